//! Runs the reconciler's operations through the plugins: one operation per volume at a time, journalled before and after, failures retried with exponential backoff.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use kvol_plugin::plugin::{PublishRequest, UnpublishRequest};
use kvol_plugin::{PluginHost, PluginRef, PluginRegistry, VolumeSpec};
use tokio::sync::Notify;

use crate::metrics::Metrics;
use crate::model::{ActualState, Operation, PodVolumeKey};
use crate::store::{ActualChange, Store};

/// The first retry comes after this long (upstream's `initialDurationBeforeRetry`).
pub const INITIAL_BACKOFF: Duration = Duration::from_millis(500);
/// Retries never wait longer than this (upstream's `maxDurationBeforeRetry`, 2m2s).
pub const MAX_BACKOFF: Duration = Duration::from_secs(122);

/// How long to wait before retrying after `failures` consecutive failures: 500 ms, doubling,
/// at most 2m2s.
pub fn backoff_delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    INITIAL_BACKOFF.saturating_mul(1 << doublings).min(MAX_BACKOFF)
}

/// An operation running now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Running {
    pub operation: &'static str,
    pub started: Instant,
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
}

#[derive(Debug, Default)]
struct State {
    actual: Arc<ActualState>,
    published_at: Arc<BTreeMap<PodVolumeKey, Instant>>,
    running: BTreeMap<String, Running>,
    failures: BTreeMap<String, Failure>,
    /// Once set, nothing new starts (shutdown).
    closed: bool,
}

/// Runs operations on tokio tasks; a stuck operation holds only its own volume.
#[derive(Debug)]
pub struct Executor {
    host: PluginHost,
    registry: Arc<PluginRegistry>,
    store: Arc<Store>,
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
        }
    }

    /// Starts `op` unless an operation on its volume is running or it is waiting out its
    /// backoff; returns whether it started.
    pub fn submit(self: &Arc<Self>, op: Operation) -> bool {
        let key = op.lock_key();
        {
            let mut state = self.lock();
            let now = Instant::now();
            if state.closed
                || state.running.contains_key(&key)
                || state.failures.get(&key).is_some_and(|f| f.retry_at > now)
            {
                return false;
            }
            state.running.insert(key.clone(), Running { operation: op.name(), started: now });
        }
        let this = Arc::clone(self);
        tokio::spawn(async move { this.run(key, op).await });
        true
    }

    /// When the next backed-off operation may be retried, if any is waiting.
    pub fn next_retry(&self) -> Option<Instant> {
        self.lock().failures.values().map(|f| f.retry_at).min()
    }

    async fn run(self: Arc<Self>, key: String, op: Operation) {
        let started = Instant::now();
        let migrated = spec_of(&op).migrated.is_some();
        let outcome = match self.store.begin(&op) {
            Ok(id) => {
                // CSI calls made for a migrated volume are labelled so in `csi_operations_seconds`.
                let result = kvol_csi::client::with_migrated(migrated, self.perform(&op)).await;
                let change = result.as_ref().map_or(ActualChange::Nothing, Clone::clone);
                match self.store.finish(id, &change) {
                    Ok(()) => result.map(|_| change),
                    Err(e) => Err(format!("cannot journal the end of {}: {e}", op.name())),
                }
            }
            Err(e) => Err(format!("cannot journal {}: {e}", op.name())),
        };
        let ok = outcome.is_ok();
        self.metrics.observe_operation(op.name(), op.plugin(), ok, migrated, started.elapsed());
        {
            let mut state = self.lock();
            state.running.remove(&key);
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
                    apply(Arc::make_mut(&mut state.actual), change);
                    state.failures.remove(&key);
                    tracing::info!(operation = op.name(), volume = %key, plugin = op.plugin(), elapsed_ms = started.elapsed().as_millis() as u64, "operation succeeded");
                }
                Err(error) => {
                    let count = state.failures.get(&key).map_or(0, |f| f.count) + 1;
                    let delay = backoff_delay(count);
                    tracing::warn!(operation = op.name(), volume = %key, plugin = op.plugin(), %error, retry_in_ms = delay.as_millis() as u64, "operation failed");
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

    async fn perform(&self, op: &Operation) -> Result<ActualChange, String> {
        let plugin = self.plugin(op.plugin())?;
        let node = self.host.node.name.as_str();
        let missing = |what: &str| format!("volume plugin {} cannot {what}", plugin.name());
        match op {
            Operation::Attach { unique_name, plugin: name, spec } => {
                let attacher = plugin.attacher().ok_or_else(|| missing("attach"))?;
                let device = attacher.attach(spec, node).await.map_err(|e| e.to_string())?;
                let device = attacher
                    .wait_for_attach(spec, device.as_deref(), self.attach_timeout)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok(ActualChange::SetAttached(crate::model::AttachedVolume {
                    unique_name: unique_name.clone(),
                    plugin: name.clone(),
                    spec: spec.clone(),
                    device_path: Some(device).filter(|d| !d.is_empty()),
                }))
            }
            Operation::Stage { unique_name, plugin: name, spec, device_path, staging_path } => {
                let stager = plugin.device_mounter().ok_or_else(|| missing("stage"))?;
                let path = staging_path.clone();
                stager.stage(spec, device_path.as_deref(), &path).await.map_err(|e| e.to_string())?;
                Ok(ActualChange::SetStaged(crate::model::StagedVolume {
                    unique_name: unique_name.clone(),
                    plugin: name.clone(),
                    spec: spec.clone(),
                    staging_path: path,
                    device_path: device_path.clone(),
                }))
            }
            Operation::Publish { volume, mount_options } => {
                let mounter = plugin.mounter().ok_or_else(|| missing("publish"))?;
                let request = PublishRequest {
                    spec: &volume.spec,
                    pod: &volume.pod,
                    pod_volume_name: &volume.key.volume,
                    target: &volume.target,
                    staging_path: volume.staging_path.as_deref(),
                    device_path: volume.device_path.as_deref(),
                    read_only: volume.spec.read_only,
                    mount_options,
                };
                mounter.publish(&request).await.map_err(|e| e.to_string())?;
                Ok(ActualChange::SetPublished(volume.clone()))
            }
            Operation::Unpublish { volume } => {
                let mounter = plugin.mounter().ok_or_else(|| missing("unpublish"))?;
                let request = UnpublishRequest {
                    pod_uid: &volume.key.pod_uid,
                    pod_volume_name: &volume.key.volume,
                    target: &volume.target,
                };
                mounter.unpublish(&request).await.map_err(|e| e.to_string())?;
                Ok(ActualChange::RemovePublished(volume.key.clone()))
            }
            Operation::Unstage { volume } => {
                let stager = plugin.device_mounter().ok_or_else(|| missing("unstage"))?;
                stager.unstage(&volume.staging_path).await.map_err(|e| e.to_string())?;
                Ok(ActualChange::RemoveStaged(volume.unique_name.clone()))
            }
            Operation::Detach { volume } => {
                let attacher = plugin.attacher().ok_or_else(|| missing("detach"))?;
                attacher.detach(&volume.unique_name, node).await.map_err(|e| e.to_string())?;
                Ok(ActualChange::RemoveAttached(volume.unique_name.clone()))
            }
        }
    }

    /// Forgets a publication whose mount is gone (removed by hand, lost in a reboot), so the
    /// reconciler publishes it again; journalled like any change.
    pub fn forget_published(&self, key: &PodVolumeKey) -> Result<(), String> {
        let mut state = self.lock();
        let Some(volume) = state.actual.published.get(key).cloned() else { return Ok(()) };
        let op = Operation::Unpublish { volume };
        let id = self.store.begin(&op).map_err(|e| e.to_string())?;
        let change = ActualChange::RemovePublished(key.clone());
        self.store.finish(id, &change).map_err(|e| e.to_string())?;
        apply(Arc::make_mut(&mut state.actual), change);
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

fn spec_of(op: &Operation) -> &VolumeSpec {
    match op {
        Operation::Unpublish { volume } | Operation::Publish { volume, .. } => &volume.spec,
        Operation::Unstage { volume } => &volume.spec,
        Operation::Detach { volume } => &volume.spec,
        Operation::Attach { spec, .. } | Operation::Stage { spec, .. } => spec,
    }
}

/// Applies a journalled change to the in-memory actual state (the store applied the same).
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
            actual.published.insert(v.key.clone(), v);
        }
        ActualChange::RemovePublished(key) => {
            actual.published.remove(&key);
        }
        ActualChange::Nothing => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_from_half_a_second_to_two_minutes() {
        let rows = [(1, 500), (2, 1_000), (3, 2_000), (4, 4_000), (8, 64_000), (9, 122_000), (40, 122_000)];
        for (failures, ms) in rows {
            assert_eq!(backoff_delay(failures), Duration::from_millis(ms), "{failures} failures");
        }
        assert_eq!(backoff_delay(0), INITIAL_BACKOFF);
    }
}
