//! subPath binding against a pod that wants out of its volume: symlinks to `/etc`, `../`, absolute paths, a planted target, and a rename race, each on real mounts in a private mount namespace.
//!
//! Both resolvers run every case: the kernel's `openat2(RESOLVE_BENEATH)` and kvol's own walk.
//! The race swaps a directory inside the volume with a symlink out of it
//! (`renameat2(RENAME_EXCHANGE)`) for `KVOL_SUBPATH_RACE_SECONDS` (10 by default) while other
//! threads prepare and clean up the sub-path in a loop, checking after every bind by device and
//! inode that it shows the directory inside. Every test leaves nothing mounted.
//!
//! These tests need root (CAP_SYS_ADMIN), as kvol itself does.

use std::fs;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use kvol_plugin::mount::{Mounter, SystemMounter};
use kvol_plugin::subpath::{self, FileId, Resolver};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use rustix::fs::{CWD, Mode, OFlags, RenameFlags, openat, renameat_with};

/// Moves the calling thread (and the threads it starts from now on) into a mount namespace of
/// its own whose mounts propagate nowhere.
fn enter_private_mount_namespace() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS)
        .expect("unshare the mount namespace (these tests need root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
}

const RESOLVERS: [Resolver; 2] = [Resolver::Auto, Resolver::Walk];

/// A node root with one pod, its volume, and a directory outside the volume with a secret.
struct Node {
    scratch: kvol_test_support::ScratchRoot,
    pod: PathBuf,
    volume: PathBuf,
    outside: PathBuf,
}

impl Node {
    fn new() -> Node {
        enter_private_mount_namespace();
        let scratch = kvol_test_support::ScratchRoot::new();
        let pod = scratch.path().join("pods/uid-1");
        let volume = pod.join("volumes/kubernetes.io~empty-dir/data");
        let outside = scratch.path().join("outside");
        fs::create_dir_all(&volume).unwrap();
        fs::create_dir_all(outside.join("inner")).unwrap();
        fs::write(outside.join("secret"), b"host secret").unwrap();
        Node { scratch, pod, volume, outside }
    }

    /// `../` as many times as it takes from the volume to the scratch root.
    fn climb_out(&self) -> String {
        let depth = self.volume.strip_prefix(self.scratch.path()).unwrap().components().count();
        "../".repeat(depth)
    }

    fn assert_nothing_mounted(&self) {
        let left = SystemMounter.mounts_under(self.scratch.path()).unwrap();
        assert!(left.is_empty(), "mounts left: {left:?}");
    }

    /// Prepares `sub_path` with each resolver; every one must be refused, nothing mounted, no
    /// target made, and nothing outside touched.
    fn assert_refused(&self, sub_path: &str, what: &str) {
        for resolver in RESOLVERS {
            let dest = subpath::bind_target(&self.pod, "data", "app", 0).unwrap();
            let err = subpath::prepare_with(&self.volume, sub_path, &dest, 0o777, resolver)
                .expect_err(&format!("{what}: {sub_path:?} with {resolver:?} must be refused"));
            assert!(err.is_refusal(), "{what}: {sub_path:?} with {resolver:?}: not a refusal: {err}");
            println!("{what}: {sub_path:?} with {resolver:?}: {err}");
            self.assert_nothing_mounted();
            assert!(
                !self.pod.join(subpath::SUBPATHS_DIR).exists(),
                "no bind target is made for a refused subPath"
            );
        }
        assert_eq!(fs::read(self.outside.join("secret")).unwrap(), b"host secret");
        assert!(!self.outside.join("inner").join("x").exists());
    }
}

#[test]
fn a_symlink_to_etc_is_refused_as_the_sub_path_and_on_the_way() {
    let node = Node::new();
    symlink("/etc", node.volume.join("etc")).unwrap();
    symlink("/", node.volume.join("root")).unwrap();
    fs::create_dir_all(node.volume.join("dir")).unwrap();
    symlink("/etc/passwd", node.volume.join("dir/passwd")).unwrap();
    node.assert_refused("etc", "a symlink to /etc as the subPath");
    node.assert_refused("etc/passwd", "a symlink to /etc as a middle component");
    node.assert_refused("etc/ssh", "a symlink to /etc as a middle component");
    node.assert_refused("root/etc", "a symlink to / as a middle component");
    node.assert_refused("dir/passwd", "a symlink to /etc/passwd as the last component");
    // Missing below the link: nothing is created through it either.
    node.assert_refused("etc/kvol-made-this", "a directory to create beyond a symlink to /etc");
    assert!(!Path::new("/etc/kvol-made-this").exists());
}

#[test]
fn relative_symlinks_that_climb_out_are_refused() {
    let node = Node::new();
    let out = format!("{}outside", node.climb_out());
    symlink(&out, node.volume.join("up")).unwrap();
    fs::create_dir_all(node.volume.join("a/b")).unwrap();
    symlink(format!("../../{out}"), node.volume.join("a/b/up")).unwrap();
    symlink("../../..", node.volume.join("a/parent")).unwrap();
    node.assert_refused("up", "a relative symlink out of the volume");
    node.assert_refused("up/secret", "a relative symlink out of the volume, on the way");
    node.assert_refused("a/b/up/inner", "a deeper relative symlink out of the volume");
    node.assert_refused("a/parent", "a symlink to the volume's parent");
    node.assert_refused("up/inner/x", "a directory to create beyond a symlink out of the volume");
}

#[test]
fn dot_dot_and_absolute_sub_paths_are_refused_before_any_look() {
    let node = Node::new();
    for sub_path in ["../outside", "a/../../outside", "..", "./..", "a/..", "../../../../../outside/secret"] {
        node.assert_refused(sub_path, "a `..` subPath");
    }
    let outside = node.outside.display().to_string();
    for sub_path in ["/etc", "/", outside.as_str()] {
        node.assert_refused(sub_path, "an absolute subPath");
    }
    let dest = subpath::bind_target(&node.pod, "data", "app", 0).unwrap();
    let err = subpath::prepare(&node.volume, "../etc", &dest, 0o777).unwrap_err();
    assert_eq!(err.to_string(), "unable to provision SubPath `../etc`: must not contain '..'");
    let err = subpath::prepare(&node.volume, "/etc", &dest, 0o777).unwrap_err();
    assert_eq!(err.to_string(), "error SubPath `/etc` must not be an absolute path");
}

#[test]
fn a_symlink_planted_on_the_target_side_is_never_followed() {
    let node = Node::new();
    fs::create_dir_all(node.volume.join("dir")).unwrap();
    // volume-subpaths itself a link out of the pod directory.
    symlink(&node.outside, node.pod.join(subpath::SUBPATHS_DIR)).unwrap();
    let dest = subpath::bind_target(&node.pod, "data", "app", 0).unwrap();
    let err = subpath::prepare(&node.volume, "dir", &dest, 0o777).unwrap_err();
    assert!(err.to_string().contains("kvol never follows one"), "{err}");
    assert!(!node.outside.join("data").exists(), "nothing made through the link");
    node.assert_nothing_mounted();
    let report = subpath::clean_up(&node.pod, None).unwrap();
    assert!(!report.is_clean(), "the planted link is reported: {report:?}");
    assert_eq!(fs::read(node.outside.join("secret")).unwrap(), b"host secret");
    fs::remove_file(node.pod.join(subpath::SUBPATHS_DIR)).unwrap();

    // The index itself a link to a directory outside.
    let container = dest.parent().unwrap();
    fs::create_dir_all(container).unwrap();
    symlink(node.outside.join("inner"), &dest).unwrap();
    let err = subpath::prepare(&node.volume, "dir", &dest, 0o777).unwrap_err();
    assert!(err.to_string().contains("symlink"), "{err}");
    node.assert_nothing_mounted();
    let report = subpath::clean_up(&node.pod, None).unwrap();
    assert_eq!(report.kept.first().map(|k| k.path.as_path()), Some(dest.as_path()), "{report:?}");
    assert!(node.outside.join("inner").is_dir(), "the link's target stays");
}

/// Counts of one preparing thread in the race.
#[derive(Debug, Default)]
struct Figures {
    attempts: AtomicU64,
    successes: AtomicU64,
    refusals: AtomicU64,
    /// Refusals because `openat2` kept answering `EAGAIN` (renames racing its `..` checks).
    raced: AtomicU64,
    other_errors: AtomicU64,
    escapes: AtomicU64,
    unclean: AtomicU64,
}

#[test]
fn a_rename_race_never_binds_outside_the_volume() {
    let seconds: u64 =
        std::env::var("KVOL_SUBPATH_RACE_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    let node = Node::new();
    // `real` (with `real/inner`) is swapped, by name, with a symlink to `outside` (which has
    // an `inner` too, so an escape would succeed): absolute one time, relative the next.
    fs::create_dir_all(node.volume.join("real/inner")).unwrap();
    symlink(&node.outside, node.volume.join("link-abs")).unwrap();
    symlink(format!("{}outside", node.climb_out()), node.volume.join("link-rel")).unwrap();
    let inside = [
        FileId::of_path(&node.volume.join("real")).unwrap(),
        FileId::of_path(&node.volume.join("real/inner")).unwrap(),
    ];
    let outside =
        [FileId::of_path(&node.outside).unwrap(), FileId::of_path(&node.outside.join("inner")).unwrap()];

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let swapper = {
        let (stop, swaps) = (stop.clone(), swaps.clone());
        let volume = openat(CWD, &node.volume, OFlags::RDONLY | OFlags::DIRECTORY, Mode::empty()).unwrap();
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for link in ["link-abs", "link-rel"] {
                    // There and back: `real` is the symlink in between.
                    for _ in 0..2 {
                        renameat_with(&volume, "real", &volume, link, RenameFlags::EXCHANGE)
                            .expect("renameat2(RENAME_EXCHANGE)");
                        swaps.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        })
    };

    let deadline = Instant::now() + Duration::from_secs(seconds);
    let preparers: Vec<_> = RESOLVERS
        .into_iter()
        .map(|resolver| {
            let figures = Arc::new(Figures::default());
            // A pod directory per thread: one thread's cleanup never meets the other's mounts.
            let pod = node.scratch.path().join(format!("pods/racer-{resolver:?}"));
            let volume = node.volume.clone();
            let counts = figures.clone();
            let handle = std::thread::spawn(move || {
                let mut round = 0usize;
                while Instant::now() < deadline {
                    let index = round % 2;
                    round += 1;
                    let sub_path = ["real", "real/inner"][index];
                    let dest = subpath::bind_target(&pod, "data", "app", index).unwrap();
                    counts.attempts.fetch_add(1, Ordering::Relaxed);
                    match subpath::prepare_with(&volume, sub_path, &dest, 0o755, resolver) {
                        Ok(bound) => {
                            counts.successes.fetch_add(1, Ordering::Relaxed);
                            let shown = FileId::of_path(&bound).unwrap();
                            if shown != inside[index] {
                                counts.escapes.fetch_add(1, Ordering::Relaxed);
                                let at = if outside.contains(&shown) {
                                    "outside the volume"
                                } else {
                                    "somewhere else"
                                };
                                eprintln!("ESCAPE with {resolver:?}: {sub_path} bound {shown}, {at}");
                            }
                        }
                        Err(e) if e.is_refusal() => {
                            counts.refusals.fetch_add(1, Ordering::Relaxed);
                            if e.to_string().contains("kept changing") {
                                counts.raced.fetch_add(1, Ordering::Relaxed);
                            }
                        }
                        Err(e) => {
                            counts.other_errors.fetch_add(1, Ordering::Relaxed);
                            eprintln!("with {resolver:?}: {e}");
                        }
                    }
                    match subpath::clean_up(&pod, Some("data")) {
                        Ok(report) if report.is_clean() => {}
                        other => {
                            counts.unclean.fetch_add(1, Ordering::Relaxed);
                            eprintln!("cleanup with {resolver:?}: {other:?}");
                        }
                    }
                }
            });
            (resolver, figures, handle)
        })
        .collect();

    let mut results = Vec::new();
    for (resolver, figures, handle) in preparers {
        handle.join().expect("a preparing thread panicked");
        results.push((resolver, figures));
    }
    stop.store(true, Ordering::Relaxed);
    swapper.join().expect("the swapping thread panicked");

    println!("subPath rename race, {seconds} s, {} swaps:", swaps.load(Ordering::Relaxed));
    for (resolver, f) in &results {
        let load = |c: &AtomicU64| c.load(Ordering::Relaxed);
        println!(
            "  {resolver:?}: attempts {}, successes {}, refusals {} ({} of them EAGAIN from openat2), other errors {}, escapes {}, unclean cleanups {}",
            load(&f.attempts),
            load(&f.successes),
            load(&f.refusals),
            load(&f.raced),
            load(&f.other_errors),
            load(&f.escapes),
            load(&f.unclean)
        );
    }
    for (resolver, f) in &results {
        assert_eq!(
            f.escapes.load(Ordering::Relaxed),
            0,
            "{resolver:?}: a bind mount landed outside the volume"
        );
        assert_eq!(f.other_errors.load(Ordering::Relaxed), 0, "{resolver:?}: errors other than refusals");
        assert_eq!(f.unclean.load(Ordering::Relaxed), 0, "{resolver:?}: a cleanup left something");
        assert!(f.successes.load(Ordering::Relaxed) > 0, "{resolver:?}: the race never let a bind through");
        assert!(f.refusals.load(Ordering::Relaxed) > 0, "{resolver:?}: the race never met the symlink");
    }
    node.assert_nothing_mounted();
    assert_eq!(fs::read(node.outside.join("secret")).unwrap(), b"host secret");
}
