//! Each pod's created → Ready, as a watch on the pods sees it (first seen, first seen Ready, on this machine's clock) and as the API's times say (creationTimestamp to the Ready condition's lastTransitionTime, whole seconds).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio_stream::StreamExt;

/// When each pod (by name) was first seen, and first seen Ready.
#[derive(Default)]
pub struct Timings {
    seen: HashMap<String, Instant>,
    ready: HashMap<String, Instant>,
}

impl Timings {
    pub fn ready_count(&self) -> usize {
        self.ready.len()
    }

    /// Each Ready pod's first seen → first seen Ready, sorted.
    pub fn latencies(&self) -> Vec<Duration> {
        let mut all: Vec<Duration> = self
            .ready
            .iter()
            .filter_map(|(name, at)| Some(at.duration_since(*self.seen.get(name)?)))
            .collect();
        all.sort();
        all
    }

    fn record(&mut self, pod: &Pod) {
        let Some(name) = pod.metadata.name.clone() else { return };
        let now = Instant::now();
        self.seen.entry(name.clone()).or_insert(now);
        if is_ready(pod) {
            self.ready.entry(name).or_insert(now);
        }
    }
}

fn is_ready(pod: &Pod) -> bool {
    ready_condition(pod).is_some_and(|c| c.status == "True")
}

fn ready_condition(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodCondition> {
    pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "Ready")
}

/// Watches the pods `selector` selects from now on, recording into the timings it returns;
/// the watch ends with the task (abort it).
pub async fn watch(pods: Api<Pod>, selector: &str) -> (Arc<Mutex<Timings>>, tokio::task::JoinHandle<()>) {
    let listed = pods.list(&ListParams::default().labels(selector)).await.expect("the pods listed");
    let version = listed.metadata.resource_version.unwrap_or_else(|| "0".into());
    let timings = Arc::new(Mutex::new(Timings::default()));
    let task = tokio::spawn(follow(pods, selector.to_string(), version, timings.clone()));
    (timings, task)
}

/// The watch itself, started again from the last version seen when the server ends it.
async fn follow(pods: Api<Pod>, selector: String, mut version: String, timings: Arc<Mutex<Timings>>) {
    loop {
        let params = WatchParams::default().labels(&selector).timeout(290);
        let Ok(stream) = pods.watch(&params, &version).await else {
            tokio::time::sleep(Duration::from_millis(100)).await;
            continue;
        };
        let mut stream = std::pin::pin!(stream);
        while let Some(Ok(event)) = stream.next().await {
            match event {
                WatchEvent::Added(pod) | WatchEvent::Modified(pod) => {
                    version = pod.metadata.resource_version.clone().unwrap_or(version);
                    timings.lock().unwrap().record(&pod);
                }
                WatchEvent::Bookmark(mark) => version = mark.metadata.resource_version,
                WatchEvent::Deleted(_) => {}
                WatchEvent::Error(e) => panic!("the watch on pods {selector} failed: {e:?}"),
            }
        }
    }
}

/// Each pod's creationTimestamp → its Ready condition's lastTransitionTime, as the API has
/// them (whole seconds), sorted.
pub fn api_latencies(pods: &[Pod]) -> Vec<Duration> {
    let mut all: Vec<Duration> = pods
        .iter()
        .filter(|p| is_ready(p))
        .filter_map(|p| {
            let created = p.metadata.creation_timestamp.as_ref()?.0;
            let ready = ready_condition(p)?.last_transition_time.as_ref()?.0;
            let seconds = ready.duration_since(created).as_secs();
            Some(Duration::from_secs(seconds.max(0) as u64))
        })
        .collect();
    all.sort();
    all
}

/// The `q` quantile (0 ≤ q ≤ 1) of sorted durations, nearest rank.
pub fn quantile(sorted: &[Duration], q: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}
