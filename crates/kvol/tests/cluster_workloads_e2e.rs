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

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::create;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret};
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use serde_json::json;
use support::cluster_node::{Process, agent, ready_condition, until};
use support::containerd::{Containerd, IMAGE, tools};

const NODE: &str = "kvol-worker";

/// A StatefulSet of two with a volumeClaimTemplate on the upstream hostpath driver: each
/// claim provisioned, attached by the controllers, published by kvol and written by its pod; a
/// pod deleted comes back on the same claim and finds what it wrote.
async fn a_statefulset_with_claims(client: &kube::Client, log: &Path) {
    use k8s_openapi::api::apps::v1::StatefulSet;
    use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass, VolumeAttachment};
    let driver = support::csi_peers::DRIVER;
    create(
        &Api::<CSIDriver>::all(client.clone()),
        json!({"metadata": {"name": driver}, "spec": {"attachRequired": true}}),
    )
    .await;
    create(
        &Api::<StorageClass>::all(client.clone()),
        json!({"metadata": {"name": "hp"}, "provisioner": driver, "volumeBindingMode": "Immediate"}),
    )
    .await;
    cluster::wait_for_csinode_driver(client, NODE, driver).await;
    let sets: Api<StatefulSet> = Api::namespaced(client.clone(), "default");
    let created = Instant::now();
    create(
        &sets,
        json!({"metadata": {"name": "db"}, "spec": {"replicas": 2, "serviceName": "db",
            "selector": {"matchLabels": {"app": "db"}},
            "template": {"metadata": {"labels": {"app": "db"}}, "spec": {"terminationGracePeriodSeconds": 1,
                "containers": [{"name": "db", "image": IMAGE,
                    "command": ["sh", "-c", "echo $HOSTNAME >> /data/who; exec sleep 100000"],
                    "readinessProbe": {"exec": {"command": ["cat", "/data/who"]}, "periodSeconds": 1},
                    "volumeMounts": [{"name": "data", "mountPath": "/data"}]}]}},
            "volumeClaimTemplates": [{"metadata": {"name": "data"}, "spec": {"storageClassName": "hp",
                "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}]}}),
    )
    .await;
    let ready = async |want_restarted: Option<&str>| {
        until("the statefulset ready", Duration::from_secs(120), log, async || {
            let status = sets.get("db").await.ok()?.status?;
            // A new db-0, itself ready (the set's count may still be the old one's).
            let restarted = match want_restarted {
                Some(uid) => {
                    Api::<Pod>::namespaced(client.clone(), "default").get("db-0").await.ok().is_some_and(
                        |p| {
                            let ready =
                                p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                                    c.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                                });
                            p.metadata.uid.as_deref() != Some(uid) && ready
                        },
                    )
                }
                None => true,
            };
            (status.ready_replicas == Some(2) && restarted).then_some(())
        })
        .await
    };
    ready(None).await;
    eprintln!("statefulset created → 2 pods ready on their claims in {} ms", created.elapsed().as_millis());
    let attachments =
        Api::<VolumeAttachment>::all(client.clone()).list(&ListParams::default()).await.unwrap().items;
    let attached = attachments
        .iter()
        .filter(|va| va.spec.node_name == NODE && va.status.as_ref().is_some_and(|s| s.attached))
        .count();
    assert_eq!(attached, 2, "each claim attached to the node: {attachments:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let said = |name: &'static str| {
        let pods = pods.clone();
        async move {
            let params = kube::api::AttachParams::default().stderr(false);
            let mut attached =
                pods.exec(name, ["cat", "/data/who"], &params).await.expect("exec through the api server");
            let mut said = String::new();
            tokio::io::AsyncReadExt::read_to_string(&mut attached.stdout().expect("its stdout"), &mut said)
                .await
                .unwrap();
            attached.join().await.unwrap();
            said
        }
    };
    assert_eq!(said("db-0").await, "db-0\n");
    assert_eq!(said("db-1").await, "db-1\n");
    let old = pods.get("db-0").await.unwrap().metadata.uid.unwrap();
    let deleted = Instant::now();
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    ready(Some(&old)).await;
    assert_eq!(said("db-0").await, "db-0\ndb-0\n", "the same claim, with what it wrote before");
    eprintln!("db-0 deleted → back on its claim, its data there, in {} ms", deleted.elapsed().as_millis());
    sets.delete("db", &DeleteParams::background()).await.unwrap();
}

/// The names of the Deployment's pods that are not being deleted, once `replicas` of them
/// are available.
async fn available(client: &kube::Client, log: &Path, limit: Duration) -> BTreeSet<String> {
    available_n(client, log, limit, 2).await
}

/// [`available`] for `replicas` pods.
async fn available_n(client: &kube::Client, log: &Path, limit: Duration, replicas: i32) -> BTreeSet<String> {
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
        let want = replicas as usize;
        (available == replicas && updated == replicas && live.len() == want).then_some(live)
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

/// The web pods' running containers in the runtime, by pod name.
async fn running_web_containers(cri: &kvol_cri::CriClient) -> BTreeMap<String, Vec<String>> {
    let filter = kvol_cri::ContainerFilter {
        state: Some(kvol_cri::ContainerStateValue {
            state: kvol_cri::ContainerState::ContainerRunning as i32,
        }),
        label_selector: [("io.kubernetes.container.name".to_string(), "web".to_string())].into(),
        ..Default::default()
    };
    let listed = cri.list_containers(kvol_cri::ListContainersRequest { filter: Some(filter) }).await.unwrap();
    let mut by_pod: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for container in listed.containers {
        let pod = container.labels.get("io.kubernetes.pod.name").cloned().unwrap_or_default();
        by_pod.entry(pod).or_default().push(container.id);
    }
    by_pod
}

/// kvol killed -9 at random moments while the Deployment is scaled up and down
/// (`KVOL_NODE_CHURN_ROUNDS`, 3 by default; `KVOL_CHURN_SEED`): after each restart every pod is
/// available with one running container, and every container that ran before the kill runs on,
/// the same one. (A container whose start the kill cut short — containerd fails a start whose
/// caller went — is started again as a new attempt, as kubelet would.)
fn kill_churn(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    containerd: &Containerd,
    kvol: &mut Process,
    start_agent: impl Fn() -> Process,
    log: &Path,
) {
    use kube::api::{Patch, PatchParams};
    let rounds = std::env::var("KVOL_NODE_CHURN_ROUNDS").ok().and_then(|r| r.parse().ok()).unwrap_or(3usize);
    let seed = std::env::var("KVOL_CHURN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261207u64);
    let mut dice = fastrand::Rng::with_seed(seed);
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let cri = {
        let _inside = runtime.enter();
        kvol_cri::CriClient::new(&containerd.endpoint(), Default::default()).expect("a cri client")
    };
    let (started, mut kept) = (Instant::now(), 0);
    for round in 0..rounds {
        let replicas = if round + 1 == rounds { 2 } else { 2 + dice.i32(1..=2) };
        let scale = json!({"spec": {"replicas": replicas}});
        runtime.block_on(deployments.patch("web", &PatchParams::default(), &Patch::Merge(scale))).unwrap();
        std::thread::sleep(Duration::from_millis(dice.u64(0..1500)));
        let ran = runtime.block_on(running_web_containers(&cri));
        kvol.0.kill().unwrap();
        let _ = kvol.0.wait();
        std::thread::sleep(Duration::from_millis(dice.u64(0..500)));
        *kvol = start_agent();
        runtime.block_on(async {
            let names = available_n(client, log, Duration::from_secs(90), replicas).await;
            let now = running_web_containers(&cri).await;
            for name in &names {
                let running = now.get(name).cloned().unwrap_or_default();
                assert_eq!(running.len(), 1, "round {round}: {name}'s running containers (seed {seed})");
                if let Some(before) = ran.get(name) {
                    assert_eq!(&running, before, "round {round}: {name} ran before the kill (seed {seed})");
                    kept += 1;
                }
            }
        });
    }
    eprintln!(
        "{rounds} rounds of kill -9 while scaling (seed {seed}): every pod available with one container, the {kept} that ran before a kill the same, in {} ms",
        started.elapsed().as_millis()
    );
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
    let plane = control_plane::ControlPlane::start(&binaries);
    let server = &plane.server;
    let client = runtime.block_on(server.client());
    let scratch = kvol_test_support::ScratchRoot::new();
    let (root, log) = (scratch.path().join("node"), scratch.path().join("agent.log"));
    plane.give_client_ca(scratch.path());
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
    // A StatefulSet's claims, provisioned and attached by the upstream driver's controllers
    // (kept to the end: the claims' volumes go only through the driver).
    let mut csi = support::csi_peers::binaries().map(|binaries| {
        support::csi_peers::CsiPeers::start(
            &binaries,
            &root.join("kubelet"),
            NODE,
            &server.kubeconfig,
            scratch.path(),
        )
    });
    if let Some(csi) = csi.as_mut() {
        runtime.block_on(a_statefulset_with_claims(&client, &log));
        csi.assert_running();
    }

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

    kill_churn(
        &runtime,
        &client,
        &containerd,
        &mut kvol,
        || Process(agent(NODE, &server.kubeconfig, &root, &endpoint, &log).spawn().unwrap()),
        &log,
    );

    // kvol stopped: the node goes Unknown and the taint manager evicts its pods.
    let before = runtime.block_on(available(&client, &log, Duration::from_secs(30)));
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
            before.is_subset(&deleting).then_some(())
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
    drop(csi);
    assert_eq!(containerd.containers(), Vec::<String>::new(), "containers left in containerd");
}

/// A Deployment becomes Available on the node with every volume kind, on the pod network; a
/// Job completes; a deleted pod's replacement runs.
async fn a_deployment_and_a_job(client: &kube::Client, log: &Path) {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create(&config_maps, json!({"metadata": {"name": "app"}, "data": {"greeting": "hello\n"}})).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    create(&secrets, json!({"metadata": {"name": "creds"}, "stringData": {"password": "s3cret\n"}})).await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let created = Instant::now();
    create(&deployments, control_plane::web_deployment("web", 2, None)).await;
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
