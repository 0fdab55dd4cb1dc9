//! Rooms beside the loop: the parts that run tasks of their own (the metrics server, the volume stats collector, the runtime API), each started with only what it needs and stopped with the agent through one small door.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kvol_plugin::PluginRegistry;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::report::metrics::Metrics;
use crate::report::volume_stats::ClaimedVolume;
use crate::runtime::runner_pods::RunnerPods;
use crate::runtime::view::RuntimeView;

/// How long a stopping room's tasks may take before they are cut off (a runner's open stream
/// must not hold the agent's shutdown).
const STOP_WAIT: Duration = Duration::from_secs(5);

/// A part of the agent that runs beside the loop and stops with it.
pub trait Room: Send {
    /// Its name, for the log.
    fn name(&self) -> &'static str;
    /// Stops its tasks and waits for them (at most [`STOP_WAIT`] for a task room).
    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>>;
}

/// A room that is one task, told to stop through a watch.
#[derive(Debug)]
pub struct TaskRoom {
    name: &'static str,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl TaskRoom {
    /// Spawns `run`, which gets a future that completes when the room is stopped.
    pub fn spawn<F, Fut>(name: &'static str, run: F) -> TaskRoom
    where
        F: FnOnce(Pin<Box<dyn Future<Output = ()> + Send>>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, mut stopped) = watch::channel(false);
        let stopping = Box::pin(async move {
            let _ = stopped.wait_for(|s| *s).await;
        });
        TaskRoom { name, stop, task: tokio::spawn(run(stopping)) }
    }
}

impl Room for TaskRoom {
    fn name(&self) -> &'static str {
        self.name
    }

    fn stop(self: Box<Self>) -> Pin<Box<dyn Future<Output = ()> + Send>> {
        Box::pin(async move {
            let TaskRoom { name, stop, mut task } = *self;
            let _ = stop.send(true);
            if tokio::time::timeout(STOP_WAIT, &mut task).await.is_err() {
                tracing::warn!(
                    room = name,
                    waited_s = STOP_WAIT.as_secs(),
                    "a room did not stop in time; cut off"
                );
                task.abort();
            }
        })
    }
}

/// The rooms the agent started, stopped together in the reverse order.
#[derive(Default)]
pub struct Rooms {
    rooms: Vec<Box<dyn Room>>,
}

impl std::fmt::Debug for Rooms {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.rooms.iter().map(|r| r.name())).finish()
    }
}

impl Rooms {
    pub fn add(&mut self, room: impl Room + 'static) {
        self.rooms.push(Box::new(room));
    }

    pub async fn stop_all(self) {
        for room in self.rooms.into_iter().rev() {
            room.stop().await;
        }
    }
}

/// Serves `/metrics` on `address`; the address bound (port 0 picks one).
pub async fn metrics_server(
    address: std::net::SocketAddr,
    metrics: Arc<Metrics>,
) -> Result<(TaskRoom, String), String> {
    let listener = tokio::net::TcpListener::bind(address)
        .await
        .map_err(|e| format!("cannot listen for metrics on {address}: {e}"))?;
    let bound = listener.local_addr().map_err(|e| e.to_string())?;
    let room = TaskRoom::spawn("metrics", move |stopped| async move {
        let _ = crate::report::metrics::serve_metrics(listener, metrics, stopped).await;
    });
    tracing::info!(address = %bound, "serving metrics");
    Ok((room, bound.to_string()))
}

/// Measures the claims' published volumes every `period` for the metrics; the loop says which
/// they are through the sender.
pub fn stats_collector(
    period: Duration,
    registry: Arc<PluginRegistry>,
    metrics: Arc<Metrics>,
) -> (TaskRoom, watch::Sender<Arc<Vec<ClaimedVolume>>>) {
    let (sender, receiver) = watch::channel(Arc::new(Vec::new()));
    let room = TaskRoom::spawn("volume stats", move |stopped| async move {
        let (stop_tx, stop_rx) = watch::channel(false);
        let collector =
            crate::report::volume_stats::run_collector(period, receiver, registry, metrics, stop_rx);
        tokio::select! {
            _ = collector => {}
            _ = stopped => { let _ = stop_tx.send(true); }
        }
    });
    (room, sender)
}

/// Serves the runtime API on `socket` from the views the loop publishes; bound before the
/// loop starts, so a runner can connect once the agent is up.
pub fn runtime_api(
    socket: &std::path::Path,
    views: watch::Receiver<Arc<RuntimeView>>,
    runner: Arc<RunnerPods>,
    pods_dir: std::path::PathBuf,
) -> Result<TaskRoom, String> {
    let service = crate::runtime::server::RuntimeService::new(views, runner, pods_dir);
    let serving = crate::runtime::server::bind(socket)?;
    let socket = socket.to_path_buf();
    Ok(TaskRoom::spawn("runtime api", move |stopped| async move {
        if let Err(e) = crate::runtime::server::serve(serving, service, stopped).await {
            tracing::warn!(socket = %socket.display(), error = %e, "runtime api stopped");
        }
    }))
}
