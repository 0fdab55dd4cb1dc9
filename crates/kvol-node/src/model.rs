//! The agent's vocabulary: the objects a source provides, the volumes pods want, the volumes the node has, and the operations between them; plain data, no I/O.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::path::PathBuf;

use kvol_plugin::VolumeSpec;
use kvol_plugin::plugin::PodInfo;
use serde::{Deserialize, Serialize};

pub use kvol_api::objects::{ObjectSet, SourceProblem};

/// One volume of one pod: the unit of publishing.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PodVolumeKey {
    pub pod_uid: String,
    /// The pod's name for the volume (`spec.volumes[].name`).
    pub volume: String,
}

impl fmt::Display for PodVolumeKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.pod_uid, self.volume)
    }
}

/// A volume a pod wants, resolved to a spec, or pending with the reason.
#[derive(Clone, Debug, PartialEq)]
pub struct DesiredVolume {
    pub key: PodVolumeKey,
    pub pod: PodInfo,
    /// `namespace/name` of the pod, for messages.
    pub pod_name: String,
    /// The spec to mount; `None` while pending.
    pub spec: Option<VolumeSpec>,
    /// Why the volume cannot be set up yet (an unbound claim, a missing PV …).
    pub pending: Option<String>,
    /// Mount options from the PV (`spec.mountOptions`).
    pub mount_options: Vec<String>,
    /// The pod is being deleted (`deletionTimestamp` set) and its containers may still run
    /// out their grace period: what it has stays set up, nothing new is (kubelet's rule).
    pub terminating: bool,
    /// For a configMap, secret, downwardAPI or projected volume: what it is to hold.
    pub projection: Option<std::sync::Arc<kvol_api::projection::Projection>>,
    /// For a claim's volume: the size its status says it has (`status.capacity`), which is
    /// the size its filesystem was last grown to; a volume whose PersistentVolume is larger is
    /// grown on the node once published (kubelet's expansion at mount).
    pub claim_size: Option<u64>,
}

/// What the pods on this node want.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DesiredState {
    pub volumes: BTreeMap<PodVolumeKey, DesiredVolume>,
    /// Volumes of those pods that no container (init, regular or ephemeral) mounts or takes
    /// as a device, with their pod's `namespace/name`: not set up, as the v1.26 kubelet sets up
    /// only the volumes some container uses; listed so status can say why.
    pub unused: BTreeMap<PodVolumeKey, String>,
}

/// A volume attached to this node (node-driven attach).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AttachedVolume {
    /// The plugin's unique volume name (`VolumePlugin::volume_name`).
    pub unique_name: String,
    pub plugin: String,
    pub spec: VolumeSpec,
    /// The device path attach or wait-for-attach returned.
    pub device_path: Option<String>,
    /// The attach's outcome is unknown (it timed out, the connection broke, the agent died
    /// during it): torn down like an attached volume, attached again if wanted.
    #[serde(default, skip_serializing_if = "is_false")]
    pub uncertain: bool,
}

/// A volume staged (mount-device) on this node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct StagedVolume {
    pub unique_name: String,
    pub plugin: String,
    pub spec: VolumeSpec,
    pub staging_path: PathBuf,
    pub device_path: Option<String>,
    /// The stage's outcome is unknown (or the record was reconstructed from the node): torn
    /// down like a staged volume, staged again if wanted.
    #[serde(default, skip_serializing_if = "is_false")]
    pub uncertain: bool,
}

/// A volume published into a pod's volume directory.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishedVolume {
    pub key: PodVolumeKey,
    pub pod: PodInfo,
    pub pod_name: String,
    pub unique_name: String,
    pub plugin: String,
    pub spec: VolumeSpec,
    /// The pod volume directory (`pods/<uid>/volumes/<plugin>/<volume>`).
    pub target: PathBuf,
    pub staging_path: Option<PathBuf>,
    pub device_path: Option<String>,
    /// The publish's outcome is unknown (it timed out, the connection broke, the agent died
    /// during it), or the record was reconstructed from a pod volume directory: torn down like
    /// a published volume, published again if wanted.
    #[serde(default, skip_serializing_if = "is_false")]
    pub uncertain: bool,
    /// For a configMap, secret, downwardAPI or projected volume: what it holds (to publish, or
    /// as last published). Kept in memory only — a Secret's values never reach the journal —
    /// so after a restart the first publish compares the files on disk instead.
    #[serde(skip)]
    pub projection: Option<std::sync::Arc<kvol_api::projection::Projection>>,
    /// The size the node last made the volume's filesystem: its persistent volume's capacity
    /// when it was published or last expanded on the node; `None` where there is none to
    /// follow (an inline volume, a record from before kvol recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fs_size: Option<u64>,
    /// The size the plugin said it cannot grow the filesystem to while the volume is in use,
    /// and why (kubelet's in-use expansion error): not asked again until it is published again.
    /// In memory only: a restart asks again.
    #[serde(skip)]
    pub expansion_deferred: Option<(u64, String)>,
}

/// Whether a published volume of `plugin` may be a plain directory on the node's disk, with
/// nothing mounted (an emptyDir or a configMap volume): then its directory, not a mount, says
/// it is there.
pub fn plain_directory_plugin(plugin: &str) -> bool {
    matches!(plugin, "kubernetes.io/empty-dir" | "kubernetes.io/configmap")
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// What the node has: the agent's record, persisted in the journal store.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActualState {
    /// By unique volume name.
    pub attached: BTreeMap<String, AttachedVolume>,
    /// By unique volume name.
    pub staged: BTreeMap<String, StagedVolume>,
    pub published: BTreeMap<PodVolumeKey, PublishedVolume>,
}

/// One step the reconciler asks for. Teardown steps carry the record of what is there;
/// bring-up steps carry what to set up.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", tag = "op")]
pub enum Operation {
    Unpublish {
        volume: PublishedVolume,
    },
    Unstage {
        volume: StagedVolume,
    },
    Detach {
        volume: AttachedVolume,
    },
    Attach {
        unique_name: String,
        plugin: String,
        spec: VolumeSpec,
    },
    Stage {
        unique_name: String,
        plugin: String,
        spec: VolumeSpec,
        device_path: Option<String>,
        /// Where to stage: carried so a journal entry says where an interrupted stage mounted.
        staging_path: PathBuf,
    },
    Publish {
        volume: PublishedVolume,
        mount_options: Vec<String>,
    },
    /// The node's part of expansion (`NodeExpandVolume`): the published volume's filesystem
    /// grown from `volume.fs_size` to `new_size` bytes.
    Expand {
        volume: PublishedVolume,
        new_size: u64,
    },
}

impl Operation {
    /// The kubelet-style operation name (for metrics and logs).
    pub fn name(&self) -> &'static str {
        match self {
            Operation::Unpublish { .. } => "volume_unmount",
            Operation::Unstage { .. } => "unmount_device",
            Operation::Detach { .. } => "volume_detach",
            Operation::Attach { .. } => "volume_attach",
            Operation::Stage { .. } => "mount_device",
            Operation::Publish { .. } => "volume_mount",
            Operation::Expand { .. } => "volume_fs_resize",
        }
    }

    /// The key that serialises operations: one operation per volume at a time. Attach, stage,
    /// unstage and detach are per unique volume; publish and unpublish per pod volume.
    pub fn lock_key(&self) -> String {
        match self {
            Operation::Unpublish { volume }
            | Operation::Publish { volume, .. }
            | Operation::Expand { volume, .. } => {
                format!("pod:{}", volume.key)
            }
            Operation::Unstage { volume } => format!("volume:{}", volume.unique_name),
            Operation::Detach { volume } => format!("volume:{}", volume.unique_name),
            Operation::Attach { unique_name, .. } | Operation::Stage { unique_name, .. } => {
                format!("volume:{unique_name}")
            }
        }
    }

    /// The volume (and, for a publish or an unpublish, the pod volume) the operation holds
    /// while it runs.
    pub fn claim(&self) -> Claim {
        match self {
            Operation::Unpublish { volume }
            | Operation::Publish { volume, .. }
            | Operation::Expand { volume, .. } => {
                Claim { unique_name: volume.unique_name.clone(), pod: Some(volume.key.clone()) }
            }
            Operation::Unstage { volume } => Claim { unique_name: volume.unique_name.clone(), pod: None },
            Operation::Detach { volume } => Claim { unique_name: volume.unique_name.clone(), pod: None },
            Operation::Attach { unique_name, .. } | Operation::Stage { unique_name, .. } => {
                Claim { unique_name: unique_name.clone(), pod: None }
            }
        }
    }

    /// The plugin the operation runs through.
    pub fn plugin(&self) -> &str {
        match self {
            Operation::Unpublish { volume }
            | Operation::Publish { volume, .. }
            | Operation::Expand { volume, .. } => &volume.plugin,
            Operation::Unstage { volume } => &volume.plugin,
            Operation::Detach { volume } => &volume.plugin,
            Operation::Attach { plugin, .. } | Operation::Stage { plugin, .. } => plugin,
        }
    }
}

/// What a running operation holds: its volume by unique name and, for a publish or an
/// unpublish, its pod volume.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Claim {
    pub unique_name: String,
    pub pod: Option<PodVolumeKey>,
}

impl Claim {
    /// Whether two operations may not run at once: any two on one pod volume, and any two on
    /// one volume unless both are pod-level (publishes of different pods run side by side, as
    /// upstream runs them for volumes several pods share).
    pub fn conflicts(&self, other: &Claim) -> bool {
        let same_pod_volume = self.pod.is_some() && self.pod == other.pod;
        let same_volume =
            self.unique_name == other.unique_name && (self.pod.is_none() || other.pod.is_none());
        same_pod_volume || same_volume
    }
}

/// Claims held at once, indexed so that telling whether one more conflicts with any of them
/// ([`Claim::conflicts`]) is two lookups, not a pass over all: the planner and the executor
/// each hold thousands of claims at node scale.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeldClaims {
    /// How many held claims name each pod volume.
    pod_volumes: HashMap<PodVolumeKey, usize>,
    /// Per unique name: how many held claims name it, and how many of those are not pod-level.
    volumes: HashMap<String, (usize, usize)>,
}

impl HeldClaims {
    pub fn new<'a>(claims: impl IntoIterator<Item = &'a Claim>) -> HeldClaims {
        let mut held = HeldClaims::default();
        claims.into_iter().for_each(|c| held.insert(c));
        held
    }

    /// Whether `claim` conflicts with one held: the same result as asking each.
    pub fn conflicts(&self, claim: &Claim) -> bool {
        let same_pod_volume = claim.pod.as_ref().is_some_and(|key| self.pod_volumes.contains_key(key));
        let same_volume = self
            .volumes
            .get(&claim.unique_name)
            .is_some_and(|&(all, node_level)| if claim.pod.is_none() { all > 0 } else { node_level > 0 });
        same_pod_volume || same_volume
    }

    pub fn insert(&mut self, claim: &Claim) {
        if let Some(key) = &claim.pod {
            *self.pod_volumes.entry(key.clone()).or_default() += 1;
        }
        let counts = self.volumes.entry(claim.unique_name.clone()).or_default();
        counts.0 += 1;
        counts.1 += usize::from(claim.pod.is_none());
    }

    /// Lets go of one claim equal to `claim` (one that was inserted).
    pub fn remove(&mut self, claim: &Claim) {
        if let Some(key) = &claim.pod
            && let Some(count) = self.pod_volumes.get_mut(key)
        {
            *count -= 1;
            if *count == 0 {
                self.pod_volumes.remove(key);
            }
        }
        if let Some(counts) = self.volumes.get_mut(&claim.unique_name) {
            counts.0 -= 1;
            counts.1 -= usize::from(claim.pod.is_none());
            if counts.0 == 0 {
                self.volumes.remove(&claim.unique_name);
            }
        }
    }
}

/// A volume's unique name, as upstream forms it: `<plugin>/<volume name>` for a volume that is
/// attached or staged (one per node, whichever pods use it), `<plugin>/<pod uid>-<spec name>`
/// for one that is only published (each pod has its own). `plugin` is the name pod volume
/// directories are filed under (`kubernetes.io/csi` for every CSI driver), so two plugins'
/// volumes never share a name.
pub fn unique_volume_name(plugin: &str, volume_name: &str, node_wide: bool, pod_uid: &str) -> String {
    if node_wide { format!("{plugin}/{volume_name}") } else { format!("{plugin}/{pod_uid}-{volume_name}") }
}

/// The plugin's own name for a volume inside its unique name (what detach is given): the part
/// after `<plugin>/`; a name without that prefix is returned whole.
pub fn plugin_volume_name<'a>(plugin: &str, unique_name: &'a str) -> &'a str {
    unique_name.strip_prefix(plugin).and_then(|rest| rest.strip_prefix('/')).unwrap_or(unique_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(unique: &str, pod: Option<(&str, &str)>) -> Claim {
        Claim {
            unique_name: unique.into(),
            pod: pod.map(|(uid, volume)| PodVolumeKey { pod_uid: uid.into(), volume: volume.into() }),
        }
    }

    #[test]
    fn claims_conflict_on_one_volume_unless_both_are_pod_level() {
        // (a, b, conflict)
        let rows = [
            (claim("v", None), claim("v", None), true),
            (claim("v", None), claim("v", Some(("p1", "d"))), true),
            (claim("v", Some(("p1", "d"))), claim("v", None), true),
            (claim("v", Some(("p1", "d"))), claim("v", Some(("p2", "d"))), false),
            (claim("v", Some(("p1", "d"))), claim("w", Some(("p1", "d"))), true),
            (claim("v", None), claim("w", None), false),
            (claim("v", Some(("p1", "d"))), claim("w", Some(("p1", "e"))), false),
        ];
        for (a, b, conflict) in rows {
            assert_eq!(a.conflicts(&b), conflict, "{a:?} vs {b:?}");
            assert_eq!(b.conflicts(&a), conflict, "{b:?} vs {a:?} (symmetric)");
        }
    }

    #[test]
    fn held_claims_answer_as_asking_each_claim() {
        let held = [
            claim("v", None),
            claim("w", Some(("p1", "d"))),
            claim("w", Some(("p2", "d"))),
            claim("x", Some(("p3", "e"))),
        ];
        let asked = [
            claim("v", None),
            claim("v", Some(("p9", "d"))),
            claim("w", None),
            claim("w", Some(("p4", "d"))),
            claim("y", Some(("p1", "d"))),
            claim("x", Some(("p3", "f"))),
            claim("z", None),
        ];
        // Every subset of the held claims, built up and taken apart again.
        for mask in 0..(1u32 << held.len()) {
            let chosen: Vec<&Claim> =
                held.iter().enumerate().filter(|(i, _)| mask & (1 << i) != 0).map(|(_, c)| c).collect();
            let mut set = HeldClaims::new(held.iter());
            for (i, c) in held.iter().enumerate() {
                if mask & (1 << i) == 0 {
                    set.remove(c);
                }
            }
            assert_eq!(set, HeldClaims::new(chosen.iter().copied()), "removal undoes insertion ({mask:b})");
            for a in &asked {
                let each = chosen.iter().any(|c| c.conflicts(a));
                assert_eq!(set.conflicts(a), each, "{a:?} against {chosen:?}");
            }
        }
    }

    #[test]
    fn unique_names_carry_the_plugin_and_for_pod_scoped_volumes_the_pod() {
        // (plugin, volume name, node-wide, pod uid, unique name)
        let rows = [
            ("kubernetes.io/csi", "d.csi^vol-1", true, "u1", "kubernetes.io/csi/d.csi^vol-1"),
            ("kubernetes.io/csi", "scratch", false, "u1", "kubernetes.io/csi/u1-scratch"),
            ("kvol/loop", "v", true, "u1", "kvol/loop/v"),
            ("kvol/tmpfs", "v", true, "u1", "kvol/tmpfs/v"),
            ("kubernetes.io/empty-dir", "cache", false, "u2", "kubernetes.io/empty-dir/u2-cache"),
        ];
        for (plugin, name, node_wide, uid, unique) in rows {
            assert_eq!(unique_volume_name(plugin, name, node_wide, uid), unique);
            if node_wide {
                assert_eq!(plugin_volume_name(plugin, unique), name, "round trip of {unique}");
            }
        }
        assert_eq!(plugin_volume_name("kvol/loop", "v"), "v", "a name without the prefix is whole");
        assert_eq!(plugin_volume_name("kvol/loop", "kvol/loopy/v"), "kvol/loopy/v");
    }
}
