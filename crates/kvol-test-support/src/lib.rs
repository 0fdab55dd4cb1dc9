//! A test's scratch root that leaves nothing behind: dropped (the test passed or panicked), it stops every process it finds there, unmounts what is below it, detaches its loop devices, then removes it.
//!
//! What "there" means is read from the system, not from what the test remembers starting: a
//! process whose command line names the root (an agent, a driver, a registrar given paths under
//! it) or whose pid is in a `*.pid` file under it (the components an agent started); a mount at
//! or below the root in this thread's mount namespace; a loop device whose backing file is
//! under it. So what a killed agent left running for its successor (which a test never starts)
//! is stopped too. Data is never removed through a mount: a root with a mount left below it is
//! left on disk, and said.

pub mod pods;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

/// What is left under a root: the census a test or a person can take.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Leftovers {
    /// Processes (pid, command line) that name the root or whose pid file is under it.
    pub processes: Vec<(i32, String)>,
    /// Mount points at or below the root, deepest last.
    pub mounts: Vec<PathBuf>,
    /// Loop devices (`/dev/loopN`) whose backing file is under the root.
    pub loop_devices: Vec<(String, PathBuf)>,
}

impl Leftovers {
    pub fn is_empty(&self) -> bool {
        self.processes.is_empty() && self.mounts.is_empty() && self.loop_devices.is_empty()
    }
}

impl std::fmt::Display for Leftovers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (pid, command) in &self.processes {
            writeln!(f, "process {pid}: {command}")?;
        }
        for mount in &self.mounts {
            writeln!(f, "mount {}", mount.display())?;
        }
        for (device, file) in &self.loop_devices {
            writeln!(f, "loop device {device}: {}", file.display())?;
        }
        Ok(())
    }
}

/// A temporary directory that cleans up after everything a test started in it.
#[derive(Debug)]
pub struct ScratchRoot {
    path: PathBuf,
    dir: Option<tempfile::TempDir>,
    /// When the root was made, in clock ticks since boot: no process started earlier is one
    /// the test started (a pid file's pid may have been taken by another process since).
    made_at_ticks: u64,
}

impl ScratchRoot {
    /// A new empty directory under the system's temporary directory, by its resolved path (the
    /// mount table holds resolved paths).
    pub fn new() -> ScratchRoot {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let path = std::fs::canonicalize(dir.path()).expect("the temporary directory resolves");
        ScratchRoot { path, dir: Some(dir), made_at_ticks: ticks_since_boot() }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// What is left under the root now.
    pub fn leftovers(&self) -> Leftovers {
        census_since(&self.path, self.made_at_ticks)
    }

    /// Stops the processes, unmounts the mounts and detaches the loop devices under the root;
    /// returns what could not be cleaned.
    pub fn clean(&self) -> Leftovers {
        stop_processes(&self.path, self.made_at_ticks);
        unmount_below(&self.path);
        detach_loop_devices(&self.path);
        census_since(&self.path, self.made_at_ticks)
    }
}

impl Default for ScratchRoot {
    fn default() -> ScratchRoot {
        ScratchRoot::new()
    }
}

impl Drop for ScratchRoot {
    fn drop(&mut self) {
        let left = self.clean();
        let Some(dir) = self.dir.take() else { return };
        if left.mounts.is_empty() {
            drop(dir);
        } else {
            // Removing the tree would delete what the mounts hold.
            let _ = dir.keep();
        }
        if !left.is_empty() {
            eprintln!("scratch root {} could not be cleaned; left:\n{left}", self.path.display());
        }
    }
}

/// Everything under `root` that a test may have left, counting only processes started at or
/// after `since_ticks` (clock ticks since boot).
pub fn census_since(root: &Path, since_ticks: u64) -> Leftovers {
    Leftovers {
        processes: processes_of(root, since_ticks),
        mounts: mounts_below(root),
        loop_devices: loop_devices_of(root),
    }
}

/// How many clock ticks before its root's creation a process may seem to have started.
const START_SLACK_TICKS: u64 = 10;

/// Clock ticks since boot, as process start times count them.
fn ticks_since_boot() -> u64 {
    let uptime = std::fs::read_to_string("/proc/uptime").unwrap_or_default();
    let seconds: f64 = uptime.split_whitespace().next().and_then(|s| s.parse().ok()).unwrap_or(0.0);
    let per_second = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK).ok().flatten().unwrap_or(100);
    (seconds * per_second as f64) as u64
}

/// A process's start time in clock ticks since boot (`/proc/<pid>/stat` field 22).
fn started_at_ticks(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    // Fields after the command: state is field 3, so start time (22) is the 20th here.
    rest.split_whitespace().nth(19)?.parse().ok()
}

/// Processes started at or after `since_ticks` whose command line names `root` (as an
/// argument or within one) or whose pid is in a `*.pid` file under it; never this process.
pub fn processes_of(root: &Path, since_ticks: u64) -> Vec<(i32, String)> {
    let needle = root.to_string_lossy().into_owned();
    let recorded = pid_files(root);
    let own = std::process::id() as i32;
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/proc") else { return found };
    for entry in entries.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        if pid == own {
            continue;
        }
        let Some(raw) = command_line(pid) else { continue };
        // Empty: a kernel thread or a zombie (a pid file names it all the same).
        if raw.is_empty() && !recorded.contains(&pid) {
            continue;
        }
        let command = String::from_utf8_lossy(&raw).replace('\0', " ").trim_end().to_string();
        // Some slack: `/proc/uptime` (two decimals, read as a float) and start times round
        // differently, and a process started in the same tick as the root was seen a tick
        // early under load (the census missed it). No process older than the root can name
        // it (its name is new), so 100 ms of slack costs nothing. A zombie is gone already (it
        // only waits to be reaped, by a parent that may never do it).
        let young = started_at_ticks(pid).is_some_and(|t| t + START_SLACK_TICKS >= since_ticks) && alive(pid);
        if young && (command.contains(&needle) || recorded.contains(&pid)) {
            found.push((pid, command));
        }
    }
    found.sort();
    found
}

/// A process's command line, NUL-separated. A process in the middle of its exec has its new
/// executable but not yet its arguments (`cmdline` reads empty, though the parent's spawn has
/// returned): read again for up to 100 ms until they appear. A kernel thread (no executable)
/// and a zombie read empty at once.
fn command_line(pid: i32) -> Option<Vec<u8>> {
    let deadline = Instant::now() + Duration::from_millis(100);
    loop {
        let raw = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
        let execing = raw.is_empty() && std::fs::read_link(format!("/proc/{pid}/exe")).is_ok() && alive(pid);
        if !execing || Instant::now() >= deadline {
            return Some(raw);
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The pids written in `*.pid` files anywhere under `root` (not following links).
fn pid_files(root: &Path) -> Vec<i32> {
    let mut pids = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(kind) = entry.file_type() else { continue };
            let path = entry.path();
            if kind.is_dir() {
                stack.push(path);
            } else if kind.is_file() && path.extension().is_some_and(|e| e == "pid") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                pids.extend(text.split_whitespace().next().and_then(|p| p.parse::<i32>().ok()));
            }
        }
    }
    pids
}

/// Stops the processes of `root`: an agent first (it would start the others again), then the
/// rest, each asked with SIGTERM and killed after a grace of 2 s; repeated while new ones appear.
fn stop_processes(root: &Path, since_ticks: u64) {
    for _ in 0..5 {
        let found = processes_of(root, since_ticks);
        if found.is_empty() {
            return;
        }
        let (agents, others): (Vec<_>, Vec<_>) =
            found.into_iter().partition(|(_, command)| command.split(' ').nth(1) == Some("agent"));
        for group in [agents, others] {
            let pids: Vec<i32> = group.iter().map(|(pid, _)| *pid).collect();
            for pid in &pids {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGTERM);
            }
            let deadline = Instant::now() + Duration::from_secs(2);
            while Instant::now() < deadline && pids.iter().any(|p| alive(*p)) {
                std::thread::sleep(Duration::from_millis(20));
            }
            for pid in pids.iter().filter(|p| alive(**p)) {
                let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
            }
        }
    }
}

/// Whether `pid` runs (a zombie does not: it only waits for its parent to reap it).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|stat| stat.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// Mount points at or below `root` in this thread's mount namespace, in table order.
pub fn mounts_below(root: &Path) -> Vec<PathBuf> {
    let table = std::fs::read_to_string("/proc/thread-self/mountinfo").unwrap_or_default();
    table
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape_mount_path)
        .filter(|target| target.starts_with(root))
        .collect()
}

/// A mountinfo path: spaces, tabs, newlines and backslashes are written as octal escapes.
fn unescape_mount_path(field: &str) -> PathBuf {
    let mut out = Vec::with_capacity(field.len());
    let bytes = field.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).and_then(|d| std::str::from_utf8(d).ok());
        match (bytes[i], octal.and_then(|d| u8::from_str_radix(d, 8).ok())) {
            (b'\\', Some(byte)) => {
                out.push(byte);
                i += 4;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    PathBuf::from(String::from_utf8_lossy(&out).into_owned())
}

/// What a reboot leaves of `root`: every mount at or below it gone and the loop devices backed
/// by files under it detached (its files stay).
pub fn lose_mounts_and_loop_devices(root: &Path) {
    unmount_below(root);
    detach_loop_devices(root);
}

/// Unmounts every mount at or below `root`, deepest first, detaching a busy one.
fn unmount_below(root: &Path) {
    for _ in 0..3 {
        let mut mounts = mounts_below(root);
        if mounts.is_empty() {
            return;
        }
        mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
        for mount in mounts {
            let _ = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// Loop devices whose backing file lies under `root` (as `/sys/block/loopN/loop/backing_file`
/// says; a deleted file reads with " (deleted)" after its path).
pub fn loop_devices_of(root: &Path) -> Vec<(String, PathBuf)> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/block") else { return found };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        let Ok(text) = std::fs::read_to_string(entry.path().join("loop/backing_file")) else { continue };
        let file = PathBuf::from(text.trim_end().trim_end_matches(" (deleted)"));
        if file.starts_with(root) {
            found.push((format!("/dev/{name}"), file));
        }
    }
    found.sort();
    found
}

/// Detaches the loop devices backed by files under `root` (`losetup -d`).
fn detach_loop_devices(root: &Path) {
    for (device, _) in loop_devices_of(root) {
        let _ = std::process::Command::new("losetup").args(["-d", &device]).status();
    }
}

/// Writes `text` to `dir/name` as a source sees a manifest land: whole, renamed into place
/// from a dot-file beside it.
pub fn write_whole(dir: &Path, name: &str, text: &str) {
    let tmp = dir.join(format!(".{name}"));
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, dir.join(name)).unwrap();
}

/// Where a bench's agent logs: the file `KVOL_BENCH_AGENT_LOG_FILE` names, else nowhere.
pub fn bench_agent_log() -> std::process::Stdio {
    match std::env::var_os("KVOL_BENCH_AGENT_LOG_FILE") {
        Some(path) => std::process::Stdio::from(std::fs::File::create(path).unwrap()),
        None => std::process::Stdio::null(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_escapes_are_read_back() {
        assert_eq!(unescape_mount_path(r"/tmp/a\040b\011c\134d"), PathBuf::from("/tmp/a b\tc\\d"));
        assert_eq!(unescape_mount_path("/plain"), PathBuf::from("/plain"));
        assert_eq!(unescape_mount_path(r"/odd\04"), PathBuf::from(r"/odd\04"));
    }

    #[test]
    fn a_process_naming_the_root_and_one_in_a_pid_file_are_stopped_and_the_root_removed() {
        let scratch = ScratchRoot::new();
        let root = scratch.path().to_path_buf();
        // One names the root on its command line; the other does not, but left its pid file.
        let named = std::process::Command::new("sh")
            .args(["-c", "while true; do sleep 0.05; done", "named"])
            .arg(&root)
            .spawn()
            .expect("sh runs");
        let hidden = std::process::Command::new("sleep").arg("600").spawn().expect("sleep runs");
        std::fs::create_dir_all(root.join("components")).unwrap();
        std::fs::write(root.join("components/x.pid"), format!("{}\n", hidden.id())).unwrap();
        let pids: Vec<i32> = scratch.leftovers().processes.iter().map(|(p, _)| *p).collect();
        let (n, h) = (named.id() as i32, hidden.id() as i32);
        let starts = (started_at_ticks(n), started_at_ticks(h), scratch.made_at_ticks);
        assert!(
            pids.contains(&n) && pids.contains(&h),
            "found {pids:?}; named {n}, hidden {h}; starts {starts:?}"
        );
        drop(scratch);
        // Reaped here (they are this process's children): gone means exited.
        for mut child in [named, hidden] {
            let status = child.wait().expect("wait");
            assert!(!status.success(), "stopped by a signal: {status:?}");
        }
        assert!(!root.exists(), "{} removed", root.display());
    }
}
