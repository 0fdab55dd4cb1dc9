//! Crash recovery: the actual state rebuilt from the store's record, the operations a crash interrupted, the mount table and the pod volume directories.
//!
//! [`crate::actual::observe`] reads the node (the mount table and a walk of
//! `<root>/pods/*/volumes/*/*`); [`rebuild`] is pure and decides. "Mounted at or under P" below means some mount point equals
//! P or lies below it, compared by path components (`/a/b-2` is not below `/a/b`). A publish
//! target counts as mounted when something is mounted below it because CSI publishes at
//! `<target>/mount`.
//!
//! Interrupted operations (journal entries not finished), applied in id order:
//!
//! - **Publish**: target mounted at or under → recorded published (it finished before the
//!   crash); otherwise recorded *uncertain*: a driver can finish a call after its caller died,
//!   so the reconciler publishes it again if the pod still wants it and unpublishes it if not
//!   (both idempotent) — nothing a dead agent started is forgotten.
//! - **Unpublish**: target still mounted at or under → stays published (the reconciler retries
//!   the teardown if the pod no longer wants it); otherwise recorded uncertain, so the
//!   teardown is issued again: a CSI driver keeps its own books (and `vol_data.json` is removed
//!   only after it answers), so "nothing mounted" does not mean the driver was told.
//! - **Stage**: the same with the staging path (which the journal entry carries): mounted at or
//!   under → staged, otherwise staged *uncertain*.
//! - **Unstage**: staging path still mounted → stays staged; otherwise staged uncertain, so
//!   the unstage is issued again (it is idempotent), for the same reason.
//! - **Attach**: whether the storage side finished is unknown, so the volume is recorded
//!   attached *uncertain* with no device path: detached if no longer wanted (no leaked
//!   attachment), attached again if still wanted, which is idempotent in every plugin and
//!   learns the device. A stored attached record of the volume is kept as it is.
//! - **Detach**: stays attached, uncertain (the reconciler retries the detach).
//!
//! Records no journal entry touches:
//!
//! - A **published** record whose target has nothing mounted at or under it ("mount gone")
//!   becomes uncertain, so the reconciler publishes it again if still wanted (drift repair)
//!   and tears it down (removing its directory) if not, except a `kubernetes.io/empty-dir`
//!   record whose directory still exists: a disk emptyDir is a plain directory, not a mount.
//! - A **staged** record is kept whether or not its staging path is mounted: some plugins stage
//!   without a mount (a local volume that is a directory, drivers whose stage mounts nothing).
//! - An **attached** record is kept: attachments are not visible in the mount table.
//!
//! Finally, every pod volume directory on disk that neither is nor contains the target of a
//! published record is an **orphan**: [`crate::actual::reconstruct`] attributes it to its plugin and
//! records it uncertain, so it is torn down through that plugin; [`clear_orphan`] removes one
//! that cannot be attributed when it is empty with nothing mounted, and any other is left alone
//! and reported (kvol does not know what made it).

use std::collections::BTreeSet;
use std::io;
use std::ops::Bound;
use std::path::{Path, PathBuf};

use kvol_plugin::NodePaths;

use crate::actual::observe::{NodeObservation, PodVolumeDir, subdirectories};
use crate::actual::store::JournalEntry;
use crate::model::{ActualState, AttachedVolume, Operation, PodVolumeKey, PublishedVolume, StagedVolume};

/// The rebuilt actual state, each decision about an interrupted operation or a drifted record
/// in words, and the pod volume directories no record accounts for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Rebuilt {
    pub actual: ActualState,
    pub notes: Vec<String>,
    pub orphans: Vec<PodVolumeDir>,
}

/// Clears away an orphan pod volume directory, as kubelet clears orphaned pod directories: only
/// when nothing is mounted at or below it and it is empty (removed with `rmdir`, which cannot
/// delete data), then its parents up to the pod directory while they are empty. Returns `None`
/// when it is gone, or why it was left.
pub fn clear_orphan(orphan: &PodVolumeDir, mount_points: &BTreeSet<PathBuf>) -> Option<String> {
    let path = &orphan.path;
    if any_at_or_under(mount_points, path) {
        return Some(format!(
            "orphan pod volume directory {} has something mounted at or below it: left alone",
            path.display()
        ));
    }
    // A kill while a CSI record was being written leaves its temporary copy: kvol's own, and
    // with nothing mounted below, no data.
    if let Err(e) = kvol_csi::paths::remove_stray_vol_data_temps(path) {
        return Some(format!("cannot clear orphan pod volume directory {}: {e}", path.display()));
    }
    match std::fs::remove_dir(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) if e.kind() == io::ErrorKind::DirectoryNotEmpty => {
            return Some(format!(
                "orphan pod volume directory {} is not empty: left for a person to look at",
                path.display()
            ));
        }
        Err(e) => return Some(format!("cannot remove orphan pod volume directory {}: {e}", path.display())),
    }
    // volumes/<plugin dir>, volumes, pods/<uid>: each only if now empty.
    for parent in path.ancestors().skip(1).take(3) {
        if std::fs::remove_dir(parent).is_err() {
            break;
        }
    }
    None
}

/// Clears the directories of pods that are not in `wanted` and have no published record:
/// `pods/<uid>/volumes/<plugin dir>`, `volumes` and the block devices' directories with `rmdir`
/// only, each while empty (a volume's directory is never removed here: teardown does that).
/// Once none of them is left, what else kubelet keeps in a pod's directory (`etc-hosts`,
/// `containers/`, `plugins/`) goes with the pod directory, as kubelet clears an orphaned
/// pod's directory — never through a mount, never following a link. Returns the pod
/// directories that stay, with why.
pub fn clear_empty_pod_dirs(
    paths: &NodePaths,
    wanted: &BTreeSet<&str>,
    actual: &ActualState,
) -> Vec<(PathBuf, String)> {
    let mut left = Vec::new();
    let Ok(pods) = subdirectories(&paths.root().join("pods")) else { return left };
    for (uid, pod_dir) in pods {
        if wanted.contains(uid.as_str()) || actual.published.keys().any(|k| k.pod_uid == uid) {
            continue;
        }
        // SubPath binds a crash left (their volumes' unpublish takes them down otherwise):
        // unmounted, their empty mount points removed, nothing else touched.
        if pod_dir.join(kvol_plugin::subpath::SUBPATHS_DIR).exists() {
            match kvol_plugin::subpath::clean_up(&pod_dir, None) {
                Ok(report) => left.extend(report.kept.iter().map(|k| (k.path.clone(), k.reason.clone()))),
                Err(e) => {
                    left.push((pod_dir.clone(), format!("subPath binds of {} stay: {e}", pod_dir.display())))
                }
            }
        }
        let volumes = pod_dir.join("volumes");
        for (_, plugin_dir) in subdirectories(&volumes).unwrap_or_default() {
            let _ = std::fs::remove_dir(&plugin_dir);
        }
        let _ = std::fs::remove_dir(&volumes);
        let devices = pod_dir.join(kvol_plugin::block::VOLUME_DEVICES);
        for (_, plugin_dir) in subdirectories(&devices).unwrap_or_default() {
            let _ = std::fs::remove_dir(&plugin_dir);
        }
        let _ = std::fs::remove_dir(&devices);
        if std::fs::remove_dir(&pod_dir).is_ok() {
            continue;
        }
        let volume_content = [volumes, devices, pod_dir.join("volume-subpaths")];
        if volume_content.iter().any(|d| std::fs::symlink_metadata(d).is_ok()) {
            continue; // a volume is still there: its teardown comes first
        }
        let removed = paths
            .open_root()
            .map_err(|e| e.to_string())
            .and_then(|root| root.remove_all(&pod_dir).map_err(|e| e.to_string()));
        match removed {
            Ok(()) => {
                tracing::info!(path = %pod_dir.display(), "removed the directory of a pod no longer wanted")
            }
            Err(e) => left.push((
                pod_dir.clone(),
                format!("pod directory {} of a pod no longer wanted stays: {e}", pod_dir.display()),
            )),
        }
    }
    left
}

/// Whether some path of `set` equals `path` or lies below it. Paths order by components, so
/// the paths below `path` follow it directly.
fn any_at_or_under(set: &BTreeSet<PathBuf>, path: &Path) -> bool {
    set.range::<Path, _>((Bound::Included(path), Bound::Unbounded))
        .next()
        .is_some_and(|p| p.starts_with(path))
}

/// Rebuilds the actual state from the stored record, the unfinished journal entries (in id
/// order) and what the node shows, by the rules of the module documentation.
pub fn rebuild(stored: &ActualState, incomplete: &[JournalEntry], seen: &NodeObservation) -> Rebuilt {
    // A block volume's pod device link is a symlink: its global map file's mount counts.
    let mounted =
        |path: &Path| any_at_or_under(&seen.mount_points, &kvol_plugin::block::mount_check_path(path));
    let mut actual = stored.clone();
    let mut notes = Vec::new();
    let mut journaled: BTreeSet<PodVolumeKey> = BTreeSet::new();

    for entry in incomplete {
        let id = entry.id;
        match &entry.operation {
            Operation::Publish { volume, .. } => {
                journaled.insert(volume.key.clone());
                let target = volume.target.display();
                if mounted(&volume.target) {
                    notes.push(format!(
                        "interrupted publish of {} (journal entry {id}): {target} is mounted, recorded published",
                        volume.key
                    ));
                    actual.published.insert(volume.key.clone(), volume.clone());
                } else {
                    notes.push(format!(
                        "interrupted publish of {} (journal entry {id}): nothing is mounted at {target} yet, recorded uncertain",
                        volume.key
                    ));
                    let record = PublishedVolume { uncertain: true, ..volume.clone() };
                    actual.published.insert(volume.key.clone(), record);
                }
            }
            // The record keeps its old size: the expansion is planned again, and growing a
            // filesystem to a size it has is done at once.
            Operation::Expand { volume, new_size } => {
                notes.push(format!(
                    "interrupted expansion of {} to {new_size} bytes (journal entry {id}): expanded again",
                    volume.key
                ));
            }
            Operation::Unpublish { volume } => {
                journaled.insert(volume.key.clone());
                let target = volume.target.display();
                if mounted(&volume.target) {
                    notes.push(format!(
                        "interrupted unpublish of {} (journal entry {id}): {target} is still mounted, stays published",
                        volume.key
                    ));
                    actual.published.entry(volume.key.clone()).or_insert_with(|| volume.clone());
                } else {
                    notes.push(format!(
                        "interrupted unpublish of {} (journal entry {id}): nothing is mounted at {target}, recorded uncertain to be torn down again",
                        volume.key
                    ));
                    let record = PublishedVolume { uncertain: true, ..volume.clone() };
                    actual.published.insert(volume.key.clone(), record);
                }
            }
            Operation::Stage { unique_name, plugin, spec, device_path, staging_path } => {
                let uncertain = !mounted(staging_path);
                notes.push(if uncertain {
                    format!(
                        "interrupted stage of {unique_name} (journal entry {id}): nothing is mounted at {} yet, recorded uncertain",
                        staging_path.display()
                    )
                } else {
                    format!(
                        "interrupted stage of {unique_name} (journal entry {id}): {} is mounted, recorded staged",
                        staging_path.display()
                    )
                });
                let volume = StagedVolume {
                    unique_name: unique_name.clone(),
                    plugin: plugin.clone(),
                    spec: spec.clone(),
                    staging_path: staging_path.clone(),
                    device_path: device_path.clone(),
                    uncertain,
                };
                actual.staged.insert(unique_name.clone(), volume);
            }
            Operation::Unstage { volume } => {
                let name = &volume.unique_name;
                let staging = volume.staging_path.display();
                if mounted(&volume.staging_path) {
                    notes.push(format!(
                        "interrupted unstage of {name} (journal entry {id}): {staging} is still mounted, stays staged"
                    ));
                    actual.staged.entry(name.clone()).or_insert_with(|| volume.clone());
                } else {
                    notes.push(format!(
                        "interrupted unstage of {name} (journal entry {id}): nothing is mounted at {staging}, recorded uncertain to be unstaged again"
                    ));
                    actual.staged.insert(name.clone(), StagedVolume { uncertain: true, ..volume.clone() });
                }
            }
            Operation::Attach { unique_name, plugin, spec } => {
                if actual.attached.contains_key(unique_name) {
                    notes.push(format!(
                        "interrupted attach of {unique_name} (journal entry {id}): it was attached before, record kept"
                    ));
                } else {
                    notes.push(format!(
                        "interrupted attach of {unique_name} (journal entry {id}): outcome unknown, recorded attached uncertain without a device"
                    ));
                    let volume = AttachedVolume {
                        unique_name: unique_name.clone(),
                        plugin: plugin.clone(),
                        spec: spec.clone(),
                        device_path: None,
                        uncertain: true,
                    };
                    actual.attached.insert(unique_name.clone(), volume);
                }
            }
            Operation::Detach { volume } => {
                // The storage side may have detached already: keep the record (so an unwanted
                // volume is detached again, idempotently) but forget the device, so a volume
                // wanted again is attached again rather than staged from a stale device.
                notes.push(format!(
                    "interrupted detach of {} (journal entry {id}): stays attached with its device unknown, to be detached (or attached) again",
                    volume.unique_name
                ));
                let record =
                    actual.attached.entry(volume.unique_name.clone()).or_insert_with(|| volume.clone());
                record.device_path = None;
                record.uncertain = true;
            }
        }
    }

    let dirs: BTreeSet<&Path> = seen.pod_volume_dirs.iter().map(|d| d.path.as_path()).collect();
    for (key, volume) in actual.published.iter_mut() {
        if journaled.contains(key) || volume.uncertain || mounted(&volume.target) {
            continue;
        }
        if crate::model::plain_directory_plugin(&volume.plugin) && dirs.contains(volume.target.as_path()) {
            continue;
        }
        let gone = if crate::model::plain_directory_plugin(&volume.plugin) {
            "directory gone"
        } else {
            "mount gone"
        };
        notes.push(format!(
            "published {key} ({}) at {}: {gone}, recorded uncertain: published again if still wanted, torn down if not",
            volume.plugin,
            volume.target.display()
        ));
        volume.uncertain = true;
    }

    let targets: BTreeSet<PathBuf> = actual.published.values().map(|v| v.target.clone()).collect();
    let orphans =
        seen.pod_volume_dirs.iter().filter(|d| !any_at_or_under(&targets, &d.path)).cloned().collect();
    Rebuilt { actual, notes, orphans }
}

#[cfg(test)]
mod tests {
    const EMPTY_DIR: &str = "kubernetes.io/empty-dir";
    use std::collections::BTreeMap;

    use super::*;
    use kvol_plugin::plugin::PodInfo;
    use kvol_plugin::testing::{csi_pv, inline_empty_dir};

    /// The records of `actual` by kind, as `name` or `name device` strings (ending in ` ?` when
    /// uncertain), for comparing.
    fn summary(actual: &ActualState) -> BTreeMap<&'static str, Vec<String>> {
        let mark = |uncertain: bool| if uncertain { " ?" } else { "" };
        let attached = actual
            .attached
            .values()
            .map(|a| match &a.device_path {
                Some(d) => format!("{} {d}{}", a.unique_name, mark(a.uncertain)),
                None => format!("{}{}", a.unique_name, mark(a.uncertain)),
            })
            .collect();
        let staged =
            actual.staged.values().map(|s| format!("{}{}", s.unique_name, mark(s.uncertain))).collect();
        let published = actual.published.iter().map(|(k, p)| format!("{k}{}", mark(p.uncertain))).collect();
        BTreeMap::from([("attached", attached), ("staged", staged), ("published", published)])
    }

    const ROOT: &str = "/k";

    fn target(pod: &str, plugin: &str, volume: &str) -> PathBuf {
        NodePaths::new(ROOT).pod_volume_dir(pod, plugin, volume).unwrap()
    }

    fn staging(unique: &str) -> PathBuf {
        PathBuf::from(format!("{ROOT}/plugins/kubernetes.io/csi/d.csi/{unique}/globalmount"))
    }

    fn published(pod: &str, plugin: &str, volume: &str) -> PublishedVolume {
        let spec = if plugin == EMPTY_DIR { inline_empty_dir(volume) } else { csi_pv(volume, "d.csi") };
        PublishedVolume {
            projection: None,
            fs_size: None,
            expansion_deferred: None,
            key: PodVolumeKey { pod_uid: pod.into(), volume: volume.into() },
            pod: PodInfo { uid: pod.into(), name: pod.into(), namespace: "ns".into(), ..PodInfo::default() },
            pod_name: format!("ns/{pod}"),
            unique_name: volume.into(),
            plugin: plugin.into(),
            spec,
            target: target(pod, plugin, volume),
            staging_path: None,
            device_path: None,
            uncertain: false,
        }
    }

    fn csi(pod: &str, volume: &str) -> PublishedVolume {
        published(pod, "kubernetes.io/csi", volume)
    }

    fn empty_dir(pod: &str, volume: &str) -> PublishedVolume {
        published(pod, EMPTY_DIR, volume)
    }

    fn staged(unique: &str) -> StagedVolume {
        StagedVolume {
            unique_name: unique.into(),
            plugin: "kubernetes.io/csi".into(),
            spec: csi_pv(unique, "d.csi"),
            staging_path: staging(unique),
            device_path: Some("/dev/sdb".into()),
            uncertain: false,
        }
    }

    fn attached(unique: &str, device: Option<&str>) -> AttachedVolume {
        AttachedVolume {
            unique_name: unique.into(),
            plugin: "kubernetes.io/csi".into(),
            spec: csi_pv(unique, "d.csi"),
            device_path: device.map(str::to_string),
            uncertain: false,
        }
    }

    fn state(
        attached_: &[AttachedVolume],
        staged_: &[StagedVolume],
        published_: &[PublishedVolume],
    ) -> ActualState {
        ActualState {
            attached: attached_.iter().map(|v| (v.unique_name.clone(), v.clone())).collect(),
            staged: staged_.iter().map(|v| (v.unique_name.clone(), v.clone())).collect(),
            published: published_.iter().map(|v| (v.key.clone(), v.clone())).collect(),
        }
    }

    fn dir(pod: &str, plugin: &str, volume: &str) -> PodVolumeDir {
        PodVolumeDir {
            pod_uid: pod.into(),
            plugin_dir: kvol_plugin::host::escape_plugin_name(plugin),
            volume: volume.into(),
            path: target(pod, plugin, volume),
        }
    }

    fn publish(v: PublishedVolume) -> Operation {
        Operation::Publish { volume: v, mount_options: vec![] }
    }

    fn stage(unique: &str) -> Operation {
        Operation::Stage {
            unique_name: unique.into(),
            plugin: "kubernetes.io/csi".into(),
            spec: csi_pv(unique, "d.csi"),
            device_path: Some("/dev/sdb".into()),
            staging_path: staging(unique),
        }
    }

    fn attach(unique: &str) -> Operation {
        Operation::Attach {
            unique_name: unique.into(),
            plugin: "kubernetes.io/csi".into(),
            spec: csi_pv(unique, "d.csi"),
        }
    }

    /// One row: the stored state, the interrupted operations, what the node shows, and what
    /// the rebuild must decide.
    struct Case {
        name: &'static str,
        stored: ActualState,
        incomplete: Vec<Operation>,
        mounts: Vec<PathBuf>,
        dirs: Vec<PodVolumeDir>,
        /// `attached` (`name` or `name device`), `staged`, `published` (`uid/volume`).
        want: [Vec<&'static str>; 3],
        /// Pod volume directory paths (below the root) reported as orphans.
        orphans: Vec<PathBuf>,
        /// A phrase one of the notes must contain (or, when empty, there must be no note).
        note: &'static str,
    }

    /// A block volume published to its pod device link (a symlink; kvol's bind mount on the
    /// global map file is what shows it mapped).
    fn block(pod: &str, volume: &str) -> PublishedVolume {
        let target = NodePaths::new(ROOT).pod_device_path(pod, "kubernetes.io/csi", volume).unwrap();
        PublishedVolume { target, ..csi(pod, volume) }
    }

    fn global_map_file(pod: &str, volume: &str) -> PathBuf {
        PathBuf::from(format!("{ROOT}/plugins/kubernetes.io/csi/volumeDevices/{volume}/dev/{pod}"))
    }

    fn cases() -> Vec<Case> {
        let none = ActualState::default;
        vec![
            Case {
                name: "interrupted block publish, global map file mounted: published",
                stored: none(),
                incomplete: vec![publish(block("p1", "pv-b"))],
                mounts: vec![global_map_file("p1", "pv-b")],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/pv-b"]],
                orphans: vec![],
                note: "is mounted, recorded published",
            },
            Case {
                name: "interrupted block publish, nothing mapped yet: uncertain",
                stored: none(),
                incomplete: vec![publish(block("p1", "pv-b"))],
                mounts: vec![PathBuf::from("/k")],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/pv-b ?"]],
                orphans: vec![],
                note: "nothing is mounted at",
            },
            Case {
                name: "published block volume still mapped after a crash: kept",
                stored: state(&[], &[], &[block("p1", "pv-b")]),
                incomplete: vec![],
                mounts: vec![global_map_file("p1", "pv-b")],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/pv-b"]],
                orphans: vec![],
                note: "",
            },
            Case {
                name: "published block volume whose mapping is gone: uncertain, mapped again",
                stored: state(&[], &[], &[block("p1", "pv-b")]),
                incomplete: vec![],
                mounts: vec![],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/pv-b ?"]],
                orphans: vec![],
                note: "mount gone",
            },
            Case {
                name: "interrupted publish, target mounted: published",
                stored: none(),
                incomplete: vec![publish(csi("p1", "data"))],
                mounts: vec![target("p1", "kubernetes.io/csi", "data")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data"]],
                orphans: vec![],
                note: "is mounted, recorded published",
            },
            Case {
                name: "interrupted publish, mounted below the target (csi <target>/mount): published",
                stored: none(),
                incomplete: vec![publish(csi("p1", "data"))],
                mounts: vec![target("p1", "kubernetes.io/csi", "data").join("mount")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data"]],
                orphans: vec![],
                note: "recorded published",
            },
            Case {
                name: "interrupted publish, nothing mounted yet: uncertain (the driver may still finish it)",
                stored: none(),
                incomplete: vec![publish(csi("p1", "data"))],
                mounts: vec![PathBuf::from("/"), PathBuf::from("/k")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data ?"]],
                orphans: vec![],
                note: "nothing is mounted at /k/pods/p1/volumes/kubernetes.io~csi/data yet, recorded uncertain",
            },
            Case {
                name: "interrupted publish, only a sibling sharing a name prefix mounted: uncertain",
                stored: state(&[], &[], &[csi("p1", "data-2")]),
                incomplete: vec![publish(csi("p1", "data"))],
                mounts: vec![target("p1", "kubernetes.io/csi", "data-2")],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/data ?", "p1/data-2"]],
                orphans: vec![],
                note: "recorded uncertain",
            },
            Case {
                name: "interrupted publish of a disk emptyDir whose directory exists: uncertain, redone or torn down",
                stored: none(),
                incomplete: vec![publish(empty_dir("p1", "cache"))],
                mounts: vec![],
                dirs: vec![dir("p1", EMPTY_DIR, "cache")],
                want: [vec![], vec![], vec!["p1/cache ?"]],
                orphans: vec![],
                note: "recorded uncertain",
            },
            Case {
                name: "interrupted unpublish, still mounted: stays published",
                stored: state(&[], &[], &[csi("p1", "data")]),
                incomplete: vec![Operation::Unpublish { volume: csi("p1", "data") }],
                mounts: vec![target("p1", "kubernetes.io/csi", "data").join("mount")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data"]],
                orphans: vec![],
                note: "is still mounted, stays published",
            },
            Case {
                name: "interrupted unpublish, still mounted, no stored record: the entry's record is kept",
                stored: none(),
                incomplete: vec![Operation::Unpublish { volume: csi("p1", "data") }],
                mounts: vec![target("p1", "kubernetes.io/csi", "data")],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/data"]],
                orphans: vec![],
                note: "stays published",
            },
            Case {
                name: "interrupted unpublish, unmounted: uncertain, torn down again through the driver",
                stored: state(&[], &[], &[csi("p1", "data")]),
                incomplete: vec![Operation::Unpublish { volume: csi("p1", "data") }],
                mounts: vec![],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data ?"]],
                orphans: vec![],
                note: "nothing is mounted at /k/pods/p1/volumes/kubernetes.io~csi/data, recorded uncertain",
            },
            Case {
                name: "interrupted unpublish of a disk emptyDir: uncertain, torn down again",
                stored: state(&[], &[], &[empty_dir("p1", "cache")]),
                incomplete: vec![Operation::Unpublish { volume: empty_dir("p1", "cache") }],
                mounts: vec![],
                dirs: vec![dir("p1", EMPTY_DIR, "cache")],
                want: [vec![], vec![], vec!["p1/cache ?"]],
                orphans: vec![],
                note: "recorded uncertain",
            },
            Case {
                name: "interrupted stage whose staging path (from the journal) is mounted: staged",
                stored: state(&[attached("v1", Some("/dev/sdb"))], &[], &[]),
                incomplete: vec![stage("v1")],
                mounts: vec![staging("v1")],
                dirs: vec![],
                want: [vec!["v1 /dev/sdb"], vec!["v1"], vec![]],
                orphans: vec![],
                note: "is mounted, recorded staged",
            },
            Case {
                name: "interrupted stage of a recorded volume, mounted: staged",
                stored: state(&[], &[staged("v1")], &[]),
                incomplete: vec![stage("v1")],
                mounts: vec![staging("v1")],
                dirs: vec![],
                want: [vec![], vec!["v1"], vec![]],
                orphans: vec![],
                note: "globalmount is mounted, recorded staged",
            },
            Case {
                name: "interrupted stage of a recorded volume, unmounted: staged uncertain",
                stored: state(&[], &[staged("v1")], &[]),
                incomplete: vec![stage("v1")],
                mounts: vec![],
                dirs: vec![],
                want: [vec![], vec!["v1 ?"], vec![]],
                orphans: vec![],
                note: "globalmount yet, recorded uncertain",
            },
            Case {
                name: "interrupted unstage, still mounted: stays staged",
                stored: state(&[], &[staged("v1")], &[]),
                incomplete: vec![Operation::Unstage { volume: staged("v1") }],
                mounts: vec![staging("v1")],
                dirs: vec![],
                want: [vec![], vec!["v1"], vec![]],
                orphans: vec![],
                note: "is still mounted, stays staged",
            },
            Case {
                name: "interrupted unstage, unmounted: uncertain, unstaged again",
                stored: state(&[], &[staged("v1")], &[]),
                incomplete: vec![Operation::Unstage { volume: staged("v1") }],
                mounts: vec![],
                dirs: vec![],
                want: [vec![], vec!["v1 ?"], vec![]],
                orphans: vec![],
                note: "recorded uncertain to be unstaged again",
            },
            Case {
                name: "interrupted attach: attached uncertain, without a device",
                stored: none(),
                incomplete: vec![attach("v1")],
                mounts: vec![],
                dirs: vec![],
                want: [vec!["v1 ?"], vec![], vec![]],
                orphans: vec![],
                note: "outcome unknown, recorded attached uncertain without a device",
            },
            Case {
                name: "interrupted re-attach of an attached volume: the record is kept",
                stored: state(&[attached("v1", Some("/dev/sdb"))], &[], &[]),
                incomplete: vec![attach("v1")],
                mounts: vec![],
                dirs: vec![],
                want: [vec!["v1 /dev/sdb"], vec![], vec![]],
                orphans: vec![],
                note: "record kept",
            },
            Case {
                name: "interrupted detach: stays attached",
                stored: state(&[attached("v1", Some("/dev/sdb"))], &[], &[]),
                incomplete: vec![Operation::Detach { volume: attached("v1", Some("/dev/sdb")) }],
                mounts: vec![],
                dirs: vec![],
                want: [vec!["v1 ?"], vec![], vec![]],
                orphans: vec![],
                note: "stays attached",
            },
            Case {
                name: "interrupted detach with no stored record: the entry's record",
                stored: none(),
                incomplete: vec![Operation::Detach { volume: attached("v1", None) }],
                mounts: vec![],
                dirs: vec![],
                want: [vec!["v1 ?"], vec![], vec![]],
                orphans: vec![],
                note: "stays attached",
            },
            Case {
                name: "published record with its mount: kept, no note",
                stored: state(&[], &[], &[csi("p1", "data")]),
                incomplete: vec![],
                mounts: vec![target("p1", "kubernetes.io/csi", "data").join("mount")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data"]],
                orphans: vec![],
                note: "",
            },
            Case {
                name: "published record whose mount is gone: uncertain, to be published again or torn down",
                stored: state(&[], &[], &[csi("p1", "data")]),
                incomplete: vec![],
                mounts: vec![PathBuf::from("/k")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "data")],
                want: [vec![], vec![], vec!["p1/data ?"]],
                orphans: vec![],
                note: "mount gone",
            },
            Case {
                name: "published disk emptyDir whose directory exists: kept",
                stored: state(&[], &[], &[empty_dir("p1", "cache")]),
                incomplete: vec![],
                mounts: vec![],
                dirs: vec![dir("p1", EMPTY_DIR, "cache")],
                want: [vec![], vec![], vec!["p1/cache"]],
                orphans: vec![],
                note: "",
            },
            Case {
                name: "published disk emptyDir whose directory is gone: uncertain",
                stored: state(&[], &[], &[empty_dir("p1", "cache")]),
                incomplete: vec![],
                mounts: vec![],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/cache ?"]],
                orphans: vec![],
                note: "directory gone",
            },
            Case {
                name: "the directory exception is for emptyDir only: a bare hostPath directory is uncertain",
                stored: state(&[], &[], &[published("p1", "kubernetes.io/host-path", "logs")]),
                incomplete: vec![],
                mounts: vec![],
                dirs: vec![dir("p1", "kubernetes.io/host-path", "logs")],
                want: [vec![], vec![], vec!["p1/logs ?"]],
                orphans: vec![],
                note: "mount gone",
            },
            Case {
                name: "staged and attached records without mounts: kept",
                stored: state(&[attached("v1", Some("/dev/sdb"))], &[staged("v1")], &[]),
                incomplete: vec![],
                mounts: vec![],
                dirs: vec![],
                want: [vec!["v1 /dev/sdb"], vec!["v1"], vec![]],
                orphans: vec![],
                note: "",
            },
            Case {
                name: "pod volume directories no record accounts for: orphans, the others not",
                stored: state(&[], &[], &[csi("p1", "data"), empty_dir("p1", "cache")]),
                incomplete: vec![],
                mounts: vec![target("p1", "kubernetes.io/csi", "data")],
                dirs: vec![
                    dir("p1", EMPTY_DIR, "cache"),
                    dir("p1", "kubernetes.io/csi", "data"),
                    dir("p1", "kubernetes.io/csi", "old"),
                    dir("p2", EMPTY_DIR, "scratch"),
                ],
                want: [vec![], vec![], vec!["p1/cache", "p1/data"]],
                orphans: vec![target("p1", "kubernetes.io/csi", "old"), target("p2", EMPTY_DIR, "scratch")],
                note: "",
            },
            Case {
                name: "entries apply in id order: a publish then its unpublish, unmounted",
                stored: none(),
                incomplete: vec![
                    publish(csi("p1", "data")),
                    Operation::Unpublish { volume: csi("p1", "data") },
                ],
                mounts: vec![],
                dirs: vec![],
                want: [vec![], vec![], vec!["p1/data ?"]],
                orphans: vec![],
                note: "interrupted unpublish of p1/data (journal entry 2)",
            },
            Case {
                name: "a whole volume mid-bring-up: attach recorded, stage unknown, publish mounted",
                stored: none(),
                incomplete: vec![attach("v1"), publish(csi("p1", "v1"))],
                mounts: vec![target("p1", "kubernetes.io/csi", "v1").join("mount")],
                dirs: vec![dir("p1", "kubernetes.io/csi", "v1")],
                want: [vec!["v1 ?"], vec![], vec!["p1/v1"]],
                orphans: vec![],
                note: "recorded published",
            },
        ]
    }

    #[test]
    fn rebuild_follows_the_rules() {
        for case in cases() {
            let incomplete: Vec<JournalEntry> = case
                .incomplete
                .into_iter()
                .zip(1..)
                .map(|(operation, id)| JournalEntry { id, operation, started_unix_ms: 1_700_000_000_000 })
                .collect();
            let seen = NodeObservation {
                mount_points: case.mounts.into_iter().collect(),
                pod_volume_dirs: case.dirs,
                ..NodeObservation::default()
            };
            let rebuilt = rebuild(&case.stored, &incomplete, &seen);
            let want: BTreeMap<&str, Vec<String>> = ["attached", "staged", "published"]
                .into_iter()
                .zip(case.want)
                .map(|(kind, names)| (kind, names.into_iter().map(str::to_string).collect()))
                .collect();
            assert_eq!(summary(&rebuilt.actual), want, "{}", case.name);
            let orphans: Vec<PathBuf> = rebuilt.orphans.iter().map(|o| o.path.clone()).collect();
            assert_eq!(orphans, case.orphans, "{}: orphans", case.name);
            if case.note.is_empty() {
                assert!(rebuilt.notes.is_empty(), "{}: unexpected notes {:?}", case.name, rebuilt.notes);
            } else {
                assert!(
                    rebuilt.notes.iter().any(|n| n.contains(case.note)),
                    "{}: no note contains {:?}: {:?}",
                    case.name,
                    case.note,
                    rebuilt.notes
                );
            }
            // Every interrupted operation and every dropped record is explained.
            assert!(rebuilt.notes.len() >= incomplete.len(), "{}: {:?}", case.name, rebuilt.notes);
        }
    }

    #[test]
    fn recorded_records_are_the_ones_decided_on() {
        // A publish found mounted is recorded exactly as journaled (pod, spec, staging path).
        let mut volume = csi("p1", "data");
        volume.staging_path = Some(staging("data"));
        volume.device_path = Some("/dev/sdc".into());
        let entry = JournalEntry { id: 7, operation: publish(volume.clone()), started_unix_ms: 0 };
        let seen = NodeObservation {
            mount_points: [volume.target.clone()].into(),
            pod_volume_dirs: vec![],
            ..NodeObservation::default()
        };
        let rebuilt = rebuild(&ActualState::default(), &[entry], &seen);
        assert_eq!(rebuilt.actual.published.get(&volume.key), Some(&volume));

        // A stage found mounted takes the journaled spec and device, the stored staging path.
        let mut before = staged("v1");
        before.device_path = None;
        let entry = JournalEntry { id: 8, operation: stage("v1"), started_unix_ms: 0 };
        let seen = NodeObservation {
            mount_points: [staging("v1")].into(),
            pod_volume_dirs: vec![],
            ..NodeObservation::default()
        };
        let rebuilt = rebuild(&state(&[], &[before], &[]), &[entry], &seen);
        assert_eq!(rebuilt.actual.staged.get("v1"), Some(&staged("v1")));
    }

    #[test]
    fn at_or_under_compares_components() {
        let set: BTreeSet<PathBuf> =
            ["/a/b-2", "/a/bc", "/a/b/c/d", "/x"].into_iter().map(PathBuf::from).collect();
        // (path, whether something of the set is at or under it)
        let table = [
            ("/a/b", true),
            ("/a/b/c", true),
            ("/a/b/c/d", true),
            ("/a/b/e", false),
            ("/a/b-", false),
            ("/a", true),
            ("/", true),
            ("/x", true),
            ("/x/y", false),
            ("/y", false),
        ];
        for (path, want) in table {
            assert_eq!(any_at_or_under(&set, Path::new(path)), want, "{path}");
        }
        assert!(!any_at_or_under(&BTreeSet::new(), Path::new("/")));
    }
}
