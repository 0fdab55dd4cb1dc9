//! What kubelet writes on a claim once the node has grown its filesystem, decided purely: the claim's `status.capacity` raised to the size the node made, and its `FileSystemResizePending` condition gone (kubelet's `MarkFSResizeFinished`).

use std::collections::BTreeMap;

use crate::model::{ActualState, ObjectSet};

/// A claim to tell its filesystem's new size.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimResized {
    pub namespace: String,
    pub name: String,
    /// The size the node made the filesystem, in bytes.
    pub capacity_bytes: u64,
    /// The claim's conditions without `FileSystemResizePending` (a merge patch replaces the
    /// list whole).
    pub conditions: Vec<k8s_openapi::api::core::v1::PersistentVolumeClaimCondition>,
    /// The claim's version this was decided from: a claim changed since (the resizer marked it
    /// pending after kvol wrote) is written again.
    pub resource_version: Option<String>,
}

/// Receives the claims to update after every pass; the cluster's writer patches their status.
pub trait ClaimStatusSink: Send + Sync + std::fmt::Debug {
    fn report(&self, resized: &[ClaimResized]);
}

/// The condition the resizer sets and the node clears.
pub const RESIZE_PENDING: &str = "FileSystemResizePending";

/// The claims of published volumes the node has grown whose status does not say so yet: a
/// smaller `status.capacity`, or a `FileSystemResizePending` condition. Pure.
pub fn resized_claims(objects: &ObjectSet, actual: &ActualState) -> Vec<ClaimResized> {
    let mut out: BTreeMap<String, ClaimResized> = BTreeMap::new();
    for published in actual.published.values().filter(|p| !p.uncertain) {
        let (Some(size), Some(pv)) = (published.fs_size, published.spec.pv()) else { continue };
        let Some(claim_ref) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else { continue };
        let namespace = claim_ref.namespace.clone().unwrap_or_else(|| "default".into());
        let name = claim_ref.name.clone().unwrap_or_default();
        let key = format!("{namespace}/{name}");
        let Some(claim) = objects.claims.get(&key) else { continue };
        let status = claim.status.as_ref();
        let shown = status
            .and_then(|s| s.capacity.as_ref())
            .and_then(|c| c.get("storage"))
            .and_then(|q| kvol_api::quantity::parse_bytes(&q.0).ok());
        let conditions = status.and_then(|s| s.conditions.clone()).unwrap_or_default();
        let pending = conditions.iter().any(|c| c.type_ == RESIZE_PENDING);
        if shown.is_some_and(|s| s >= size) && !pending {
            continue;
        }
        let kept = conditions.into_iter().filter(|c| c.type_ != RESIZE_PENDING).collect();
        let resource_version = claim.metadata.resource_version.clone();
        let capacity_bytes = size.max(shown.unwrap_or(0));
        out.insert(key, ClaimResized { namespace, name, capacity_bytes, conditions: kept, resource_version });
    }
    out.into_values().collect()
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::model::{PodVolumeKey, PublishedVolume};

    fn claim(status: serde_json::Value) -> k8s_openapi::api::core::v1::PersistentVolumeClaim {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": "c", "namespace": "ns"}, "status": status}),
        )
        .unwrap()
    }

    #[test]
    fn a_grown_claim_is_told_once_its_status_lags() {
        let pv: k8s_openapi::api::core::v1::PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv"},
            "spec": {"capacity": {"storage": "32Mi"}, "claimRef": {"namespace": "ns", "name": "c"}, "csi": {"driver": "d", "volumeHandle": "h"}}
        }))
        .unwrap();
        let pending = serde_json::json!([{"type": "FileSystemResizePending", "status": "True"}, {"type": "Other", "status": "True"}]);
        /// (what, the node's size, the claim's status, expected capacity and conditions left)
        type Case = (&'static str, Option<u64>, serde_json::Value, Option<(u64, Vec<&'static str>)>);
        let cases: Vec<Case> = vec![
            (
                "grown, pending: told, condition gone",
                Some(32 << 20),
                serde_json::json!({"capacity": {"storage": "16Mi"}, "conditions": pending}),
                Some((32 << 20, vec!["Other"])),
            ),
            (
                "grown, status behind without a condition: told",
                Some(32 << 20),
                serde_json::json!({"capacity": {"storage": "16Mi"}}),
                Some((32 << 20, vec![])),
            ),
            (
                "status already right: nothing",
                Some(32 << 20),
                serde_json::json!({"capacity": {"storage": "32Mi"}}),
                None,
            ),
            ("no size known: nothing", None, serde_json::json!({"capacity": {"storage": "16Mi"}}), None),
        ];
        for (what, size, status, want) in cases {
            let mut objects = ObjectSet::default();
            objects.claims.insert("ns/c".into(), claim(status));
            let mut actual = ActualState::default();
            let key = PodVolumeKey { pod_uid: "u".into(), volume: "v".into() };
            let record = PublishedVolume {
                projection: None,
                fs_size: size,
                key: key.clone(),
                pod: Default::default(),
                pod_name: "ns/p".into(),
                unique_name: "d^h".into(),
                plugin: "d".into(),
                spec: kvol_plugin::VolumeSpec::persistent(Arc::new(pv.clone())),
                target: "/t".into(),
                staging_path: None,
                device_path: None,
                uncertain: false,
            };
            actual.published.insert(key, record);
            let got: Vec<(u64, Vec<String>)> = resized_claims(&objects, &actual)
                .into_iter()
                .map(|r| (r.capacity_bytes, r.conditions.into_iter().map(|c| c.type_).collect()))
                .collect();
            let want: Vec<(u64, Vec<String>)> =
                want.into_iter().map(|(b, c)| (b, c.into_iter().map(String::from).collect())).collect();
            assert_eq!(got, want, "{what}");
        }
    }
}
