//! The external storage e2e driver definition (`e2e.test -storage.testdriver=FILE`) read as upstream reads it: Go's JSON field matching, upstream's defaults, unknown keys warned about; pure.
//!
//! Facts from upstream (`test/e2e/storage/external/external.go`, `driverDefinition`, and
//! `test/e2e/storage/framework/testdriver.go`, `DriverInfo` and the `Cap*` constants): field
//! names match case-insensitively (Go's `encoding/json`); `SupportedFsType` defaults to the set
//! holding only `""` (the driver's default filesystem) and `SupportedSizeRange.Min` to `5Gi`;
//! with `controllerExpansion` set, `onlineExpansion` and `offlineExpansion` default to true;
//! sets (`SupportedFsType`, `SupportedMountOption`) are maps whose keys are the members.
//! Upstream decodes loosely (an unknown key is dropped without a word); kvol says each one.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

use serde_json::{Map, Value};

/// Where the storage class (or snapshot class) of the tests comes from.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum ClassSource {
    /// Not given: the tests that need the class are skipped.
    #[default]
    None,
    /// A class with the driver's name as provisioner and no parameters.
    FromName,
    /// A class read from this file (relative paths: beside the definition).
    FromFile(PathBuf),
    /// A class installed in a cluster under this name; with no cluster its parameters are
    /// unknown, so kvol uses the driver's name and no parameters and says so.
    FromExistingClassName(String),
}

impl ClassSource {
    pub fn is_set(&self) -> bool {
        !matches!(self, ClassSource::None)
    }
}

/// One `InlineVolumes` entry: a CSI ephemeral volume's attributes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct InlineVolume {
    pub attributes: BTreeMap<String, String>,
    /// Two pods with the same definition see the same data.
    pub shared: bool,
    /// The driver mounts it read-only only.
    pub read_only: bool,
}

/// The capabilities upstream's framework knows, by their YAML names.
pub const KNOWN_CAPABILITIES: [&str; 23] = [
    "persistence",
    "block",
    "fsGroup",
    "volumeMountGroup",
    "exec",
    "snapshotDataSource",
    "pvcDataSource",
    "offlineSnapshotClone",
    "multipods",
    "RWX",
    "controllerExpansion",
    "nodeExpansion",
    "offlineExpansion",
    "onlineExpansion",
    "volumeLimits",
    "singleNodeVolume",
    "topology",
    "capacity",
    "FSResizeFromSourceNotSupported",
    "readWriteOncePod",
    "multiplePVsSameID",
    "capReadOnlyMany",
    "volumeGroupSnapshot",
];

/// `DriverInfo`: what the driver says it is and can do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverInfo {
    pub name: String,
    pub max_file_size: Option<i64>,
    /// `SupportedSizeRange`: the smallest and largest volume, as quantities.
    pub size_min: String,
    pub size_max: Option<String>,
    /// `""` is the driver's default filesystem.
    pub fs_types: BTreeSet<String>,
    pub mount_options: BTreeSet<String>,
    pub required_mount_options: BTreeSet<String>,
    /// Capability name (as in [`KNOWN_CAPABILITIES`]) → value; unknown names are dropped.
    pub capabilities: BTreeMap<String, bool>,
    pub topology_keys: Vec<String>,
    pub num_allowed_topologies: i64,
    pub required_access_modes: Vec<String>,
}

impl Default for DriverInfo {
    fn default() -> DriverInfo {
        DriverInfo {
            name: String::new(),
            max_file_size: None,
            size_min: "5Gi".to_string(),
            size_max: None,
            fs_types: BTreeSet::from([String::new()]),
            mount_options: BTreeSet::new(),
            required_mount_options: BTreeSet::new(),
            capabilities: BTreeMap::new(),
            topology_keys: Vec::new(),
            num_allowed_topologies: 0,
            required_access_modes: Vec::new(),
        }
    }
}

impl DriverInfo {
    /// Whether the capability is set to true (an absent one is false).
    pub fn has(&self, capability: &str) -> bool {
        self.capabilities.get(capability).copied().unwrap_or(false)
    }
}

/// A whole driver definition and what reading it had to say.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverDefinition {
    pub short_name: Option<String>,
    pub storage_class: ClassSource,
    pub snapshot_class: ClassSource,
    pub inline_volumes: Vec<InlineVolume>,
    pub driver_info: DriverInfo,
    /// Keys kvol does not know (or knows and does not use), each with its path in the file.
    pub warnings: Vec<String>,
}

/// Why a definition cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DefinitionError {
    #[error("driver definition {file}: not YAML or JSON: {reason}")]
    Syntax { file: String, reason: String },
    #[error("driver definition {file}: {field}: {reason}")]
    Field { file: String, field: String, reason: String },
}

/// Keys upstream reads and kvol has no use for on one node; said once each, not fatal.
const IGNORED_TOP: [&str; 5] =
    ["ClientNodeName", "NodeSelectors", "Timeouts", "VolumeAttributesClass", "ShortName"];
const IGNORED_INFO: [&str; 6] = [
    "InTreePluginName",
    "TestTags",
    "StressTestOptions",
    "VolumeSnapshotStressTestOptions",
    "PerformanceTestOptions",
    "FeatureTag",
];

/// Parses a definition's text; `file` names it in errors and warnings.
pub fn parse(text: &str, file: &str) -> Result<DriverDefinition, DefinitionError> {
    let value: Value = serde_saphyr::from_str(text)
        .map_err(|e| DefinitionError::Syntax { file: file.to_string(), reason: e.to_string() })?;
    let top = match value {
        Value::Object(map) => map,
        Value::Null => Map::new(),
        other => {
            return Err(field_error(
                file,
                "",
                format!("expected a mapping, found {}", kvol_api::json_kind(&other)),
            ));
        }
    };
    let mut reader = Reader { file, warnings: Vec::new() };
    let mut definition = DriverDefinition::default();
    for (key, value) in &top {
        match canonical(key, &["StorageClass", "SnapshotClass", "InlineVolumes", "DriverInfo", "ShortName"])
            .or_else(|| canonical(key, &IGNORED_TOP))
        {
            Some("StorageClass") => definition.storage_class = reader.class(value, "StorageClass")?,
            Some("SnapshotClass") => definition.snapshot_class = reader.class(value, "SnapshotClass")?,
            Some("InlineVolumes") => definition.inline_volumes = reader.inline_volumes(value)?,
            Some("DriverInfo") => definition.driver_info = reader.driver_info(value)?,
            Some("ShortName") => definition.short_name = Some(reader.string(value, "ShortName")?),
            Some(known) => reader.warn(format!("{known}: read by upstream, not used by kvol on one node")),
            None => reader.warn(format!("{key}: unknown key, ignored")),
        }
    }
    if definition.driver_info.name.is_empty() {
        return Err(field_error(file, "DriverInfo.Name", "not set".to_string()));
    }
    apply_expansion_defaults(&mut definition.driver_info.capabilities);
    definition.warnings = reader.warnings;
    Ok(definition)
}

/// Upstream's backward compatibility: `controllerExpansion` turns on online and offline
/// expansion unless the file says otherwise.
fn apply_expansion_defaults(capabilities: &mut BTreeMap<String, bool>) {
    if capabilities.get("controllerExpansion").copied().unwrap_or(false) {
        for implied in ["onlineExpansion", "offlineExpansion"] {
            capabilities.entry(implied.to_string()).or_insert(true);
        }
    }
}

/// The spelling in `names` that `key` matches as Go's JSON decoder matches field names.
fn canonical(key: &str, names: &[&'static str]) -> Option<&'static str> {
    names.iter().find(|n| **n == key).or_else(|| names.iter().find(|n| n.eq_ignore_ascii_case(key))).copied()
}

fn field_error(file: &str, field: &str, reason: String) -> DefinitionError {
    DefinitionError::Field { file: file.to_string(), field: field.to_string(), reason }
}

struct Reader<'a> {
    file: &'a str,
    warnings: Vec<String>,
}

impl Reader<'_> {
    fn warn(&mut self, warning: String) {
        self.warnings.push(warning);
    }

    fn error(&self, field: &str, reason: String) -> DefinitionError {
        field_error(self.file, field, reason)
    }

    fn object<'v>(
        &self,
        value: &'v Value,
        field: &str,
    ) -> Result<Option<&'v Map<String, Value>>, DefinitionError> {
        match value {
            Value::Object(map) => Ok(Some(map)),
            Value::Null => Ok(None),
            other => {
                Err(self.error(field, format!("expected a mapping, found {}", kvol_api::json_kind(other))))
            }
        }
    }

    fn string(&self, value: &Value, field: &str) -> Result<String, DefinitionError> {
        match value {
            Value::String(s) => Ok(s.clone()),
            Value::Null => Ok(String::new()),
            // Quantities such as `Min: 1` arrive as numbers.
            Value::Number(n) => Ok(n.to_string()),
            other => {
                Err(self.error(field, format!("expected a string, found {}", kvol_api::json_kind(other))))
            }
        }
    }

    fn boolean(&self, value: &Value, field: &str) -> Result<bool, DefinitionError> {
        match value {
            Value::Bool(b) => Ok(*b),
            Value::Null => Ok(false),
            other => {
                Err(self
                    .error(field, format!("expected true or false, found {}", kvol_api::json_kind(other))))
            }
        }
    }

    fn integer(&self, value: &Value, field: &str) -> Result<i64, DefinitionError> {
        value.as_i64().ok_or_else(|| {
            self.error(field, format!("expected a whole number, found {}", kvol_api::json_kind(value)))
        })
    }

    fn class(&mut self, value: &Value, field: &str) -> Result<ClassSource, DefinitionError> {
        let Some(map) = self.object(value, field)? else { return Ok(ClassSource::None) };
        let mut from_name = false;
        let mut from_file = String::new();
        let mut existing = String::new();
        for (key, v) in map {
            let path = format!("{field}.{key}");
            match canonical(key, &["FromName", "FromFile", "FromExistingClassName"]) {
                Some("FromName") => from_name = self.boolean(v, &path)?,
                Some("FromFile") => from_file = self.string(v, &path)?,
                Some(_) => existing = self.string(v, &path)?,
                None => self.warn(format!("{path}: unknown key, ignored")),
            }
        }
        // Upstream's order: FromName, then FromExistingClassName, then FromFile.
        Ok(if from_name {
            ClassSource::FromName
        } else if !existing.is_empty() {
            ClassSource::FromExistingClassName(existing)
        } else if !from_file.is_empty() {
            ClassSource::FromFile(PathBuf::from(from_file))
        } else {
            ClassSource::None
        })
    }

    fn inline_volumes(&mut self, value: &Value) -> Result<Vec<InlineVolume>, DefinitionError> {
        let items = match value {
            Value::Array(items) => items,
            Value::Null => return Ok(Vec::new()),
            other => {
                return Err(self.error(
                    "InlineVolumes",
                    format!("expected a list, found {}", kvol_api::json_kind(other)),
                ));
            }
        };
        let mut volumes = Vec::new();
        for (i, item) in items.iter().enumerate() {
            let field = format!("InlineVolumes[{i}]");
            let mut volume = InlineVolume::default();
            for (key, v) in self.object(item, &field)?.into_iter().flatten() {
                let path = format!("{field}.{key}");
                match canonical(key, &["Attributes", "Shared", "ReadOnly"]) {
                    Some("Attributes") => volume.attributes = self.string_map(v, &path)?,
                    Some("Shared") => volume.shared = self.boolean(v, &path)?,
                    Some(_) => volume.read_only = self.boolean(v, &path)?,
                    None => self.warn(format!("{path}: unknown key, ignored")),
                }
            }
            volumes.push(volume);
        }
        Ok(volumes)
    }

    fn string_map(&self, value: &Value, field: &str) -> Result<BTreeMap<String, String>, DefinitionError> {
        let mut map = BTreeMap::new();
        for (k, v) in self.object(value, field)?.into_iter().flatten() {
            map.insert(k.clone(), self.string(v, &format!("{field}.{k}"))?);
        }
        Ok(map)
    }

    /// A Go `sets.String`: a mapping whose keys are the members (a list is taken too).
    fn set(&self, value: &Value, field: &str) -> Result<BTreeSet<String>, DefinitionError> {
        match value {
            Value::Object(map) => Ok(map.keys().cloned().collect()),
            Value::Array(items) => items.iter().map(|v| self.string(v, field)).collect(),
            Value::Null => Ok(BTreeSet::new()),
            other => Err(self.error(
                field,
                format!("expected a mapping of members, found {}", kvol_api::json_kind(other)),
            )),
        }
    }

    fn strings(&self, value: &Value, field: &str) -> Result<Vec<String>, DefinitionError> {
        match value {
            Value::Array(items) => items.iter().map(|v| self.string(v, field)).collect(),
            Value::Null => Ok(Vec::new()),
            other => Err(self.error(field, format!("expected a list, found {}", kvol_api::json_kind(other)))),
        }
    }

    fn driver_info(&mut self, value: &Value) -> Result<DriverInfo, DefinitionError> {
        let mut info = DriverInfo::default();
        const FIELDS: [&str; 11] = [
            "Name",
            "MaxFileSize",
            "SupportedSizeRange",
            "SupportedFsType",
            "SupportedMountOption",
            "RequiredMountOption",
            "Capabilities",
            "TopologyKeys",
            "NumAllowedTopologies",
            "RequiredAccessModes",
            "InTreePluginName",
        ];
        for (key, v) in self.object(value, "DriverInfo")?.into_iter().flatten() {
            let path = format!("DriverInfo.{key}");
            match canonical(key, &FIELDS).or_else(|| canonical(key, &IGNORED_INFO)) {
                Some("Name") => info.name = self.string(v, &path)?,
                Some("MaxFileSize") => info.max_file_size = Some(self.integer(v, &path)?),
                Some("SupportedSizeRange") => self.size_range(v, &path, &mut info)?,
                Some("SupportedFsType") => info.fs_types = self.set(v, &path)?,
                Some("SupportedMountOption") => info.mount_options = self.set(v, &path)?,
                Some("RequiredMountOption") => info.required_mount_options = self.set(v, &path)?,
                Some("Capabilities") => info.capabilities = self.capabilities(v, &path)?,
                Some("TopologyKeys") => info.topology_keys = self.strings(v, &path)?,
                Some("NumAllowedTopologies") => info.num_allowed_topologies = self.integer(v, &path)?,
                Some("RequiredAccessModes") => info.required_access_modes = self.strings(v, &path)?,
                Some(known) => self.warn(format!("DriverInfo.{known}: read by upstream, not used by kvol")),
                None => self.warn(format!("{path}: unknown key, ignored")),
            }
        }
        Ok(info)
    }

    fn size_range(
        &mut self,
        value: &Value,
        field: &str,
        info: &mut DriverInfo,
    ) -> Result<(), DefinitionError> {
        for (key, v) in self.object(value, field)?.into_iter().flatten() {
            let path = format!("{field}.{key}");
            let quantity = match canonical(key, &["Min", "Max"]) {
                Some(_) => self.string(v, &path)?,
                None => {
                    self.warn(format!("{path}: unknown key, ignored"));
                    continue;
                }
            };
            if !quantity.is_empty() {
                kvol_api::quantity::parse_bytes(&quantity).map_err(|e| self.error(&path, e.to_string()))?;
            }
            match canonical(key, &["Min", "Max"]) {
                Some("Min") => info.size_min = quantity,
                _ => info.size_max = (!quantity.is_empty()).then_some(quantity),
            }
        }
        Ok(())
    }

    fn capabilities(
        &mut self,
        value: &Value,
        field: &str,
    ) -> Result<BTreeMap<String, bool>, DefinitionError> {
        let mut capabilities = BTreeMap::new();
        for (key, v) in self.object(value, field)?.into_iter().flatten() {
            let path = format!("{field}.{key}");
            let on = self.boolean(v, &path)?;
            // Capabilities are a map keyed by string: Go matches them exactly.
            if KNOWN_CAPABILITIES.contains(&key.as_str()) {
                capabilities.insert(key.clone(), on);
            } else {
                self.warn(format!("{path}: unknown capability, ignored"));
            }
        }
        Ok(capabilities)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The hostpath project's own definition (deploy/kubernetes-1.27/test-driver.yaml), in our words.
    const HOSTPATH: &str = "
StorageClass:
  FromName: true
SnapshotClass:
  FromName: true
DriverInfo:
  Name: hostpath.csi.k8s.io
  SupportedSizeRange:
    Min: 1Mi
  Capabilities:
    block: true
    controllerExpansion: true
    exec: true
    multipods: true
    nodeExpansion: true
    persistence: true
    singleNodeVolume: true
    snapshotDataSource: true
    topology: true
    FSResizeFromSourceNotSupported: true
InlineVolumes:
- shared: true
";

    #[test]
    fn the_hostpath_projects_definition_reads_with_upstreams_defaults() {
        let d = parse(HOSTPATH, "test-driver.yaml").unwrap();
        assert_eq!(d.driver_info.name, "hostpath.csi.k8s.io");
        assert_eq!(d.storage_class, ClassSource::FromName);
        assert_eq!(d.snapshot_class, ClassSource::FromName);
        assert_eq!(d.inline_volumes, [InlineVolume { shared: true, ..InlineVolume::default() }]);
        assert_eq!(d.driver_info.size_min, "1Mi");
        assert_eq!(d.driver_info.fs_types, BTreeSet::from([String::new()]));
        // controllerExpansion implies both expansion modes.
        assert!(d.driver_info.has("onlineExpansion") && d.driver_info.has("offlineExpansion"));
        assert!(d.driver_info.has("FSResizeFromSourceNotSupported"));
        assert!(!d.driver_info.has("pvcDataSource"));
        assert_eq!(d.warnings, Vec::<String>::new());
    }

    #[test]
    fn fields_and_their_readings() {
        // (text, what must hold)
        type Check = fn(&DriverDefinition) -> bool;
        let table: [(&str, Check); 10] = [
            ("DriverInfo: {Name: d}", |d| {
                d.storage_class == ClassSource::None && d.driver_info.size_min == "5Gi"
            }),
            ("driverinfo: {name: d}\nstorageclass: {fromname: true}", |d| {
                d.driver_info.name == "d" && d.storage_class == ClassSource::FromName
            }),
            ("DriverInfo: {Name: d}\nStorageClass: {FromFile: sc.yaml}", |d| {
                d.storage_class == ClassSource::FromFile("sc.yaml".into())
            }),
            ("DriverInfo: {Name: d}\nStorageClass: {FromExistingClassName: fast, FromFile: x}", |d| {
                d.storage_class == ClassSource::FromExistingClassName("fast".into())
            }),
            ("DriverInfo: {Name: d, SupportedFsType: {ext4: {}, xfs: {}}}", |d| {
                d.driver_info.fs_types == BTreeSet::from(["ext4".into(), "xfs".into()])
            }),
            ("DriverInfo: {Name: d, SupportedMountOption: {dirsync: {}}}", |d| {
                d.driver_info.mount_options == BTreeSet::from(["dirsync".into()])
            }),
            (
                "DriverInfo: {Name: d, Capabilities: {controllerExpansion: true, onlineExpansion: false}}",
                |d| !d.driver_info.has("onlineExpansion") && d.driver_info.has("offlineExpansion"),
            ),
            (
                "DriverInfo: {Name: d, TopologyKeys: [topology.kubernetes.io/zone], NumAllowedTopologies: 2}",
                |d| {
                    d.driver_info.topology_keys == ["topology.kubernetes.io/zone"]
                        && d.driver_info.num_allowed_topologies == 2
                },
            ),
            ("DriverInfo: {Name: d}\nInlineVolumes: [{Attributes: {size: 1Mi}, ReadOnly: true}]", |d| {
                d.inline_volumes[0].read_only && d.inline_volumes[0].attributes["size"] == "1Mi"
            }),
            (
                "{\"DriverInfo\": {\"Name\": \"d\", \"SupportedSizeRange\": {\"Min\": \"1Gi\", \"Max\": \"8Gi\"}}}",
                |d| d.driver_info.size_max.as_deref() == Some("8Gi"),
            ),
        ];
        for (text, check) in table {
            let d = parse(text, "f.yaml").unwrap_or_else(|e| panic!("{text}: {e}"));
            assert!(check(&d), "{text}: {d:?}");
        }
    }

    #[test]
    fn unknown_keys_are_warnings_and_bad_values_are_errors() {
        let warned = [
            ("DriverInfo: {Name: d}\nBogus: 1", "Bogus: unknown key, ignored"),
            ("DriverInfo: {Name: d, Colour: red}", "DriverInfo.Colour: unknown key, ignored"),
            (
                "DriverInfo: {Name: d, Capabilities: {teleport: true}}",
                "DriverInfo.Capabilities.teleport: unknown capability, ignored",
            ),
            (
                "DriverInfo: {Name: d}\nTimeouts: {PodStart: 5m}",
                "Timeouts: read by upstream, not used by kvol on one node",
            ),
            (
                "DriverInfo: {Name: d}\nStorageClass: {FromName: true, Parameters: {}}",
                "StorageClass.Parameters: unknown key, ignored",
            ),
        ];
        for (text, warning) in warned {
            let d = parse(text, "f.yaml").unwrap_or_else(|e| panic!("{text}: {e}"));
            assert_eq!(d.warnings, [warning], "{text}");
        }
        let refused = [
            ("StorageClass: {FromName: true}", "driver definition f.yaml: DriverInfo.Name: not set"),
            (
                "DriverInfo: {Name: d, Capabilities: {block: yes please}}",
                "driver definition f.yaml: DriverInfo.Capabilities.block: expected true or false, found a string",
            ),
            (
                "DriverInfo: {Name: d, SupportedSizeRange: {Min: lots}}",
                "driver definition f.yaml: DriverInfo.SupportedSizeRange.Min: ",
            ),
            ("- a list", "driver definition f.yaml: : expected a mapping, found a list"),
            (
                "DriverInfo: {Name: d}\nInlineVolumes: {shared: true}",
                "driver definition f.yaml: InlineVolumes: expected a list, found a mapping",
            ),
        ];
        for (text, error) in refused {
            let e = parse(text, "f.yaml").unwrap_err().to_string();
            assert!(e.starts_with(error), "{text}: {e}");
        }
    }
}
