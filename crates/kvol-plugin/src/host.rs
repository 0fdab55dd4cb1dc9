//! What plugins get from the node: its paths as kubelet lays them out, its identity, and the mount seam.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::mount::Mounter;

/// The node's directory layout under one root (kubelet's `/var/lib/kubelet` by default).
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

    /// `<root>/pods/<uid>`.
    pub fn pod_dir(&self, pod_uid: &str) -> PathBuf {
        self.root.join("pods").join(pod_uid)
    }

    /// `<root>/pods/<uid>/volumes/<plugin with / as ~>/<volume>`: where a pod's volume is published.
    pub fn pod_volume_dir(&self, pod_uid: &str, plugin_name: &str, volume_name: &str) -> PathBuf {
        self.pod_dir(pod_uid).join("volumes").join(escape_plugin_name(plugin_name)).join(volume_name)
    }

    /// `<root>/plugins/<plugin>`: a plugin's node-global directory (stage paths live below it).
    pub fn plugin_dir(&self, plugin_name: &str) -> PathBuf {
        self.root.join("plugins").join(plugin_name)
    }
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
}

impl NodeInfo {
    /// A node with the labels every node carries (`kubernetes.io/hostname`).
    pub fn named(name: impl Into<String>) -> NodeInfo {
        let name = name.into();
        let labels = BTreeMap::from([("kubernetes.io/hostname".to_string(), name.clone())]);
        NodeInfo { name, labels }
    }
}

/// The node as plugins see it. Cheap to clone.
#[derive(Clone, Debug)]
pub struct PluginHost {
    pub paths: NodePaths,
    pub node: NodeInfo,
    pub mounter: Arc<dyn Mounter>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_kubelet_layout() {
        let p = NodePaths::new("/var/lib/kubelet");
        assert_eq!(
            p.pod_volume_dir("uid-1", "kubernetes.io/empty-dir", "cache"),
            Path::new("/var/lib/kubelet/pods/uid-1/volumes/kubernetes.io~empty-dir/cache")
        );
        assert_eq!(
            p.pod_volume_dir("u", "example.com/lvm", "v"),
            Path::new("/var/lib/kubelet/pods/u/volumes/example.com~lvm/v")
        );
        assert_eq!(
            p.plugin_dir("kubernetes.io/csi"),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi")
        );
    }
}
