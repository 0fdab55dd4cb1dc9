//! kubelet's atomic writer for the volumes made of API objects (configMap, secret, downwardAPI, projected): a payload written whole into a timestamped directory and swapped in by renaming the `..data` link, so a reader sees all old files or all new ones.
//!
//! The layout is kubelet's: `..<UTC time>.<random>/` holds the payload, `..data` links to it, and
//! each top-level name of the payload is a link to `..data/<name>`. Two things differ on purpose
//! (kubelet's k/k#93686 and k/k#121472): the user-visible links are made only after the swap,
//! so no name ever points at nothing, and [`repair`] puts right what a crash at any step left
//! (a half-written directory, a `..data_tmp`, missing links). Every path is reached beneath the
//! volume's directory without following a symlink: a payload key or a planted `..data` never
//! makes it write or delete outside the volume.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::path::Path;
use std::time::SystemTime;

use rustix::fs::{AtFlags, Mode, OFlags, ResolveFlags};

use crate::beneath::Root;

/// The link that names the payload's current directory.
pub const DATA_LINK: &str = "..data";
/// The link made beside it and renamed over it.
const DATA_TMP_LINK: &str = "..data_tmp";
/// The longest payload path kubelet accepts.
pub use kvol_api::projection::{FileProjection, Payload, validate_payload};

/// The top-level names of a payload: the user-visible links.
fn top_level(payload: &Payload) -> BTreeSet<String> {
    payload
        .keys()
        .filter_map(|p| p.split('/').find(|s| !s.is_empty() && *s != "."))
        .map(str::to_string)
        .collect()
}

/// A timestamped directory's name, as kubelet makes it (Go's `os.MkdirTemp` with the pattern
/// `..2006_01_02_15_04_05.`): `..`, the UTC time to the second, a dot, then random digits —
/// `..2026_11_27_15_09_42.3351956330` on the kubelet peer. Pure.
pub fn timestamp_dir_name(now: SystemTime, random: u32) -> String {
    let since = now.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = since.as_secs();
    let (days, day_secs) = (secs / 86_400, secs % 86_400);
    let (year, month, day) = civil_from_days(days as i64);
    format!(
        "..{year:04}_{month:02}_{day:02}_{:02}_{:02}_{:02}.{random}",
        day_secs / 3600,
        day_secs / 60 % 60,
        day_secs % 60
    )
}

/// Days since 1970-01-01 → (year, month, day), the proleptic Gregorian calendar.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The directory `..data` names now, if it is a link to a plain `..`-name in the volume.
fn current_dir(volume: &OwnedFd) -> io::Result<Option<String>> {
    match rustix::fs::readlinkat(volume, DATA_LINK, Vec::new()) {
        Ok(target) => {
            let target = target.to_string_lossy().into_owned();
            let plain = !target.contains('/') && target.starts_with("..") && target != DATA_LINK;
            Ok(plain.then_some(target))
        }
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::INVAL) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Reads `path` below the directory `dir` of the volume, following no symlink.
fn read_beneath(volume: &OwnedFd, dir: &str, path: &str) -> io::Result<(Vec<u8>, u32)> {
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    let relative = format!("{dir}/{path}");
    let fd = rustix::fs::openat2(
        volume,
        relative.as_str(),
        OFlags::RDONLY | OFlags::CLOEXEC,
        Mode::empty(),
        resolve,
    )?;
    let mode = rustix::fs::fstat(&fd)?.st_mode & 0o7777;
    let mut data = Vec::new();
    std::fs::File::from(fd).read_to_end(&mut data)?;
    Ok((data, mode))
}

/// Whether the directory `..data` names holds exactly `payload`: the same files, bytes and modes
/// (each mode as the `fsGroup` walk leaves it).
fn holds(volume: &OwnedFd, dir: &str, payload: &Payload, fs_group: Option<u32>) -> bool {
    let group_bits = if fs_group.is_some() { GROUP_READ } else { 0 };
    let same = payload.iter().all(|(path, file)| {
        read_beneath(volume, dir, path)
            .is_ok_and(|(data, mode)| data == file.data && mode == file.mode | group_bits)
    });
    same && listed_files(volume, dir)
        .is_ok_and(|files| files == payload.keys().cloned().collect::<BTreeSet<_>>())
}

/// The regular files below `dir` of the volume, as relative paths (no link followed).
fn listed_files(volume: &OwnedFd, dir: &str) -> io::Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    let mut stack = vec![String::new()];
    let resolve = ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    while let Some(sub) = stack.pop() {
        let at = if sub.is_empty() { dir.to_string() } else { format!("{dir}/{sub}") };
        let fd = rustix::fs::openat2(
            volume,
            at.as_str(),
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
            resolve,
        )?;
        for entry in rustix::fs::Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name == "." || name == ".." {
                continue;
            }
            let path = if sub.is_empty() { name } else { format!("{sub}/{name}") };
            match entry.file_type() {
                rustix::fs::FileType::Directory => stack.push(path),
                rustix::fs::FileType::RegularFile => {
                    found.insert(path);
                }
                _ => {}
            }
        }
    }
    Ok(found)
}

/// The bits the `fsGroup` walk adds to a file of these read-only volumes (kubelet's).
const GROUP_READ: u32 = 0o440;

/// [`write_owned`] without an `fsGroup`.
pub fn write(root: &Root, volume_dir: &Path, payload: &Payload, random: u32) -> io::Result<bool> {
    write_owned(root, volume_dir, payload, random, None)
}

/// Writes `payload` into the volume at `volume_dir` (which `root` holds): a new timestamped
/// directory, each file given its `fs_user` and the whole directory the pod's `fs_group` (as
/// kubelet's ownership walk gives it) *before* `..data` is swapped to it by rename, then the
/// user-visible links, then what the old payload had and this one does not, and the old
/// directory, removed. Nothing is written when the volume already holds exactly this payload.
/// `random` names the new directory with the time (the caller's random digits; a name that
/// exists already is an error, never reused). Returns whether it wrote.
pub fn write_owned(
    root: &Root,
    volume_dir: &Path,
    payload: &Payload,
    random: u32,
    fs_group: Option<u32>,
) -> io::Result<bool> {
    validate_payload(payload).map_err(io::Error::other)?;
    let volume = root.open_dir(volume_dir)?;
    let old = current_dir(&volume)?;
    if let Some(old) = &old
        && holds(&volume, old, payload, fs_group)
    {
        return Ok(false);
    }
    let new = timestamp_dir_name(SystemTime::now(), random);
    let new_dir = volume_dir.join(&new);
    // A name already there (the same second and the same random digits) is never written into:
    // it may be the payload readers see now.
    if rustix::fs::statat(&volume, new.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_ok() {
        return Err(io::Error::new(
            io::ErrorKind::AlreadyExists,
            format!("{} exists already", new_dir.display()),
        ));
    }
    root.create_dir_all(&new_dir, 0o755)?;
    for (path, file) in payload {
        let target = new_dir.join(path);
        if let Some(parent) = target.parent() {
            root.create_dir_all(parent, 0o755)?;
        }
        let fd = root.create_file(&target, 0o600)?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(file.mode))?;
        if let Some(user) = file.fs_user {
            rustix::fs::fchown(&fd, Some(rustix::fs::Uid::from_raw(user)), None)?;
        }
        // Not synced, as kubelet does not: after a crash the first publish compares the files
        // with what they should hold and writes again where they differ.
        let mut out = std::fs::File::from(fd);
        out.write_all(&file.data)?;
    }
    if let Some(gid) = fs_group {
        crate::beneath::apply_fs_group(&new_dir, gid, true)?;
    }
    // The swap: a new link beside `..data`, renamed over it (one rename: old or new, never a mix).
    let _ = rustix::fs::unlinkat(&volume, DATA_TMP_LINK, AtFlags::empty());
    rustix::fs::symlinkat(new.as_str(), &volume, DATA_TMP_LINK)?;
    rustix::fs::renameat(&volume, DATA_TMP_LINK, &volume, DATA_LINK)?;
    // Only now the names users see: each already resolves through the new `..data`.
    let wanted = top_level(payload);
    make_links(&volume, &wanted)?;
    if let Some(old) = old {
        remove_stale_links(&volume, &wanted)?;
        root.remove_all(&volume_dir.join(old))?;
    }
    Ok(true)
}

/// Makes `<name>` → `..data/<name>` for each name that is not there yet.
fn make_links(volume: &OwnedFd, names: &BTreeSet<String>) -> io::Result<()> {
    for name in names {
        let target = format!("{DATA_LINK}/{name}");
        match rustix::fs::symlinkat(target.as_str(), volume, name.as_str()) {
            Ok(()) | Err(rustix::io::Errno::EXIST) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Removes the user-visible links that name something `wanted` does not (only links into
/// `..data`: nothing else in the volume is ours).
fn remove_stale_links(volume: &OwnedFd, wanted: &BTreeSet<String>) -> io::Result<()> {
    for entry in rustix::fs::Dir::read_from(volume)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with("..") || name == "." || wanted.contains(&name) {
            continue;
        }
        let points_into_data = rustix::fs::readlinkat(volume, name.as_str(), Vec::new())
            .is_ok_and(|t| t.to_string_lossy().starts_with(&format!("{DATA_LINK}/")));
        if points_into_data {
            rustix::fs::unlinkat(volume, name.as_str(), AtFlags::empty())?;
        }
    }
    Ok(())
}

/// Puts right what a crash left in the volume at `volume_dir`: `..data_tmp` removed, every
/// timestamped directory `..data` does not name removed (a half-written payload, or an old one
/// not yet deleted), and the user-visible links of the current payload made where missing.
/// Returns what it did, in words.
pub fn repair(root: &Root, volume_dir: &Path) -> io::Result<Vec<String>> {
    let volume = root.open_dir(volume_dir)?;
    let mut done = Vec::new();
    if rustix::fs::unlinkat(&volume, DATA_TMP_LINK, AtFlags::empty()).is_ok() {
        done.push(format!("removed {DATA_TMP_LINK}"));
    }
    let current = current_dir(&volume)?;
    let mut stale = Vec::new();
    for entry in rustix::fs::Dir::read_from(&volume)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let timestamped =
            name.starts_with("..") && name != ".." && name != DATA_LINK && name != DATA_TMP_LINK;
        if timestamped
            && entry.file_type() == rustix::fs::FileType::Directory
            && current.as_deref() != Some(&name)
        {
            stale.push(name);
        }
    }
    for name in stale {
        root.remove_all(&volume_dir.join(&name))?;
        done.push(format!("removed the stale directory {name}"));
    }
    if let Some(current) = current {
        let names: BTreeSet<String> = listed_files(&volume, &current)?
            .iter()
            .filter_map(|p| p.split('/').next().map(str::to_string))
            .collect();
        for name in &names {
            if rustix::fs::statat(&volume, name.as_str(), AtFlags::SYMLINK_NOFOLLOW).is_err() {
                done.push(format!("made the missing link {name}"));
            }
        }
        make_links(&volume, &names)?;
    }
    Ok(done)
}

/// The files a reader sees through the user-visible names, for tests and status: path →
/// bytes, read through `..data` beneath the volume.
pub fn read_payload(root: &Root, volume_dir: &Path) -> io::Result<BTreeMap<String, Vec<u8>>> {
    let volume = root.open_dir(volume_dir)?;
    let Some(current) = current_dir(&volume)? else { return Ok(BTreeMap::new()) };
    let mut out = BTreeMap::new();
    for path in listed_files(&volume, &current)? {
        let (data, _) = read_beneath(&volume, &current, &path)?;
        out.insert(path, data);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{MetadataExt, symlink};
    use std::path::PathBuf;
    use std::time::Duration;

    use super::*;

    fn payload(files: &[(&str, &str, u32)]) -> Payload {
        files
            .iter()
            .map(|(p, d, m)| {
                (p.to_string(), FileProjection { data: d.as_bytes().to_vec(), mode: *m, fs_user: None })
            })
            .collect()
    }

    fn volume() -> (tempfile::TempDir, Root, PathBuf) {
        let dir = tempfile::tempdir().unwrap();
        let top = dir.path().canonicalize().unwrap();
        let volume = top.join("vol");
        std::fs::create_dir_all(&volume).unwrap();
        let root = Root::open(&top).unwrap();
        (dir, root, volume)
    }

    #[test]
    fn payload_paths_are_checked_as_kubelet_checks_them() {
        let rows: &[(&str, Option<&str>)] = &[
            ("a.conf", None),
            ("dir/b.conf", None),
            ("a..b", None),
            ("", Some("empty")),
            ("/etc/passwd", Some("absolute")),
            ("../x", Some("starts with '..'")),
            ("..data", Some("starts with '..'")),
            ("a/../../x", Some("'..' element")),
        ];
        for (path, want) in rows {
            let got = validate_payload(&payload(&[(path, "x", 0o644)]));
            match want {
                None => assert!(got.is_ok(), "{path}: {got:?}"),
                Some(words) => assert!(got.as_ref().is_err_and(|e| e.contains(words)), "{path}: {got:?}"),
            }
        }
        let long = "a".repeat(4097);
        assert!(validate_payload(&payload(&[(&long, "x", 0o644)])).is_err());
    }

    #[test]
    fn timestamped_names_are_kubelets() {
        // The kubelet peer's: `..2026_11_27_15_09_42.3351956330`.
        let at = SystemTime::UNIX_EPOCH + Duration::new(1_700_000_000, 5);
        assert_eq!(timestamp_dir_name(at, 3_351_956_330), "..2023_11_14_22_13_20.3351956330");
        let leap = SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400); // 2000-02-29
        assert!(
            timestamp_dir_name(leap, 0).starts_with("..2000_02_29_00_00_00."),
            "{}",
            timestamp_dir_name(leap, 0)
        );
    }

    #[test]
    fn the_layout_is_kubelets_and_an_update_swaps_it_whole() {
        let (_dir, root, vol) = volume();
        let first = payload(&[("a.conf", "one", 0o644), ("dir/b.conf", "two", 0o400), ("gone", "x", 0o644)]);
        assert!(write(&root, &vol, &first, 1).unwrap());
        let data = std::fs::read_link(vol.join(DATA_LINK)).unwrap();
        let ts = data.to_string_lossy().into_owned();
        assert!(ts.starts_with("..") && vol.join(&ts).is_dir(), "{ts}");
        for name in ["a.conf", "dir", "gone"] {
            assert_eq!(std::fs::read_link(vol.join(name)).unwrap(), PathBuf::from(format!("..data/{name}")));
        }
        assert_eq!(std::fs::read_to_string(vol.join("dir/b.conf")).unwrap(), "two");
        assert_eq!(std::fs::metadata(vol.join(&ts).join("dir/b.conf")).unwrap().mode() & 0o7777, 0o400);
        assert_eq!(std::fs::metadata(vol.join(&ts)).unwrap().mode() & 0o7777, 0o755);
        // The same payload again: nothing written.
        assert!(!write(&root, &vol, &first, 2).unwrap());
        assert_eq!(std::fs::read_link(vol.join(DATA_LINK)).unwrap(), data);
        // Changed: a new directory, the old one and the dropped name's link gone.
        let second = payload(&[("a.conf", "ONE", 0o644), ("dir/b.conf", "two", 0o400)]);
        assert!(write(&root, &vol, &second, 3).unwrap());
        assert_ne!(std::fs::read_link(vol.join(DATA_LINK)).unwrap(), data);
        assert!(!vol.join(&ts).exists(), "the old directory is removed");
        assert!(std::fs::symlink_metadata(vol.join("gone")).is_err(), "the dropped name's link is removed");
        assert_eq!(std::fs::read_to_string(vol.join("a.conf")).unwrap(), "ONE");
        assert_eq!(read_payload(&root, &vol).unwrap().len(), 2);
    }

    #[test]
    fn a_crash_at_any_step_is_put_right() {
        let (_dir, root, vol) = volume();
        let files = payload(&[("a", "1", 0o644), ("b", "2", 0o644)]);
        write(&root, &vol, &files, 1).unwrap();
        let current = std::fs::read_link(vol.join(DATA_LINK)).unwrap();
        // A later write killed: its directory half-written, its `..data_tmp` made, a link lost.
        std::fs::create_dir(vol.join("..2030_01_01_00_00_00.0000000009")).unwrap();
        std::fs::write(vol.join("..2030_01_01_00_00_00.0000000009/a"), "half").unwrap();
        symlink("..2030_01_01_00_00_00.0000000009", vol.join(DATA_TMP_LINK)).unwrap();
        std::fs::remove_file(vol.join("b")).unwrap();
        let done = repair(&root, &vol).unwrap();
        assert_eq!(done.len(), 3, "{done:?}");
        assert_eq!(std::fs::read_link(vol.join(DATA_LINK)).unwrap(), current, "the current payload stays");
        assert!(!vol.join("..2030_01_01_00_00_00.0000000009").exists());
        assert!(std::fs::symlink_metadata(vol.join(DATA_TMP_LINK)).is_err());
        assert_eq!(std::fs::read_to_string(vol.join("b")).unwrap(), "2");
        assert!(repair(&root, &vol).unwrap().is_empty(), "nothing left to do");
    }

    #[test]
    fn a_planted_data_link_or_key_link_never_leads_outside() {
        let (dir, root, vol) = volume();
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(&outside).unwrap();
        std::fs::write(outside.join("a"), "not the volume's").unwrap();
        symlink(&outside, vol.join(DATA_LINK)).unwrap();
        symlink(&outside, vol.join("a")).unwrap();
        write(&root, &vol, &payload(&[("a", "mine", 0o644)]), 1).unwrap();
        assert_eq!(std::fs::read_to_string(outside.join("a")).unwrap(), "not the volume's");
        assert!(std::fs::read_link(vol.join(DATA_LINK)).unwrap().to_string_lossy().starts_with(".."));
        // The planted key link stays as it was (not ours to follow or replace); the payload is
        // reached through `..data`.
        assert_eq!(read_payload(&root, &vol).unwrap()["a"], b"mine");
    }

    #[test]
    fn a_reader_through_data_never_sees_two_keys_from_different_writes() {
        let (_dir, root, vol) = volume();
        write(&root, &vol, &payload(&[("a", "0", 0o644), ("b", "0", 0o644)]), 0).unwrap();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let reader = {
            let (vol, stop) = (vol.clone(), std::sync::Arc::clone(&stop));
            std::thread::spawn(move || {
                let (mut reads, mut mixed) = (0u32, 0u32);
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    // A reader that opens the payload's directory once and both keys in it.
                    let Ok(dir) = std::fs::File::open(vol.join(DATA_LINK)) else { continue };
                    use std::os::fd::AsFd;
                    let read = |name: &str| -> Option<String> {
                        let fd = rustix::fs::openat(dir.as_fd(), name, OFlags::RDONLY, Mode::empty()).ok()?;
                        let mut s = String::new();
                        std::fs::File::from(fd).read_to_string(&mut s).ok()?;
                        Some(s)
                    };
                    if let (Some(a), Some(b)) = (read("a"), read("b")) {
                        reads += 1;
                        mixed += u32::from(a != b);
                    }
                }
                (reads, mixed)
            })
        };
        for n in 1..=1000 {
            let v = n.to_string();
            write(&root, &vol, &payload(&[("a", &v, 0o644), ("b", &v, 0o644)]), n).unwrap();
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let (reads, mixed) = reader.join().unwrap();
        assert!(reads > 0, "the reader read");
        assert_eq!(mixed, 0, "{mixed} of {reads} reads saw two writes");
        assert_eq!(std::fs::read_to_string(vol.join("a")).unwrap(), "1000");
    }
}
