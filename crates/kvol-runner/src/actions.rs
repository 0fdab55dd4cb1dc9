//! What to do next for one pod, as kubelet's computePodActions decides it (kuberuntime_manager.go): the sandbox to make or remake, the next init container, the containers to start, restart (with the crash-loop back-off) or kill; pure.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Container, Pod, PodSpec};

use crate::backoff::{Backoff, go_duration};
use crate::labels::{self, PodIds};

/// A container's state as the runtime reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    Created,
    Running,
    Exited,
    Unknown,
}

/// A sandbox the runtime has for the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SandboxSeen {
    pub id: String,
    pub attempt: u32,
    pub ready: bool,
    /// Nanoseconds since the epoch.
    pub created_at: i64,
}

/// A container the runtime has for the pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerSeen {
    pub id: String,
    pub sandbox_id: String,
    pub name: String,
    /// From the restart-count annotation.
    pub restart_count: u32,
    /// From the hash annotation.
    pub hash: Option<u32>,
    pub state: State,
    pub exit_code: i32,
    /// Nanoseconds since the epoch (0: unknown).
    pub created_at: i64,
    pub started_at: i64,
    pub finished_at: i64,
    /// The runtime's reason for an exit (`Completed`, `Error`, `OOMKilled`).
    pub reason: String,
    pub message: String,
    /// A liveness or startup probe failed it: it is stopped (and restarted as the policy says).
    pub failed_probe: Option<crate::probes::Kind>,
    /// Its readiness as its probes say (`None`: it has no readiness or startup probe).
    pub probed_ready: Option<bool>,
    /// The image it runs, as the runtime names it (kubelet's `imageID`).
    pub image_ref: String,
}

/// What the runtime has for one pod.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodSeen {
    pub sandboxes: Vec<SandboxSeen>,
    pub containers: Vec<ContainerSeen>,
}

impl PodSeen {
    /// The newest container of that name (highest restart count, then newest).
    pub fn latest(&self, name: &str) -> Option<&ContainerSeen> {
        self.containers.iter().filter(|c| c.name == name).max_by_key(|c| (c.restart_count, c.created_at))
    }

    fn latest_sandbox(&self) -> Option<&SandboxSeen> {
        self.sandboxes.iter().max_by_key(|s| (s.created_at, s.attempt))
    }
}

/// A container that should run but waits, with kubelet's reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Waiting {
    pub reason: String,
    pub message: String,
}

/// What to do for a pod, in order: kill, make the sandbox, start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PodActions {
    /// Stop every container and sandbox of the pod first.
    pub kill_pod: bool,
    /// Make a sandbox of this attempt.
    pub create_sandbox: Option<u32>,
    /// The ready sandbox to start containers in, when none is to be made.
    pub sandbox_id: Option<String>,
    /// The init container to start next.
    pub start_init: Option<String>,
    /// The regular containers to start, in the spec's order.
    pub start: Vec<String>,
    /// Containers made but never started (an agent died between create and start) of the
    /// spec's current definition, in the ready sandbox: started as they are, not made again.
    pub start_created: Vec<String>,
    /// Containers to stop (id, why), the pod's others left alone.
    pub kill: Vec<(String, String)>,
    /// Exited containers no longer needed (older attempts; the newest exited one of each name
    /// is kept, as kubelet's garbage collector keeps one).
    pub remove: Vec<String>,
    /// Not-ready sandboxes other than the newest, to remove.
    pub remove_sandboxes: Vec<String>,
    /// Containers that should start but wait, by name.
    pub waiting: BTreeMap<String, Waiting>,
    /// When to look again at the latest (a back-off ends).
    pub wake_in: Option<Duration>,
}

fn restart_policy(spec: &PodSpec) -> &str {
    spec.restart_policy.as_deref().unwrap_or("Always")
}

/// The back-off key of a container: pod uid, name and spec hash (kubelet's `getStableKey`).
pub fn backoff_key(pod: &Pod, container: &Container) -> String {
    format!("{}_{}_{:x}", PodIds::of(pod).uid, container.name, labels::container_hash(container))
}

fn ns_to_duration(ns: i64) -> Duration {
    Duration::from_nanos(ns.max(0) as u64)
}

/// Whether a container that is not running should be started (kubelet's
/// `ShouldContainerBeRestarted`).
pub fn should_start(spec: &PodSpec, seen: Option<&ContainerSeen>) -> bool {
    match seen.map(|c| (c.state, c.exit_code)) {
        None => true,
        Some((State::Running, _)) => false,
        Some((State::Unknown | State::Created, _)) => true,
        Some((State::Exited, code)) => match restart_policy(spec) {
            "Never" => false,
            "OnFailure" => code != 0,
            _ => true,
        },
    }
}

/// Where initialisation stands (kubelet's `findNextInitContainerToRun`): the last failed init
/// container, the next to run, and whether all are done.
fn next_init<'a>(
    spec: &'a PodSpec,
    seen: &'a PodSeen,
) -> (Option<&'a ContainerSeen>, Option<&'a Container>, bool) {
    let init = spec.init_containers.as_deref().unwrap_or_default();
    if init.is_empty() {
        return (None, None, true);
    }
    if spec.containers.iter().any(|c| seen.latest(&c.name).is_some_and(|s| s.state == State::Running)) {
        return (None, None, true);
    }
    for container in init.iter().rev() {
        if let Some(status) = seen.latest(&container.name).filter(|s| init_failed(s)) {
            return (Some(status), Some(container), false);
        }
    }
    for (i, container) in init.iter().enumerate().rev() {
        match seen.latest(&container.name).map(|s| s.state) {
            None => continue,
            Some(State::Running) => return (None, None, false),
            Some(State::Exited) if i + 1 == init.len() => return (None, None, true),
            Some(State::Exited) => return (None, Some(&init[i + 1]), false),
            Some(_) => return (None, Some(container), false),
        }
    }
    (None, Some(&init[0]), false)
}

fn init_failed(status: &ContainerSeen) -> bool {
    (status.state == State::Exited && status.exit_code != 0) || status.state == State::Unknown
}

/// The pod's next actions, from its spec, what the runtime has, the back-off so far and the
/// time now (since the epoch). Starting a container that had exited counts against its
/// back-off here (kubelet's `doBackOff`), so `backoff` is updated.
pub fn compute(pod: &Pod, seen: &PodSeen, backoff: &mut Backoff, now: Duration) -> PodActions {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let mut actions = PodActions { remove: superseded(seen), ..PodActions::default() };
    let latest = seen.latest_sandbox();
    actions.remove_sandboxes = seen
        .sandboxes
        .iter()
        .filter(|s| !s.ready && Some(s.id.as_str()) != latest.map(|l| l.id.as_str()))
        .map(|s| s.id.clone())
        .collect();
    let ready_count = seen.sandboxes.iter().filter(|s| s.ready).count();
    let (create, attempt) = match latest {
        None => (true, 0),
        Some(s) if !s.ready || ready_count > 1 => (true, s.attempt + 1),
        Some(s) => {
            actions.sandbox_id = Some(s.id.clone());
            (false, s.attempt)
        }
    };
    if create {
        actions.kill_pod = latest.is_some();
        decide_new_sandbox(pod, spec, seen, attempt, backoff, now, &mut actions);
        return actions;
    }
    let (last_failed, next, done) = next_init(spec, seen);
    if !done {
        if let Some(next) = next {
            if last_failed.is_some() && restart_policy(spec) == "Never" {
                actions.kill_pod = true;
            } else {
                if let Some(unknown) = last_failed.filter(|s| s.state == State::Unknown) {
                    actions.kill.push((unknown.id.clone(), "init container in unknown state".into()));
                }
                start_if_not_backing_off(pod, next, seen, backoff, now, &mut actions, true);
            }
        }
        return actions;
    }
    decide_containers(pod, spec, seen, backoff, now, &mut actions);
    actions
}

fn decide_new_sandbox(
    pod: &Pod,
    spec: &PodSpec,
    seen: &PodSeen,
    attempt: u32,
    backoff: &mut Backoff,
    now: Duration,
    actions: &mut PodActions,
) {
    // A pod that must not restart is not given a new sandbox once it ran.
    if restart_policy(spec) == "Never" && attempt != 0 && !seen.containers.is_empty() {
        return;
    }
    let to_start: Vec<&Container> = spec
        .containers
        .iter()
        .filter(|c| {
            !(restart_policy(spec) == "OnFailure"
                && seen.latest(&c.name).is_some_and(|s| s.state == State::Exited && s.exit_code == 0))
        })
        .collect();
    if to_start.is_empty() && next_init(spec, seen).2 {
        return;
    }
    actions.create_sandbox = Some(attempt);
    if let Some(first) = spec.init_containers.iter().flatten().next() {
        start_if_not_backing_off(pod, first, seen, backoff, now, actions, true);
        return;
    }
    for container in to_start {
        start_if_not_backing_off(pod, container, seen, backoff, now, actions, false);
    }
}

fn decide_containers(
    pod: &Pod,
    spec: &PodSpec,
    seen_all: &PodSeen,
    backoff: &mut Backoff,
    now: Duration,
    actions: &mut PodActions,
) {
    let mut keep = 0;
    for container in &spec.containers {
        let status = seen_all.latest(&container.name);
        match status.map(|s| s.state) {
            Some(State::Running) if status.and_then(|s| s.failed_probe).is_some() => {
                let seen = status.expect("running");
                let kind = seen.failed_probe.expect("failed");
                actions.kill.push((seen.id.clone(), crate::probes::restart_message(&container.name, kind)));
                if restart_policy(spec) != "Never" {
                    start_if_not_backing_off(pod, container, seen_all, backoff, now, actions, false);
                }
            }
            Some(State::Running) => {
                let hash = labels::container_hash(container);
                if status.and_then(|s| s.hash).is_some_and(|h| h != hash) {
                    let id = status.map(|s| s.id.clone()).unwrap_or_default();
                    actions.kill.push((id, format!("container {} definition changed", container.name)));
                    start_if_not_backing_off(pod, container, seen_all, backoff, now, actions, false);
                } else {
                    keep += 1;
                }
            }
            Some(State::Created)
                if status.and_then(|s| s.hash) == Some(labels::container_hash(container))
                    && actions.create_sandbox.is_none() =>
            {
                actions.start_created.push(status.map(|s| s.id.clone()).unwrap_or_default());
                keep += 1;
            }
            Some(State::Created | State::Unknown) => {
                let id = status.map(|s| s.id.clone()).unwrap_or_default();
                actions.kill.push((id, format!("container {} is not running", container.name)));
                start_if_not_backing_off(pod, container, seen_all, backoff, now, actions, false);
            }
            _ if should_start(spec, status) => {
                start_if_not_backing_off(pod, container, seen_all, backoff, now, actions, false)
            }
            _ => {}
        }
    }
    // Containers of names the spec no longer has.
    let known = |name: &str| {
        spec.containers.iter().chain(spec.init_containers.iter().flatten()).any(|c| c.name == name)
    };
    for c in seen_all.containers.iter().filter(|c| c.state == State::Running && !known(&c.name)) {
        actions.kill.push((c.id.clone(), format!("container {} is not in the pod's spec", c.name)));
    }
    if keep == 0 && actions.start.is_empty() && actions.waiting.is_empty() {
        actions.kill_pod = true;
    }
}

/// Starts `container` now, or — when it exited before and its back-off has not passed —
/// records kubelet's `CrashLoopBackOff` and when to look again.
fn start_if_not_backing_off(
    pod: &Pod,
    container: &Container,
    seen: &PodSeen,
    backoff: &mut Backoff,
    now: Duration,
    actions: &mut PodActions,
    init: bool,
) {
    let key = backoff_key(pod, container);
    if let Some(previous) = seen.latest(&container.name).filter(|s| s.state == State::Exited) {
        let finished = ns_to_duration(previous.finished_at);
        if let Some(left) = backoff.waiting(&key, finished, now) {
            let message = format!(
                "back-off {} restarting failed container={} pod={}",
                go_duration(backoff.current(&key)),
                container.name,
                PodIds::of(pod).kubelet_format()
            );
            actions
                .waiting
                .insert(container.name.clone(), Waiting { reason: "CrashLoopBackOff".into(), message });
            actions.wake_in = Some(actions.wake_in.map_or(left, |w| w.min(left)));
            return;
        }
        backoff.next(&key, finished, now);
    }
    if init {
        actions.start_init = Some(container.name.clone());
    } else {
        actions.start.push(container.name.clone());
    }
}

/// Exited containers that are not the newest of their name.
fn superseded(seen: &PodSeen) -> Vec<String> {
    let mut newest_exited: BTreeMap<&str, &ContainerSeen> = BTreeMap::new();
    for c in seen.containers.iter().filter(|c| c.state == State::Exited) {
        let entry = newest_exited.entry(c.name.as_str()).or_insert(c);
        if (c.restart_count, c.created_at) > (entry.restart_count, entry.created_at) {
            *entry = c;
        }
    }
    seen.containers
        .iter()
        .filter(|c| {
            c.state == State::Exited && newest_exited.get(c.name.as_str()).is_some_and(|n| n.id != c.id)
        })
        .map(|c| c.id.clone())
        .collect()
}

#[cfg(test)]
#[path = "actions_tests.rs"]
mod tests;
