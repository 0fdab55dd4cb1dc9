//! `kvol agent --kubeconfig` as the only volume manager of a node, beside the real control plane: kube-controller-manager's attach/detach controller, the upstream csi-provisioner and csi-attacher, the upstream hostpath driver with `--enable-attach` and its node-driver-registrar — a churn of pods with the agent killed at random moments, watched so that no mounted volume is ever missing from the Node's `volumesInUse` and the driver never leaves the CSINode.
//!
//! Needs `KVOL_KUBE_APISERVER`, `KVOL_ETCD`, `KVOL_KUBE_CONTROLLER_MANAGER`, `KVOL_CSI_PROVISIONER`,
//! `KVOL_CSI_ATTACHER`, `KVOL_UPSTREAM_HOSTPATH` and `KVOL_NODE_DRIVER_REGISTRAR`; skipped with
//! the reason when one is unset. `KVOL_CHURN_SEED` and `KVOL_CHURN_ROUNDS` as the churn tests.

#[allow(dead_code)]
#[path = "support/mod.rs"]
mod node_support;
#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass, VolumeAttachment};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use kvol_node::report::status::{Phase, StatusReport, read_status};
use kvol_plugin::{Mounter, SystemMounter};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use serde_json::json;

use node_support::csi_peers::DRIVER;
const NODE: &str = "n1";

/// The peers, or `None` with the reason printed.
fn peers() -> Option<[PathBuf; 5]> {
    let vars = [
        "KVOL_KUBE_CONTROLLER_MANAGER",
        "KVOL_CSI_PROVISIONER",
        "KVOL_CSI_ATTACHER",
        "KVOL_UPSTREAM_HOSTPATH",
        "KVOL_NODE_DRIVER_REGISTRAR",
    ];
    let found: Vec<PathBuf> = vars
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()).map(PathBuf::from))
        .collect();
    match <[PathBuf; 5]>::try_from(found) {
        Ok(paths) => Some(paths),
        Err(_) => {
            eprintln!("skipped: set {} to run the tests beside the real controllers", vars.join(", "));
            None
        }
    }
}

/// A process the test runs, killed when dropped.
struct Process {
    what: String,
    child: Child,
    log: PathBuf,
}

impl Process {
    fn start(what: &str, mut command: Command, log: PathBuf) -> Process {
        let out = std::fs::OpenOptions::new().create(true).append(true).open(&log).unwrap();
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what}: {e}"));
        Process { what: what.to_string(), child, log }
    }

    fn assert_running(&mut self) {
        if let Some(status) = self.child.try_wait().unwrap() {
            let log = std::fs::read_to_string(&self.log).unwrap_or_default();
            let tail: Vec<&str> = log.lines().rev().take(40).collect::<Vec<_>>().into_iter().rev().collect();
            panic!("{} exited ({status}); its log ends:\n{}", self.what, tail.join("\n"));
        }
    }

    fn kill_9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill_9();
    }
}

async fn create<K>(api: &Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("a valid object");
    api.create(&PostParams::default(), &object).await.expect("created")
}

/// What one look at the node saw: the mounts of the driver's volumes, then the Node and
/// CSINode, then the mounts again.
#[derive(Debug, Default)]
struct Watch {
    /// Looks where a volume was mounted in both mount reads and the Node read between them did
    /// not list it in `volumesInUse`.
    unlisted_while_mounted: Vec<String>,
    /// Looks where the CSINode, having listed the driver, did not.
    driver_missing: Vec<String>,
    /// Looks where the Node lacked the controller-managed annotation after kvol first set it.
    unmanaged: Vec<String>,
    looks: usize,
    driver_seen: bool,
    annotation_seen: bool,
    /// Volume handles whose unique names are watched (filled as claims bind).
    handles: Vec<String>,
}

/// The unique names of the driver's volumes mounted under `root` (staging or publish paths,
/// by the handle each path holds in its records), of those in `handles`.
fn mounted_handles(root: &Path, handles: &[String]) -> Vec<String> {
    let mounts = SystemMounter.mounts_under(root).unwrap_or_default();
    let driver_dir = root.join("kubelet/plugins/kubernetes.io/csi").join(DRIVER);
    let pods_dir = root.join("kubelet/pods");
    let mut found = Vec::new();
    for handle in handles {
        let pv_dir_of = |m: &Path| m.parent().map(Path::to_path_buf);
        let names_handle = |dir: &Path| {
            std::fs::read_to_string(dir.join("vol_data.json"))
                .is_ok_and(|t| t.contains(&format!("\"{handle}\"")))
        };
        let mounted = mounts.iter().any(|m| {
            let under_driver = m.target.starts_with(&driver_dir);
            let under_pods = m.target.starts_with(&pods_dir);
            (under_driver || under_pods) && pv_dir_of(&m.target).is_some_and(|d| names_handle(&d))
        });
        if mounted {
            found.push(format!("kubernetes.io/csi/{DRIVER}^{handle}"));
        }
    }
    found
}

/// Looks at the node every 20 ms until `stop`.
async fn watch_node(client: kube::Client, root: PathBuf, watch: Arc<Mutex<Watch>>, stop: Arc<AtomicBool>) {
    let nodes: Api<Node> = Api::all(client.clone());
    let csinodes: Api<CSINode> = Api::all(client);
    while !stop.load(Ordering::Relaxed) {
        let handles = watch.lock().unwrap().handles.clone();
        let before = mounted_handles(&root, &handles);
        let (Ok(node), Ok(csinode)) = (nodes.get(NODE).await, csinodes.get_opt(NODE).await) else {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        };
        let after = mounted_handles(&root, &handles);
        let in_use = node.status.as_ref().and_then(|s| s.volumes_in_use.clone()).unwrap_or_default();
        let annotations = node.metadata.annotations.clone().unwrap_or_default();
        let managed = annotations
            .get("volumes.kubernetes.io/controller-managed-attach-detach")
            .is_some_and(|v| v == "true");
        let has_driver = csinode.is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER));
        look(&mut watch.lock().unwrap(), &before, &after, &in_use, managed, has_driver);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Records one look: a volume mounted in both mount reads and not in `in_use` between them.
fn look(
    w: &mut Watch,
    before: &[String],
    after: &[String],
    in_use: &[String],
    managed: bool,
    has_driver: bool,
) {
    {
        w.looks += 1;
        let at = w.looks;
        for name in before.iter().filter(|n| after.contains(n)) {
            if !in_use.contains(name) {
                w.unlisted_while_mounted.push(format!("look {at}: {name} mounted, volumesInUse {in_use:?}"));
            }
        }
        if w.driver_seen && !has_driver {
            w.driver_missing.push(format!("look {at}"));
        }
        w.driver_seen |= has_driver;
        if w.annotation_seen && !managed {
            w.unmanaged.push(format!("look {at}"));
        }
        w.annotation_seen |= managed;
    }
}

struct Agent {
    process: Option<Process>,
    root: PathBuf,
    kubeconfig: PathBuf,
    log: PathBuf,
    starts: usize,
}

impl Agent {
    fn start(&mut self) {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
        command
            .args(["agent", "--no-metrics", "--resync-seconds", "1", "--node-name", NODE, "--kubeconfig"])
            .arg(&self.kubeconfig)
            .arg("--root")
            .arg(&self.root)
            .env("KVOL_LOG", "info")
            .env_remove("KVOL_CONFIG")
            .env_remove("KVOL_FEATURE_GATES");
        self.process = Some(Process::start("the agent", command, self.log.clone()));
        self.starts += 1;
    }

    fn kill_9(&mut self) {
        if let Some(mut p) = self.process.take() {
            p.kill_9();
        }
    }

    /// Waits (at most 90 s) until the running agent's status satisfies `ok`.
    fn wait(&mut self, what: &str, ok: impl Fn(&StatusReport) -> bool) -> StatusReport {
        let start = Instant::now();
        loop {
            let process = self.process.as_mut().expect("the agent runs");
            process.assert_running();
            if let Ok(report) = read_status(&self.root)
                && report.pid == process.child.id()
                && ok(&report)
            {
                return report;
            }
            if start.elapsed() >= Duration::from_secs(90) {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                let tail: Vec<&str> =
                    log.lines().rev().take(50).collect::<Vec<_>>().into_iter().rev().collect();
                panic!(
                    "never {what}; status: {:#?}\nthe agent's log ends:\n{}",
                    read_status(&self.root),
                    tail.join("\n")
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A small deterministic random source (xorshift), seeded as the churn tests are.
struct Dice(u64);

impl Dice {
    fn roll(&mut self, sides: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % sides
    }
}

#[test]
fn the_controllers_attach_for_a_node_only_kvol_manages_and_no_mounted_volume_leaves_volumes_in_use() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let Some([kcm, provisioner, attacher, hostpath, registrar]) = peers() else { return };
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let seed = std::env::var("KVOL_CHURN_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(20261127u64);
    let rounds = std::env::var("KVOL_CHURN_ROUNDS").ok().and_then(|s| s.parse().ok()).unwrap_or(4usize);
    eprintln!("seed {seed}, {rounds} rounds");
    let mut dice = Dice(seed | 1);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = runtime.block_on(server.client());
    let kubeconfig = server.kubeconfig.clone();
    runtime.block_on(async {
        create(&Api::<Node>::all(client.clone()), json!({"metadata": {"name": NODE}})).await;
        create(
            &Api::<CSIDriver>::all(client.clone()),
            json!({"metadata": {"name": DRIVER}, "spec": {"attachRequired": true, "podInfoOnMount": true}}),
        )
        .await;
        create(
            &Api::<StorageClass>::all(client.clone()),
            json!({"metadata": {"name": "hp"}, "provisioner": DRIVER, "volumeBindingMode": "Immediate"}),
        )
        .await;
    });

    let scratch = kvol_test_support::ScratchRoot::new();
    let top = scratch.path().to_path_buf();
    let root = top.join("node");
    std::fs::create_dir_all(&root).unwrap();
    let log = |name: &str| top.join(format!("{name}.log"));
    let mut csi = node_support::csi_peers::CsiPeers::start(
        &[provisioner, attacher, hostpath, registrar],
        &root.join("kubelet"),
        NODE,
        &kubeconfig,
        &top,
    );
    let kc = format!("--kubeconfig={}", kubeconfig.display());
    let mut controllers = Command::new(&kcm);
    controllers.args([
        &kc,
        "--controllers=attachdetach,persistentvolume-binder,pv-protection,pvc-protection",
        "--leader-elect=false",
        "--use-service-account-credentials=false",
        "--secure-port=0",
    ]);
    let mut kcm_process =
        Process::start("kube-controller-manager", controllers, log("kube-controller-manager"));

    let mut agent = Agent {
        process: None,
        root: root.clone(),
        kubeconfig: kubeconfig.clone(),
        log: log("agent"),
        starts: 0,
    };
    agent.start();
    runtime.block_on(support::wait_for_csinode_driver(&client, NODE, DRIVER));

    let watch = Arc::new(Mutex::new(Watch::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher =
        runtime.spawn(watch_node(client.clone(), root.clone(), Arc::clone(&watch), Arc::clone(&stop)));

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let vas: Api<VolumeAttachment> = Api::all(client.clone());
    let now = DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() };
    let mut kills = 0;
    for round in 0..rounds {
        let (claim, pod) = (format!("claim-{round}"), format!("pod-{round}"));
        let pv_name = runtime.block_on(async {
            create(
                &claims,
                json!({"metadata": {"name": claim}, "spec": {"storageClassName": "hp",
                    "accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Mi"}}}}),
            )
            .await;
            wait_bound(&claims, &claim).await
        });
        let pv = runtime.block_on(Api::<PersistentVolume>::all(client.clone()).get(&pv_name)).unwrap();
        let handle = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone()).unwrap();
        watch.lock().unwrap().handles.push(handle.clone());
        runtime.block_on(async {
            create(
                &pods,
                kvol_test_support::pods::mounting_its_volumes(
                    json!({"metadata": {"name": pod}, "spec": {"nodeName": NODE,
                    "containers": [{"name": "app", "image": "busybox"}],
                    "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]}}),
                ),
            )
            .await;
        });
        // Sometimes the agent dies while the volume is being attached or mounted.
        if dice.roll(2) == 0 {
            std::thread::sleep(Duration::from_millis(dice.roll(3000)));
            agent.kill_9();
            kills += 1;
            std::thread::sleep(Duration::from_millis(dice.roll(1000)));
            agent.start();
        }
        let pod_key = format!("default/{pod}");
        let report = agent.wait("published", |r| {
            r.volumes.iter().any(|v| v.pod == pod_key && v.volume == "data" && v.phase == Phase::Published)
        });
        let v = report.volumes.iter().find(|v| v.pod == pod_key && v.volume == "data").unwrap();
        // kubelet's path: named by the PersistentVolume, not the pod's volume name.
        let expected =
            root.join("kubelet/pods").join(&v.pod_uid).join("volumes/kubernetes.io~csi").join(&pv_name);
        assert_eq!(v.target.as_deref(), Some(expected.as_path()), "{pod_key}: the publish path");
        let publish = expected.join("mount");
        assert!(SystemMounter.is_mount_point(&publish).unwrap(), "{} is not mounted", publish.display());
        std::fs::write(publish.join("round"), round.to_string()).unwrap();
        let va_name = kvol_csi_rules::names::attachment_id(&handle, DRIVER, NODE);
        let va = runtime.block_on(vas.get(&va_name)).expect("the controller's volumeattachment");
        assert!(va.status.is_some_and(|s| s.attached), "{va_name} is attached");

        // Sometimes the agent dies while the volume is published.
        if dice.roll(2) == 0 {
            agent.kill_9();
            kills += 1;
            std::thread::sleep(Duration::from_millis(dice.roll(1500)));
            agent.start();
            agent.wait("published again", |r| {
                r.volumes
                    .iter()
                    .any(|v| v.pod == pod_key && v.volume == "data" && v.phase == Phase::Published)
            });
            assert_eq!(std::fs::read_to_string(publish.join("round")).unwrap(), round.to_string());
        }

        // The pod goes (sometimes while the agent is down, sometimes with a kill mid-teardown).
        let down = dice.roll(3) == 0;
        if down {
            agent.kill_9();
            kills += 1;
        }
        runtime.block_on(async { pods.delete(&pod, &now).await.expect("deleted") });
        if down {
            std::thread::sleep(Duration::from_millis(dice.roll(1000)));
            agent.start();
        } else if dice.roll(2) == 0 {
            std::thread::sleep(Duration::from_millis(dice.roll(300)));
            agent.kill_9();
            kills += 1;
            agent.start();
        }
        agent.wait("torn down", |r| r.volumes.is_empty() && r.node_volumes.is_empty());
        assert!(
            !SystemMounter.is_mount_point(&publish).unwrap_or(false),
            "{} still mounted",
            publish.display()
        );
        // The controller detaches once volumesInUse drops the volume.
        runtime.block_on(wait_gone(&vas, &va_name));
        runtime.block_on(async {
            claims.delete(&claim, &DeleteParams::default()).await.expect("claim deleted")
        });
        kcm_process.assert_running();
        csi.assert_running();
    }
    stop.store(true, Ordering::Relaxed);
    runtime.block_on(watcher).unwrap();
    let w = watch.lock().unwrap();
    eprintln!(
        "{rounds} rounds, {kills} kills of the agent, {} starts, {} looks at the node",
        agent.starts, w.looks
    );
    assert!(w.annotation_seen, "kvol never set controller-managed-attach-detach");
    assert!(
        w.unlisted_while_mounted.is_empty(),
        "mounted but not in volumesInUse: {:#?}",
        w.unlisted_while_mounted
    );
    assert!(w.driver_missing.is_empty(), "the CSINode lost {DRIVER}: {:?}", w.driver_missing);
    assert!(w.unmanaged.is_empty(), "the node lost its controller-managed annotation: {:?}", w.unmanaged);
    assert!(w.looks > 100, "the watch looked only {} times", w.looks);
}

/// Waits (at most 60 s) until the claim is bound; its PV's name.
async fn wait_bound(claims: &Api<PersistentVolumeClaim>, name: &str) -> String {
    let start = Instant::now();
    loop {
        let claim = claims.get(name).await.expect("the claim");
        let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if let Some(pv) = claim.spec.and_then(|s| s.volume_name).filter(|_| bound) {
            return pv;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "claim {name} never bound");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (at most 60 s) until the VolumeAttachment `name` is gone.
async fn wait_gone(vas: &Api<VolumeAttachment>, name: &str) {
    let start = Instant::now();
    while vas.get_opt(name).await.expect("read volumeattachments").is_some() {
        assert!(start.elapsed() < Duration::from_secs(60), "volumeattachment {name} never detached");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
