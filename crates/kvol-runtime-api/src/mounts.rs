//! A container's mounts and devices as kubelet v1.26's makeMounts and makeBlockVolumes make them, from the pod and where its volumes are published; pure (sub-paths are planned here, bound by the caller).
//!
//! Facts from the kubelet peer (`pkg/kubelet/kubelet_pods.go`): a mount is read-only when the
//! volumeMount says so or the volume itself is (configMap, secret, downwardAPI and projected
//! volumes always are: the peer's fake runtime saw `ro=true` for them); `mountPropagation`
//! unset or `None` is private, `HostToContainer` and `Bidirectional` map to CRI's values, and
//! the API allows `Bidirectional` to privileged containers only; a sub-path must be relative
//! and step back nowhere, and is bound at `volume-subpaths/<volume>/<container>/<index>` under
//! the pod's directory, the index that of the volumeMount in the container's list; a
//! `volumeDevices` entry becomes a device with permissions `mrw`. Left to the runner, as kubelet
//! makes them outside the volume manager: `/etc/hosts`, `/dev/termination-log`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::{Container, Pod, VolumeMount};

/// Where one of the pod's volumes is published, as the planner needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublishedVolume {
    /// The pod volume directory, or a block volume's device link.
    pub host_path: PathBuf,
    /// The volume itself is read-only (a read-only claim or source; the API-object kinds).
    pub read_only: bool,
    /// kvol makes the volume's files itself (emptyDir and the API-object kinds): kubelet asks
    /// the runtime to relabel those for SELinux.
    pub managed: bool,
    /// A raw block volume (a device, for `volumeDevices`).
    pub block: bool,
}

/// CRI's mount propagation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Propagation {
    Private,
    HostToContainer,
    Bidirectional,
}

/// Where a mount's host side comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum HostSide {
    /// The volume's path as it is.
    Volume(PathBuf),
    /// A bind mount of `sub_path` beneath `volume_dir`, to be made at `dest`.
    SubPath { volume_dir: PathBuf, sub_path: String, dest: PathBuf },
}

/// One mount of the container, its sub-path (if any) still to bind.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedMount {
    pub volume: String,
    pub container_path: String,
    pub host: HostSide,
    pub read_only: bool,
    pub selinux_relabel: bool,
    pub propagation: Propagation,
}

/// One device of the container (a `volumeDevices` entry).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PlannedDevice {
    pub volume: String,
    pub container_path: String,
    pub host_path: PathBuf,
    pub permissions: String,
}

/// A container's mounts and devices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerPlan {
    pub mounts: Vec<PlannedMount>,
    pub devices: Vec<PlannedDevice>,
}

/// The container `name` of the pod (a regular or an init container).
pub fn container<'a>(pod: &'a Pod, name: &str) -> Option<&'a Container> {
    let spec = pod.spec.as_ref()?;
    spec.containers.iter().chain(spec.init_containers.iter().flatten()).find(|c| c.name == name)
}

/// The mounts and devices of container `name`, or every reason they cannot be made.
/// `volumes` are the pod's published volumes by the pod's names for them; `pod_dir` is
/// `<root>/pods/<uid>`.
pub fn plan(
    pod: &Pod,
    pod_dir: &Path,
    name: &str,
    volumes: &BTreeMap<String, PublishedVolume>,
) -> Result<ContainerPlan, String> {
    let container = container(pod, name).ok_or_else(|| format!("the pod has no container {name:?}"))?;
    let privileged = container.security_context.as_ref().and_then(|c| c.privileged) == Some(true);
    let env = |var: &str| env_value(pod, container, var);
    let mut plan = ContainerPlan::default();
    let mut errors = Vec::new();
    for (index, mount) in container.volume_mounts.iter().flatten().enumerate() {
        match plan_mount(pod_dir, name, index, mount, volumes, privileged, &env) {
            Ok(m) => plan.mounts.push(m),
            Err(why) => errors.push(format!("volumeMount {:?} at {:?}: {why}", mount.name, mount.mount_path)),
        }
    }
    for device in container.volume_devices.iter().flatten() {
        match volumes.get(&device.name) {
            Some(v) if v.block => plan.devices.push(PlannedDevice {
                volume: device.name.clone(),
                container_path: device.device_path.clone(),
                host_path: v.host_path.clone(),
                permissions: "mrw".to_string(),
            }),
            Some(_) => {
                errors.push(format!("volumeDevice {:?}: the volume is not a block volume", device.name))
            }
            None => errors.push(format!("volumeDevice {:?}: the volume is not published", device.name)),
        }
    }
    if errors.is_empty() { Ok(plan) } else { Err(errors.join("; ")) }
}

fn plan_mount(
    pod_dir: &Path,
    container: &str,
    index: usize,
    mount: &VolumeMount,
    volumes: &BTreeMap<String, PublishedVolume>,
    privileged: bool,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<PlannedMount, String> {
    let volume = volumes.get(&mount.name).ok_or("the volume is not published")?;
    if volume.block {
        return Err("the volume is a block volume: use volumeDevices".to_string());
    }
    let propagation = propagation(mount.mount_propagation.as_deref(), privileged)?;
    let sub_path = match (mount.sub_path.as_deref(), mount.sub_path_expr.as_deref()) {
        (Some(p), Some(e)) if !p.is_empty() && !e.is_empty() => {
            return Err("subPath and subPathExpr are mutually exclusive".to_string());
        }
        (_, Some(expr)) if !expr.is_empty() => kvol_api::subpath_expr::expand_sub_path_expr(expr, env)
            .map_err(|why| format!("subPathExpr {expr:?}: {why}"))?,
        (path, _) => path.unwrap_or_default().to_string(),
    };
    let host = if sub_path.is_empty() {
        HostSide::Volume(volume.host_path.clone())
    } else {
        kvol_api::subpath_expr::validate_sub_path(&sub_path)?;
        let dest = pod_dir.join("volume-subpaths").join(&mount.name).join(container).join(index.to_string());
        HostSide::SubPath { volume_dir: volume.host_path.clone(), sub_path, dest }
    };
    let container_path = if mount.mount_path.starts_with('/') {
        mount.mount_path.clone()
    } else {
        format!("/{}", mount.mount_path)
    };
    Ok(PlannedMount {
        volume: mount.name.clone(),
        container_path,
        host,
        read_only: mount.read_only == Some(true) || volume.read_only,
        selinux_relabel: volume.managed,
        propagation,
    })
}

/// CRI's propagation for a volumeMount's `mountPropagation` (kubelet's
/// `translateMountPropagation`), with the API's rule that only a privileged container may have
/// `Bidirectional`.
pub fn propagation(mode: Option<&str>, privileged: bool) -> Result<Propagation, String> {
    match mode {
        None | Some("None") => Ok(Propagation::Private),
        Some("HostToContainer") => Ok(Propagation::HostToContainer),
        Some("Bidirectional") if privileged => Ok(Propagation::Bidirectional),
        Some("Bidirectional") => {
            Err("Bidirectional mount propagation is available only to privileged containers".into())
        }
        Some(other) => {
            Err(format!("invalid mountPropagation {other:?} (None, HostToContainer or Bidirectional)"))
        }
    }
}

/// An environment variable of the container, as far as kvol can tell it without the runtime:
/// a literal `value`, or a `fieldRef` to the pod's metadata, `spec.nodeName` or
/// `spec.serviceAccountName`. Others (ConfigMap and Secret keys, resources, the pod's IP) are
/// unknown here: a `subPathExpr` naming one is refused, as kubelet refuses an unset variable.
fn env_value(pod: &Pod, container: &Container, var: &str) -> Option<String> {
    let entry = container.env.iter().flatten().rev().find(|e| e.name == var)?;
    if let Some(value) = &entry.value {
        return Some(value.clone());
    }
    let field = entry.value_from.as_ref()?.field_ref.as_ref()?;
    let spec = pod.spec.as_ref();
    match field.field_path.as_str() {
        "spec.nodeName" => spec.and_then(|s| s.node_name.clone()),
        "spec.serviceAccountName" => spec.and_then(|s| s.service_account_name.clone()),
        path => {
            let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            let at = kvol_api::projection::PodRef { pod, namespace, uid };
            kvol_api::projection::field_value(at, path).ok()
        }
    }
}

#[cfg(test)]
#[path = "mounts_tests.rs"]
mod tests;
