//! The bundled hostpath driver end to end: real unix sockets, real gRPC, real bind mounts, each test in a private mount namespace of its own thread.
//!
//! Every test runs the driver in-process with the real mounter on sockets in a temporary
//! directory, talks to it with the generated clients, and leaves nothing mounted there. The
//! runtime is tokio's current-thread one, so the driver's mounts happen on the test's thread,
//! inside its namespace. These tests need root (CAP_SYS_ADMIN), as the driver itself does.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_csi::CsiError;
use kvol_csi::proto::csi::controller_client::ControllerClient;
use kvol_csi::proto::csi::group_controller_client::GroupControllerClient;
use kvol_csi::proto::csi::identity_client::IdentityClient;
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::{self, volume_capability::access_mode::Mode};
use kvol_csi::proto::registration::{
    InfoRequest, RegistrationStatus, registration_client::RegistrationClient,
};
use kvol_hostpath::state::{snapshot_id_for_name, volume_id_for_name};
use kvol_hostpath::{EPHEMERAL_CONTEXT_KEY, HostpathConfig, HostpathDriver, RegistrationOutcome};
use kvol_plugin::mount::{Mounter, SystemMounter};
use tokio::sync::{oneshot, watch};
use tokio::task::JoinHandle;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const MIB: i64 = 1 << 20;

mod support;

use support::Sandbox;

impl Sandbox {
    fn config(&self) -> HostpathConfig {
        HostpathConfig {
            state_dir: self.path("state"),
            csi_socket: self.path("plugins/hostpath.csi.kvol.io/csi.sock"),
            registration_dir: Some(self.path("plugins_registry")),
            max_volumes_per_node: 7,
            ..HostpathConfig::new("hostpath.csi.kvol.io", "node-a")
        }
    }
}

/// The driver running in-process, and clients of its sockets.
struct Running {
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), CsiError>>,
    csi_socket: PathBuf,
    registration_socket: Option<PathBuf>,
    outcomes: watch::Receiver<Option<RegistrationOutcome>>,
    identity: IdentityClient<Channel>,
    controller: ControllerClient<Channel>,
    node: NodeClient<Channel>,
}

async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .expect("a unix endpoint")
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}

async fn start(config: HostpathConfig) -> Running {
    let driver = HostpathDriver::bind(config, Arc::new(SystemMounter)).expect("the driver starts");
    let csi_socket = driver.csi_socket().to_path_buf();
    let registration_socket = driver.registration_socket().map(Path::to_path_buf);
    let outcomes = driver.registration_outcomes();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(driver.run(async {
        let _ = stopped.await;
    }));
    let ch = channel(&csi_socket).await;
    Running {
        stop,
        task,
        csi_socket,
        registration_socket,
        outcomes,
        identity: IdentityClient::new(ch.clone()),
        controller: ControllerClient::new(ch.clone()),
        node: NodeClient::new(ch),
    }
}

impl Running {
    /// Stops the driver: it must end cleanly and take its sockets with it.
    async fn stop(self) {
        let Running { stop, task, csi_socket, registration_socket, identity, controller, node, .. } = self;
        drop((identity, controller, node));
        stop.send(()).expect("the driver is still running");
        task.await.expect("the driver task").expect("the driver stops cleanly");
        assert!(!csi_socket.exists(), "the csi socket is removed");
        if let Some(reg) = registration_socket {
            assert!(!reg.exists(), "the registration socket is removed");
        }
    }
}

fn mount_cap(mode: Mode) -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
        access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
    }
}

fn block_cap() -> csi::VolumeCapability {
    csi::VolumeCapability {
        access_type: Some(csi::volume_capability::AccessType::Block(Default::default())),
        ..mount_cap(Mode::SingleNodeWriter)
    }
}

fn create_req(name: &str, required_bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.to_string(),
        capacity_range: (required_bytes > 0).then_some(csi::CapacityRange { required_bytes, limit_bytes: 0 }),
        volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter)],
        ..Default::default()
    }
}

fn stage_req(volume_id: &str, staging: &Path) -> csi::NodeStageVolumeRequest {
    csi::NodeStageVolumeRequest {
        volume_id: volume_id.to_string(),
        staging_target_path: staging.display().to_string(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        ..Default::default()
    }
}

fn unstage_req(volume_id: &str, staging: &Path) -> csi::NodeUnstageVolumeRequest {
    csi::NodeUnstageVolumeRequest {
        volume_id: volume_id.to_string(),
        staging_target_path: staging.display().to_string(),
    }
}

fn publish_req(
    volume_id: &str,
    staging: &Path,
    target: &Path,
    readonly: bool,
) -> csi::NodePublishVolumeRequest {
    csi::NodePublishVolumeRequest {
        volume_id: volume_id.to_string(),
        staging_target_path: staging.display().to_string(),
        target_path: target.display().to_string(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        readonly,
        ..Default::default()
    }
}

fn unpublish_req(volume_id: &str, target: &Path) -> csi::NodeUnpublishVolumeRequest {
    csi::NodeUnpublishVolumeRequest {
        volume_id: volume_id.to_string(),
        target_path: target.display().to_string(),
    }
}

fn code<T: std::fmt::Debug>(result: Result<T, tonic::Status>) -> Code {
    match result {
        Ok(v) => panic!("expected an error status, got {v:?}"),
        Err(s) => s.code(),
    }
}

/// Creates volume `name`; its id.
async fn create(d: &mut Running, name: &str, required_bytes: i64) -> String {
    let v = d
        .controller
        .create_volume(create_req(name, required_bytes))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    v.volume_id
}

#[tokio::test]
async fn identity_and_node_info_describe_the_driver() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let info = d.identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(
        (info.name.as_str(), info.vendor_version.as_str()),
        ("hostpath.csi.kvol.io", env!("CARGO_PKG_VERSION"))
    );
    // The manifest says the backing: this type's default, a directory.
    assert_eq!(
        info.manifest,
        HashMap::from([(
            "volume-backing".to_string(),
            "directory (asked for); volumes' sizes are not enforced".to_string()
        )])
    );
    let probe = d.identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));

    use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
    let caps =
        d.identity.get_plugin_capabilities(csi::GetPluginCapabilitiesRequest {}).await.unwrap().into_inner();
    let caps: Vec<_> = caps.capabilities.into_iter().filter_map(|c| c.r#type).collect();
    assert_eq!(
        caps,
        [
            Type::Service(Service { r#type: service::Type::ControllerService as i32 }),
            Type::Service(Service { r#type: service::Type::VolumeAccessibilityConstraints as i32 }),
            Type::Service(Service { r#type: service::Type::GroupControllerService as i32 }),
            Type::VolumeExpansion(VolumeExpansion { r#type: volume_expansion::Type::Online as i32 }),
        ]
    );

    use csi::controller_service_capability::rpc::Type as C;
    let rpcs = |caps: Vec<csi::ControllerServiceCapability>| -> Vec<i32> {
        caps.into_iter()
            .map(|c| match c.r#type {
                Some(csi::controller_service_capability::Type::Rpc(r)) => r.r#type,
                None => panic!("a capability without an rpc"),
            })
            .collect()
    };
    let caps =
        d.controller.controller_get_capabilities(csi::ControllerGetCapabilitiesRequest {}).await.unwrap();
    let want = [
        C::CreateDeleteVolume,
        C::CreateDeleteSnapshot,
        C::ListSnapshots,
        C::ListVolumes,
        C::CloneVolume,
        C::ExpandVolume,
        C::GetCapacity,
    ];
    assert_eq!(rpcs(caps.into_inner().capabilities), want.map(|c| c as i32));

    use csi::node_service_capability::rpc::Type as N;
    let caps = d.node.node_get_capabilities(csi::NodeGetCapabilitiesRequest {}).await.unwrap().into_inner();
    let caps: Vec<i32> = caps
        .capabilities
        .into_iter()
        .map(|c| match c.r#type {
            Some(csi::node_service_capability::Type::Rpc(r)) => r.r#type,
            None => panic!("a capability without an rpc"),
        })
        .collect();
    let want = [N::StageUnstageVolume, N::GetVolumeStats, N::ExpandVolume, N::VolumeCondition];
    assert_eq!(caps, want.map(|c| c as i32));

    let info = d.node.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.node_id, "node-a");
    assert_eq!(info.max_volumes_per_node, 7);
    let topology = info.accessible_topology.unwrap().segments;
    assert_eq!(
        topology,
        HashMap::from([("topology.hostpath.csi.kvol.io/node".to_string(), "node-a".to_string())])
    );

    // Attach and modify are off by default, and not served.
    let publish = csi::ControllerPublishVolumeRequest {
        volume_id: "v".into(),
        node_id: "node-a".into(),
        ..Default::default()
    };
    assert_eq!(code(d.controller.controller_publish_volume(publish).await), Code::Unimplemented);
    let modify = csi::ControllerModifyVolumeRequest { volume_id: "v".into(), ..Default::default() };
    assert_eq!(code(d.controller.controller_modify_volume(modify).await), Code::Unimplemented);
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn create_volume_is_idempotent_by_name_and_checks_its_arguments() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let first =
        d.controller.create_volume(create_req("pvc-a", MIB + 1)).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(first.volume_id, volume_id_for_name("pvc-a"));
    assert_eq!(first.capacity_bytes, 2 * MIB, "rounded up to whole mebibytes");
    assert_eq!(
        first.accessible_topology[0].segments["topology.hostpath.csi.kvol.io/node"], "node-a",
        "the volume lives on this node"
    );
    let dir = sb.path("state/volumes").join(&first.volume_id);
    assert!(dir.is_dir(), "{} is the volume", dir.display());
    fs::write(dir.join("keep"), "data").unwrap();

    let again =
        d.controller.create_volume(create_req("pvc-a", MIB + 1)).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(again, first, "the same name and a compatible size return the same volume");
    assert_eq!(fs::read_to_string(dir.join("keep")).unwrap(), "data", "and leave its content alone");
    let smaller =
        d.controller.create_volume(create_req("pvc-a", MIB)).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(smaller.volume_id, first.volume_id, "2 MiB satisfies a request for 1 MiB");

    let bigger = d.controller.create_volume(create_req("pvc-a", 10 * MIB)).await;
    assert_eq!(code(bigger), Code::AlreadyExists);
    let capped = csi::CreateVolumeRequest {
        capacity_range: Some(csi::CapacityRange { required_bytes: 0, limit_bytes: MIB }),
        ..create_req("pvc-a", 0)
    };
    assert_eq!(code(d.controller.create_volume(capped).await), Code::AlreadyExists);

    let invalid = [
        csi::CreateVolumeRequest { name: String::new(), ..create_req("x", 0) },
        csi::CreateVolumeRequest { volume_capabilities: vec![], ..create_req("pvc-b", 0) },
        csi::CreateVolumeRequest {
            volume_capabilities: vec![mount_cap(Mode::SingleNodeWriter), block_cap()],
            ..create_req("pvc-b", 0)
        },
        csi::CreateVolumeRequest {
            capacity_range: Some(csi::CapacityRange { required_bytes: 2 * MIB, limit_bytes: MIB }),
            ..create_req("pvc-b", 0)
        },
    ];
    for req in invalid {
        let shown = format!("{req:?}");
        assert_eq!(code(d.controller.create_volume(req).await), Code::InvalidArgument, "{shown}");
    }
    let elsewhere = csi::CreateVolumeRequest {
        accessibility_requirements: Some(csi::TopologyRequirement {
            requisite: vec![csi::Topology {
                segments: HashMap::from([("topology.hostpath.csi.kvol.io/node".into(), "node-b".into())]),
            }],
            preferred: vec![],
        }),
        ..create_req("pvc-b", 0)
    };
    assert_eq!(code(d.controller.create_volume(elsewhere).await), Code::ResourceExhausted);
    assert!(
        !sb.path("state/volumes").join(volume_id_for_name("pvc-b")).exists(),
        "refused volumes leave nothing"
    );

    // Expansion records the new capacity; the node makes it visible (NodeExpandVolume).
    let expand = |required_bytes| csi::ControllerExpandVolumeRequest {
        volume_id: first.volume_id.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes, limit_bytes: 0 }),
        ..Default::default()
    };
    let grown = d.controller.controller_expand_volume(expand(5 * MIB)).await.unwrap().into_inner();
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (5 * MIB, true));
    let same = d.controller.controller_expand_volume(expand(MIB)).await.unwrap().into_inner();
    assert_eq!(same.capacity_bytes, 5 * MIB, "volumes never shrink");
    let unknown = csi::ControllerExpandVolumeRequest { volume_id: volume_id_for_name("nope"), ..expand(MIB) };
    assert_eq!(code(d.controller.controller_expand_volume(unknown).await), Code::NotFound);
    let no_range = csi::ControllerExpandVolumeRequest { capacity_range: None, ..expand(MIB) };
    assert_eq!(code(d.controller.controller_expand_volume(no_range).await), Code::InvalidArgument);
    let no_id = csi::ControllerExpandVolumeRequest { volume_id: String::new(), ..expand(MIB) };
    assert_eq!(code(d.controller.controller_expand_volume(no_id).await), Code::InvalidArgument);
    let listed = d.controller.list_volumes(csi::ListVolumesRequest::default()).await.unwrap().into_inner();
    assert_eq!(listed.entries[0].volume.as_ref().unwrap().capacity_bytes, 5 * MIB);
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn list_volumes_pages_by_token() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let mut ids = Vec::new();
    for name in ["a", "b", "c"] {
        ids.push(create(&mut d, name, 0).await);
    }
    ids.sort();
    let list = |max_entries, starting_token: &str| csi::ListVolumesRequest {
        max_entries,
        starting_token: starting_token.into(),
    };
    let first = d.controller.list_volumes(list(2, "")).await.unwrap().into_inner();
    let got: Vec<_> = first.entries.iter().map(|e| e.volume.as_ref().unwrap().volume_id.clone()).collect();
    assert_eq!(got, ids[..2]);
    assert_eq!(first.next_token, ids[2]);
    let second = d.controller.list_volumes(list(2, &first.next_token)).await.unwrap().into_inner();
    assert_eq!(second.entries.len(), 1);
    assert_eq!(second.entries[0].volume.as_ref().unwrap().volume_id, ids[2]);
    assert_eq!(second.next_token, "");
    assert_eq!(code(d.controller.list_volumes(list(0, "invalid-token")).await), Code::Aborted);
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn delete_volume_is_idempotent_and_refused_while_in_use() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let del = |id: &str| csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() };
    assert_eq!(code(d.controller.delete_volume(del("")).await), Code::InvalidArgument);
    d.controller
        .delete_volume(del(&volume_id_for_name("never")))
        .await
        .expect("an unknown volume is deleted already");

    let id = create(&mut d, "pvc", 0).await;
    let dir = sb.path("state/volumes").join(&id);
    let staging = sb.path("kubelet/globalmount");
    let target = sb.path("pods/p/mount");
    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    assert_eq!(code(d.controller.delete_volume(del(&id)).await), Code::FailedPrecondition, "staged");
    d.node.node_publish_volume(publish_req(&id, &staging, &target, false)).await.unwrap();
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    let err = d.controller.delete_volume(del(&id)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "published");
    assert_eq!(err.message(), format!("volume {id} is still in use: mounted on {}", target.display()));
    assert!(dir.is_dir(), "a refused delete keeps the data");

    d.node.node_unpublish_volume(unpublish_req(&id, &target)).await.unwrap();
    d.controller.delete_volume(del(&id)).await.unwrap();
    assert!(!dir.exists(), "the volume's directory is gone");
    d.controller.delete_volume(del(&id)).await.expect("deleting twice is fine");
    let listed = d.controller.list_volumes(csi::ListVolumesRequest::default()).await.unwrap().into_inner();
    assert!(listed.entries.is_empty());
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn validate_volume_capabilities_confirms_mount_access_only() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = create(&mut d, "pvc", 0).await;
    let validate =
        |volume_id: &str, caps: Vec<csi::VolumeCapability>| csi::ValidateVolumeCapabilitiesRequest {
            volume_id: volume_id.to_string(),
            volume_capabilities: caps,
            volume_context: HashMap::from([("k".to_string(), "v".to_string())]),
            ..Default::default()
        };
    let ok = d
        .controller
        .validate_volume_capabilities(validate(&id, vec![mount_cap(Mode::MultiNodeMultiWriter)]))
        .await
        .unwrap()
        .into_inner();
    let confirmed = ok.confirmed.expect("mount access is confirmed");
    assert_eq!(confirmed.volume_capabilities, [mount_cap(Mode::MultiNodeMultiWriter)]);
    assert_eq!(confirmed.volume_context["k"], "v");

    let block = d
        .controller
        .validate_volume_capabilities(validate(&id, vec![mount_cap(Mode::SingleNodeWriter), block_cap()]));
    let block = block.await.unwrap().into_inner();
    assert_eq!(block.confirmed, None);
    assert!(block.message.contains("block access was asked for"), "{}", block.message);

    let unknown = validate(&volume_id_for_name("nope"), vec![mount_cap(Mode::SingleNodeWriter)]);
    assert_eq!(code(d.controller.validate_volume_capabilities(unknown).await), Code::NotFound);
    assert_eq!(
        code(d.controller.validate_volume_capabilities(validate(&id, vec![])).await),
        Code::InvalidArgument
    );
    let no_id = validate("", vec![mount_cap(Mode::SingleNodeWriter)]);
    assert_eq!(code(d.controller.validate_volume_capabilities(no_id).await), Code::InvalidArgument);
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn snapshots_copy_content_list_page_restore_and_delete() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let src = create(&mut d, "src", 3 * MIB).await;
    let other = create(&mut d, "other", 0).await;
    let src_dir = sb.path("state/volumes").join(&src);
    fs::create_dir(src_dir.join("sub")).unwrap();
    fs::write(src_dir.join("sub/data.txt"), "before").unwrap();

    let snap = |name: &str, source: &str| csi::CreateSnapshotRequest {
        name: name.to_string(),
        source_volume_id: source.to_string(),
        ..Default::default()
    };
    let s1 = d.controller.create_snapshot(snap("s1", &src)).await.unwrap().into_inner().snapshot.unwrap();
    assert_eq!(s1.snapshot_id, snapshot_id_for_name("s1"));
    assert_eq!((s1.source_volume_id.as_str(), s1.size_bytes, s1.ready_to_use), (src.as_str(), 3 * MIB, true));
    assert!(s1.creation_time.is_some_and(|t| t.seconds > 0));
    let snap_dir = sb.path("state/snapshots").join(&s1.snapshot_id);
    assert_eq!(fs::read_to_string(snap_dir.join("sub/data.txt")).unwrap(), "before");
    fs::write(src_dir.join("sub/data.txt"), "after").unwrap();
    assert_eq!(fs::read_to_string(snap_dir.join("sub/data.txt")).unwrap(), "before", "a copy, not a link");

    let again = d.controller.create_snapshot(snap("s1", &src)).await.unwrap().into_inner().snapshot.unwrap();
    assert_eq!(again, s1, "the same name and source return the same snapshot");
    assert_eq!(code(d.controller.create_snapshot(snap("s1", &other)).await), Code::AlreadyExists);
    assert_eq!(code(d.controller.create_snapshot(snap("", &src)).await), Code::InvalidArgument);
    assert_eq!(code(d.controller.create_snapshot(snap("s3", "")).await), Code::InvalidArgument);
    assert_eq!(
        code(d.controller.create_snapshot(snap("s3", &volume_id_for_name("nope"))).await),
        Code::NotFound
    );
    let s2 = d.controller.create_snapshot(snap("s2", &other)).await.unwrap().into_inner().snapshot.unwrap();

    let lister = d.controller.clone();
    let list = |req: csi::ListSnapshotsRequest| {
        let mut c = lister.clone();
        async move {
            let r = c.list_snapshots(req).await?.into_inner();
            let ids: Vec<String> = r.entries.into_iter().map(|e| e.snapshot.unwrap().snapshot_id).collect();
            Ok::<_, tonic::Status>((ids, r.next_token))
        }
    };
    let mut all = vec![s1.snapshot_id.clone(), s2.snapshot_id.clone()];
    all.sort();
    assert_eq!(list(Default::default()).await.unwrap(), (all.clone(), String::new()));
    let by_source = csi::ListSnapshotsRequest { source_volume_id: other.clone(), ..Default::default() };
    assert_eq!(list(by_source).await.unwrap().0, [s2.snapshot_id.as_str()]);
    let by_id = csi::ListSnapshotsRequest { snapshot_id: s1.snapshot_id.clone(), ..Default::default() };
    assert_eq!(list(by_id).await.unwrap().0, [s1.snapshot_id.as_str()]);
    let by_unknown =
        csi::ListSnapshotsRequest { snapshot_id: snapshot_id_for_name("nope"), ..Default::default() };
    assert_eq!(list(by_unknown).await.unwrap().0, Vec::<String>::new());
    let page1 = list(csi::ListSnapshotsRequest { max_entries: 1, ..Default::default() }).await.unwrap();
    assert_eq!(page1, (vec![all[0].clone()], all[1].clone()));
    let page2 =
        list(csi::ListSnapshotsRequest { max_entries: 1, starting_token: page1.1, ..Default::default() });
    assert_eq!(page2.await.unwrap(), (vec![all[1].clone()], String::new()));
    let bad =
        list(csi::ListSnapshotsRequest { starting_token: "invalid-token".into(), ..Default::default() });
    assert_eq!(bad.await.unwrap_err().code(), Code::Aborted);

    // Restore: a new volume made from the snapshot, at least as large as its source.
    let from = |name: &str, source: csi::volume_content_source::Type| csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource { r#type: Some(source) }),
        ..create_req(name, MIB)
    };
    let snapshot_source = |id: &str| {
        csi::volume_content_source::Type::Snapshot(csi::volume_content_source::SnapshotSource {
            snapshot_id: id.into(),
        })
    };
    let restored =
        d.controller.create_volume(from("restored", snapshot_source(&s1.snapshot_id))).await.unwrap();
    let restored = restored.into_inner().volume.unwrap();
    assert_eq!(restored.capacity_bytes, 3 * MIB, "grown to the snapshot's size");
    assert_eq!(
        restored.content_source,
        Some(csi::VolumeContentSource { r#type: Some(snapshot_source(&s1.snapshot_id)) })
    );
    let restored_dir = sb.path("state/volumes").join(&restored.volume_id);
    assert_eq!(fs::read_to_string(restored_dir.join("sub/data.txt")).unwrap(), "before");
    let missing = from("restored-2", snapshot_source(&snapshot_id_for_name("nope")));
    assert_eq!(code(d.controller.create_volume(missing).await), Code::NotFound);
    let other_source = from("restored", snapshot_source(&s2.snapshot_id));
    assert_eq!(code(d.controller.create_volume(other_source).await), Code::AlreadyExists);

    // Clone: a new volume made from a volume.
    let volume_source = csi::volume_content_source::Type::Volume(csi::volume_content_source::VolumeSource {
        volume_id: src.clone(),
    });
    let clone =
        d.controller.create_volume(from("clone", volume_source)).await.unwrap().into_inner().volume.unwrap();
    let clone_dir = sb.path("state/volumes").join(&clone.volume_id);
    assert_eq!(fs::read_to_string(clone_dir.join("sub/data.txt")).unwrap(), "after");

    let del = |id: &str| csi::DeleteSnapshotRequest { snapshot_id: id.to_string(), ..Default::default() };
    d.controller.delete_snapshot(del(&s1.snapshot_id)).await.unwrap();
    assert!(!snap_dir.exists());
    d.controller.delete_snapshot(del(&s1.snapshot_id)).await.expect("deleting twice is fine");
    assert_eq!(code(d.controller.delete_snapshot(del("")).await), Code::InvalidArgument);
    assert_eq!(
        fs::read_to_string(restored_dir.join("sub/data.txt")).unwrap(),
        "before",
        "a restored volume outlives its snapshot"
    );
    assert_eq!(list(Default::default()).await.unwrap().0, [s2.snapshot_id.as_str()]);
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn stage_publish_write_read_only_unpublish_unstage() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = create(&mut d, "pvc", 0).await;
    let dir = sb.path("state/volumes").join(&id);
    let staging = sb.path("kubelet/plugins/globalmount");
    let rw = sb.path("pods/p1/volumes/mount");
    let ro = sb.path("pods/p2/volumes/mount");

    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    d.node.node_stage_volume(stage_req(&id, &staging)).await.expect("staging again is fine");
    assert_eq!(sb.mounts_on(&staging).len(), 1, "staged once");

    d.node.node_publish_volume(publish_req(&id, &staging, &rw, false)).await.unwrap();
    fs::write(rw.join("hello.txt"), "through the target").unwrap();
    assert_eq!(
        fs::read_to_string(dir.join("hello.txt")).unwrap(),
        "through the target",
        "it lands in the volume"
    );
    d.node
        .node_publish_volume(publish_req(&id, &staging, &rw, false))
        .await
        .expect("publishing again is fine");
    let on_rw = sb.mounts_on(&rw);
    assert_eq!(on_rw.len(), 1, "published once: {on_rw:?}");
    assert!(!on_rw[0].read_only());
    let flipped = d.node.node_publish_volume(publish_req(&id, &staging, &rw, true)).await;
    assert_eq!(code(flipped), Code::AlreadyExists, "published read-write, asked read-only");

    d.node.node_publish_volume(publish_req(&id, &staging, &ro, true)).await.unwrap();
    assert!(sb.mounts_on(&ro)[0].read_only());
    assert_eq!(fs::read_to_string(ro.join("hello.txt")).unwrap(), "through the target");
    let err = fs::write(ro.join("nope.txt"), "x").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ReadOnlyFilesystem, "{err}");
    // A reader-only access mode publishes read-only even without the flag.
    let reader = sb.path("pods/p3/volumes/mount");
    let req = csi::NodePublishVolumeRequest {
        volume_capability: Some(mount_cap(Mode::SingleNodeReaderOnly)),
        ..publish_req(&id, &staging, &reader, false)
    };
    d.node.node_publish_volume(req).await.unwrap();
    assert!(sb.mounts_on(&reader)[0].read_only());

    for target in [&rw, &ro, &reader] {
        d.node.node_unpublish_volume(unpublish_req(&id, target)).await.unwrap();
        assert!(sb.mounts_on(target).is_empty());
        assert!(!target.exists(), "{} is removed", target.display());
        d.node.node_unpublish_volume(unpublish_req(&id, target)).await.expect("unpublishing again is fine");
    }
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    assert!(sb.mounts_on(&staging).is_empty());
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.expect("unstaging again is fine");
    assert_eq!(
        fs::read_to_string(dir.join("hello.txt")).unwrap(),
        "through the target",
        "data stays in the volume"
    );
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn node_rpcs_name_missing_arguments_unknown_volumes_and_foreign_paths() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = create(&mut d, "pvc", 0).await;
    let other = create(&mut d, "other", 0).await;
    let unknown = volume_id_for_name("unknown");
    let staging = sb.path("stage");
    let target = sb.path("target");

    let publishes = [
        (
            csi::NodePublishVolumeRequest {
                volume_id: String::new(),
                ..publish_req(&id, &staging, &target, false)
            },
            Code::InvalidArgument,
        ),
        (
            csi::NodePublishVolumeRequest {
                target_path: String::new(),
                ..publish_req(&id, &staging, &target, false)
            },
            Code::InvalidArgument,
        ),
        (
            csi::NodePublishVolumeRequest {
                target_path: "rel/target".into(),
                ..publish_req(&id, &staging, &target, false)
            },
            Code::InvalidArgument,
        ),
        (
            csi::NodePublishVolumeRequest {
                volume_capability: None,
                ..publish_req(&id, &staging, &target, false)
            },
            Code::InvalidArgument,
        ),
        (
            csi::NodePublishVolumeRequest {
                volume_capability: Some(block_cap()),
                ..publish_req(&id, &staging, &target, false)
            },
            Code::InvalidArgument,
        ),
        (publish_req(&unknown, &staging, &target, false), Code::NotFound),
        (
            csi::NodePublishVolumeRequest {
                staging_target_path: String::new(),
                ..publish_req(&id, &staging, &target, false)
            },
            Code::FailedPrecondition,
        ),
        (publish_req(&id, &staging, &target, false), Code::FailedPrecondition),
    ];
    for (req, want) in publishes {
        let shown = format!("{req:?}");
        assert_eq!(code(d.node.node_publish_volume(req).await), want, "{shown}");
    }
    assert!(!target.exists(), "failed publishes create no target");

    let stages = [
        (
            csi::NodeStageVolumeRequest { volume_id: String::new(), ..stage_req(&id, &staging) },
            Code::InvalidArgument,
        ),
        (
            csi::NodeStageVolumeRequest { staging_target_path: String::new(), ..stage_req(&id, &staging) },
            Code::InvalidArgument,
        ),
        (
            csi::NodeStageVolumeRequest { volume_capability: None, ..stage_req(&id, &staging) },
            Code::InvalidArgument,
        ),
        (stage_req(&unknown, &staging), Code::NotFound),
    ];
    for (req, want) in stages {
        let shown = format!("{req:?}");
        assert_eq!(code(d.node.node_stage_volume(req).await), want, "{shown}");
    }
    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    assert_eq!(
        code(d.node.node_stage_volume(stage_req(&other, &staging)).await),
        Code::AlreadyExists,
        "staged by another"
    );

    assert_eq!(code(d.node.node_unstage_volume(unstage_req("", &staging)).await), Code::InvalidArgument);
    assert_eq!(
        code(d.node.node_unstage_volume(unstage_req(&id, Path::new(""))).await),
        Code::InvalidArgument
    );
    assert_eq!(code(d.node.node_unstage_volume(unstage_req(&unknown, &staging)).await), Code::NotFound);
    d.node.node_unstage_volume(unstage_req(&other, &staging)).await.expect("not staged there: nothing to do");
    assert_eq!(sb.mounts_on(&staging).len(), 1, "another volume's unstage leaves the mount alone");

    assert_eq!(code(d.node.node_unpublish_volume(unpublish_req("", &target)).await), Code::InvalidArgument);
    assert_eq!(
        code(d.node.node_unpublish_volume(unpublish_req(&id, Path::new(""))).await),
        Code::InvalidArgument
    );
    d.node
        .node_unpublish_volume(unpublish_req(&unknown, &target))
        .await
        .expect("an unknown target is unpublished");

    // Something this driver did not mount: never unmounted, never mounted over.
    let foreign = sb.path("foreign");
    fs::create_dir(&foreign).unwrap();
    SystemMounter.mount("tmpfs", &foreign, "tmpfs", false, &[]).unwrap();
    d.node.node_unpublish_volume(unpublish_req(&id, &foreign)).await.unwrap();
    assert_eq!(sb.mounts_on(&foreign).len(), 1, "the foreign mount is left alone");
    assert_eq!(
        code(d.node.node_publish_volume(publish_req(&id, &staging, &foreign, false)).await),
        Code::AlreadyExists
    );
    assert_eq!(code(d.node.node_stage_volume(stage_req(&other, &foreign)).await), Code::AlreadyExists);
    SystemMounter.unmount(&foreign).unwrap();

    let stats = |volume_id: &str, volume_path: &str| csi::NodeGetVolumeStatsRequest {
        volume_id: volume_id.to_string(),
        volume_path: volume_path.to_string(),
        ..Default::default()
    };
    let target_str = target.display().to_string();
    assert_eq!(code(d.node.node_get_volume_stats(stats("", &target_str)).await), Code::InvalidArgument);
    assert_eq!(code(d.node.node_get_volume_stats(stats(&id, "")).await), Code::InvalidArgument);
    assert_eq!(code(d.node.node_get_volume_stats(stats(&unknown, "some/path")).await), Code::NotFound);
    assert_eq!(code(d.node.node_get_volume_stats(stats(&id, "some/path")).await), Code::NotFound);
    assert_eq!(
        code(d.node.node_get_volume_stats(stats(&id, &target_str)).await),
        Code::NotFound,
        "not published"
    );
    let expand = |volume_id: &str, volume_path: &str| csi::NodeExpandVolumeRequest {
        volume_id: volume_id.to_string(),
        volume_path: volume_path.to_string(),
        ..Default::default()
    };
    assert_eq!(code(d.node.node_expand_volume(expand(&id, "")).await), Code::InvalidArgument);
    assert_eq!(code(d.node.node_expand_volume(expand("", &target_str)).await), Code::InvalidArgument);
    assert_eq!(code(d.node.node_expand_volume(expand(&unknown, "some/path")).await), Code::NotFound);
    assert_eq!(
        code(d.node.node_expand_volume(expand(&id, &target_str)).await),
        Code::NotFound,
        "not published"
    );

    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn ephemeral_volumes_live_from_publish_to_unpublish() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = "csi-5f2bb1a0c4e4b2f1d5b33c1e";
    let target = sb.path("pods/p/volumes/kubernetes.io~csi/scratch/mount");
    let ephemeral = |volume_id: &str, target: &Path| csi::NodePublishVolumeRequest {
        volume_context: HashMap::from([
            (EPHEMERAL_CONTEXT_KEY.to_string(), "true".to_string()),
            ("csi.storage.k8s.io/pod.name".to_string(), "p".to_string()),
        ]),
        ..publish_req(volume_id, Path::new(""), target, false)
    };
    let eph_dir = sb.path("state/ephemeral");
    let entries = || fs::read_dir(&eph_dir).unwrap().map(|e| e.unwrap().path()).collect::<Vec<_>>();
    assert!(entries().is_empty());

    d.node.node_publish_volume(ephemeral(id, &target)).await.unwrap();
    let made = entries();
    assert_eq!(made.len(), 1, "one fresh directory for the volume: {made:?}");
    fs::write(target.join("scratch.txt"), "tmp").unwrap();
    assert_eq!(fs::read_to_string(made[0].join("scratch.txt")).unwrap(), "tmp");
    d.node.node_publish_volume(ephemeral(id, &target)).await.expect("publishing again is fine");
    assert_eq!(sb.mounts_on(&target).len(), 1);

    let stats = csi::NodeGetVolumeStatsRequest {
        volume_id: id.to_string(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    assert_eq!(d.node.node_get_volume_stats(stats).await.unwrap().into_inner().usage.len(), 2);
    let del = csi::DeleteVolumeRequest { volume_id: id.to_string(), ..Default::default() };
    assert_eq!(code(d.controller.delete_volume(del).await), Code::FailedPrecondition);
    let listed = d.controller.list_volumes(csi::ListVolumesRequest::default()).await.unwrap().into_inner();
    assert!(listed.entries.is_empty(), "ephemeral volumes are not the controller's");

    let persistent = create(&mut d, "pvc", 0).await;
    let other_target = sb.path("pods/q/mount");
    assert_eq!(
        code(d.node.node_publish_volume(ephemeral(&persistent, &other_target)).await),
        Code::InvalidArgument
    );

    d.node.node_unpublish_volume(unpublish_req(id, &target)).await.unwrap();
    assert!(sb.mounts_on(&target).is_empty());
    assert!(!target.exists());
    assert!(entries().is_empty(), "the ephemeral volume is deleted with its last publication");
    d.node.node_unpublish_volume(unpublish_req(id, &target)).await.expect("unpublishing again is fine");
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn an_ephemeral_volume_with_a_mount_below_it_is_not_deleted_through_the_mount() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = "csi-0c0ffee0c4e4b2f1d5b33c1e";
    let target = sb.path("pods/p/volumes/kubernetes.io~csi/scratch/mount");
    let publish = csi::NodePublishVolumeRequest {
        volume_context: HashMap::from([(EPHEMERAL_CONTEXT_KEY.to_string(), "true".to_string())]),
        ..publish_req(id, Path::new(""), &target, false)
    };
    d.node.node_publish_volume(publish).await.unwrap();
    let data = fs::read_dir(sb.path("state/ephemeral")).unwrap().next().unwrap().unwrap().path();
    let below = data.join("deeper/mnt");
    fs::create_dir_all(&below).unwrap();
    nix::mount::mount(Some("tmpfs"), &below, Some("tmpfs"), nix::mount::MsFlags::empty(), None::<&str>)
        .unwrap();
    fs::write(below.join("precious"), "not the volume's").unwrap();

    let refused = d.node.node_unpublish_volume(unpublish_req(id, &target)).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("refusing to delete through the mount at"), "{}", refused.message());
    assert_eq!(fs::read_to_string(below.join("precious")).unwrap(), "not the volume's");

    nix::mount::umount(&below).unwrap();
    d.node
        .node_unpublish_volume(unpublish_req(id, &target))
        .await
        .expect("deleted once nothing is mounted below");
    assert!(!data.exists());
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn volume_stats_report_the_filesystem_of_a_published_path() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = create(&mut d, "pvc", 0).await;
    let staging = sb.path("stage");
    let target = sb.path("target");
    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    d.node.node_publish_volume(publish_req(&id, &staging, &target, false)).await.unwrap();

    let stats = |path: &Path| csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: path.display().to_string(),
        ..Default::default()
    };
    let usage = d.node.node_get_volume_stats(stats(&target)).await.unwrap().into_inner().usage;
    let (bytes, inodes) = (&usage[0], &usage[1]);
    assert_eq!(bytes.unit, csi::volume_usage::Unit::Bytes as i32);
    assert_eq!(inodes.unit, csi::volume_usage::Unit::Inodes as i32);
    let fs_stats = nix::sys::statvfs::statvfs(&sb.path("state")).unwrap();
    assert_eq!(
        bytes.total as u64,
        fs_stats.blocks() * fs_stats.fragment_size(),
        "the state filesystem's size"
    );
    assert!(bytes.total > 0 && bytes.available <= bytes.total && bytes.used <= bytes.total, "{bytes:?}");
    assert!(inodes.used <= inodes.total, "{inodes:?}");
    d.node.node_get_volume_stats(stats(&staging)).await.expect("the staging path has stats too");

    // VOLUME_CONDITION: healthy while the volume's data is in place, abnormal (naming the
    // path) while it is gone, healthy again once it is back.
    let condition =
        |r: tonic::Response<csi::NodeGetVolumeStatsResponse>| r.into_inner().volume_condition.unwrap();
    assert!(!condition(d.node.node_get_volume_stats(stats(&target)).await.unwrap()).abnormal);
    let data = sb.path("state").join("volumes").join(&id);
    let moved = sb.path("state").join("moved-away");
    std::fs::rename(&data, &moved).unwrap();
    let gone = condition(d.node.node_get_volume_stats(stats(&target)).await.unwrap());
    assert!(gone.abnormal && gone.message.contains(&data.display().to_string()), "{gone:?}");
    std::fs::rename(&moved, &data).unwrap();
    assert!(!condition(d.node.node_get_volume_stats(stats(&target)).await.unwrap()).abnormal);

    d.node.node_unpublish_volume(unpublish_req(&id, &target)).await.unwrap();
    assert_eq!(code(d.node.node_get_volume_stats(stats(&target)).await), Code::NotFound);
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn records_survive_a_restart() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = create(&mut d, "pvc", 0).await;
    let staging = sb.path("stage");
    let target = sb.path("target");
    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    d.node.node_publish_volume(publish_req(&id, &staging, &target, true)).await.unwrap();
    d.stop().await;
    assert_eq!(sb.mounts_on(&target).len(), 1, "stopping the driver unmounts nothing");

    let mut d = start(sb.config()).await;
    d.node.node_publish_volume(publish_req(&id, &staging, &target, true)).await.expect("still published");
    assert_eq!(
        code(d.node.node_publish_volume(publish_req(&id, &staging, &target, false)).await),
        Code::AlreadyExists
    );
    let del = csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() };
    assert_eq!(code(d.controller.delete_volume(del.clone()).await), Code::FailedPrecondition, "still in use");
    d.node.node_unpublish_volume(unpublish_req(&id, &target)).await.unwrap();
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    d.controller.delete_volume(del).await.unwrap();
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn the_registrar_answers_get_info_and_hears_the_verdict() {
    let sb = Sandbox::new();
    let config = sb.config();
    let reg_socket = sb.path("plugins_registry/hostpath.csi.kvol.io-reg.sock");
    let mut d = start(config.clone()).await;
    assert_eq!(d.registration_socket.as_deref(), Some(reg_socket.as_path()));
    let mut reg = RegistrationClient::new(channel(&reg_socket).await);
    let info = reg.get_info(InfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.r#type, "CSIPlugin");
    assert_eq!(info.name, "hostpath.csi.kvol.io");
    assert_eq!(info.endpoint, d.csi_socket.display().to_string());
    assert_eq!(info.supported_versions, ["1.0.0"]);

    let status = |registered: bool, error: &str| RegistrationStatus {
        plugin_registered: registered,
        error: error.into(),
    };
    reg.notify_registration_status(status(false, "driver already registered")).await.unwrap();
    let outcome = d.outcomes.wait_for(Option::is_some).await.unwrap().clone();
    assert_eq!(
        outcome,
        Some(RegistrationOutcome { registered: false, error: "driver already registered".into() })
    );
    d.identity
        .probe(csi::ProbeRequest {})
        .await
        .expect("a failed registration does not stop the driver by default");
    reg.notify_registration_status(status(true, "")).await.unwrap();
    drop(reg);
    d.stop().await;

    // Told to, the driver stops on a failed registration, with an error, sockets removed.
    let d = start(HostpathConfig { exit_on_registration_failure: true, ..config.clone() }).await;
    let mut reg = RegistrationClient::new(channel(&reg_socket).await);
    reg.notify_registration_status(status(false, "no handler for this version")).await.unwrap();
    let err = d.task.await.unwrap().unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "plugin socket {}: the kubelet did not register driver {}: no handler for this version",
            reg_socket.display(),
            "hostpath.csi.kvol.io"
        )
    );
    assert!(!reg_socket.exists() && !d.csi_socket.exists(), "both sockets are removed");

    // Without registration there is no registration socket.
    let d = start(HostpathConfig { registration_dir: None, ..config }).await;
    assert_eq!(d.registration_socket, None);
    assert!(!reg_socket.exists());
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn stale_sockets_are_replaced_and_other_files_refused() {
    let sb = Sandbox::new();
    let config = sb.config();
    fs::create_dir_all(config.csi_socket.parent().unwrap()).unwrap();
    drop(std::os::unix::net::UnixListener::bind(&config.csi_socket).unwrap());
    assert!(config.csi_socket.exists(), "a stale socket from an earlier run");
    let mut d = start(config.clone()).await;
    d.identity.probe(csi::ProbeRequest {}).await.expect("the driver serves on the replaced socket");
    d.stop().await;

    fs::write(&config.csi_socket, "not a socket").unwrap();
    let err = HostpathDriver::bind(config.clone(), Arc::new(SystemMounter)).unwrap_err().to_string();
    assert_eq!(
        err,
        format!(
            "plugin socket {}: something other than a socket is there; refusing to replace it",
            config.csi_socket.display()
        )
    );
    assert_eq!(fs::read_to_string(&config.csi_socket).unwrap(), "not a socket");
    let reg = config.registration_socket().unwrap();
    assert!(!reg.exists(), "nothing else was bound");

    fs::remove_file(&config.csi_socket).unwrap();
    fs::write(config.state_dir.join("state.json"), "{").unwrap();
    let err = HostpathDriver::bind(config.clone(), Arc::new(SystemMounter)).unwrap_err().to_string();
    assert!(
        err.starts_with(&format!("cannot load {}", config.state_dir.join("state.json").display())),
        "{err}"
    );
    assert!(!config.csi_socket.exists(), "a damaged state file stops the driver before it listens");
    sb.assert_nothing_mounted();
}

// ---- What the driver serves beyond the basics: group snapshots, expansion on the node,
// attach, capacity, the volume limit, modify. ----

async fn group_client(d: &Running) -> GroupControllerClient<Channel> {
    GroupControllerClient::new(channel(&d.csi_socket).await)
}

fn snapshot_dirs(sb: &Sandbox) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(sb.path("state/snapshots"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test]
async fn a_group_snapshot_has_every_member_or_none() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let mut group = group_client(&d).await;
    let a = create(&mut d, "pvc-a", MIB).await;
    let b = create(&mut d, "pvc-b", 2 * MIB).await;
    fs::write(sb.path("state/volumes").join(&a).join("data"), b"a's data").unwrap();
    // Volume b holds a socket, which a snapshot cannot copy: b's member fails after a's was made.
    let socket = sb.path("state/volumes").join(&b).join("sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket).unwrap();
    let create_group = |name: &str, ids: &[&str]| csi::CreateVolumeGroupSnapshotRequest {
        name: name.to_string(),
        source_volume_ids: ids.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    };
    let err = group.create_volume_group_snapshot(create_group("g1", &[&a, &b])).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(err.message().starts_with("group snapshot g1: ") && err.message().contains("sock"), "{err:?}");
    assert_eq!(snapshot_dirs(&sb), Vec::<String>::new(), "no member snapshot is left behind");
    let listed =
        d.controller.list_snapshots(csi::ListSnapshotsRequest::default()).await.unwrap().into_inner();
    assert!(listed.entries.is_empty(), "{listed:?}");
    let state = fs::read_to_string(sb.path("state/state.json")).unwrap();
    assert!(!state.contains("group"), "nothing recorded: {state}");

    drop(listener);
    fs::remove_file(&socket).unwrap();
    let made = group.create_volume_group_snapshot(create_group("g1", &[&a, &b])).await.unwrap().into_inner();
    let made = made.group_snapshot.unwrap();
    assert!(made.ready_to_use);
    assert_eq!(made.snapshots.len(), 2);
    let sources: Vec<&str> = made.snapshots.iter().map(|s| s.source_volume_id.as_str()).collect();
    assert_eq!(sources, [a.as_str(), b.as_str()]);
    assert!(made.snapshots.iter().all(|s| s.group_snapshot_id == made.group_snapshot_id));
    assert_eq!((made.snapshots[0].size_bytes, made.snapshots[1].size_bytes), (MIB, 2 * MIB));
    let mut ids: Vec<String> = made.snapshots.iter().map(|s| s.snapshot_id.clone()).collect();
    ids.sort();
    assert_eq!(snapshot_dirs(&sb), ids);
    // Idempotent by name; the same name over other volumes is ALREADY_EXISTS.
    let again = group.create_volume_group_snapshot(create_group("g1", &[&a, &b])).await.unwrap().into_inner();
    assert_eq!(again.group_snapshot.unwrap().group_snapshot_id, made.group_snapshot_id);
    assert_eq!(
        code(group.create_volume_group_snapshot(create_group("g1", &[&a])).await),
        Code::AlreadyExists
    );
    assert_eq!(
        code(group.create_volume_group_snapshot(create_group("", &[&a])).await),
        Code::InvalidArgument
    );
    assert_eq!(
        code(group.create_volume_group_snapshot(create_group("g2", &[])).await),
        Code::InvalidArgument
    );
    let missing = volume_id_for_name("missing");
    assert_eq!(
        code(group.create_volume_group_snapshot(create_group("g2", &[&a, &missing])).await),
        Code::NotFound
    );
    assert_eq!(snapshot_dirs(&sb).len(), 2, "a refused group makes nothing");

    // A member restores like any snapshot, and cannot be deleted alone.
    let restore = csi::CreateVolumeRequest {
        volume_content_source: Some(csi::VolumeContentSource {
            r#type: Some(csi::volume_content_source::Type::Snapshot(
                csi::volume_content_source::SnapshotSource {
                    snapshot_id: made.snapshots[0].snapshot_id.clone(),
                },
            )),
        }),
        ..create_req("restored", 0)
    };
    let restored = d.controller.create_volume(restore).await.unwrap().into_inner().volume.unwrap();
    assert_eq!(
        fs::read(sb.path("state/volumes").join(&restored.volume_id).join("data")).unwrap(),
        b"a's data"
    );
    let del_member = csi::DeleteSnapshotRequest {
        snapshot_id: made.snapshots[0].snapshot_id.clone(),
        ..Default::default()
    };
    assert_eq!(code(d.controller.delete_snapshot(del_member).await), Code::FailedPrecondition);

    let get = |id: &str, snapshot_ids: Vec<String>| csi::GetVolumeGroupSnapshotRequest {
        group_snapshot_id: id.to_string(),
        snapshot_ids,
        ..Default::default()
    };
    let got =
        group.get_volume_group_snapshot(get(&made.group_snapshot_id, vec![])).await.unwrap().into_inner();
    assert_eq!(got.group_snapshot.unwrap(), made);
    assert_eq!(code(group.get_volume_group_snapshot(get("", vec![])).await), Code::InvalidArgument);
    assert_eq!(code(group.get_volume_group_snapshot(get("group-none", vec![])).await), Code::NotFound);
    let wrong = vec![ids[0].clone()];
    assert_eq!(
        code(group.get_volume_group_snapshot(get(&made.group_snapshot_id, wrong)).await),
        Code::InvalidArgument
    );

    let delete = |id: &str| csi::DeleteVolumeGroupSnapshotRequest {
        group_snapshot_id: id.to_string(),
        ..Default::default()
    };
    assert_eq!(code(group.delete_volume_group_snapshot(delete("")).await), Code::InvalidArgument);
    group.delete_volume_group_snapshot(delete(&made.group_snapshot_id)).await.unwrap();
    group.delete_volume_group_snapshot(delete(&made.group_snapshot_id)).await.unwrap();
    assert!(snapshot_dirs(&sb).is_empty());
    let listed =
        d.controller.list_snapshots(csi::ListSnapshotsRequest::default()).await.unwrap().into_inner();
    assert!(listed.entries.is_empty(), "{listed:?}");
    d.stop().await;
    sb.assert_nothing_mounted();
}

fn bytes_usage(stats: csi::NodeGetVolumeStatsResponse) -> csi::VolumeUsage {
    stats.usage.into_iter().find(|u| u.unit == csi::volume_usage::Unit::Bytes as i32).expect("a bytes usage")
}

#[tokio::test]
async fn expansion_is_visible_through_volume_stats_once_the_node_expands() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let id = create(&mut d, "pvc", 4 * MIB).await;
    let (staging, target) = (sb.path("stage"), sb.path("target"));
    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    d.node.node_publish_volume(publish_req(&id, &staging, &target, false)).await.unwrap();
    let stats = || csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    let before = bytes_usage(d.node.node_get_volume_stats(stats()).await.unwrap().into_inner());
    assert_eq!(before.total, 4 * MIB);
    fs::write(target.join("data"), vec![1u8; MIB as usize]).unwrap();
    let written = bytes_usage(d.node.node_get_volume_stats(stats()).await.unwrap().into_inner());
    assert!(written.used >= before.used + MIB, "{before:?} {written:?}");
    assert_eq!(written.available, 4 * MIB - written.used);

    let expand = csi::ControllerExpandVolumeRequest {
        volume_id: id.clone(),
        capacity_range: Some(csi::CapacityRange { required_bytes: 16 * MIB, limit_bytes: 0 }),
        ..Default::default()
    };
    let grown = d.controller.controller_expand_volume(expand).await.unwrap().into_inner();
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (16 * MIB, true));
    let stale = bytes_usage(d.node.node_get_volume_stats(stats()).await.unwrap().into_inner());
    assert_eq!(stale.total, 4 * MIB, "the node has not grown it yet");

    let node_expand = |required_bytes: i64| csi::NodeExpandVolumeRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        capacity_range: Some(csi::CapacityRange { required_bytes, limit_bytes: 0 }),
        ..Default::default()
    };
    assert_eq!(
        code(d.node.node_expand_volume(node_expand(32 * MIB)).await),
        Code::OutOfRange,
        "past the capacity"
    );
    let done = d.node.node_expand_volume(node_expand(16 * MIB)).await.unwrap().into_inner();
    assert_eq!(done.capacity_bytes, 16 * MIB);
    let after = bytes_usage(d.node.node_get_volume_stats(stats()).await.unwrap().into_inner());
    assert_eq!(after.total, 16 * MIB);
    // Through the staging path too, and kept across a restart.
    d.stop().await;
    let mut d = start(sb.config()).await;
    let staged = csi::NodeGetVolumeStatsRequest { volume_path: staging.display().to_string(), ..stats() };
    assert_eq!(bytes_usage(d.node.node_get_volume_stats(staged).await.unwrap().into_inner()).total, 16 * MIB);
    d.node.node_unpublish_volume(unpublish_req(&id, &target)).await.unwrap();
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    d.stop().await;
    sb.assert_nothing_mounted();
}

#[tokio::test]
async fn with_attach_on_a_volume_is_staged_only_once_attached_here() {
    let sb = Sandbox::new();
    let mut d = start(HostpathConfig { enable_attach: true, max_volumes_per_node: 0, ..sb.config() }).await;
    let id = create(&mut d, "pvc", MIB).await;
    let staging = sb.path("stage");
    let err = d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert_eq!(
        err.message(),
        format!("volume {id} is not attached to node node-a: controller publish it first")
    );
    assert!(sb.mounts().is_empty());

    let attach = |node: &str, readonly: bool| csi::ControllerPublishVolumeRequest {
        volume_id: id.clone(),
        node_id: node.to_string(),
        volume_capability: Some(mount_cap(Mode::SingleNodeWriter)),
        readonly,
        ..Default::default()
    };
    assert_eq!(code(d.controller.controller_publish_volume(attach("node-b", false)).await), Code::NotFound);
    let missing = csi::ControllerPublishVolumeRequest {
        volume_id: volume_id_for_name("nope"),
        ..attach("node-a", false)
    };
    assert_eq!(code(d.controller.controller_publish_volume(missing).await), Code::NotFound);
    let no_cap = csi::ControllerPublishVolumeRequest { volume_capability: None, ..attach("node-a", false) };
    assert_eq!(code(d.controller.controller_publish_volume(no_cap).await), Code::InvalidArgument);
    d.controller.controller_publish_volume(attach("node-a", false)).await.unwrap();
    d.controller.controller_publish_volume(attach("node-a", false)).await.unwrap();
    assert_eq!(
        code(d.controller.controller_publish_volume(attach("node-a", true)).await),
        Code::AlreadyExists
    );
    let state = fs::read_to_string(sb.path("state/state.json")).unwrap();
    assert!(state.contains("\"attached\"") && state.contains("node-a"), "{state}");

    d.node.node_stage_volume(stage_req(&id, &staging)).await.unwrap();
    assert_eq!(sb.mounts_on(&staging).len(), 1);
    let detach = csi::ControllerUnpublishVolumeRequest {
        volume_id: id.clone(),
        node_id: "node-a".into(),
        ..Default::default()
    };
    assert_eq!(
        code(d.controller.controller_unpublish_volume(detach.clone()).await),
        Code::FailedPrecondition,
        "still staged"
    );
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    let del = csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() };
    assert_eq!(
        code(d.controller.delete_volume(del.clone()).await),
        Code::FailedPrecondition,
        "still attached"
    );
    d.controller.controller_unpublish_volume(detach.clone()).await.unwrap();
    d.controller.controller_unpublish_volume(detach).await.unwrap();
    assert_eq!(code(d.node.node_stage_volume(stage_req(&id, &staging)).await), Code::FailedPrecondition);
    d.controller.delete_volume(del).await.unwrap();
    d.stop().await;
    sb.assert_nothing_mounted();
}

fn capacity_req(kind: Option<&str>) -> csi::GetCapacityRequest {
    csi::GetCapacityRequest {
        parameters: kind.map(|k| HashMap::from([("kind".to_string(), k.to_string())])).unwrap_or_default(),
        ..Default::default()
    }
}

fn kind_req(name: &str, kind: &str, required_bytes: i64) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        parameters: HashMap::from([("kind".to_string(), kind.to_string())]),
        ..create_req(name, required_bytes)
    }
}

#[tokio::test]
async fn capacity_is_the_filesystems_lowered_to_the_kinds_cap() {
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let free = |path: &Path| {
        let s = nix::sys::statvfs::statvfs(path).unwrap();
        (s.blocks_available() * s.fragment_size()) as i64
    };
    let reported = d.controller.get_capacity(capacity_req(None)).await.unwrap().into_inner();
    let actual = free(&sb.path("state"));
    // The filesystem is shared with whatever else runs: allow for other writers.
    assert!((reported.available_capacity - actual).abs() < 256 * MIB, "{reported:?} vs {actual}");
    assert_eq!(reported.maximum_volume_size, Some(reported.available_capacity));
    d.stop().await;

    let caps = [("slow".to_string(), 10 * MIB)].into();
    let mut d = start(HostpathConfig { capacity: caps, ..sb.config() }).await;
    let available = |r: csi::GetCapacityResponse| r.available_capacity;
    assert_eq!(
        available(d.controller.get_capacity(capacity_req(Some("slow"))).await.unwrap().into_inner()),
        10 * MIB
    );
    d.controller.create_volume(kind_req("a", "slow", 4 * MIB)).await.unwrap();
    assert_eq!(
        available(d.controller.get_capacity(capacity_req(Some("slow"))).await.unwrap().into_inner()),
        6 * MIB
    );
    let err = d.controller.create_volume(kind_req("b", "slow", 7 * MIB)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert!(err.message().contains("kind \"slow\" has 6291456 of its 10485760 bytes left"), "{err:?}");
    assert_eq!(
        available(d.controller.get_capacity(capacity_req(Some("fast"))).await.unwrap().into_inner()),
        0
    );
    assert_eq!(code(d.controller.create_volume(kind_req("c", "fast", MIB)).await), Code::ResourceExhausted);
    assert_eq!(
        code(d.controller.create_volume(create_req("d", MIB)).await),
        Code::ResourceExhausted,
        "no kind, no cap"
    );
    let elsewhere = csi::GetCapacityRequest {
        accessible_topology: Some(csi::Topology {
            segments: HashMap::from([(
                "topology.hostpath.csi.kvol.io/node".to_string(),
                "node-b".to_string(),
            )]),
        }),
        ..capacity_req(Some("slow"))
    };
    assert_eq!(available(d.controller.get_capacity(elsewhere).await.unwrap().into_inner()), 0);
    d.stop().await;
}

#[tokio::test]
async fn create_volume_honours_the_volume_limit() {
    let sb = Sandbox::new();
    let mut d = start(HostpathConfig { max_volumes_per_node: 2, ..sb.config() }).await;
    let info = d.node.node_get_info(csi::NodeGetInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.max_volumes_per_node, 2);
    let a = create(&mut d, "a", MIB).await;
    create(&mut d, "b", MIB).await;
    let err = d.controller.create_volume(create_req("c", MIB)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted);
    assert_eq!(err.message(), "volume c: node node-a already has 2 volumes, its limit of 2");
    assert!(!sb.path("state/volumes").join(volume_id_for_name("c")).exists());
    create(&mut d, "a", MIB).await; // an existing volume is still found by name
    let del = csi::DeleteVolumeRequest { volume_id: a, ..Default::default() };
    d.controller.delete_volume(del).await.unwrap();
    create(&mut d, "c", MIB).await;
    d.stop().await;
}

#[tokio::test]
async fn modify_volume_accepts_only_the_named_parameters() {
    let sb = Sandbox::new();
    let params = |pairs: &[(&str, &str)]| {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<HashMap<_, _>>()
    };
    // Off: mutable parameters are refused at creation too.
    let mut d = start(sb.config()).await;
    let with_params =
        csi::CreateVolumeRequest { mutable_parameters: params(&[("iops", "100")]), ..create_req("m", MIB) };
    assert_eq!(code(d.controller.create_volume(with_params.clone()).await), Code::InvalidArgument);
    d.stop().await;

    let config = HostpathConfig {
        enable_controller_modify_volume: true,
        accepted_mutable_parameter_names: ["iops".to_string()].into(),
        ..sb.config()
    };
    let mut d = start(config).await;
    let id = d.controller.create_volume(with_params).await.unwrap().into_inner().volume.unwrap().volume_id;
    let modify = |id: &str, pairs: &[(&str, &str)]| csi::ControllerModifyVolumeRequest {
        volume_id: id.to_string(),
        mutable_parameters: params(pairs),
        ..Default::default()
    };
    d.controller.controller_modify_volume(modify(&id, &[("iops", "300")])).await.unwrap();
    let state = fs::read_to_string(sb.path("state/state.json")).unwrap();
    assert!(state.contains("\"iops\": \"300\""), "{state}");
    let err =
        d.controller.controller_modify_volume(modify(&id, &[("iops", "1"), ("XXX", "y")])).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert_eq!(
        err.message(),
        format!("volume {id}: mutable parameters [\"XXX\"] are not accepted (accepted: [\"iops\"])")
    );
    assert!(
        fs::read_to_string(sb.path("state/state.json")).unwrap().contains("\"iops\": \"300\""),
        "a refused modify changes nothing"
    );
    assert_eq!(code(d.controller.controller_modify_volume(modify("", &[])).await), Code::InvalidArgument);
    assert_eq!(
        code(d.controller.controller_modify_volume(modify(&volume_id_for_name("x"), &[])).await),
        Code::NotFound
    );
    let refused =
        csi::CreateVolumeRequest { mutable_parameters: params(&[("XXX", "1")]), ..create_req("n", MIB) };
    assert_eq!(code(d.controller.create_volume(refused).await), Code::InvalidArgument);
    d.stop().await;
}

/// Detaches, when dropped, every loop device still holding `image`: a failed test leaves none.
struct LoopGuard(PathBuf);

impl Drop for LoopGuard {
    fn drop(&mut self) {
        for device in loop_devices_of(&self.0) {
            let _ = std::process::Command::new("losetup").arg("-d").arg(&device).status();
        }
    }
}

/// The loop devices holding `file`, as `losetup -j` lists them.
fn loop_devices_of(file: &Path) -> Vec<PathBuf> {
    let Ok(out) = std::process::Command::new("losetup").arg("-j").arg(file).output() else {
        return Vec::new();
    };
    kvol_hostpath::block::parse_associations(&String::from_utf8_lossy(&out.stdout))
}

/// Whether this machine can attach loop devices (losetup and /dev/loop-control); a test that
/// needs them says why it skips.
fn loop_devices_usable() -> bool {
    let usable = Path::new("/dev/loop-control").exists()
        && std::process::Command::new("losetup").arg("--version").output().is_ok_and(|o| o.status.success());
    if !usable {
        eprintln!("skipped: no losetup or /dev/loop-control on this machine");
    }
    usable
}

#[tokio::test]
async fn block_volumes_are_loop_devices_bound_onto_target_files() {
    use std::io::{Read, Seek, SeekFrom, Write};
    use std::os::unix::fs::FileTypeExt;
    if !loop_devices_usable() {
        return;
    }
    let sb = Sandbox::new();
    let mut d = start(sb.config()).await;
    let req =
        csi::CreateVolumeRequest { volume_capabilities: vec![block_cap()], ..create_req("blk", 16 * MIB) };
    let id = d.controller.create_volume(req).await.unwrap().into_inner().volume.unwrap().volume_id;
    let image = sb.path("state/volumes").join(&id).join(kvol_hostpath::block::IMAGE_FILE);
    let _guard = LoopGuard(image.clone());
    assert_eq!(fs::metadata(&image).unwrap().len(), 16 * MIB as u64);
    let staging = sb.path("kubelet/plugins/kubernetes.io/csi/volumeDevices/staging/blk");
    let target = sb.path("kubelet/plugins/kubernetes.io/csi/volumeDevices/publish/blk/p1");
    fs::create_dir_all(&staging).unwrap();
    fs::create_dir_all(target.parent().unwrap()).unwrap();
    let block_stage = |path: &Path| csi::NodeStageVolumeRequest {
        volume_capability: Some(block_cap()),
        ..stage_req(&id, path)
    };
    let block_publish = csi::NodePublishVolumeRequest {
        volume_capability: Some(block_cap()),
        ..publish_req(&id, &staging, &target, false)
    };
    let mounted_as_filesystem = d.node.node_stage_volume(stage_req(&id, &staging)).await;
    assert_eq!(code(mounted_as_filesystem), Code::InvalidArgument, "a block volume is not mounted");

    d.node.node_stage_volume(block_stage(&staging)).await.unwrap();
    d.node.node_stage_volume(block_stage(&staging)).await.expect("staging again is fine");
    let devices = loop_devices_of(&image);
    assert_eq!(devices.len(), 1, "one loop device: {devices:?}");
    d.node.node_publish_volume(block_publish.clone()).await.unwrap();
    d.node.node_publish_volume(block_publish.clone()).await.expect("publishing again is fine");
    assert!(fs::metadata(&target).unwrap().file_type().is_block_device(), "the target is the device");
    assert_eq!(sb.mounts_on(&target).len(), 1);

    let data: Vec<u8> = (0..MIB).map(|i| (i % 251) as u8).collect();
    let mut dev = fs::OpenOptions::new().read(true).write(true).open(&target).unwrap();
    dev.seek(SeekFrom::Start(MIB as u64)).unwrap();
    dev.write_all(&data).unwrap();
    dev.sync_all().unwrap();
    drop(dev);
    let mut back = vec![0u8; data.len()];
    let mut file = fs::File::open(&image).unwrap();
    file.seek(SeekFrom::Start(MIB as u64)).unwrap();
    file.read_exact(&mut back).unwrap();
    assert!(back == data, "what went through the device is in the image");
    let stats = csi::NodeGetVolumeStatsRequest {
        volume_id: id.clone(),
        volume_path: target.display().to_string(),
        ..Default::default()
    };
    let usage = d.node.node_get_volume_stats(stats).await.unwrap().into_inner().usage;
    assert_eq!(usage.len(), 1, "a device reports its size only: {usage:?}");
    assert_eq!((usage[0].total, usage[0].unit), (16 * MIB, csi::volume_usage::Unit::Bytes as i32));

    // A restarted driver finds the loop device again rather than attaching another.
    d.stop().await;
    let mut d = start(sb.config()).await;
    d.node.node_stage_volume(block_stage(&staging)).await.unwrap();
    assert_eq!(loop_devices_of(&image), devices, "the same loop device after a restart");

    let busy =
        d.controller.delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() });
    assert_eq!(code(busy.await), Code::FailedPrecondition, "in use");
    d.node.node_unpublish_volume(unpublish_req(&id, &target)).await.unwrap();
    assert!(fs::symlink_metadata(&target).is_err(), "the target file is removed");
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.unwrap();
    assert!(loop_devices_of(&image).is_empty(), "unstage detaches the loop device");
    d.node.node_unstage_volume(unstage_req(&id, &staging)).await.expect("unstaging again is fine");
    d.controller
        .delete_volume(csi::DeleteVolumeRequest { volume_id: id.clone(), ..Default::default() })
        .await
        .unwrap();
    assert!(!image.exists(), "delete removes the image");
    d.stop().await;
    sb.assert_nothing_mounted();
}
