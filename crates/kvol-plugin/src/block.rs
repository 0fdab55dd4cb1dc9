//! Raw block volumes on the node: kubelet's block paths, the refusal for plugins without block support, and mapping a device into a pod.
//!
//! A block volume reaches a pod as kubelet lays it out (`pkg/volume/csi/csi_block.go`,
//! `pkg/volume/util/volumepathhandler`):
//!
//! ```text
//! <root>/plugins/<plugin>/volumeDevices/<spec name>/dev/<pod uid>   global map file: the device bind-mounted
//! <root>/pods/<pod uid>/volumeDevices/<plugin, / as ~>/<spec name>  pod device link: a symlink to the device
//! ```
//!
//! (`<plugin>` is written with its `/`, as kubelet's `GetVolumeDevicePluginDir` does:
//! `plugins/kubernetes.io/csi/volumeDevices/…`.) The pod device link is the publish target the
//! agent records; the bind mount on the global map file is what says, across a restart, that
//! the volume is mapped: [`mount_check_path`] turns a target into the path whose mount counts.
//! Kubelet also holds a loop device on the global map file as a lock against removal; kvol
//! does not.

use std::io;
use std::path::{Component, Path, PathBuf};

use crate::error::{PluginError, Result};
use crate::host::{NodePaths, escape_plugin_name};
use crate::mount::Mounter;
use crate::plugin::VolumePlugin;
use crate::spec::VolumeSpec;

/// The directory name kubelet files block volumes under, beside `volumes`.
pub const VOLUME_DEVICES: &str = "volumeDevices";
/// The global map path's last component.
pub const DEV: &str = "dev";

/// Refuses a Block spec for a plugin without block support, naming both.
pub fn check_supported(plugin: &dyn VolumePlugin, spec: &VolumeSpec) -> Result<()> {
    if !spec.is_block() || plugin.supports_block(spec) {
        return Ok(());
    }
    Err(PluginError::invalid(
        spec,
        format!("it has volumeMode Block, and volume plugin {} does not serve block volumes", plugin.name()),
    ))
}

/// Where a pod's volume is published: its pod device link for a block volume, its pod volume
/// directory otherwise, both named by the spec as kubelet names them — the PersistentVolume's
/// name for a volume of a claim or a PV, the pod's volume name for an inline volume
/// (`pods/<uid>/volumes/kubernetes.io~csi/pvc-<uid>/mount`, not `…/<pod volume name>/…`). A
/// Block spec of a plugin without block support is refused here.
pub fn publish_target(
    paths: &NodePaths,
    plugin: &dyn VolumePlugin,
    spec: &VolumeSpec,
    pod_uid: &str,
) -> Result<PathBuf> {
    check_supported(plugin, spec)?;
    if spec.is_block() {
        return paths.pod_device_path(pod_uid, plugin.pod_dir_plugin_name(), spec.name());
    }
    paths.pod_volume_dir(pod_uid, plugin.pod_dir_plugin_name(), spec.name())
}

impl NodePaths {
    /// `<root>/plugins/<plugin>/volumeDevices`: a plugin's node-global block directory.
    pub fn volume_devices_dir(&self, plugin_name: &str) -> PathBuf {
        self.plugin_dir(plugin_name).join(VOLUME_DEVICES)
    }

    /// `<root>/plugins/<plugin>/volumeDevices/<spec name>/dev`: kubelet's global map path.
    pub fn global_map_path(&self, plugin_name: &str, spec_name: &str) -> Result<PathBuf> {
        segment("volume name", spec_name)?;
        Ok(self.volume_devices_dir(plugin_name).join(spec_name).join(DEV))
    }

    /// `<root>/pods/<uid>/volumeDevices/<plugin with ~>/<spec name>`: the pod device link.
    pub fn pod_device_path(&self, pod_uid: &str, plugin_name: &str, spec_name: &str) -> Result<PathBuf> {
        let plugin = escape_plugin_name(plugin_name);
        segment("plugin name", &plugin)?;
        segment("volume name", spec_name)?;
        Ok(self.pod_dir(pod_uid)?.join(VOLUME_DEVICES).join(plugin).join(spec_name))
    }
}

fn segment(what: &'static str, value: &str) -> Result<()> {
    crate::beneath::check_segment(value).map_err(|reason| PluginError::PathSegment {
        what,
        value: value.to_string(),
        reason,
    })
}

/// The parts of a pod device link: root, pod uid, plugin (unescaped) and spec name; `None`
/// when `target` is not one (a filesystem volume's directory).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodDevice {
    pub root: PathBuf,
    pub pod_uid: String,
    pub plugin: String,
    pub spec_name: String,
}

impl PodDevice {
    /// Reads `<root>/pods/<uid>/volumeDevices/<plugin>/<spec>` back into its parts (pure).
    pub fn parse(target: &Path) -> Option<PodDevice> {
        if !target.is_absolute() {
            return None;
        }
        let parts: Vec<&str> = target
            .components()
            .map(|c| match c {
                Component::Normal(s) => s.to_str(),
                Component::RootDir => Some("/"),
                _ => None,
            })
            .collect::<Option<_>>()?;
        let [.., pods, uid, devices, plugin, spec] = parts.as_slice() else { return None };
        if *pods != "pods" || *devices != VOLUME_DEVICES {
            return None;
        }
        let root = target.ancestors().nth(5)?.to_path_buf();
        Some(PodDevice {
            root,
            pod_uid: uid.to_string(),
            plugin: plugin.replace('~', "/"),
            spec_name: spec.to_string(),
        })
    }

    /// The global map file this pod's device is bind-mounted on.
    pub fn global_map_file(&self) -> PathBuf {
        NodePaths::new(&self.root)
            .volume_devices_dir(&self.plugin)
            .join(&self.spec_name)
            .join(DEV)
            .join(&self.pod_uid)
    }
}

/// The path whose mount says a published volume is in place: the global map file for a pod
/// device link, the target itself for a filesystem volume.
pub fn mount_check_path(target: &Path) -> PathBuf {
    PodDevice::parse(target).map_or_else(|| target.to_path_buf(), |d| d.global_map_file())
}

/// Maps `device` into the pod whose device link is `target`: bind-mounts it on the global map
/// file (created empty) and points the link at it. Idempotent: a mapping in place is kept, a
/// link to something else replaced.
pub fn map_device(paths: &NodePaths, mounter: &dyn Mounter, target: &Path, device: &Path) -> Result<()> {
    let parsed = PodDevice::parse(target).ok_or_else(|| {
        PluginError::io("map a block device to", target, io::Error::other("it is not a pod device path"))
    })?;
    let root = paths.open_root()?;
    let global = parsed.global_map_file();
    drop(root.create_file(&global, 0o640).map_err(|e| PluginError::io("create", &global, e))?);
    if !mounter.is_mount_point(&global)? {
        mounter.bind(device, &global, false)?;
    }
    let parent = target.parent().expect("a pod device path has a parent");
    let dir = root.create_dir_all(parent, 0o750).map_err(|e| PluginError::io("create", parent, e))?;
    let name = target.file_name().expect("a pod device path has a name");
    match rustix::fs::readlinkat(&dir, name, Vec::new()) {
        Ok(now) if Path::new(now.to_str().unwrap_or_default()) == device => return Ok(()),
        Ok(_) => root.remove_empty(target).map_err(|e| PluginError::io("replace", target, e))?,
        Err(rustix::io::Errno::NOENT) => {}
        Err(e) => return Err(PluginError::io("read the link", target, e.into())),
    }
    rustix::fs::symlinkat(device, &dir, name).map_err(|e| PluginError::io("link", target, e.into()))
}

/// Undoes [`map_device`]: the link, the bind mount and the global map file, then the
/// directories above each that are left empty (up to the pod's `volumeDevices` and the
/// volume's directory under `volumeDevices`). Already gone is success.
pub fn unmap_device(paths: &NodePaths, mounter: &dyn Mounter, target: &Path) -> Result<()> {
    let Some(parsed) = PodDevice::parse(target) else { return Ok(()) };
    let root = paths.open_root()?;
    root.remove_empty(target).map_err(|e| PluginError::io("remove", target, e))?;
    let global = parsed.global_map_file();
    if mounter.is_mount_point(&global)? {
        mounter.unmount(&global)?;
    }
    root.remove_empty(&global).map_err(|e| PluginError::io("remove", &global, e))?;
    let pod_devices = target.ancestors().nth(2).expect("checked by parse");
    remove_empty_dirs(&root, target.parent(), pod_devices);
    let volume_dir = global.ancestors().nth(2).expect("a global map file has parents");
    remove_empty_dirs(&root, global.parent(), volume_dir);
    Ok(())
}

/// Removes `from` and its parents while they are empty directories, up to and including `last`.
fn remove_empty_dirs(root: &crate::beneath::Root, from: Option<&Path>, last: &Path) {
    let mut at = from;
    while let Some(dir) = at {
        if root.remove_if_empty(dir).is_err() || dir == last || !dir.starts_with(last) {
            return;
        }
        at = dir.parent();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_kubelet_block_layout() {
        let p = NodePaths::new("/var/lib/kubelet");
        assert_eq!(
            p.global_map_path("kubernetes.io/csi", "pv-1").unwrap(),
            Path::new("/var/lib/kubelet/plugins/kubernetes.io/csi/volumeDevices/pv-1/dev")
        );
        assert_eq!(
            p.pod_device_path("u1", "kubernetes.io/csi", "pv-1").unwrap(),
            Path::new("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~csi/pv-1")
        );
        assert!(p.pod_device_path("u1", "kubernetes.io/csi", "..").is_err());
        assert!(p.global_map_path("kubernetes.io/csi", "a/b").is_err());
    }

    #[test]
    fn targets_parse_back_and_give_the_path_whose_mount_counts() {
        // (target, its parts: root, pod uid, plugin, spec name; the path whose mount counts)
        type Parts = Option<(&'static str, &'static str, &'static str, &'static str)>;
        let cases: &[(&str, Parts, &str)] = &[
            (
                "/r/pods/u1/volumeDevices/kubernetes.io~csi/pv-1",
                Some(("/r", "u1", "kubernetes.io/csi", "pv-1")),
                "/r/plugins/kubernetes.io/csi/volumeDevices/pv-1/dev/u1",
            ),
            (
                "/r/pods/u2/volumeDevices/kubernetes.io~local-volume/lv",
                Some(("/r", "u2", "kubernetes.io/local-volume", "lv")),
                "/r/plugins/kubernetes.io/local-volume/volumeDevices/lv/dev/u2",
            ),
            ("/r/pods/u1/volumes/kubernetes.io~csi/pv-1", None, "/r/pods/u1/volumes/kubernetes.io~csi/pv-1"),
            (
                "/r/pods/u1/volumeDevices/kubernetes.io~csi",
                None,
                "/r/pods/u1/volumeDevices/kubernetes.io~csi",
            ),
            ("pods/u1/volumeDevices/p/v", None, "pods/u1/volumeDevices/p/v"),
        ];
        for (target, want, check) in cases {
            let got = PodDevice::parse(Path::new(target));
            let want = want.map(|(root, uid, plugin, spec)| PodDevice {
                root: root.into(),
                pod_uid: uid.into(),
                plugin: plugin.into(),
                spec_name: spec.into(),
            });
            assert_eq!(got, want, "{target}");
            assert_eq!(mount_check_path(Path::new(target)), Path::new(check), "{target}");
        }
    }
}
