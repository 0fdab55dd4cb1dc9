//! Manifests read: a directory of YAML or JSON manifests (or one text) turned into an object set, every problem named with its file and document.
//!
//! The directory holds Pods, PersistentVolumes, PersistentVolumeClaims, StorageClasses,
//! CSIDrivers, Secrets, VolumeSnapshots and VolumeSnapshotClasses, as `kubectl get -o yaml` writes them or as a person writes them by
//! hand. Every `*.yaml`, `*.yml` and `*.json` file directly in the directory is read, in name
//! order; dot-files are skipped, so editors' swap files and the temporary file of an atomic
//! write (`.name.yaml.tmp`, then rename) never count. One bad document or file is a
//! [`SourceProblem`]; everything else is still loaded.
//!
//! Manifests rarely carry `metadata.uid`, and a pod's uid names its volume directories, so a
//! pod without one gets [`static_pod_uid`]: derived from its namespace and name alone, it stays
//! the same when the pod is edited, and the pod's volumes stay where they are.

use std::collections::BTreeMap;
use std::fmt;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use serde_json::Value;
use sha2::{Digest, Sha256};

use crate::model::{ObjectSet, SourceProblem};
use kvol_api::snapshot::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};

/// The namespace of a namespaced object that names none.
pub const DEFAULT_NAMESPACE: &str = "default";

/// An object read from a manifest. Its debug output shows a Secret's keys, never its values.
#[derive(Clone, PartialEq)]
pub enum Object {
    // Shared with the object sets made from them, not copied: a pod or a PV weighs kilobytes.
    Pod(Arc<Pod>),
    PersistentVolume(Arc<PersistentVolume>),
    PersistentVolumeClaim(Box<PersistentVolumeClaim>),
    StorageClass(Box<StorageClass>),
    CsiDriver(Box<CSIDriver>),
    Secret(Box<Secret>),
    ConfigMap(Box<ConfigMap>),
    VolumeSnapshot(Box<VolumeSnapshot>),
    VolumeSnapshotClass(Box<VolumeSnapshotClass>),
    VolumeSnapshotContent(Box<VolumeSnapshotContent>),
}

impl Object {
    /// The object's kind, as the API spells it.
    pub fn kind(&self) -> &'static str {
        match self {
            Object::Pod(_) => "Pod",
            Object::PersistentVolume(_) => "PersistentVolume",
            Object::PersistentVolumeClaim(_) => "PersistentVolumeClaim",
            Object::StorageClass(_) => "StorageClass",
            Object::CsiDriver(_) => "CSIDriver",
            Object::Secret(_) => "Secret",
            Object::ConfigMap(_) => "ConfigMap",
            Object::VolumeSnapshot(_) => "VolumeSnapshot",
            Object::VolumeSnapshotClass(_) => "VolumeSnapshotClass",
            Object::VolumeSnapshotContent(_) => "VolumeSnapshotContent",
        }
    }

    /// The object's key in an [`ObjectSet`]: `namespace/name` for namespaced kinds, `name` for
    /// cluster-scoped ones.
    pub fn key(&self) -> String {
        let meta = match self {
            Object::Pod(o) => &o.metadata,
            Object::PersistentVolume(o) => &o.metadata,
            Object::PersistentVolumeClaim(o) => &o.metadata,
            Object::StorageClass(o) => &o.metadata,
            Object::CsiDriver(o) => &o.metadata,
            Object::Secret(o) => &o.metadata,
            Object::ConfigMap(o) => &o.metadata,
            Object::VolumeSnapshot(o) => &o.metadata,
            Object::VolumeSnapshotClass(o) => &o.metadata,
            Object::VolumeSnapshotContent(o) => &o.metadata,
        };
        let name = meta.name.as_deref().unwrap_or_default();
        if namespaced(self.kind()) {
            format!("{}/{name}", meta.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE))
        } else {
            name.to_string()
        }
    }
}

impl fmt::Debug for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Object::Pod(o) => f.debug_tuple("Pod").field(o).finish(),
            Object::PersistentVolume(o) => f.debug_tuple("PersistentVolume").field(o).finish(),
            Object::PersistentVolumeClaim(o) => f.debug_tuple("PersistentVolumeClaim").field(o).finish(),
            Object::StorageClass(o) => f.debug_tuple("StorageClass").field(o).finish(),
            Object::CsiDriver(o) => f.debug_tuple("CsiDriver").field(o).finish(),
            Object::Secret(o) => {
                f.debug_tuple("Secret").field(&kvol_plugin::host::RedactedSecret(o)).finish()
            }
            Object::ConfigMap(o) => f.debug_tuple("ConfigMap").field(o).finish(),
            Object::VolumeSnapshot(o) => f.debug_tuple("VolumeSnapshot").field(o).finish(),
            Object::VolumeSnapshotClass(o) => f.debug_tuple("VolumeSnapshotClass").field(o).finish(),
            Object::VolumeSnapshotContent(o) => f.debug_tuple("VolumeSnapshotContent").field(o).finish(),
        }
    }
}

impl fmt::Display for Object {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind(), self.key())
    }
}

/// The kinds the source reads, with the apiVersion each must have and whether it is namespaced.
const KINDS: &[(&str, &str, bool)] = &[
    ("Pod", "v1", true),
    ("PersistentVolume", "v1", false),
    ("PersistentVolumeClaim", "v1", true),
    ("StorageClass", "storage.k8s.io/v1", false),
    ("CSIDriver", "storage.k8s.io/v1", false),
    ("Secret", "v1", true),
    ("ConfigMap", "v1", true),
    ("VolumeSnapshot", kvol_api::snapshot::API_VERSION, true),
    ("VolumeSnapshotClass", kvol_api::snapshot::API_VERSION, false),
    ("VolumeSnapshotContent", kvol_api::snapshot::API_VERSION, false),
];

/// The kinds the source reads, as a sentence: `A, B and C`.
fn kinds_read() -> String {
    let names: Vec<&str> = KINDS.iter().map(|(kind, _, _)| *kind).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} and {last}", rest.join(", ")),
        _ => names.join(""),
    }
}

fn namespaced(kind: &str) -> bool {
    KINDS.iter().any(|(k, _, ns)| *k == kind && *ns)
}

/// The uid of a pod that has none in its manifest: the UUID (version 8, RFC 9562) made of the
/// first 16 bytes of sha256(`kvol-static-pod/<namespace>/<name>`). It depends on nothing else,
/// so editing the pod keeps its uid and its volume directories.
pub fn static_pod_uid(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("kvol-static-pod/{namespace}/{name}").as_bytes());
    let mut b = [0u8; 16];
    b.copy_from_slice(&digest[..16]);
    b[6] = (b[6] & 0x0f) | 0x80;
    b[8] = (b[8] & 0x3f) | 0x80;
    let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &hex[..8], &hex[8..12], &hex[12..16], &hex[16..20], &hex[20..])
}

/// Reads a YAML or JSON stream (one or many documents; a `List` contributes its items) into
/// objects. A document that is not a supported, valid object is a problem naming `origin`, the
/// document's 1-based position and the object; a stream that cannot be parsed at all is one
/// problem for `origin`. Namespaced objects without a namespace get `default`; pods without a
/// uid get [`static_pod_uid`]; a Secret's `stringData` is merged into `data`, as the API server
/// does.
pub fn parse_manifests(origin: &str, text: &str) -> (Vec<Object>, Vec<SourceProblem>) {
    let (objects, problems) = parse_documents(origin, text);
    (objects.into_iter().map(|(_, object)| object).collect(), problems)
}

/// As [`parse_manifests`], each object with its document position.
fn parse_documents(origin: &str, text: &str) -> (Vec<(usize, Object)>, Vec<SourceProblem>) {
    let values = match parse_values(text) {
        Ok(values) => values,
        Err(reason) => {
            let reason = format!("cannot parse as YAML or JSON: {reason}");
            return (Vec::new(), vec![SourceProblem { origin: origin.to_string(), document: None, reason }]);
        }
    };
    let mut documents = Vec::new();
    for value in values {
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                documents.extend(map.get("items").and_then(Value::as_array).cloned().unwrap_or_default());
            }
            other => documents.push(other),
        }
    }
    let mut objects = Vec::new();
    let mut problems = Vec::new();
    for (i, value) in documents.into_iter().enumerate() {
        match type_object(value) {
            Ok(object) => objects.push((i + 1, object)),
            Err(reason) => {
                problems.push(SourceProblem { origin: origin.to_string(), document: Some(i + 1), reason })
            }
        }
    }
    (objects, problems)
}

/// The documents of a YAML or JSON stream as plain values (YAML with strict booleans; a
/// top-level JSON array contributes its items); the one stream reader kvol has.
pub fn parse_values(text: &str) -> Result<Vec<Value>, String> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('{') || trimmed.starts_with('[') {
        // A JSON stream: one or more concatenated values, a top-level array contributing its items.
        let mut out = Vec::new();
        for value in serde_json::Deserializer::from_str(text).into_iter::<Value>() {
            match value {
                Ok(Value::Array(items)) => out.extend(items),
                Ok(v) => out.push(v),
                Err(e) => return Err(format!("json: {e}")),
            }
        }
        return Ok(out);
    }
    // YAML 1.2 booleans: only `true` and `false`, so a name like `n` or `on` stays a string.
    // Octal as kubectl reads it (YAML 1.1): `defaultMode: 0644` is 420, as every manifest
    // written for Kubernetes means it.
    let options = serde_saphyr::options! { strict_booleans: true, legacy_octal_numbers: true };
    serde_saphyr::from_multiple_with_options::<Value>(text, options).map_err(|e| format!("yaml: {e}"))
}

fn label_of(value: &Value) -> String {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("<no kind>");
    let name = value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<no name>");
    format!("{kind}/{name}")
}

fn type_object(value: Value) -> Result<Object, String> {
    if !value.is_object() {
        return Err(format!(
            "not a Kubernetes object: a document must be a mapping, found {}",
            kvol_api::json_kind(&value)
        ));
    }
    let label = label_of(&value);
    let kind = value.get("kind").and_then(Value::as_str).ok_or(format!("{label}: missing \"kind\""))?;
    let Some(&(kind, want, is_namespaced)) = KINDS.iter().find(|(k, _, _)| *k == kind) else {
        return Err(format!(
            "unsupported kind {kind:?} ({label}): the manifests source reads {}",
            kinds_read()
        ));
    };
    let api_version =
        value.get("apiVersion").and_then(Value::as_str).ok_or(format!("{label}: missing \"apiVersion\""))?;
    if api_version != want {
        return Err(format!("unsupported apiVersion {api_version:?} for {label}: want {want:?}"));
    }
    let name = value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or_default();
    if name.is_empty() {
        return Err(format!("{label}: missing metadata.name"));
    }
    let namespace = value.pointer("/metadata/namespace").and_then(Value::as_str).unwrap_or_default();
    if name.contains('/') || (is_namespaced && namespace.contains('/')) {
        return Err(format!("{label}: a name or namespace must not contain \"/\""));
    }
    let invalid = |e: serde_json::Error| format!("invalid {label}: {e}");
    let mut object = match kind {
        "Pod" => Object::Pod(serde_json::from_value(value).map_err(invalid)?),
        "PersistentVolume" => Object::PersistentVolume(serde_json::from_value(value).map_err(invalid)?),
        "PersistentVolumeClaim" => {
            Object::PersistentVolumeClaim(serde_json::from_value(value).map_err(invalid)?)
        }
        "StorageClass" => Object::StorageClass(serde_json::from_value(value).map_err(invalid)?),
        "CSIDriver" => Object::CsiDriver(serde_json::from_value(value).map_err(invalid)?),
        "ConfigMap" => Object::ConfigMap(serde_json::from_value(value).map_err(invalid)?),
        "VolumeSnapshot" => Object::VolumeSnapshot(serde_json::from_value(value).map_err(invalid)?),
        "VolumeSnapshotClass" => Object::VolumeSnapshotClass(serde_json::from_value(value).map_err(invalid)?),
        "VolumeSnapshotContent" => {
            Object::VolumeSnapshotContent(serde_json::from_value(value).map_err(invalid)?)
        }
        _ => Object::Secret(serde_json::from_value(value).map_err(invalid)?),
    };
    complete(&mut object);
    validate(&object).map_err(|errors| format!("invalid {label}: {errors}"))?;
    Ok(object)
}

/// Checks the object as the API server would, plus kvol's rules for names that become paths
/// ([`kvol_api::validation`]); the error lists every bad field.
fn validate(object: &Object) -> Result<(), String> {
    use kvol_api::validation as v;
    let errors = match object {
        Object::Pod(o) => v::validate_pod(o),
        Object::PersistentVolume(o) => v::validate_persistent_volume(o),
        Object::PersistentVolumeClaim(o) => v::validate_claim(o),
        Object::StorageClass(o) => v::validate_storage_class(o),
        Object::CsiDriver(o) => v::validate_csi_driver(o),
        Object::Secret(o) => v::validate_secret(o),
        Object::ConfigMap(o) => v::validate_config_map(o),
        Object::VolumeSnapshot(o) => v::validate_volume_snapshot(o),
        Object::VolumeSnapshotClass(o) => v::validate_volume_snapshot_class(o),
        Object::VolumeSnapshotContent(o) => v::validate_volume_snapshot_content(o),
    };
    if errors.is_empty() {
        return Ok(());
    }
    Err(errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; "))
}

/// Fills in what the API server would: the default namespace, a pod's uid, a Secret's data.
fn complete(object: &mut Object) {
    let meta = match object {
        Object::Pod(o) => &mut Arc::make_mut(o).metadata,
        Object::PersistentVolumeClaim(o) => &mut o.metadata,
        Object::Secret(o) => &mut o.metadata,
        Object::ConfigMap(o) => &mut o.metadata,
        Object::VolumeSnapshot(o) => &mut o.metadata,
        Object::PersistentVolume(_)
        | Object::StorageClass(_)
        | Object::CsiDriver(_)
        | Object::VolumeSnapshotClass(_)
        | Object::VolumeSnapshotContent(_) => return,
    };
    if meta.namespace.as_deref().unwrap_or_default().is_empty() {
        meta.namespace = Some(DEFAULT_NAMESPACE.to_string());
    }
    match object {
        Object::Pod(pod) if pod.metadata.uid.as_deref().unwrap_or_default().is_empty() => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or(DEFAULT_NAMESPACE);
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            let uid = static_pod_uid(namespace, name);
            Arc::make_mut(pod).metadata.uid = Some(uid);
        }
        Object::Secret(secret) => {
            if let Some(strings) = secret.string_data.take() {
                let data = secret.data.get_or_insert_with(BTreeMap::new);
                for (key, value) in strings {
                    data.insert(key, ByteString(value.into_bytes()));
                }
            }
        }
        _ => {}
    }
}

/// Where an object of a set was read from, to name both places when it is defined twice.
#[derive(Clone, Debug)]
struct Place {
    origin: String,
    document: usize,
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} document {}", self.origin, self.document)
    }
}

/// Builds an object set, noting every object defined more than once.
#[derive(Debug, Default)]
pub(crate) struct SetBuilder {
    set: ObjectSet,
    places: BTreeMap<(&'static str, String), Place>,
}

impl SetBuilder {
    /// Adds the objects and problems of one file; an object already defined is replaced, with
    /// a problem naming both places.
    pub(crate) fn add(&mut self, origin: &str, objects: Vec<(usize, Object)>, problems: Vec<SourceProblem>) {
        self.set.problems.extend(problems);
        for (document, object) in objects {
            let key = object.key();
            let place = Place { origin: origin.to_string(), document };
            if let Some(earlier) = self.places.insert((object.kind(), key.clone()), place) {
                self.set.problems.push(SourceProblem {
                    origin: origin.to_string(),
                    document: Some(document),
                    reason: format!(
                        "{} {key} is also defined in {earlier}; the definition here is used",
                        object.kind()
                    ),
                });
            }
            match object {
                Object::Pod(o) => drop(self.set.pods.insert(key, o)),
                Object::PersistentVolume(o) => drop(self.set.persistent_volumes.insert(key, o)),
                Object::PersistentVolumeClaim(o) => drop(self.set.claims.insert(key, *o)),
                Object::StorageClass(o) => drop(self.set.storage_classes.insert(key, *o)),
                Object::CsiDriver(o) => drop(self.set.csi_drivers.insert(key, *o)),
                Object::Secret(o) => drop(self.set.secrets.insert(key, *o)),
                Object::ConfigMap(o) => drop(self.set.config_maps.insert(key, *o)),
                Object::VolumeSnapshot(o) => drop(self.set.volume_snapshots.insert(key, *o)),
                Object::VolumeSnapshotClass(o) => drop(self.set.snapshot_classes.insert(key, *o)),
                Object::VolumeSnapshotContent(o) => drop(self.set.snapshot_contents.insert(key, *o)),
            }
        }
    }

    /// Adds the documents of one stream (tests build sets this way).
    #[cfg(test)]
    pub(crate) fn add_text(&mut self, origin: &str, text: &str) {
        let (objects, problems) = parse_documents(origin, text);
        self.add(origin, objects, problems);
    }

    pub(crate) fn add_problem(&mut self, problem: SourceProblem) {
        self.set.problems.push(problem);
    }

    pub(crate) fn finish(self) -> ObjectSet {
        self.set
    }
}

/// Whether a file name is a manifest's: not a dot-file, ending in `.yaml`, `.yml` or `.json`.
pub fn is_manifest_name(name: &str) -> bool {
    !name.starts_with('.')
        && Path::new(name)
            .extension()
            .and_then(|e| e.to_str())
            .is_some_and(|e| matches!(e, "yaml" | "yml" | "json"))
}

/// Reads every manifest file directly in `dir` (see [`is_manifest_name`]; not recursive) in
/// name order into one object set. A file that cannot be read or parsed, or a directory that
/// cannot be listed, is a problem; the other files are still loaded. An object defined twice is
/// a problem naming both places, and the later definition wins. With a [`ParseCache`] kept
/// between loads, a file that read cleanly once and now has problems counts with its last
/// good objects (and says so) until it reads cleanly again or is removed.
pub fn load_dir(dir: &Path) -> ObjectSet {
    load_dir_cached(dir, &mut ParseCache::default())
}

/// What one file parsed to, with the file's identity when it was read.
#[derive(Debug)]
struct Parsed {
    identity: (u64, u64, Option<std::time::SystemTime>),
    /// The objects the file counts for: its own, or its last good ones while it has problems
    /// (shared with `last_good`, not copied: the objects of a hundred pods weigh megabytes).
    objects: Arc<Vec<(usize, Object)>>,
    problems: Vec<SourceProblem>,
    /// The objects of its last read without problems, if it had one.
    last_good: Option<Arc<Vec<(usize, Object)>>>,
}

/// Parsed files by path: a file whose inode, size and modification time are unchanged is not
/// read or parsed again, so a change to one manifest among hundreds costs one parse. With a
/// [`ManifestMemory`], each file's last clean text outlives the process: a file that is broken
/// when the agent starts keeps the objects it last read cleanly, as one that breaks while it runs.
#[derive(Debug, Default)]
pub struct ParseCache {
    files: BTreeMap<PathBuf, Parsed>,
    memory: Option<Arc<dyn ManifestMemory>>,
    /// What a load found to remember, written at its end in one go (one durable write for a
    /// hundred new files rather than one each).
    to_remember: Vec<(String, Option<String>)>,
}

/// Where each manifest file's last clean text is kept across restarts (the agent's journal).
pub trait ManifestMemory: Send + Sync + fmt::Debug {
    /// Every remembered file's text, by file name.
    fn recall(&self) -> BTreeMap<String, String>;
    /// Remembers `text` as file `name`'s last clean read; `None`: the file is gone.
    fn remember(&self, name: &str, text: Option<&str>);
    /// Remembers several files at once, as [`ManifestMemory::remember`] each would (a store
    /// makes them durable together).
    fn remember_all(&self, files: &[(String, Option<String>)]) {
        for (name, text) in files {
            self.remember(name, text.as_deref());
        }
    }
}

impl ParseCache {
    /// A cache that remembers through `memory`, starting from what it remembers of files in `dir`.
    pub fn with_memory(dir: &Path, memory: Arc<dyn ManifestMemory>) -> ParseCache {
        let mut files = BTreeMap::new();
        for (name, text) in memory.recall() {
            let path = dir.join(&name);
            let (objects, problems) = parse_documents(&path.display().to_string(), &text);
            if problems.is_empty() {
                let objects = Arc::new(objects);
                let parsed = Parsed {
                    identity: (0, 0, None),
                    objects: Arc::clone(&objects),
                    problems,
                    last_good: Some(objects),
                };
                files.insert(path, parsed);
            }
        }
        ParseCache { files, memory: Some(memory), to_remember: Vec::new() }
    }

    /// Notes `text` as the file's last clean read, remembered when the load ends.
    fn remember(&mut self, path: &Path, text: Option<&str>) {
        if let (Some(_), Some(name)) = (&self.memory, path.file_name().and_then(|n| n.to_str())) {
            self.to_remember.push((name.to_string(), text.map(str::to_string)));
        }
    }

    /// Remembers what the load noted, in one go.
    fn remember_noted(&mut self) {
        if let Some(memory) = &self.memory
            && !self.to_remember.is_empty()
        {
            memory.remember_all(&std::mem::take(&mut self.to_remember));
        }
    }
}

/// [`load_dir`], reusing `cache` for files that did not change (and updating it).
pub fn load_dir_cached(dir: &Path, cache: &mut ParseCache) -> ObjectSet {
    let mut builder = SetBuilder::default();
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) => {
            builder.add_problem(SourceProblem {
                origin: dir.display().to_string(),
                document: None,
                reason: format!("cannot list the manifests directory: {e}"),
            });
            return builder.finish();
        }
    };
    let mut names = Vec::new();
    for entry in entries {
        match entry {
            Ok(entry) => {
                if let Some(name) = entry.file_name().to_str()
                    && is_manifest_name(name)
                {
                    names.push(name.to_string());
                }
            }
            Err(e) => builder.add_problem(SourceProblem {
                origin: dir.display().to_string(),
                document: None,
                reason: format!("cannot list the manifests directory: {e}"),
            }),
        }
    }
    names.sort();
    let gone: Vec<PathBuf> = cache
        .files
        .keys()
        .filter(|path| {
            !path.file_name().and_then(|n| n.to_str()).is_some_and(|n| names.iter().any(|m| m == n))
        })
        .cloned()
        .collect();
    for path in gone {
        cache.files.remove(&path);
        cache.remember(&path, None);
    }
    for name in names {
        let path = dir.join(&name);
        let origin = path.display().to_string();
        // Follows symlinks: a linked manifest counts, a directory named like one does not.
        let identity = match fs::metadata(&path) {
            Ok(meta) if !meta.is_file() => continue,
            // Removed since the listing: the change that removed it brings another rebuild.
            Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
            Ok(meta) => {
                use std::os::unix::fs::MetadataExt;
                Some((meta.ino(), meta.len(), meta.modified().ok()))
            }
            Err(_) => None,
        };
        if let (Some(identity), Some(parsed)) = (identity, cache.files.get(&path))
            && parsed.identity == identity
        {
            builder.add(&origin, Vec::clone(&parsed.objects), parsed.problems.clone());
            continue;
        }
        match fs::read_to_string(&path) {
            Ok(text) => {
                let (objects, mut problems) = parse_documents(&origin, &text);
                if problems.is_empty() {
                    cache.remember(&path, Some(&text));
                }
                let last_good = cache.files.get(&path).and_then(|p| p.last_good.clone());
                let (objects, last_good) = match last_good {
                    _ if problems.is_empty() => {
                        let objects = Arc::new(objects);
                        (Arc::clone(&objects), Some(objects))
                    }
                    // A file that read cleanly before and now does not (an edit in progress, a
                    // typo) keeps its last good objects: its pods' volumes are not torn down.
                    Some(good) => {
                        problems.push(SourceProblem {
                            origin: origin.clone(),
                            document: None,
                            reason: format!(
                                "keeping the {} object(s) last read from it until it reads without problems",
                                good.len()
                            ),
                        });
                        (Arc::clone(&good), Some(good))
                    }
                    None => (Arc::new(objects), None),
                };
                builder.add(&origin, Vec::clone(&objects), problems.clone());
                if let Some(identity) = identity {
                    cache.files.insert(path.clone(), Parsed { identity, objects, problems, last_good });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => builder.add_problem(SourceProblem {
                origin,
                document: None,
                reason: format!("cannot read: {e}"),
            }),
        }
    }
    cache.remember_noted();
    builder.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Parses and describes the outcome: objects as `Kind key`, problems as their display.
    fn outcome(text: &str) -> Vec<String> {
        let (objects, problems) = parse_manifests("m.yaml", text);
        objects.iter().map(|o| o.to_string()).chain(problems.iter().map(|p| format!("problem {p}"))).collect()
    }

    #[test]
    fn streams_are_split_typed_and_defaulted() {
        // (what, input, objects then problems)
        let cases: &[(&str, &str, &[&str])] = &[
            ("empty", "", &[]),
            ("empty documents are skipped", "---\n---\n", &[]),
            (
                "every kind",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n---\n\
                 apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv}\n---\n\
                 apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: c, namespace: ns}\n---\n\
                 apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: sc}\n\
                 provisioner: x\n---\n\
                 apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: d.example.com}\n\
                 spec: {}\n---\n\
                 apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n",
                &[
                    "Pod default/p",
                    "PersistentVolume pv",
                    "PersistentVolumeClaim ns/c",
                    "StorageClass sc",
                    "CSIDriver d.example.com",
                    "Secret default/s",
                ],
            ),
            (
                "a list is expanded and its items numbered",
                "apiVersion: v1\nkind: List\nitems:\n\
                 - {apiVersion: v1, kind: Pod, metadata: {name: a}}\n\
                 - {apiVersion: v1, kind: Service, metadata: {name: c}}\n\
                 ---\napiVersion: v1\nkind: Pod\nmetadata: {name: b}\n",
                &[
                    "Pod default/a",
                    "Pod default/b",
                    "problem m.yaml document 2: unsupported kind \"Service\" (Service/c): the manifests \
                     source reads Pod, PersistentVolume, PersistentVolumeClaim, StorageClass, CSIDriver, \
                     Secret, ConfigMap, VolumeSnapshot, VolumeSnapshotClass and VolumeSnapshotContent",
                ],
            ),
            (
                "a json stream",
                concat!(
                    r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","namespace":"x"}} "#,
                    r#"[{"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"q"}}]"#,
                ),
                &["Pod x/p", "PersistentVolume q"],
            ),
            (
                "a wrong apiVersion",
                "apiVersion: storage.k8s.io/v1beta1\nkind: CSIDriver\nmetadata: {name: d}\n",
                &["problem m.yaml document 1: unsupported apiVersion \"storage.k8s.io/v1beta1\" for \
                     CSIDriver/d: want \"storage.k8s.io/v1\""],
            ),
            (
                "no kind",
                "apiVersion: v1\nmetadata: {name: p}\n",
                &["problem m.yaml document 1: <no kind>/p: missing \"kind\""],
            ),
            (
                "no apiVersion",
                "kind: Pod\nmetadata: {name: p}\n",
                &["problem m.yaml document 1: Pod/p: missing \"apiVersion\""],
            ),
            (
                "no name",
                "apiVersion: v1\nkind: Secret\nmetadata: {generateName: s-}\n",
                &["problem m.yaml document 1: Secret/<no name>: missing metadata.name"],
            ),
            (
                "a slash in a name",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: a/b}\n",
                &["problem m.yaml document 1: Pod/a/b: a name or namespace must not contain \"/\""],
            ),
            (
                "not a mapping",
                "- a\n- b\n",
                &["problem m.yaml document 1: not a Kubernetes object: a document must be a mapping, \
                     found a list"],
            ),
            (
                "strict booleans keep `on` a string",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: on}\n",
                &["Pod default/on"],
            ),
            (
                "a malformed stream is one problem for the file",
                "apiVersion: v1\nkind: Pod\nmetadata: [1, 2\n",
                &["problem m.yaml: cannot parse as YAML or JSON: yaml: "],
            ),
        ];
        for (what, input, want) in cases {
            let got = outcome(input);
            let matches = got.len() == want.len()
                && got
                    .iter()
                    .zip(want.iter())
                    .all(|(g, w)| if w.ends_with(": ") { g.starts_with(w) } else { g == w });
            assert!(matches, "{what}: got {got:#?}, want {want:#?}");
        }
    }

    #[test]
    fn invalid_objects_name_document_object_and_reason() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\n---\n\
                    apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: bad, namespace: ns}\n\
                    spec: {accessModes: 5}\n";
        let (objects, problems) = parse_manifests("dir/c.yaml", text);
        assert_eq!(objects.len(), 1);
        assert_eq!(problems.len(), 1);
        assert_eq!(problems[0].origin, "dir/c.yaml");
        assert_eq!(problems[0].document, Some(2));
        assert!(
            problems[0].reason.starts_with("invalid PersistentVolumeClaim/bad: invalid type: integer `5`"),
            "{}",
            problems[0].reason
        );
    }

    #[test]
    fn config_maps_are_read_and_modes_in_octal_mean_what_kubectl_reads() {
        let text = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: \"1\"}\n---\n\
                    apiVersion: v1\nkind: ConfigMap\nmetadata: {name: twice}\ndata: {a: x}\nbinaryData: {a: eA==}\n---\n\
                    apiVersion: v1\nkind: Pod\nmetadata: {name: p}\n\
                    spec: {volumes: [{name: s, secret: {secretName: s, defaultMode: 0400, items: [{key: k, path: k, mode: 0o600}]}}]}\n";
        let (objects, problems) = parse_manifests("dir/m.yaml", text);
        assert_eq!(
            objects.iter().map(ToString::to_string).collect::<Vec<_>>(),
            ["ConfigMap default/cfg", "Pod default/p"]
        );
        let reasons: Vec<&str> = problems.iter().map(|p| p.reason.as_str()).collect();
        assert_eq!(reasons.len(), 1, "{reasons:?}");
        assert!(reasons[0].starts_with("invalid ConfigMap/twice: binaryData[a]"), "{reasons:?}");
        let Object::Pod(pod) = &objects[1] else { panic!() };
        let secret = pod.spec.as_ref().unwrap().volumes.as_ref().unwrap()[0].secret.clone().unwrap();
        assert_eq!(secret.default_mode, Some(0o400), "0400 is octal, as kubectl reads it");
        assert_eq!(secret.items.unwrap()[0].mode, Some(0o600));
    }

    #[test]
    fn objects_with_names_that_would_escape_are_problems_and_nothing_else_is_affected() {
        let text = "apiVersion: v1\nkind: Pod\nmetadata: {name: ok}\n\
                    spec: {volumes: [{name: cache, emptyDir: {}}]}\n---\n\
                    apiVersion: v1\nkind: Pod\nmetadata: {name: evil}\n\
                    spec: {volumes: [{name: a, emptyDir: {}}, {name: b, emptyDir: {}}, \
                    {name: ../../../../../../../../srv/victim, emptyDir: {}}]}\n---\n\
                    apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: ../../etc}\n---\n\
                    apiVersion: v1\nkind: Pod\nmetadata: {name: Upper, namespace: \"a%2Fb\"}\n---\n\
                    apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: pv}\n\
                    spec: {hostPath: {path: /srv/../etc}}\n---\n\
                    apiVersion: storage.k8s.io/v1\nkind: CSIDriver\nmetadata: {name: \"..\"}\n";
        let (objects, problems) = parse_manifests("dir/evil.yaml", text);
        assert_eq!(objects.iter().map(Object::key).collect::<Vec<_>>(), ["default/ok"]);
        let got: Vec<(Option<usize>, &str)> =
            problems.iter().map(|p| (p.document, p.reason.as_str())).collect();
        let want = [
            (
                Some(2),
                "invalid Pod/evil: spec.volumes[2].name: \"../../../../../../../../srv/victim\" is not a DNS-1123 label: it contains '.'",
            ),
            (
                Some(3),
                "invalid Pod/web: metadata.uid: \"../../etc\" is not a uid kvol accepts: it contains '.'",
            ),
            (
                Some(4),
                "invalid Pod/Upper: metadata.name: \"Upper\" is not a DNS-1123 subdomain: it contains 'U'",
            ),
            (
                Some(5),
                "invalid PersistentVolume/pv: spec.hostPath.path: \"/srv/../etc\" is not a clean absolute path: it has a \"..\" component",
            ),
            (
                Some(6),
                "invalid CSIDriver/..: metadata.name: \"..\" is not a CSI driver name: it has an empty part between dots",
            ),
        ];
        assert_eq!(got.len(), want.len(), "{got:#?}");
        for ((gd, g), (wd, w)) in got.iter().zip(want) {
            assert_eq!(*gd, wd);
            assert!(g.starts_with(w), "{g:?} vs {w:?}");
        }
        assert!(problems[2].reason.contains("metadata.namespace: \"a%2Fb\" is not a DNS-1123 label"));
        assert!(problems.iter().all(|p| p.origin == "dir/evil.yaml"));
    }

    #[test]
    fn pods_get_a_stable_uid_unless_they_have_one() {
        let uid_of = |text: &str| match parse_manifests("p.yaml", text).0.as_slice() {
            [Object::Pod(pod)] => pod.metadata.uid.clone().unwrap(),
            other => panic!("{other:?}"),
        };
        let plain = uid_of("apiVersion: v1\nkind: Pod\nmetadata: {name: web}\n");
        let edited = uid_of(
            "apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: default, labels: {a: b}}\n\
             spec: {containers: [{name: c, image: i}]}\n",
        );
        let other_ns = uid_of("apiVersion: v1\nkind: Pod\nmetadata: {name: web, namespace: other}\n");
        let given = uid_of("apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: u-1234}\n");
        assert_eq!(plain, edited, "an edit keeps the uid");
        assert_eq!(plain, static_pod_uid("default", "web"));
        assert_ne!(plain, other_ns);
        assert_eq!(given, "u-1234");
    }

    #[test]
    fn static_uids_are_version_8_uuids() {
        // (namespace, name): distinct inputs, including ones that would collide if joined carelessly.
        let cases = [("default", "web"), ("a", "b-c"), ("a-b", "c"), ("", "x")];
        let mut seen = std::collections::BTreeSet::new();
        for (namespace, name) in cases {
            let uid = static_pod_uid(namespace, name);
            let groups: Vec<usize> = uid.split('-').map(str::len).collect();
            assert_eq!(groups, [8, 4, 4, 4, 12], "{uid}");
            assert!(
                uid.chars().all(|c| c == '-' || c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{uid}"
            );
            assert_eq!(&uid[14..15], "8", "version nibble of {uid}");
            assert!(matches!(&uid[19..20], "8" | "9" | "a" | "b"), "variant of {uid}");
            assert!(seen.insert(uid.clone()), "{namespace}/{name} repeats {uid}");
        }
    }

    #[test]
    fn secret_string_data_is_merged_into_data() {
        let text = "apiVersion: v1\nkind: Secret\nmetadata: {name: s}\n\
                    data: {a: YQ==, b: Yg==}\nstringData: {b: B, c: C}\n";
        let (objects, problems) = parse_manifests("s.yaml", text);
        assert!(problems.is_empty(), "{problems:?}");
        let Object::Secret(secret) = &objects[0] else { panic!("{objects:?}") };
        let data: Vec<(String, Vec<u8>)> =
            secret.data.clone().unwrap().into_iter().map(|(k, v)| (k, v.0)).collect();
        let want = [("a", "a"), ("b", "B"), ("c", "C")];
        assert_eq!(data, want.map(|(k, v)| (k.to_string(), v.as_bytes().to_vec())));
        assert_eq!(secret.string_data, None);
    }

    #[test]
    fn duplicates_name_both_places_and_the_last_wins() {
        let mut builder = SetBuilder::default();
        builder.add_text("a.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {v: one}}\n");
        builder.add_text(
            "b.yaml",
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: p}\n---\n\
             apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: default, labels: {v: two}}\n",
        );
        let set = builder.finish();
        let problems: Vec<String> = set.problems.iter().map(ToString::to_string).collect();
        assert_eq!(
            problems,
            ["b.yaml document 2: Pod default/p is also defined in a.yaml document 1; the definition here \
                 is used"]
        );
        assert_eq!(set.pods["default/p"].metadata.labels.as_ref().unwrap()["v"], "two");
        assert!(set.persistent_volumes.contains_key("p"), "a PV of the same name is another object");
    }

    #[test]
    fn manifest_names() {
        let cases = [
            ("pod.yaml", true),
            ("pod.yml", true),
            ("pod.json", true),
            ("pod.YAML", false),
            (".pod.yaml", false),
            (".pod.yaml.tmp", false),
            ("pod.yaml~", false),
            ("pod.yaml.swp", false),
            ("README", false),
            ("yaml", false),
        ];
        for (name, want) in cases {
            assert_eq!(is_manifest_name(name), want, "{name}");
        }
    }

    #[test]
    fn load_dir_reads_manifests_in_name_order_and_reports_bad_files() {
        let dir = tempfile::tempdir().unwrap();
        let write = |name: &str, text: &str| fs::write(dir.path().join(name), text).unwrap();
        write("b.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: p, labels: {from: b}}\n");
        write("a.json", r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p","labels":{"from":"a"}}}"#);
        write("c.yml", "apiVersion: v1\nkind: Secret\nmetadata: [\n");
        write(".hidden.yaml", "apiVersion: v1\nkind: Pod\nmetadata: {name: hidden}\n");
        write("notes.txt", "not yaml: [");
        fs::write(dir.path().join("d.yaml"), [0xff, 0xfe, 0x00]).unwrap();
        fs::create_dir(dir.path().join("sub.yaml")).unwrap();
        let set = load_dir(dir.path());
        let at = |name: &str| dir.path().join(name).display().to_string();
        assert_eq!(set.pods.keys().collect::<Vec<_>>(), ["default/p"]);
        assert_eq!(
            set.pods["default/p"].metadata.labels.as_ref().unwrap()["from"],
            "b",
            "name order: b after a"
        );
        let problems: Vec<String> = set.problems.iter().map(ToString::to_string).collect();
        assert_eq!(problems.len(), 3, "{problems:#?}");
        assert_eq!(
            problems[0],
            format!(
                "{} document 1: Pod default/p is also defined in {} document 1; the definition here is used",
                at("b.yaml"),
                at("a.json")
            )
        );
        assert!(
            problems[1].starts_with(&format!("{}: cannot parse as YAML or JSON: ", at("c.yml"))),
            "{}",
            problems[1]
        );
        assert_eq!(problems[2], format!("{}: cannot read: stream did not contain valid UTF-8", at("d.yaml")));
        assert!(set.secrets.is_empty() && set.persistent_volumes.is_empty(), "nothing from the bad files");

        let missing = load_dir(&dir.path().join("missing"));
        assert_eq!(missing.problems.len(), 1);
        assert!(missing.problems[0].reason.starts_with("cannot list the manifests directory: "));
    }
}
