//! The whole control plane for the cluster tests and benches: kube-apiserver (ServiceAccount admission on, a kubelet client certificate of a CA of its own), kube-controller-manager with every controller, kube-scheduler; and the Deployment they run on the nodes, with its configMap and secret.
//!
//! Included by path beside `support` and the API server's support (`crate::cluster`), which it
//! needs: `#[path = "support/control_plane.rs"] mod control_plane;`.
// Shared by the tests and benches that include it; not every one uses every item.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::Api;
use kube::api::PostParams;
use serde_json::json;

use crate::cluster::ApiServer;
use crate::support::cluster_node::{Process, kubelet_client_pki};
use crate::support::containerd::IMAGE;

/// The binaries of the control plane: kube-apiserver, etcd, kube-controller-manager and
/// kube-scheduler.
pub struct Binaries {
    apiserver: PathBuf,
    etcd: PathBuf,
    controller_manager: PathBuf,
    scheduler: PathBuf,
}

/// The four binaries, or `None` with the reason printed.
pub fn binaries() -> Option<Binaries> {
    let (apiserver, etcd) = crate::cluster::binaries()?;
    let found = |var: &str| std::env::var_os(var).filter(|p| !p.is_empty()).map(PathBuf::from);
    match (found("KVOL_KUBE_CONTROLLER_MANAGER"), found("KVOL_KUBE_SCHEDULER")) {
        (Some(controller_manager), Some(scheduler)) => {
            Some(Binaries { apiserver, etcd, controller_manager, scheduler })
        }
        _ => {
            eprintln!("skipped: set KVOL_KUBE_CONTROLLER_MANAGER and KVOL_KUBE_SCHEDULER");
            None
        }
    }
}

/// A control-plane process, its output in `log`.
pub fn start(binary: &Path, args: &[String], log: &Path) -> Process {
    let out = std::fs::File::create(log).unwrap();
    let child = Command::new(binary)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}", binary.display()));
    Process(child)
}

/// The running control plane; the scheduler and the controllers stop before the API server.
pub struct ControlPlane {
    _scheduler: Process,
    _controllers: Process,
    pub server: ApiServer,
    /// `ca.crt` (the nodes' `--client-ca-file`), and the API server's client certificate.
    pub pki: kvol_test_support::ScratchRoot,
    /// The controllers' and the scheduler's logs.
    pub logs: kvol_test_support::ScratchRoot,
}

impl ControlPlane {
    /// Starts the API server, the controllers (node monitor every 1 s, grace 20 s) and the
    /// scheduler.
    pub fn start(binaries: &Binaries) -> ControlPlane {
        let pki = kvol_test_support::ScratchRoot::new();
        kubelet_client_pki(pki.path());
        ControlPlane::start_with(binaries, pki, Vec::new(), Vec::new())
    }

    /// [`ControlPlane::start`] with the PKI `pki` (made by `kubelet_client_pki`: its CA may
    /// also sign clients' certificates) and more flags for the API server and the controllers;
    /// a flag given replaces the default of the same name.
    pub fn start_with(
        binaries: &Binaries,
        pki: kvol_test_support::ScratchRoot,
        apiserver: Vec<String>,
        controllers: Vec<String>,
    ) -> ControlPlane {
        let mut apiserver_args = vec![
            format!("--kubelet-client-certificate={}", pki.path().join("client.crt").display()),
            format!("--kubelet-client-key={}", pki.path().join("client.key").display()),
            "--kubelet-preferred-address-types=InternalIP".into(),
            // The controllers make the service accounts: every pod gets kube-api-access.
            "--disable-admission-plugins=".into(),
        ];
        replace_flags(&mut apiserver_args, apiserver);
        let server = ApiServer::start_with(&binaries.apiserver, &binaries.etcd, apiserver_args);
        let logs = kvol_test_support::ScratchRoot::new();
        let kubeconfig = format!("--kubeconfig={}", server.kubeconfig.display());
        let api_dir = server.dir.path();
        let mut controller_args = vec![
            kubeconfig.clone(),
            "--controllers=*".into(),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--use-service-account-credentials=false".into(),
            format!("--service-account-private-key-file={}", api_dir.join("pki/sa.key").display()),
            format!("--root-ca-file={}", api_dir.join("certs/apiserver.crt").display()),
            "--node-monitor-period=1s".into(),
            "--node-monitor-grace-period=20s".into(),
        ];
        replace_flags(&mut controller_args, controllers);
        let controllers = start(
            &binaries.controller_manager,
            &controller_args,
            &logs.path().join("kube-controller-manager.log"),
        );
        let scheduler = start(
            &binaries.scheduler,
            &[kubeconfig, "--leader-elect=false".into(), "--secure-port=0".into()],
            &logs.path().join("kube-scheduler.log"),
        );
        ControlPlane { _scheduler: scheduler, _controllers: controllers, server, pki, logs }
    }

    /// The CA of the API server's client certificate, copied to `<dir>/pki/ca.crt` where the
    /// node agent's command looks for it (beside its root `<dir>/node`).
    pub fn give_client_ca(&self, dir: &Path) {
        std::fs::create_dir_all(dir.join("pki")).unwrap();
        std::fs::copy(self.pki.path().join("ca.crt"), dir.join("pki/ca.crt")).unwrap();
    }
}

/// `defaults` with `extra` added, each flag of `extra` (`--name=value`) replacing the default
/// of the same name.
fn replace_flags(defaults: &mut Vec<String>, extra: Vec<String>) {
    let name = |flag: &str| flag.split('=').next().unwrap_or(flag).to_string();
    defaults.retain(|d| !extra.iter().any(|e| name(e) == name(d)));
    defaults.extend(extra);
}

/// Creates the object `body` describes.
pub async fn create<K>(api: &Api<K>, body: serde_json::Value) -> K
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    api.create(&PostParams::default(), &serde_json::from_value(body).expect("a valid object"))
        .await
        .unwrap_or_else(|e| panic!("cannot create the object: {e}"))
}

/// The configMap `app` and the secret `creds` the web pods read.
pub async fn create_app_config(client: &kube::Client) {
    let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    create(&config_maps, json!({"metadata": {"name": "app"}, "data": {"greeting": "hello\n"}})).await;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "default");
    create(&secrets, json!({"metadata": {"name": "creds"}, "stringData": {"password": "s3cret\n"}})).await;
}

/// The web pod's spec: it mounts a configMap, a secret, the downward API and an emptyDir (and
/// the kube-api-access volume the API server adds), writes what it read into the emptyDir and
/// serves it on its pod IP, ready by an httpGet probe; evicted 2 s after its node is lost.
pub fn web_pod_spec() -> serde_json::Value {
    let script = "cat /cfg/greeting /creds/password /info/name \
        /var/run/secrets/kubernetes.io/serviceaccount/namespace > /scratch/said; \
        exec httpd -f -p 8080 -h /scratch";
    let tolerate =
        |key: &str| json!({"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 2});
    json!({
        "terminationGracePeriodSeconds": 2,
        "tolerations": [tolerate("node.kubernetes.io/unreachable"), tolerate("node.kubernetes.io/not-ready")],
        "containers": [{"name": "web", "image": IMAGE, "imagePullPolicy": "IfNotPresent",
            "command": ["sh", "-c", script],
            "ports": [{"containerPort": 8080}],
            "readinessProbe": {"httpGet": {"path": "/said", "port": 8080}, "periodSeconds": 1},
            "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}, {"name": "creds", "mountPath": "/creds"},
                             {"name": "info", "mountPath": "/info"}, {"name": "scratch", "mountPath": "/scratch"}]}],
        "volumes": [{"name": "cfg", "configMap": {"name": "app"}},
                    {"name": "creds", "secret": {"secretName": "creds"}},
                    {"name": "info", "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]}},
                    {"name": "scratch", "emptyDir": {}}]})
}

/// The Deployment `name` of `replicas` web pods (label `app=<name>`), on the node `node`
/// alone when given (nodeSelector `kubernetes.io/hostname`).
pub fn web_deployment(name: &str, replicas: usize, node: Option<&str>) -> serde_json::Value {
    let mut spec = web_pod_spec();
    if let Some(node) = node {
        spec["nodeSelector"] = json!({"kubernetes.io/hostname": node});
    }
    json!({"metadata": {"name": name}, "spec": {
        "replicas": replicas,
        "selector": {"matchLabels": {"app": name}},
        "template": {"metadata": {"labels": {"app": name}}, "spec": spec}}})
}
