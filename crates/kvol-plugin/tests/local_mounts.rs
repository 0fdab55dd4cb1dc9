//! The local plugins on real mounts, each test in a private mount namespace of its own thread.
//!
//! Every test mounts under a temporary root and leaves nothing mounted there.
//!
//! These tests need root (CAP_SYS_ADMIN), as kvol itself does.

use std::collections::BTreeMap;
use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{
    EmptyDirVolumeSource, HostPathVolumeSource, LocalVolumeSource, NodeSelector, NodeSelectorRequirement,
    NodeSelectorTerm, PersistentVolume, PersistentVolumeSpec, Volume, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_plugin::local::{EmptyDirPlugin, HostPathPlugin, LocalVolumePlugin};
use kvol_plugin::mount::{MountPoint, Mounter, SystemMounter};
use kvol_plugin::plugin::{DeviceMounter, PodInfo, PublishRequest, UnpublishRequest, VolumeMounter};
use kvol_plugin::{NodeInfo, NodePaths, PluginError, PluginHost, VolumeSpec};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;
use nix::sys::stat::Mode;

/// Moves the calling thread into a mount namespace of its own whose mounts propagate nowhere.
/// Call it first in every test: the async body then runs on this same thread.
fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .expect("unshare the mount namespace (these tests need root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

/// Sets this thread's umask. Unsharing the mount namespace also unshared the thread's
/// filesystem context, umask included, so other tests do not see it.
fn set_umask(mask: u32) {
    nix::sys::stat::umask(Mode::from_bits_truncate(mask));
}

/// A node rooted in a temporary directory, with the real mounter. Dropping it detaches
/// whatever a failed test left mounted below the root before the directory is deleted, so
/// deleting it can never reach through a mount.
struct Sandbox {
    host: PluginHost,
    /// Kept for its deletion on drop, after [`Sandbox::drop`] detached what was left mounted.
    _root: kvol_test_support::ScratchRoot,
}

impl Sandbox {
    fn new() -> Sandbox {
        Sandbox::on_node(NodeInfo::named("node-a"))
    }

    fn on_node(node: NodeInfo) -> Sandbox {
        let root = kvol_test_support::ScratchRoot::new();
        let paths = NodePaths::new(fs::canonicalize(root.path()).expect("canonical root"));
        Sandbox { host: PluginHost::new(paths, node, Arc::new(SystemMounter)), _root: root }
    }

    fn path(&self, relative: &str) -> PathBuf {
        self.host.paths.root().join(relative)
    }

    fn mounts_below(&self, path: &Path) -> Vec<MountPoint> {
        SystemMounter.mounts_under(path).expect("read the mount table")
    }

    fn mount_on(&self, path: &Path) -> MountPoint {
        let mut on_path: Vec<_> = self.mounts_below(path).into_iter().filter(|m| m.target == path).collect();
        assert_eq!(on_path.len(), 1, "expected one mount on {}: {on_path:?}", path.display());
        on_path.remove(0)
    }

    fn assert_nothing_mounted(&self) {
        let left = self.mounts_below(self.host.paths.root());
        assert!(left.is_empty(), "mounts left under the root: {left:?}");
    }
}

impl Drop for Sandbox {
    fn drop(&mut self) {
        let mut left = self.mounts_below(self.host.paths.root());
        left.sort_by_key(|m| std::cmp::Reverse(m.target.components().count()));
        for mount in left {
            let _ = nix::mount::umount2(&mount.target, MntFlags::MNT_DETACH);
        }
    }
}

static POD: PodInfo = PodInfo {
    name: String::new(),
    namespace: String::new(),
    uid: String::new(),
    service_account: String::new(),
    fs_group: None,
    fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
    memory_limit: None,
};

fn publish_request<'a>(spec: &'a VolumeSpec, target: &'a Path, read_only: bool) -> PublishRequest<'a> {
    PublishRequest {
        spec,
        pod: &POD,
        pod_volume_name: spec.name(),
        target,
        staging_path: None,
        device_path: None,
        read_only,
        mount_options: &[],
        projection: None,
    }
}

fn unpublish_request(target: &Path) -> UnpublishRequest<'_> {
    UnpublishRequest { pod_uid: "uid-1", pod_volume_name: "", target, spec: None }
}

fn empty_dir(medium: Option<&str>, size_limit: Option<&str>) -> VolumeSpec {
    let source = EmptyDirVolumeSource {
        medium: medium.map(str::to_string),
        size_limit: size_limit.map(|s| Quantity(s.to_string())),
        ..EmptyDirVolumeSource::default()
    };
    VolumeSpec::inline(
        Volume { name: "cache".to_string(), empty_dir: Some(source), ..Volume::default() },
        "ns",
    )
}

fn host_path(path: &Path, path_type: &str) -> VolumeSpec {
    let source =
        HostPathVolumeSource { path: path.to_str().unwrap().to_string(), type_: Some(path_type.to_string()) };
    VolumeSpec::inline(
        Volume { name: "host".to_string(), host_path: Some(source), ..Volume::default() },
        "ns",
    )
}

fn local_pv(path: &Path, hostnames: &[&str]) -> VolumeSpec {
    let requirement = NodeSelectorRequirement {
        key: "kubernetes.io/hostname".to_string(),
        operator: "In".to_string(),
        values: Some(hostnames.iter().map(|h| h.to_string()).collect()),
    };
    let required = NodeSelector {
        node_selector_terms: vec![NodeSelectorTerm {
            match_expressions: Some(vec![requirement]),
            match_fields: None,
        }],
    };
    VolumeSpec::persistent(PersistentVolume {
        metadata: ObjectMeta { name: Some("local-pv".to_string()), ..ObjectMeta::default() },
        spec: Some(PersistentVolumeSpec {
            local: Some(LocalVolumeSource { path: path.to_str().unwrap().to_string(), fs_type: None }),
            node_affinity: Some(VolumeNodeAffinity { required: Some(required) }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    })
}

fn mode_of(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o7777
}

#[tokio::test]
async fn empty_dir_on_disk_is_world_writable_whatever_the_umask() {
    enter_private_mount_namespace();
    set_umask(0o077);
    let sandbox = Sandbox::new();
    let plugin = EmptyDirPlugin::new(sandbox.host.clone());
    let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
    let spec = empty_dir(None, None);
    plugin.publish(&publish_request(&spec, &dir, false)).await.unwrap();
    assert_eq!(mode_of(&dir), 0o777);
    assert!(sandbox.mounts_below(&dir).is_empty(), "the disk medium mounts nothing");
    fs::write(dir.join("data"), b"x").unwrap();
    plugin.publish(&publish_request(&spec, &dir, false)).await.unwrap();
    assert!(dir.join("data").exists(), "publishing again keeps the contents");

    plugin.unpublish(&unpublish_request(&dir)).await.unwrap();
    assert!(!dir.exists());
    plugin.unpublish(&unpublish_request(&dir)).await.unwrap();
    sandbox.assert_nothing_mounted();
}

/// A directory outside the root with a mode and a file that must survive.
fn victim() -> (kvol_test_support::ScratchRoot, PathBuf) {
    let outside = kvol_test_support::ScratchRoot::new();
    let victim = fs::canonicalize(outside.path()).unwrap().join("victim");
    fs::create_dir(&victim).unwrap();
    fs::write(victim.join("keep"), b"precious").unwrap();
    fs::set_permissions(&victim, fs::Permissions::from_mode(0o700)).unwrap();
    (outside, victim)
}

fn assert_untouched(victim: &Path) {
    assert_eq!(mode_of(victim), 0o700, "{} changed mode", victim.display());
    assert_eq!(fs::read(victim.join("keep")).unwrap(), b"precious");
    assert_eq!(fs::read_dir(victim).unwrap().count(), 1);
}

#[tokio::test]
async fn empty_dir_named_to_climb_out_of_the_root_reaches_nothing() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let (_outside, victim) = victim();
    let plugin = EmptyDirPlugin::new(sandbox.host.clone());
    let climb = format!("{}{}", "../".repeat(12), victim.strip_prefix("/").unwrap().display());
    // The plugin's directory exists, so the climbing path resolves to the victim.
    fs::create_dir_all(sandbox.path("pods/uid-1/volumes/kubernetes.io~empty-dir")).unwrap();
    for name in [climb.as_str(), victim.to_str().unwrap()] {
        let err = plugin.pod_volume_dir("uid-1", name).unwrap_err();
        assert!(err.to_string().starts_with(&format!("refusing volume name {name:?}: ")), "{err}");
        // Past a validation bug the path is built anyway: the plugin still refuses it.
        let dir = sandbox.path("pods/uid-1/volumes/kubernetes.io~empty-dir").join(name);
        let spec = empty_dir(None, None);
        let err = plugin.publish(&publish_request(&spec, &dir, false)).await.unwrap_err();
        assert!(err.to_string().contains("refusing"), "{err}");
        plugin.unpublish(&unpublish_request(&dir)).await.unwrap_err();
        assert_untouched(&victim);
    }
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn empty_dir_under_a_planted_symlink_is_refused_and_its_teardown_removes_nothing_outside() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let (_outside, victim) = victim();
    let plugin = EmptyDirPlugin::new(sandbox.host.clone());
    let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
    // The pod volume directory's parent is a link to the victim; the victim holds what the
    // volume directory would be, with content.
    let parent = dir.parent().unwrap();
    fs::create_dir_all(parent.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(&victim, parent).unwrap();
    fs::create_dir(victim.join("cache")).unwrap();
    fs::write(victim.join("cache/keep"), b"x").unwrap();
    let before = mode_of(&victim.join("cache"));
    let spec = empty_dir(None, None);
    let err = plugin.publish(&publish_request(&spec, &dir, false)).await.unwrap_err();
    assert!(err.to_string().contains("kvol never follows one"), "{err}");
    let err = plugin.unpublish(&unpublish_request(&dir)).await.unwrap_err();
    assert!(err.to_string().contains("kvol never follows one"), "{err}");
    assert_eq!(mode_of(&victim.join("cache")), before, "no chmod through the link");
    assert!(victim.join("cache/keep").exists());
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn recursive_removal_refuses_to_delete_through_a_mount() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let (_outside, victim) = victim();
    let root = sandbox.host.paths.open_root().unwrap();
    let dir = sandbox.path("pods/uid-1/volumes/kubernetes.io~empty-dir/cache");
    fs::create_dir_all(dir.join("inner")).unwrap();
    SystemMounter.bind(&victim, &dir.join("inner"), false).unwrap();
    let err = root.remove_all(&dir).unwrap_err();
    assert!(err.to_string().contains("refusing to delete through the mount at"), "{err}");
    SystemMounter.unmount(&dir.join("inner")).unwrap();
    assert_untouched(&victim);
    root.remove_all(&dir).unwrap();
    assert!(!dir.exists());
}

#[tokio::test]
async fn empty_dir_in_memory_is_a_sized_tmpfs_that_unpublish_removes() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = EmptyDirPlugin::new(sandbox.host.clone());
    let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
    let spec = empty_dir(Some("Memory"), Some("64Mi"));
    plugin.publish(&publish_request(&spec, &dir, false)).await.unwrap();
    plugin.publish(&publish_request(&spec, &dir, false)).await.unwrap();

    let tmpfs = sandbox.mount_on(&dir);
    assert_eq!(tmpfs.fstype, "tmpfs");
    assert!(tmpfs.options.iter().any(|o| o == "size=65536k"), "{:?}", tmpfs.options);
    assert!(!tmpfs.read_only());
    assert_eq!(mode_of(&dir), 0o1777, "the tmpfs root stays sticky and world-writable, as upstream");
    fs::write(dir.join("data"), b"in memory").unwrap();

    plugin.unpublish(&unpublish_request(&dir)).await.unwrap();
    assert!(!dir.exists());
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn empty_dir_teardown_refuses_while_a_foreign_mount_lies_below() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = EmptyDirPlugin::new(sandbox.host.clone());
    let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
    plugin.publish(&publish_request(&empty_dir(Some("Memory"), None), &dir, false)).await.unwrap();
    let foreign = dir.join("foreign");
    fs::create_dir(&foreign).unwrap();
    SystemMounter.mount("tmpfs", &foreign, "tmpfs", false, &[]).unwrap();
    fs::write(foreign.join("precious"), b"not the volume's").unwrap();

    let err = plugin.unpublish(&unpublish_request(&dir)).await.unwrap_err();
    assert!(
        matches!(&err, PluginError::ForeignMounts { mounts, .. } if mounts == std::slice::from_ref(&foreign)),
        "{err}"
    );
    assert!(err.to_string().contains(&foreign.display().to_string()), "{err}");
    assert!(foreign.join("precious").exists(), "nothing was deleted");
    assert_eq!(sandbox.mount_on(&dir).fstype, "tmpfs", "the volume's own tmpfs is still mounted");

    SystemMounter.unmount(&foreign).unwrap();
    plugin.unpublish(&unpublish_request(&dir)).await.unwrap();
    assert!(!dir.exists());
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn plain_empty_dir_teardown_never_enters_a_foreign_mount_below() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = EmptyDirPlugin::new(sandbox.host.clone());
    let dir = plugin.pod_volume_dir("uid-1", "cache").unwrap();
    plugin.publish(&publish_request(&empty_dir(None, None), &dir, false)).await.unwrap();
    let foreign = dir.join("deep/foreign");
    fs::create_dir_all(&foreign).unwrap();
    SystemMounter.mount("tmpfs", &foreign, "tmpfs", false, &[]).unwrap();
    fs::write(foreign.join("precious"), b"not the volume's").unwrap();

    let err = plugin.unpublish(&unpublish_request(&dir)).await.unwrap_err();
    assert!(
        matches!(&err, PluginError::ForeignMounts { mounts, .. } if mounts == std::slice::from_ref(&foreign)),
        "{err}"
    );
    assert!(foreign.join("precious").exists(), "nothing in the foreign mount was deleted");

    SystemMounter.unmount(&foreign).unwrap();
    plugin.unpublish(&unpublish_request(&dir)).await.unwrap();
    assert!(!dir.exists());
    sandbox.assert_nothing_mounted();
}

/// A victim directory holding an empty `data` directory, the name a plugin's teardown would
/// remove if it followed a link into the victim.
fn victim_with_empty(name: &str) -> (kvol_test_support::ScratchRoot, PathBuf) {
    let (outside, victim) = victim();
    fs::create_dir(victim.join(name)).unwrap();
    (outside, victim)
}

fn assert_untouched_with(victim: &Path, name: &str) {
    assert_eq!(mode_of(victim), 0o700, "{} changed mode", victim.display());
    assert_eq!(fs::read(victim.join("keep")).unwrap(), b"precious");
    assert!(victim.join(name).is_dir(), "{} was removed", victim.join(name).display());
    assert_eq!(fs::read_dir(victim).unwrap().count(), 2);
}

#[tokio::test]
async fn host_path_under_a_planted_symlink_is_refused_and_its_teardown_removes_nothing_outside() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    let source = sandbox.path("host-src");
    fs::create_dir(&source).unwrap();
    let spec = host_path(&source, "Directory");
    // A link at the pod's volumes directory, then at the plugin's directory below it.
    for link in ["pods/uid-1/volumes", "pods/uid-1/volumes/kubernetes.io~host-path"] {
        let (_outside, victim) = victim_with_empty("data");
        let target = sandbox.host.paths.pod_volume_dir("uid-1", "kubernetes.io/host-path", "data").unwrap();
        let link = sandbox.path(link);
        fs::create_dir_all(link.parent().unwrap()).unwrap();
        // The victim mirrors what lies below the link: `kubernetes.io~host-path/data` or `data`.
        let below = target.strip_prefix(&link).unwrap();
        if below.components().count() == 2 {
            let plugin_dir = victim.join(below.parent().unwrap());
            fs::rename(victim.join("data"), victim.join("tmp")).unwrap();
            fs::create_dir(&plugin_dir).unwrap();
            fs::rename(victim.join("tmp"), plugin_dir.join("data")).unwrap();
        }
        std::os::unix::fs::symlink(&victim, &link).unwrap();
        let name = below.components().next().unwrap().as_os_str().to_str().unwrap().to_string();

        let err = plugin.publish(&publish_request(&spec, &target, false)).await.unwrap_err();
        assert!(err.to_string().contains("kvol never follows one"), "{}: {err}", link.display());
        assert!(err.to_string().contains(&target.parent().unwrap().display().to_string()), "{err}");
        let err = plugin.unpublish(&unpublish_request(&target)).await.unwrap_err();
        assert!(err.to_string().contains("kvol never follows one"), "{}: {err}", link.display());
        assert_untouched_with(&victim, &name);
        assert!(victim.join(below).is_dir(), "{} was removed", victim.join(below).display());
        assert!(sandbox.mounts_below(&victim).is_empty(), "nothing is mounted in the victim");
        sandbox.assert_nothing_mounted();
        fs::remove_file(&link).unwrap();
    }
    // Without the link the same volume publishes and tears down.
    publish_and_tear_down(&sandbox, &plugin, &spec, "data").await;
}

/// Publishes, checks the target is a mount point of the kind the source is, and tears down.
async fn publish_and_tear_down(sandbox: &Sandbox, plugin: &HostPathPlugin, spec: &VolumeSpec, name: &str) {
    let target = sandbox.path(&format!("pods/uid-1/volumes/kubernetes.io~host-path/{name}"));
    plugin.publish(&publish_request(spec, &target, false)).await.unwrap_or_else(|e| panic!("{name}: {e}"));
    sandbox.mount_on(&target);
    plugin.publish(&publish_request(spec, &target, false)).await.unwrap();
    sandbox.mount_on(&target);
    plugin.unpublish(&unpublish_request(&target)).await.unwrap();
    assert!(!target.exists(), "{name}: the target is removed");
}

#[tokio::test]
async fn host_path_types_that_match_are_bound() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    let dir = sandbox.path("host/dir");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("keep"), b"x").unwrap();
    let file = sandbox.path("host/file");
    fs::write(&file, b"keep").unwrap();
    let socket_path = sandbox.path("host/socket");
    let _listener = std::os::unix::net::UnixListener::bind(&socket_path).unwrap();

    let cases = [
        ("dir", host_path(&dir, "Directory")),
        ("dir-unchecked", host_path(&dir, "")),
        ("file", host_path(&file, "File")),
        ("socket", host_path(&socket_path, "Socket")),
        ("null", host_path(Path::new("/dev/null"), "CharDevice")),
    ];
    for (name, spec) in &cases {
        publish_and_tear_down(&sandbox, &plugin, spec, name).await;
    }
    assert!(dir.join("keep").exists() && fs::read(&file).unwrap() == b"keep", "host data is kept");
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn host_path_block_device_is_bound() {
    enter_private_mount_namespace();
    let Some(device) = any_block_device() else {
        eprintln!("skipped: no block device under /dev to check type BlockDevice against");
        return;
    };
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    publish_and_tear_down(&sandbox, &plugin, &host_path(&device, "BlockDevice"), "block").await;
    let err =
        plugin.publish(&publish_request(&host_path(&device, "CharDevice"), &sandbox.path("t"), false)).await;
    assert_eq!(
        err.unwrap_err().to_string(),
        format!(
            "hostPath type check failed: {} is not a character device, it's a BlockDevice",
            device.display()
        )
    );
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn host_path_create_types_create_with_upstream_modes() {
    enter_private_mount_namespace();
    set_umask(0o022);
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    let new_dir = sandbox.path("host/new/dir");
    publish_and_tear_down(&sandbox, &plugin, &host_path(&new_dir, "DirectoryOrCreate"), "new-dir").await;
    assert!(new_dir.is_dir());
    assert_eq!(mode_of(&new_dir), 0o755);
    assert_eq!(mode_of(&sandbox.path("host/new")), 0o755, "parents are created too");

    let new_file = sandbox.path("host/new/file");
    publish_and_tear_down(&sandbox, &plugin, &host_path(&new_file, "FileOrCreate"), "new-file").await;
    assert!(new_file.is_file());
    assert_eq!(mode_of(&new_file), 0o644);

    let orphan = sandbox.path("host/absent/file");
    let err = plugin
        .publish(&publish_request(&host_path(&orphan, "FileOrCreate"), &sandbox.path("t"), false))
        .await;
    assert!(err.unwrap_err().to_string().contains(&orphan.display().to_string()));
    assert!(!sandbox.path("host/absent").exists(), "FileOrCreate does not create the directory");
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn host_path_mismatches_name_the_path_and_expected_type() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    let dir = sandbox.path("host/dir");
    fs::create_dir_all(&dir).unwrap();
    let file = sandbox.path("host/file");
    fs::write(&file, b"x").unwrap();
    let missing = sandbox.path("host/missing");
    let null = Path::new("/dev/null");
    let mismatch = |path: &Path, expected: &str, found: &str| {
        format!("hostPath type check failed: {} is not a {expected}, it's a {found}", path.display())
    };
    let cases = [
        (host_path(&file, "Directory"), mismatch(&file, "directory", "File")),
        (host_path(&file, "DirectoryOrCreate"), mismatch(&file, "directory", "File")),
        (host_path(&dir, "File"), mismatch(&dir, "file", "Directory")),
        (host_path(&dir, "FileOrCreate"), mismatch(&dir, "file", "Directory")),
        (host_path(&file, "Socket"), mismatch(&file, "socket file", "File")),
        (host_path(&dir, "CharDevice"), mismatch(&dir, "character device", "Directory")),
        (host_path(null, "BlockDevice"), mismatch(null, "block device", "CharDevice")),
        (
            host_path(&missing, "Directory"),
            format!("hostPath {} doesn't exist (hostPath type Directory)", missing.display()),
        ),
        (
            host_path(&missing, ""),
            format!("hostPath {} doesn't exist (hostPath type unset)", missing.display()),
        ),
        (host_path(&dir, "Folder"), "inline volume \"host\": Folder is an invalid volume type".to_string()),
    ];
    let target = sandbox.path("pods/uid-1/volumes/kubernetes.io~host-path/host");
    for (spec, expected) in cases {
        let err = plugin.publish(&publish_request(&spec, &target, false)).await.unwrap_err();
        assert_eq!(err.to_string(), expected);
        assert!(!target.exists(), "a refused publish creates no target");
    }
    assert!(!missing.exists());
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn host_path_read_only_bind_refuses_writes() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    let dir = sandbox.path("host/dir");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("existing"), b"x").unwrap();
    let target = sandbox.path("pods/uid-1/volumes/kubernetes.io~host-path/ro");
    let spec = host_path(&dir, "Directory");
    plugin.publish(&publish_request(&spec, &target, true)).await.unwrap();

    assert!(sandbox.mount_on(&target).read_only());
    assert_eq!(fs::read(target.join("existing")).unwrap(), b"x", "reads pass");
    let err = fs::write(target.join("new"), b"y").unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    let err = fs::OpenOptions::new().append(true).open(target.join("existing")).unwrap_err();
    assert_eq!(err.raw_os_error(), Some(nix::libc::EROFS), "{err}");
    fs::write(dir.join("new"), b"y").expect("the host path itself stays writable");

    plugin.unpublish(&unpublish_request(&target)).await.unwrap();
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn host_path_unpublish_takes_down_submounts_the_bind_brought_along() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let plugin = HostPathPlugin::new(sandbox.host.clone());
    let dir = sandbox.path("host/dir");
    let inner = dir.join("inner");
    fs::create_dir_all(&inner).unwrap();
    SystemMounter.mount("tmpfs", &inner, "tmpfs", false, &[]).unwrap();
    fs::write(inner.join("data"), b"x").unwrap();
    let target = sandbox.path("pods/uid-1/volumes/kubernetes.io~host-path/tree");
    plugin.publish(&publish_request(&host_path(&dir, "Directory"), &target, false)).await.unwrap();
    assert!(target.join("inner/data").exists(), "the bind is recursive");
    assert_eq!(sandbox.mounts_below(&target).len(), 2);

    plugin.unpublish(&unpublish_request(&target)).await.unwrap();
    assert!(!target.exists());
    assert!(inner.join("data").exists(), "the host's own mount and data are untouched");
    SystemMounter.unmount(&inner).unwrap();
    sandbox.assert_nothing_mounted();
}

fn node_with_zone(name: &str) -> NodeInfo {
    let mut node = NodeInfo::named(name);
    node.labels.extend(BTreeMap::from([("topology.kubernetes.io/zone".to_string(), "z1".to_string())]));
    node
}

#[tokio::test]
async fn local_directory_volume_is_bound_on_its_node_only() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::on_node(node_with_zone("node-a"));
    let plugin = LocalVolumePlugin::new(sandbox.host.clone());
    let disk = sandbox.path("mnt/disks/ssd1");
    fs::create_dir_all(&disk).unwrap();
    let target = sandbox.path("pods/uid-1/volumes/kubernetes.io~local-volume/local-pv");

    let elsewhere = local_pv(&disk, &["node-b"]);
    let staging = plugin.device_mount_path(&elsewhere).unwrap();
    let err = plugin.stage(&elsewhere, None, &staging).await.unwrap_err();
    assert!(matches!(err, PluginError::NodeAffinity { ref node, .. } if node == "node-a"), "{err}");
    let err = plugin.publish(&publish_request(&elsewhere, &target, false)).await.unwrap_err();
    assert!(err.to_string().contains("cannot be used on node \"node-a\""), "{err}");
    assert!(!target.exists());
    sandbox.assert_nothing_mounted();

    let here = local_pv(&disk, &["node-a"]);
    plugin.stage(&here, None, &staging).await.unwrap();
    plugin.publish(&publish_request(&here, &target, false)).await.unwrap();
    assert!(sandbox.mounts_below(&staging).is_empty() && !staging.exists(), "a directory is not staged");
    assert!(!sandbox.mount_on(&target).read_only());
    fs::write(target.join("written-in-pod"), b"x").unwrap();
    assert!(disk.join("written-in-pod").exists(), "the pod writes to the local disk");

    plugin.unpublish(&unpublish_request(&target)).await.unwrap();
    plugin.unstage(&staging).await.unwrap();
    assert!(!target.exists() && disk.join("written-in-pod").exists());
    sandbox.assert_nothing_mounted();
}

/// A loop device over a file, detached when dropped (even when the test fails).
struct LoopDevice {
    path: PathBuf,
}

impl LoopDevice {
    fn attach(file: &Path) -> LoopDevice {
        let out = Command::new("losetup").args(["--find", "--show"]).arg(file).output().expect("run losetup");
        assert!(out.status.success(), "losetup failed: {}", String::from_utf8_lossy(&out.stderr));
        LoopDevice { path: PathBuf::from(String::from_utf8(out.stdout).unwrap().trim()) }
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.path).status();
    }
}

/// Why loop-device tests cannot run here, if they cannot.
fn loop_tools_missing() -> Option<String> {
    for tool in ["losetup", "mkfs.ext4"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("{tool} is not installed"));
        }
    }
    (!Path::new("/dev/loop-control").exists()).then(|| "/dev/loop-control does not exist".to_string())
}

#[tokio::test]
async fn local_block_volume_on_a_loop_device_is_staged_and_bound_but_never_formatted() {
    enter_private_mount_namespace();
    if let Some(why) = loop_tools_missing() {
        eprintln!("skipped: {why}");
        return;
    }
    let backing_dir = kvol_test_support::ScratchRoot::new();
    let backing = backing_dir.path().join("disk.img");
    fs::File::create(&backing).unwrap().set_len(16 << 20).unwrap();
    let device = LoopDevice::attach(&backing);
    let sandbox = Sandbox::new();
    let plugin = LocalVolumePlugin::new(sandbox.host.clone());
    let spec = local_pv(&device.path, &["node-a"]);
    let staging = plugin.device_mount_path(&spec).unwrap();
    assert_eq!(staging, sandbox.path("plugins/kubernetes.io/local-volume/mounts/local-pv"));

    // No filesystem yet: kvol does not make one.
    let err = plugin.stage(&spec, None, &staging).await.unwrap_err();
    assert!(matches!(err, PluginError::DeviceMount { .. }), "{err}");
    assert!(err.to_string().contains("kvol does not format devices"), "{err}");
    assert!(!staging.exists(), "a failed stage leaves no staging directory");

    let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&device.path).output().unwrap();
    assert!(mkfs.status.success(), "mkfs.ext4: {}", String::from_utf8_lossy(&mkfs.stderr));
    plugin.stage(&spec, None, &staging).await.unwrap();
    plugin.stage(&spec, None, &staging).await.unwrap();
    let staged = sandbox.mount_on(&staging);
    assert_eq!((staged.fstype.as_str(), staged.source.as_str()), ("ext4", device.path.to_str().unwrap()));

    let target = sandbox.path("pods/uid-1/volumes/kubernetes.io~local-volume/local-pv");
    let mut request = publish_request(&spec, &target, false);
    request.staging_path = Some(&staging);
    plugin.publish(&request).await.unwrap();
    fs::File::create(target.join("written-in-pod")).unwrap().write_all(b"on ext4").unwrap();
    assert_eq!(fs::read(staging.join("written-in-pod")).unwrap(), b"on ext4");

    plugin.unpublish(&unpublish_request(&target)).await.unwrap();
    plugin.unstage(&staging).await.unwrap();
    plugin.unstage(&staging).await.unwrap();
    assert!(!staging.exists() && !target.exists());
    sandbox.assert_nothing_mounted();
}

/// Some block device node under /dev, if the machine has one.
fn any_block_device() -> Option<PathBuf> {
    use std::os::unix::fs::FileTypeExt;
    let mut entries: Vec<PathBuf> = fs::read_dir("/dev").ok()?.filter_map(|e| Some(e.ok()?.path())).collect();
    entries.sort();
    entries.into_iter().find(|p| fs::metadata(p).is_ok_and(|m| m.file_type().is_block_device()))
}

/// The whole host path as operations will take it: the gates shape the catalog, the registry
/// indexes it, `resolve` picks the plugin, and the plugin publishes through the real mounter.
/// A migrated in-tree spec on the same registry ends in its driver's name, never in
/// "no volume plugin matched".
#[tokio::test]
async fn specs_resolve_through_the_registry_to_real_mounts() {
    use kvol_api::FeatureGates;
    use kvol_plugin::migration::{NodeMigration, NodeStatus, Route, resolve};
    use kvol_plugin::{PluginRegistry, catalog};

    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let gates = FeatureGates::parse("CSIMigrationRBD=true,InTreePluginRBDUnregister=true").unwrap();
    let (plugins, skipped) = catalog::compiled_in(&sandbox.host, &gates);
    assert_eq!(skipped.len(), 1, "{skipped:?}");
    let registry = PluginRegistry::new(plugins).unwrap();
    let snapshot = registry.snapshot();
    let own_node = NodeMigration::of_own_node("node-a", &gates, []);

    let data = sandbox.path("data");
    fs::create_dir(&data).unwrap();
    fs::write(data.join("hello"), b"from the host").unwrap();
    let spec = host_path(&data, "Directory");
    let resolved = resolve(&snapshot, &gates, &spec, NodeStatus::Known(&own_node)).unwrap();
    assert_eq!((resolved.plugin.name(), resolved.route), ("kubernetes.io/host-path", Route::Native));
    let target = sandbox.host.paths.pod_volume_dir("uid-1", resolved.plugin.name(), "host").unwrap();
    let mounter = resolved.plugin.mounter().expect("hostPath publishes");
    mounter.publish(&publish_request(&resolved.spec, &target, false)).await.unwrap();
    assert_eq!(fs::read(target.join("hello")).unwrap(), b"from the host");
    assert_eq!(sandbox.mount_on(&target).target, target);
    mounter.unpublish(&unpublish_request(&target)).await.unwrap();
    assert_eq!(fs::read(data.join("hello")).unwrap(), b"from the host", "host data survives teardown");

    let rbd = Volume {
        name: "ceph".to_string(),
        rbd: Some(k8s_openapi::api::core::v1::RBDVolumeSource {
            monitors: vec!["10.0.0.1:6789".to_string()],
            image: "img".to_string(),
            pool: Some("rbd".to_string()),
            ..Default::default()
        }),
        ..Volume::default()
    };
    let err =
        resolve(&snapshot, &gates, &VolumeSpec::inline(rbd, "ns"), NodeStatus::Known(&own_node)).unwrap_err();
    assert_eq!(
        err.to_string(),
        "inline volume \"ceph\" uses in-tree plugin kubernetes.io/rbd, migrated to CSI driver rbd.csi.ceph.com, which is not registered on this node"
    );
    sandbox.assert_nothing_mounted();
}

/// `is_mount_point` (one statx) says what the mount table says, for every kind of path.
#[test]
fn mount_point_checks_agree_with_the_mount_table() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let tmpfs = sandbox.path("tmpfs");
    let below = tmpfs.join("below");
    let plain = sandbox.path("plain");
    let file = sandbox.path("file");
    let bound_file = sandbox.path("bound-file");
    let bound_dir = sandbox.path("bound-dir");
    for dir in [&tmpfs, &plain, &bound_dir] {
        fs::create_dir_all(dir).unwrap();
    }
    fs::write(&file, b"x").unwrap();
    fs::write(&bound_file, b"").unwrap();
    SystemMounter.mount("kvol-test", &tmpfs, "tmpfs", false, &[]).unwrap();
    fs::create_dir(&below).unwrap();
    SystemMounter.bind(&file, &bound_file, false).unwrap();
    SystemMounter.bind(&plain, &bound_dir, true).unwrap();

    let rows = [
        (tmpfs.clone(), true),
        (below, false),
        (plain, false),
        (file, false),
        (bound_file.clone(), true),
        (bound_dir.clone(), true),
        (sandbox.path("missing"), false),
        (sandbox.path("missing/deeper"), false),
    ];
    let table = SystemMounter.mount_points().unwrap();
    for (path, mounted) in rows {
        assert_eq!(SystemMounter.is_mount_point(&path).unwrap(), mounted, "{}", path.display());
        assert_eq!(table.iter().any(|m| m.target == path), mounted, "the table on {}", path.display());
    }
    for target in [&bound_dir, &bound_file, &tmpfs] {
        SystemMounter.unmount(target).unwrap();
        assert!(!SystemMounter.is_mount_point(target).unwrap(), "{} after unmount", target.display());
    }
    sandbox.assert_nothing_mounted();
}

#[tokio::test]
async fn host_paths_outside_the_allowed_prefixes_are_refused() {
    enter_private_mount_namespace();
    let sandbox = Sandbox::new();
    let outside = kvol_test_support::ScratchRoot::new();
    let base = fs::canonicalize(outside.path()).unwrap();
    let (allowed, sibling) = (base.join("srv"), base.join("srv2"));
    fs::create_dir_all(allowed.join("data")).unwrap();
    fs::create_dir_all(&sibling).unwrap();
    let host = sandbox.host.clone().with_allowed_host_paths(Some(vec![allowed.clone()]));
    let plugin = HostPathPlugin::new(host);
    let target = sandbox.path("pods/uid-1/volumes/kubernetes.io~host-path/host");
    let inside = host_path(&allowed.join("data"), "Directory");
    plugin.publish(&publish_request(&inside, &target, false)).await.unwrap();
    assert_eq!(sandbox.mount_on(&target).fstype, sandbox.mounts_below(&target)[0].fstype);
    plugin.unpublish(&unpublish_request(&target)).await.unwrap();
    let refused = host_path(&sibling, "Directory");
    let err = plugin.publish(&publish_request(&refused, &target, false)).await.unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "inline volume \"host\": host path {} is outside the allowed host paths ({}) set by --allowed-host-paths",
            sibling.display(),
            allowed.display()
        )
    );
    assert!(!target.exists(), "a refused volume leaves no target");
    sandbox.assert_nothing_mounted();
}
