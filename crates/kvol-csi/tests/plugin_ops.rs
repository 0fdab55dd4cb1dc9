//! The CSI plugin against a recording fake driver over real gRPC on unix sockets: what reaches the driver, and how failures come back.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::{
    CSIPersistentVolumeSource, CSIVolumeSource, LocalObjectReference, PersistentVolumeSpec, Secret,
    SecretReference, Volume,
};
use k8s_openapi::api::storage::v1::{CSIDriver, CSIDriverSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_csi::client::{CsiClient, Timeouts};
use kvol_csi::paths::{self, VolData};
use kvol_csi::policy::{
    self, EPHEMERAL_KEY, POD_NAME_KEY, POD_NAMESPACE_KEY, POD_UID_KEY, SERVICE_ACCOUNT_KEY,
};
use kvol_csi::proto::csi::controller_server::{Controller, ControllerServer};
use kvol_csi::proto::csi::identity_server::{Identity, IdentityServer};
use kvol_csi::proto::csi::node_server::{Node, NodeServer};
use kvol_csi::proto::csi::volume_capability::access_mode::Mode;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume};
use kvol_csi::proto::csi::*;
use kvol_csi::{CsiError, CsiPlugin, MemoryAttachments, MemoryObjects};
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest};
use kvol_plugin::testing::{inline, pv, volume};
use kvol_plugin::{
    DynamicSource, NodeInfo, NodePaths, PluginError, PluginHost, PluginKind, PluginRegistry, ProbeEvent,
    RecordingMounter, SecretMap, SourceKey, VolumePlugin, VolumeSpec,
};
use tokio::net::UnixListener;
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Code, Request, Response, Status};

const DRIVER: &str = "fake.csi.kvol.io";
const NODE: &str = "node-a";
const NODE_ID: &str = "fake-node-id-1";

use node_service_capability::rpc::Type as NodeCap;

// ---- The recording fake driver ----

/// One request the fake driver received.
#[derive(Clone, Debug, PartialEq)]
enum Call {
    Probe,
    NodeGetCapabilities,
    ControllerGetCapabilities,
    Stage(NodeStageVolumeRequest),
    Unstage(NodeUnstageVolumeRequest),
    Publish(NodePublishVolumeRequest),
    Unpublish(NodeUnpublishVolumeRequest),
    Expand(NodeExpandVolumeRequest),
    ControllerPublish(ControllerPublishVolumeRequest),
    ControllerUnpublish(ControllerUnpublishVolumeRequest),
}

/// How the fake driver behaves; changeable while it runs.
#[derive(Debug, Default)]
struct Behaviour {
    node_caps: Vec<NodeCap>,
    /// `Some` serves a Controller service with these capabilities; `None` serves none.
    controller_caps: Option<Vec<controller_service_capability::rpc::Type>>,
    publish_context: BTreeMap<String, String>,
    /// RPC name → the status it fails with.
    fail: BTreeMap<&'static str, (Code, String)>,
    /// RPCs that never answer.
    hang: BTreeSet<&'static str>,
    /// NodePublishVolume creates the target with a file `data` (mode 0600) in it, as a mount
    /// would show; NodeUnpublishVolume takes the file away again unless `keep_data`.
    create_target: bool,
    keep_data: bool,
}

#[derive(Debug, Default)]
struct FakeState {
    calls: Vec<Call>,
    behaviour: Behaviour,
}

#[derive(Clone, Debug, Default)]
struct Fake(Arc<Mutex<FakeState>>);

impl Fake {
    fn lock(&self) -> MutexGuard<'_, FakeState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn behave(&self, f: impl FnOnce(&mut Behaviour)) {
        f(&mut self.lock().behaviour);
    }

    fn calls(&self) -> Vec<Call> {
        self.lock().calls.clone()
    }

    fn take_calls(&self) -> Vec<Call> {
        std::mem::take(&mut self.lock().calls)
    }

    /// Records the call, then hangs or fails as told.
    async fn enter(&self, rpc: &'static str, call: Call) -> Result<(), Status> {
        let (hang, fail) = {
            let mut state = self.lock();
            state.calls.push(call);
            (state.behaviour.hang.contains(rpc), state.behaviour.fail.get(rpc).cloned())
        };
        if hang {
            tokio::time::sleep(Duration::from_secs(3600)).await;
        }
        match fail {
            Some((code, message)) => Err(Status::new(code, message)),
            None => Ok(()),
        }
    }
}

type Answer<T> = Result<Response<T>, Status>;

#[tonic::async_trait]
impl Identity for Fake {
    async fn get_plugin_info(&self, _: Request<GetPluginInfoRequest>) -> Answer<GetPluginInfoResponse> {
        Ok(Response::new(GetPluginInfoResponse {
            name: DRIVER.into(),
            vendor_version: "0.1.0".into(),
            ..Default::default()
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<GetPluginCapabilitiesRequest>,
    ) -> Answer<GetPluginCapabilitiesResponse> {
        Ok(Response::new(GetPluginCapabilitiesResponse::default()))
    }

    async fn probe(&self, _: Request<ProbeRequest>) -> Answer<ProbeResponse> {
        self.enter("Probe", Call::Probe).await?;
        Ok(Response::new(ProbeResponse { ready: Some(true) }))
    }
}

#[tonic::async_trait]
impl Node for Fake {
    async fn node_stage_volume(&self, r: Request<NodeStageVolumeRequest>) -> Answer<NodeStageVolumeResponse> {
        self.enter("NodeStageVolume", Call::Stage(r.into_inner())).await?;
        Ok(Response::new(NodeStageVolumeResponse {}))
    }

    async fn node_unstage_volume(
        &self,
        r: Request<NodeUnstageVolumeRequest>,
    ) -> Answer<NodeUnstageVolumeResponse> {
        self.enter("NodeUnstageVolume", Call::Unstage(r.into_inner())).await?;
        Ok(Response::new(NodeUnstageVolumeResponse {}))
    }

    async fn node_publish_volume(
        &self,
        r: Request<NodePublishVolumeRequest>,
    ) -> Answer<NodePublishVolumeResponse> {
        let request = r.into_inner();
        let target = PathBuf::from(&request.target_path);
        self.enter("NodePublishVolume", Call::Publish(request)).await?;
        if self.lock().behaviour.create_target {
            fs::create_dir_all(&target).unwrap();
            fs::write(target.join("data"), "payload").unwrap();
            fs::set_permissions(target.join("data"), fs::Permissions::from_mode(0o600)).unwrap();
        }
        Ok(Response::new(NodePublishVolumeResponse {}))
    }

    async fn node_unpublish_volume(
        &self,
        r: Request<NodeUnpublishVolumeRequest>,
    ) -> Answer<NodeUnpublishVolumeResponse> {
        let request = r.into_inner();
        let data = Path::new(&request.target_path).join("data");
        self.enter("NodeUnpublishVolume", Call::Unpublish(request)).await?;
        if !self.lock().behaviour.keep_data {
            let _ = fs::remove_file(data);
        }
        Ok(Response::new(NodeUnpublishVolumeResponse {}))
    }

    async fn node_get_volume_stats(
        &self,
        _: Request<NodeGetVolumeStatsRequest>,
    ) -> Answer<NodeGetVolumeStatsResponse> {
        Err(Status::unimplemented("no stats"))
    }

    async fn node_expand_volume(
        &self,
        r: Request<NodeExpandVolumeRequest>,
    ) -> Answer<NodeExpandVolumeResponse> {
        let required = r.get_ref().capacity_range.map_or(0, |c| c.required_bytes);
        self.enter("NodeExpandVolume", Call::Expand(r.into_inner())).await?;
        Ok(Response::new(NodeExpandVolumeResponse { capacity_bytes: required }))
    }

    async fn node_get_capabilities(
        &self,
        _: Request<NodeGetCapabilitiesRequest>,
    ) -> Answer<NodeGetCapabilitiesResponse> {
        self.enter("NodeGetCapabilities", Call::NodeGetCapabilities).await?;
        let capabilities = self
            .lock()
            .behaviour
            .node_caps
            .iter()
            .map(|t| NodeServiceCapability {
                r#type: Some(node_service_capability::Type::Rpc(node_service_capability::Rpc {
                    r#type: *t as i32,
                })),
            })
            .collect();
        Ok(Response::new(NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(&self, _: Request<NodeGetInfoRequest>) -> Answer<NodeGetInfoResponse> {
        Ok(Response::new(NodeGetInfoResponse { node_id: NODE_ID.into(), ..Default::default() }))
    }
}

#[tonic::async_trait]
impl Controller for Fake {
    async fn create_volume(&self, _: Request<CreateVolumeRequest>) -> Answer<CreateVolumeResponse> {
        Err(Status::unimplemented(""))
    }
    async fn delete_volume(&self, _: Request<DeleteVolumeRequest>) -> Answer<DeleteVolumeResponse> {
        Err(Status::unimplemented(""))
    }
    async fn controller_publish_volume(
        &self,
        r: Request<ControllerPublishVolumeRequest>,
    ) -> Answer<ControllerPublishVolumeResponse> {
        self.enter("ControllerPublishVolume", Call::ControllerPublish(r.into_inner())).await?;
        let publish_context = self.lock().behaviour.publish_context.clone().into_iter().collect();
        Ok(Response::new(ControllerPublishVolumeResponse { publish_context }))
    }
    async fn controller_unpublish_volume(
        &self,
        r: Request<ControllerUnpublishVolumeRequest>,
    ) -> Answer<ControllerUnpublishVolumeResponse> {
        self.enter("ControllerUnpublishVolume", Call::ControllerUnpublish(r.into_inner())).await?;
        Ok(Response::new(ControllerUnpublishVolumeResponse {}))
    }
    async fn validate_volume_capabilities(
        &self,
        _: Request<ValidateVolumeCapabilitiesRequest>,
    ) -> Answer<ValidateVolumeCapabilitiesResponse> {
        Err(Status::unimplemented(""))
    }
    async fn list_volumes(&self, _: Request<ListVolumesRequest>) -> Answer<ListVolumesResponse> {
        Err(Status::unimplemented(""))
    }
    async fn get_capacity(&self, _: Request<GetCapacityRequest>) -> Answer<GetCapacityResponse> {
        Err(Status::unimplemented(""))
    }
    async fn controller_get_capabilities(
        &self,
        _: Request<ControllerGetCapabilitiesRequest>,
    ) -> Answer<ControllerGetCapabilitiesResponse> {
        self.enter("ControllerGetCapabilities", Call::ControllerGetCapabilities).await?;
        let capabilities = self
            .lock()
            .behaviour
            .controller_caps
            .iter()
            .flatten()
            .map(|t| ControllerServiceCapability {
                r#type: Some(controller_service_capability::Type::Rpc(controller_service_capability::Rpc {
                    r#type: *t as i32,
                })),
            })
            .collect();
        Ok(Response::new(ControllerGetCapabilitiesResponse { capabilities }))
    }
    async fn create_snapshot(&self, _: Request<CreateSnapshotRequest>) -> Answer<CreateSnapshotResponse> {
        Err(Status::unimplemented(""))
    }
    async fn delete_snapshot(&self, _: Request<DeleteSnapshotRequest>) -> Answer<DeleteSnapshotResponse> {
        Err(Status::unimplemented(""))
    }
    async fn list_snapshots(&self, _: Request<ListSnapshotsRequest>) -> Answer<ListSnapshotsResponse> {
        Err(Status::unimplemented(""))
    }
    async fn controller_expand_volume(
        &self,
        _: Request<ControllerExpandVolumeRequest>,
    ) -> Answer<ControllerExpandVolumeResponse> {
        Err(Status::unimplemented(""))
    }
    async fn controller_modify_volume(
        &self,
        _: Request<ControllerModifyVolumeRequest>,
    ) -> Answer<ControllerModifyVolumeResponse> {
        Err(Status::unimplemented(""))
    }
}

/// The fake driver serving on a unix socket from a runtime of its own, so killing the runtime
/// is the driver process dying: every connection and in-flight handler goes with it.
struct Driver {
    runtime: Option<tokio::runtime::Runtime>,
}

impl Driver {
    fn start(socket: &Path, fake: &Fake) -> Driver {
        let runtime =
            tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build().unwrap();
        let listener = {
            let _in_runtime = runtime.enter();
            UnixListener::bind(socket).unwrap()
        };
        let mut router = tonic::transport::Server::builder()
            .add_service(IdentityServer::new(fake.clone()))
            .add_service(NodeServer::new(fake.clone()));
        if fake.lock().behaviour.controller_caps.is_some() {
            router = router.add_service(ControllerServer::new(fake.clone()));
        }
        runtime.spawn(router.serve_with_incoming(UnixListenerStream::new(listener)));
        Driver { runtime: Some(runtime) }
    }

    fn kill(&mut self) {
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        self.kill();
    }
}

// ---- The node around the plugin ----

/// A node root, the fake driver on its socket, and what the plugin's host reads.
struct Fixture {
    _dir: kvol_test_support::ScratchRoot,
    root: PathBuf,
    socket: PathBuf,
    fake: Fake,
    driver: Driver,
    objects: MemoryObjects,
    mounter: Arc<RecordingMounter>,
    plugin: CsiPlugin,
}

struct Setup {
    driver_name: &'static str,
    behaviour: Behaviour,
    csidriver: Option<CSIDriverSpec>,
    secrets: Vec<Secret>,
    call_timeout: Duration,
    tokens: Option<Arc<dyn kvol_csi::TokenSource>>,
}

impl Setup {
    fn new() -> Setup {
        Setup {
            driver_name: DRIVER,
            behaviour: Behaviour::default(),
            csidriver: None,
            secrets: Vec::new(),
            call_timeout: Duration::from_secs(20),
            tokens: None,
        }
    }

    fn tokens(mut self, tokens: Arc<dyn kvol_csi::TokenSource>) -> Setup {
        self.tokens = Some(tokens);
        self
    }

    fn node_caps(mut self, caps: &[NodeCap]) -> Setup {
        self.behaviour.node_caps = caps.to_vec();
        self
    }

    fn controller(mut self, caps: &[controller_service_capability::rpc::Type]) -> Setup {
        self.behaviour.controller_caps = Some(caps.to_vec());
        self
    }

    fn csidriver(mut self, spec: CSIDriverSpec) -> Setup {
        self.csidriver = Some(spec);
        self
    }

    fn secret(mut self, namespace: &str, name: &str, values: &[(&str, &str)]) -> Setup {
        self.secrets.push(secret(namespace, name, values));
        self
    }

    async fn start(self) -> Fixture {
        let dir = kvol_test_support::ScratchRoot::new();
        let base = dir.path().canonicalize().unwrap();
        let root = base.join("kubelet");
        fs::create_dir_all(&root).unwrap();
        let socket = base.join("csi.sock");
        let fake = Fake::default();
        fake.lock().behaviour = self.behaviour;
        let driver = Driver::start(&socket, &fake);
        let objects = MemoryObjects::new();
        if let Some(spec) = self.csidriver {
            objects.put_csi_driver(csidriver(self.driver_name, spec));
        }
        let mut secrets = SecretMap::default();
        for s in self.secrets {
            secrets.insert(s);
        }
        let mounter = Arc::new(RecordingMounter::new());
        let host = PluginHost::new(NodePaths::new(&root), NodeInfo::named(NODE), mounter.clone())
            .with_secrets(Arc::new(secrets));
        let client =
            CsiClient::new(self.driver_name, &socket, Timeouts::with_call(self.call_timeout)).unwrap();
        let plugin = CsiPlugin::connect(self.driver_name, client, host, Arc::new(objects.clone()), NODE_ID)
            .await
            .unwrap()
            .with_tokens(self.tokens);
        Fixture { _dir: dir, root, socket, fake, driver, objects, mounter, plugin }
    }
}

impl Fixture {
    /// The calls after the capability queries `connect` made.
    fn volume_calls(&self) -> Vec<Call> {
        self.fake
            .calls()
            .into_iter()
            .filter(|c| !matches!(c, Call::NodeGetCapabilities | Call::ControllerGetCapabilities))
            .collect()
    }

    fn target(&self, volume: &str) -> PathBuf {
        self.plugin.pod_volume_dir("uid-1", volume).unwrap()
    }

    fn set_csidriver(&self, spec: Option<CSIDriverSpec>) {
        match spec {
            Some(spec) => self.objects.put_csi_driver(csidriver(self.plugin.driver(), spec)),
            None => self.objects.remove_csi_driver(self.plugin.driver()),
        }
    }
}

fn csidriver(name: &str, spec: CSIDriverSpec) -> CSIDriver {
    CSIDriver { metadata: ObjectMeta { name: Some(name.into()), ..Default::default() }, spec }
}

fn secret(namespace: &str, name: &str, values: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(values.iter().map(|(k, v)| (k.to_string(), ByteString(v.as_bytes().to_vec()))).collect()),
        ..Default::default()
    }
}

fn secret_ref(namespace: &str, name: &str) -> Option<SecretReference> {
    Some(SecretReference { namespace: Some(namespace.into()), name: Some(name.into()) })
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|s| s.to_string()).collect()
}

fn map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

fn sorted<K: Ord, V>(m: impl IntoIterator<Item = (K, V)>) -> BTreeMap<K, V> {
    m.into_iter().collect()
}

/// A CSI persistent volume of `DRIVER`.
fn csi_pv(name: &str, csi: CSIPersistentVolumeSource, access: &[&str], mount_options: &[&str]) -> VolumeSpec {
    pv(
        name,
        PersistentVolumeSpec {
            csi: Some(CSIPersistentVolumeSource { driver: DRIVER.into(), ..csi }),
            access_modes: Some(strings(access)),
            mount_options: (!mount_options.is_empty()).then(|| strings(mount_options)),
            ..Default::default()
        },
    )
}

fn plain_pv(name: &str, handle: &str) -> VolumeSpec {
    csi_pv(
        name,
        CSIPersistentVolumeSource { volume_handle: handle.into(), ..Default::default() },
        &["ReadWriteOnce"],
        &[],
    )
}

fn pod() -> PodInfo {
    PodInfo {
        name: "web-0".into(),
        namespace: "shop".into(),
        uid: "uid-1".into(),
        service_account: "web".into(),
        fs_group: None,
        fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
        memory_limit: None,
    }
}

fn publish_request<'a>(
    spec: &'a VolumeSpec,
    pod: &'a PodInfo,
    target: &'a Path,
    staging_path: Option<&'a Path>,
    device_path: Option<&'a str>,
) -> PublishRequest<'a> {
    PublishRequest {
        spec,
        pod,
        pod_volume_name: spec.name(),
        target,
        staging_path,
        device_path,
        read_only: false,
        mount_options: &[],
        projection: None,
    }
}

fn unpublish_request(target: &Path) -> UnpublishRequest<'_> {
    UnpublishRequest { pod_uid: "uid-1", pod_volume_name: "v", target, spec: None }
}

fn mount_capability(mode: Mode, fs_type: &str, flags: &[&str], group: &str) -> Option<VolumeCapability> {
    Some(VolumeCapability {
        access_mode: Some(AccessMode { mode: mode as i32 }),
        access_type: Some(AccessType::Mount(MountVolume {
            fs_type: fs_type.into(),
            mount_flags: strings(flags),
            volume_mount_group: group.into(),
        })),
    })
}

/// The CSI error behind a plugin error.
fn csi_error(e: &PluginError) -> &CsiError {
    match e {
        PluginError::Driver { source, .. } => {
            source.downcast_ref::<CsiError>().unwrap_or_else(|| panic!("not a csi error: {e}"))
        }
        other => panic!("not a driver error: {other}"),
    }
}

fn the_publish(calls: &[Call]) -> &NodePublishVolumeRequest {
    let publishes: Vec<_> =
        calls.iter().filter_map(|c| if let Call::Publish(p) = c { Some(p) } else { None }).collect();
    assert_eq!(publishes.len(), 1, "{calls:?}");
    publishes[0]
}

fn path_str(path: &Path) -> String {
    path.to_str().unwrap().to_string()
}

// ---- Tests ----

#[tokio::test]
async fn stage_publish_and_teardown_send_what_upstream_sends() {
    let f = Setup::new()
        .node_caps(&[NodeCap::StageUnstageVolume])
        .csidriver(CSIDriverSpec {
            pod_info_on_mount: Some(true),
            attach_required: Some(false),
            ..Default::default()
        })
        .secret("storage", "stage-creds", &[("key", "s3cret")])
        .secret("storage", "publish-creds", &[("token", "t0k")])
        .start()
        .await;
    let spec = csi_pv(
        "pv-1",
        CSIPersistentVolumeSource {
            volume_handle: "vol-1".into(),
            fs_type: Some("ext4".into()),
            volume_attributes: Some(map(&[("pool", "fast")])),
            node_stage_secret_ref: secret_ref("storage", "stage-creds"),
            node_publish_secret_ref: secret_ref("storage", "publish-creds"),
            ..Default::default()
        },
        &["ReadOnlyMany"],
        &["noatime"],
    );
    let capability = mount_capability(Mode::MultiNodeReaderOnly, "ext4", &["noatime"], "");
    assert_eq!(f.plugin.kind(), PluginKind::Csi);
    assert_eq!(f.plugin.serves(), [SourceKey::Csi(DRIVER)]);
    assert!(f.plugin.can_device_mount(&spec));

    // Stage.
    let stager = f.plugin.device_mounter().expect("STAGE_UNSTAGE_VOLUME offers staging");
    let staging = stager.device_mount_path(&spec).unwrap();
    let volume_dir = f.root.join("plugins/kubernetes.io/csi").join(DRIVER).join(paths::sha256_hex("vol-1"));
    assert_eq!(staging, volume_dir.join("globalmount"));
    stager.stage(&spec, None, &staging).await.unwrap();
    assert_eq!(
        f.volume_calls(),
        [Call::Stage(NodeStageVolumeRequest {
            volume_id: "vol-1".into(),
            publish_context: Default::default(),
            staging_target_path: path_str(&staging),
            volume_capability: capability.clone(),
            secrets: [("key".to_string(), "s3cret".to_string())].into(),
            volume_context: [("pool".to_string(), "fast".to_string())].into(),
        })]
    );
    assert!(staging.is_dir(), "kvol creates the staging directory");
    assert_eq!(
        paths::load_vol_data(&volume_dir).unwrap(),
        Some(VolData { driver_name: DRIVER.into(), volume_handle: "vol-1".into(), ..VolData::default() })
    );

    // Publish.
    f.fake.take_calls();
    let target = f.target("pv-1");
    assert_eq!(target, f.root.join("pods/uid-1/volumes/kubernetes.io~csi/pv-1"));
    let pod = pod();
    let req =
        PublishRequest { read_only: true, ..publish_request(&spec, &pod, &target, Some(&staging), None) };
    f.plugin.mounter().unwrap().publish(&req).await.unwrap();
    let calls = f.volume_calls();
    let publish = the_publish(&calls);
    assert_eq!(publish.volume_id, "vol-1");
    assert_eq!(publish.target_path, path_str(&target.join("mount")));
    assert_eq!(publish.staging_target_path, path_str(&staging));
    assert!(publish.readonly);
    assert_eq!(publish.volume_capability, capability);
    assert_eq!(sorted(publish.secrets.clone()), map(&[("token", "t0k")]));
    assert_eq!(
        sorted(publish.volume_context.clone()),
        map(&[
            ("pool", "fast"),
            (POD_NAME_KEY, "web-0"),
            (POD_NAMESPACE_KEY, "shop"),
            (POD_UID_KEY, "uid-1"),
            (SERVICE_ACCOUNT_KEY, "web"),
            (EPHEMERAL_KEY, "false"),
        ])
    );
    assert_eq!(
        paths::load_vol_data(&target).unwrap(),
        Some(VolData {
            driver_name: DRIVER.into(),
            volume_handle: "vol-1".into(),
            spec_volume_id: "pv-1".into(),
            node_name: NODE.into(),
            attachment_id: paths::attachment_id("vol-1", DRIVER, NODE),
            volume_lifecycle_mode: "Persistent".into(),
        })
    );

    // Tear down: each RPC names the same volume and path, and only empty directories go.
    f.fake.take_calls();
    f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap();
    stager.unstage(&staging).await.unwrap();
    assert_eq!(
        f.volume_calls(),
        [
            Call::Unpublish(NodeUnpublishVolumeRequest {
                volume_id: "vol-1".into(),
                target_path: path_str(&target.join("mount"))
            }),
            Call::Unstage(NodeUnstageVolumeRequest {
                volume_id: "vol-1".into(),
                staging_target_path: path_str(&staging)
            }),
        ]
    );
    assert!(!target.exists() && target.parent().unwrap().is_dir(), "only the volume's own directory goes");
    assert!(!volume_dir.exists());
    assert_eq!(f.mounter.calls(), [], "the driver mounts, not kvol");

    // Both teardowns are idempotent: nothing recorded, nothing called.
    f.fake.take_calls();
    f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap();
    stager.unstage(&staging).await.unwrap();
    assert_eq!(f.volume_calls(), []);
}

/// A token source that mints `<audience>:<pod uid>:<n>` and remembers what it was asked.
#[derive(Debug, Default)]
struct CountingTokens {
    asked: Mutex<Vec<(String, String, Option<i64>)>>,
}

#[async_trait::async_trait]
impl kvol_csi::TokenSource for CountingTokens {
    async fn token(
        &self,
        pod: &PodInfo,
        request: &kvol_csi::TokenAudience,
    ) -> Result<k8s_openapi::api::authentication::v1::TokenRequestStatus, String> {
        let mut asked = self.asked.lock().unwrap();
        asked.push((pod.uid.clone(), request.audience.clone(), request.expiration_seconds));
        if request.audience == "refused" {
            return Err("serviceaccounts \"web\" not found".into());
        }
        Ok(k8s_openapi::api::authentication::v1::TokenRequestStatus {
            token: Some(format!("{}:{}:{}", request.audience, pod.uid, asked.len())),
            expiration_timestamp: serde_json::from_value(serde_json::json!("2026-11-26T23:00:00Z")).ok(),
        })
    }
}

fn token_requests(audiences: &[(&str, Option<i64>)]) -> CSIDriverSpec {
    CSIDriverSpec {
        token_requests: Some(
            audiences
                .iter()
                .map(|(audience, expiration_seconds)| k8s_openapi::api::storage::v1::TokenRequest {
                    audience: audience.to_string(),
                    expiration_seconds: *expiration_seconds,
                })
                .collect(),
        ),
        ..Default::default()
    }
}

#[tokio::test]
async fn a_csidriver_with_token_requests_gets_the_pods_tokens_minted_at_each_publish() {
    let tokens = Arc::new(CountingTokens::default());
    let f = Setup::new()
        .csidriver(token_requests(&[("vault", Some(600)), ("", None)]))
        .tokens(tokens.clone())
        .start()
        .await;
    let spec = plain_pv("pv-1", "vol-1");
    let pod = pod();
    let target = f.target("pv-1");
    for round in 1..=2 {
        f.fake.take_calls();
        f.plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, None, None))
            .await
            .unwrap();
        let calls = f.volume_calls();
        let value =
            the_publish(&calls).volume_context.get(kvol_csi::tokens::SERVICE_ACCOUNT_TOKENS_KEY).cloned();
        let tokens: serde_json::Value = serde_json::from_str(&value.expect("the tokens key")).unwrap();
        // Fresh tokens each publish: a driver that requiresRepublish renews through it.
        let (first, second) = (2 * round - 1, 2 * round);
        assert_eq!(
            tokens,
            serde_json::json!({
                "": {"token": format!(":uid-1:{second}"), "expirationTimestamp": "2026-11-26T23:00:00Z"},
                "vault": {"token": format!("vault:uid-1:{first}"), "expirationTimestamp": "2026-11-26T23:00:00Z"},
            }),
            "round {round}"
        );
    }
    let asked = tokens.asked.lock().unwrap().clone();
    assert_eq!(asked[0], ("uid-1".to_string(), "vault".to_string(), Some(600)));
    assert_eq!(asked[1], ("uid-1".to_string(), String::new(), None));

    // A token the API server refuses fails the publish, naming the audience and the pod;
    // the driver is not called.
    f.set_csidriver(Some(token_requests(&[("refused", None)])));
    f.fake.take_calls();
    let e = f.plugin.mounter().unwrap().publish(&publish_request(&spec, &pod, &target, None, None)).await;
    let message = e.expect_err("no token, no publish").to_string();
    assert!(message.contains("\"refused\"") && message.contains("shop/web-0"), "{message}");
    assert!(!f.volume_calls().iter().any(|c| matches!(c, Call::Publish(_))), "{:?}", f.volume_calls());
}

#[tokio::test]
async fn without_a_token_source_a_driver_asking_for_tokens_cannot_publish() {
    let f = Setup::new().csidriver(token_requests(&[("vault", None)])).start().await;
    let spec = plain_pv("pv-1", "vol-1");
    let pod = pod();
    let e = f
        .plugin
        .mounter()
        .unwrap()
        .publish(&publish_request(&spec, &pod, &f.target("pv-1"), None, None))
        .await;
    let message = e.expect_err("standalone cannot mint tokens").to_string();
    assert!(message.contains(DRIVER) && message.contains("tokenRequests"), "{message}");
    assert!(!f.volume_calls().iter().any(|c| matches!(c, Call::Publish(_))));
}

#[tokio::test]
async fn pod_information_reaches_the_driver_only_when_the_csidriver_asks() {
    let f = Setup::new().start().await;
    let spec = csi_pv(
        "pv-1",
        CSIPersistentVolumeSource {
            volume_handle: "vol-1".into(),
            volume_attributes: Some(map(&[("pool", "fast")])),
            ..Default::default()
        },
        &["ReadWriteOnce"],
        &[],
    );
    let pod_keys = [POD_NAME_KEY, POD_NAMESPACE_KEY, POD_UID_KEY, SERVICE_ACCOUNT_KEY, EPHEMERAL_KEY];
    // The same plugin throughout: the CSIDriver is read at each call.
    let table = [
        (None, false),
        (Some(CSIDriverSpec::default()), false),
        (Some(CSIDriverSpec { pod_info_on_mount: Some(false), ..Default::default() }), false),
        (Some(CSIDriverSpec { pod_info_on_mount: Some(true), ..Default::default() }), true),
    ];
    for (i, (csidriver, want_pod_info)) in table.into_iter().enumerate() {
        f.set_csidriver(csidriver.clone());
        f.fake.take_calls();
        let target = f.target(&format!("pv-{i}"));
        let pod = pod();
        f.plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, None, None))
            .await
            .unwrap();
        let calls = f.volume_calls();
        let context = &the_publish(&calls).volume_context;
        assert_eq!(context.get("pool").map(String::as_str), Some("fast"), "{csidriver:?}");
        for key in pod_keys {
            assert_eq!(context.contains_key(key), want_pod_info, "{key} with {csidriver:?}");
        }
    }
}

#[tokio::test]
async fn without_stage_unstage_publish_goes_straight_to_the_target() {
    let f = Setup::new().start().await;
    let spec = plain_pv("pv-1", "vol-1");
    assert!(f.plugin.device_mounter().is_none());
    assert!(!f.plugin.can_device_mount(&spec));
    assert!(!f.plugin.capabilities().device_mountable);
    let target = f.target("pv-1");
    let pod = pod();
    f.plugin.mounter().unwrap().publish(&publish_request(&spec, &pod, &target, None, None)).await.unwrap();
    let calls = f.volume_calls();
    let publish = the_publish(&calls);
    assert_eq!(publish.staging_target_path, "", "no staging path without STAGE_UNSTAGE_VOLUME");
    assert_eq!(publish.volume_capability, mount_capability(Mode::SingleNodeWriter, "", &[], ""));
    assert!(!publish.readonly);
}

#[tokio::test]
async fn single_node_multi_writer_drivers_get_the_new_access_modes() {
    let f = Setup::new().node_caps(&[NodeCap::SingleNodeMultiWriter]).start().await;
    let table = [
        ("ReadWriteOncePod", Mode::SingleNodeSingleWriter),
        ("ReadWriteOnce", Mode::SingleNodeMultiWriter),
        ("ReadWriteMany", Mode::MultiNodeMultiWriter),
    ];
    for (access, want) in table {
        let name = format!("pv-{}", access.to_lowercase());
        let spec = csi_pv(
            &name,
            CSIPersistentVolumeSource { volume_handle: name.clone(), ..Default::default() },
            &[access],
            &[],
        );
        f.fake.take_calls();
        let target = f.target(&name);
        let pod = pod();
        f.plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, None, None))
            .await
            .unwrap();
        let calls = f.volume_calls();
        assert_eq!(the_publish(&calls).volume_capability, mount_capability(want, "", &[], ""), "{access}");
    }
}

#[tokio::test]
async fn the_publish_context_of_attach_flows_to_stage_and_publish() {
    use controller_service_capability::rpc::Type as ControllerCap;
    let mut setup = Setup::new()
        .node_caps(&[NodeCap::StageUnstageVolume])
        .controller(&[ControllerCap::PublishUnpublishVolume])
        .secret("storage", "ctrl-creds", &[("admin", "pw")]);
    setup.behaviour.publish_context = map(&[("devicePath", "/dev/fake0")]);
    let f = setup.start().await;
    let spec = csi_pv(
        "pv-1",
        CSIPersistentVolumeSource {
            volume_handle: "vol-1".into(),
            read_only: Some(true),
            volume_attributes: Some(map(&[("pool", "fast")])),
            controller_publish_secret_ref: secret_ref("storage", "ctrl-creds"),
            ..Default::default()
        },
        &["ReadWriteOnce"],
        &[],
    );
    let attacher = f.plugin.attacher().unwrap();
    assert!(f.plugin.can_attach(&spec), "no CSIDriver: attach is required");
    assert!(!attacher.is_attached(&spec, NODE).await.unwrap());

    let device_path = attacher.attach(&spec, NODE).await.unwrap().expect("a publish context");
    assert_eq!(device_path, r#"{"devicePath":"/dev/fake0"}"#);
    assert_eq!(
        f.volume_calls(),
        [Call::ControllerPublish(ControllerPublishVolumeRequest {
            volume_id: "vol-1".into(),
            node_id: NODE_ID.into(),
            volume_capability: mount_capability(Mode::SingleNodeWriter, "", &[], ""),
            readonly: true,
            secrets: [("admin".to_string(), "pw".to_string())].into(),
            volume_context: [("pool".to_string(), "fast".to_string())].into(),
        })]
    );
    assert!(attacher.is_attached(&spec, NODE).await.unwrap());
    assert!(!attacher.is_attached(&spec, "node-b").await.unwrap());
    let err = attacher.attach(&spec, "node-b").await.unwrap_err().to_string();
    assert!(err.contains("kvol attaches volumes only to its own node \"node-a\""), "{err}");
    assert_eq!(attacher.wait_for_attach(&spec, None, Duration::ZERO).await.unwrap(), device_path);

    // Stage gets the context from the device path; publish, given none, from the record.
    f.fake.take_calls();
    let stager = f.plugin.device_mounter().unwrap();
    let staging = stager.device_mount_path(&spec).unwrap();
    stager.stage(&spec, Some(&device_path), &staging).await.unwrap();
    let target = f.target("pv-1");
    let pod = pod();
    f.plugin
        .mounter()
        .unwrap()
        .publish(&publish_request(&spec, &pod, &target, Some(&staging), None))
        .await
        .unwrap();
    let calls = f.volume_calls();
    let Call::Stage(stage) = &calls[0] else { panic!("{calls:?}") };
    assert_eq!(sorted(stage.publish_context.clone()), map(&[("devicePath", "/dev/fake0")]));
    assert_eq!(sorted(the_publish(&calls).publish_context.clone()), map(&[("devicePath", "/dev/fake0")]));

    // Teardown keeps the attach record until detach, which sends the attach's Secret again.
    f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap();
    stager.unstage(&staging).await.unwrap();
    let volume_dir = staging.parent().unwrap();
    assert!(volume_dir.join(paths::ATTACHMENT_FILE).is_file());
    f.fake.take_calls();
    attacher.detach(&f.plugin.volume_name(&spec).unwrap(), NODE).await.unwrap();
    assert_eq!(
        f.volume_calls(),
        [Call::ControllerUnpublish(ControllerUnpublishVolumeRequest {
            volume_id: "vol-1".into(),
            node_id: NODE_ID.into(),
            secrets: [("admin".to_string(), "pw".to_string())].into(),
        })]
    );
    assert!(!volume_dir.exists());
    assert!(!attacher.is_attached(&spec, NODE).await.unwrap());
}

/// A VolumeAttachment as the attach/detach controller and external-attacher leave it.
fn volume_attachment(
    name: &str,
    node: &str,
    status: serde_json::Value,
) -> k8s_openapi::api::storage::v1::VolumeAttachment {
    serde_json::from_value(serde_json::json!({
        "metadata": {"name": name},
        "spec": {"attacher": DRIVER, "nodeName": node, "source": {"persistentVolumeName": "pv-1"}},
        "status": status,
    }))
    .unwrap()
}

#[tokio::test]
async fn in_cluster_mode_attach_waits_for_the_volumeattachment_and_never_calls_the_controller() {
    use controller_service_capability::rpc::Type as ControllerCap;
    let mut f = Setup::new()
        .node_caps(&[NodeCap::StageUnstageVolume])
        .controller(&[ControllerCap::PublishUnpublishVolume])
        .start()
        .await;
    let attachments = MemoryAttachments::default();
    f.plugin = f.plugin.with_attachments(Some(Arc::new(attachments.clone())));
    let spec = plain_pv("pv-1", "vol-1");
    let name = paths::attachment_id("vol-1", DRIVER, NODE);
    let attacher = f.plugin.attacher().unwrap();
    assert_eq!(attacher.attach(&spec, NODE).await.unwrap(), None, "the controller attaches");
    assert!(!attacher.is_attached(&spec, NODE).await.unwrap());
    let err = attacher.wait_for_attach(&spec, None, Duration::from_secs(3)).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "timed out after 3s: waiting for the attach/detach controller to create volumeattachment {name}"
        )),
        "{err}"
    );

    attachments.put(volume_attachment(
        &name,
        NODE,
        serde_json::json!({"attachError": {"message": "disk in use by node-z"}}),
    ));
    let err = attacher.wait_for_attach(&spec, None, Duration::from_secs(3)).await.unwrap_err().to_string();
    assert!(
        err.contains("csi driver fake.csi.kvol.io: attach of volume \"vol-1\" failed")
            && err.ends_with("disk in use by node-z"),
        "{err}"
    );

    attachments.put(volume_attachment(
        &name,
        NODE,
        serde_json::json!({"attached": true, "attachmentMetadata": {"devicePath": "/dev/va0"}}),
    ));
    assert!(attacher.is_attached(&spec, NODE).await.unwrap());
    let device_path = attacher.wait_for_attach(&spec, None, Duration::from_secs(3)).await.unwrap();
    assert_eq!(device_path, r#"{"devicePath":"/dev/va0"}"#);
    let stager = f.plugin.device_mounter().unwrap();
    let staging = stager.device_mount_path(&spec).unwrap();
    stager.stage(&spec, Some(&device_path), &staging).await.unwrap();
    stager.unstage(&staging).await.unwrap();
    attacher.detach(&f.plugin.volume_name(&spec).unwrap(), NODE).await.unwrap();
    let calls = f.volume_calls();
    let Call::Stage(stage) = &calls[0] else { panic!("{calls:?}") };
    assert_eq!(sorted(stage.publish_context.clone()), map(&[("devicePath", "/dev/va0")]));
    assert!(
        !calls.iter().any(|c| matches!(c, Call::ControllerPublish(_) | Call::ControllerUnpublish(_))),
        "no controller calls from the node in cluster mode: {calls:?}"
    );
}

#[tokio::test]
async fn without_publish_unpublish_attach_calls_nothing() {
    use controller_service_capability::rpc::Type as ControllerCap;
    let f = Setup::new().controller(&[ControllerCap::CreateDeleteVolume]).start().await;
    let spec = plain_pv("pv-1", "vol-1");
    let attacher = f.plugin.attacher().unwrap();
    assert_eq!(attacher.attach(&spec, NODE).await.unwrap(), None);
    assert!(attacher.is_attached(&spec, NODE).await.unwrap());
    attacher.detach(&format!("{DRIVER}^vol-1"), NODE).await.unwrap();
    assert_eq!(f.volume_calls(), []);
    let err = attacher.detach("other.csi.io^vol-1", NODE).await.unwrap_err().to_string();
    assert!(err.contains("it belongs to csi driver \"other.csi.io\""), "{err}");
}

#[tokio::test]
async fn attach_required_is_read_from_the_csidriver_at_lookup_time() {
    let f = Setup::new().node_caps(&[NodeCap::StageUnstageVolume]).start().await;
    let plugin: kvol_plugin::PluginRef = Arc::new(
        CsiPlugin::new(
            DRIVER,
            f.plugin.client().clone(),
            f.plugin.host().clone(),
            Arc::new(f.objects.clone()),
            NODE_ID,
        )
        .with_capabilities(f.plugin.driver_capabilities()),
    );
    let registry = PluginRegistry::new(vec![]).unwrap();
    assert!(registry.apply(DynamicSource::Csi, [ProbeEvent::AddOrUpdate(plugin)]).is_empty());
    let spec = plain_pv("pv-1", "vol-1");
    let ephemeral = inline(Volume {
        csi: Some(CSIVolumeSource { driver: DRIVER.into(), ..Default::default() }),
        ..volume("scratch")
    });
    let attachable = |spec: &VolumeSpec| {
        registry.snapshot().find_attachable_by_spec(spec).unwrap().map(|p| p.name().to_string())
    };
    let table = [
        (None, Some(DRIVER.to_string())),
        (Some(CSIDriverSpec { attach_required: Some(false), ..Default::default() }), None),
        (Some(CSIDriverSpec { attach_required: Some(true), ..Default::default() }), Some(DRIVER.to_string())),
        (Some(CSIDriverSpec::default()), Some(DRIVER.to_string())),
    ];
    for (csidriver, want) in table {
        f.set_csidriver(csidriver.clone());
        assert_eq!(attachable(&spec), want, "{csidriver:?}");
        assert_eq!(attachable(&ephemeral), None, "ephemeral volumes never attach ({csidriver:?})");
    }
    let snapshot = registry.snapshot();
    assert!(snapshot.find_device_mountable_by_spec(&spec).unwrap().is_some());
    assert!(snapshot.find_device_mountable_by_spec(&ephemeral).unwrap().is_none());
    assert_eq!(snapshot.find_persistent_by_spec(&spec).unwrap().name(), DRIVER);
}

#[tokio::test]
async fn ephemeral_inline_volumes_follow_volume_lifecycle_modes() {
    let f = Setup::new().secret("shop", "inline-creds", &[("token", "t")]).start().await;
    let ephemeral = inline(Volume {
        csi: Some(CSIVolumeSource {
            driver: DRIVER.into(),
            read_only: Some(true),
            fs_type: Some("ext4".into()),
            volume_attributes: Some(map(&[("size", "1Gi")])),
            node_publish_secret_ref: Some(LocalObjectReference { name: "inline-creds".into() }),
        }),
        ..volume("scratch")
    });
    let persistent = plain_pv("pv-1", "vol-1");
    let modes = |modes: &[&str]| CSIDriverSpec {
        volume_lifecycle_modes: Some(strings(modes)),
        pod_info_on_mount: Some(true),
        ..Default::default()
    };
    let table: [(Option<CSIDriverSpec>, &VolumeSpec, Option<&str>); 5] = [
        (
            None,
            &ephemeral,
            Some(&format!(
                "csi driver {DRIVER}: ephemeral inline volumes are not supported (there is no CSIDriver object \
                 named {DRIVER}, and without one only persistent volumes are served)"
            )),
        ),
        (
            Some(modes(&["Persistent"])),
            &ephemeral,
            Some(&format!(
                "csi driver {DRIVER}: ephemeral inline volumes are not supported (its CSIDriver lists \
                 volumeLifecycleModes [Persistent])"
            )),
        ),
        (
            Some(modes(&["Ephemeral"])),
            &persistent,
            Some(&format!(
                "csi driver {DRIVER}: persistent volumes are not supported (its CSIDriver lists \
                 volumeLifecycleModes [Ephemeral])"
            )),
        ),
        (Some(modes(&["Ephemeral"])), &ephemeral, None),
        (Some(modes(&["Persistent", "Ephemeral"])), &ephemeral, None),
    ];
    for (csidriver, spec, refusal) in table {
        f.set_csidriver(csidriver.clone());
        f.fake.take_calls();
        let target = f.target(spec.name());
        let pod = pod();
        let result =
            f.plugin.mounter().unwrap().publish(&publish_request(spec, &pod, &target, None, None)).await;
        match refusal {
            Some(message) => {
                let err = result.unwrap_err();
                assert!(matches!(csi_error(&err), CsiError::Policy { .. }), "{err}");
                assert_eq!(csi_error(&err).to_string(), message);
                assert_eq!(f.volume_calls(), [], "refused before reaching the driver");
                assert!(!target.exists(), "refused before creating anything");
            }
            None => {
                result.unwrap();
                let calls = f.volume_calls();
                let publish = the_publish(&calls);
                assert_eq!(publish.volume_id, policy::ephemeral_volume_handle("uid-1", "scratch"));
                assert_eq!(publish.staging_target_path, "");
                assert!(publish.publish_context.is_empty());
                assert!(publish.readonly);
                assert_eq!(
                    publish.volume_capability,
                    mount_capability(Mode::SingleNodeWriter, "ext4", &[], "")
                );
                assert_eq!(
                    sorted(publish.secrets.clone()),
                    map(&[("token", "t")]),
                    "secret read in the pod's namespace"
                );
                assert_eq!(
                    sorted(publish.volume_context.clone()),
                    map(&[
                        ("size", "1Gi"),
                        (POD_NAME_KEY, "web-0"),
                        (POD_NAMESPACE_KEY, "shop"),
                        (POD_UID_KEY, "uid-1"),
                        (SERVICE_ACCOUNT_KEY, "web"),
                        (EPHEMERAL_KEY, "true"),
                    ])
                );
                let record = paths::load_vol_data(&target).unwrap().unwrap();
                assert_eq!(record.volume_lifecycle_mode, "Ephemeral");
                f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap();
                assert!(!target.exists());
            }
        }
    }
    assert!(!f.plugin.can_attach(&ephemeral));
    assert!(f.plugin.device_mounter().is_none());
}

#[tokio::test]
async fn grpc_codes_come_back_with_whether_to_retry() {
    let f = Setup::new().start().await;
    let spec = plain_pv("pv-1", "vol-1");
    let table = [
        (Code::NotFound, false),
        (Code::InvalidArgument, false),
        (Code::FailedPrecondition, false),
        (Code::Internal, false),
        (Code::Unavailable, true),
        (Code::Aborted, true),
        (Code::ResourceExhausted, true),
    ];
    for (i, (code, retriable)) in table.into_iter().enumerate() {
        f.fake.behave(|b| {
            b.fail.insert("NodePublishVolume", (code, "volume vol-1 is unwell".into()));
        });
        let target = f.target(&format!("pv-{i}"));
        let pod = pod();
        let err = f
            .plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, None, None))
            .await
            .unwrap_err();
        match csi_error(&err) {
            CsiError::Rpc { driver, rpc, code: got, message, retriable: r } => {
                assert_eq!(
                    (driver.as_str(), *rpc, *got, message.as_str()),
                    (DRIVER, "NodePublishVolume", code, "volume vol-1 is unwell")
                );
                assert_eq!(*r, retriable, "{code:?}");
            }
            other => panic!("{code:?}: {other}"),
        }
        let retry = if retriable { ", will retry" } else { "" };
        assert_eq!(
            err.to_string(),
            format!(
                "volume plugin {DRIVER}: csi driver {DRIVER}: NodePublishVolume failed ({code:?}{retry}): \
                 volume vol-1 is unwell"
            )
        );
        // A final error undoes the publish; after a retriable one the driver may still be
        // publishing, so the record that lets unpublish clean up stays.
        assert_eq!(target.join(paths::VOL_DATA_FILE).exists(), retriable, "{code:?}");
        assert_eq!(target.exists(), retriable, "{code:?}");
    }
}

#[tokio::test]
async fn a_driver_that_never_answers_times_out() {
    let mut setup = Setup::new();
    setup.call_timeout = Duration::from_millis(300);
    let f = setup.start().await;
    f.fake.behave(|b| {
        b.hang.insert("NodePublishVolume");
    });
    let spec = plain_pv("pv-1", "vol-1");
    let target = f.target("pv-1");
    let pod = pod();
    let started = Instant::now();
    let err = f
        .plugin
        .mounter()
        .unwrap()
        .publish(&publish_request(&spec, &pod, &target, None, None))
        .await
        .unwrap_err();
    let took = started.elapsed();
    match csi_error(&err) {
        CsiError::Timeout { driver, rpc, limit } => {
            assert_eq!(
                (driver.as_str(), *rpc, *limit),
                (DRIVER, "NodePublishVolume", Duration::from_millis(300))
            );
        }
        other => panic!("{other}"),
    }
    assert!(csi_error(&err).is_retriable());
    assert_eq!(
        err.to_string(),
        format!("volume plugin {DRIVER}: csi driver {DRIVER}: NodePublishVolume did not answer within 300ms")
    );
    assert!(took >= Duration::from_millis(300) && took < Duration::from_secs(10), "{took:?}");
    assert!(
        target.join(paths::VOL_DATA_FILE).exists(),
        "a timed-out publish may still complete: keep the record"
    );
}

#[tokio::test]
async fn a_vanished_socket_is_a_connect_error() {
    let mut f = Setup::new().start().await;
    assert!(f.plugin.client().probe().await.unwrap());
    f.driver.kill();
    fs::remove_file(&f.socket).unwrap();
    let fresh = CsiClient::new(DRIVER, &f.socket, Timeouts::with_call(Duration::from_secs(5))).unwrap();
    for client in [&fresh, f.plugin.client()] {
        // The plugin's own client may first notice its old connection is gone.
        let mut err = client.probe().await.unwrap_err();
        if !matches!(err, CsiError::Connect { .. }) {
            err = client.probe().await.unwrap_err();
        }
        match &err {
            CsiError::Connect { driver, endpoint, reason } => {
                assert_eq!((driver.as_str(), endpoint.as_str()), (DRIVER, path_str(&f.socket).as_str()));
                assert!(reason.contains("No such file or directory"), "{reason}");
            }
            other => panic!("{other}"),
        }
        assert!(err.is_retriable());
        assert!(
            err.to_string()
                .starts_with(&format!("csi driver {DRIVER}: cannot connect to {}: ", f.socket.display())),
            "{err}"
        );
    }
}

#[tokio::test]
async fn a_driver_dying_mid_publish_is_a_clear_error() {
    let mut f = Setup::new().start().await;
    f.fake.behave(|b| {
        b.hang.insert("NodePublishVolume");
    });
    let spec = plain_pv("pv-1", "vol-1");
    let target = f.target("pv-1");
    let pod = pod();
    let req = publish_request(&spec, &pod, &target, None, None);
    let fake = f.fake.clone();
    let driver = &mut f.driver;
    let started = Instant::now();
    let (result, ()) = tokio::join!(f.plugin.mounter().unwrap().publish(&req), async {
        while !fake.calls().iter().any(|c| matches!(c, Call::Publish(_))) {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        driver.kill();
    });
    let err = result.unwrap_err();
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the error comes when the driver dies, not at the deadline"
    );
    match csi_error(&err) {
        CsiError::Rpc { driver, rpc, code, message, retriable } => {
            assert_eq!(
                (driver.as_str(), *rpc, *code, *retriable),
                (DRIVER, "NodePublishVolume", Code::Unavailable, true)
            );
            assert!(message.starts_with("the connection to the driver broke during the call: "), "{message}");
        }
        other => panic!("{other:?}"),
    }
    let text = err.to_string();
    assert!(
        text.starts_with(&format!(
            "volume plugin {DRIVER}: csi driver {DRIVER}: NodePublishVolume failed (Unavailable, will retry): "
        )),
        "{text}"
    );
    assert!(target.join(paths::VOL_DATA_FILE).exists(), "the publish may have happened: keep the record");
}

#[tokio::test]
async fn migrated_in_tree_volumes_are_ordinary_csi_volumes() {
    use kvol_api::MigratablePlugin;
    let driver = MigratablePlugin::AwsEbs.csi_driver();
    let mut setup = Setup::new().node_caps(&[NodeCap::StageUnstageVolume]);
    setup.driver_name = driver;
    let f = setup.start().await;
    let in_tree = kvol_plugin::testing::in_tree_pv("pv-ebs", MigratablePlugin::AwsEbs);
    let inline_in_tree = kvol_plugin::testing::inline_in_tree("ebs-inline", MigratablePlugin::AwsEbs);
    for original in [in_tree, inline_in_tree] {
        let spec = kvol_plugin::migration::translate_spec(&original).unwrap();
        assert!(spec.migrated.is_some(), "{spec}");
        assert!(f.plugin.can_support(&spec), "{spec}");
        let handle = spec.pv().unwrap().spec.as_ref().unwrap().csi.as_ref().unwrap().volume_handle.clone();
        assert_eq!(f.plugin.volume_name(&spec).unwrap(), format!("{driver}^{handle}"));
        assert!(f.plugin.can_attach(&spec) && f.plugin.can_device_mount(&spec));

        f.fake.take_calls();
        let stager = f.plugin.device_mounter().unwrap();
        let staging = stager.device_mount_path(&spec).unwrap();
        stager.stage(&spec, None, &staging).await.unwrap();
        let target = f.target(spec.name());
        let pod = pod();
        f.plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, Some(&staging), None))
            .await
            .unwrap();
        f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap();
        stager.unstage(&staging).await.unwrap();
        let calls = f.volume_calls();
        let ids: Vec<&str> = calls
            .iter()
            .map(|c| match c {
                Call::Stage(r) => r.volume_id.as_str(),
                Call::Publish(r) => r.volume_id.as_str(),
                Call::Unpublish(r) => r.volume_id.as_str(),
                Call::Unstage(r) => r.volume_id.as_str(),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ids, [handle.as_str(); 4], "{spec}");
        assert!(!target.exists() && !staging.exists(), "{spec}");
    }
}

#[tokio::test]
async fn node_expansion_sends_size_paths_and_secret() {
    let f = Setup::new()
        .node_caps(&[NodeCap::StageUnstageVolume, NodeCap::ExpandVolume])
        .secret("storage", "expand-creds", &[("k", "v")])
        .start()
        .await;
    let spec = csi_pv(
        "pv-1",
        CSIPersistentVolumeSource {
            volume_handle: "vol-1".into(),
            fs_type: Some("xfs".into()),
            node_expand_secret_ref: secret_ref("storage", "expand-creds"),
            ..Default::default()
        },
        &["ReadWriteOnce"],
        &[],
    );
    // Given the pod volume directory, as the agent gives it; the driver is told where publish
    // mounted the volume.
    let mount = f.target("pv-1").join("mount");
    let expander = f.plugin.node_expander().expect("EXPAND_VOLUME offers node expansion");
    expander.expand_on_node(&spec, None, &f.target("pv-1"), 2 << 30, 1 << 30).await.unwrap();
    assert_eq!(
        f.volume_calls(),
        [Call::Expand(NodeExpandVolumeRequest {
            volume_id: "vol-1".into(),
            volume_path: path_str(&mount),
            capacity_range: Some(CapacityRange { required_bytes: 2 << 30, limit_bytes: 0 }),
            staging_target_path: path_str(&f.plugin.stage_path("vol-1")),
            volume_capability: mount_capability(Mode::SingleNodeWriter, "xfs", &[], ""),
            secrets: [("k".to_string(), "v".to_string())].into(),
        })]
    );
    let plain = Setup::new().start().await;
    assert!(plain.plugin.node_expander().is_none());
    assert!(!plain.plugin.capabilities().node_expandable);
}

#[tokio::test]
async fn a_missing_secret_is_named_and_nothing_is_called() {
    let f = Setup::new().node_caps(&[NodeCap::StageUnstageVolume]).start().await;
    let spec = csi_pv(
        "pv-1",
        CSIPersistentVolumeSource {
            volume_handle: "vol-1".into(),
            node_stage_secret_ref: secret_ref("storage", "gone"),
            node_publish_secret_ref: secret_ref("storage", "gone-too"),
            ..Default::default()
        },
        &["ReadWriteOnce"],
        &[],
    );
    let stager = f.plugin.device_mounter().unwrap();
    let staging = stager.device_mount_path(&spec).unwrap();
    let err = stager.stage(&spec, None, &staging).await.unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "volume plugin {DRIVER}: csi driver {DRIVER}: cannot read nodeStageSecretRef secret storage/gone: \
             there is no such secret"
        )
    );
    let target = f.target("pv-1");
    let pod = pod();
    let err = f
        .plugin
        .mounter()
        .unwrap()
        .publish(&publish_request(&spec, &pod, &target, None, None))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .ends_with("cannot read nodePublishSecretRef secret storage/gone-too: there is no such secret"),
        "{err}"
    );
    assert_eq!(f.volume_calls(), []);
    assert!(!staging.exists() && !target.exists());
}

#[tokio::test]
async fn a_corrupt_volume_record_is_an_error_naming_it() {
    let f = Setup::new().start().await;
    let target = f.target("pv-1");
    fs::create_dir_all(target.join("mount")).unwrap();
    fs::write(target.join(paths::VOL_DATA_FILE), "{\"driverName\": ").unwrap();
    let err =
        f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap_err().to_string();
    let file = target.join(paths::VOL_DATA_FILE);
    assert!(err.starts_with(&format!("cannot parse volume record {}: ", file.display())), "{err}");
    assert_eq!(f.volume_calls(), []);
    assert!(target.join("mount").is_dir(), "nothing is removed");

    // A target without any record cannot be unpublished either: its handle is unknown.
    fs::remove_file(&file).unwrap();
    let err =
        f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap_err().to_string();
    assert!(err.contains("is missing, so the volume handle is unknown"), "{err}");
}

#[tokio::test]
async fn with_the_journals_record_a_lost_or_corrupt_volume_record_is_no_obstacle() {
    let f = Setup::new().start().await;
    let spec = plain_pv("pv-1", "vol-1");
    let target = f.target("pv-1");
    for record in [Some("{\"driverName\": "), Some(""), None] {
        fs::create_dir_all(target.join("mount")).unwrap();
        if let Some(text) = record {
            fs::write(target.join(paths::VOL_DATA_FILE), text).unwrap();
        }
        let request =
            UnpublishRequest { pod_uid: "uid-1", pod_volume_name: "v", target: &target, spec: Some(&spec) };
        f.plugin.mounter().unwrap().unpublish(&request).await.unwrap_or_else(|e| panic!("{record:?}: {e}"));
        let handles: Vec<String> = f
            .volume_calls()
            .into_iter()
            .filter_map(|c| match c {
                Call::Unpublish(r) => Some(r.volume_id),
                _ => None,
            })
            .collect();
        assert_eq!(handles.last().map(String::as_str), Some("vol-1"), "{record:?}: by the journal's handle");
        assert!(!target.exists(), "{record:?}: the pod volume directory is gone");
    }
}

#[tokio::test]
async fn unpublish_never_deletes_what_the_driver_left_behind() {
    let mut setup = Setup::new();
    setup.behaviour.create_target = true;
    setup.behaviour.keep_data = true;
    let f = setup.start().await;
    let spec = plain_pv("pv-1", "vol-1");
    let target = f.target("pv-1");
    let pod = pod();
    f.plugin.mounter().unwrap().publish(&publish_request(&spec, &pod, &target, None, None)).await.unwrap();
    let err =
        f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await.unwrap_err().to_string();
    assert!(
        err.contains(&format!(
            "{} is not empty after NodeUnpublishVolume; kvol never deletes data",
            target.join("mount").display()
        )),
        "{err}"
    );
    assert_eq!(fs::read_to_string(target.join("mount/data")).unwrap(), "payload");
    assert!(target.join(paths::VOL_DATA_FILE).exists(), "the record stays for the next try");
}

#[tokio::test]
async fn fs_group_is_applied_by_kvol_or_delegated_to_the_driver() {
    let gid = i64::from(nix::unistd::getegid().as_raw());
    let file_policy =
        |policy: &str| CSIDriverSpec { fs_group_policy: Some(policy.into()), ..Default::default() };
    // (node caps, fsGroupPolicy, fsType, kvol changes modes, driver gets the group)
    type Row = (&'static [NodeCap], Option<CSIDriverSpec>, &'static str, bool, bool);
    let table: [Row; 5] = [
        (&[], Some(file_policy("File")), "", true, false),
        (&[], Some(file_policy("None")), "ext4", false, false),
        (&[], None, "ext4", true, false),
        (&[], None, "", false, false),
        (&[NodeCap::VolumeMountGroup], Some(file_policy("File")), "ext4", false, true),
    ];
    for (caps, csidriver, fs_type, kvol_applies, delegated) in table {
        let mut setup = Setup::new().node_caps(caps);
        setup.behaviour.create_target = true;
        setup.csidriver = csidriver.clone();
        let f = setup.start().await;
        let spec = csi_pv(
            "pv-1",
            CSIPersistentVolumeSource {
                volume_handle: "vol-1".into(),
                fs_type: (!fs_type.is_empty()).then(|| fs_type.to_string()),
                ..Default::default()
            },
            &["ReadWriteOnce"],
            &[],
        );
        let target = f.target("pv-1");
        let pod = PodInfo { fs_group: Some(gid), ..pod() };
        f.plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, None, None))
            .await
            .unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o7777;
        let case = format!("{caps:?} {csidriver:?} {fs_type:?}");
        assert_eq!(mode(&target.join("mount/data")), if kvol_applies { 0o660 } else { 0o600 }, "{case}");
        assert_eq!(
            mode(&target.join("mount")) & 0o2000 != 0,
            kvol_applies,
            "setgid on the directory: {case}"
        );
        let calls = f.volume_calls();
        let group = if delegated { gid.to_string() } else { String::new() };
        assert_eq!(
            the_publish(&calls).volume_capability,
            mount_capability(Mode::SingleNodeWriter, fs_type, &[], &group),
            "{case}"
        );
    }
}

#[tokio::test]
async fn capabilities_are_asked_once_and_a_node_only_driver_has_no_controller() {
    let f = Setup::new().node_caps(&[NodeCap::StageUnstageVolume]).start().await;
    let client = f.plugin.client().clone();
    for _ in 0..3 {
        assert!(client.node_get_capabilities().await.unwrap().stage_unstage);
        assert_eq!(client.controller_get_capabilities().await.unwrap(), Default::default());
    }
    let asked = f.fake.calls().iter().filter(|c| matches!(c, Call::NodeGetCapabilities)).count();
    assert_eq!(asked, 1, "cached after connect asked");
    assert!(!f.fake.calls().contains(&Call::ControllerGetCapabilities), "no Controller service is served");
    let info = client.plugin_info().await.unwrap();
    assert_eq!(info.name, DRIVER);
    assert_eq!(client.node_get_info().await.unwrap().node_id, NODE_ID);
}

#[tokio::test]
async fn a_teardown_the_driver_answers_not_found_is_done_and_cleaned_up() {
    let f = Setup::new().start().await;
    let spec = plain_pv("pv-1", "vol-1");
    // (the code NodeUnpublishVolume fails with, whether the teardown succeeds)
    for (i, (code, done)) in [(Code::NotFound, true), (Code::Internal, false)].into_iter().enumerate() {
        let target = f.target(&format!("pv-nf-{i}"));
        let pod = pod();
        f.fake.behave(|b| {
            b.fail.remove("NodeUnpublishVolume");
        });
        f.plugin
            .mounter()
            .unwrap()
            .publish(&publish_request(&spec, &pod, &target, None, None))
            .await
            .unwrap();
        f.fake.behave(|b| {
            b.fail.insert("NodeUnpublishVolume", (code, "no such volume".into()));
        });
        let result = f.plugin.mounter().unwrap().unpublish(&unpublish_request(&target)).await;
        assert_eq!(result.is_ok(), done, "{code:?}: {result:?}");
        assert_eq!(target.exists(), !done, "{code:?}: the pod volume directory goes only when done");
    }
}
