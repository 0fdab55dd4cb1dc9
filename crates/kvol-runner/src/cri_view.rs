//! What the runtime has, read through CRI: kvol's sandboxes and containers grouped by pod uid, as `actions::PodSeen` (one ListPodSandbox and one ListContainers a look; an exited container's status asked once and remembered).

use std::collections::{BTreeMap, HashMap};

use kvol_cri::{self as cri, CriClient, CriError};

use crate::actions::{ContainerSeen, PodSeen, SandboxSeen, State};
use crate::labels;

/// The pods the runtime has (by uid), and the identity of each (`ns/name`).
#[derive(Clone, Debug, Default)]
pub struct RuntimeView {
    pub pods: BTreeMap<String, PodSeen>,
    pub names: BTreeMap<String, String>,
    /// A pod's grace period as its containers' annotation carries it.
    pub grace: BTreeMap<String, i64>,
}

/// An exited container's end, which never changes once read.
#[derive(Clone, Debug, Default)]
struct Ended {
    exit_code: i32,
    started_at: i64,
    finished_at: i64,
    reason: String,
    message: String,
}

/// Reads the runtime's state; remembers the ends of exited containers between looks.
#[derive(Debug, Default)]
pub struct Viewer {
    ended: HashMap<String, Ended>,
}

fn managed() -> HashMap<String, String> {
    HashMap::from([(labels::MANAGED_BY.to_string(), "true".to_string())])
}

impl Viewer {
    pub async fn look(&mut self, cri: &CriClient) -> Result<RuntimeView, CriError> {
        let sandboxes = cri
            .list_pod_sandbox(cri::ListPodSandboxRequest {
                filter: Some(cri::PodSandboxFilter { label_selector: managed(), ..Default::default() }),
            })
            .await?
            .items;
        let containers = cri
            .list_containers(cri::ListContainersRequest {
                filter: Some(cri::ContainerFilter { label_selector: managed(), ..Default::default() }),
            })
            .await?
            .containers;
        let mut view = RuntimeView::default();
        for s in &sandboxes {
            let uid = s.labels.get(labels::POD_UID).cloned().unwrap_or_default();
            let meta = s.metadata.clone().unwrap_or_default();
            view.names.insert(uid.clone(), format!("{}/{}", meta.namespace, meta.name));
            view.pods.entry(uid).or_default().sandboxes.push(SandboxSeen {
                id: s.id.clone(),
                attempt: meta.attempt,
                ready: s.state == cri::PodSandboxState::SandboxReady as i32,
                created_at: s.created_at,
            });
        }
        let live: std::collections::HashSet<&str> = containers.iter().map(|c| c.id.as_str()).collect();
        self.ended.retain(|id, _| live.contains(id.as_str()));
        for c in &containers {
            let seen = self.container(cri, c).await;
            let uid = c.labels.get(labels::POD_UID).cloned().unwrap_or_default();
            if let Some(grace) =
                c.annotations.get(labels::POD_TERMINATION_GRACE_PERIOD).and_then(|g| g.parse().ok())
            {
                view.grace.insert(uid.clone(), grace);
            }
            view.pods.entry(uid).or_default().containers.push(seen);
        }
        Ok(view)
    }

    async fn container(&mut self, cri: &CriClient, c: &cri::Container) -> ContainerSeen {
        let state = state_of(c.state);
        let mut seen = ContainerSeen {
            id: c.id.clone(),
            sandbox_id: c.pod_sandbox_id.clone(),
            name: c.labels.get(labels::CONTAINER_NAME).cloned().unwrap_or_default(),
            restart_count: labels::restart_count_of(&c.annotations),
            hash: c.annotations.get(labels::CONTAINER_HASH).and_then(|h| u32::from_str_radix(h, 16).ok()),
            state,
            exit_code: 0,
            created_at: c.created_at,
            started_at: 0,
            finished_at: 0,
            reason: String::new(),
            message: String::new(),
            failed_probe: None,
            probed_ready: None,
            image_ref: c.image_ref.clone(),
        };
        if state != State::Exited {
            return seen;
        }
        if !self.ended.contains_key(&c.id) {
            let request = cri::ContainerStatusRequest { container_id: c.id.clone(), verbose: false };
            match cri.container_status(request).await.map(|r| r.status) {
                Ok(Some(s)) => {
                    let ended = Ended {
                        exit_code: s.exit_code,
                        started_at: s.started_at,
                        finished_at: s.finished_at,
                        message: termination_message(&s, &c.annotations).unwrap_or(s.message),
                        reason: s.reason,
                    };
                    self.ended.insert(c.id.clone(), ended);
                }
                // Asked again at the next look.
                Ok(None) | Err(_) => return seen,
            }
        }
        let ended = &self.ended[&c.id];
        seen.exit_code = ended.exit_code;
        seen.started_at = ended.started_at;
        seen.finished_at = ended.finished_at;
        seen.reason = ended.reason.clone();
        seen.message = ended.message.clone();
        seen
    }
}

pub fn state_of(state: i32) -> State {
    match cri::ContainerState::try_from(state) {
        Ok(cri::ContainerState::ContainerCreated) => State::Created,
        Ok(cri::ContainerState::ContainerRunning) => State::Running,
        Ok(cri::ContainerState::ContainerExited) => State::Exited,
        _ => State::Unknown,
    }
}

/// Kubelet's cap on a termination message read from its file.
const MAX_MESSAGE_BYTES: usize = 4096;
/// With `FallbackToLogsOnError`: at most this much of the log's end…
const MAX_FALLBACK_BYTES: usize = 2048;
/// …and at most this many lines.
const MAX_FALLBACK_LINES: usize = 80;

/// An exited container's termination message as kubelet reads it: the file bound at its
/// termination message path (through the status' mounts), or — with
/// `FallbackToLogsOnError`, a failure and no file content — the end of its log.
fn termination_message(
    status: &cri::ContainerStatus,
    annotations: &HashMap<String, String>,
) -> Option<String> {
    let path = annotations.get(labels::TERMINATION_MESSAGE_PATH)?;
    let from_file = status
        .mounts
        .iter()
        .find(|m| &m.container_path == path)
        .and_then(|m| std::fs::read(&m.host_path).ok())
        .map(|bytes| String::from_utf8_lossy(&bytes[..bytes.len().min(MAX_MESSAGE_BYTES)]).into_owned())
        .filter(|m| !m.is_empty());
    let fallback =
        annotations.get(labels::TERMINATION_MESSAGE_POLICY).is_some_and(|p| p == "FallbackToLogsOnError");
    match from_file {
        Some(message) => Some(message),
        None if fallback && status.exit_code != 0 => {
            let log = std::fs::read(&status.log_path).ok()?;
            Some(log_tail(&String::from_utf8_lossy(&log)))
        }
        None => None,
    }
}

/// A CRI log (`<time> <stream> <P|F> <text>` lines) as the container wrote it: partial lines
/// (`P`) joined to the next.
pub fn log_text(log: &str) -> String {
    let mut text = String::new();
    for line in log.lines() {
        let mut fields = line.splitn(4, ' ');
        let (_, _, tag, content) =
            (fields.next(), fields.next(), fields.next(), fields.next().unwrap_or_default());
        text.push_str(content);
        if tag != Some("P") {
            text.push('\n');
        }
    }
    text
}

/// The end of a CRI log (`<time> <stream> <P|F> <text>` lines) as the container wrote it:
/// the last [`MAX_FALLBACK_LINES`] lines, at most [`MAX_FALLBACK_BYTES`].
pub fn log_tail(log: &str) -> String {
    let text = log_text(log);
    let lines: Vec<&str> = text.lines().collect();
    let mut tail = lines[lines.len().saturating_sub(MAX_FALLBACK_LINES)..].join("\n");
    if !tail.is_empty() {
        tail.push('\n');
    }
    if tail.len() > MAX_FALLBACK_BYTES {
        let mut cut = tail.len() - MAX_FALLBACK_BYTES;
        while !tail.is_char_boundary(cut) {
            cut += 1;
        }
        tail = tail[cut..].to_string();
    }
    tail
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_tails() {
        let long: String = (0..100).map(|i| format!("2026-01-01T00:00:00Z stdout F line {i}\n")).collect();
        let want_long: String = (20..100).map(|i| format!("line {i}\n")).collect();
        // (case, log, tail)
        let cases = [
            (
                "whole lines",
                "2026-01-01T00:00:00Z stdout F hello\n2026-01-01T00:00:01Z stderr F oops\n",
                "hello\noops\n",
            ),
            ("a partial line joined", "t stdout P par\nt stdout F tial\n", "partial\n"),
            ("empty", "", ""),
            ("the last 80 lines", long.as_str(), want_long.as_str()),
        ];
        for (name, log, want) in cases {
            assert_eq!(log_tail(log), want, "{name}");
        }
        let wide: String = (0..10).map(|_| format!("t stdout F {}\n", "x".repeat(500))).collect();
        assert_eq!(log_tail(&wide).len(), MAX_FALLBACK_BYTES, "at most 2 KiB");
    }

    #[test]
    fn the_message_file_through_the_status_mounts() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("msg");
        std::fs::write(&file, "bye").unwrap();
        let log = dir.path().join("0.log");
        std::fs::write(&log, "t stderr F it broke\n").unwrap();
        let status = |exit_code, host: &std::path::Path| cri::ContainerStatus {
            exit_code,
            log_path: log.display().to_string(),
            mounts: vec![cri::Mount {
                container_path: "/dev/termination-log".into(),
                host_path: host.display().to_string(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let annotations = |policy: &str| {
            HashMap::from([
                (labels::TERMINATION_MESSAGE_PATH.to_string(), "/dev/termination-log".to_string()),
                (labels::TERMINATION_MESSAGE_POLICY.to_string(), policy.to_string()),
            ])
        };
        let empty = dir.path().join("empty");
        std::fs::write(&empty, "").unwrap();
        // (case, status, policy, expected)
        let cases = [
            ("the file", status(1, &file), "File", Some("bye")),
            ("an empty file under File", status(1, &empty), "File", None),
            ("fallback on failure", status(2, &empty), "FallbackToLogsOnError", Some("it broke\n")),
            ("no fallback on success", status(0, &empty), "FallbackToLogsOnError", None),
        ];
        for (name, status, policy, want) in cases {
            assert_eq!(termination_message(&status, &annotations(policy)).as_deref(), want, "{name}");
        }
    }
}
