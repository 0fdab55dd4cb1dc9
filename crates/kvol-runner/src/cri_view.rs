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
                        reason: s.reason,
                        message: s.message,
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
