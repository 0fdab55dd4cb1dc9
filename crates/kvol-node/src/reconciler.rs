//! The reconciler's decision: from what pods want and what the node has, the next operations — teardown first, then bring-up; pure, no I/O.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kvol_plugin::VolumeSpec;

use crate::model::{ActualState, Claim, DesiredState, HeldClaims, Operation, PodVolumeKey, PublishedVolume};

/// How a wanted volume is served, as the plugin registry resolved it (migration decided and
/// the spec translated if needed).
#[derive(Clone, Debug, PartialEq)]
pub struct Resolution {
    pub plugin: String,
    /// The plugin's unique volume name: attach and stage are per unique volume.
    pub unique_name: String,
    /// The spec the plugin gets (a translation, for a migrated in-tree spec).
    pub spec: VolumeSpec,
    /// Whether the volume must be attached first.
    pub attach: bool,
    /// The staging path, when the plugin stages this volume.
    pub staging_path: Option<PathBuf>,
    /// The pod volume directory to publish into.
    pub target: PathBuf,
    /// Whether the plugin wants the volume published again periodically (CSI
    /// `requiresRepublish`).
    pub republish: bool,
    /// Whether the plugin grows a published filesystem on the node (CSI `EXPAND_VOLUME`, a
    /// filesystem volume).
    pub node_expand: bool,
}

/// The resolution of each wanted volume that has a spec, or why it could not be resolved (no
/// plugin, the driver not registered, migration off …).
pub type Resolutions = BTreeMap<PodVolumeKey, Result<Resolution, String>>;

/// The operations that move the node toward what the pods want, teardown first.
///
/// - A published volume is unpublished when no pod wants it, or its pod now wants something
///   else there (another plugin or volume). A wanted volume whose resolution failed is left
///   alone: its driver may come back, and tearing down would disturb a running pod. An
///   uncertain record (outcome unknown, or reconstructed from the node) of a wanted volume is
///   kept when its plugin and target match, and published again, which makes it certain. A
///   reconstructed record keyed by its directory's name (a PV's name) is the record of the
///   pod's volume that resolves to the same plugin and target (or, unresolved, may be it): kept,
///   and published again under the pod's name for it, which replaces it (see
///   the executor's `apply`).
/// - A staged volume is unstaged once nothing published uses it and no wanted volume stages it.
/// - An attached volume is detached once it is neither staged nor published nor wanted.
/// - Neither is torn down while a wanted volume that failed to resolve may be it (same kind,
///   same PV name, or same inline volume name in the same namespace, see [`may_be`]): after a
///   restart the record is there before its driver registers again, and the unique name of an
///   unresolved volume is not known. Conservative: an unrelated record that shares the name waits
///   too, until the failing volume resolves or its pod goes.
/// - A wanted volume is attached (when its plugin attaches and it is not attached, or its
///   attach is uncertain, or it was attached before a crash without a known device), then
///   staged (again, when the stage is uncertain), then published — one step per plan; the next
///   plan takes the next step.
/// - Uncertain records are torn down exactly like certain ones: unpublish, unstage and detach
///   are idempotent in every plugin and by the CSI spec.
/// - No operation is planned that conflicts with one in `busy` (running now) or with one
///   planned before it in the same plan ([`Claim::conflicts`]): one operation per volume at a
///   time, except publishes and unpublishes of different pods. This also deduplicates (two
///   pods on one volume ask for one attach).
pub fn plan(
    desired: &DesiredState,
    resolutions: &Resolutions,
    actual: &ActualState,
    busy: &[Claim],
) -> Vec<Operation> {
    let wanted = |key: &PodVolumeKey| -> Option<&Resolution> {
        desired
            .volumes
            .contains_key(key)
            .then(|| resolutions.get(key))
            .flatten()
            .and_then(|r| r.as_ref().ok())
    };
    let unresolved = |key: &PodVolumeKey| {
        desired.volumes.contains_key(key) && !matches!(resolutions.get(key), Some(Ok(_)))
    };
    // A record reconstructed from the node is keyed by its directory's name (a claim's volume
    // by its PV's name), not by the name its pod gives the volume: it is that pod's volume which
    // resolves to the record's plugin and target — or, not resolved yet, may be it.
    let adopted = |key: &PodVolumeKey, published: &PublishedVolume| {
        // The pod's own volumes only, by one range of the ordered map (a scan of every wanted
        // volume per record would be quadratic after a lost journal at node scale).
        let first = PodVolumeKey { pod_uid: key.pod_uid.clone(), volume: String::new() };
        published.uncertain
            && desired.volumes.range(first..).take_while(|(k, _)| k.pod_uid == key.pod_uid).any(|(k, v)| {
                k != key
                    && !actual.published.contains_key(k)
                    && match wanted(k) {
                        Some(r) => r.plugin == published.plugin && r.target == published.target,
                        None => unresolved(k) && v.spec.as_ref().is_some_and(|s| may_be(&published.spec, s)),
                    }
            })
    };
    let kept = |key: &PodVolumeKey, published: &PublishedVolume| match wanted(key) {
        Some(r) => is_same_volume(r, published),
        None => unresolved(key) || adopted(key, published),
    };

    let mut teardown = Vec::new();
    for (key, published) in &actual.published {
        if !kept(key, published) {
            teardown.push(Operation::Unpublish { volume: published.clone() });
        }
    }
    let published_uses: BTreeSet<&str> = actual.published.values().map(|p| p.unique_name.as_str()).collect();
    let wanted_all: Vec<&Resolution> =
        desired.volumes.keys().filter_map(|k| resolutions.get(k).and_then(|r| r.as_ref().ok())).collect();
    let staging_wanted: HashSet<&str> =
        wanted_all.iter().filter(|r| r.staging_path.is_some()).map(|r| r.unique_name.as_str()).collect();
    let attach_wanted: HashSet<&str> =
        wanted_all.iter().filter(|r| r.attach).map(|r| r.unique_name.as_str()).collect();
    let unresolved_specs: Vec<&VolumeSpec> = desired
        .volumes
        .iter()
        .filter(|(key, _)| unresolved(key))
        .filter_map(|(_, volume)| volume.spec.as_ref())
        .collect();
    let maybe_unresolved = |spec: &VolumeSpec| unresolved_specs.iter().any(|wanted| may_be(spec, wanted));
    for (unique, staged) in &actual.staged {
        let needed = published_uses.contains(unique.as_str())
            || staging_wanted.contains(unique.as_str())
            || maybe_unresolved(&staged.spec);
        if !needed {
            teardown.push(Operation::Unstage { volume: staged.clone() });
        }
    }
    for (unique, attached) in &actual.attached {
        let needed = actual.staged.contains_key(unique)
            || published_uses.contains(unique.as_str())
            || attach_wanted.contains(unique.as_str())
            || maybe_unresolved(&attached.spec);
        if !needed {
            teardown.push(Operation::Detach { volume: attached.clone() });
        }
    }

    let mut bring_up = Vec::new();
    // A terminating pod's volumes are kept above, and nothing new is set up for them.
    for (key, volume) in desired.volumes.iter().filter(|(_, v)| !v.terminating) {
        let Some(r) = wanted(key) else { continue };
        if let Some(published) = actual.published.get(key) {
            // Published (kept), or being torn down before it is published anew; an uncertain
            // record that is kept is published again below.
            if !published.uncertain || !kept(key, published) {
                continue;
            }
        }
        bring_up.push(next_step(key, volume, r, actual));
    }
    let mut held = HeldClaims::new(busy);
    let mut ops = Vec::new();
    for op in teardown.into_iter().chain(bring_up) {
        let claim = op.claim();
        if held.conflicts(&claim) {
            continue;
        }
        held.insert(&claim);
        ops.push(op);
    }
    ops
}

/// Whether a published record is the volume `r` resolves to: the same plugin and unique name,
/// or, for an uncertain record, the same plugin and target (a record reconstructed from the
/// node may not know the unique name the spec gives).
fn is_same_volume(r: &Resolution, published: &PublishedVolume) -> bool {
    r.plugin == published.plugin
        && (r.unique_name == published.unique_name || (published.uncertain && r.target == published.target))
}

/// The next bring-up step of a wanted volume: attach, stage or publish.
fn next_step(
    key: &PodVolumeKey,
    volume: &crate::model::DesiredVolume,
    r: &Resolution,
    actual: &ActualState,
) -> Operation {
    let attached = actual.attached.get(&r.unique_name);
    let staged = actual.staged.get(&r.unique_name).filter(|s| !s.uncertain);
    let attach_needed =
        attached.is_none_or(|a| a.uncertain || (a.device_path.is_none() && r.staging_path.is_some()));
    if r.attach && attach_needed {
        return Operation::Attach {
            unique_name: r.unique_name.clone(),
            plugin: r.plugin.clone(),
            spec: r.spec.clone(),
        };
    }
    if let Some(staging_path) = r.staging_path.clone().filter(|_| staged.is_none()) {
        return Operation::Stage {
            staging_path,
            unique_name: r.unique_name.clone(),
            plugin: r.plugin.clone(),
            spec: r.spec.clone(),
            device_path: attached.and_then(|a| a.device_path.clone()),
        };
    }
    let device_path =
        staged.and_then(|s| s.device_path.clone()).or_else(|| attached.and_then(|a| a.device_path.clone()));
    // An uncertain record kept for this volume is published again where it is: a journal from
    // before kubelet's naming (`…/<pod volume name>`) keeps its pods' paths until they go.
    let target = actual.published.get(key).map_or_else(|| r.target.clone(), |p| p.target.clone());
    Operation::Publish {
        volume: PublishedVolume {
            projection: volume.projection.clone(),
            fs_size: published_size(volume.claim_size, capacity(&r.spec)),
            expansion_deferred: None,
            key: key.clone(),
            pod: volume.pod.clone(),
            pod_name: volume.pod_name.clone(),
            unique_name: r.unique_name.clone(),
            plugin: r.plugin.clone(),
            spec: r.spec.clone(),
            target,
            staging_path: r.staging_path.clone(),
            device_path,
            uncertain: false,
        },
        mount_options: volume.mount_options.clone(),
    }
}

/// Whether `op` stages or publishes an attachable volume that `reported` (the volumes the
/// cluster has taken as in use) does not list yet: kubelet mounts such a volume only once the
/// Node's `volumesInUse` shows it, so the attach/detach controller cannot detach it under the
/// mount. Pure.
pub fn waits_for_in_use(op: &Operation, resolutions: &Resolutions, reported: &BTreeSet<String>) -> bool {
    let attachable = |unique: &str| {
        resolutions.values().filter_map(|r| r.as_ref().ok()).any(|r| r.unique_name == unique && r.attach)
    };
    match op {
        Operation::Stage { unique_name, .. } => attachable(unique_name) && !reported.contains(unique_name),
        Operation::Publish { volume, .. } => {
            attachable(&volume.unique_name) && !reported.contains(&volume.unique_name)
        }
        _ => false,
    }
}

/// Publishes again the published volumes whose plugin asks for it (CSI `requiresRepublish`,
/// as kubelet does on every pod sync) once `period` has passed since their last publish by this
/// agent; a volume with no such time (published before the agent started) is due at once. A
/// volume made of API objects is published again at once when what it should hold changed
/// (another digest, or none known since a restart). Only volumes still wanted as they are
/// published; pure.
pub fn republish(
    desired: &DesiredState,
    resolutions: &Resolutions,
    actual: &ActualState,
    published_at: &BTreeMap<PodVolumeKey, Instant>,
    now: Instant,
    period: Duration,
) -> Vec<Operation> {
    actual
        .published
        .iter()
        .filter_map(|(key, published)| {
            let wanted = desired.volumes.get(key)?;
            let r = resolutions.get(key)?.as_ref().ok()?;
            let same = r.plugin == published.plugin
                && r.unique_name == published.unique_name
                && !published.uncertain;
            let due = published_at.get(key).is_none_or(|at| now.saturating_duration_since(*at) >= period);
            let digest =
                |p: &Option<std::sync::Arc<kvol_api::projection::Projection>>| p.as_ref().map(|p| p.digest());
            let changed =
                wanted.projection.is_some() && digest(&wanted.projection) != digest(&published.projection);
            (same && ((r.republish && due) || changed)).then(|| Operation::Publish {
                volume: PublishedVolume { projection: wanted.projection.clone(), ..published.clone() },
                mount_options: wanted.mount_options.clone(),
            })
        })
        .collect()
}

/// When [`republish`] next finds a timed republish due (a volume of a plugin that asks to be
/// published again, `period` after its last publish), or `None` when no published volume is
/// of such a plugin; a volume already due gives `now`. Pure.
pub fn next_republish(
    resolutions: &Resolutions,
    actual: &ActualState,
    published_at: &BTreeMap<PodVolumeKey, Instant>,
    now: Instant,
    period: Duration,
) -> Option<Instant> {
    actual
        .published
        .iter()
        .filter(|(key, _)| resolutions.get(*key).is_some_and(|r| r.as_ref().is_ok_and(|r| r.republish)))
        .map(|(key, _)| published_at.get(key).map_or(now, |at| (*at + period).max(now)))
        .min()
}

/// The node's part of expansion, kubelet's: a published filesystem volume whose persistent
/// volume's capacity grew past the size the node last made its filesystem is grown to it
/// (`NodeExpandVolume`), online, by its plugin. Only certain records of volumes still wanted as
/// they are published, of a plugin that expands on the node; a record that knows no size (from
/// before kvol recorded it) takes the capacity it has as its size. Pure.
pub fn expansions(desired: &DesiredState, resolutions: &Resolutions, actual: &ActualState) -> Vec<Operation> {
    actual
        .published
        .iter()
        .filter_map(|(key, published)| {
            desired.volumes.get(key)?;
            let r = resolutions.get(key)?.as_ref().ok()?;
            let same = r.plugin == published.plugin
                && r.unique_name == published.unique_name
                && !published.uncertain;
            let wanted = capacity(&r.spec)?;
            let grown = published.fs_size.is_some_and(|size| wanted > size);
            // The plugin said it cannot while the volume is in use: not until it is published again.
            let deferred = published.expansion_deferred.as_ref().is_some_and(|(size, _)| *size >= wanted);
            (same && r.node_expand && grown && !deferred).then(|| Operation::Expand {
                volume: PublishedVolume { spec: r.spec.clone(), ..published.clone() },
                new_size: wanted,
            })
        })
        .collect()
}

/// The size a volume's filesystem has when it is published: its claim's status says what the
/// node last grew it to, so a volume the driver grew while no pod used it (offline) is smaller
/// than its PersistentVolume, and [`expansions`] grows it next; without a claim status, the
/// volume's capacity. Pure.
pub fn published_size(claim_size: Option<u64>, capacity: Option<u64>) -> Option<u64> {
    match (claim_size, capacity) {
        (Some(claim), Some(capacity)) => Some(claim.min(capacity)),
        (_, capacity) => capacity,
    }
}

/// A persistent volume's capacity in bytes (`spec.capacity.storage`).
pub fn capacity(spec: &VolumeSpec) -> Option<u64> {
    let quantity = spec.pv()?.spec.as_ref()?.capacity.as_ref()?.get("storage")?;
    kvol_api::quantity::parse_bytes(&quantity.0).ok()
}

/// Whether `record` (the spec a staged or attached record holds, translated if migrated) may be
/// the volume `wanted` (a pod's spec, as written) names: both persistent with the same PV name,
/// or both inline with the same volume name in the same namespace.
pub fn may_be(record: &VolumeSpec, wanted: &VolumeSpec) -> bool {
    use kvol_plugin::SpecSource;
    let origin = record.migrated.as_ref().and_then(|m| m.inline_origin.as_ref());
    match (&record.source, &wanted.source) {
        (SpecSource::Persistent(_), SpecSource::Persistent(_)) => record.name() == wanted.name(),
        (
            SpecSource::Inline { volume, pod_namespace },
            SpecSource::Inline { volume: w, pod_namespace: wn },
        ) => {
            let (name, namespace) = match origin {
                Some(o) => (o.volume.name.as_str(), o.pod_namespace.as_str()),
                None => (volume.name.as_str(), pod_namespace.as_str()),
            };
            name == w.name && namespace == wn
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{AttachedVolume, DesiredVolume, StagedVolume};
    use kvol_plugin::plugin::PodInfo;
    use kvol_plugin::testing::{csi_pv, inline_empty_dir};

    #[test]
    fn a_volume_is_published_at_the_size_its_claim_says_the_node_made_it() {
        // (what, the claim's status capacity, the PV's capacity, the size recorded at publish)
        let cases = [
            ("no claim status: the volume's", None, Some(32), Some(32)),
            ("status as large: the volume's", Some(32), Some(32), Some(32)),
            ("grown offline: the claim's, grown next", Some(16), Some(32), Some(16)),
            ("a status larger than the volume: the volume's", Some(64), Some(32), Some(32)),
            ("no capacity at all", Some(16), None, None),
        ];
        for (what, claim, pv, want) in cases {
            assert_eq!(published_size(claim, pv), want, "{what}");
        }
    }

    fn key(pod: &str, volume: &str) -> PodVolumeKey {
        PodVolumeKey { pod_uid: pod.into(), volume: volume.into() }
    }

    fn want(desired: &mut DesiredState, pod: &str, volume: &str, spec: VolumeSpec) {
        let k = key(pod, volume);
        let pod_info =
            PodInfo { uid: pod.into(), name: pod.into(), namespace: "ns".into(), ..PodInfo::default() };
        desired.volumes.insert(
            k.clone(),
            DesiredVolume {
                key: k,
                pod: pod_info,
                pod_name: format!("ns/{pod}"),
                spec: Some(spec),
                pending: None,
                mount_options: vec![],
                terminating: false,
                projection: None,
                claim_size: None,
            },
        );
    }

    /// A CSI-like resolution: attach and stage as asked.
    fn res(unique: &str, attach: bool, stage: bool, pod: &str, volume: &str) -> Resolution {
        Resolution {
            plugin: "d.csi".into(),
            unique_name: unique.into(),
            spec: csi_pv(unique, "d.csi"),
            attach,
            staging_path: stage.then(|| PathBuf::from(format!("/stage/{unique}"))),
            target: PathBuf::from(format!("/pods/{pod}/{volume}")),
            republish: false,
            node_expand: false,
        }
    }

    fn published(r: &Resolution, pod: &str, volume: &str) -> PublishedVolume {
        PublishedVolume {
            projection: None,
            fs_size: None,
            expansion_deferred: None,
            key: key(pod, volume),
            pod: PodInfo { uid: pod.into(), name: pod.into(), namespace: "ns".into(), ..PodInfo::default() },
            pod_name: format!("ns/{pod}"),
            unique_name: r.unique_name.clone(),
            plugin: r.plugin.clone(),
            spec: r.spec.clone(),
            target: r.target.clone(),
            staging_path: r.staging_path.clone(),
            device_path: None,
            uncertain: false,
        }
    }

    fn staged(r: &Resolution) -> StagedVolume {
        StagedVolume {
            unique_name: r.unique_name.clone(),
            plugin: r.plugin.clone(),
            spec: r.spec.clone(),
            staging_path: r.staging_path.clone().unwrap(),
            device_path: Some("/dev/x".into()),
            uncertain: false,
        }
    }

    fn attached(r: &Resolution, device: Option<&str>) -> AttachedVolume {
        AttachedVolume {
            unique_name: r.unique_name.clone(),
            plugin: r.plugin.clone(),
            spec: r.spec.clone(),
            device_path: device.map(str::to_string),
            uncertain: false,
        }
    }

    /// The operations as `name key` strings, in order.
    fn names(ops: &[Operation]) -> Vec<String> {
        ops.iter().map(|o| format!("{} {}", o.name(), o.lock_key())).collect()
    }

    #[test]
    fn bring_up_goes_attach_then_stage_then_publish() {
        let r = res("v1", true, true, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let resolutions: Resolutions = [(key("p1", "data"), Ok(r.clone()))].into();
        // (actual state, the one expected operation)
        let mut actual = ActualState::default();
        let steps = [
            (ActualState::default(), "volume_attach volume:v1"),
            (
                {
                    actual.attached.insert("v1".into(), attached(&r, Some("/dev/x")));
                    actual.clone()
                },
                "mount_device volume:v1",
            ),
            (
                {
                    actual.staged.insert("v1".into(), staged(&r));
                    actual.clone()
                },
                "volume_mount pod:p1/data",
            ),
        ];
        for (state, want_op) in steps {
            assert_eq!(names(&plan(&desired, &resolutions, &state, &[])), [want_op]);
        }
        actual.published.insert(key("p1", "data"), published(&r, "p1", "data"));
        assert!(plan(&desired, &resolutions, &actual, &[]).is_empty(), "all done: nothing to do");
        // The publish carries the device learned at attach, through the staged record.
        actual.published.clear();
        match &plan(&desired, &resolutions, &actual, &[])[0] {
            Operation::Publish { volume, .. } => assert_eq!(volume.device_path.as_deref(), Some("/dev/x")),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_terminating_pod_keeps_what_it_has_and_gets_nothing_new() {
        let r = res("v1", true, true, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        desired.volumes.values_mut().for_each(|v| v.terminating = true);
        let resolutions: Resolutions = [(key("p1", "data"), Ok(r.clone()))].into();
        let mut actual = ActualState::default();
        assert!(plan(&desired, &resolutions, &actual, &[]).is_empty(), "nothing attached for it");
        actual.attached.insert("v1".into(), attached(&r, Some("/dev/x")));
        assert!(plan(&desired, &resolutions, &actual, &[]).is_empty(), "attached: not staged, not detached");
        actual.staged.insert("v1".into(), staged(&r));
        actual.published.insert(key("p1", "data"), published(&r, "p1", "data"));
        assert!(plan(&desired, &resolutions, &actual, &[]).is_empty(), "published: kept");
        actual.published.get_mut(&key("p1", "data")).unwrap().uncertain = true;
        assert!(
            plan(&desired, &resolutions, &actual, &[]).is_empty(),
            "uncertain: kept, not published again"
        );
        // The pod gone: everything comes down.
        assert_eq!(
            names(&plan(&DesiredState::default(), &Resolutions::default(), &actual, &[])),
            ["volume_unmount pod:p1/data"]
        );
    }

    #[test]
    fn plugins_without_attach_or_stage_publish_at_once() {
        let spec = inline_empty_dir("cache");
        let r = Resolution {
            plugin: "kubernetes.io/empty-dir".into(),
            unique_name: "cache".into(),
            spec: spec.clone(),
            attach: false,
            staging_path: None,
            target: "/pods/p1/cache".into(),
            republish: false,
            node_expand: false,
        };
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "cache", spec);
        let resolutions: Resolutions = [(key("p1", "cache"), Ok(r))].into();
        assert_eq!(
            names(&plan(&desired, &resolutions, &ActualState::default(), &[])),
            ["volume_mount pod:p1/cache"]
        );
    }

    #[test]
    fn teardown_comes_first_and_in_order() {
        let r = res("v1", true, true, "p1", "data");
        let mut actual = ActualState::default();
        actual.attached.insert("v1".into(), attached(&r, Some("/dev/x")));
        actual.staged.insert("v1".into(), staged(&r));
        actual.published.insert(key("p1", "data"), published(&r, "p1", "data"));
        let desired = DesiredState::default();
        let none = Resolutions::new();
        // Published: only the unpublish (the staged and attached volume are still in use).
        assert_eq!(names(&plan(&desired, &none, &actual, &[])), ["volume_unmount pod:p1/data"]);
        actual.published.clear();
        assert_eq!(names(&plan(&desired, &none, &actual, &[])), ["unmount_device volume:v1"]);
        actual.staged.clear();
        assert_eq!(names(&plan(&desired, &none, &actual, &[])), ["volume_detach volume:v1"]);
        actual.attached.clear();
        assert!(plan(&desired, &none, &actual, &[]).is_empty());
    }

    #[test]
    fn a_shared_volume_is_attached_once_and_kept_while_any_pod_uses_it() {
        let r1 = res("v1", true, true, "p1", "data");
        let r2 = res("v1", true, true, "p2", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r1.spec.clone());
        want(&mut desired, "p2", "data", r2.spec.clone());
        let resolutions: Resolutions =
            [(key("p1", "data"), Ok(r1.clone())), (key("p2", "data"), Ok(r2.clone()))].into();
        assert_eq!(
            names(&plan(&desired, &resolutions, &ActualState::default(), &[])),
            ["volume_attach volume:v1"]
        );

        // p1 goes away while both are published: only p1's publication is torn down.
        let mut actual = ActualState::default();
        actual.attached.insert("v1".into(), attached(&r1, Some("/dev/x")));
        actual.staged.insert("v1".into(), staged(&r1));
        actual.published.insert(key("p1", "data"), published(&r1, "p1", "data"));
        actual.published.insert(key("p2", "data"), published(&r2, "p2", "data"));
        desired.volumes.remove(&key("p1", "data"));
        assert_eq!(names(&plan(&desired, &resolutions, &actual, &[])), ["volume_unmount pod:p1/data"]);
    }

    #[test]
    fn an_unresolvable_wanted_volume_is_not_torn_down() {
        let r = res("v1", false, true, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let mut actual = ActualState::default();
        actual.staged.insert("v1".into(), staged(&r));
        actual.published.insert(key("p1", "data"), published(&r, "p1", "data"));
        let failing: Resolutions =
            [(key("p1", "data"), Err("csi driver d.csi is not registered".to_string()))].into();
        assert!(
            plan(&desired, &failing, &actual, &[]).is_empty(),
            "a driver restarting must not unmount pods"
        );
    }

    #[test]
    fn a_record_an_unresolved_wanted_volume_may_be_is_kept() {
        // After a restart: attached (or staged) before the crash, the driver not back yet.
        let r = res("v1", true, true, "p1", "data");
        let other = res("v2", true, true, "p2", "logs");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let failing: Resolutions =
            [(key("p1", "data"), Err("no volume plugin matched persistent volume \"v1\"".to_string()))]
                .into();
        // (attached, staged, expected operations): the unresolved volume's records stay, an
        // unrelated volume's go.
        let rows: [(&[&Resolution], &[&Resolution], &[&str]); 4] = [
            (&[&r], &[], &[]),
            (&[], &[&r], &[]),
            (&[&r, &other], &[&other], &["unmount_device volume:v2"]),
            (&[&other], &[], &["volume_detach volume:v2"]),
        ];
        for (attached_records, staged_records, expected) in rows {
            let mut actual = ActualState::default();
            for a in attached_records {
                actual.attached.insert(a.unique_name.clone(), attached(a, Some("/dev/x")));
            }
            for s in staged_records {
                actual.staged.insert(s.unique_name.clone(), staged(s));
            }
            let ops = names(&plan(&desired, &failing, &actual, &[]));
            assert_eq!(ops, expected, "attached {attached_records:?}, staged {staged_records:?}");
        }
        // Once the pod is gone, the same records are torn down.
        let mut actual = ActualState::default();
        actual.attached.insert("v1".into(), attached(&r, Some("/dev/x")));
        assert_eq!(
            names(&plan(&DesiredState::default(), &failing, &actual, &[])),
            ["volume_detach volume:v1"]
        );
    }

    #[test]
    fn volumes_whose_plugin_asks_are_published_again_each_period() {
        let period = Duration::from_secs(60);
        let now = Instant::now() + Duration::from_secs(3600);
        let mut asks = res("v1", false, true, "p1", "data");
        asks.republish = true;
        let plain = res("v2", false, true, "p2", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", asks.spec.clone());
        want(&mut desired, "p2", "data", plain.spec.clone());
        let resolutions: Resolutions =
            [(key("p1", "data"), Ok(asks.clone())), (key("p2", "data"), Ok(plain.clone()))].into();
        let mut actual = ActualState::default();
        actual.published.insert(key("p1", "data"), published(&asks, "p1", "data"));
        actual.published.insert(key("p2", "data"), published(&plain, "p2", "data"));
        // (last publish of p1/data, whether it is due, when the next one falls due)
        let rows = [
            (None, true, now),
            (Some(now - Duration::from_secs(61)), true, now),
            (Some(now - period), true, now),
            (Some(now - Duration::from_secs(59)), false, now + Duration::from_secs(1)),
            (Some(now), false, now + period),
        ];
        for (last, due, next) in rows {
            let at: BTreeMap<PodVolumeKey, Instant> =
                last.map(|t| (key("p1", "data"), t)).into_iter().collect();
            let ops = names(&republish(&desired, &resolutions, &actual, &at, now, period));
            let want: &[&str] = if due { &["volume_mount pod:p1/data"] } else { &[] };
            assert_eq!(ops, want, "last publish {last:?}");
            assert_eq!(
                next_republish(&resolutions, &actual, &at, now, period),
                Some(next),
                "last publish {last:?}"
            );
        }
        // No published volume of a plugin that asks: no timed republish ever falls due.
        let plain_only: Resolutions = [(key("p2", "data"), Ok(plain.clone()))].into();
        assert_eq!(next_republish(&plain_only, &actual, &BTreeMap::new(), now, period), None);
        // Not wanted any more, or wanted as something else: no republish.
        let none = BTreeMap::new();
        assert!(republish(&DesiredState::default(), &resolutions, &actual, &none, now, period).is_empty());
        let mut moved = asks.clone();
        moved.unique_name = "v9".into();
        let changed: Resolutions = [(key("p1", "data"), Ok(moved))].into();
        assert!(republish(&desired, &changed, &actual, &none, now, period).is_empty());
    }

    #[test]
    fn may_be_compares_kind_and_name() {
        use kvol_plugin::testing::inline_empty_dir;
        let pv = |name: &str| csi_pv(name, "d.csi");
        let rows = [
            (pv("a"), pv("a"), true),
            (pv("a"), pv("b"), false),
            (inline_empty_dir("a"), inline_empty_dir("a"), true),
            (inline_empty_dir("a"), inline_empty_dir("b"), false),
            (inline_empty_dir("a"), pv("a"), false),
        ];
        for (record, wanted, expected) in rows {
            assert_eq!(may_be(&record, &wanted), expected, "{} vs {}", record.name(), wanted.name());
        }
    }

    #[test]
    fn a_changed_volume_is_torn_down_before_the_new_one_comes_up() {
        let old = res("v1", false, false, "p1", "data");
        let new = res("v2", false, false, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", new.spec.clone());
        let resolutions: Resolutions = [(key("p1", "data"), Ok(new))].into();
        let mut actual = ActualState::default();
        actual.published.insert(key("p1", "data"), published(&old, "p1", "data"));
        assert_eq!(names(&plan(&desired, &resolutions, &actual, &[])), ["volume_unmount pod:p1/data"]);
        actual.published.clear();
        assert_eq!(names(&plan(&desired, &resolutions, &actual, &[])), ["volume_mount pod:p1/data"]);
    }

    #[test]
    fn an_attach_of_unknown_outcome_is_redone_to_learn_the_device() {
        let r = res("v1", true, true, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let resolutions: Resolutions = [(key("p1", "data"), Ok(r.clone()))].into();
        let mut actual = ActualState::default();
        actual.attached.insert("v1".into(), attached(&r, None));
        assert_eq!(names(&plan(&desired, &resolutions, &actual, &[])), ["volume_attach volume:v1"]);
        // Not wanted any more: detached, not left behind.
        assert_eq!(
            names(&plan(&DesiredState::default(), &Resolutions::new(), &actual, &[])),
            ["volume_detach volume:v1"]
        );
    }

    fn uncertain<T: Clone>(mut record: T, set: impl Fn(&mut T)) -> T {
        set(&mut record);
        record
    }

    #[test]
    fn uncertain_records_are_torn_down_like_certain_ones() {
        let r = res("v1", true, true, "p1", "data");
        let p = uncertain(published(&r, "p1", "data"), |v| v.uncertain = true);
        let s = uncertain(staged(&r), |v| v.uncertain = true);
        let a = uncertain(attached(&r, None), |v| v.uncertain = true);
        // (published, staged, attached, expected)
        let rows: [(bool, bool, bool, &[&str]); 4] = [
            (true, true, true, &["volume_unmount pod:p1/data"]),
            (false, true, true, &["unmount_device volume:v1"]),
            (false, false, true, &["volume_detach volume:v1"]),
            (true, false, false, &["volume_unmount pod:p1/data"]),
        ];
        for (has_p, has_s, has_a, expected) in rows {
            let mut actual = ActualState::default();
            if has_p {
                actual.published.insert(key("p1", "data"), p.clone());
            }
            if has_s {
                actual.staged.insert("v1".into(), s.clone());
            }
            if has_a {
                actual.attached.insert("v1".into(), a.clone());
            }
            let ops = names(&plan(&DesiredState::default(), &Resolutions::new(), &actual, &[]));
            assert_eq!(ops, expected, "published {has_p}, staged {has_s}, attached {has_a}");
        }
    }

    #[test]
    fn an_uncertain_wanted_volume_is_set_up_again() {
        let r = res("v1", true, true, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let resolutions: Resolutions = [(key("p1", "data"), Ok(r.clone()))].into();
        let certain_attach = attached(&r, Some("/dev/x"));
        let certain_stage = staged(&r);
        // A publish record reconstructed from the node: right plugin and target, unique name
        // not known.
        let mut reconstructed = published(&r, "p1", "data");
        reconstructed.unique_name = "kubernetes.io/csi/unknown".into();
        reconstructed.uncertain = true;
        let mut elsewhere = reconstructed.clone();
        elsewhere.target = "/pods/p1/other".into();
        // (attached, staged, published, expected)
        type Row<'a> = (AttachedVolume, Option<StagedVolume>, Option<PublishedVolume>, &'a [&'a str]);
        let rows: [Row; 5] = [
            (
                uncertain(certain_attach.clone(), |a| a.uncertain = true),
                None,
                None,
                &["volume_attach volume:v1"],
            ),
            (
                certain_attach.clone(),
                Some(uncertain(certain_stage.clone(), |s| s.uncertain = true)),
                None,
                &["mount_device volume:v1"],
            ),
            (
                certain_attach.clone(),
                Some(certain_stage.clone()),
                Some(uncertain(published(&r, "p1", "data"), |p| p.uncertain = true)),
                &["volume_mount pod:p1/data"],
            ),
            (
                certain_attach.clone(),
                Some(certain_stage.clone()),
                Some(reconstructed),
                &["volume_mount pod:p1/data"],
            ),
            // Another target: not this volume, so torn down first (the publish waits for it).
            (
                certain_attach.clone(),
                Some(certain_stage.clone()),
                Some(elsewhere),
                &["volume_unmount pod:p1/data"],
            ),
        ];
        for (a, st, p, expected) in rows {
            let mut actual = ActualState::default();
            actual.attached.insert("v1".into(), a);
            if let Some(st) = st {
                actual.staged.insert("v1".into(), st);
            }
            if let Some(p) = p {
                actual.published.insert(key("p1", "data"), p);
            }
            assert_eq!(names(&plan(&desired, &resolutions, &actual, &[])), expected, "{actual:?}");
        }
        // Certain and published: nothing to do, not even for the republish of uncertain ones.
        let mut actual = ActualState::default();
        actual.attached.insert("v1".into(), certain_attach);
        actual.staged.insert("v1".into(), certain_stage);
        actual.published.insert(key("p1", "data"), published(&r, "p1", "data"));
        assert!(plan(&desired, &resolutions, &actual, &[]).is_empty());
    }

    #[test]
    fn a_record_at_the_pod_volume_name_path_stays_there_until_its_pod_goes() {
        // A journal from before kubelet's naming: the volume was published at
        // `…/<pod volume name>`, the resolution now says `…/<pv name>`.
        let r = res("v1", false, false, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let mut moved = r.clone();
        moved.target = "/pods/p1/pv-1".into();
        let resolutions: Resolutions = [(key("p1", "data"), Ok(moved))].into();
        let old = published(&r, "p1", "data");
        // Certain: kept where it is, nothing planned (no unpublish, no second mount).
        let mut actual = ActualState::default();
        actual.published.insert(key("p1", "data"), old.clone());
        assert!(plan(&desired, &resolutions, &actual, &[]).is_empty());
        // Uncertain (a publish cut short): published again at its own path, not the new one.
        actual.published.insert(key("p1", "data"), uncertain(old.clone(), |p| p.uncertain = true));
        match plan(&desired, &resolutions, &actual, &[]).as_slice() {
            [Operation::Publish { volume, .. }] => assert_eq!(volume.target, old.target),
            other => panic!("expected one publish, got {other:?}"),
        }
        // Its pod gone: torn down at its own path.
        match plan(&DesiredState::default(), &Resolutions::new(), &actual, &[]).as_slice() {
            [Operation::Unpublish { volume }] => assert_eq!(volume.target, old.target),
            other => panic!("expected one unpublish, got {other:?}"),
        }
    }

    #[test]
    fn a_record_reconstructed_under_its_directorys_name_is_the_pods_volume_at_that_target() {
        // The pod calls its claim's volume `data`; the node's directory (and so the
        // reconstructed record) is named after the PV, `pv-1`, at the target `data` resolves to.
        let r = res("v1", false, false, "p1", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p1", "data", r.spec.clone());
        let at_target = uncertain(published(&r, "p1", "pv-1"), |p| p.uncertain = true);
        let elsewhere = uncertain(published(&r, "p1", "pv-1"), |p| p.target = "/pods/p1/other".into());
        let other_pod = uncertain(published(&r, "p2", "pv-1"), |p| p.target = r.target.clone());
        let resolved: Resolutions = [(key("p1", "data"), Ok(r.clone()))].into();
        let unresolved: Resolutions = [(key("p1", "data"), Err("driver not registered".into()))].into();
        // (what, the record, the resolutions, the plan)
        let rows: [(&str, PublishedVolume, &Resolutions, &[&str]); 5] = [
            (
                "uncertain at the target: published again there",
                at_target.clone(),
                &resolved,
                &["volume_mount pod:p1/data"],
            ),
            ("the driver not back yet: kept, nothing done", at_target.clone(), &unresolved, &[]),
            (
                "certain (a journal's, not reconstructed): another volume",
                PublishedVolume { uncertain: false, ..at_target.clone() },
                &resolved,
                &["volume_unmount pod:p1/pv-1", "volume_mount pod:p1/data"],
            ),
            (
                "another target: another volume",
                uncertain(elsewhere, |p| p.uncertain = true),
                &resolved,
                &["volume_unmount pod:p1/pv-1", "volume_mount pod:p1/data"],
            ),
            (
                "another pod's: not this pod's volume",
                uncertain(other_pod, |p| p.uncertain = true),
                &resolved,
                &["volume_unmount pod:p2/pv-1", "volume_mount pod:p1/data"],
            ),
        ];
        for (what, record, resolutions, want) in rows {
            let mut actual = ActualState::default();
            actual.published.insert(record.key.clone(), record);
            assert_eq!(names(&plan(&desired, resolutions, &actual, &[])), want, "{what}");
        }
        // The publish replaces the reconstructed record: one record at the target.
        let mut actual = ActualState::default();
        actual.published.insert(key("p1", "pv-1"), at_target.clone());
        crate::executor::apply(
            &mut actual,
            crate::actual::store::ActualChange::SetPublished(published(&r, "p1", "data")),
        );
        assert_eq!(actual.published.keys().collect::<Vec<_>>(), [&key("p1", "data")]);
    }

    #[test]
    fn an_attachable_volume_is_staged_and_published_once_the_cluster_has_it_in_use() {
        let attachable = res("v1", true, true, "p1", "data");
        let plain = res("e1", false, false, "p2", "cache");
        let resolutions: Resolutions =
            [(key("p1", "data"), Ok(attachable.clone())), (key("p2", "cache"), Ok(plain.clone()))].into();
        let stage = Operation::Stage {
            unique_name: "v1".into(),
            plugin: "d.csi".into(),
            spec: attachable.spec.clone(),
            device_path: None,
            staging_path: "/stage/v1".into(),
        };
        let publish = |r: &Resolution, pod: &str, volume: &str| Operation::Publish {
            volume: published(r, pod, volume),
            mount_options: Vec::new(),
        };
        let attach = Operation::Attach {
            unique_name: "v1".into(),
            plugin: "d.csi".into(),
            spec: attachable.spec.clone(),
        };
        let listed: BTreeSet<String> = ["v1".to_string()].into();
        let none = BTreeSet::new();
        // (operation, reported in use, waits)
        let rows: [(&Operation, &BTreeSet<String>, bool); 7] = [
            (&stage, &none, true),
            (&stage, &listed, false),
            (&publish(&attachable, "p1", "data"), &none, true),
            (&publish(&attachable, "p1", "data"), &listed, false),
            (&publish(&plain, "p2", "cache"), &none, false),
            (&attach, &none, false),
            (&Operation::Unpublish { volume: published(&attachable, "p1", "data") }, &none, false),
        ];
        for (op, reported, want) in rows {
            assert_eq!(waits_for_in_use(op, &resolutions, reported), want, "{} {reported:?}", op.name());
        }
    }

    fn busy(unique: &str, pod: Option<(&str, &str)>) -> Claim {
        Claim { unique_name: unique.into(), pod: pod.map(|(uid, volume)| key(uid, volume)) }
    }

    #[test]
    fn nothing_is_planned_for_a_volume_with_an_operation_in_flight() {
        let r1 = res("v1", false, true, "p1", "data");
        let r2 = res("v1", false, true, "p2", "data");
        let mut desired = DesiredState::default();
        want(&mut desired, "p2", "data", r2.spec.clone());
        let resolutions: Resolutions = [(key("p2", "data"), Ok(r2.clone()))].into();
        let mut staged_only = ActualState::default();
        staged_only.staged.insert("v1".into(), staged(&r1));
        let mut p1_leaving = staged_only.clone();
        p1_leaving.published.insert(key("p1", "data"), published(&r1, "p1", "data"));
        // (actual, running, expected)
        let rows: [(&ActualState, Vec<Claim>, &[&str]); 6] = [
            // Nothing running: p2 is published on the staged volume.
            (&staged_only, vec![], &["volume_mount pod:p2/data"]),
            // An unstage or a detach of v1 in flight: p2's publish waits for it.
            (&staged_only, vec![busy("v1", None)], &[]),
            // A publish of another pod on v1: p2's publish runs beside it.
            (&staged_only, vec![busy("v1", Some(("p1", "data")))], &["volume_mount pod:p2/data"]),
            // p2's own pod volume busy (an earlier unpublish): nothing for it.
            (&staged_only, vec![busy("v0", Some(("p2", "data")))], &[]),
            // p1 leaves while p2 arrives: both pod-level, both planned.
            (&p1_leaving, vec![], &["volume_unmount pod:p1/data", "volume_mount pod:p2/data"]),
            // Another volume busy: no effect.
            (
                &p1_leaving,
                vec![busy("v9", None)],
                &["volume_unmount pod:p1/data", "volume_mount pod:p2/data"],
            ),
        ];
        for (actual, running, expected) in rows {
            assert_eq!(
                names(&plan(&desired, &resolutions, actual, &running)),
                expected,
                "running {running:?}"
            );
        }
        // Nothing wanted and the stage still published by p1: the unstage is not planned beside
        // p1's unpublish, and waits for an unpublish in flight.
        let none = Resolutions::new();
        let empty = DesiredState::default();
        assert_eq!(names(&plan(&empty, &none, &p1_leaving, &[])), ["volume_unmount pod:p1/data"]);
        assert!(plan(&empty, &none, &staged_only, &[busy("v1", Some(("p1", "data")))]).is_empty());
        assert_eq!(names(&plan(&empty, &none, &staged_only, &[])), ["unmount_device volume:v1"]);
    }

    /// `spec` with `spec.capacity.storage` set to `size`.
    fn sized(spec: &VolumeSpec, size: &str) -> VolumeSpec {
        let mut pv = spec.pv().unwrap().clone();
        let quantity = k8s_openapi::apimachinery::pkg::api::resource::Quantity(size.to_string());
        pv.spec.as_mut().unwrap().capacity = Some([("storage".to_string(), quantity)].into());
        VolumeSpec::persistent(pv)
    }

    #[test]
    fn a_grown_volume_is_expanded_on_the_node_once_and_only_when_it_may_be() {
        // (what, recorded size, the PV's capacity now, plugin expands on the node, uncertain, expected new size)
        type Case = (&'static str, Option<u64>, &'static str, bool, bool, Option<u64>);
        let cases: &[Case] = &[
            ("grown: expanded to the new capacity", Some(16 << 20), "32Mi", true, false, Some(32 << 20)),
            ("the same size: nothing", Some(32 << 20), "32Mi", true, false, None),
            ("shrunk (refused upstream of here): nothing", Some(32 << 20), "16Mi", true, false, None),
            (
                "a plugin that does not expand on the node: nothing",
                Some(16 << 20),
                "32Mi",
                false,
                false,
                None,
            ),
            ("an uncertain record: published again first", Some(16 << 20), "32Mi", true, true, None),
            ("no size recorded (an older journal): nothing", None, "32Mi", true, false, None),
        ];
        for (what, recorded, now, expands, uncertain, want) in cases {
            let mut r = res("v1", false, true, "p", "data");
            r.spec = sized(&r.spec, now);
            r.node_expand = *expands;
            let mut desired = DesiredState::default();
            want_volume(&mut desired, &r);
            let mut actual = ActualState::default();
            let record =
                PublishedVolume { fs_size: *recorded, uncertain: *uncertain, ..published(&r, "p", "data") };
            actual.published.insert(key("p", "data"), record);
            let resolutions: Resolutions = [(key("p", "data"), Ok(r.clone()))].into();
            let got: Vec<u64> = expansions(&desired, &resolutions, &actual)
                .into_iter()
                .map(|op| match op {
                    Operation::Expand { volume, new_size } => {
                        assert_eq!(volume.fs_size, *recorded, "{what}: the old size travels with the record");
                        assert_eq!(
                            capacity(&volume.spec),
                            Some(new_size),
                            "{what}: the spec of the new size"
                        );
                        new_size
                    }
                    other => panic!("{what}: {other:?}"),
                })
                .collect();
            assert_eq!(got, want.iter().copied().collect::<Vec<_>>(), "{what}");
        }
        // Deferred by the plugin (not while in use): not asked again for that size, asked for more.
        for (deferred_at, now, asked) in [(32 << 20, "32Mi", false), (32 << 20, "64Mi", true)] {
            let mut r = res("v1", false, true, "p", "data");
            r.spec = sized(&r.spec, now);
            r.node_expand = true;
            let mut desired = DesiredState::default();
            want_volume(&mut desired, &r);
            let mut actual = ActualState::default();
            let record = PublishedVolume {
                fs_size: Some(16 << 20),
                expansion_deferred: Some((deferred_at, "in use".into())),
                ..published(&r, "p", "data")
            };
            actual.published.insert(key("p", "data"), record);
            let resolutions: Resolutions = [(key("p", "data"), Ok(r.clone()))].into();
            assert_eq!(
                !expansions(&desired, &resolutions, &actual).is_empty(),
                asked,
                "deferred at 32Mi, now {now}"
            );
        }
        // A volume no pod wants any more is torn down, not expanded.
        let r = res("v1", false, true, "p", "data");
        let mut actual = ActualState::default();
        actual
            .published
            .insert(key("p", "data"), PublishedVolume { fs_size: Some(1), ..published(&r, "p", "data") });
        let resolutions: Resolutions = [(key("p", "data"), Ok(r))].into();
        assert!(expansions(&DesiredState::default(), &resolutions, &actual).is_empty());
    }

    fn want_volume(desired: &mut DesiredState, r: &Resolution) {
        want(desired, "p", "data", r.spec.clone());
    }
}
