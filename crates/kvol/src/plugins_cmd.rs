//! `kvol plugins`: the volume plugins this node would have, with kind, capabilities and migration state.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use kvol_api::FeatureGates;
use kvol_flex::prober::{ProberConfig, probe_all_once};
use kvol_plugin::catalog::{self, NotRegistered, PluginListing};
use kvol_plugin::{
    DynamicSource, NodeInfo, NodePaths, PluginError, PluginHost, PluginKind, PluginRegistry, ProbeEvent,
    SystemMounter,
};

/// Output format of `kvol plugins`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PluginsFormat {
    Table,
    Json,
}

/// The rows `kvol plugins` prints: the compiled-in registry the gates give, the Flexvolume
/// drivers found in `flex_dir` (probed once: checked and `init` run), and what was left out.
pub fn rows(
    gates: &FeatureGates,
    root: PathBuf,
    node_name: &str,
    flex_dir: &Path,
) -> anyhow::Result<Vec<PluginListing>> {
    let host = PluginHost::new(NodePaths::new(root), NodeInfo::named(node_name), Arc::new(SystemMounter));
    let (plugins, mut not_registered) = catalog::compiled_in(&host, gates);
    let registry = PluginRegistry::new(plugins)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (flex, failed) = runtime.block_on(probe_all_once(&ProberConfig::new(flex_dir), host));
    not_registered.extend(failed);
    for refused in registry.apply(DynamicSource::Flexvolume, flex.into_iter().map(ProbeEvent::AddOrUpdate)) {
        if let PluginError::DuplicateName { name, .. } = &refused {
            let reason = refused.to_string();
            not_registered.push(NotRegistered { name: name.clone(), kind: PluginKind::Flexvolume, reason });
        }
    }
    Ok(catalog::listing(&registry.snapshot(), gates, &not_registered))
}

/// Renders the rows as an aligned table.
pub fn table(rows: &[PluginListing]) -> String {
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            let migration = match &r.migration {
                Some(m) => format!("{} → {} ({})", m.state, m.csi_driver, m.gate),
                None => "-".to_string(),
            };
            let caps = if r.capabilities.is_empty() { "-".to_string() } else { r.capabilities.join(",") };
            let registered = if r.registered { "yes" } else { "no" }.to_string();
            let details = r.details.iter().map(|(k, v)| format!("{k}={v}"));
            let notes = r.note.iter().cloned().chain(details).collect::<Vec<_>>().join("; ");
            [r.name.clone(), r.kind.to_string(), registered, caps, migration, notes]
        })
        .collect();
    let header = ["NAME", "KIND", "REGISTERED", "CAPABILITIES", "MIGRATION", "NOTES"].map(str::to_string);
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&cells) {
        let mut line = String::new();
        for (cell, w) in row.iter().zip(widths) {
            line.push_str(cell);
            line.push_str(&" ".repeat(w - cell.chars().count() + 2));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

pub fn run(
    gates: &FeatureGates,
    format: PluginsFormat,
    root: PathBuf,
    node_name: &str,
    flex_dir: &Path,
) -> anyhow::Result<ExitCode> {
    let rows = rows(gates, root, node_name, flex_dir)?;
    match format {
        PluginsFormat::Table => print!("{}", table(&rows)),
        PluginsFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
    }
    Ok(ExitCode::SUCCESS)
}
