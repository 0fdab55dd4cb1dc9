//! The agent's Prometheus metrics, named and labelled as kubelet's, and the HTTP endpoint that serves them.
//!
//! | metric | labels | from |
//! |---|---|---|
//! | `storage_operation_duration_seconds` (histogram) | `migrated`, `operation_name`, `status`, `volume_plugin` | kubelet `pkg/volume/util/metrics.go`; `status` is `success` or `fail-unknown` |
//! | `csi_operations_seconds` (histogram) | `driver_name`, `grpc_status_code`, `method_name`, `migrated` | the same file, fed by kubelet's gRPC interceptor (`pkg/volume/csi/csi_metrics.go`): the full gRPC method and grpc-go's name of the code |
//! | `volume_manager_total_volumes` (gauge) | `plugin_name`, `state` (`desired_state_of_world`, `actual_state_of_world`) | kubelet `pkg/kubelet/volumemanager/metrics/metrics.go`: volumes to mount (plugin `N/A` when none resolves) and volumes mounted |
//! | `kubelet_volume_stats_capacity_bytes`, `_available_bytes`, `_used_bytes`, `_inodes`, `_inodes_free`, `_inodes_used` (gauges) | `namespace`, `persistentvolumeclaim` | kubelet `pkg/kubelet/metrics/collectors/volume_stats.go`: each claim's published volume as last measured ([`crate::report::volume_stats`]) |
//! | `kubelet_volume_stats_health_status_abnormal` (gauge) | `namespace`, `persistentvolumeclaim` | the same file: 1 when the CSI driver's volume condition says abnormal, 0 when it says healthy; absent when the driver reports no condition |
//! | `kvol_volumes` (gauge) | `state` (`published`, `pending`, `failing`) | kvol's own |
//!
//! Both histograms have kubelet's buckets. Labels are declared in the order kubelet's Go
//! client prints them (by name); only a bucket's `le` comes first rather than last.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use kvol_plugin::VolumeSpec;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tonic::Code;

use crate::model::{DesiredState, PodVolumeKey, PublishedVolume};
use crate::reconciler::Resolutions;
use kvol_plugin::plugin::VolumeStats;

/// A claim by namespace and name: the labels of its stats.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ClaimRef {
    pub namespace: String,
    pub name: String,
}

/// kubelet's buckets of both operation histograms, in seconds.
pub const BUCKETS: [f64; 13] = [0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0];

/// The content type of the OpenMetrics text `encode` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// kubelet's `status` label of a finished operation.
pub const STATUS_SUCCESS: &str = "success";
/// kubelet's `status` label of a failed operation (it tells no failure from another).
pub const STATUS_FAIL_UNKNOWN: &str = "fail-unknown";

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OperationLabels {
    migrated: &'static str,
    operation_name: String,
    status: &'static str,
    volume_plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CsiLabels {
    driver_name: String,
    grpc_status_code: &'static str,
    method_name: String,
    migrated: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct TotalVolumesLabels {
    plugin_name: String,
    state: &'static str,
}

/// kubelet's `state` of volumes the pods want mounted.
pub const DESIRED_STATE: &str = "desired_state_of_world";
/// kubelet's `state` of volumes mounted.
pub const ACTUAL_STATE: &str = "actual_state_of_world";
/// kubelet's `plugin_name` of a wanted volume no plugin serves.
pub const PLUGIN_NOT_AVAILABLE: &str = "N/A";

#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ClaimLabels {
    namespace: String,
    persistentvolumeclaim: String,
}

impl ClaimLabels {
    fn of(claim: &ClaimRef) -> ClaimLabels {
        ClaimLabels { namespace: claim.namespace.clone(), persistentvolumeclaim: claim.name.clone() }
    }
}

/// One gauge family per field of [`VolumeStats`], in the order of [`VOLUME_STATS`].
type StatsFamilies = [Family<ClaimLabels, Gauge>; 7];

/// A gauge's name, help, and the field of [`VolumeStats`] it shows.
type StatsGauge = (&'static str, &'static str, fn(&VolumeStats) -> Option<u64>);

/// kubelet's volume stats gauges.
const VOLUME_STATS: [StatsGauge; 7] = [
    ("kubelet_volume_stats_capacity_bytes", "Capacity of the volume in bytes", |s| s.capacity_bytes),
    ("kubelet_volume_stats_available_bytes", "Bytes still available in the volume", |s| s.available_bytes),
    ("kubelet_volume_stats_used_bytes", "Bytes used in the volume", |s| s.used_bytes),
    ("kubelet_volume_stats_inodes", "Inodes the volume can hold", |s| s.inodes),
    ("kubelet_volume_stats_inodes_free", "Inodes still free in the volume", |s| s.inodes_free),
    ("kubelet_volume_stats_inodes_used", "Inodes used in the volume", |s| s.inodes_used),
    (
        "kubelet_volume_stats_health_status_abnormal",
        "Whether the volume's driver reports it abnormal: 1 abnormal, 0 healthy",
        |s| s.abnormal.map(u64::from),
    ),
];

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VolumeLabels {
    state: &'static str,
}

type HistogramFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn kubelet_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// The agent's metrics. Shared by the executor, the CSI clients and the endpoint.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    operations: HistogramFamily<OperationLabels>,
    csi: HistogramFamily<CsiLabels>,
    volumes: Family<VolumeLabels, Gauge>,
    total_volumes: Family<TotalVolumesLabels, Gauge>,
    /// The `total_volumes` series last set, so those gone are removed.
    total_keys: std::sync::Mutex<std::collections::BTreeSet<TotalVolumesLabels>>,
    volume_stats: StatsFamilies,
    /// The claims whose stats are set, so those gone are removed.
    stats_keys: std::sync::Mutex<std::collections::BTreeSet<ClaimRef>>,
}

impl Metrics {
    /// All metrics registered, none observed yet.
    pub fn new() -> Arc<Metrics> {
        let mut registry = Registry::default();
        let operations: HistogramFamily<OperationLabels> = Family::new_with_constructor(kubelet_histogram);
        let csi: HistogramFamily<CsiLabels> = Family::new_with_constructor(kubelet_histogram);
        let volumes = Family::<VolumeLabels, Gauge>::default();
        registry.register(
            "storage_operation_duration_seconds",
            "Storage operation duration",
            operations.clone(),
        );
        registry.register(
            "csi_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            csi.clone(),
        );
        registry.register("kvol_volumes", "Pod volumes of this node by state", volumes.clone());
        let total_volumes = Family::<TotalVolumesLabels, Gauge>::default();
        registry.register(
            "volume_manager_total_volumes",
            "Number of volumes in Volume Manager",
            total_volumes.clone(),
        );
        let volume_stats: StatsFamilies = Default::default();
        for ((name, help, _), family) in VOLUME_STATS.iter().zip(&volume_stats) {
            registry.register(*name, *help, family.clone());
        }
        Arc::new(Metrics {
            registry,
            operations,
            csi,
            volumes,
            total_volumes,
            total_keys: Default::default(),
            volume_stats,
            stats_keys: Default::default(),
        })
    }

    /// One finished volume operation: `operation` is kubelet's name (`volume_attach`,
    /// `mount_device`, `volume_mount`, `volume_unmount`, `unmount_device`, `volume_detach`),
    /// `plugin` the plugin's name as kubelet gives it (`kubernetes.io/csi:<driver>` for CSI).
    pub fn observe_operation(
        &self,
        operation: &str,
        plugin: &str,
        ok: bool,
        migrated: bool,
        elapsed: Duration,
    ) {
        let labels = OperationLabels {
            migrated: bool_label(migrated),
            operation_name: operation.to_string(),
            status: if ok { STATUS_SUCCESS } else { STATUS_FAIL_UNKNOWN },
            volume_plugin: plugin.to_string(),
        };
        self.operations.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }

    /// How many pod volumes are published, pending (waiting for something, or being set up)
    /// and failing (their last operation failed).
    pub fn set_volumes(&self, published: i64, pending: i64, failing: i64) {
        for (state, count) in [("published", published), ("pending", pending), ("failing", failing)] {
            self.volumes.get_or_create(&VolumeLabels { state }).set(count);
        }
    }

    /// `volume_manager_total_volumes`: `(state, plugin_name)` → volumes, as [`total_volumes`]
    /// counts them; series no longer counted are removed.
    pub fn set_total_volumes(&self, counts: &BTreeMap<(&'static str, String), i64>) {
        let mut keys = self.total_keys.lock().unwrap_or_else(|e| e.into_inner());
        let now: std::collections::BTreeSet<TotalVolumesLabels> = counts
            .iter()
            .map(|((state, plugin), count)| {
                let labels = TotalVolumesLabels { plugin_name: plugin.clone(), state };
                self.total_volumes.get_or_create(&labels).set(*count);
                labels
            })
            .collect();
        for gone in keys.difference(&now) {
            self.total_volumes.remove(gone);
        }
        *keys = now;
    }

    /// The `kubelet_volume_stats_*` gauges: each claim measured gets what its stats tell (a
    /// field not told has no series); claims not in `measured` lose theirs.
    pub fn set_volume_stats(&self, measured: &BTreeMap<ClaimRef, VolumeStats>) {
        let mut keys = self.stats_keys.lock().unwrap_or_else(|e| e.into_inner());
        for gone in keys.iter().filter(|claim| !measured.contains_key(claim)) {
            self.remove_stats(&ClaimLabels::of(gone));
        }
        for (claim, stats) in measured {
            let labels = ClaimLabels::of(claim);
            for ((_, _, field), family) in VOLUME_STATS.iter().zip(&self.volume_stats) {
                match field(stats) {
                    Some(value) => {
                        family.get_or_create(&labels).set(i64::try_from(value).unwrap_or(i64::MAX));
                    }
                    None => {
                        family.remove(&labels);
                    }
                }
            }
        }
        *keys = measured.keys().cloned().collect();
    }

    /// Drops the volume stats of every claim `keep` says no to (its volume is no longer
    /// published), without waiting for the next measuring.
    pub fn keep_volume_stats(&self, keep: impl Fn(&ClaimRef) -> bool) {
        let mut keys = self.stats_keys.lock().unwrap_or_else(|e| e.into_inner());
        keys.retain(|claim| {
            let kept = keep(claim);
            if !kept {
                self.remove_stats(&ClaimLabels::of(claim));
            }
            kept
        });
    }

    fn remove_stats(&self, labels: &ClaimLabels) {
        for family in &self.volume_stats {
            family.remove(labels);
        }
    }

    /// Every metric in the OpenMetrics text format, ending in `# EOF`.
    pub fn encode(&self) -> String {
        let mut text = String::new();
        if let Err(e) = encode(&mut text, &self.registry) {
            tracing::warn!(error = %e, "cannot encode the metrics");
        }
        text
    }
}

impl kvol_csi::client::RpcObserver for Metrics {
    fn observe(&self, driver: &str, method: &str, code: Code, elapsed: Duration) {
        let labels = CsiLabels {
            driver_name: driver.to_string(),
            grpc_status_code: grpc_code_name(code),
            method_name: method.to_string(),
            migrated: bool_label(kvol_csi::client::call_is_migrated()),
        };
        self.csi.get_or_create(&labels).observe(elapsed.as_secs_f64());
    }
}

/// The plugin CSI volumes are filed under, as kubelet names it in `volume_plugin`.
const CSI_PLUGIN: &str = "kubernetes.io/csi";

/// kubelet's `volume_plugin` label: `kubernetes.io/csi:<driver>` for a CSI volume (also one
/// migrated to its CSI driver, whose plugin is that driver), the plugin's name otherwise
/// (`kubernetes.io/empty-dir`, a Flexvolume driver's `vendor/driver`).
pub fn volume_plugin_label(plugin: &str, served_by_csi: bool) -> String {
    if served_by_csi { format!("{CSI_PLUGIN}:{plugin}") } else { plugin.to_string() }
}

/// [`volume_plugin_label`] of a volume `plugin` serves with `spec` (CSI when the spec has a
/// CSI source or was migrated to one).
pub fn spec_plugin_label(plugin: &str, spec: &VolumeSpec) -> String {
    volume_plugin_label(plugin, spec.csi_driver().is_some() || spec.migrated.is_some())
}

/// kubelet's volume manager counts: every wanted volume with a spec (`desired_state_of_world`,
/// under its resolved plugin or `N/A`) and every published one (`actual_state_of_world`) but
/// the uncertain ones, which kubelet does not count as mounted.
pub fn total_volumes(
    desired: &DesiredState,
    resolutions: &Resolutions,
    published: &BTreeMap<PodVolumeKey, PublishedVolume>,
) -> BTreeMap<(&'static str, String), i64> {
    let mut counts = BTreeMap::new();
    for (key, wanted) in &desired.volumes {
        if wanted.spec.is_none() {
            continue;
        }
        let plugin = match resolutions.get(key) {
            Some(Ok(r)) => spec_plugin_label(&r.plugin, &r.spec),
            _ => PLUGIN_NOT_AVAILABLE.to_string(),
        };
        *counts.entry((DESIRED_STATE, plugin)).or_insert(0) += 1;
    }
    // As kubelet's actual state of world counts: mounted volumes, not uncertain ones.
    for p in published.values().filter(|p| !p.uncertain) {
        *counts.entry((ACTUAL_STATE, spec_plugin_label(&p.plugin, &p.spec))).or_insert(0) += 1;
    }
    counts
}

/// A boolean label as Go's `strconv.FormatBool` writes it.
fn bool_label(value: bool) -> &'static str {
    if value { "true" } else { "false" }
}

/// A gRPC code as grpc-go names it (`codes.Code.String()`), which kubelet puts in
/// `grpc_status_code`; note `Canceled`, not tonic's `Cancelled`.
pub fn grpc_code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "Canceled",
        Code::Unknown => "Unknown",
        Code::InvalidArgument => "InvalidArgument",
        Code::DeadlineExceeded => "DeadlineExceeded",
        Code::NotFound => "NotFound",
        Code::AlreadyExists => "AlreadyExists",
        Code::PermissionDenied => "PermissionDenied",
        Code::ResourceExhausted => "ResourceExhausted",
        Code::FailedPrecondition => "FailedPrecondition",
        Code::Aborted => "Aborted",
        Code::OutOfRange => "OutOfRange",
        Code::Unimplemented => "Unimplemented",
        Code::Internal => "Internal",
        Code::Unavailable => "Unavailable",
        Code::DataLoss => "DataLoss",
        Code::Unauthenticated => "Unauthenticated",
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes; every other path is 404.
pub async fn serve_metrics(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let metrics = Arc::clone(&metrics);
                async move { ([(header::CONTENT_TYPE, CONTENT_TYPE)], metrics.encode()) }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "not found: kvol serves /metrics\n").into_response() });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uncertain_volumes_are_not_counted_as_mounted() {
        let volume = serde_json::from_value(serde_json::json!({"name": "v", "emptyDir": {}})).unwrap();
        let spec = VolumeSpec::inline(volume, "default");
        let record = |pod: &str, uncertain: bool| PublishedVolume {
            projection: None,
            fs_size: None,
            expansion_deferred: None,
            key: PodVolumeKey { pod_uid: pod.into(), volume: "v".into() },
            pod: kvol_plugin::plugin::PodInfo::default(),
            pod_name: format!("default/{pod}"),
            unique_name: format!("kubernetes.io/empty-dir/{pod}-v"),
            plugin: "kubernetes.io/empty-dir".into(),
            spec: spec.clone(),
            target: format!("/pods/{pod}/v").into(),
            staging_path: None,
            device_path: None,
            uncertain,
        };
        let published: BTreeMap<PodVolumeKey, PublishedVolume> =
            [record("a", false), record("b", true)].into_iter().map(|p| (p.key.clone(), p)).collect();
        let counts = total_volumes(&DesiredState::default(), &Resolutions::new(), &published);
        assert_eq!(
            counts.get(&(ACTUAL_STATE, "kubernetes.io/empty-dir".to_string())),
            Some(&1),
            "{counts:?}"
        );
    }

    #[test]
    fn volume_plugin_labels_are_kubelets() {
        let table = [
            ("hostpath.csi.kvol.io", true, "kubernetes.io/csi:hostpath.csi.kvol.io"),
            ("pd.csi.storage.gke.io", true, "kubernetes.io/csi:pd.csi.storage.gke.io"),
            ("kubernetes.io/empty-dir", false, "kubernetes.io/empty-dir"),
            ("kubernetes.io/local-volume", false, "kubernetes.io/local-volume"),
            ("kvol/tmpfs", false, "kvol/tmpfs"),
        ];
        for (plugin, csi, want) in table {
            assert_eq!(volume_plugin_label(plugin, csi), want, "{plugin}");
        }
    }
    use kvol_csi::client::RpcObserver;

    /// The sample lines of `text` whose name is `name` (buckets, sum, count or the value).
    fn samples<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.starts_with(name) && !l.starts_with('#')).collect()
    }

    /// The samples of exactly the metric `name` (not of others it is a prefix of).
    fn series<'a>(text: &'a str, name: &str) -> Vec<&'a str> {
        text.lines().filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{'))).collect()
    }

    #[test]
    fn grpc_codes_are_named_as_grpc_go_names_them() {
        let table = [
            (Code::Ok, "OK"),
            (Code::Cancelled, "Canceled"),
            (Code::Unknown, "Unknown"),
            (Code::InvalidArgument, "InvalidArgument"),
            (Code::DeadlineExceeded, "DeadlineExceeded"),
            (Code::NotFound, "NotFound"),
            (Code::AlreadyExists, "AlreadyExists"),
            (Code::PermissionDenied, "PermissionDenied"),
            (Code::ResourceExhausted, "ResourceExhausted"),
            (Code::FailedPrecondition, "FailedPrecondition"),
            (Code::Aborted, "Aborted"),
            (Code::OutOfRange, "OutOfRange"),
            (Code::Unimplemented, "Unimplemented"),
            (Code::Internal, "Internal"),
            (Code::Unavailable, "Unavailable"),
            (Code::DataLoss, "DataLoss"),
            (Code::Unauthenticated, "Unauthenticated"),
        ];
        for (code, name) in table {
            assert_eq!(grpc_code_name(code), name, "{code:?}");
        }
    }

    #[test]
    fn operations_are_labelled_as_kubelet_labels_them() {
        let table = [
            (
                ("volume_mount", "kubernetes.io/csi:hostpath.csi.kvol.io", true, false),
                r#"{migrated="false",operation_name="volume_mount",status="success",volume_plugin="kubernetes.io/csi:hostpath.csi.kvol.io"}"#,
            ),
            (
                ("mount_device", "kubernetes.io/csi:ebs.csi.aws.com", false, true),
                r#"{migrated="true",operation_name="mount_device",status="fail-unknown",volume_plugin="kubernetes.io/csi:ebs.csi.aws.com"}"#,
            ),
            (
                ("volume_detach", "kubernetes.io/nfs", false, false),
                r#"{migrated="false",operation_name="volume_detach",status="fail-unknown",volume_plugin="kubernetes.io/nfs"}"#,
            ),
        ];
        for ((operation, plugin, ok, migrated), labels) in table {
            let metrics = Metrics::new();
            metrics.observe_operation(operation, plugin, ok, migrated, Duration::from_millis(300));
            let text = metrics.encode();
            let count = format!("storage_operation_duration_seconds_count{labels} 1");
            assert!(text.lines().any(|l| l == count), "no {count} in\n{text}");
        }
    }

    #[test]
    fn an_operation_falls_in_kubelets_buckets() {
        let metrics = Metrics::new();
        let labels = r#"migrated="false",operation_name="volume_attach",status="success",volume_plugin="p""#;
        for ms in [50, 300, 300, 7000, 700_000] {
            metrics.observe_operation("volume_attach", "p", true, false, Duration::from_millis(ms));
        }
        let text = metrics.encode();
        let buckets = samples(&text, "storage_operation_duration_seconds_bucket");
        let want: Vec<String> = [
            ("0.1", 1),
            ("0.25", 1),
            ("0.5", 3),
            ("1.0", 3),
            ("2.5", 3),
            ("5.0", 3),
            ("10.0", 4),
            ("15.0", 4),
            ("25.0", 4),
            ("50.0", 4),
            ("120.0", 4),
            ("300.0", 4),
            ("600.0", 4),
            ("+Inf", 5),
        ]
        .iter()
        .map(|(le, n)| format!("storage_operation_duration_seconds_bucket{{le=\"{le}\",{labels}}} {n}"))
        .collect();
        assert_eq!(buckets, want, "\n{text}");
        assert!(
            text.contains(&format!("storage_operation_duration_seconds_sum{{{labels}}} 707.65\n")),
            "{text}"
        );
    }

    #[test]
    fn csi_calls_are_labelled_as_kubelets_interceptor_labels_them() {
        let metrics = Metrics::new();
        let driver = "hostpath.csi.kvol.io";
        metrics.observe(driver, "/csi.v1.Node/NodePublishVolume", Code::Ok, Duration::from_millis(20));
        metrics.observe(driver, "/csi.v1.Node/NodePublishVolume", Code::Cancelled, Duration::from_millis(20));
        let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
        runtime.block_on(kvol_csi::client::with_migrated(true, async {
            metrics.observe(driver, "/csi.v1.Node/NodeStageVolume", Code::Ok, Duration::from_millis(20));
        }));
        let text = metrics.encode();
        for labels in [
            r#"driver_name="hostpath.csi.kvol.io",grpc_status_code="OK",method_name="/csi.v1.Node/NodePublishVolume",migrated="false""#,
            r#"driver_name="hostpath.csi.kvol.io",grpc_status_code="Canceled",method_name="/csi.v1.Node/NodePublishVolume",migrated="false""#,
            r#"driver_name="hostpath.csi.kvol.io",grpc_status_code="OK",method_name="/csi.v1.Node/NodeStageVolume",migrated="true""#,
        ] {
            let count = format!("csi_operations_seconds_count{{{labels}}} 1");
            assert!(text.lines().any(|l| l == count), "no {count} in\n{text}");
        }
        assert_eq!(samples(&text, "csi_operations_seconds_count").len(), 3, "{text}");
    }

    #[test]
    fn volume_stats_are_labelled_by_claim_and_follow_the_last_measuring() {
        let metrics = Metrics::new();
        let claim = |name: &str| ClaimRef { namespace: "ns".into(), name: name.into() };
        let full = VolumeStats {
            capacity_bytes: Some(1000),
            available_bytes: Some(600),
            used_bytes: Some(400),
            inodes: Some(10),
            inodes_free: Some(7),
            inodes_used: Some(3),
            abnormal: Some(true),
        };
        let bytes_only = VolumeStats {
            capacity_bytes: Some(50),
            available_bytes: Some(50),
            used_bytes: Some(0),
            ..VolumeStats::default()
        };
        metrics.set_volume_stats(&BTreeMap::from([(claim("a"), full), (claim("b"), bytes_only)]));
        let text = metrics.encode();
        for line in [
            r#"kubelet_volume_stats_capacity_bytes{namespace="ns",persistentvolumeclaim="a"} 1000"#,
            r#"kubelet_volume_stats_available_bytes{namespace="ns",persistentvolumeclaim="a"} 600"#,
            r#"kubelet_volume_stats_used_bytes{namespace="ns",persistentvolumeclaim="a"} 400"#,
            r#"kubelet_volume_stats_inodes{namespace="ns",persistentvolumeclaim="a"} 10"#,
            r#"kubelet_volume_stats_inodes_free{namespace="ns",persistentvolumeclaim="a"} 7"#,
            r#"kubelet_volume_stats_inodes_used{namespace="ns",persistentvolumeclaim="a"} 3"#,
            r#"kubelet_volume_stats_health_status_abnormal{namespace="ns",persistentvolumeclaim="a"} 1"#,
            r#"kubelet_volume_stats_capacity_bytes{namespace="ns",persistentvolumeclaim="b"} 50"#,
        ] {
            assert!(text.lines().any(|l| l == line), "{line} missing from\n{text}");
        }
        // What b's driver does not report has no series.
        assert_eq!(series(&text, "kubelet_volume_stats_inodes").len(), 1, "{text}");
        assert_eq!(series(&text, "kubelet_volume_stats_health_status_abnormal").len(), 1, "{text}");

        // b measured again alone: a's series go; b no longer published: all go.
        metrics.set_volume_stats(&BTreeMap::from([(claim("b"), bytes_only)]));
        let text = metrics.encode();
        assert_eq!(series(&text, "kubelet_volume_stats_capacity_bytes").len(), 1, "{text}");
        assert!(series(&text, "kubelet_volume_stats_inodes").is_empty(), "{text}");
        metrics.keep_volume_stats(|c| c.name != "b");
        assert!(series(&metrics.encode(), "kubelet_volume_stats_capacity_bytes").is_empty());
    }

    #[test]
    fn volume_gauges_are_set_not_added() {
        let metrics = Metrics::new();
        metrics.set_volumes(5, 2, 1);
        metrics.set_volumes(3, 0, 1);
        let text = metrics.encode();
        // Series come in no set order.
        let mut gauges = samples(&text, "kvol_volumes");
        gauges.sort();
        assert_eq!(
            gauges,
            [
                r#"kvol_volumes{state="failing"} 1"#,
                r#"kvol_volumes{state="pending"} 0"#,
                r#"kvol_volumes{state="published"} 3"#,
            ]
        );
    }

    #[test]
    fn the_text_declares_every_metric_and_ends_in_eof() {
        let metrics = Metrics::new();
        metrics.set_volumes(0, 0, 0);
        metrics.observe_operation("volume_mount", "p", true, false, Duration::ZERO);
        metrics.observe("d", "/csi.v1.Identity/Probe", Code::Ok, Duration::ZERO);
        let text = metrics.encode();
        for declaration in [
            "# TYPE storage_operation_duration_seconds histogram",
            "# TYPE csi_operations_seconds histogram",
            "# TYPE kvol_volumes gauge",
        ] {
            assert!(text.lines().any(|l| l == declaration), "no {declaration} in\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
