//! A kvol node in a real cluster: `kvol agent --kubeconfig --container-runtime-endpoint` on a private containerd registers its Node (Ready, its Lease renewed), runs a pod the API binds to it and writes the pod's status as kubelet does (Running, Ready, container statuses), rejects pods as kubelet's admission does (resources, node affinity, a NoExecute taint of its Node not tolerated), and, when the pod is deleted, stops its containers, lets its volumes go and deletes the object with grace 0; a node whose Lease a kubelet renews is refused with a non-zero exit; with kube-controller-manager's node lifecycle controller, the node stays Ready while kvol runs and turns Unknown once it is stopped.
//!
//! Needs root, `KVOL_KUBE_APISERVER` and `KVOL_ETCD`, and containerd, runc and a static busybox
//! (skipped, saying so, without them); the node lifecycle part also `KVOL_KUBE_CONTROLLER_MANAGER`.

#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod cluster;
#[allow(dead_code)]
mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams};
use serde_json::json;
use support::cluster_node::{Process, agent, kubelet_client_pki, ready_condition, until};
use support::containerd::{Containerd, IMAGE, tools};

const NODE: &str = "kvol-node";

#[test]
fn a_kvol_node_joins_runs_a_pod_writes_its_status_and_deletes_it() {
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let Some((apiserver, etcd)) = cluster::binaries() else { return };
    support::enter_private_mount_namespace();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let pki = kvol_test_support::ScratchRoot::new();
    kubelet_client_pki(pki.path());
    let kubelet_client = [
        format!("--kubelet-client-certificate={}", pki.path().join("client.crt").display()),
        format!("--kubelet-client-key={}", pki.path().join("client.key").display()),
        "--kubelet-preferred-address-types=InternalIP".to_string(),
    ];
    let server = cluster::ApiServer::start_with(&apiserver, &etcd, kubelet_client.to_vec());
    let client = runtime.block_on(server.client());
    let containerd = Containerd::with_image(&busybox);
    let scratch = kvol_test_support::ScratchRoot::new();
    let (root, log) = (scratch.path().join("node"), scratch.path().join("agent.log"));
    std::fs::create_dir_all(scratch.path().join("pki")).unwrap();
    std::fs::copy(pki.path().join("ca.crt"), scratch.path().join("pki/ca.crt")).unwrap();
    let start = Instant::now();
    let manifests = scratch.path().join("manifests");
    std::fs::create_dir_all(&manifests).unwrap();
    let mut command = agent(NODE, &server.kubeconfig, &root, &containerd.endpoint(), &log);
    let mut kvol = Process(command.arg("--manifests").arg(&manifests).spawn().unwrap());
    runtime.block_on(async {
        let nodes: Api<Node> = Api::all(client.clone());
        let ready = until("the node registered and Ready", Duration::from_secs(30), &log, async || {
            let node = nodes.get_opt(NODE).await.ok().flatten()?;
            (ready_condition(&node)?.0 == "True").then_some(node)
        })
        .await;
        eprintln!("node {NODE} Ready {} ms after the agent started", start.elapsed().as_millis());
        let info = ready.status.unwrap().node_info.unwrap();
        assert!(info.container_runtime_version.starts_with("containerd://"), "{info:?}");
        assert!(info.kubelet_version.starts_with("v1.26.0-kvol."), "{info:?}");
        let lease = Api::<Lease>::namespaced(client.clone(), "kube-node-lease").get(NODE).await.unwrap();
        assert_eq!(lease.spec.unwrap().holder_identity.as_deref(), Some(NODE));
        run_and_delete_a_pod(&client, &log).await;
        rejected_pods(&client, &log).await;
        taints_judged(&client, &log).await;
        a_crash_loop(&client, &log).await;
        a_static_pod_and_its_mirror(&client, &manifests, &log).await;
        refuse_a_kubelets_node(&client, &server.kubeconfig, &root, &containerd.endpoint(), &log).await;
    });
    node_lifecycle(&runtime, &client, &server.kubeconfig, scratch.path(), &mut kvol, &log);
    drop(kvol);
    assert_eq!(containerd.containers(), Vec::<String>::new(), "containers left in containerd");
}

/// A pod bound to the node: Running and Ready in the API, as kubelet writes it; deleted → its
/// containers stopped, its volumes gone and its object deleted by the node.
async fn run_and_delete_a_pod(client: &kube::Client, log: &Path) {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let config = json!({"metadata": {"name": "app"}, "data": {"greeting": "hello from the api"}});
    config_maps.create(&Default::default(), &serde_json::from_value(config).unwrap()).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = json!({"metadata": {"name": "web", "labels": {"app": "web"}}, "spec": {
        "nodeName": NODE, "hostNetwork": true, "terminationGracePeriodSeconds": 5,
        "containers": [{"name": "main", "image": IMAGE,
            "command": ["sh", "-c", "trap 'exit 0' TERM; echo \"$(cat /cfg/greeting)\"; httpd -p 127.0.0.1:18080 -h /cfg; while true; do sleep 1; done"],
            "readinessProbe": {"exec": {"command": ["cat", "/cfg/greeting"]}, "periodSeconds": 1},
            "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}, {"name": "scratch", "mountPath": "/scratch"},
                             {"name": "info", "mountPath": "/info"}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "app"}}, {"name": "scratch", "emptyDir": {}},
                    {"name": "info", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}}]}});
    let created = Instant::now();
    let uid = cluster::create(&pods, pod).await.metadata.uid.unwrap();
    let running = until("the pod Running and Ready in the api", Duration::from_secs(60), log, async || {
        let pod = pods.get("web").await.ok()?;
        let status = pod.status.clone()?;
        let ready = status.conditions.as_ref()?.iter().any(|c| c.type_ == "Ready" && c.status == "True");
        (status.phase.as_deref() == Some("Running") && ready).then_some(status)
    })
    .await;
    eprintln!("pod created → Running and Ready in the api in {} ms", created.elapsed().as_millis());
    let container = &running.container_statuses.as_ref().unwrap()[0];
    assert!(container.ready && container.started == Some(true), "{container:?}");
    assert!(
        container.container_id.as_deref().is_some_and(|id| id.starts_with("containerd://")),
        "{container:?}"
    );
    assert!(container.state.as_ref().unwrap().running.is_some(), "{container:?}");
    assert_eq!(
        (running.qos_class.as_deref(), running.host_ip.is_some(), running.start_time.is_some()),
        (Some("BestEffort"), true, true)
    );
    let conditions: Vec<&str> =
        running.conditions.as_ref().unwrap().iter().map(|c| c.type_.as_str()).collect();
    for kind in ["PodScheduled", "Initialized", "ContainersReady", "Ready"] {
        assert!(conditions.contains(&kind), "{kind} in {conditions:?}");
    }

    // `kubectl logs`: the API server asks the node's kubelet API, with its client certificate.
    let said = until("the log through the api server", Duration::from_secs(10), log, async || {
        let said = pods.logs("web", &Default::default()).await.expect("the log through the api server");
        (!said.is_empty()).then_some(said)
    })
    .await;
    assert_eq!(said, "hello from the api\n");
    let tail = kube::api::LogParams { tail_lines: Some(1), timestamps: true, ..Default::default() };
    let said = pods.logs("web", &tail).await.unwrap();
    assert!(said.ends_with(" hello from the api\n") && said.len() > 30, "with its time: {said:?}");

    // `kubectl exec`: through the API server to the node, spliced to the runtime's session.
    let params = kube::api::AttachParams::default().stderr(false);
    let mut attached = pods
        .exec("web", ["sh", "-c", "echo exec: $(cat /cfg/greeting)"], &params)
        .await
        .expect("exec through the api server");
    let mut said = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut attached.stdout().expect("its stdout"), &mut said)
        .await
        .unwrap();
    attached.join().await.unwrap();
    assert_eq!(said, "exec: hello from the api\n");

    // `kubectl port-forward`: a connection through the API server to the pod's port.
    let mut forwarder = pods.portforward("web", &[18080]).await.expect("port-forward through the api server");
    let mut stream = forwarder.take_stream(18080).expect("the port's stream");
    tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET /greeting HTTP/1.0\r\n\r\n").await.unwrap();
    let mut answer = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut stream, &mut answer).await.unwrap();
    drop(stream);
    let _ = forwarder.join().await;
    assert!(answer.starts_with("HTTP/1.") && answer.ends_with("hello from the api"), "{answer}");

    kubelet_api_callers(client).await;

    // Deleted: the node stops it, lets its volumes go, then deletes the object itself.
    let deleting = Instant::now();
    pods.delete("web", &DeleteParams { grace_period_seconds: Some(5), ..Default::default() }).await.unwrap();
    until("the pod object gone", Duration::from_secs(60), log, async || {
        pods.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    eprintln!(
        "pod {uid} deleted → stopped, volumes gone, object deleted in {} ms",
        deleting.elapsed().as_millis()
    );
    // The agent logs the delete once the API answered it, a moment after the pod is gone.
    until("the agent's word of the delete", Duration::from_secs(5), log, async || {
        let agent_log = std::fs::read_to_string(log).unwrap_or_default();
        agent_log.contains("pod deleted: its containers stopped and its volumes let go").then_some(())
    })
    .await;

    // kubelet's Events about it, in the order they happened.
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let mut about: Vec<_> = events
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid.as_str()))
        .collect();
    about.sort_by_key(|e| e.first_timestamp.clone().map(|t| t.0));
    let said: Vec<(String, String)> = about
        .iter()
        .map(|e| (e.reason.clone().unwrap_or_default(), e.message.clone().unwrap_or_default()))
        .collect();
    eprintln!("events: {said:#?}");
    let reasons: Vec<&str> = said.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(reasons, ["Pulled", "Created", "Started", "Killing"], "{said:#?}");
    assert_eq!(said[1].1, "Created container main");
    assert_eq!(said[3].1, "Stopping container main");
}

/// Pods the node does not take, as kubelet rejects them: Failed with the reason and "Pod was
/// rejected: …" in the API, an Event, and no container started.
async fn rejected_pods(client: &kube::Client, log: &Path) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let container = |resources: serde_json::Value| json!([{"name": "main", "image": IMAGE, "command": ["sleep", "100000"], "resources": resources}]);
    let greedy = json!({"metadata": {"name": "greedy"}, "spec": {"nodeName": NODE, "hostNetwork": true,
        "containers": container(json!({"requests": {"cpu": "100000"}}))}});
    let elsewhere = json!({"metadata": {"name": "elsewhere"}, "spec": {"nodeName": NODE, "hostNetwork": true,
        "nodeSelector": {"disk": "none-here"}, "containers": container(json!({}))}});
    for pod in [greedy, elsewhere] {
        pods.create(&Default::default(), &serde_json::from_value(pod).unwrap()).await.unwrap();
    }
    // (pod, reason, message start)
    let table = [
        (
            "greedy",
            "OutOfcpu",
            "Pod was rejected: Node didn't have enough resource: cpu, requested: 100000000, used: 0, capacity: ",
        ),
        ("elsewhere", "NodeAffinity", "Pod was rejected: Predicate NodeAffinity failed"),
    ];
    for (name, reason, message) in table {
        let status = until(&format!("{name} rejected"), Duration::from_secs(30), log, async || {
            let status = pods.get(name).await.ok()?.status?;
            (status.phase.as_deref() == Some("Failed")).then_some(status)
        })
        .await;
        assert_eq!(status.reason.as_deref(), Some(reason), "{name}: {status:?}");
        assert!(status.message.as_deref().is_some_and(|m| m.starts_with(message)), "{name}: {status:?}");
        assert!(status.container_statuses.unwrap_or_default().iter().all(|c| c.container_id.is_none()));
        pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await
            .unwrap();
    }
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let listed = events.list(&Default::default()).await.unwrap().items;
    assert!(
        listed.iter().any(|e| e.reason.as_deref() == Some("OutOfcpu")
            && e.involved_object.name.as_deref() == Some("greedy")),
        "kubelet's Event of the rejection"
    );
}

/// The Node tainted NoExecute and NoSchedule (kubelet's admission judges only NoExecute): a
/// pod not tolerating the NoExecute taint is rejected as kubelet rejects it (TaintToleration),
/// one tolerating it runs though it does not tolerate the NoSchedule one.
async fn taints_judged(client: &kube::Client, log: &Path) {
    let nodes: Api<Node> = Api::all(client.clone());
    let taints = json!({"spec": {"taints": [{"key": "kvol.test/hard", "value": "yes", "effect": "NoExecute"},
        {"key": "kvol.test/soft", "value": "yes", "effect": "NoSchedule"}]}});
    nodes.patch(NODE, &PatchParams::default(), &Patch::Merge(taints)).await.unwrap();
    until("the runner told of the taints", Duration::from_secs(10), log, async || {
        std::fs::read_to_string(log).ok()?.contains("kvol.test/hard").then_some(())
    })
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = |name: &str, tolerations: serde_json::Value| {
        json!({"metadata": {"name": name}, "spec": {"nodeName": NODE, "hostNetwork": true,
            "terminationGracePeriodSeconds": 1, "tolerations": tolerations,
            "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}]}})
    };
    let hard = json!([{"key": "kvol.test/hard", "operator": "Exists", "effect": "NoExecute"}]);
    // (pod, its tolerations, the phase, the reason, the message)
    let table = [
        (
            "intolerant",
            json!([]),
            "Failed",
            Some("TaintToleration"),
            Some("Pod was rejected: Predicate TaintToleration failed"),
        ),
        ("tolerant", hard, "Running", None, None),
    ];
    for (name, tolerations, _, _, _) in &table {
        pods.create(&Default::default(), &serde_json::from_value(pod(name, tolerations.clone())).unwrap())
            .await
            .unwrap();
    }
    for (name, _, phase, reason, message) in table {
        let status = until(&format!("{name} {phase}"), Duration::from_secs(30), log, async || {
            let status = pods.get(name).await.ok()?.status?;
            (status.phase.as_deref() == Some(phase)).then_some(status)
        })
        .await;
        assert_eq!(
            (status.reason.as_deref(), status.message.as_deref()),
            (reason, message),
            "{name}: {status:?}"
        );
        pods.delete(name, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
            .await
            .unwrap();
    }
    nodes
        .patch(NODE, &PatchParams::default(), &Patch::Merge(json!({"spec": {"taints": null}})))
        .await
        .unwrap();
}

/// A static pod from the manifests directory: run as `<name>-<node>`, shown in the API by a
/// mirror pod owned by the Node and carrying its status; a deleted mirror made again while the
/// static pod runs on untouched; the manifest removed → the pod stopped and its mirror gone.
async fn a_static_pod_and_its_mirror(client: &kube::Client, manifests: &Path, log: &Path) {
    let uid = "5eed0000-0000-4000-8000-0000000057a7";
    let manifest = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: static-web, namespace: default, uid: {uid}}}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n  containers:\n  - {{name: main, image: '{IMAGE}', command: [sleep, '100000']}}\n"
    );
    std::fs::write(manifests.join("static-web.yaml"), manifest).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let name = format!("static-web-{NODE}");
    let running = |mirror_uid: Option<String>| {
        let (pods, name) = (pods.clone(), name.clone());
        async move {
            let pod = pods.get_opt(&name).await.ok()??;
            let fresh = mirror_uid.is_none_or(|old| pod.metadata.uid.as_deref() != Some(old.as_str()));
            let status = pod.status.clone()?;
            let container = status.container_statuses.clone()?.into_iter().next()?;
            (fresh && status.phase.as_deref() == Some("Running") && container.ready)
                .then_some((pod, container))
        }
    };
    let (mirror, container) =
        until("the mirror pod running", Duration::from_secs(60), log, async || running(None).await).await;
    let annotations = mirror.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(
        annotations.get("kubernetes.io/config.mirror").map(String::as_str),
        Some(uid),
        "{annotations:?}"
    );
    assert_eq!(annotations.get("kubernetes.io/config.source").map(String::as_str), Some("file"));
    let owner = &mirror.metadata.owner_references.clone().unwrap()[0];
    assert_eq!((owner.kind.as_str(), owner.name.as_str(), owner.controller), ("Node", NODE, Some(true)));

    // The mirror deleted as a user would: made again, the static pod not restarted.
    let old = mirror.metadata.uid.clone();
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    let (_, again) =
        until("the mirror pod made again", Duration::from_secs(60), log, async || running(old.clone()).await)
            .await;
    assert_eq!(
        (again.container_id, again.restart_count),
        (container.container_id, 0),
        "the static pod ran on"
    );

    std::fs::remove_file(manifests.join("static-web.yaml")).unwrap();
    until("the mirror pod gone with its static pod", Duration::from_secs(60), log, async || {
        pods.get_opt(&name).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// A container that keeps failing: CrashLoopBackOff in the API and kubelet's BackOff Event.
async fn a_crash_loop(client: &kube::Client, log: &Path) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod = json!({"metadata": {"name": "crashy"}, "spec": {"nodeName": NODE, "hostNetwork": true,
        "containers": [{"name": "main", "image": IMAGE, "command": ["sh", "-c", "exit 3"]}]}});
    let uid = cluster::create(&pods, pod).await.metadata.uid.unwrap();
    let waiting = until("crashy in CrashLoopBackOff", Duration::from_secs(30), log, async || {
        let status = pods.get("crashy").await.ok()?.status?;
        let container = status.container_statuses?.into_iter().next()?;
        let waiting = container.state?.waiting?;
        (waiting.reason.as_deref() == Some("CrashLoopBackOff")).then_some((waiting, container.last_state))
    })
    .await;
    let terminated = waiting.1.and_then(|s| s.terminated).expect("its last state");
    assert_eq!((terminated.exit_code, terminated.reason.as_deref()), (3, Some("Error")));
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let want = format!("Back-off restarting failed container main in pod crashy_default({uid})");
    until("kubelet's BackOff Event", Duration::from_secs(10), log, async || {
        let listed = events.list(&Default::default()).await.ok()?.items;
        listed
            .iter()
            .any(|e| e.reason.as_deref() == Some("BackOff") && e.message.as_deref() == Some(want.as_str()))
            .then_some(())
    })
    .await;
    pods.delete("crashy", &DeleteParams { grace_period_seconds: Some(0), ..Default::default() })
        .await
        .unwrap();
}

/// `GET path` on the node's kubelet API with `token` (if any), as curl does it: the status
/// code and the body.
async fn kubelet_api_get(port: i32, path: &str, token: Option<&str>) -> (u16, String) {
    let mut curl = Command::new("curl");
    curl.args(["-sk", "-w", "\n%{http_code}", &format!("https://127.0.0.1:{port}{path}")]);
    if let Some(token) = token {
        curl.args(["-H", &format!("Authorization: Bearer {token}")]);
    }
    let out = tokio::task::spawn_blocking(move || curl.output()).await.unwrap().expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').expect("curl's status code");
    (code.parse().expect("a status code"), body.to_string())
}

/// A token of the service account `name` in `default`, made for it.
async fn service_account_token(client: &kube::Client, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::TokenRequest;
    use k8s_openapi::api::core::v1::ServiceAccount;
    let accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
    accounts
        .create(&Default::default(), &serde_json::from_value(json!({"metadata": {"name": name}})).unwrap())
        .await
        .unwrap();
    let request: TokenRequest = serde_json::from_value(json!({"spec": {"audiences": []}})).unwrap();
    let made = accounts.create_token_request(name, &Default::default(), &request).await.unwrap();
    made.status.unwrap().token.expect("a token")
}

/// Callers of the node's kubelet API straight (not through the API server): a bearer token is
/// a user by TokenReview, and its request is allowed by SubjectAccessReview (`nodes/proxy`
/// for a container's log), as kubelet decides.
async fn kubelet_api_callers(client: &kube::Client) {
    let node = Api::<Node>::all(client.clone()).get(NODE).await.unwrap();
    let port = node.status.unwrap().daemon_endpoints.unwrap().kubelet_endpoint.unwrap().port;
    let logs = "/containerLogs/default/web/main";
    let reader = service_account_token(client, "reader").await;
    let viewer = service_account_token(client, "viewer").await;
    let role = json!({"metadata": {"name": "node-proxy"},
        "rules": [{"apiGroups": [""], "resources": ["nodes/proxy"], "verbs": ["get"]}]});
    let binding = json!({"metadata": {"name": "viewer-node-proxy"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-proxy"},
        "subjects": [{"kind": "ServiceAccount", "name": "viewer", "namespace": "default"}]});
    use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
    Api::<ClusterRole>::all(client.clone())
        .create(&Default::default(), &serde_json::from_value(role).unwrap())
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(&Default::default(), &serde_json::from_value(binding).unwrap())
        .await
        .unwrap();
    // (token, status, body)
    let table = [
        (None, 401, "Unauthorized".to_string()),
        (Some("not-a-token"), 401, "Unauthorized".to_string()),
        (
            Some(reader.as_str()),
            403,
            "Forbidden (user=system:serviceaccount:default:reader, verb=get, resource=nodes, subresource=proxy)"
                .to_string(),
        ),
        (Some(viewer.as_str()), 200, "hello from the api\n".to_string()),
    ];
    for (token, status, body) in table {
        let said = kubelet_api_get(port, logs, token).await;
        assert_eq!(said, (status, body), "{logs} with token {:?}", token.map(|t| &t[..t.len().min(12)]));
    }
    assert_eq!(kubelet_api_get(port, "/healthz", None).await, (200, "ok".to_string()));
}

/// A node whose Lease a kubelet renews: a second agent for it exits non-zero, saying so.
async fn refuse_a_kubelets_node(
    client: &kube::Client,
    kubeconfig: &Path,
    root: &Path,
    endpoint: &str,
    log: &Path,
) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": "kubelet-node", "namespace": "kube-node-lease"},
        "spec": {"holderIdentity": "kubelet-node", "leaseDurationSeconds": 40, "renewTime": MicroTime(Timestamp::now())}});
    leases.patch("kubelet-node", &PatchParams::apply("kubelet").force(), &Patch::Apply(lease)).await.unwrap();
    let other_log = log.with_file_name("refused.log");
    let other_root = root.with_file_name("refused");
    let mut refused = agent("kubelet-node", kubeconfig, &other_root, endpoint, &other_log).spawn().unwrap();
    let status = tokio::task::spawn_blocking(move || refused.wait()).await.unwrap().unwrap();
    let said = std::fs::read_to_string(&other_log).unwrap_or_default();
    assert!(!status.success(), "the agent beside a kubelet exited {status}: {said}");
    assert!(said.contains("node kubelet-node is kept by another agent"), "{said}");
    assert!(Api::<Node>::all(client.clone()).get_opt("kubelet-node").await.unwrap().is_none());
}

/// With the node lifecycle controller: Ready while kvol runs (past the controller's grace
/// period), Unknown once it stops.
fn node_lifecycle(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    kubeconfig: &Path,
    dir: &Path,
    kvol: &mut Process,
    log: &Path,
) {
    let Some(kcm) = std::env::var_os("KVOL_KUBE_CONTROLLER_MANAGER") else {
        return eprintln!("node lifecycle skipped: set KVOL_KUBE_CONTROLLER_MANAGER");
    };
    let kcm_log = std::fs::File::create(dir.join("kube-controller-manager.log")).unwrap();
    let _kcm = Process(
        Command::new(kcm)
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(["--controllers=nodelifecycle", "--leader-elect=false", "--secure-port=0"])
            .args([
                "--use-service-account-credentials=false",
                "--node-monitor-period=1s",
                "--node-monitor-grace-period=20s",
            ])
            .stdout(kcm_log.try_clone().unwrap())
            .stderr(kcm_log)
            .spawn()
            .unwrap(),
    );
    let nodes: Api<Node> = Api::all(client.clone());
    runtime.block_on(async {
        // Past the grace period with kvol running: still Ready.
        for _ in 0..30 {
            let node = nodes.get(NODE).await.unwrap();
            assert_eq!(ready_condition(&node).map(|c| c.0).as_deref(), Some("True"), "Ready while kvol runs");
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    });
    let pid = nix::unistd::Pid::from_raw(kvol.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = kvol.0.wait();
    let stopped = Instant::now();
    runtime.block_on(until(
        "the node NotReady once kvol stopped",
        Duration::from_secs(90),
        log,
        async || {
            let node = nodes.get(NODE).await.ok()?;
            (ready_condition(&node)?.0 == "Unknown").then_some(())
        },
    ));
    eprintln!("node Ready → Unknown {} ms after kvol stopped", stopped.elapsed().as_millis());
}
