//! The upstream CSI side of a cluster node, for the cluster tests: the hostpath driver (with attach) and its node-driver-registrar under a node's kubelet root, with csi-provisioner and csi-attacher against the API server.
// Compiled into every test binary that has `support`; only the cluster tests use it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{Daemon, wait_for_path};

/// The upstream hostpath driver's name.
pub const DRIVER: &str = "hostpath.csi.k8s.io";

/// `KVOL_CSI_PROVISIONER`, `KVOL_CSI_ATTACHER`, `KVOL_UPSTREAM_HOSTPATH` and
/// `KVOL_NODE_DRIVER_REGISTRAR`, or `None` with the reason printed.
pub fn binaries() -> Option<[PathBuf; 4]> {
    let vars =
        ["KVOL_CSI_PROVISIONER", "KVOL_CSI_ATTACHER", "KVOL_UPSTREAM_HOSTPATH", "KVOL_NODE_DRIVER_REGISTRAR"];
    let found: Vec<PathBuf> = vars
        .iter()
        .filter_map(|v| std::env::var_os(v).filter(|p| !p.is_empty()).map(PathBuf::from))
        .collect();
    let found = <[PathBuf; 4]>::try_from(found).ok();
    if found.is_none() {
        eprintln!("skipped: set {} for the upstream CSI driver and its controllers", vars.join(", "));
    }
    found
}

/// The four processes, killed when dropped.
pub struct CsiPeers {
    pub processes: Vec<Daemon>,
}

impl CsiPeers {
    /// Starts the driver for `node` (its socket under `<kubelet root>/plugins`, registered
    /// through `<kubelet root>/plugins_registry`), then its controllers with `kubeconfig`;
    /// logs and the driver's state under `dir`.
    pub fn start(
        binaries: &[PathBuf; 4],
        kubelet_root: &Path,
        node: &str,
        kubeconfig: &Path,
        dir: &Path,
    ) -> CsiPeers {
        let [provisioner, attacher, hostpath, registrar] = binaries;
        let socket_dir = kubelet_root.join("plugins").join(DRIVER);
        std::fs::create_dir_all(&socket_dir).unwrap();
        std::fs::create_dir_all(kubelet_root.join("plugins_registry")).unwrap();
        let socket = socket_dir.join("csi.sock");
        let log = |name: &str| dir.join(format!("{name}.log"));
        let mut driver = Command::new(hostpath);
        driver
            .arg(format!("--endpoint=unix://{}", socket.display()))
            .args(["--nodeid", node, "--drivername", DRIVER, "--enable-attach", "--statedir"])
            .arg(dir.join("hostpath-state"));
        let driver = Daemon::spawn("hostpathplugin", driver, &log("hostpath"));
        wait_for_path(&socket, "the driver's socket", std::time::Duration::from_secs(30));
        let mut reg = Command::new(registrar);
        reg.arg(format!("--csi-address={}", socket.display()))
            .arg(format!("--kubelet-registration-path={}", socket.display()))
            .arg(format!("--plugin-registration-path={}", kubelet_root.join("plugins_registry").display()));
        let registrar = Daemon::spawn("node-driver-registrar", reg, &log("registrar"));
        let csi_address = format!("--csi-address={}", socket.display());
        let kc = format!("--kubeconfig={}", kubeconfig.display());
        let controller = |binary: &Path, what: &str| {
            let mut command = Command::new(binary);
            command.args([&csi_address, &kc, "--leader-election=false", "--timeout=30s"]);
            Daemon::spawn(what, command, &log(what))
        };
        let processes = vec![
            driver,
            registrar,
            controller(provisioner, "csi-provisioner"),
            controller(attacher, "csi-attacher"),
        ];
        CsiPeers { processes }
    }

    /// Panics naming the one that exited, if one did.
    pub fn assert_running(&mut self) {
        self.processes.iter_mut().for_each(Daemon::assert_running);
    }
}
