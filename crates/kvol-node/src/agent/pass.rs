//! The loop's pass: objects → desired state → resolutions → (resync) → plan → operations → runtime view and status, each step a method of [`Loop`], doing again only what changed.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use kvol_claims::ClaimsController;
use kvol_components_runtime::ComponentRuntime;
use kvol_components_runtime::components::ComponentStates;
use kvol_csi::registration::RegistrationWatcher;
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, NodeObjects};
use kvol_flex::prober::FlexProber;
use kvol_plugin::migration::NodeMigration;
use kvol_plugin::{Mounter, PluginHost, PluginRegistry, Snapshot};

use super::start::{CsiParts, NodeParts, ObjectSecrets, secrets_from, undecided_flex_drivers};
use crate::actual::repair::{adopt_leftovers, repair_drift};
use crate::config::AgentConfig;
use crate::desired::pods::{NodeContext, desired_state_on};
use crate::desired::resolve_all;
use crate::executor::{ExecSnapshot, Executor};
use crate::model::{DesiredState, ObjectSet};
use crate::reconciler::{Resolutions, expansions, next_republish, plan, republish, waits_for_in_use};
use crate::report::metrics::Metrics;
use crate::report::status::StatusReport;
use crate::report::status_report::{REPORT_REFRESH, STATUS_REFRESH, StatusWrite, status_write};
use crate::runtime::runner_pods::RunnerPods;
use crate::sources::ObjectSource;

/// The source's objects with the provisioned volumes laid over them, and what they want.
pub(super) struct ObjectsView {
    pub source: Arc<ObjectSet>,
    /// The versions of what is laid over the source's set: the provisioned volumes, the
    /// runner's pods.
    pub overlays: Overlays,
    pub objects: ObjectSet,
    pub desired: DesiredState,
}

/// The agent's loop: each [`Loop::pass`] takes the same named steps, from the objects to the
/// status file; the parts it works with were set up by [`run`].
pub(super) struct Loop<'a> {
    pub(super) config: &'a AgentConfig,
    /// Whether the agent takes VolumeSnapshots (the `snapshot-controller` component runs).
    pub(super) snapshots_on: bool,
    /// Why the config file's last change or components' own files were not applied.
    pub(super) component_problems: Vec<String>,
    /// The supervised component processes, for the status report.
    pub(super) components: ComponentStates,
    pub(super) host: &'a PluginHost,
    pub(super) mounter: &'a dyn Mounter,
    pub(super) registry: &'a Arc<PluginRegistry>,
    pub(super) executor: &'a Arc<Executor>,
    pub(super) handler: &'a Arc<CsiRegistrationHandler>,
    pub(super) registration: &'a RegistrationWatcher,
    pub(super) flex_prober: &'a FlexProber,
    /// Flexvolume drivers on disk at start whose first probe has not ended: the teardown of a
    /// volume of theirs waits for it (their volumes resolve only once they load).
    pub(super) undecided_flex: BTreeSet<String>,
    /// The registration sockets there at start, and whether the cluster may be told the
    /// node's storage yet (once it may, it always may).
    pub(super) sockets_at_start: Vec<PathBuf>,
    pub(super) node_storage_open: bool,
    pub(super) objects: &'a MemoryObjects,
    pub(super) metrics: &'a Arc<Metrics>,
    pub(super) secrets: &'a ObjectSecrets,
    pub(super) source: &'a dyn ObjectSource,
    /// The standalone control plane (`None` in a cluster).
    pub(super) claims: Option<&'a ClaimsController>,
    pub(super) started: SystemTime,
    /// The same moment by the monotonic clock, for how long the agent has run.
    pub(super) started_at: Instant,
    pub(super) metrics_address: Option<String>,
    /// Pod volume directories no plugin could be named for, with why, while they last.
    pub(super) orphans_left: Vec<(PathBuf, String)>,
    /// The damaged journal kept aside at start, as `kvol status` says it (for the agent's life).
    pub(super) journal_damage: Option<String>,
    /// Directories of pods no longer wanted that could not be removed, with why.
    pub(super) pod_dirs_left: Vec<(PathBuf, String)>,
    pub(super) last_resync: Instant,
    /// How long the last resync took (it walks every volume and pod directory).
    pub(super) resync_took: Duration,
    pub(super) last_status: Option<(StatusReport, Instant)>,
    /// Whether the last write of the status file failed (said once until one succeeds).
    pub(super) status_unwritable: bool,
    /// What the last status report was made from, and when.
    pub(super) last_report: Option<(ReportInputs, Instant)>,
    /// The last resolutions and what they were made from.
    pub(super) cached_resolutions: Option<(ResolveKey, Arc<Resolutions>)>,
    /// A changed status held back by [`status_write`]: when a pass must write it.
    pub(super) status_deferred: Option<Instant>,
    pub(super) cached_view: Option<ObjectsView>,
    /// The volumes of claims, for the stats collector (`None`: stats are off).
    pub(super) stats_volumes:
        Option<tokio::sync::watch::Sender<Arc<Vec<crate::report::volume_stats::ClaimedVolume>>>>,
    /// The actual state's version and the objects the volumes of claims were last found from.
    pub(super) last_claimed: Option<(u64, Arc<ObjectSet>, Overlays)>,
    /// The pods a runner handed over the runtime API.
    pub(super) runner: &'a Arc<RunnerPods>,
    /// The node as the runtime API answers from it, and what it was last made from.
    pub(super) runtime_view: tokio::sync::watch::Sender<Arc<crate::runtime::view::RuntimeView>>,
    pub(super) last_view: Option<(u64, Arc<ObjectSet>, Overlays)>,
    /// What the last plan was made from, and when.
    pub(super) last_plan: Option<(PlanKey, Instant)>,
    /// When the next timed republish falls due, as the last look over every published volume
    /// found (`None`: none is timed).
    pub(super) next_republish: Option<Instant>,
}

/// What the loop works with, set up by `run` before the first pass.
pub(super) struct Parts<'a> {
    pub config: &'a AgentConfig,
    pub node: &'a NodeParts,
    pub csi: &'a CsiParts,
    pub source: &'a dyn ObjectSource,
    pub claims: Option<&'a ClaimsController>,
    pub executor: &'a Arc<Executor>,
    pub runner: &'a Arc<RunnerPods>,
}

/// What the rooms beside the loop hand it: where metrics are served, whom to tell the claims'
/// volumes, where to publish the runtime view.
pub(super) struct Outlets {
    pub metrics_address: Option<String>,
    pub stats_volumes:
        Option<tokio::sync::watch::Sender<Arc<Vec<crate::report::volume_stats::ClaimedVolume>>>>,
    pub runtime_view: tokio::sync::watch::Sender<Arc<crate::runtime::view::RuntimeView>>,
}

impl<'a> Loop<'a> {
    /// A loop that has made no pass yet; `orphans_left` are the pod volume directories start-up
    /// could name no plugin for.
    pub(super) fn new(
        parts: Parts<'a>,
        components: &ComponentRuntime,
        outlets: Outlets,
        orphans_left: Vec<(PathBuf, String)>,
        started: SystemTime,
    ) -> Loop<'a> {
        let Parts { config, node, csi, source, claims, executor, runner } = parts;
        Loop {
            config,
            snapshots_on: components.snapshots_on(),
            component_problems: components.problems(),
            components: components.states(),
            host: &node.host,
            mounter: node.mounter.as_ref(),
            registry: &node.registry,
            executor,
            handler: &csi.handler,
            registration: &csi.watcher,
            flex_prober: &node.prober,
            undecided_flex: undecided_flex_drivers(&config.volume_plugin_dir, &node.prober),
            sockets_at_start: csi.sockets_at_start.clone(),
            node_storage_open: false,
            objects: &csi.objects,
            metrics: &node.metrics,
            secrets: &node.secrets,
            source,
            claims,
            started,
            started_at: Instant::now(),
            metrics_address: outlets.metrics_address,
            orphans_left,
            journal_damage: node.journal_damage.clone(),
            pod_dirs_left: Vec::new(),
            // The first pass checks the journal against the mount table before the runtime API
            // answers from it: after a reboot no volume is said ready on a mount that is gone.
            last_resync: Instant::now().checked_sub(config.resync).unwrap_or_else(Instant::now),
            resync_took: Duration::ZERO,
            last_status: None,
            status_unwritable: false,
            last_report: None,
            cached_resolutions: None,
            status_deferred: None,
            cached_view: None,
            stats_volumes: outlets.stats_volumes,
            last_claimed: None,
            runner,
            runtime_view: outlets.runtime_view,
            last_view: None,
            last_plan: None,
            next_republish: None,
        }
    }
}

impl Loop<'_> {
    /// One pass: objects → desired state → resolutions → (resync) → plan → operations → status;
    /// how long it took.
    pub(super) fn pass(&mut self) -> Duration {
        let pass_started = Instant::now();
        let view = self.objects_view();
        if let Some(claims) = self.claims {
            let in_use = || self.executor.volumes_in_use();
            claims.pass(&view.objects, &view.source, &self.handler.drivers(), in_use, self.snapshots_on);
        }
        let viewed = pass_started.elapsed();
        let snapshot = self.registry.snapshot();
        let resolutions = self.resolve(&snapshot, &view);
        let resolved = pass_started.elapsed();
        if self.last_resync.elapsed() >= resync_period(self.config.resync, self.resync_took) {
            self.last_resync = Instant::now();
            self.resync(&view.desired);
            self.resync_took = self.last_resync.elapsed();
        }
        self.submit(&view, &resolutions);
        // One snapshot for everything shown after the plan: while a snapshot holds the actual
        // state, an operation ending copies it whole (copy on write), so each one taken
        // costs a copy at node scale.
        let exec = self.executor.snapshot();
        self.offer_runtime_view(&view, &resolutions, &exec);
        let submitted = pass_started.elapsed();
        let problems = self.problems(&view.objects, &exec);
        let inputs = ReportInputs {
            executor: exec.version,
            source: Arc::clone(&view.source),
            provisioned: view.overlays,
            plugins: snapshot.generation(),
            problems,
            components: self.components.snapshot(),
            snapshots: self.claims.map_or(0, ClaimsController::snapshots_version),
        };
        let changed = self.last_report.as_ref().is_none_or(|(last, _)| *last != inputs);
        let since = self.last_report.as_ref().map(|(_, at)| at.elapsed());
        // The report is made again unchanged only to keep running operations' ages fresh;
        // with none running, as often as the file is refreshed.
        let refresh = if exec.running.is_empty() { STATUS_REFRESH } else { REPORT_REFRESH };
        let written = match status_write(changed, since, refresh, exec.running.is_empty()) {
            StatusWrite::Now if !changed && exec.running.is_empty() && self.touch_status() => {
                self.last_report = Some((inputs, Instant::now()));
                false
            }
            StatusWrite::Now => {
                let written = self.report(
                    inputs.problems.clone(),
                    &view.objects,
                    &view.desired,
                    &resolutions,
                    &snapshot,
                    &exec,
                );
                self.last_report = Some((inputs, Instant::now()));
                written
            }
            StatusWrite::After(wait) => {
                self.status_deferred = Some(Instant::now() + wait);
                false
            }
            StatusWrite::NotYet => false,
        };
        drop(exec);
        self.offer_claimed_volumes(&view);
        tracing::debug!(
            elapsed_us = pass_started.elapsed().as_micros() as u64,
            view_us = viewed.as_micros() as u64,
            resolve_us = (resolved - viewed).as_micros() as u64,
            submit_us = (submitted - resolved).as_micros() as u64,
            volumes = view.desired.volumes.len(),
            status_written = written,
            "reconcile pass"
        );
        self.cached_view = Some(view);
        pass_started.elapsed()
    }

    /// The objects with the provisioned volumes laid over them, and the desired state, made
    /// again only when the source or the provisioned records changed: most passes follow an
    /// operation, not a change of objects.
    fn objects_view(&mut self) -> ObjectsView {
        let from_source = self.source.current();
        let provisioned = self.claims.map_or(0, ClaimsController::provisioned_version);
        let runner = self.runner.version();
        match self.cached_view.take() {
            Some(v) if Arc::ptr_eq(&v.source, &from_source) && v.overlays == (provisioned, runner) => v,
            _ => {
                let mut set = (*from_source).clone();
                self.runner.overlay(&mut set);
                let provisioned = self.claims.map_or(0, |claims| claims.overlay(&mut set));
                let node = NodeContext {
                    node_name: self.config.node_name.clone(),
                    allocatable: self.host.node.allocatable,
                    mints_tokens: self.host.tokens.is_some(),
                };
                let desired = desired_state_on(&set, &node);
                secrets_from(self.secrets, &set);
                // The whole set: a CSIDriver removed from the source stops applying at once.
                self.objects.set_csi_drivers(set.csi_drivers.values().cloned());
                ObjectsView { source: from_source, overlays: (provisioned, runner), objects: set, desired }
            }
        }
    }

    /// How each wanted volume is served, with the node's migration as its CSINode says; made
    /// again only when the objects, the plugins or the node's migration changed.
    fn resolve(&mut self, snapshot: &Snapshot, view: &ObjectsView) -> Arc<Resolutions> {
        let config = self.config;
        let own = NodeMigration::of_own_node(
            &config.node_name,
            &config.gates,
            self.handler.drivers().iter().map(|d| d.name.as_str()),
        );
        let node = self.objects.csi_node(&config.node_name).map(|c| NodeMigration::from_csinode(&c));
        let migration = node.unwrap_or(own);
        let key = ResolveKey {
            source: Arc::clone(&view.source),
            provisioned: view.overlays,
            plugins: snapshot.generation(),
            migration,
        };
        if let Some((last, resolutions)) = &self.cached_resolutions
            && *last == key
        {
            return Arc::clone(resolutions);
        }
        let resolutions =
            Arc::new(resolve_all(snapshot, &config.gates, &key.migration, &self.host.paths, &view.desired));
        self.cached_resolutions = Some((key, Arc::clone(&resolutions)));
        resolutions
    }

    /// Now and then: published records checked against the mount table, and directories of
    /// pods gone that no record accounts for adopted for teardown.
    fn resync(&mut self, desired: &DesiredState) {
        repair_drift(self.executor, self.mounter);
        let (listed, pod_dirs_left) =
            adopt_leftovers(&self.host.paths, self.executor, desired, self.registry);
        // An orphan gone from the listing is no longer a problem.
        self.orphans_left.retain(|(path, _)| listed.iter().any(|d| &d.path == path));
        // Said once, shown while it lasts.
        for (path, reason) in pod_dirs_left.iter().filter(|left| !self.pod_dirs_left.contains(left)) {
            tracing::warn!(path = %path.display(), %reason, "pod directory left");
        }
        self.pod_dirs_left = pod_dirs_left;
    }

    /// The node as the runtime API answers from it, made again when the objects, the runner's
    /// pods or the executor's state changed.
    fn offer_runtime_view(&mut self, view: &ObjectsView, resolutions: &Resolutions, exec: &ExecSnapshot) {
        let inputs = (exec.version, Arc::clone(&view.source), view.overlays);
        let same = self
            .last_view
            .as_ref()
            .is_some_and(|(v, s, o)| *v == inputs.0 && Arc::ptr_eq(s, &inputs.1) && *o == inputs.2);
        if same {
            return;
        }
        let volumes = crate::report::status_report::volume_statuses(&view.desired, resolutions, exec);
        let made = crate::runtime::view::make(&view.objects, volumes, &exec.actual);
        self.runtime_view.send_if_modified(|current| {
            if **current == made {
                return false;
            }
            *current = Arc::new(made);
            true
        });
        self.last_view = Some(inputs);
    }

    /// The plan's operations and the republishes due, submitted to the executor. The plan is
    /// made again only when one of its inputs changed or a backed-off operation came due since
    /// the last one: with the same inputs it would give the same operations, each already
    /// submitted (started, or refused while its volume is busy — whose end changes the
    /// executor's version — or backed off). At node scale an idle pass skipped this O(volumes)
    /// work four times a second.
    fn submit(&mut self, view: &ObjectsView, resolutions: &Arc<Resolutions>) {
        let (desired, resolutions_ref) = (&view.desired, resolutions.as_ref());
        if !self.undecided_flex.is_empty() {
            let decided: BTreeSet<String> = self.flex_prober.status().into_iter().map(|d| d.name).collect();
            self.undecided_flex.retain(|name| !decided.contains(name));
        }
        let exec = self.executor.snapshot();
        // In a cluster, an attachable volume is mounted only once the API lists it in use.
        let reported = self.config.node_storage.as_ref().and_then(|sink| sink.reported_in_use());
        let key = PlanKey {
            executor: exec.version,
            source: Arc::clone(&view.source),
            overlays: view.overlays,
            resolutions: Arc::clone(resolutions),
            reported: reported.clone(),
            undecided_flex: self.undecided_flex.len(),
        };
        let now = Instant::now();
        let retry_came_due =
            |since: Instant| exec.failures.values().any(|f| f.retry_at > since && f.retry_at <= now);
        let same = self.last_plan.as_ref().is_some_and(|(last, at)| *last == key && !retry_came_due(*at));
        if !same {
            for op in plan(desired, resolutions_ref, &exec.actual, &exec.busy()) {
                if reported.as_ref().is_some_and(|reported| waits_for_in_use(&op, resolutions_ref, reported))
                {
                    continue;
                }
                if !self.undecided_flex.is_empty() && self.undecided_flex.contains(op.plugin()) {
                    continue;
                }
                self.executor.submit(op);
            }
            for op in expansions(desired, resolutions_ref, &exec.actual) {
                self.executor.submit(op);
            }
            self.last_plan = Some((key, now));
        }
        // With the plan's inputs unchanged no projection changed: only a timed republish can
        // fall due, and when the next one does is known. An idle pass at node scale skipped
        // this look over every published volume (and its digests) four times a second.
        if same && self.next_republish.is_none_or(|at| at > now) {
            return;
        }
        let period = self.config.republish;
        let due = republish(desired, resolutions_ref, &exec.actual, &exec.published_at, now, period);
        self.next_republish = next_republish(resolutions_ref, &exec.actual, &exec.published_at, now, period);
        for op in due {
            self.executor.submit(op);
        }
    }

    /// Tells the stats collector which published volumes come from claims, when the published
    /// volumes or the objects changed since it was last told.
    fn offer_claimed_volumes(&mut self, view: &ObjectsView) {
        let Some(sender) = &self.stats_volumes else { return };
        let (actual, version) = self.executor.actual();
        let unchanged = self
            .last_claimed
            .as_ref()
            .is_some_and(|(a, o, v)| *a == version && Arc::ptr_eq(o, &view.source) && *v == view.overlays);
        if unchanged {
            return;
        }
        let claimed = crate::report::volume_stats::claimed_volumes(&view.objects.pods, &actual.published);
        drop(actual);
        sender.send_if_modified(|current| {
            let changed = **current != claimed;
            if changed {
                *current = Arc::new(claimed);
            }
            changed
        });
        self.last_claimed = Some((version, Arc::clone(&view.source), view.overlays));
    }

    /// How long to sleep when nothing wakes the loop: until the next retry is due, at most
    /// 250 ms (plugin changes are polled), at least 5 ms.
    pub(super) fn nap(&self) -> Duration {
        let retry_in = self
            .executor
            .next_retry()
            .map(|at| at.saturating_duration_since(Instant::now()))
            .unwrap_or(Duration::from_secs(1));
        let nap = retry_in.min(Duration::from_millis(250)).max(Duration::from_millis(5));
        match self.status_deferred {
            Some(at) => nap.min(at.saturating_duration_since(Instant::now()).max(Duration::from_millis(1))),
            None => nap,
        }
    }
}

/// How long the loop rests after a pass of `took` while operations run (`busy`), before it
/// looks at what woke it: at node scale a pass walks thousands of volumes, and one after each
/// operation's end would take the core the operations need. The loop then spends at most half
/// its time in passes; a cheap pass (under 10 ms) or an idle executor rests not at all. Pure.
pub(super) fn pacing(took: Duration, busy: bool) -> Duration {
    if busy && took >= Duration::from_millis(10) {
        took.min(Duration::from_millis(500))
    } else {
        Duration::ZERO
    }
}

/// How often to resync: every `configured` period, or less often when a resync takes more
/// than 1% of it, so that at node scale (thousands of volumes and pod directories walked) the
/// idle agent spends at most 1% of a core on it. Pure.
pub(super) fn resync_period(configured: Duration, last_took: Duration) -> Duration {
    configured.max(last_took * 100)
}

/// The versions of the provisioned volumes and of the runner's pods, laid over a source's set.
pub(super) type Overlays = (u64, u64);

/// What resolutions are made from, as far as telling a change goes.
#[derive(Debug)]
pub(super) struct ResolveKey {
    source: Arc<ObjectSet>,
    provisioned: Overlays,
    plugins: u64,
    migration: NodeMigration,
}

impl PartialEq for ResolveKey {
    /// The objects by identity, as [`ReportInputs`] compares them.
    fn eq(&self, other: &ResolveKey) -> bool {
        Arc::ptr_eq(&self.source, &other.source)
            && self.provisioned == other.provisioned
            && self.plugins == other.plugins
            && self.migration == other.migration
    }
}

/// What a status report is made from, as far as telling a change goes: the executor's
/// version, the objects, the plugins, the problems.
#[derive(Debug)]
pub(super) struct ReportInputs {
    pub(super) executor: u64,
    pub(super) source: Arc<ObjectSet>,
    pub(super) provisioned: Overlays,
    pub(super) plugins: u64,
    pub(super) problems: Vec<String>,
    /// A component restarted or turned healthy is news for the status.
    pub(super) components: Vec<kvol_components_runtime::ComponentStatus>,
    /// Snapshots taken or deleted.
    pub(super) snapshots: u64,
}

impl PartialEq for ReportInputs {
    /// The objects by identity: a new set from the source is a change, and comparing two sets'
    /// contents on every pass would cost what this saves.
    fn eq(&self, other: &ReportInputs) -> bool {
        self.executor == other.executor
            && Arc::ptr_eq(&self.source, &other.source)
            && self.provisioned == other.provisioned
            && self.plugins == other.plugins
            && self.problems == other.problems
            && self.components == other.components
            && self.snapshots == other.snapshots
    }
}

/// What a plan is made from, as far as telling a change goes: the executor's version (the
/// actual state, what runs, what failed), the objects by identity, the resolutions by
/// identity, what the cluster lists in use, and how many Flexvolume drivers are undecided.
#[derive(Debug)]
pub(super) struct PlanKey {
    executor: u64,
    source: Arc<ObjectSet>,
    overlays: Overlays,
    resolutions: Arc<Resolutions>,
    reported: Option<BTreeSet<String>>,
    undecided_flex: usize,
}

impl PartialEq for PlanKey {
    fn eq(&self, other: &PlanKey) -> bool {
        self.executor == other.executor
            && Arc::ptr_eq(&self.source, &other.source)
            && self.overlays == other.overlays
            && Arc::ptr_eq(&self.resolutions, &other.resolutions)
            && self.reported == other.reported
            && self.undecided_flex == other.undecided_flex
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passes_rest_as_long_as_they_took_only_when_costly_and_busy() {
        let ms = Duration::from_millis;
        // (pass took, operations running, rest)
        let rows = [
            (ms(2), true, Duration::ZERO),
            (ms(9), true, Duration::ZERO),
            (ms(10), true, ms(10)),
            (ms(250), true, ms(250)),
            (ms(900), true, ms(500)),
            (ms(250), false, Duration::ZERO),
        ];
        for (took, busy, rest) in rows {
            assert_eq!(pacing(took, busy), rest, "took {took:?}, busy {busy}");
        }
    }

    #[test]
    fn resync_spreads_out_only_when_it_costs_more_than_a_hundredth() {
        let s = Duration::from_secs;
        let ms = Duration::from_millis;
        // (configured, last resync took, period)
        let rows = [
            (s(10), Duration::ZERO, s(10)),
            (s(10), ms(50), s(10)),
            (s(10), ms(100), s(10)),
            (s(10), ms(270), s(27)),
            (s(1), ms(30), s(3)),
        ];
        for (configured, took, period) in rows {
            assert_eq!(resync_period(configured, took), period, "{configured:?}, took {took:?}");
        }
    }
}
