//! The gRPC client of one CSI driver: one lazily connected channel over its unix socket, a deadline on every call, and statuses turned into [`CsiError`]s.
//!
//! Every call carries the same deadline twice: as the request's `grpc-timeout` (so a driver
//! can give up too) and as a local timer around the call (so a driver that never answers
//! cannot hold kvol). Upstream's per-operation `csiTimeout` is two minutes; that is the default.
//!
//! Whether a failed call is worth retrying follows upstream kubelet's `isFinalError`
//! (`pkg/volume/csi/csi_client.go`) and the CSI spec's error tables:
//!
//! | code | retriable | why |
//! |---|---|---|
//! | `Cancelled`, `DeadlineExceeded` | yes | the call was cut short; the operation may still be running |
//! | `Unavailable` | yes | the driver is restarting or its socket is broken; kvol also reports a connection that breaks under a call this way |
//! | `ResourceExhausted` | yes | the driver is out of resources for now |
//! | `Aborted` | yes | CSI: another operation on the volume is pending |
//! | every other code | no | CSI: the operation failed and is not in progress (`NotFound`, `InvalidArgument`, `FailedPrecondition`, `Internal`, `Unknown` …) |
//!
//! `Internal` and `Unknown` are final as upstream has them: the CSI spec gives them no
//! "retry" meaning, and kvol's reconciler retries every failed operation anyway; `retriable`
//! says whether the operation may still be in progress or clear up by itself.
//!
//! A client with an [`RpcObserver`] tells it the outcome of every call, as kubelet's gRPC
//! interceptor feeds `csi_operations_seconds` (`pkg/volume/csi/csi_metrics.go`): the full gRPC
//! method, the status code (a local timeout is `DeadlineExceeded`, a socket that cannot be
//! dialled `Unavailable`) and how long the call took.

use std::collections::BTreeMap;
use std::error::Error as _;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::OnceCell;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Response, Status};

use crate::error::{CsiError, Result};
use crate::proto::csi::controller_client::ControllerClient;
use crate::proto::csi::identity_client::IdentityClient;
use crate::proto::csi::node_client::NodeClient;
use crate::proto::csi::{
    ControllerExpandVolumeRequest, ControllerGetCapabilitiesRequest, ControllerPublishVolumeRequest,
    ControllerServiceCapability, ControllerUnpublishVolumeRequest, CreateSnapshotRequest,
    CreateVolumeRequest, DeleteSnapshotRequest, DeleteVolumeRequest, GetPluginCapabilitiesRequest,
    GetPluginInfoRequest, GetPluginInfoResponse, NodeExpandVolumeRequest, NodeGetCapabilitiesRequest,
    NodeGetInfoRequest, NodeGetInfoResponse, NodeGetVolumeStatsRequest, NodeGetVolumeStatsResponse,
    NodePublishVolumeRequest, NodeServiceCapability, NodeStageVolumeRequest, NodeUnpublishVolumeRequest,
    NodeUnstageVolumeRequest, PluginCapability, ProbeRequest, Snapshot, Volume,
    controller_service_capability, node_service_capability, plugin_capability,
};

/// Upstream's `csiTimeout`: the deadline of every CSI call.
pub const DEFAULT_CALL_TIMEOUT: Duration = Duration::from_secs(120);
/// How long opening the socket connection may take (upstream's registration dial timeout).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// The deadlines of a client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// The deadline of every call, connecting included.
    pub call: Duration,
    /// The deadline of opening the connection.
    pub connect: Duration,
}

impl Default for Timeouts {
    fn default() -> Timeouts {
        Timeouts { call: DEFAULT_CALL_TIMEOUT, connect: DEFAULT_CONNECT_TIMEOUT }
    }
}

impl Timeouts {
    /// The defaults with another call deadline.
    pub fn with_call(call: Duration) -> Timeouts {
        Timeouts { call, ..Timeouts::default() }
    }
}

/// What the driver's Node service offers (`NodeGetCapabilities`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeCapabilities {
    /// `STAGE_UNSTAGE_VOLUME`: kvol stages (NodeStageVolume) before publishing.
    pub stage_unstage: bool,
    /// `EXPAND_VOLUME`: NodeExpandVolume grows the filesystem on the node.
    pub expand: bool,
    pub get_volume_stats: bool,
    pub volume_condition: bool,
    /// `SINGLE_NODE_MULTI_WRITER`: the driver knows the single-node access modes of CSI 1.5.
    pub single_node_multi_writer: bool,
    /// `VOLUME_MOUNT_GROUP`: the driver applies the pod's fsGroup itself.
    pub volume_mount_group: bool,
}

impl NodeCapabilities {
    /// The capabilities a `NodeGetCapabilities` answer lists; unknown ones are ignored.
    pub fn from_proto(capabilities: &[NodeServiceCapability]) -> NodeCapabilities {
        use node_service_capability::rpc::Type;
        let mut caps = NodeCapabilities::default();
        for cap in capabilities {
            let Some(node_service_capability::Type::Rpc(rpc)) = cap.r#type else { continue };
            match Type::try_from(rpc.r#type) {
                Ok(Type::StageUnstageVolume) => caps.stage_unstage = true,
                Ok(Type::ExpandVolume) => caps.expand = true,
                Ok(Type::GetVolumeStats) => caps.get_volume_stats = true,
                Ok(Type::VolumeCondition) => caps.volume_condition = true,
                Ok(Type::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                Ok(Type::VolumeMountGroup) => caps.volume_mount_group = true,
                Ok(Type::Unknown) | Err(_) => {}
            }
        }
        caps
    }
}

/// What the driver's Controller service offers (`ControllerGetCapabilities`); all false for a
/// driver without a Controller service.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ControllerCapabilities {
    /// `PUBLISH_UNPUBLISH_VOLUME`: attaching calls ControllerPublishVolume.
    pub publish_unpublish: bool,
    pub publish_readonly: bool,
    pub expand: bool,
    pub single_node_multi_writer: bool,
}

impl ControllerCapabilities {
    /// The capabilities a `ControllerGetCapabilities` answer lists; unknown ones are ignored.
    pub fn from_proto(capabilities: &[ControllerServiceCapability]) -> ControllerCapabilities {
        use controller_service_capability::rpc::Type;
        let mut caps = ControllerCapabilities::default();
        for cap in capabilities {
            let Some(controller_service_capability::Type::Rpc(rpc)) = cap.r#type else { continue };
            match Type::try_from(rpc.r#type) {
                Ok(Type::PublishUnpublishVolume) => caps.publish_unpublish = true,
                Ok(Type::PublishReadonly) => caps.publish_readonly = true,
                Ok(Type::ExpandVolume) => caps.expand = true,
                Ok(Type::SingleNodeMultiWriter) => caps.single_node_multi_writer = true,
                _ => {}
            }
        }
        caps
    }
}

/// What the driver's Identity service says of the plugin as a whole (`GetPluginCapabilities`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PluginCapabilities {
    pub controller_service: bool,
    pub volume_accessibility_constraints: bool,
    pub online_expansion: bool,
    pub offline_expansion: bool,
}

impl PluginCapabilities {
    /// The capabilities a `GetPluginCapabilities` answer lists; unknown ones are ignored.
    pub fn from_proto(capabilities: &[PluginCapability]) -> PluginCapabilities {
        use plugin_capability::service::Type as Service;
        use plugin_capability::volume_expansion::Type as Expansion;
        let mut caps = PluginCapabilities::default();
        for cap in capabilities {
            match &cap.r#type {
                Some(plugin_capability::Type::Service(s)) => match Service::try_from(s.r#type) {
                    Ok(Service::ControllerService) => caps.controller_service = true,
                    Ok(Service::VolumeAccessibilityConstraints) => {
                        caps.volume_accessibility_constraints = true
                    }
                    _ => {}
                },
                Some(plugin_capability::Type::VolumeExpansion(e)) => match Expansion::try_from(e.r#type) {
                    Ok(Expansion::Online) => caps.online_expansion = true,
                    Ok(Expansion::Offline) => caps.offline_expansion = true,
                    _ => {}
                },
                None => {}
            }
        }
        caps
    }
}

/// Whether a call that failed with `code` may succeed when tried again, or may still be in
/// progress at the driver (the table in the module documentation).
pub const fn is_retriable(code: Code) -> bool {
    matches!(
        code,
        Code::Cancelled
            | Code::DeadlineExceeded
            | Code::Unavailable
            | Code::ResourceExhausted
            | Code::Aborted
    )
}

/// Told the outcome of every call of the clients it is given to ([`CsiClient::with_observer`]).
pub trait RpcObserver: Send + Sync + std::fmt::Debug {
    /// One finished call: `driver`'s `method` (the full gRPC method, as
    /// `/csi.v1.Node/NodePublishVolume`) ended with `code` after `elapsed`. Called on the task
    /// that made the call, so [`call_is_migrated`] tells whether it served a migrated volume;
    /// it must not block.
    fn observe(&self, driver: &str, method: &str, code: Code, elapsed: Duration);
}

tokio::task_local! {
    static MIGRATED: bool;
}

/// Runs `work` with the CSI calls made in it marked as serving a migrated in-tree volume (or
/// not): kubelet's `migrated` label, which its CSI plugin passes in the call's context.
pub async fn with_migrated<F: Future>(migrated: bool, work: F) -> F::Output {
    MIGRATED.scope(migrated, work).await
}

/// Whether the CSI call being made serves a migrated volume: the innermost [`with_migrated`]
/// around it says; false outside any.
pub fn call_is_migrated() -> bool {
    MIGRATED.try_with(|migrated| *migrated).unwrap_or(false)
}

/// Every CSI v1 RPC and its full gRPC method (`/<package>.<service>/<rpc>`), the name kubelet's
/// metrics give a call.
pub const GRPC_METHODS: [(&str, &str); 28] = [
    ("GetPluginInfo", "/csi.v1.Identity/GetPluginInfo"),
    ("GetPluginCapabilities", "/csi.v1.Identity/GetPluginCapabilities"),
    ("Probe", "/csi.v1.Identity/Probe"),
    ("CreateVolume", "/csi.v1.Controller/CreateVolume"),
    ("DeleteVolume", "/csi.v1.Controller/DeleteVolume"),
    ("ControllerPublishVolume", "/csi.v1.Controller/ControllerPublishVolume"),
    ("ControllerUnpublishVolume", "/csi.v1.Controller/ControllerUnpublishVolume"),
    ("ValidateVolumeCapabilities", "/csi.v1.Controller/ValidateVolumeCapabilities"),
    ("ListVolumes", "/csi.v1.Controller/ListVolumes"),
    ("GetCapacity", "/csi.v1.Controller/GetCapacity"),
    ("ControllerGetCapabilities", "/csi.v1.Controller/ControllerGetCapabilities"),
    ("CreateSnapshot", "/csi.v1.Controller/CreateSnapshot"),
    ("DeleteSnapshot", "/csi.v1.Controller/DeleteSnapshot"),
    ("ListSnapshots", "/csi.v1.Controller/ListSnapshots"),
    ("ControllerExpandVolume", "/csi.v1.Controller/ControllerExpandVolume"),
    ("ControllerModifyVolume", "/csi.v1.Controller/ControllerModifyVolume"),
    ("GroupControllerGetCapabilities", "/csi.v1.GroupController/GroupControllerGetCapabilities"),
    ("CreateVolumeGroupSnapshot", "/csi.v1.GroupController/CreateVolumeGroupSnapshot"),
    ("DeleteVolumeGroupSnapshot", "/csi.v1.GroupController/DeleteVolumeGroupSnapshot"),
    ("GetVolumeGroupSnapshot", "/csi.v1.GroupController/GetVolumeGroupSnapshot"),
    ("NodeStageVolume", "/csi.v1.Node/NodeStageVolume"),
    ("NodeUnstageVolume", "/csi.v1.Node/NodeUnstageVolume"),
    ("NodePublishVolume", "/csi.v1.Node/NodePublishVolume"),
    ("NodeUnpublishVolume", "/csi.v1.Node/NodeUnpublishVolume"),
    ("NodeGetVolumeStats", "/csi.v1.Node/NodeGetVolumeStats"),
    ("NodeExpandVolume", "/csi.v1.Node/NodeExpandVolume"),
    ("NodeGetCapabilities", "/csi.v1.Node/NodeGetCapabilities"),
    ("NodeGetInfo", "/csi.v1.Node/NodeGetInfo"),
];

/// The full gRPC method of the CSI RPC `rpc` (`NodePublishVolume` →
/// `/csi.v1.Node/NodePublishVolume`); `None` for a name CSI v1 does not have.
pub fn grpc_method(rpc: &str) -> Option<&'static str> {
    GRPC_METHODS.iter().find(|(name, _)| *name == rpc).map(|(_, method)| *method)
}

/// The gRPC code an observer is told for a call's outcome.
fn outcome_code<R>(outcome: &Result<R>) -> Code {
    match outcome {
        Ok(_) => Code::Ok,
        Err(CsiError::Rpc { code, .. }) => *code,
        Err(CsiError::Timeout { .. }) => Code::DeadlineExceeded,
        // What gRPC reports when the socket cannot be dialled.
        Err(CsiError::Connect { .. }) => Code::Unavailable,
        Err(_) => Code::Unknown,
    }
}

/// A path as a CSI request field (proto strings are UTF-8).
pub fn path_field(path: &Path) -> Result<String> {
    path.to_str().map(str::to_string).ok_or_else(|| {
        let reason = std::io::Error::new(std::io::ErrorKind::InvalidInput, "the path is not valid UTF-8");
        CsiError::io("pass to a csi driver", path, reason)
    })
}

/// The client of one CSI driver. Clones share the connection, the capability caches and the
/// observer.
#[derive(Clone, Debug)]
pub struct CsiClient {
    channel: Channel,
    inner: Arc<Inner>,
    observer: Option<Arc<dyn RpcObserver>>,
}

#[derive(Debug)]
struct Inner {
    driver: String,
    endpoint: PathBuf,
    timeouts: Timeouts,
    node_capabilities: OnceCell<NodeCapabilities>,
    controller_capabilities: OnceCell<ControllerCapabilities>,
}

impl CsiClient {
    /// A client of `driver` at the unix socket `endpoint`. Nothing is dialled yet: the first
    /// call connects, and a broken connection is re-dialled by the next call. Must be called
    /// inside a tokio runtime (the channel's worker task runs there).
    pub fn new(driver: impl Into<String>, endpoint: &Path, timeouts: Timeouts) -> Result<CsiClient> {
        let driver = driver.into();
        let refused = |reason: String| CsiError::Connect {
            driver: driver.clone(),
            endpoint: endpoint.display().to_string(),
            reason,
        };
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(refused("a csi client must be created inside a tokio runtime".to_string()));
        }
        let path = endpoint.to_str().ok_or_else(|| refused("the socket path is not valid UTF-8".into()))?;
        let channel = Endpoint::from_shared(format!("unix://{path}"))
            .map_err(|e| refused(e.to_string()))?
            .connect_timeout(timeouts.connect)
            .connect_lazy();
        let inner = Inner {
            driver,
            endpoint: endpoint.to_path_buf(),
            timeouts,
            node_capabilities: OnceCell::new(),
            controller_capabilities: OnceCell::new(),
        };
        Ok(CsiClient { channel, inner: Arc::new(inner), observer: None })
    }

    /// This client telling `observer` the outcome of every call it makes from now on.
    pub fn with_observer(self, observer: Arc<dyn RpcObserver>) -> CsiClient {
        CsiClient { observer: Some(observer), ..self }
    }

    pub fn driver(&self) -> &str {
        &self.inner.driver
    }

    pub fn endpoint(&self) -> &Path {
        &self.inner.endpoint
    }

    pub fn timeouts(&self) -> Timeouts {
        self.inner.timeouts
    }

    /// `GetPluginInfo`.
    pub async fn plugin_info(&self) -> Result<GetPluginInfoResponse> {
        let mut identity = IdentityClient::new(self.channel.clone());
        self.run("GetPluginInfo", identity.get_plugin_info(self.request(GetPluginInfoRequest {}))).await
    }

    /// `GetPluginCapabilities`.
    pub async fn plugin_capabilities(&self) -> Result<PluginCapabilities> {
        let mut identity = IdentityClient::new(self.channel.clone());
        let request = self.request(GetPluginCapabilitiesRequest {});
        let response = self.run("GetPluginCapabilities", identity.get_plugin_capabilities(request)).await?;
        Ok(PluginCapabilities::from_proto(&response.capabilities))
    }

    /// `Probe`: whether the driver is ready. An answer without `ready` means ready (CSI spec).
    pub async fn probe(&self) -> Result<bool> {
        let mut identity = IdentityClient::new(self.channel.clone());
        let response = self.run("Probe", identity.probe(self.request(ProbeRequest {}))).await?;
        Ok(response.ready.unwrap_or(true))
    }

    /// `NodeGetInfo`: the driver's node ID, volume limit and topology.
    pub async fn node_get_info(&self) -> Result<NodeGetInfoResponse> {
        let mut node = NodeClient::new(self.channel.clone());
        self.run("NodeGetInfo", node.node_get_info(self.request(NodeGetInfoRequest {}))).await
    }

    /// `NodeGetCapabilities`, asked once per client and then remembered.
    pub async fn node_get_capabilities(&self) -> Result<NodeCapabilities> {
        let caps = self
            .inner
            .node_capabilities
            .get_or_try_init(|| async {
                let mut node = NodeClient::new(self.channel.clone());
                let request = self.request(NodeGetCapabilitiesRequest {});
                let response = self.run("NodeGetCapabilities", node.node_get_capabilities(request)).await?;
                Ok::<_, CsiError>(NodeCapabilities::from_proto(&response.capabilities))
            })
            .await?;
        Ok(*caps)
    }

    /// `ControllerGetCapabilities`, asked once per client and then remembered. A driver
    /// without a Controller service (`Unimplemented`) has none.
    pub async fn controller_get_capabilities(&self) -> Result<ControllerCapabilities> {
        let caps = self
            .inner
            .controller_capabilities
            .get_or_try_init(|| async {
                let mut controller = ControllerClient::new(self.channel.clone());
                let request = self.request(ControllerGetCapabilitiesRequest {});
                match self
                    .run("ControllerGetCapabilities", controller.controller_get_capabilities(request))
                    .await
                {
                    Ok(response) => Ok(ControllerCapabilities::from_proto(&response.capabilities)),
                    Err(CsiError::Rpc { code: Code::Unimplemented, .. }) => {
                        Ok(ControllerCapabilities::default())
                    }
                    Err(e) => Err(e),
                }
            })
            .await?;
        Ok(*caps)
    }

    /// `NodeStageVolume`.
    pub async fn node_stage(&self, request: NodeStageVolumeRequest) -> Result<()> {
        let mut node = NodeClient::new(self.channel.clone());
        self.run("NodeStageVolume", node.node_stage_volume(self.request(request))).await?;
        Ok(())
    }

    /// `NodeUnstageVolume` of `volume_id` staged at `staging_target_path`.
    pub async fn node_unstage(&self, volume_id: &str, staging_target_path: &Path) -> Result<()> {
        let request = NodeUnstageVolumeRequest {
            volume_id: volume_id.to_string(),
            staging_target_path: path_field(staging_target_path)?,
        };
        let mut node = NodeClient::new(self.channel.clone());
        self.run("NodeUnstageVolume", node.node_unstage_volume(self.request(request))).await?;
        Ok(())
    }

    /// `NodePublishVolume`.
    pub async fn node_publish(&self, request: NodePublishVolumeRequest) -> Result<()> {
        let mut node = NodeClient::new(self.channel.clone());
        self.run("NodePublishVolume", node.node_publish_volume(self.request(request))).await?;
        Ok(())
    }

    /// `NodeUnpublishVolume` of `volume_id` published at `target_path`.
    pub async fn node_unpublish(&self, volume_id: &str, target_path: &Path) -> Result<()> {
        let request = NodeUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            target_path: path_field(target_path)?,
        };
        let mut node = NodeClient::new(self.channel.clone());
        self.run("NodeUnpublishVolume", node.node_unpublish_volume(self.request(request))).await?;
        Ok(())
    }

    /// `NodeExpandVolume`; the capacity the driver reports (0 when it does not say).
    pub async fn node_expand(&self, request: NodeExpandVolumeRequest) -> Result<i64> {
        let mut node = NodeClient::new(self.channel.clone());
        let response = self.run("NodeExpandVolume", node.node_expand_volume(self.request(request))).await?;
        Ok(response.capacity_bytes)
    }

    /// `NodeGetVolumeStats` of `volume_id` published at `volume_path`.
    pub async fn node_get_volume_stats(
        &self,
        volume_id: &str,
        volume_path: &Path,
        staging_target_path: Option<&Path>,
    ) -> Result<NodeGetVolumeStatsResponse> {
        let request = NodeGetVolumeStatsRequest {
            volume_id: volume_id.to_string(),
            volume_path: path_field(volume_path)?,
            staging_target_path: staging_target_path.map(path_field).transpose()?.unwrap_or_default(),
        };
        let mut node = NodeClient::new(self.channel.clone());
        self.run("NodeGetVolumeStats", node.node_get_volume_stats(self.request(request))).await
    }

    /// `ControllerPublishVolume`; the publish context the driver returns.
    pub async fn controller_publish(
        &self,
        request: ControllerPublishVolumeRequest,
    ) -> Result<BTreeMap<String, String>> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let response = self
            .run("ControllerPublishVolume", controller.controller_publish_volume(self.request(request)))
            .await?;
        Ok(response.publish_context.into_iter().collect())
    }

    /// `ControllerUnpublishVolume` of `volume_id` from the driver's node `node_id`.
    pub async fn controller_unpublish(
        &self,
        volume_id: &str,
        node_id: &str,
        secrets: BTreeMap<String, String>,
    ) -> Result<()> {
        let request = ControllerUnpublishVolumeRequest {
            volume_id: volume_id.to_string(),
            node_id: node_id.to_string(),
            secrets: secrets.into_iter().collect(),
        };
        let mut controller = ControllerClient::new(self.channel.clone());
        self.run("ControllerUnpublishVolume", controller.controller_unpublish_volume(self.request(request)))
            .await?;
        Ok(())
    }

    /// `CreateVolume`; the volume the driver made (or already had under that name).
    pub async fn create_volume(&self, request: CreateVolumeRequest) -> Result<Volume> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let response = self.run("CreateVolume", controller.create_volume(self.request(request))).await?;
        response.volume.ok_or_else(|| CsiError::Driver {
            driver: self.inner.driver.clone(),
            reason: "CreateVolume answered without a volume".to_string(),
        })
    }

    /// `DeleteVolume` of `volume_id`.
    pub async fn delete_volume(&self, volume_id: &str, secrets: BTreeMap<String, String>) -> Result<()> {
        let request =
            DeleteVolumeRequest { volume_id: volume_id.to_string(), secrets: secrets.into_iter().collect() };
        let mut controller = ControllerClient::new(self.channel.clone());
        self.run("DeleteVolume", controller.delete_volume(self.request(request))).await?;
        Ok(())
    }

    /// `CreateSnapshot`; the snapshot the driver took (or already had under that name).
    pub async fn create_snapshot(&self, request: CreateSnapshotRequest) -> Result<Snapshot> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let response = self.run("CreateSnapshot", controller.create_snapshot(self.request(request))).await?;
        response.snapshot.ok_or_else(|| CsiError::Driver {
            driver: self.inner.driver.clone(),
            reason: "CreateSnapshot answered without a snapshot".to_string(),
        })
    }

    /// `DeleteSnapshot` of `snapshot_id`.
    pub async fn delete_snapshot(&self, snapshot_id: &str) -> Result<()> {
        let request = DeleteSnapshotRequest { snapshot_id: snapshot_id.to_string(), ..Default::default() };
        let mut controller = ControllerClient::new(self.channel.clone());
        self.run("DeleteSnapshot", controller.delete_snapshot(self.request(request))).await?;
        Ok(())
    }

    /// `ControllerExpandVolume`; the capacity the driver reports and whether the node must
    /// grow the volume too.
    pub async fn controller_expand(&self, request: ControllerExpandVolumeRequest) -> Result<(i64, bool)> {
        let mut controller = ControllerClient::new(self.channel.clone());
        let response = self
            .run("ControllerExpandVolume", controller.controller_expand_volume(self.request(request)))
            .await?;
        Ok((response.capacity_bytes, response.node_expansion_required))
    }

    /// A request carrying the call deadline as its `grpc-timeout`.
    fn request<T>(&self, message: T) -> Request<T> {
        let mut request = Request::new(message);
        request.set_timeout(self.inner.timeouts.call);
        request
    }

    /// Runs one call under the deadline, maps its failure and tells the observer.
    async fn run<R>(
        &self,
        rpc: &'static str,
        call: impl Future<Output = std::result::Result<Response<R>, Status>>,
    ) -> Result<R> {
        let limit = self.inner.timeouts.call;
        let started = Instant::now();
        let outcome = match tokio::time::timeout(limit, call).await {
            Ok(Ok(response)) => Ok(response.into_inner()),
            Ok(Err(status)) => Err(self.status_error(rpc, status)),
            Err(_) => Err(self.timeout_error(rpc)),
        };
        if let Some(observer) = &self.observer {
            let method = grpc_method(rpc).unwrap_or(rpc);
            observer.observe(&self.inner.driver, method, outcome_code(&outcome), started.elapsed());
        }
        outcome
    }

    fn timeout_error(&self, rpc: &'static str) -> CsiError {
        CsiError::Timeout { driver: self.inner.driver.clone(), rpc, limit: self.inner.timeouts.call }
    }

    /// A failed call as an error: the socket could not be dialled → `Connect`; the local
    /// `grpc-timeout` fired → `Timeout`; the connection broke under the call → `Rpc` with
    /// `Unavailable` (retriable); the driver's own status → `Rpc` with the retriable table.
    fn status_error(&self, rpc: &'static str, status: Status) -> CsiError {
        match Failure::of(&status) {
            Failure::Connect(reason) => CsiError::Connect {
                driver: self.inner.driver.clone(),
                endpoint: self.inner.endpoint.display().to_string(),
                reason,
            },
            Failure::TimedOut => self.timeout_error(rpc),
            Failure::Transport(reason) => {
                // gRPC's code for a broken transport; the driver may still be working on it.
                let message = format!("the connection to the driver broke during the call: {reason}");
                tracing::debug!(driver = %self.inner.driver, rpc, %message, "csi call failed");
                CsiError::Rpc {
                    driver: self.inner.driver.clone(),
                    rpc,
                    code: Code::Unavailable,
                    message,
                    retriable: true,
                }
            }
            Failure::Status => {
                let code = status.code();
                let message = match status.message() {
                    "" => code.description().to_string(),
                    message => message.to_string(),
                };
                tracing::debug!(driver = %self.inner.driver, rpc, ?code, %message, "csi call failed");
                CsiError::Rpc {
                    driver: self.inner.driver.clone(),
                    rpc,
                    code,
                    message,
                    retriable: is_retriable(code),
                }
            }
        }
    }
}

/// How a call failed, from the errors behind its status.
#[derive(Debug, PartialEq, Eq)]
enum Failure {
    /// The connection could not be opened; the reason is the innermost error's text.
    Connect(String),
    /// tonic's own `grpc-timeout` enforcement fired.
    TimedOut,
    /// The connection failed under a call in flight (the driver died or closed it); the
    /// reason is the innermost error's text.
    Transport(String),
    /// The driver answered with a status.
    Status,
}

impl Failure {
    fn of(status: &Status) -> Failure {
        let mut source = status.source();
        while let Some(err) = source {
            if let Some(connect) = err.downcast_ref::<tonic::ConnectError>() {
                return Failure::Connect(innermost(connect));
            }
            if err.downcast_ref::<tonic::TimeoutExpired>().is_some() {
                return Failure::TimedOut;
            }
            source = err.source();
        }
        // A status the driver sent carries no source; one made from a local error does.
        match status.source() {
            Some(err) => Failure::Transport(innermost(err)),
            None => Failure::Status,
        }
    }
}

/// The text of the innermost error below `err` (the OS error of a failed connect).
fn innermost(err: &(dyn std::error::Error + 'static)) -> String {
    let mut last = err;
    while let Some(next) = last.source() {
        last = next;
    }
    last.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::csi::controller_service_capability::Rpc as ControllerRpc;
    use crate::proto::csi::node_service_capability::Rpc as NodeRpc;

    #[test]
    fn retriable_codes_follow_upstream_is_final_error() {
        let table = [
            (Code::Ok, false),
            (Code::Cancelled, true),
            (Code::Unknown, false),
            (Code::InvalidArgument, false),
            (Code::DeadlineExceeded, true),
            (Code::NotFound, false),
            (Code::AlreadyExists, false),
            (Code::PermissionDenied, false),
            (Code::ResourceExhausted, true),
            (Code::FailedPrecondition, false),
            (Code::Aborted, true),
            (Code::OutOfRange, false),
            (Code::Unimplemented, false),
            (Code::Internal, false),
            (Code::Unavailable, true),
            (Code::DataLoss, false),
            (Code::Unauthenticated, false),
        ];
        for (code, retriable) in table {
            assert_eq!(is_retriable(code), retriable, "{code:?}");
        }
    }

    #[test]
    fn node_capabilities_are_read_from_the_answer() {
        use node_service_capability::rpc::Type;
        let cap = |t: i32| NodeServiceCapability {
            r#type: Some(node_service_capability::Type::Rpc(NodeRpc { r#type: t })),
        };
        let table: [(Vec<NodeServiceCapability>, NodeCapabilities); 4] = [
            (vec![], NodeCapabilities::default()),
            (
                vec![cap(Type::StageUnstageVolume as i32)],
                NodeCapabilities { stage_unstage: true, ..Default::default() },
            ),
            (
                vec![
                    cap(Type::ExpandVolume as i32),
                    cap(Type::SingleNodeMultiWriter as i32),
                    cap(Type::VolumeMountGroup as i32),
                    cap(Type::GetVolumeStats as i32),
                    cap(Type::VolumeCondition as i32),
                ],
                NodeCapabilities {
                    stage_unstage: false,
                    expand: true,
                    get_volume_stats: true,
                    volume_condition: true,
                    single_node_multi_writer: true,
                    volume_mount_group: true,
                },
            ),
            // An unknown number and an empty entry are skipped, not errors.
            (vec![cap(99), NodeServiceCapability { r#type: None }], NodeCapabilities::default()),
        ];
        for (answer, want) in table {
            assert_eq!(NodeCapabilities::from_proto(&answer), want, "{answer:?}");
        }
    }

    #[test]
    fn controller_capabilities_are_read_from_the_answer() {
        use controller_service_capability::rpc::Type;
        let cap = |t: Type| ControllerServiceCapability {
            r#type: Some(controller_service_capability::Type::Rpc(ControllerRpc { r#type: t as i32 })),
        };
        let caps = ControllerCapabilities::from_proto(&[
            cap(Type::CreateDeleteVolume),
            cap(Type::PublishUnpublishVolume),
        ]);
        assert_eq!(caps, ControllerCapabilities { publish_unpublish: true, ..Default::default() });
        let caps = ControllerCapabilities::from_proto(&[cap(Type::PublishReadonly), cap(Type::ExpandVolume)]);
        assert_eq!(
            caps,
            ControllerCapabilities { publish_readonly: true, expand: true, ..Default::default() }
        );
    }

    #[test]
    fn a_client_outside_a_runtime_is_an_error_not_a_panic() {
        let err =
            CsiClient::new("d.example.com", Path::new("/no/such.sock"), Timeouts::default()).unwrap_err();
        assert!(err.to_string().contains("inside a tokio runtime"), "{err}");
    }

    #[test]
    fn grpc_methods_are_those_of_the_generated_services() {
        let generated = include_str!(concat!(env!("OUT_DIR"), "/csi.v1.rs"));
        for (rpc, method) in GRPC_METHODS {
            assert!(generated.contains(&format!("\"{method}\"")), "{method} is not a generated method");
            assert!(method.ends_with(&format!("/{rpc}")), "{rpc} → {method}");
            assert_eq!(grpc_method(rpc), Some(method));
        }
        // Every method the services have is in the table.
        let all: std::collections::BTreeSet<&str> =
            generated.split("\"/csi.v1.").skip(1).map(|rest| &rest[..rest.find('"').unwrap()]).collect();
        assert_eq!(all.len(), GRPC_METHODS.len(), "{all:?}");
        assert_eq!(grpc_method("NodeFrobnicate"), None);
    }

    #[test]
    fn every_rpc_this_client_runs_has_a_grpc_method() {
        let source = include_str!("client.rs");
        let mut seen = 0;
        for piece in source.split(".run(\"").skip(1) {
            let rpc = &piece[..piece.find('"').unwrap()];
            assert!(grpc_method(rpc).is_some(), "{rpc} is not a csi v1 rpc");
            seen += 1;
        }
        assert!(seen >= 14, "found {seen} calls");
    }

    #[test]
    fn outcomes_become_the_codes_kubelet_records() {
        let driver = || "d".to_string();
        let table: [(Result<()>, Code); 5] = [
            (Ok(()), Code::Ok),
            (
                Err(CsiError::Rpc {
                    driver: driver(),
                    rpc: "Probe",
                    code: Code::NotFound,
                    message: String::new(),
                    retriable: false,
                }),
                Code::NotFound,
            ),
            (
                Err(CsiError::Timeout { driver: driver(), rpc: "Probe", limit: Duration::ZERO }),
                Code::DeadlineExceeded,
            ),
            (
                Err(CsiError::Connect { driver: driver(), endpoint: "/x".into(), reason: String::new() }),
                Code::Unavailable,
            ),
            (Err(CsiError::Driver { driver: driver(), reason: String::new() }), Code::Unknown),
        ];
        for (outcome, code) in table {
            assert_eq!(outcome_code(&outcome), code, "{outcome:?}");
        }
    }

    /// One call an observer saw.
    #[derive(Clone, Debug, PartialEq)]
    struct Seen {
        driver: String,
        method: String,
        code: Code,
        migrated: bool,
        elapsed: Duration,
    }

    #[derive(Debug, Default)]
    struct Recorder(std::sync::Mutex<Vec<Seen>>);

    impl RpcObserver for Recorder {
        fn observe(&self, driver: &str, method: &str, code: Code, elapsed: Duration) {
            let seen = Seen {
                driver: driver.into(),
                method: method.into(),
                code,
                migrated: call_is_migrated(),
                elapsed,
            };
            self.0.lock().unwrap().push(seen);
        }
    }

    impl Recorder {
        fn take(&self) -> Vec<(String, String, Code, bool)> {
            let seen = std::mem::take(&mut *self.0.lock().unwrap());
            seen.into_iter().map(|s| (s.driver, s.method, s.code, s.migrated)).collect()
        }
    }

    /// An Identity service: GetPluginInfo answers, Probe fails, GetPluginCapabilities hangs.
    #[derive(Debug)]
    struct Identity;

    #[tonic::async_trait]
    impl crate::proto::csi::identity_server::Identity for Identity {
        async fn get_plugin_info(
            &self,
            _: Request<GetPluginInfoRequest>,
        ) -> std::result::Result<Response<GetPluginInfoResponse>, Status> {
            Ok(Response::new(GetPluginInfoResponse { name: "d.example.com".into(), ..Default::default() }))
        }

        async fn get_plugin_capabilities(
            &self,
            _: Request<GetPluginCapabilitiesRequest>,
        ) -> std::result::Result<Response<crate::proto::csi::GetPluginCapabilitiesResponse>, Status> {
            tokio::time::sleep(Duration::from_secs(30)).await;
            Ok(Response::new(Default::default()))
        }

        async fn probe(
            &self,
            _: Request<ProbeRequest>,
        ) -> std::result::Result<Response<crate::proto::csi::ProbeResponse>, Status> {
            Err(Status::failed_precondition("not ready"))
        }
    }

    #[tokio::test]
    async fn an_observer_is_told_every_call_and_its_outcome() {
        use crate::proto::csi::identity_server::IdentityServer;
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        let listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let server = tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(IdentityServer::new(Identity))
                .serve_with_incoming(tokio_stream::wrappers::UnixListenerStream::new(listener)),
        );
        let recorder = Arc::new(Recorder::default());
        let timeouts = Timeouts::with_call(Duration::from_millis(300));
        let plain = CsiClient::new("d.example.com", &socket, timeouts).unwrap();
        let client = plain.clone().with_observer(recorder.clone());

        plain.plugin_info().await.unwrap();
        assert_eq!(recorder.take(), [], "a client without the observer tells it nothing");

        let (d, ok, fail, late) =
            ("d.example.com".to_string(), Code::Ok, Code::FailedPrecondition, Code::DeadlineExceeded);
        client.plugin_info().await.unwrap();
        client.clone().probe().await.unwrap_err();
        with_migrated(true, client.plugin_info()).await.unwrap();
        client.plugin_capabilities().await.unwrap_err();
        assert_eq!(
            recorder.take(),
            [
                (d.clone(), "/csi.v1.Identity/GetPluginInfo".to_string(), ok, false),
                (d.clone(), "/csi.v1.Identity/Probe".to_string(), fail, false),
                (d.clone(), "/csi.v1.Identity/GetPluginInfo".to_string(), ok, true),
                (d.clone(), "/csi.v1.Identity/GetPluginCapabilities".to_string(), late, false),
            ]
        );

        let gone = CsiClient::new("d.example.com", &dir.path().join("gone.sock"), timeouts)
            .unwrap()
            .with_observer(recorder.clone());
        gone.node_get_info().await.unwrap_err();
        assert_eq!(
            recorder.take(),
            [(d.clone(), "/csi.v1.Node/NodeGetInfo".to_string(), Code::Unavailable, false)]
        );
        server.abort();
    }

    #[tokio::test]
    async fn the_observer_is_told_how_long_a_call_took() {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("csi.sock");
        // A socket that accepts and never answers: the call runs into its deadline.
        let _listener = tokio::net::UnixListener::bind(&socket).unwrap();
        let recorder = Arc::new(Recorder::default());
        let client =
            CsiClient::new("d.example.com", &socket, Timeouts::with_call(Duration::from_millis(200)))
                .unwrap()
                .with_observer(recorder.clone());
        client.probe().await.unwrap_err();
        let seen = recorder.0.lock().unwrap().clone();
        assert_eq!(seen.len(), 1, "{seen:?}");
        assert_eq!(seen[0].code, Code::DeadlineExceeded);
        assert!(
            seen[0].elapsed >= Duration::from_millis(200) && seen[0].elapsed < Duration::from_secs(5),
            "{:?}",
            seen[0].elapsed
        );
    }

    #[test]
    fn failures_are_told_apart_by_the_errors_behind_the_status() {
        let local = |err: Box<dyn std::error::Error + Send + Sync>| Status::from_error(err);
        let table = [
            (Status::not_found("no volume"), Failure::Status),
            (
                local(Box::new(tonic::ConnectError(Box::new(std::io::Error::from(
                    std::io::ErrorKind::NotFound,
                ))))),
                Failure::Connect("entity not found".into()),
            ),
            (local(Box::new(tonic::TimeoutExpired(()))), Failure::TimedOut),
            (local(Box::new(std::io::Error::other("broken pipe"))), Failure::Transport("broken pipe".into())),
        ];
        for (status, want) in table {
            assert_eq!(Failure::of(&status), want, "{status:?}");
        }
    }
}
