//! Raw block volumes in the object model: `volumeMode` (Filesystem unless it says Block), a pod's `volumeDevices`, and the rules tying them together; pure.
//!
//! The rules, as the API server and kubelet apply them:
//! - `volumeMode` of a persistent volume or a claim is `Filesystem` (also when unset) or `Block`;
//! - a claim and the volume it binds to must have the same mode;
//! - a pod uses a volume through `volumeMounts` (a filesystem) or `volumeDevices` (a block
//!   device), never both; a Block volume only through `volumeDevices`, a Filesystem one only
//!   through `volumeMounts`; an inline volume is never a block device;
//! - each `volumeDevices[].devicePath` is a clean absolute path (no `..`) and names a volume of
//!   the pod.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::core::v1::{
    Container, PersistentVolume, PersistentVolumeClaim, Pod, VolumeDevice, VolumeMount,
};

use crate::field::{FieldError, clean_absolute_path};

/// A volume's `volumeMode`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum VolumeMode {
    /// A filesystem mounted into the pod (the default).
    #[default]
    Filesystem,
    /// A raw block device handed to the pod.
    Block,
}

impl VolumeMode {
    /// The mode a `volumeMode` field gives: unset is Filesystem; anything else but the two
    /// names is refused.
    pub fn parse(value: Option<&str>) -> Result<VolumeMode, String> {
        match value {
            None | Some("Filesystem") => Ok(VolumeMode::Filesystem),
            Some("Block") => Ok(VolumeMode::Block),
            Some(other) => Err(format!("volumeMode {other:?} is neither \"Filesystem\" nor \"Block\"")),
        }
    }

    /// The API spelling.
    pub const fn as_str(self) -> &'static str {
        match self {
            VolumeMode::Filesystem => "Filesystem",
            VolumeMode::Block => "Block",
        }
    }

    /// The mode of a persistent volume (`spec.volumeMode`).
    pub fn of_pv(pv: &PersistentVolume) -> Result<VolumeMode, String> {
        VolumeMode::parse(pv.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
    }

    /// The mode of a claim (`spec.volumeMode`).
    pub fn of_claim(claim: &PersistentVolumeClaim) -> Result<VolumeMode, String> {
        VolumeMode::parse(claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()))
    }
}

impl fmt::Display for VolumeMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which of a pod's volumes its containers (all kinds) mount and which they take as devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodUse {
    pub mounted: BTreeSet<String>,
    pub devices: BTreeSet<String>,
}

impl PodUse {
    /// Whether the pod takes volume `name` as a block device.
    pub fn as_device(&self, name: &str) -> bool {
        self.devices.contains(name)
    }
}

/// One container's use of volumes: its field path, the names it mounts and its devices
/// (name, devicePath).
struct ContainerUse<'a> {
    at: String,
    mounts: Vec<&'a str>,
    devices: Vec<(&'a str, &'a str)>,
}

fn container_use<'a>(
    at: String,
    mounts: Option<&'a Vec<VolumeMount>>,
    devices: Option<&'a Vec<VolumeDevice>>,
) -> ContainerUse<'a> {
    ContainerUse {
        at,
        mounts: mounts.into_iter().flatten().map(|m| m.name.as_str()).collect(),
        devices: devices.into_iter().flatten().map(|d| (d.name.as_str(), d.device_path.as_str())).collect(),
    }
}

fn of<'a>(kind: &str, list: &'a [Container]) -> Vec<ContainerUse<'a>> {
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            container_use(format!("spec.{kind}[{i}]"), c.volume_mounts.as_ref(), c.volume_devices.as_ref())
        })
        .collect()
}

/// Every container of the pod: init, regular and ephemeral.
fn containers(pod: &Pod) -> Vec<ContainerUse<'_>> {
    let Some(spec) = pod.spec.as_ref() else { return Vec::new() };
    let mut all = of("initContainers", spec.init_containers.as_deref().unwrap_or_default());
    all.extend(of("containers", &spec.containers));
    for (i, c) in spec.ephemeral_containers.iter().flatten().enumerate() {
        let at = format!("spec.ephemeralContainers[{i}]");
        all.push(container_use(at, c.volume_mounts.as_ref(), c.volume_devices.as_ref()));
    }
    all
}

/// Which volumes the pod mounts and which it takes as devices.
pub fn pod_use(pod: &Pod) -> PodUse {
    let mut used = PodUse::default();
    for c in containers(pod) {
        used.mounted.extend(c.mounts.iter().map(|m| m.to_string()));
        used.devices.extend(c.devices.iter().map(|(name, _)| name.to_string()));
    }
    used
}

/// The field errors of a pod's `volumeDevices`: a devicePath that is not a clean absolute
/// path, a device naming no volume of the pod, a volume both mounted and taken as a device.
pub fn pod_device_errors(pod: &Pod) -> Vec<FieldError> {
    let volumes: BTreeSet<&str> = pod
        .spec
        .as_ref()
        .and_then(|s| s.volumes.as_ref())
        .into_iter()
        .flatten()
        .map(|v| v.name.as_str())
        .collect();
    let used = pod_use(pod);
    let mut errors = Vec::new();
    for c in containers(pod) {
        for (j, (name, path)) in c.devices.iter().enumerate() {
            let at = format!("{}.volumeDevices[{j}]", c.at);
            if let Err(reason) = clean_absolute_path(path) {
                errors.push(field_error(format!("{at}.devicePath"), path, "a clean absolute path", reason));
            }
            if !volumes.contains(name) {
                let reason = "the pod has no volume of that name".to_string();
                errors.push(field_error(format!("{at}.name"), name, "a volume of the pod", reason));
            } else if used.mounted.contains(*name) {
                let reason =
                    "the pod also mounts it in volumeMounts; a volume is a filesystem or a device, not both"
                        .to_string();
                errors.push(field_error(
                    format!("{at}.name"),
                    name,
                    "a volume used only as a device",
                    reason,
                ));
            }
        }
    }
    errors
}

fn field_error(field: String, value: &str, rule: &'static str, reason: String) -> FieldError {
    FieldError { field, value: value.to_string(), rule, reason }
}

/// A claim binds only to a volume of its own mode.
pub fn check_binding(
    pv_name: &str,
    pv: VolumeMode,
    claim_key: &str,
    claim: VolumeMode,
) -> Result<(), String> {
    if pv == claim {
        return Ok(());
    }
    Err(format!(
        "volume mode mismatch: persistentvolume {pv_name} has volumeMode {pv}, but persistentvolumeclaim \
         {claim_key} asks for {claim}"
    ))
}

/// A pod's volume is used as its mode says: a Block volume only in volumeDevices, a
/// Filesystem one only in volumeMounts. `mode` is `None` for an inline volume (never a device).
pub fn check_use(volume: &str, as_device: bool, mode: Option<VolumeMode>) -> Result<(), String> {
    match (as_device, mode) {
        (true, None) => Err(format!(
            "volume {volume:?} is in volumeDevices, but it is an inline volume; only a persistent volume \
             with volumeMode Block can be a block device"
        )),
        (true, Some(VolumeMode::Filesystem)) => Err(format!(
            "volume {volume:?} is in volumeDevices, but its persistent volume has volumeMode Filesystem"
        )),
        (false, Some(VolumeMode::Block)) => Err(format!(
            "volume {volume:?} has volumeMode Block, so it must be in volumeDevices, not volumeMounts"
        )),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, Volume};

    fn pod(volumes: &[&str], mounts: &[&str], devices: &[(&str, &str)]) -> Pod {
        let container = Container {
            name: "c".into(),
            volume_mounts: Some(
                mounts
                    .iter()
                    .map(|m| VolumeMount {
                        name: m.to_string(),
                        mount_path: format!("/m/{m}"),
                        ..Default::default()
                    })
                    .collect(),
            ),
            volume_devices: Some(
                devices
                    .iter()
                    .map(|(n, p)| VolumeDevice { name: n.to_string(), device_path: p.to_string() })
                    .collect(),
            ),
            ..Container::default()
        };
        Pod {
            spec: Some(PodSpec {
                volumes: Some(
                    volumes.iter().map(|v| Volume { name: v.to_string(), ..Volume::default() }).collect(),
                ),
                containers: vec![container],
                ..PodSpec::default()
            }),
            ..Pod::default()
        }
    }

    #[test]
    fn modes_parse_with_filesystem_the_default() {
        let cases: &[(Option<&str>, Result<VolumeMode, &str>)] = &[
            (None, Ok(VolumeMode::Filesystem)),
            (Some("Filesystem"), Ok(VolumeMode::Filesystem)),
            (Some("Block"), Ok(VolumeMode::Block)),
            (Some("block"), Err("volumeMode \"block\" is neither \"Filesystem\" nor \"Block\"")),
            (Some(""), Err("volumeMode \"\" is neither \"Filesystem\" nor \"Block\"")),
        ];
        for (value, want) in cases {
            assert_eq!(VolumeMode::parse(*value), want.map_err(str::to_string), "{value:?}");
        }
    }

    #[test]
    fn pod_devices_are_checked() {
        let cases: Vec<(Pod, Vec<&str>)> = vec![
            (pod(&["data", "logs"], &["logs"], &[("data", "/dev/xvda")]), vec![]),
            (
                pod(&["data"], &[], &[("data", "dev/xvda")]),
                vec![
                    "spec.containers[0].volumeDevices[0].devicePath: \"dev/xvda\" is not a clean absolute path: it is not absolute",
                ],
            ),
            (
                pod(&["data"], &[], &[("data", "/dev/../etc/passwd")]),
                vec![
                    "spec.containers[0].volumeDevices[0].devicePath: \"/dev/../etc/passwd\" is not a clean absolute path: it has a \"..\" component",
                ],
            ),
            (
                pod(&["data"], &["data"], &[("data", "/dev/xvda")]),
                vec![
                    "spec.containers[0].volumeDevices[0].name: \"data\" is not a volume used only as a device: the pod also mounts it in volumeMounts; a volume is a filesystem or a device, not both",
                ],
            ),
            (
                pod(&["data"], &[], &[("nope", "/dev/xvda")]),
                vec![
                    "spec.containers[0].volumeDevices[0].name: \"nope\" is not a volume of the pod: the pod has no volume of that name",
                ],
            ),
        ];
        for (pod, want) in cases {
            let got: Vec<String> = pod_device_errors(&pod).iter().map(ToString::to_string).collect();
            assert_eq!(got, want);
        }
        let used = pod_use(&pod(&["a", "b"], &["a"], &[("b", "/dev/b")]));
        assert!(used.as_device("b") && !used.as_device("a"));
    }

    #[test]
    fn bindings_and_uses_follow_the_mode() {
        use VolumeMode::{Block, Filesystem};
        let bindings = [
            (Block, Block, Ok(())),
            (Filesystem, Filesystem, Ok(())),
            (
                Block,
                Filesystem,
                Err(
                    "volume mode mismatch: persistentvolume pv-1 has volumeMode Block, but persistentvolumeclaim ns/c asks for Filesystem",
                ),
            ),
            (
                Filesystem,
                Block,
                Err(
                    "volume mode mismatch: persistentvolume pv-1 has volumeMode Filesystem, but persistentvolumeclaim ns/c asks for Block",
                ),
            ),
        ];
        for (pv, claim, want) in bindings {
            assert_eq!(
                check_binding("pv-1", pv, "ns/c", claim),
                want.map_err(str::to_string),
                "{pv} {claim}"
            );
        }
        let uses: [(bool, Option<VolumeMode>, Option<&str>); 6] = [
            (true, Some(Block), None),
            (false, Some(Filesystem), None),
            (false, None, None),
            (true, None, Some("inline volume")),
            (true, Some(Filesystem), Some("has volumeMode Filesystem")),
            (false, Some(Block), Some("must be in volumeDevices")),
        ];
        for (as_device, mode, want) in uses {
            let got = check_use("v", as_device, mode);
            match want {
                None => assert_eq!(got, Ok(())),
                Some(part) => assert!(got.as_ref().unwrap_err().contains(part), "{got:?}"),
            }
        }
    }
}
