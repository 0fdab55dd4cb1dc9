//! Driver calls: run `<driver> <command> <args…>` as a child process with a deadline and an output cap, and parse its JSON status.
//!
//! Like upstream's `CombinedOutput`, the driver's stdout and stderr are one pipe, so the output
//! is read in exactly the order it was written. Unlike upstream, every call has a deadline and
//! an output cap; the driver runs in a process group of its own, and when either limit is hit
//! the whole group gets SIGKILL. Everything is async, with no lock shared between calls, so a
//! hanging driver holds up only its own call. When the driver exits, whatever it wrote is
//! already in the pipe and is read without waiting for end-of-file: a background process that
//! inherited the pipe (a FUSE daemon, say) can neither hold the call up nor be killed by it.

use std::io;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::{ExitStatus, Stdio};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::net::unix::pipe;
use tokio::process::Child;

use crate::error::{FlexError, Result};
use crate::options::RedactedArgs;
use crate::protocol::{Command, DriverStatus};
use crate::{status, trust};

/// How long to wait for a killed driver to be reaped before leaving it to tokio's orphan reaper
/// (a process stuck in uninterruptible sleep does not die at once).
const REAP_GRACE: Duration = Duration::from_secs(2);
/// How often a spawn failing with ETXTBSY is retried, and how long apart.
const SPAWN_RETRIES: u32 = 5;
const SPAWN_RETRY_DELAY: Duration = Duration::from_millis(20);
/// Bytes read from the output pipe at a time.
const CHUNK: usize = 16 * 1024;

/// Limits on every driver call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CallLimits {
    /// Deadline of every command but `waitforattach`.
    pub timeout: Duration,
    /// Deadline of `waitforattach` (kubelet waits 10 minutes).
    pub wait_for_attach_timeout: Duration,
    /// Most bytes of combined stdout and stderr read from one call.
    pub max_output: usize,
}

impl CallLimits {
    /// The deadline of `command`.
    pub const fn timeout_of(&self, command: Command) -> Duration {
        match command {
            Command::WaitForAttach => self.wait_for_attach_timeout,
            _ => self.timeout,
        }
    }
}

impl Default for CallLimits {
    fn default() -> Self {
        CallLimits {
            timeout: Duration::from_secs(120),
            wait_for_attach_timeout: Duration::from_secs(600),
            max_output: 1 << 20,
        }
    }
}

/// One installed driver: its plugin name (`vendor/driver`), its executable and its limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlexDriver {
    pub name: String,
    pub executable: PathBuf,
    pub limits: CallLimits,
    /// The owner the executable and its directory must have, checked before every call.
    pub owner_uid: u32,
}

/// The environment variable every driver call gets: the executable's path, so a call whose
/// `argv` shows only `/proc/<pid>/fd/<n>` (a script run through its interpreter) is still
/// recognised as a driver call by [`crate::leftovers`] after its agent died.
pub const DRIVER_ENV: &str = "KVOL_FLEXVOLUME_DRIVER";

/// The path that executes an open descriptor: its magic link under this process's `/proc`
/// entry. It resolves to the opened inode whatever happened to the file's name meanwhile, and
/// it stays valid for a script's interpreter (which opens it after `execve`) as long as this
/// process holds the descriptor.
pub fn exec_path(fd: &OwnedFd) -> PathBuf {
    PathBuf::from(format!("/proc/{}/fd/{}", std::process::id(), fd.as_raw_fd()))
}

impl FlexDriver {
    /// Runs `command` with `args`; returns the parsed Success status or why not.
    pub async fn call(&self, command: Command, args: &[String]) -> Result<DriverStatus> {
        self.call_within(command, args, self.limits.timeout_of(command)).await
    }

    /// Runs `command` with `args` under the deadline `timeout` instead of the limits' one.
    pub async fn call_within(
        &self,
        command: Command,
        args: &[String],
        timeout: Duration,
    ) -> Result<DriverStatus> {
        let shown = RedactedArgs(args);
        tracing::debug!(driver = %self.name, %command, args = ?shown, "calling flexvolume driver");
        let (output, exit) = self.run(command, args, timeout).await?;
        let failed_exit = (!exit.success()).then(|| exit.to_string());
        let judged = status::judge(&self.name, command, &output, failed_exit.as_deref());
        match &judged {
            Err(FlexError::SuccessWithFailedExit { .. }) => {
                let bug = "flexvolume driver bug: status Success with a failed exit";
                tracing::error!(driver = %self.name, %command, %exit, "{bug}")
            }
            Err(e) if !e.is_not_supported() => {
                let output = String::from_utf8_lossy(&output);
                let (driver, failed) = (&self.name, "flexvolume driver call failed");
                tracing::warn!(%driver, %command, args = ?shown, %exit, %output, "{failed}")
            }
            _ => {}
        }
        judged
    }

    /// Runs the driver and collects its combined output, within `timeout` and the output cap.
    async fn run(
        &self,
        command: Command,
        args: &[String],
        timeout: Duration,
    ) -> Result<(Vec<u8>, ExitStatus)> {
        let spawn_error = |source: io::Error| FlexError::Spawn {
            driver: self.name.clone(),
            command: command.as_str(),
            source,
        };
        // The checked file, held open until the call ends: a script's interpreter opens it by
        // its /proc path after the exec.
        let checked = trust::open_executable(&self.executable, self.owner_uid).map_err(|e| match e {
            FlexError::Io { source, .. } => spawn_error(source),
            refused => refused,
        })?;
        // One pipe for stdout and stderr, as Go's CombinedOutput does: the output keeps its order.
        let (reader, writer) = io::pipe().map_err(spawn_error)?;
        let mut child = self.spawn(&checked, command, args, &writer).await.map_err(spawn_error)?;
        // Only the driver may hold the write end now, or the pipe would never end.
        drop(writer);
        let mut group = GroupGuard(child.id().and_then(|id| i32::try_from(id).ok()).map(Pid::from_raw));
        let mut output = pipe::Receiver::from_owned_fd(OwnedFd::from(reader)).map_err(spawn_error)?;
        let max = self.limits.max_output;
        let collected = tokio::time::timeout(timeout, collect(&mut child, &mut output, max)).await;
        let failure = match collected {
            Ok(Ok(Collected::Exited(status, bytes))) => {
                // Reaped: the group id may be gone, so nothing may be killed by it any more.
                group.disarm();
                return Ok((bytes, status));
            }
            Ok(Ok(Collected::TooLarge { exited })) => {
                if exited {
                    group.disarm();
                }
                FlexError::OutputTooLarge { driver: self.name.clone(), command: command.as_str(), limit: max }
            }
            Ok(Err(source)) => FlexError::io("read the output of", &self.executable, source),
            Err(_elapsed) => {
                FlexError::Timeout { driver: self.name.clone(), command: command.as_str(), limit: timeout }
            }
        };
        let killing = "killing the flexvolume driver's process group";
        tracing::warn!(driver = %self.name, %command, error = %failure, "{killing}");
        group.kill();
        let _ = tokio::time::timeout(REAP_GRACE, child.wait()).await;
        Err(failure)
    }

    /// Starts the driver in a new process group, its stdout and stderr on `writer`. A driver
    /// file still open for writing somewhere (being copied in place, or inherited for an
    /// instant by a process another thread forks) fails with ETXTBSY; that is retried briefly.
    /// `argv[0]` is the executable's path, as before; `$0` of a script is the `/proc` path.
    async fn spawn(
        &self,
        checked: &OwnedFd,
        command: Command,
        args: &[String],
        writer: &io::PipeWriter,
    ) -> io::Result<Child> {
        let mut attempt = 0;
        loop {
            let mut cmd = tokio::process::Command::new(exec_path(checked));
            cmd.arg0(&self.executable)
                .env(DRIVER_ENV, &self.executable)
                .arg(command.as_str())
                .args(args)
                .stdin(Stdio::null())
                .stdout(writer.try_clone()?)
                .stderr(writer.try_clone()?)
                .process_group(0)
                .kill_on_drop(true);
            match cmd.spawn() {
                Err(e) if e.raw_os_error() == Some(Errno::ETXTBSY as i32) && attempt < SPAWN_RETRIES => {
                    attempt += 1;
                    tokio::time::sleep(SPAWN_RETRY_DELAY).await;
                }
                // `cmd` drops here with its copies of the write end.
                spawned => return spawned,
            }
        }
    }
}

/// What reading a driver's output ended with.
enum Collected {
    Exited(ExitStatus, Vec<u8>),
    /// More than the cap; `exited` when the driver had already exited (and been reaped).
    TooLarge {
        exited: bool,
    },
}

/// Reads the output while waiting for the driver to exit; stops reading at `max` bytes.
async fn collect(child: &mut Child, output: &mut pipe::Receiver, max: usize) -> io::Result<Collected> {
    let mut bytes = Vec::new();
    let mut chunk = vec![0u8; CHUNK];
    let mut open = true;
    loop {
        tokio::select! {
            read = output.read(&mut chunk), if open => match read? {
                0 => open = false,
                n => {
                    if !append(&mut bytes, &chunk[..n], max) {
                        return Ok(Collected::TooLarge { exited: false });
                    }
                }
            },
            status = child.wait() => {
                let status = status?;
                if open && !drain(output, &mut bytes, &mut chunk, max) {
                    return Ok(Collected::TooLarge { exited: true });
                }
                return Ok(Collected::Exited(status, bytes));
            }
        }
    }
}

/// Reads what is in the pipe now, without waiting: after the driver exited, all it wrote is
/// there. Returns false when the cap is exceeded. The driver is reaped by now, so a read error
/// (which a pipe of kvol's own does not have) ends the output rather than the call.
fn drain(output: &pipe::Receiver, bytes: &mut Vec<u8>, chunk: &mut [u8], max: usize) -> bool {
    loop {
        // The pipe is non-blocking (tokio made it so), so this read never waits.
        match nix::unistd::read(output.as_fd(), chunk) {
            Ok(0) | Err(Errno::EAGAIN) => return true,
            Ok(n) => {
                if !append(bytes, &chunk[..n], max) {
                    return false;
                }
            }
            Err(Errno::EINTR) => {}
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the rest of a flexvolume driver's output");
                return true;
            }
        }
    }
}

/// Appends `data` unless that makes more than `max` bytes.
fn append(bytes: &mut Vec<u8>, data: &[u8], max: usize) -> bool {
    if bytes.len() + data.len() > max {
        return false;
    }
    bytes.extend_from_slice(data);
    true
}

/// Kills the driver's process group unless disarmed: when the deadline or the cap is hit, and
/// when the calling future is dropped mid-call. Armed only while the group leader is unreaped,
/// so its id cannot have been reused.
struct GroupGuard(Option<Pid>);

impl GroupGuard {
    fn disarm(&mut self) {
        self.0 = None;
    }

    fn kill(&mut self) {
        if let Some(group) = self.0.take() {
            match killpg(group, Signal::SIGKILL) {
                Ok(()) | Err(Errno::ESRCH) => {}
                Err(e) => {
                    let failed = "cannot kill a flexvolume driver's process group";
                    tracing::error!(group = group.as_raw(), error = %e, "{failed}")
                }
            }
        }
    }
}

impl Drop for GroupGuard {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_waitforattach_has_its_own_deadline() {
        let limits = CallLimits {
            timeout: Duration::from_secs(1),
            wait_for_attach_timeout: Duration::from_secs(9),
            max_output: 10,
        };
        for command in Command::ALL {
            let expected = if command == Command::WaitForAttach { 9 } else { 1 };
            assert_eq!(limits.timeout_of(command), Duration::from_secs(expected), "{command}");
        }
    }

    #[test]
    fn commands_are_spelled_as_upstream() {
        let spelled: Vec<&str> = Command::ALL.iter().map(|c| c.as_str()).collect();
        assert_eq!(
            spelled,
            [
                "init",
                "attach",
                "detach",
                "waitforattach",
                "isattached",
                "mountdevice",
                "unmountdevice",
                "mount",
                "unmount",
                "getvolumename",
                "expandvolume",
                "expandfs"
            ]
        );
    }

    #[test]
    fn output_is_capped_exactly() {
        // (bytes held, bytes read, cap, whether they fit, bytes held afterwards)
        let cases = [
            ("", "abc", 3, true, 3),
            ("ab", "c", 3, true, 3),
            ("ab", "cd", 3, false, 2),
            ("", "", 0, true, 0),
            ("", "x", 0, false, 0),
        ];
        for (have, more, max, fits, len) in cases {
            let mut bytes = have.as_bytes().to_vec();
            let more = more.as_bytes();
            assert_eq!(append(&mut bytes, more, max), fits, "{have:?} + {more:?} within {max}");
            assert_eq!(bytes.len(), len);
        }
    }
}
