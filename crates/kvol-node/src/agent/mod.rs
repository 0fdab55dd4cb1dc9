//! The agent: wires sources, plugins (compiled-in, Flexvolume, CSI), the journal, the reconciler and the executor into kvol's main loop.
//!
//! Start-up: open the journal, stop the Flexvolume driver calls a dead predecessor left
//! running, rebuild the actual state from the journal, the mount table and the pod volume
//! directories (clearing empty orphans); register the compiled-in plugins; install the example
//! Flexvolume drivers and start the prober; start the CSI registration watcher and (by default) the
//! bundled CSI driver; watch the manifests directory. Then loop: desired state from the
//! objects, a resolution per volume, a plan, operations submitted; again whenever the objects
//! change, an operation ends, a retry falls due or the resync timer fires. SIGTERM stops the
//! loop and lets running operations finish; nothing is unmounted (volumes outlive the agent).
//!
//! The rooms of the agent: [`start`] (start-up, in order), [`pass`] (the loop's steps) and
//! [`report`] (what it tells), and [`rooms`] for the parts that run beside the loop (the
//! metrics server, the stats collector, the runtime API) behind one `Room` door; `run` only
//! composes them.

mod pass;
mod report;
pub mod rooms;
mod start;
pub use start::measured_capacity;

use std::sync::Arc;
use std::time::{Duration, SystemTime};

use kvol_claims::ClaimsController;
use kvol_components_runtime::ComponentRuntime;
use tokio::sync::{Notify, watch};

use self::pass::{Loop, Outlets, Parts};
use self::rooms::Rooms;
use self::start::{CsiParts, NodeParts};
use crate::config::AgentConfig;
use crate::executor::Executor;
use crate::runtime::runner_pods::{RUNNER_PODS_DIR, RunnerPods};
use crate::runtime::view::RuntimeView;
use crate::sources::{ManifestsSource, ObjectSource};

/// Runs the agent on its manifests directory until `shutdown` completes.
pub async fn run_agent(
    config: AgentConfig,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    run(config, None, shutdown).await
}

/// Runs the agent on the objects `source` gives (`config.manifests_dir` is not read) until
/// `shutdown` completes: the seam a cluster source, or code embedding kvol, plugs into.
pub async fn run_agent_with_source(
    config: AgentConfig,
    source: Box<dyn ObjectSource>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    run(config, Some(source), shutdown).await
}

/// The rooms beside the loop, and what they hand the loop.
struct Beside {
    rooms: Rooms,
    outlets: Outlets,
}

/// Starts the rooms beside the loop that the config asks for.
async fn start_beside(
    config: &AgentConfig,
    node: &NodeParts,
    runner: &Arc<RunnerPods>,
) -> Result<Beside, String> {
    let mut rooms = Rooms::default();
    let metrics_address = match config.metrics_address {
        Some(address) => {
            let (room, bound) = rooms::metrics_server(address, node.metrics.clone()).await?;
            rooms.add(room);
            Some(bound)
        }
        None => None,
    };
    let stats_volumes = (!config.volume_stats_period.is_zero()).then(|| {
        let (room, sender) = rooms::stats_collector(
            config.volume_stats_period,
            Arc::clone(&node.registry),
            node.metrics.clone(),
        );
        rooms.add(room);
        sender
    });
    let (runtime_view, views) = watch::channel(Arc::new(RuntimeView::default()));
    if let Some(socket) = &config.runtime_socket {
        rooms.add(rooms::runtime_api(socket, views, Arc::clone(runner), config.root_dir.join("pods"))?);
    }
    Ok(Beside { rooms, outlets: Outlets { metrics_address, stats_volumes, runtime_view } })
}

/// The objects' source: the one given, else the manifests directory (its last clean texts
/// kept in the journal).
fn source_of(
    config: &AgentConfig,
    given: Option<Box<dyn ObjectSource>>,
    node: &NodeParts,
) -> Result<Box<dyn ObjectSource>, String> {
    if let Some(source) = given {
        return Ok(source);
    }
    let memory: Arc<dyn crate::sources::ManifestMemory> = node.store.clone();
    let source = ManifestsSource::start_with_memory(config.manifests_dir.clone(), Some(memory));
    Ok(Box::new(source.map_err(|e| e.to_string())?))
}

/// The pods a runner handed over the runtime API, as kept under the state directory.
fn runner_pods(config: &AgentConfig) -> Result<Arc<RunnerPods>, String> {
    let (runner, problems) = RunnerPods::open(&config.state_dir.join(RUNNER_PODS_DIR))?;
    for problem in &problems {
        tracing::warn!(%problem, "runner pod not restored");
    }
    Ok(Arc::new(runner))
}

async fn run(
    config: AgentConfig,
    source: Option<Box<dyn ObjectSource>>,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> Result<(), String> {
    let started = SystemTime::now();
    let config = start::prepare_dirs(config)?;
    let mut node = NodeParts::open(&config).await?;
    let csi = CsiParts::start(&config, &node)?;
    let supervision = kvol_components_runtime::supervisor::SupervisorSettings {
        backoff: kvol_api::Backoff { max: config.component_restart_backoff_max, ..Default::default() },
        ..Default::default()
    };
    let mut components =
        ComponentRuntime::start(config.components.clone(), config.config_file.as_deref(), supervision)
            .await?;
    let source = source_of(&config, source, &node)?;
    if let Some(tap) = config.objects_tap.clone() {
        crate::sources::forward(source.subscribe(), tap);
    }
    let runner = runner_pods(&config)?;
    let Beside { rooms, outlets } = start_beside(&config, &node, &runner).await?;
    let wake = Arc::new(Notify::new());
    let executor = Executor::new(
        node.host.clone(),
        Arc::clone(&node.registry),
        Arc::clone(&node.store),
        node.metrics.clone(),
        std::mem::take(&mut node.actual),
        Arc::clone(&wake),
    );
    // The standalone control plane; in a cluster, the cluster's controllers do its jobs.
    let claims = config.provision_claims.then(|| {
        ClaimsController::start(&config.state_dir, &config.node_name, &config.gates, Arc::clone(&wake))
    });
    let orphans_left = std::mem::take(&mut node.orphans_left);
    let parts = Parts {
        config: &config,
        node: &node,
        csi: &csi,
        source: source.as_ref(),
        claims: claims.as_ref(),
        executor: &executor,
        runner: &runner,
    };
    let agent = Loop::new(parts, &components, outlets, orphans_left, started);
    drive(agent, shutdown, source.as_ref(), &runner, &mut components, &wake).await;

    tracing::info!("shutting down: volumes stay mounted");
    let still_running = executor.close(Duration::from_secs(30)).await;
    if still_running > 0 {
        tracing::warn!(
            still_running,
            "operations still running at shutdown; the journal finishes them on restart"
        );
    }
    rooms.stop_all().await;
    components.stop_all().await;
    csi.watcher.shutdown().await;
    node.prober.shutdown().await;
    source.shutdown();
    Ok(())
}

/// Runs passes until `shutdown`: again whenever the objects or the runner's pods change, a
/// component changes, an operation ends (`wake`), a retry or a deferred status falls due, or
/// the loop's nap ends (plugin changes are polled: the registry has no notification).
async fn drive(
    mut agent: Loop<'_>,
    shutdown: impl std::future::Future<Output = ()> + Send,
    source: &dyn ObjectSource,
    runner: &RunnerPods,
    components: &mut ComponentRuntime,
    wake: &Notify,
) {
    let mut shutdown = std::pin::pin!(shutdown);
    let mut objects_rx = source.subscribe();
    let mut runner_rx = runner.subscribe();
    loop {
        let took = agent.pass();
        let rest = pass::pacing(took, !agent.executor.is_idle());
        if !rest.is_zero() {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = tokio::time::sleep(rest) => {}
            }
        }
        tokio::select! {
            _ = &mut shutdown => break,
            changed = objects_rx.changed() => { if changed.is_err() { break; } }
            _ = runner_rx.changed() => {}
            change = components.next_change() => {
                components.apply(change).await;
                agent.snapshots_on = components.snapshots_on();
                agent.component_problems = components.problems();
            }
            _ = wake.notified() => {}
            _ = tokio::time::sleep(agent.nap()) => {}
        }
    }
}
