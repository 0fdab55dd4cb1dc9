//! Faults the fault tests share: a journal damaged in the ways a node meets, and a state directory on a small filesystem of its own that can be filled.

#![allow(dead_code)] // not every test that shares this module uses all of it

use std::path::{Path, PathBuf};

use super::Node;

/// kvol's own files (`--state-dir`) on a tmpfs of `size` (`4m`) of their own at `<root>/state`,
/// so that filling it fills nothing else; returns the directory.
pub fn small_state_filesystem(node: &mut Node, size: &str) -> PathBuf {
    let state = node.root.join("state");
    std::fs::create_dir_all(&state).unwrap();
    let options = format!("size={size}");
    nix::mount::mount(
        Some("tmpfs"),
        &state,
        Some("tmpfs"),
        nix::mount::MsFlags::empty(),
        Some(options.as_str()),
    )
    .unwrap();
    node.state_dir = state.clone();
    state
}

/// Fills the filesystem of `dir` with `dir/filler` until it is full.
pub fn fill(dir: &Path) {
    use std::io::Write;
    let mut file = std::fs::File::create(dir.join("filler")).unwrap();
    let chunk = vec![0x5au8; 64 * 1024];
    loop {
        if let Err(e) = file.write_all(&chunk).and_then(|()| file.sync_all()) {
            assert_eq!(e.raw_os_error(), Some(nix::libc::ENOSPC), "{e}");
            break;
        }
    }
    // What a partial chunk left: the last bytes too.
    while file.write_all(&[0]).and_then(|()| file.sync_all()).is_ok() {}
}

pub type JournalDamage = fn(&Path);

/// Garbage (a fixed pseudo-random sequence) over `range` of the file's bytes.
pub fn garbage(f: &Path, range: impl Fn(usize) -> std::ops::Range<usize>) {
    let mut bytes = std::fs::read(f).unwrap();
    let range = range(bytes.len());
    for (i, b) in bytes[range].iter_mut().enumerate() {
        *b = (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[2];
    }
    std::fs::write(f, bytes).unwrap();
}

/// Whether a damage leaves a file kept aside: always; never (nothing left to keep); or only
/// when it hit the pages in use (garbage over free pages is no damage: every page in use
/// passes its checksum, and the journal is read as it was).
#[derive(Clone, Copy, PartialEq, Debug)]
pub enum KeptAside {
    Always,
    Never,
    WhenFound,
}

/// The ways a node meets a damaged journal file, after the journal lost outright (the path
/// a damaged one takes, with nothing to keep aside).
pub const JOURNAL_DAMAGES: [(&str, JournalDamage, KeptAside); 7] = [
    ("lost", |f| std::fs::remove_file(f).unwrap(), KeptAside::Never),
    (
        "truncated to half",
        |f| {
            let len = std::fs::metadata(f).unwrap().len();
            std::fs::OpenOptions::new().write(true).open(f).unwrap().set_len(len / 2).unwrap();
        },
        KeptAside::Always,
    ),
    (
        "header zeroed",
        |f| {
            let mut bytes = std::fs::read(f).unwrap();
            bytes[..4096].fill(0);
            std::fs::write(f, bytes).unwrap();
        },
        KeptAside::Always,
    ),
    ("garbage over the middle", |f| garbage(f, |n| n / 4..n * 3 / 4), KeptAside::WhenFound),
    ("garbage over every page but the header", |f| garbage(f, |n| 4096..n), KeptAside::Always),
    ("zero length", |f| std::fs::write(f, "").unwrap(), KeptAside::Always),
    (
        "replaced by a directory",
        |f| {
            std::fs::remove_file(f).unwrap();
            std::fs::create_dir(f).unwrap();
            std::fs::write(f.join("stray"), "x").unwrap();
        },
        KeptAside::Always,
    ),
];
