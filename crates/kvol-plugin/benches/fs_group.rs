//! The `fsGroup` walk over a large volume, timed against a plain path-based walk in the same run.
//!
//! `cargo bench -p kvol-plugin --bench fs_group [FILES]` builds a tree of FILES files (default
//! 100,000; 100 per directory) in a temporary directory, then times, alternately over three
//! rounds, kvol's descriptor-based walk (`beneath::apply_fs_group`: `O_PATH|O_NOFOLLOW` opens,
//! `statx`, `fchownat`, chmod through `/proc/self/fd`) and a baseline that does what a plain
//! walk does by path (`read_dir`, `symlink_metadata`, `lchown`, `set_permissions`). Both change
//! the same inodes; the medians are printed.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_plugin::beneath::apply_fs_group;

const PER_DIR: usize = 100;
const ROUNDS: usize = 3;

fn build(root: &Path, files: usize) {
    for d in 0..files.div_ceil(PER_DIR) {
        let dir = root.join(format!("d{d}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..PER_DIR.min(files - d * PER_DIR) {
            fs::write(dir.join(format!("f{f}")), b"").unwrap();
        }
    }
}

/// The plain walk: by path, stack-based, as a `walkdir` loop would.
fn baseline(root: &Path, gid: u32) -> u64 {
    let mut pending = vec![root.to_path_buf()];
    let mut changed = 0;
    while let Some(path) = pending.pop() {
        let meta = fs::symlink_metadata(&path).unwrap();
        std::os::unix::fs::lchown(&path, None, Some(gid)).unwrap();
        changed += 1;
        if meta.file_type().is_symlink() {
            continue;
        }
        let mut mask = 0o660;
        if meta.is_dir() {
            mask |= 0o2110;
            pending.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        let mode = (meta.permissions().mode() & 0o7777) | mask;
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }
    changed
}

/// Resets the modes so each round has the same work to do.
fn reset(root: &Path) {
    let mut pending: Vec<PathBuf> = vec![root.to_path_buf()];
    while let Some(path) = pending.pop() {
        let meta = fs::symlink_metadata(&path).unwrap();
        let mode = if meta.is_dir() { 0o755 } else { 0o644 };
        if meta.is_dir() {
            pending.extend(fs::read_dir(&path).unwrap().map(|e| e.unwrap().path()));
        }
        fs::set_permissions(&path, fs::Permissions::from_mode(mode)).unwrap();
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times[times.len() / 2]
}

fn main() {
    let files: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(100_000);
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("volume");
    build(&root, files);
    // The group the files already have (ours): the walk does the same work whatever the gid.
    let gid = std::os::unix::fs::MetadataExt::gid(&fs::metadata(&root).unwrap());
    let (mut ours, mut plain) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        reset(&root);
        let start = Instant::now();
        let count = apply_fs_group(&root, gid, false).unwrap();
        ours.push(start.elapsed());
        reset(&root);
        let start = Instant::now();
        let changed = baseline(&root, gid);
        plain.push(start.elapsed());
        assert_eq!(count.changed, changed, "both walks change the same inodes");
    }
    let (ours, plain) = (median(ours), median(plain));
    println!("fs_group walk over {files} files (median of {ROUNDS}):");
    println!("  kvol (descriptors, no symlink followed, one mount): {:>8.1} ms", ours.as_secs_f64() * 1e3);
    println!("  plain walk by path (baseline):                      {:>8.1} ms", plain.as_secs_f64() * 1e3);
    println!("  ratio: {:.2}", ours.as_secs_f64() / plain.as_secs_f64());
}
