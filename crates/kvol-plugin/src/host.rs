//! What plugins get from the node: its paths as kubelet lays them out, its identity, and the mount seam.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;

use crate::mount::Mounter;

/// The node's directory layout under one root, kubelet's `--root-dir` (`/var/lib/kubelet` by
/// default): `pods/`, `plugins/` and `plugins_registry/` directly below it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodePaths {
    root: PathBuf,
}

impl NodePaths {
    pub fn new(root: impl Into<PathBuf>) -> NodePaths {
        NodePaths { root: root.into() }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The root, opened, to create and remove paths beneath it without following symlinks.
    pub fn open_root(&self) -> crate::error::Result<crate::beneath::Root> {
        crate::beneath::Root::open(&self.root)
            .map_err(|e| crate::error::PluginError::io("open the root", &self.root, e))
    }

    /// `<root>/pods/<uid>`; a uid that is not one plain path segment is refused.
    pub fn pod_dir(&self, pod_uid: &str) -> crate::error::Result<PathBuf> {
        segment("pod uid", pod_uid)?;
        Ok(self.root.join("pods").join(pod_uid))
    }

    /// Makes `<root>/pods/<uid>/volumes` (and `pods/`, `pods/<uid>`) where missing, owner and
    /// group only (0750), as kubelet makes a pod's directories before its volumes: other users
    /// of the node cannot reach a pod's volumes through them. Directories already there are
    /// left as they are.
    pub fn make_pod_dirs(&self, pod_uid: &str) -> crate::error::Result<()> {
        let volumes = self.pod_dir(pod_uid)?.join("volumes");
        self.open_root()?
            .create_dir_all(&volumes, POD_DIR_MODE)
            .map(drop)
            .map_err(|e| crate::error::PluginError::io("create directory", &volumes, e))
    }

    /// `<root>/pods/<uid>/volumes/<plugin with / as ~>/<volume>`: where a pod's volume is
    /// published. Each of the three must make one plain path segment (not empty, `.` or `..`,
    /// no NUL, no `/` once the plugin's are escaped): a validation bug upstream of here cannot
    /// turn into a path outside the pod's directory.
    pub fn pod_volume_dir(
        &self,
        pod_uid: &str,
        plugin_name: &str,
        volume_name: &str,
    ) -> crate::error::Result<PathBuf> {
        let plugin = escape_plugin_name(plugin_name);
        segment("plugin name", &plugin)?;
        segment("volume name", volume_name)?;
        Ok(self.pod_dir(pod_uid)?.join("volumes").join(plugin).join(volume_name))
    }

    /// `<root>/plugins/<plugin>`: a plugin's node-global directory (stage paths live below it).
    /// `plugin_name` is always one of the compiled-in plugin names, never a manifest's.
    pub fn plugin_dir(&self, plugin_name: &str) -> PathBuf {
        self.root.join("plugins").join(plugin_name)
    }

    /// `<root>/plugins_registry`: where CSI drivers (and their registrars) put registration
    /// sockets for the plugin watcher.
    pub fn registration_dir(&self) -> PathBuf {
        self.root.join(REGISTRATION_DIR)
    }
}

/// The mode of `pods/`, `pods/<uid>` and `pods/<uid>/volumes` (kubelet's).
pub const POD_DIR_MODE: u32 = 0o750;

/// The registration directory's name below the root (kubelet's `plugins_registry`).
pub const REGISTRATION_DIR: &str = "plugins_registry";

/// The root kubelet uses unless told otherwise (`--root-dir`).
pub const DEFAULT_ROOT_DIR: &str = "/var/lib/kubelet";

/// Refuses `value` (the `what` of a path) unless it is one plain path segment.
fn segment(what: &'static str, value: &str) -> crate::error::Result<()> {
    crate::beneath::check_segment(value).map_err(|reason| crate::error::PluginError::PathSegment {
        what,
        value: value.to_string(),
        reason,
    })
}

/// A plugin name as one path component: `kubernetes.io/empty-dir` → `kubernetes.io~empty-dir`
/// (upstream's `EscapeQualifiedName`).
pub fn escape_plugin_name(name: &str) -> String {
    name.replace('/', "~")
}

/// The node kvol runs on.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeInfo {
    pub name: String,
    pub labels: BTreeMap<String, String>,
    /// What pods may use of the node (kubelet's node allocatable): a container's unset limit in
    /// the downward API, the size of memory-backed volumes. Zero where unknown.
    pub allocatable: kvol_api::projection::NodeResources,
}

impl NodeInfo {
    /// A node with the labels every node carries (`kubernetes.io/hostname`).
    pub fn named(name: impl Into<String>) -> NodeInfo {
        let name = name.into();
        let labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.clone())]);
        NodeInfo { name, labels, allocatable: Default::default() }
    }
}

/// Where plugins read the Secrets volumes reference (Flexvolume options, CSI secrets).
pub trait SecretStore: Send + Sync + std::fmt::Debug {
    /// The Secret `namespace/name`, or `None` if there is no such Secret.
    fn get(&self, namespace: &str, name: &str) -> Option<Secret>;
}

/// A fixed set of Secrets, by namespace and name (standalone mode, tests).
#[derive(Clone, Default)]
pub struct SecretMap(pub BTreeMap<(String, String), Secret>);

impl std::fmt::Debug for SecretMap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("SecretMap").field(&RedactedSecrets(&self.0)).finish()
    }
}

pub use kvol_api::redacted::{RedactedSecret, RedactedSecrets};

impl SecretMap {
    /// Adds a Secret under its own namespace and name.
    pub fn insert(&mut self, secret: Secret) {
        let namespace = secret.metadata.namespace.clone().unwrap_or_default();
        let name = secret.metadata.name.clone().unwrap_or_default();
        self.0.insert((namespace, name), secret);
    }
}

impl SecretStore for SecretMap {
    fn get(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.0.get(&(namespace.to_string(), name.to_string())).cloned()
    }
}

/// The node as plugins see it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PluginHost {
    pub paths: NodePaths,
    pub node: NodeInfo,
    pub mounter: Arc<dyn Mounter>,
    pub secrets: Arc<dyn SecretStore>,
    /// The host paths hostPath volumes may use (`kvol agent --allowed-host-paths`), matched
    /// by whole components; `None`: any.
    pub allowed_host_paths: Option<Arc<[PathBuf]>>,
    /// Mints and rotates service-account tokens (cluster mode); `None` standalone.
    pub tokens: Option<Arc<crate::tokens::TokenCache>>,
}

impl PluginHost {
    /// A host with no Secrets.
    pub fn new(paths: NodePaths, node: NodeInfo, mounter: Arc<dyn Mounter>) -> PluginHost {
        let secrets = Arc::new(SecretMap::default());
        PluginHost { paths, node, mounter, secrets, allowed_host_paths: None, tokens: None }
    }

    /// The same host, allowing hostPath volumes under `prefixes` only (`None`: anywhere).
    pub fn with_allowed_host_paths(mut self, prefixes: Option<Vec<PathBuf>>) -> PluginHost {
        self.allowed_host_paths = prefixes.map(Arc::from);
        self
    }

    /// The same host, minting service-account tokens from `source` (through one cache).
    pub fn with_tokens(mut self, source: Option<Arc<dyn crate::tokens::TokenSource>>) -> PluginHost {
        self.tokens = source.map(|s| Arc::new(crate::tokens::TokenCache::new(s)));
        self
    }

    /// The same host, reading Secrets from `secrets`.
    pub fn with_secrets(mut self, secrets: Arc<dyn SecretStore>) -> PluginHost {
        self.secrets = secrets;
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_debug_shows_keys_never_values() {
        use k8s_openapi::ByteString;
        let mut secret = Secret { type_: Some("kvol/tmpfs".into()), ..Secret::default() };
        secret.metadata.name = Some("creds".into());
        secret.metadata.namespace = Some("ns".into());
        secret.data = Some([("password".to_string(), ByteString(b"hunter2".to_vec()))].into());
        secret.string_data = Some([("token".to_string(), "t0ps3cret".to_string())].into());
        let mut map = SecretMap::default();
        map.insert(secret);
        let shown = format!("{map:?} {map:#?}");
        assert!(!shown.contains("hunter2") && !shown.contains("t0ps3cret"), "{shown}");
        assert!(!shown.contains("104, 117"), "no bytes either: {shown}");
        assert!(
            shown.contains("\"password\"") && shown.contains("\"token\"") && shown.contains("creds"),
            "{shown}"
        );
    }

    #[test]
    fn segments_that_would_leave_the_pod_directory_are_refused() {
        let p = NodePaths::new("/var/lib/kubelet");
        let cases: &[(&str, &str, &str, &str)] = &[
            ("..", "kubernetes.io/empty-dir", "v", "refusing pod uid \"..\": \"..\" is not a path segment"),
            ("", "kubernetes.io/empty-dir", "v", "refusing pod uid \"\": a path segment must not be empty"),
            ("u", "kubernetes.io/empty-dir", ".", "refusing volume name \".\": \".\" is not a path segment"),
            (
                "u",
                "kubernetes.io/empty-dir",
                "../../x",
                "refusing volume name \"../../x\": \"../../x\" contains \"/\"",
            ),
            (
                "u",
                "kubernetes.io/empty-dir",
                "/etc",
                "refusing volume name \"/etc\": \"/etc\" contains \"/\"",
            ),
            ("u", "kubernetes.io/empty-dir", "v\0", "refusing volume name \"v\\0\": \"v\\0\" contains NUL"),
            ("a/b", "kubernetes.io/empty-dir", "v", "refusing pod uid \"a/b\": \"a/b\" contains \"/\""),
            ("u", "..", "v", "refusing plugin name \"..\": \"..\" is not a path segment"),
        ];
        for (uid, plugin, volume, want) in cases {
            let err = p.pod_volume_dir(uid, plugin, volume).unwrap_err();
            assert_eq!(err.to_string(), *want, "{uid:?} {plugin:?} {volume:?}");
        }
        assert!(p.pod_dir("..").is_err());
    }

    #[test]
    fn paths_follow_kubelet_layout() {
        let p = NodePaths::new("/var/lib/kubelet");
        assert_eq!(
            p.pod_volume_dir("uid-1", "kubernetes.io/empty-dir", "cache").unwrap(),
            Path::new("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/cache")
        );
        assert_eq!(
            p.pod_volume_dir("u", "example.com/lvm", "v").unwrap(),
            Path::new("/var/lib/kubelet/pods/u/volumes/example.com~lvm/v")
        );
        assert_eq!(
            p.plugin_dir("kubernetes.io/csi"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi")
        );
    }
}
