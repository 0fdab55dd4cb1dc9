//! The pods' volume Events in the API: [`EventWriter`] turns the agent's failing pod volumes into core/v1 Events through the [`NodeEvents`] seam, one Event per failure with its count bumped on each retry ([`kvol_node::report::pod_events::EventBook`]).

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use kvol_node::report::pod_events::{EventBook, EventChange, PodEvent, PodEventSink, VolumeFailure};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// Writes Events: the API server in cluster mode, memory in tests.
#[async_trait]
pub trait NodeEvents: Send + Sync + std::fmt::Debug {
    /// Creates `event`; `Ok(false)` when one of its name exists already.
    async fn create(&self, event: Event) -> Result<bool, String>;
    /// Merge-patches the Event `namespace/name` with `patch` (count, lastTimestamp).
    async fn patch(&self, namespace: &str, name: &str, patch: Value) -> Result<(), String>;
}

/// The Event object for `event`, reported by kvol on `node`.
pub fn event_object(event: &PodEvent, node: &str, now: Time) -> Event {
    let body = json!({
        "metadata": {"name": event_name(event), "namespace": event.namespace},
        "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": event.pod_name,
                           "namespace": event.namespace, "uid": event.pod_uid},
        "reason": event.reason,
        "message": event.message,
        "type": "Warning",
        "count": event.count,
        "source": {"component": "kvol", "host": node},
        "reportingComponent": "kvol",
        "reportingInstance": node,
    });
    let mut object: Event = serde_json::from_value(body).unwrap_or_default();
    object.first_timestamp = Some(now.clone());
    object.last_timestamp = Some(now);
    object
}

/// `<pod>.<key>`, as kubelet's Events are `<pod>.<unique suffix>`.
pub fn event_name(event: &PodEvent) -> String {
    format!("{}.{}", event.pod_name, event.key)
}

/// A [`PodEventSink`] that decides on the caller's thread (no I/O) and writes in a task;
/// a failed write is logged and dropped, as kubelet's recorder drops what it cannot send.
#[derive(Debug)]
pub struct EventWriter {
    book: Mutex<EventBook>,
    tx: mpsc::UnboundedSender<EventChange>,
}

impl EventWriter {
    pub fn start(node: String, events: Arc<dyn NodeEvents>) -> EventWriter {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_loop(node, events, rx));
        EventWriter { book: Mutex::default(), tx }
    }
}

impl PodEventSink for EventWriter {
    fn report(&self, failures: &[VolumeFailure]) {
        let changes = self.book.lock().unwrap_or_else(|p| p.into_inner()).changes(failures);
        for change in changes {
            let _ = self.tx.send(change);
        }
    }
}

async fn write_loop(node: String, events: Arc<dyn NodeEvents>, mut rx: mpsc::UnboundedReceiver<EventChange>) {
    while let Some(change) = rx.recv().await {
        if let Err(e) = write(&node, events.as_ref(), &change).await {
            tracing::warn!(error = %e, "cannot write a pod event; dropped");
        }
    }
}

async fn write(node: &str, events: &dyn NodeEvents, change: &EventChange) -> Result<(), String> {
    let now = Time(k8s_openapi::jiff::Timestamp::now());
    let (event, create) = match change {
        EventChange::Create(event) => (event, true),
        EventChange::Bump { event } => (event, false),
    };
    // An Event of the same name left by an earlier run of the agent is bumped instead.
    if create && events.create(event_object(event, node, now.clone())).await? {
        return Ok(());
    }
    let patch = json!({"count": event.count, "lastTimestamp": now});
    events.patch(&event.namespace, &event_name(event), patch).await
}

/// [`NodeEvents`] on the API server.
#[derive(Clone)]
pub struct ApiNodeEvents {
    client: Client,
}

impl std::fmt::Debug for ApiNodeEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiNodeEvents").finish_non_exhaustive()
    }
}

impl ApiNodeEvents {
    pub fn new(client: Client) -> ApiNodeEvents {
        ApiNodeEvents { client }
    }
}

#[async_trait]
impl NodeEvents for ApiNodeEvents {
    async fn create(&self, event: Event) -> Result<bool, String> {
        let namespace = event.metadata.namespace.clone().unwrap_or_default();
        let api: Api<Event> = Api::namespaced(self.client.clone(), &namespace);
        match api.create(&PostParams::default(), &event).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(e) => Err(format!(
                "cannot create event {namespace}/{}: {e}",
                event.metadata.name.as_deref().unwrap_or_default()
            )),
        }
    }

    async fn patch(&self, namespace: &str, name: &str, patch: Value) -> Result<(), String> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), namespace);
        api.patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| format!("cannot update event {namespace}/{name}: {e}"))
    }
}

/// [`NodeEvents`] in memory, for tests: the Events by `namespace/name`.
#[derive(Debug, Default, Clone)]
pub struct MemoryNodeEvents {
    pub events: Arc<Mutex<std::collections::BTreeMap<String, Event>>>,
}

#[async_trait]
impl NodeEvents for MemoryNodeEvents {
    async fn create(&self, event: Event) -> Result<bool, String> {
        let key = format!(
            "{}/{}",
            event.metadata.namespace.as_deref().unwrap_or_default(),
            event.metadata.name.as_deref().unwrap_or_default()
        );
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        if events.contains_key(&key) {
            return Ok(false);
        }
        events.insert(key, event);
        Ok(true)
    }

    async fn patch(&self, namespace: &str, name: &str, patch: Value) -> Result<(), String> {
        let mut events = self.events.lock().unwrap_or_else(|p| p.into_inner());
        let event = events
            .get_mut(&format!("{namespace}/{name}"))
            .ok_or_else(|| format!("event {namespace}/{name} does not exist"))?;
        event.count = patch["count"].as_i64().map(|c| c as i32);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn failure(count: u32) -> VolumeFailure {
        VolumeFailure {
            pod: "shop/web".into(),
            pod_uid: "u1".into(),
            volume: "data".into(),
            operation: "volume_mount",
            block: false,
            count,
            error: "exit status 32".into(),
        }
    }

    async fn settle() {
        for _ in 0..20 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn retries_of_one_failure_make_one_event_whose_count_grows() {
        let events = MemoryNodeEvents::default();
        let writer = EventWriter::start("n1".into(), Arc::new(events.clone()));
        for count in [1, 1, 1, 2, 2, 3] {
            writer.report(&[failure(count)]);
            settle().await;
        }
        let all = events.events.lock().unwrap().clone();
        assert_eq!(all.len(), 1, "{all:?}");
        let event = all.values().next().unwrap();
        assert_eq!(event.count, Some(3));
        assert_eq!(event.reason.as_deref(), Some("FailedMount"));
        assert_eq!(
            event.message.as_deref(),
            Some("MountVolume.SetUp failed for volume \"data\" : exit status 32")
        );
        assert_eq!(event.involved_object.uid.as_deref(), Some("u1"));
        assert_eq!(event.source.as_ref().and_then(|s| s.host.as_deref()), Some("n1"));
        // A restarted agent finds its Event and bumps it rather than failing.
        let again = EventWriter::start("n1".into(), Arc::new(events.clone()));
        again.report(&[failure(4)]);
        settle().await;
        assert_eq!(events.events.lock().unwrap().values().next().unwrap().count, Some(4));
    }
}
