//! kubelet's TLS bootstrap against the real control plane: kube-apiserver with bootstrap tokens, the Node authorizer and NodeRestriction, kube-controller-manager approving and signing node client certificates. A kvol node given only a bootstrap kubeconfig asks for its certificate, gets it auto-approved and signed, writes it and a kubeconfig as `system:node:<name>`, registers its Node Ready and runs a pod; started again it uses the written certificate and asks for none (its bootstrap kubeconfig moved away); its certificate broken, it asks again; a node whose request is not approved keeps the same request across a restart (the same pending key) and, denied, exits non-zero saying so.
//!
//! Needs root, `KVOL_KUBE_APISERVER`, `KVOL_ETCD`, `KVOL_KUBE_CONTROLLER_MANAGER`,
//! `KVOL_KUBE_SCHEDULER`, containerd, runc and a static busybox; skipped, saying which, without them.

#[path = "../../kvol-cluster/tests/support/mod.rs"]
mod cluster;
#[path = "support/control_plane.rs"]
mod control_plane;
#[allow(dead_code)]
mod support;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cluster::create;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use support::cluster_node::{Process, agent, ready_condition, until};
use support::containerd::{Containerd, IMAGE, tools};

const NODE: &str = "kvol-joiner";
const DENIED_NODE: &str = "kvol-refused";
/// The auto-approved token (group `system:bootstrappers:kvol`) and the one only allowed to ask.
const TOKEN: (&str, &str) = ("kvol01", "0123456789abcdef");
const MANUAL_TOKEN: (&str, &str) = ("kvol02", "fedcba9876543210");

#[test]
fn a_node_joins_with_a_bootstrap_token_and_a_denied_one_says_so() {
    let busybox = match tools() {
        Ok(busybox) => busybox,
        Err(why) => return eprintln!("skipped: {why}"),
    };
    let Some(binaries) = control_plane::binaries() else { return };
    support::enter_private_mount_namespace();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let pki = kvol_test_support::ScratchRoot::new();
    support::cluster_node::kubelet_client_pki(pki.path());
    let (ca, ca_key) = (pki.path().join("ca.crt"), pki.path().join("ca.key"));
    let plane = control_plane::ControlPlane::start_with(
        &binaries,
        pki,
        vec![
            "--enable-bootstrap-token-auth".into(),
            format!("--client-ca-file={}", ca.display()),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
        ],
        vec![
            format!("--cluster-signing-cert-file={}", ca.display()),
            format!("--cluster-signing-key-file={}", ca_key.display()),
            // Certificates of 140 s (valid from 5 min before they are signed: 440 s), so that
            // a rotation at 70 % of their life comes 8 s after they are signed.
            "--cluster-signing-duration=140s".into(),
        ],
    );
    let client = runtime.block_on(plane.server.client());
    runtime.block_on(bootstrap_tokens(&client));
    let containerd = Containerd::with_image(&busybox);
    let scratch = kvol_test_support::ScratchRoot::new();
    plane.give_client_ca(scratch.path());
    let bootstrap = bootstrap_kubeconfig(&plane.server.kubeconfig, scratch.path(), "bootstrap.conf", TOKEN);
    let node = Joiner::new(scratch.path(), NODE, &bootstrap, &containerd.endpoint());

    let issued = join_and_run_a_pod(&runtime, &client, &node);
    start_again_with_the_written_certificate(&runtime, &client, &node, &issued);
    a_broken_certificate_is_asked_for_again(&runtime, &client, &node, &issued);
    the_certificate_rotates(&runtime, &client, &node);
    let manual = bootstrap_kubeconfig(&plane.server.kubeconfig, scratch.path(), "manual.conf", MANUAL_TOKEN);
    let refused = Joiner::new(scratch.path(), DENIED_NODE, &manual, &containerd.endpoint());
    a_denied_request(&runtime, &client, &refused);
}

/// A node's files and command: its root, its (not yet written) kubeconfig, its cert dir, its log.
struct Joiner {
    name: &'static str,
    root: PathBuf,
    kubeconfig: PathBuf,
    cert_dir: PathBuf,
    bootstrap: PathBuf,
    log: PathBuf,
    endpoint: String,
}

impl Joiner {
    fn new(dir: &Path, name: &'static str, bootstrap: &Path, endpoint: &str) -> Joiner {
        Joiner {
            name,
            root: dir.join(format!("{name}/node")),
            kubeconfig: dir.join(format!("{name}/kubeconfig")),
            cert_dir: dir.join(format!("{name}/kubelet-pki")),
            bootstrap: bootstrap.to_path_buf(),
            log: dir.join(format!("{name}.log")),
            endpoint: endpoint.to_string(),
        }
    }

    fn start(&self) -> Process {
        Process(self.command().spawn().unwrap())
    }

    fn command(&self) -> Command {
        std::fs::create_dir_all(self.root.with_file_name("pki")).unwrap();
        let ca = self.root.parent().unwrap().parent().unwrap().join("pki/ca.crt");
        std::fs::copy(ca, self.root.with_file_name("pki").join("ca.crt")).unwrap();
        let mut command = agent(self.name, &self.kubeconfig, &self.root, &self.endpoint, &self.log);
        command.arg("--bootstrap-kubeconfig").arg(&self.bootstrap).arg("--cert-dir").arg(&self.cert_dir);
        command
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

/// Two bootstrap tokens as kubeadm makes them, and its bindings: both groups may ask for node
/// certificates (`system:node-bootstrapper`); only `system:bootstrappers:kvol`'s are approved
/// by the controller (`…:certificatesigningrequests:nodeclient`).
async fn bootstrap_tokens(client: &kube::Client) {
    use k8s_openapi::api::core::v1::Secret;
    use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
    let secrets: Api<Secret> = Api::namespaced(client.clone(), "kube-system");
    for ((id, secret), group) in
        [(TOKEN, "system:bootstrappers:kvol"), (MANUAL_TOKEN, "system:bootstrappers:kvol-manual")]
    {
        create(
            &secrets,
            json!({"metadata": {"name": format!("bootstrap-token-{id}")},
            "type": "bootstrap.kubernetes.io/token",
            "stringData": {"token-id": id, "token-secret": secret, "usage-bootstrap-authentication": "true",
                "auth-extra-groups": group}}),
        )
        .await;
    }
    let bindings: Api<ClusterRoleBinding> = Api::all(client.clone());
    let bind = |name: &str, role: &str, group: &str| {
        json!({"metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "Group", "name": group}]})
    };
    for body in [
        bind("kvol-bootstrappers", "system:node-bootstrapper", "system:bootstrappers:kvol"),
        bind("kvol-manual-bootstrappers", "system:node-bootstrapper", "system:bootstrappers:kvol-manual"),
        bind(
            "kvol-auto-approve",
            "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
            "system:bootstrappers:kvol",
        ),
        // kubeadm's binding for nodes renewing their own certificates.
        bind(
            "kvol-auto-approve-renewals",
            "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
            "system:nodes",
        ),
    ] {
        create(&bindings, body).await;
    }
}

/// A kubeconfig of the API server with the bootstrap token `<id>.<secret>` as its user.
fn bootstrap_kubeconfig(admin: &Path, dir: &Path, file: &str, (id, secret): (&str, &str)) -> PathBuf {
    let admin = std::fs::read_to_string(admin).unwrap();
    let (head, _) = admin.split_once("users:").expect("the admin kubeconfig's users");
    let (_, tail) = admin.split_once("contexts:").expect("its contexts");
    let text = format!("{head}users:\n- name: admin\n  user:\n    token: {id}.{secret}\ncontexts:{tail}");
    let path = dir.join(file);
    std::fs::write(&path, text).unwrap();
    path
}

async fn requests_of(client: &kube::Client, id: &str) -> Vec<CertificateSigningRequest> {
    let all = Api::<CertificateSigningRequest>::all(client.clone()).list(&Default::default()).await.unwrap();
    let user = format!("system:bootstrap:{id}");
    all.items.into_iter().filter(|r| r.spec.username.as_deref() == Some(user.as_str())).collect()
}

/// The subject of the certificate in `pem`, as openssl prints it.
fn subject_of(pem: &Path) -> String {
    let out = Command::new("openssl").args(["x509", "-noout", "-subject", "-in"]).arg(pem).output().unwrap();
    assert!(out.status.success(), "openssl x509 {}: {}", pem.display(), String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// kvol with only the bootstrap kubeconfig: one request, auto-approved and signed; the
/// certificate written is `system:node:<node>` in `system:nodes`; the Node (which only the node
/// itself may create under NodeRestriction) Ready; a pod bound to it Running. The issued file.
fn join_and_run_a_pod(runtime: &tokio::runtime::Runtime, client: &kube::Client, node: &Joiner) -> PathBuf {
    let start = Instant::now();
    let kvol = node.start();
    runtime.block_on(async {
        let nodes: Api<Node> = Api::all(client.clone());
        until("the node joined and Ready", Duration::from_secs(60), &node.log, async || {
            let found = nodes.get_opt(node.name).await.ok().flatten()?;
            (ready_condition(&found)?.0 == "True").then_some(())
        })
        .await;
        eprintln!("bootstrap → node Ready in {} ms", start.elapsed().as_millis());
        let requests = requests_of(client, TOKEN.0).await;
        assert_eq!(requests.len(), 1, "one request: {requests:?}");
        let request = &requests[0];
        assert!(request.metadata.name.as_deref().is_some_and(|n| n.starts_with("node-csr-")), "{request:?}");
        assert_eq!(request.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
        let approved = request.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
            c.iter().any(|c| c.type_ == "Approved" && c.reason.as_deref() == Some("AutoApproved"))
        });
        assert!(approved, "approved by the controller: {:?}", request.status);
        let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
        create(&pods, json!({"metadata": {"name": "joined"}, "spec": {"nodeName": node.name, "hostNetwork": true,
            "terminationGracePeriodSeconds": 1, "containers": [{"name": "main", "image": IMAGE, "command": ["sleep", "100000"]}]}}))
        .await;
        until("a pod Running on the joined node", Duration::from_secs(60), &node.log, async || {
            let status = pods.get("joined").await.ok()?.status?;
            (status.phase.as_deref() == Some("Running")).then_some(())
        })
        .await;
    });
    let current = node.cert_dir.join("kubelet-client-current.pem");
    let issued = std::fs::read_link(&current).expect("kubelet-client-current.pem links to the issued file");
    assert!(issued.to_string_lossy().starts_with("kubelet-client-2"), "{}", issued.display());
    let subject = subject_of(&current);
    assert!(
        subject.contains(&format!("CN = system:node:{}", node.name)) && subject.contains("O = system:nodes"),
        "{subject}"
    );
    let kubeconfig = std::fs::read_to_string(&node.kubeconfig).unwrap();
    assert!(
        kubeconfig.contains(&current.display().to_string()) && !kubeconfig.contains(TOKEN.1),
        "{kubeconfig}"
    );
    assert!(!node.cert_dir.join("kubelet-client.key.tmp").exists(), "the pending key is removed once issued");
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(node.cert_dir.join(&issued)).unwrap().permissions(),
    );
    assert_eq!(mode & 0o077, 0, "the key's file is its owner's only: {mode:o}");
    drop(kvol);
    issued
}

/// Waits until a kvol started at `start` renews the node's Lease (kvol runs as the node); how long.
async fn lease_renewed(client: &kube::Client, node: &Joiner, start: Instant) -> u128 {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-node-lease");
    let renewed = |lease: &Lease| lease.spec.as_ref()?.renew_time.as_ref().map(|t| t.0);
    let first = renewed(&leases.get(node.name).await.unwrap());
    until("the lease renewed by the new start", Duration::from_secs(30), &node.log, async || {
        let now = renewed(&leases.get(node.name).await.ok()?);
        (now > first).then_some(())
    })
    .await;
    start.elapsed().as_millis()
}

const ASKING: &str = "asking for the node's client certificate";

/// Started again, kvol finds the written kubeconfig usable: no new request, the same file, the
/// bootstrap kubeconfig not even read (it is moved away), the node's Lease renewed by the new
/// process.
fn start_again_with_the_written_certificate(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    node: &Joiner,
    issued: &Path,
) {
    let before = node.log_text().matches(ASKING).count();
    let away = node.bootstrap.with_extension("away");
    std::fs::rename(&node.bootstrap, &away).unwrap();
    let start = Instant::now();
    let kvol = node.start();
    runtime.block_on(async {
        let ms = lease_renewed(client, node, start).await;
        eprintln!("second start → lease renewed in {ms} ms");
        assert_eq!(requests_of(client, TOKEN.0).await.len(), 1, "no new request");
    });
    drop(kvol);
    std::fs::rename(&away, &node.bootstrap).unwrap();
    let after = node.log_text().matches(ASKING).count();
    assert_eq!(after, before, "the second start asks for nothing:\n{}", node.log_text());
    let current = std::fs::read_link(node.cert_dir.join("kubelet-client-current.pem")).unwrap();
    assert_eq!(current, issued, "the same certificate");
}

/// The written certificate broken (its file overwritten): the next start finds it unusable and
/// asks again, a second request, and runs as the node on the new certificate.
fn a_broken_certificate_is_asked_for_again(
    runtime: &tokio::runtime::Runtime,
    client: &kube::Client,
    node: &Joiner,
    issued: &Path,
) {
    std::fs::write(node.cert_dir.join(issued), "not a certificate\n").unwrap();
    let before = node.log_text().matches(ASKING).count();
    let start = Instant::now();
    let _kvol = node.start();
    runtime.block_on(async {
        let ms = lease_renewed(client, node, start).await;
        eprintln!("broken certificate → asked again, lease renewed in {ms} ms");
        assert_eq!(requests_of(client, TOKEN.0).await.len(), 2, "a second request");
    });
    assert_eq!(node.log_text().matches(ASKING).count(), before + 1, "{}", node.log_text());
    let subject = subject_of(&node.cert_dir.join("kubelet-client-current.pem"));
    assert!(subject.contains(&format!("CN = system:node:{}", node.name)), "{subject}");
}

/// A token whose requests the controller does not approve: the request waits; kvol killed and
/// started again asks under the same name (its pending key kept); denied by hand, kvol exits
/// non-zero naming the request and the reason.
fn a_denied_request(runtime: &tokio::runtime::Runtime, client: &kube::Client, node: &Joiner) {
    let mut kvol = node.start();
    let name = runtime.block_on(async {
        until("a pending request", Duration::from_secs(30), &node.log, async || {
            let requests = requests_of(client, MANUAL_TOKEN.0).await;
            requests.first().and_then(|r| r.metadata.name.clone())
        })
        .await
    });
    std::thread::sleep(Duration::from_secs(2));
    assert!(kvol.0.try_wait().unwrap().is_none(), "kvol waits for the answer:\n{}", node.log_text());
    assert!(node.cert_dir.join("kubelet-client.key.tmp").exists(), "the pending key is kept");
    drop(kvol);
    let mut kvol = node.start();
    runtime.block_on(async {
        until("the restart finds its request", Duration::from_secs(30), &node.log, async || {
            node.log_text().contains("the request made before is still there").then_some(())
        })
        .await;
        let requests = requests_of(client, MANUAL_TOKEN.0).await;
        let names: Vec<_> = requests.iter().filter_map(|r| r.metadata.name.clone()).collect();
        assert_eq!(names, std::slice::from_ref(&name), "the same request after the restart");
        let api: Api<CertificateSigningRequest> = Api::all(client.clone());
        let deny = json!({"status": {"conditions": [{"type": "Denied", "status": "True", "reason": "NotThisNode",
            "message": "kvol's test denies it"}]}});
        api.patch_subresource("approval", &name, &PatchParams::default(), &Patch::Merge(deny)).await.unwrap();
    });
    let denied = Instant::now();
    let status = loop {
        if let Some(status) = kvol.0.try_wait().unwrap() {
            break status;
        }
        assert!(
            denied.elapsed() < Duration::from_secs(30),
            "kvol still runs after the denial:\n{}",
            node.log_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("denied → kvol exited ({status}) in {} ms", denied.elapsed().as_millis());
    assert!(!status.success(), "a denied node exits non-zero");
    let log = node.log_text();
    assert!(
        log.contains(&format!("node {DENIED_NODE}: certificate signing request {name} was denied"))
            && log.contains("NotThisNode"),
        "the error says which request and why:\n{log}"
    );
    let nodes: Api<Node> = Api::all(client.clone());
    assert!(runtime.block_on(nodes.get_opt(DENIED_NODE)).unwrap().is_none(), "no Node for a denied node");
}

/// With `--rotate-certificates` (and the jitter fixed at 70 % of the life): before the
/// certificate expires kvol asks, as `system:node:<node>`, for a new one, gets it approved by the
/// controller, keeps it as current, and starts itself again on it (the same process): the
/// node's Lease renewed after that, its pod still running in the same container.
fn the_certificate_rotates(runtime: &tokio::runtime::Runtime, client: &kube::Client, node: &Joiner) {
    let before = std::fs::read_link(node.cert_dir.join("kubelet-client-current.pem")).unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let container = |pod: Pod| {
        let status = pod.status?.container_statuses?.into_iter().next()?;
        Some((status.container_id?, status.restart_count))
    };
    let running = runtime.block_on(pods.get("joined")).ok().and_then(container).expect("the joined pod runs");
    let start = Instant::now();
    let mut kvol = Process(
        node.command().arg("--rotate-certificates").env("KVOL_ROTATION_JITTER", "0").spawn().unwrap(),
    );
    let user = format!("system:node:{}", node.name);
    runtime.block_on(async {
        let api: Api<CertificateSigningRequest> = Api::all(client.clone());
        let renewal = until("a renewal request signed", Duration::from_secs(60), &node.log, async || {
            let listed = api.list(&Default::default()).await.ok()?;
            let mine =
                listed.items.into_iter().find(|r| r.spec.username.as_deref() == Some(user.as_str()))?;
            mine.status.as_ref()?.certificate.as_ref()?;
            Some(mine)
        })
        .await;
        eprintln!("rotation: renewal signed {} ms after the start", start.elapsed().as_millis());
        assert!(renewal.metadata.name.as_deref().is_some_and(|n| n.starts_with("csr-")), "{renewal:?}");
        // The new process image registers the node again (its Lease renewed first).
        let signed = Instant::now();
        until("kvol started again and the node registered", Duration::from_secs(30), &node.log, async || {
            let log = node.log_text();
            let (_, after) = log.split_once("starting again with the rotated client certificate")?;
            (after.contains("joined=Kept") && after.contains("node registered")).then_some(())
        })
        .await;
        eprintln!(
            "rotation: node registered again {} ms after the renewal was signed",
            signed.elapsed().as_millis()
        );
    });
    assert!(kvol.0.try_wait().unwrap().is_none(), "kvol runs on, the same process:\n{}", node.log_text());
    let after = std::fs::read_link(node.cert_dir.join("kubelet-client-current.pem")).unwrap();
    assert_ne!(after, before, "a new current certificate");
    let subject = subject_of(&node.cert_dir.join(&after));
    assert!(subject.contains(&format!("CN = {user}")), "{subject}");
    let still = runtime.block_on(pods.get("joined")).ok().and_then(container);
    assert_eq!(still, Some(running), "the pod's container adopted, not restarted");
}
