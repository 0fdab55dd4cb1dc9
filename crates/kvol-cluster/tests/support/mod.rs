//! A throw-away etcd and kube-apiserver on loopback for the cluster tests, started from the binaries `KVOL_ETCD` and `KVOL_KUBE_APISERVER` name.

#![allow(dead_code)]

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running etcd + kube-apiserver; both are killed on drop.
pub struct ApiServer {
    pub dir: kvol_test_support::ScratchRoot,
    pub kubeconfig: PathBuf,
    pub port: u16,
    /// etcd's client URL (`http://127.0.0.1:<port>`), for `etcdctl`.
    pub etcd_url: String,
    etcd: Child,
    apiserver: Option<Child>,
    apiserver_args: Vec<String>,
    binary: PathBuf,
}

/// The two binaries, or `None` (with the reason printed) when the environment does not name them.
pub fn binaries() -> Option<(PathBuf, PathBuf)> {
    let (Some(apiserver), Some(etcd)) =
        (std::env::var_os("KVOL_KUBE_APISERVER"), std::env::var_os("KVOL_ETCD"))
    else {
        eprintln!(
            "skipped: set KVOL_KUBE_APISERVER and KVOL_ETCD to run the tests against a real kube-apiserver"
        );
        return None;
    };
    Some((PathBuf::from(apiserver), PathBuf::from(etcd)))
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("a free port").local_addr().expect("its address").port()
}

/// `--name` of `--name=value`.
fn flag_name(arg: &str) -> &str {
    arg.split('=').next().unwrap_or(arg)
}

fn run(cmd: &mut Command) {
    let status = cmd.status().unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(status.success(), "{cmd:?} failed: {status}");
}

impl ApiServer {
    /// Starts etcd and the API server (RBAC, a static admin token) and waits until it is ready.
    pub fn start(apiserver: &Path, etcd: &Path) -> ApiServer {
        ApiServer::start_with(apiserver, etcd, Vec::new())
    }

    /// [`ApiServer::start`] with more flags for the API server; a flag given here replaces the
    /// default of the same name (`--disable-admission-plugins=` turns the ServiceAccount
    /// admission back on, for a cluster whose controllers make the accounts).
    pub fn start_with(apiserver: &Path, etcd: &Path, extra: Vec<String>) -> ApiServer {
        let dir = kvol_test_support::ScratchRoot::new();
        let d = dir.path();
        let (client, peer, port) = (free_port(), free_port(), free_port());
        let etcd_url = format!("http://127.0.0.1:{client}");
        let etcd = Command::new(etcd)
            .args(["--name", "kvol", "--data-dir"])
            .arg(d.join("etcd-data"))
            .args(["--listen-client-urls", &etcd_url, "--advertise-client-urls", &etcd_url])
            .args(["--listen-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-advertise-peer-urls", &format!("http://127.0.0.1:{peer}")])
            .args(["--initial-cluster", &format!("kvol=http://127.0.0.1:{peer}"), "--log-level", "warn"])
            .stdin(Stdio::null())
            .stdout(fs::File::create(d.join("etcd.out")).expect("etcd log"))
            .stderr(fs::File::create(d.join("etcd.log")).expect("etcd log"))
            .spawn()
            .expect("etcd starts");
        fs::create_dir_all(d.join("pki")).expect("pki dir");
        run(Command::new("openssl")
            .arg("genrsa")
            .arg("-out")
            .arg(d.join("pki/sa.key"))
            .arg("2048")
            .stderr(Stdio::null()));
        run(Command::new("openssl")
            .args(["rsa", "-pubout", "-in"])
            .arg(d.join("pki/sa.key"))
            .arg("-out")
            .arg(d.join("pki/sa.pub"))
            .stderr(Stdio::null()));
        let token = format!("kvol-test-{:x}", std::process::id() as u64 * 7919 + port as u64);
        fs::write(d.join("pki/tokens.csv"), format!("{token},admin,admin,system:masters\n")).expect("tokens");
        let args: Vec<String> = vec![
            format!("--etcd-servers={etcd_url}"),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", d.join("certs").display()),
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local".into(),
            format!("--service-account-key-file={}", d.join("pki/sa.pub").display()),
            format!("--service-account-signing-key-file={}", d.join("pki/sa.key").display()),
            format!("--token-auth-file={}", d.join("pki/tokens.csv").display()),
            "--authorization-mode=RBAC".into(),
            // No controller manager creates the "default" service accounts.
            "--disable-admission-plugins=ServiceAccount".into(),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--endpoint-reconciler-type=none".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ]
        .into_iter()
        .filter(|default| !extra.iter().any(|e| flag_name(e) == flag_name(default)))
        .chain(extra.iter().cloned())
        .collect();
        let mut server = ApiServer {
            kubeconfig: d.join("kubeconfig"),
            port,
            etcd_url: etcd_url.clone(),
            etcd,
            apiserver: None,
            apiserver_args: args,
            binary: apiserver.to_path_buf(),
            dir,
        };
        server.start_apiserver();
        let ca =
            fs::read(server.dir.path().join("certs/apiserver.crt")).expect("the apiserver's certificate");
        let kubeconfig = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: kvol\n  cluster:\n    server: https://127.0.0.1:{port}\n    certificate-authority-data: {}\nusers:\n- name: admin\n  user:\n    token: {token}\ncontexts:\n- name: kvol\n  context:\n    cluster: kvol\n    user: admin\ncurrent-context: kvol\n",
            base64(&ca)
        );
        fs::write(&server.kubeconfig, kubeconfig).expect("kubeconfig");
        server
    }

    /// Starts (or starts again) the API server and waits until its port answers and its
    /// certificate is written.
    pub fn start_apiserver(&mut self) {
        self.start_apiserver_on(self.port);
    }

    /// Starts the API server on `port` in place of the kubeconfig's (a client of that
    /// kubeconfig finds nothing there): the cluster changes while the API server its clients
    /// know is away. [`ApiServer::client_on`] reaches it.
    pub fn start_apiserver_on(&mut self, port: u16) {
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join("kube-apiserver.log"))
            .expect("apiserver log");
        let child = Command::new(&self.binary)
            .args(&self.apiserver_args)
            .arg(format!("--secure-port={port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("log"))
            .stderr(log)
            .spawn()
            .expect("kube-apiserver starts");
        self.apiserver = Some(child);
        let deadline = Instant::now() + Duration::from_secs(120);
        let cert = self.dir.path().join("certs/apiserver.crt");
        while !(cert.exists() && std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()) {
            assert!(
                Instant::now() < deadline,
                "kube-apiserver did not start; see its log in {}",
                self.dir.path().display()
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Kills the API server (etcd stays).
    pub fn kill_apiserver(&mut self) {
        if let Some(mut child) = self.apiserver.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// A client for this API server, once it answers requests.
    pub async fn client(&self) -> kube::Client {
        self.client_on(self.port).await
    }

    /// The kubeconfig with its server on `port` of loopback, and over `scheme` (`https`, or
    /// `http` for a proxy in front), written beside the API server's own.
    pub fn kubeconfig_at(&self, scheme: &str, port: u16) -> PathBuf {
        let text = fs::read_to_string(&self.kubeconfig).expect("the kubeconfig");
        let text = text
            .replace(&format!("https://127.0.0.1:{}", self.port), &format!("{scheme}://127.0.0.1:{port}"));
        let path = self.dir.path().join(format!("kubeconfig-{scheme}-{port}"));
        fs::write(&path, text).expect("a kubeconfig");
        path
    }

    /// A client for the API server on `port` (see [`ApiServer::start_apiserver_on`]), once it
    /// answers requests.
    pub async fn client_on(&self, port: u16) -> kube::Client {
        let kubeconfig =
            if port == self.port { self.kubeconfig.clone() } else { self.kubeconfig_at("https", port) };
        let client = kvol_cluster::client::client(Some(&kubeconfig)).await.expect("a client");
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let api: kube::Api<k8s_openapi::api::core::v1::Namespace> = kube::Api::all(client.clone());
            match api.get_opt("default").await {
                Ok(Some(_)) => return client,
                other => {
                    assert!(Instant::now() < deadline, "kube-apiserver not ready: {other:?}");
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
            }
        }
    }
}

impl Drop for ApiServer {
    fn drop(&mut self) {
        self.kill_apiserver();
        let _ = self.etcd.kill();
        let _ = self.etcd.wait();
    }
}

/// Waits (at most 60 s) until the CSINode of `node` lists `driver`: its registration went
/// through the API.
pub async fn wait_for_csinode_driver(client: &kube::Client, node: &str, driver: &str) {
    let nodes: kube::Api<k8s_openapi::api::storage::v1::CSINode> = kube::Api::all(client.clone());
    let start = Instant::now();
    loop {
        let csinode = nodes.get_opt(node).await.ok().flatten();
        if csinode.is_some_and(|n| n.spec.drivers.iter().any(|d| d.name == driver)) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "{driver} never appeared in the CSINode of {node}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Creates the object `body` describes.
pub async fn create<K>(api: &kube::Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(body).expect("a valid object");
    api.create(&kube::api::PostParams::default(), &object).await.expect("created")
}

/// The Nodes `nodes` and the CSIDriver object of `driver` as the bundled driver's: no attach,
/// the pod's info on mount, persistent and ephemeral volumes.
pub async fn nodes_and_csi_driver(client: &kube::Client, nodes: &[&str], driver: &str) {
    for node in nodes {
        create(
            &kube::Api::<k8s_openapi::api::core::v1::Node>::all(client.clone()),
            serde_json::json!({"metadata": {"name": node}}),
        )
        .await;
    }
    create(
        &kube::Api::<k8s_openapi::api::storage::v1::CSIDriver>::all(client.clone()),
        serde_json::json!({"metadata": {"name": driver}, "spec": {"attachRequired": false, "podInfoOnMount": true,
            "volumeLifecycleModes": ["Persistent", "Ephemeral"]}}),
    )
    .await;
}

/// Waits (at most 60 s) until `check` holds for the source's set.
pub async fn until(
    source: &kvol_cluster::source::ApiSource,
    what: &str,
    check: impl Fn(&kvol_node::model::ObjectSet) -> bool,
) {
    use kvol_node::sources::ObjectSource;
    let mut rx = source.subscribe();
    let deadline = Instant::now() + Duration::from_secs(60);
    while !check(&rx.borrow_and_update()) {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(!left.is_zero(), "timed out waiting for {what}: {:?}", source.current().pods.keys());
        let _ = tokio::time::timeout(left, rx.changed()).await;
    }
}

/// Standard base64 with padding (a kubeconfig's certificate data).
fn base64(data: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(ALPHABET[(n >> (18 - 6 * i)) as usize & 63] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
