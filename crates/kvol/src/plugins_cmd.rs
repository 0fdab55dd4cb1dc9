//! `kvol plugins`: the volume plugins this node would have, with kind, capabilities and migration state.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use std::time::Duration;

use anyhow::Context;
use k8s_openapi::api::storage::v1::CSIDriver;
use kvol_api::FeatureGates;
use kvol_csi::handler::register_present_once;
use kvol_csi::registration::WatcherConfig;
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, Timeouts};
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

/// Where `kvol plugins` looks for dynamic plugins.
#[derive(Clone, Debug)]
pub struct Sources<'a> {
    /// The Flexvolume plugin directory; each driver is checked and its `init` run.
    pub flex_dir: &'a Path,
    /// The plugin-registration directory; each CSI driver's socket is asked GetInfo (nothing is
    /// sent back to it) and the driver NodeGetInfo and its capabilities.
    pub registration_dir: &'a Path,
    /// CSIDriver objects (YAML or JSON files) whose settings apply to the drivers found.
    pub manifests: &'a [PathBuf],
}

/// The rows `kvol plugins` prints: the compiled-in registry the gates give, the Flexvolume and
/// CSI drivers found (each probed once), and what was left out with why.
pub fn rows(
    gates: &FeatureGates,
    root: PathBuf,
    node_name: &str,
    sources: &Sources<'_>,
) -> anyhow::Result<Vec<PluginListing>> {
    let host = PluginHost::new(NodePaths::new(root), NodeInfo::named(node_name), Arc::new(SystemMounter));
    let objects = MemoryObjects::new();
    for driver in csi_drivers(sources.manifests)? {
        objects.put_csi_driver(driver);
    }
    let (plugins, mut not_registered) = catalog::compiled_in(&host, gates);
    let registry = Arc::new(PluginRegistry::new(plugins)?);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    let (flex, failed) = runtime.block_on(probe_all_once(&ProberConfig::new(sources.flex_dir), host.clone()));
    not_registered.extend(failed);
    for refused in registry.apply(DynamicSource::Flexvolume, flex.into_iter().map(ProbeEvent::AddOrUpdate)) {
        if let PluginError::DuplicateName { name, .. } = &refused {
            let reason = refused.to_string();
            not_registered.push(NotRegistered { name: name.clone(), kind: PluginKind::Flexvolume, reason });
        }
    }
    let handler = CsiRegistrationHandler::new(
        Arc::clone(&registry),
        Arc::new(objects),
        host,
        gates,
        Timeouts::with_call(Duration::from_secs(10)),
    );
    let config = WatcherConfig::new(sources.registration_dir);
    let failures = runtime.block_on(register_present_once(sources.registration_dir, &config, &handler));
    not_registered.extend(failures.into_iter().map(|(socket, reason)| NotRegistered {
        name: socket,
        kind: PluginKind::Csi,
        reason,
    }));
    Ok(catalog::listing(&registry.snapshot(), gates, &not_registered))
}

/// The CSIDriver objects in `manifests` (other kinds are skipped); a malformed one is an error
/// naming its file.
fn csi_drivers(manifests: &[PathBuf]) -> anyhow::Result<Vec<CSIDriver>> {
    let mut drivers = Vec::new();
    for path in crate::input_files(manifests)? {
        let text =
            std::fs::read_to_string(&path).with_context(|| format!("cannot read {}", path.display()))?;
        let name = path.display().to_string();
        for (i, value) in crate::documents::read_values(&text, &name)?.into_iter().enumerate() {
            if value.get("kind").and_then(|k| k.as_str()) != Some("CSIDriver") {
                continue;
            }
            let driver: CSIDriver = serde_json::from_value(value)
                .with_context(|| format!("{name}: document {} is not a valid CSIDriver", i + 1))?;
            drivers.push(driver);
        }
    }
    Ok(drivers)
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
    sources: &Sources<'_>,
) -> anyhow::Result<ExitCode> {
    let rows = rows(gates, root, node_name, sources)?;
    match format {
        PluginsFormat::Table => print!("{}", table(&rows)),
        PluginsFormat::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
    }
    Ok(ExitCode::SUCCESS)
}
