//! Which backing a driver runs with: `auto` becomes loop where loop devices can be made here and directories elsewhere, decided once at start from a cheap probe, the reason kept to be said.
//!
//! [`probe`] is the only I/O: it opens `/dev/loop-control` read-write, asks `losetup -f` for a
//! free loop device and opens that node read-write, looks for `mkfs.ext4` in `PATH`, and reads
//! whether this process may grow a mounted ext4 filesystem (`CAP_SYS_RESOURCE`). It attaches,
//! formats and mounts nothing, so it leaves nothing behind (`losetup -f`, like the kernel's
//! `LOOP_CTL_GET_FREE` under it, may make an unbound device node when none is free, as any
//! later attach would). [`decide`] turns what it found, and what was asked for, into a
//! [`BackingChoice`]: the backing and why, which the driver says at start and in its
//! `GetPluginInfo` manifest under [`MANIFEST_KEY`], where `kvol status` shows it. Without
//! `CAP_SYS_RESOURCE` loop is still chosen, saying that ext4 volumes then grow only when
//! staged again (xfs ones grow online all the same).

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::VolumeBacking;

/// The loop-control device.
pub const LOOP_CONTROL: &str = "/dev/loop-control";
/// The `GetPluginInfo` manifest key under which the driver says its backing and why.
pub const MANIFEST_KEY: &str = "volume-backing";
/// How long `losetup -f` may take before the probe gives up on it.
const PROBE_DEADLINE: Duration = Duration::from_secs(10);

/// What the probe found; each fact is what was found, or why not (naming the path).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoopFacts {
    /// `/dev/loop-control` opened read-write.
    pub loop_control: Result<(), String>,
    /// A free loop device (`losetup -f`) whose node opened read-write.
    pub free_device: Result<PathBuf, String>,
    /// Where `mkfs.ext4` is in `PATH`.
    pub mkfs_ext4: Result<PathBuf, String>,
    /// Whether a mounted ext4 filesystem can be grown (the kernel asks for `CAP_SYS_RESOURCE`);
    /// it does not decide the backing, only what the reason says.
    pub ext4_online_growth: Result<(), String>,
}

impl LoopFacts {
    /// Why loop devices cannot be made here, one reason per failed fact; empty when they can.
    pub fn problems(&self) -> Vec<String> {
        let mut problems = Vec::new();
        problems.extend(self.loop_control.clone().err());
        problems.extend(self.free_device.clone().err());
        problems.extend(self.mkfs_ext4.clone().err());
        problems
    }
}

/// The backing a driver runs with (never [`VolumeBacking::Auto`]) and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackingChoice {
    pub backing: VolumeBacking,
    pub reason: String,
}

impl BackingChoice {
    /// `loop (<reason>); a volume holds its size and no more`, or the directory's equivalent.
    pub fn describe(&self) -> String {
        let consequence = match self.backing {
            VolumeBacking::Loop => "a volume holds its size and no more",
            _ => "volumes' sizes are not enforced",
        };
        format!("{} ({}); {consequence}", self.backing.name(), self.reason)
    }

    /// The line the driver says at start: `volume backing: ` and [`describe`](Self::describe).
    pub fn line(&self) -> String {
        format!("volume backing: {}", self.describe())
    }
}

/// The backing for `requested`, given what the probe found (`None`: nothing was probed, as a
/// directory asked for needs no probe). Pure. `auto` is loop only when every fact is good; a
/// loop asked for stays loop, its reason saying what the probe found wrong.
pub fn decide(requested: VolumeBacking, facts: Option<&LoopFacts>) -> BackingChoice {
    let growth = facts.and_then(|f| f.ext4_online_growth.clone().err());
    let choice = |backing, reason: String| match (&growth, backing) {
        (Some(why), VolumeBacking::Loop) => BackingChoice {
            backing,
            reason: format!("{reason}; {why}: ext4 volumes grow when staged again, xfs ones online"),
        },
        _ => BackingChoice { backing, reason },
    };
    let problems = facts.map(LoopFacts::problems);
    match (requested, facts, problems) {
        (VolumeBacking::Directory, _, _) => choice(VolumeBacking::Directory, "asked for".into()),
        (VolumeBacking::Loop, _, Some(problems)) if !problems.is_empty() => choice(
            VolumeBacking::Loop,
            format!("asked for, though loop devices cannot be made here: {}", problems.join("; ")),
        ),
        (VolumeBacking::Loop, _, _) => choice(VolumeBacking::Loop, "asked for".into()),
        (VolumeBacking::Auto, None, _) => {
            choice(VolumeBacking::Directory, "chosen automatically, though nothing was probed".into())
        }
        (VolumeBacking::Auto, Some(_), Some(problems)) if !problems.is_empty() => choice(
            VolumeBacking::Directory,
            format!("loop devices cannot be made here: {}", problems.join("; ")),
        ),
        (VolumeBacking::Auto, Some(facts), _) => {
            let shown = |fact: &Result<PathBuf, String>| {
                fact.as_ref().map(|p| p.display().to_string()).unwrap_or_default()
            };
            choice(
                VolumeBacking::Loop,
                format!(
                    "chosen automatically: loop devices can be made here ({LOOP_CONTROL} and {} open, \
                     mkfs.ext4 is {})",
                    shown(&facts.free_device),
                    shown(&facts.mkfs_ext4)
                ),
            )
        }
    }
}

/// The backing `requested` resolves to here: [`decide`] over a [`probe`] (none for a
/// directory asked for).
pub fn resolve(requested: VolumeBacking) -> BackingChoice {
    match requested {
        VolumeBacking::Directory => decide(requested, None),
        _ => decide(requested, Some(&probe())),
    }
}

/// Looks at whether loop devices can be made here, leaving nothing behind.
pub fn probe() -> LoopFacts {
    LoopFacts {
        loop_control: open_read_write(Path::new(LOOP_CONTROL)),
        free_device: free_loop_device(),
        mkfs_ext4: find_program("mkfs.ext4"),
        ext4_online_growth: match std::fs::read_to_string("/proc/self/status") {
            Ok(status) if has_capability(&status, CAP_SYS_RESOURCE) => Ok(()),
            Ok(_) => Err("mounted ext4 filesystems cannot grow here (no CAP_SYS_RESOURCE)".to_string()),
            Err(e) => Err(format!("/proc/self/status: {}", describe_io(&e))),
        },
    }
}

/// The capability the kernel asks of whoever grows a mounted ext4 filesystem.
const CAP_SYS_RESOURCE: u32 = 24;

/// Whether the effective set in a `/proc/<pid>/status` text holds capability `bit`. Pure.
fn has_capability(status: &str, bit: u32) -> bool {
    status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|hex| u64::from_str_radix(hex.trim(), 16).ok())
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// Opens `path` read-write and closes it again; why not, naming the path.
fn open_read_write(path: &Path) -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map(drop)
        .map_err(|e| format!("{}: {}", path.display(), describe_io(&e)))
}

/// The device `losetup -f` names as free, once its node opened read-write.
fn free_loop_device() -> Result<PathBuf, String> {
    let said = crate::loopfs::run("losetup", &["-f"], PROBE_DEADLINE).map_err(|s| s.message().to_string())?;
    let device = said.trim();
    if !device.starts_with("/dev/") {
        return Err(format!("losetup -f named no free loop device (it said {device:?})"));
    }
    let device = PathBuf::from(device);
    open_read_write(&device)?;
    Ok(device)
}

/// Where `program` is in `PATH` (an executable file), as running it by name would find it.
fn find_program(program: &str) -> Result<PathBuf, String> {
    let path = std::env::var_os("PATH")
        .unwrap_or_else(|| "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".into());
    std::env::split_paths(&path)
        .map(|dir| dir.join(program))
        .find(|candidate| is_executable_file(candidate))
        .ok_or_else(|| format!("{program} is not installed (not found in PATH)"))
}

fn is_executable_file(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// An I/O error as the system describes it, lower-case ("permission denied").
fn describe_io(e: &std::io::Error) -> String {
    let said = match e.raw_os_error() {
        Some(code) => nix::errno::Errno::from_raw(code).desc().to_string(),
        None => e.to_string(),
    };
    let mut chars = said.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => said,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(control: Option<&str>, free: Option<&str>, mkfs: Option<&str>) -> LoopFacts {
        LoopFacts {
            loop_control: control.map_or(Ok(()), |e| Err(e.to_string())),
            free_device: free.map_or(Ok(PathBuf::from("/dev/loop3")), |e| Err(e.to_string())),
            mkfs_ext4: mkfs.map_or(Ok(PathBuf::from("/usr/sbin/mkfs.ext4")), |e| Err(e.to_string())),
            ext4_online_growth: Ok(()),
        }
    }

    #[test]
    fn the_backing_follows_what_was_asked_and_what_the_probe_found() {
        use VolumeBacking::{Auto, Directory, Loop};
        let good = facts(None, None, None);
        let denied = facts(
            Some("/dev/loop-control: permission denied"),
            Some("losetup -f: exit status: 1 (losetup: cannot find an unused loop device)"),
            None,
        );
        let no_mkfs = facts(None, None, Some("mkfs.ext4 is not installed (not found in PATH)"));
        let no_node = facts(None, Some("/dev/loop9: no such file or directory"), None);
        let no_growth = LoopFacts {
            ext4_online_growth: Err("mounted ext4 filesystems cannot grow here (no CAP_SYS_RESOURCE)".into()),
            ..good.clone()
        };
        let nothing_but_growth =
            LoopFacts { ext4_online_growth: no_growth.ext4_online_growth.clone(), ..denied.clone() };
        let cases: &[(VolumeBacking, Option<&LoopFacts>, VolumeBacking, &str)] = &[
            (
                Auto,
                Some(&good),
                Loop,
                "loop (chosen automatically: loop devices can be made here (/dev/loop-control and \
                 /dev/loop3 open, mkfs.ext4 is /usr/sbin/mkfs.ext4)); a volume holds its size and no more",
            ),
            (
                Auto,
                Some(&denied),
                Directory,
                "directory (loop devices cannot be made here: /dev/loop-control: permission denied; \
                 losetup -f: exit status: 1 (losetup: cannot find an unused loop device)); volumes' \
                 sizes are not enforced",
            ),
            (
                Auto,
                Some(&no_mkfs),
                Directory,
                "directory (loop devices cannot be made here: mkfs.ext4 is not installed (not found in \
                 PATH)); volumes' sizes are not enforced",
            ),
            (
                Auto,
                Some(&no_node),
                Directory,
                "directory (loop devices cannot be made here: /dev/loop9: no such file or directory); \
                 volumes' sizes are not enforced",
            ),
            (
                Auto,
                None,
                Directory,
                "directory (chosen automatically, though nothing was probed); volumes' sizes are not \
                 enforced",
            ),
            (
                Auto,
                Some(&no_growth),
                Loop,
                "loop (chosen automatically: loop devices can be made here (/dev/loop-control and \
                 /dev/loop3 open, mkfs.ext4 is /usr/sbin/mkfs.ext4); mounted ext4 filesystems cannot grow \
                 here (no CAP_SYS_RESOURCE): ext4 volumes grow when staged again, xfs ones online); a \
                 volume holds its size and no more",
            ),
            (
                Auto,
                Some(&nothing_but_growth),
                Directory,
                "directory (loop devices cannot be made here: /dev/loop-control: permission denied; \
                 losetup -f: exit status: 1 (losetup: cannot find an unused loop device)); volumes' \
                 sizes are not enforced",
            ),
            (
                Loop,
                Some(&no_growth),
                Loop,
                "loop (asked for; mounted ext4 filesystems cannot grow here (no CAP_SYS_RESOURCE): ext4 \
                 volumes grow when staged again, xfs ones online); a volume holds its size and no more",
            ),
            (
                Directory,
                Some(&no_growth),
                Directory,
                "directory (asked for); volumes' sizes are not enforced",
            ),
            (Directory, None, Directory, "directory (asked for); volumes' sizes are not enforced"),
            (Directory, Some(&good), Directory, "directory (asked for); volumes' sizes are not enforced"),
            (Loop, Some(&good), Loop, "loop (asked for); a volume holds its size and no more"),
            (Loop, None, Loop, "loop (asked for); a volume holds its size and no more"),
            (
                Loop,
                Some(&no_mkfs),
                Loop,
                "loop (asked for, though loop devices cannot be made here: mkfs.ext4 is not installed \
                 (not found in PATH)); a volume holds its size and no more",
            ),
        ];
        for (requested, found, backing, described) in cases {
            let got = decide(*requested, *found);
            assert_eq!(got.backing, *backing, "{requested:?} with {found:?}");
            assert_eq!(got.describe(), *described, "{requested:?} with {found:?}");
            assert_eq!(got.line(), format!("volume backing: {described}"));
        }
    }

    #[test]
    fn capabilities_are_read_from_the_effective_set() {
        let status = |eff: &str| format!("Name:\tkvol\nCapInh:\t0000000000000000\nCapEff:\t{eff}\n");
        let cases = [
            ("000001ffffffffff", true),
            ("000001fffeffffff", false),
            ("0000000001000000", true),
            ("garbage", false),
        ];
        for (eff, want) in cases {
            assert_eq!(has_capability(&status(eff), CAP_SYS_RESOURCE), want, "{eff}");
        }
        assert!(!has_capability("Name:\tkvol\n", CAP_SYS_RESOURCE), "no CapEff line");
    }

    #[test]
    fn io_errors_are_said_in_lower_case_with_the_path() {
        let err = open_read_write(Path::new("/nonexistent-kvol/loop-control")).unwrap_err();
        assert_eq!(err, "/nonexistent-kvol/loop-control: no such file or directory");
        let err = find_program("kvol-no-such-mkfs").unwrap_err();
        assert_eq!(err, "kvol-no-such-mkfs is not installed (not found in PATH)");
        assert!(find_program("sh").is_ok_and(|p| p.ends_with("sh")));
    }
}
