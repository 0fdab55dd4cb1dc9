//! One cluster, two nodes side by side: a kvol node and a kubelet v1.26 node beside the whole control plane, each on a containerd of its own with a CNI bridge network (a kubelet kills every pod on its runtime it does not know); for the side-by-side bench and the field-by-field comparison.
//!
//! Included by path beside `support`, `cluster` and `control_plane`:
//! `#[path = "support/side_by_side.rs"] mod side_by_side;`. Needs the calling thread in a
//! private mount namespace (`support::enter_private_mount_namespace`).
// Shared by the tests and benches that include it; not every one uses every item.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;

use crate::control_plane::{self, ControlPlane};
use crate::support::cluster_node::{Process, agent_resyncing, ready_condition, until};
use crate::support::containerd::{Containerd, tools};
use crate::support::kubelet_host::{KubeletSide, kubelet_binary, kubelet_command};

pub const KVOL_NODE: &str = "kvol-node";
pub const KUBELET_NODE: &str = "kubelet-node";

/// The cluster; dropped in this order: the kvol agent, the kubelet (and what it took from the
/// host), both containerds (their pods' tasks and networks), the control plane.
pub struct SideBySide {
    pub kvol: Process,
    pub kvol_log: PathBuf,
    pub kubelet: KubeletSide,
    pub client: kube::Client,
    _kvol_containerd: Containerd,
    _kubelet_containerd: Containerd,
    pub control: ControlPlane,
    _scratch: kvol_test_support::ScratchRoot,
}

/// Why the side-by-side cluster cannot run here (a peer or a tool missing), or `None`.
pub fn missing_peer() -> Option<String> {
    if let Err(why) = tools() {
        return Some(why);
    }
    if let Err(why) = kubelet_binary() {
        return Some(why);
    }
    let unset: Vec<&str> = [
        "KVOL_KUBE_APISERVER",
        "KVOL_ETCD",
        "KVOL_KUBE_CONTROLLER_MANAGER",
        "KVOL_KUBE_SCHEDULER",
        "KVOL_CNI_BIN",
    ]
    .into_iter()
    .filter(|var| std::env::var_os(var).is_none_or(|v| v.is_empty()))
    .collect();
    (!unset.is_empty()).then(|| format!("set {}", unset.join(", ")))
}

impl SideBySide {
    /// The control plane, both containerds and both agents, once both nodes are Ready and
    /// untainted. Call [`missing_peer`] first.
    pub fn start(runtime: &tokio::runtime::Runtime) -> SideBySide {
        let busybox = tools().expect("the runner's tools");
        let binaries = control_plane::binaries().expect("the control plane's binaries");
        let kvol_containerd = Containerd::with_pod_network(&busybox).expect("a pod network");
        let kubelet_containerd = Containerd::with_pod_network(&busybox).expect("a pod network");
        let control = ControlPlane::start(&binaries);
        let client = runtime.block_on(control.server.client());
        let scratch = kvol_test_support::ScratchRoot::new();
        control.give_client_ca(scratch.path());
        let kvol_log = scratch.path().join("agent.log");
        let root = scratch.path().join("node");
        let endpoint = kvol_containerd.endpoint();
        let started = Instant::now();
        // As a node ships: its volumes checked every 10 s (the tests' agent checks every second).
        let kubeconfig = &control.server.kubeconfig;
        let command = agent_resyncing(KVOL_NODE, kubeconfig, &root, &endpoint, &kvol_log, 10).spawn();
        let kvol = Process(command.unwrap_or_else(|e| panic!("cannot start the agent of {KVOL_NODE}: {e}")));
        let kubelet = KubeletSide::start(|dir| {
            let mut command = kubelet_command(
                &kubelet_binary().expect("the kubelet"),
                dir,
                &kubelet_containerd.endpoint(),
                KUBELET_NODE,
            );
            command
                .arg("--kubeconfig")
                .arg(&control.server.kubeconfig)
                .arg("--client-ca-file")
                .arg(control.pki.path().join("ca.crt"))
                // The disk may be fuller than kubelet's default thresholds (imagefs 15 %):
                // no eviction, no DiskPressure, as kvol measures none.
                .arg("--eviction-hard=memory.available<1Mi,nodefs.available<1%,imagefs.available<1%,nodefs.inodesFree<1%");
            command
        })
        .unwrap_or_else(|why| panic!("no kubelet for {KUBELET_NODE}: {why}"));
        let cluster = SideBySide {
            kvol,
            kvol_log,
            kubelet,
            client,
            _kvol_containerd: kvol_containerd,
            _kubelet_containerd: kubelet_containerd,
            control,
            _scratch: scratch,
        };
        runtime.block_on(cluster.ready(KVOL_NODE, &cluster.kvol_log));
        runtime.block_on(cluster.ready(KUBELET_NODE, &cluster.kubelet_log()));
        eprintln!("both nodes Ready and untainted {:.1?} after the agents started", started.elapsed());
        cluster
    }

    /// The kubelet's log file.
    pub fn kubelet_log(&self) -> PathBuf {
        self.kubelet.kubelet.dir.join("kubelet.log")
    }

    /// The log of the agent of `node`.
    pub fn log_of(&self, node: &str) -> PathBuf {
        if node == KVOL_NODE { self.kvol_log.clone() } else { self.kubelet_log() }
    }

    /// The pid of the agent of `node`.
    pub fn pid_of(&self, node: &str) -> u32 {
        if node == KVOL_NODE { self.kvol.0.id() } else { self.kubelet.kubelet.pid() }
    }

    /// Waits (2 min at most) until `node` is Ready and has no taint.
    async fn ready(&self, node: &str, log: &Path) {
        let nodes: Api<Node> = Api::all(self.client.clone());
        let what = format!("node {node} Ready and untainted");
        until(&what, Duration::from_secs(120), log, async || {
            let found = nodes.get_opt(node).await.ok()??;
            let untainted = found.spec.as_ref().is_none_or(|s| s.taints.as_ref().is_none_or(Vec::is_empty));
            (ready_condition(&found)?.0 == "True" && untainted).then_some(())
        })
        .await;
    }
}
