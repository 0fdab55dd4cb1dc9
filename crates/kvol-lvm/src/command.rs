//! lvm2 and other external commands, each bounded in time (killed on timeout), errors naming the command and its stderr.

use std::process::Stdio;
use std::time::Duration;

use crate::vgs::{self, VolumeGroup};

/// How long one lvm command may take by default.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// lvm2 settings for hosts and containers without udev: lvm neither waits for udev nor asks it
/// for the device list (otherwise commands hang or find no devices there).
pub const NO_UDEV_CONFIG: &str =
    "devices { obtain_device_list_from_udev=0 } activation { udev_sync=0 udev_rules=0 }";

/// A command that did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum CommandError {
    #[error("cannot run {command}: {source}")]
    Spawn { command: String, source: std::io::Error },
    #[error("{command} did not finish within {timeout:?} and was killed")]
    Timeout { command: String, timeout: Duration },
    #[error("{command} failed ({status}): {stderr}")]
    Failed { command: String, status: String, stderr: String },
    #[error("{command}: {source}")]
    Output { command: String, source: vgs::VgsError },
}

/// What a finished command left: its exit code (`None` when killed by a signal) and output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    pub command: String,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
}

impl Finished {
    /// Its stdout when it exited 0, else an error with its stderr.
    pub fn ok(self) -> Result<String, CommandError> {
        match self.code {
            Some(0) => Ok(self.stdout),
            code => Err(CommandError::Failed {
                command: self.command,
                status: code
                    .map_or_else(|| "killed by a signal".to_string(), |c| format!("exit status: {c}")),
                stderr: self.stderr.trim().to_string(),
            }),
        }
    }
}

/// Runs `program args…` with at most `timeout`, whatever its exit status; killed when the time
/// is up.
pub async fn output(program: &str, args: &[&str], timeout: Duration) -> Result<Finished, CommandError> {
    let command = std::iter::once(program).chain(args.iter().copied()).collect::<Vec<_>>().join(" ");
    let child = tokio::process::Command::new(program)
        .args(args)
        .env("DM_DISABLE_UDEV", "1")
        .env("LVM_SUPPRESS_FD_WARNINGS", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|source| CommandError::Spawn { command: command.clone(), source })?;
    let output = match tokio::time::timeout(timeout, child.wait_with_output()).await {
        Ok(result) => result.map_err(|source| CommandError::Spawn { command: command.clone(), source })?,
        Err(_) => return Err(CommandError::Timeout { command, timeout }),
    };
    Ok(Finished {
        command,
        code: output.status.code(),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    })
}

/// Runs `program args…` with at most `timeout`, returning its stdout; killed when the time is up.
pub async fn run(program: &str, args: &[&str], timeout: Duration) -> Result<String, CommandError> {
    output(program, args, timeout).await?.ok()
}

/// The node's volume groups, from `vgs` (udev-free).
pub async fn volume_groups(timeout: Duration) -> Result<Vec<VolumeGroup>, CommandError> {
    let mut args = vec!["--config", NO_UDEV_CONFIG];
    args.extend_from_slice(vgs::VGS_ARGS);
    let out = run("vgs", &args, timeout).await?;
    vgs::parse_vgs(&out).map_err(|source| CommandError::Output { command: "vgs".into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn output_failure_and_timeout() {
        let out = run("sh", &["-c", "echo hello"], Duration::from_secs(10)).await.unwrap();
        assert_eq!(out, "hello\n");
        let err = run("sh", &["-c", "echo boom >&2; exit 3"], Duration::from_secs(10)).await.unwrap_err();
        assert_eq!(err.to_string(), "sh -c echo boom >&2; exit 3 failed (exit status: 3): boom");
        let started = std::time::Instant::now();
        let err = run("sleep", &["30"], Duration::from_millis(200)).await.unwrap_err();
        assert!(matches!(err, CommandError::Timeout { .. }), "{err}");
        assert!(started.elapsed() < Duration::from_secs(10));
        let err = run("/nonexistent/kvol-lvm-tool", &[], Duration::from_secs(1)).await.unwrap_err();
        assert!(err.to_string().starts_with("cannot run /nonexistent/kvol-lvm-tool"), "{err}");
    }
}
