//! Data through a published path, as a container would see it: files written with fsync and read back, contents made from a seed and checksummed, a read-only mount told from a refused write.

use std::io::Write as _;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::report::Failure;

/// `len` bytes that depend on `seed` (so two volumes' files differ), cheap to make: a
/// xorshift stream seeded from the seed's SHA-256.
pub fn pattern(seed: &str, len: usize) -> Vec<u8> {
    let digest = Sha256::digest(seed.as_bytes());
    let mut state = u64::from_le_bytes(digest[..8].try_into().unwrap_or([1; 8])) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        out.extend_from_slice(&state.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The SHA-256 of `bytes`, in hex.
pub fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes).iter().map(|b| format!("{b:02x}")).collect()
}

/// Writes `bytes` to `dir/name` and syncs it, as a container writing its data would.
pub fn write(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), Failure> {
    let path = dir.join(name);
    let mut file = std::fs::File::create(&path)
        .map_err(|e| Failure::new(format!("cannot create {}: {e}", path.display())))?;
    file.write_all(bytes)
        .and_then(|()| file.sync_all())
        .map_err(|e| Failure::new(format!("cannot write {} ({} bytes): {e}", path.display(), bytes.len())))
}

/// Checks that `dir/name` holds exactly `expected`; `what` says where the data came from.
pub fn expect(dir: &Path, name: &str, expected: &[u8], what: &str) -> Result<(), Failure> {
    let path = dir.join(name);
    let found = std::fs::read(&path)
        .map_err(|e| Failure::new(format!("{what}: cannot read {}: {e}", path.display())))?;
    if found == expected {
        return Ok(());
    }
    Err(Failure::new(format!(
        "{what}: {} holds {} bytes (sha256 {}), expected {} bytes (sha256 {})",
        path.display(),
        found.len(),
        sha256_hex(&found),
        expected.len(),
        sha256_hex(expected)
    )))
}

/// Checks that `dir/name` does not exist.
pub fn expect_absent(dir: &Path, name: &str, what: &str) -> Result<(), Failure> {
    let path = dir.join(name);
    match std::fs::symlink_metadata(&path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Ok(_) => Err(Failure::new(format!("{what}: {} exists", path.display()))),
        Err(e) => Err(Failure::new(format!("{what}: cannot look at {}: {e}", path.display()))),
    }
}

/// Checks that a write into `dir` is refused because the filesystem is read-only (EROFS),
/// as a container's write to a read-only volume is.
pub fn expect_read_only(dir: &Path, what: &str) -> Result<(), Failure> {
    let path = dir.join(".kvol-read-only-probe");
    match std::fs::File::create(&path) {
        Ok(_) => {
            let _ = std::fs::remove_file(&path);
            Err(Failure::new(format!(
                "{what}: a write to {} succeeded: the volume is not mounted read-only",
                dir.display()
            )))
        }
        Err(e) if e.raw_os_error() == Some(nix::libc::EROFS) => Ok(()),
        Err(e) => Err(Failure::new(format!(
            "{what}: a write to {} failed with {e}, not with a read-only filesystem (EROFS)",
            dir.display()
        ))),
    }
}

/// The size of the filesystem holding `dir`, in bytes (statvfs, as `df` shows it).
pub fn filesystem_size(dir: &Path) -> Result<u64, Failure> {
    let stats = nix::sys::statvfs::statvfs(dir)
        .map_err(|e| Failure::new(format!("cannot statvfs {}: {e}", dir.display())))?;
    Ok(stats.blocks() as u64 * stats.fragment_size() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_are_seeded_and_sized() {
        // (seed, len)
        for (seed, len) in [("a", 0), ("a", 31), ("a", 32), ("a", 1000), ("b", 1000)] {
            let p = pattern(seed, len);
            assert_eq!(p.len(), len);
            assert_eq!(p, pattern(seed, len), "deterministic");
        }
        assert_ne!(pattern("a", 100), pattern("b", 100));
        assert_eq!(sha256_hex(b""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }

    #[test]
    fn writes_are_read_back_and_differences_are_said() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "f", b"hello").unwrap();
        expect(dir.path(), "f", b"hello", "pod b").unwrap();
        let e = expect(dir.path(), "f", b"hellO", "pod b").unwrap_err();
        assert!(e.message.starts_with("pod b: ") && e.message.contains("holds 5 bytes"), "{}", e.message);
        expect_absent(dir.path(), "g", "pod c").unwrap();
        assert!(expect_absent(dir.path(), "f", "pod c").is_err());
        // A writable directory is not read-only.
        let e = expect_read_only(dir.path(), "pod d").unwrap_err();
        assert!(e.message.contains("is not mounted read-only"), "{}", e.message);
    }
}
