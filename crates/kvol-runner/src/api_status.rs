//! A pod's status as kubelet writes it to the API (generateAPIPodStatus): phase, the four conditions, addresses, start time, QoS class and every container's status, from the runner's view and what the runtime has; pure.

use k8s_openapi::api::core::v1::{
    ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting, ContainerStatus,
    Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;

use crate::actions::{ContainerSeen, PodSeen, State};
use crate::container::{QosClass, qos_class};
use crate::status::{ContainerView, PodView};

/// What the status is made from besides the pod, its view and what the runtime has.
#[derive(Clone, Debug)]
pub struct StatusContext<'a> {
    pub host_ip: &'a str,
    pub pod_ips: &'a [String],
    /// The runtime's name, `containerID`'s scheme (`containerd`).
    pub runtime: &'a str,
    /// When the node first took the pod (kept from the API's copy once there).
    pub start_time: Timestamp,
    pub now: Timestamp,
}

/// The pod's status; conditions whose status did not change keep their transition time from
/// the API's copy (`pod.status`).
pub fn api_pod_status(pod: &Pod, view: &PodView, seen: &PodSeen, context: &StatusContext<'_>) -> PodStatus {
    let default_spec = PodSpec::default();
    let spec = pod.spec.as_ref().unwrap_or(&default_spec);
    let previous = pod.status.as_ref();
    let start = previous.and_then(|s| s.start_time.clone()).unwrap_or(Time(context.start_time));
    let status_of =
        |views: &[ContainerView], specs: &[k8s_openapi::api::core::v1::Container]| -> Vec<ContainerStatus> {
            views.iter().map(|v| container_status(v, specs, seen, context.runtime)).collect()
        };
    let init_specs = spec.init_containers.clone().unwrap_or_default();
    let init_statuses: Vec<ContainerStatus> =
        status_of(&view.init_containers, &init_specs).into_iter().map(as_init_container).collect();
    PodStatus {
        phase: Some(view.phase.clone()),
        conditions: Some(conditions(pod, view, context.now)),
        host_ip: Some(context.host_ip.to_string()).filter(|h| !h.is_empty()),
        pod_ip: context.pod_ips.first().cloned(),
        pod_ips: Some(context.pod_ips.iter().map(|ip| PodIP { ip: ip.clone() }).collect())
            .filter(|v: &Vec<_>| !v.is_empty()),
        start_time: Some(start),
        qos_class: Some(qos_name(qos_class(spec)).to_string()),
        container_statuses: Some(status_of(&view.containers, &spec.containers)),
        init_container_statuses: Some(init_statuses).filter(|v| !v.is_empty()),
        ..Default::default()
    }
}

/// The status kubelet writes for a pod it rejected: Failed, its reason and message, the rest
/// as the API had it (the scheduler's condition, the start time).
pub fn rejected_status(pod: &Pod, view: &PodView) -> PodStatus {
    let previous = pod.status.clone().unwrap_or_default();
    PodStatus {
        phase: Some(view.phase.clone()),
        reason: Some(view.reason.clone()),
        message: Some(view.message.clone()),
        ..previous
    }
}

/// An init container's status as kubelet's prober manager leaves it (v1.26): ready once it
/// has terminated with 0, and no `started` (only regular containers have one).
fn as_init_container(status: ContainerStatus) -> ContainerStatus {
    let succeeded =
        status.state.as_ref().and_then(|s| s.terminated.as_ref()).is_some_and(|t| t.exit_code == 0);
    ContainerStatus { ready: succeeded, started: None, ..status }
}

fn qos_name(qos: QosClass) -> &'static str {
    match qos {
        QosClass::Guaranteed => "Guaranteed",
        QosClass::Burstable => "Burstable",
        QosClass::BestEffort => "BestEffort",
    }
}

/// PodScheduled, Initialized, ContainersReady and Ready, with kubelet's reasons and messages.
fn conditions(pod: &Pod, view: &PodView, now: Timestamp) -> Vec<PodCondition> {
    let unfinished: Vec<&str> = view
        .init_containers
        .iter()
        .filter(|c| !(c.state == "terminated" && c.exit_code == Some(0)))
        .map(|c| c.name.as_str())
        .collect();
    let unready: Vec<&str> = view.containers.iter().filter(|c| !c.ready).map(|c| c.name.as_str()).collect();
    let succeeded = view.phase == "Succeeded";
    let init = if unfinished.is_empty() || succeeded {
        None
    } else {
        Some((
            "ContainersNotInitialized",
            format!("containers with incomplete status: [{}]", unfinished.join(" ")),
        ))
    };
    let ready = if succeeded {
        Some(("PodCompleted", String::new()))
    } else if unready.is_empty() {
        None
    } else {
        Some(("ContainersNotReady", format!("containers with unready status: [{}]", unready.join(" "))))
    };
    let previous = pod.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let make = |kind: &str, failing: Option<(&str, String)>| {
        let status = if failing.is_none() { "True" } else { "False" };
        let kept = previous
            .iter()
            .find(|c| c.type_ == kind && c.status == status)
            .and_then(|c| c.last_transition_time.clone());
        let (reason, message) = failing
            .map(|(r, m)| (Some(r.to_string()), Some(m).filter(|m| !m.is_empty())))
            .unwrap_or((None, None));
        PodCondition {
            type_: kind.to_string(),
            status: status.to_string(),
            reason,
            message,
            last_transition_time: Some(kept.unwrap_or(Time(now))),
            last_probe_time: None,
            observed_generation: None,
        }
    };
    vec![
        make("Initialized", init),
        make("Ready", ready.clone()),
        make("ContainersReady", ready),
        make("PodScheduled", None),
    ]
}

fn time_of(nanos: i64) -> Option<Time> {
    (nanos > 0).then(|| Timestamp::from_nanosecond(i128::from(nanos)).ok().map(Time)).flatten()
}

/// One container's status: its state, the last run's end, and what runs.
fn container_status(
    view: &ContainerView,
    specs: &[k8s_openapi::api::core::v1::Container],
    seen: &PodSeen,
    runtime: &str,
) -> ContainerStatus {
    let image = specs.iter().find(|c| c.name == view.name).and_then(|c| c.image.clone()).unwrap_or_default();
    let latest = seen.latest(&view.name);
    let id = |c: &ContainerSeen| format!("{runtime}://{}", c.id);
    let terminated = |c: &ContainerSeen, reason: &str, message: &str| ContainerStateTerminated {
        exit_code: c.exit_code,
        reason: Some(reason.to_string()).filter(|r| !r.is_empty()),
        message: Some(message.to_string()).filter(|m| !m.is_empty()),
        started_at: time_of(c.started_at),
        finished_at: time_of(c.finished_at),
        container_id: Some(id(c)),
        signal: None,
    };
    let state = match view.state.as_str() {
        "running" => ContainerState {
            running: Some(ContainerStateRunning {
                started_at: latest.and_then(|c| time_of(c.started_at.max(c.created_at))),
            }),
            ..Default::default()
        },
        "terminated" => ContainerState {
            terminated: latest.map(|c| terminated(c, &view.reason, &view.message)),
            ..Default::default()
        },
        _ => ContainerState {
            waiting: Some(ContainerStateWaiting {
                reason: Some(view.reason.clone()).filter(|r| !r.is_empty()),
                message: Some(view.message.clone()).filter(|m| !m.is_empty()),
            }),
            ..Default::default()
        },
    };
    // The run before: the latest's when it waits to restart, else the one before the latest.
    let before = if view.terminated_before {
        latest
    } else {
        let restarts = latest.map(|c| c.restart_count).unwrap_or(0);
        seen.containers
            .iter()
            .filter(|c| c.name == view.name && c.restart_count < restarts && c.state == State::Exited)
            .max_by_key(|c| c.restart_count)
    };
    let last_state = before.map(|c| {
        let reason = if c.reason.is_empty() {
            if c.exit_code == 0 { "Completed" } else { "Error" }
        } else {
            &c.reason
        };
        ContainerState { terminated: Some(terminated(c, reason, &c.message)), ..Default::default() }
    });
    ContainerStatus {
        name: view.name.clone(),
        state: Some(state),
        last_state: Some(last_state.unwrap_or_default()),
        ready: view.ready,
        started: Some(view.state == "running"),
        restart_count: view.restart_count as i32,
        image,
        image_id: latest.map(|c| c.image_ref.clone()).unwrap_or_default(),
        container_id: latest.filter(|_| view.state != "waiting" || view.terminated_before).map(id),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::status::pod_view;

    fn seen(name: &str, state: State, restart_count: u32, exit_code: i32) -> ContainerSeen {
        ContainerSeen {
            id: format!("{name}{restart_count}"),
            sandbox_id: "s".into(),
            name: name.into(),
            restart_count,
            hash: None,
            state,
            exit_code,
            created_at: 1_700_000_000_000_000_000 + i64::from(restart_count),
            started_at: 1_700_000_000_000_000_000,
            finished_at: if state == State::Exited { 1_700_000_010_000_000_000 } else { 0 },
            reason: String::new(),
            message: String::new(),
            failed_probe: None,
            probed_ready: None,
            image_ref: "sha256:abc".into(),
        }
    }

    #[test]
    fn a_running_pod_and_a_restarted_container_as_kubelet_writes_them() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u"},
            "spec": {"containers": [{"name": "app", "image": "busybox:1", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                                    {"name": "side", "image": "busybox:1", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}]},
            "status": {"conditions": [{"type": "PodScheduled", "status": "True", "lastTransitionTime": "2026-01-01T00:00:00Z"}]}}))
        .unwrap();
        let seen = PodSeen {
            sandboxes: vec![],
            containers: vec![
                seen("app", State::Running, 0, 0),
                seen("side", State::Exited, 0, 1),
                seen("side", State::Running, 1, 0),
            ],
        };
        let view = pod_view(&pod, &seen, &Default::default(), "");
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let ips = vec!["10.88.0.4".to_string()];
        let context = StatusContext {
            host_ip: "192.0.2.1",
            pod_ips: &ips,
            runtime: "containerd",
            start_time: now,
            now,
        };
        let status = api_pod_status(&pod, &view, &seen, &context);
        assert_eq!(status.phase.as_deref(), Some("Running"));
        assert_eq!(status.qos_class.as_deref(), Some("Guaranteed"));
        assert_eq!(status.pod_ips.as_ref().unwrap()[0].ip, "10.88.0.4");
        let conditions: Vec<(String, String)> =
            status.conditions.clone().unwrap().into_iter().map(|c| (c.type_, c.status)).collect();
        assert_eq!(
            conditions,
            [
                ("Initialized", "True"),
                ("Ready", "True"),
                ("ContainersReady", "True"),
                ("PodScheduled", "True")
            ]
            .map(|(a, b)| (a.to_string(), b.to_string()))
        );
        let scheduled = status.conditions.unwrap().into_iter().find(|c| c.type_ == "PodScheduled").unwrap();
        assert_eq!(
            scheduled.last_transition_time.unwrap().0.to_string(),
            "2026-01-01T00:00:00Z",
            "an unchanged condition keeps its time"
        );
        let side = &status.container_statuses.unwrap()[1];
        assert_eq!(
            (side.restart_count, side.ready, side.container_id.as_deref()),
            (1, true, Some("containerd://side1"))
        );
        let last = side.last_state.as_ref().unwrap().terminated.as_ref().unwrap();
        assert_eq!(
            (last.exit_code, last.reason.as_deref(), last.container_id.as_deref()),
            (1, Some("Error"), Some("containerd://side0"))
        );
        assert_eq!(side.image_id, "sha256:abc");
    }

    #[test]
    fn a_waiting_pod_says_why() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u"},
            "spec": {"initContainers": [{"name": "setup", "image": "i"}], "containers": [{"name": "app", "image": "i"}]}}))
        .unwrap();
        let view = pod_view(&pod, &PodSeen::default(), &Default::default(), "waiting for its volumes");
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let context =
            StatusContext { host_ip: "192.0.2.1", pod_ips: &[], runtime: "containerd", start_time: now, now };
        let status = api_pod_status(&pod, &view, &PodSeen::default(), &context);
        assert_eq!(status.phase.as_deref(), Some("Pending"));
        assert_eq!(status.qos_class.as_deref(), Some("BestEffort"));
        let init = status.conditions.unwrap().into_iter().find(|c| c.type_ == "Initialized").unwrap();
        assert_eq!(
            (init.status.as_str(), init.message.as_deref()),
            ("False", Some("containers with incomplete status: [setup]"))
        );
        let app = &status.container_statuses.unwrap()[0];
        assert_eq!(
            app.state.as_ref().unwrap().waiting.as_ref().unwrap().reason.as_deref(),
            Some("PodInitializing")
        );
        assert_eq!(app.container_id, None);
        let setup = &status.init_container_statuses.unwrap()[0];
        assert_eq!((setup.ready, setup.started), (false, None), "an init container has no started");
    }

    #[test]
    fn an_init_container_that_succeeded_is_ready() {
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "web", "namespace": "shop", "uid": "u"},
            "spec": {"initContainers": [{"name": "setup", "image": "i"}], "containers": [{"name": "app", "image": "i"}]}}))
        .unwrap();
        let seen = PodSeen { sandboxes: vec![], containers: vec![seen("setup", State::Exited, 0, 0)] };
        let view = pod_view(&pod, &seen, &Default::default(), "");
        let now = Timestamp::from_second(1_800_000_000).unwrap();
        let context =
            StatusContext { host_ip: "192.0.2.1", pod_ips: &[], runtime: "containerd", start_time: now, now };
        let status = api_pod_status(&pod, &view, &seen, &context);
        let setup = &status.init_container_statuses.unwrap()[0];
        assert_eq!((setup.ready, setup.started), (true, None));
        assert_eq!(setup.state.as_ref().unwrap().terminated.as_ref().unwrap().exit_code, 0);
    }
}
