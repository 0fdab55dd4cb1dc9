//! `kvol lvm-driver`: runs the LVM CSI driver (lvmd.yaml prepared first; an invalid one stops it with every problem listed), or only checks (`--check`) or prepares (`--prepare`) its lvmd.yaml.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use kvol_lvm::config_file::{self, ConfigError, Loaded};
use kvol_lvm::{LvmDriver, LvmDriverConfig, ReloadOutcome};
use kvol_plugin::mount::SystemMounter;
use tokio::signal::unix::{SignalKind, signal};

#[derive(Debug, Clone, clap::Args)]
#[command(group = clap::ArgGroup::new("mode").args(["check", "prepare"]))]
pub struct LvmDriverArgs {
    /// The TopoLVM-compatible lvmd.yaml (`--config` is kvol's own config file, a global flag).
    #[arg(long, default_value = kvol_lvm::DEFAULT_CONFIG_PATH)]
    pub lvmd_config: PathBuf,
    /// Validate the file without touching the node: every problem on its own line, exit 1 if any.
    #[arg(long)]
    pub check: bool,
    /// Make sure the file exists and is valid: a user's file is only validated; when there is none
    /// (or kvol generated it) it is generated from the node's volume groups (`vgs`).
    #[arg(long)]
    pub prepare: bool,
    /// The volume group a generated file uses when the node has several.
    #[arg(long)]
    pub volume_group: Option<String>,
    /// How long one lvm command may take.
    #[arg(long, default_value_t = 60)]
    pub lvm_timeout_seconds: u64,
    /// The CSI driver name (also the tag on the driver's logical volumes).
    #[arg(long, visible_alias = "driver-name", default_value = kvol_lvm::DEFAULT_DRIVER_NAME)]
    pub name: String,
    /// This node's name (NodeGetInfo's node id and topology); defaults to the host name.
    #[arg(long, env = "KVOL_NODE_NAME")]
    pub node_name: Option<String>,
    /// The CSI socket; defaults to /var/lib/kubelet/plugins/<name>/csi.sock.
    #[arg(long, visible_alias = "endpoint")]
    pub csi_socket: Option<PathBuf>,
    /// The kubelet's plugin-registration directory; the driver serves <name>-reg.sock there.
    #[arg(long, default_value = kvol_hostpath::DEFAULT_REGISTRATION_DIR)]
    pub registration_dir: PathBuf,
    /// Serve no registration socket (register the driver some other way).
    #[arg(long, conflicts_with = "registration_dir")]
    pub no_register: bool,
}

/// The driver configuration the arguments describe, on node `node`.
pub fn config(args: &LvmDriverArgs, node: &str) -> LvmDriverConfig {
    let csi_socket = args.csi_socket.clone().unwrap_or_else(|| kvol_hostpath::default_csi_socket(&args.name));
    let csi_socket = match csi_socket.to_str().and_then(|s| s.strip_prefix("unix://")) {
        Some(path) => PathBuf::from(path),
        None => csi_socket,
    };
    LvmDriverConfig {
        driver_name: args.name.clone(),
        node_name: node.to_string(),
        lvmd_config: args.lvmd_config.clone(),
        volume_group: args.volume_group.clone(),
        csi_socket,
        registration_dir: (!args.no_register).then(|| args.registration_dir.clone()),
        lvm_timeout: Duration::from_secs(args.lvm_timeout_seconds),
    }
}

/// Runs the chosen mode (the driver when neither --check nor --prepare is given); problems go
/// to stderr one per line.
pub fn run(args: &LvmDriverArgs, node: &str) -> anyhow::Result<ExitCode> {
    let result = if args.check { config_file::load(&args.lvmd_config) } else { prepare(args)? };
    match result {
        Ok(loaded) if args.check || args.prepare => {
            print_summary(args, &loaded);
            Ok(ExitCode::SUCCESS)
        }
        Ok(loaded) => {
            print_summary(args, &loaded);
            serve(config(args, node), loaded)
        }
        Err(e) => {
            for problem in e.problems() {
                eprintln!("{problem}");
            }
            if !args.check && !args.prepare {
                eprintln!(
                    "kvol: the lvm driver does not start until {} is valid",
                    args.lvmd_config.display()
                );
            }
            Ok(ExitCode::FAILURE)
        }
    }
}

/// Serves the driver until SIGTERM or SIGINT; SIGHUP reloads lvmd.yaml (as a change of the
/// file does).
fn serve(config: LvmDriverConfig, loaded: Loaded) -> anyhow::Result<ExitCode> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async move {
        let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
        let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
        let mut hup = signal(SignalKind::hangup()).context("cannot handle SIGHUP")?;
        let (name, node) = (config.driver_name.clone(), config.node_name.clone());
        let driver = LvmDriver::bind(config, loaded.config, Arc::new(SystemMounter))?;
        eprintln!("kvol: lvm driver {name} on node {node} serving {}", driver.csi_socket().display());
        match driver.registration_socket() {
            Some(socket) => eprintln!("kvol: lvm driver {name} registers through {}", socket.display()),
            None => eprintln!("kvol: lvm driver {name} serves no registration socket"),
        }
        let reloader = driver.reloader();
        tokio::spawn(async move {
            while hup.recv().await.is_some() {
                match reloader.reload().await {
                    ReloadOutcome::Applied => eprintln!("kvol: lvmd.yaml reloaded"),
                    ReloadOutcome::Unchanged => eprintln!("kvol: lvmd.yaml unchanged"),
                    ReloadOutcome::Refused(why) | ReloadOutcome::Invalid(why) => {
                        eprintln!("kvol: lvmd.yaml not reloaded, the running configuration stays:");
                        for line in why {
                            eprintln!("  {line}");
                        }
                    }
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
        eprintln!("kvol: lvm driver {name} stopped; sockets removed");
        Ok(ExitCode::SUCCESS)
    })
}

fn prepare(args: &LvmDriverArgs) -> anyhow::Result<Result<Loaded, ConfigError>> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let timeout = Duration::from_secs(args.lvm_timeout_seconds);
    // A user's file needs no volume groups listed; only ask lvm when kvol may generate.
    let user_file = std::fs::read_to_string(&args.lvmd_config)
        .map(|text| !kvol_lvm::generate::is_generated(&text))
        .unwrap_or(false);
    let vgs =
        if user_file { Vec::new() } else { runtime.block_on(kvol_lvm::command::volume_groups(timeout))? };
    Ok(config_file::ensure(&args.lvmd_config, &vgs, args.volume_group.as_deref()))
}

fn print_summary(args: &LvmDriverArgs, loaded: &Loaded) {
    let origin = if loaded.generated { "generated by kvol" } else { "written by its user" };
    println!("{}: valid ({origin})", args.lvmd_config.display());
    for class in &loaded.config.device_classes {
        let default = if class.default { ", default" } else { "" };
        println!("  device class {}: {}{default}", class.name, class.target());
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::{Cli, Command};

    fn args(argv: &[&str]) -> LvmDriverArgs {
        let cli = Cli::try_parse_from([&["kvol", "lvm-driver"], argv].concat()).unwrap();
        match cli.command {
            Command::LvmDriver(a) => a,
            other => panic!("parsed as {other:?}"),
        }
    }

    #[test]
    fn defaults_follow_the_driver_name() {
        let c = config(&args(&[]), "node-a");
        assert_eq!(c, LvmDriverConfig::new(kvol_lvm::DEFAULT_DRIVER_NAME, "node-a"));
        let c = config(&args(&["--driver-name", "x.example"]), "n");
        assert_eq!(c.csi_socket, PathBuf::from("/var/lib/kubelet/plugins/x.example/csi.sock"));
        assert_eq!(
            c.registration_socket(),
            Some(PathBuf::from("/var/lib/kubelet/plugins_registry/x.example-reg.sock"))
        );
    }

    #[test]
    fn flags_set_every_field() {
        let rows: &[(&[&str], LvmDriverConfig)] = &[
            (
                &[
                    "--name=d.example",
                    "--lvmd-config=/e/l.yaml",
                    "--csi-socket=/c.sock",
                    "--registration-dir=/r",
                    "--lvm-timeout-seconds=5",
                    "--volume-group=vg1",
                ],
                LvmDriverConfig {
                    driver_name: "d.example".into(),
                    node_name: "n".into(),
                    lvmd_config: "/e/l.yaml".into(),
                    volume_group: Some("vg1".into()),
                    csi_socket: "/c.sock".into(),
                    registration_dir: Some("/r".into()),
                    lvm_timeout: Duration::from_secs(5),
                },
            ),
            (
                &["--endpoint=unix:///run/csi.sock", "--no-register"],
                LvmDriverConfig {
                    csi_socket: "/run/csi.sock".into(),
                    registration_dir: None,
                    ..LvmDriverConfig::new(kvol_lvm::DEFAULT_DRIVER_NAME, "n")
                },
            ),
        ];
        for (argv, want) in rows {
            assert_eq!(&config(&args(argv), "n"), want, "{argv:?}");
        }
        let err = Cli::try_parse_from(["kvol", "lvm-driver", "--check", "--prepare"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::ArgumentConflict);
    }

    /// The example CSIDriver and StorageClass name this driver and the parameter it reads.
    #[test]
    fn the_examples_match_the_driver() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/lvm");
        let text = std::fs::read_to_string(format!("{dir}/csidriver.yaml")).unwrap();
        let driver: k8s_openapi::api::storage::v1::CSIDriver = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(driver.metadata.name.as_deref(), Some(kvol_lvm::DEFAULT_DRIVER_NAME));
        assert_eq!(driver.spec.attach_required, Some(false));
        assert_eq!(driver.spec.storage_capacity, Some(true));
        let text = std::fs::read_to_string(format!("{dir}/storageclass.yaml")).unwrap();
        let class: k8s_openapi::api::storage::v1::StorageClass = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(class.provisioner, kvol_lvm::DEFAULT_DRIVER_NAME);
        let parameters = class.parameters.unwrap_or_default();
        assert_eq!(parameters.get(kvol_lvm::DEVICE_CLASS_PARAMETER).map(String::as_str), Some("thin"));
        assert_eq!(class.allow_volume_expansion, Some(true));
    }
}
