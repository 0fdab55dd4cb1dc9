//! The node's pods in the API, as kubelet's status manager and recorder keep them: each status change the runner reports written to the pod's status subresource (once per change, the pod's uid a precondition), a pod gone from the node — containers stopped, volumes let go — deleted with grace 0 when the API had begun deleting it, and kubelet's Events about pods (a repeat counted on the same Event).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Event, Pod, PodStatus};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::{Api, Client};
use kvol_api::pod::{PodEventReport, PodReport, PodStatusReport};
use serde_json::json;
use tokio::sync::mpsc;

/// Writes the runner's reports until their sender goes.
#[derive(Debug)]
pub struct PodStatusWriter {
    task: tokio::task::JoinHandle<()>,
}

impl PodStatusWriter {
    pub fn start(
        client: Client,
        node: String,
        reports: mpsc::UnboundedReceiver<PodReport>,
    ) -> PodStatusWriter {
        PodStatusWriter { task: tokio::spawn(write(client, node, reports)) }
    }

    pub fn stop(self) {
        self.task.abort();
    }
}

/// The body of a status patch: the status whole, the uid as a precondition.
pub fn status_patch(uid: &str, status: &PodStatus) -> serde_json::Value {
    json!({"metadata": {"uid": uid}, "status": status})
}

async fn write(client: Client, node: String, mut reports: mpsc::UnboundedReceiver<PodReport>) {
    let mut written: BTreeMap<String, Box<PodStatus>> = BTreeMap::new();
    // A static pod's uid → its mirror pod's.
    let mut mirrors: BTreeMap<String, String> = BTreeMap::new();
    let mut events = EventBook::default();
    while let Some(report) = reports.recv().await {
        let report = match report {
            PodReport::Status(report) => report,
            PodReport::Event(event) => {
                events.write(&client, &node, &event).await;
                continue;
            }
        };
        if report.status.is_none() {
            events.forget(&report.uid);
            mirrors.remove(&report.uid);
        }
        let pods: Api<Pod> = Api::namespaced(client.clone(), &report.namespace);
        let key = format!("{}/{}", report.namespace, report.name);
        match &report.status {
            Some(status) if written.get(&report.uid) == Some(status) => {}
            Some(status) => {
                let uid = mirrors.get(&report.uid).cloned().unwrap_or_else(|| report.uid.clone());
                let mut outcome = patch_status(&pods, &report.name, &uid, status).await;
                if matches!(&outcome, Err(kube::Error::Api(e)) if [404, 409, 422].contains(&e.code)) {
                    // A static pod's status goes to its mirror pod, which has a uid of its own
                    // (the API answers the static pod's as an immutable field changed: 422).
                    if let Some(mirror) = mirror_uid(&pods, &report).await.filter(|m| *m != uid) {
                        mirrors.insert(report.uid.clone(), mirror.clone());
                        outcome = patch_status(&pods, &report.name, &mirror, status).await;
                    }
                }
                match outcome {
                    Ok(_) => {
                        written.insert(report.uid.clone(), status.clone());
                    }
                    // A static pod without a mirror yet, or a pod deleted meanwhile: nothing to
                    // write now.
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

async fn patch_status(pods: &Api<Pod>, name: &str, uid: &str, status: &PodStatus) -> kube::Result<Pod> {
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(status_patch(uid, status))).await
}

/// The uid of the mirror pod of the static pod `report` is about, when the API has one.
async fn mirror_uid(pods: &Api<Pod>, report: &PodStatusReport) -> Option<String> {
    let pod = pods.get_opt(&report.name).await.ok()??;
    let hash = pod.metadata.annotations.as_ref()?.get(crate::mirror_pods::CONFIG_MIRROR)?;
    (*hash == report.uid).then(|| pod.metadata.uid.clone()).flatten()
}

/// An Event's identity: pod uid, field path, type, reason, message.
type EventKey = (String, String, &'static str, String, String);

/// The Events written, by (pod uid, field path, type, reason, message): a repeat bumps the count of the
/// one written before, as kubelet's recorder aggregates.
#[derive(Debug, Default)]
struct EventBook {
    written: BTreeMap<EventKey, (String, i32)>,
}

impl EventBook {
    async fn write(&mut self, client: &Client, node: &str, report: &PodEventReport) {
        let events: Api<Event> = Api::namespaced(client.clone(), &report.namespace);
        let key = (
            report.uid.clone(),
            report.field_path.clone(),
            report.kind,
            report.reason.clone(),
            report.message.clone(),
        );
        let now = Time(Timestamp::now());
        let outcome = match self.written.get_mut(&key) {
            Some((name, count)) => {
                *count += 1;
                let patch = json!({"count": *count, "lastTimestamp": now});
                events.patch(name, &PatchParams::default(), &Patch::Merge(patch)).await.map(|_| ())
            }
            None => {
                let event = event_object(report, node, now);
                let name = event.metadata.name.clone().unwrap_or_default();
                self.written.insert(key, (name, 1));
                events.create(&Default::default(), &event).await.map(|_| ())
            }
        };
        if let Err(e) = outcome {
            tracing::warn!(pod = %format!("{}/{}", report.namespace, report.name), reason = %report.reason, error = %e, "pod event not written");
        }
    }

    /// Drops what was written about a pod gone from the node.
    fn forget(&mut self, uid: &str) {
        self.written.retain(|(u, ..), _| u != uid);
    }
}

/// The Event of `report`, as kubelet reports it (source `kubelet`-like: kvol on `node`), named
/// `<pod>.<unique suffix>`.
pub fn event_object(report: &PodEventReport, node: &str, now: Time) -> Event {
    let suffix = format!("{:x}", now.0.as_nanosecond());
    let body = json!({
        "metadata": {"name": format!("{}.{suffix}", report.name), "namespace": report.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": report.name,
                           "namespace": report.namespace, "uid": report.uid},
        "reason": report.reason, "message": report.message, "type": report.kind, "count": 1,
        "source": {"component": "kvol", "host": node},
        "reportingComponent": "kvol", "reportingInstance": node,
    });
    let mut event: Event = serde_json::from_value(body).unwrap_or_default();
    if !report.field_path.is_empty() {
        event.involved_object.field_path = Some(report.field_path.clone());
    }
    event.first_timestamp = Some(now.clone());
    event.last_timestamp = Some(now);
    event
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
