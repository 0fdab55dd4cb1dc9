//! Driver calls a previous agent left running when it died: found in `/proc` and stopped before a new agent acts, so no two calls ever work on one volume at once.
//!
//! A call kvol starts leads its own process group (see [`crate::driver`]), and runs an
//! executable inside the driver directory: `argv[0]` for a binary, `argv[1]` for a script run
//! by its interpreter — or, since kvol executes the checked descriptor, `argv[1]` of a script
//! is `/proc/<agent pid>/fd/<n>`, so the call also carries the executable's path in its
//! environment ([`crate::driver::DRIVER_ENV`]). The command line reported has the Secret
//! values of its options JSON redacted. When the agent dies the call goes on, reparented away from kvol. A new
//! agent stops such calls (the whole group, with `SIGKILL`) before it reads the mount table:
//! the journal says which operations were interrupted, and the mount table read afterwards is
//! final. A driver must already tolerate being killed: every call has a deadline.
//!
//! A call whose parent is a running kvol process (the same executable as this one, for
//! example `kvol plugins` probing drivers) is not a leftover and is left alone.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::driver::DRIVER_ENV;
use crate::options::redact_secrets;

/// A driver call running with no kvol process as its parent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeftoverCall {
    pub pid: i32,
    /// The command line, arguments joined by spaces and Secret values redacted, for the log.
    pub command_line: String,
}

/// The facts of one process that decide whether it is a leftover call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProcessFacts {
    pub pid: i32,
    pub process_group: i32,
    pub parent_is_kvol: bool,
    pub argv: Vec<String>,
    /// The value of [`crate::driver::DRIVER_ENV`] in its environment, if any.
    pub driver_env: Option<String>,
}

/// Whether `process` is a driver call under `flex_dir` that no kvol process owns; pure.
pub fn is_leftover(process: &ProcessFacts, flex_dir: &Path) -> bool {
    let under = |arg: &String| {
        let path = Path::new(arg);
        path.is_absolute() && path.starts_with(flex_dir) && path != flex_dir
    };
    let points_in = process.argv.iter().take(2).any(under) || process.driver_env.as_ref().is_some_and(under);
    process.pid == process.process_group && !process.parent_is_kvol && points_in
}

/// The leftover driver calls under `flex_dir`, read from `/proc`. Processes that vanish while
/// being read are skipped.
pub fn find(flex_dir: &Path) -> Vec<LeftoverCall> {
    let own = std::env::current_exe().ok();
    let Ok(listing) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut found = Vec::new();
    for entry in listing.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<i32>().ok()) else { continue };
        let Some(facts) = read_facts(pid, own.as_deref()) else { continue };
        if is_leftover(&facts, flex_dir) {
            found.push(LeftoverCall { pid, command_line: shown_command_line(&facts.argv) });
        }
    }
    found.sort_by_key(|c| c.pid);
    found
}

/// The command line as logs may show it: arguments joined by spaces, Secret values redacted.
pub fn shown_command_line(argv: &[String]) -> String {
    argv.iter().map(|a| redact_secrets(a)).collect::<Vec<_>>().join(" ")
}

/// Kills each call's process group and waits (at most `limit` in all) until the calls are
/// gone; returns the ones still there after that.
pub fn stop(calls: &[LeftoverCall], limit: Duration) -> Vec<LeftoverCall> {
    for call in calls {
        // ESRCH: it ended on its own meanwhile.
        let _ = killpg(Pid::from_raw(call.pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + limit;
    loop {
        let left: Vec<LeftoverCall> = calls.iter().filter(|c| alive(c.pid)).cloned().collect();
        if left.is_empty() || Instant::now() >= deadline {
            return left;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether `pid` exists and is not a zombie waiting for its new parent to reap it.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat_fields(&stat).is_some_and(|(state, _, _)| state != 'Z' && state != 'X'),
        Err(_) => false,
    }
}

fn read_facts(pid: i32, own_exe: Option<&Path>) -> Option<ProcessFacts> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, parent, process_group) = stat_fields(&stat)?;
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
    let argv: Vec<String> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .map(|a| String::from_utf8_lossy(a).into_owned())
        .collect();
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    let prefix = format!("{DRIVER_ENV}=");
    let driver_env = environ
        .split(|b| *b == 0)
        .find_map(|v| v.strip_prefix(prefix.as_bytes()))
        .map(|v| String::from_utf8_lossy(v).into_owned());
    let parent_exe: Option<PathBuf> = std::fs::read_link(format!("/proc/{parent}/exe")).ok();
    let parent_is_kvol = parent_exe.is_some() && parent_exe.as_deref() == own_exe;
    Some(ProcessFacts { pid, process_group, parent_is_kvol, argv, driver_env })
}

/// State, parent pid and process group from `/proc/<pid>/stat`; the command name in
/// parentheses may itself hold spaces and parentheses, so the fields are read after the last
/// `)`.
fn stat_fields(stat: &str) -> Option<(char, i32, i32)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let parent = fields.next()?.parse().ok()?;
    let group = fields.next()?.parse().ok()?;
    Some((state, parent, group))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_group_leading_calls_of_driver_executables_without_a_kvol_parent_are_leftovers() {
        let dir = Path::new("/var/lib/kvol/flexvolume");
        let facts = |pid, group, parent_is_kvol, argv: &[&str]| ProcessFacts {
            pid,
            process_group: group,
            parent_is_kvol,
            argv: argv.iter().map(|s| s.to_string()).collect(),
            driver_env: None,
        };
        let through_proc = |env: &str| ProcessFacts {
            driver_env: Some(env.to_string()),
            ..facts(10, 10, false, &["/bin/sh", "/proc/77/fd/9", "mount"])
        };
        let script = "/var/lib/kvol/flexvolume/acme~nfs/nfs";
        let rows = [
            (facts(10, 10, false, &[script, "mount", "/t"]), true),
            (facts(10, 10, false, &["/bin/sh", script, "mount"]), true),
            (facts(10, 10, true, &["/bin/sh", script, "init"]), false),
            (facts(11, 10, false, &["mount", "-t", "tmpfs"]), false),
            (facts(12, 10, false, &["/bin/sh", "-c", script]), false),
            (facts(10, 10, false, &["/bin/sh", "/elsewhere/acme~nfs/nfs"]), false),
            (facts(10, 10, false, &["/var/lib/kvol/flexvolume"]), false),
            (facts(10, 10, false, &["acme~nfs/nfs", "mount"]), false),
            (facts(10, 10, false, &[]), false),
            (through_proc(script), true),
            (through_proc("/elsewhere/acme~nfs/nfs"), false),
            (ProcessFacts { parent_is_kvol: true, ..through_proc(script) }, false),
            (facts(10, 10, false, &["/bin/sh", "/proc/77/fd/9", "mount"]), false),
        ];
        for (process, expected) in rows {
            assert_eq!(is_leftover(&process, dir), expected, "{process:?}");
        }
    }

    #[test]
    fn the_command_line_shown_has_no_secret_values() {
        let options = r#"{"kubernetes.io/secret/password":"c2VjcmV0","kubernetes.io/fsType":"ext4"}"#;
        let argv: Vec<String> = ["/d/acme~nfs/nfs", "mount", "/t", options].map(String::from).to_vec();
        let shown = shown_command_line(&argv);
        assert!(!shown.contains("c2VjcmV0"), "{shown}");
        assert!(shown.starts_with("/d/acme~nfs/nfs mount /t {"), "{shown}");
        assert!(shown.contains("ext4") && shown.contains("<redacted>"), "{shown}");
    }

    #[test]
    fn stat_fields_survive_odd_command_names() {
        let rows = [
            ("42 (sh) S 1 42 42 0 -1", Some(('S', 1, 42))),
            ("42 (a) b) (c) R 7 9 9 0", Some(('R', 7, 9))),
            ("42 (x y) Z 1 42", Some(('Z', 1, 42))),
            ("42 (broken", None),
            ("42 (sh) S one 42", None),
        ];
        for (stat, expected) in rows {
            assert_eq!(stat_fields(stat), expected, "{stat}");
        }
    }
}
