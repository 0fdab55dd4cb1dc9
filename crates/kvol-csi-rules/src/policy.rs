//! CSIDriver semantics as pure functions: upstream's defaults, lifecycle modes, fsGroup policy, access modes, volume capabilities and volume context.
//!
//! Everything here is decided from values alone, so each rule is a table test. Upstream
//! sources: `pkg/volume/csi/csi_plugin.go` (`skipAttach`, lifecycle mode of a spec),
//! `csi_mounter.go` (`supportsVolumeLifecycleMode`, `supportsFSGroup`, pod-info attributes,
//! `makeVolumeHandle`), `csi_client.go` (access-mode mapping) and the `storage.k8s.io/v1`
//! CSIDriver defaults.

use std::collections::BTreeMap;
use std::fmt;

use k8s_openapi::api::storage::v1::CSIDriver;
use kvol_api::pod::PodInfo;

pub use crate::names::ephemeral_volume_handle;

/// Volume-context key: the pod's name (added only when the CSIDriver has `podInfoOnMount`).
pub const POD_NAME_KEY: &str = "csi.storage.k8s.io/pod.name";
/// Volume-context key: the pod's namespace.
pub const POD_NAMESPACE_KEY: &str = "csi.storage.k8s.io/pod.namespace";
/// Volume-context key: the pod's UID.
pub const POD_UID_KEY: &str = "csi.storage.k8s.io/pod.uid";
/// Volume-context key: the pod's service account.
pub const SERVICE_ACCOUNT_KEY: &str = "csi.storage.k8s.io/serviceAccount.name";
/// Volume-context key: `"true"` for an ephemeral inline volume, else `"false"`.
pub const EPHEMERAL_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// A CSI access mode (`VolumeCapability.AccessMode.Mode`), numbered as in the CSI spec so the
/// gRPC layer converts with `as i32`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessMode {
    Unknown = 0,
    SingleNodeWriter = 1,
    SingleNodeReaderOnly = 2,
    MultiNodeReaderOnly = 3,
    MultiNodeSingleWriter = 4,
    MultiNodeMultiWriter = 5,
    SingleNodeSingleWriter = 6,
    SingleNodeMultiWriter = 7,
}

/// A volume the driver's CSIDriver does not allow, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("csi driver {driver}: {reason}")]
pub struct PolicyRefusal {
    pub driver: String,
    pub reason: String,
}

/// How a volume of a CSI driver lives (`CSIDriver.spec.volumeLifecycleModes`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum LifecycleMode {
    /// A persistent volume (PV `spec.csi`).
    Persistent,
    /// An ephemeral inline volume (a pod's `csi` volume source).
    Ephemeral,
}

impl LifecycleMode {
    /// The API spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            LifecycleMode::Persistent => "Persistent",
            LifecycleMode::Ephemeral => "Ephemeral",
        }
    }

    /// The mode of an API spelling; `None` for anything else.
    pub fn parse(text: &str) -> Option<LifecycleMode> {
        match text {
            "Persistent" => Some(LifecycleMode::Persistent),
            "Ephemeral" => Some(LifecycleMode::Ephemeral),
            _ => None,
        }
    }

    /// The mode of a spec: ephemeral for a pod's inline `csi` source, persistent otherwise.
    pub const fn of_inline(inline: bool) -> LifecycleMode {
        if inline { LifecycleMode::Ephemeral } else { LifecycleMode::Persistent }
    }
}

impl fmt::Display for LifecycleMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who applies a pod's fsGroup to the volume (`CSIDriver.spec.fsGroupPolicy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum FsGroupPolicy {
    /// Only for volumes with an fsType and a ReadWriteOnce(Pod) access mode: the default.
    #[default]
    ReadWriteOnceWithFsType,
    /// Always (unless the volume is read-only).
    File,
    /// Never.
    None,
}

impl FsGroupPolicy {
    /// The API spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            FsGroupPolicy::ReadWriteOnceWithFsType => "ReadWriteOnceWithFSType",
            FsGroupPolicy::File => "File",
            FsGroupPolicy::None => "None",
        }
    }

    /// The policy of an API spelling; `None` for anything else.
    pub fn parse(text: &str) -> Option<FsGroupPolicy> {
        match text {
            "ReadWriteOnceWithFSType" => Some(FsGroupPolicy::ReadWriteOnceWithFsType),
            "File" => Some(FsGroupPolicy::File),
            "None" => Some(FsGroupPolicy::None),
            _ => None,
        }
    }
}

/// What a driver's CSIDriver object asks of kvol, with upstream's defaults filled in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DriverPolicy {
    /// Whether a CSIDriver object exists: without one only persistent volumes are served.
    pub has_object: bool,
    /// `attachRequired`: unset or no object means attach.
    pub attach_required: bool,
    /// `podInfoOnMount`: unset or no object means no pod information in the volume context.
    pub pod_info_on_mount: bool,
    /// `volumeLifecycleModes`: unset or empty means `[Persistent]`.
    pub lifecycle_modes: Vec<LifecycleMode>,
    /// `fsGroupPolicy`: unset means `ReadWriteOnceWithFSType`.
    pub fs_group_policy: FsGroupPolicy,
    /// `requiresRepublish`: unset means no.
    pub requires_republish: bool,
    /// `tokenRequests`: the service-account tokens the driver gets in the volume context.
    pub token_requests: Vec<crate::tokens::TokenAudience>,
}

impl Default for DriverPolicy {
    fn default() -> DriverPolicy {
        DriverPolicy::from_object(None)
    }
}

impl DriverPolicy {
    /// The policy of a driver's CSIDriver object, or of none.
    ///
    /// Values the API server would have defaulted are defaulted the same way here (standalone
    /// manifests are not defaulted): an empty `volumeLifecycleModes` is `[Persistent]`, an
    /// unset `fsGroupPolicy` is `ReadWriteOnceWithFSType`. Unknown lifecycle modes are
    /// ignored; an unknown fsGroupPolicy acts as the default, as upstream's comparisons do.
    pub fn from_object(driver: Option<&CSIDriver>) -> DriverPolicy {
        let Some(driver) = driver else {
            return DriverPolicy {
                has_object: false,
                attach_required: true,
                pod_info_on_mount: false,
                lifecycle_modes: vec![LifecycleMode::Persistent],
                fs_group_policy: FsGroupPolicy::default(),
                requires_republish: false,
                token_requests: Vec::new(),
            };
        };
        let spec = &driver.spec;
        let listed = spec.volume_lifecycle_modes.as_deref().unwrap_or_default();
        let mut lifecycle_modes: Vec<LifecycleMode> =
            listed.iter().filter_map(|m| LifecycleMode::parse(m)).collect();
        if listed.is_empty() {
            lifecycle_modes.push(LifecycleMode::Persistent);
        }
        DriverPolicy {
            has_object: true,
            attach_required: spec.attach_required.unwrap_or(true),
            pod_info_on_mount: spec.pod_info_on_mount.unwrap_or(false),
            lifecycle_modes,
            fs_group_policy: spec
                .fs_group_policy
                .as_deref()
                .and_then(FsGroupPolicy::parse)
                .unwrap_or_default(),
            requires_republish: spec.requires_republish.unwrap_or(false),
            token_requests: spec
                .token_requests
                .iter()
                .flatten()
                .map(|r| crate::tokens::TokenAudience {
                    audience: r.audience.clone(),
                    expiration_seconds: r.expiration_seconds,
                })
                .collect(),
        }
    }

    /// Whether volumes of `mode` may be used with this driver.
    pub fn allows(&self, mode: LifecycleMode) -> bool {
        self.lifecycle_modes.contains(&mode)
    }
}

/// Refuses a volume whose lifecycle mode the driver's CSIDriver does not list (upstream's
/// `supportsVolumeLifecycleMode`).
pub fn check_lifecycle_mode(
    driver: &str,
    policy: &DriverPolicy,
    mode: LifecycleMode,
) -> Result<(), PolicyRefusal> {
    if policy.allows(mode) {
        return Ok(());
    }
    let what = match mode {
        LifecycleMode::Persistent => "persistent volumes",
        LifecycleMode::Ephemeral => "ephemeral inline volumes",
    };
    let why = if policy.has_object {
        let listed: Vec<&str> = policy.lifecycle_modes.iter().map(|m| m.as_str()).collect();
        format!("its CSIDriver lists volumeLifecycleModes [{}]", listed.join(", "))
    } else {
        format!(
            "there is no CSIDriver object named {driver}, and without one only persistent volumes are served"
        )
    };
    Err(PolicyRefusal { driver: driver.to_string(), reason: format!("{what} are not supported ({why})") })
}

/// The CSI access mode of a persistent volume: its first access mode (upstream looks at
/// `accessModes[0]` only), ReadWriteOnce when it lists none. A driver with the node capability
/// `SINGLE_NODE_MULTI_WRITER` gets CSI 1.5's single-node modes; one without gets ReadWriteOncePod
/// as `SINGLE_NODE_WRITER`, so older drivers still work. An unknown mode is `UNKNOWN`, which a
/// driver refuses.
pub fn access_mode(modes: &[String], single_node_multi_writer: bool) -> AccessMode {
    match (modes.first().map_or("ReadWriteOnce", String::as_str), single_node_multi_writer) {
        ("ReadWriteOnce", false) => AccessMode::SingleNodeWriter,
        ("ReadWriteOnce", true) => AccessMode::SingleNodeMultiWriter,
        ("ReadOnlyMany", _) => AccessMode::MultiNodeReaderOnly,
        ("ReadWriteMany", _) => AccessMode::MultiNodeMultiWriter,
        ("ReadWriteOncePod", false) => AccessMode::SingleNodeWriter,
        ("ReadWriteOncePod", true) => AccessMode::SingleNodeSingleWriter,
        _ => AccessMode::Unknown,
    }
}

/// The volume context of NodePublishVolume: the volume's attributes, plus the pod's name,
/// namespace, UID, service account and the ephemeral flag when the CSIDriver asks for pod
/// information (`podInfoOnMount`). Pod information wins over an attribute of the same key.
pub fn volume_context(
    attributes: Option<&BTreeMap<String, String>>,
    pod: &PodInfo,
    policy: &DriverPolicy,
    mode: LifecycleMode,
) -> BTreeMap<String, String> {
    let mut context = attributes.cloned().unwrap_or_default();
    if policy.pod_info_on_mount {
        let ephemeral = (mode == LifecycleMode::Ephemeral).to_string();
        for (key, value) in [
            (POD_NAME_KEY, pod.name.as_str()),
            (POD_NAMESPACE_KEY, pod.namespace.as_str()),
            (POD_UID_KEY, pod.uid.as_str()),
            (SERVICE_ACCOUNT_KEY, pod.service_account.as_str()),
            (EPHEMERAL_KEY, ephemeral.as_str()),
        ] {
            context.insert(key.to_string(), value.to_string());
        }
    }
    context
}

/// Whether kvol applies a pod's fsGroup to the published volume (upstream's `supportsFSGroup`,
/// asked only when the pod has an fsGroup and the driver does not apply it itself).
///
/// `access_modes` is the persistent volume's access modes, or `None` for an ephemeral inline
/// volume, which is always published ReadWriteOnce.
pub fn applies_fs_group(
    policy: FsGroupPolicy,
    fs_type: &str,
    access_modes: Option<&[String]>,
    read_only: bool,
) -> bool {
    match policy {
        _ if read_only => false,
        FsGroupPolicy::None => false,
        FsGroupPolicy::File => true,
        FsGroupPolicy::ReadWriteOnceWithFsType if fs_type.is_empty() => false,
        FsGroupPolicy::ReadWriteOnceWithFsType => match access_modes {
            None => true,
            Some(modes) => modes.iter().any(|m| m == "ReadWriteOnce" || m == "ReadWriteOncePod"),
        },
    }
}

/// The publish context carried in a device path: kvol's attacher returns the context of
/// ControllerPublishVolume as a JSON object. `Ok(None)` for no device path or one that is not
/// a JSON object (a path or an attachment name from another attacher).
pub fn parse_publish_context(device_path: Option<&str>) -> Result<Option<BTreeMap<String, String>>, String> {
    let Some(text) = device_path.map(str::trim).filter(|t| t.starts_with('{')) else {
        return Ok(None);
    };
    serde_json::from_str(text).map(Some).map_err(|e| {
        format!("the device path {text:?} is not a publish context (a JSON object of strings): {e}")
    })
}

/// The device path that carries a publish context.
pub fn publish_context_device_path(context: &BTreeMap<String, String>) -> String {
    serde_json::to_string(context).unwrap_or_else(|_| "{}".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::CSIDriverSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn driver(spec: CSIDriverSpec) -> CSIDriver {
        CSIDriver { metadata: ObjectMeta { name: Some("d.example.com".into()), ..Default::default() }, spec }
    }

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn csidriver_defaults_follow_upstream() {
        use LifecycleMode::{Ephemeral, Persistent};
        let none = DriverPolicy::from_object(None);
        let empty = DriverPolicy::from_object(Some(&driver(CSIDriverSpec::default())));
        let set = DriverPolicy::from_object(Some(&driver(CSIDriverSpec {
            attach_required: Some(false),
            pod_info_on_mount: Some(true),
            volume_lifecycle_modes: Some(strings(&["Ephemeral", "Bogus", "Persistent"])),
            fs_group_policy: Some("File".into()),
            requires_republish: Some(true),
            ..Default::default()
        })));
        let explicitly_empty_modes = DriverPolicy::from_object(Some(&driver(CSIDriverSpec {
            volume_lifecycle_modes: Some(vec![]),
            fs_group_policy: Some("Whatever".into()),
            ..Default::default()
        })));
        let table = [
            (&none, false, true, false, vec![Persistent], FsGroupPolicy::ReadWriteOnceWithFsType, false),
            (&empty, true, true, false, vec![Persistent], FsGroupPolicy::ReadWriteOnceWithFsType, false),
            (&set, true, false, true, vec![Ephemeral, Persistent], FsGroupPolicy::File, true),
            (
                &explicitly_empty_modes,
                true,
                true,
                false,
                vec![Persistent],
                FsGroupPolicy::ReadWriteOnceWithFsType,
                false,
            ),
        ];
        for (policy, has_object, attach, pod_info, modes, fs_group, republish) in table {
            assert_eq!(policy.has_object, has_object, "{policy:?}");
            assert_eq!(policy.attach_required, attach, "{policy:?}");
            assert_eq!(policy.pod_info_on_mount, pod_info, "{policy:?}");
            assert_eq!(policy.lifecycle_modes, modes, "{policy:?}");
            assert_eq!(policy.fs_group_policy, fs_group, "{policy:?}");
            assert_eq!(policy.requires_republish, republish, "{policy:?}");
        }
        assert_eq!(DriverPolicy::default(), none);
    }

    #[test]
    fn lifecycle_modes_are_checked_with_a_message_that_says_why() {
        use LifecycleMode::{Ephemeral, Persistent};
        let only = |modes: &[&str]| {
            DriverPolicy::from_object(Some(&driver(CSIDriverSpec {
                volume_lifecycle_modes: Some(strings(modes)),
                ..Default::default()
            })))
        };
        let none = DriverPolicy::from_object(None);
        let table: [(&DriverPolicy, LifecycleMode, Option<&str>); 7] = [
            (&none, Persistent, None),
            (
                &none,
                Ephemeral,
                Some(
                    "csi driver d.example.com: ephemeral inline volumes are not supported (there is no \
                     CSIDriver object named d.example.com, and without one only persistent volumes are served)",
                ),
            ),
            (&only(&["Persistent"]), Persistent, None),
            (
                &only(&["Persistent"]),
                Ephemeral,
                Some(
                    "csi driver d.example.com: ephemeral inline volumes are not supported (its CSIDriver \
                     lists volumeLifecycleModes [Persistent])",
                ),
            ),
            (
                &only(&["Ephemeral"]),
                Persistent,
                Some(
                    "csi driver d.example.com: persistent volumes are not supported (its CSIDriver lists \
                     volumeLifecycleModes [Ephemeral])",
                ),
            ),
            (&only(&["Ephemeral"]), Ephemeral, None),
            (&only(&["Persistent", "Ephemeral"]), Ephemeral, None),
        ];
        for (policy, mode, want) in table {
            let got = check_lifecycle_mode("d.example.com", policy, mode).err().map(|e| e.to_string());
            assert_eq!(got.as_deref(), want, "{policy:?} {mode}");
        }
    }

    #[test]
    fn access_modes_map_as_upstream_with_and_without_single_node_multi_writer() {
        let table = [
            (&[][..], false, AccessMode::SingleNodeWriter),
            (&[][..], true, AccessMode::SingleNodeMultiWriter),
            (&["ReadWriteOnce"][..], false, AccessMode::SingleNodeWriter),
            (&["ReadWriteOnce"][..], true, AccessMode::SingleNodeMultiWriter),
            (&["ReadOnlyMany"][..], false, AccessMode::MultiNodeReaderOnly),
            (&["ReadOnlyMany"][..], true, AccessMode::MultiNodeReaderOnly),
            (&["ReadWriteMany"][..], false, AccessMode::MultiNodeMultiWriter),
            (&["ReadWriteMany"][..], true, AccessMode::MultiNodeMultiWriter),
            (&["ReadWriteOncePod"][..], false, AccessMode::SingleNodeWriter),
            (&["ReadWriteOncePod"][..], true, AccessMode::SingleNodeSingleWriter),
            // Only the first mode counts, as upstream.
            (&["ReadOnlyMany", "ReadWriteOnce"][..], false, AccessMode::MultiNodeReaderOnly),
            (&["Sideways"][..], false, AccessMode::Unknown),
        ];
        for (modes, snmw, want) in table {
            assert_eq!(access_mode(&strings(modes), snmw), want, "{modes:?} snmw={snmw}");
        }
    }

    #[test]
    fn pod_information_is_added_only_when_the_driver_asks() {
        let pod = PodInfo {
            name: "web-0".into(),
            namespace: "shop".into(),
            uid: "uid-1".into(),
            service_account: "web".into(),
            fs_group: None,
            fs_group_change_policy: kvol_api::pod::FsGroupChangePolicy::Always,
            memory_limit: None,
        };
        let attributes = BTreeMap::from([
            ("share".to_string(), "a".to_string()),
            (POD_NAME_KEY.to_string(), "forged".to_string()),
        ]);
        let asks = DriverPolicy { pod_info_on_mount: true, ..DriverPolicy::default() };
        let with = |ephemeral: &str| {
            BTreeMap::from([
                ("share".to_string(), "a".to_string()),
                (POD_NAME_KEY.to_string(), "web-0".to_string()),
                (POD_NAMESPACE_KEY.to_string(), "shop".to_string()),
                (POD_UID_KEY.to_string(), "uid-1".to_string()),
                (SERVICE_ACCOUNT_KEY.to_string(), "web".to_string()),
                (EPHEMERAL_KEY.to_string(), ephemeral.to_string()),
            ])
        };
        let table = [
            (DriverPolicy::default(), LifecycleMode::Persistent, Some(&attributes), attributes.clone()),
            (DriverPolicy::default(), LifecycleMode::Ephemeral, None, BTreeMap::new()),
            (asks.clone(), LifecycleMode::Persistent, Some(&attributes), with("false")),
            (asks.clone(), LifecycleMode::Ephemeral, Some(&attributes), with("true")),
        ];
        for (policy, mode, attrs, want) in table {
            assert_eq!(volume_context(attrs, &pod, &policy, mode), want, "{mode} {policy:?}");
        }
    }

    #[test]
    fn fs_group_is_applied_as_upstream_decides() {
        use FsGroupPolicy::{File, None as Never, ReadWriteOnceWithFsType as Rwo};
        let rwo = strings(&["ReadWriteOnce"]);
        let rwop = strings(&["ReadWriteOncePod"]);
        let rox = strings(&["ReadOnlyMany"]);
        // (policy, fsType, access modes, read-only, applies)
        type Row<'a> = (FsGroupPolicy, &'a str, Option<&'a [String]>, bool, bool);
        let table: [Row<'_>; 11] = [
            (Rwo, "ext4", Some(&rwo), false, true),
            (Rwo, "ext4", Some(&rwop), false, true),
            (Rwo, "ext4", Some(&rox), false, false),
            (Rwo, "ext4", Some(&[]), false, false),
            (Rwo, "", Some(&rwo), false, false),
            (Rwo, "ext4", None, false, true),
            (Rwo, "ext4", Some(&rwo), true, false),
            (File, "", Some(&rox), false, true),
            (File, "", None, true, false),
            (Never, "ext4", Some(&rwo), false, false),
            (Never, "", None, false, false),
        ];
        for (policy, fs_type, modes, read_only, want) in table {
            assert_eq!(
                applies_fs_group(policy, fs_type, modes, read_only),
                want,
                "{policy:?} {fs_type:?} {modes:?} ro={read_only}"
            );
        }
    }

    #[test]
    fn publish_contexts_travel_as_json_device_paths() {
        let context = BTreeMap::from([("devicePath".to_string(), "/dev/sdb".to_string())]);
        let path = publish_context_device_path(&context);
        assert_eq!(path, r#"{"devicePath":"/dev/sdb"}"#);
        assert_eq!(parse_publish_context(Some(&path)), Ok(Some(context)));
        assert_eq!(parse_publish_context(None), Ok(None));
        assert_eq!(parse_publish_context(Some("")), Ok(None));
        assert_eq!(parse_publish_context(Some("/dev/sdb")), Ok(None));
        assert_eq!(parse_publish_context(Some("{}")), Ok(Some(BTreeMap::new())));
        let err = parse_publish_context(Some(r#"{"a": 1}"#)).unwrap_err();
        assert!(err.starts_with(r#"the device path "{\"a\": 1}" is not a publish context"#), "{err}");
    }

    #[test]
    fn api_spellings_round_trip() {
        for mode in [LifecycleMode::Persistent, LifecycleMode::Ephemeral] {
            assert_eq!(LifecycleMode::parse(mode.as_str()), Some(mode));
        }
        for policy in [FsGroupPolicy::ReadWriteOnceWithFsType, FsGroupPolicy::File, FsGroupPolicy::None] {
            assert_eq!(FsGroupPolicy::parse(policy.as_str()), Some(policy));
        }
        assert_eq!(LifecycleMode::parse("persistent"), None, "spellings are case-sensitive");
    }
}
