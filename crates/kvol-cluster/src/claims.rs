//! Claims' status after the node grew their filesystem, written as kubelet writes it: [`ClaimStatusWriter`] merge-patches `status.capacity` and the conditions without `FileSystemResizePending`, once per version of the claim.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};
use kube::{Api, Client};
use kvol_node::report::claim_status::{ClaimResized, ClaimStatusSink};

/// Patches claims' status through the API server; the same change for the same version of the
/// claim is not written again (the source's copy lags the write), a failed one is tried again at
/// the next report, and a claim changed since (the resizer marked it pending after the write)
/// is written again.
pub struct ClaimStatusWriter {
    client: Client,
    written: Arc<Mutex<BTreeMap<String, ClaimResized>>>,
}

impl std::fmt::Debug for ClaimStatusWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClaimStatusWriter").finish_non_exhaustive()
    }
}

impl ClaimStatusWriter {
    pub fn new(client: Client) -> ClaimStatusWriter {
        ClaimStatusWriter { client, written: Arc::new(Mutex::new(BTreeMap::new())) }
    }
}

/// The merge patch of a claim's status kubelet's `MarkFSResizeFinished` amounts to.
pub fn status_patch(resized: &ClaimResized) -> serde_json::Value {
    serde_json::json!({"status": {
        "capacity": {"storage": resized.capacity_bytes.to_string()},
        "conditions": resized.conditions,
    }})
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
            tokio::spawn(async move {
                let api: Api<PersistentVolumeClaim> = Api::namespaced(client, &claim.namespace);
                let patch = status_patch(&claim);
                match api.patch_status(&claim.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                    Ok(_) => {
                        tracing::info!(claim = %key, bytes = claim.capacity_bytes, "claim status: filesystem resized")
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

    #[test]
    fn the_patch_sets_the_capacity_and_the_conditions_left() {
        let resized = ClaimResized {
            namespace: "ns".into(),
            name: "c".into(),
            capacity_bytes: 33554432,
            conditions: vec![
                serde_json::from_value(serde_json::json!({"type": "Other", "status": "True"})).unwrap(),
            ],
            resource_version: Some("7".into()),
        };
        assert_eq!(
            status_patch(&resized),
            serde_json::json!({"status": {"capacity": {"storage": "33554432"}, "conditions": [{"type": "Other", "status": "True"}]}})
        );
    }
}
