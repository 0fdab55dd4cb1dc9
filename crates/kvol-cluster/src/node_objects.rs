//! The node's storage objects in the API: its CSINode (owned by the Node), the node-ID annotation, the topology labels and `status.volumesInUse`, applied server-side as field manager `kvol` so no other writer's fields are touched.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kvol_api::backoff::Backoff;
use kvol_api::keys::ANN_CONTROLLER_MANAGED_ATTACH_DETACH;
use kvol_csi_rules::csinode::{ANN_NODE_ID, set_node_owner};
use kvol_node::report::node_storage::{NodeStorage, NodeStorageSink};
use serde_json::{Value, json};
use tokio::sync::watch;

/// The field manager kvol's server-side applies use.
pub const FIELD_MANAGER: &str = "kvol";

/// Reads and writes this node's storage objects.
#[async_trait]
pub trait NodeObjects: Send + Sync + std::fmt::Debug {
    /// The Node's uid, `None` when the Node does not exist.
    async fn node_uid(&self, node: &str) -> Result<Option<String>, String>;
    /// Applies the CSINode (as built by [`csinode_body`]).
    async fn apply_csi_node(&self, body: Value) -> Result<(), String>;
    /// Applies kvol's fields of the Node's metadata ([`node_body`]).
    async fn apply_node(&self, node: &str, body: Value) -> Result<(), String>;
    /// Applies kvol's fields of the Node's status ([`node_status_body`]).
    async fn apply_node_status(&self, node: &str, body: Value) -> Result<(), String>;
}

/// The CSINode to apply: the bookkeeping's object with the Node as its owner.
pub fn csinode_body(csinode: &CSINode, node: &str, node_uid: &str) -> Value {
    let mut csinode = csinode.clone();
    set_node_owner(&mut csinode, node, node_uid);
    let mut body = serde_json::to_value(&csinode).unwrap_or(Value::Null);
    body["apiVersion"] = json!("storage.k8s.io/v1");
    body["kind"] = json!("CSINode");
    if let Some(meta) = body.get_mut("metadata").and_then(Value::as_object_mut) {
        for server_set in ["resourceVersion", "uid", "creationTimestamp", "managedFields", "generation"] {
            meta.remove(server_set);
        }
    }
    body
}

/// kvol's fields of the Node: `controller-managed-attach-detach: "true"` (kvol waits for the
/// attach/detach controller's VolumeAttachments, so the controller must manage the node), the
/// node-ID annotation and the drivers' topology labels; a field left out is removed by the
/// apply when kvol alone set it (another manager's stays).
pub fn node_body(node: &str, node_ids: Option<&str>, topology: &BTreeMap<String, String>) -> Value {
    let mut metadata = json!({"name": node, "annotations": {ANN_CONTROLLER_MANAGED_ATTACH_DETACH: "true"}});
    if let Some(ids) = node_ids {
        metadata["annotations"][ANN_NODE_ID] = json!(ids);
    }
    if !topology.is_empty() {
        metadata["labels"] = json!(topology);
    }
    json!({"apiVersion": "v1", "kind": "Node", "metadata": metadata})
}

/// kvol's fields of the Node's status: `volumesInUse`.
pub fn node_status_body(node: &str, volumes_in_use: &[String]) -> Value {
    json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": node}, "status": {"volumesInUse": volumes_in_use}})
}

/// [`NodeObjects`] on the API server.
#[derive(Clone)]
pub struct ApiNodeObjects {
    client: Client,
}

impl std::fmt::Debug for ApiNodeObjects {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiNodeObjects").finish_non_exhaustive()
    }
}

impl ApiNodeObjects {
    pub fn new(client: Client) -> ApiNodeObjects {
        ApiNodeObjects { client }
    }
}

fn apply_params() -> PatchParams {
    // Forced: these fields are kvol's alone (kubelet's, which kvol stands in for).
    PatchParams::apply(FIELD_MANAGER).force()
}

#[async_trait]
impl NodeObjects for ApiNodeObjects {
    async fn node_uid(&self, node: &str) -> Result<Option<String>, String> {
        let api: Api<Node> = Api::all(self.client.clone());
        let found = api.get_opt(node).await.map_err(|e| format!("cannot read node {node}: {e}"))?;
        Ok(found.and_then(|n| n.metadata.uid))
    }

    async fn apply_csi_node(&self, body: Value) -> Result<(), String> {
        let name = body["metadata"]["name"].as_str().unwrap_or_default().to_string();
        let api: Api<CSINode> = Api::all(self.client.clone());
        api.patch(&name, &apply_params(), &Patch::Apply(&body))
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot apply csinode {name}: {e}"))
    }

    async fn apply_node(&self, node: &str, body: Value) -> Result<(), String> {
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch(node, &apply_params(), &Patch::Apply(&body))
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot apply node {node}: {e}"))
    }

    async fn apply_node_status(&self, node: &str, body: Value) -> Result<(), String> {
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch_status(node, &apply_params(), &Patch::Apply(&body))
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot apply the status of node {node}: {e}"))
    }
}

/// [`NodeObjects`] in memory, for tests: one Node uid, the bodies applied, and failures to
/// give before writes succeed.
#[derive(Debug, Default)]
pub struct MemoryNodeObjects {
    pub node_uid: Mutex<Option<String>>,
    pub applied: Mutex<BTreeMap<String, Value>>,
    pub failures_left: Mutex<u32>,
}

impl MemoryNodeObjects {
    fn write(&self, key: String, body: Value) -> Result<(), String> {
        let mut left = self.failures_left.lock().unwrap_or_else(|p| p.into_inner());
        if *left > 0 {
            *left -= 1;
            return Err(format!("cannot apply {key}: the api server is away"));
        }
        self.applied.lock().unwrap_or_else(|p| p.into_inner()).insert(key, body);
        Ok(())
    }

    /// The body last applied under `key` (`csinode`, `node`, `status`).
    pub fn get(&self, key: &str) -> Option<Value> {
        self.applied.lock().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }
}

#[async_trait]
impl NodeObjects for MemoryNodeObjects {
    async fn node_uid(&self, _node: &str) -> Result<Option<String>, String> {
        Ok(self.node_uid.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }

    async fn apply_csi_node(&self, body: Value) -> Result<(), String> {
        self.write("csinode".into(), body)
    }

    async fn apply_node(&self, _node: &str, body: Value) -> Result<(), String> {
        self.write("node".into(), body)
    }

    async fn apply_node_status(&self, _node: &str, body: Value) -> Result<(), String> {
        self.write("status".into(), body)
    }
}

/// A [`NodeStorageSink`] that writes what changed to a [`NodeObjects`], the latest state only,
/// retrying failed writes on [`Backoff::default`].
///
/// Nothing is written before the first report: an agent starting knows nothing yet, and an
/// empty state written then would tell the attach/detach controller that every mounted volume
/// is unmounted.
#[derive(Debug)]
pub struct NodeWriter {
    latest: watch::Sender<NodeStorage>,
    /// The `volumesInUse` the API last accepted.
    accepted_in_use: Arc<Mutex<BTreeSet<String>>>,
}

impl NodeWriter {
    /// Starts writing node `node`'s storage to `objects`.
    pub fn start(node: String, objects: Arc<dyn NodeObjects>) -> NodeWriter {
        let (latest, rx) = watch::channel(NodeStorage::default());
        let accepted_in_use = Arc::new(Mutex::new(BTreeSet::new()));
        tokio::spawn(write_loop(node, objects, rx, Backoff::default(), Arc::clone(&accepted_in_use)));
        NodeWriter { latest, accepted_in_use }
    }
}

impl NodeStorageSink for NodeWriter {
    fn report(&self, storage: &NodeStorage) {
        // The first report is news even when it equals the empty state the channel began with.
        self.latest.send_modify(|current| *current = storage.clone());
    }

    fn reported_in_use(&self) -> Option<BTreeSet<String>> {
        Some(self.accepted_in_use.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

/// The bodies already written, so an unchanged part is not written again.
#[derive(Default)]
struct Written {
    csinode: Option<Value>,
    node: Option<Value>,
    status: Option<Value>,
}

async fn write_loop(
    node: String,
    objects: Arc<dyn NodeObjects>,
    mut rx: watch::Receiver<NodeStorage>,
    backoff: Backoff,
    accepted_in_use: Arc<Mutex<BTreeSet<String>>>,
) {
    let mut written = Written::default();
    let mut failures = 0u32;
    // The channel's first value is no report: wait for the agent's first.
    if rx.changed().await.is_err() {
        return;
    }
    loop {
        let storage = rx.borrow_and_update().clone();
        match write_once(&node, objects.as_ref(), &storage, &mut written).await {
            Ok(()) => {
                failures = 0;
                *accepted_in_use.lock().unwrap_or_else(|p| p.into_inner()) =
                    storage.volumes_in_use.iter().cloned().collect();
                if rx.changed().await.is_err() {
                    return;
                }
            }
            Err(e) => {
                failures += 1;
                tracing::warn!(node, error = %e, attempt = failures, "cannot write the node's storage objects; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(backoff.delay(failures)) => {}
                    changed = rx.changed() => if changed.is_err() { return },
                }
            }
        }
    }
}

/// Writes the parts of `storage` that differ from `written`.
async fn write_once(
    node: &str,
    objects: &dyn NodeObjects,
    storage: &NodeStorage,
    written: &mut Written,
) -> Result<(), String> {
    let node_change = Some(node_body(node, storage.node_ids.as_deref(), &storage.topology_labels))
        .filter(|body| written.node.as_ref() != Some(body));
    if node_change.is_some() || storage.csi_node.is_some() {
        // An apply would create a missing Node, and a CSINode needs the Node's uid as owner.
        let Some(uid) = objects.node_uid(node).await? else {
            return Err(format!("node {node} does not exist in the api"));
        };
        // The Node first, as kubelet's InstallCSIDriver does: whoever sees a driver in the
        // CSINode (scheduler, provisioner) finds its node ID and topology labels already there.
        if let Some(body) = node_change {
            objects.apply_node(node, body.clone()).await?;
            written.node = Some(body);
        }
        if let Some(csinode) = &storage.csi_node {
            let body = csinode_body(csinode, node, &uid);
            if written.csinode.as_ref() != Some(&body) {
                objects.apply_csi_node(body.clone()).await?;
                written.csinode = Some(body);
            }
        }
    }
    let body = node_status_body(node, &storage.volumes_in_use);
    if written.status.as_ref() != Some(&body) {
        objects.apply_node_status(node, body.clone()).await?;
        written.status = Some(body);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvol_csi_rules::csinode::initial_csinode;

    #[test]
    fn the_bodies_carry_only_kvols_fields() {
        let mut csinode = initial_csinode("n1", &["kubernetes.io/gce-pd"]);
        csinode.metadata.resource_version = Some("7".into());
        let body = csinode_body(&csinode, "n1", "u-1");
        assert_eq!(body["kind"], "CSINode");
        assert_eq!(body["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(body["metadata"]["ownerReferences"][0]["kind"], "Node");
        assert!(body["metadata"].get("resourceVersion").is_none());
        let zone: BTreeMap<String, String> = [("topology.kvol.io/zone".to_string(), "z1".to_string())].into();
        let none = BTreeMap::new();
        let cases: &[(Option<&str>, &BTreeMap<String, String>, Value)] = &[
            (
                None,
                &none,
                json!({"name": "n1", "annotations": {ANN_CONTROLLER_MANAGED_ATTACH_DETACH: "true"}}),
            ),
            (
                Some(r#"{"d":"n1"}"#),
                &none,
                json!({"name": "n1", "annotations": {ANN_CONTROLLER_MANAGED_ATTACH_DETACH: "true", ANN_NODE_ID: r#"{"d":"n1"}"#}}),
            ),
            (
                None,
                &zone,
                json!({"name": "n1", "annotations": {ANN_CONTROLLER_MANAGED_ATTACH_DETACH: "true"}, "labels": {"topology.kvol.io/zone": "z1"}}),
            ),
            (
                Some("{}"),
                &zone,
                json!({"name": "n1", "annotations": {ANN_CONTROLLER_MANAGED_ATTACH_DETACH: "true", ANN_NODE_ID: "{}"}, "labels": {"topology.kvol.io/zone": "z1"}}),
            ),
        ];
        for (ids, labels, metadata) in cases {
            assert_eq!(node_body("n1", *ids, labels)["metadata"], *metadata, "{ids:?} {labels:?}");
        }
        assert_eq!(node_status_body("n1", &["a".into()])["status"], json!({"volumesInUse": ["a"]}));
    }

    #[tokio::test(start_paused = true)]
    async fn the_writer_retries_until_the_api_takes_the_latest_state() {
        let objects = Arc::new(MemoryNodeObjects::default());
        *objects.node_uid.lock().unwrap() = Some("u-1".into());
        *objects.failures_left.lock().unwrap() = 3;
        let writer = NodeWriter::start("n1".into(), objects.clone());
        writer.report(&NodeStorage {
            csi_node: Some(initial_csinode("n1", &[])),
            node_ids: Some(r#"{"d":"x"}"#.into()),
            volumes_in_use: vec!["kubernetes.io/csi/d^h".into()],
            topology_labels: BTreeMap::new(),
        });
        for _ in 0..100 {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            if objects.get("status").is_some() {
                break;
            }
        }
        assert_eq!(*objects.failures_left.lock().unwrap(), 0);
        assert_eq!(objects.get("csinode").unwrap()["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(objects.get("node").unwrap()["metadata"]["annotations"][ANN_NODE_ID], r#"{"d":"x"}"#);
        assert_eq!(objects.get("status").unwrap()["status"]["volumesInUse"][0], "kubernetes.io/csi/d^h");
    }

    #[tokio::test(start_paused = true)]
    async fn a_missing_node_is_retried_not_written_without_an_owner() {
        let objects = Arc::new(MemoryNodeObjects::default());
        let writer = NodeWriter::start("n1".into(), objects.clone());
        writer.report(&NodeStorage { csi_node: Some(initial_csinode("n1", &[])), ..NodeStorage::default() });
        tokio::time::sleep(std::time::Duration::from_secs(5)).await;
        assert!(objects.get("csinode").is_none());
        assert!(objects.get("node").is_none(), "an apply would have created the node");
        *objects.node_uid.lock().unwrap() = Some("u-2".into());
        tokio::time::sleep(std::time::Duration::from_secs(60)).await;
        assert_eq!(objects.get("csinode").unwrap()["metadata"]["ownerReferences"][0]["uid"], "u-2");
    }

    #[tokio::test(start_paused = true)]
    async fn nothing_is_written_before_the_first_report_and_in_use_is_known_once_taken() {
        let objects = Arc::new(MemoryNodeObjects::default());
        *objects.node_uid.lock().unwrap() = Some("u-1".into());
        let writer = NodeWriter::start("n1".into(), objects.clone());
        tokio::time::sleep(std::time::Duration::from_secs(10)).await;
        for part in ["node", "csinode", "status"] {
            assert!(objects.get(part).is_none(), "{part} written before any report");
        }
        assert_eq!(writer.reported_in_use(), Some(BTreeSet::new()));
        // An empty first report is written all the same: it is what the agent knows.
        writer.report(&NodeStorage::default());
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert_eq!(objects.get("status").unwrap()["status"]["volumesInUse"], json!([]));
        assert_eq!(
            objects.get("node").unwrap()["metadata"]["annotations"][ANN_CONTROLLER_MANAGED_ATTACH_DETACH],
            "true"
        );
        writer.report(&NodeStorage {
            volumes_in_use: vec!["kubernetes.io/csi/d^h".into()],
            ..NodeStorage::default()
        });
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        assert_eq!(writer.reported_in_use(), Some(["kubernetes.io/csi/d^h".to_string()].into()));
    }
}
