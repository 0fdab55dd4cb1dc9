//! What the `kvol components` commands share, standalone and against a cluster: default paths, output format, the catalogue, the node's facts, the status and uninstall arguments, the refusal to orphan data.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use kvol_components::uninstall::Holder;
use kvol_components::{Catalogue, NodeFacts, NodeFeature};

/// kvol's state directory unless told otherwise (`kvol agent --state-dir`); the commands that
/// read the agent's files default to it too.
pub const DEFAULT_STATE_DIR: &str = "/var/lib/kvol";

/// Where a user drops component definitions.
pub const DEFAULT_DEFINITIONS_DIR: &str = "/etc/kvol/components";

/// How long `vgs` may take to say whether the node has a volume group.
const VGS_DEADLINE: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum Format {
    Table,
    Json,
}

#[derive(Debug, clap::Args)]
pub struct StatusArgs {
    /// The agent's state directory (its `--state-dir`, or its `--root`).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// Directory of user component definitions (*.yaml).
    #[arg(long, default_value = DEFAULT_DEFINITIONS_DIR)]
    pub definitions_dir: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Format,
    /// Report on this cluster instead of this node: each component's deployed objects, its
    /// workloads' readiness and resource requests, and its driver's volumes.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct UninstallArgs {
    /// The component to remove.
    pub name: String,
    /// The agent's state directory (its `--state-dir`, or its `--root`).
    #[arg(long, default_value = DEFAULT_STATE_DIR)]
    pub state_dir: PathBuf,
    /// The agent's manifests directory; defaults to `<state-dir>/manifests`.
    #[arg(long)]
    pub manifests: Option<PathBuf>,
    /// Directory of user component definitions (*.yaml).
    #[arg(long, default_value = DEFAULT_DEFINITIONS_DIR)]
    pub definitions_dir: PathBuf,
    /// Remove it even though objects still depend on it; each one is named as orphaned.
    #[arg(long)]
    pub force: bool,
    /// Uninstall from this cluster instead of this node: the holders are read from the API and
    /// the component's deployed objects deleted, workloads first, definitions last.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig: Option<PathBuf>,
}

/// Says what uninstalling `component` would orphan: a refusal listing each holder (the exit
/// code to return), or with `force` each one named as orphaned and `None`.
pub(crate) fn refuse_orphaning(component: &str, found: &[Holder], force: bool) -> Option<ExitCode> {
    if !found.is_empty() && !force {
        eprintln!("kvol: component {component} still holds data; uninstalling would orphan:");
        for holder in found {
            eprintln!("  {holder}");
        }
        eprintln!("delete these first, or pass --force to orphan them");
        return Some(ExitCode::FAILURE);
    }
    for holder in found {
        println!("orphaned: {holder}");
    }
    None
}

/// What the node has that components may need, found out by asking it (`vgs`).
pub fn node_facts() -> NodeFacts {
    facts_with_volume_group(volume_group_present())
}

pub(crate) fn facts_with_volume_group(present: bool) -> NodeFacts {
    NodeFacts { features: if present { [NodeFeature::LvmVolumeGroup].into() } else { Default::default() } }
}

/// Whether `vgs` lists at least one volume group; no lvm2 tools, an error or no answer within
/// the deadline all count as none.
fn volume_group_present() -> bool {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        return false;
    };
    runtime.block_on(kvol_lvm::command::volume_groups(VGS_DEADLINE)).is_ok_and(|groups| !groups.is_empty())
}

/// The built-in definitions and the directory's; each file left out is said on stderr.
pub(crate) fn load_catalogue(dir: &std::path::Path) -> Catalogue {
    let (catalogue, problems) = Catalogue::load(dir);
    for problem in &problems {
        eprintln!("kvol: component definition left out: {problem}");
    }
    catalogue
}

/// Config problems on one line.
pub(crate) fn joined(problems: &[kvol_components::ConfigProblem]) -> String {
    problems.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
