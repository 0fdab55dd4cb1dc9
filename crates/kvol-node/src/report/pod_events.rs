//! Kubelet's volume Events for pods, decided purely: which failures of which pod volumes to report, with kubelet's reasons, and each failure once (a retry bumps its count instead of making another Event).
//!
//! Reasons and message prefixes are kubelet's (`pkg/kubelet/events`, the operation generator):
//! a failed attach is `FailedAttachVolume` / "AttachVolume.Attach failed for volume …"; a failed
//! stage `FailedMount` / "MountVolume.MountDevice failed for volume …"; a failed publish
//! `FailedMount` / "MountVolume.SetUp failed for volume …". A raw block volume (`volumeMode:
//! Block`) is mapped, not mounted, and kubelet says so: `FailedMapVolume` /
//! "MapVolume.SetUpDevice failed …" for its stage, "MapVolume.MapPodDevice failed …" for its
//! publish; a failed online expansion on the node (`volume_fs_resize`, as kubelet names it)
//! `VolumeResizeFailed` / "NodeExpandVolume.NodeExpandVolume failed …". The prefixes are kept as kubelet
//! writes them so that what people search for in `kubectl describe pod` is found. Teardown
//! failures are node-side, not the pod's (the pod may be gone), and are not reported.

use std::collections::BTreeMap;

use crate::executor::ExecSnapshot;
use crate::model::DesiredState;
use crate::reconciler::Resolutions;

/// One pod volume whose last operation failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VolumeFailure {
    /// `namespace/name`.
    pub pod: String,
    pub pod_uid: String,
    pub volume: String,
    /// The executor's operation name (`volume_attach`, `mount_device`, `volume_mount`).
    pub operation: &'static str,
    /// The volume is a raw block volume (mapped into the pod, not mounted).
    pub block: bool,
    /// How many times in a row it failed.
    pub count: u32,
    pub error: String,
}

/// Receives the failing pod volumes after every pass; the cluster's writer makes Events.
pub trait PodEventSink: Send + Sync + std::fmt::Debug {
    fn report(&self, failures: &[VolumeFailure]);
}

/// Kubelet's Event reason and message prefix for a failed `operation` on a filesystem or a
/// raw `block` volume; `None` for teardown.
pub fn kubelet_reason(operation: &str, block: bool) -> Option<(&'static str, &'static str)> {
    match (operation, block) {
        ("volume_attach", _) => Some(("FailedAttachVolume", "AttachVolume.Attach failed")),
        ("mount_device", false) => Some(("FailedMount", "MountVolume.MountDevice failed")),
        ("volume_mount", false) => Some(("FailedMount", "MountVolume.SetUp failed")),
        ("mount_device", true) => Some(("FailedMapVolume", "MapVolume.SetUpDevice failed")),
        ("volume_mount", true) => Some(("FailedMapVolume", "MapVolume.MapPodDevice failed")),
        ("volume_fs_resize", _) => Some(("VolumeResizeFailed", "NodeExpandVolume.NodeExpandVolume failed")),
        _ => None,
    }
}

/// The failures of the volumes pods want now (a volume's attach or stage failure counts for
/// every pod using it).
pub fn volume_failures(
    desired: &DesiredState,
    resolutions: &Resolutions,
    exec: &ExecSnapshot,
) -> Vec<VolumeFailure> {
    let mut out = Vec::new();
    for (key, want) in &desired.volumes {
        let unique = resolutions.get(key).and_then(|r| r.as_ref().ok()).map(|r| &r.unique_name);
        let failure = exec
            .failures
            .get(&format!("pod:{key}"))
            .or_else(|| unique.and_then(|u| exec.failures.get(&format!("volume:{u}"))));
        let block = want.spec.as_ref().is_some_and(|s| s.is_block());
        if let Some(f) = failure.filter(|f| kubelet_reason(f.operation, block).is_some()) {
            out.push(VolumeFailure {
                pod: want.pod_name.clone(),
                pod_uid: key.pod_uid.clone(),
                volume: key.volume.clone(),
                operation: f.operation,
                block,
                count: f.count,
                error: f.last_error.clone(),
            });
        }
    }
    out
}

/// An Event to write.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodEvent {
    /// Stable per (pod, volume, reason, message): the Event's name suffix.
    pub key: String,
    pub namespace: String,
    pub pod_name: String,
    pub pod_uid: String,
    pub reason: &'static str,
    pub message: String,
    pub count: u32,
}

/// What to write this time.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum EventChange {
    /// A failure not reported before.
    Create(PodEvent),
    /// A reported failure that happened again: its count is now `count`.
    Bump { event: PodEvent },
}

/// The Events already made, so a failure is one Event whose count follows the retries.
#[derive(Debug, Default)]
pub struct EventBook {
    counts: BTreeMap<String, u32>,
}

impl EventBook {
    /// The writes `failures` call for; failures gone from the list are forgotten (the same
    /// failure later is a new Event, as kubelet's aggregation window would make it).
    pub fn changes(&mut self, failures: &[VolumeFailure]) -> Vec<EventChange> {
        let mut next = BTreeMap::new();
        let mut out = Vec::new();
        for f in failures {
            let Some(event) = pod_event(f) else { continue };
            match self.counts.get(&event.key) {
                None => out.push(EventChange::Create(event.clone())),
                Some(&seen) if seen != event.count => out.push(EventChange::Bump { event: event.clone() }),
                Some(_) => {}
            }
            next.insert(event.key, event.count);
        }
        self.counts = next;
        out
    }
}

/// The Event for one failure; `None` for an operation kubelet reports no Event for.
fn pod_event(f: &VolumeFailure) -> Option<PodEvent> {
    let (reason, prefix) = kubelet_reason(f.operation, f.block)?;
    let (namespace, pod_name) = f.pod.split_once('/').unwrap_or(("default", f.pod.as_str()));
    let message = format!("{prefix} for volume {:?} : {}", f.volume, f.error);
    let key = short_hash(&format!("{}\n{}\n{reason}\n{message}", f.pod_uid, f.volume));
    Some(PodEvent {
        key,
        namespace: namespace.to_string(),
        pod_name: pod_name.to_string(),
        pod_uid: f.pod_uid.clone(),
        reason,
        message,
        count: f.count.max(1),
    })
}

/// 16 hex digits of FNV-1a: stable across restarts, enough to tell a pod's failures apart.
fn short_hash(text: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(volume: &str, operation: &'static str, count: u32, error: &str) -> VolumeFailure {
        VolumeFailure {
            pod: "shop/web".into(),
            pod_uid: "u1".into(),
            volume: volume.into(),
            operation,
            block: false,
            count,
            error: error.into(),
        }
    }

    #[test]
    fn reasons_are_kubelets() {
        let cases = [
            ("volume_attach", false, Some(("FailedAttachVolume", "AttachVolume.Attach failed"))),
            ("volume_attach", true, Some(("FailedAttachVolume", "AttachVolume.Attach failed"))),
            ("mount_device", false, Some(("FailedMount", "MountVolume.MountDevice failed"))),
            ("volume_mount", false, Some(("FailedMount", "MountVolume.SetUp failed"))),
            ("mount_device", true, Some(("FailedMapVolume", "MapVolume.SetUpDevice failed"))),
            ("volume_mount", true, Some(("FailedMapVolume", "MapVolume.MapPodDevice failed"))),
            (
                "volume_fs_resize",
                false,
                Some(("VolumeResizeFailed", "NodeExpandVolume.NodeExpandVolume failed")),
            ),
            ("volume_unmount", false, None),
            ("volume_unmount", true, None),
            ("unmount_device", false, None),
            ("volume_detach", true, None),
        ];
        for (operation, block, want) in cases {
            assert_eq!(kubelet_reason(operation, block), want, "{operation} block={block}");
        }
    }

    #[test]
    fn a_failure_is_one_event_whose_count_follows_the_retries() {
        type Pass<'a> = (&'a [VolumeFailure], &'a [(&'a str, u32)]);
        let disk = |n| failure("data", "volume_attach", n, "disk is attached to n9");
        let mount = |n| failure("data", "volume_mount", n, "exit status 32");
        // Each pass: the failures seen, then the writes wanted ("create"/"bump", count).
        let passes: &[Pass] = &[
            (&[disk(1)], &[("create", 1)]),
            (&[disk(1)], &[]),
            (&[disk(2)], &[("bump", 2)]),
            (&[disk(2)], &[]),
            (&[disk(3), mount(1)], &[("bump", 3), ("create", 1)]),
            (&[], &[]),
            (&[disk(1)], &[("create", 1)]),
        ];
        let mut book = EventBook::default();
        for (i, (failures, want)) in passes.iter().enumerate() {
            let got: Vec<(&str, u32)> = book
                .changes(failures)
                .iter()
                .map(|c| match c {
                    EventChange::Create(e) => ("create", e.count),
                    EventChange::Bump { event } => ("bump", event.count),
                })
                .collect();
            assert_eq!(got, *want, "pass {i}");
        }
    }

    #[test]
    fn events_name_the_pod_the_volume_and_the_error() {
        let mut book = EventBook::default();
        let changes = book.changes(&[
            failure("data", "volume_attach", 1, "disk is attached to n9"),
            failure("data", "volume_unmount", 1, "busy"),
        ]);
        let [EventChange::Create(event)] = changes.as_slice() else { panic!("{changes:?}") };
        assert_eq!((event.namespace.as_str(), event.pod_name.as_str()), ("shop", "web"));
        assert_eq!(event.reason, "FailedAttachVolume");
        assert_eq!(event.message, "AttachVolume.Attach failed for volume \"data\" : disk is attached to n9");
        let other = book.changes(&[failure("data", "volume_attach", 1, "another error")]);
        let [EventChange::Create(second)] = other.as_slice() else { panic!("{other:?}") };
        assert_ne!(second.key, event.key, "another message is another event");
    }
}
