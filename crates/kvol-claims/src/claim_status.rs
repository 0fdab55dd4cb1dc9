//! The status the standalone control plane keeps for the claims it provisioned, as a cluster's API server would hold it (capacity, the resize condition, kubelet v1.26's resize status); its changes and the claim status it makes, pure.
//!
//! In a cluster three parties write a claim's status: the PV controller binds it (capacity =
//! the volume's), the external-resizer grows the volume (`allocatedResources`, and the
//! `FileSystemResizePending` condition when the node must grow the filesystem), and kubelet
//! clears the condition and raises the capacity once it has (`MarkFSResizeFinished`). Standalone
//! kvol is all three; this is what it remembers between them. The resize status values are
//! v1.26's `resizeStatus`, kept only with the `RecoverVolumeExpansionFailure` gate on, as there.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimCondition, PersistentVolumeClaimStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde::{Deserialize, Serialize};

/// The condition the resizer sets and the node clears.
pub const RESIZE_PENDING: &str = "FileSystemResizePending";

/// What the external-resizer writes in the condition's message.
pub const RESIZE_PENDING_MESSAGE: &str =
    "Waiting for user to (re-)start a pod to finish file system resize of volume on node.";

/// v1.26's `resizeStatus` values (`PersistentVolumeClaimResizeStatus`); the empty string is
/// "no expansion in progress".
pub mod resize_status {
    pub const NONE: &str = "";
    pub const CONTROLLER_IN_PROGRESS: &str = "ControllerExpansionInProgress";
    pub const CONTROLLER_FAILED: &str = "ControllerExpansionFailed";
    pub const NODE_PENDING: &str = "NodeExpansionPending";
}

/// What is kept of one provisioned claim's status (`claim-status/<namespace>~<name>.json`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptClaimStatus {
    /// `status.capacity`: the size the claim has for its users — the volume's at binding, then
    /// what the node grew the filesystem to (or the driver grew it to, when no node step is
    /// needed).
    pub capacity: u64,
    /// `status.allocatedResources` (gate on): the size last asked of the driver.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated: Option<u64>,
    /// `status.resizeStatus` (gate on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize_status: Option<String>,
    /// The `FileSystemResizePending` condition: the driver grew the volume, the node has not
    /// grown its filesystem yet.
    #[serde(default)]
    pub fs_resize_pending: bool,
}

/// Whether the `RecoverVolumeExpansionFailure` gate is on (kubelet v1.26: alpha, off).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Recovery(pub bool);

impl KeptClaimStatus {
    /// A claim just bound to a volume of `capacity` bytes.
    pub fn bound(capacity: u64) -> KeptClaimStatus {
        KeptClaimStatus { capacity, ..KeptClaimStatus::default() }
    }

    /// `ControllerExpandVolume` to `to` bytes is about to be called.
    pub fn controller_started(self, to: u64, recovery: Recovery) -> KeptClaimStatus {
        if !recovery.0 {
            return self;
        }
        KeptClaimStatus {
            allocated: Some(to),
            resize_status: Some(resize_status::CONTROLLER_IN_PROGRESS.into()),
            ..self
        }
    }

    /// `ControllerExpandVolume` failed.
    pub fn controller_failed(self, recovery: Recovery) -> KeptClaimStatus {
        if !recovery.0 {
            return self;
        }
        KeptClaimStatus { resize_status: Some(resize_status::CONTROLLER_FAILED.into()), ..self }
    }

    /// The driver grew the volume to `to` bytes; `node_expansion_required` as it answered.
    pub fn controller_done(
        self,
        to: u64,
        node_expansion_required: bool,
        recovery: Recovery,
    ) -> KeptClaimStatus {
        let allocated = if recovery.0 { Some(to) } else { self.allocated };
        if node_expansion_required {
            let resize_status =
                if recovery.0 { Some(resize_status::NODE_PENDING.into()) } else { self.resize_status };
            KeptClaimStatus { allocated, resize_status, fs_resize_pending: true, ..self }
        } else {
            let resize_status =
                if recovery.0 { Some(resize_status::NONE.into()) } else { self.resize_status };
            KeptClaimStatus {
                capacity: self.capacity.max(to),
                allocated,
                resize_status,
                fs_resize_pending: false,
            }
        }
    }

    /// The node grew the filesystem to `size` bytes (kubelet's `MarkFSResizeFinished`).
    pub fn node_done(self, size: u64, recovery: Recovery) -> KeptClaimStatus {
        let resize_status = if recovery.0 { Some(resize_status::NONE.into()) } else { self.resize_status };
        KeptClaimStatus { capacity: self.capacity.max(size), resize_status, fs_resize_pending: false, ..self }
    }

    /// The claim's status as the API server would show it, for the volume `pv`: `Bound`, the
    /// volume's access modes, the capacity (the volume's own quantity when the sizes agree, so
    /// `1Gi` stays `1Gi`), `allocatedResources`, the pending condition.
    pub fn status(&self, pv: &PersistentVolume) -> PersistentVolumeClaimStatus {
        let spec = pv.spec.as_ref();
        let pv_quantity = spec.and_then(|s| s.capacity.as_ref()).and_then(|c| c.get("storage"));
        let quantity = |bytes: u64| match pv_quantity {
            Some(q) if kvol_api::quantity::parse_bytes(&q.0).ok() == Some(bytes) => q.clone(),
            _ => Quantity(bytes.to_string()),
        };
        let storage = |bytes: u64| BTreeMap::from([("storage".to_string(), quantity(bytes))]);
        let conditions = self.fs_resize_pending.then(|| {
            vec![PersistentVolumeClaimCondition {
                type_: RESIZE_PENDING.into(),
                status: "True".into(),
                message: Some(RESIZE_PENDING_MESSAGE.into()),
                ..PersistentVolumeClaimCondition::default()
            }]
        });
        PersistentVolumeClaimStatus {
            phase: Some("Bound".into()),
            access_modes: spec.and_then(|s| s.access_modes.clone()),
            capacity: Some(storage(self.capacity)),
            allocated_resources: self.allocated.map(storage),
            conditions,
            ..PersistentVolumeClaimStatus::default()
        }
    }
}

/// What a claim's status says of its size: the capacity, and whether its filesystem waits to
/// be grown on the node. Pure; for any claim, kept here or written by a cluster.
pub fn shown_capacity(claim: &PersistentVolumeClaim) -> Option<u64> {
    let quantity = claim.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    kvol_api::quantity::parse_bytes(&quantity.0).ok()
}

/// The status of each provisioned claim, laid over `claims` (a claim written as a manifest
/// carries none); claims without a kept status are left as they are.
pub fn overlay(
    claims: &mut BTreeMap<String, PersistentVolumeClaim>,
    kept: &BTreeMap<String, KeptClaimStatus>,
    provisioned: &BTreeMap<String, std::sync::Arc<PersistentVolume>>,
) {
    for (key, status) in kept {
        let (Some(claim), Some(pv)) = (claims.get_mut(key), provisioned.get(key)) else { continue };
        claim.status = Some(status.status(pv));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MI: u64 = 1 << 20;

    #[test]
    fn a_resize_moves_through_the_states_kubelet_and_the_resizer_write() {
        // (what, the steps from bound at 16Mi, capacity, allocated, resize status, pending)
        type Step = fn(KeptClaimStatus) -> KeptClaimStatus;
        type Case = (&'static str, &'static [Step], u64, Option<u64>, Option<&'static str>, bool);
        let cases: &[Case] = &[
            ("bound", &[], 16, None, None, false),
            (
                "gate off: driver grew, node to do",
                &[
                    |s| s.controller_started(32 * MI, Recovery(false)),
                    |s| s.controller_done(32 * MI, true, Recovery(false)),
                ],
                16,
                None,
                None,
                true,
            ),
            (
                "gate off: node done",
                &[
                    |s| s.controller_done(32 * MI, true, Recovery(false)),
                    |s| s.node_done(32 * MI, Recovery(false)),
                ],
                32,
                None,
                None,
                false,
            ),
            (
                "gate off: no node step needed",
                &[|s| s.controller_done(32 * MI, false, Recovery(false))],
                32,
                None,
                None,
                false,
            ),
            (
                "gate on: controller under way",
                &[|s| s.controller_started(32 * MI, Recovery(true))],
                16,
                Some(32),
                Some(resize_status::CONTROLLER_IN_PROGRESS),
                false,
            ),
            (
                "gate on: controller failed",
                &[|s| s.controller_started(32 * MI, Recovery(true)), |s| s.controller_failed(Recovery(true))],
                16,
                Some(32),
                Some(resize_status::CONTROLLER_FAILED),
                false,
            ),
            (
                "gate on: node pending",
                &[
                    |s| s.controller_started(32 * MI, Recovery(true)),
                    |s| s.controller_done(32 * MI, true, Recovery(true)),
                ],
                16,
                Some(32),
                Some(resize_status::NODE_PENDING),
                true,
            ),
            (
                "gate on: node done",
                &[
                    |s| s.controller_done(32 * MI, true, Recovery(true)),
                    |s| s.node_done(32 * MI, Recovery(true)),
                ],
                32,
                Some(32),
                Some(resize_status::NONE),
                false,
            ),
            (
                "a node size below the capacity never lowers it",
                &[|s| s.node_done(8 * MI, Recovery(false))],
                16,
                None,
                None,
                false,
            ),
        ];
        for (what, steps, capacity, allocated, status, pending) in cases {
            let got = steps.iter().fold(KeptClaimStatus::bound(16 * MI), |s, step| step(s));
            assert_eq!(got.capacity, capacity * MI, "{what}");
            assert_eq!(got.allocated, allocated.map(|a| a * MI), "{what}");
            assert_eq!(got.resize_status.as_deref(), *status, "{what}");
            assert_eq!(got.fs_resize_pending, *pending, "{what}");
        }
    }

    #[test]
    fn the_status_shows_the_volumes_quantity_when_the_sizes_agree() {
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "pv"},
            "spec": {"capacity": {"storage": "32Mi"}, "accessModes": ["ReadWriteOnce"]}
        }))
        .unwrap();
        let pending = KeptClaimStatus::bound(16 * MI).controller_done(32 * MI, true, Recovery(true));
        let status = serde_json::to_value(pending.status(&pv)).unwrap();
        assert_eq!(
            status,
            serde_json::json!({
                "phase": "Bound",
                "accessModes": ["ReadWriteOnce"],
                "capacity": {"storage": "16777216"},
                "allocatedResources": {"storage": "32Mi"},
                "conditions": [{"type": "FileSystemResizePending", "status": "True", "message": RESIZE_PENDING_MESSAGE}],
            })
        );
        let done = pending.node_done(32 * MI, Recovery(true));
        let status = serde_json::to_value(done.status(&pv)).unwrap();
        assert_eq!(status["capacity"], serde_json::json!({"storage": "32Mi"}));
        assert!(status.get("conditions").is_none(), "{status}");
    }
}
