//! The driver under test: a socket someone else serves, or a command kvol starts (its socket in place of `{socket}`), restarts and stops, in a process group of its own.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kvol_csi::{CsiClient, Timeouts};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

/// The placeholder `--driver-command` must hold.
pub const SOCKET_PLACEHOLDER: &str = "{socket}";

/// How long a started driver may take to answer Probe.
const READY_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the driver cannot be reached or run.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    #[error("driver command {command:?}: {reason}")]
    Command { command: String, reason: String },
    #[error("csi driver at {}: {reason}", socket.display())]
    NotReady { socket: PathBuf, reason: String },
}

/// How the driver is given.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverSpec {
    /// A driver already serving this socket.
    Socket(PathBuf),
    /// A command line kvol runs, `{socket}` standing for the socket kvol chooses.
    Command(String),
}

/// The words of a command line: split at unquoted white space, `'…'` and `"…"` quoting (no
/// escapes inside single quotes; `\` escapes the next character elsewhere); `{socket}` replaced
/// in every word. Pure.
pub fn command_words(template: &str, socket: &Path) -> Result<Vec<String>, String> {
    if !template.contains(SOCKET_PLACEHOLDER) {
        return Err(format!(
            "it does not name the socket: put {SOCKET_PLACEHOLDER} where the driver's endpoint goes"
        ));
    }
    let socket = socket.to_str().ok_or("the socket path is not valid UTF-8")?;
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = template.chars();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => words.extend(word.take()),
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => return Err("a single quote is not closed".to_string()),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => w.extend(chars.next()),
                        Some(c) => w.push(c),
                        None => return Err("a double quote is not closed".to_string()),
                    }
                }
            }
            '\\' => word.get_or_insert_with(String::new).extend(chars.next()),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    if words.is_empty() {
        return Err("it is empty".to_string());
    }
    Ok(words.into_iter().map(|w| w.replace(SOCKET_PLACEHOLDER, socket)).collect())
}

/// The driver: where it serves, and the process when kvol runs it.
#[derive(Debug)]
pub struct Driver {
    socket: PathBuf,
    command: Option<(String, Vec<String>)>,
    log: PathBuf,
    child: Option<Child>,
    restarts: u32,
}

impl Driver {
    /// Reaches a driver serving `socket`, or starts `command` serving `<work_dir>/csi.sock`
    /// (its output in `<work_dir>/driver.log`); returns once it answers Probe.
    pub async fn start(spec: &DriverSpec, work_dir: &Path) -> Result<Driver, DriverError> {
        let log = work_dir.join("driver.log");
        let mut driver = match spec {
            DriverSpec::Socket(socket) => {
                Driver { socket: socket.clone(), command: None, log, child: None, restarts: 0 }
            }
            DriverSpec::Command(template) => {
                let socket = work_dir.join("csi.sock");
                let words = command_words(template, &socket)
                    .map_err(|reason| DriverError::Command { command: template.clone(), reason })?;
                Driver { socket, command: Some((template.clone(), words)), log, child: None, restarts: 0 }
            }
        };
        driver.spawn()?;
        driver.wait_ready().await?;
        Ok(driver)
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// Whether kvol runs the driver (and so can restart it).
    pub fn is_started_by_kvol(&self) -> bool {
        self.command.is_some()
    }

    /// Where the driver's output goes when kvol runs it.
    pub fn log(&self) -> &Path {
        &self.log
    }

    fn spawn(&mut self) -> Result<(), DriverError> {
        let Some((template, words)) = &self.command else { return Ok(()) };
        let refused = |reason: String| DriverError::Command { command: template.clone(), reason };
        // A socket left by the last run would be taken for the new driver's.
        let _ = std::fs::remove_file(&self.socket);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map_err(|e| refused(format!("cannot open its log {}: {e}", self.log.display())))?;
        let err = out.try_clone().map_err(|e| refused(e.to_string()))?;
        let child = Command::new(&words[0])
            .args(&words[1..])
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| refused(format!("cannot start {}: {e}", words[0])))?;
        self.child = Some(child);
        Ok(())
    }

    /// Waits until the socket exists and Probe says ready.
    async fn wait_ready(&mut self) -> Result<(), DriverError> {
        let started = Instant::now();
        let not_ready = |reason: String| DriverError::NotReady { socket: self.socket.clone(), reason };
        let mut last = String::from("its socket does not exist");
        while started.elapsed() < READY_TIMEOUT {
            if let Some(child) = &mut self.child
                && let Ok(Some(status)) = child.try_wait()
            {
                return Err(not_ready(format!(
                    "the driver exited ({status}); its output is in {}",
                    self.log.display()
                )));
            }
            if self.socket.exists() {
                let client = CsiClient::new(
                    "driver-under-test",
                    &self.socket,
                    Timeouts::with_call(Duration::from_secs(2)),
                )
                .map_err(|e| not_ready(e.to_string()))?;
                match client.probe().await {
                    Ok(true) => return Ok(()),
                    Ok(false) => last = "Probe says not ready".to_string(),
                    Err(e) => last = e.to_string(),
                }
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Err(not_ready(format!("not ready after {READY_TIMEOUT:?}: {last}")))
    }

    /// Kills the driver's process group with SIGKILL and waits for it.
    pub async fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
            }
            let _ = child.wait().await;
        }
    }

    /// Kills the driver and starts it again; returns once it answers Probe. Only for a driver
    /// kvol started.
    pub async fn restart(&mut self) -> Result<(), DriverError> {
        if self.command.is_none() {
            return Err(DriverError::NotReady {
                socket: self.socket.clone(),
                reason: "kvol did not start this driver and cannot restart it".to_string(),
            });
        }
        self.kill().await;
        self.restarts += 1;
        self.spawn()?;
        self.wait_ready().await
    }

    /// Stops a driver kvol started: SIGTERM, then SIGKILL after five seconds.
    pub async fn stop(&mut self) {
        let Some(child) = &mut self.child else { return };
        if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGTERM);
            if tokio::time::timeout(Duration::from_secs(5), child.wait()).await.is_ok() {
                self.child = None;
                return;
            }
        }
        self.kill().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_lines_split_as_a_shell_would_for_plain_quoting() {
        let socket = Path::new("/w/csi.sock");
        // (template, words)
        let table: [(&str, &[&str]); 5] = [
            ("drv --endpoint unix://{socket}", &["drv", "--endpoint", "unix:///w/csi.sock"]),
            ("drv   --csi-socket={socket}  ", &["drv", "--csi-socket=/w/csi.sock"]),
            ("'/opt/my driver/bin' -e {socket}", &["/opt/my driver/bin", "-e", "/w/csi.sock"]),
            ("drv --name \"a \\\"b\\\"\" {socket}", &["drv", "--name", "a \"b\"", "/w/csi.sock"]),
            ("drv a\\ b {socket} ''", &["drv", "a b", "/w/csi.sock", ""]),
        ];
        for (template, words) in table {
            assert_eq!(command_words(template, socket).unwrap(), words, "{template}");
        }
        let refused = [
            ("drv --endpoint /tmp/x.sock", "it does not name the socket"),
            ("drv '{socket}", "a single quote is not closed"),
            ("drv \"{socket}", "a double quote is not closed"),
        ];
        for (template, reason) in refused {
            let e = command_words(template, socket).unwrap_err();
            assert!(e.starts_with(reason), "{template}: {e}");
        }
    }
}
