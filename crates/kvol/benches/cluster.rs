//! Cluster mode end to end: a pod created in a real kube-apiserver → its CSI ephemeral volume published by `kvol agent --kubeconfig`, beside the same publish made straight to the driver; a pod's API-object volumes (the default kube-api-access, two ConfigMaps, a Secret) beside an emptyDir-only pod; a ConfigMap change → the pod's file.
//!
//! `cargo bench -p kvol --bench cluster` as root, with `KVOL_KUBE_APISERVER` and `KVOL_ETCD`
//! naming a kube-apiserver and an etcd (see the README's "Cluster mode"); without them it prints
//! why and does nothing. The agent runs in a private mount namespace it inherits from this
//! process. `KVOL_BENCH_ROUNDS` sets the number of pods (default 20); `KVOL_BENCH_AGENT_LOG` the
//! agent's `KVOL_LOG` and `KVOL_BENCH_AGENT_LOG_FILE` where its log goes.

#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use kvol_csi::proto::csi::node_client::NodeClient;
use kvol_csi::proto::csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
use kvol_csi::proto::csi::{NodePublishVolumeRequest, NodeUnpublishVolumeRequest, VolumeCapability};
use kvol_node::report::status::{Phase, read_status};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;
use serde_json::json;

const DRIVER: &str = "hostpath.csi.kvol.io";
const NODE: &str = "bench-node";

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

async fn create<K>(api: &Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("a valid object");
    api.create(&PostParams::default(), &object).await.expect("created")
}

/// A pod on the bench node with one CSI ephemeral volume of the bundled driver.
fn ephemeral_pod(name: &str) -> serde_json::Value {
    kvol_test_support::pods::mounting_its_volumes(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": NODE,
        "containers": [{"name": "c", "image": "none"}],
        "volumes": [{"name": "data", "csi": {"driver": DRIVER, "volumeAttributes": {"size": "1Mi"}}}]}}),
    )
}

/// Volumes the agent's status file shows published (0 until this agent has written one).
fn published(state: &Path, pid: u32) -> usize {
    match read_status(state) {
        Ok(r) if r.pid == pid => r.volumes.iter().filter(|v| v.phase == Phase::Published).count(),
        _ => 0,
    }
}

async fn wait_published(state: &Path, pid: u32, n: usize, limit: Duration) -> Duration {
    let start = Instant::now();
    while published(state, pid) < n {
        assert!(start.elapsed() < limit, "only {} of {n} published after {limit:?}", published(state, pid));
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    start.elapsed()
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The same publish, straight to the driver's socket: NodePublishVolume of an ephemeral volume.
async fn direct_publishes(socket: &Path, work: &Path, rounds: usize) -> Vec<Duration> {
    let channel = tonic::transport::Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut node = NodeClient::new(channel);
    let capability = VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    };
    let mut out = Vec::new();
    for i in 0..rounds {
        let target = work.join(format!("direct/t{i}"));
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        let volume_id = format!("csi-direct-{i}");
        let context = [("csi.storage.k8s.io/ephemeral", "true"), ("size", "1Mi")];
        let start = Instant::now();
        node.node_publish_volume(NodePublishVolumeRequest {
            volume_id: volume_id.clone(),
            target_path: target.display().to_string(),
            volume_capability: Some(capability.clone()),
            volume_context: context.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ..NodePublishVolumeRequest::default()
        })
        .await
        .unwrap();
        out.push(start.elapsed());
        node.node_unpublish_volume(NodeUnpublishVolumeRequest {
            volume_id,
            target_path: target.display().to_string(),
        })
        .await
        .unwrap();
    }
    out
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let Some((apiserver, etcd)) = support::binaries() else { return };
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (the bench needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let rounds: usize = std::env::var("KVOL_BENCH_ROUNDS").ok().and_then(|v| v.parse().ok()).unwrap_or(20);
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = runtime.block_on(server.client());
    runtime.block_on(support::nodes_and_csi_driver(&client, &[NODE], DRIVER));
    let dir = tempfile::tempdir().unwrap();
    let root: PathBuf = std::fs::canonicalize(dir.path()).unwrap();
    let agent = Agent(
        Command::new(env!("CARGO_BIN_EXE_kvol"))
            .args(["agent", "--no-metrics", "--no-example-flex-drivers", "--node-name", NODE, "--kubeconfig"])
            .arg(&server.kubeconfig)
            .arg("--root")
            .arg(&root)
            .env("KVOL_LOG", std::env::var("KVOL_BENCH_AGENT_LOG").unwrap_or_else(|_| "warn".into()))
            .stdout(Stdio::null())
            .stderr(kvol_test_support::bench_agent_log())
            .spawn()
            .unwrap(),
    );
    let pid = agent.0.id();
    // Ready when the node's CSINode lists the bundled driver: registration went through the API.
    runtime.block_on(support::wait_for_csinode_driver(&client, NODE, DRIVER));
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let through_agent: Vec<Duration> = runtime.block_on(async {
        let mut out = Vec::new();
        for i in 0..rounds {
            let start = Instant::now();
            create(&pods, ephemeral_pod(&format!("p{i}"))).await;
            wait_published(&root, pid, i + 1, Duration::from_secs(60)).await;
            out.push(start.elapsed());
        }
        out
    });
    let socket = root.join("kubelet/plugins").join(DRIVER).join("csi.sock");
    let direct = runtime.block_on(direct_publishes(&socket, &root, rounds));
    let (a, d) = (median(through_agent.clone()), median(direct));
    println!("a pod created in the API → its CSI ephemeral volume published ({rounds} pods, medians)");
    println!(
        "  {:.1} ms through the API and the agent (min {:.1}, max {:.1}); NodePublishVolume straight to the driver {:.1} ms; ratio {:.1}x; goal <= 30 ms, {}",
        ms(a),
        ms(*through_agent.iter().min().unwrap()),
        ms(*through_agent.iter().max().unwrap()),
        ms(d),
        a.as_secs_f64() / d.as_secs_f64().max(1e-9),
        if a <= Duration::from_millis(30) { "met" } else { "NOT MET" }
    );
    pod_object_volumes(&runtime, &client, &root, pid, rounds);
    drop(agent);
    drop(server);
}

/// A pod with every pod's `kube-api-access` projected volume, two ConfigMaps and a Secret.
fn api_objects_pod(name: &str) -> serde_json::Value {
    kvol_test_support::pods::mounting_its_volumes(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": NODE,
        "serviceAccountName": "default", "containers": [{"name": "c", "image": "none"}],
        "volumes": [
            {"name": "kube-api-access-b7x2k", "projected": {"defaultMode": 420, "sources": [
                {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                {"downwardAPI": {"items": [{"path": "namespace", "fieldRef": {"fieldPath": "metadata.namespace"}}]}}]}},
            {"name": "settings", "configMap": {"name": "settings"}},
            {"name": "features", "configMap": {"name": "features"}},
            {"name": "creds", "secret": {"secretName": "creds"}}]}}),
    )
}

/// The same pod's weight in the agent's path with one emptyDir: the baseline.
fn empty_dir_pod(name: &str) -> serde_json::Value {
    kvol_test_support::pods::mounting_its_volumes(
        json!({"metadata": {"name": name, "namespace": "default"}, "spec": {"nodeName": NODE,
        "containers": [{"name": "c", "image": "none"}], "volumes": [{"name": "scratch", "emptyDir": {}}]}}),
    )
}

/// Pod created → its volumes published, for pods of API objects and emptyDir pods (medians),
/// then ConfigMap patched → the pod's file holds the new value.
fn pod_object_volumes(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    root: &Path,
    pid: u32,
    rounds: usize,
) {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, ServiceAccount};
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    runtime.block_on(async {
        create(
            &Api::<ServiceAccount>::namespaced(client.clone(), "default"),
            json!({"metadata": {"name": "default"}}),
        )
        .await;
        create(
            &config_maps,
            json!({"metadata": {"name": "kube-root-ca.crt"}, "data": {"ca.crt": "bundle\n"}}),
        )
        .await;
        create(&config_maps, json!({"metadata": {"name": "settings"}, "data": {"a": "1", "b": "2"}})).await;
        create(&config_maps, json!({"metadata": {"name": "features"}, "data": {"x": "on"}})).await;
        create(
            &Api::<Secret>::namespaced(client.clone(), "default"),
            json!({"metadata": {"name": "creds"}, "stringData": {"p": "s"}}),
        )
        .await;
    });
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let already = published(root, pid);
    let (objects, empties) = runtime.block_on(async {
        let (mut objects, mut empties) = (Vec::new(), Vec::new());
        let mut expected = already;
        for i in 0..rounds {
            let start = Instant::now();
            create(&pods, api_objects_pod(&format!("o{i}"))).await;
            expected += 4;
            wait_published(root, pid, expected, Duration::from_secs(60)).await;
            objects.push(start.elapsed());
            let start = Instant::now();
            create(&pods, empty_dir_pod(&format!("e{i}"))).await;
            expected += 1;
            wait_published(root, pid, expected, Duration::from_secs(60)).await;
            empties.push(start.elapsed());
        }
        (objects, empties)
    });
    let (o, e) = (median(objects.clone()), median(empties.clone()));
    println!(
        "a pod created in the API → its kube-api-access, two ConfigMap and a Secret volumes published ({rounds} pods, medians)"
    );
    println!(
        "  {:.1} ms (min {:.1}, max {:.1}); an emptyDir-only pod {:.1} ms; ratio {:.2}x",
        ms(o),
        ms(*objects.iter().min().unwrap()),
        ms(*objects.iter().max().unwrap()),
        ms(e),
        o.as_secs_f64() / e.as_secs_f64().max(1e-9)
    );
    // One of the pods' ConfigMap files, followed through changes.
    let report = read_status(root).expect("a status");
    let target = report
        .volumes
        .iter()
        .find(|v| v.pod == "default/o0" && v.volume == "settings")
        .and_then(|v| v.target.clone())
        .expect("o0's settings volume");
    let updates: Vec<Duration> = runtime.block_on(async {
        let mut out = Vec::new();
        for i in 0..rounds {
            let value = format!("v{i}");
            let start = Instant::now();
            let patch = json!({"data": {"a": value}});
            config_maps
                .patch("settings", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
                .await
                .unwrap();
            while std::fs::read_to_string(target.join("a")).unwrap_or_default() != value {
                assert!(start.elapsed() < Duration::from_secs(30), "the change never arrived");
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            out.push(start.elapsed());
        }
        out
    });
    let u = median(updates.clone());
    println!(
        "a ConfigMap patched in the API → the file in {rounds} pods' volumes, ({rounds} changes, medians): {:.1} ms (max {:.1}); goal <= 1000 ms, {}",
        ms(u),
        ms(*updates.iter().max().unwrap()),
        if u <= Duration::from_secs(1) { "met" } else { "NOT MET" }
    );
}
