//! A kvol node in a real cluster, for the node tests: the API server's kubelet client certificate and its CA, the agent's command as a node (cluster mode, a container runtime, kubelet's API on a free port), waiting on the API, and the Node's Ready condition.

// Compiled into every test binary that has `support`; only the node's tests use it.
#![allow(dead_code)]

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;

/// A child process, killed when dropped.
pub struct Process(pub Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A CA and a client certificate it signed for the API server's calls to the node
/// (`<dir>/ca.crt`, `<dir>/client.crt`, `<dir>/client.key`), made with openssl.
pub fn kubelet_client_pki(dir: &Path) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    std::fs::write(dir.join("client.ext"), "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
        .unwrap();
    run(&[
        "req",
        "-x509",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "1",
        "-subj",
        "/CN=kubelet-client-ca",
    ]);
    run(&[
        "req",
        "-newkey",
        "rsa:2048",
        "-nodes",
        "-keyout",
        "client.key",
        "-out",
        "client.csr",
        "-subj",
        "/CN=kube-apiserver-kubelet-client/O=system:masters",
    ]);
    run(&[
        "x509",
        "-req",
        "-in",
        "client.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "client.crt",
        "-days",
        "1",
        "-extfile",
        "client.ext",
    ]);
}

pub fn agent(node: &str, kubeconfig: &Path, root: &Path, endpoint: &str, log: &Path) -> Command {
    agent_resyncing(node, kubeconfig, root, endpoint, log, 1)
}

/// [`agent`] checking its published volumes every `resync_seconds` (the tests' 1, or the
/// default 10 as a node ships).
pub fn agent_resyncing(
    node: &str,
    kubeconfig: &Path,
    root: &Path,
    endpoint: &str,
    log: &Path,
    resync_seconds: u64,
) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_kvol"));
    command
        .args(["agent", "--no-metrics", "--no-components", "--node-name", node])
        .args(["--resync-seconds", &resync_seconds.to_string()])
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .arg("--root")
        .arg(root)
        .args(["--container-runtime-endpoint", endpoint])
        .args(["--port", &super::kubelet_host::free_port().to_string()])
        // These machines' disks run close to kubelet's default nodefs threshold (10% free):
        // a node under disk pressure is tainted and gets no new pods.
        .args(["--eviction-hard", "memory.available<1Mi,nodefs.available<1%"])
        .arg("--client-ca-file")
        .arg(root.with_file_name("pki").join("ca.crt"))
        .env("KVOL_LOG", "info")
        .env_remove("KVOL_CONFIG")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::OpenOptions::new().create(true).append(true).open(log).unwrap());
    command
}

/// Polls `check` every 100 ms until it answers, for at most `limit`; panics with `what` and the log.
pub async fn until<T>(
    what: &str,
    limit: Duration,
    log: &Path,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    let start = Instant::now();
    loop {
        if let Some(found) = check().await {
            return found;
        }
        assert!(
            start.elapsed() < limit,
            "{what}: not within {limit:?}; the agent's log:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub fn ready_condition(node: &Node) -> Option<(String, Option<String>)> {
    let conditions = node.status.as_ref()?.conditions.as_ref()?;
    conditions.iter().find(|c| c.type_ == "Ready").map(|c| (c.status.clone(), c.reason.clone()))
}
