//! The real `kvol agent --kubeconfig` against a real kube-apiserver (`KVOL_KUBE_APISERVER`, `KVOL_ETCD`; skipped with the reason when unset), with real mounts: the node's pods mounted and nobody else's, the node's storage objects kept in the API, and an outage of the API server that unmounts nothing, with its watch history compacted meanwhile (410 Gone on return), and an API server answering 429 and 500 for a while.

#[path = "support/api_proxy.rs"]
mod api_proxy;
#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kvol_node::report::status::{Phase, StatusReport, read_status};
use kvol_plugin::{Mounter, SystemMounter};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use serde_json::json;

const DRIVER: &str = "hostpath.csi.kvol.io";
const NODE: &str = "n1";

/// A kvol process the test runs (the agent, a driver), killed when dropped.
struct Process {
    what: &'static str,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            panic!("{} exited ({status}); its log:\n{log}", self.what);
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn create<K>(api: &Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("a valid object");
    api.create(&PostParams::default(), &object).await.expect("created")
}

/// A PersistentVolume `pv` of `size` with the volume `source` (`{"csi": …}` or an in-tree
/// source, with `labels`), pre-bound to claim `default/<claim>`, and that claim bound to it.
async fn bound_claim(
    client: &kube::Client,
    pv: &str,
    claim: &str,
    size: &str,
    labels: serde_json::Value,
    source: serde_json::Value,
) {
    let mut spec = json!({"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"], "storageClassName": "",
        "claimRef": {"namespace": "default", "name": claim}});
    for (key, value) in source.as_object().expect("a volume source") {
        spec[key] = value.clone();
    }
    create(
        &Api::<PersistentVolume>::all(client.clone()),
        json!({"metadata": {"name": pv, "labels": labels}, "spec": spec}),
    )
    .await;
    create(
        &Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default"),
        json!({"metadata": {"name": claim}, "spec": {"accessModes": ["ReadWriteOnce"],
            "storageClassName": "", "volumeName": pv, "resources": {"requests": {"storage": size}}}}),
    )
    .await;
}

/// A pod on `node` with a CSI ephemeral volume of the bundled driver and an emptyDir.
fn pod(name: &str, node: &str) -> serde_json::Value {
    kvol_test_support::pods::mounting_its_volumes(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": node,
        "containers": [{"name": "c", "image": "none"}],
        "volumes": [{"name": "data", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1Mi"}}},
                    {"name": "cache", "emptyDir": {}}]}}),
    )
}

/// This thread in a mount namespace of its own (the agent inherits it), a runtime, a real
/// kube-apiserver and its admin client; `None` (the reason printed) without the binaries.
fn private_cluster() -> Option<(tokio::runtime::Runtime, support::ApiServer, kube::Client)> {
    let (apiserver, etcd) = support::binaries()?;
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = runtime.block_on(server.client());
    Some((runtime, server, client))
}

/// `kvol agent --kubeconfig` as node [`NODE`] on a root below `dir` (its log beside it); the
/// root and the agent.
fn start_agent(dir: &kvol_test_support::ScratchRoot, kubeconfig: &Path) -> (PathBuf, Process) {
    let root: PathBuf = std::fs::canonicalize(dir.path()).unwrap().join("node");
    let log = dir.path().join("agent.log");
    let agent = Process {
        what: "the agent",
        child: Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["agent", "--no-metrics", "--resync-seconds", "1", "--node-name", NODE, "--kubeconfig"])
            .arg(kubeconfig)
            .arg("--root")
            .arg(&root)
            .env("KVOL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log,
    };
    (root, agent)
}

/// Waits (at most 60 s) until the agent's status file satisfies `ok`.
fn wait_status(
    root: &Path,
    agent: &mut Process,
    what: &str,
    ok: impl Fn(&StatusReport) -> bool,
) -> StatusReport {
    let start = Instant::now();
    loop {
        agent.assert_running();
        if let Ok(report) = read_status(root)
            && report.pid == agent.child.id()
            && ok(&report)
        {
            return report;
        }
        if start.elapsed() >= Duration::from_secs(60) {
            let log = std::fs::read_to_string(&agent.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
            panic!(
                "never {what}; status: {:#?}\nthe agent's log, last lines:\n{}",
                read_status(root),
                tail.join("\n")
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn published(report: &StatusReport, pod: &str, volume: &str) -> bool {
    report.volumes.iter().any(|v| v.pod == pod && v.volume == volume && v.phase == Phase::Published)
}

/// The CSI volume's publish path (`…/volumes/kubernetes.io~csi/data/mount`).
fn publish_path(report: &StatusReport, pod: &str) -> PathBuf {
    let v = report.volumes.iter().find(|v| v.pod == pod && v.volume == "data").expect("the volume");
    v.target.as_ref().expect("a target").join("mount")
}

/// CreateVolume of a 1 MiB filesystem volume named `name` on the driver at `socket`; its id.
async fn create_volume(socket: &Path, name: &str) -> String {
    use kvol_csi::proto::csi::controller_client::ControllerClient;
    use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    use kvol_csi::proto::csi::{CapacityRange, CreateVolumeRequest, VolumeCapability};
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .expect("the bundled driver's socket");
    let capability = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    };
    let answer = ControllerClient::new(channel)
        .create_volume(CreateVolumeRequest {
            name: name.into(),
            capacity_range: Some(CapacityRange { required_bytes: 1 << 20, limit_bytes: 0 }),
            volume_capabilities: vec![capability],
            ..CreateVolumeRequest::default()
        })
        .await
        .expect("CreateVolume");
    answer.into_inner().volume.expect("a volume").volume_id
}

/// Every path below `dir` (none if it is gone).
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

fn mounted(path: &Path, root: &Path) -> bool {
    SystemMounter.mounts_under(root).unwrap().iter().any(|m| m.target == path)
}

#[test]
fn the_agent_mounts_its_nodes_pods_from_the_api_and_keeps_them_through_an_outage() {
    let Some((runtime, mut server, client)) = private_cluster() else { return };
    runtime.block_on(support::nodes_and_csi_driver(&client, &[NODE, "n2"], DRIVER));
    let dir = kvol_test_support::ScratchRoot::new();
    let (root, mut agent) = start_agent(&dir, &server.kubeconfig);

    // Registration reaches the API: the CSINode lists the driver, the Node carries its node ID.
    runtime.block_on(async {
        support::wait_for_csinode_driver(&client, NODE, DRIVER).await;
        let node = Api::<Node>::all(client.clone()).get(NODE).await.unwrap();
        let ids = node.metadata.annotations.unwrap_or_default();
        let ids = ids.get("csi.volume.kubernetes.io/nodeid").expect("the node-ID annotation");
        assert!(ids.contains(DRIVER), "{ids}");
    });

    // This node's pod is mounted; the other node's pod is not this agent's business.
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    runtime.block_on(async {
        create(&pods, pod("mine", NODE)).await;
        create(&pods, pod("theirs", "n2")).await;
    });
    let report = wait_status(&root, &mut agent, "published mine", |r| {
        published(r, "default/mine", "data") && published(r, "default/mine", "cache")
    });
    assert!(!report.volumes.iter().any(|v| v.pod == "default/theirs"), "{:#?}", report.volumes);
    let mine = publish_path(&report, "default/mine");
    assert!(mounted(&mine, &root), "{} is not mounted", mine.display());
    std::fs::write(mine.join("kept"), "written before the outage").unwrap();

    // Every other kind kvol serves, from the API: hostPath, a Flexvolume driver's volume, and a
    // claim bound to a PV of the bundled driver (created on the driver, as a provisioner would).
    let host_dir = dir.path().join("host-data");
    let socket = root.join("kubelet/plugins").join(DRIVER).join("csi.sock");
    let handle = runtime.block_on(create_volume(&socket, "claimed"));
    runtime.block_on(async {
        bound_claim(
            &client,
            "pv-claimed",
            "claimed",
            "1Mi",
            json!({}),
            json!({"csi": {"driver": DRIVER, "volumeHandle": handle}}),
        )
        .await;
        create(
            &pods,
            kvol_test_support::pods::mounting_its_volumes(
                json!({"metadata": {"name": "kinds", "namespace": "default"}, "spec": {"nodeName": NODE,
                "containers": [{"name": "c", "image": "none"}],
                "volumes": [
                    {"name": "host", "hostPath": {"path": host_dir, "type": "DirectoryOrCreate"}},
                    {"name": "fast", "flexVolume": {"driver": "kvol/tmpfs", "options": {"size": "8Mi"}}},
                    {"name": "claimed", "persistentVolumeClaim": {"claimName": "claimed"}}]}}),
            ),
        )
        .await;
    });
    let report = wait_status(&root, &mut agent, "published every kind", |r| {
        ["host", "fast", "claimed"].iter().all(|v| published(r, "default/kinds", v))
    });
    let kinds_uid = report.volumes.iter().find(|v| v.pod == "default/kinds").unwrap().pod_uid.clone();
    let kinds_dir = root.join("kubelet/pods").join(&kinds_uid);
    assert!(
        !SystemMounter.mounts_under(&kinds_dir).unwrap().is_empty(),
        "the kinds pod's volumes are mounted"
    );

    // An in-tree GCE PD, migrated to pd.csi.storage.gke.io (a second bundled driver under that
    // name, serving the handle it is given), attached the cluster's way.
    let (_pd_driver, migrated_path) = migrated_gce_pd(&runtime, &client, dir.path(), &root, &mut agent);

    // The API server away for 30 s: nothing is unmounted, nothing is lost, the agent runs on.
    server.kill_apiserver();
    let outage = Instant::now();
    while outage.elapsed() < Duration::from_secs(30) {
        agent.assert_running();
        assert!(mounted(&mine, &root), "{} was unmounted during the outage", mine.display());
        std::thread::sleep(Duration::from_millis(500));
    }
    let report = wait_status(&root, &mut agent, "still published", |r| published(r, "default/mine", "data"));
    assert_eq!(publish_path(&report, "default/mine"), mine);
    assert_eq!(std::fs::read_to_string(mine.join("kept")).unwrap(), "written before the outage");

    // Back: a pod created after the outage is mounted (the watch resumed), the old one is kept.
    server.start_apiserver();
    let client = runtime.block_on(server.client());
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    runtime.block_on(create(&pods, pod("later", NODE)));
    wait_status(&root, &mut agent, "published later", |r| published(r, "default/later", "data"));
    assert!(mounted(&mine, &root), "{} was unmounted after the outage", mine.display());

    // A pod deleted gracefully keeps its volume while its containers may still run (no kubelet
    // here finishes the deletion), as kubelet keeps it; removed from the API, it is torn down.
    runtime.block_on(async { pods.delete("mine", &DeleteParams::default()).await.expect("deleted") });
    let terminating = runtime.block_on(async { pods.get("mine").await.expect("still there") });
    assert!(terminating.metadata.deletion_timestamp.is_some(), "{:?}", terminating.metadata);
    std::thread::sleep(Duration::from_secs(2));
    let report = wait_status(&root, &mut agent, "kept mine", |r| published(r, "default/mine", "data"));
    assert!(mounted(&mine, &root), "{} was unmounted during the grace period", mine.display());
    assert_eq!(publish_path(&report, "default/mine"), mine);
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    runtime.block_on(async { pods.delete("mine", &now).await.expect("deleted") });
    wait_status(&root, &mut agent, "tore mine down", |r| !r.volumes.iter().any(|v| v.pod == "default/mine"));
    assert!(!mounted(&mine, &root), "{} is still mounted", mine.display());
    assert!(!mine.parent().unwrap().exists(), "the pod volume directory is gone");
    runtime.block_on(async { pods.delete("kinds", &now).await.expect("deleted") });
    runtime.block_on(async { pods.delete("migrated", &now).await.expect("deleted") });
    wait_status(&root, &mut agent, "tore migrated down", |r| {
        !r.volumes.iter().any(|v| v.pod == "default/migrated")
    });
    assert!(!mounted(&migrated_path, &root), "{} is still mounted", migrated_path.display());
    runtime.block_on(wait_in_use(&client, GCE_PD_IN_USE, false));
    wait_status(&root, &mut agent, "tore kinds down", |r| {
        !r.volumes.iter().any(|v| v.pod == "default/kinds")
    });
    // The pod's emptied directory tree goes at the next resync (`--resync-seconds 1`), as
    // kubelet's housekeeping removes it.
    let start = Instant::now();
    while kinds_dir.exists() {
        assert!(
            start.elapsed() < Duration::from_secs(15),
            "{} is left: {:#?}",
            kinds_dir.display(),
            walk(&kinds_dir)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    agent.assert_running();
    drop(agent);
    let left = SystemMounter.mounts_under(&root).unwrap();
    for m in left.iter().rev() {
        let _ = nix::mount::umount2(&m.target, nix::mount::MntFlags::MNT_DETACH);
    }
}

/// The handle upstream's translation gives pdName `disk-1` in zone `zone-a`, and the name the
/// node reports it under in `status.volumesInUse`.
const GCE_PD_HANDLE: &str = "projects/UNSPECIFIED/zones/zone-a/disks/disk-1";
const GCE_PD_IN_USE: &str =
    "kubernetes.io/csi/pd.csi.storage.gke.io^projects/UNSPECIFIED/zones/zone-a/disks/disk-1";
const GCE_PD_DRIVER: &str = "pd.csi.storage.gke.io";

/// Waits (at most 30 s) until the Node's `status.volumesInUse` does, or does not, list `volume`.
async fn wait_in_use(client: &kube::Client, volume: &str, listed: bool) {
    let start = Instant::now();
    loop {
        let node = Api::<Node>::all(client.clone()).get(NODE).await.expect("the node");
        let in_use = node.status.and_then(|s| s.volumes_in_use).unwrap_or_default();
        if in_use.iter().any(|v| v == volume) == listed {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "volumesInUse never {listed} for {volume}: {in_use:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A pod with a claim bound to an in-tree GCE PD PV: the agent translates it, waits for the
/// VolumeAttachment (which the test makes and marks attached, as the attach/detach controller
/// and external-attacher would), then stages and publishes it on the driver named
/// `pd.csi.storage.gke.io`. Returns the driver's process and the publish path.
fn migrated_gce_pd(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    scratch: &Path,
    root: &Path,
    agent: &mut Process,
) -> (Process, PathBuf) {
    use k8s_openapi::api::storage::v1::VolumeAttachment;
    use kube::api::{Patch, PatchParams};
    let log = scratch.join("pd-driver.log");
    let driver = Process {
        what: "the pd.csi.storage.gke.io driver",
        child: Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["csi-driver", "--static-volumes", "--name", GCE_PD_DRIVER, "--node-name", NODE])
            .arg("--state-dir")
            .arg(scratch.join("pd-state"))
            .arg("--csi-socket")
            .arg(root.join("kubelet/plugins").join(GCE_PD_DRIVER).join("csi.sock"))
            .arg("--registration-dir")
            .arg(root.join("kubelet/plugins_registry"))
            .env("KVOL_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
        log,
    };
    let vas = Api::<VolumeAttachment>::all(client.clone());
    let va_name = kvol_csi_rules::names::attachment_id(GCE_PD_HANDLE, GCE_PD_DRIVER, NODE);
    runtime.block_on(async {
        support::wait_for_csinode_driver(client, NODE, GCE_PD_DRIVER).await;
        create(
            &Api::<CSIDriver>::all(client.clone()),
            json!({"metadata": {"name": GCE_PD_DRIVER}, "spec": {"attachRequired": true}}),
        )
        .await;
        bound_claim(
            client,
            "pv-gce",
            "gce",
            "1Gi",
            json!({"topology.kubernetes.io/zone": "zone-a"}),
            json!({"gcePersistentDisk": {"pdName": "disk-1", "fsType": "ext4"}}),
        )
        .await;
        create(
            &Api::<Pod>::namespaced(client.clone(), "default"),
            kvol_test_support::pods::mounting_its_volumes(
                json!({"metadata": {"name": "migrated", "namespace": "default"}, "spec": {"nodeName": NODE,
                "containers": [{"name": "c", "image": "none"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "gce"}}]}}),
            ),
        )
        .await;
    });
    // Without its VolumeAttachment the volume waits: nothing is staged.
    std::thread::sleep(Duration::from_secs(2));
    let report = read_status(root).expect("the status");
    assert!(!published(&report, "default/migrated", "data"), "published unattached: {:#?}", report.volumes);
    runtime.block_on(async {
        create(
            &vas,
            json!({"metadata": {"name": va_name}, "spec": {"attacher": GCE_PD_DRIVER, "nodeName": NODE,
                "source": {"persistentVolumeName": "pv-gce"}}}),
        )
        .await;
        let status = json!({"status": {"attached": true, "attachmentMetadata": {"devicePath": "/dev/sdb"}}});
        vas.patch_status(&va_name, &PatchParams::default(), &Patch::Merge(&status)).await.expect("marked");
    });
    let report = wait_status(root, agent, "published migrated", |r| published(r, "default/migrated", "data"));
    let path = publish_path(&report, "default/migrated");
    assert!(mounted(&path, root), "{} is not mounted", path.display());
    std::fs::write(path.join("on-the-pd"), "migrated").unwrap();
    let staged = root
        .join("kubelet/plugins/kubernetes.io/csi")
        .join(GCE_PD_DRIVER)
        .join(kvol_csi_rules::names::sha256_hex(GCE_PD_HANDLE))
        .join("globalmount");
    assert!(mounted(&staged, root), "staged under the translated handle's hash: {}", staged.display());
    runtime.block_on(wait_in_use(client, GCE_PD_IN_USE, true));
    (driver, path)
}

/// `kvol migrate check --kubeconfig` reads the live cluster: an in-tree PV, the CSINodes and
/// the Secrets; a missing secret blocks, and creating it unblocks.
#[test]
fn migrate_check_reads_a_live_cluster() {
    use k8s_openapi::api::core::v1::Secret;
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = runtime.block_on(server.client());
    runtime.block_on(async {
        create(
            &Api::<PersistentVolume>::all(client.clone()),
            json!({"metadata": {"name": "share"}, "spec": {"capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteMany"],
                "azureFile": {"shareName": "s", "secretName": "creds", "secretNamespace": "default"}}}),
        )
        .await;
        create(&Api::<Node>::all(client.clone()), json!({"metadata": {"name": NODE}})).await;
        create(
            &Api::<CSINode>::all(client.clone()),
            json!({"metadata": {"name": NODE}, "spec": {"drivers": [{"name": "file.csi.azure.com", "nodeID": NODE}]}}),
        )
        .await;
    });
    let check = || {
        Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["migrate", "check", "-o", "json", "--kubeconfig"])
            .arg(&server.kubeconfig)
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_FEATURE_GATES")
            .output()
            .unwrap()
    };
    let out = check();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    assert_eq!(out.status.code(), Some(1), "{report:#}");
    assert_eq!(report["plugins"][0]["plugin"], "kubernetes.io/azure-file");
    assert_eq!(report["plugins"][0]["registeredOn"], json!([NODE]));
    assert_eq!(report["plugins"][0]["missingSecrets"], json!(["default/creds"]));
    runtime.block_on(create(
        &Api::<Secret>::namespaced(client.clone(), "default"),
        json!({"metadata": {"name": "creds"}}),
    ));
    let out = check();
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["blockers"], json!([]), "{report:#}");
    assert_eq!(out.status.code(), Some(0));
}

/// A user component deployed into the cluster from its bundle: applied with kvol's label and
/// field manager, an object its bundle drops pruned, and left alone once turned off.
#[test]
fn component_bundles_are_applied_pruned_and_left_alone_when_off() {
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = runtime.block_on(server.client());
    let dir = kvol_test_support::ScratchRoot::new();
    let definitions = dir.path().join("components");
    std::fs::create_dir_all(&definitions).unwrap();
    let definition = |with_settings: bool| {
        let settings = "  - {apiVersion: v1, kind: ConfigMap, metadata: {name: cloud-settings, namespace: default}, data: {level: \"1\"}}\n";
        format!(
            "name: cloud\nrole: driver\nprovides: {{csiDriver: cloud.csi.example}}\ncluster:\n  objects:\n\
             {}  - {{apiVersion: storage.k8s.io/v1, kind: CSIDriver, metadata: {{name: cloud.csi.example}}, spec: {{attachRequired: false}}}}\n\
             \x20 - {{apiVersion: v1, kind: ServiceAccount, metadata: {{name: cloud, namespace: default}}}}\n",
            if with_settings { settings } else { "" }
        )
    };
    std::fs::write(definitions.join("cloud.yaml"), definition(true)).unwrap();
    let config = dir.path().join("kvol.yaml");
    let apply = |storage: &str| {
        std::fs::write(&config, storage).unwrap();
        let out = Command::new(env!("CARGO_BIN_EXE_kvol"))
            .arg("--config")
            .arg(&config)
            .args(["components", "apply", "--kubeconfig"])
            .arg(&server.kubeconfig)
            .arg("--definitions-dir")
            .arg(&definitions)
            .env_remove("KVOL_CONFIG")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).to_string();
        assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
        stdout
    };
    let label = |labels: Option<&std::collections::BTreeMap<String, String>>| {
        labels.and_then(|l| l.get("components.kvol.io/name")).cloned()
    };

    // On: every object applied, labelled, under kvol's field manager.
    let out = apply("storage:\n  driver: cloud\n  optionalCsiComponents: [none]\n");
    assert!(out.contains("applied ServiceAccount default/cloud (cloud)"), "{out}");
    runtime.block_on(async {
        let settings =
            Api::<ConfigMap>::namespaced(client.clone(), "default").get("cloud-settings").await.unwrap();
        assert_eq!(label(settings.metadata.labels.as_ref()).as_deref(), Some("cloud"));
        let managers: Vec<String> = settings
            .metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter_map(|m| m.manager)
            .collect();
        assert!(managers.iter().any(|m| m == "kvol"), "{managers:?}");
        let driver = Api::<CSIDriver>::all(client.clone()).get("cloud.csi.example").await.unwrap();
        assert_eq!(label(driver.metadata.labels.as_ref()).as_deref(), Some("cloud"));
    });

    // The bundle drops the ConfigMap: it is pruned, the rest stays.
    std::fs::write(definitions.join("cloud.yaml"), definition(false)).unwrap();
    let out = apply("storage:\n  driver: cloud\n  optionalCsiComponents: [none]\n");
    assert!(out.contains("pruned ConfigMap default/cloud-settings (cloud)"), "{out}");
    runtime.block_on(async {
        let gone =
            Api::<ConfigMap>::namespaced(client.clone(), "default").get_opt("cloud-settings").await.unwrap();
        assert!(gone.is_none(), "{gone:?}");
        assert!(
            Api::<ServiceAccount>::namespaced(client.clone(), "default")
                .get_opt("cloud")
                .await
                .unwrap()
                .is_some()
        );
    });

    // Off: nothing applied, nothing deleted; the objects stay exactly as they are.
    let before = runtime.block_on(async {
        Api::<ServiceAccount>::namespaced(client.clone(), "default")
            .get("cloud")
            .await
            .unwrap()
            .metadata
            .resource_version
    });
    let out = apply("storage:\n  driver: none\n  optionalCsiComponents: [none]\n");
    assert!(out.contains("left alone: component cloud is off"), "{out}");
    assert!(!out.contains("applied") && !out.contains("pruned"), "{out}");
    runtime.block_on(async {
        let sa = Api::<ServiceAccount>::namespaced(client.clone(), "default").get("cloud").await.unwrap();
        assert_eq!(sa.metadata.resource_version, before, "the turned-off component's object was touched");
        assert!(Api::<CSIDriver>::all(client.clone()).get_opt("cloud.csi.example").await.unwrap().is_some());
    });

    // Uninstall from the cluster: refused while a volume and a claim of its driver exist, each
    // named; once they are gone, its objects are deleted.
    let uninstall = |force: bool| {
        Command::new(env!("CARGO_BIN_EXE_kvol"))
            .arg("--config")
            .arg(&config)
            .args(["components", "uninstall", "cloud", "--kubeconfig"])
            .arg(&server.kubeconfig)
            .arg("--definitions-dir")
            .arg(&definitions)
            .args(force.then_some("--force"))
            .env_remove("KVOL_CONFIG")
            .output()
            .unwrap()
    };
    runtime.block_on(async {
        bound_claim(
            &client,
            "pv-cloud",
            "cloudy",
            "1Gi",
            json!({}),
            json!({"csi": {"driver": "cloud.csi.example", "volumeHandle": "vol-1"}}),
        )
        .await;
    });
    let out = uninstall(false);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("PersistentVolume pv-cloud")
            && stderr.contains("PersistentVolumeClaim default/cloudy"),
        "{stderr}"
    );
    runtime.block_on(async {
        assert!(
            Api::<CSIDriver>::all(client.clone()).get_opt("cloud.csi.example").await.unwrap().is_some(),
            "refused, yet deleted"
        );
        use kube::api::{Patch, PatchParams};
        let now = DeleteParams::default();
        let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
        let volumes = Api::<PersistentVolume>::all(client.clone());
        claims.delete("cloudy", &now).await.unwrap();
        volumes.delete("pv-cloud", &now).await.unwrap();
        // The API server's protection finalizers stay until a controller releases them; no
        // controller runs here, so the test does its part.
        let release = json!({"metadata": {"finalizers": null}});
        claims.patch("cloudy", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
        volumes.patch("pv-cloud", &PatchParams::default(), &Patch::Merge(&release)).await.unwrap();
        assert!(volumes.get_opt("pv-cloud").await.unwrap().is_none());
        assert!(claims.get_opt("cloudy").await.unwrap().is_none());
        // One more volume of the driver, which the user chooses to orphan.
        create(
            &volumes,
            json!({"metadata": {"name": "pv-left"}, "spec": {"capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"], "csi": {"driver": "cloud.csi.example", "volumeHandle": "vol-2"}}}),
        )
        .await;
    });
    let out = uninstall(false);
    assert_eq!(out.status.code(), Some(1), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("PersistentVolume pv-left"));
    let out = uninstall(true);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("orphaned: PersistentVolume pv-left: a volume of cloud.csi.example"), "{stdout}");
    assert!(stdout.contains("deleted ServiceAccount default/cloud"), "{stdout}");
    runtime.block_on(async {
        assert!(Api::<CSIDriver>::all(client.clone()).get_opt("cloud.csi.example").await.unwrap().is_none());
        assert!(
            Api::<ServiceAccount>::namespaced(client.clone(), "default")
                .get_opt("cloud")
                .await
                .unwrap()
                .is_none()
        );
    });
}

/// The built-in bundles (the bundled hostpath driver and the LVM driver, each beside upstream's
/// external-provisioner) are accepted whole by a real API server once kvol's image is named;
/// without one, nothing of them is applied and the message says what to pass.
#[test]
fn built_in_bundles_deploy_with_kvols_image_and_wait_without_one() {
    use k8s_openapi::api::apps::v1::DaemonSet;
    use k8s_openapi::api::rbac::v1::{ClusterRole, Role};
    use k8s_openapi::api::storage::v1::StorageClass;
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = runtime.block_on(server.client());
    let dir = kvol_test_support::ScratchRoot::new();
    let config = dir.path().join("kvol.yaml");
    let apply = |storage: &str, image: Option<&str>| {
        std::fs::write(&config, storage).unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
        command
            .arg("--config")
            .arg(&config)
            .args(["components", "apply", "--kubeconfig"])
            .arg(&server.kubeconfig)
            .arg("--definitions-dir")
            .arg(dir.path().join("none"))
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_IMAGE");
        if let Some(image) = image {
            command.args(["--image", image]);
        }
        command.output().unwrap()
    };
    let text = |out: &std::process::Output| {
        format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
    };

    // No image: refused with what to do, nothing applied.
    let out = apply("storage:\n  driver: hostpath\n  optionalCsiComponents: [none]\n", None);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(
        text(&out).contains("component hostpath: its bundle runs kvol's own container image"),
        "{}",
        text(&out)
    );
    assert!(text(&out).contains("--image"), "{}", text(&out));
    runtime.block_on(async {
        assert!(
            Api::<CSIDriver>::all(client.clone()).get_opt("hostpath.csi.kvol.io").await.unwrap().is_none()
        );
    });

    // Named: every object of the bundle is accepted by the API server's validation.
    let image = "registry.example/kvol:e2e";
    let out = apply("storage:\n  driver: hostpath\n  optionalCsiComponents: [none]\n", Some(image));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("applied DaemonSet kvol-hostpath/csi-hostpath (hostpath)"), "{}", text(&out));
    runtime.block_on(async {
        let daemonset =
            Api::<DaemonSet>::namespaced(client.clone(), "kvol-hostpath").get("csi-hostpath").await.unwrap();
        let containers = daemonset.spec.template.spec.unwrap().containers;
        let images: Vec<&str> = containers.iter().filter_map(|c| c.image.as_deref()).collect();
        assert_eq!(images, [image, "registry.k8s.io/sig-storage/csi-provisioner:v5.2.0"]);
        let class = Api::<StorageClass>::all(client.clone()).get("kvol-hostpath").await.unwrap();
        assert_eq!(class.provisioner, "hostpath.csi.kvol.io");
        assert_eq!(class.volume_binding_mode.as_deref(), Some("WaitForFirstConsumer"));
        let role = Api::<ClusterRole>::all(client.clone()).get("kvol-hostpath-provisioner").await.unwrap();
        assert!(!role.rules.unwrap_or_default().is_empty());
        let driver = Api::<CSIDriver>::all(client.clone()).get("hostpath.csi.kvol.io").await.unwrap();
        assert_eq!(driver.metadata.labels.unwrap()["components.kvol.io/name"], "hostpath");
    });

    // The cluster footprint: objects, the workload's readiness (no kubelet runs its pods here)
    // and what each pod requests.
    let out = Command::new(env!("CARGO_BIN_EXE_kvol"))
        .arg("--config")
        .arg(&config)
        .args(["components", "status", "--kubeconfig"])
        .arg(&server.kubeconfig)
        .arg("--definitions-dir")
        .arg(dir.path().join("none"))
        .env_remove("KVOL_CONFIG")
        .output()
        .unwrap();
    let status = text(&out);
    assert!(out.status.success(), "{status}");
    assert!(status.contains("hostpath: run: storage.driver is hostpath"), "{status}");
    assert!(
        status.contains("1 CSIDriver, 1 ClusterRole, 1 ClusterRoleBinding, 1 DaemonSet, 1 Namespace"),
        "{status}"
    );
    assert!(
        status.contains("DaemonSet kvol-hostpath/csi-hostpath: 0/0 pods ready; each pod requests driver cpu 10m memory 24Mi, provisioner cpu 10m memory 32Mi"),
        "{status}"
    );
    assert!(status.contains("lvm: off: ") && status.contains("  volumes: 0\n"), "{status}");

    // The LVM driver instead: its bundle applied too, the hostpath one left as it is.
    let out = apply("storage:\n  driver: lvm\n  optionalCsiComponents: [none]\n", Some(image));
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("left alone: component hostpath is off"), "{}", text(&out));
    runtime.block_on(async {
        let daemonset =
            Api::<DaemonSet>::namespaced(client.clone(), "kvol-lvm").get("csi-lvm").await.unwrap();
        let args = daemonset.spec.template.spec.unwrap().containers[1].args.clone().unwrap();
        assert!(args.iter().any(|a| a == "--enable-capacity"), "{args:?}");
        assert!(
            Api::<Role>::namespaced(client.clone(), "kvol-lvm")
                .get_opt("csi-lvm-capacity")
                .await
                .unwrap()
                .is_some()
        );
        let driver = Api::<CSIDriver>::all(client.clone()).get("lvm.csi.kvol.io").await.unwrap();
        assert_eq!(driver.spec.storage_capacity, Some(true));
        assert!(
            Api::<CSIDriver>::all(client.clone()).get_opt("hostpath.csi.kvol.io").await.unwrap().is_some()
        );
    });
}

/// The volume the ServiceAccount admission plugin gives every pod (as v1.26 writes it; the test
/// server runs without that plugin, so the test writes it as the plugin would).
fn kube_api_access() -> serde_json::Value {
    json!({"name": "kube-api-access-x7k2p", "projected": {"defaultMode": 420, "sources": [
        {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
        {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
        {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}}]}}]}})
}

#[test]
fn every_pods_api_access_volume_holds_a_token_the_api_server_accepts() {
    use k8s_openapi::api::authentication::v1::TokenReview;
    use k8s_openapi::api::core::v1::{ConfigMap, ServiceAccount};
    let Some((runtime, server, client)) = private_cluster() else { return };
    let roots = Api::<ConfigMap>::namespaced(client.clone(), "default");
    runtime.block_on(async {
        create(&Api::<Node>::all(client.clone()), json!({"metadata": {"name": NODE}})).await;
        // What the controller-manager would have made: the account, and the root CA bundle.
        create(
            &Api::<ServiceAccount>::namespaced(client.clone(), "default"),
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        create(
            &roots,
            json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "first bundle\n"}}),
        )
        .await;
    });
    let dir = kvol_test_support::ScratchRoot::new();
    let (root, mut agent) = start_agent(&dir, &server.kubeconfig);
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let created = Instant::now();
    let uid = runtime.block_on(async {
        let pod: Pod = create(
            &pods,
            kvol_test_support::pods::mounting_its_volumes(
                json!({"metadata": {"name": "app", "namespace": "default"}, "spec": {"nodeName": NODE,
                "serviceAccountName": "default", "containers": [{"name": "c", "image": "none"}],
                "volumes": [kube_api_access()]}}),
            ),
        )
        .await;
        pod.metadata.uid.expect("a uid")
    });
    wait_status(&root, &mut agent, "published the api access volume", |r| {
        published(r, "default/app", "kube-api-access-x7k2p")
    });
    eprintln!("kube-api-access published {:?} after the pod was created", created.elapsed());
    let volume =
        root.join("kubelet/pods").join(&uid).join("volumes/kubernetes.io~projected/kube-api-access-x7k2p");
    assert_eq!(std::fs::read_to_string(volume.join("namespace")).unwrap(), "default");
    assert_eq!(std::fs::read_to_string(volume.join("ca.crt")).unwrap(), "first bundle\n");
    let token = std::fs::read_to_string(volume.join("token")).unwrap();
    assert!(mounted(&volume, &root), "the volume is a tmpfs");

    // The API server takes the token: the pod's service account, bound to this pod.
    let review: TokenReview = runtime.block_on(async {
        let api = Api::<TokenReview>::all(client.clone());
        let body: TokenReview = serde_json::from_value(json!({"spec": {"token": token}})).unwrap();
        api.create(&PostParams::default(), &body).await.expect("a token review")
    });
    let status = review.status.expect("a review status");
    assert_eq!(status.authenticated, Some(true), "{status:?}");
    let user = status.user.expect("a user");
    assert_eq!(user.username.as_deref(), Some("system:serviceaccount:default:default"));
    let extra = user.extra.unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/pod-name"),
        Some(&vec!["app".to_string()]),
        "{extra:?}"
    );
    assert_eq!(extra.get("authentication.kubernetes.io/pod-uid"), Some(&vec![uid.clone()]));

    // The CA bundle rotated: in the pod's files within a second or so, the token untouched.
    let asked = Instant::now();
    runtime.block_on(async {
        let patch = json!({"data": {"ca.crt": "second bundle\n"}});
        roots
            .patch("kube-root-ca.crt", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
            .await
            .unwrap();
    });
    while std::fs::read_to_string(volume.join("ca.crt")).unwrap_or_default() != "second bundle\n" {
        assert!(asked.elapsed() < Duration::from_secs(10), "the new bundle never arrived");
        std::thread::sleep(Duration::from_millis(5));
    }
    eprintln!("a ConfigMap change reached the pod's files {:?} after the patch", asked.elapsed());
    assert_eq!(
        std::fs::read_to_string(volume.join("token")).unwrap(),
        token,
        "the token is not minted again"
    );

    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    runtime.block_on(async { pods.delete("app", &now).await.expect("deleted") });
    wait_status(&root, &mut agent, "tore the pod down", |r| r.volumes.is_empty());
    assert!(!mounted(&volume, &root), "{} is still mounted", volume.display());
    agent.assert_running();
}

#[test]
fn a_claim_the_resizer_grew_is_grown_on_the_node_and_its_status_says_so() {
    use kube::api::{Patch, PatchParams};
    use kvol_csi::proto::csi::controller_client::ControllerClient;
    use kvol_csi::proto::csi::{CapacityRange, ControllerExpandVolumeRequest};
    let Some((runtime, server, client)) = private_cluster() else { return };
    runtime.block_on(async {
        create(&Api::<Node>::all(client.clone()), json!({"metadata": {"name": NODE}})).await;
        create(
            &Api::<CSIDriver>::all(client.clone()),
            json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": false}}),
        )
        .await;
    });
    let dir = kvol_test_support::ScratchRoot::new();
    let (root, mut agent) = start_agent(&dir, &server.kubeconfig);
    let socket = root.join("kubelet/plugins").join(DRIVER).join("csi.sock");
    let start = Instant::now();
    while !socket.exists() {
        assert!(start.elapsed() < Duration::from_secs(60), "no bundled driver");
        std::thread::sleep(Duration::from_millis(50));
    }
    let handle = runtime.block_on(create_volume(&socket, "grown"));
    let claims = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default");
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    runtime.block_on(async {
        bound_claim(
            &client,
            "pv-grown",
            "grown",
            "1Mi",
            json!({}),
            json!({"csi": {"driver": DRIVER, "volumeHandle": handle}}),
        )
        .await;
        let status = json!({"status": {"phase": "Bound", "capacity": {"storage": "1Mi"}}});
        claims.patch_status("grown", &PatchParams::default(), &Patch::Merge(&status)).await.unwrap();
        create(
            &pods,
            kvol_test_support::pods::mounting_its_volumes(
                json!({"metadata": {"name": "db", "namespace": "default"}, "spec": {"nodeName": NODE,
                "containers": [{"name": "c", "image": "none"}],
                "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "grown"}}]}}),
            ),
        )
        .await;
    });
    wait_status(&root, &mut agent, "published the claim", |r| published(r, "default/db", "data"));

    // What the external-resizer does: the volume grown by its driver, the PV's capacity
    // raised, the claim marked FileSystemResizePending.
    let asked = Instant::now();
    runtime.block_on(async {
        let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
            .unwrap()
            .connect()
            .await
            .unwrap();
        ControllerClient::new(channel)
            .controller_expand_volume(ControllerExpandVolumeRequest {
                volume_id: handle.clone(),
                capacity_range: Some(CapacityRange { required_bytes: 2 << 20, limit_bytes: 0 }),
                ..ControllerExpandVolumeRequest::default()
            })
            .await
            .unwrap();
        let pv = json!({"spec": {"capacity": {"storage": "2Mi"}}});
        Api::<PersistentVolume>::all(client.clone())
            .patch("pv-grown", &PatchParams::default(), &Patch::Merge(&pv))
            .await
            .unwrap();
        let pending =
            json!({"status": {"conditions": [{"type": "FileSystemResizePending", "status": "True"}]}});
        claims.patch_status("grown", &PatchParams::default(), &Patch::Merge(&pending)).await.unwrap();
    });
    // The node grows it and says so on the claim, as kubelet does.
    let status = runtime.block_on(async {
        loop {
            let claim = claims.get("grown").await.unwrap();
            let status = claim.status.unwrap_or_default();
            let capacity = status.capacity.as_ref().and_then(|c| c.get("storage")).map(|q| q.0.clone());
            let pending = status.conditions.iter().flatten().any(|c| c.type_ == "FileSystemResizePending");
            if capacity.as_deref() == Some("2Mi") && !pending {
                return status;
            }
            assert!(
                asked.elapsed() < Duration::from_secs(120),
                "the claim's status never said so: {status:?}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let took = asked.elapsed();
    eprintln!(
        "resizer done → the claim's status says 2Mi (the PV's own quantity), condition cleared, {took:?} later"
    );
    assert!(
        took < Duration::from_secs(10),
        "the PV and claim are followed by watch, not reread every 30 s: {took:?}"
    );
    assert!(status.conditions.iter().flatten().all(|c| c.type_ != "FileSystemResizePending"));
    // kubelet's FileSystemResizeSuccessful, on the claim and on the pod.
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), "default");
    let told = runtime.block_on(async {
        loop {
            let list = events.list(&Default::default()).await.unwrap();
            let told: Vec<(String, String, String)> = list
                .items
                .into_iter()
                .filter(|e| e.reason.as_deref() == Some("FileSystemResizeSuccessful"))
                .map(|e| {
                    (
                        e.involved_object.kind.unwrap_or_default(),
                        e.involved_object.name.unwrap_or_default(),
                        e.message.unwrap_or_default(),
                    )
                })
                .collect();
            if told.len() >= 2 || asked.elapsed() > Duration::from_secs(60) {
                return told;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let message = format!("MountVolume.NodeExpandVolume succeeded for volume \"pv-grown\" {NODE}");
    let mut told = told;
    told.sort();
    assert_eq!(
        told,
        [
            ("PersistentVolumeClaim".to_string(), "grown".to_string(), message.clone()),
            ("Pod".to_string(), "db".to_string(), message)
        ]
    );
    let log = std::fs::read_to_string(&agent.log).unwrap();
    assert!(log.contains("volume_fs_resize"), "{log}");
    assert!(!log.contains("volume_unmount"), "never unpublished: {log}");
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    runtime.block_on(async { pods.delete("db", &now).await.unwrap() });
    wait_status(&root, &mut agent, "tore db down", |r| r.volumes.is_empty());
    agent.assert_running();
}

/// How long the API server stays away in the outage test: `KVOL_APISERVER_AWAY_SECS` when set
/// (the five minutes: 300), else 30 s.
fn away() -> Duration {
    let secs = std::env::var("KVOL_APISERVER_AWAY_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(30);
    Duration::from_secs(secs)
}

/// An outage's node: pods `leaving` (to be deleted meanwhile) and `reader` (its ConfigMap
/// `settings` to be changed meanwhile), each with a CSI ephemeral volume of the bundled driver,
/// and `migrated` (an attachable volume, so the Node's `volumesInUse` lists it); the agent
/// reaching the API through `kubeconfig`.
struct Outage {
    root: PathBuf,
    agent: Process,
    _pd_driver: Process,
    leaving: PathBuf,
    reader_file: PathBuf,
    migrated: PathBuf,
    _dir: kvol_test_support::ScratchRoot,
}

const SETTINGS: &str = "settings";

fn reader_pod() -> serde_json::Value {
    kvol_test_support::pods::mounting_its_volumes(
        json!({"metadata": {"name": "reader", "namespace": "default"}, "spec": {"nodeName": NODE,
        "containers": [{"name": "c", "image": "none"}],
        "volumes": [{"name": "data", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1Mi"}}},
                    {"name": "settings", "configMap": {"name": SETTINGS}}]}}),
    )
}

fn settings(greeting: &str) -> serde_json::Value {
    json!({"metadata": {"name": SETTINGS, "namespace": "default"}, "data": {"greeting": greeting}})
}

/// The node's objects in the API, the agent started on `kubeconfig`, every pod published.
fn outage_node(runtime: &tokio::runtime::Runtime, client: &kube::Client, kubeconfig: &Path) -> Outage {
    use k8s_openapi::api::core::v1::ConfigMap;
    runtime.block_on(async {
        support::nodes_and_csi_driver(client, &[NODE], DRIVER).await;
        create(&Api::<ConfigMap>::namespaced(client.clone(), "default"), settings("before")).await;
        let pods = Api::<Pod>::namespaced(client.clone(), "default");
        create(&pods, pod("leaving", NODE)).await;
        create(&pods, reader_pod()).await;
    });
    let dir = kvol_test_support::ScratchRoot::new();
    let (root, mut agent) = start_agent(&dir, kubeconfig);
    let report = wait_status(&root, &mut agent, "published leaving and reader", |r| {
        published(r, "default/leaving", "data") && published(r, "default/reader", "settings")
    });
    let leaving = publish_path(&report, "default/leaving");
    std::fs::write(leaving.join("kept"), "written before the outage").unwrap();
    let reader = report.volumes.iter().find(|v| v.pod == "default/reader" && v.volume == "settings").unwrap();
    let reader_file = reader.target.clone().unwrap().join("greeting");
    assert_eq!(std::fs::read_to_string(&reader_file).unwrap(), "before");
    let (pd_driver, migrated) = migrated_gce_pd(runtime, client, dir.path(), &root, &mut agent);
    Outage { root, agent, _pd_driver: pd_driver, leaving, reader_file, migrated, _dir: dir }
}

/// What changes while the agent cannot see it: `leaving` deleted, `settings` changed, a pod
/// `arriving` created.
async fn change_meanwhile(client: &kube::Client) {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    pods.delete("leaving", &now).await.expect("deleted");
    Api::<ConfigMap>::namespaced(client.clone(), "default")
        .patch(SETTINGS, &PatchParams::default(), &Patch::Merge(settings("after")))
        .await
        .expect("changed");
    create(&pods, pod("arriving", NODE)).await;
}

impl Outage {
    /// While the agent cannot see the API: it runs, keeps the last known pods (nothing torn
    /// down, the old ConfigMap content), every mount in place.
    fn assert_kept(&mut self) {
        self.agent.assert_running();
        for path in [&self.leaving, &self.migrated] {
            assert!(mounted(path, &self.root), "{} was unmounted while the api was away", path.display());
        }
        assert_eq!(std::fs::read_to_string(self.leaving.join("kept")).unwrap(), "written before the outage");
        assert_eq!(std::fs::read_to_string(&self.reader_file).unwrap(), "before");
        let report = read_status(&self.root).expect("the status");
        assert!(published(&report, "default/leaving", "data"), "{:#?}", report.volumes);
        assert!(!report.volumes.iter().any(|v| v.pod == "default/arriving"), "{:#?}", report.volumes);
    }

    /// Waits (at most 120 s) until what changed is applied: `leaving`'s volumes gone, the new
    /// ConfigMap content in `reader`'s file, `arriving` published; meanwhile the Node's
    /// `volumesInUse`, read every 100 ms, must list the migrated volume (mounted throughout).
    /// How long it took, and how many reads of the Node.
    fn converge(&mut self, runtime: &tokio::runtime::Runtime, client: &kube::Client) -> (Duration, usize) {
        let start = Instant::now();
        let mut reads = 0;
        loop {
            self.agent.assert_running();
            let in_use = runtime.block_on(async {
                let node = Api::<Node>::all(client.clone()).get(NODE).await.ok()?;
                Some(node.status.and_then(|s| s.volumes_in_use).unwrap_or_default())
            });
            if let Some(in_use) = in_use {
                reads += 1;
                assert!(
                    in_use.iter().any(|v| v == GCE_PD_IN_USE),
                    "a mounted volume left volumesInUse: {in_use:?}"
                );
            }
            assert!(mounted(&self.migrated, &self.root), "{} was unmounted", self.migrated.display());
            let report = read_status(&self.root).ok();
            let done = report.as_ref().is_some_and(|r| {
                !r.volumes.iter().any(|v| v.pod == "default/leaving")
                    && published(r, "default/arriving", "data")
                    && published(r, "default/migrated", "data")
            }) && !mounted(&self.leaving, &self.root)
                && std::fs::read_to_string(&self.reader_file).is_ok_and(|s| s == "after");
            if done {
                return (start.elapsed(), reads);
            }
            if start.elapsed() > Duration::from_secs(120) {
                let log = std::fs::read_to_string(&self.agent.log).unwrap_or_default();
                let tail: Vec<&str> =
                    log.lines().rev().take(60).collect::<Vec<_>>().into_iter().rev().collect();
                panic!(
                    "never converged; status: {report:#?}\nthe agent's log, last lines:\n{}",
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Every pod deleted; the agent tears everything down.
    fn finish(mut self, runtime: &tokio::runtime::Runtime, client: &kube::Client) {
        let pods = Api::<Pod>::namespaced(client.clone(), "default");
        let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
        runtime.block_on(async {
            for name in ["reader", "arriving", "migrated"] {
                pods.delete(name, &now).await.expect("deleted");
            }
        });
        wait_status(&self.root, &mut self.agent, "tore everything down", |r| r.volumes.is_empty());
        runtime.block_on(wait_in_use(client, GCE_PD_IN_USE, false));
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.agent.log).unwrap_or_default()
    }
}

/// `etcdctl` (Debian's etcd-client) with `args` against `endpoint`; its output.
fn etcdctl(endpoint: &str, args: &[&str]) -> String {
    let out = Command::new("etcdctl")
        .arg(format!("--endpoints={endpoint}"))
        .args(args)
        .env("ETCDCTL_API", "3")
        .output()
        .expect("etcdctl runs");
    assert!(out.status.success(), "etcdctl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Writes `n` revisions (a ConfigMap nobody references, changed `n` times), then compacts
/// etcd's history to its current revision: no watch can resume from before.
async fn compact_history(client: &kube::Client, endpoint: &str, n: usize) -> u64 {
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::{Patch, PatchParams};
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    create(&maps, json!({"metadata": {"name": "churn"}, "data": {"n": "0"}})).await;
    for i in 1..n {
        let change = json!({"data": {"n": i.to_string()}});
        maps.patch("churn", &PatchParams::default(), &Patch::Merge(change)).await.expect("changed");
    }
    let status: serde_json::Value =
        serde_json::from_str(&etcdctl(endpoint, &["endpoint", "status", "-w", "json"])).expect("json");
    let revision = status[0]["Status"]["header"]["revision"].as_u64().expect("a revision");
    etcdctl(endpoint, &["compact", &revision.to_string()]);
    revision
}

/// The API server away (killed, etcd kept) for [`away`] while a pod is deleted, a ConfigMap
/// changed, a pod created and the watch history compacted, through a second API server the
/// agent does not know: kvol keeps the last known pods meanwhile, relists on its return (the
/// resumed watches meet 410 Gone), applies what changed, and the Node's `volumesInUse` never
/// drops the volume mounted throughout.
#[test]
fn the_api_server_away_with_its_history_compacted_keeps_every_volume_and_applies_what_changed_on_return() {
    if Command::new("etcdctl").arg("version").output().is_err() {
        eprintln!("skipped: no etcdctl (apt-get install etcd-client) to compact etcd's history");
        return;
    }
    let Some((runtime, mut server, client)) = private_cluster() else { return };
    let mut outage = outage_node(&runtime, &client, &server.kubeconfig.clone());
    let away = away();

    server.kill_apiserver();
    let gone = Instant::now();
    let other = support::free_port();
    server.start_apiserver_on(other);
    let revision = runtime.block_on(async {
        let meanwhile = server.client_on(other).await;
        change_meanwhile(&meanwhile).await;
        compact_history(&meanwhile, &server.etcd_url, 200).await
    });
    server.kill_apiserver();
    let mut checks = 0;
    while gone.elapsed() < away {
        outage.assert_kept();
        checks += 1;
        std::thread::sleep(Duration::from_millis(500));
    }
    outage.assert_kept();

    server.start_apiserver();
    let client = runtime.block_on(server.client());
    let back = gone.elapsed();
    let (took, reads) = outage.converge(&runtime, &client);
    let log = outage.log();
    // "too old resource version" from the watch cache, "… is too old" from etcd.
    let gone_410 = log
        .lines()
        .filter(|l| l.contains("api watch failed") || l.contains("watch of referenced object"))
        .filter(|l| l.contains("too old"))
        .count();
    eprintln!(
        "api server away {back:?} (asked {away:?}), etcd compacted at revision {revision}; {checks} checks while away kept every volume; \
         converged {took:?} after its return ({reads} reads of the Node, each listing the mounted volume in volumesInUse); \
         {gone_410} watch failures said the resource version was too old (410 Gone)"
    );
    assert!(gone_410 >= 1, "no watch met 410 Gone on return:\n{log}");
    outage.finish(&runtime, &client);
}

/// The API server answering `429 Too Many Requests`, then `500 Internal Server Error`, to
/// every request for a while (a proxy in front of it, every open watch cut at each turn) while
/// a pod is deleted, a ConfigMap changed and a pod created: kvol backs off (the requests it
/// makes meanwhile are counted), keeps its state, and converges once the API server answers.
#[test]
fn the_api_server_answering_429_then_500_for_a_while_is_backed_off_and_converged_after() {
    let Some((runtime, server, client)) = private_cluster() else { return };
    let proxy = runtime.block_on(api_proxy::ApiProxy::start(client.clone()));
    let kubeconfig = server.kubeconfig_at("http", proxy.port);
    let mut outage = outage_node(&runtime, &client, &kubeconfig);
    let half = away() / 2;

    let start = Instant::now();
    proxy.set(api_proxy::Answer::TooManyRequests, true);
    runtime.block_on(change_meanwhile(&client));
    let mut checks = 0;
    for (answer, until) in
        [(api_proxy::Answer::TooManyRequests, half), (api_proxy::Answer::InternalError, 2 * half)]
    {
        proxy.set(answer, true);
        while start.elapsed() < until {
            outage.assert_kept();
            checks += 1;
            std::thread::sleep(Duration::from_millis(500));
        }
    }
    outage.assert_kept();
    let faulty = start.elapsed();
    let refused = proxy.counts().refused;
    proxy.set(api_proxy::Answer::Forward, false);
    let (took, reads) = outage.converge(&runtime, &client);
    let per_second = refused as f64 / faulty.as_secs_f64();
    eprintln!(
        "429 then 500 for {faulty:?}: {refused} requests refused ({per_second:.1}/s), {checks} checks kept every volume; \
         converged {took:?} after ({reads} reads of the Node, each listing the mounted volume in volumesInUse); {} requests forwarded in all",
        proxy.counts().forwarded
    );
    assert!(refused > 0, "the agent asked nothing while refused");
    assert!(per_second < 10.0, "no back-off: {refused} requests refused in {faulty:?}");
    outage.finish(&runtime, &client);
}
