//! What the node tells the cluster about its storage after each pass: its CSINode, the node-ID annotation and the attachable volumes in use; made purely here, written by a sink (the API in cluster mode).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

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

    /// The volumes the cluster has taken as in use (the last `volumesInUse` the API accepted),
    /// which an attachable volume must be among before it is staged or published, as kubelet
    /// waits; `None` when the sink does not say (nothing is held back).
    fn reported_in_use(&self) -> Option<BTreeSet<String>> {
        None
    }
}

/// How long after start the agent waits for the drivers registered before it (their sockets
/// still there) to register again before it tells the cluster its storage anyway.
pub const REREGISTRATION_WAIT: Duration = Duration::from_secs(30);

/// Whether the agent may tell the cluster its storage: not before the drivers whose
/// registration sockets were there at start have registered again or their sockets are gone
/// (until then the API keeps what the previous agent wrote: the CSINode's drivers, the node
/// IDs, every volume in use), or [`REREGISTRATION_WAIT`] has passed. The actual state is
/// rebuilt before the first pass, so it never gates this. Pure.
pub fn may_report(
    sockets_at_start: &[PathBuf],
    registered: &[PathBuf],
    exists: impl Fn(&Path) -> bool,
    since_start: Duration,
) -> bool {
    since_start >= REREGISTRATION_WAIT
        || sockets_at_start.iter().all(|socket| registered.contains(socket) || !exists(socket))
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
    #[test]
    fn the_cluster_is_told_once_the_drivers_of_before_are_back_or_gone() {
        let secs = Duration::from_secs;
        let paths = |names: &[&str]| -> Vec<PathBuf> {
            names.iter().map(|n| PathBuf::from(format!("/reg/{n}.sock"))).collect()
        };
        // (sockets at start, registered now, sockets still on disk, since start, may report)
        type Row<'a> = (&'a [&'a str], &'a [&'a str], &'a [&'a str], Duration, bool);
        let rows: &[Row] = &[
            (&[], &[], &[], secs(0), true),
            (&["a"], &[], &["a"], secs(0), false),
            (&["a"], &["a"], &["a"], secs(0), true),
            (&["a", "b"], &["a"], &["a", "b"], secs(29), false),
            (&["a", "b"], &["a"], &["a"], secs(1), true),
            (&["a"], &[], &["a"], REREGISTRATION_WAIT, true),
        ];
        for (at_start, registered, on_disk, since, want) in rows {
            let on_disk = paths(on_disk);
            let exists = |p: &Path| on_disk.iter().any(|d| d == p);
            assert_eq!(
                may_report(&paths(at_start), &paths(registered), exists, *since),
                *want,
                "{at_start:?} {registered:?} {on_disk:?} {since:?}"
            );
        }
    }
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
            node_expand: false,
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
