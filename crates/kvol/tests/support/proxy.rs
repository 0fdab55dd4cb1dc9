//! A misbehaving CSI driver for tests: a gRPC proxy in front of a real driver that, for NodeStageVolume and NodePublishVolume, lets the real driver do the work and then answers normally, answers `UNAVAILABLE`, or never answers; it keeps the driver's own books of what is staged and published; or, told a [`Fault`], is a driver with that one bug.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::controller_server::{Controller, ControllerServer};
use kvol_csi::proto::csi::identity_client::IdentityClient;
use kvol_csi::proto::csi::identity_server::{Identity, IdentityServer};
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::node_server::{Node, NodeServer};
use kvol_csi::proto::csi::*;
use kvol_csi::proto::registration::registration_server::RegistrationServer;
use kvol_hostpath::registrar::{RegistrarService, plugin_info};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::{Channel, Endpoint, Server};
use tonic::{Request, Response, Status};

/// What the proxy does with a NodeStageVolume or NodePublishVolume call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behaviour {
    /// Forward the call and return the driver's answer.
    Answer,
    /// Forward the call; when the driver did the work, answer `UNAVAILABLE` all the same.
    UnavailableAfterWork,
    /// Forward the call; when the driver did the work, never answer (the caller's deadline, or
    /// its death, ends the call).
    HangAfterWork,
}

/// One bug the proxy gives the driver behind it (`kvol test-driver`'s broken drivers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(dead_code)] // not every test that shares this module uses it
pub enum Fault {
    /// NodePublishVolume's `readonly` is dropped: the volume is published writable.
    IgnoreReadonly,
    /// NodeUnstageVolume first deletes everything in the staged volume.
    LoseDataOnUnstage,
    /// NodeGetVolumeStats says nothing is used and everything is available.
    LyingStats,
    /// NodePublishVolume (and NodeUnpublishVolume) use `<target_path>-elsewhere`.
    WrongPath,
}

/// The path a [`Fault::WrongPath`] driver mounts at instead of `target`.
fn elsewhere(target: &str) -> String {
    format!("{target}-elsewhere")
}

/// Deletes what a directory holds (a staged volume's data), leaving the directory.
fn empty_dir(dir: &Path) {
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        let _ = if path.is_dir() && !path.is_symlink() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        };
    }
}

/// The driver's books as the proxy saw the real driver's successful answers.
#[derive(Debug, Default, Clone)]
pub struct Ledger {
    pub publishes: u64,
    pub unpublishes: u64,
    pub stages: u64,
    pub unstages: u64,
    /// Successful NodePublishVolume calls for a target already published (idempotent repeats).
    pub republishes: u64,
    pub unavailable_injected: u64,
    pub hangs_injected: u64,
    /// (volume id, target) the driver has published and not yet unpublished.
    pub published: BTreeSet<(String, PathBuf)>,
    /// (volume id, staging path) the driver has staged and not yet unstaged.
    pub staged: BTreeSet<(String, PathBuf)>,
}

impl Ledger {
    /// Whether every publish was matched by an unpublish and every stage by an unstage.
    pub fn balanced(&self) -> bool {
        self.published.is_empty() && self.staged.is_empty()
    }
}

/// The proxy's shared state: the backend channel, the schedule and the books.
struct Shared {
    backend: Channel,
    /// While true every call is answered normally.
    calm: AtomicBool,
    /// Answer, unavailable and hang weights, out of their sum.
    weights: [u32; 3],
    rng: Mutex<fastrand::Rng>,
    ledger: Mutex<Ledger>,
    hanging: AtomicUsize,
    fault: Mutex<Option<Fault>>,
}

impl Shared {
    fn has(&self, fault: Fault) -> bool {
        *self.fault.lock().unwrap() == Some(fault)
    }

    fn behaviour(&self) -> Behaviour {
        if self.calm.load(Ordering::SeqCst) {
            return Behaviour::Answer;
        }
        let total: u32 = self.weights.iter().sum();
        let draw = self.rng.lock().unwrap().u32(0..total.max(1));
        if draw < self.weights[0] {
            Behaviour::Answer
        } else if draw < self.weights[0] + self.weights[1] {
            Behaviour::UnavailableAfterWork
        } else {
            Behaviour::HangAfterWork
        }
    }

    /// Applies `behaviour` to the driver's successful answer.
    async fn misbehave<T>(&self, behaviour: Behaviour, answer: Response<T>) -> Result<Response<T>, Status> {
        match behaviour {
            Behaviour::Answer => Ok(answer),
            Behaviour::UnavailableAfterWork => {
                self.ledger.lock().unwrap().unavailable_injected += 1;
                Err(Status::unavailable("test proxy: the work is done but the answer is lost"))
            }
            Behaviour::HangAfterWork => {
                self.ledger.lock().unwrap().hangs_injected += 1;
                let _hanging = Hanging::new(&self.hanging);
                std::future::pending::<()>().await;
                unreachable!("a pending future never completes")
            }
        }
    }
}

/// Counts a call that never answers while it is held (the server drops it when the caller goes).
struct Hanging<'a>(&'a AtomicUsize);

impl<'a> Hanging<'a> {
    fn new(count: &'a AtomicUsize) -> Hanging<'a> {
        count.fetch_add(1, Ordering::SeqCst);
        Hanging(count)
    }
}

impl Drop for Hanging<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Clone)]
struct Proxy(Arc<Shared>);

impl Proxy {
    /// Makes the call `call` on the backend in a task of its own, so it runs to its end (and is
    /// booked by `book` when it succeeded) even when the caller goes away meanwhile: a driver
    /// finishes the work of a call whose caller died.
    async fn book<T, F, Fut>(
        &self,
        call: F,
        book: impl FnOnce(&mut Ledger) + Send + 'static,
    ) -> Result<Response<T>, Status>
    where
        T: Send + 'static,
        F: FnOnce(NodeClient<Channel>) -> Fut,
        Fut: std::future::Future<Output = Result<Response<T>, Status>> + Send + 'static,
    {
        let shared = Arc::clone(&self.0);
        let work = call(NodeClient::new(self.0.backend.clone()));
        tokio::spawn(async move {
            let answer = work.await;
            if answer.is_ok() {
                book(&mut shared.ledger.lock().unwrap());
            }
            answer
        })
        .await
        .map_err(|e| Status::internal(format!("test proxy: the forwarded call failed: {e}")))?
    }
}

/// An impl of a CSI service for [`Proxy`] forwarding the listed methods to the backend, with
/// the methods given as `extra` written out.
macro_rules! forwarding {
    ($service:ident, $client:ident, [$($method:ident: $req:ty => $resp:ty),* $(,)?], { $($extra:tt)* }) => {
        #[tonic::async_trait]
        impl $service for Proxy {
            $(
                async fn $method(&self, request: Request<$req>) -> Result<Response<$resp>, Status> {
                    $client::new(self.0.backend.clone()).$method(request.into_inner()).await
                }
            )*
            $($extra)*
        }
    };
}

forwarding!(Identity, IdentityClient, [
    get_plugin_info: GetPluginInfoRequest => GetPluginInfoResponse,
    get_plugin_capabilities: GetPluginCapabilitiesRequest => GetPluginCapabilitiesResponse,
    probe: ProbeRequest => ProbeResponse,
], {});

forwarding!(Controller, ControllerClient, [
        create_volume: CreateVolumeRequest => CreateVolumeResponse,
        delete_volume: DeleteVolumeRequest => DeleteVolumeResponse,
        controller_publish_volume: ControllerPublishVolumeRequest => ControllerPublishVolumeResponse,
        controller_unpublish_volume: ControllerUnpublishVolumeRequest => ControllerUnpublishVolumeResponse,
        validate_volume_capabilities: ValidateVolumeCapabilitiesRequest => ValidateVolumeCapabilitiesResponse,
        list_volumes: ListVolumesRequest => ListVolumesResponse,
        get_capacity: GetCapacityRequest => GetCapacityResponse,
        controller_get_capabilities: ControllerGetCapabilitiesRequest => ControllerGetCapabilitiesResponse,
        create_snapshot: CreateSnapshotRequest => CreateSnapshotResponse,
        delete_snapshot: DeleteSnapshotRequest => DeleteSnapshotResponse,
        list_snapshots: ListSnapshotsRequest => ListSnapshotsResponse,
    controller_expand_volume: ControllerExpandVolumeRequest => ControllerExpandVolumeResponse,
    controller_modify_volume: ControllerModifyVolumeRequest => ControllerModifyVolumeResponse,
], {});

forwarding!(Node, NodeClient, [
    node_expand_volume: NodeExpandVolumeRequest => NodeExpandVolumeResponse,
    node_get_capabilities: NodeGetCapabilitiesRequest => NodeGetCapabilitiesResponse,
    node_get_info: NodeGetInfoRequest => NodeGetInfoResponse,
], {
    async fn node_get_volume_stats(
        &self,
        request: Request<NodeGetVolumeStatsRequest>,
    ) -> Result<Response<NodeGetVolumeStatsResponse>, Status> {
        let mut answer = NodeClient::new(self.0.backend.clone()).node_get_volume_stats(request.into_inner()).await?;
        if self.0.has(Fault::LyingStats) {
            for usage in &mut answer.get_mut().usage {
                usage.available = usage.total;
                usage.used = 0;
            }
        }
        Ok(answer)
    }

    async fn node_stage_volume(
        &self,
        request: Request<NodeStageVolumeRequest>,
    ) -> Result<Response<NodeStageVolumeResponse>, Status> {
        let request = request.into_inner();
        let key = (request.volume_id.clone(), PathBuf::from(&request.staging_target_path));
        let behaviour = self.0.behaviour();
        let answer = self
            .book(move |mut node| async move { node.node_stage_volume(request).await }, move |ledger| {
                ledger.stages += 1;
                ledger.staged.insert(key);
            })
            .await?;
        self.0.misbehave(behaviour, answer).await
    }

    async fn node_unstage_volume(
        &self,
        request: Request<NodeUnstageVolumeRequest>,
    ) -> Result<Response<NodeUnstageVolumeResponse>, Status> {
        let request = request.into_inner();
        if self.0.has(Fault::LoseDataOnUnstage) {
            empty_dir(Path::new(&request.staging_target_path));
        }
        let key = (request.volume_id.clone(), PathBuf::from(&request.staging_target_path));
        self.book(move |mut node| async move { node.node_unstage_volume(request).await }, move |ledger| {
            ledger.unstages += 1;
            ledger.staged.remove(&key);
        })
        .await
    }

    async fn node_publish_volume(
        &self,
        request: Request<NodePublishVolumeRequest>,
    ) -> Result<Response<NodePublishVolumeResponse>, Status> {
        let mut request = request.into_inner();
        if self.0.has(Fault::IgnoreReadonly) {
            request.readonly = false;
        }
        if self.0.has(Fault::WrongPath) {
            request.target_path = elsewhere(&request.target_path);
        }
        let key = (request.volume_id.clone(), PathBuf::from(&request.target_path));
        let behaviour = self.0.behaviour();
        let answer = self
            .book(move |mut node| async move { node.node_publish_volume(request).await }, move |ledger| {
                ledger.publishes += 1;
                if !ledger.published.insert(key) {
                    ledger.republishes += 1;
                }
            })
            .await?;
        self.0.misbehave(behaviour, answer).await
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<NodeUnpublishVolumeRequest>,
    ) -> Result<Response<NodeUnpublishVolumeResponse>, Status> {
        let mut request = request.into_inner();
        if self.0.has(Fault::WrongPath) {
            request.target_path = elsewhere(&request.target_path);
        }
        let key = (request.volume_id.clone(), PathBuf::from(&request.target_path));
        self.book(move |mut node| async move { node.node_unpublish_volume(request).await }, move |ledger| {
            ledger.unpublishes += 1;
            ledger.published.remove(&key);
        })
        .await
    }
});

/// A running proxy on its own runtime; dropping it stops it.
pub struct ChaosDriver {
    shared: Arc<Shared>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// How a [`ChaosDriver`] is set up.
pub struct ChaosConfig<'a> {
    /// The driver name it registers under (the backend's GetPluginInfo should say the same).
    pub name: &'a str,
    /// Where it serves CSI.
    pub socket: &'a Path,
    /// The real driver's CSI socket.
    pub backend: &'a Path,
    /// Where to serve `<name>-reg.sock` (the plugin-registration protocol); `None`: not at all.
    pub registration_dir: Option<&'a Path>,
    /// Answer, unavailable-after-work and hang-after-work weights.
    pub weights: [u32; 3],
    pub seed: u64,
}

impl ChaosDriver {
    /// Starts the proxy (and its registration socket) on a runtime of its own threads.
    pub fn start(config: ChaosConfig<'_>) -> ChaosDriver {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("a runtime for the proxy");
        let backend = runtime.block_on(async {
            Endpoint::from_shared(format!("unix://{}", config.backend.display())).unwrap().connect_lazy()
        });
        let shared = Arc::new(Shared {
            backend,
            calm: AtomicBool::new(false),
            weights: config.weights,
            rng: Mutex::new(fastrand::Rng::with_seed(config.seed)),
            ledger: Mutex::new(Ledger::default()),
            hanging: AtomicUsize::new(0),
            fault: Mutex::new(None),
        });
        let proxy = Proxy(Arc::clone(&shared));
        let _ = std::fs::remove_file(config.socket);
        std::fs::create_dir_all(config.socket.parent().unwrap()).unwrap();
        let registration = config.registration_dir.map(|dir| {
            std::fs::create_dir_all(dir).unwrap();
            dir.join(format!("{}-reg.sock", config.name))
        });
        runtime.block_on(async {
            let incoming = UnixListenerStream::new(tokio::net::UnixListener::bind(config.socket).unwrap());
            tokio::spawn(
                Server::builder()
                    .add_service(IdentityServer::new(proxy.clone()))
                    .add_service(ControllerServer::new(proxy.clone()))
                    .add_service(NodeServer::new(proxy))
                    .serve_with_incoming(incoming),
            );
            if let Some(path) = &registration {
                let _ = std::fs::remove_file(path);
                let (tx, _rx) = tokio::sync::watch::channel(None);
                let service = RegistrarService::new(plugin_info(config.name, config.socket), tx);
                let incoming = UnixListenerStream::new(tokio::net::UnixListener::bind(path).unwrap());
                tokio::spawn(
                    Server::builder()
                        .add_service(RegistrationServer::new(service))
                        .serve_with_incoming(incoming),
                );
            }
        });
        ChaosDriver { shared, runtime: Some(runtime) }
    }

    /// From now on the driver has `fault` (and no other).
    #[allow(dead_code)] // not every test that shares this module uses it
    pub fn set_fault(&self, fault: Option<Fault>) {
        *self.shared.fault.lock().unwrap() = fault;
    }

    /// While calm, every call is answered normally.
    pub fn set_calm(&self, calm: bool) {
        self.shared.calm.store(calm, Ordering::SeqCst);
    }

    /// Calls that did their work and are being held without an answer.
    pub fn hanging(&self) -> usize {
        self.shared.hanging.load(Ordering::SeqCst)
    }

    pub fn ledger(&self) -> Ledger {
        self.shared.ledger.lock().unwrap().clone()
    }
}

impl Drop for ChaosDriver {
    fn drop(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}
