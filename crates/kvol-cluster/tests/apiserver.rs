//! The API source and the node writer against a real kube-apiserver (env-gated: `KVOL_KUBE_APISERVER`, `KVOL_ETCD`).

mod support;

use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::api::DeleteParams;
use kube::{Api, Client};
use kvol_cluster::node_objects::{ApiNodeObjects, NodeWriter};
use kvol_cluster::source::ApiSource;
use kvol_node::report::node_storage::{NodeStorage, NodeStorageSink};
use kvol_node::sources::ObjectSource;
use serde_json::json;

use support::{ApiServer, create, until};

const DRIVER: &str = "hostpath.csi.kvol.io";

async fn create_node(client: &Client, name: &str) -> Node {
    create(
        &Api::<Node>::all(client.clone()),
        json!({"metadata": {"name": name, "annotations": {"other.example/keep": "yes"},
            "labels": {"other.example/label": "kept"}}}),
    )
    .await
}

/// A PV of the bundled driver, a claim bound to it (spec.volumeName and status, as the binder
/// would set them), and a pod on `node` using the claim and an emptyDir.
async fn pod_with_claim(client: &Client, pod: &str, node: &str) {
    let pv = format!("pv-{pod}");
    let claim = format!("claim-{pod}");
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        json!({"metadata": {"name": pv}, "spec": {
            "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
            "csi": {"driver": DRIVER, "volumeHandle": format!("h-{pod}")}}}),
    )
    .await;
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    create(
        &claims,
        json!({"metadata": {"name": claim}, "spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "fast", "volumeName": pv,
            "resources": {"requests": {"storage": "1Mi"}}}}),
    )
    .await;
    create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        kvol_test_support::pods::mounting_its_volumes(
            json!({"metadata": {"name": pod}, "spec": {"nodeName": node,
            "containers": [{"name": "c", "image": "none"}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}},
                        {"name": "scratch", "emptyDir": {}}]}}),
        ),
    )
    .await;
}

/// The StorageClass `fast` and the CSIDriver of the bundled driver (no attach).
async fn class_and_driver(client: &Client) {
    create(
        &Api::<StorageClass>::all(client.clone()),
        json!({"metadata": {"name": "fast"}, "provisioner": DRIVER}),
    )
    .await;
    create(
        &Api::<CSIDriver>::all(client.clone()),
        json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}),
    )
    .await;
}

fn keys<V>(map: &std::collections::BTreeMap<String, V>) -> Vec<&str> {
    map.keys().map(String::as_str).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_source_holds_the_nodes_pods_and_only_what_they_reference_through_an_outage() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let mut server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    create_node(&client, "n1").await;
    create_node(&client, "n2").await;
    class_and_driver(&client).await;
    pod_with_claim(&client, "mine", "n1").await;
    pod_with_claim(&client, "theirs", "n2").await;

    let source = ApiSource::start(client.clone(), "n1").await;
    let set = source.current();
    assert_eq!(keys(&set.pods), ["default/mine"]);
    assert_eq!(keys(&set.claims), ["default/claim-mine"]);
    assert_eq!(keys(&set.persistent_volumes), ["pv-mine"]);
    assert_eq!(keys(&set.storage_classes), ["fast"]);
    assert_eq!(keys(&set.csi_drivers), [DRIVER]);

    // A new pod of this node arrives through the watch, with its inline CSI volume.
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    create(
        &pods,
        kvol_test_support::pods::mounting_its_volumes(
            json!({"metadata": {"name": "inline"}, "spec": {"nodeName": "n1",
            "containers": [{"name": "c", "image": "none"}],
            "volumes": [{"name": "eph", "csi": {"driver": DRIVER}}]}}),
        ),
    )
    .await;
    until(&source, "the inline pod", |s| s.pods.contains_key("default/inline")).await;

    // The API server goes away for 30 s: the last known objects stay.
    server.kill_apiserver();
    tokio::time::sleep(Duration::from_secs(30)).await;
    let during = source.current();
    assert_eq!(keys(&during.pods), ["default/inline", "default/mine"]);
    assert_eq!(keys(&during.persistent_volumes), ["pv-mine"]);

    // Back: a deletion made after the outage is seen (the watch resumed or relisted).
    server.start_apiserver();
    let client = server.client().await;
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    pods.delete("inline", &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
        .await
        .expect("deleted");
    until(&source, "the inline pod gone", |s| keys(&s.pods) == ["default/mine"]).await;
    Box::new(source).shutdown();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_node_writer_applies_csinode_node_ids_and_volumes_in_use_beside_other_writers() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let node = create_node(&client, "n1").await;
    let writer = NodeWriter::start("n1".into(), std::sync::Arc::new(ApiNodeObjects::new(client.clone())));
    let csinode =
        kvol_csi::csinode::install_driver(None, "n1", DRIVER, "n1", ["topology.kvol.io/node"], 7, &[])
            .expect("a csinode");
    let ids = kvol_csi::csinode::node_id_annotation_set(None, DRIVER, "n1").expect("an annotation");
    writer.report(&NodeStorage {
        csi_node: Some(csinode),
        node_ids: Some(ids.clone()),
        volumes_in_use: vec![format!("kubernetes.io/csi/{DRIVER}^h1")],
        topology_labels: [("topology.kvol.io/node".to_string(), "n1".to_string())].into(),
    });
    let nodes = Api::<Node>::all(client.clone());
    let csinodes = Api::<CSINode>::all(client.clone());
    let deadline = Instant::now() + Duration::from_secs(60);
    let (found, seen) = loop {
        let found = csinodes.get_opt("n1").await.expect("csinode read");
        let seen = nodes.get("n1").await.expect("node read");
        let in_use = seen.status.as_ref().and_then(|s| s.volumes_in_use.clone()).unwrap_or_default();
        if let Some(found) = found.filter(|_| !in_use.is_empty()) {
            break (found, seen);
        }
        assert!(Instant::now() < deadline, "the node's storage objects never appeared");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let owner = &found.metadata.owner_references.as_ref().expect("an owner")[0];
    assert_eq!((owner.kind.as_str(), owner.uid.as_str()), ("Node", node.metadata.uid.as_deref().unwrap()));
    let driver = &found.spec.drivers[0];
    assert_eq!((driver.name.as_str(), driver.node_id.as_str()), (DRIVER, "n1"));
    assert_eq!(driver.allocatable.as_ref().and_then(|a| a.count), Some(7));
    let annotations = seen.metadata.annotations.clone().unwrap_or_default();
    assert_eq!(annotations.get(kvol_csi::csinode::ANN_NODE_ID), Some(&ids));
    assert_eq!(annotations.get("other.example/keep").map(String::as_str), Some("yes"));
    let labels = seen.metadata.labels.clone().unwrap_or_default();
    assert_eq!(labels.get("topology.kvol.io/node").map(String::as_str), Some("n1"), "{labels:?}");
    assert_eq!(labels.get("other.example/label").map(String::as_str), Some("kept"));
    assert_eq!(
        seen.status.and_then(|s| s.volumes_in_use).unwrap_or_default(),
        [format!("kubernetes.io/csi/{DRIVER}^h1")]
    );

    // The driver goes: kvol's annotation and volumes go, the other writer's annotation stays.
    writer.report(&NodeStorage {
        csi_node: Some(kvol_csi::csinode::initial_csinode("n1", &[])),
        node_ids: None,
        volumes_in_use: Vec::new(),
        topology_labels: Default::default(),
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let seen = nodes.get("n1").await.expect("node read");
        let annotations = seen.metadata.annotations.clone().unwrap_or_default();
        let labels = seen.metadata.labels.clone().unwrap_or_default();
        let in_use = seen.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
        let drivers = csinodes.get("n1").await.expect("csinode").spec.drivers;
        if !annotations.contains_key(kvol_csi::csinode::ANN_NODE_ID)
            && !labels.contains_key("topology.kvol.io/node")
            && in_use.is_empty()
            && drivers.is_empty()
        {
            assert_eq!(annotations.get("other.example/keep").map(String::as_str), Some("yes"));
            assert_eq!(labels.get("other.example/label").map(String::as_str), Some("kept"));
            break;
        }
        assert!(Instant::now() < deadline, "kvol's fields were not removed: {annotations:?} {in_use:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volumeattachment_marked_attached_by_the_controller_ends_the_nodes_wait() {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::{Patch, PatchParams};
    use kvol_csi::AttachmentSource;
    use kvol_csi::attachment::wait_for_attachment;
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let source = kvol_cluster::attachments::ApiAttachments::new(client.clone());
    let name = kvol_csi::paths::attachment_id("h1", DRIVER, "n1");
    assert_eq!(source.volume_attachment(&name).await.expect("a read"), None);
    let vas = Api::<VolumeAttachment>::all(client.clone());
    create(
        &vas,
        json!({"metadata": {"name": name}, "spec": {"attacher": DRIVER, "nodeName": "n1",
            "source": {"persistentVolumeName": "pv-1"}}}),
    )
    .await;
    // The external-attacher's part, played by the test: after a second, attached with metadata.
    let (marker, marked) = (vas.clone(), name.clone());
    let mark = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let status = json!({"status": {"attached": true, "attachmentMetadata": {"lun": "4"}}});
        marker.patch_status(&marked, &PatchParams::default(), &Patch::Merge(&status)).await.expect("marked")
    });
    let context = wait_for_attachment(&source, &name, DRIVER, "h1", "n1", Duration::from_secs(60))
        .await
        .expect("attached");
    mark.await.expect("the marker ran");
    assert_eq!(context.get("lun").map(String::as_str), Some("4"));

    let failed = json!({"status": {"attached": false, "attachError": {"message": "disk is attached to n9"}}});
    vas.patch_status(&name, &PatchParams::default(), &Patch::Merge(&failed)).await.expect("failed");
    let err = wait_for_attachment(&source, &name, DRIVER, "h1", "n1", Duration::from_secs(60))
        .await
        .expect_err("the attach error");
    assert!(err.ends_with("disk is attached to n9"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_pod_volume_is_one_event_on_the_pod_with_kubelets_reason_and_a_growing_count() {
    use k8s_openapi::api::core::v1::Event;
    use kvol_cluster::events::{ApiNodeEvents, EventWriter};
    use kvol_node::report::pod_events::{PodEventSink, VolumeFailure};
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let writer = EventWriter::start("n1".into(), std::sync::Arc::new(ApiNodeEvents::new(client.clone())));
    let failure = |count| VolumeFailure {
        pod: "default/web".into(),
        pod_uid: "uid-web".into(),
        volume: "data".into(),
        operation: "volume_attach",
        block: false,
        count,
        error: "attach of volume \"h1\" failed (volumeattachment csi-1): disk is attached to n9".into(),
    };
    let events = Api::<Event>::namespaced(client.clone(), "default");
    let deadline = Instant::now() + Duration::from_secs(60);
    for count in [1, 1, 2, 2, 3] {
        writer.report(&[failure(count)]);
        loop {
            let mut list = events.list(&Default::default()).await.expect("events listed").items;
            // The API server reports about itself too: only the pod's Events count.
            list.retain(|e| e.involved_object.kind.as_deref() == Some("Pod"));
            if list.iter().any(|e| e.count == Some(count as i32)) {
                assert_eq!(list.len(), 1, "one event per failure: {list:?}");
                let e = &list[0];
                assert_eq!(e.reason.as_deref(), Some("FailedAttachVolume"));
                assert_eq!(e.type_.as_deref(), Some("Warning"));
                assert_eq!(e.involved_object.name.as_deref(), Some("web"));
                assert!(
                    e.message.as_deref().unwrap_or_default().ends_with("disk is attached to n9"),
                    "{e:?}"
                );
                break;
            }
            assert!(Instant::now() < deadline, "the event never reached count {count}: {list:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// Creates `count` objects no pod of the nodes under test references: PVs, claims, and pods
/// on another node, in equal thirds, 16 requests at a time.
async fn unrelated_objects(client: &Client, prefix: &str, count: usize) {
    use futures::StreamExt;
    let pvs = Api::<PersistentVolume>::all(client.clone());
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    futures::stream::iter(0..count)
        .for_each_concurrent(16, |i| {
            let (pvs, claims, pods) = (pvs.clone(), claims.clone(), pods.clone());
            async move {
                let name = format!("{prefix}-{i}");
                match i % 3 {
                    0 => drop(
                        create(
                            &pvs,
                            json!({"metadata": {"name": name}, "spec": {
                        "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
                        "csi": {"driver": DRIVER, "volumeHandle": name}}}),
                        )
                        .await,
                    ),
                    1 => drop(
                        create(
                            &claims,
                            json!({"metadata": {"name": name}, "spec": {
                        "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}),
                        )
                        .await,
                    ),
                    _ => drop(
                        create(
                            &pods,
                            kvol_test_support::pods::mounting_its_volumes(
                                json!({"metadata": {"name": name}, "spec": {"nodeName": "elsewhere",
                        "containers": [{"name": "c", "image": "none"}],
                        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": name}}]}}),
                            ),
                        )
                        .await,
                    ),
                }
            }
        })
        .await;
}

/// One node's life seen by a fresh source: its first pod (with a claim) there at start,
/// `unrelated` objects created elsewhere while it watches, then its second pod; what the
/// source took from the API server.
async fn node_traffic(client: &Client, node: &str, unrelated: usize) -> kvol_cluster::source::TrafficCount {
    pod_with_claim(client, &format!("{node}-a"), node).await;
    let source = ApiSource::start(client.clone(), node).await;
    unrelated_objects(client, &format!("{node}-during"), unrelated).await;
    pod_with_claim(client, &format!("{node}-b"), node).await;
    until(&source, "the node's second pod, its claim and its volume", |s| {
        s.pods.len() == 2 && s.claims.len() == 2 && s.persistent_volumes.len() == 2
    })
    .await;
    let set = source.current();
    let own = [format!("default/{node}-a"), format!("default/{node}-b")];
    assert_eq!(keys(&set.pods), own.iter().map(String::as_str).collect::<Vec<_>>(), "only the node's pods");
    let traffic = source.traffic();
    Box::new(source).shutdown();
    traffic
}

/// Kubelet's design, and the proof: a node's load on the API grows with its own pods,
/// not with the cluster. The same node life with 2,000 unrelated PVs, claims and pods in the
/// cluster (and 200 more created while it watches) takes exactly what it takes with none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nodes_api_traffic_does_not_grow_with_the_cluster() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    class_and_driver(&client).await;
    let quiet = node_traffic(&client, "quiet", 0).await;
    let started = Instant::now();
    unrelated_objects(&client, "before", 2000).await;
    let filled = started.elapsed();
    let busy = node_traffic(&client, "busy", 200).await;
    println!(
        "a node's traffic: {quiet:?} in an empty cluster, {busy:?} beside 2,000 unrelated objects (created in {filled:?}) and 200 more made while it watched"
    );
    assert_eq!(busy, quiet, "the node's traffic grew with the cluster");
    // Its two claims and two volumes followed by a watch each, its StorageClass read.
    assert!(
        quiet.watched_objects >= 3 && quiet.object_watches == 4 && quiet.reads >= 1,
        "the count saw the node's own objects: {quiet:?}"
    );
}

/// Tokens minted through the real TokenRequest API for a pod's service account: bound to the
/// pod, for the audience asked; the API server's TokenReview accepts them as the account
/// and the pod. A pod that does not exist (a uid that does not match) gets none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_are_minted_for_the_pods_service_account_bound_to_the_pod() {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    use kvol_cluster::tokens::ApiTokens;
    use kvol_csi::{TokenAudience, TokenSource};
    use kvol_plugin::plugin::PodInfo;
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), "default"),
        json!({"metadata": {"name": "web"}}),
    )
    .await;
    let pod: Pod = create(
        &Api::<Pod>::namespaced(client.clone(), "default"),
        json!({"metadata": {"name": "web-0"}, "spec": {"nodeName": "n1", "serviceAccountName": "web",
            "containers": [{"name": "c", "image": "none"}]}}),
    )
    .await;
    let info = PodInfo {
        name: "web-0".into(),
        namespace: "default".into(),
        uid: pod.metadata.uid.clone().expect("a uid"),
        service_account: "web".into(),
        ..PodInfo::default()
    };
    let tokens = ApiTokens::new(client.clone());
    let request = TokenAudience { audience: "vault".into(), expiration_seconds: Some(3600) };
    let status = tokens.token(&info, &request).await.expect("a token");
    let token = status.token.expect("the token");
    assert!(status.expiration_timestamp.is_some());

    let review: TokenReview = create(
        &Api::<TokenReview>::all(client.clone()),
        serde_json::to_value(TokenReview {
            spec: TokenReviewSpec { token, audiences: Some(vec!["vault".into()]) },
            ..TokenReview::default()
        })
        .unwrap(),
    )
    .await;
    let reviewed = review.status.expect("a review");
    assert_eq!(reviewed.authenticated, Some(true), "{reviewed:?}");
    let user = reviewed.user.expect("a user");
    assert_eq!(user.username.as_deref(), Some("system:serviceaccount:default:web"));
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["web-0".to_string()]),
        "{extra:?}"
    );
    assert_eq!(reviewed.audiences, Some(vec!["vault".to_string()]));

    let stranger = PodInfo { uid: "not-the-pods-uid".into(), ..info };
    let refused = tokens.token(&stranger, &request).await.expect_err("bound to a pod that is not there");
    assert!(refused.contains("serviceaccount default/web"), "{refused}");
}
