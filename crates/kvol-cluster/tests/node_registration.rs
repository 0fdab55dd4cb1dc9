//! A kvol node's registration against a real kube-apiserver (env-gated: `KVOL_KUBE_APISERVER`, `KVOL_ETCD`): the Node as kubelet registers it (labels, capacity, `nodeInfo`, Ready), its Lease taken and renewed, the storage fields of the node writer left alone, a restart taking its own Lease back — and a node whose Lease another agent renews refused, in both modes.

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::Api;
use kube::api::{Patch, PatchParams};
use kvol_cluster::node_objects::{ApiNodeObjects, NodeObjects, node_status_body};
use kvol_cluster::node_registration::{LEASE_NAMESPACE, NodeFacts, take_node};
use serde_json::json;

use support::ApiServer;

fn facts(name: &str) -> NodeFacts {
    NodeFacts {
        name: name.into(),
        hostname: name.into(),
        internal_ip: "192.0.2.10".into(),
        cpu_millis: 2000,
        memory_bytes: 4 << 30,
        ephemeral_storage_bytes: 20 << 30,
        max_pods: 110,
        architecture: "amd64".into(),
        kernel_version: "6.1.0".into(),
        os_image: "Debian GNU/Linux 12 (bookworm)".into(),
        container_runtime_version: "containerd://1.6.20".into(),
        agent_version: "v1.26.0-kvol.0.1.0".into(),
        ..Default::default()
    }
}

/// A Lease of `node` renewed `ago` before now by `manager` (a kubelet's, say).
async fn lease_renewed_by(leases: &Api<Lease>, node: &str, manager: &str, ago: i64) {
    let renewed = Timestamp::now().checked_sub(SignedDuration::from_secs(ago)).unwrap();
    let body = json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": node, "namespace": LEASE_NAMESPACE},
        "spec": {"holderIdentity": node, "leaseDurationSeconds": 40, "renewTime": MicroTime(renewed)}});
    leases
        .patch(node, &PatchParams::apply(manager).force(), &Patch::Apply(body))
        .await
        .expect("the lease is written");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kvol_node_registers_keeps_its_lease_and_refuses_a_kubelets_node() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let leases: Api<Lease> = Api::namespaced(client.clone(), LEASE_NAMESPACE);

    // Registered as kubelet registers, the storage writer's field beside it.
    let keeper =
        take_node(client.clone(), "kvol-1", Some(facts("kvol-1"))).await.expect("registered").unwrap();
    let objects = ApiNodeObjects::new(client.clone());
    objects
        .apply_node_status("kvol-1", node_status_body("kvol-1", &["kubernetes.io/csi/d^v1".into()]))
        .await
        .unwrap();
    let node = nodes.get("kvol-1").await.unwrap();
    let labels = node.metadata.labels.clone().unwrap();
    assert_eq!(labels["kubernetes.io/hostname"], "kvol-1");
    assert_eq!(labels["kubernetes.io/arch"], "amd64");
    let status = node.status.clone().unwrap();
    let ready = status.conditions.clone().unwrap().into_iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!((ready.status.as_str(), ready.reason.as_deref()), ("True", Some("KubeletReady")));
    assert_eq!(status.capacity.as_ref().unwrap()["pods"].0, "110");
    let info = status.node_info.clone().unwrap();
    assert_eq!(
        (info.kubelet_version.as_str(), info.container_runtime_version.as_str()),
        ("v1.26.0-kvol.0.1.0", "containerd://1.6.20")
    );
    let lease = leases.get("kvol-1").await.unwrap();
    let spec = lease.spec.clone().unwrap();
    assert_eq!((spec.holder_identity.as_deref(), spec.lease_duration_seconds), (Some("kvol-1"), Some(40)));
    assert_eq!(lease.metadata.owner_references.unwrap()[0].uid, node.metadata.uid.clone().unwrap());

    // Renewed every 10 s.
    let first = spec.renew_time.unwrap().0;
    let start = Instant::now();
    loop {
        let renewed = leases.get("kvol-1").await.unwrap().spec.unwrap().renew_time.unwrap().0;
        if renewed > first {
            eprintln!("lease renewed {} ms after registration", start.elapsed().as_millis());
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(15), "the lease was not renewed within 15 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // A restart takes its own lease back, and the storage writer's field survives it.
    keeper.stop().await;
    let again =
        take_node(client.clone(), "kvol-1", Some(facts("kvol-1"))).await.expect("its own node back").unwrap();
    let volumes_in_use = nodes.get("kvol-1").await.unwrap().status.unwrap().volumes_in_use;
    assert_eq!(
        volumes_in_use,
        Some(vec!["kubernetes.io/csi/d^v1".to_string()]),
        "the node writer's field kept"
    );
    again.stop().await;

    // A node whose lease a kubelet renews: refused, running pods or volumes only.
    lease_renewed_by(&leases, "kubelet-1", "kubelet", 2).await;
    for facts in [Some(facts("kubelet-1")), None] {
        let registering = facts.is_some();
        let refusal = take_node(client.clone(), "kubelet-1", facts).await.map(|_| ()).unwrap_err();
        assert!(
            refusal.starts_with("node kubelet-1 is kept by another agent: its lease kube-node-lease/kubelet-1 was renewed by \"kubelet\""),
            "registering {registering}: {refusal}"
        );
    }
    assert!(nodes.get_opt("kubelet-1").await.unwrap().is_none(), "nothing registered for it");

    // Once that lease has run out, the node is free.
    lease_renewed_by(&leases, "kubelet-1", "kubelet", 60).await;
    let taken = take_node(client.clone(), "kubelet-1", Some(facts("kubelet-1")))
        .await
        .expect("a stale lease is taken");
    taken.unwrap().stop().await;
}

/// The Node's condition of `kind`: its status, reason and transition time.
fn condition(node: &Node, kind: &str) -> (String, Option<String>, Option<Timestamp>) {
    let conditions = node.status.as_ref().and_then(|s| s.conditions.clone()).unwrap_or_default();
    let found = conditions.into_iter().find(|c| c.type_ == kind).expect("the condition");
    (found.status, found.reason, found.last_transition_time.map(|t| t.0))
}

#[tokio::test(flavor = "multi_thread")]
async fn allocatable_held_back_and_memory_pressure_posted_when_it_comes() {
    use kvol_api::allocatable::{Available, parse_eviction};
    use kvol_api::projection::NodeResources;
    use kvol_cluster::node_registration::PressureWatch;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let nodes: Api<Node> = Api::all(client.clone());
    let free = Arc::new(AtomicU64::new(2 << 30));
    let measured = Arc::clone(&free);
    let facts = NodeFacts {
        allocatable: Some(NodeResources {
            cpu_millis: 1700,
            memory_bytes: 3 << 30,
            ephemeral_storage_bytes: 18 << 30,
        }),
        pressure: PressureWatch {
            eviction: parse_eviction("memory.available<100Mi").unwrap(),
            measure: Some(Arc::new(move || Available {
                memory_bytes: measured.load(Ordering::SeqCst),
                memory_capacity: 4 << 30,
                nodefs_bytes: 10 << 30,
                nodefs_capacity: 20 << 30,
            })),
        },
        ..facts("kvol-p")
    };
    let keeper = take_node(client.clone(), "kvol-p", Some(facts)).await.expect("registered").unwrap();
    let node = nodes.get("kvol-p").await.unwrap();
    let status = node.status.clone().unwrap();
    // As the API server returns them (canonical quantities).
    assert_eq!(status.capacity.as_ref().unwrap()["cpu"].0, "2");
    assert_eq!(status.allocatable.as_ref().unwrap()["cpu"].0, "1700m");
    assert_eq!(status.allocatable.as_ref().unwrap()["memory"].0, "3Gi");
    let (memory, reason, before) = condition(&node, "MemoryPressure");
    assert_eq!((memory.as_str(), reason.as_deref()), ("False", Some("KubeletHasSufficientMemory")));
    let ready_since = condition(&node, "Ready").2;

    free.store(50 << 20, Ordering::SeqCst);
    let changed = Instant::now();
    let node = loop {
        let node = nodes.get("kvol-p").await.unwrap();
        if condition(&node, "MemoryPressure").0 == "True" {
            break node;
        }
        assert!(changed.elapsed() < Duration::from_secs(30), "no memory pressure posted: {:?}", node.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!("memory pressure posted {} ms after it came", changed.elapsed().as_millis());
    let (_, reason, since) = condition(&node, "MemoryPressure");
    assert_eq!(reason.as_deref(), Some("KubeletHasInsufficientMemory"));
    assert!(since > before, "its transition time moved: {before:?} → {since:?}");
    assert_eq!(condition(&node, "Ready").2, ready_since, "Ready's transition time kept");
    keeper.stop().await;
}
