//! The status snapshot the agent writes to `<root>/status.json` and `kvol status` reads and renders.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use k8s_openapi::api::storage::v1::CSINode;
use serde::{Deserialize, Serialize};

/// The name of the status file in the agent's root directory.
pub const STATUS_FILE: &str = "status.json";

/// What the agent is doing, as of `updated_unix_ms`.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct StatusReport {
    pub node: String,
    /// The agent's process ID.
    pub pid: u32,
    pub started_unix_ms: u64,
    pub updated_unix_ms: u64,
    /// Where the agent serves `/metrics`, when it does.
    pub metrics_address: Option<String>,
    #[serde(default)]
    pub volumes: Vec<VolumeStatus>,
    /// Problems that are no one volume's: source documents that cannot be read, plugins that
    /// failed to probe …
    #[serde(default)]
    pub problems: Vec<String>,
    /// The plugins the agent has, by name.
    #[serde(default)]
    pub plugins: Vec<String>,
    /// Every volume attached to or staged on the node, whether or not a pod still uses it: a
    /// volume whose pods are gone stays here until it is unstaged and detached.
    #[serde(default)]
    pub node_volumes: Vec<NodeVolumeStatus>,
    /// The node's CSINode as registration keeps it (drivers with node IDs and topology keys,
    /// the migrated-plugins annotation); standalone kvol has no API server to show it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub csi_node: Option<CSINode>,
    /// The storage components' processes the agent supervises (standalone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<kvol_components_runtime::components::ComponentStatus>,
    /// The volume snapshots the agent took (standalone).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub snapshots: Vec<SnapshotStatus>,
    /// The bound claims among the objects and their sizes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub claims: Vec<ClaimSizeStatus>,
}

/// A bound claim's sizes: what it asks, what its volume has, what its status says it has (the
/// size its filesystem was last grown to), and where a resize stands.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ClaimSizeStatus {
    /// `namespace/name`.
    pub name: String,
    /// Its PersistentVolume.
    pub volume: String,
    /// `spec.resources.requests.storage`, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_bytes: Option<u64>,
    /// The PersistentVolume's capacity, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_bytes: Option<u64>,
    /// `status.capacity.storage`, in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_bytes: Option<u64>,
    /// `status.allocatedResources.storage` (RecoverVolumeExpansionFailure), in bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_bytes: Option<u64>,
    /// v1.26's `resizeStatus` (RecoverVolumeExpansionFailure); empty: none in progress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resize_status: Option<String>,
    /// The status conditions' types (`FileSystemResizePending` …).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<String>,
}

/// A snapshot the agent took: the standalone VolumeSnapshotContent.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct SnapshotStatus {
    /// The VolumeSnapshot, `namespace/name`.
    pub name: String,
    pub driver: String,
    pub snapshot_handle: String,
    pub source_claim: String,
    pub size_bytes: i64,
    pub ready_to_use: bool,
    /// The pre-provisioned VolumeSnapshotContent it was brought in from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
}

/// One volume attached to or staged on the node (per unique volume, not per pod).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct NodeVolumeStatus {
    /// The plugin's unique name for the volume.
    pub unique_name: String,
    pub plugin: String,
    /// Attaching, attached, staging, staged, tearing-down (unstage or detach under way) or
    /// failed (the last operation on it failed; it is retried).
    pub phase: Phase,
    pub attached: bool,
    pub device_path: Option<String>,
    /// Where it is staged, when it is.
    pub staging_path: Option<PathBuf>,
    pub last_error: Option<String>,
    pub progress: Option<String>,
}

/// One volume of one pod.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct VolumeStatus {
    /// `namespace/name` of the pod.
    pub pod: String,
    pub pod_uid: String,
    /// The pod's name for the volume.
    pub volume: String,
    /// The plugin serving it, once known.
    pub plugin: Option<String>,
    pub phase: Phase,
    /// Whether an in-tree volume is served by its CSI driver.
    #[serde(default)]
    pub migrated: bool,
    pub device_path: Option<String>,
    pub staging_path: Option<PathBuf>,
    /// The pod volume directory, once published.
    pub target: Option<PathBuf>,
    /// Why the last operation on the volume failed.
    pub last_error: Option<String>,
    /// What the volume waits for (an unbound claim, a missing PV …).
    pub pending_reason: Option<String>,
    /// The operation under way, in words.
    pub progress: Option<String>,
}

/// Where a volume is between wanted and published.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Pending,
    Attaching,
    Attached,
    Staging,
    Staged,
    Publishing,
    Published,
    /// Published by a call whose outcome is unknown (a deadline, a dead connection, a driver
    /// that answered garbage), or reconstructed from the node: kept for teardown, published
    /// again while wanted, and never ready for containers until a call succeeds (kubelet's
    /// "uncertain" mount).
    Uncertain,
    TearingDown,
    Failed,
    /// No container of the pod mounts it or takes it as a device: not set up, as kubelet
    /// does not set such a volume up.
    Unused,
}

impl Phase {
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Pending => "pending",
            Phase::Attaching => "attaching",
            Phase::Attached => "attached",
            Phase::Staging => "staging",
            Phase::Staged => "staged",
            Phase::Publishing => "publishing",
            Phase::Published => "published",
            Phase::Uncertain => "uncertain",
            Phase::TearingDown => "tearing-down",
            Phase::Failed => "failed",
            Phase::Unused => "unused",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `<root>/status.json`.
pub fn status_path(root: &Path) -> PathBuf {
    root.join(STATUS_FILE)
}

/// Writes `report` as `<root>/status.json` whole or not at all: a temporary file renamed over
/// the old one, so a reader never sees half a report. Not synced to disk: the report is a view
/// the agent rewrites on every start, and an fsync per change would sit on the path of every
/// volume operation; after a power loss a reader may see an older report, never a torn one.
pub fn write_status(root: &Path, report: &StatusReport) -> std::io::Result<()> {
    let mut text = serde_json::to_vec_pretty(report).map_err(std::io::Error::other)?;
    text.push(b'\n');
    kvol_plugin::atomic_file::replace(
        &status_path(root),
        &text,
        kvol_plugin::atomic_file::Durability::AtomicOnly,
    )
    .map_err(|e| std::io::Error::new(e.source.kind(), e.to_string()))
}

/// Marks the status file current without writing it again (its modification time, which
/// [`read_status`] takes as `updated` when later): an idle agent at node scale would otherwise
/// rewrite a report of thousands of volumes, unchanged, every few seconds.
pub fn touch_status(root: &Path) -> std::io::Result<()> {
    fs::File::options().write(true).open(status_path(root))?.set_modified(std::time::SystemTime::now())
}

/// The report in `<state dir>/status.json`; the message says what is wrong when there is none or
/// it cannot be read. `updated` is the later of the report's own and the file's modification
/// time (see [`touch_status`]).
pub fn read_status(root: &Path) -> Result<StatusReport, String> {
    let path = status_path(root);
    let text = match fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "no status at {}: is the agent running with --state-dir {}?",
                path.display(),
                root.display()
            ));
        }
        Err(e) => return Err(format!("cannot read the status at {}: {e}", path.display())),
    };
    let mut report: StatusReport = serde_json::from_str(&text)
        .map_err(|e| format!("the status at {} is corrupt: {e}", path.display()))?;
    let touched = fs::metadata(&path).and_then(|m| m.modified()).ok();
    let touched_ms = touched
        .and_then(|t| t.duration_since(std::time::SystemTime::UNIX_EPOCH).ok())
        .map_or(0, |d| d.as_millis() as u64);
    report.updated_unix_ms = report.updated_unix_ms.max(touched_ms);
    Ok(report)
}

/// Whether process `pid` is alive on this machine (`/proc/<pid>` exists).
pub fn pid_alive(pid: u32) -> bool {
    pid != 0 && Path::new("/proc").join(pid.to_string()).exists()
}

/// The report as a header and a table of volumes, for people. `now_unix_ms` gives the age of
/// the report; an agent whose pid is not alive is said to have left a stale report.
pub fn render_table(report: &StatusReport, now_unix_ms: u64) -> String {
    render(report, now_unix_ms, pid_alive(report.pid))
}

/// [`render_table`] with whether the agent runs given.
fn render(report: &StatusReport, now_unix_ms: u64, agent_alive: bool) -> String {
    let mut out = format!(
        "node {}, agent pid {}, started {} ago, updated {} ago",
        report.node,
        report.pid,
        age(now_unix_ms.saturating_sub(report.started_unix_ms)),
        age(now_unix_ms.saturating_sub(report.updated_unix_ms)),
    );
    if let Some(address) = &report.metrics_address {
        out.push_str(&format!(", metrics on {address}"));
    }
    out.push('\n');
    if !agent_alive {
        out.push_str(&format!(
            "warning: agent pid {} is not running: this status may be stale\n",
            report.pid
        ));
    }
    if !report.plugins.is_empty() {
        out.push_str(&format!("plugins: {}\n", report.plugins.join(", ")));
    }
    if let Some(csi_node) = &report.csi_node {
        out.push_str(&csi_node_lines(csi_node));
    }
    for component in &report.components {
        out.push_str(&component_line(component));
    }
    for snapshot in &report.snapshots {
        let ready = if snapshot.ready_to_use { "ready" } else { "not ready" };
        let origin = match &snapshot.content {
            Some(content) => format!("from VolumeSnapshotContent {content}"),
            None => format!("of claim {}", snapshot.source_claim),
        };
        out.push_str(&format!(
            "snapshot {}: {ready}, {} bytes, {origin}, {} snapshot {}\n",
            snapshot.name, snapshot.size_bytes, snapshot.driver, snapshot.snapshot_handle
        ));
    }
    for claim in &report.claims {
        out.push_str(&claim_line(claim));
    }
    if !report.problems.is_empty() {
        out.push_str("problems:\n");
        for problem in &report.problems {
            out.push_str(&format!("  {}\n", one_line(problem)));
        }
    }
    out.push('\n');
    if report.volumes.is_empty() {
        out.push_str("no pod volumes\n");
    } else {
        let header = ["POD", "VOLUME", "PLUGIN", "PHASE", "DEVICE/PATH", "LAST ERROR"].map(str::to_string);
        let rows: Vec<[String; 6]> = report.volumes.iter().map(row).collect();
        table(&mut out, &header, &rows);
    }
    if !report.node_volumes.is_empty() {
        out.push_str("\nattached or staged on the node:\n");
        let header = ["VOLUME", "PLUGIN", "PHASE", "DEVICE/PATH", "LAST ERROR"].map(str::to_string);
        let rows: Vec<[String; 5]> = report.node_volumes.iter().map(node_row).collect();
        table(&mut out, &header, &rows);
    }
    out
}

/// A claim's sizes on one line: `claim ns/c: volume pv, asks 2Gi, volume 2Gi, capacity 1Gi, FileSystemResizePending`.
fn claim_line(claim: &ClaimSizeStatus) -> String {
    let size = |bytes: Option<u64>| bytes.map_or_else(|| "?".to_string(), kvol_api::quantity::format_bytes);
    let mut facts = vec![
        format!("volume {}", claim.volume),
        format!("asks {}", size(claim.requested_bytes)),
        format!("volume size {}", size(claim.volume_bytes)),
        format!("capacity {}", size(claim.capacity_bytes)),
    ];
    if claim.allocated_bytes.is_some() {
        facts.push(format!("allocated {}", size(claim.allocated_bytes)));
    }
    if let Some(status) = claim.resize_status.as_deref().filter(|s| !s.is_empty()) {
        facts.push(format!("resize {status}"));
    }
    facts.extend(claim.conditions.iter().cloned());
    format!("claim {}: {}\n", claim.name, facts.join(", "))
}

/// The CSINode in a line per driver and one for the migrated plugins.
/// A supervised component process on one line: running or not, starts, health, what it says
/// it is (its version, then each entry of its manifest as `key: value`), last exit.
fn component_line(component: &kvol_components_runtime::components::ComponentStatus) -> String {
    let state = &component.state;
    let running = match (state.pid, state.restart_backoff_ms) {
        (Some(pid), _) => format!("pid {pid}"),
        (None, Some(ms)) => format!(
            "not running, restarting after a back-off of {:?} ({} crash(es) in a row)",
            std::time::Duration::from_millis(ms),
            state.crashes_in_a_row
        ),
        (None, None) => "not running".to_string(),
    };
    let health = match (state.healthy, &state.probe_error) {
        (Some(true), _) => "healthy".to_string(),
        (Some(false), Some(e)) => format!("unhealthy: {}", one_line(e)),
        (Some(false), None) => "unhealthy".to_string(),
        (None, _) if state.pid.is_some() => "not probed yet".to_string(),
        (None, _) => String::new(),
    };
    let health = if health.is_empty() { health } else { format!(", {health}") };
    let mut version = state.version.as_deref().map(|v| format!(", {}", one_line(v))).unwrap_or_default();
    for (key, value) in &state.manifest {
        version.push_str(&format!(", {}: {}", one_line(key), one_line(value)));
    }
    let last =
        state.last_exit.as_deref().map(|e| format!("; last ended: {}", one_line(e))).unwrap_or_default();
    format!(
        "component {}: {running}, started {} time(s){health}{version}{last}\n",
        component.name, state.starts
    )
}

fn csi_node_lines(csi_node: &CSINode) -> String {
    let mut out = String::new();
    for driver in &csi_node.spec.drivers {
        let mut facts = vec![format!("node id {}", driver.node_id)];
        if let Some(keys) = driver.topology_keys.as_ref().filter(|k| !k.is_empty()) {
            facts.push(format!("topology keys {}", keys.join(", ")));
        }
        if let Some(count) = driver.allocatable.as_ref().and_then(|a| a.count) {
            facts.push(format!("at most {count} volumes"));
        }
        out.push_str(&format!("csi driver {}: {}\n", driver.name, facts.join("; ")));
    }
    let migrated = csi_node
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(kvol_api::keys::ANN_MIGRATED_PLUGINS))
        .filter(|v| !v.is_empty());
    if let Some(plugins) = migrated {
        out.push_str(&format!("migrated plugins: {}\n", plugins.replace(',', ", ")));
    }
    out
}

/// Appends `header` and `rows` as columns padded to their widest cell.
fn table<const N: usize>(out: &mut String, header: &[String; N], rows: &[[String; N]]) {
    let mut widths = header.clone().map(|h| h.chars().count());
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in std::iter::once(header).chain(rows) {
        let mut line = String::new();
        for (cell, width) in row.iter().zip(widths) {
            line.push_str(cell);
            line.push_str(&" ".repeat(width - cell.chars().count() + 2));
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

/// The cells of one node volume.
fn node_row(volume: &NodeVolumeStatus) -> [String; 5] {
    let mut phase = volume.phase.to_string();
    if let Some(progress) = &volume.progress {
        phase.push_str(&format!(": {progress}"));
    }
    let path = volume.staging_path.as_ref().map(|p| p.display().to_string());
    let location = match (volume.device_path.clone(), path) {
        (Some(device), Some(path)) => format!("{device} → {path}"),
        (Some(only), None) | (None, Some(only)) => only,
        (None, None) => "-".to_string(),
    };
    [
        volume.unique_name.clone(),
        volume.plugin.clone(),
        one_line(&phase),
        one_line(&location),
        volume.last_error.as_deref().map_or_else(|| "-".to_string(), one_line),
    ]
}

/// The cells of one volume: the phase with the operation under way, the device and the
/// deepest path it is mounted at, and the last error or else what it waits for.
fn row(volume: &VolumeStatus) -> [String; 6] {
    let mut phase = volume.phase.to_string();
    if volume.migrated {
        phase.push_str(" (migrated)");
    }
    if let Some(progress) = &volume.progress {
        phase.push_str(&format!(": {progress}"));
    }
    let path = volume.target.as_ref().or(volume.staging_path.as_ref()).map(|p| p.display().to_string());
    let location = match (volume.device_path.clone(), path) {
        (Some(device), Some(path)) => format!("{device} → {path}"),
        (Some(only), None) | (None, Some(only)) => only,
        (None, None) => "-".to_string(),
    };
    let error = volume.last_error.as_ref().or(volume.pending_reason.as_ref());
    [
        volume.pod.clone(),
        volume.volume.clone(),
        volume.plugin.clone().unwrap_or_else(|| "-".to_string()),
        one_line(&phase),
        one_line(&location),
        error.map_or_else(|| "-".to_string(), |e| one_line(e)),
    ]
}

/// A cell on one line.
fn one_line(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A duration in milliseconds as people read an age: `12s`, `5m`, `3h`, `2d`.
fn age(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..120 => format!("{s}s"),
        120..7200 => format!("{}m", s / 60),
        7200..172_800 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86_400),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn volume(pod: &str, name: &str, phase: Phase) -> VolumeStatus {
        VolumeStatus {
            pod: pod.into(),
            pod_uid: format!("uid-{name}"),
            volume: name.into(),
            plugin: None,
            phase,
            migrated: false,
            device_path: None,
            staging_path: None,
            target: None,
            last_error: None,
            pending_reason: None,
            progress: None,
        }
    }

    fn report(volumes: Vec<VolumeStatus>) -> StatusReport {
        StatusReport {
            node: "node-a".into(),
            pid: 4242,
            started_unix_ms: 1_000_000,
            updated_unix_ms: 1_100_000,
            metrics_address: None,
            volumes,
            problems: Vec::new(),
            plugins: Vec::new(),
            node_volumes: Vec::new(),
            csi_node: None,
            components: Vec::new(),
            snapshots: Vec::new(),
            claims: Vec::new(),
        }
    }

    #[test]
    fn phases_are_written_in_kebab_case_and_read_back() {
        let table = [
            (Phase::Pending, "pending"),
            (Phase::Attaching, "attaching"),
            (Phase::Attached, "attached"),
            (Phase::Staging, "staging"),
            (Phase::Staged, "staged"),
            (Phase::Publishing, "publishing"),
            (Phase::Published, "published"),
            (Phase::Uncertain, "uncertain"),
            (Phase::TearingDown, "tearing-down"),
            (Phase::Failed, "failed"),
            (Phase::Unused, "unused"),
        ];
        for (phase, name) in table {
            assert_eq!(serde_json::to_value(phase).unwrap(), serde_json::json!(name));
            assert_eq!(serde_json::from_value::<Phase>(serde_json::json!(name)).unwrap(), phase);
            assert_eq!(phase.to_string(), name);
        }
        assert!(serde_json::from_value::<Phase>(serde_json::json!("tearingDown")).is_err());
    }

    #[test]
    fn a_claim_line_shows_its_sizes_and_where_a_resize_stands() {
        let claim = |resize: Option<&str>, conditions: &[&str], allocated: Option<u64>| ClaimSizeStatus {
            name: "default/data".into(),
            volume: "pvc-1".into(),
            requested_bytes: Some(2 << 30),
            volume_bytes: Some(2 << 30),
            capacity_bytes: Some(1 << 30),
            allocated_bytes: allocated,
            resize_status: resize.map(String::from),
            conditions: conditions.iter().map(|c| c.to_string()).collect(),
        };
        let cases = [
            (
                claim(None, &["FileSystemResizePending"], None),
                "claim default/data: volume pvc-1, asks 2Gi, volume size 2Gi, capacity 1Gi, FileSystemResizePending\n",
            ),
            (
                claim(Some("NodeExpansionPending"), &["FileSystemResizePending"], Some(2 << 30)),
                "claim default/data: volume pvc-1, asks 2Gi, volume size 2Gi, capacity 1Gi, allocated 2Gi, resize NodeExpansionPending, FileSystemResizePending\n",
            ),
            (
                ClaimSizeStatus { capacity_bytes: None, ..claim(Some(""), &[], None) },
                "claim default/data: volume pvc-1, asks 2Gi, volume size 2Gi, capacity ?\n",
            ),
        ];
        for (claim, want) in cases {
            assert_eq!(claim_line(&claim), want);
            let mut r = report(Vec::new());
            r.claims = vec![claim];
            assert!(render(&r, 1_100_000, true).contains(want));
        }
    }

    #[test]
    fn the_report_is_camel_case_json() {
        let mut v = volume("default/web", "data", Phase::Published);
        v.pending_reason = Some("x".into());
        let mut r = report(vec![v]);
        r.metrics_address = Some("127.0.0.1:10256".into());
        let value = serde_json::to_value(&r).unwrap();
        assert_eq!(value["startedUnixMs"], 1_000_000);
        assert_eq!(value["updatedUnixMs"], 1_100_000);
        assert_eq!(value["metricsAddress"], "127.0.0.1:10256");
        assert_eq!(value["volumes"][0]["podUid"], "uid-data");
        assert_eq!(value["volumes"][0]["pendingReason"], "x");
        assert_eq!(value["volumes"][0]["phase"], "published");
        assert_eq!(serde_json::from_value::<StatusReport>(value).unwrap(), r);
    }

    #[test]
    fn rows_show_the_deepest_path_and_the_reason() {
        let mut staged = volume("default/db", "data", Phase::Staged);
        staged.plugin = Some("kubernetes.io/csi:ebs.csi.aws.com".into());
        staged.migrated = true;
        staged.device_path = Some("/dev/xvdf".into());
        staged.staging_path = Some("/var/lib/kvol/plugins/s".into());
        let mut published = staged.clone();
        published.phase = Phase::Published;
        published.migrated = false;
        published.device_path = None;
        published.target = Some("/var/lib/kvol/pods/u/volumes/v".into());
        let mut pending = volume("default/web", "claim", Phase::Pending);
        pending.pending_reason = Some("claim \"c\" is not bound".into());
        let mut failing = volume("ns/p", "v", Phase::Failed);
        failing.plugin = Some("kubernetes.io/nfs".into());
        failing.pending_reason = Some("ignored while there is an error".into());
        failing.last_error = Some("mount failed:\n  exit status 32".into());
        let mut busy = volume("ns/p", "w", Phase::Attaching);
        busy.progress = Some("waiting for the device".into());
        let table = [
            (
                staged,
                [
                    "default/db",
                    "data",
                    "kubernetes.io/csi:ebs.csi.aws.com",
                    "staged (migrated)",
                    "/dev/xvdf → /var/lib/kvol/plugins/s",
                    "-",
                ],
            ),
            (
                published,
                [
                    "default/db",
                    "data",
                    "kubernetes.io/csi:ebs.csi.aws.com",
                    "published",
                    "/var/lib/kvol/pods/u/volumes/v",
                    "-",
                ],
            ),
            (pending, ["default/web", "claim", "-", "pending", "-", "claim \"c\" is not bound"]),
            (failing, ["ns/p", "v", "kubernetes.io/nfs", "failed", "-", "mount failed: exit status 32"]),
            (busy, ["ns/p", "w", "-", "attaching: waiting for the device", "-", "-"]),
        ];
        for (volume, want) in table {
            assert_eq!(row(&volume), want.map(str::to_string), "{volume:?}");
        }
    }

    #[test]
    fn ages_read_as_people_read_them() {
        let table = [
            (0, "0s"),
            (999, "0s"),
            (59_000, "59s"),
            (119_999, "119s"),
            (120_000, "2m"),
            (7_199_000, "119m"),
            (7_200_000, "2h"),
            (172_800_000, "2d"),
        ];
        for (ms, want) in table {
            assert_eq!(age(ms), want, "{ms}");
        }
    }

    #[test]
    fn the_table_has_a_header_line_and_aligned_columns() {
        let mut v = volume("default/web", "data", Phase::Published);
        v.plugin = Some("kubernetes.io/empty-dir".into());
        v.target = Some("/r/pods/u/volumes/kubernetes.io~empty-dir/data".into());
        let mut r = report(vec![v, volume("default/web", "cache", Phase::Pending)]);
        r.metrics_address = Some("127.0.0.1:10256".into());
        r.plugins = vec!["kubernetes.io/empty-dir".into(), "kubernetes.io/nfs".into()];
        r.problems = vec!["pods.yaml document 2: no kind".into()];
        let text = render(&r, 1_103_000, true);
        let want = "\
node node-a, agent pid 4242, started 103s ago, updated 3s ago, metrics on 127.0.0.1:10256
plugins: kubernetes.io/empty-dir, kubernetes.io/nfs
problems:
  pods.yaml document 2: no kind

POD          VOLUME  PLUGIN                   PHASE      DEVICE/PATH                                     LAST ERROR
default/web  data    kubernetes.io/empty-dir  published  /r/pods/u/volumes/kubernetes.io~empty-dir/data  -
default/web  cache   -                        pending    -                                               -
";
        assert_eq!(text, want);
    }

    #[test]
    fn volumes_whose_pods_are_gone_show_in_the_node_table() {
        let mut r = report(Vec::new());
        r.node_volumes = vec![
            NodeVolumeStatus {
                unique_name: "vol-1".into(),
                plugin: "acme/disk".into(),
                phase: Phase::TearingDown,
                attached: true,
                device_path: Some("/dev/sdb".into()),
                staging_path: Some("/r/plugins/acme/mounts/vol-1".into()),
                last_error: None,
                progress: Some("unmount_device running for 1.0 s".into()),
            },
            NodeVolumeStatus {
                unique_name: "vol-2".into(),
                plugin: "acme/disk".into(),
                phase: Phase::Failed,
                attached: true,
                device_path: None,
                staging_path: None,
                last_error: Some("volume_detach failed 2 time(s): busy".into()),
                progress: None,
            },
        ];
        let text = render(&r, 1_100_000, true);
        let want = "\
node node-a, agent pid 4242, started 100s ago, updated 0s ago

no pod volumes

attached or staged on the node:
VOLUME  PLUGIN     PHASE                                           DEVICE/PATH                              LAST ERROR
vol-1   acme/disk  tearing-down: unmount_device running for 1.0 s  /dev/sdb → /r/plugins/acme/mounts/vol-1  -
vol-2   acme/disk  failed                                          -                                        volume_detach failed 2 time(s): busy
";
        assert_eq!(text, want);
    }

    #[test]
    fn the_csi_node_shows_a_line_per_driver_and_the_migrated_plugins() {
        let csi_node: CSINode = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "node-a",
                "annotations": {"storage.alpha.kubernetes.io/migrated-plugins": "kubernetes.io/aws-ebs,kubernetes.io/gce-pd"}
            },
            "spec": {"drivers": [
                {"name": "ebs.csi.aws.com", "nodeID": "i-0abc", "topologyKeys": ["topology.ebs.csi.aws.com/zone"], "allocatable": {"count": 25}},
                {"name": "hostpath.csi.kvol.io", "nodeID": "node-a"}
            ]}
        }))
        .unwrap();
        assert_eq!(
            csi_node_lines(&csi_node),
            "csi driver ebs.csi.aws.com: node id i-0abc; topology keys topology.ebs.csi.aws.com/zone; at most 25 volumes\n\
             csi driver hostpath.csi.kvol.io: node id node-a\n\
             migrated plugins: kubernetes.io/aws-ebs, kubernetes.io/gce-pd\n"
        );
        let mut r = report(Vec::new());
        r.csi_node = Some(csi_node);
        let back: StatusReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r, "the CSINode round-trips through status.json");
        assert!(render(&r, 1_100_000, true).contains("\ncsi driver hostpath.csi.kvol.io: node id node-a\n"));
    }

    #[test]
    fn a_dead_agent_and_an_empty_node_are_said_so() {
        let text = render(&report(Vec::new()), 1_100_000, false);
        assert_eq!(
            text,
            "node node-a, agent pid 4242, started 100s ago, updated 0s ago\n\
             warning: agent pid 4242 is not running: this status may be stale\n\
             \n\
             no pod volumes\n"
        );
        // A clock that went back shows no negative age.
        assert!(
            render(&report(Vec::new()), 0, true)
                .starts_with("node node-a, agent pid 4242, started 0s ago, updated 0s ago\n")
        );
    }

    #[test]
    fn component_processes_are_one_line_each() {
        use kvol_components_runtime::components::ComponentStatus;
        use kvol_components_runtime::supervisor::ProcessState;
        let rows = [
            (
                ProcessState {
                    pid: Some(77),
                    starts: 1,
                    healthy: Some(true),
                    version: Some("hostpath.csi.kvol.io 0.1.0".into()),
                    ..ProcessState::default()
                },
                "component hostpath: pid 77, started 1 time(s), healthy, hostpath.csi.kvol.io 0.1.0\n",
            ),
            (
                ProcessState {
                    pid: Some(79),
                    starts: 1,
                    healthy: Some(true),
                    version: Some("hostpath.csi.kvol.io 0.1.0".into()),
                    manifest: [(
                        "volume-backing".to_string(),
                        "directory (loop devices cannot be made here: /dev/loop-control: permission denied); \
                         volumes' sizes are not enforced"
                            .to_string(),
                    )]
                    .into(),
                    ..ProcessState::default()
                },
                "component hostpath: pid 79, started 1 time(s), healthy, hostpath.csi.kvol.io 0.1.0, \
                 volume-backing: directory (loop devices cannot be made here: /dev/loop-control: permission \
                 denied); volumes' sizes are not enforced\n",
            ),
            (
                ProcessState {
                    pid: Some(78),
                    starts: 2,
                    healthy: None,
                    last_exit: Some("the process signal: 9 (SIGKILL)".into()),
                    probe_error: None,
                    ..ProcessState::default()
                },
                "component hostpath: pid 78, started 2 time(s), not probed yet; last ended: the process signal: 9 (SIGKILL)\n",
            ),
            (
                ProcessState {
                    pid: None,
                    starts: 5,
                    healthy: Some(false),
                    last_exit: Some("the process exit status: 3".into()),
                    probe_error: Some("connection refused\nat csi.sock".into()),
                    ..ProcessState::default()
                },
                "component hostpath: not running, started 5 time(s), unhealthy: connection refused at csi.sock; last ended: the process exit status: 3\n",
            ),
            (
                ProcessState {
                    pid: None,
                    starts: 6,
                    last_exit: Some("the process signal: 9 (SIGKILL)".into()),
                    crashes_in_a_row: 4,
                    restart_backoff_ms: Some(4_000),
                    ..ProcessState::default()
                },
                "component hostpath: not running, restarting after a back-off of 4s (4 crash(es) in a row), started 6 time(s); last ended: the process signal: 9 (SIGKILL)\n",
            ),
        ];
        for (state, want) in rows {
            let mut r = report(Vec::new());
            r.components = vec![ComponentStatus { name: "hostpath".into(), state }];
            let text = render(&r, 1_100_000, true);
            assert!(text.contains(want), "{text}");
        }
    }

    #[test]
    fn liveness_is_read_from_proc() {
        let mut r = report(Vec::new());
        r.pid = std::process::id();
        assert!(!render_table(&r, 1_100_000).contains("stale"));
        // Above any pid_max Linux allows (2^22).
        r.pid = 1 << 23;
        assert!(render_table(&r, 1_100_000).contains("agent pid 8388608 is not running"));
        assert!(!pid_alive(0));
    }

    #[test]
    fn a_written_report_is_read_back_and_replaces_the_last() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kvol");
        let mut r = report(vec![volume("default/web", "data", Phase::Staging)]);
        // Later than the file's modification time, so the report's own time is read back.
        let now_ms =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        r.updated_unix_ms = now_ms + 60_000;
        write_status(&root, &r).unwrap();
        assert_eq!(read_status(&root).unwrap(), r);
        r.volumes[0].phase = Phase::Published;
        write_status(&root, &r).unwrap();
        assert_eq!(read_status(&root).unwrap(), r);
        let names: Vec<_> = fs::read_dir(&root).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(names, ["status.json"], "no temporary file is left");
    }

    #[test]
    fn a_touched_status_reads_as_updated_then() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("kvol");
        let r = report(Vec::new());
        write_status(&root, &r).unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_millis(r.updated_unix_ms);
        fs::File::options().write(true).open(status_path(&root)).unwrap().set_modified(old).unwrap();
        assert_eq!(read_status(&root).unwrap().updated_unix_ms, r.updated_unix_ms, "the report's own time");
        let before =
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        touch_status(&root).unwrap();
        let read = read_status(&root).unwrap();
        assert!(read.updated_unix_ms >= before, "{} < {before}", read.updated_unix_ms);
        assert_eq!(StatusReport { updated_unix_ms: r.updated_unix_ms, ..read }, r, "nothing else changes");
    }

    #[test]
    fn a_missing_or_corrupt_status_is_a_clear_message() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        let err = read_status(root).unwrap_err();
        assert_eq!(
            err,
            format!(
                "no status at {}/status.json: is the agent running with --state-dir {}?",
                root.display(),
                root.display()
            )
        );
        fs::write(status_path(root), "{\"node\": \"a\"").unwrap();
        let err = read_status(root).unwrap_err();
        assert!(
            err.starts_with(&format!("the status at {}/status.json is corrupt: ", root.display())),
            "{err}"
        );
    }
}
