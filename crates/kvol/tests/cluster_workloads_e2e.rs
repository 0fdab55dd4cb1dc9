//! A kvol node beside the whole control plane: kube-apiserver (ServiceAccount admission on), kube-controller-manager with all its controllers, kube-scheduler, and containerd with a CNI bridge network on the node. A Deployment whose pods use a configMap, a secret, the downward API, an emptyDir and the kube-api-access volume the API server adds becomes Available, its pods on the pod network and ready by an httpGet probe on their own IP; a Job completes; a deleted pod's replacement runs; kvol stopped → the node goes Unknown and the taint manager evicts its pods, which kvol, started again, stops and deletes while their replacements run; the workloads deleted → nothing left in containerd.
//!
//! Needs root, `KVOL_KUBE_APISERVER`, `KVOL_ETCD`, `KVOL_KUBE_CONTROLLER_MANAGER`,
//! `KVOL_KUBE_SCHEDULER`, `KVOL_CNI_BIN` (bridge, host-local), containerd, runc and a static
//! busybox; skipped, saying which, without them.

#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod cluster;
#[path = "support/control_plane.rs"]
mod control_plane;
#[allow(dead_code)]
mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use control_plane::{ControlPlane, create, create_app_config, web_deployment};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;
use support::cluster_node::{Process, agent, ready_condition, until};
use support::containerd::{Containerd, IMAGE, tools};

const NODE: &str = "kvol-worker";

/// The names of the Deployment's pods that are not being deleted, once `replicas` of them
/// are available.
async fn available(client: &kube::Client, log: &Path, limit: Duration) -> BTreeSet<String> {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    until("the deployment available", limit, log, async || {
        let status = deployments.get("web").await.ok()?.status?;
        let (available, updated) = (status.available_replicas?, status.updated_replicas?);
        let listed = pods.list(&ListParams::default().labels("app=web")).await.ok()?.items;
        let live: BTreeSet<String> = listed
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect();
        (available == 2 && updated == 2 && live.len() == 2).then_some(live)
    })
    .await
}

/// The node `bystander`, Ready (its Lease and status renewed every 2 s as a kubelet's would
/// be) and tainted so that nothing runs there.
async fn bystander(client: kube::Client) {
    use k8s_openapi::api::coordination::v1::Lease;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, Time};
    use k8s_openapi::jiff::Timestamp;
    use kube::api::{Patch, PatchParams};
    let name = "bystander";
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    create(&nodes, json!({"metadata": {"name": name}, "spec": {"taints": [{"key": "bystander", "effect": "NoSchedule"}]}})).await;
    let apply = PatchParams::apply("bystander").force();
    loop {
        let now = Timestamp::now();
        let lease = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": name, "namespace": "kube-node-lease"},
            "spec": {"holderIdentity": name, "leaseDurationSeconds": 40, "renewTime": MicroTime(now)}});
        let _ = leases.patch(name, &apply, &Patch::Apply(lease)).await;
        let status = json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": name}, "status": {
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                "lastHeartbeatTime": Time(now), "lastTransitionTime": Time(now)}]}});
        let _ = nodes.patch_status(name, &apply, &Patch::Apply(status)).await;
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
}

/// Each pod's container id, restart count and pod IP, as the API has them.
async fn containers_and_ips(pods: &Api<Pod>, names: &BTreeSet<String>) -> Vec<(String, i32, String)> {
    let mut found = Vec::new();
    for name in names {
        let status = pods.get(name).await.unwrap().status.unwrap_or_default();
        let container = status.container_statuses.unwrap_or_default().into_iter().next().unwrap();
        found.push((
            container.container_id.unwrap_or_default(),
            container.restart_count,
            status.pod_ip.unwrap_or_default(),
        ));
    }
    found
}

/// What the pod `name` serves on its pod IP, with that IP.
async fn served(pods: &Api<Pod>, name: &str) -> (String, String) {
    let pod = pods.get(name).await.unwrap();
    let ip = pod.status.and_then(|s| s.pod_ip).expect("a pod ip");
    let url = format!("http://{ip}:8080/said");
    let out = tokio::task::spawn_blocking(move || {
        Command::new("curl").args(["-s", "--max-time", "5", &url]).output()
    })
    .await
    .unwrap()
    .expect("curl runs");
    (ip, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn deployments_jobs_and_evictions_on_a_kvol_node_beside_the_whole_control_plane() {
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let Some(binaries) = control_plane::binaries() else { return };
    support::enter_private_mount_namespace();
    let Some(containerd) = Containerd::with_pod_network(&busybox) else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let control = ControlPlane::start(&binaries);
    let server = &control.server;
    let client = runtime.block_on(server.client());
    let scratch = kvol_test_support::ScratchRoot::new();
    let (root, log) = (scratch.path().join("node"), scratch.path().join("agent.log"));
    control.give_client_ca(scratch.path());
    // A second node that stays Ready: with every node lost the controller takes the control
    // plane for cut off and evicts nothing.
    let _bystander = runtime.spawn(bystander(client.clone()));
    let endpoint = containerd.endpoint();
    let started = Instant::now();
    let mut kvol = Process(agent(NODE, &server.kubeconfig, &root, &endpoint, &log).spawn().unwrap());
    runtime.block_on(async {
        let nodes: Api<Node> = Api::all(client.clone());
        until("the node Ready and untainted", Duration::from_secs(60), &log, async || {
            let node = nodes.get_opt(NODE).await.ok()??;
            let untainted = node.spec.as_ref().is_none_or(|s| s.taints.as_ref().is_none_or(Vec::is_empty));
            (ready_condition(&node)?.0 == "True" && untainted).then_some(())
        })
        .await;
        eprintln!("node Ready and untainted {} ms after the agent started", started.elapsed().as_millis());
        a_deployment_and_a_job(&client, &log).await;
    });

    // kvol killed -9 and started again: it adopts the running pods, restarts nothing, and
    // keeps probing them on their own addresses.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let before = runtime.block_on(available(&client, &log, Duration::from_secs(10)));
    let running = runtime.block_on(containers_and_ips(&pods, &before));
    kvol.0.kill().unwrap();
    let _ = kvol.0.wait();
    let restarted = Instant::now();
    kvol = Process(agent(NODE, &server.kubeconfig, &root, &endpoint, &log).spawn().unwrap());
    runtime.block_on(async {
        // The new agent's first status (its probes not yet run) may say not ready for a moment.
        tokio::time::sleep(Duration::from_secs(4)).await;
        until("the pods ready again after the restart", Duration::from_secs(30), &log, async || {
            let now = containers_and_ips(&pods, &before).await;
            let ready =
                pods.list(&ListParams::default().labels("app=web")).await.ok()?.items.iter().all(|p| {
                    let conditions = p.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
                    conditions.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                });
            (ready && now == running).then_some(())
        })
        .await;
    });
    eprintln!(
        "kvol killed -9 and started again: the same containers and addresses, ready again {} ms later",
        restarted.elapsed().as_millis()
    );

    // kvol stopped: the node goes Unknown and the taint manager evicts its pods.
    let pid = nix::unistd::Pid::from_raw(kvol.0.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let _ = kvol.0.wait();
    let stopped = Instant::now();
    runtime.block_on(until(
        "the pods evicted once the node is lost",
        Duration::from_secs(90),
        &log,
        async || {
            let listed = pods.list(&ListParams::default().labels("app=web")).await.ok()?.items;
            let deleting: BTreeSet<String> = listed
                .into_iter()
                .filter(|p| p.metadata.deletion_timestamp.is_some())
                .filter_map(|p| p.metadata.name)
                .collect();
            (deleting == before).then_some(())
        },
    ));
    eprintln!("kvol stopped → its pods evicted {} ms later", stopped.elapsed().as_millis());
    // Started again: kvol stops the evicted pods, deletes them, and runs their replacements.
    let restarted = Instant::now();
    kvol = Process(agent(NODE, &server.kubeconfig, &root, &endpoint, &log).spawn().unwrap());
    runtime.block_on(async {
        let after = available(&client, &log, Duration::from_secs(120)).await;
        assert!(after.is_disjoint(&before), "replacements: {after:?} after {before:?}");
        until("the evicted pods deleted by the node", Duration::from_secs(60), &log, async || {
            let listed = pods.list(&ListParams::default().labels("app=web")).await.ok()?.items;
            listed.iter().all(|p| p.metadata.deletion_timestamp.is_none()).then_some(())
        })
        .await;
        eprintln!(
            "kvol started again → evicted pods gone, replacements available in {} ms",
            restarted.elapsed().as_millis()
        );
        everything_deleted(&client, &log).await;
    });
    drop(kvol);
    assert_eq!(containerd.containers(), Vec::<String>::new(), "containers left in containerd");
}

/// A Deployment becomes Available on the node with every volume kind, on the pod network; a
/// Job completes; a deleted pod's replacement runs.
async fn a_deployment_and_a_job(client: &kube::Client, log: &Path) {
    create_app_config(client).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let created = Instant::now();
    create(&deployments, web_deployment("web", 2, None)).await;
    let names = available(client, log, Duration::from_secs(120)).await;
    eprintln!("deployment created → Available (2 pods) in {} ms", created.elapsed().as_millis());
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let node = Api::<Node>::all(client.clone()).get(NODE).await.unwrap();
    let host_ips: Vec<String> =
        node.status.unwrap().addresses.unwrap_or_default().into_iter().map(|a| a.address).collect();
    for name in &names {
        let pod = pods.get(name).await.unwrap();
        let volumes = pod.spec.unwrap().volumes.unwrap_or_default();
        assert!(volumes.iter().any(|v| v.name.starts_with("kube-api-access-")), "{name}: {volumes:?}");
        let (ip, said) = served(&pods, name).await;
        assert!(!host_ips.contains(&ip), "{name} is on the pod network, not the node's: {ip}");
        assert_eq!(said, format!("hello\ns3cret\n{name}default"), "{name} at {ip}");
    }

    let jobs: Api<Job> = Api::namespaced(client.clone(), "default");
    let created = Instant::now();
    create(
        &jobs,
        json!({"metadata": {"name": "once"}, "spec": {"backoffLimit": 0, "template": {"spec": {
            "restartPolicy": "Never",
            "containers": [{"name": "once", "image": IMAGE, "command": ["sh", "-c", "echo done"]}]}}}}),
    )
    .await;
    until("the job complete", Duration::from_secs(60), log, async || {
        let status = jobs.get("once").await.ok()?.status?;
        (status.succeeded == Some(1)).then_some(())
    })
    .await;
    eprintln!("job created → complete in {} ms", created.elapsed().as_millis());

    let gone = names.iter().next().unwrap().clone();
    let deleted = Instant::now();
    pods.delete(&gone, &DeleteParams::default()).await.unwrap();
    until("the deleted pod gone", Duration::from_secs(60), log, async || {
        pods.get_opt(&gone).await.ok()?.is_none().then_some(())
    })
    .await;
    let replaced = available(client, log, Duration::from_secs(60)).await;
    assert!(!replaced.contains(&gone) && replaced.len() == 2, "{replaced:?}");
    eprintln!("a pod deleted → gone and replaced in {} ms", deleted.elapsed().as_millis());
}

/// The Deployment and the Job deleted (their pods with them, by the garbage collector): no pod
/// left in the API.
async fn everything_deleted(client: &kube::Client, log: &Path) {
    let background = DeleteParams::background();
    Api::<Deployment>::namespaced(client.clone(), "default").delete("web", &background).await.unwrap();
    Api::<Job>::namespaced(client.clone(), "default").delete("once", &background).await.unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let deleted = Instant::now();
    until("every pod gone", Duration::from_secs(90), log, async || {
        pods.list(&ListParams::default()).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    eprintln!("workloads deleted → every pod gone in {} ms", deleted.elapsed().as_millis());
}
