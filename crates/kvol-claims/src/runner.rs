//! The standalone control plane's runner: the claims to provision, the volumes to reclaim and the snapshots to take, decided each pass and carried out through the drivers' controller services, one call per claim or VolumeSnapshot at a time.
//!
//! The node loop meets it through [`ClaimsController`] alone: objects in ([`ClaimsController::pass`]),
//! provisioned PersistentVolumes ([`ClaimsController::overlay`]) and problems out. A failed call is
//! shown at once and waits out [`RETRY_PAUSE`] before its key is tried again.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kvol_api::{FeatureGates, ObjectSet};
use kvol_csi::RegisteredDriver;
use tokio::sync::Notify;

use crate::claim_status::{KeptClaimStatus, Recovery};
use crate::snapshots::SnapshotRecord;

/// What the standalone control plane keeps between passes, and how it is told of them.
#[derive(Debug)]
pub struct ClaimsController {
    node_name: String,
    gates: FeatureGates,
    state: Provisioning,
    wake: Arc<Notify>,
}

impl ClaimsController {
    /// Reads the records under `state_dir` (`provisioned/`, `snapshots/`; a record that cannot
    /// be read is logged and left out); `wake` is told whenever a call ends.
    pub fn start(
        state_dir: &Path,
        node_name: &str,
        gates: &FeatureGates,
        wake: Arc<Notify>,
    ) -> ClaimsController {
        let dir = state_dir.join("provisioned");
        let (records, problems) = crate::records::load_provisioned(&dir);
        for problem in problems {
            tracing::warn!(%problem, "provisioned volumes");
        }
        let snapshots_dir = state_dir.join("snapshots");
        let (snapshot_records, problems) = crate::records::load_snapshots(&snapshots_dir);
        for problem in problems {
            tracing::warn!(%problem, "snapshots");
        }
        let snapshots =
            SnapshotBook { records: snapshot_records, dir: snapshots_dir, ..SnapshotBook::default() };
        let statuses_dir = state_dir.join("claim-status");
        let (statuses, problems) = crate::records::load_records(&statuses_dir, "claim status record");
        for problem in problems {
            tracing::warn!(%problem, "claim status");
        }
        let recovery = Recovery(gates.enabled(kvol_api::gates::Gate::RecoverVolumeExpansionFailure));
        ClaimsController {
            node_name: node_name.to_string(),
            gates: gates.clone(),
            state: Provisioning {
                done: Arc::new(std::sync::Mutex::new(Provisioned {
                    records,
                    statuses,
                    waiting: Vec::new(),
                    saving: BTreeSet::new(),
                    version: 0,
                })),
                statuses: StatusFiles { dir: statuses_dir, writing: Arc::default() },
                recovery,
                calls: CallSlots::default(),
                dir,
                channels: ControllerChannels::default(),
                snapshots: Arc::new(std::sync::Mutex::new(snapshots)),
                snapshot_calls: CallSlots::default(),
            },
            wake,
        }
    }

    /// Starts the calls this pass calls for: claims of `objects` to provision, provisioned
    /// volumes whose claim left `source` to reclaim (`in_use`: the unique names of the volumes
    /// the node has, asked only when a claim is gone), and, with `snapshots_on`, snapshots to
    /// take, adopt or delete; each through its driver among `drivers`. Claims of volumes a
    /// driver grows offline only wait while `in_use` lists them.
    pub fn pass(
        &self,
        objects: &ObjectSet,
        source: &ObjectSet,
        drivers: &[RegisteredDriver],
        in_use: impl Fn() -> Vec<String>,
        snapshots_on: bool,
    ) {
        start_provisioning((&self.node_name, &self.gates), objects, drivers, &self.state, &self.wake);
        start_expanding(objects, drivers, &in_use, &self.state, &self.wake);
        start_reclaiming(source, in_use, drivers, &self.state, &self.wake);
        if snapshots_on {
            start_snapshotting(objects, drivers, &self.state, &self.wake);
        }
    }

    /// Counts changes of the provisioned volumes: a view of the objects made at another
    /// version is out of date.
    pub fn provisioned_version(&self) -> u64 {
        self.state.done.lock().unwrap_or_else(|p| p.into_inner()).version
    }

    /// Lays the provisioned PersistentVolumes over `objects`, their claims bound to them;
    /// returns the version laid.
    pub fn overlay(&self, objects: &mut ObjectSet) -> u64 {
        let done = self.state.done.lock().unwrap_or_else(|p| p.into_inner());
        crate::provision::overlay(objects, &done.records);
        crate::claim_status::overlay(&mut objects.claims, &done.kept_statuses(), &done.records);
        done.version
    }

    /// Tells the kept status of provisioned claims that the node grew their filesystem to
    /// the size given (`namespace/name` → bytes), as kubelet's `MarkFSResizeFinished` tells a
    /// cluster's. Saved in the background; the claims' view changes once saved.
    pub fn node_resized(&self, grown: &[(String, u64)]) {
        let recovery = self.state.recovery;
        let changed: Vec<(String, KeptClaimStatus)> = {
            let done = self.state.done.lock().unwrap_or_else(|p| p.into_inner());
            let kept = done.kept_statuses();
            grown
                .iter()
                .filter_map(|(key, size)| {
                    let now = kept.get(key)?;
                    Some((key.clone(), now.clone().node_done(*size, recovery))).filter(|(_, new)| new != now)
                })
                .collect()
        };
        for (key, status) in changed {
            if !self.state.done.lock().unwrap_or_else(|p| p.into_inner()).saving.insert(key.clone()) {
                continue;
            }
            let (done, files, wake) =
                (Arc::clone(&self.state.done), self.state.statuses.clone(), Arc::clone(&self.wake));
            tokio::spawn(async move {
                let saved = save_status(&files, &key, &status).await.is_ok();
                let mut done = done.lock().unwrap_or_else(|p| p.into_inner());
                done.saving.remove(&key);
                if saved {
                    done.statuses.insert(key, status);
                    done.version += 1;
                }
                drop(done);
                wake.notify_one();
            });
        }
    }

    /// The kept status of each provisioned claim, by claim key.
    pub fn claim_statuses(&self) -> BTreeMap<String, KeptClaimStatus> {
        self.state.done.lock().unwrap_or_else(|p| p.into_inner()).kept_statuses()
    }

    /// Whether `claim_key` has a provisioned volume.
    pub fn is_provisioned(&self, claim_key: &str) -> bool {
        self.state.done.lock().unwrap_or_else(|p| p.into_inner()).records.contains_key(claim_key)
    }

    /// Counts changes of the snapshots taken or deleted.
    pub fn snapshots_version(&self) -> u64 {
        self.state.snapshots.lock().unwrap_or_else(|p| p.into_inner()).version
    }

    /// The snapshots taken, by VolumeSnapshot key.
    pub fn snapshot_records(&self) -> Vec<(String, SnapshotRecord)> {
        let book = self.state.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        book.records.iter().map(|(k, r)| (k.clone(), r.clone())).collect()
    }

    /// Why claims' edits of their size are refused (a shrink, a class without expansion).
    pub fn expansion_problems(&self, objects: &ObjectSet) -> Vec<String> {
        let done = self.state.done.lock().unwrap_or_else(|p| p.into_inner());
        let mut problems = crate::resize::claims_to_expand(objects, &done.records).1;
        problems.extend(done.waiting.iter().cloned());
        problems
    }

    /// The claims whose last provisioning or reclaiming call failed, with the error.
    pub fn provisioning_failures(&self) -> Vec<(String, String)> {
        self.state.calls.failures()
    }

    /// Why VolumeSnapshots are not taken (or not acted on at all, when `snapshots_on` is
    /// false), and why claims restored from one wait.
    pub fn snapshot_problems(&self, objects: &ObjectSet, snapshots_on: bool) -> Vec<String> {
        let book = self.state.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        let mut problems = Vec::new();
        if !snapshots_on {
            if !objects.volume_snapshots.is_empty() {
                problems.push(format!(
                    "{} VolumeSnapshot(s) not acted on: the snapshot-controller component is off (storage.optionalCsiComponents)",
                    objects.volume_snapshots.len()
                ));
            }
            return problems;
        }
        problems.extend(book.pending.iter().map(|p| format!("snapshot {}: {}", p.key, p.reason)));
        problems.extend(
            self.state.snapshot_calls.failures().into_iter().map(|(k, e)| format!("snapshot {k}: {e}")),
        );
        let done = self.state.done.lock().unwrap_or_else(|p| p.into_inner());
        for (key, claim) in &objects.claims {
            let restoring = claim.spec.as_ref().is_some_and(|s| s.data_source.is_some());
            if restoring
                && !done.records.contains_key(key)
                && let Err(reason) = crate::snapshots::restore_source(key, claim, &book.records)
            {
                problems.push(reason);
            }
        }
        problems
    }
}

/// The volumes the agent provisioned, by claim key; `version` counts changes, so a pass can
/// tell whether its view of the objects is still current.
#[derive(Debug)]
struct Provisioned {
    records: BTreeMap<String, Arc<k8s_openapi::api::core::v1::PersistentVolume>>,
    /// The claims' status kept since it last changed (a claim without one is as bound).
    statuses: BTreeMap<String, KeptClaimStatus>,
    /// Why claims whose volumes grow offline only wait, from the last pass.
    waiting: Vec<String>,
    /// The claims whose status the node's report is being saved for.
    saving: BTreeSet<String>,
    version: u64,
}

impl Provisioned {
    /// Every provisioned claim's status: the kept one, or bound at its volume's capacity.
    fn kept_statuses(&self) -> BTreeMap<String, KeptClaimStatus> {
        self.records
            .iter()
            .map(|(key, pv)| {
                let kept = self.statuses.get(key).cloned();
                let bound = || KeptClaimStatus::bound(crate::resize::capacity(pv).unwrap_or(0));
                (key.clone(), kept.unwrap_or_else(bound))
            })
            .collect()
    }
}

/// Where the claims' kept status is written, one write at a time (two writers of one record
/// would share its temporary file).
#[derive(Clone, Debug)]
struct StatusFiles {
    dir: PathBuf,
    writing: Arc<tokio::sync::Mutex<()>>,
}

/// Writes a claim's kept status durably, on a blocking thread.
async fn save_status(files: &StatusFiles, key: &str, status: &KeptClaimStatus) -> Result<(), String> {
    let _one_at_a_time = files.writing.lock().await;
    let (path, status) = (crate::records::record_path(&files.dir, key), status.clone());
    let saved = kvol_plugin::blocking::shared()
        .run(&path.clone(), RECORD_WRITE_DEADLINE, move || crate::records::save_record(&path, &status))
        .await;
    let saved = saved.unwrap_or_else(|e| Err(e.to_string()));
    if let Err(e) = &saved {
        tracing::warn!(claim = %key, error = %e, "cannot save the claim's status");
    }
    saved
}

/// What provisioning keeps between passes: the claims done (with the PV each got), the ones
/// under way or failed (claim → empty, or the error), and where the records live.
#[derive(Debug)]
struct Provisioning {
    done: Arc<std::sync::Mutex<Provisioned>>,
    /// Provisioning and reclaiming calls, by claim.
    calls: CallSlots,
    dir: PathBuf,
    /// Where the claims' kept status lives (`claim-status/`).
    statuses: StatusFiles,
    recovery: Recovery,
    channels: ControllerChannels,
    /// The snapshots taken (the `snapshot-controller` component, when it runs).
    snapshots: Arc<std::sync::Mutex<SnapshotBook>>,
    /// Snapshot calls, by VolumeSnapshot.
    snapshot_calls: CallSlots,
}

/// The pause after a failed controller call (provisioning, reclaiming, a snapshot) before the
/// same key is tried again.
pub const RETRY_PAUSE: Duration = Duration::from_secs(5);

/// How long a provisioned record's write and fsync may take before the provisioning counts as
/// failed (and is tried again after the pause, unless the write is still stuck).
const RECORD_WRITE_DEADLINE: Duration = Duration::from_secs(30);

/// Controller calls by key (a claim, a VolumeSnapshot): empty while one runs, else its last
/// error, kept through [`RETRY_PAUSE`]. At most one call per key runs, and none starts during
/// a failure's pause.
#[derive(Clone, Debug, Default)]
struct CallSlots(Arc<std::sync::Mutex<BTreeMap<String, String>>>);

impl CallSlots {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a call for `key` as running, unless one runs or its last failure is in its pause.
    fn begin(&self, key: &str) -> bool {
        let mut calls = self.lock();
        if calls.contains_key(key) {
            return false;
        }
        calls.insert(key.to_string(), String::new());
        true
    }

    fn succeeded(&self, key: &str) {
        self.lock().remove(key);
    }

    /// Shows `error` as `key`'s (the agent is woken so the status says it now), keeps it
    /// through the retry pause, then forgets it so a later pass tries again.
    async fn failed(&self, key: &str, error: String, wake: &Notify) {
        self.lock().insert(key.to_string(), error);
        wake.notify_one();
        tokio::time::sleep(RETRY_PAUSE).await;
        self.lock().remove(key);
    }

    /// The keys whose last call failed, with the error.
    fn failures(&self) -> Vec<(String, String)> {
        self.lock().iter().filter(|(_, e)| !e.is_empty()).map(|(k, e)| (k.clone(), e.clone())).collect()
    }
}

/// The snapshots the agent took, by VolumeSnapshot key, and the ones under way or failed.
#[derive(Debug, Default)]
struct SnapshotBook {
    records: BTreeMap<String, SnapshotRecord>,
    /// Counts changes of `records`, for the status.
    version: u64,
    /// Why each VolumeSnapshot not taken is waiting, from the last pass.
    pending: Vec<crate::snapshots::SnapshotPending>,
    dir: PathBuf,
}

/// One gRPC channel per driver endpoint for provisioning, connected on first use and kept (a
/// channel reconnects by itself after the driver restarts): a claim costs its CreateVolume,
/// not a new connection.
#[derive(Clone, Debug, Default)]
struct ControllerChannels(Arc<std::sync::Mutex<BTreeMap<String, tonic::transport::Channel>>>);

impl ControllerChannels {
    fn get(&self, endpoint: &str) -> Result<tonic::transport::Channel, String> {
        let mut channels = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{endpoint}"))
            .map_err(|e| format!("csi driver endpoint {endpoint}: {e}"))?
            .connect_lazy();
        channels.insert(endpoint.to_string(), channel.clone());
        Ok(channel)
    }
}

/// Starts provisioning each claim that needs it (one task per claim at a time); a failure is kept
/// as the claim's problem and retried on a later pass.
fn start_provisioning(
    (node_name, gates): (&str, &FeatureGates),
    objects: &ObjectSet,
    drivers: &[RegisteredDriver],
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let Provisioning { done: provisioned, calls, dir, channels, snapshots, .. } = state;
    let names: Vec<String> = drivers.iter().map(|d| d.name.clone()).collect();
    let requests = {
        let done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
        let snapshots = snapshots.lock().unwrap_or_else(|p| p.into_inner());
        crate::provision::claims_to_provision(
            objects,
            node_name,
            &done.records,
            &snapshots.records,
            &names,
            gates,
        )
    };
    for request in requests {
        let Some(endpoint) = drivers.iter().find(|d| d.name == request.driver).map(|d| d.endpoint.clone())
        else {
            continue;
        };
        if !calls.begin(&request.claim_key) {
            continue;
        }
        let (provisioned, calls, dir, wake, channels) =
            (Arc::clone(provisioned), calls.clone(), dir.to_path_buf(), Arc::clone(wake), channels.clone());
        tokio::spawn(async move {
            let claim = request.claim_key.clone();
            let channel = channels.get(&endpoint);
            let outcome = match async { provision_one(&request, channel?).await }.await {
                // The record's fsync runs on a blocking thread: on a runtime thread it would
                // stall every other task (a burst of claims queued their fsyncs one by one).
                Ok(pv) => {
                    let record = crate::records::record_path(&dir, &claim);
                    let saved = kvol_plugin::blocking::shared()
                        .run(&record.clone(), RECORD_WRITE_DEADLINE, move || {
                            crate::records::save_record(&record, &pv).map(|()| pv)
                        })
                        .await;
                    saved.unwrap_or_else(|e| Err(format!("cannot save the provisioned record: {e}")))
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(pv) => {
                    tracing::info!(claim = %claim, driver = %request.driver, volume = ?pv.metadata.name, "claim provisioned");
                    {
                        let mut provisioned = provisioned.lock().unwrap_or_else(|p| p.into_inner());
                        provisioned.records.insert(claim.clone(), Arc::new(pv));
                        provisioned.version += 1;
                    }
                    calls.succeeded(&claim);
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, driver = %request.driver, error = %e, "provisioning failed");
                    calls.failed(&claim, e, &wake).await;
                }
            }
            wake.notify_one();
        });
    }
}

/// Grows, through their drivers (`ControllerExpandVolume`), the provisioned volumes whose claim
/// asks for more (one task per claim at a time), then records the claim's status and the new
/// capacity, in that order (a crash between them grows it again, which drivers take as done);
/// the node grows the filesystem from there. A volume whose driver grows volumes offline only
/// waits until the node no longer uses it. A failure is kept as the claim's problem and retried.
fn start_expanding(
    objects: &ObjectSet,
    drivers: &[RegisteredDriver],
    in_use: &dyn Fn() -> Vec<String>,
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let Provisioning { done: provisioned, calls, dir, channels, statuses, recovery, .. } = state;
    let requests = {
        let done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
        crate::resize::claims_to_expand(objects, &done.records).0
    };
    let offline_only: Vec<&str> = drivers
        .iter()
        .filter(|d| d.plugin.offline_expansion && !d.plugin.online_expansion)
        .map(|d| d.name.as_str())
        .collect();
    let in_use =
        if requests.iter().any(|r| offline_only.contains(&r.driver.as_str())) { in_use() } else { vec![] };
    let in_use: Vec<&str> = in_use.iter().map(String::as_str).collect();
    let (requests, waiting) = crate::resize::offline_waits(requests, &offline_only, &in_use);
    provisioned.lock().unwrap_or_else(|p| p.into_inner()).waiting = waiting;
    for request in requests {
        let Some(endpoint) = drivers.iter().find(|d| d.name == request.driver).map(|d| d.endpoint.clone())
        else {
            continue;
        };
        let slot = format!("{} (expansion)", request.claim_key);
        if !calls.begin(&slot) {
            continue;
        }
        let (provisioned, calls, dir, wake, channels) =
            (Arc::clone(provisioned), calls.clone(), dir.to_path_buf(), Arc::clone(wake), channels.clone());
        let (statuses, recovery) = (statuses.clone(), *recovery);
        tokio::spawn(async move {
            let key = request.claim_key.clone();
            let kept = || provisioned.lock().unwrap_or_else(|p| p.into_inner()).kept_statuses().remove(&key);
            let keep = |status: KeptClaimStatus| {
                let mut done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
                done.statuses.insert(key.clone(), status);
                done.version += 1;
            };
            if recovery.0
                && let Some(now) = kept()
            {
                let started = now.controller_started(request.to, recovery);
                if save_status(&statuses, &key, &started).await.is_ok() {
                    keep(started);
                }
            }
            let outcome = match async { expand_one(&request, channels.get(&endpoint)?).await }.await {
                Ok((bytes, node_required)) => {
                    let status = kept().map(|s| s.controller_done(bytes, node_required, recovery));
                    let current =
                        provisioned.lock().unwrap_or_else(|p| p.into_inner()).records.get(&key).cloned();
                    match (current, status) {
                        (Some(pv), Some(status)) => match save_status(&statuses, &key, &status).await {
                            Ok(()) => {
                                keep(status);
                                let grown = crate::resize::with_capacity(&pv, bytes);
                                let record = crate::records::record_path(&dir, &key);
                                let saved = kvol_plugin::blocking::shared()
                                    .run(&record.clone(), RECORD_WRITE_DEADLINE, move || {
                                        crate::records::save_record(&record, &grown).map(|()| grown)
                                    })
                                    .await;
                                saved.unwrap_or_else(|e| Err(format!("cannot save the expanded record: {e}")))
                            }
                            Err(e) => Err(format!("cannot save the claim's status: {e}")),
                        },
                        _ => Err("its record is gone".to_string()),
                    }
                }
                Err(e) => Err(e),
            };
            match outcome {
                Ok(pv) => {
                    tracing::info!(claim = %key, volume = %request.pv_name, from = request.from, to = request.to, "volume expanded by its driver");
                    let mut done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
                    done.records.insert(key.clone(), Arc::new(pv));
                    done.version += 1;
                    drop(done);
                    calls.succeeded(&slot);
                }
                Err(e) => {
                    tracing::warn!(claim = %key, error = %e, "expansion failed");
                    if recovery.0
                        && let Some(now) = kept()
                    {
                        let failed = now.controller_failed(recovery);
                        if save_status(&statuses, &key, &failed).await.is_ok() {
                            keep(failed);
                        }
                    }
                    calls.failed(&slot, e, &wake).await;
                }
            }
            wake.notify_one();
        });
    }
}

/// `ControllerExpandVolume`: the size the volume has now, and whether the node must grow its
/// filesystem.
async fn expand_one(
    request: &crate::resize::ExpandRequest,
    channel: tonic::transport::Channel,
) -> Result<(u64, bool), String> {
    let to = i64::try_from(request.to).map_err(|_| format!("{} bytes are too many for csi", request.to))?;
    let expand = kvol_csi::proto::csi::ControllerExpandVolumeRequest {
        volume_id: request.volume_handle.clone(),
        capacity_range: Some(kvol_csi::proto::csi::CapacityRange { required_bytes: to, limit_bytes: 0 }),
        ..Default::default()
    };
    let what = format!("csi driver {}: ControllerExpandVolume of {}", request.driver, request.pv_name);
    let answer = controller_call(what, controller(channel).controller_expand_volume(expand)).await?;
    // A driver that says less than asked (0: it did not say) has grown it to what was asked.
    Ok((u64::try_from(answer.capacity_bytes).unwrap_or(0).max(request.to), answer.node_expansion_required))
}

/// Deletes, through their drivers, the provisioned volumes whose claims are gone (one task per
/// claim at a time), then forgets their records; a failure is kept as the claim's problem and
/// retried on a later pass.
fn start_reclaiming(
    source: &ObjectSet,
    in_use: impl FnOnce() -> Vec<String>,
    drivers: &[RegisteredDriver],
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let Provisioning { done: provisioned, calls, dir, channels, statuses, .. } = state;
    let requests = {
        let done = provisioned.lock().unwrap_or_else(|p| p.into_inner());
        if done.records.keys().all(|claim| source.claims.contains_key(claim)) {
            return;
        }
        let in_use = in_use();
        let in_use: Vec<&str> = in_use.iter().map(String::as_str).collect();
        crate::provision::volumes_to_reclaim(source, &done.records, &in_use)
    };
    for request in requests {
        let Some(endpoint) = drivers.iter().find(|d| d.name == request.driver).map(|d| d.endpoint.clone())
        else {
            continue;
        };
        if !calls.begin(&request.claim_key) {
            continue;
        }
        let (provisioned, calls, dir, wake, channel) = (
            Arc::clone(provisioned),
            calls.clone(),
            dir.to_path_buf(),
            Arc::clone(wake),
            channels.get(&endpoint),
        );
        let statuses_dir = statuses.dir.clone();
        tokio::spawn(async move {
            let claim = request.claim_key.clone();
            let outcome = async { delete_one(&request, channel?).await }
                .await
                .and_then(|()| crate::records::remove_provisioned(&dir, &claim))
                .and_then(|()| {
                    crate::records::remove_record(&crate::records::record_path(&statuses_dir, &claim))
                });
            match outcome {
                Ok(()) => {
                    tracing::info!(claim = %claim, driver = %request.driver, volume = %request.pv_name, "claim deleted: its volume deleted");
                    let mut provisioned = provisioned.lock().unwrap_or_else(|p| p.into_inner());
                    provisioned.records.remove(&claim);
                    provisioned.statuses.remove(&claim);
                    provisioned.version += 1;
                    drop(provisioned);
                    calls.succeeded(&claim);
                }
                Err(e) => {
                    tracing::warn!(claim = %claim, driver = %request.driver, error = %e, "deleting a deleted claim's volume failed");
                    calls.failed(&claim, e, &wake).await;
                }
            }
            wake.notify_one();
        });
    }
}

/// Takes the VolumeSnapshots not yet taken and deletes, through their drivers, the snapshots
/// whose manifests are gone (one call per snapshot at a time); records are written before a
/// snapshot counts as taken and removed after it is deleted. A failure is kept as the
/// snapshot's problem and retried after a pause.
fn start_snapshotting(
    objects: &ObjectSet,
    drivers: &[RegisteredDriver],
    state: &Provisioning,
    wake: &Arc<Notify>,
) {
    let names: Vec<String> = drivers.iter().map(|d| d.name.clone()).collect();
    let (take, delete) = {
        let mut book = state.snapshots.lock().unwrap_or_else(|p| p.into_inner());
        let (take, pending) = crate::snapshots::snapshots_to_take(objects, &book.records, &names);
        book.pending = pending;
        let delete: Vec<(String, crate::snapshots::SnapshotRecord)> =
            crate::snapshots::snapshots_to_delete(objects, &book.records)
                .into_iter()
                .map(|(k, r)| (k.clone(), r.clone()))
                .collect();
        (take, delete)
    };
    let endpoint = |driver: &str| drivers.iter().find(|d| d.name == driver).map(|d| d.endpoint.clone());
    for work in take {
        let Some(endpoint) = endpoint(work.driver()) else { continue };
        let key = work.key().to_string();
        spawn_snapshot_call(state, wake, &key, state.channels.get(&endpoint), move |channel| async move {
            match &work {
                crate::snapshots::SnapshotWork::Take(request) => snapshot_one(request, channel).await,
                crate::snapshots::SnapshotWork::Adopt(adoption) => {
                    adopt_snapshot_one(adoption, channel).await
                }
            }
        });
    }
    for (key, record) in delete {
        let Some(endpoint) = endpoint(&record.driver) else { continue };
        spawn_snapshot_call(state, wake, &key, state.channels.get(&endpoint), move |channel| async move {
            delete_snapshot_one(&record, channel).await.map(|()| None)
        });
    }
}

/// Runs one snapshot call for `key` unless one runs already; `Some(record)` is recorded,
/// `None` forgets the key's record.
fn spawn_snapshot_call<F, Fut>(
    state: &Provisioning,
    wake: &Arc<Notify>,
    key: &str,
    channel: Result<tonic::transport::Channel, String>,
    call: F,
) where
    F: FnOnce(tonic::transport::Channel) -> Fut + Send + 'static,
    Fut: std::future::Future<Output = Result<Option<crate::snapshots::SnapshotRecord>, String>> + Send,
{
    if !state.snapshot_calls.begin(key) {
        return;
    }
    let (book, calls, wake, key) =
        (Arc::clone(&state.snapshots), state.snapshot_calls.clone(), Arc::clone(wake), key.to_string());
    tokio::spawn(async move {
        let outcome = match channel {
            Ok(channel) => call(channel).await,
            Err(e) => Err(e),
        };
        let dir = book.lock().unwrap_or_else(|p| p.into_inner()).dir.clone();
        let outcome = outcome.and_then(|record| {
            match &record {
                Some(record) => crate::records::save_snapshot(&dir, &key, record)?,
                None => crate::records::remove_snapshot(&dir, &key)?,
            }
            Ok(record)
        });
        match outcome {
            Ok(record) => {
                tracing::info!(snapshot = %key, taken = record.is_some(), "snapshot recorded");
                let mut book = book.lock().unwrap_or_else(|p| p.into_inner());
                match record {
                    Some(record) => drop(book.records.insert(key.clone(), record)),
                    None => drop(book.records.remove(&key)),
                }
                book.version += 1;
                drop(book);
                calls.succeeded(&key);
            }
            Err(e) => {
                tracing::warn!(snapshot = %key, error = %e, "snapshot call failed");
                calls.failed(&key, e, &wake).await;
            }
        }
        wake.notify_one();
    });
}

async fn snapshot_one(
    request: &crate::snapshots::SnapshotRequest,
    channel: tonic::transport::Channel,
) -> Result<Option<crate::snapshots::SnapshotRecord>, String> {
    let create = kvol_csi::proto::csi::CreateSnapshotRequest {
        source_volume_id: request.source_volume_handle.clone(),
        name: request.name.clone(),
        parameters: request.parameters.clone().into_iter().collect(),
        ..Default::default()
    };
    let what = format!("csi driver {}: CreateSnapshot of {}", request.driver, request.key);
    let answer = controller_call(what.clone(), controller(channel).create_snapshot(create)).await?;
    let snapshot = answer.snapshot.ok_or_else(|| format!("{what} returned no snapshot"))?;
    Ok(Some(crate::snapshots::SnapshotRecord {
        driver: request.driver.clone(),
        snapshot_handle: snapshot.snapshot_id,
        source_volume_handle: request.source_volume_handle.clone(),
        source_claim: request.source_claim.clone(),
        size_bytes: snapshot.size_bytes,
        ready_to_use: snapshot.ready_to_use,
        deletion_policy: request.deletion_policy.clone(),
        created_unix_seconds: snapshot.creation_time.map_or(0, |t| t.seconds),
        content: None,
    }))
}

/// Brings in a pre-provisioned content's snapshot: ListSnapshots of its handle when the driver
/// can list (a snapshot the driver does not know is an error, retried), else taken as ready
/// with no size, as the external-snapshotter does.
async fn adopt_snapshot_one(
    adoption: &crate::snapshots::ContentAdoption,
    channel: tonic::transport::Channel,
) -> Result<Option<crate::snapshots::SnapshotRecord>, String> {
    use kvol_csi::proto::csi::controller_service_capability::{Type, rpc::Type as Rpc};
    let mut client = controller(channel);
    let what = format!("csi driver {}: ControllerGetCapabilities", adoption.driver);
    let capabilities = controller_call(
        what,
        client.controller_get_capabilities(kvol_csi::proto::csi::ControllerGetCapabilitiesRequest {}),
    )
    .await?;
    let lists = capabilities
        .capabilities
        .iter()
        .any(|c| matches!(c.r#type, Some(Type::Rpc(ref rpc)) if rpc.r#type == Rpc::ListSnapshots as i32));
    let mut record = crate::snapshots::SnapshotRecord {
        driver: adoption.driver.clone(),
        snapshot_handle: adoption.snapshot_handle.clone(),
        source_volume_handle: String::new(),
        source_claim: String::new(),
        size_bytes: 0,
        ready_to_use: true,
        deletion_policy: adoption.deletion_policy.clone(),
        created_unix_seconds: 0,
        content: Some(adoption.content.clone()),
    };
    if !lists {
        return Ok(Some(record));
    }
    let list = kvol_csi::proto::csi::ListSnapshotsRequest {
        snapshot_id: adoption.snapshot_handle.clone(),
        ..Default::default()
    };
    let what = format!("csi driver {}: ListSnapshots of {}", adoption.driver, adoption.snapshot_handle);
    let answer = controller_call(what.clone(), client.list_snapshots(list)).await?;
    let snapshot = answer
        .entries
        .into_iter()
        .filter_map(|entry| entry.snapshot)
        .find(|snapshot| snapshot.snapshot_id == adoption.snapshot_handle)
        .ok_or_else(|| {
            format!("{what}: the driver has no such snapshot (VolumeSnapshotContent {})", adoption.content)
        })?;
    record.source_volume_handle = snapshot.source_volume_id;
    record.size_bytes = snapshot.size_bytes;
    record.ready_to_use = snapshot.ready_to_use;
    record.created_unix_seconds = snapshot.creation_time.map_or(0, |t| t.seconds);
    Ok(Some(record))
}

async fn delete_snapshot_one(
    record: &crate::snapshots::SnapshotRecord,
    channel: tonic::transport::Channel,
) -> Result<(), String> {
    let delete = kvol_csi::proto::csi::DeleteSnapshotRequest {
        snapshot_id: record.snapshot_handle.clone(),
        ..Default::default()
    };
    let what = format!("csi driver {}: DeleteSnapshot of {}", record.driver, record.snapshot_handle);
    controller_call(what, controller(channel).delete_snapshot(delete)).await.map(drop)
}

async fn delete_one(
    request: &crate::provision::ReclaimRequest,
    channel: tonic::transport::Channel,
) -> Result<(), String> {
    let delete = kvol_csi::proto::csi::DeleteVolumeRequest {
        volume_id: request.volume_handle.clone(),
        ..Default::default()
    };
    let what = format!("csi driver {}: DeleteVolume of {}", request.driver, request.pv_name);
    controller_call(what, controller(channel).delete_volume(delete)).await.map(drop)
}

/// The deadline of the agent's own controller calls (provisioning, reclaiming, snapshots).
const CONTROLLER_CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// One controller call within [`CONTROLLER_CALL_TIMEOUT`]; an error says what `what` (driver,
/// call and object) ran into: no answer in time, or the driver's code and message.
async fn controller_call<T>(
    what: String,
    call: impl std::future::Future<Output = Result<tonic::Response<T>, tonic::Status>>,
) -> Result<T, String> {
    tokio::time::timeout(CONTROLLER_CALL_TIMEOUT, call)
        .await
        .map_err(|_| format!("{what} did not answer within 2m"))?
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("{what} failed ({:?}): {}", s.code(), s.message()))
}

fn controller(
    channel: tonic::transport::Channel,
) -> kvol_csi::proto::csi::controller_client::ControllerClient<tonic::transport::Channel> {
    kvol_csi::proto::csi::controller_client::ControllerClient::new(channel)
}

async fn provision_one(
    request: &crate::provision::ProvisionRequest,
    channel: tonic::transport::Channel,
) -> Result<k8s_openapi::api::core::v1::PersistentVolume, String> {
    let create = crate::wire::create_request(request)?;
    let what = format!("csi driver {}: CreateVolume", request.driver);
    let response = controller_call(what.clone(), controller(channel).create_volume(create)).await?;
    let volume = response.volume.ok_or_else(|| format!("{what} returned no volume"))?;
    crate::wire::bound_pv(request, &volume)
}
