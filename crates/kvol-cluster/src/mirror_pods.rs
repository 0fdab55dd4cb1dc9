//! Static pods as kubelet shows them to the cluster: a manifests directory's pods named `<name>-<node>` and marked as the file's, and for each a mirror pod in the API (the same pod, annotated `kubernetes.io/config.mirror`, owned by the Node) that the node keeps — made when missing, replaced when outdated or being deleted, removed when its static pod is gone — and never runs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};
use kvol_node::model::ObjectSet;
use serde_json::json;
use tokio::sync::watch;

/// The annotation naming where a pod came from (`file` for a static pod).
pub const CONFIG_SOURCE: &str = "kubernetes.io/config.source";
/// The annotation carrying a static pod's hash (kvol: its uid).
pub const CONFIG_HASH: &str = "kubernetes.io/config.hash";
/// The annotation marking a mirror pod, its value the static pod's hash.
pub const CONFIG_MIRROR: &str = "kubernetes.io/config.mirror";

/// A manifests directory's pod as a static pod of `node`: named `<name>-<node>` (kubelet's
/// name for it), marked as the file's, its hash its uid.
pub fn as_static(pod: &Pod, node: &str) -> Pod {
    let mut pod = pod.clone();
    let name = pod.metadata.name.clone().unwrap_or_default();
    pod.metadata.name = Some(format!("{name}-{}", node.to_lowercase()));
    let uid = pod.metadata.uid.clone().unwrap_or_default();
    let annotations = pod.metadata.annotations.get_or_insert_with(BTreeMap::new);
    annotations.insert(CONFIG_SOURCE.into(), "file".into());
    annotations.insert(CONFIG_HASH.into(), uid);
    pod
}

/// Whether `pod` is a static pod (from a file).
pub fn is_static(pod: &Pod) -> bool {
    annotation(pod, CONFIG_SOURCE).is_some_and(|s| s == "file")
}

/// Whether `pod` is a mirror pod (kubelet never runs one).
pub fn is_mirror(pod: &Pod) -> bool {
    annotation(pod, CONFIG_MIRROR).is_some()
}

fn annotation<'a>(pod: &'a Pod, key: &str) -> Option<&'a String> {
    pod.metadata.annotations.as_ref()?.get(key)
}

fn key_of(pod: &Pod) -> String {
    format!(
        "{}/{}",
        pod.metadata.namespace.as_deref().unwrap_or("default"),
        pod.metadata.name.as_deref().unwrap_or("")
    )
}

/// What to do about the mirror pods.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MirrorPlan {
    /// Mirrors to delete (outdated, being deleted, or of no static pod): `(namespace, name, uid)`.
    pub delete: Vec<(String, String, String)>,
    /// Static pods whose mirror to create, by key.
    pub create: Vec<String>,
}

/// The plan that makes `mirrors` (the node's mirror pods in the API) match `statics` (the
/// node's static pods): a mirror stays only while its hash is its static pod's and it is not
/// being deleted; a static pod without such a mirror gets one, once the old one is gone.
pub fn plan(statics: &[&Pod], mirrors: &[Pod]) -> MirrorPlan {
    let wanted: BTreeMap<String, &str> = statics
        .iter()
        .map(|p| (key_of(p), annotation(p, CONFIG_HASH).map(String::as_str).unwrap_or_default()))
        .collect();
    let mut plan = MirrorPlan::default();
    let mut kept = std::collections::BTreeSet::new();
    for mirror in mirrors {
        let key = key_of(mirror);
        let current = wanted
            .get(&key)
            .is_some_and(|hash| annotation(mirror, CONFIG_MIRROR).map(String::as_str) == Some(*hash));
        if current && mirror.metadata.deletion_timestamp.is_none() {
            kept.insert(key);
        } else {
            let namespace = mirror.metadata.namespace.clone().unwrap_or_default();
            let name = mirror.metadata.name.clone().unwrap_or_default();
            plan.delete.push((namespace, name, mirror.metadata.uid.clone().unwrap_or_default()));
        }
    }
    let present: std::collections::BTreeSet<String> = mirrors.iter().map(key_of).collect();
    // A static pod whose old mirror is being removed gets its new one on a later pass.
    plan.create = wanted.keys().filter(|k| !kept.contains(*k) && !present.contains(*k)).cloned().collect();
    plan
}

/// The mirror pod of `pod` on `node` (the Node's uid `node_uid`): the pod without its uid and
/// status, annotated with its hash, owned by the Node, bound to it.
pub fn mirror_of(pod: &Pod, node: &str, node_uid: &str) -> Pod {
    let mut mirror = pod.clone();
    mirror.status = None;
    mirror.metadata.uid = None;
    mirror.metadata.resource_version = None;
    mirror.metadata.creation_timestamp = None;
    let hash = annotation(pod, CONFIG_HASH).cloned().unwrap_or_default();
    mirror.metadata.annotations.get_or_insert_with(BTreeMap::new).insert(CONFIG_MIRROR.into(), hash);
    mirror.metadata.owner_references = serde_json::from_value(json!([{
        "apiVersion": "v1", "kind": "Node", "name": node, "uid": node_uid, "controller": true
    }]))
    .ok();
    if let Some(spec) = mirror.spec.as_mut() {
        spec.node_name = Some(node.to_string());
    }
    mirror
}

/// Keeps the node's mirror pods: at every change of the node's objects and every 10 s.
#[derive(Debug)]
pub struct MirrorKeeper {
    task: tokio::task::JoinHandle<()>,
}

impl MirrorKeeper {
    pub fn start(
        client: kube::Client,
        node: String,
        objects: watch::Receiver<Arc<ObjectSet>>,
    ) -> MirrorKeeper {
        MirrorKeeper { task: tokio::spawn(keep(client, node, objects)) }
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

async fn keep(client: kube::Client, node: String, mut objects: watch::Receiver<Arc<ObjectSet>>) {
    let pods_on_node = ListParams::default().fields(&format!("spec.nodeName={node}"));
    loop {
        let set = Arc::clone(&objects.borrow_and_update());
        let statics: Vec<&Pod> = set.pods.values().map(Arc::as_ref).filter(|p| is_static(p)).collect();
        match Api::<Pod>::all(client.clone()).list(&pods_on_node).await {
            Ok(listed) => {
                let mirrors: Vec<Pod> = listed.items.into_iter().filter(is_mirror).collect();
                apply(&client, &node, &statics, &plan(&statics, &mirrors)).await;
            }
            Err(e) => tracing::warn!(node, error = %e, "cannot list the node's mirror pods"),
        }
        tokio::select! {
            changed = objects.changed() => if changed.is_err() { return },
            _ = tokio::time::sleep(Duration::from_secs(10)) => {}
        }
    }
}

async fn apply(client: &kube::Client, node: &str, statics: &[&Pod], plan: &MirrorPlan) {
    for (namespace, name, uid) in &plan.delete {
        let params = DeleteParams {
            grace_period_seconds: Some(0),
            preconditions: Some(Preconditions { uid: Some(uid.clone()), resource_version: None }),
            ..Default::default()
        };
        match Api::<Pod>::namespaced(client.clone(), namespace).delete(name, &params).await {
            Ok(_) => {
                tracing::info!(pod = %format!("{namespace}/{name}"), "mirror pod deleted (outdated or of no static pod)")
            }
            Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
            Err(e) => {
                tracing::warn!(pod = %format!("{namespace}/{name}"), error = %e, "mirror pod not deleted")
            }
        }
    }
    if plan.create.is_empty() {
        return;
    }
    let node_uid = match Api::<Node>::all(client.clone()).get(node).await {
        Ok(found) => found.metadata.uid.unwrap_or_default(),
        Err(e) => return tracing::warn!(node, error = %e, "no mirror pods made: the node's uid is unknown"),
    };
    for pod in statics.iter().filter(|p| plan.create.contains(&key_of(p))) {
        let mirror = mirror_of(pod, node, &node_uid);
        let namespace = mirror.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        match Api::<Pod>::namespaced(client.clone(), &namespace).create(&PostParams::default(), &mirror).await
        {
            Ok(_) => tracing::info!(pod = %key_of(pod), "mirror pod created"),
            Err(kube::Error::Api(e)) if e.code == 409 => {}
            Err(e) => tracing::warn!(pod = %key_of(pod), error = %e, "mirror pod not created"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(name: &str, uid: &str, annotations: serde_json::Value, deleting: bool) -> Pod {
        let mut pod: Pod = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": "default", "uid": uid, "annotations": annotations},
            "spec": {"containers": [{"name": "main", "image": "busybox"}]}}))
        .unwrap();
        if deleting {
            pod.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        }
        pod
    }

    fn static_pod(name: &str, hash: &str) -> Pod {
        pod(name, hash, json!({CONFIG_SOURCE: "file", CONFIG_HASH: hash}), false)
    }

    fn mirror(name: &str, hash: &str, uid: &str, deleting: bool) -> Pod {
        pod(name, uid, json!({CONFIG_SOURCE: "file", CONFIG_HASH: hash, CONFIG_MIRROR: hash}), deleting)
    }

    #[test]
    fn a_manifests_pod_named_and_marked_as_kubelets_static_pod() {
        let made = as_static(&pod("web", "u1", json!({"note": "x"}), false), "Node-A");
        assert_eq!(made.metadata.name.as_deref(), Some("web-node-a"));
        let annotations = made.metadata.annotations.clone().unwrap();
        assert_eq!((annotations[CONFIG_SOURCE].as_str(), annotations[CONFIG_HASH].as_str()), ("file", "u1"));
        assert!(is_static(&made) && !is_mirror(&made));
        let mirror = mirror_of(&made, "node-a", "n-uid");
        assert!(is_mirror(&mirror) && mirror.metadata.uid.is_none());
        assert_eq!(mirror.metadata.annotations.unwrap()[CONFIG_MIRROR], "u1");
        let owner = &mirror.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.kind.as_str(), owner.uid.as_str(), owner.controller),
            ("Node", "n-uid", Some(true))
        );
        assert_eq!(mirror.spec.unwrap().node_name.as_deref(), Some("node-a"));
    }

    #[test]
    fn mirrors_made_kept_replaced_and_removed() {
        let key = |name: &str| format!("default/{name}");
        let gone = |name: &str, uid: &str| ("default".to_string(), name.to_string(), uid.to_string());
        // (what, static pods, mirrors, want)
        let table = [
            (
                "none yet",
                vec![static_pod("a", "h1")],
                vec![],
                MirrorPlan { delete: vec![], create: vec![key("a")] },
            ),
            (
                "current",
                vec![static_pod("a", "h1")],
                vec![mirror("a", "h1", "m1", false)],
                MirrorPlan::default(),
            ),
            (
                "outdated: removed now, made again next pass",
                vec![static_pod("a", "h2")],
                vec![mirror("a", "h1", "m1", false)],
                MirrorPlan { delete: vec![gone("a", "m1")], create: vec![] },
            ),
            (
                "being deleted: removed",
                vec![static_pod("a", "h1")],
                vec![mirror("a", "h1", "m1", true)],
                MirrorPlan { delete: vec![gone("a", "m1")], create: vec![] },
            ),
            (
                "of no static pod: removed",
                vec![],
                vec![mirror("b", "h9", "m9", false)],
                MirrorPlan { delete: vec![gone("b", "m9")], create: vec![] },
            ),
        ];
        for (what, statics, mirrors, want) in table {
            let statics: Vec<&Pod> = statics.iter().collect();
            assert_eq!(plan(&statics, &mirrors), want, "{what}");
        }
    }
}
