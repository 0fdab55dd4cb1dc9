//! `kvol csi-driver`: runs the bundled hostpath CSI driver, and its registrar, on this node until SIGTERM or SIGINT.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use kvol_hostpath::{
    DEFAULT_DRIVER_NAME, DEFAULT_REGISTRATION_DIR, DEFAULT_STATE_DIR, HostpathConfig, HostpathDriver,
    VolumeBacking, default_csi_socket,
};
use kvol_plugin::mount::SystemMounter;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Clone, clap::Args)]
pub struct CsiDriverArgs {
    /// The CSI driver name.
    #[arg(long, default_value = DEFAULT_DRIVER_NAME)]
    pub name: String,
    /// This node's name (NodeGetInfo's node id and topology); defaults to the host name.
    #[arg(long, env = "KVOL_NODE_NAME")]
    pub node_name: Option<String>,
    /// Where volumes, snapshots and the state file live.
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The CSI socket; defaults to /var/lib/kubelet/plugins/<name>/csi.sock.
    #[arg(long)]
    pub csi_socket: Option<PathBuf>,
    /// The kubelet's plugin-registration directory; the driver serves <name>-reg.sock there.
    #[arg(long, default_value = DEFAULT_REGISTRATION_DIR)]
    pub registration_dir: PathBuf,
    /// Serve no registration socket (register the driver some other way).
    #[arg(long, conflicts_with = "registration_dir")]
    pub no_register: bool,
    /// The most volumes this node holds: NodeGetInfo's max_volumes_per_node, and CreateVolume
    /// (and ControllerPublish) refuse more; 0 means no limit.
    #[arg(long, visible_alias = "maxvolumespernode", default_value_t = 0)]
    pub max_volumes_per_node: i64,
    /// Serve ControllerPublish/Unpublish: attachments are recorded, and NodeStageVolume
    /// refuses a volume not attached to this node.
    #[arg(long)]
    pub enable_attach: bool,
    /// Serve ControllerModifyVolume for the parameters named by
    /// --accepted-mutable-parameter-names.
    #[arg(long)]
    pub enable_controller_modify_volume: bool,
    /// The mutable parameters CreateVolume and ControllerModifyVolume accept (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub accepted_mutable_parameter_names: Vec<String>,
    /// A capacity cap, <kind>=<quantity> (e.g. slow=10Gi) for volumes whose storage class has
    /// the parameter kind=<kind>, or a bare <quantity> for volumes without one; repeatable.
    /// Without it GetCapacity reports the state directory's free space.
    #[arg(long, value_parser = parse_capacity_arg)]
    pub capacity: Vec<(String, i64)>,
    /// Exit (with status 1) when the kubelet reports a failed registration, as
    /// node-driver-registrar does; by default the failure is printed and the driver keeps serving.
    #[arg(long)]
    pub exit_on_registration_failure: bool,
    /// Serve persistent volumes this driver did not create (a PV written by hand, or an in-tree
    /// volume migrated to this driver's name): an unknown volume id is taken on at its first
    /// NodeStageVolume as an empty directory. Without it an unknown id is NotFound.
    #[arg(long)]
    pub static_volumes: bool,
    /// What backs a new filesystem volume: `loop` (a sparse image file formatted ext4, or xfs
    /// when the fstype asks for it, mounted through a loop device: a volume holds its size and
    /// no more), `directory` (sizes are recorded, not enforced), or `auto`: loop where loop
    /// devices can be made here (/dev/loop-control opens, losetup finds a free device,
    /// mkfs.ext4 is installed), else directory; the choice and why are said at start. A
    /// volume keeps the backing it was made with. The agent's bundled driver takes it from
    /// the agent's environment (KVOL_VOLUME_BACKING).
    #[arg(long, env = "KVOL_VOLUME_BACKING", default_value = "auto", value_parser = parse_volume_backing)]
    pub volume_backing: VolumeBacking,
    /// Grow volumes offline only: the plugin capability says OFFLINE, and ControllerExpandVolume
    /// of a volume in use on the node fails (FailedPrecondition); online by default.
    #[arg(long)]
    pub offline_expansion: bool,
}

fn parse_volume_backing(value: &str) -> Result<VolumeBacking, String> {
    VolumeBacking::parse(value)
}

fn parse_capacity_arg(value: &str) -> Result<(String, i64), String> {
    kvol_hostpath::capacity::parse_capacity(value)
}

/// The driver configuration the arguments describe, on node `node`.
pub fn config(args: &CsiDriverArgs, node: &str) -> HostpathConfig {
    HostpathConfig {
        driver_name: args.name.clone(),
        node_name: node.to_string(),
        state_dir: args.state_dir.clone(),
        csi_socket: args.csi_socket.clone().unwrap_or_else(|| default_csi_socket(&args.name)),
        registration_dir: (!args.no_register).then(|| args.registration_dir.clone()),
        max_volumes_per_node: args.max_volumes_per_node,
        enable_attach: args.enable_attach,
        enable_controller_modify_volume: args.enable_controller_modify_volume,
        accepted_mutable_parameter_names: args.accepted_mutable_parameter_names.iter().cloned().collect(),
        capacity: args.capacity.iter().cloned().collect(),
        exit_on_registration_failure: args.exit_on_registration_failure,
        static_volumes: args.static_volumes,
        volume_backing: args.volume_backing,
        offline_expansion: args.offline_expansion,
    }
}

/// Runs the driver until SIGTERM or SIGINT, then removes its sockets and returns success.
pub fn run(args: &CsiDriverArgs, node: &str) -> anyhow::Result<ExitCode> {
    let config = config(args, node);
    let name = config.driver_name.clone();
    // One thread: the driver's calls take one lock and do their disk work inline, so more
    // workers would only contend with the agent for a small node's cores (the agent bench's
    // 50 pods: 1.29–1.61x the direct calls with one thread, 1.60–1.90x with a worker per core).
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        // Handlers first: a signal from now on stops the driver cleanly.
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let driver = HostpathDriver::bind(config, Arc::new(SystemMounter))?;
        eprintln!(
            "kvol: csi driver {name} on node {node} serving {} (state in {})",
            driver.csi_socket().display(),
            driver.config().state_dir.display()
        );
        eprintln!("kvol: csi driver {name}: {}", driver.backing().line());
        match driver.registration_socket() {
            Some(socket) => eprintln!("kvol: csi driver {name} registers through {}", socket.display()),
            None => eprintln!("kvol: csi driver {name} serves no registration socket"),
        }
        let mut outcomes = driver.registration_outcomes();
        let reporter = name.clone();
        tokio::spawn(async move {
            while outcomes.changed().await.is_ok() {
                let outcome = outcomes.borrow_and_update().clone();
                match outcome {
                    Some(o) if o.registered => {
                        eprintln!("kvol: the kubelet registered csi driver {reporter}")
                    }
                    Some(o) => {
                        eprintln!("kvol: the kubelet did not register csi driver {reporter}: {}", o.error)
                    }
                    None => {}
                }
            }
        });
        let stop = async move {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        };
        driver.run(stop).await?;
        eprintln!("kvol: csi driver {name} stopped; sockets removed");
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn args(argv: &[&str]) -> CsiDriverArgs {
        let cli = Cli::try_parse_from([&["kvol", "csi-driver"], argv].concat()).unwrap();
        match cli.command {
            Command::CsiDriver(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_driver_name() {
        let c = config(&args(&[]), "node-a");
        let auto = HostpathConfig {
            volume_backing: VolumeBacking::Auto,
            ..HostpathConfig::new(DEFAULT_DRIVER_NAME, "node-a")
        };
        assert_eq!(c, auto);
        let c = config(&args(&["--name", "x.example"]), "n");
        assert_eq!(c.csi_socket, PathBuf::from("/var/lib/kubelet/plugins/x.example/csi.sock"));
        assert_eq!(
            c.registration_socket(),
            Some(PathBuf::from("/var/lib/kubelet/plugins_registry/x.example-reg.sock"))
        );
    }

    #[test]
    fn flags_set_every_field() {
        let a = args(&[
            "--name=d.example",
            "--state-dir=/s",
            "--csi-socket=/c.sock",
            "--registration-dir=/r",
            "--max-volumes-per-node=3",
            "--enable-attach",
            "--enable-controller-modify-volume",
            "--accepted-mutable-parameter-names=iops,throughput",
            "--capacity=slow=10Gi",
            "--capacity",
            "4096",
            "--exit-on-registration-failure",
            "--static-volumes",
            "--volume-backing",
            "loop",
            "--offline-expansion",
        ]);
        let c = config(&a, "n");
        assert_eq!(
            c,
            HostpathConfig {
                driver_name: "d.example".into(),
                node_name: "n".into(),
                state_dir: "/s".into(),
                csi_socket: "/c.sock".into(),
                registration_dir: Some("/r".into()),
                max_volumes_per_node: 3,
                enable_attach: true,
                enable_controller_modify_volume: true,
                accepted_mutable_parameter_names: ["iops".to_string(), "throughput".to_string()].into(),
                capacity: [("slow".to_string(), 10 << 30), (String::new(), 4096)].into(),
                exit_on_registration_failure: true,
                static_volumes: true,
                volume_backing: VolumeBacking::Loop,
                offline_expansion: true,
            }
        );
        assert_eq!(config(&args(&[]), "n").volume_backing, VolumeBacking::Auto);
        assert_eq!(
            config(&args(&["--volume-backing=directory"]), "n").volume_backing,
            VolumeBacking::Directory
        );
        let err =
            Cli::try_parse_from(["kvol", "csi-driver", "--volume-backing=zfs"]).unwrap_err().to_string();
        assert!(err.contains("volume backing \"zfs\" is not one of auto, directory, loop"), "{err}");
        // Upstream's spelling of the volume limit works too.
        assert_eq!(config(&args(&["--maxvolumespernode=2"]), "n").max_volumes_per_node, 2);
        let err =
            Cli::try_parse_from(["kvol", "csi-driver", "--capacity=slow=1.5Gi"]).unwrap_err().to_string();
        assert!(err.contains("capacity \"slow=1.5Gi\""), "{err}");
        assert_eq!(config(&args(&["--no-register"]), "n").registration_dir, None);
    }

    #[test]
    fn no_register_and_a_registration_dir_conflict() {
        let err = Cli::try_parse_from(["kvol", "csi-driver", "--no-register", "--registration-dir", "/r"])
            .unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }
    /// The example CSIDriver object names this driver and asks for what it does: no attach,
    /// pod info (which carries the ephemeral marker), persistent and ephemeral volumes.
    #[test]
    fn the_example_csidriver_matches_the_driver() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/csi/hostpath-csidriver.yaml");
        let text = std::fs::read_to_string(path).unwrap();
        let driver: k8s_openapi::api::storage::v1::CSIDriver = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(driver.metadata.name.as_deref(), Some(DEFAULT_DRIVER_NAME));
        assert_eq!(driver.spec.attach_required, Some(false));
        assert_eq!(driver.spec.pod_info_on_mount, Some(true));
        let modes = driver.spec.volume_lifecycle_modes.unwrap_or_default();
        assert_eq!(modes, ["Persistent", "Ephemeral"]);
    }
}
