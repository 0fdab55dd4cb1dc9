//! Validation of what a manifest names, as the API server validates it, plus the rules kvol adds because those names become paths.
//!
//! Standalone kvol has no API server in front of it, so these checks are the only ones an
//! object gets before its names become path segments under the kubelet root. The rules:
//!
//! - object names: DNS-1123 subdomain (pods, persistent volumes, claims, storage classes,
//!   secrets); CSIDriver names: DNS-1123 subdomain of at most 63 characters;
//! - namespaces and pod volume names: DNS-1123 label;
//! - `metadata.uid`, when given: the API server assigns uids (RFC 4122 UUIDs) and does not
//!   constrain a client-supplied one, but kvol uses it as a directory name, so kvol requires
//!   1 to 63 characters of ASCII letters, digits and `-` (every UUID passes; `.`, `..`, `/`,
//!   NUL, `%2F` cannot);
//! - Flexvolume driver names: a qualified name, `[prefix/]name` (prefix a DNS-1123 subdomain,
//!   name at most 63 alphanumerics, `-`, `_` or `.`, beginning and ending alphanumeric);
//! - CSI driver names in volumes: as CSIDriver names;
//! - hostPath and local volume paths: absolute, cleaned (no empty, `.` or `..` component,
//!   no trailing `/` except for `/` itself) and without NUL.
//!
//! - `volumeMode` of volumes and claims, and a pod's `volumeDevices`: see [`crate::volume_mode`].
//!
//! Every rejection names the field, the value and the rule.

use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeClaim, Pod, Secret, Volume,
};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

pub use crate::field::{FieldError, clean_absolute_path};

/// The longest DNS-1123 label.
pub const LABEL_MAX: usize = 63;
/// The longest DNS-1123 subdomain.
pub const SUBDOMAIN_MAX: usize = 253;
/// The longest CSIDriver name.
pub const CSI_DRIVER_MAX: usize = 63;
/// The longest `metadata.uid` kvol accepts.
pub const UID_MAX: usize = 63;

/// A rule: what a value must be, and a check giving the reason it is not.
#[derive(Clone, Copy)]
struct Rule {
    name: &'static str,
    check: fn(&str) -> Result<(), String>,
}

const LABEL: Rule = Rule { name: "a DNS-1123 label", check: dns1123_label };
const SUBDOMAIN: Rule = Rule { name: "a DNS-1123 subdomain", check: dns1123_subdomain };
const CSI_DRIVER: Rule = Rule { name: "a CSI driver name", check: csi_driver_name };
const ONE_SOURCE: Rule = Rule {
    name: "exactly one of persistentVolumeClaimName and volumeSnapshotContentName",
    check: |count| if count == "1" { Ok(()) } else { Err(format!("{count} are given")) },
};
const DELETION_POLICY: Rule = Rule {
    name: "Delete or Retain",
    check: |policy| match policy {
        "Delete" | "Retain" => Ok(()),
        other => Err(format!("{other:?} is neither")),
    },
};
const ONE_CONTENT_SOURCE: Rule = Rule {
    name: "exactly one of snapshotHandle and volumeHandle",
    check: |count| if count == "1" { Ok(()) } else { Err(format!("{count} are given")) },
};
const SNAPSHOT_HANDLE: Rule = Rule { name: "a snapshot handle", check: snapshot_handle };
const UID: Rule = Rule { name: "a uid kvol accepts", check: uid };
const QUALIFIED: Rule = Rule { name: "a qualified name (vendor/driver)", check: qualified_name };
const FS_GROUP_CHANGE_POLICY: Rule = Rule { name: "an fsGroupChangePolicy", check: fs_group_change_policy };
const HOST_PATH: Rule = Rule { name: "a clean absolute path", check: clean_absolute_path };
const VOLUME_MODE: Rule = Rule { name: "a volume mode", check: volume_mode };

/// A driver's snapshot id: opaque, but present, at most 1024 bytes and free of control
/// characters (it reaches logs, status and file contents).
fn snapshot_handle(value: &str) -> Result<(), String> {
    not_empty_within(value, 1024)?;
    first_bad_char(value, |c| !c.is_control())
}

/// `Filesystem` or `Block`.
fn volume_mode(value: &str) -> Result<(), String> {
    crate::volume_mode::VolumeMode::parse(Some(value)).map(drop)
}

fn first_bad_char(value: &str, allowed: impl Fn(char) -> bool) -> Result<(), String> {
    match value.chars().find(|c| !allowed(*c)) {
        Some(c) => Err(format!("it contains {c:?}")),
        None => Ok(()),
    }
}

fn not_empty_within(value: &str, max: usize) -> Result<(), String> {
    if value.is_empty() {
        return Err("it is empty".to_string());
    }
    if value.len() > max {
        return Err(format!("it is {} characters long, more than {max}", value.len()));
    }
    Ok(())
}

/// Lower-case alphanumerics and `-`, beginning and ending alphanumeric; length unchecked.
fn label_chars(value: &str) -> Result<(), String> {
    first_bad_char(value, |c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        .map_err(|r| format!("{r}; only lower-case letters, digits and '-' are allowed"))?;
    if value.starts_with('-') || value.ends_with('-') {
        return Err("it must begin and end with a letter or digit".to_string());
    }
    Ok(())
}

/// A DNS-1123 label: at most 63 lower-case alphanumerics or `-`, beginning and ending alphanumeric.
pub fn dns1123_label(value: &str) -> Result<(), String> {
    not_empty_within(value, LABEL_MAX)?;
    label_chars(value)
}

/// A DNS-1123 subdomain: at most 253 characters, non-empty labels joined by `.`.
pub fn dns1123_subdomain(value: &str) -> Result<(), String> {
    not_empty_within(value, SUBDOMAIN_MAX)?;
    for part in value.split('.') {
        if part.is_empty() {
            return Err("it has an empty part between dots".to_string());
        }
        label_chars(part)?;
    }
    Ok(())
}

/// A CSIDriver name: a DNS-1123 subdomain of at most 63 characters.
pub fn csi_driver_name(value: &str) -> Result<(), String> {
    not_empty_within(value, CSI_DRIVER_MAX)?;
    dns1123_subdomain(value)
}

/// A uid kvol accepts: 1 to 63 ASCII letters, digits and `-`.
pub fn uid(value: &str) -> Result<(), String> {
    not_empty_within(value, UID_MAX)?;
    first_bad_char(value, |c| c.is_ascii_alphanumeric() || c == '-')
        .map_err(|r| format!("{r}; only letters, digits and '-' are allowed"))
}

/// A qualified name: `[prefix/]name`, prefix a DNS-1123 subdomain, name at most 63
/// alphanumerics, `-`, `_` or `.`, beginning and ending alphanumeric.
pub fn qualified_name(value: &str) -> Result<(), String> {
    let name = match value.split_once('/') {
        Some((prefix, name)) => {
            dns1123_subdomain(prefix).map_err(|r| format!("its prefix {prefix:?}: {r}"))?;
            name
        }
        None => value,
    };
    not_empty_within(name, LABEL_MAX).map_err(|r| format!("its name part {name:?}: {r}"))?;
    first_bad_char(name, |c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        .map_err(|r| format!("its name part {name:?}: {r}"))?;
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    if !edge(name.chars().next()) || !edge(name.chars().last()) {
        return Err(format!("its name part {name:?} must begin and end with a letter or digit"));
    }
    Ok(())
}

/// `OnRootMismatch` or `Always`.
pub fn fs_group_change_policy(value: &str) -> Result<(), String> {
    match value {
        "OnRootMismatch" | "Always" => Ok(()),
        _ => Err("it must be \"OnRootMismatch\" or \"Always\"".to_string()),
    }
}

/// Collects the field errors of one object.
#[derive(Default)]
struct Errors(Vec<FieldError>);

impl Errors {
    fn check(&mut self, field: impl Into<String>, value: &str, rule: Rule) {
        if let Err(reason) = (rule.check)(value) {
            self.0.push(FieldError {
                field: field.into(),
                value: value.to_string(),
                rule: rule.name,
                reason,
            });
        }
    }

    fn check_some(&mut self, field: &str, value: Option<&str>, rule: Rule) {
        if let Some(value) = value {
            self.check(field, value, rule);
        }
    }

    /// `metadata.name` by `name_rule`, `metadata.namespace` (when namespaced and given) as a
    /// label, `metadata.uid` (when given) as a uid.
    fn meta(&mut self, meta: &ObjectMeta, name_rule: Rule, namespaced: bool) {
        self.check("metadata.name", meta.name.as_deref().unwrap_or_default(), name_rule);
        if namespaced {
            self.check_some("metadata.namespace", meta.namespace.as_deref().filter(|n| !n.is_empty()), LABEL);
        }
        self.check_some("metadata.uid", meta.uid.as_deref().filter(|u| !u.is_empty()), UID);
    }

    fn pod_volume(&mut self, i: usize, volume: &Volume) {
        let at = format!("spec.volumes[{i}]");
        self.check(format!("{at}.name"), &volume.name, LABEL);
        if let Some(host_path) = &volume.host_path {
            self.check(format!("{at}.hostPath.path"), &host_path.path, HOST_PATH);
        }
        if let Some(flex) = &volume.flex_volume {
            self.check(format!("{at}.flexVolume.driver"), &flex.driver, QUALIFIED);
        }
        if let Some(csi) = &volume.csi {
            self.check(format!("{at}.csi.driver"), &csi.driver, CSI_DRIVER);
        }
    }

    fn pv_csi(&mut self, csi: &CSIPersistentVolumeSource) {
        self.check("spec.csi.driver", &csi.driver, CSI_DRIVER);
    }
}

/// A pod's field errors: its metadata and every volume's name, hostPath, Flexvolume driver
/// and CSI driver.
pub fn validate_pod(pod: &Pod) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&pod.metadata, SUBDOMAIN, true);
    let policy =
        pod.spec.as_ref().and_then(|s| s.security_context.as_ref()?.fs_group_change_policy.as_deref());
    errors.check_some("spec.securityContext.fsGroupChangePolicy", policy, FS_GROUP_CHANGE_POLICY);
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    for (i, volume) in volumes.into_iter().flatten().enumerate() {
        errors.pod_volume(i, volume);
    }
    errors.0.extend(crate::volume_mode::pod_device_errors(pod));
    errors.0
}

/// A persistent volume's field errors: its name and its hostPath, local path, Flexvolume and
/// CSI driver.
pub fn validate_persistent_volume(pv: &PersistentVolume) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&pv.metadata, SUBDOMAIN, false);
    if let Some(spec) = &pv.spec {
        if let Some(host_path) = &spec.host_path {
            errors.check("spec.hostPath.path", &host_path.path, HOST_PATH);
        }
        if let Some(local) = &spec.local {
            errors.check("spec.local.path", &local.path, HOST_PATH);
        }
        if let Some(flex) = &spec.flex_volume {
            errors.check("spec.flexVolume.driver", &flex.driver, QUALIFIED);
        }
        if let Some(csi) = &spec.csi {
            errors.pv_csi(csi);
        }
        errors.check_some("spec.volumeMode", spec.volume_mode.as_deref(), VOLUME_MODE);
    }
    errors.0
}

/// A claim's field errors: its metadata and the volume it binds to.
pub fn validate_claim(claim: &PersistentVolumeClaim) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&claim.metadata, SUBDOMAIN, true);
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref()).filter(|n| !n.is_empty());
    errors.check_some("spec.volumeName", volume_name, SUBDOMAIN);
    errors.check_some(
        "spec.volumeMode",
        claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()),
        VOLUME_MODE,
    );
    errors.0
}

/// A storage class's field errors: its metadata.
pub fn validate_storage_class(class: &StorageClass) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&class.metadata, SUBDOMAIN, false);
    errors.0
}

/// A CSIDriver's field errors: its name, by the CSI driver name rule.
pub fn validate_csi_driver(driver: &CSIDriver) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&driver.metadata, CSI_DRIVER, false);
    errors.0
}

/// A VolumeSnapshot's field errors: its metadata and its source (exactly one of a claim,
/// which kvol serves, and a content).
pub fn validate_volume_snapshot(snapshot: &crate::snapshot::VolumeSnapshot) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&snapshot.metadata, SUBDOMAIN, true);
    let source = &snapshot.spec.source;
    let given = [&source.persistent_volume_claim_name, &source.volume_snapshot_content_name];
    errors.check("spec.source", &given.iter().filter(|s| s.is_some()).count().to_string(), ONE_SOURCE);
    errors.check_some(
        "spec.source.persistentVolumeClaimName",
        source.persistent_volume_claim_name.as_deref(),
        SUBDOMAIN,
    );
    errors.check_some(
        "spec.source.volumeSnapshotContentName",
        source.volume_snapshot_content_name.as_deref(),
        SUBDOMAIN,
    );
    errors.check_some(
        "spec.volumeSnapshotClassName",
        snapshot.spec.volume_snapshot_class_name.as_deref(),
        SUBDOMAIN,
    );
    errors.0
}

/// A VolumeSnapshotContent's field errors: its metadata, driver, deletion policy, one source
/// (a handle without control characters), and the VolumeSnapshot it names.
pub fn validate_volume_snapshot_content(content: &crate::snapshot::VolumeSnapshotContent) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&content.metadata, SUBDOMAIN, false);
    let spec = &content.spec;
    errors.check("spec.driver", &spec.driver, CSI_DRIVER);
    errors.check("spec.deletionPolicy", &spec.deletion_policy, DELETION_POLICY);
    let given = [&spec.source.snapshot_handle, &spec.source.volume_handle];
    errors.check(
        "spec.source",
        &given.iter().filter(|s| s.is_some()).count().to_string(),
        ONE_CONTENT_SOURCE,
    );
    errors.check_some("spec.source.snapshotHandle", spec.source.snapshot_handle.as_deref(), SNAPSHOT_HANDLE);
    errors.check_some("spec.source.volumeHandle", spec.source.volume_handle.as_deref(), SNAPSHOT_HANDLE);
    errors.check("spec.volumeSnapshotRef.name", &spec.volume_snapshot_ref.name, SUBDOMAIN);
    errors.check("spec.volumeSnapshotRef.namespace", &spec.volume_snapshot_ref.namespace, LABEL);
    errors.check_some("spec.volumeSnapshotClassName", spec.volume_snapshot_class_name.as_deref(), SUBDOMAIN);
    errors.0
}

/// A VolumeSnapshotClass's field errors: its metadata, driver name and deletion policy.
pub fn validate_volume_snapshot_class(class: &crate::snapshot::VolumeSnapshotClass) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&class.metadata, SUBDOMAIN, false);
    errors.check("driver", &class.driver, CSI_DRIVER);
    errors.check("deletionPolicy", &class.deletion_policy, DELETION_POLICY);
    errors.0
}

/// A Secret's field errors: its metadata.
pub fn validate_secret(secret: &Secret) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&secret.metadata, SUBDOMAIN, true);
    errors.0
}

/// A ConfigMap as the API server checks it: its name a DNS subdomain, and no key in both
/// `data` and `binaryData`.
pub fn validate_config_map(config_map: &k8s_openapi::api::core::v1::ConfigMap) -> Vec<FieldError> {
    let mut errors = Errors::default();
    errors.meta(&config_map.metadata, SUBDOMAIN, true);
    let binary = config_map.binary_data.as_ref();
    for key in config_map.data.iter().flat_map(|d| d.keys()) {
        if binary.is_some_and(|b| b.contains_key(key)) {
            errors.0.push(FieldError {
                field: format!("binaryData[{key}]"),
                value: key.clone(),
                rule: "a key of binaryData alone",
                reason: "data has the same key".to_string(),
            });
        }
    }
    errors.0
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{
        FlexVolumeSource, HostPathVolumeSource, PersistentVolumeSpec, PodSpec, SecretVolumeSource,
    };

    use super::*;

    type Check = fn(&str) -> Result<(), String>;

    /// (check, value, None when accepted or the start of the reason).
    fn run(cases: &[(Check, &str, Option<&str>)]) {
        for (check, value, want) in cases {
            match (check(value), want) {
                (Ok(()), None) => {}
                (Err(got), Some(want)) => assert!(got.starts_with(want), "{value:?}: {got:?} vs {want:?}"),
                (got, want) => panic!("{value:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn labels_and_subdomains_as_the_api_server() {
        let long_label = "a".repeat(64);
        let long_subdomain = format!("{}.{}", "a".repeat(200), "b".repeat(60));
        let max_subdomain = format!("{}.{}", "a".repeat(200), "b".repeat(52));
        let cases: &[(Check, &str, Option<&str>)] = &[
            (dns1123_label, "cache", None),
            (dns1123_label, "a", None),
            (dns1123_label, "0-data-9", None),
            (dns1123_label, &"a".repeat(63), None),
            (dns1123_label, &long_label, Some("it is 64 characters long, more than 63")),
            (dns1123_label, "", Some("it is empty")),
            (dns1123_label, ".", Some("it contains '.'")),
            (dns1123_label, "..", Some("it contains '.'")),
            (dns1123_label, "../../srv/victim", Some("it contains '.'")),
            (dns1123_label, "/srv", Some("it contains '/'")),
            (dns1123_label, "a/b", Some("it contains '/'")),
            (dns1123_label, "a%2Fb", Some("it contains '%'")),
            (dns1123_label, "a\0b", Some("it contains '\\0'")),
            (dns1123_label, "Cache", Some("it contains 'C'")),
            (dns1123_label, "-a", Some("it must begin and end")),
            (dns1123_label, "a-", Some("it must begin and end")),
            (dns1123_label, "a.b", Some("it contains '.'")),
            (dns1123_subdomain, "a.b-c.d", None),
            (dns1123_subdomain, "web-0", None),
            (dns1123_subdomain, &max_subdomain, None),
            (dns1123_subdomain, &long_subdomain, Some("it is 261 characters long, more than 253")),
            (dns1123_subdomain, "", Some("it is empty")),
            (dns1123_subdomain, ".", Some("it has an empty part")),
            (dns1123_subdomain, "..", Some("it has an empty part")),
            (dns1123_subdomain, "a..b", Some("it has an empty part")),
            (dns1123_subdomain, ".a", Some("it has an empty part")),
            (dns1123_subdomain, "a/b", Some("it contains '/'")),
            (dns1123_subdomain, "/etc", Some("it contains '/'")),
            (dns1123_subdomain, "a%2Fb", Some("it contains '%'")),
            (dns1123_subdomain, "A.b", Some("it contains 'A'")),
            (dns1123_subdomain, "a\0", Some("it contains '\\0'")),
            (dns1123_subdomain, "a.-b", Some("it must begin and end")),
        ];
        run(cases);
    }

    #[test]
    fn uids_csi_and_flexvolume_driver_names() {
        let long = "a".repeat(64);
        let long_csi = format!("{}.io", "a".repeat(61));
        let cases: &[(Check, &str, Option<&str>)] = &[
            (uid, "0b5c2f3e-6a1d-4c8e-9f00-1234567890ab", None),
            (uid, "uid-1", None),
            (uid, "U-1234", None),
            (uid, "", Some("it is empty")),
            (uid, ".", Some("it contains '.'")),
            (uid, "..", Some("it contains '.'")),
            (uid, "../../srv", Some("it contains '.'")),
            (uid, "/abs", Some("it contains '/'")),
            (uid, "a%2F", Some("it contains '%'")),
            (uid, "a\0", Some("it contains '\\0'")),
            (uid, "a_b", Some("it contains '_'")),
            (uid, &long, Some("it is 64 characters long, more than 63")),
            (csi_driver_name, "hostpath.csi.kvol.io", None),
            (csi_driver_name, &long_csi, Some("it is 64 characters long, more than 63")),
            (csi_driver_name, "..", Some("it has an empty part")),
            (csi_driver_name, "Csi.io", Some("it contains 'C'")),
            (csi_driver_name, "a/b", Some("it contains '/'")),
            (qualified_name, "kvol/tmpfs", None),
            (qualified_name, "example.com/Lvm_2.x", None),
            (qualified_name, "tmpfs", None),
            (qualified_name, "kvol/..", Some("its name part \"..\" must begin and end")),
            (qualified_name, "../x", Some("its prefix \"..\": it has an empty part")),
            (qualified_name, "kvol/a/b", Some("its name part \"a/b\": it contains '/'")),
            (qualified_name, "kvol/", Some("its name part \"\": it is empty")),
            (qualified_name, "/x", Some("its prefix \"\": it is empty")),
            (qualified_name, "kvol/a%2Fb", Some("its name part \"a%2Fb\": it contains '%'")),
            (qualified_name, "kvol/a\0", Some("its name part \"a\\0\": it contains '\\0'")),
            (qualified_name, "Kvol/x", Some("its prefix \"Kvol\": it contains 'K'")),
            (qualified_name, &format!("k/{long}"), Some("its name part")),
        ];
        run(cases);
    }

    #[test]
    fn host_paths_are_clean_and_absolute() {
        let cases: &[(Check, &str, Option<&str>)] = &[
            (fs_group_change_policy, "OnRootMismatch", None),
            (fs_group_change_policy, "Always", None),
            (fs_group_change_policy, "onRootMismatch", Some("it must be \"OnRootMismatch\" or \"Always\"")),
            (clean_absolute_path, "/", None),
            (clean_absolute_path, "/srv/data", None),
            (clean_absolute_path, "/srv/..data/x..", None),
            (clean_absolute_path, "/srv/%2F..", None),
            (clean_absolute_path, "", Some("it is not absolute")),
            (clean_absolute_path, "srv", Some("it is not absolute")),
            (clean_absolute_path, "../srv", Some("it is not absolute")),
            (clean_absolute_path, "/srv/../etc", Some("it has a \"..\" component")),
            (clean_absolute_path, "/..", Some("it has a \"..\" component")),
            (clean_absolute_path, "/srv/./x", Some("it has a \".\" component")),
            (clean_absolute_path, "/srv//x", Some("it has an empty component")),
            (clean_absolute_path, "/srv/", Some("it has an empty component")),
            (clean_absolute_path, "/srv\0/x", Some("it contains NUL")),
        ];
        run(cases);
    }

    fn volume(name: &str) -> Volume {
        Volume { name: name.into(), secret: Some(SecretVolumeSource::default()), ..Volume::default() }
    }

    fn pod(name: &str, uid: Option<&str>, volumes: Vec<Volume>) -> Pod {
        Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("default".into()),
                uid: uid.map(str::to_string),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec { volumes: Some(volumes), ..PodSpec::default() }),
            ..Pod::default()
        }
    }

    #[test]
    fn pods_are_checked_field_by_field() {
        let host_path = |p: &str| Volume {
            host_path: Some(HostPathVolumeSource { path: p.into(), type_: None }),
            ..volume("host")
        };
        let flex = |d: &str| Volume {
            flex_volume: Some(FlexVolumeSource { driver: d.into(), ..FlexVolumeSource::default() }),
            ..volume("flex")
        };
        let cases: Vec<(Pod, Vec<&str>)> = vec![
            (pod("web", Some("0b5c2f3e-6a1d-4c8e-9f00-1234567890ab"), vec![volume("cache")]), vec![]),
            (pod("web", None, vec![volume("a"), host_path("/srv"), flex("kvol/tmpfs")]), vec![]),
            (
                pod("web", None, vec![volume("a"), volume("b"), volume("../../../../srv/victim")]),
                vec![
                    "spec.volumes[2].name: \"../../../../srv/victim\" is not a DNS-1123 label: it contains '.'",
                ],
            ),
            (
                pod("../web", Some("../x"), vec![]),
                vec![
                    "metadata.name: \"../web\" is not a DNS-1123 subdomain: it has an empty part between dots",
                    "metadata.uid: \"../x\" is not a uid kvol accepts: it contains '.'",
                ],
            ),
            (
                pod("web", None, vec![host_path("/srv/../etc"), flex("../../bin/sh")]),
                vec![
                    "spec.volumes[0].hostPath.path: \"/srv/../etc\" is not a clean absolute path: it has a \"..\" component",
                    "spec.volumes[1].flexVolume.driver: \"../../bin/sh\" is not a qualified name (vendor/driver): its prefix \"..\": it has an empty part",
                ],
            ),
        ];
        for (pod, want) in cases {
            let got: Vec<String> = validate_pod(&pod).iter().map(ToString::to_string).collect();
            assert_eq!(got.len(), want.len(), "{got:#?}");
            for (g, w) in got.iter().zip(&want) {
                assert!(g.starts_with(w), "{g:?} vs {w:?}");
            }
        }
    }

    #[test]
    fn other_kinds_are_checked() {
        let mut pv = PersistentVolume {
            metadata: ObjectMeta { name: Some("pv-1".into()), ..ObjectMeta::default() },
            spec: Some(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource { path: "relative".into(), type_: None }),
                ..PersistentVolumeSpec::default()
            }),
            ..PersistentVolume::default()
        };
        let got: Vec<String> = validate_persistent_volume(&pv).iter().map(ToString::to_string).collect();
        assert_eq!(
            got,
            ["spec.hostPath.path: \"relative\" is not a clean absolute path: it is not absolute"]
        );
        pv.metadata.name = Some("PV".into());
        pv.spec = None;
        assert_eq!(validate_persistent_volume(&pv)[0].field, "metadata.name");
        let driver = CSIDriver {
            metadata: ObjectMeta { name: Some(format!("{}.io", "d".repeat(70))), ..ObjectMeta::default() },
            ..CSIDriver::default()
        };
        assert_eq!(validate_csi_driver(&driver)[0].rule, "a CSI driver name");
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some("s".into()),
                namespace: Some("Bad/ns".into()),
                ..ObjectMeta::default()
            },
            ..Secret::default()
        };
        assert_eq!(validate_secret(&secret)[0].field, "metadata.namespace");
    }

    #[test]
    fn snapshot_contents_name_their_handle_driver_and_snapshot() {
        use crate::snapshot::{
            SnapshotReference, VolumeSnapshotContent, VolumeSnapshotContentSource, VolumeSnapshotContentSpec,
        };
        let good = VolumeSnapshotContent {
            metadata: ObjectMeta { name: Some("imported".into()), ..ObjectMeta::default() },
            spec: VolumeSnapshotContentSpec {
                deletion_policy: "Retain".into(),
                driver: "hostpath.csi.kvol.io".into(),
                source: VolumeSnapshotContentSource {
                    snapshot_handle: Some("snap-1".into()),
                    volume_handle: None,
                },
                volume_snapshot_ref: SnapshotReference { name: "before".into(), namespace: "default".into() },
                volume_snapshot_class_name: None,
            },
        };
        assert_eq!(validate_volume_snapshot_content(&good), vec![]);
        // (what, change, field named)
        type Change = fn(&mut VolumeSnapshotContent);
        let rows: [(&str, Change, &str); 7] = [
            ("no handle", |c| c.spec.source.snapshot_handle = None, "spec.source"),
            ("two sources", |c| c.spec.source.volume_handle = Some("v".into()), "spec.source"),
            (
                "a control character",
                |c| c.spec.source.snapshot_handle = Some("a\nb".into()),
                "spec.source.snapshotHandle",
            ),
            (
                "an empty handle",
                |c| c.spec.source.snapshot_handle = Some(String::new()),
                "spec.source.snapshotHandle",
            ),
            ("a bad policy", |c| c.spec.deletion_policy = "Keep".into(), "spec.deletionPolicy"),
            ("no driver", |c| c.spec.driver = String::new(), "spec.driver"),
            (
                "no snapshot named",
                |c| c.spec.volume_snapshot_ref.namespace = String::new(),
                "spec.volumeSnapshotRef.namespace",
            ),
        ];
        for (what, change, field) in rows {
            let mut content = good.clone();
            change(&mut content);
            let errors = validate_volume_snapshot_content(&content);
            assert!(errors.iter().any(|e| e.field == field), "{what}: {errors:?}");
        }
    }
}
