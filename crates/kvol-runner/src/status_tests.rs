use serde_json::json;

use super::*;

use crate::test_pods::pod;

fn seen(specs: &[(&str, State, i32, u32)]) -> PodSeen {
    PodSeen {
        sandboxes: vec![],
        containers: specs
            .iter()
            .map(|(name, state, exit_code, restarts)| ContainerSeen {
                id: format!("{name}-{restarts}"),
                sandbox_id: "s".into(),
                name: name.to_string(),
                restart_count: *restarts,
                hash: None,
                state: *state,
                exit_code: *exit_code,
                created_at: 0,
                started_at: 0,
                finished_at: 0,
                reason: String::new(),
                message: String::new(),
                failed_probe: None,
                probed_ready: None,
                image_ref: String::new(),
            })
            .collect(),
    }
}

#[test]
fn phase_and_states() {
    use State::*;
    let crash = BTreeMap::from([(
        "a".to_string(),
        Waiting {
            reason: "CrashLoopBackOff".into(),
            message: "back-off 10s restarting failed container=a".into(),
        },
    )]);
    let none = BTreeMap::new();
    // (case, pod, seen, waiting, phase, ready, [(state, reason, restarts)] of the regular containers)
    type Row<'a> =
        (&'a str, Pod, PodSeen, &'a BTreeMap<String, Waiting>, &'a str, bool, Vec<(&'a str, &'a str, u32)>);
    let cases: Vec<Row> = vec![
        (
            "nothing yet",
            pod("Always", &[], &["a"]),
            seen(&[]),
            &none,
            "Pending",
            false,
            vec![("waiting", "ContainerCreating", 0)],
        ),
        (
            "running",
            pod("Always", &[], &["a"]),
            seen(&[("a", Running, 0, 0)]),
            &none,
            "Running",
            true,
            vec![("running", "", 0)],
        ),
        (
            "init running: PodInitializing",
            pod("Always", &["i"], &["a"]),
            seen(&[("i", Running, 0, 0)]),
            &none,
            "Pending",
            false,
            vec![("waiting", "PodInitializing", 0)],
        ),
        (
            "crash looping under Always",
            pod("Always", &[], &["a"]),
            seen(&[("a", Exited, 1, 3)]),
            &crash,
            "Running",
            false,
            vec![("waiting", "CrashLoopBackOff", 3)],
        ),
        (
            "succeeded under Never",
            pod("Never", &[], &["a"]),
            seen(&[("a", Exited, 0, 0)]),
            &none,
            "Succeeded",
            false,
            vec![("terminated", "Completed", 0)],
        ),
        (
            "failed under Never",
            pod("Never", &[], &["a"]),
            seen(&[("a", Exited, 2, 0)]),
            &none,
            "Failed",
            false,
            vec![("terminated", "Error", 0)],
        ),
        (
            "OnFailure: one succeeded, one running",
            pod("OnFailure", &[], &["a", "b"]),
            seen(&[("a", Exited, 0, 0), ("b", Running, 0, 0)]),
            &none,
            "Running",
            false,
            vec![("terminated", "Completed", 0), ("running", "", 0)],
        ),
        (
            "failed init under Never",
            pod("Never", &["i"], &["a"]),
            seen(&[("i", Exited, 1, 0)]),
            &none,
            "Failed",
            false,
            vec![("waiting", "PodInitializing", 0)],
        ),
    ];
    for (name, pod, seen, waiting, phase, ready, containers) in cases {
        let view = pod_view(&pod, &seen, waiting, "");
        assert_eq!(view.phase, phase, "{name}");
        assert_eq!(view.ready, ready, "{name}");
        let got: Vec<_> =
            view.containers.iter().map(|c| (c.state.as_str(), c.reason.as_str(), c.restart_count)).collect();
        assert_eq!(got, containers, "{name}");
    }
}

#[test]
fn serialised_as_kubelet_names_it() {
    let view =
        pod_view(&pod("Always", &[], &["a"]), &seen(&[("a", State::Running, 0, 2)]), &BTreeMap::new(), "");
    let json = serde_json::to_value(&view).unwrap();
    assert_eq!(
        json,
        json!({"pod": "shop/web", "uid": "u-1", "phase": "Running", "ready": true,
            "containers": [{"name": "a", "state": "running", "restartCount": 2, "ready": true, "containerId": "a-2"}]})
    );
}

#[test]
fn readiness_from_the_probes() {
    // (case, probed, container ready, pod ready)
    for (name, probed, ready) in
        [("no probe", None, true), ("probe passing", Some(true), true), ("probe failing", Some(false), false)]
    {
        let mut seen = seen(&[("a", State::Running, 0, 0)]);
        seen.containers[0].probed_ready = probed;
        let view = pod_view(&pod("Always", &[], &["a"]), &seen, &BTreeMap::new(), "");
        assert_eq!((view.containers[0].ready, view.ready), (ready, ready), "{name}");
        assert_eq!(view.phase, "Running", "{name}");
    }
}
