//! The kvol command line: argument parsing and the commands, over the kvol libraries.

pub mod agent_cmd;
pub mod components_cluster_cmd;
pub mod components_cmd;
pub mod components_common;
pub mod components_node_cmd;
pub mod csi_driver_cmd;
pub mod documents;
pub mod embedded_runtime;
pub mod flex_cmd;
pub mod gates_cmd;
pub mod lvm_driver_cmd;
pub mod migrate_cmd;
pub mod node_facts;
pub mod plugins_cmd;
pub mod pod_cmd;
pub mod pod_exec_cmd;
pub mod pod_logs_cmd;
pub mod runner_cmd;
pub mod status_cmd;
pub mod test_driver_cmd;
pub mod translate_cmd;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::{Context, bail};
use clap::{Parser, Subcommand};
use kvol_api::KvolConfig;

use crate::documents::Format;
use crate::translate_cmd::Direction;

/// kvol: the storage half of a kubelet.
#[derive(Debug, Parser)]
#[command(name = "kvol", version, about)]
pub struct Cli {
    /// Configuration file (YAML); its featureGates are applied before --feature-gates.
    #[arg(long, global = true, env = "KVOL_CONFIG")]
    pub config: Option<PathBuf>,
    /// Feature gates, e.g. CSIMigrationRBD=true,InTreePluginRBDUnregister=true. Validated at start.
    #[arg(long, global = true, env = "KVOL_FEATURE_GATES", value_name = "A=true,B=false")]
    pub feature_gates: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Translate in-tree volume specs (PersistentVolume, StorageClass, Pod inline volumes) to CSI, or back.
    Translate(TranslateArgs),
    /// Show the feature gates in effect and what they decide for each migratable plugin.
    Gates(GatesArgs),
    /// List the volume plugins this node would have: kind, capabilities and CSI migration state.
    Plugins(PluginsArgs),
    /// Flexvolume drivers.
    #[command(subcommand)]
    Flex(FlexCommand),
    /// Run the bundled hostpath CSI driver and its registrar until SIGTERM or SIGINT.
    CsiDriver(csi_driver_cmd::CsiDriverArgs),
    /// Run the LVM CSI driver (lvm.csi.kvol.io) and its registrar until SIGTERM or SIGINT; or,
    /// for its TopoLVM-compatible lvmd.yaml, --check validates a file and --prepare generates
    /// it from the node's volume groups unless the user wrote it.
    LvmDriver(lvm_driver_cmd::LvmDriverArgs),
    /// Run the node agent: pods in the manifests directory get their volumes attached, staged
    /// and published; state survives a crash. SIGTERM stops it without unmounting anything.
    Agent(Box<agent_cmd::AgentArgs>),
    /// Show what the node agent last reported: its volumes, their phases and last errors.
    Status(status_cmd::StatusArgs),
    /// Storage components (CSI drivers and optional pieces such as snapshots): what kvol
    /// knows and what the config's `storage` section decides for this node.
    #[command(subcommand)]
    Components(components_cmd::ComponentsCommand),
    /// CSI migration of in-tree volumes: `check` says what would migrate and what blocks it.
    #[command(subcommand)]
    Migrate(migrate_cmd::MigrateCommand),
    /// The runtime API from a shell: wait for a pod's volumes, a container's mounts (CRI or
    /// OCI), hand a pod over and take it back, watch.
    #[command(subcommand)]
    Pod(pod_cmd::PodCommand),
    /// Run the node half of Kubernetes' external storage e2e suites against a CSI driver, from
    /// the driver's test-driver YAML: provisioning, volumes, volumeIO, subPath, multiVolume,
    /// expansion, ephemeral and a driver restart, each named after its upstream test.
    TestDriver(test_driver_cmd::TestDriverArgs),
}

#[derive(Debug, Subcommand)]
pub enum FlexCommand {
    /// Install a driver file atomically as <dir>/<vendor~driver>/<driver> (copy to a dot file,
    /// fsync, rename); prints installed, updated or unchanged.
    Install(FlexInstallArgs),
}

#[derive(Debug, clap::Args)]
pub struct FlexInstallArgs {
    /// The driver executable to install.
    pub driver_file: PathBuf,
    /// The driver directory name, vendor~driver (or driver).
    #[arg(long)]
    pub name: String,
    /// The Flexvolume plugin directory (kubelet's and `kvol agent`'s `--volume-plugin-dir`).
    #[arg(long, visible_alias = "volume-plugin-dir", default_value = kvol_flex::install::DEFAULT_PLUGIN_DIR)]
    pub dir: PathBuf,
}

impl Command {
    /// Whether the command runs until stopped (a server), rather than answering once.
    pub fn is_long_running(&self) -> bool {
        matches!(self, Command::CsiDriver(_) | Command::Agent(_))
    }
}

#[derive(Debug, clap::Args)]
pub struct TranslateArgs {
    /// Files or directories (their *.yaml, *.yml, *.json files, in name order) to read; `-` or
    /// nothing reads standard input.
    pub inputs: Vec<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "yaml")]
    pub output: Format,
    /// Translate CSI PersistentVolumes of migrated drivers back to their in-tree form.
    #[arg(long)]
    pub to_in_tree: bool,
    /// Namespace for Pods that do not name one (it must agree with those that do).
    #[arg(short = 'n', long)]
    pub namespace: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct GatesArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: gates_cmd::GatesFormat,
}

#[derive(Debug, clap::Args)]
pub struct PluginsArgs {
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: plugins_cmd::PluginsFormat,
    /// Kubelet's root directory (`kvol agent --root-dir`; pod volumes live below it).
    #[arg(long, default_value = kvol_plugin::host::DEFAULT_ROOT_DIR)]
    pub root_dir: PathBuf,
    /// The node's name (its `kubernetes.io/hostname` label); defaults to the host name.
    #[arg(long, env = "KVOL_NODE_NAME")]
    pub node_name: Option<String>,
    /// The Flexvolume plugin directory (`kvol agent --volume-plugin-dir`); each driver in it is
    /// checked and its `init` run.
    #[arg(long, visible_alias = "flex-dir", default_value = kvol_flex::install::DEFAULT_PLUGIN_DIR)]
    pub volume_plugin_dir: PathBuf,
    /// The plugin-registration directory; each CSI driver registered there is asked who it is.
    /// Defaults to `<root-dir>/plugins_registry`.
    #[arg(long)]
    pub registration_dir: Option<PathBuf>,
    /// Files or directories with CSIDriver objects whose settings apply to the CSI drivers found.
    #[arg(long = "manifests", value_name = "PATH")]
    pub manifests: Vec<PathBuf>,
}

/// This machine's host name, the default node name as kubelet uses it.
pub fn host_name() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_lowercase())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_string())
}

/// Reads and parses the configuration file (`--config`); none given is the default config.
/// Every command starts here, and with the feature gates it validates.
pub fn load_config(cli: &Cli) -> anyhow::Result<KvolConfig> {
    Ok(match &cli.config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("cannot read config file {}", path.display()))?;
            serde_saphyr::from_str::<KvolConfig>(&text)
                .map_err(|e| anyhow::anyhow!("invalid config file {}: {e}", path.display()))?
        }
        None => KvolConfig::default(),
    })
}

/// An error and its causes on one line, `a: b: c`, leaving out a cause whose text the line
/// already ends with (library errors often print their cause and also expose it as `source`).
pub fn render_error(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if line.ends_with(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

/// Runs the command line; returns the process exit code (0 ok, 1 failed, 2 bad usage or config).
pub fn run(cli: Cli) -> ExitCode {
    let loaded = load_config(&cli).and_then(|config| {
        let gates = config.feature_gates(cli.feature_gates.as_deref())?;
        Ok((config, gates))
    });
    let (config, gates) = match loaded {
        Ok(loaded) => loaded,
        Err(e) => {
            eprintln!("kvol: {}", render_error(&e));
            return ExitCode::from(2);
        }
    };
    let result = match &cli.command {
        Command::Translate(args) => run_translate(args),
        Command::Gates(args) => gates_cmd::run(&gates, args.output),
        Command::Plugins(args) => {
            let node = args.node_name.clone().unwrap_or_else(host_name);
            let registration_dir = args
                .registration_dir
                .clone()
                .unwrap_or_else(|| kvol_plugin::NodePaths::new(&args.root_dir).registration_dir());
            let sources = plugins_cmd::Sources {
                flex_dir: &args.volume_plugin_dir,
                registration_dir: &registration_dir,
                manifests: &args.manifests,
            };
            plugins_cmd::run(&gates, args.output, args.root_dir.clone(), &node, &sources)
        }
        Command::Flex(FlexCommand::Install(args)) => {
            flex_cmd::run_install(&args.driver_file, &args.name, &args.dir)
        }
        Command::Agent(args) => {
            let node = args.node_name.clone().unwrap_or_else(host_name);
            agent_cmd::run(&gates, &config.storage, cli.config.as_deref(), args, node)
        }
        Command::CsiDriver(args) => {
            let node = args.node_name.clone().unwrap_or_else(host_name);
            csi_driver_cmd::run(args, &node)
        }
        Command::LvmDriver(args) => {
            let node = args.node_name.clone().unwrap_or_else(host_name);
            lvm_driver_cmd::run(args, &node)
        }
        Command::Status(args) => status_cmd::run(args),
        Command::Pod(command) => pod_cmd::run(command),
        Command::Components(components_cmd::ComponentsCommand::List(args)) => components_cmd::run_list(args),
        Command::Components(components_cmd::ComponentsCommand::Plan(args)) => {
            components_cmd::run_plan(args, &config.storage)
        }
        Command::Components(components_cmd::ComponentsCommand::Status(args)) => match &args.kubeconfig {
            Some(kubeconfig) => components_cluster_cmd::run_status(args, kubeconfig, &config.storage),
            None => components_node_cmd::run_status(args, &config.storage),
        },
        Command::Components(components_cmd::ComponentsCommand::Uninstall(args)) => match &args.kubeconfig {
            Some(kubeconfig) => components_cluster_cmd::run_uninstall(args, kubeconfig, &config.storage),
            None => components_node_cmd::run_uninstall(args, &config.storage),
        },
        Command::Components(components_cmd::ComponentsCommand::Apply(args)) => {
            components_cluster_cmd::run_apply(args, &config.storage)
        }
        Command::Migrate(command) => migrate_cmd::run(&gates, command),
        Command::TestDriver(args) => test_driver_cmd::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kvol: {}", render_error(&e));
            ExitCode::FAILURE
        }
    }
}

/// The input files of `translate`, directories expanded.
pub(crate) fn input_files(inputs: &[PathBuf]) -> anyhow::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    for input in inputs {
        if input.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(input)
                .with_context(|| format!("cannot read directory {}", input.display()))?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    p.is_file()
                        && matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json"))
                })
                .collect();
            found.sort();
            if found.is_empty() {
                bail!("directory {} holds no .yaml, .yml or .json file", input.display());
            }
            files.extend(found);
        } else {
            files.push(input.clone());
        }
    }
    Ok(files)
}

fn read_input(path: &Path) -> anyhow::Result<String> {
    if path == Path::new("-") {
        let mut text = String::new();
        std::io::stdin().read_to_string(&mut text).context("cannot read standard input")?;
        return Ok(text);
    }
    std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))
}

fn run_translate(args: &TranslateArgs) -> anyhow::Result<ExitCode> {
    let stdin = [PathBuf::from("-")];
    let inputs = if args.inputs.is_empty() { &stdin[..] } else { &args.inputs[..] };
    let mut docs = Vec::new();
    for path in input_files(inputs)? {
        let text = read_input(&path)?;
        let name =
            if path == Path::new("-") { "standard input".to_string() } else { path.display().to_string() };
        let mut more = documents::read_stream(&text, &name)?;
        // Positions count across all inputs, so a message points at one document.
        for d in &mut more {
            d.position += docs.len();
        }
        docs.extend(more);
    }
    let direction = if args.to_in_tree { Direction::ToInTree } else { Direction::ToCsi };
    match translate_cmd::translate_documents(docs, direction, args.namespace.as_deref()) {
        Ok(results) => {
            let text = documents::render(&results, args.output).map_err(anyhow::Error::msg)?;
            let mut out = std::io::stdout().lock();
            out.write_all(text.as_bytes())
                .and_then(|()| out.flush())
                .context("cannot write standard output")?;
            Ok(ExitCode::SUCCESS)
        }
        Err(errors) => {
            for e in &errors {
                eprintln!("kvol: {e}");
            }
            eprintln!("kvol: {} document(s) could not be translated; nothing was written", errors.len());
            Ok(ExitCode::FAILURE)
        }
    }
}

#[cfg(test)]
mod render_tests {
    use super::render_error;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot read /x: {source}")]
    struct Repeats {
        source: std::io::Error,
    }

    #[test]
    fn causes_already_in_the_message_are_not_repeated() {
        let e = anyhow::Error::new(Repeats { source: std::io::Error::from(std::io::ErrorKind::NotFound) });
        assert_eq!(render_error(&e), "cannot read /x: entity not found");
        let e = anyhow::Error::new(std::io::Error::from(std::io::ErrorKind::NotFound)).context("loading y");
        assert_eq!(render_error(&e), "loading y: entity not found");
    }
}
