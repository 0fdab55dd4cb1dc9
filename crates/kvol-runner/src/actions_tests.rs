use super::*;

const NOW: u64 = 10_000;

fn secs(s: u64) -> i64 {
    (s * 1_000_000_000) as i64
}

use crate::test_pods::pod;

fn sandbox(id: &str, attempt: u32, ready: bool) -> SandboxSeen {
    SandboxSeen { id: id.into(), attempt, ready, created_at: attempt as i64 }
}

/// A container seen: `name:state[:exit]@restarts`, e.g. `c:exited:1@2`.
fn c(pod: &Pod, spec: &str) -> ContainerSeen {
    let (head, restarts) = spec.split_once('@').unwrap_or((spec, "0"));
    let mut parts = head.split(':');
    let name = parts.next().unwrap();
    let state = match parts.next().unwrap() {
        "running" => State::Running,
        "exited" => State::Exited,
        "created" => State::Created,
        _ => State::Unknown,
    };
    let exit_code = parts.next().map(|e| e.parse().unwrap()).unwrap_or(0);
    let restart_count: u32 = restarts.parse().unwrap();
    let specs = pod.spec.as_ref().unwrap();
    let container =
        specs.containers.iter().chain(specs.init_containers.iter().flatten()).find(|c| c.name == name);
    ContainerSeen {
        id: format!("{name}-{restart_count}"),
        sandbox_id: "s1".into(),
        name: name.into(),
        restart_count,
        hash: container.map(labels::container_hash),
        state,
        exit_code,
        created_at: restart_count as i64,
        started_at: 0,
        finished_at: if state == State::Exited { secs(NOW) } else { 0 },
        reason: String::new(),
        message: String::new(),
        failed_probe: None,
        probed_ready: None,
        image_ref: String::new(),
    }
}

struct Case {
    name: &'static str,
    pod: Pod,
    sandboxes: Vec<SandboxSeen>,
    containers: Vec<&'static str>,
    /// Back-off already counted for these containers (times `next` was called).
    backed_off: Vec<(&'static str, u32)>,
    want: Want,
}

#[derive(Debug, Default, PartialEq)]
struct Want {
    kill_pod: bool,
    create_sandbox: Option<u32>,
    start_init: Option<&'static str>,
    start: Vec<&'static str>,
    start_created: Vec<&'static str>,
    kill: Vec<&'static str>,
    waiting: Vec<&'static str>,
    remove: Vec<&'static str>,
}

fn run(case: &Case) -> Want {
    let seen = PodSeen {
        sandboxes: case.sandboxes.clone(),
        containers: case.containers.iter().map(|s| c(&case.pod, s)).collect(),
    };
    let mut backoff = Backoff::default();
    let spec = case.pod.spec.as_ref().unwrap();
    for (name, times) in &case.backed_off {
        let container = spec
            .containers
            .iter()
            .chain(spec.init_containers.iter().flatten())
            .find(|c| c.name == *name)
            .unwrap();
        for _ in 0..*times {
            backoff.next(
                &backoff_key(&case.pod, container),
                Duration::from_secs(NOW),
                Duration::from_secs(NOW),
            );
        }
    }
    let got = compute(&case.pod, &seen, &mut backoff, Duration::from_secs(NOW + 1));
    let leak = |v: Vec<String>| {
        v.into_iter().map(|s| &*Box::leak(s.into_boxed_str())).collect::<Vec<&'static str>>()
    };
    Want {
        kill_pod: got.kill_pod,
        create_sandbox: got.create_sandbox,
        start_init: got.start_init.map(|s| &*Box::leak(s.into_boxed_str())),
        start: leak(got.start),
        start_created: leak(got.start_created),
        kill: leak(got.kill.into_iter().map(|(id, _)| id).collect()),
        waiting: leak(got.waiting.into_keys().collect()),
        remove: leak(got.remove),
    }
}

#[test]
fn compute_pod_actions_table() {
    let always = pod("Always", &[], &["a", "b"]);
    let with_init = pod("Always", &["i1", "i2"], &["a"]);
    let never = pod("Never", &[], &["a"]);
    let on_failure = pod("OnFailure", &[], &["a"]);
    let ready = || vec![sandbox("s1", 0, true)];
    let cases = vec![
        Case {
            name: "new pod: a sandbox, then every container",
            pod: always.clone(),
            sandboxes: vec![],
            containers: vec![],
            backed_off: vec![],
            want: Want { create_sandbox: Some(0), start: vec!["a", "b"], ..Want::default() },
        },
        Case {
            name: "new pod with init containers: the first init container only",
            pod: with_init.clone(),
            sandboxes: vec![],
            containers: vec![],
            backed_off: vec![],
            want: Want { create_sandbox: Some(0), start_init: Some("i1"), ..Want::default() },
        },
        Case {
            name: "all running: nothing",
            pod: always.clone(),
            sandboxes: ready(),
            containers: vec!["a:running", "b:running"],
            backed_off: vec![],
            want: Want::default(),
        },
        Case {
            name: "sandbox died: kill and remake with the next attempt",
            pod: always.clone(),
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec!["a:exited:137", "b:exited:137"],
            backed_off: vec![],
            want: Want { kill_pod: true, create_sandbox: Some(1), start: vec!["a", "b"], ..Want::default() },
        },
        Case {
            name: "Never: a dead sandbox is not remade",
            pod: never.clone(),
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec!["a:exited:0"],
            backed_off: vec![],
            want: Want { kill_pod: true, ..Want::default() },
        },
        Case {
            name: "first init done: the second",
            pod: with_init.clone(),
            sandboxes: ready(),
            containers: vec!["i1:exited:0"],
            backed_off: vec![],
            want: Want { start_init: Some("i2"), ..Want::default() },
        },
        Case {
            name: "init running: wait",
            pod: with_init.clone(),
            sandboxes: ready(),
            containers: vec!["i1:running"],
            backed_off: vec![],
            want: Want::default(),
        },
        Case {
            name: "inits done: the containers",
            pod: with_init.clone(),
            sandboxes: ready(),
            containers: vec!["i1:exited:0", "i2:exited:0"],
            backed_off: vec![],
            want: Want { start: vec!["a"], ..Want::default() },
        },
        Case {
            name: "failed init under Always: restarted (first failure: no back-off yet)",
            pod: with_init.clone(),
            sandboxes: ready(),
            containers: vec!["i1:exited:1"],
            backed_off: vec![],
            want: Want { start_init: Some("i1"), ..Want::default() },
        },
        Case {
            name: "failed init under Never: the pod is killed",
            pod: pod("Never", &["i1"], &["a"]),
            sandboxes: ready(),
            containers: vec!["i1:exited:1"],
            backed_off: vec![],
            want: Want { kill_pod: true, ..Want::default() },
        },
        Case {
            name: "crashed once: restarted at once",
            pod: always.clone(),
            sandboxes: ready(),
            containers: vec!["a:exited:1", "b:running"],
            backed_off: vec![],
            want: Want { start: vec!["a"], ..Want::default() },
        },
        Case {
            name: "crashed again within its back-off: CrashLoopBackOff",
            pod: always.clone(),
            sandboxes: ready(),
            containers: vec!["a:exited:1@1", "a:exited:1@0", "b:running"],
            backed_off: vec![("a", 1)],
            want: Want { waiting: vec!["a"], remove: vec!["a-0"], ..Want::default() },
        },
        Case {
            name: "Always restarts a container that succeeded",
            pod: always.clone(),
            sandboxes: ready(),
            containers: vec!["a:exited:0", "b:running"],
            backed_off: vec![],
            want: Want { start: vec!["a"], ..Want::default() },
        },
        Case {
            name: "OnFailure: a success stays, the pod's sandbox is stopped",
            pod: on_failure.clone(),
            sandboxes: ready(),
            containers: vec!["a:exited:0"],
            backed_off: vec![],
            want: Want { kill_pod: true, ..Want::default() },
        },
        Case {
            name: "OnFailure: a failure restarts",
            pod: on_failure.clone(),
            sandboxes: ready(),
            containers: vec!["a:exited:2"],
            backed_off: vec![],
            want: Want { start: vec!["a"], ..Want::default() },
        },
        Case {
            name: "OnFailure, all succeeded, sandbox gone: no new sandbox",
            pod: on_failure.clone(),
            sandboxes: vec![sandbox("s1", 0, false)],
            containers: vec!["a:exited:0"],
            backed_off: vec![],
            want: Want { kill_pod: true, ..Want::default() },
        },
        Case {
            name: "Never: a failure stays, sandbox stopped",
            pod: never.clone(),
            sandboxes: ready(),
            containers: vec!["a:exited:1"],
            backed_off: vec![],
            want: Want { kill_pod: true, ..Want::default() },
        },
        Case {
            name: "made but never started (the agent died between): started as it is, not made again",
            pod: always.clone(),
            sandboxes: ready(),
            containers: vec!["a:created", "b:running"],
            backed_off: vec![],
            want: Want { start_created: vec!["a-0"], ..Want::default() },
        },
        Case {
            name: "in an unknown state: killed and started again",
            pod: always.clone(),
            sandboxes: ready(),
            containers: vec!["a:unknown", "b:running"],
            backed_off: vec![],
            want: Want { start: vec!["a"], kill: vec!["a-0"], ..Want::default() },
        },
        Case {
            name: "a running container the spec no longer has is killed",
            pod: pod("Always", &[], &["a"]),
            sandboxes: ready(),
            containers: vec!["a:running", "old:running"],
            backed_off: vec![],
            want: Want { kill: vec!["old-0"], ..Want::default() },
        },
        Case {
            name: "two ready sandboxes: kill and remake",
            pod: always.clone(),
            sandboxes: vec![sandbox("s1", 0, true), sandbox("s2", 1, true)],
            containers: vec![],
            backed_off: vec![],
            want: Want { kill_pod: true, create_sandbox: Some(2), start: vec!["a", "b"], ..Want::default() },
        },
    ];
    for case in &cases {
        assert_eq!(run(case), case.want, "{}", case.name);
    }
}

#[test]
fn crash_loop_message_and_wake() {
    let pod = pod("Always", &[], &["a"]);
    let seen = PodSeen { sandboxes: vec![sandbox("s1", 0, true)], containers: vec![c(&pod, "a:exited:1@3")] };
    let mut backoff = Backoff::default();
    let key = backoff_key(&pod, &pod.spec.as_ref().unwrap().containers[0]);
    let at = Duration::from_secs(NOW);
    backoff.next(&key, at, at);
    backoff.next(&key, at, at);
    let got = compute(&pod, &seen, &mut backoff, at + Duration::from_secs(5));
    assert_eq!(
        got.waiting.get("a"),
        Some(&Waiting {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 20s restarting failed container=a pod=web_shop(u-1)".into()
        })
    );
    assert_eq!(got.wake_in, Some(Duration::from_secs(15)));
    // Once the 20 s have passed it starts, and the next wait is 40 s.
    let got = compute(&pod, &seen, &mut backoff, at + Duration::from_secs(20));
    assert_eq!(got.start, vec!["a".to_string()]);
    assert_eq!(backoff.current(&key), Duration::from_secs(40));
}

#[test]
fn a_changed_spec_restarts_the_container() {
    let pod = pod("Always", &[], &["a"]);
    let mut running = c(&pod, "a:running");
    running.hash = Some(12345);
    let seen = PodSeen { sandboxes: vec![sandbox("s1", 0, true)], containers: vec![running] };
    let got = compute(&pod, &seen, &mut Backoff::default(), Duration::from_secs(NOW));
    assert_eq!(got.kill.len(), 1);
    assert_eq!(got.start, vec!["a".to_string()]);
}

#[test]
fn a_failed_liveness_probe_restarts_unless_never() {
    // (case, policy, restarted)
    for (name, policy, restarted) in
        [("Always", "Always", true), ("OnFailure", "OnFailure", true), ("Never", "Never", false)]
    {
        let pod = pod(policy, &[], &["a"]);
        let mut running = c(&pod, "a:running");
        running.failed_probe = Some(crate::probes::Kind::Liveness);
        let seen = PodSeen { sandboxes: vec![sandbox("s1", 0, true)], containers: vec![running] };
        let got = compute(&pod, &seen, &mut Backoff::default(), Duration::from_secs(NOW));
        assert_eq!(
            got.kill,
            vec![("a-0".to_string(), "Container a failed liveness probe, will be restarted".to_string())],
            "{name}"
        );
        assert_eq!(got.start == vec!["a".to_string()], restarted, "{name}");
    }
}
