//! The status report made from what is wanted, how it resolved and what the executor has, and when to make and write it.

use std::time::{Duration, SystemTime};

use kvol_plugin::Snapshot;

use crate::config::AgentConfig;
use crate::executor::ExecSnapshot;
use crate::model::DesiredState;
use crate::reconciler::Resolutions;
use crate::report::status::{NodeVolumeStatus, Phase, StatusReport, VolumeStatus};

/// The status report is made, and its file written, at most once per this while it keeps
/// changing (a burst of operations ending would otherwise make and write it on every pass);
/// the last change is made and written once the gap is over.
pub const STATUS_MIN_GAP: Duration = Duration::from_millis(5);

/// An unchanged status file is written again this often, so its `updated` stays fresh.
pub const STATUS_REFRESH: Duration = Duration::from_secs(5);

/// A report whose inputs did not change is made again this often, so the ages of running
/// operations it shows stay fresh.
pub const REPORT_REFRESH: Duration = Duration::from_secs(1);

/// Whether to make (or write) the status now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusWrite {
    Now,
    /// Changed, but made less than [`STATUS_MIN_GAP`] ago: by a pass after this long.
    After(Duration),
    NotYet,
}

/// When to make or write the status: `changed` says whether it (or what it is made from)
/// differs from the last time, `since_last` how long ago that was (`None`: never); unchanged,
/// it is done again after `refresh`.
///
/// `settled` (no operation running) writes a change at once: the gap only thins out the
/// reports of a burst, never delays the one that shows where it ended.
pub fn status_write(
    changed: bool,
    since_last: Option<Duration>,
    refresh: Duration,
    settled: bool,
) -> StatusWrite {
    match since_last {
        None => StatusWrite::Now,
        Some(age) if age >= refresh => StatusWrite::Now,
        Some(_) if changed && settled => StatusWrite::Now,
        Some(age) if changed && age >= STATUS_MIN_GAP => StatusWrite::Now,
        Some(age) if changed => StatusWrite::After(STATUS_MIN_GAP - age),
        Some(_) => StatusWrite::NotYet,
    }
}

#[allow(clippy::too_many_arguments)]
pub fn status_report(
    config: &AgentConfig,
    problems: Vec<String>,
    desired: &DesiredState,
    resolutions: &Resolutions,
    exec: &ExecSnapshot,
    started: SystemTime,
    metrics_address: &Option<String>,
    snapshot: &Snapshot,
) -> StatusReport {
    let now = SystemTime::now();
    let ms = |t: SystemTime| t.duration_since(SystemTime::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let volumes = volume_statuses(desired, resolutions, exec);
    let mut unique_names: Vec<&String> =
        exec.actual.attached.keys().chain(exec.actual.staged.keys()).collect();
    unique_names.sort();
    unique_names.dedup();
    let node_volumes = unique_names
        .into_iter()
        .map(|unique| {
            let attached = exec.actual.attached.get(unique);
            let staged = exec.actual.staged.get(unique);
            let lock = format!("volume:{unique}");
            let running = exec.running.get(&lock);
            let failure = exec.failures.get(&lock);
            let phase = match (running.map(|r| r.operation), failure) {
                (Some("volume_attach"), _) => Phase::Attaching,
                (Some("mount_device"), _) => Phase::Staging,
                (Some(_), _) => Phase::TearingDown,
                (None, Some(_)) => Phase::Failed,
                (None, None) if staged.is_some() => Phase::Staged,
                (None, None) => Phase::Attached,
            };
            NodeVolumeStatus {
                unique_name: unique.clone(),
                plugin: staged
                    .map(|s| s.plugin.clone())
                    .or_else(|| attached.map(|a| a.plugin.clone()))
                    .unwrap_or_default(),
                phase,
                attached: attached.is_some(),
                device_path: staged
                    .and_then(|s| s.device_path.clone())
                    .or_else(|| attached.and_then(|a| a.device_path.clone())),
                staging_path: staged.map(|s| s.staging_path.clone()),
                last_error: failure.map(describe_failure),
                progress: running.map(|r| {
                    format!("{} running for {:.1} s", r.operation, r.started.elapsed().as_secs_f64())
                }),
            }
        })
        .collect();
    StatusReport {
        csi_node: None,
        components: Vec::new(),
        snapshots: Vec::new(),
        claims: Vec::new(),
        node_volumes,
        node: config.node_name.clone(),
        pid: std::process::id(),
        started_unix_ms: ms(started),
        updated_unix_ms: ms(now),
        metrics_address: metrics_address.clone(),
        volumes,
        problems,
        plugins: snapshot.plugins().iter().map(|r| r.plugin.name().to_string()).collect(),
    }
}

/// Every pod volume the node wants or has, with its phase, plugin, paths and why it is not
/// published: what `kvol status` lists and the runtime API answers from.
pub fn volume_statuses(
    desired: &DesiredState,
    resolutions: &Resolutions,
    exec: &ExecSnapshot,
) -> Vec<VolumeStatus> {
    let mut volumes = Vec::new();
    let mut keys: Vec<_> = desired.volumes.keys().cloned().collect();
    for key in exec.actual.published.keys() {
        if !desired.volumes.contains_key(key) {
            keys.push(key.clone());
        }
    }
    for key in keys {
        let want = desired.volumes.get(&key);
        let published = exec.actual.published.get(&key);
        let resolution = resolutions.get(&key);
        let ok = resolution.and_then(|r| r.as_ref().ok());
        let unique = ok.map(|r| r.unique_name.clone()).or_else(|| published.map(|p| p.unique_name.clone()));
        let pod_lock = format!("pod:{key}");
        let volume_lock = unique.as_ref().map(|u| format!("volume:{u}"));
        let running =
            exec.running.get(&pod_lock).or_else(|| volume_lock.as_ref().and_then(|l| exec.running.get(l)));
        let failure =
            exec.failures.get(&pod_lock).or_else(|| volume_lock.as_ref().and_then(|l| exec.failures.get(l)));
        let staged = unique.as_ref().and_then(|u| exec.actual.staged.get(u));
        let attached = unique.as_ref().and_then(|u| exec.actual.attached.get(u));
        let phase = if let Some(r) = running {
            match r.operation {
                "volume_attach" => Phase::Attaching,
                "mount_device" => Phase::Staging,
                "volume_mount" => Phase::Publishing,
                // Growing a published filesystem: it stays published, and says so in progress.
                "volume_fs_resize" => Phase::Published,
                _ => Phase::TearingDown,
            }
        } else if want.is_none() {
            Phase::TearingDown
        } else if published.is_some_and(|p| p.uncertain) {
            Phase::Uncertain
        } else if published.is_some() {
            Phase::Published
        } else if failure.is_some() || matches!(resolution, Some(Err(_))) {
            Phase::Failed
        } else if staged.is_some() {
            Phase::Staged
        } else if attached.is_some() {
            Phase::Attached
        } else {
            Phase::Pending
        };
        let last_error =
            failure.map(describe_failure).or_else(|| resolution.and_then(|r| r.as_ref().err().cloned()));
        let spec = published.map(|p| &p.spec).or(ok.map(|r| &r.spec));
        volumes.push(VolumeStatus {
            pod: want
                .map(|w| w.pod_name.clone())
                .or_else(|| published.map(|p| p.pod_name.clone()))
                .unwrap_or_default(),
            pod_uid: key.pod_uid.clone(),
            volume: key.volume.clone(),
            plugin: published.map(|p| p.plugin.clone()).or_else(|| ok.map(|r| r.plugin.clone())),
            phase,
            migrated: spec.is_some_and(|s| s.migrated.is_some()),
            device_path: published
                .and_then(|p| p.device_path.clone())
                .or_else(|| attached.and_then(|a| a.device_path.clone())),
            staging_path: staged
                .map(|s| s.staging_path.clone())
                .or_else(|| ok.and_then(|r| r.staging_path.clone())),
            target: published.map(|p| p.target.clone()).or_else(|| ok.map(|r| r.target.clone())),
            last_error,
            pending_reason: want.and_then(|w| w.pending.clone()).or_else(|| {
                want.filter(|w| w.terminating && published.is_none())
                    .map(|_| "the pod is being deleted: nothing new is set up for it".to_string())
            }),
            progress: running
                .map(|r| format!("{} running for {:.1} s", r.operation, r.started.elapsed().as_secs_f64())),
        });
    }
    volumes.extend(unused_statuses(desired, exec));
    volumes
}

/// The volumes no container uses, as status lists them: not set up, with kubelet's rule as
/// the reason (one still published from before is listed above, tearing down).
fn unused_statuses<'a>(
    desired: &'a DesiredState,
    exec: &'a ExecSnapshot,
) -> impl Iterator<Item = VolumeStatus> + 'a {
    desired.unused.iter().filter(|(key, _)| !exec.actual.published.contains_key(*key)).map(|(key, pod)| {
        VolumeStatus {
            pod: pod.clone(),
            pod_uid: key.pod_uid.clone(),
            volume: key.volume.clone(),
            plugin: None,
            phase: Phase::Unused,
            migrated: false,
            device_path: None,
            staging_path: None,
            target: None,
            last_error: None,
            pending_reason: Some(format!(
                "no container of pod {pod} mounts volume {:?} (volumeMounts) or maps it (volumeDevices): \
                 not set up, as kubelet sets up only the volumes its containers use",
                key.volume
            )),
            progress: None,
        }
    })
}

/// A failure as status shows it: the operation, how often, the driver's words, and the backoff
/// before the next try (fixed per failure, so the status file does not change every pass).
pub fn describe_failure(f: &crate::executor::Failure) -> String {
    let backoff = crate::executor::BACKOFF.delay(f.count);
    format!(
        "{} failed {} time(s): {}; tried again {:.1} s after the failure",
        f.operation,
        f.count,
        f.last_error,
        backoff.as_secs_f64()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_file_is_written_at_once_unless_it_was_just_written() {
        let ms = Duration::from_millis;
        // (what, changed, written how long ago, operations running, decision)
        let rows = [
            ("never written", false, None, true, StatusWrite::Now),
            ("never written, changed", true, None, true, StatusWrite::Now),
            ("changed, written long ago", true, Some(ms(6)), true, StatusWrite::Now),
            ("changed, written exactly the gap ago", true, Some(STATUS_MIN_GAP), true, StatusWrite::Now),
            (
                "changed mid-burst, written 2 ms ago",
                true,
                Some(ms(2)),
                true,
                StatusWrite::After(STATUS_MIN_GAP - ms(2)),
            ),
            ("changed and settled, written 2 ms ago", true, Some(ms(2)), false, StatusWrite::Now),
            ("unchanged, written 2 ms ago", false, Some(ms(2)), false, StatusWrite::NotYet),
            ("unchanged, written 4 s ago", false, Some(Duration::from_secs(4)), true, StatusWrite::NotYet),
            ("unchanged, stale", false, Some(STATUS_REFRESH), true, StatusWrite::Now),
        ];
        for (name, changed, since_last, running, want) in rows {
            assert_eq!(status_write(changed, since_last, STATUS_REFRESH, !running), want, "{name}");
        }
        assert_eq!(status_write(false, Some(REPORT_REFRESH), REPORT_REFRESH, true), StatusWrite::Now);
    }
}
