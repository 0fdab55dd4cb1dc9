//! A kvol node and a kubelet v1.26 node side by side in one cluster: the same Deployment run on each, one after the other, each pod timed from created to Ready, with each node agent's CPU and RSS.
//!
//! `cargo bench -p kvol --bench cluster_nodes` (root; `. /work/peers/env.sh` for
//! `KVOL_KUBE_APISERVER`, `KVOL_ETCD`, `KVOL_KUBE_CONTROLLER_MANAGER`, `KVOL_KUBE_SCHEDULER`,
//! `KVOL_KUBELET`, `KVOL_CNI_BIN`; containerd, runc and a static busybox; without any of them
//! the bench says which and stops). One API server and etcd, kube-controller-manager with
//! every controller and kube-scheduler; the kvol node `kvol-node` and the kubelet node
//! `kubelet-node`, each on its own containerd with a CNI bridge network. On each node in turn
//! (kvol's first), a Deployment of `KVOL_BENCH_PODS` (default 50) pods pinned to it by
//! nodeSelector (a configMap, a secret, a downwardAPI and an emptyDir volume, the
//! kube-api-access volume the API server adds, busybox serving on its pod IP, an httpGet
//! readiness probe every second) is created and timed until all its pods are Ready, then
//! deleted and timed until they are all gone. Each pod's created → Ready is timed by a watch
//! (first seen → first seen Ready), and from the API's own times (creationTimestamp → the Ready
//! condition's lastTransitionTime, whole seconds). The agent's CPU is utime + stime from /proc
//! over the run; its RSS read idle and with the pods running. Numbers are printed, never
//! asserted; the goals (p99 ≤ 1/5 of kubelet's, RSS ≤ 1/3) are said met or not.

#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod cluster;
#[path = "../tests/support/control_plane.rs"]
mod control_plane;
#[path = "../tests/support/side_by_side.rs"]
mod side_by_side;
#[path = "../tests/support/mod.rs"]
#[allow(dead_code)]
mod support;

#[path = "cluster_nodes/table.rs"]
mod table;
#[path = "cluster_nodes/timings.rs"]
mod timings;

use std::time::{Duration, Instant};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{DeleteParams, ListParams};
use side_by_side::{KUBELET_NODE, KVOL_NODE, SideBySide};
use support::cluster_node::until;
use support::footprint::{cpu_time, vm_rss_kib};
use table::Run;

/// The bench's count of pods from `KVOL_BENCH_PODS`, or 50.
fn pods_wanted() -> usize {
    std::env::var("KVOL_BENCH_PODS").ok().and_then(|v| v.parse().ok()).unwrap_or(50)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    if let Some(why) = side_by_side::missing_peer() {
        println!("skipped: {why}");
        return;
    }
    support::enter_private_mount_namespace();
    let pods = pods_wanted();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let cluster = SideBySide::start(&runtime);
    runtime.block_on(control_plane::create_app_config(&cluster.client));
    let kvol = runtime.block_on(run(&cluster, KVOL_NODE, pods));
    let kubelet = runtime.block_on(run(&cluster, KUBELET_NODE, pods));
    table::print(&kvol, &kubelet, pods);
}

/// The Deployment `bench-<node>` of `pods` pods on `node`: created, timed until all Ready,
/// deleted, timed until all gone.
async fn run(cluster: &SideBySide, node: &str, pods: usize) -> Run {
    let name = format!("bench-{node}");
    let selector = format!("app={name}");
    let log = cluster.log_of(node);
    let pid = cluster.pid_of(node);
    let pod_api: Api<Pod> = Api::namespaced(cluster.client.clone(), "default");
    let deployments: Api<Deployment> = Api::namespaced(cluster.client.clone(), "default");
    let rss_idle_kib = vm_rss_kib(pid);
    let (timings, watch) = timings::watch(pod_api.clone(), &selector).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let cpu_start = agent_cpu(pid, node);
    let created = Instant::now();
    control_plane::create(&deployments, control_plane::web_deployment(&name, pods, Some(node))).await;
    let what = format!("{pods} pods of {name} Ready on {node}");
    until(&what, Duration::from_secs(600), &log, async || {
        (timings.lock().unwrap().ready_count() >= pods).then_some(())
    })
    .await;
    let all_ready = created.elapsed();
    let cpu_to_ready = agent_cpu(pid, node) - cpu_start;
    let rss_running_kib = vm_rss_kib(pid);
    let listed = pod_api.list(&ListParams::default().labels(&selector)).await.expect("the pods listed");
    let api_latencies = timings::api_latencies(&listed.items);
    watch.abort();
    let latencies = timings.lock().unwrap().latencies();
    println!("{node}: {pods} pods Ready {all_ready:.2?} after the Deployment's creation");

    let deleted = Instant::now();
    deployments.delete(&name, &DeleteParams::background()).await.expect("the deployment deleted");
    let what = format!("every pod of {name} gone from {node}");
    until(&what, Duration::from_secs(600), &log, async || {
        pod_api.list(&ListParams::default().labels(&selector)).await.ok()?.items.is_empty().then_some(())
    })
    .await;
    let all_gone = deleted.elapsed();
    let cpu_whole = agent_cpu(pid, node) - cpu_start;
    println!("{node}: the Deployment deleted → its pods gone in {all_gone:.2?}");
    Run {
        node: node.to_string(),
        latencies,
        api_latencies,
        all_ready,
        all_gone,
        cpu_to_ready,
        cpu_whole,
        rss_idle_kib,
        rss_running_kib,
    }
}

/// The CPU time the agent of `node` has used so far.
fn agent_cpu(pid: u32, node: &str) -> Duration {
    cpu_time(pid).unwrap_or_else(|| panic!("no cpu time for the agent of {node} (pid {pid}): has it exited?"))
}
