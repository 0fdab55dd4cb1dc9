//! The emptyDir plugin: a world-writable directory on the node's disk, or a tmpfs for medium `Memory`.
//!
//! Teardown deletes the directory with its contents, so it first makes sure nothing but its
//! own tmpfs is mounted at or below it: deleting through a foreign mount would destroy data
//! that is not the volume's. Creation, chmod and removal go through [`crate::beneath`]: they
//! never follow a symlink below the kubelet root, and removal never enters another mount.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::EmptyDirVolumeSource;

use super::mount_table_path;
use super::quantity;
use crate::beneath::Root;
use crate::error::{PluginError, Result};
use crate::host::PluginHost;
use crate::mount::{MountPoint, Mounter};
use crate::plugin::{PluginKind, PublishRequest, UnpublishRequest, VolumeMounter, VolumePlugin};
use crate::spec::{SourceKey, VolumeSpec};

/// The plugin's upstream name.
pub const PLUGIN_NAME: &str = "kubernetes.io/empty-dir";

/// The mode of an emptyDir directory, whatever the umask (upstream's `defaultPerm`).
pub const DIR_MODE: u32 = 0o777;

/// What backs an emptyDir volume.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Medium {
    /// A directory on the node's disk (medium `""`).
    Disk,
    /// A tmpfs (medium `Memory`), of at most `size_limit` bytes when one is set; without one
    /// the kernel's default applies (half of RAM).
    Memory { size_limit: Option<u64> },
}

/// The medium an emptyDir source asks for, or why kvol cannot provide it.
pub fn medium_of(source: &EmptyDirVolumeSource) -> Result<Medium, String> {
    match source.medium.as_deref().unwrap_or_default() {
        "" => Ok(Medium::Disk),
        "Memory" => {
            let Some(limit) = &source.size_limit else { return Ok(Medium::Memory { size_limit: None }) };
            let bytes = quantity::parse_bytes(&limit.0)
                .map_err(|e| format!("sizeLimit {:?} is not a valid quantity: {e}", limit.0))?;
            // Zero means no limit, as upstream; tmpfs would read size=0 as unlimited anyway.
            Ok(Medium::Memory { size_limit: (bytes > 0).then_some(bytes) })
        }
        medium if medium == "HugePages" || medium.starts_with("HugePages-") => Err(format!(
            "medium {medium:?} is not supported by kvol: hugetlbfs-backed emptyDir volumes are not implemented"
        )),
        medium => Err(format!("unknown storage medium {medium:?}")),
    }
}

/// The tmpfs mount data for a size limit: `size=<bytes>`, or nothing.
pub fn tmpfs_options(size_limit: Option<u64>) -> Vec<String> {
    size_limit.map(|bytes| format!("size={bytes}")).into_iter().collect()
}

/// The emptyDir plugin (`kubernetes.io/empty-dir`).
#[derive(Debug)]
pub struct EmptyDirPlugin {
    host: PluginHost,
}

impl EmptyDirPlugin {
    pub fn new(host: PluginHost) -> EmptyDirPlugin {
        EmptyDirPlugin { host }
    }

    /// Where a pod's emptyDir volume lives: `<root>/pods/<uid>/volumes/kubernetes.io~empty-dir/<volume>`.
    pub fn pod_volume_dir(&self, pod_uid: &str, volume_name: &str) -> Result<PathBuf> {
        self.host.paths.pod_volume_dir(pod_uid, PLUGIN_NAME, volume_name)
    }
}

/// The size of a memory-backed volume of a pod, as kubelet sizes it: the node's allocatable
/// memory, or the pod's memory limit when that is smaller, or the volume's own `sizeLimit`
/// when that is smaller still; `None` when none is known (the kernel's default, half of RAM).
pub fn memory_volume_size(allocatable: u64, pod_limit: Option<u64>, size_limit: Option<u64>) -> Option<u64> {
    let smaller = |limit: Option<u64>, than: Option<u64>| match (limit.filter(|l| *l > 0), than) {
        (Some(l), Some(t)) if l <= t => Some(l),
        (Some(l), None) => Some(l),
        _ => than,
    };
    let node = (allocatable > 0).then_some(allocatable);
    smaller(size_limit, smaller(pod_limit, node))
}

/// Sets a pod's volume directory up as an emptyDir of `medium` (world-writable; a tmpfs of
/// `size` for `Memory`) with the pod's `fsGroup`: what emptyDir publishes, and what kubelet's
/// configMap, secret, downwardAPI and projected volumes are wrapped in.
pub(crate) fn set_up(host: &PluginHost, req: &PublishRequest<'_>, medium: Medium) -> Result<()> {
    let root = host.paths.open_root()?;
    make_world_writable(&root, req.target)?;
    if let Medium::Memory { size_limit } = medium {
        let size = memory_volume_size(host.node.allocatable.memory_bytes, req.pod.memory_limit, size_limit);
        set_up_tmpfs(host.mounter.as_ref(), req.target, size)?;
    }
    // The pod's fsGroup, as kubelet's emptyDir gives it: the group, g+rwx and setgid.
    if let Some(group) = req.pod.fs_group {
        crate::beneath::apply_pod_fs_group(req.target, group, req.pod.fs_group_change_policy, false)?;
    }
    Ok(())
}

/// Mounts a tmpfs on `dir` unless one is there already. Asks about `dir` alone (not the
/// mount table) unless something other than a tmpfs is mounted there.
fn set_up_tmpfs(mounter: &dyn Mounter, dir: &Path, size_limit: Option<u64>) -> Result<()> {
    let table_path = mount_table_path(dir);
    if mounter.is_tmpfs_mount(&table_path)? {
        return Ok(());
    }
    if !mounter.is_mount_point(&table_path)? {
        // The tmpfs root comes up 1777 (sticky, world-writable) and stays so, as upstream leaves it.
        mounter.mount("tmpfs", dir, "tmpfs", false, &tmpfs_options(size_limit))?;
        return Ok(());
    }
    let on_dir = mounts_on(mounter, dir)?;
    if let Some(last) = on_dir.last() {
        if last.fstype == "tmpfs" {
            return Ok(());
        }
        let already =
            io::Error::other(format!("{} from {} is already mounted there", last.fstype, last.source));
        return Err(PluginError::io("mount tmpfs on", dir, already));
    }
    // The tmpfs root comes up 1777 (sticky, world-writable) and stays so, as upstream leaves it.
    mounter.mount("tmpfs", dir, "tmpfs", false, &tmpfs_options(size_limit))?;
    Ok(())
}

/// Takes a volume set up by [`set_up`] down: its tmpfs, if any, unmounted and the directory
/// deleted with its contents; refused while anything else is mounted at or below it. Already
/// gone: success.
///
/// Asks about the directory alone, not the mount table (which at node scale holds thousands
/// of mounts, each formatted at every read): a tmpfs with anything mounted below it cannot be
/// unmounted (the kernel says busy), and the removal never enters a mount. Only when either
/// refuses is the table read, to name what is mounted there. A plain directory's own files
/// may then be partly removed already; a mount's never are.
pub(crate) fn tear_down(host: &PluginHost, dir: &Path) -> Result<()> {
    match fs::symlink_metadata(dir) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(PluginError::io("inspect", dir, e)),
        Ok(_) => {}
    }
    let mounter = host.mounter.as_ref();
    let table_path = mount_table_path(dir);
    // Latest first, should tmpfs mounts be stacked.
    while mounter.is_tmpfs_mount(&table_path)? {
        if mounter.unmount(&table_path).is_err() {
            return tear_down_by_table(host, dir);
        }
    }
    if mounter.is_mount_point(&table_path)? {
        return tear_down_by_table(host, dir);
    }
    let root = host.paths.open_root()?;
    match root.remove_all(dir) {
        Ok(()) => Ok(()),
        Err(_) => tear_down_by_table(host, dir),
    }
}

/// [`tear_down`] by the mount table: what is mounted at or below the directory, named when it
/// is not the volume's own tmpfs.
fn tear_down_by_table(host: &PluginHost, dir: &Path) -> Result<()> {
    let mounter = host.mounter.as_ref();
    let table_path = mount_table_path(dir);
    let mounts = mounter.mounts_under(&table_path)?;
    let foreign: Vec<PathBuf> = mounts
        .iter()
        .filter(|m| m.target != table_path || m.fstype != "tmpfs")
        .map(|m| m.target.clone())
        .collect();
    if !foreign.is_empty() {
        return Err(PluginError::ForeignMounts { path: dir.to_path_buf(), mounts: foreign });
    }
    // Latest first, should tmpfs mounts be stacked.
    for tmpfs in mounts.iter().rev() {
        mounter.unmount(&tmpfs.target)?;
    }
    let root = host.paths.open_root()?;
    root.remove_all(dir).map_err(|e| PluginError::io("remove", dir, e))
}

/// The mounts exactly on `path`, in mount order.
fn mounts_on(mounter: &dyn Mounter, path: &Path) -> Result<Vec<MountPoint>> {
    let table_path = mount_table_path(path);
    Ok(mounter.mounts_under(&table_path)?.into_iter().filter(|m| m.target == table_path).collect())
}

/// Creates the directory (and its parents) under the root without following symlinks and makes
/// its permission bits 0777 when a umask narrowed them; like upstream's `setupDir`, it leaves a
/// directory alone whose bits are already all set (a tmpfs root keeps its sticky bit on a
/// repeated publish).
fn make_world_writable(root: &Root, dir: &Path) -> Result<()> {
    let fd = root.create_dir_all(dir, DIR_MODE).map_err(|e| PluginError::io("create directory", dir, e))?;
    let mode = rustix::fs::fstat(&fd).map_err(|e| PluginError::io("inspect", dir, e.into()))?.st_mode;
    if mode & 0o777 == DIR_MODE {
        return Ok(());
    }
    rustix::fs::fchmod(&fd, rustix::fs::Mode::from_raw_mode(DIR_MODE))
        .map_err(|e| PluginError::io("chmod", dir, e.into()))
}

impl VolumePlugin for EmptyDirPlugin {
    fn name(&self) -> &str {
        PLUGIN_NAME
    }

    fn kind(&self) -> PluginKind {
        PluginKind::CompiledIn
    }

    fn serves(&self) -> Vec<SourceKey<'_>> {
        vec![SourceKey::Field("emptyDir")]
    }

    fn can_support(&self, spec: &VolumeSpec) -> bool {
        spec.inline_volume().is_some_and(|v| v.empty_dir.is_some())
    }

    /// The pod's name for the volume, as upstream names ephemeral volumes.
    fn volume_name(&self, spec: &VolumeSpec) -> Result<String> {
        if !self.can_support(spec) {
            return Err(PluginError::invalid(spec, "it is not an emptyDir volume"));
        }
        Ok(spec.name().to_string())
    }

    fn mounter(&self) -> Option<&dyn VolumeMounter> {
        Some(self)
    }
}

#[async_trait]
impl VolumeMounter for EmptyDirPlugin {
    /// Sets the volume up at `req.target`; already set up, it does nothing.
    async fn publish(&self, req: &PublishRequest<'_>) -> Result<()> {
        let spec = req.spec;
        let source = spec
            .inline_volume()
            .and_then(|v| v.empty_dir.as_ref())
            .ok_or_else(|| PluginError::invalid(spec, "it is not an emptyDir volume"))?;
        let medium = medium_of(source).map_err(|reason| PluginError::invalid(spec, reason))?;
        set_up(&self.host, req, medium)
    }

    /// Unmounts the volume's tmpfs, if any, and deletes the directory with its contents;
    /// refuses while anything else is mounted at or below it. Already gone: success.
    async fn unpublish(&self, req: &UnpublishRequest<'_>) -> Result<()> {
        tear_down(&self.host, req.target)
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Volume;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

    use std::os::unix::fs::PermissionsExt;

    use super::*;
    use crate::local::test_support::{block_on, publish_request, recording_host, unpublish_request};
    use crate::mount::MountCall;

    fn source(medium: Option<&str>, size_limit: Option<&str>) -> EmptyDirVolumeSource {
        EmptyDirVolumeSource {
            medium: medium.map(str::to_string),
            size_limit: size_limit.map(|s| Quantity(s.to_string())),
            ..EmptyDirVolumeSource::default()
        }
    }

    fn spec(medium: Option<&str>, size_limit: Option<&str>) -> VolumeSpec {
        let volume = Volume {
            name: "cache".to_string(),
            empty_dir: Some(source(medium, size_limit)),
            ..Volume::default()
        };
        VolumeSpec::inline(volume, "ns")
    }

    #[test]
    fn media_are_read_from_the_source() {
        /// Medium, sizeLimit, and the medium or the start of the reason.
        type Case = (Option<&'static str>, Option<&'static str>, Result<Medium, &'static str>);
        let cases: &[Case] = &[
            (None, None, Ok(Medium::Disk)),
            (Some(""), Some("1Gi"), Ok(Medium::Disk)),
            (Some("Memory"), None, Ok(Medium::Memory { size_limit: None })),
            (Some("Memory"), Some("64Mi"), Ok(Medium::Memory { size_limit: Some(64 << 20) })),
            (Some("Memory"), Some("1.5k"), Ok(Medium::Memory { size_limit: Some(1500) })),
            (Some("Memory"), Some("0"), Ok(Medium::Memory { size_limit: None })),
            (Some("Memory"), Some("64MB"), Err("sizeLimit \"64MB\" is not a valid quantity: \"MB\" is not")),
            (Some("Memory"), Some("-1Gi"), Err("sizeLimit \"-1Gi\" is not a valid quantity: it is negative")),
            (Some("HugePages"), None, Err("medium \"HugePages\" is not supported by kvol")),
            (Some("HugePages-2Mi"), None, Err("medium \"HugePages-2Mi\" is not supported by kvol")),
            (Some("memory"), None, Err("unknown storage medium \"memory\"")),
            (Some("SSD"), None, Err("unknown storage medium \"SSD\"")),
        ];
        for (medium, limit, expected) in cases {
            match (medium_of(&source(*medium, *limit)), expected) {
                (Ok(got), Ok(want)) => assert_eq!(got, *want, "{medium:?} {limit:?}"),
                (Err(got), Err(want)) => {
                    assert!(got.starts_with(want), "{got:?} does not start with {want:?}")
                }
                (got, want) => panic!("{medium:?} {limit:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn tmpfs_size_option_is_in_bytes() {
        assert_eq!(tmpfs_options(None), Vec::<String>::new());
        assert_eq!(tmpfs_options(Some(67_108_864)), ["size=67108864"]);
    }

    #[test]
    fn disk_medium_is_a_world_writable_directory_without_mounts() {
        let (_root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        assert!(dir.ends_with("pods/uid-1/volumes/kubernetes.io~empty-dir/cache"));
        let disk = spec(None, None);
        block_on(plugin.publish(&publish_request(&disk, &dir, false))).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
        block_on(plugin.publish(&publish_request(&disk, &dir, false))).unwrap();
        assert_eq!(fs::metadata(&dir).unwrap().permissions().mode() & 0o7777, 0o777);
        assert!(mounter.calls().is_empty());
    }

    #[test]
    fn memory_medium_mounts_one_sized_tmpfs() {
        let (_root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        let memory = spec(Some("Memory"), Some("64Mi"));
        block_on(plugin.publish(&publish_request(&memory, &dir, true))).unwrap();
        block_on(plugin.publish(&publish_request(&memory, &dir, true))).unwrap();
        let expected = MountCall::Mount {
            source: "tmpfs".to_string(),
            target: dir.clone(),
            fstype: "tmpfs".to_string(),
            read_only: false,
            data: vec!["size=67108864".to_string()],
        };
        assert_eq!(mounter.calls(), [expected]);
    }

    #[test]
    fn memory_medium_without_limit_takes_the_kernel_default() {
        let (_root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        block_on(plugin.publish(&publish_request(&spec(Some("Memory"), None), &dir, false))).unwrap();
        assert!(matches!(&mounter.calls()[..], [MountCall::Mount { data, .. }] if data.is_empty()));
    }

    #[test]
    fn a_foreign_mount_on_the_directory_is_not_covered() {
        let (_root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        fs::create_dir_all(&dir).unwrap();
        mounter.bind(Path::new("/srv"), &dir, false).unwrap();
        let err =
            block_on(plugin.publish(&publish_request(&spec(Some("Memory"), None), &dir, false))).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!("cannot mount tmpfs on {}: bind from /srv is already mounted there", dir.display())
        );
    }

    #[test]
    fn bad_specs_are_refused_naming_the_volume_and_value() {
        let (_root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        let cases = [
            (
                spec(Some("Memory"), Some("lots")),
                "inline volume \"cache\": sizeLimit \"lots\" is not a valid quantity",
            ),
            (
                spec(Some("HugePages-1Gi"), None),
                "inline volume \"cache\": medium \"HugePages-1Gi\" is not supported by kvol",
            ),
            (
                VolumeSpec::inline(Volume { name: "x".into(), ..Volume::default() }, "ns"),
                "inline volume \"x\": it is not an emptyDir volume",
            ),
        ];
        for (spec, expected) in cases {
            let err = block_on(plugin.publish(&publish_request(&spec, &dir, false))).unwrap_err();
            assert!(err.to_string().starts_with(expected), "{err}");
        }
        assert!(!dir.exists() && mounter.calls().is_empty(), "a refused spec leaves nothing behind");
    }

    #[test]
    fn unpublish_unmounts_the_tmpfs_deletes_the_directory_and_is_idempotent() {
        let (_root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        block_on(plugin.publish(&publish_request(&spec(Some("Memory"), None), &dir, false))).unwrap();
        fs::write(dir.join("file"), b"x").unwrap();
        block_on(plugin.unpublish(&unpublish_request(&dir))).unwrap();
        assert!(!dir.exists());
        assert_eq!(mounter.calls().last(), Some(&MountCall::Unmount { target: dir.clone() }));
        block_on(plugin.unpublish(&unpublish_request(&dir))).unwrap();
        assert_eq!(mounter.calls().len(), 2);
    }

    /// (A plain directory with a mount below is refused by the removal itself, which never
    /// enters a mount: a real mount's test, in `tests/local_mounts.rs`.)
    #[test]
    fn unpublish_refuses_while_foreign_mounts_lie_below() {
        let (root, host, mounter) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
        block_on(plugin.publish(&publish_request(&spec(Some("Memory"), None), &dir, false))).unwrap();
        let inner = dir.join("inner");
        fs::create_dir(&inner).unwrap();
        mounter.bind(&root.path().join("precious"), &inner, false).unwrap();
        let err = block_on(plugin.unpublish(&unpublish_request(&dir))).unwrap_err();
        assert_eq!(
            err.to_string(),
            format!(
                "refusing to delete {}: other mounts lie at or below it ({}); unmount them first",
                dir.display(),
                inner.display()
            )
        );
        assert!(inner.exists());
        let table = mounter.mount_points().unwrap();
        assert_eq!(table.len(), 2, "the volume's tmpfs and the foreign mount stay: {table:?}");
    }

    #[test]
    fn the_plugin_serves_inline_empty_dirs_only() {
        let (_root, host, _) = recording_host();
        let plugin = EmptyDirPlugin::new(host);
        assert_eq!(plugin.name(), "kubernetes.io/empty-dir");
        assert_eq!(plugin.serves(), [SourceKey::Field("emptyDir")]);
        assert!(plugin.can_support(&spec(None, None)));
        assert_eq!(plugin.volume_name(&spec(None, None)).unwrap(), "cache");
        let caps = plugin.capabilities();
        assert!(caps.mountable && !caps.persistent && !caps.attachable && !caps.device_mountable);
    }
}
