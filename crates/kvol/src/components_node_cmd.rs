//! `kvol components status` and `kvol components uninstall` on a standalone node: what each component is doing and costs, and removing one without orphaning data.

use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvol_api::StorageSection;
use kvol_components::uninstall::{Holder, Inventory, SnapshotObject, holders};
use kvol_components::{Catalogue, Decision, decide};
use kvol_components_runtime::components::ComponentStatus;
use kvol_node::report::status::{Phase, StatusReport, read_status};
use serde::Serialize;

use crate::components_common::{Format, StatusArgs, UninstallArgs, refuse_orphaning};

/// One component as `kvol components status` shows it.
#[derive(Debug, Serialize)]
struct Row {
    name: String,
    /// run, off or blocked: what the config decides.
    decision: &'static str,
    /// running, restarting, stopped.
    state: String,
    pid: Option<u32>,
    starts: u32,
    healthy: Option<bool>,
    /// What its process says it is (`GetPluginInfo`), once it answered a probe.
    version: Option<String>,
    /// What else it says of itself there (`GetPluginInfo`'s manifest: the bundled driver's
    /// volume backing and why).
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    manifest: std::collections::BTreeMap<String, String>,
    rss_bytes: Option<u64>,
    cpu_seconds: Option<f64>,
    csi_driver: Option<String>,
    /// Pod volumes of its CSI driver published now.
    volumes_published: usize,
    last_exit: Option<String>,
}

/// Runs `kvol components status`.
pub fn run_status(args: &StatusArgs, storage: &StorageSection) -> anyhow::Result<ExitCode> {
    let catalogue = crate::components_common::load_catalogue(&args.definitions_dir);
    let decision =
        decide(storage, &catalogue, &crate::components_common::node_facts()).map_err(|problems| {
            anyhow::anyhow!("invalid storage section: {}", crate::components_common::joined(&problems))
        })?;
    let report = read_status(&args.state_dir).ok();
    let rows = status_rows(&catalogue, &decision, report.as_ref(), &ProcFs);
    match args.output {
        Format::Json => println!("{}", serde_json::to_string_pretty(&rows)?),
        Format::Table => {
            if report.is_none() {
                println!("no agent status under {}: processes unknown", args.state_dir.display());
            }
            print!("{}", table(&rows));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// What the kernel says about a process's footprint.
trait Footprint {
    /// Resident memory in bytes and CPU time (user + system) in seconds.
    fn of(&self, pid: u32) -> Option<(u64, f64)>;
}

/// `/proc/<pid>/statm` and `/proc/<pid>/stat`.
struct ProcFs;

impl Footprint for ProcFs {
    fn of(&self, pid: u32) -> Option<(u64, f64)> {
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).ok()?;
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let page = rustix::param::page_size() as u64;
        let ticks = rustix::param::clock_ticks_per_second() as f64;
        parse_footprint(&statm, &stat, page, ticks)
    }
}

/// RSS from `statm`'s second field (pages), CPU from `stat`'s utime and stime (fields 14 and
/// 15, counted after the parenthesised command name, which may hold spaces). Pure.
fn parse_footprint(statm: &str, stat: &str, page: u64, ticks: f64) -> Option<(u64, f64)> {
    let resident: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    let after_name = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // After the name: state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    Some((resident * page, (utime + stime) / ticks))
}

fn status_rows(
    catalogue: &Catalogue,
    decision: &Decision,
    report: Option<&StatusReport>,
    footprint: &dyn Footprint,
) -> Vec<Row> {
    let processes: &[ComponentStatus] = report.map_or(&[], |r| &r.components);
    catalogue
        .entries()
        .iter()
        .map(|entry| {
            let name = entry.definition.name.clone();
            let verdict = decision.verdict(&name).map_or("off", |v| v.word());
            let process = processes.iter().find(|p| p.name == name).map(|p| &p.state);
            let pid = process.and_then(|p| p.pid);
            let usage = pid.and_then(|pid| footprint.of(pid));
            let csi_driver = entry.definition.provides.csi_driver.clone();
            let volumes_published = match (&csi_driver, report) {
                (Some(driver), Some(report)) => published_of(report, driver),
                _ => 0,
            };
            Row {
                name,
                decision: verdict,
                state: match (process, pid) {
                    (None, _) => "stopped".to_string(),
                    (Some(_), Some(_)) => "running".to_string(),
                    (Some(_), None) => "restarting".to_string(),
                },
                pid,
                starts: process.map_or(0, |p| p.starts),
                healthy: process.and_then(|p| p.healthy),
                version: process.and_then(|p| p.version.clone()),
                manifest: process.map(|p| p.manifest.clone()).unwrap_or_default(),
                rss_bytes: usage.map(|u| u.0),
                cpu_seconds: usage.map(|u| u.1),
                csi_driver,
                volumes_published,
                last_exit: process.and_then(|p| p.last_exit.clone()),
            }
        })
        .collect()
}

/// The pod volumes of `driver` published now (a CSI driver's plugin is named by the driver).
fn published_of(report: &StatusReport, driver: &str) -> usize {
    report
        .volumes
        .iter()
        .filter(|v| v.phase == Phase::Published && v.plugin.as_deref() == Some(driver))
        .count()
}

fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<22} {:<8} {:<10} {:>8} {:>6} {:<9} {:>9} {:>8} {:>7}  {:<28} {}\n",
        "COMPONENT",
        "CONFIG",
        "STATE",
        "PID",
        "STARTS",
        "HEALTH",
        "RSS",
        "CPU",
        "VOLUMES",
        "VERSION",
        "LAST EXIT"
    );
    for row in rows {
        let dash = || "-".to_string();
        let health = match row.healthy {
            Some(true) => "healthy",
            Some(false) => "unhealthy",
            None => "-",
        };
        out.push_str(&format!(
            "{:<22} {:<8} {:<10} {:>8} {:>6} {:<9} {:>9} {:>8} {:>7}  {:<28} {}\n",
            row.name,
            row.decision,
            row.state,
            row.pid.map_or_else(dash, |p| p.to_string()),
            row.starts,
            health,
            row.rss_bytes.map_or_else(dash, |b| format!("{:.1}MiB", b as f64 / 1048576.0)),
            row.cpu_seconds.map_or_else(dash, |s| format!("{s:.2}s")),
            row.volumes_published,
            row.version.as_deref().unwrap_or("-"),
            row.last_exit.as_deref().unwrap_or("-"),
        ));
    }
    // What the processes say of themselves beyond their version, a line each under the table.
    for row in rows {
        for (key, value) in &row.manifest {
            out.push_str(&format!("{}: {key}: {value}\n", row.name));
        }
    }
    out
}

/// Runs `kvol components uninstall NAME`.
pub fn run_uninstall(args: &UninstallArgs, storage: &StorageSection) -> anyhow::Result<ExitCode> {
    let catalogue = crate::components_common::load_catalogue(&args.definitions_dir);
    let Some((entry, _)) = catalogue.resolve(&args.name) else {
        anyhow::bail!("no component named {:?} (known: {})", args.name, catalogue.known_names().join(", "));
    };
    let definition = &entry.definition;
    let decision =
        decide(storage, &catalogue, &crate::components_common::node_facts()).map_err(|problems| {
            anyhow::anyhow!("invalid storage section: {}", crate::components_common::joined(&problems))
        })?;
    if decision.verdict(&definition.name).is_some_and(|v| v.runs()) {
        eprintln!(
            "kvol: component {} is on in the config's storage section: turn it off first ({}), then uninstall",
            definition.name,
            how_to_turn_off(definition.role)
        );
        return Ok(ExitCode::FAILURE);
    }
    if let Some(pid) = running_pid(&args.state_dir, &definition.name) {
        eprintln!(
            "kvol: component {} still runs (pid {pid}): the agent has not stopped it yet",
            definition.name
        );
        return Ok(ExitCode::FAILURE);
    }
    let manifests = args.manifests.clone().unwrap_or_else(|| args.state_dir.join("manifests"));
    let found = standalone_holders(definition, &manifests, &args.state_dir);
    if let Some(refused) = refuse_orphaning(&definition.name, &found, args.force) {
        return Ok(refused);
    }
    remove_component_files(&args.state_dir, &definition.name)?;
    println!("component {} uninstalled", definition.name);
    Ok(ExitCode::SUCCESS)
}

fn how_to_turn_off(role: kvol_components::Role) -> &'static str {
    match role {
        kvol_components::Role::Driver => "storage.driver: none, or another driver",
        kvol_components::Role::Optional => "leave it out of storage.optionalCsiComponents",
    }
}

/// The pid in the component's pid file when that process still runs.
fn running_pid(state_dir: &Path, name: &str) -> Option<u32> {
    let text = std::fs::read_to_string(state_dir.join("components").join(format!("{name}.pid"))).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    (!stat.contains(") Z ")).then_some(pid)
}

/// What depends on the component on this node: the manifests' volumes, claims, classes and
/// VolumeSnapshotContents, the volumes the agent provisioned (`<state>/provisioned`) and the
/// snapshots it took or brought in (`<state>/snapshots`).
fn standalone_holders(
    definition: &kvol_components::ComponentDefinition,
    manifests: &Path,
    state_dir: &Path,
) -> Vec<Holder> {
    let objects = kvol_node::sources::load_dir(manifests);
    let (provisioned, _) = kvol_claims::records::load_provisioned(&state_dir.join("provisioned"));
    let mut volumes: Vec<_> = objects
        .persistent_volumes
        .values()
        .map(|pv| k8s_openapi::api::core::v1::PersistentVolume::clone(pv))
        .collect();
    volumes.extend(provisioned.values().map(|pv| k8s_openapi::api::core::v1::PersistentVolume::clone(pv)));
    let claims: Vec<_> = objects.claims.values().cloned().collect();
    let classes: Vec<_> = objects.storage_classes.values().cloned().collect();
    let (taken, _) = kvol_claims::records::load_snapshots(&state_dir.join("snapshots"));
    let mut snapshots: Vec<SnapshotObject> = taken
        .into_iter()
        .map(|(key, record)| SnapshotObject {
            kind: "VolumeSnapshot",
            name: key,
            driver: Some(record.driver),
        })
        .collect();
    snapshots.extend(objects.snapshot_contents.iter().map(|(name, content)| SnapshotObject {
        kind: "VolumeSnapshotContent",
        name: name.clone(),
        driver: Some(content.spec.driver.clone()),
    }));
    holders(
        definition,
        &Inventory { volumes: &volumes, claims: &claims, classes: &classes, snapshots: &snapshots },
    )
}

/// Removes the component's data directory, log, pid file and config copy; what is already gone is fine.
fn remove_component_files(state_dir: &Path, name: &str) -> anyhow::Result<()> {
    let data = state_dir.join(format!("csi-{name}"));
    match std::fs::remove_dir_all(&data) {
        Ok(()) => println!("removed {}", data.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("cannot remove {}", data.display())),
    }
    for file in [
        state_dir.join("logs").join(format!("{name}.log")),
        state_dir.join("components").join(format!("{name}.pid")),
        state_dir.join("components").join(format!("{name}.yaml")),
    ] {
        match std::fs::remove_file(&file) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e).with_context(|| format!("cannot remove {}", file.display())),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn footprints_are_read_from_statm_and_stat() {
        let stat = "4242 (kvol csi) S 1 4242 4242 0 -1 4194560 500 0 0 0 150 50 0 0 20 0 8 0 100 0 0";
        let rows = [
            ("spaces in the name", "1000 300 200 1 0 400 0", stat, Some((300 * 4096, 2.0))),
            ("a short stat", "1000 300", "4242 (x) S 1", None),
            ("no closing parenthesis", "1000 300", "4242 (x S 1 2 3 4 5 6 7 8 9 10 11 12 13", None),
            ("garbage in statm", "a b", stat, None),
        ];
        for (what, statm, stat, want) in rows {
            assert_eq!(parse_footprint(statm, stat, 4096, 100.0), want, "{what}");
        }
    }

    #[test]
    fn what_a_process_says_of_itself_is_a_line_under_the_table() {
        let row = |name: &str, manifest: &[(&str, &str)]| Row {
            name: name.into(),
            decision: "run",
            state: "running".into(),
            pid: Some(7),
            starts: 1,
            healthy: Some(true),
            version: Some("hostpath.csi.kvol.io 0.1.0".into()),
            manifest: manifest.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            rss_bytes: None,
            cpu_seconds: None,
            csi_driver: None,
            volumes_published: 0,
            last_exit: None,
        };
        let text = table(&[
            row("hostpath", &[("volume-backing", "loop (asked for); a volume holds its size and no more")]),
            row("snapshot-controller", &[]),
        ]);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 4, "{text}");
        assert!(lines[1].starts_with("hostpath ") && lines[2].starts_with("snapshot-controller "), "{text}");
        assert_eq!(
            lines[3],
            "hostpath: volume-backing: loop (asked for); a volume holds its size and no more"
        );
        let json = serde_json::to_value(row("x", &[])).unwrap();
        assert!(json.get("manifest").is_none(), "an empty manifest is left out: {json}");
    }
}
