//! The runtime API of the real `kvol agent` under a runner that misbehaves: a wait given up mid-way, a pod handed twice, a pod taken back while its volumes are still being published, a container asked for before its volumes are; and the stream of changes. Real mounts, no container runtime needed.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use kvol_runtime_api::proto::pod_volumes_client::PodVolumesClient;
use kvol_runtime_api::proto::{
    AdmitPodRequest, ContainerMountsRequest, ReleasePodRequest, WaitRequest, WatchRequest,
};
use support::{Node, enter_private_mount_namespace};
use tonic::transport::Channel;

const CONFIG: &str =
    "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: app, namespace: default}\ndata: {a: \"1\"}\n";

fn pod(name: &str, uid: &str, config_map: &str) -> Vec<u8> {
    format!(
        r#"{{"apiVersion": "v1", "kind": "Pod", "metadata": {{"name": "{name}", "namespace": "default", "uid": "{uid}"}},
          "spec": {{"containers": [{{"name": "c", "volumeMounts": [
              {{"name": "scratch", "mountPath": "/s", "subPath": "deep/er"}}, {{"name": "cfg", "mountPath": "/cfg"}}]}}],
            "volumes": [{{"name": "scratch", "emptyDir": {{"medium": "Memory"}}}},
                        {{"name": "cfg", "configMap": {{"name": "{config_map}"}}}}]}}}}"#
    )
    .into_bytes()
}

/// A client of the node's agent, waiting for it as long as a runner would (the agent may be
/// starting, or restarting over the socket a killed one left).
async fn connect(node: &Node) -> Result<PodVolumesClient<Channel>, kvol_runtime_api::ConnectError> {
    let socket = node.root.join(kvol_runtime_api::SOCKET_NAME);
    kvol_runtime_api::connect_within(&socket, Duration::from_secs(30), || {}).await
}

fn started() -> (Node, tokio::runtime::Runtime, PodVolumesClient<Channel>) {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("config.yaml", CONFIG);
    node.start();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let api = runtime.block_on(connect(&node)).unwrap();
    (node, runtime, api)
}

#[test]
fn a_misbehaving_runner_gets_clear_errors_and_leaks_nothing() {
    let (node, runtime, mut api) = started();
    let wait = |api: &mut PodVolumesClient<Channel>, uid: &str, ms: u32, gone: bool| {
        let request = WaitRequest { pod_uid: uid.to_string(), timeout_ms: ms };
        let answer = if gone {
            runtime.block_on(api.wait_for_volumes_gone(request))
        } else {
            runtime.block_on(api.wait_for_volumes(request))
        };
        answer.map(|r| r.into_inner())
    };

    // An unknown pod: NOT_FOUND once the wait is over.
    let unknown = wait(&mut api, "no-such-uid", 100, false).unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown:?}");

    // A pod whose ConfigMap does not exist: not ready, with kubelet's sentence and each reason.
    let stuck = "00000000-0000-4000-8000-000000000001";
    let admitted =
        runtime.block_on(api.admit_pod(AdmitPodRequest { pod_json: pod("stuck", stuck, "missing") }));
    assert_eq!(admitted.unwrap().into_inner().pod_uid, stuck);
    let answer = wait(&mut api, stuck, 1500, false).unwrap();
    assert!(!answer.ready, "{answer:#?}");
    assert!(
        answer.message.starts_with(
            "unmounted volumes=[cfg]: cfg: volume \"cfg\": configmap default/missing does not exist"
        ),
        "{}",
        answer.message
    );
    let cfg = answer.volumes.iter().find(|v| v.name == "cfg").unwrap();
    assert_eq!(cfg.phase, "pending");
    // Its container cannot be asked for yet.
    let early = runtime
        .block_on(
            api.container_mounts(ContainerMountsRequest { pod_uid: stuck.into(), container: "c".into() }),
        )
        .unwrap_err();
    assert_eq!(early.code(), tonic::Code::FailedPrecondition, "{early:?}");
    assert!(
        early.message().contains("volumeMount \"cfg\" at \"/cfg\": the volume is not published"),
        "{early:?}"
    );

    // A runner that gives up mid-wait: the agent goes on answering.
    let mut quick = api.clone();
    let gave_up = runtime.block_on(async {
        tokio::time::timeout(
            Duration::from_millis(200),
            quick.wait_for_volumes(WaitRequest { pod_uid: stuck.into(), timeout_ms: 30_000 }),
        )
        .await
    });
    assert!(gave_up.is_err(), "the runner gave up first");

    // The same pod handed twice, or another pod under the same name: refused.
    let twice = runtime
        .block_on(api.admit_pod(AdmitPodRequest { pod_json: pod("stuck", stuck, "missing") }))
        .unwrap_err();
    assert_eq!(twice.code(), tonic::Code::AlreadyExists);
    let renamed = pod("stuck", "00000000-0000-4000-8000-000000000009", "missing");
    let clash = runtime.block_on(api.admit_pod(AdmitPodRequest { pod_json: renamed })).unwrap_err();
    assert_eq!(clash.code(), tonic::Code::AlreadyExists);
    let bad = runtime
        .block_on(api.admit_pod(AdmitPodRequest { pod_json: b"{\"kind\": \"Pod\"}".to_vec() }))
        .unwrap_err();
    assert_eq!(bad.code(), tonic::Code::InvalidArgument, "{bad:?}");

    // A pod taken back while its volumes are still being published: torn down, nothing left.
    let hasty = "00000000-0000-4000-8000-000000000002";
    runtime.block_on(api.admit_pod(AdmitPodRequest { pod_json: pod("hasty", hasty, "app") })).unwrap();
    runtime.block_on(api.release_pod(ReleasePodRequest { pod_uid: hasty.into() })).unwrap();
    let gone = wait(&mut api, hasty, 30_000, true).unwrap();
    assert!(gone.ready, "{gone:#?}\n{}", node.agent_log());

    // A pod that runs: its subPath bound, then released; the bind goes with the volume.
    let good = "00000000-0000-4000-8000-000000000003";
    let mut changes =
        runtime.block_on(api.watch_volumes(WatchRequest { pod_uid: good.into() })).unwrap().into_inner();
    runtime.block_on(api.admit_pod(AdmitPodRequest { pod_json: pod("good", good, "app") })).unwrap();
    let ready = wait(&mut api, good, 30_000, false).unwrap();
    assert!(ready.ready, "{ready:#?}\n{}", node.agent_log());
    let mounts = runtime
        .block_on(
            api.container_mounts(ContainerMountsRequest { pod_uid: good.into(), container: "c".into() }),
        )
        .unwrap()
        .into_inner();
    let sub = &mounts.mounts[0];
    assert_eq!(sub.sub_path, "deep/er");
    let bound = std::path::Path::new(&sub.host_path);
    assert!(node.mounts().iter().any(|m| m.target == bound), "{} is a mount", bound.display());
    let scratch = ready.volumes.iter().find(|v| v.name == "scratch").unwrap();
    assert!(std::path::Path::new(&scratch.host_path).join("deep/er").is_dir(), "the sub-path was made");
    // The same call again binds nothing more.
    runtime
        .block_on(
            api.container_mounts(ContainerMountsRequest { pod_uid: good.into(), container: "c".into() }),
        )
        .unwrap();
    assert_eq!(node.mounts().iter().filter(|m| m.target == bound).count(), 1);
    runtime.block_on(api.release_pod(ReleasePodRequest { pod_uid: good.into() })).unwrap();
    let gone = wait(&mut api, good, 30_000, true).unwrap();
    assert!(gone.ready, "{gone:#?}\n{}", node.agent_log());
    // The stream told each step: not ready, ready, gone.
    let seen: Vec<(bool, usize)> = runtime.block_on(async {
        let mut seen = Vec::new();
        while let Ok(Some(Ok(change))) =
            tokio::time::timeout(Duration::from_millis(500), changes.message()).await.map(|r| r.transpose())
        {
            seen.push((change.ready, change.volumes.len()));
        }
        seen
    });
    assert!(seen.contains(&(true, 2)), "{seen:?}");
    assert_eq!(seen.last(), Some(&(false, 0)), "the last change: the pod gone: {seen:?}");

    // Nothing of any of them is left mounted.
    runtime.block_on(api.release_pod(ReleasePodRequest { pod_uid: stuck.into() })).unwrap();
    assert!(wait(&mut api, stuck, 30_000, true).unwrap().ready);
    let left: Vec<_> =
        node.mounts().into_iter().filter(|m| m.target.starts_with(node.root.join("kubelet/pods"))).collect();
    assert!(left.is_empty(), "{left:#?}");
}

#[test]
fn a_runners_pod_outlives_an_agent_killed_with_9_and_its_subpath_binds_go_with_it() {
    let (mut node, runtime, mut api) = started();
    let uid = "00000000-0000-4000-8000-000000000004";
    runtime.block_on(api.admit_pod(AdmitPodRequest { pod_json: pod("kept", uid, "app") })).unwrap();
    let wait = WaitRequest { pod_uid: uid.into(), timeout_ms: 30_000 };
    assert!(runtime.block_on(api.wait_for_volumes(wait.clone())).unwrap().into_inner().ready);
    let mounts = runtime
        .block_on(api.container_mounts(ContainerMountsRequest { pod_uid: uid.into(), container: "c".into() }))
        .unwrap()
        .into_inner();
    let bound = std::path::PathBuf::from(&mounts.mounts[0].host_path);
    std::fs::write(bound.join("kept"), "through the bind").unwrap();

    node.kill_9();
    node.start();
    // The killed agent's socket is still there, and nothing listens on it until the new one
    // binds: the client waits for the agent, as a runner started beside it must.
    let mut api = runtime.block_on(connect(&node)).unwrap();
    // The restarted agent has the pod from its first pass: nothing was torn down.
    let again = runtime.block_on(api.wait_for_volumes(wait.clone())).unwrap().into_inner();
    assert!(again.ready, "{again:#?}\n{}", node.agent_log());
    assert_eq!(std::fs::read_to_string(bound.join("kept")).unwrap(), "through the bind");
    assert!(!node.agent_log().contains("volume_unmount"), "nothing unpublished:\n{}", node.agent_log());

    runtime.block_on(api.release_pod(ReleasePodRequest { pod_uid: uid.into() })).unwrap();
    let gone = runtime.block_on(api.wait_for_volumes_gone(wait)).unwrap().into_inner();
    assert!(gone.ready, "{gone:#?}");
    let left: Vec<_> =
        node.mounts().into_iter().filter(|m| m.target.starts_with(node.root.join("kubelet/pods"))).collect();
    assert!(left.is_empty(), "{left:#?}");
    assert!(!bound.exists(), "the bind's mount point is removed");
}

fn kvol_pod(node: &Node, args: &[&str]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_kvol"));
    command.arg("pod").args(args).arg("--root").arg(&node.root);
    command
}

#[test]
fn a_wait_started_before_the_agent_waits_for_it_within_its_timeout_and_says_so() {
    enter_private_mount_namespace();
    let mut node = Node::new();
    node.write("config.yaml", CONFIG);
    let uid = "00000000-0000-4000-8000-000000000009";
    node.write("pod.json", std::str::from_utf8(&pod("early", uid, "app")).unwrap());

    // No agent, a short deadline: the wait waits out its timeout, then says plainly that no
    // agent answers where it looked and how to point it elsewhere.
    let start = Instant::now();
    let alone = kvol_pod(&node, &["wait", uid, "--timeout", "1"]).output().unwrap();
    let said = String::from_utf8_lossy(&alone.stderr);
    assert!(!alone.status.success(), "{said}");
    assert!(start.elapsed() >= Duration::from_millis(900), "gave up after {:?}", start.elapsed());
    assert!(said.contains("waiting for the kvol agent's runtime api at"), "{said}");
    assert!(said.contains("no kvol agent answers at") && said.contains("--state-dir"), "{said}");
    // The other commands do not wait: they say the same at once.
    let mounts = kvol_pod(&node, &["mounts", uid, "c"]).output().unwrap();
    let said = String::from_utf8_lossy(&mounts.stderr);
    assert!(!mounts.status.success() && said.contains("no kvol agent answers at"), "{said}");
    assert!(said.contains(&node.root.join("runtime.sock").display().to_string()), "{said}");

    // Started first (a unit beside the agent's), the wait is answered once the agent is up.
    let wait = kvol_pod(&node, &["wait", uid, "--timeout", "60"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    node.start();
    let out = wait.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}\n{}", node.agent_log());
    assert!(stderr.contains("waiting for the kvol agent's runtime api at"), "{stderr}");
    let answer: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(answer["ready"], true, "{answer:#}");
    node.remove("pod.json");
    let gone = kvol_pod(&node, &["wait", uid, "--gone", "--timeout", "30"]).output().unwrap();
    assert!(gone.status.success(), "{}", String::from_utf8_lossy(&gone.stderr));
}
