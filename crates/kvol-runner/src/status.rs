//! A pod's status as kubelet's PodStatus shows it — phase, ready, and each container's state with its reason and restart count — made from what the runtime has and what the runner decided; pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodSpec};
use serde::Serialize;

use crate::actions::{ContainerSeen, PodSeen, State, Waiting, should_start};
use crate::labels::PodIds;

/// One container's state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ContainerView {
    pub name: String,
    /// `waiting`, `running` or `terminated`.
    pub state: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub restart_count: u32,
    pub ready: bool,
    #[serde(skip_serializing_if = "String::is_empty")]
    pub container_id: String,
    /// It waits after having run (kubelet's `lastTerminationState.terminated`).
    #[serde(skip)]
    pub terminated_before: bool,
}

/// One pod's status.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PodView {
    /// `namespace/name`.
    pub pod: String,
    pub uid: String,
    pub phase: String,
    pub ready: bool,
    /// Why the pod as a whole waits (its volumes, its sandbox), when it does.
    #[serde(skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Why the pod failed as a whole (`OutOfcpu` for a pod the node rejected).
    #[serde(skip_serializing_if = "String::is_empty")]
    pub reason: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub init_containers: Vec<ContainerView>,
    pub containers: Vec<ContainerView>,
}

/// The pod's status from what the runtime has (`seen`), the containers that wait and why
/// (`waiting`: the back-off, and the runner's own failures such as `ErrImagePull`), and a
/// pod-level message.
pub fn pod_view(pod: &Pod, seen: &PodSeen, waiting: &BTreeMap<String, Waiting>, message: &str) -> PodView {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let ids = PodIds::of(pod);
    let init_containers: Vec<ContainerView> = spec
        .init_containers
        .iter()
        .flatten()
        .map(|c| container_view(&c.name, seen.latest(&c.name), waiting.get(&c.name), true, spec))
        .collect();
    let initialised = init_containers.iter().all(|c| c.state == "terminated" && c.exit_code == Some(0));
    let default_reason = if initialised { "ContainerCreating" } else { "PodInitializing" };
    let containers: Vec<ContainerView> = spec
        .containers
        .iter()
        .map(|c| {
            let mut view = container_view(&c.name, seen.latest(&c.name), waiting.get(&c.name), false, spec);
            if view.state == "waiting" && view.reason.is_empty() {
                view.reason = default_reason.into();
            }
            view
        })
        .collect();
    let phase = phase(spec, &init_containers, &containers);
    let ready = phase == "Running" && containers.iter().all(|c| c.ready);
    PodView {
        pod: ids.key(),
        uid: ids.uid.to_string(),
        phase: phase.to_string(),
        ready,
        message: message.to_string(),
        reason: String::new(),
        init_containers,
        containers,
    }
}

/// The status of a pod the node rejected (kubelet's `rejectPod`): Failed, with the reason and
/// "Pod was rejected: …"; no container runs.
pub fn rejected_view(pod: &Pod, rejection: &crate::admission::Rejection) -> PodView {
    let ids = PodIds::of(pod);
    PodView {
        pod: ids.key(),
        uid: ids.uid.to_string(),
        phase: "Failed".into(),
        ready: false,
        message: format!("Pod was rejected: {}", rejection.message),
        reason: rejection.reason.clone(),
        init_containers: Vec::new(),
        containers: Vec::new(),
    }
}

fn container_view(
    name: &str,
    seen: Option<&ContainerSeen>,
    waiting: Option<&Waiting>,
    init: bool,
    spec: &PodSpec,
) -> ContainerView {
    let mut view = ContainerView {
        name: name.to_string(),
        state: "waiting".into(),
        reason: String::new(),
        message: String::new(),
        exit_code: None,
        restart_count: seen.map(|s| s.restart_count).unwrap_or(0),
        ready: false,
        container_id: seen.map(|s| s.id.clone()).unwrap_or_default(),
        terminated_before: false,
    };
    match seen.map(|s| s.state) {
        Some(State::Running) => {
            view.state = "running".into();
            // A running regular container is ready unless its probes say otherwise.
            view.ready = !init && seen.and_then(|s| s.probed_ready).unwrap_or(true);
        }
        Some(State::Exited) => {
            let s = seen.expect("seen");
            let restarting = waiting.is_some() || (should_start(spec, seen) && !(init && s.exit_code == 0));
            if restarting {
                view.terminated_before = true;
            } else {
                view.state = "terminated".into();
                view.exit_code = Some(s.exit_code);
                view.reason = if s.reason.is_empty() {
                    if s.exit_code == 0 { "Completed".into() } else { "Error".into() }
                } else {
                    s.reason.clone()
                };
                view.message = s.message.clone();
            }
        }
        _ => {}
    }
    if view.state == "waiting"
        && let Some(w) = waiting
    {
        view.reason = w.reason.clone();
        view.message = w.message.clone();
    }
    view
}

/// Kubelet's `getPhase`.
pub fn phase(spec: &PodSpec, init: &[ContainerView], containers: &[ContainerView]) -> &'static str {
    let policy = spec.restart_policy.as_deref().unwrap_or("Always");
    let mut pending_init = 0;
    let mut failed_init = 0;
    for c in init {
        match c.state.as_str() {
            "terminated" if c.exit_code == Some(0) => {}
            "terminated" => failed_init += 1,
            "waiting" if c.terminated_before => failed_init += 1,
            _ => pending_init += 1,
        }
    }
    let (mut unknown, mut running, mut waiting, mut stopped, mut succeeded) = (0, 0, 0, 0, 0);
    for c in containers {
        match c.state.as_str() {
            "running" => running += 1,
            "terminated" => {
                stopped += 1;
                if c.exit_code == Some(0) {
                    succeeded += 1;
                }
            }
            "waiting" if c.terminated_before => stopped += 1,
            "waiting" => waiting += 1,
            _ => unknown += 1,
        }
    }
    if failed_init > 0 && policy == "Never" {
        return "Failed";
    }
    if pending_init > 0 || failed_init > 0 || waiting > 0 {
        return "Pending";
    }
    if running > 0 && unknown == 0 {
        return "Running";
    }
    if running == 0 && stopped > 0 && unknown == 0 {
        return match policy {
            "Always" => "Running",
            _ if stopped == succeeded => "Succeeded",
            "Never" => "Failed",
            _ => "Running",
        };
    }
    "Pending"
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
