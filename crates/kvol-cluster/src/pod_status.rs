//! The node's pods' status in the API, as kubelet's status manager keeps it: each change the runner reports written to the pod's status subresource (once per change, the pod's uid a precondition), and a pod gone from the node — containers stopped, volumes let go — deleted with grace 0 when the API had begun deleting it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, PodStatus};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use kvol_api::pod::PodStatusReport;
use serde_json::json;
use tokio::sync::mpsc;

/// Writes the runner's reports until their sender goes.
#[derive(Debug)]
pub struct PodStatusWriter {
    task: tokio::task::JoinHandle<()>,
}

impl PodStatusWriter {
    pub fn start(client: Client, reports: mpsc::UnboundedReceiver<PodStatusReport>) -> PodStatusWriter {
        PodStatusWriter { task: tokio::spawn(write(client, reports)) }
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

/// The body of a status patch: the status whole, the uid as a precondition.
pub fn status_patch(uid: &str, status: &PodStatus) -> serde_json::Value {
    json!({"metadata": {"uid": uid}, "status": status})
}

async fn write(client: Client, mut reports: mpsc::UnboundedReceiver<PodStatusReport>) {
    let mut written: BTreeMap<String, PodStatus> = BTreeMap::new();
    while let Some(report) = reports.recv().await {
        let pods: Api<Pod> = Api::namespaced(client.clone(), &report.namespace);
        let key = format!("{}/{}", report.namespace, report.name);
        match &report.status {
            Some(status) if written.get(&report.uid) == Some(status) => {}
            Some(status) => {
                let patch = Patch::Merge(status_patch(&report.uid, status));
                match pods.patch_status(&report.name, &PatchParams::default(), &patch).await {
                    Ok(_) => {
                        written.insert(report.uid.clone(), status.clone());
                    }
                    // A static pod without a mirror, or one deleted meanwhile: nothing to write.
                    Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                    Err(e) => tracing::warn!(pod = %key, error = %e, "pod status not written"),
                }
            }
            None => {
                written.remove(&report.uid);
                delete_if_deleting(&pods, &report, &key).await;
            }
        }
    }
}

/// Deletes the pod with grace 0 when the API is deleting it (its deletionTimestamp set): the
/// node has finished with it, as kubelet's status manager decides.
async fn delete_if_deleting(pods: &Api<Pod>, report: &PodStatusReport, key: &str) {
    let Ok(Some(pod)) = pods.get_opt(&report.name).await else { return };
    let same = pod.metadata.uid.as_deref() == Some(report.uid.as_str());
    if !same || pod.metadata.deletion_timestamp.is_none() {
        return;
    }
    let params = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions { uid: Some(report.uid.clone()), resource_version: None }),
        ..Default::default()
    };
    match pods.delete(&report.name, &params).await {
        Ok(_) => tracing::info!(pod = %key, "pod deleted: its containers stopped and its volumes let go"),
        Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
        Err(e) => tracing::warn!(pod = %key, error = %e, "pod not deleted"),
    }
}
