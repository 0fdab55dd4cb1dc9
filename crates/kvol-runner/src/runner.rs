//! The runner's loop: looks at the runtime (every second, or at once after a change), gives each pod's worker the pod and what the runtime has of it, starts workers for new pods and for the runtime's pods no longer wanted, and keeps every pod's status.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kvol_api::ObjectSet;
use kvol_api::projection::NodeResources;
use kvol_cri::{CriClient, Deadlines};
use tokio::sync::{Notify, watch};

use crate::cri_view::Viewer;
use crate::sandbox::SandboxContext;
use crate::shared::{Shared, Volumes};
use crate::status::PodView;
use crate::worker::{Input, Worker};

/// How the runner is set up.
#[derive(Clone, Debug)]
pub struct RunnerConfig {
    /// The runtime's CRI endpoint (`unix:///run/containerd/containerd.sock`).
    pub endpoint: String,
    /// kvol's runtime API socket.
    pub runtime_socket: PathBuf,
    /// The runner's own files (termination message files).
    pub state_dir: PathBuf,
    /// Where pods' log directories go (`/var/log/pods`).
    pub log_root: PathBuf,
    pub node_name: String,
    /// The node's address (a host-network pod's IP).
    pub host_ip: String,
    /// The host's resolv.conf, read once at start.
    pub resolv_conf: PathBuf,
    pub node: NodeResources,
    /// The node's labels, for its pods' node affinity.
    pub node_labels: BTreeMap<String, String>,
    /// How many pods the node takes (kubelet's `--max-pods`).
    pub max_pods: u32,
    /// The node's taints as its Node has them (kept current in cluster mode, where kvol keeps
    /// the Node; none standalone): a pod not tolerating a NoExecute one is rejected.
    pub node_taints: watch::Receiver<Vec<k8s_openapi::api::core::v1::Taint>>,
    /// How often the runtime is looked at when nothing happens.
    pub poll: Duration,
}

/// Errors that stop the runner before it runs.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("container runtime: {0}")]
    Cri(#[from] kvol_cri::CriError),
    #[error("runtime api socket {socket}: {reason}")]
    RuntimeApi { socket: String, reason: String },
}

/// The runner, made; [`Runner::run`] runs it.
#[derive(Debug)]
pub struct Runner {
    shared: Arc<Shared>,
    poll: Duration,
}

impl Runner {
    /// Checks nothing yet: the runtime and the runtime API are dialled when first used.
    pub fn new(config: RunnerConfig) -> Result<Runner, RunnerError> {
        let cri = CriClient::new(&config.endpoint, Deadlines::default())?;
        let socket = config.runtime_socket.display().to_string();
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{socket}"))
            .map_err(|e| RunnerError::RuntimeApi { socket: socket.clone(), reason: e.to_string() })?
            .connect_lazy();
        let host_resolv_conf = std::fs::read_to_string(&config.resolv_conf).unwrap_or_default();
        let shared = Shared {
            cri,
            volumes: Volumes::new(channel),
            sandbox_context: SandboxContext {
                log_root: config.log_root.clone(),
                host_resolv_conf,
                cluster_dns: Vec::new(),
                cluster_domain: "cluster.local".into(),
            },
            state_dir: config.state_dir.clone(),
            node_name: config.node_name.clone(),
            host_ip: config.host_ip.clone(),
            node: config.node,
            node_labels: config.node_labels.clone(),
            max_pods: config.max_pods,
            node_taints: config.node_taints.clone(),
            admitted: Mutex::new(BTreeMap::new()),
            status: watch::channel(Arc::new(BTreeMap::new())).0,
            relist: Notify::new(),
            looks: std::sync::atomic::AtomicU64::new(0),
            fresh_wanted: Mutex::new(BTreeMap::new()),
            finished: Mutex::new(Vec::new()),
            reports: std::sync::OnceLock::new(),
            runtime_name: std::sync::OnceLock::new(),
        };
        Ok(Runner { shared: Arc::new(shared), poll: config.poll })
    }

    /// Each pod's status as kubelet writes it to the API, as it changes, and each pod gone from
    /// the node; for cluster mode's writer. Asked once, before [`Runner::run`].
    pub fn reports(&self) -> tokio::sync::mpsc::UnboundedReceiver<kvol_api::pod::PodReport> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let _ = self.shared.reports.set(tx);
        rx
    }

    /// Every pod's status, by uid, updated as it changes.
    pub fn status(&self) -> watch::Receiver<Arc<BTreeMap<String, PodView>>> {
        self.shared.status.subscribe()
    }

    /// Runs the node's pods until `stop` turns true (containers are left running then: a
    /// restarted runner adopts them). The set's first value is not acted on: the runner starts
    /// at the first set published after it subscribed, so it never takes a not-yet-read source
    /// for "no pods" and stops what runs.
    pub async fn run(self, mut wanted: watch::Receiver<Arc<ObjectSet>>, mut stop: watch::Receiver<bool>) {
        tokio::select! {
            changed = wanted.changed() => if changed.is_err() { return },
            _ = stop.wait_for(|s| *s) => return,
        }
        let version = self.shared.cri.version(kvol_cri::VersionRequest { version: "v1".into() }).await;
        let _ =
            self.shared.runtime_name.set(version.map(|v| v.runtime_name).unwrap_or_else(|_| "cri".into()));
        let (status, file) = (self.shared.status.subscribe(), self.shared.state_dir.join(STATUS_FILE));
        tokio::spawn(write_status(status, file, self.shared.cri.endpoint().to_string()));
        let mut viewer = Viewer::default();
        let mut workers: BTreeMap<String, watch::Sender<Input>> = BTreeMap::new();
        // Pods being deleted whose workers finished: not started again while the API deletes.
        let mut finished = std::collections::BTreeSet::new();
        let mut runtime_failing = false;
        loop {
            let objects = Arc::clone(&wanted.borrow_and_update());
            let look = self.shared.looks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            match viewer.look(&self.shared.cri).await {
                Ok(view) => {
                    if runtime_failing {
                        tracing::info!(endpoint = %self.shared.cri.endpoint(), "container runtime answers again");
                    }
                    runtime_failing = false;
                    self.dispatch(&objects, view, look, &mut workers, &mut finished);
                }
                Err(e) => {
                    if !runtime_failing {
                        tracing::warn!(error = %e, "cannot read the container runtime's state");
                    }
                    runtime_failing = true;
                }
            }
            tokio::select! {
                changed = wanted.changed() => if changed.is_err() { return },
                _ = self.shared.relist.notified() => {}
                _ = tokio::time::sleep(self.poll) => {}
                _ = stop.wait_for(|s| *s) => return,
            }
        }
    }

    /// Gives every worker its input; starts workers for new pods and for the runtime's pods
    /// no longer wanted; drops workers that finished.
    fn dispatch(
        &self,
        objects: &Arc<ObjectSet>,
        mut view: crate::cri_view::RuntimeView,
        look: u64,
        workers: &mut BTreeMap<String, watch::Sender<Input>>,
        finished: &mut std::collections::BTreeSet<String>,
    ) {
        for uid in std::mem::take(&mut *self.shared.finished.lock().unwrap_or_else(|e| e.into_inner())) {
            // A finished worker whose pod came back (or is still seen) starts again below.
            workers.remove(&uid);
            finished.insert(uid);
        }
        let mut wanted: BTreeMap<String, Arc<Pod>> = BTreeMap::new();
        for pod in objects.pods.values().filter(|p| self.is_ours(p)) {
            wanted.insert(pod.metadata.uid.clone().unwrap_or_default(), Arc::clone(pod));
        }
        let mut uids: std::collections::BTreeSet<String> = wanted.keys().cloned().collect();
        uids.extend(view.pods.keys().cloned());
        uids.extend(workers.keys().cloned());
        // A pod being deleted that the runtime no longer has (its containers stopped by an
        // agent that died before deleting it) is finished once more, so its object goes.
        let deleting: std::collections::BTreeSet<String> = objects
            .pods
            .values()
            .filter(|p| self.is_ours_deleting(p))
            .filter_map(|p| p.metadata.uid.clone())
            .collect();
        finished.retain(|uid| deleting.contains(uid));
        uids.extend(deleting.into_iter().filter(|uid| !finished.contains(uid)));
        for uid in uids {
            let input = Input {
                pod: wanted.get(&uid).cloned(),
                seen: view.pods.remove(&uid).unwrap_or_default(),
                objects: Arc::clone(objects),
                grace: view.grace.get(&uid).copied(),
                look,
            };
            match workers.get(&uid) {
                Some(tx) => {
                    let forced = self.fresh_look_for(&uid, look);
                    // A worker is woken only by a change of its own (or the look it waits
                    // for); the look's number is kept fresh either way.
                    tx.send_if_modified(|current| {
                        let changed = forced || !input.same_as(current);
                        *current = input;
                        changed
                    });
                }
                None => {
                    let (tx, rx) = watch::channel(input);
                    let worker = Worker::new(uid.clone(), Arc::clone(&self.shared));
                    tokio::spawn(worker.run(rx));
                    workers.insert(uid, tx);
                }
            }
        }
    }

    /// Whether the worker of `uid` waits for a look at least as new as `look`.
    fn fresh_look_for(&self, uid: &str, look: u64) -> bool {
        let mut wanted = self.shared.fresh_wanted.lock().unwrap_or_else(|e| e.into_inner());
        match wanted.get(uid) {
            Some(from) if *from <= look => {
                wanted.remove(uid);
                true
            }
            _ => false,
        }
    }

    /// A pod of this node being deleted, with a uid.
    fn is_ours_deleting(&self, pod: &Pod) -> bool {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty())
            && pod.metadata.deletion_timestamp.is_some()
            && node.is_none_or(|n| n.is_empty() || n == self.shared.node_name)
    }

    /// A pod this node runs: bound here (or to no node, as a manifest's), not being deleted,
    /// with a uid.
    fn is_ours(&self, pod: &Pod) -> bool {
        let node = pod.spec.as_ref().and_then(|s| s.node_name.as_deref());
        pod.metadata.uid.as_deref().is_some_and(|u| !u.is_empty())
            && pod.metadata.deletion_timestamp.is_none()
            && node.is_none_or(|n| n.is_empty() || n == self.shared.node_name)
    }
}

/// The pods' status file under the runner's directory: `{"pods": [PodView…]}`, replaced whole
/// at every change.
pub const STATUS_FILE: &str = "pods.json";

/// The status as [`STATUS_FILE`] holds it.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StatusFile {
    pub pods: Vec<serde_json::Value>,
    /// The CRI endpoint the pods run on (`kvol pod exec` goes there).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
}

async fn write_status(
    mut status: watch::Receiver<Arc<BTreeMap<String, PodView>>>,
    file: PathBuf,
    endpoint: String,
) {
    loop {
        let pods: Vec<serde_json::Value> =
            status.borrow_and_update().values().filter_map(|v| serde_json::to_value(v).ok()).collect();
        let json =
            serde_json::to_vec_pretty(&StatusFile { pods, endpoint: endpoint.clone() }).unwrap_or_default();
        let temporary = file.with_extension("json.tmp");
        let written = async {
            if let Some(dir) = file.parent() {
                tokio::fs::create_dir_all(dir).await?;
            }
            tokio::fs::write(&temporary, &json).await?;
            tokio::fs::rename(&temporary, &file).await
        };
        if let Err(e) = written.await {
            tracing::warn!(file = %file.display(), error = %e, "cannot write the pods' status");
        }
        if status.changed().await.is_err() {
            return;
        }
    }
}
