//! Drivers that crash at a test's moment: the bundled one killed by its pid while the agent's supervisor runs it, and the upstream hostpath driver killed and started again by the test (as a DaemonSet's kubelet restarts a container).

#![allow(dead_code)] // not every test that shares this module uses all of it

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_components_runtime::components::ComponentStatus;
use kvol_node::report::status::StatusReport;

use super::{Daemon, Node};

const LIMIT: Duration = Duration::from_secs(60);
/// The upstream driver's name.
pub const UPSTREAM: &str = "hostpath.csi.k8s.io";

/// The driver of a crash loop: killed with -9 at the test's moment, and waited for until it
/// serves again.
pub trait Crashing {
    fn kill(&mut self, node: &Node);
    /// Waits until the driver serves again (starting it, when the test is its supervisor),
    /// calling `look` meanwhile.
    fn back(&mut self, node: &Node, look: &mut dyn FnMut(&StatusReport));
}

/// The bundled driver's component (`hostpath`) in `report`.
pub fn hostpath(report: &StatusReport) -> Option<&ComponentStatus> {
    report.components.iter().find(|c| c.name == "hostpath")
}

/// The bundled driver as the agent's supervised component: the test kills it, the supervisor
/// starts it again.
pub struct Supervised {
    pub killed: Vec<u32>,
}

impl Crashing for Supervised {
    fn kill(&mut self, node: &Node) {
        let report = node.wait(LIMIT, |r| hostpath(r).is_some_and(|c| c.state.pid.is_some())).unwrap();
        let pid = hostpath(&report).unwrap().state.pid.unwrap();
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
            .unwrap();
        self.killed.push(pid);
    }

    fn back(&mut self, node: &Node, look: &mut dyn FnMut(&StatusReport)) {
        let killed = *self.killed.last().unwrap();
        let start = Instant::now();
        loop {
            if let Some(report) = node.status() {
                look(&report);
                let state = hostpath(&report).map(|c| &c.state);
                if state.is_some_and(|s| s.pid.is_some_and(|p| p != killed) && s.healthy == Some(true)) {
                    return;
                }
            }
            assert!(start.elapsed() < LIMIT, "the bundled driver never came back\n{}", node.agent_log());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// The upstream hostpath driver behind node-driver-registrar, killed by the test and started
/// again after a moment, as a DaemonSet's kubelet restarts a container; the registrar runs on.
pub struct Upstream {
    pub binary: PathBuf,
    pub socket: PathBuf,
    pub state: PathBuf,
    pub log: PathBuf,
    pub driver: Option<Daemon>,
    pub rng: fastrand::Rng,
}

impl Upstream {
    /// The upstream driver (`binary`) serving at `<root>/kubelet/plugins/<driver>/csi.sock` with
    /// its state in `<root>/upstream-state`, started, and node-driver-registrar (`registrar`)
    /// registering it for `node`'s agent; `seed` picks the moments it is started again.
    pub fn behind_registrar(node: &Node, binary: PathBuf, registrar: &Path, seed: u64) -> (Upstream, Daemon) {
        let root = &node.root;
        let mut upstream = Upstream {
            binary,
            socket: root.join("kubelet/plugins").join(UPSTREAM).join("csi.sock"),
            state: root.join("upstream-state"),
            log: root.join("hostpathplugin.log"),
            driver: None,
            rng: fastrand::Rng::with_seed(seed.rotate_left(7)),
        };
        upstream.start();
        super::wait_for_path(&upstream.socket, "hostpathplugin", LIMIT);
        let registrar = super::start_registrar(registrar, &upstream.socket, &upstream.socket, node);
        (upstream, registrar)
    }

    /// Whether the driver's own state file lists `target`. Upstream's v1.15 NodePublishVolume
    /// finds a target mounted by a call it died in and answers success without recording it;
    /// its NodeUnpublishVolume then answers success without unmounting: a target left mounted
    /// after its unpublish is the driver's doing when its state does not list it.
    pub fn lists(&self, target: &Path) -> bool {
        let state = std::fs::read_to_string(self.state.join("state.json")).unwrap_or_default();
        state.contains(&*target.to_string_lossy())
    }

    pub fn start(&mut self) {
        self.driver =
            Some(super::start_hostpathplugin(&self.binary, UPSTREAM, &self.socket, &self.state, &self.log));
    }
}

impl Crashing for Upstream {
    fn kill(&mut self, _node: &Node) {
        // Dropped: SIGKILL, then reaped.
        self.driver.take().expect("the driver runs");
    }

    fn back(&mut self, node: &Node, look: &mut dyn FnMut(&StatusReport)) {
        let restart_at = Instant::now() + Duration::from_millis(self.rng.u64(200..1500));
        while Instant::now() < restart_at {
            if let Some(report) = node.status() {
                look(&report);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.start();
        let start = Instant::now();
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(start.elapsed() < LIMIT, "hostpathplugin never served again");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}
