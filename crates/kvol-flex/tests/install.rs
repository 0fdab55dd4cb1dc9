//! The atomic installer against real files: fresh install, idempotence, atomic replacement, failures that keep the old version.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kvol_flex::install::{DEFAULT_PLUGIN_DIR, InstallOutcome, install};
use kvol_flex::{FlexError, Installed};

struct Setup {
    _tmp: kvol_test_support::ScratchRoot,
    plugin_dir: PathBuf,
    sources: PathBuf,
}

fn setup() -> Setup {
    let tmp = kvol_test_support::ScratchRoot::new();
    let plugin_dir = tmp.path().join("exec");
    let sources = tmp.path().join("src");
    std::fs::create_dir(&plugin_dir).unwrap();
    std::fs::create_dir(&sources).unwrap();
    Setup { _tmp: tmp, plugin_dir, sources }
}

impl Setup {
    /// A driver file to install, with these bytes (mode 0644: the installer sets 0755 itself).
    fn source(&self, name: &str, bytes: &[u8]) -> PathBuf {
        let p = self.sources.join(name);
        std::fs::write(&p, bytes).unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        p
    }
}

/// The names in `dir`, sorted.
fn entries(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
    names.sort();
    names
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().mode() & 0o7777
}

#[test]
fn the_default_plugin_dir_is_kubelets() {
    assert_eq!(DEFAULT_PLUGIN_DIR, "/usr/libexec/kubernetes/kubelet-plugins/volume/exec");
}

#[test]
fn a_fresh_install_creates_the_driver_dir_and_an_executable() {
    let s = setup();
    let src = s.source("nfs", b"#!/bin/sh\necho v1\n");
    let got = install(&src, &s.plugin_dir, "example.com~nfs").unwrap();
    let exe = s.plugin_dir.join("example.com~nfs/nfs");
    assert_eq!(
        got,
        Installed {
            name: "example.com/nfs".into(),
            executable: exe.clone(),
            outcome: InstallOutcome::Installed
        }
    );
    assert_eq!(std::fs::read(&exe).unwrap(), b"#!/bin/sh\necho v1\n");
    assert_eq!(mode(&exe), 0o755);
    assert_eq!(mode(&s.plugin_dir.join("example.com~nfs")), 0o755);
    assert_eq!(entries(&s.plugin_dir.join("example.com~nfs")), ["nfs"], "no temporary file left");
    assert_eq!(mode(&src), 0o644, "the source is not touched");

    // A driver without a vendor.
    let got = install(&src, &s.plugin_dir, "lvm").unwrap();
    assert_eq!((got.name.as_str(), got.executable), ("lvm", s.plugin_dir.join("lvm/lvm")));
}

#[test]
fn reinstalling_the_same_bytes_is_unchanged_and_writes_nothing() {
    let s = setup();
    let src = s.source("nfs", b"#!/bin/sh\necho v1\n");
    install(&src, &s.plugin_dir, "vendor~nfs").unwrap();
    let exe = s.plugin_dir.join("vendor~nfs/nfs");
    let before = std::fs::metadata(&exe).unwrap();

    let again = install(&src, &s.plugin_dir, "vendor~nfs").unwrap();
    assert_eq!(again.outcome, InstallOutcome::Unchanged);
    let after = std::fs::metadata(&exe).unwrap();
    assert_eq!(
        (after.ino(), after.mtime(), after.mtime_nsec()),
        (before.ino(), before.mtime(), before.mtime_nsec())
    );

    // Same bytes but a wrong mode is not "the same": it is fixed by a fresh copy.
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert_eq!(install(&src, &s.plugin_dir, "vendor~nfs").unwrap().outcome, InstallOutcome::Updated);
    assert_eq!(mode(&exe), 0o755);
}

#[test]
fn an_update_replaces_atomically_readers_see_old_or_new_never_a_mix() {
    let s = setup();
    // Big enough that a non-atomic copy would be seen half-written.
    let old: Vec<u8> = [b"#!/bin/sh\n# old\n".as_slice(), &vec![b'o'; 512 * 1024]].concat();
    let new: Vec<u8> = [b"#!/bin/sh\n# new\n".as_slice(), &vec![b'n'; 768 * 1024]].concat();
    let src_old = s.source("old", &old);
    let src_new = s.source("new", &new);
    install(&src_old, &s.plugin_dir, "vendor~big").unwrap();
    let exe = s.plugin_dir.join("vendor~big/big");

    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (exe, stop, old, new) = (exe.clone(), Arc::clone(&stop), old.clone(), new.clone());
        std::thread::spawn(move || {
            let (mut reads, mut saw_new) = (0u64, false);
            while !stop.load(Ordering::Relaxed) {
                let got = std::fs::read(&exe).expect("the executable always exists");
                assert!(got == old || got == new, "read {} bytes that are neither version", got.len());
                saw_new |= got == new;
                reads += 1;
            }
            (reads, saw_new)
        })
    };
    for i in 0..60 {
        let (src, want) = if i % 2 == 0 {
            (&src_new, InstallOutcome::Updated)
        } else {
            (&src_old, InstallOutcome::Updated)
        };
        assert_eq!(install(src, &s.plugin_dir, "vendor~big").unwrap().outcome, want);
    }
    stop.store(true, Ordering::Relaxed);
    let (reads, saw_new) = reader.join().expect("the reader saw only whole versions");
    assert!(reads > 0 && saw_new, "the reader ran ({reads} reads) and saw the new version");
    assert_eq!(std::fs::read(&exe).unwrap(), old, "the last install (old bytes) is in place");
    assert_eq!(entries(&s.plugin_dir.join("vendor~big")), ["big"]);
}

#[test]
fn a_missing_source_fails_and_keeps_the_installed_version() {
    let s = setup();
    let src = s.source("nfs", b"v1");
    install(&src, &s.plugin_dir, "vendor~nfs").unwrap();
    let missing = s.sources.join("nope");
    let err = install(&missing, &s.plugin_dir, "vendor~nfs").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cannot read driver file {}: No such file or directory (os error 2)", missing.display())
    );
    assert_eq!(std::fs::read(s.plugin_dir.join("vendor~nfs/nfs")).unwrap(), b"v1");
    assert_eq!(entries(&s.plugin_dir.join("vendor~nfs")), ["nfs"]);
}

#[test]
fn a_failed_rename_removes_the_temporary_file_and_keeps_what_was_there() {
    let s = setup();
    // Something that is not a file sits where the executable goes: the rename fails after the
    // temporary copy was written.
    let blocker = s.plugin_dir.join("vendor~nfs/nfs");
    std::fs::create_dir_all(blocker.join("inside")).unwrap();
    let err = install(&s.source("nfs", b"v1"), &s.plugin_dir, "vendor~nfs").unwrap_err();
    assert!(
        err.to_string().starts_with(&format!("cannot rename the new driver over {}: ", blocker.display())),
        "{err}"
    );
    assert_eq!(entries(&s.plugin_dir.join("vendor~nfs")), ["nfs"], "no .nfs left behind");
    assert!(blocker.join("inside").is_dir());
}

/// A tmpfs of a few pages mounted on a fresh directory, unmounted on drop.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(at: &Path) -> SmallFs {
        use nix::mount::{MsFlags, mount};
        std::fs::create_dir_all(at).unwrap();
        mount(Some("tmpfs"), at, Some("tmpfs"), MsFlags::empty(), Some("size=64k,mode=0755"))
            .expect("the tests run as root and can mount a tmpfs");
        SmallFs(at.to_path_buf())
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
    }
}

#[test]
fn running_out_of_space_mid_copy_keeps_the_old_version_and_leaves_no_temporary_file() {
    let s = setup();
    let fs = SmallFs::mount(&s.plugin_dir.parent().unwrap().join("small"));
    let plugin_dir = fs.0.clone();
    install(&s.source("small", b"#!/bin/sh\necho small\n"), &plugin_dir, "vendor~drv").unwrap();
    let big = s.source("big", &vec![b'x'; 256 * 1024]);
    let err = install(&big, &plugin_dir, "vendor~drv").unwrap_err();
    let temp = plugin_dir.join("vendor~drv/.drv");
    assert!(
        err.to_string().starts_with(&format!("cannot write temporary file {}: ", temp.display()))
            || err.to_string().starts_with(&format!("cannot fsync temporary file {}: ", temp.display())),
        "{err}"
    );
    assert_eq!(std::fs::read(plugin_dir.join("vendor~drv/drv")).unwrap(), b"#!/bin/sh\necho small\n");
    assert_eq!(entries(&plugin_dir.join("vendor~drv")), ["drv"]);
}

#[test]
fn a_read_only_plugin_dir_fails_without_touching_anything() {
    use nix::mount::{MsFlags, mount};
    let s = setup();
    install(&s.source("drv", b"v1"), &s.plugin_dir, "vendor~drv").unwrap();
    // A read-only bind mount of the plugin dir.
    let ro = SmallFs(s.plugin_dir.parent().unwrap().join("ro"));
    std::fs::create_dir(&ro.0).unwrap();
    mount(Some(&s.plugin_dir), &ro.0, None::<&str>, MsFlags::MS_BIND, None::<&str>).unwrap();
    mount(
        None::<&str>,
        &ro.0,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY,
        None::<&str>,
    )
    .unwrap();
    let err = install(&s.source("drv2", b"v2"), &ro.0, "vendor~drv").unwrap_err();
    let temp = ro.0.join("vendor~drv/.drv");
    assert_eq!(
        err.to_string(),
        format!("cannot create temporary file {}: Read-only file system (os error 30)", temp.display())
    );
    let err = install(&s.source("drv2", b"v2"), &ro.0, "vendor~new").unwrap_err();
    assert!(err.to_string().starts_with("cannot create driver directory "), "{err}");
    assert_eq!(std::fs::read(s.plugin_dir.join("vendor~drv/drv")).unwrap(), b"v1");
    assert_eq!(entries(&s.plugin_dir), ["vendor~drv"]);
    assert_eq!(entries(&s.plugin_dir.join("vendor~drv")), ["drv"]);
}

#[test]
fn other_drivers_and_other_files_are_untouched() {
    let s = setup();
    install(&s.source("a", b"a1"), &s.plugin_dir, "vendor~a").unwrap();
    install(&s.source("b", b"b1"), &s.plugin_dir, "vendor~b").unwrap();
    let config = s.plugin_dir.join("vendor~a/config.json");
    std::fs::write(&config, "{}").unwrap();
    let b = s.plugin_dir.join("vendor~b/b");
    let stat = |p: &Path| {
        let m = std::fs::metadata(p).unwrap();
        (m.ino(), m.mtime(), m.mtime_nsec(), m.mode())
    };
    let (b_before, config_before) = (stat(&b), stat(&config));

    assert_eq!(
        install(&s.source("a", b"a2"), &s.plugin_dir, "vendor~a").unwrap().outcome,
        InstallOutcome::Updated
    );
    assert_eq!(std::fs::read(s.plugin_dir.join("vendor~a/a")).unwrap(), b"a2");
    assert_eq!((stat(&b), stat(&config)), (b_before, config_before));
    assert_eq!(entries(&s.plugin_dir), ["vendor~a", "vendor~b"]);
    assert_eq!(entries(&s.plugin_dir.join("vendor~a")), ["a", "config.json"]);
}

#[test]
fn a_stale_temporary_file_is_replaced_not_followed() {
    let s = setup();
    let dir = s.plugin_dir.join("vendor~drv");
    std::fs::create_dir(&dir).unwrap();
    // A leftover planted as a symlink to a file elsewhere must not be written through.
    let victim = s.sources.join("victim");
    std::fs::write(&victim, "precious").unwrap();
    std::os::unix::fs::symlink(&victim, dir.join(".drv")).unwrap();
    install(&s.source("drv", b"v1"), &s.plugin_dir, "vendor~drv").unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
    assert_eq!(entries(&dir), ["drv"]);
}

#[test]
fn invalid_names_are_refused_before_anything_is_created() {
    let s = setup();
    let src = s.source("drv", b"v1");
    for name in ["", ".", "..", ".hidden~drv", "a/b", "vendor~", "Vendor_Inc~drv", "vendor~-drv", "a~b~c~d"] {
        match install(&src, &s.plugin_dir, name) {
            Err(FlexError::InvalidName { reason, .. }) => assert!(!reason.is_empty(), "{name:?}"),
            other => panic!("{name:?}: expected an invalid-name error, got {other:?}"),
        }
    }
    assert!(entries(&s.plugin_dir).is_empty());
    let err = install(&src, &s.plugin_dir, "vendor~").unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("flexvolume driver directory {}: ", s.plugin_dir.join("vendor~").display())),
        "{err}"
    );
}

#[test]
fn a_missing_plugin_dir_is_an_error_naming_it() {
    let s = setup();
    let nowhere = s.plugin_dir.join("missing");
    let err = install(&s.source("drv", b"v1"), &nowhere, "vendor~drv").unwrap_err();
    assert_eq!(
        err.to_string(),
        format!("cannot use plugin directory {}: No such file or directory (os error 2)", nowhere.display())
    );
    assert!(!nowhere.exists());
}
