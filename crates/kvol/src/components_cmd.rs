//! `kvol components`: the storage components kvol knows, and what the config decides for this node.

use std::path::PathBuf;
use std::process::ExitCode;

use kvol_api::StorageSection;
use kvol_components::definition::Standalone;
use kvol_components::{Catalogue, NodeFeature, Role, decide};
use serde::Serialize;

use crate::components_common::{
    DEFAULT_DEFINITIONS_DIR, Format, facts_with_volume_group, load_catalogue, node_facts,
};

#[derive(Debug, clap::Subcommand)]
pub enum ComponentsCommand {
    /// List the component definitions: built in, and those in the definitions directory.
    List(ListArgs),
    /// Check the config's storage section and show, for every component, whether it should
    /// run here and why; exit 2 with every problem listed when the section is invalid.
    Plan(PlanArgs),
    /// Each component on this node: what the config decides, its process (pid, starts,
    /// health, memory, CPU time) and the pod volumes of its driver published now.
    Status(crate::components_common::StatusArgs),
    /// Remove a component that is turned off: refused while any volume, claim or snapshot
    /// still depends on it (each listed), then its data directory, log and pid file go.
    Uninstall(crate::components_common::UninstallArgs),
    /// Deploy into a cluster: each component the config turns on is applied from its
    /// definition's cluster bundle (server-side apply, field manager kvol, labelled with the
    /// component), what its bundle no longer has is pruned, components turned off are left
    /// exactly as they are.
    Apply(crate::components_cluster_cmd::ApplyArgs),
}

#[derive(Debug, clap::Args)]
pub struct ListArgs {
    /// Directory of user component definitions (*.yaml).
    #[arg(long, default_value = DEFAULT_DEFINITIONS_DIR)]
    pub definitions_dir: PathBuf,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: Format,
}

#[derive(Debug, clap::Args)]
pub struct PlanArgs {
    /// Directory of user component definitions (*.yaml).
    #[arg(long, default_value = DEFAULT_DEFINITIONS_DIR)]
    pub definitions_dir: PathBuf,
    /// Whether the node has an LVM volume group; by default `vgs` is asked.
    #[arg(long, value_name = "BOOL")]
    pub volume_group: Option<bool>,
}

#[derive(Serialize)]
struct Listed<'a> {
    name: &'a str,
    role: &'static str,
    csi_driver: Option<&'a str>,
    snapshots: bool,
    needs: Vec<&'static str>,
    default: String,
    standalone: &'static str,
    /// How many objects its cluster bundle has (0: none, it is not deployed into clusters).
    cluster_objects: usize,
    source: String,
}

/// Runs `kvol components list`.
pub fn run_list(args: &ListArgs) -> anyhow::Result<ExitCode> {
    let (catalogue, problems) = Catalogue::load(&args.definitions_dir);
    let rows: Vec<Listed> = catalogue.entries().iter().map(listed).collect();
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Format::Table => print!("{}", table(&rows)),
    }
    for problem in &problems {
        eprintln!("kvol: component definition left out: {problem}");
    }
    Ok(if problems.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn listed(entry: &kvol_components::catalogue::Entry) -> Listed<'_> {
    let d = &entry.definition;
    let default = match (d.role, d.default_rank, d.on_by_default) {
        (Role::Driver, Some(rank), _) => format!("rank {rank}"),
        (Role::Optional, _, true) => "on".to_string(),
        _ => "-".to_string(),
    };
    Listed {
        name: &d.name,
        role: match d.role {
            Role::Driver => "driver",
            Role::Optional => "optional",
        },
        csi_driver: d.provides.csi_driver.as_deref(),
        snapshots: d.provides.snapshots,
        needs: d.needs.iter().map(|n| need_name(*n)).collect(),
        default,
        standalone: match &d.standalone {
            Some(Standalone::Process(_)) => "process",
            Some(Standalone::InAgent(_)) => "in-agent",
            None => "-",
        },
        cluster_objects: d.cluster.as_ref().map_or(0, |bundle| bundle.objects.len()),
        source: entry.origin.to_string(),
    }
}

fn need_name(need: NodeFeature) -> &'static str {
    match need {
        NodeFeature::LvmVolumeGroup => "lvm-volume-group",
    }
}

fn table(rows: &[Listed]) -> String {
    let lines: Vec<[String; 8]> = rows
        .iter()
        .map(|r| {
            [
                r.name.to_string(),
                r.role.to_string(),
                r.csi_driver.unwrap_or("-").to_string(),
                if r.needs.is_empty() { "-".into() } else { r.needs.join(",") },
                r.default.clone(),
                r.standalone.to_string(),
                match r.cluster_objects {
                    0 => "-".to_string(),
                    n => format!("{n} objects"),
                },
                r.source.clone(),
            ]
        })
        .collect();
    let header = ["NAME", "ROLE", "CSI DRIVER", "NEEDS", "DEFAULT", "STANDALONE", "CLUSTER", "SOURCE"]
        .map(String::from);
    let mut widths = [0usize; 8];
    for line in std::iter::once(&header).chain(&lines) {
        for (w, cell) in widths.iter_mut().zip(line) {
            *w = (*w).max(cell.len());
        }
    }
    let mut out = String::new();
    for line in std::iter::once(&header).chain(&lines) {
        let cells: Vec<String> = line.iter().zip(widths).map(|(c, w)| format!("{c:<w$}")).collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// Runs `kvol components plan` for the config's storage section.
pub fn run_plan(args: &PlanArgs, storage: &StorageSection) -> anyhow::Result<ExitCode> {
    let catalogue = load_catalogue(&args.definitions_dir);
    let facts = match args.volume_group {
        Some(known) => facts_with_volume_group(known),
        None => node_facts(),
    };
    match decide(storage, &catalogue, &facts) {
        Ok(decision) => {
            for warning in &decision.warnings {
                eprintln!("kvol: warning: {warning}");
            }
            print!("{decision}");
            Ok(ExitCode::SUCCESS)
        }
        Err(problems) => {
            for problem in &problems {
                eprintln!("kvol: invalid config: {problem}");
            }
            Ok(ExitCode::from(2))
        }
    }
}
