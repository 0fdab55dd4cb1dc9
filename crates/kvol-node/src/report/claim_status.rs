//! What kubelet writes on a claim once the node has grown its filesystem, decided purely: the claim's `status.capacity` raised to the size the node made, and its `FileSystemResizePending` condition gone (kubelet's `MarkFSResizeFinished`), with the pods to tell (`FileSystemResizeSuccessful`).

use std::collections::BTreeMap;

use crate::model::{ActualState, ObjectSet};

/// A claim to tell its filesystem's new size.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimResized {
    pub namespace: String,
    pub name: String,
    /// The claim's uid (an Event about it names it, or `kubectl describe` does not list it).
    pub uid: Option<String>,
    /// The size the node made the filesystem, in bytes.
    pub capacity_bytes: u64,
    /// `capacity_bytes` as kubelet writes it: the PersistentVolume's own quantity when the
    /// sizes agree (`2Gi` stays `2Gi`), else the bytes.
    pub quantity: String,
    /// The claim's PersistentVolume, as kubelet's messages name the volume.
    pub volume: String,
    /// The pods on this node using the volume (kubelet tells each of them too).
    pub pods: Vec<ClaimUser>,
    /// The claim's conditions without `FileSystemResizePending` (a merge patch replaces the
    /// list whole).
    pub conditions: Vec<k8s_openapi::api::core::v1::PersistentVolumeClaimCondition>,
    /// The claim's version this was decided from: a claim changed since (the resizer marked it
    /// pending after kvol wrote) is written again.
    pub resource_version: Option<String>,
}

/// A pod using a claim's volume.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ClaimUser {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// Receives the claims to update after every pass; the cluster's writer patches their status.
pub trait ClaimStatusSink: Send + Sync + std::fmt::Debug {
    fn report(&self, resized: &[ClaimResized]);
}

/// The condition the resizer sets and the node clears.
pub const RESIZE_PENDING: &str = "FileSystemResizePending";

/// The claims of published volumes the node has grown whose status does not say so yet: a
/// smaller `status.capacity`, or a `FileSystemResizePending` condition — once the node has
/// grown the filesystem to the volume's capacity, never before. Pure.
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
        // The node has its part still to do (the volume as the objects have it now is larger):
        // the condition stays until it has grown it.
        let current = pv.metadata.name.as_ref().and_then(|n| objects.persistent_volumes.get(n));
        let wanted = current.and_then(|pv| pv.spec.as_ref()?.capacity.as_ref()?.get("storage").cloned());
        if wanted.and_then(|q| kvol_api::quantity::parse_bytes(&q.0).ok()).is_some_and(|w| w > size) {
            continue;
        }
        let user = ClaimUser {
            namespace: published.pod.namespace.clone(),
            name: published.pod.name.clone(),
            uid: published.pod.uid.clone(),
        };
        if let Some(told) = out.get_mut(&key) {
            told.pods.push(user);
            continue;
        }
        let kept = conditions.into_iter().filter(|c| c.type_ != RESIZE_PENDING).collect();
        let resource_version = claim.metadata.resource_version.clone();
        let capacity_bytes = size.max(shown.unwrap_or(0));
        let pv_quantity = pv.spec.as_ref().and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"));
        let quantity = match pv_quantity {
            Some(q) if kvol_api::quantity::parse_bytes(&q.0).ok() == Some(capacity_bytes) => q.0.clone(),
            _ => capacity_bytes.to_string(),
        };
        let volume = pv.metadata.name.clone().unwrap_or_default();
        out.insert(
            key,
            ClaimResized {
                namespace,
                name,
                uid: claim.metadata.uid.clone(),
                capacity_bytes,
                quantity,
                volume,
                pods: vec![user],
                conditions: kept,
                resource_version,
            },
        );
    }
    let mut out: Vec<ClaimResized> = out.into_values().collect();
    out.iter_mut().for_each(|c| c.pods.sort());
    out
}

/// A status line for each published volume its plugin cannot grow while in use (it grows it
/// when the volume is published again, as kubelet retries at the next mount). Pure.
pub fn deferred_expansions(actual: &ActualState) -> Vec<String> {
    actual
        .published
        .values()
        .filter_map(|p| {
            let (size, reason) = p.expansion_deferred.as_ref()?;
            Some(format!(
                "volume {:?} of pod {} grows to {} when it is published again (its plugin cannot grow it in use: {reason})",
                p.key.volume,
                p.pod_name,
                kvol_api::quantity::format_bytes(*size)
            ))
        })
        .collect()
}

/// The sizes of every bound claim among `objects` whose volume is among them too, with the
/// resize status kept for it (`resize_statuses`, by `namespace/name`: standalone's own). Pure.
pub fn claim_sizes(
    objects: &ObjectSet,
    resize_statuses: &BTreeMap<String, String>,
) -> Vec<crate::report::status::ClaimSizeStatus> {
    let bytes = |q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>| {
        q.and_then(|q| kvol_api::quantity::parse_bytes(&q.0).ok())
    };
    objects
        .claims
        .iter()
        .filter_map(|(key, claim)| {
            let spec = claim.spec.as_ref()?;
            let volume = spec.volume_name.clone().filter(|v| !v.is_empty())?;
            let pv = objects.persistent_volumes.get(&volume)?;
            let status = claim.status.as_ref();
            let storage = |m: Option<
                &BTreeMap<String, k8s_openapi::apimachinery::pkg::api::resource::Quantity>,
            >| { bytes(m.and_then(|m| m.get("storage"))) };
            Some(crate::report::status::ClaimSizeStatus {
                name: key.clone(),
                requested_bytes: storage(spec.resources.as_ref().and_then(|r| r.requests.as_ref())),
                volume_bytes: storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref())),
                capacity_bytes: storage(status.and_then(|s| s.capacity.as_ref())),
                allocated_bytes: storage(status.and_then(|s| s.allocated_resources.as_ref())),
                resize_status: resize_statuses.get(key).cloned(),
                conditions: status
                    .and_then(|s| s.conditions.as_ref())
                    .map(|c| c.iter().map(|c| c.type_.clone()).collect())
                    .unwrap_or_default(),
                volume,
            })
        })
        .collect()
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
    fn a_deferred_expansion_is_a_status_line() {
        let key = PodVolumeKey { pod_uid: "u".into(), volume: "data".into() };
        let pv: k8s_openapi::api::core::v1::PersistentVolume =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "pv"}})).unwrap();
        let record = PublishedVolume {
            projection: None,
            fs_size: Some(16 << 20),
            expansion_deferred: Some((32 << 20, "growing a mounted ext4 needs CAP_SYS_RESOURCE".into())),
            key: key.clone(),
            pod: Default::default(),
            pod_name: "ns/db".into(),
            unique_name: "d^h".into(),
            plugin: "d".into(),
            spec: kvol_plugin::VolumeSpec::persistent(Arc::new(pv)),
            target: "/t".into(),
            staging_path: None,
            device_path: None,
            uncertain: false,
        };
        let mut actual = ActualState::default();
        actual.published.insert(key, record);
        assert_eq!(
            deferred_expansions(&actual),
            [
                "volume \"data\" of pod ns/db grows to 32Mi when it is published again (its plugin cannot grow it in use: growing a mounted ext4 needs CAP_SYS_RESOURCE)"
            ]
        );
    }

    #[test]
    fn bound_claims_show_their_sizes() {
        let mut objects = ObjectSet::default();
        fn yaml<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
            serde_json::from_value(v).unwrap()
        }
        objects.claims.insert(
            "ns/c".into(),
            yaml(serde_json::json!({
                "metadata": {"name": "c", "namespace": "ns"},
                "spec": {"volumeName": "pv", "resources": {"requests": {"storage": "2Gi"}}},
                "status": {"capacity": {"storage": "1Gi"}, "conditions": [{"type": "FileSystemResizePending", "status": "True"}]}
            })),
        );
        objects.claims.insert(
            "ns/unbound".into(),
            yaml(serde_json::json!({"metadata": {"name": "unbound", "namespace": "ns"}, "spec": {}})),
        );
        objects.persistent_volumes.insert(
            "pv".into(),
            Arc::new(yaml(
                serde_json::json!({"metadata": {"name": "pv"}, "spec": {"capacity": {"storage": "2Gi"}}}),
            )),
        );
        let statuses = BTreeMap::from([("ns/c".to_string(), "NodeExpansionPending".to_string())]);
        let sizes = claim_sizes(&objects, &statuses);
        assert_eq!(
            sizes,
            [crate::report::status::ClaimSizeStatus {
                name: "ns/c".into(),
                volume: "pv".into(),
                requested_bytes: Some(2 << 30),
                volume_bytes: Some(2 << 30),
                capacity_bytes: Some(1 << 30),
                allocated_bytes: None,
                resize_status: Some("NodeExpansionPending".into()),
                conditions: vec!["FileSystemResizePending".into()],
            }],
            "the unbound claim is left out"
        );
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
            (
                "pending, the node not grown yet (the volume is 32Mi): the condition stays",
                Some(16 << 20),
                serde_json::json!({"capacity": {"storage": "16Mi"}, "conditions": pending}),
                None,
            ),
        ];
        for (what, size, status, want) in cases {
            let mut objects = ObjectSet::default();
            objects.claims.insert("ns/c".into(), claim(status));
            objects.persistent_volumes.insert("pv".into(), Arc::new(pv.clone()));
            let mut actual = ActualState::default();
            let key = PodVolumeKey { pod_uid: "u".into(), volume: "v".into() };
            let record = PublishedVolume {
                projection: None,
                fs_size: size,
                expansion_deferred: None,
                key: key.clone(),
                pod: kvol_plugin::plugin::PodInfo {
                    namespace: "ns".into(),
                    name: "p".into(),
                    uid: "u".into(),
                    ..Default::default()
                },
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
            let resized = resized_claims(&objects, &actual);
            if let Some(r) = resized.first() {
                assert_eq!((r.quantity.as_str(), r.volume.as_str()), ("32Mi", "pv"), "{what}");
                assert_eq!(r.pods, [ClaimUser { namespace: "ns".into(), name: "p".into(), uid: "u".into() }]);
            }
            let got: Vec<(u64, Vec<String>)> = resized
                .into_iter()
                .map(|r| (r.capacity_bytes, r.conditions.into_iter().map(|c| c.type_).collect()))
                .collect();
            let want: Vec<(u64, Vec<String>)> =
                want.into_iter().map(|(b, c)| (b, c.into_iter().map(String::from).collect())).collect();
            assert_eq!(got, want, "{what}");
        }
    }
}
