//! The loop's report: the status report and file, the volume gauges, and what the cluster is told (the node's storage, grown claims, pods' Events) — written when something other than the clock changed.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Instant;

use kvol_claims::ClaimsController;
use kvol_csi::NodeObjects;
use kvol_plugin::Snapshot;

use super::pass::Loop;
use crate::executor::ExecSnapshot;
use crate::model::{DesiredState, ObjectSet};
use crate::reconciler::Resolutions;
use crate::report::node_storage::may_report;
use crate::report::status::{Phase, SnapshotStatus, write_status};
use crate::report::status_report::{STATUS_REFRESH, StatusWrite, status_report, status_write};

impl Loop<'_> {
    /// The snapshots taken, as the status shows them.
    fn snapshot_statuses(&self) -> Vec<SnapshotStatus> {
        let Some(claims) = self.claims else { return Vec::new() };
        claims
            .snapshot_records()
            .into_iter()
            .map(|(key, r)| SnapshotStatus {
                name: key,
                driver: r.driver,
                snapshot_handle: r.snapshot_handle,
                source_claim: r.source_claim,
                size_bytes: r.size_bytes,
                ready_to_use: r.ready_to_use,
                content: r.content,
            })
            .collect()
    }

    /// The problems status shows: the source's, a damaged journal kept aside, orphans left, failed provisionings, the
    /// components', the snapshots'.
    pub(super) fn problems(&mut self, objects: &ObjectSet, exec: &ExecSnapshot) -> Vec<String> {
        let mut problems: Vec<String> = objects.problems.iter().map(ToString::to_string).collect();
        problems.extend(self.journal_damage.iter().cloned());
        if !self.orphans_left.is_empty() {
            // Now a published volume's directory: no longer a problem.
            self.orphans_left
                .retain(|(path, _)| !exec.actual.published.values().any(|p| p.target.starts_with(path)));
            problems.extend(self.orphans_left.iter().map(|(_, reason)| reason.clone()));
        }
        problems.extend(self.pod_dirs_left.iter().map(|(_, reason)| reason.clone()));
        problems.extend(crate::report::claim_status::deferred_expansions(&exec.actual));
        let claims = self.claims;
        problems.extend(claims.map(|c| c.expansion_problems(objects)).unwrap_or_default());
        let failures = claims.map(ClaimsController::provisioning_failures).unwrap_or_default();
        problems.extend(failures.into_iter().map(|(claim, reason)| {
            crate::model::SourceProblem {
                origin: format!("provisioning of claim {claim}"),
                document: None,
                reason,
            }
            .to_string()
        }));
        problems.extend(self.component_problems.iter().cloned());
        if let Some(claims) = claims {
            problems.extend(claims.snapshot_problems(objects, self.snapshots_on));
        }
        problems
    }

    /// Refreshes the status file's time when the last report is still what it shows (nothing
    /// it is made from changed, nothing runs); whether it did.
    pub(super) fn touch_status(&mut self) -> bool {
        self.last_status.is_some()
            && !self.status_unwritable
            && crate::report::status::touch_status(&self.config.state_dir).is_ok()
    }

    /// The status report, the volume gauges, and the status file — written when something
    /// other than the clock changed, or every 5 s so `updated` stays fresh: a busy pass should
    /// not cost a file write. Returns whether the file was written.
    pub(super) fn report(
        &mut self,
        problems: Vec<String>,
        objects: &ObjectSet,
        desired: &DesiredState,
        resolutions: &Resolutions,
        snapshot: &Snapshot,
        exec: &ExecSnapshot,
    ) -> bool {
        let mut report = status_report(
            self.config,
            problems,
            desired,
            resolutions,
            exec,
            self.started,
            &self.metrics_address,
            snapshot,
        );
        report.csi_node = self.objects.csi_node(&self.config.node_name);
        report.components = self.components.snapshot();
        report.snapshots = self.snapshot_statuses();
        let resize_statuses: BTreeMap<String, String> = self
            .claims
            .map(|c| c.claim_statuses())
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(key, kept)| Some((key, kept.resize_status?)))
            .collect();
        report.claims = crate::report::claim_status::claim_sizes(objects, &resize_statuses);
        self.tell(objects, desired, resolutions, exec, report.csi_node.clone());
        let count = |phase: Phase| report.volumes.iter().filter(|v| v.phase == phase).count() as i64;
        // An uncertain volume that failed is failing; one being published again is neither.
        let failing_uncertain =
            report.volumes.iter().filter(|v| v.phase == Phase::Uncertain && v.last_error.is_some()).count()
                as i64;
        self.metrics.set_volumes(
            count(Phase::Published),
            count(Phase::Pending),
            count(Phase::Failed) + failing_uncertain,
        );
        self.metrics.set_total_volumes(&crate::report::metrics::total_volumes(
            desired,
            resolutions,
            &exec.actual.published,
        ));
        let mut comparable = report.clone();
        comparable.updated_unix_ms = 0;
        let last = self.last_status.as_ref();
        let changed = last.is_none_or(|(previous, _)| *previous != comparable);
        self.status_deferred = None;
        match status_write(changed, last.map(|(_, at)| at.elapsed()), STATUS_REFRESH, exec.running.is_empty())
        {
            StatusWrite::Now => match write_status(&self.config.state_dir, &report) {
                Ok(()) => {
                    self.last_status = Some((comparable, Instant::now()));
                    if std::mem::take(&mut self.status_unwritable) {
                        tracing::info!("the status file is written again");
                    }
                    return true;
                }
                // Said once, not every pass, until it is written again.
                Err(e) if !self.status_unwritable => {
                    self.status_unwritable = true;
                    tracing::warn!(error = %e, "cannot write the status file: kvol status shows the last one written");
                }
                Err(_) => {}
            },
            StatusWrite::After(wait) => self.status_deferred = Some(Instant::now() + wait),
            StatusWrite::NotYet => {}
        }
        false
    }

    /// Tells whom the config names: the cluster the node's storage, the claims grown, the pods'
    /// volume failures as Events; the standalone claims controller the claims the node grew.
    fn tell(
        &mut self,
        objects: &ObjectSet,
        desired: &DesiredState,
        resolutions: &Resolutions,
        exec: &ExecSnapshot,
        csi_node: Option<k8s_openapi::api::storage::v1::CSINode>,
    ) {
        if let Some(sink) = self.config.node_storage.as_ref().filter(|_| self.may_report_node_storage()) {
            sink.report(&crate::report::node_storage::NodeStorage {
                csi_node,
                node_ids: self.handler.node_id_annotation(),
                volumes_in_use: crate::report::node_storage::volumes_in_use(resolutions, &exec.actual),
                topology_labels: self.handler.topology_labels(),
            });
        }
        let resized = crate::report::claim_status::resized_claims(objects, &exec.actual);
        if let Some(sink) = &self.config.claim_status {
            sink.report(&resized);
        }
        if let Some(claims) = self.claims.filter(|_| !resized.is_empty()) {
            let grown: Vec<(String, u64)> =
                resized.iter().map(|r| (format!("{}/{}", r.namespace, r.name), r.capacity_bytes)).collect();
            claims.node_resized(&grown);
        }
        if let Some(sink) = &self.config.pod_events {
            sink.report(&crate::report::pod_events::volume_failures(desired, resolutions, exec));
        }
    }

    /// Whether the cluster may be told the node's storage: once the drivers registered before
    /// this start are back or gone, or after a while (see `may_report`); then for good.
    fn may_report_node_storage(&mut self) -> bool {
        if !self.node_storage_open {
            let registered: Vec<PathBuf> =
                self.registration.registered().into_iter().map(|p| p.socket).collect();
            // The monotonic clock: a wall clock set forward must not open this early.
            let since_start = self.started_at.elapsed();
            self.node_storage_open =
                may_report(&self.sockets_at_start, &registered, |p| p.exists(), since_start);
            if self.node_storage_open {
                tracing::info!(registered = registered.len(), "telling the cluster the node's storage");
            }
        }
        self.node_storage_open
    }
}
