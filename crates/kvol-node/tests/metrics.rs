//! The metrics endpoint over real HTTP: kubelet's metric names, labels and buckets in a scrape, 404 elsewhere, shutdown; and CSI calls of a registered driver reaching the metrics.

use std::sync::Arc;
use std::time::Duration;

use kvol_api::FeatureGates;
use kvol_csi::client::RpcObserver;
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, RegistrationHandler, Timeouts};
use kvol_hostpath::{HostpathConfig, HostpathDriver};
use kvol_node::report::metrics::{Metrics, serve_metrics};
use kvol_plugin::{NodeInfo, NodePaths, PluginHost, PluginRegistry, RecordingMounter};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// One answer: the status code, the headers (lower-case names) and the body.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }
}

/// `GET path` over a fresh connection, as a plain HTTP/1.1 client would send it.
async fn get(address: std::net::SocketAddr, path: &str) -> Answer {
    let mut stream = TcpStream::connect(address).await.unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut raw)).await.unwrap().unwrap();
    let raw = String::from_utf8(raw).unwrap();
    let (head, body) = raw.split_once("\r\n\r\n").expect("a head and a body");
    let mut lines = head.split("\r\n");
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .map(|l| {
            let (name, value) = l.split_once(':').unwrap();
            (name.trim().to_lowercase(), value.trim().to_string())
        })
        .collect();
    Answer { status, headers, body: body.to_string() }
}

fn started(
    metrics: &Arc<Metrics>,
    listener: TcpListener,
) -> (oneshot::Sender<()>, tokio::task::JoinHandle<()>) {
    let (stop, stopped) = oneshot::channel::<()>();
    let shutdown = async {
        let _ = stopped.await;
    };
    let server = tokio::spawn(serve_metrics(listener, Arc::clone(metrics), shutdown));
    let task = tokio::spawn(async move { server.await.unwrap().unwrap() });
    (stop, task)
}

#[tokio::test]
async fn a_scrape_has_kubelets_names_labels_and_buckets() {
    let metrics = Metrics::new();
    metrics.observe_operation(
        "volume_mount",
        "kubernetes.io/csi:hostpath.csi.kvol.io",
        true,
        false,
        Duration::from_millis(40),
    );
    metrics.observe_operation(
        "volume_mount",
        "kubernetes.io/csi:hostpath.csi.kvol.io",
        true,
        false,
        Duration::from_secs(3),
    );
    metrics.observe_operation(
        "mount_device",
        "kubernetes.io/csi:ebs.csi.aws.com",
        false,
        true,
        Duration::from_secs(20),
    );
    metrics.observe(
        "hostpath.csi.kvol.io",
        "/csi.v1.Node/NodePublishVolume",
        tonic::Code::Ok,
        Duration::from_millis(30),
    );
    metrics.observe(
        "hostpath.csi.kvol.io",
        "/csi.v1.Node/NodeStageVolume",
        tonic::Code::DeadlineExceeded,
        Duration::from_secs(120),
    );
    metrics.set_volumes(4, 1, 2);

    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, server) = started(&metrics, listener);

    let answer = get(address, "/metrics").await;
    assert_eq!(answer.status, 200, "{}", answer.body);
    assert_eq!(
        answer.header("content-type"),
        Some("application/openmetrics-text; version=1.0.0; charset=utf-8")
    );
    let body = answer.body;
    let lines: Vec<&str> = body.lines().collect();
    let has = |line: &str| assert!(lines.contains(&line), "no line {line:?} in\n{body}");

    has("# TYPE storage_operation_duration_seconds histogram");
    has("# TYPE csi_operations_seconds histogram");
    has("# TYPE kvol_volumes gauge");

    let mount = r#"migrated="false",operation_name="volume_mount",status="success",volume_plugin="kubernetes.io/csi:hostpath.csi.kvol.io""#;
    has(&format!("storage_operation_duration_seconds_count{{{mount}}} 2"));
    has(&format!(r#"storage_operation_duration_seconds_bucket{{le="0.1",{mount}}} 1"#));
    has(&format!(r#"storage_operation_duration_seconds_bucket{{le="2.5",{mount}}} 1"#));
    has(&format!(r#"storage_operation_duration_seconds_bucket{{le="5.0",{mount}}} 2"#));
    let failed = r#"migrated="true",operation_name="mount_device",status="fail-unknown",volume_plugin="kubernetes.io/csi:ebs.csi.aws.com""#;
    has(&format!(r#"storage_operation_duration_seconds_bucket{{le="15.0",{failed}}} 0"#));
    has(&format!(r#"storage_operation_duration_seconds_bucket{{le="25.0",{failed}}} 1"#));
    has(&format!(r#"storage_operation_duration_seconds_bucket{{le="+Inf",{failed}}} 1"#));

    let publish = r#"driver_name="hostpath.csi.kvol.io",grpc_status_code="OK",method_name="/csi.v1.Node/NodePublishVolume",migrated="false""#;
    has(&format!("csi_operations_seconds_count{{{publish}}} 1"));
    has(&format!(r#"csi_operations_seconds_bucket{{le="0.1",{publish}}} 1"#));
    let stage = r#"driver_name="hostpath.csi.kvol.io",grpc_status_code="DeadlineExceeded",method_name="/csi.v1.Node/NodeStageVolume",migrated="false""#;
    has(&format!(r#"csi_operations_seconds_bucket{{le="50.0",{stage}}} 0"#));
    has(&format!(r#"csi_operations_seconds_bucket{{le="120.0",{stage}}} 1"#));

    has(r#"kvol_volumes{state="published"} 4"#);
    has(r#"kvol_volumes{state="pending"} 1"#);
    has(r#"kvol_volumes{state="failing"} 2"#);
    assert_eq!(lines.last(), Some(&"# EOF"));

    // A later scrape sees later observations.
    metrics.set_volumes(5, 0, 2);
    let again = get(address, "/metrics").await;
    assert!(again.body.lines().any(|l| l == r#"kvol_volumes{state="published"} 5"#), "{}", again.body);

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the server stops").unwrap();
}

#[tokio::test]
async fn other_paths_are_not_found_and_shutdown_stops_the_server() {
    let metrics = Metrics::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let (stop, server) = started(&metrics, listener);

    for path in ["/", "/metricsx", "/healthz", "/metrics/extra"] {
        let answer = get(address, path).await;
        assert_eq!(answer.status, 404, "{path}: {}", answer.body);
        assert!(answer.body.contains("kvol serves /metrics"), "{path}: {}", answer.body);
    }
    assert!(!server.is_finished());

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), server).await.expect("the server stops").unwrap();
    assert!(TcpStream::connect(address).await.is_err(), "nothing listens after shutdown");
}

#[tokio::test]
async fn calls_of_a_driver_the_handler_registers_reach_the_metrics() {
    let dir = kvol_test_support::ScratchRoot::new();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let driver = "hostpath.csi.kvol.io";
    let config = HostpathConfig {
        state_dir: root.join("state"),
        csi_socket: root.join("plugins").join(driver).join("csi.sock"),
        registration_dir: None,
        ..HostpathConfig::new(driver, "node-a")
    };
    let endpoint = config.csi_socket.display().to_string();
    let bound = HostpathDriver::bind(config, Arc::new(RecordingMounter::new())).unwrap();
    let (stop, stopped) = oneshot::channel::<()>();
    let serving = tokio::spawn(bound.run(async {
        let _ = stopped.await;
    }));

    let metrics = Metrics::new();
    let host = PluginHost::new(
        NodePaths::new(root.join("kvol")),
        NodeInfo::named("node-a"),
        Arc::new(RecordingMounter::new()),
    );
    let registry = Arc::new(PluginRegistry::new(Vec::new()).unwrap());
    let handler = CsiRegistrationHandler::new(
        Arc::clone(&registry),
        Arc::new(MemoryObjects::new()),
        host,
        &FeatureGates::default(),
        Timeouts::default(),
    )
    .with_observer(metrics.clone());
    handler.register(driver, &endpoint, &["1.0.0".to_string()]).await.unwrap();

    let text = metrics.encode();
    for method in ["/csi.v1.Node/NodeGetInfo", "/csi.v1.Node/NodeGetCapabilities"] {
        let count = format!(
            r#"csi_operations_seconds_count{{driver_name="{driver}",grpc_status_code="OK",method_name="{method}",migrated="false"}} 1"#
        );
        assert!(text.lines().any(|l| l == count), "no {count} in\n{text}");
    }

    stop.send(()).unwrap();
    serving.await.unwrap().unwrap();
}
