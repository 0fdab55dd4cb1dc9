//! The bundled hostpath CSI driver (`hostpath.csi.kvol.io`): volumes are filesystem images on loop devices or directories under a state directory, snapshots copies, served over CSI and registered with the kubelet.
//!
//! One process serves the three CSI services on the CSI socket and, unless told not to, the
//! kubelet plugin-registration service on `<registration dir>/<driver>-reg.sock` (what
//! node-driver-registrar does for other drivers). Layout under the state directory:
//!
//! ```text
//! <state>/state.json            volumes, snapshots, and where each volume is staged and published
//! <state>/volumes/<volume id>   a directory-backed volume's data (volume id = vol-<sha256(name)[..32]>)
//! <state>/volumes/<id>.img      a loop-backed volume's filesystem image
//! <state>/snapshots/<snap id>   a snapshot: a copy of its source volume's directory (or image)
//! <state>/ephemeral/<hash>      a CSI ephemeral inline volume, from publish to unpublish
//! <state>/static/<hash>         a volume taken on at its first stage (`static_volumes`)
//! ```
//!
//! With the directory backing, capacity is recorded, never enforced: there are no quotas, and
//! volume statistics are those of the filesystem holding the state directory. With the loop
//! backing ([`loopfs`]) a filesystem volume is an ext4 or xfs image on a loop device and holds
//! its size and no more. `auto` (what `kvol csi-driver` runs by default) is decided once, at
//! start, by [`backing`]: loop where loop devices can be made, else directories, said why.

pub mod backing;
pub mod block;
pub mod capacity;
pub mod controller;
mod driver;
mod fsutil;
pub mod group;
pub mod identity;
pub mod loopfs;
pub mod node;
pub mod registrar;
pub mod server;
pub mod state;
pub mod usage;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

pub use registrar::RegistrationOutcome;
pub use server::HostpathDriver;

use kvol_csi::CsiError;

/// The driver's default name.
pub const DEFAULT_DRIVER_NAME: &str = "hostpath.csi.kvol.io";
/// Where volumes, snapshots and the state file live by default.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kvol/csi-hostpath";
/// The kubelet's plugin-registration directory.
pub const DEFAULT_REGISTRATION_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// The directory under which a driver's CSI socket conventionally lives.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The volume-context key through which kubelet marks a CSI ephemeral inline volume.
pub const EPHEMERAL_CONTEXT_KEY: &str = "csi.storage.k8s.io/ephemeral";

/// How the hostpath driver runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostpathConfig {
    /// The CSI driver name (GetPluginInfo, registration, topology key).
    pub driver_name: String,
    /// This node's name: NodeGetInfo's node id and the topology value.
    pub node_name: String,
    /// Where volumes, snapshots and the state file live.
    pub state_dir: PathBuf,
    /// The unix socket the CSI services listen on; reported to the kubelet as the endpoint.
    pub csi_socket: PathBuf,
    /// Where the registration socket goes; `None` serves no registration socket.
    pub registration_dir: Option<PathBuf>,
    /// NodeGetInfo's max_volumes_per_node, and the most volumes CreateVolume makes (and
    /// ControllerPublish attaches); 0 means no limit.
    pub max_volumes_per_node: i64,
    /// Serve ControllerPublish/Unpublish (upstream's `--enable-attach`): attachments are
    /// recorded, and NodeStage refuses a volume not attached to this node.
    pub enable_attach: bool,
    /// Serve ControllerModifyVolume (upstream's `--enable-controller-modify-volume`).
    pub enable_controller_modify_volume: bool,
    /// The mutable parameters CreateVolume and ControllerModifyVolume accept
    /// (upstream's `--accepted-mutable-parameter-names`).
    pub accepted_mutable_parameter_names: BTreeSet<String>,
    /// Capacity caps by storage-class `kind` parameter (upstream's `--capacity kind=quantity`);
    /// the kind "" caps volumes created without one. Empty: only the filesystem limits.
    pub capacity: BTreeMap<String, i64>,
    /// Whether a registration failure reported by the kubelet stops the driver (with an error),
    /// as upstream's node-driver-registrar does. Off by default: the failure is logged and the
    /// driver keeps serving, since the kubelet re-registers when the socket is re-created.
    pub exit_on_registration_failure: bool,
    /// Serve persistent volumes the driver did not create (static provisioning: a PV written
    /// by hand, or an in-tree volume migrated to this driver's name): the first NodeStageVolume
    /// of an unknown volume id takes it on as an empty filesystem volume, recorded like any
    /// other from then on. Off by default, when an unknown id is NotFound as the CSI spec asks.
    pub static_volumes: bool,
    /// What backs a new filesystem volume (`--volume-backing`): a directory (this type's
    /// default; sizes are recorded, not enforced), a filesystem image on a loop device
    /// ([`loopfs`]), which holds its size and no more, or `Auto`, which [`HostpathDriver::bind`]
    /// turns into one of the two ([`backing::resolve`]). A volume keeps the backing it was
    /// made with, whatever this says later.
    pub volume_backing: VolumeBacking,
    /// Grow volumes offline only (`--offline-expansion`): the plugin capability says
    /// `OFFLINE`, and ControllerExpandVolume of a volume staged or published on the node is
    /// FailedPrecondition, as a driver that cannot grow a volume in use answers.
    pub offline_expansion: bool,
}

/// What backs a new filesystem volume.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VolumeBacking {
    /// Loop where loop devices can be made here, else directories: decided once, at start
    /// ([`backing::resolve`]); a running driver never has this backing.
    Auto,
    /// A directory under the state directory.
    #[default]
    Directory,
    /// A sparse image file formatted ext4 or xfs, mounted through a loop device ([`loopfs`]).
    Loop,
}

impl VolumeBacking {
    /// The names `--volume-backing` takes.
    pub const NAMES: [&str; 3] = ["auto", "directory", "loop"];

    /// The backing named `name` (`auto`, `directory` or `loop`).
    pub fn parse(name: &str) -> Result<VolumeBacking, String> {
        match name {
            "auto" => Ok(VolumeBacking::Auto),
            "directory" => Ok(VolumeBacking::Directory),
            "loop" => Ok(VolumeBacking::Loop),
            other => Err(format!("volume backing {other:?} is not one of auto, directory, loop")),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            VolumeBacking::Auto => "auto",
            VolumeBacking::Directory => "directory",
            VolumeBacking::Loop => "loop",
        }
    }
}

impl HostpathConfig {
    /// The default configuration for `driver_name` on `node_name`: state in
    /// [`DEFAULT_STATE_DIR`], the CSI socket at `/var/lib/kubelet/plugins/<driver>/csi.sock`,
    /// registration in [`DEFAULT_REGISTRATION_DIR`].
    pub fn new(driver_name: &str, node_name: &str) -> HostpathConfig {
        HostpathConfig {
            driver_name: driver_name.to_string(),
            node_name: node_name.to_string(),
            state_dir: PathBuf::from(DEFAULT_STATE_DIR),
            csi_socket: default_csi_socket(driver_name),
            registration_dir: Some(PathBuf::from(DEFAULT_REGISTRATION_DIR)),
            max_volumes_per_node: 0,
            enable_attach: false,
            enable_controller_modify_volume: false,
            accepted_mutable_parameter_names: BTreeSet::new(),
            capacity: BTreeMap::new(),
            exit_on_registration_failure: false,
            static_volumes: false,
            volume_backing: VolumeBacking::Directory,
            offline_expansion: false,
        }
    }

    /// The registration socket, `<registration dir>/<driver>-reg.sock`, when registration is on.
    pub fn registration_socket(&self) -> Option<PathBuf> {
        self.registration_dir.as_deref().map(|dir| dir.join(format!("{}-reg.sock", self.driver_name)))
    }

    /// The topology key volumes and the node are labelled with: `topology.<driver>/node`.
    pub fn topology_key(&self) -> String {
        format!("topology.{}/node", self.driver_name)
    }

    /// Checks what the driver cannot run without.
    pub fn validate(&self) -> Result<(), CsiError> {
        let bad = |reason: String| CsiError::Driver { driver: self.driver_name.clone(), reason };
        if let Some(reason) = driver_name_problem(&self.driver_name) {
            return Err(bad(reason));
        }
        if self.node_name.is_empty() {
            return Err(bad("the node name is empty".to_string()));
        }
        if self.max_volumes_per_node < 0 {
            return Err(bad(format!("max volumes per node {} is negative", self.max_volumes_per_node)));
        }
        if let Some((kind, bytes)) = self.capacity.iter().find(|(_, b)| **b < 0) {
            return Err(bad(format!("capacity {bytes} of kind {kind:?} is negative")));
        }
        let paths = [
            ("state directory", Some(&self.state_dir)),
            ("csi socket", Some(&self.csi_socket)),
            ("registration directory", self.registration_dir.as_ref()),
        ];
        for (what, path) in paths {
            if let Some(path) = path
                && !path.is_absolute()
            {
                return Err(bad(format!("the {what} {} is not an absolute path", path.display())));
            }
        }
        Ok(())
    }
}

/// `/var/lib/kubelet/plugins/<driver>/csi.sock`.
pub fn default_csi_socket(driver_name: &str) -> PathBuf {
    Path::new(DEFAULT_PLUGINS_DIR).join(driver_name).join("csi.sock")
}

/// Why `name` is not a valid CSI driver name, if it is not: the CSI spec asks for at most 63
/// characters, starting and ending with an alphanumeric, with `-`, `_` and `.` between.
pub fn driver_name_problem(name: &str) -> Option<String> {
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if name.is_empty() {
        Some("the driver name is empty".to_string())
    } else if name.len() > 63 {
        Some(format!("driver name {name:?} is longer than 63 characters"))
    } else if !name.starts_with(alnum) || !name.ends_with(alnum) {
        Some(format!("driver name {name:?} must start and end with a letter or digit"))
    } else if !name.chars().all(|c| alnum(c) || matches!(c, '-' | '_' | '.')) {
        Some(format!("driver name {name:?} may hold only letters, digits, '-', '_' and '.'"))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn driver_names_follow_the_csi_rules() {
        let long = "a".repeat(64);
        let cases: &[(&str, Option<&str>)] = &[
            ("hostpath.csi.kvol.io", None),
            ("a", None),
            ("a_b-c.d9", None),
            ("", Some("the driver name is empty")),
            (&long, Some("longer than 63 characters")),
            ("-hostpath", Some("must start and end with a letter or digit")),
            ("hostpath.", Some("must start and end with a letter or digit")),
            ("host/path", Some("may hold only letters")),
            ("host path", Some("may hold only letters")),
        ];
        for (name, want) in cases {
            let got = driver_name_problem(name);
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) if g.contains(w) => {}
                _ => panic!("{name:?}: want {want:?}, got {got:?}"),
            }
        }
        assert_eq!(driver_name_problem(&"a".repeat(63)), None);
    }

    #[test]
    fn volume_backings_are_named() {
        for name in VolumeBacking::NAMES {
            assert_eq!(VolumeBacking::parse(name).unwrap().name(), name);
        }
        assert_eq!(VolumeBacking::default(), VolumeBacking::Directory);
        let err = VolumeBacking::parse("Loop").unwrap_err();
        assert_eq!(err, "volume backing \"Loop\" is not one of auto, directory, loop");
    }

    #[test]
    fn defaults_derive_sockets_and_topology_from_the_driver_name() {
        let c = HostpathConfig::new("hostpath.csi.kvol.io", "node-a");
        assert_eq!(c.csi_socket, Path::new("/var/lib/kubelet/plugins/hostpath.csi.kvol.io/csi.sock"));
        assert_eq!(
            c.registration_socket().unwrap(),
            Path::new("/var/lib/kubelet/plugins_registry/hostpath.csi.kvol.io-reg.sock")
        );
        assert_eq!(c.topology_key(), "topology.hostpath.csi.kvol.io/node");
        assert_eq!(c.state_dir, Path::new(DEFAULT_STATE_DIR));
        c.validate().unwrap();
        let c = HostpathConfig { registration_dir: None, ..c };
        assert_eq!(c.registration_socket(), None);
    }

    #[test]
    fn invalid_configurations_are_named() {
        let ok = HostpathConfig::new("d.example", "n");
        let cases = [
            (HostpathConfig { node_name: String::new(), ..ok.clone() }, "the node name is empty"),
            (
                HostpathConfig { max_volumes_per_node: -1, ..ok.clone() },
                "max volumes per node -1 is negative",
            ),
            (
                HostpathConfig { state_dir: "rel/state".into(), ..ok.clone() },
                "the state directory rel/state is not an absolute path",
            ),
            (
                HostpathConfig { registration_dir: Some("reg".into()), ..ok.clone() },
                "the registration directory reg is not an absolute path",
            ),
            (HostpathConfig { driver_name: "x y".into(), ..ok.clone() }, "may hold only letters"),
        ];
        for (config, want) in cases {
            let err = config.validate().unwrap_err().to_string();
            assert!(err.contains(want), "{err} does not contain {want}");
        }
    }
}
