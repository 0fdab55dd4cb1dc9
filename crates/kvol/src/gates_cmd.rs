//! `kvol gates`: the feature gates in effect and their decision for each migratable plugin.

use std::process::ExitCode;

use kvol_api::{FeatureGates, Gate, MigratablePlugin};
use serde_json::json;

/// Output format of `kvol gates`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum GatesFormat {
    Table,
    Json,
}

/// The report as JSON: every gate with its value, default and lock; every plugin with its decisions.
pub fn report(gates: &FeatureGates) -> serde_json::Value {
    let explicit: std::collections::BTreeMap<Gate, bool> = gates.explicit().collect();
    let gate_rows: Vec<_> = Gate::all()
        .map(|g| {
            let spec = g.spec();
            json!({
                "name": g.name(),
                "enabled": gates.enabled(g),
                "default": spec.default,
                "locked": spec.locked,
                "stage": spec.stage.to_string(),
                "explicit": explicit.contains_key(&g),
            })
        })
        .collect();
    let plugin_rows: Vec<_> = MigratablePlugin::ALL
        .into_iter()
        .map(|p| {
            json!({
                "plugin": p.in_tree_name(),
                "csiDriver": p.csi_driver(),
                "migrated": gates.is_migrated(p),
                "inTreeOff": gates.is_in_tree_off(p),
                "migrationComplete": gates.is_migration_complete(p),
                "translationCompiledIn": kvol_translate::is_compiled_in(p),
            })
        })
        .collect();
    json!({ "gates": gate_rows, "plugins": plugin_rows })
}

/// Renders the report as two aligned tables.
pub fn table(gates: &FeatureGates) -> String {
    let mut out = format!("{:<34} {:<8} {:<8} {}\n", "GATE", "ENABLED", "DEFAULT", "STAGE");
    for g in Gate::all() {
        let spec = g.spec();
        let stage = if spec.locked { format!("{} (locked)", spec.stage) } else { spec.stage.to_string() };
        out.push_str(&format!("{:<34} {:<8} {:<8} {}\n", g.name(), gates.enabled(g), spec.default, stage));
    }
    out.push('\n');
    out.push_str(&format!(
        "{:<31} {:<25} {:<9} {:<12} {}\n",
        "PLUGIN", "CSI DRIVER", "MIGRATED", "IN-TREE OFF", "TRANSLATION"
    ));
    for p in MigratablePlugin::ALL {
        let compiled = if kvol_translate::is_compiled_in(p) { "compiled in" } else { "not compiled in" };
        out.push_str(&format!(
            "{:<31} {:<25} {:<9} {:<12} {}\n",
            p.in_tree_name(),
            p.csi_driver(),
            gates.is_migrated(p),
            gates.is_in_tree_off(p),
            compiled
        ));
    }
    out
}

pub fn run(gates: &FeatureGates, format: GatesFormat) -> anyhow::Result<ExitCode> {
    match format {
        GatesFormat::Table => print!("{}", table(gates)),
        GatesFormat::Json => println!("{}", serde_json::to_string_pretty(&report(gates))?),
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn report_reflects_the_gates() {
        let gates = FeatureGates::parse("CSIMigrationRBD=true,InTreePluginRBDUnregister=true").unwrap();
        let r = report(&gates);
        let rbd =
            r["plugins"].as_array().unwrap().iter().find(|p| p["plugin"] == "kubernetes.io/rbd").unwrap();
        assert_eq!(rbd["migrated"], true);
        assert_eq!(rbd["inTreeOff"], true);
        assert_eq!(rbd["migrationComplete"], true);
        let gate = r["gates"].as_array().unwrap().iter().find(|g| g["name"] == "CSIMigrationRBD").unwrap();
        assert_eq!(gate["explicit"], true);
        assert_eq!(gate["default"], false);
        let t = table(&gates);
        assert!(t.lines().any(|l| l.starts_with("kubernetes.io/rbd") && l.contains("true      true")), "{t}");
    }
}
