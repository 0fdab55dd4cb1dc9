//! What a configMap, secret, downwardAPI or projected volume holds — its files, modes and owners, made from the pod and the objects it names as kubelet v1.26 makes them; pure.
//!
//! Facts from the kubelet peer (`pkg/volume/{configmap,secret,downwardapi,projected}`): a
//! missing `defaultMode` is 0644 (the API server's default); without `items` every key is a
//! file, with `items` only those, a missing key an error unless the source is `optional`; a
//! ConfigMap's `data` wins over its `binaryData`; a missing object is an error unless
//! `optional`, and then the volume is empty (projected: that source adds nothing); a projected
//! service-account token is mode 0600 when the pod has an `fsGroup` or a single `runAsUser`
//! (the `fsGroup` walk then makes it 0640), else the volume's `defaultMode`. Errors of one volume
//! are gathered, not stopped at the first.
//!
//! Beyond kubelet, for objects written as manifests (nothing defaulted them): a Secret's
//! `stringData` is merged over its `data` as the API server merges it, and a container's unset
//! request reads as its limit, as the API server defaults it.

use std::collections::BTreeMap;
use std::fmt;
use std::hash::{Hash, Hasher};

use k8s_openapi::api::core::v1::{
    ConfigMap, Container, DownwardAPIVolumeFile, KeyToPath, Pod, Secret, Volume,
};

use crate::downward::{format_map, resource_value};
use crate::quantity::parse_bytes;

/// The mode of a payload file when the volume sets none (the API server's default, 0644).
pub const DEFAULT_MODE: u32 = 0o644;
/// The mode of a projected token file when the pod has an `fsGroup` or one `runAsUser`.
pub const TOKEN_MODE_WITH_OWNER: u32 = 0o600;
/// The longest payload path kubelet accepts.
const MAX_PATH_LENGTH: usize = 4096;

/// One file of a payload: its bytes, its mode and, when kubelet gives it one, its owner.
/// Its debug output shows the length, never the bytes (they may be a Secret's).
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct FileProjection {
    pub data: Vec<u8>,
    pub mode: u32,
    /// The user the file is given (a projected token, when the pod runs as one user).
    pub fs_user: Option<u32>,
}

impl fmt::Debug for FileProjection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileProjection")
            .field("bytes", &self.data.len())
            .field("mode", &format_args!("{:04o}", self.mode))
            .field("fs_user", &self.fs_user)
            .finish()
    }
}

/// A volume's files by relative path (`a.conf`, `dir/b.conf`).
pub type Payload = BTreeMap<String, FileProjection>;

/// The four kinds of volume made of API objects, by kubelet's plugin names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ProjectionKind {
    ConfigMap,
    Secret,
    DownwardApi,
    Projected,
}

impl ProjectionKind {
    /// Every kind, in plugin-name order.
    pub const ALL: [ProjectionKind; 4] = [
        ProjectionKind::ConfigMap,
        ProjectionKind::DownwardApi,
        ProjectionKind::Projected,
        ProjectionKind::Secret,
    ];

    /// Kubelet's plugin name (`kubernetes.io/configmap` …).
    pub const fn plugin_name(self) -> &'static str {
        match self {
            ProjectionKind::ConfigMap => "kubernetes.io/configmap",
            ProjectionKind::Secret => "kubernetes.io/secret",
            ProjectionKind::DownwardApi => "kubernetes.io/downward-api",
            ProjectionKind::Projected => "kubernetes.io/projected",
        }
    }

    /// The volume source field (`configMap` …).
    pub const fn field(self) -> &'static str {
        match self {
            ProjectionKind::ConfigMap => "configMap",
            ProjectionKind::Secret => "secret",
            ProjectionKind::DownwardApi => "downwardAPI",
            ProjectionKind::Projected => "projected",
        }
    }

    /// Whether kubelet keeps the volume in memory (a tmpfs): all but configMap.
    pub const fn in_memory(self) -> bool {
        !matches!(self, ProjectionKind::ConfigMap)
    }

    /// The kind a volume is, when it is one of the four.
    pub fn of(volume: &Volume) -> Option<ProjectionKind> {
        if volume.config_map.is_some() {
            Some(ProjectionKind::ConfigMap)
        } else if volume.secret.is_some() {
            Some(ProjectionKind::Secret)
        } else if volume.downward_api.is_some() {
            Some(ProjectionKind::DownwardApi)
        } else if volume.projected.is_some() {
            Some(ProjectionKind::Projected)
        } else {
            None
        }
    }
}

/// A service-account token a projected volume holds: what to ask the TokenRequest API for and
/// where to put the answer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TokenFile {
    pub path: String,
    /// Empty: the API server's own audience.
    pub audience: String,
    pub expiration_seconds: Option<i64>,
    pub mode: u32,
    pub fs_user: Option<u32>,
}

/// What a volume holds: its files, and the tokens to mint into it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct Projection {
    pub files: Payload,
    pub tokens: Vec<TokenFile>,
}

impl Projection {
    /// A digest of the files and the token requests (not the tokens): equal digests, nothing to
    /// write again. In memory only; not stable across builds.
    pub fn digest(&self) -> u64 {
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        self.hash(&mut hasher);
        hasher.finish()
    }
}

/// Where the objects a volume names are read from.
pub trait ProjectionObjects {
    fn config_map(&self, namespace: &str, name: &str) -> Option<&ConfigMap>;
    fn secret(&self, namespace: &str, name: &str) -> Option<&Secret>;
}

impl ProjectionObjects for crate::objects::ObjectSet {
    fn config_map(&self, namespace: &str, name: &str) -> Option<&ConfigMap> {
        self.config_maps.get(&format!("{namespace}/{name}"))
    }

    fn secret(&self, namespace: &str, name: &str) -> Option<&Secret> {
        self.secrets.get(&format!("{namespace}/{name}"))
    }
}

/// The node's allocatable resources, which a container's unset limit reads as (kubelet's
/// `GetNodeAllocatable`); zero where unknown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct NodeResources {
    pub cpu_millis: u64,
    pub memory_bytes: u64,
    pub ephemeral_storage_bytes: u64,
}

/// The pod a volume is made for, as the projection needs it.
#[derive(Clone, Copy, Debug)]
pub struct PodRef<'a> {
    pub pod: &'a Pod,
    /// Its namespace (defaulted) and uid (a static pod's computed one).
    pub namespace: &'a str,
    pub uid: &'a str,
}

/// What `volume` of `pod` holds, or every reason it cannot be made. `None` when the volume is
/// not one of the four kinds.
pub fn project(
    volume: &Volume,
    pod: PodRef<'_>,
    objects: &dyn ProjectionObjects,
    node: &NodeResources,
) -> Option<Result<Projection, String>> {
    let kind = ProjectionKind::of(volume)?;
    let config_map = |name: &str| {
        (
            format!("configmap {}/{name}", pod.namespace),
            objects.config_map(pod.namespace, name).map(config_map_keys),
        )
    };
    let secret = |name: &str| {
        (format!("secret {}/{name}", pod.namespace), objects.secret(pod.namespace, name).map(secret_keys))
    };
    let mut errors = Vec::new();
    let mut projection = Projection::default();
    match kind {
        ProjectionKind::ConfigMap => {
            let source = volume.config_map.as_ref().expect("the kind says so");
            let name = source.name.as_str();
            let mode = default_mode(source.default_mode, &mut errors);
            let optional = source.optional.unwrap_or(false);
            let (what, keys) = config_map(name);
            object_files(
                what,
                keys,
                source.items.as_deref(),
                mode,
                optional,
                &mut projection.files,
                &mut errors,
            );
        }
        ProjectionKind::Secret => {
            let source = volume.secret.as_ref().expect("the kind says so");
            let name = source.secret_name.as_deref().unwrap_or_default();
            let mode = default_mode(source.default_mode, &mut errors);
            let optional = source.optional.unwrap_or(false);
            let (what, keys) = secret(name);
            object_files(
                what,
                keys,
                source.items.as_deref(),
                mode,
                optional,
                &mut projection.files,
                &mut errors,
            );
        }
        ProjectionKind::DownwardApi => {
            let source = volume.downward_api.as_ref().expect("the kind says so");
            let mode = default_mode(source.default_mode, &mut errors);
            downward_files(
                pod,
                node,
                source.items.as_deref().unwrap_or_default(),
                mode,
                &mut projection.files,
                &mut errors,
            );
        }
        ProjectionKind::Projected => {
            let source = volume.projected.as_ref().expect("the kind says so");
            let mode = default_mode(source.default_mode, &mut errors);
            let owned = pod_fs_group(pod.pod).is_some() || fs_user(pod.pod).is_some();
            for part in source.sources.as_deref().unwrap_or_default() {
                if let Some(s) = &part.config_map {
                    let name = s.name.as_str();
                    let optional = s.optional.unwrap_or(false);
                    let (what, keys) = config_map(name);
                    object_files(
                        what,
                        keys,
                        s.items.as_deref(),
                        mode,
                        optional,
                        &mut projection.files,
                        &mut errors,
                    );
                } else if let Some(s) = &part.secret {
                    let name = s.name.as_str();
                    let optional = s.optional.unwrap_or(false);
                    let (what, keys) = secret(name);
                    object_files(
                        what,
                        keys,
                        s.items.as_deref(),
                        mode,
                        optional,
                        &mut projection.files,
                        &mut errors,
                    );
                } else if let Some(s) = &part.downward_api {
                    downward_files(
                        pod,
                        node,
                        s.items.as_deref().unwrap_or_default(),
                        mode,
                        &mut projection.files,
                        &mut errors,
                    );
                } else if let Some(s) = &part.service_account_token {
                    if let Some(seconds) = s.expiration_seconds.filter(|s| *s < 600) {
                        errors.push(format!("serviceAccountToken expirationSeconds {seconds} is under 600"));
                    }
                    projection.tokens.push(TokenFile {
                        path: s.path.clone(),
                        audience: s.audience.clone().unwrap_or_default(),
                        expiration_seconds: s.expiration_seconds,
                        mode: if owned { TOKEN_MODE_WITH_OWNER } else { mode },
                        fs_user: fs_user(pod.pod),
                    });
                }
            }
        }
    }
    for token in &projection.tokens {
        projection.files.remove(&token.path);
        if let Err(why) = validate_path(&token.path) {
            errors.push(format!("serviceAccountToken path {:?}: {why}", token.path));
        }
    }
    if let Err(why) = validate_payload(&projection.files) {
        errors.push(why);
    }
    Some(if errors.is_empty() { Ok(projection) } else { Err(errors.join("; ")) })
}

/// A source's `defaultMode`, 0644 when unset; one out of range is an error (and 0644 stands in).
fn default_mode(mode: Option<i32>, errors: &mut Vec<String>) -> u32 {
    match mode {
        None => DEFAULT_MODE,
        Some(m) => file_mode(m).unwrap_or_else(|why| {
            errors.push(format!("defaultMode: {why}"));
            DEFAULT_MODE
        }),
    }
}

/// A mode as the API allows it: 0 to 0777.
fn file_mode(mode: i32) -> Result<u32, String> {
    u32::try_from(mode)
        .ok()
        .filter(|m| *m <= 0o777)
        .ok_or_else(|| format!("{mode:#o} is not a mode from 0 to 0777"))
}

/// One object's keys as files: all of them, or the `items` asked for.
fn keyed_files(
    what: &str,
    keys: &BTreeMap<String, Vec<u8>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
    optional: bool,
    files: &mut Payload,
    errors: &mut Vec<String>,
) {
    let items = items.filter(|items| !items.is_empty());
    let Some(items) = items else {
        for (key, data) in keys {
            files.insert(key.clone(), FileProjection { data: data.clone(), mode, fs_user: None });
        }
        return;
    };
    for item in items {
        let Some(data) = keys.get(&item.key) else {
            if !optional {
                errors.push(format!("{what} has no key {:?}", item.key));
            }
            continue;
        };
        let mode = match item.mode.map(file_mode) {
            None => mode,
            Some(Ok(m)) => m,
            Some(Err(why)) => {
                errors.push(format!("{what} item {:?} mode: {why}", item.key));
                continue;
            }
        };
        files.insert(item.path.clone(), FileProjection { data: data.clone(), mode, fs_user: None });
    }
}

/// The files of the object a source names: `keys` is the object's keys when it exists; a
/// missing object is an error unless the source is `optional`.
#[allow(clippy::too_many_arguments)]
fn object_files(
    what: String,
    keys: Option<BTreeMap<String, Vec<u8>>>,
    items: Option<&[KeyToPath]>,
    mode: u32,
    optional: bool,
    files: &mut Payload,
    errors: &mut Vec<String>,
) {
    match keys {
        Some(keys) => keyed_files(&what, &keys, items, mode, optional, files, errors),
        None if optional => {}
        None => errors.push(format!("{what} does not exist")),
    }
}

/// A ConfigMap's keys: `binaryData`, then `data` over it (kubelet reads `data` first).
pub fn config_map_keys(config_map: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut keys: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (key, value) in config_map.binary_data.iter().flatten() {
        keys.insert(key.clone(), value.0.clone());
    }
    for (key, value) in config_map.data.iter().flatten() {
        keys.insert(key.clone(), value.clone().into_bytes());
    }
    keys
}

/// A Secret's keys: `data`, then `stringData` over it (as the API server merges them).
pub fn secret_keys(secret: &Secret) -> BTreeMap<String, Vec<u8>> {
    let mut keys: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        keys.insert(key.clone(), value.0.clone());
    }
    for (key, value) in secret.string_data.iter().flatten() {
        keys.insert(key.clone(), value.clone().into_bytes());
    }
    keys
}

/// The downward API's files (kubelet's `CollectData`): each item's path cleaned, its field or
/// resource formatted.
fn downward_files(
    pod: PodRef<'_>,
    node: &NodeResources,
    items: &[DownwardAPIVolumeFile],
    mode: u32,
    files: &mut Payload,
    errors: &mut Vec<String>,
) {
    for item in items {
        let mode = match item.mode.map(file_mode) {
            None => mode,
            Some(Ok(m)) => m,
            Some(Err(why)) => {
                errors.push(format!("downwardAPI item {:?} mode: {why}", item.path));
                continue;
            }
        };
        let value = match (&item.field_ref, &item.resource_field_ref) {
            (Some(field), None) => field_value(pod, &field.field_path),
            (None, Some(resource)) => {
                let container = resource.container_name.as_deref().unwrap_or_default();
                let divisor = resource.divisor.as_ref().map(|d| d.0.as_str());
                container_resource(pod.pod, node, container, &resource.resource, divisor)
            }
            (None, None) => Err("it sets neither fieldRef nor resourceFieldRef".to_string()),
            (Some(_), Some(_)) => Err("it sets both fieldRef and resourceFieldRef".to_string()),
        };
        match value {
            Ok(value) => {
                files.insert(
                    clean_path(&item.path),
                    FileProjection { data: value.into_bytes(), mode, fs_user: None },
                );
            }
            Err(why) => errors.push(format!("downwardAPI item {:?}: {why}", item.path)),
        }
    }
}

/// The field paths the downward API serves in volumes.
pub const VOLUME_FIELD_PATHS: &[&str] =
    &["metadata.name", "metadata.namespace", "metadata.uid", "metadata.labels", "metadata.annotations"];

/// A pod field as kubelet writes it into a downward API file: the labels and annotations as
/// [`format_map`] lines, one label or annotation (`metadata.labels['key']`) as its value
/// (empty when it is not set).
pub fn field_value(pod: PodRef<'_>, path: &str) -> Result<String, String> {
    let meta = &pod.pod.metadata;
    let empty = BTreeMap::new();
    if let Some((map, key)) = subscript(path) {
        let map = match map {
            "metadata.labels" => meta.labels.as_ref().unwrap_or(&empty),
            "metadata.annotations" => meta.annotations.as_ref().unwrap_or(&empty),
            _ => return Err(unsupported_field(path)),
        };
        return Ok(map.get(key).cloned().unwrap_or_default());
    }
    match path {
        "metadata.name" => Ok(meta.name.clone().unwrap_or_default()),
        "metadata.namespace" => Ok(pod.namespace.to_string()),
        "metadata.uid" => Ok(pod.uid.to_string()),
        "metadata.labels" => Ok(format_map(meta.labels.as_ref().unwrap_or(&empty))),
        "metadata.annotations" => Ok(format_map(meta.annotations.as_ref().unwrap_or(&empty))),
        _ => Err(unsupported_field(path)),
    }
}

fn unsupported_field(path: &str) -> String {
    format!(
        "fieldPath {path:?} is not served in volumes (only {}, and metadata.labels['key'] or \
         metadata.annotations['key'])",
        VOLUME_FIELD_PATHS.join(", ")
    )
}

/// `metadata.labels['key']` → (`metadata.labels`, `key`).
fn subscript(path: &str) -> Option<(&str, &str)> {
    let (map, rest) = path.split_once("['")?;
    let key = rest.strip_suffix("']")?;
    Some((map, key))
}

/// A container's resource as kubelet writes it: its limit (the node's allocatable when unset),
/// or its request (its limit when unset, as the API server defaults it; else zero).
pub fn container_resource(
    pod: &Pod,
    node: &NodeResources,
    container_name: &str,
    resource: &str,
    divisor: Option<&str>,
) -> Result<String, String> {
    if container_name.is_empty() {
        return Err("resourceFieldRef names no container (volumes must name one)".to_string());
    }
    let container = containers(pod)
        .find(|c| c.name == container_name)
        .ok_or_else(|| format!("the pod has no container {container_name:?}"))?;
    let (which, kind) = resource
        .split_once('.')
        .ok_or_else(|| format!("resource {resource:?} is not limits.<name> or requests.<name>"))?;
    let resources = container.resources.as_ref();
    let limit = resources.and_then(|r| r.limits.as_ref()).and_then(|l| l.get(kind)).map(|q| q.0.clone());
    let request = resources.and_then(|r| r.requests.as_ref()).and_then(|l| l.get(kind)).map(|q| q.0.clone());
    let allocatable = || match kind {
        "cpu" => Some(format!("{}m", node.cpu_millis)),
        "memory" => Some(node.memory_bytes.to_string()),
        "ephemeral-storage" => Some(node.ephemeral_storage_bytes.to_string()),
        _ => None,
    };
    let quantity = match which {
        "limits" => limit.or_else(allocatable),
        "requests" => request.or(limit),
        _ => return Err(format!("resource {resource:?} is not limits.<name> or requests.<name>")),
    };
    resource_value(resource, quantity.as_deref().unwrap_or("0"), divisor)
}

fn containers(pod: &Pod) -> impl Iterator<Item = &Container> {
    let spec = pod.spec.as_ref();
    let regular = spec.map(|s| s.containers.as_slice()).unwrap_or_default();
    let init = spec.and_then(|s| s.init_containers.as_deref()).unwrap_or_default();
    regular.iter().chain(init)
}

/// The pod's `fsGroup`.
pub fn pod_fs_group(pod: &Pod) -> Option<i64> {
    pod.spec.as_ref()?.security_context.as_ref()?.fs_group
}

/// The one user every container of the pod runs as (kubelet's `FsUserFrom`): each container's
/// `runAsUser`, else the pod's; `None` when one has none or two differ.
pub fn fs_user(pod: &Pod) -> Option<u32> {
    let spec = pod.spec.as_ref()?;
    let pod_user = spec.security_context.as_ref().and_then(|c| c.run_as_user);
    let mut user = None;
    for container in containers(pod) {
        let own = container.security_context.as_ref().and_then(|c| c.run_as_user).or(pod_user)?;
        if user.is_some_and(|u| u != own) {
            return None;
        }
        user = Some(own);
    }
    user.and_then(|u| u32::try_from(u).ok())
}

/// The pod's memory limit (kubelet's pod cgroup limit, which sizes its memory volumes): the sum
/// of its containers' limits, at least each init container's; `None` when a container has none.
pub fn pod_memory_limit(pod: &Pod) -> Option<u64> {
    let spec = pod.spec.as_ref()?;
    let limit = |c: &Container| -> Option<u64> {
        let q = c.resources.as_ref()?.limits.as_ref()?.get("memory")?;
        parse_bytes(&q.0).ok().filter(|b| *b > 0)
    };
    let mut sum: u64 = 0;
    for container in &spec.containers {
        sum = sum.saturating_add(limit(container)?);
    }
    for container in spec.init_containers.iter().flatten() {
        sum = sum.max(limit(container)?);
    }
    (sum > 0).then_some(sum)
}

/// A path as Go's `filepath.Clean` makes it: no empty or `.` elements, a `..` after a name
/// folded into it.
pub fn clean_path(path: &str) -> String {
    let absolute = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            ".." if absolute => {}
            part => parts.push(part),
        }
    }
    let joined = parts.join("/");
    match (absolute, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// Checks every path of `payload` as kubelet does: not empty, not absolute, at most 4096 bytes,
/// no `..` element and not starting with `..`.
pub fn validate_payload(payload: &Payload) -> Result<(), String> {
    for path in payload.keys() {
        validate_path(path).map_err(|why| format!("payload path {path:?}: {why}"))?;
    }
    Ok(())
}

fn validate_path(path: &str) -> Result<(), &'static str> {
    if path.is_empty() {
        return Err("it is empty");
    }
    if path.len() > MAX_PATH_LENGTH {
        return Err("it is longer than 4096 bytes");
    }
    if path.starts_with('/') {
        return Err("it is absolute");
    }
    if path.starts_with("..") {
        return Err("it starts with '..'");
    }
    if path.split('/').any(|part| part == "..") {
        return Err("it has a '..' element");
    }
    Ok(())
}

#[cfg(test)]
#[path = "projection_tests.rs"]
mod tests;
