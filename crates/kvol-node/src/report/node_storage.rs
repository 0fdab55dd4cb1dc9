//! What the node tells the cluster about its storage after each pass: its CSINode, the node-ID annotation and the attachable volumes in use; made purely here, written by a sink (the API in cluster mode).

use std::collections::BTreeSet;

use k8s_openapi::api::storage::v1::CSINode;

use crate::model::ActualState;
use crate::reconciler::Resolutions;

/// The node's storage objects as the agent knows them now.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeStorage {
    /// This node's CSINode, once the registration handler made it.
    pub csi_node: Option<CSINode>,
    /// The Node annotation `csi.volume.kubernetes.io/nodeid` (a JSON map driver → node ID);
    /// `None` when no driver is registered.
    pub node_ids: Option<String>,
    /// The Node's `status.volumesInUse`: sorted unique names of the attachable volumes that are
    /// mounted or being mounted.
    pub volumes_in_use: Vec<String>,
    /// The Node's topology labels: every registered CSI driver's NodeGetInfo segments.
    pub topology_labels: std::collections::BTreeMap<String, String>,
}

/// Receives the node's storage after every pass; deduplicating and writing is the sink's.
pub trait NodeStorageSink: Send + Sync + std::fmt::Debug {
    fn report(&self, storage: &NodeStorage);
}

/// The unique names of attachable volumes in use, as kubelet reports them: wanted by a pod
/// (being mounted) or still attached on the node (mounted, or not yet torn down), sorted.
pub fn volumes_in_use(resolutions: &Resolutions, actual: &ActualState) -> Vec<String> {
    let wanted =
        resolutions.values().filter_map(|r| r.as_ref().ok()).filter(|r| r.attach).map(|r| &r.unique_name);
    let attached = actual.attached.keys();
    let names: BTreeSet<&String> = wanted.chain(attached).collect();
    names.into_iter().cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AttachedVolume, PodVolumeKey};
    use crate::reconciler::Resolution;
    use kvol_plugin::VolumeSpec;

    fn spec() -> VolumeSpec {
        let volume =
            serde_json::from_value(serde_json::json!({"name": "v", "emptyDir": {}})).expect("a volume");
        VolumeSpec::inline(volume, "default")
    }

    fn resolution(unique: &str, attach: bool) -> Result<Resolution, String> {
        Ok(Resolution {
            plugin: "p".into(),
            unique_name: unique.into(),
            spec: spec(),
            attach,
            staging_path: None,
            target: "/t".into(),
            republish: false,
        })
    }

    #[test]
    fn attachable_volumes_wanted_or_attached_are_in_use_once_each() {
        type Case<'a> = (&'a [(&'a str, Result<(&'a str, bool), ()>)], &'a [&'a str], &'a [&'a str]);
        let cases: &[Case] = &[
            (&[], &[], &[]),
            (&[("a", Ok(("d^1", true)))], &[], &["d^1"]),
            (&[("a", Ok(("e^1", false)))], &[], &[]),
            (&[("a", Err(()))], &[], &[]),
            (&[], &["d^2"], &["d^2"]),
            (&[("a", Ok(("d^1", true))), ("b", Ok(("d^1", true)))], &["d^1", "d^0"], &["d^0", "d^1"]),
        ];
        for (wanted, attached, want) in cases {
            let resolutions: Resolutions = wanted
                .iter()
                .map(|(pod, r)| {
                    let key = PodVolumeKey { pod_uid: pod.to_string(), volume: "v".into() };
                    let r = match r {
                        Ok((unique, attach)) => resolution(unique, *attach),
                        Err(()) => Err("no plugin".into()),
                    };
                    (key, r)
                })
                .collect();
            let mut actual = ActualState::default();
            for name in *attached {
                actual.attached.insert(
                    name.to_string(),
                    AttachedVolume {
                        unique_name: name.to_string(),
                        plugin: "p".into(),
                        spec: spec(),
                        device_path: None,
                        uncertain: false,
                    },
                );
            }
            assert_eq!(volumes_in_use(&resolutions, &actual), *want, "{wanted:?} {attached:?}");
        }
    }
}
