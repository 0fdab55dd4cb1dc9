//! kvol's LVM CSI driver (`lvm.csi.kvol.io`): logical volumes carved from the node's volume groups in the device classes of a TopoLVM-compatible `lvmd.yaml`, served over CSI and registered with the kubelet.
//!
//! lvm is the only record: a volume is a logical volume named by its id (`vol-<hash of the CSI
//! name>`, snapshots `snap-…`) whose tags, set by the same `lvcreate` that makes it, name the
//! driver, the CSI name, the class and the source. A retried or crashed create finds its LV by
//! name; there is no state file to disagree with lvm.
//!
//! - [`lvmd`]: the file's format exactly as TopoLVM's lvmd reads it, and TopoLVM's validation
//!   rules, every problem collected (pure).
//! - [`vgs`], [`lvs`]: the node's volume groups and logical volumes from lvm's JSON reports (pure).
//! - [`generate`]: the file kvol writes when there is none, and how a generated file is told from
//!   a user's (pure).
//! - [`config_file`]: reading the file, or generating it when absent, never replacing a user's.
//! - [`naming`]: ids from CSI names, the tags and their encoding (pure).
//! - [`capacity`]: sizes rounded to extents, what a thick or thin class has left (pure).
//! - [`reload`]: whether a changed file may replace the running one (pure).
//! - [`command`], [`lvm`]: lvm2's tools run with a deadline, killed when it passes, udev-free.
//! - [`filesystem`]: blkid, the never-reformat decision, mkfs and growing filesystems.
//! - [`controller`], [`node`], [`identity`], [`server`]: the CSI services and their serving,
//!   registration, and the reload on file change or SIGHUP.

pub mod capacity;
pub mod command;
pub mod config_file;
pub mod controller;
mod driver;
pub mod filesystem;
pub mod generate;
pub mod identity;
pub mod lvm;
pub mod lvmd;
pub mod lvs;
pub mod naming;
pub mod node;
pub mod reload;
pub mod server;
pub mod vgs;

use std::path::PathBuf;
use std::time::Duration;

pub use driver::{DEVICE_CLASS_PARAMETER, choose_class};
pub use server::{LvmDriver, ReloadOutcome, Reloader};

use kvol_csi::CsiError;

/// The driver's default CSI name.
pub const DEFAULT_DRIVER_NAME: &str = "lvm.csi.kvol.io";
/// Where the driver's `lvmd.yaml` lives by default.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/kvol/lvmd.yaml";

/// How the LVM driver runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LvmDriverConfig {
    /// The CSI driver name (GetPluginInfo, registration, topology key, the LVs' driver tag).
    pub driver_name: String,
    /// This node's name: NodeGetInfo's node id and the topology value.
    pub node_name: String,
    /// The lvmd.yaml the driver reloads.
    pub lvmd_config: PathBuf,
    /// The volume group a generated lvmd.yaml uses (`None`: the node's only one).
    pub volume_group: Option<String>,
    /// The unix socket the CSI services listen on.
    pub csi_socket: PathBuf,
    /// Where the registration socket goes; `None` serves none.
    pub registration_dir: Option<PathBuf>,
    /// How long one lvm (or mkfs, blkid, resize) command may take.
    pub lvm_timeout: Duration,
}

impl LvmDriverConfig {
    /// The defaults for `driver_name` on `node_name`: sockets where the kubelet looks.
    pub fn new(driver_name: &str, node_name: &str) -> LvmDriverConfig {
        LvmDriverConfig {
            driver_name: driver_name.to_string(),
            node_name: node_name.to_string(),
            lvmd_config: PathBuf::from(DEFAULT_CONFIG_PATH),
            volume_group: None,
            csi_socket: kvol_hostpath::default_csi_socket(driver_name),
            registration_dir: Some(PathBuf::from(kvol_hostpath::DEFAULT_REGISTRATION_DIR)),
            lvm_timeout: command::DEFAULT_TIMEOUT,
        }
    }

    /// `<registration dir>/<driver>-reg.sock`, when registration is on.
    pub fn registration_socket(&self) -> Option<PathBuf> {
        self.registration_dir.as_deref().map(|dir| dir.join(format!("{}-reg.sock", self.driver_name)))
    }

    /// `topology.<driver>/node`.
    pub fn topology_key(&self) -> String {
        format!("topology.{}/node", self.driver_name)
    }

    /// Checks what the driver cannot run without.
    pub fn validate(&self) -> Result<(), CsiError> {
        let bad = |reason: String| CsiError::Driver { driver: self.driver_name.clone(), reason };
        if let Some(reason) = kvol_hostpath::driver_name_problem(&self.driver_name) {
            return Err(bad(reason));
        }
        if self.node_name.is_empty() {
            return Err(bad("the node name is empty".into()));
        }
        for (what, path) in [
            ("csi socket", Some(&self.csi_socket)),
            ("registration directory", self.registration_dir.as_ref()),
        ] {
            if let Some(path) = path.filter(|p| !p.is_absolute()) {
                return Err(bad(format!("the {what} {} is not an absolute path", path.display())));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_validation() {
        let c = LvmDriverConfig::new(DEFAULT_DRIVER_NAME, "node-a");
        assert_eq!(c.csi_socket, PathBuf::from("/var/lib/kubelet/plugins/lvm.csi.kvol.io/csi.sock"));
        assert_eq!(
            c.registration_socket(),
            Some(PathBuf::from("/var/lib/kubelet/plugins_registry/lvm.csi.kvol.io-reg.sock"))
        );
        assert_eq!(c.topology_key(), "topology.lvm.csi.kvol.io/node");
        c.validate().unwrap();
        let rows = [
            (LvmDriverConfig { node_name: String::new(), ..c.clone() }, "the node name is empty"),
            (
                LvmDriverConfig { csi_socket: "rel.sock".into(), ..c.clone() },
                "the csi socket rel.sock is not an absolute path",
            ),
            (
                LvmDriverConfig { registration_dir: Some("reg".into()), ..c.clone() },
                "the registration directory reg is not an absolute path",
            ),
            (LvmDriverConfig { driver_name: "a b".into(), ..c.clone() }, "may hold only letters"),
        ];
        for (config, want) in rows {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err} lacks {want}");
        }
    }
}
