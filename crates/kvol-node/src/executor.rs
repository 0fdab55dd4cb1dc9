//! Runs the reconciler's operations through the plugins: one operation per volume at a time, journalled before and after, failures retried with exponential backoff.
//!
//! An operation whose outcome is unknown (the driver call was cut short: a deadline, a broken
//! connection, a driver killed mid-way) is journalled as an *uncertain* record of what it may
//! have done, so that teardown includes it; a later success makes the record certain.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvol_plugin::plugin::{PublishRequest, UnpublishRequest};
use kvol_plugin::{PluginHost, PluginRef, PluginRegistry, VolumeSpec};
use tokio::sync::Notify;

use crate::actual::store::{ActualChange, GroupCommit, Store};
use crate::model::{
    ActualState, AttachedVolume, Claim, HeldClaims, Operation, PodVolumeKey, PublishedVolume, StagedVolume,
    plugin_volume_name,
};
use crate::report::metrics::Metrics;

/// How failed operations are retried: 500 ms doubling to 2m2s, as kubelet.
pub const BACKOFF: kvol_api::Backoff = kvol_api::Backoff::OPERATIONS;

/// An operation running now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    pub operation: &'static str,
    pub started: Instant,
    /// The volume (and pod volume) it holds.
    pub claim: Claim,
}

/// The last failure of the operations on one lock key.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub operation: &'static str,
    pub count: u32,
    pub last_error: String,
    pub retry_at: Instant,
}

/// What the executor is doing, for status and the reconciler.
#[derive(Clone, Debug, Default)]
pub struct ExecSnapshot {
    /// Shared with the executor until its next change (copy on write): a snapshot per loop
    /// pass costs a reference count, not a copy of every record.
    pub actual: Arc<ActualState>,
    /// When each published volume was last published by this agent (absent: before it
    /// started), for plugins that ask to be published again.
    pub published_at: Arc<BTreeMap<PodVolumeKey, Instant>>,
    /// By lock key.
    pub running: BTreeMap<String, Running>,
    /// By lock key.
    pub failures: BTreeMap<String, Failure>,
    /// Counts the changes to what a snapshot shows (`actual`, operations started and ended,
    /// failures): equal versions, equal snapshots but for the running operations' ages. Lets a
    /// reader tell a change without keeping `actual` alive (which would make the next change
    /// copy it).
    pub version: u64,
}

impl ExecSnapshot {
    /// What the running operations hold, for the planner.
    pub fn busy(&self) -> Vec<Claim> {
        self.running.values().map(|r| r.claim.clone()).collect()
    }
}

#[derive(Debug, Default)]
struct State {
    actual: Arc<ActualState>,
    published_at: Arc<BTreeMap<PodVolumeKey, Instant>>,
    running: BTreeMap<String, Running>,
    /// What the running operations hold, indexed (a submit at node scale would otherwise ask
    /// thousands of them).
    held: HeldClaims,
    failures: BTreeMap<String, Failure>,
    /// Once set, nothing new starts (shutdown).
    closed: bool,
    /// See [`ExecSnapshot::version`].
    version: u64,
    /// Counts the changes to `actual` only.
    actual_version: u64,
}

impl State {
    /// Applies `change` to the actual state, copying it only if a snapshot still holds it.
    fn change_actual(&mut self, change: ActualChange) {
        apply(Arc::make_mut(&mut self.actual), change);
        self.version += 1;
        self.actual_version += 1;
    }
}

/// Runs operations on tokio tasks; a stuck operation holds only its own volume.
#[derive(Debug)]
pub struct Executor {
    host: PluginHost,
    registry: Arc<PluginRegistry>,
    store: Arc<Store>,
    /// The operations' journal writes, committed in groups (see [`GroupCommit`]).
    journal: GroupCommit,
    metrics: Arc<Metrics>,
    state: Mutex<State>,
    wake: Arc<Notify>,
    attach_timeout: Duration,
}

impl Executor {
    /// An executor starting from `actual` (the rebuilt state); `wake` is notified whenever an
    /// operation ends, so the reconciler plans the next step at once.
    pub fn new(
        host: PluginHost,
        registry: Arc<PluginRegistry>,
        store: Arc<Store>,
        metrics: Arc<Metrics>,
        actual: ActualState,
        wake: Arc<Notify>,
    ) -> Arc<Executor> {
        Arc::new(Executor {
            host,
            registry,
            journal: GroupCommit::start(Arc::clone(&store)),
            store,
            metrics,
            state: Mutex::new(State { actual: Arc::new(actual), ..State::default() }),
            wake,
            attach_timeout: Duration::from_secs(600),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The actual state, the running operations and the failures, as of now.
    pub fn snapshot(&self) -> ExecSnapshot {
        let state = self.lock();
        ExecSnapshot {
            actual: Arc::clone(&state.actual),
            published_at: Arc::clone(&state.published_at),
            running: state.running.clone(),
            failures: state.failures.clone(),
            version: state.version,
        }
    }

    /// Starts `op` unless an operation it conflicts with is running (one operation per volume,
    /// see [`Claim::conflicts`]) or it is waiting out its backoff; returns whether it started.
    pub fn submit(self: &Arc<Self>, op: Operation) -> bool {
        let key = op.lock_key();
        let claim = op.claim();
        {
            let mut state = self.lock();
            let now = Instant::now();
            if state.closed
                || state.held.conflicts(&claim)
                || state.failures.get(&key).is_some_and(|f| f.retry_at > now)
            {
                return false;
            }
            state.held.insert(&claim);
            state.running.insert(key.clone(), Running { operation: op.name(), started: now, claim });
            state.version += 1;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move { this.run(key, op).await });
        true
    }

    /// The actual state and the count of its changes (equal counts, equal states); cheaper
    /// than a snapshot, and to be dropped before the next change, as a snapshot is.
    pub fn actual(&self) -> (Arc<ActualState>, u64) {
        let state = self.lock();
        (Arc::clone(&state.actual), state.actual_version)
    }

    /// The unique names of the volumes the node has: attached, staged or published.
    pub fn volumes_in_use(&self) -> Vec<String> {
        let (actual, _) = self.actual();
        let attached_or_staged = actual.attached.keys().chain(actual.staged.keys()).cloned();
        attached_or_staged.chain(actual.published.values().map(|p| p.unique_name.clone())).collect()
    }

    /// Whether no operation is running.
    pub fn is_idle(&self) -> bool {
        self.lock().running.is_empty()
    }

    /// [`ExecSnapshot::version`], without taking a snapshot.
    pub fn version(&self) -> u64 {
        self.lock().version
    }

    /// When the next backed-off operation may be retried, if any is waiting.
    pub fn next_retry(&self) -> Option<Instant> {
        self.lock().failures.values().map(|f| f.retry_at).min()
    }

    async fn run(self: Arc<Self>, key: String, op: Operation) {
        let started = Instant::now();
        let migrated = spec_of(&op).migrated.is_some();
        let outcome = match self.journal.begin(&op).await {
            Ok(id) => {
                // CSI calls made for a migrated volume are labelled so in `csi_operations_seconds`.
                let result = kvol_csi::client::with_migrated(migrated, self.perform(&op)).await;
                let change = match &result {
                    Ok(change) => change.clone(),
                    Err(failure) => self.uncertain_change(&op, failure),
                };
                let finished = self.journal.finish(id, &change).await;
                match (result, finished) {
                    (Ok(_), Ok(())) => Ok(change),
                    (Err(failure), Ok(())) => Err((failure.message, change)),
                    (_, Err(e)) => {
                        Err((format!("cannot journal the end of {}: {e}", op.name()), ActualChange::Nothing))
                    }
                }
            }
            Err(e) => Err((format!("cannot journal {}: {e}", op.name()), ActualChange::Nothing)),
        };
        let ok = outcome.is_ok();
        let label = crate::report::metrics::spec_plugin_label(op.plugin(), spec_of(&op));
        self.metrics.observe_operation(op.name(), &label, ok, migrated, started.elapsed());
        {
            let mut state = self.lock();
            if let Some(ended) = state.running.remove(&key) {
                state.held.remove(&ended.claim);
            }
            state.version += 1;
            match outcome {
                Ok(change) => {
                    match &change {
                        ActualChange::SetPublished(v) => {
                            Arc::make_mut(&mut state.published_at).insert(v.key.clone(), Instant::now());
                        }
                        ActualChange::RemovePublished(key) => {
                            Arc::make_mut(&mut state.published_at).remove(key);
                        }
                        _ => {}
                    }
                    state.change_actual(change);
                    state.failures.remove(&key);
                    tracing::info!(operation = op.name(), volume = %key, plugin = op.plugin(), elapsed_ms = started.elapsed().as_millis() as u64, "operation succeeded");
                }
                Err((error, change)) => {
                    let uncertain = change != ActualChange::Nothing;
                    state.change_actual(change);
                    let count = state.failures.get(&key).map_or(0, |f| f.count) + 1;
                    let delay = BACKOFF.delay(count);
                    tracing::warn!(operation = op.name(), volume = %key, plugin = op.plugin(), %error, uncertain, retry_in_ms = delay.as_millis() as u64, "operation failed");
                    let failure = Failure {
                        operation: op.name(),
                        count,
                        last_error: error,
                        retry_at: Instant::now() + delay,
                    };
                    state.failures.insert(key, failure);
                }
            }
        }
        self.wake.notify_one();
    }

    fn plugin(&self, name: &str) -> Result<PluginRef, String> {
        self.registry
            .snapshot()
            .find_by_name(name)
            .cloned()
            .map_err(|e| format!("{e} (is its driver registered?)"))
    }

    /// The record an operation that failed with an unknown outcome may have made, so teardown
    /// includes it: an uncertain published, staged or attached record, unless a certain record
    /// of the same volume is already there (a republish or a repeated stage that timed out
    /// leaves what was there). A teardown that failed keeps its record anyway.
    fn uncertain_change(&self, op: &Operation, failure: &Failed) -> ActualChange {
        if !failure.outcome_unknown {
            return ActualChange::Nothing;
        }
        let state = self.lock();
        let actual = &state.actual;
        match op {
            Operation::Publish { volume, .. } => {
                let certain = actual
                    .published
                    .get(&volume.key)
                    .is_some_and(|p| !p.uncertain && p.unique_name == volume.unique_name);
                if certain {
                    return ActualChange::Nothing;
                }
                ActualChange::SetPublished(PublishedVolume { uncertain: true, ..volume.clone() })
            }
            Operation::Stage { unique_name, plugin, spec, device_path, staging_path } => {
                if actual.staged.get(unique_name).is_some_and(|s| !s.uncertain) {
                    return ActualChange::Nothing;
                }
                ActualChange::SetStaged(StagedVolume {
                    unique_name: unique_name.clone(),
                    plugin: plugin.clone(),
                    spec: spec.clone(),
                    staging_path: staging_path.clone(),
                    device_path: device_path.clone(),
                    uncertain: true,
                })
            }
            Operation::Attach { unique_name, plugin, spec } => {
                if actual.attached.get(unique_name).is_some_and(|a| !a.uncertain) {
                    return ActualChange::Nothing;
                }
                ActualChange::SetAttached(AttachedVolume {
                    unique_name: unique_name.clone(),
                    plugin: plugin.clone(),
                    spec: spec.clone(),
                    device_path: None,
                    uncertain: true,
                })
            }
            // The record keeps the size it had: the expansion is planned again.
            Operation::Unpublish { .. }
            | Operation::Unstage { .. }
            | Operation::Detach { .. }
            | Operation::Expand { .. } => ActualChange::Nothing,
        }
    }

    async fn perform(&self, op: &Operation) -> Result<ActualChange, Failed> {
        let plugin = self.plugin(op.plugin()).map_err(Failed::known)?;
        let node = self.host.node.name.as_str();
        let missing = |what: &str| Failed::known(format!("volume plugin {} cannot {what}", plugin.name()));
        match op {
            Operation::Attach { unique_name, plugin: name, spec } => {
                let attacher = plugin.attacher().ok_or_else(|| missing("attach"))?;
                let device = attacher.attach(spec, node).await.map_err(Failed::from)?;
                let device = attacher
                    .wait_for_attach(spec, device.as_deref(), self.attach_timeout)
                    .await
                    .map_err(Failed::from)?;
                Ok(ActualChange::SetAttached(AttachedVolume {
                    unique_name: unique_name.clone(),
                    plugin: name.clone(),
                    spec: spec.clone(),
                    device_path: Some(device).filter(|d| !d.is_empty()),
                    uncertain: false,
                }))
            }
            Operation::Stage { unique_name, plugin: name, spec, device_path, staging_path } => {
                let stager = plugin.device_mounter().ok_or_else(|| missing("stage"))?;
                let path = staging_path.clone();
                stager.stage(spec, device_path.as_deref(), &path).await.map_err(Failed::from)?;
                Ok(ActualChange::SetStaged(StagedVolume {
                    unique_name: unique_name.clone(),
                    plugin: name.clone(),
                    spec: spec.clone(),
                    staging_path: path,
                    device_path: device_path.clone(),
                    uncertain: false,
                }))
            }
            Operation::Publish { volume, mount_options } => {
                let mounter = plugin.mounter().ok_or_else(|| missing("publish"))?;
                self.host.paths.make_pod_dirs(&volume.key.pod_uid).map_err(Failed::from)?;
                let request = PublishRequest {
                    spec: &volume.spec,
                    pod: &volume.pod,
                    pod_volume_name: &volume.key.volume,
                    target: &volume.target,
                    staging_path: volume.staging_path.as_deref(),
                    device_path: volume.device_path.as_deref(),
                    read_only: volume.spec.read_only,
                    mount_options,
                    projection: volume.projection.as_deref(),
                };
                mounter.publish(&request).await.map_err(Failed::from)?;
                Ok(ActualChange::SetPublished(PublishedVolume { uncertain: false, ..volume.clone() }))
            }
            Operation::Expand { volume, new_size } => {
                let expander =
                    plugin.node_expander().ok_or_else(|| missing("expand a volume on the node"))?;
                let old_size = volume.fs_size.unwrap_or_default();
                let grown = expander
                    .expand_on_node(
                        &volume.spec,
                        volume.device_path.as_deref(),
                        &volume.target,
                        *new_size,
                        old_size,
                    )
                    .await;
                match grown {
                    Ok(()) => Ok(ActualChange::SetPublished(PublishedVolume {
                        fs_size: Some(*new_size),
                        expansion_deferred: None,
                        ..volume.clone()
                    })),
                    Err(kvol_plugin::PluginError::NotWhileInUse { reason, .. }) => {
                        tracing::warn!(volume = %volume.key, new_size, %reason, "the plugin grows this volume when it is published again");
                        Ok(ActualChange::SetPublished(PublishedVolume {
                            expansion_deferred: Some((*new_size, reason)),
                            ..volume.clone()
                        }))
                    }
                    Err(e) => Err(Failed::from(e)),
                }
            }
            Operation::Unpublish { volume } => {
                let mounter = plugin.mounter().ok_or_else(|| missing("unpublish"))?;
                // The volume's subPath binds go first (kubelet's CleanSubPaths): a bind of a
                // directory of the volume must not outlive it, nor its data be deleted under it.
                let pod_dir = self.host.paths.pod_dir(&volume.key.pod_uid).map_err(Failed::from)?;
                let volume_name = volume.key.volume.clone();
                let cleaned = tokio::task::spawn_blocking(move || {
                    kvol_plugin::subpath::clean_up(&pod_dir, Some(&volume_name))
                })
                .await
                .map_err(|e| Failed::known(format!("the sub-path cleaner failed: {e}")))?
                .map_err(|e| Failed::known(e.to_string()))?;
                if !cleaned.is_clean() {
                    let kept: Vec<String> = cleaned.kept.iter().map(ToString::to_string).collect();
                    return Err(Failed::known(format!(
                        "subPath binds of the volume stay: {}",
                        kept.join("; ")
                    )));
                }
                let request = UnpublishRequest {
                    pod_uid: &volume.key.pod_uid,
                    pod_volume_name: &volume.key.volume,
                    target: &volume.target,
                    spec: Some(&volume.spec),
                };
                mounter.unpublish(&request).await.map_err(Failed::from)?;
                Ok(ActualChange::RemovePublished(volume.key.clone()))
            }
            Operation::Unstage { volume } => {
                let stager = plugin.device_mounter().ok_or_else(|| missing("unstage"))?;
                stager.unstage_recorded(&volume.staging_path, &volume.spec).await.map_err(Failed::from)?;
                Ok(ActualChange::RemoveStaged(volume.unique_name.clone()))
            }
            Operation::Detach { volume } => {
                let attacher = plugin.attacher().ok_or_else(|| missing("detach"))?;
                // The plugin knows the volume by its own name, not kvol's unique name.
                let name = plugin_volume_name(plugin.pod_dir_plugin_name(), &volume.unique_name);
                attacher.detach(name, node).await.map_err(Failed::from)?;
                Ok(ActualChange::RemoveAttached(volume.unique_name.clone()))
            }
        }
    }

    /// Forgets a publication whose mount is gone (removed by hand, lost in a reboot), so the
    /// reconciler publishes it again; journalled like any change.
    pub fn forget_published(&self, key: &PodVolumeKey) -> Result<(), String> {
        let Some(volume) = self.lock().actual.published.get(key).cloned() else { return Ok(()) };
        self.record(&Operation::Unpublish { volume }, ActualChange::RemovePublished(key.clone()))
    }

    /// Marks a staged volume whose staging is lost (its mounts gone in a reboot or with a
    /// mount namespace) uncertain, so the reconciler stages it again if wanted (NodeStage is
    /// idempotent) and tears it down if not; journalled like any change.
    pub fn stage_lost(&self, unique_name: &str) -> Result<(), String> {
        let Some(volume) = self.lock().actual.staged.get(unique_name).cloned() else { return Ok(()) };
        let op = Operation::Stage {
            unique_name: volume.unique_name.clone(),
            plugin: volume.plugin.clone(),
            spec: volume.spec.clone(),
            device_path: volume.device_path.clone(),
            staging_path: volume.staging_path.clone(),
        };
        self.record(&op, ActualChange::SetStaged(StagedVolume { uncertain: true, ..volume }))
    }

    /// Adopts a published volume found on the node with no record (a driver that finished a
    /// publish after the agent gave up on it, a record lost with the store): recorded
    /// uncertain, so the reconciler tears it down through its plugin, or publishes it again if
    /// wanted. Skipped while an operation on its pod volume runs or a record exists.
    pub fn adopt_published(&self, volume: PublishedVolume) -> Result<bool, String> {
        let claim = Claim { unique_name: volume.unique_name.clone(), pod: Some(volume.key.clone()) };
        let volume = PublishedVolume { uncertain: true, ..volume };
        let op = Operation::Publish { volume: volume.clone(), mount_options: Vec::new() };
        let mut state = self.lock();
        if state.closed || state.actual.published.contains_key(&volume.key) || state.held.conflicts(&claim) {
            return Ok(false);
        }
        self.record_locked(&mut state, &op, ActualChange::SetPublished(volume))?;
        Ok(true)
    }

    /// Journals a change found rather than made (begin and finish at once) and applies it.
    fn record(&self, op: &Operation, change: ActualChange) -> Result<(), String> {
        self.record_locked(&mut self.lock(), op, change)
    }

    fn record_locked(&self, state: &mut State, op: &Operation, change: ActualChange) -> Result<(), String> {
        let id = self.store.begin(op).map_err(|e| e.to_string())?;
        self.store.finish(id, &change).map_err(|e| e.to_string())?;
        state.change_actual(change);
        Ok(())
    }

    /// Stops starting operations and waits (at most `limit`) for the running ones to end;
    /// returns how many were still running.
    pub async fn close(&self, limit: Duration) -> usize {
        self.lock().closed = true;
        let deadline = Instant::now() + limit;
        loop {
            let running = self.lock().running.len();
            if running == 0 || Instant::now() >= deadline {
                return running;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Why an operation failed, and whether it may have taken effect all the same.
#[derive(Debug)]
struct Failed {
    message: String,
    outcome_unknown: bool,
}

impl Failed {
    fn known(message: impl Into<String>) -> Failed {
        Failed { message: message.into(), outcome_unknown: false }
    }
}

impl From<kvol_plugin::PluginError> for Failed {
    fn from(e: kvol_plugin::PluginError) -> Failed {
        Failed { outcome_unknown: e.outcome_unknown(), message: e.to_string() }
    }
}

fn spec_of(op: &Operation) -> &VolumeSpec {
    match op {
        Operation::Unpublish { volume }
        | Operation::Publish { volume, .. }
        | Operation::Expand { volume, .. } => &volume.spec,
        Operation::Unstage { volume } => &volume.spec,
        Operation::Detach { volume } => &volume.spec,
        Operation::Attach { spec, .. } | Operation::Stage { spec, .. } => spec,
    }
}

/// Applies a journalled change to the in-memory actual state (the store applied the same): a
/// published record replaces any other of its pod at its target.
pub fn apply(actual: &mut ActualState, change: ActualChange) {
    match change {
        ActualChange::SetAttached(v) => {
            actual.attached.insert(v.unique_name.clone(), v);
        }
        ActualChange::RemoveAttached(name) => {
            actual.attached.remove(&name);
        }
        ActualChange::SetStaged(v) => {
            actual.staged.insert(v.unique_name.clone(), v);
        }
        ActualChange::RemoveStaged(name) => {
            actual.staged.remove(&name);
        }
        ActualChange::SetPublished(v) => {
            // One target, one volume: another record of the pod at the same target (one
            // reconstructed under its directory's name) is this one, and goes.
            // Only the pod's own records are looked at: at node scale a pass over every record
            // per publish is quadratic.
            let pod_first = PodVolumeKey { pod_uid: v.key.pod_uid.clone(), volume: String::new() };
            let same_target: Vec<PodVolumeKey> = actual
                .published
                .range(pod_first..)
                .take_while(|(k, _)| k.pod_uid == v.key.pod_uid)
                .filter(|(k, p)| **k != v.key && p.target == v.target)
                .map(|(k, _)| k.clone())
                .collect();
            for key in same_target {
                actual.published.remove(&key);
            }
            actual.published.insert(v.key.clone(), v);
        }
        ActualChange::RemovePublished(key) => {
            actual.published.remove(&key);
        }
        ActualChange::Nothing => {}
    }
}
