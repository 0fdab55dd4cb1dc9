//! The mount seam: every mount and unmount kvol makes goes through [`Mounter`].
//!
//! [`SystemMounter`] calls mount(2)/umount2(2) and reads `/proc/thread-self/mountinfo`;
//! [`RecordingMounter`] keeps an in-memory mount table and records every call, for unit tests.
//!
//! Mounts that do not answer: a FUSE mount whose daemon is stopped makes any `stat` of it hang,
//! and one whose daemon died (`ENOTCONN`) or an NFS mount whose server is gone (`ESTALE`)
//! fails every look. `SystemMounter` looks at a path only through [`probe`], on a thread of its
//! own with a deadline ([`PROBE_DEADLINE`]); a path whose probe hangs is *unresponsive* from
//! then on, answered from the mount table alone (which the kernel formats without asking any
//! filesystem), and unmounted lazily (`MNT_DETACH`) when an ordinary unmount finds it busy —
//! so a dead mount is torn down instead of wedging the thread that meets it.

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::mount::{MntFlags, MsFlags};

/// A failed mount-table operation, naming what and where.
#[derive(Debug, thiserror::Error)]
#[error("cannot {op} {}: {source}", target.display())]
pub struct MountError {
    pub op: &'static str,
    pub target: PathBuf,
    #[source]
    pub source: io::Error,
}

impl MountError {
    fn new(op: &'static str, target: &Path, source: io::Error) -> MountError {
        MountError { op, target: target.to_path_buf(), source }
    }
}

impl From<MountError> for crate::PluginError {
    fn from(e: MountError) -> Self {
        crate::PluginError::Io { op: e.op, path: e.target, source: e.source }
    }
}

/// One line of the mount table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MountPoint {
    /// What is mounted: a device, a directory (`root` of a bind mount is not resolved) or a name
    /// such as `tmpfs`.
    pub source: String,
    pub target: PathBuf,
    pub fstype: String,
    /// Per-mount options (`rw`, `ro`, `nosuid` …) followed by the superblock options (`size=…`).
    pub options: Vec<String>,
}

impl MountPoint {
    /// Whether the mount is read-only.
    pub fn read_only(&self) -> bool {
        self.options.first().is_some_and(|o| o == "ro")
    }
}

/// The mount seam.
///
/// Calls are synchronous: mount(2) of a local filesystem or a bind mount returns at once. A
/// plugin whose mounts can hang (network filesystems) runs them off the async executor.
pub trait Mounter: Send + Sync + fmt::Debug {
    /// Mounts a filesystem of `fstype` from `source` on `target`, with fs-specific `data`
    /// options (for example `size=64m` for tmpfs).
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        read_only: bool,
        data: &[String],
    ) -> Result<(), MountError>;
    /// Bind-mounts `source` (a directory or a file) on `target`; read-only takes a second
    /// remount, as the kernel ignores read-only on the first bind.
    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError>;
    /// Unmounts `target` (not lazily: a busy mount is an error, not a leak).
    fn unmount(&self, target: &Path) -> Result<(), MountError>;
    /// The mount table as this process sees it.
    fn mount_points(&self) -> Result<Vec<MountPoint>, MountError>;
    /// Whether something is mounted exactly on `path`.
    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        Ok(self.mount_points()?.iter().any(|m| m.target == path))
    }
    /// The mount points at or below `path`.
    fn mounts_under(&self, path: &Path) -> Result<Vec<MountPoint>, MountError> {
        Ok(self.mount_points()?.into_iter().filter(|m| m.target.starts_with(path)).collect())
    }
    /// Whether the mount exactly on `path` (the latest, should several be stacked there) is a
    /// tmpfs; `false` when nothing is mounted there.
    fn is_tmpfs_mount(&self, path: &Path) -> Result<bool, MountError> {
        let on_path = self.mounts_under(path)?.into_iter().rfind(|m| m.target == path);
        Ok(on_path.is_some_and(|m| m.fstype == "tmpfs"))
    }
}

/// `statfs(2)`'s `f_type` of a tmpfs.
const TMPFS_MAGIC: i64 = 0x0102_1994;

/// How many times [`SystemMounter::unmount`] retries a busy mount.
const UNMOUNT_BUSY_RETRIES: u32 = 5;

/// How long a look at a path under a volume may take before the mount is taken for
/// unresponsive.
pub const PROBE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(2);

/// Paths whose probe did not answer within the deadline (its thread may still be stuck), or
/// answered that the mount is dead: never probed again, unmounted lazily when busy.
fn unresponsive() -> &'static Mutex<std::collections::BTreeSet<PathBuf>> {
    static PATHS: std::sync::OnceLock<Mutex<std::collections::BTreeSet<PathBuf>>> =
        std::sync::OnceLock::new();
    PATHS.get_or_init(Default::default)
}

fn is_unresponsive(path: &Path) -> bool {
    unresponsive().lock().unwrap_or_else(|p| p.into_inner()).contains(path)
}

fn mark_unresponsive(path: &Path) {
    unresponsive().lock().unwrap_or_else(|p| p.into_inner()).insert(path.to_path_buf());
}

/// Whether an error says the filesystem behind a path is gone (upstream's "corrupted mount":
/// a FUSE daemon that died, an NFS server gone, an I/O error).
pub fn is_dead_mount_error(errno: rustix::io::Errno) -> bool {
    use rustix::io::Errno;
    matches!(errno, Errno::NOTCONN | Errno::STALE | Errno::IO | Errno::HOSTDOWN)
}

/// Whether the filesystem mounted at `path` answers a forced `statx` within [`PROBE_DEADLINE`]
/// (a dead one, or one that does not answer, is marked unresponsive).
fn answers(path: &Path) -> bool {
    use rustix::fs::{AtFlags, CWD, StatxFlags, statx};
    let look = |p: &Path| {
        statx(CWD, p, AtFlags::SYMLINK_NOFOLLOW | AtFlags::STATX_FORCE_SYNC, StatxFlags::BASIC_STATS)
    };
    match probe(path, PROBE_DEADLINE, look) {
        Some(Err(errno)) if is_dead_mount_error(errno) => {
            mark_unresponsive(path);
            false
        }
        Some(_) => true,
        None => false,
    }
}

/// Runs `look` (a `stat` of `path`, say) on a thread of its own and waits at most `deadline`
/// for it; `None` when it did not answer in time — the path is then marked unresponsive and
/// the thread left to finish whenever the filesystem answers. A path already unresponsive is
/// not looked at again. The thread shares the caller's mount namespace.
pub fn probe<T: Send + 'static>(
    path: &Path,
    deadline: std::time::Duration,
    look: impl FnOnce(&Path) -> T + Send + 'static,
) -> Option<T> {
    if is_unresponsive(path) {
        return None;
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let owned = path.to_path_buf();
    let spawned = std::thread::Builder::new().name("kvol-probe".into()).spawn(move || {
        let _ = tx.send(look(&owned));
    });
    if spawned.is_err() {
        return None;
    }
    match rx.recv_timeout(deadline) {
        Ok(answer) => Some(answer),
        Err(_) => {
            tracing::warn!(path = %path.display(), deadline_ms = deadline.as_millis() as u64, "a look at this path did not answer: its mount is taken for unresponsive");
            mark_unresponsive(path);
            None
        }
    }
}

/// The real mount table: mount(2), umount2(2) and `/proc/self/mountinfo`.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemMounter;

impl Mounter for SystemMounter {
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        read_only: bool,
        data: &[String],
    ) -> Result<(), MountError> {
        let mut flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
        if read_only {
            flags |= MsFlags::MS_RDONLY;
        }
        let data = data.join(",");
        let data = (!data.is_empty()).then_some(data.as_str());
        nix::mount::mount(Some(source), target, Some(fstype), flags, data)
            .map_err(|e| MountError::new("mount", target, e.into()))
    }

    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        nix::mount::mount(
            Some(source),
            target,
            None::<&str>,
            MsFlags::MS_BIND | MsFlags::MS_REC,
            None::<&str>,
        )
        .map_err(|e| MountError::new("bind-mount onto", target, e.into()))?;
        if read_only {
            let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
            if let Err(e) = nix::mount::mount(None::<&str>, target, None::<&str>, flags, None::<&str>) {
                // Never leave a writable mount where a read-only one was asked for.
                let _ = nix::mount::umount2(target, MntFlags::empty());
                return Err(MountError::new("remount read-only", target, e.into()));
            }
        }
        Ok(())
    }

    /// Retries `EBUSY` a few times over about 100 ms: a process forked elsewhere holds copies
    /// of every open file until it execs, which on a busy node can pin a mount for a moment.
    /// A mount that stays busy is an error; the caller's backoff takes it from there.
    /// A mount that stays busy is detached lazily (`MNT_DETACH`) when it is unresponsive
    /// (a probe of it hangs past its deadline, or it answers as dead): the threads stuck in it
    /// hold it busy for good, and detaching deletes nothing. A busy mount that answers stays
    /// an error: something is using it.
    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        let mut tries = 0;
        loop {
            match nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW) {
                Err(nix::errno::Errno::EBUSY) if tries < UNMOUNT_BUSY_RETRIES => {
                    tries += 1;
                    std::thread::sleep(std::time::Duration::from_millis(20));
                }
                Err(nix::errno::Errno::EBUSY) if is_unresponsive(target) || !answers(target) => {
                    tracing::warn!(target = %target.display(), "unresponsive mount stays busy: detaching it lazily");
                    return nix::mount::umount2(target, MntFlags::UMOUNT_NOFOLLOW | MntFlags::MNT_DETACH)
                        .map_err(|e| MountError::new("detach", target, e.into()));
                }
                result => return result.map_err(|e| MountError::new("unmount", target, e.into())),
            }
        }
    }

    /// One `statx(2)` asking whether `path` is the root of a mount (Linux 5.8+), instead of
    /// reading the whole mount table; the table when the kernel cannot say, or the path cannot
    /// be looked at (a dead FUSE mount answers `ENOTCONN`). A path that does not exist is not a
    /// mount point.
    /// The `statx` runs through [`probe`]: a mount that does not answer within
    /// [`PROBE_DEADLINE`] is looked up in the table instead, as is a dead one.
    fn is_mount_point(&self, path: &Path) -> Result<bool, MountError> {
        use rustix::fs::{AtFlags, CWD, StatxAttributes, StatxFlags, statx};
        let look =
            |p: &Path| statx(CWD, p, AtFlags::NO_AUTOMOUNT | AtFlags::SYMLINK_NOFOLLOW, StatxFlags::empty());
        match probe(path, PROBE_DEADLINE, look) {
            Some(Ok(stat)) if stat.stx_attributes_mask.contains(StatxAttributes::MOUNT_ROOT) => {
                Ok(stat.stx_attributes.contains(StatxAttributes::MOUNT_ROOT))
            }
            Some(Err(rustix::io::Errno::NOENT)) => Ok(false),
            Some(Err(errno)) if is_dead_mount_error(errno) => {
                mark_unresponsive(path);
                Ok(self.mount_points()?.iter().any(|m| m.target == path))
            }
            _ => Ok(self.mount_points()?.iter().any(|m| m.target == path)),
        }
    }

    fn mount_points(&self) -> Result<Vec<MountPoint>, MountError> {
        let text = read_mountinfo()?;
        parse_mountinfo(&text).map_err(parse_error)
    }

    /// A `statx(2)` and a `statfs(2)` (each through [`probe`]) instead of the mount table:
    /// at node scale the table holds thousands of mounts and every read formats them all.
    fn is_tmpfs_mount(&self, path: &Path) -> Result<bool, MountError> {
        if !self.is_mount_point(path)? {
            return Ok(false);
        }
        match probe(path, PROBE_DEADLINE, |p: &Path| rustix::fs::statfs(p)) {
            // `f_type`'s width differs between architectures.
            #[allow(clippy::unnecessary_cast)]
            Some(Ok(fs)) => Ok(fs.f_type as i64 == TMPFS_MAGIC),
            _ => {
                let on_path = self.mounts_under(path)?.into_iter().rfind(|m| m.target == path);
                Ok(on_path.is_some_and(|m| m.fstype == "tmpfs"))
            }
        }
    }

    /// Parses only the lines of mounts at or below `path`: on a node with thousands of
    /// container mounts, a look under one volume must not cost them all.
    fn mounts_under(&self, path: &Path) -> Result<Vec<MountPoint>, MountError> {
        let text = read_mountinfo()?;
        parse_mountinfo(&mountinfo_lines_under(&text, path)).map_err(parse_error)
    }
}

/// Where this thread's mount table is read: thread-self, not self, as a thread that unshared
/// its mount namespace (tests do) sees its own table there, while /proc/self shows the main
/// thread's.
const MOUNTINFO: &str = "/proc/thread-self/mountinfo";

/// This thread's mount table. One read serves every thread of the same mount namespace that
/// asked before it started ([`shared_read`]): a thousand teardowns beside ten thousand container
/// mounts make a handful of reads of the table, not a thousand (the kernel formats every mount
/// at each read).
fn read_mountinfo() -> Result<std::sync::Arc<String>, MountError> {
    let path = Path::new(MOUNTINFO);
    let namespace = std::fs::read_link("/proc/thread-self/ns/mnt").map(|l| l.to_string_lossy().into_owned());
    let Ok(namespace) = namespace else {
        return std::fs::read_to_string(path)
            .map(std::sync::Arc::new)
            .map_err(|e| MountError::new("read", path, e));
    };
    shared_read(&namespace, || std::fs::read_to_string(path))
        .map_err(|(kind, message)| MountError::new("read", path, io::Error::new(kind, message)))
}

/// A read of a mount namespace's table under way or done: its generation and its outcome.
#[derive(Default)]
struct Flight {
    state: std::sync::Mutex<FlightState>,
    done: std::sync::Condvar,
}

type ReadOutcome = Result<std::sync::Arc<String>, (io::ErrorKind, String)>;

#[derive(Default)]
struct FlightState {
    reading: bool,
    started: u64,
    finished: u64,
    outcome: Option<ReadOutcome>,
}

/// `read`'s outcome from a read that started after this call did: the caller's own, or one
/// another thread of the namespace started later and shares. Never an older one: a caller that
/// has just unmounted something never sees a table from before.
fn shared_read(namespace: &str, read: impl FnOnce() -> io::Result<String>) -> ReadOutcome {
    static FLIGHTS: std::sync::OnceLock<
        std::sync::Mutex<std::collections::HashMap<String, std::sync::Arc<Flight>>>,
    > = std::sync::OnceLock::new();
    let flight = {
        let mut flights = FLIGHTS.get_or_init(Default::default).lock().unwrap_or_else(|e| e.into_inner());
        std::sync::Arc::clone(flights.entry(namespace.to_string()).or_default())
    };
    let mut state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
    // A read already under way started before this call: only the next one will do.
    let wanted = state.started + 1;
    loop {
        if state.finished >= wanted {
            return state.outcome.clone().expect("a finished read has an outcome");
        }
        if !state.reading {
            state.reading = true;
            state.started += 1;
            let generation = state.started;
            drop(state);
            let outcome = read().map(std::sync::Arc::new).map_err(|e| (e.kind(), e.to_string()));
            let mut state = flight.state.lock().unwrap_or_else(|e| e.into_inner());
            state.reading = false;
            state.finished = generation;
            state.outcome = Some(outcome.clone());
            flight.done.notify_all();
            return outcome;
        }
        state = flight.done.wait(state).unwrap_or_else(|e| e.into_inner());
    }
}

fn parse_error(reason: String) -> MountError {
    MountError::new("parse", Path::new(MOUNTINFO), io::Error::new(io::ErrorKind::InvalidData, reason))
}

/// The lines of `text` (a mountinfo table) whose mount target is `path` or lies below it,
/// compared in the kernel's escaped form so no other line is decoded. Pure.
pub fn mountinfo_lines_under(text: &str, path: &Path) -> String {
    let mut prefix = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            ' ' => prefix.push_str("\\040"),
            '\t' => prefix.push_str("\\011"),
            '\n' => prefix.push_str("\\012"),
            '\\' => prefix.push_str("\\134"),
            c => prefix.push(c),
        }
    }
    let prefix = prefix.trim_end_matches('/');
    let under = |target: &str| {
        target.strip_prefix(prefix).is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
            || (prefix.is_empty() && target.starts_with('/'))
    };
    let mut out = String::new();
    for line in text.lines() {
        if line.split(' ').nth(4).is_some_and(under) {
            out.push_str(line);
            out.push('\n');
        }
    }
    out
}

/// Parses `/proc/<pid>/mountinfo` (proc(5)): `id parent major:minor root target options
/// [optional fields…] - fstype source super-options`, with octal escapes in paths.
pub fn parse_mountinfo(text: &str) -> Result<Vec<MountPoint>, String> {
    let mut mounts = Vec::new();
    for (n, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let bad = |what: &str| format!("line {}: {what}: {line:?}", n + 1);
        let (left, right) = line.split_once(" - ").ok_or_else(|| bad("no \" - \" separator"))?;
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 6 || right.len() < 3 {
            return Err(bad("too few fields"));
        }
        let mut options: Vec<String> = left[5].split(',').map(str::to_string).collect();
        options.extend(right[2].split(',').filter(|o| !o.is_empty()).map(str::to_string));
        mounts.push(MountPoint {
            source: unescape_octal(right[1]),
            target: PathBuf::from(unescape_octal(left[4])),
            fstype: unescape_octal(right[0]),
            options,
        });
    }
    Ok(mounts)
}

/// Undoes the kernel's `\ooo` escapes of space, tab, newline and backslash.
fn unescape_octal(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\'
            && i + 3 < bytes.len()
            && bytes[i + 1..=i + 3].iter().all(|b| (b'0'..=b'7').contains(b))
        {
            let value = (bytes[i + 1] - b'0') * 64 + (bytes[i + 2] - b'0') * 8 + (bytes[i + 3] - b'0');
            out.push(value);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One call made through a [`RecordingMounter`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MountCall {
    Mount { source: String, target: PathBuf, fstype: String, read_only: bool, data: Vec<String> },
    Bind { source: PathBuf, target: PathBuf, read_only: bool },
    Unmount { target: PathBuf },
}

/// A test double: an in-memory mount table that records every call and can be told to fail.
#[derive(Debug, Default)]
pub struct RecordingMounter {
    state: Mutex<RecordingState>,
}

#[derive(Debug, Default)]
struct RecordingState {
    calls: Vec<MountCall>,
    table: Vec<MountPoint>,
    fail_next: Option<io::ErrorKind>,
}

impl RecordingMounter {
    pub fn new() -> RecordingMounter {
        RecordingMounter::default()
    }

    /// Every call so far, in order.
    pub fn calls(&self) -> Vec<MountCall> {
        self.lock().calls.clone()
    }

    /// Makes the next mount, bind or unmount fail with `kind` (and change nothing).
    pub fn fail_next(&self, kind: io::ErrorKind) {
        self.lock().fail_next = Some(kind);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, RecordingState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn record(
        &self,
        call: MountCall,
        op: &'static str,
        target: &Path,
        add: Option<MountPoint>,
    ) -> Result<(), MountError> {
        let mut state = self.lock();
        state.calls.push(call);
        if let Some(kind) = state.fail_next.take() {
            return Err(MountError::new(op, target, io::Error::from(kind)));
        }
        match add {
            Some(point) => state.table.push(point),
            None => match state.table.iter().rposition(|m| m.target == target) {
                Some(i) => {
                    state.table.remove(i);
                }
                None => return Err(MountError::new(op, target, io::Error::from_raw_os_error(22))),
            },
        }
        Ok(())
    }
}

impl Mounter for RecordingMounter {
    fn mount(
        &self,
        source: &str,
        target: &Path,
        fstype: &str,
        read_only: bool,
        data: &[String],
    ) -> Result<(), MountError> {
        let call = MountCall::Mount {
            source: source.to_string(),
            target: target.to_path_buf(),
            fstype: fstype.to_string(),
            read_only,
            data: data.to_vec(),
        };
        let mut options = vec![if read_only { "ro" } else { "rw" }.to_string()];
        options.extend(data.iter().cloned());
        let point = MountPoint {
            source: source.to_string(),
            target: target.to_path_buf(),
            fstype: fstype.to_string(),
            options,
        };
        self.record(call, "mount", target, Some(point))
    }

    fn bind(&self, source: &Path, target: &Path, read_only: bool) -> Result<(), MountError> {
        let call = MountCall::Bind { source: source.to_path_buf(), target: target.to_path_buf(), read_only };
        let point = MountPoint {
            source: source.display().to_string(),
            target: target.to_path_buf(),
            fstype: "bind".to_string(),
            options: vec![if read_only { "ro" } else { "rw" }.to_string()],
        };
        self.record(call, "bind-mount onto", target, Some(point))
    }

    /// As the kernel: a mount with others below it is busy.
    fn unmount(&self, target: &Path) -> Result<(), MountError> {
        let below = self.lock().table.iter().any(|m| m.target != target && m.target.starts_with(target));
        if below {
            self.lock().calls.push(MountCall::Unmount { target: target.to_path_buf() });
            return Err(MountError::new("unmount", target, io::Error::from_raw_os_error(16)));
        }
        self.record(MountCall::Unmount { target: target.to_path_buf() }, "unmount", target, None)
    }

    fn mount_points(&self) -> Result<Vec<MountPoint>, MountError> {
        Ok(self.lock().table.clone())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn one_read_of_the_table_serves_every_caller_that_asked_before_it_started() {
        use std::sync::atomic::{AtomicU64, Ordering};
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let read = || {
            let n = STARTED.fetch_add(1, Ordering::SeqCst) + 1;
            std::thread::sleep(std::time::Duration::from_millis(20));
            Ok(n.to_string())
        };
        let callers: Vec<_> = (0..64)
            .map(|_| {
                std::thread::spawn(move || {
                    let before = STARTED.load(Ordering::SeqCst);
                    let got: u64 = super::shared_read("test-namespace", read).unwrap().parse().unwrap();
                    (before, got)
                })
            })
            .collect();
        for caller in callers {
            let (before, got) = caller.join().unwrap();
            assert!(got > before, "read {got} started before the call (reads started then: {before})");
        }
        let reads = STARTED.load(Ordering::SeqCst);
        assert!(reads < 16, "64 callers made {reads} reads");
        // Another namespace has its own reads.
        let other = super::shared_read("another-namespace", || Ok("x".to_string())).unwrap();
        assert_eq!(other.as_str(), "x");
        let failed = super::shared_read("a-third", || Err(std::io::Error::other("gone")));
        assert_eq!(failed, Err((std::io::ErrorKind::Other, "gone".to_string())));
    }

    use super::*;

    #[test]
    fn mountinfo_lines_parse_with_escapes_and_optional_fields() {
        let text = "\
36 35 98:0 /mnt1 /mnt/with\\040space rw,noatime master:1 - ext3 /dev/root rw,errors=continue
37 35 0:40 / /run/tmp rw,nosuid shared:2 master:3 - tmpfs tmpfs ro,size=65536k
";
        let mounts = parse_mountinfo(text).unwrap();
        assert_eq!(mounts.len(), 2);
        assert_eq!(mounts[0].target, Path::new("/mnt/with space"));
        assert_eq!(mounts[0].fstype, "ext3");
        assert_eq!(mounts[0].source, "/dev/root");
        assert_eq!(mounts[0].options, ["rw", "noatime", "rw", "errors=continue"]);
        assert!(!mounts[0].read_only());
        assert_eq!(mounts[1].options, ["rw", "nosuid", "ro", "size=65536k"]);
    }

    #[test]
    fn only_the_lines_under_a_path_are_kept_escapes_and_all() {
        let text = "36 35 98:0 / /var/lib/kubelet rw - ext4 /dev/a rw\n\
                    37 36 98:0 / /var/lib/kubelet/pods/u/volumes/x rw - ext4 /dev/a rw\n\
                    38 36 98:0 / /var/lib/kubeletx rw - ext4 /dev/a rw\n\
                    39 36 0:5 / /var/lib/kubelet/my\\040dir/in rw - tmpfs t rw\n\
                    40 1 0:6 / /proc rw - proc proc rw\n";
        let targets = |path: &str| -> Vec<String> {
            parse_mountinfo(&mountinfo_lines_under(text, Path::new(path)))
                .unwrap()
                .into_iter()
                .map(|m| m.target.display().to_string())
                .collect()
        };
        assert_eq!(
            targets("/var/lib/kubelet"),
            ["/var/lib/kubelet", "/var/lib/kubelet/pods/u/volumes/x", "/var/lib/kubelet/my dir/in"]
        );
        assert_eq!(targets("/var/lib/kubelet/"), targets("/var/lib/kubelet"));
        assert_eq!(targets("/var/lib/kubelet/my dir"), ["/var/lib/kubelet/my dir/in"]);
        assert_eq!(targets("/var/lib/kubelet/pods/u/volumes/x/mount"), Vec::<String>::new());
        assert_eq!(targets("/").len(), 5);
        // The same answer as the whole table filtered, on this machine's table.
        let all = SystemMounter.mount_points().unwrap();
        for path in ["/", "/proc", "/sys", "/nowhere"] {
            let want: Vec<MountPoint> = all.iter().filter(|m| m.target.starts_with(path)).cloned().collect();
            assert_eq!(SystemMounter.mounts_under(Path::new(path)).unwrap(), want, "{path}");
        }
    }

    #[test]
    fn mountinfo_garbage_is_an_error_naming_the_line() {
        let err = parse_mountinfo("36 35 98:0 / /x rw\n").unwrap_err();
        assert!(err.starts_with("line 1: no \" - \" separator"), "{err}");
        let err = parse_mountinfo("ok\n1 2 - a\n").unwrap_err();
        assert!(err.contains("line 1"), "{err}");
    }

    #[test]
    fn unescape_leaves_plain_and_short_escapes_alone() {
        assert_eq!(unescape_octal("a\\134b"), "a\\b");
        assert_eq!(unescape_octal("a\\01"), "a\\01");
        assert_eq!(unescape_octal("\\011tab"), "\ttab");
    }

    #[test]
    fn recording_mounter_tracks_the_table_and_injected_failures() {
        let m = RecordingMounter::new();
        m.bind(Path::new("/src"), Path::new("/dst"), true).unwrap();
        assert!(m.is_mount_point(Path::new("/dst")).unwrap());
        assert!(m.mount_points().unwrap()[0].read_only());
        m.fail_next(io::ErrorKind::PermissionDenied);
        let err = m.unmount(Path::new("/dst")).unwrap_err();
        assert_eq!(err.to_string(), "cannot unmount /dst: permission denied");
        assert!(m.is_mount_point(Path::new("/dst")).unwrap(), "a failed unmount changes nothing");
        m.unmount(Path::new("/dst")).unwrap();
        assert!(m.unmount(Path::new("/dst")).is_err(), "unmounting what is not mounted fails");
        assert_eq!(m.calls().len(), 4);
    }
}
