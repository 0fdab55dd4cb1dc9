//! `kvol migrate check`: whether the objects of manifests or of a live cluster can migrate from in-tree plugins to CSI, as a table or JSON; the decisions are kvol-translate's `migration_check`.

use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;
use k8s_openapi::api::core::v1::Secret;
use kvol_api::FeatureGates;
use kvol_cluster::inventory::{Inventory as Objects, secret_key};
use kvol_translate::migration_check::{CheckInput, MigrationCheck, check};
use serde_json::{Value, json};

#[derive(Debug, clap::Subcommand)]
pub enum MigrateCommand {
    /// For each in-tree plugin in use: what would migrate to which CSI driver, whether its
    /// CSIDriver exists, where it is registered, what would not translate, missing secrets and
    /// gate skew between nodes. Exits 0 only when nothing blocks migration.
    Check(CheckArgs),
}

#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// Manifest files or directories (PersistentVolumes, Pods, StorageClasses, CSIDrivers,
    /// CSINodes, Secrets; other kinds are skipped); `-` reads standard input.
    pub inputs: Vec<PathBuf>,
    /// Read the objects from this cluster instead.
    #[arg(long, conflicts_with = "inputs")]
    pub kubeconfig: Option<PathBuf>,
    /// Output format.
    #[arg(short = 'o', long, value_enum, default_value = "table")]
    pub output: CheckFormat,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub enum CheckFormat {
    Table,
    Json,
}

pub fn run(gates: &FeatureGates, command: &MigrateCommand) -> anyhow::Result<ExitCode> {
    let MigrateCommand::Check(args) = command;
    let objects = match &args.kubeconfig {
        Some(path) => from_cluster(path)?,
        None => from_manifests(&args.inputs)?,
    };
    let input = CheckInput {
        persistent_volumes: &objects.persistent_volumes,
        pods: &objects.pods,
        storage_classes: &objects.storage_classes,
        csi_drivers: &objects.csi_drivers,
        csi_nodes: &objects.csi_nodes,
        secrets: &objects.secrets,
    };
    let result = check(&input, gates);
    let text = match args.output {
        CheckFormat::Table => table(&result),
        CheckFormat::Json => format!("{:#}\n", as_json(&result)),
    };
    let mut out = std::io::stdout().lock();
    out.write_all(text.as_bytes()).and_then(|()| out.flush()).context("cannot write standard output")?;
    Ok(if result.blockers.is_empty() { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn from_manifests(inputs: &[PathBuf]) -> anyhow::Result<Objects> {
    let stdin = [PathBuf::from("-")];
    let inputs = if inputs.is_empty() { &stdin[..] } else { inputs };
    let mut objects = Objects::default();
    for path in crate::input_files(inputs)? {
        let text = crate::read_input(&path)?;
        for value in crate::documents::read_values(&text, &path.display().to_string())? {
            add(&mut objects, value).with_context(|| format!("{}", path.display()))?;
        }
    }
    Ok(objects)
}

/// Files one document by its kind; kinds a check does not read are skipped.
fn add(objects: &mut Objects, value: Value) -> anyhow::Result<()> {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or_default().to_string();
    let parse = |what: &str| format!("cannot read a {what}");
    match kind.as_str() {
        "PersistentVolume" => {
            objects.persistent_volumes.push(serde_json::from_value(value).with_context(|| parse(&kind))?)
        }
        "Pod" => objects.pods.push(serde_json::from_value(value).with_context(|| parse(&kind))?),
        "StorageClass" => {
            objects.storage_classes.push(serde_json::from_value(value).with_context(|| parse(&kind))?)
        }
        "CSIDriver" => objects.csi_drivers.push(serde_json::from_value(value).with_context(|| parse(&kind))?),
        "CSINode" => objects.csi_nodes.push(serde_json::from_value(value).with_context(|| parse(&kind))?),
        "Secret" => {
            let secret: Secret = serde_json::from_value(value).with_context(|| parse(&kind))?;
            objects.secrets.insert(secret_key(&secret.metadata));
        }
        _ => {}
    }
    Ok(())
}

/// Every object a check reads, listed from the cluster of `kubeconfig`.
fn from_cluster(kubeconfig: &std::path::Path) -> anyhow::Result<Objects> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?;
    runtime.block_on(async {
        let client = kvol_cluster::client::client(Some(kubeconfig))
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the cluster of {}: {e}", kubeconfig.display()))?;
        kvol_cluster::inventory::list_inventory(&client).await.map_err(anyhow::Error::msg)
    })
}

fn yes_no(b: bool) -> &'static str {
    if b { "yes" } else { "no" }
}

fn table(result: &MigrationCheck) -> String {
    let mut out = String::new();
    if result.plugins.is_empty() {
        out.push_str("no in-tree volumes, classes or inline volumes of a migratable plugin\n");
    } else {
        out.push_str("PLUGIN\tCSI DRIVER\tMIGRATED BY GATES\tCSIDRIVER OBJECT\tREGISTERED ON\tOBJECTS\tWOULD NOT TRANSLATE\n");
        for p in &result.plugins {
            let failing = p.objects.iter().filter(|o| o.error.is_some()).count();
            let nodes = if p.registered_on.is_empty() { "-".to_string() } else { p.registered_on.join(",") };
            out.push_str(&format!(
                "{}\t{}\t{}\t{}\t{nodes}\t{}\t{failing}\n",
                p.plugin.in_tree_name(),
                p.plugin.csi_driver(),
                yes_no(p.migrated_by_gates),
                yes_no(p.csi_driver_object),
                p.objects.len()
            ));
        }
        out.push('\n');
        for p in &result.plugins {
            for o in &p.objects {
                let outcome = o
                    .error
                    .as_deref()
                    .map_or("translates".to_string(), |e| format!("WOULD NOT TRANSLATE: {e}"));
                out.push_str(&format!("{}\t{}\t{outcome}\n", p.plugin.in_tree_name(), o.object));
            }
        }
    }
    if !result.gate_skew.is_empty() {
        out.push_str("\nnodes' migrated plugins (they differ):\n");
        for (node, value) in &result.gate_skew {
            out.push_str(&format!("{node}\t{}\n", if value.is_empty() { "(none)" } else { value }));
        }
    }
    if result.blockers.is_empty() {
        out.push_str("\nnothing blocks migration\n");
    } else {
        out.push_str("\nblocking migration:\n");
        for b in &result.blockers {
            out.push_str(&format!("- {b}\n"));
        }
    }
    align_tabs(&out)
}

/// Lines of tab-separated cells aligned into columns, each run of such lines on its own.
fn align_tabs(text: &str) -> String {
    let mut out = String::new();
    let mut block: Vec<Vec<&str>> = Vec::new();
    let flush = |block: &mut Vec<Vec<&str>>, out: &mut String| {
        let columns = block.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|i| block.iter().filter_map(|row| row.get(i)).map(|c| c.chars().count()).max().unwrap_or(0))
            .collect();
        for row in block.drain(..) {
            let mut line = String::new();
            for (cell, width) in row.iter().zip(&widths) {
                line.push_str(cell);
                line.push_str(&" ".repeat(width - cell.chars().count() + 2));
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
    };
    for line in text.lines() {
        if line.contains('\t') {
            block.push(line.split('\t').collect());
        } else {
            flush(&mut block, &mut out);
            out.push_str(line);
            out.push('\n');
        }
    }
    flush(&mut block, &mut out);
    out
}

fn as_json(result: &MigrationCheck) -> Value {
    let object =
        |o: &kvol_translate::migration_check::ObjectCheck| json!({"object": o.object, "error": o.error});
    json!({
        "plugins": result.plugins.iter().map(|p| json!({
            "plugin": p.plugin.in_tree_name(),
            "csiDriver": p.plugin.csi_driver(),
            "migratedByGates": p.migrated_by_gates,
            "csiDriverObject": p.csi_driver_object,
            "registeredOn": p.registered_on,
            "objects": p.objects.iter().map(object).collect::<Vec<_>>(),
            "missingSecrets": p.missing_secrets,
        })).collect::<Vec<_>>(),
        "gateSkew": result.gate_skew.iter().map(|(node, value)| json!({"node": node, "migratedPlugins": value})).collect::<Vec<_>>(),
        "ambiguous": result.ambiguous.iter().map(object).collect::<Vec<_>>(),
        "blockers": result.blockers,
        "migrationBlocked": !result.blockers.is_empty(),
    })
}
