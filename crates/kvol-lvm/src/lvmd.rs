//! `lvmd.yaml` as TopoLVM's lvmd reads it, and TopoLVM's validation rules with every problem collected (pure).
//!
//! Keys are TopoLVM's. Like lvmd (which decodes with a non-strict YAML→JSON decoder), keys this
//! format does not know are ignored, and the top-level keys kvol does not use (`socket-name`,
//! `lvcreate-option-classes`, `lvm-command-prefix`) are accepted and kept, so one file serves
//! both. An omitted `spare-gb` means 10 GiB, as in TopoLVM.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::LazyLock;

use regex::Regex;
use serde::{Deserialize, Serialize};

/// The spare capacity, in GiB, of a device class whose `spare-gb` is omitted (TopoLVM's default).
pub const DEFAULT_SPARE_GB: u64 = 10;
/// The longest device-class name TopoLVM accepts (a Kubernetes qualified name).
pub const MAX_NAME_LEN: usize = 63;

/// The whole file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct LvmdConfig {
    /// lvmd's socket; kvol does not use it and keeps it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_name: Option<String>,
    pub device_classes: Vec<DeviceClass>,
    /// Named lvcreate option sets; kvol does not use them and keeps them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lvcreate_option_classes: Vec<LvcreateOptionClass>,
    /// A prefix for lvm commands; kvol does not use it and keeps it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lvm_command_prefix: Vec<String>,
}

/// One device class: where a StorageClass's volumes are carved.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct DeviceClass {
    pub name: String,
    pub volume_group: String,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub default: bool,
    /// GiB kept free; `None` (omitted) means [`DEFAULT_SPARE_GB`].
    pub spare_gb: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stripe: Option<u32>,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub stripe_size: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub lvcreate_options: Vec<String>,
    /// `thick`, `thin`, or empty (thick); kept as written so a bad value is a listed problem.
    #[serde(rename = "type", skip_serializing_if = "String::is_empty")]
    pub kind: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub thin_pool: Option<ThinPool>,
}

/// A thin class's pool.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case")]
pub struct ThinPool {
    pub name: String,
    pub overprovision_ratio: f64,
}

/// A named set of lvcreate options (TopoLVM's `lvcreate-option-classes`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LvcreateOptionClass {
    pub name: String,
    pub options: Vec<String>,
}

/// Where a class's volumes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClassKind {
    Thick,
    Thin,
}

impl DeviceClass {
    /// The spare capacity in bytes (omitted `spare-gb` = 10 GiB).
    pub fn spare_bytes(&self) -> u64 {
        self.spare_gb.unwrap_or(DEFAULT_SPARE_GB) << 30
    }

    /// The class's kind, when `type` is valid.
    pub fn class_kind(&self) -> Option<ClassKind> {
        match self.kind.as_str() {
            "" | "thick" => Some(ClassKind::Thick),
            "thin" => Some(ClassKind::Thin),
            _ => None,
        }
    }

    /// The LVM target the class owns: the VG, or `vg/pool` for a thin class.
    pub fn target(&self) -> String {
        match (&self.thin_pool, self.class_kind()) {
            (Some(pool), Some(ClassKind::Thin)) => format!("{}/{}", self.volume_group, pool.name),
            _ => self.volume_group.clone(),
        }
    }
}

impl LvmdConfig {
    /// The class StorageClasses get when they name none.
    pub fn default_class(&self) -> Option<&DeviceClass> {
        self.device_classes.iter().find(|c| c.default)
    }

    /// The class called `name`.
    pub fn class(&self, name: &str) -> Option<&DeviceClass> {
        self.device_classes.iter().find(|c| c.name == name)
    }
}

/// One thing wrong with a file: which class (if any), which field, what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// `device-classes[i]` and its name, when the problem is in one class.
    pub class: Option<(usize, String)>,
    pub field: &'static str,
    pub message: String,
}

impl fmt::Display for Problem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.class {
            Some((i, name)) if name.is_empty() => {
                write!(f, "device-classes[{i}].{}: {}", self.field, self.message)
            }
            Some((i, name)) => write!(f, "device-classes[{i}] ({name:?}).{}: {}", self.field, self.message),
            None => write!(f, "{}: {}", self.field, self.message),
        }
    }
}

/// The file could not be decoded at all.
#[derive(Debug, thiserror::Error)]
#[error("not an lvmd.yaml: {0}")]
pub struct ParseError(String);

/// Decodes `text` as lvmd.yaml (no validation: see [`validate`]).
pub fn parse(text: &str) -> Result<LvmdConfig, ParseError> {
    if text.trim().is_empty() {
        return Ok(LvmdConfig::default());
    }
    serde_saphyr::from_str(text).map_err(|e| ParseError(e.to_string().to_lowercase()))
}

/// Renders `config` as lvmd.yaml.
pub fn render(config: &LvmdConfig) -> String {
    serde_saphyr::to_string(config).expect("an lvmd config always serializes")
}

static QUALIFIED_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").expect("valid regex"));
static STRIPE_SIZE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new("(?i)^([0-9]*)(k|m|g|t|p|e|b|s)?$").expect("valid regex"));

/// Every problem TopoLVM's rules find in `config`; empty when it is valid.
pub fn validate(config: &LvmdConfig) -> Vec<Problem> {
    let mut problems = Vec::new();
    if config.device_classes.is_empty() {
        problems.push(Problem {
            class: None,
            field: "device-classes",
            message: "should have at least one device-class".into(),
        });
    }
    for (i, class) in config.device_classes.iter().enumerate() {
        let at = (i, class.name.clone());
        for (field, message) in class_problems(class) {
            problems.push(Problem { class: Some(at.clone()), field, message });
        }
    }
    problems.extend(cross_class_problems(&config.device_classes));
    problems
}

/// The problems one class has on its own.
fn class_problems(class: &DeviceClass) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if class.name.is_empty() {
        out.push(("name", "should not be empty".to_string()));
    } else {
        if class.name.len() > MAX_NAME_LEN {
            out.push(("name", format!("is {} characters, at most {MAX_NAME_LEN} allowed", class.name.len())));
        }
        if !QUALIFIED_NAME.is_match(&class.name) {
            out.push((
                "name",
                "should consist of alphanumeric characters, '-', '_' or '.', and start and end with an alphanumeric character".into(),
            ));
        }
    }
    if class.volume_group.is_empty() {
        out.push(("volume-group", "should not be empty".into()));
    }
    match class.class_kind() {
        None => {
            out.push(("type", format!("is {:?}; it can be \"thick\", \"thin\" or empty (thick)", class.kind)))
        }
        Some(ClassKind::Thin) => out.extend(thin_pool_problems(class.thin_pool.as_ref())),
        Some(ClassKind::Thick) => {}
    }
    if !class.stripe_size.is_empty() && !STRIPE_SIZE.is_match(&class.stripe_size) {
        out.push(("stripe-size", format!("is {:?}; the format is Size[k|UNIT]", class.stripe_size)));
    }
    out
}

/// A thin class's pool problems.
fn thin_pool_problems(pool: Option<&ThinPool>) -> Vec<(&'static str, String)> {
    let Some(pool) = pool else {
        return vec![("thin-pool", "type is thin but thin-pool is missing".into())];
    };
    let mut out = Vec::new();
    if pool.name.is_empty() {
        out.push(("thin-pool.name", "should not be empty".into()));
    }
    if pool.overprovision_ratio.is_nan() || pool.overprovision_ratio < 1.0 {
        out.push((
            "thin-pool.overprovision-ratio",
            format!("is {}; it should be 1.0 or more", pool.overprovision_ratio),
        ));
    }
    out
}

/// The problems between classes: duplicate names, shared targets, several defaults.
fn cross_class_problems(classes: &[DeviceClass]) -> Vec<Problem> {
    let mut problems = Vec::new();
    let mut names = BTreeSet::new();
    let mut targets: BTreeMap<String, String> = BTreeMap::new();
    for (i, class) in classes.iter().enumerate() {
        let at = Some((i, class.name.clone()));
        if !class.name.is_empty() && !names.insert(class.name.clone()) {
            problems.push(Problem {
                class: at.clone(),
                field: "name",
                message: "duplicate device-class name".into(),
            });
        }
        let target = class.target();
        if class.volume_group.is_empty() {
            continue;
        }
        if let Some(first) = targets.get(&target) {
            problems.push(Problem {
                class: at,
                field: "volume-group",
                message: format!(
                    "volume group/thin pool {target} is already the target of device-class {first:?}"
                ),
            });
        } else {
            targets.insert(target, class.name.clone());
        }
    }
    let defaults: Vec<&str> = classes.iter().filter(|c| c.default).map(|c| c.name.as_str()).collect();
    if defaults.len() > 1 {
        problems.push(Problem {
            class: None,
            field: "default",
            message: format!("should not have multiple default device-classes: {}", defaults.join(", ")),
        });
    }
    problems
}

#[cfg(test)]
mod tests;
