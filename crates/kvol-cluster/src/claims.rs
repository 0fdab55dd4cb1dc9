//! Claims' status after the node grew their filesystem, written as kubelet writes it: [`ClaimStatusWriter`] merge-patches `status.capacity` and the conditions without `FileSystemResizePending` (and `resizeStatus` with `RecoverVolumeExpansionFailure`), once per version of the claim, then tells the claim and its pods (`FileSystemResizeSuccessful`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Event;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kvol_node::report::claim_status::{ClaimResized, ClaimStatusSink};

use crate::events::NodeEvents;

/// Patches claims' status through the API server; the same change for the same version of the
/// claim is not written again (the source's copy lags the write), a failed one is tried again at
/// the next report, and a claim changed since (the resizer marked it pending after the write)
/// is written again.
pub struct ClaimStatusWriter {
    client: Client,
    written: Arc<Mutex<BTreeMap<String, ClaimResized>>>,
    /// The size each claim's pods were last told of: a claim written twice for one growth
    /// (the resizer's condition arrived after the first write) is told once, as kubelet tells
    /// once per expansion.
    told: Arc<Mutex<BTreeMap<String, u64>>>,
    node: String,
    /// `RecoverVolumeExpansionFailure` is on: `resizeStatus` is cleared too.
    recovery: bool,
    events: Arc<dyn NodeEvents>,
}

impl std::fmt::Debug for ClaimStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStatusWriter").finish_non_exhaustive()
    }
}

impl ClaimStatusWriter {
    /// Writes through `client`, as the agent of `node`; `events` receives the Events.
    pub fn new(
        client: Client,
        node: String,
        recovery: bool,
        events: Arc<dyn NodeEvents>,
    ) -> ClaimStatusWriter {
        ClaimStatusWriter { client, written: Arc::default(), told: Arc::default(), node, recovery, events }
    }
}

/// The merge patch of a claim's status kubelet's `MarkFSResizeFinished` amounts to (with
/// `recovery`, `resizeStatus` back to "no expansion in progress").
pub fn status_patch(resized: &ClaimResized, recovery: bool) -> serde_json::Value {
    let mut status = serde_json::json!({
        "capacity": {"storage": resized.quantity},
        "conditions": resized.conditions,
    });
    if recovery {
        status["resizeStatus"] = serde_json::json!("");
    }
    serde_json::json!({ "status": status })
}

/// kubelet's `FileSystemResizeSuccessful` Events for `resized`, on the claim and on each pod
/// using it: "MountVolume.NodeExpandVolume succeeded for volume \"<pv>\" <node>".
pub fn resize_events(resized: &ClaimResized, node: &str, now: Time) -> Vec<Event> {
    let message = format!("MountVolume.NodeExpandVolume succeeded for volume {:?} {node}", resized.volume);
    let stamp = now.0.as_nanosecond();
    let claim = serde_json::json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "name": resized.name, "namespace": resized.namespace, "uid": resized.uid,
        "resourceVersion": resized.resource_version});
    let pods = resized.pods.iter().map(|p| {
        serde_json::json!({"apiVersion": "v1", "kind": "Pod", "name": p.name, "namespace": p.namespace, "uid": p.uid})
    });
    std::iter::once(claim)
        .chain(pods)
        .map(|involved| {
            let name = format!("{}.{stamp:x}", involved["name"].as_str().unwrap_or_default());
            let body = serde_json::json!({
                "metadata": {"name": name, "namespace": involved["namespace"]},
                "involvedObject": involved,
                "reason": "FileSystemResizeSuccessful",
                "message": message,
                "type": "Normal",
                "count": 1,
                "source": {"component": "kvol", "host": node},
                "reportingComponent": "kvol",
                "reportingInstance": node,
            });
            let mut event: Event = serde_json::from_value(body).unwrap_or_default();
            event.first_timestamp = Some(now.clone());
            event.last_timestamp = Some(now.clone());
            event
        })
        .collect()
}

impl ClaimStatusSink for ClaimStatusWriter {
    fn report(&self, resized: &[ClaimResized]) {
        for claim in resized {
            let key = format!("{}/{}", claim.namespace, claim.name);
            {
                let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
                if written.get(&key) == Some(claim) {
                    continue;
                }
                written.insert(key.clone(), claim.clone());
            }
            let (client, written, claim) = (self.client.clone(), Arc::clone(&self.written), claim.clone());
            let (node, events, recovery) = (self.node.clone(), Arc::clone(&self.events), self.recovery);
            let told = Arc::clone(&self.told);
            tokio::spawn(async move {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client, &claim.namespace);
                let patch = status_patch(&claim, recovery);
                match api.patch_status(&claim.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        tracing::info!(claim = %key, bytes = claim.capacity_bytes, "claim status: filesystem resized");
                        let first = told
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(key.clone(), claim.capacity_bytes)
                            != Some(claim.capacity_bytes);
                        let now = Time(k8s_openapi::jiff::Timestamp::now());
                        for event in resize_events(&claim, &node, now).into_iter().filter(|_| first) {
                            if let Err(e) = events.create(event).await {
                                tracing::warn!(claim = %key, error = %e, "cannot write a resize event; dropped");
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(claim = %key, error = %e, "cannot write the claim's resized status; tried again");
                        written.lock().unwrap_or_else(|e| e.into_inner()).remove(&key);
                    }
                }
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvol_node::report::claim_status::ClaimUser;

    fn resized() -> ClaimResized {
        ClaimResized {
            namespace: "ns".into(),
            name: "c".into(),
            uid: Some("claim-uid".into()),
            capacity_bytes: 2 << 30,
            quantity: "2Gi".into(),
            volume: "pvc-1".into(),
            pods: vec![ClaimUser { namespace: "ns".into(), name: "db".into(), uid: "u1".into() }],
            conditions: vec![
                serde_json::from_value(serde_json::json!({"type": "Other", "status": "True"})).unwrap(),
            ],
            resource_version: Some("7".into()),
        }
    }

    #[test]
    fn the_patch_sets_the_capacity_and_the_conditions_left() {
        // (what, RecoverVolumeExpansionFailure, the patch)
        let cases = [
            (
                "gate off",
                false,
                serde_json::json!({"status": {"capacity": {"storage": "2Gi"}, "conditions": [{"type": "Other", "status": "True"}]}}),
            ),
            (
                "gate on: resizeStatus cleared",
                true,
                serde_json::json!({"status": {"capacity": {"storage": "2Gi"}, "conditions": [{"type": "Other", "status": "True"}], "resizeStatus": ""}}),
            ),
        ];
        for (what, recovery, want) in cases {
            assert_eq!(status_patch(&resized(), recovery), want, "{what}");
        }
    }

    #[test]
    fn the_claim_and_each_pod_are_told_as_kubelet_tells_them() {
        let now = Time(k8s_openapi::jiff::Timestamp::from_second(1_700_000_000).unwrap());
        let events = resize_events(&resized(), "node-a", now);
        let got: Vec<(String, String, String, String)> = events
            .iter()
            .map(|e| {
                (
                    e.involved_object.kind.clone().unwrap_or_default(),
                    e.involved_object.name.clone().unwrap_or_default(),
                    e.reason.clone().unwrap_or_default(),
                    e.type_.clone().unwrap_or_default(),
                )
            })
            .collect();
        let row = |kind: &str, name: &str| {
            (
                kind.to_string(),
                name.to_string(),
                "FileSystemResizeSuccessful".to_string(),
                "Normal".to_string(),
            )
        };
        assert_eq!(got, [row("PersistentVolumeClaim", "c"), row("Pod", "db")]);
        for event in &events {
            assert_eq!(
                event.message.as_deref(),
                Some("MountVolume.NodeExpandVolume succeeded for volume \"pvc-1\" node-a")
            );
            assert_eq!(event.metadata.namespace.as_deref(), Some("ns"));
        }
        assert_eq!(events[1].involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(
            events[0].involved_object.uid.as_deref(),
            Some("claim-uid"),
            "kubectl describe pvc lists it"
        );
        assert_eq!(events[0].involved_object.resource_version.as_deref(), Some("7"));
        assert_ne!(events[0].metadata.name, events[1].metadata.name);
    }
}
