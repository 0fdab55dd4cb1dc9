//! kubelet's TLS bootstrap (`kvol_cluster::bootstrap`): whether a kubeconfig's certificate is usable, read from files; and against a real kube-apiserver with no controllers (env-gated: `KVOL_KUBE_APISERVER`, `KVOL_ETCD`) a request nobody answers ends in the timeout said, asked again under the same name, and once the test approves and signs it the certificate and the kubeconfig are written.

mod support;

use std::path::Path;
use std::time::Duration;

use base64::Engine;
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kvol_cluster::bootstrap::{Bootstrap, BootstrapError, Joined, ensure, kubeconfig_certificate};
use kvol_cluster::client_cert::Unusable;
use serde_json::json;

/// A certificate for `system:node:<node>` valid until `year`, and its key, as PEM.
fn certificate(node: &str, until_year: i32) -> (String, String) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, format!("system:node:{node}"));
    params.not_before = rcgen::date_time_ymd(2000, 1, 1);
    params.not_after = rcgen::date_time_ymd(until_year, 1, 1);
    (params.self_signed(&key).unwrap().pem(), key.serialize_pem())
}

fn kubeconfig_with(user: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:6443\nusers:\n- name: u\n  user:\n{user}\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: u\ncurrent-context: x\n"
    )
}

/// Usable, or unusable for a reason the function recognises.
type Expected = Result<(), fn(&Unusable) -> bool>;

#[test]
fn a_kubeconfigs_certificate_is_usable_only_when_it_has_a_valid_one() {
    let dir = tempfile::tempdir().unwrap();
    let (good, key) = certificate("n1", 2100);
    let (old, _) = certificate("n1", 2001);
    std::fs::write(dir.path().join("current.pem"), format!("{good}{key}")).unwrap();
    std::fs::write(dir.path().join("old.pem"), &old).unwrap();
    let data = base64::engine::general_purpose::STANDARD.encode(&good);
    let cases: Vec<(&str, Option<String>, Expected)> = vec![
        ("no kubeconfig", None, Err(|u| *u == Unusable::Missing)),
        (
            "a token, no certificate",
            Some(kubeconfig_with("    token: abc")),
            Err(|u| *u == Unusable::NoCertificate),
        ),
        (
            "a certificate file (relative to the kubeconfig)",
            Some(kubeconfig_with("    client-certificate: current.pem\n    client-key: current.pem")),
            Ok(()),
        ),
        ("certificate data", Some(kubeconfig_with(&format!("    client-certificate-data: {data}"))), Ok(())),
        (
            "an expired certificate",
            Some(kubeconfig_with("    client-certificate: old.pem")),
            Err(|u| matches!(u, Unusable::Expired(_))),
        ),
        (
            "a certificate file that is not there",
            Some(kubeconfig_with("    client-certificate: gone.pem")),
            Err(|u| matches!(u, Unusable::Unreadable(_))),
        ),
        ("not a kubeconfig", Some("{{{".into()), Err(|u| matches!(u, Unusable::Unreadable(_)))),
    ];
    for (what, text, expected) in cases {
        let path = dir.path().join("kubeconfig");
        let _ = std::fs::remove_file(&path);
        if let Some(text) = text {
            std::fs::write(&path, text).unwrap();
        }
        match (kubeconfig_certificate(&path), expected) {
            (Ok(()), Ok(())) => {}
            (Err(found), Err(is)) => assert!(is(&found), "{what}: {found:?}"),
            (found, _) => panic!("{what}: {found:?}"),
        }
    }
}

async fn requests(client: &kube::Client) -> Vec<String> {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    api.list(&Default::default()).await.unwrap().items.into_iter().filter_map(|r| r.metadata.name).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_unanswered_times_out_is_found_again_and_once_signed_is_written() {
    let Some((apiserver, etcd)) = support::binaries() else { return };
    let server = support::ApiServer::start(&apiserver, &etcd);
    let client = server.client().await;
    let dir = tempfile::tempdir().unwrap();
    // The admin's kubeconfig stands for the bootstrap one: it may create requests, and no
    // controller answers them here.
    let b = Bootstrap {
        bootstrap_kubeconfig: server.kubeconfig.clone(),
        // In a directory not made yet, as kubelet's /etc/kubernetes/kubelet.conf may be.
        kubeconfig: dir.path().join("etc/kubeconfig"),
        cert_dir: dir.path().join("pki"),
        node: "n1".into(),
        timeout: Duration::from_secs(2),
    };
    let first = ensure(&b).await.unwrap_err();
    let BootstrapError::Timeout { name, .. } = &first else { panic!("{first}") };
    assert_eq!(
        first.to_string(),
        format!(
            "node n1: certificate signing request {name} was not approved and signed within 2s (`kubectl certificate approve {name}` approves it)"
        )
    );
    assert!(b.cert_dir.join("kubelet-client.key.tmp").exists() && !b.kubeconfig.exists());
    let again = ensure(&b).await.unwrap_err();
    assert!(matches!(&again, BootstrapError::Timeout { name: n, .. } if n == name), "{again}");
    assert_eq!(requests(&client).await, std::slice::from_ref(name), "asked again under the same name");
    let waiting = tokio::spawn({
        let b = b.clone();
        async move { ensure(&Bootstrap { timeout: Duration::from_secs(30), ..b }).await }
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    approve_and_sign(&client, name).await;
    let joined = waiting.await.unwrap().unwrap();
    assert_eq!(joined, Joined::Issued { request: name.clone() });
    assert_eq!(kubeconfig_certificate(&b.kubeconfig), Ok(()));
    assert!(!b.cert_dir.join("kubelet-client.key.tmp").exists(), "the pending key is gone once issued");
    let written = std::fs::read_to_string(&b.kubeconfig).unwrap();
    let current = b.cert_dir.join("kubelet-client-current.pem");
    assert!(written.contains(&current.display().to_string()), "{written}");
    assert!(!written.contains("token"), "the bootstrap credentials are not carried over: {written}");
    assert_eq!(ensure(&b).await.unwrap(), Joined::Kept, "usable now: nothing asked");
    assert_eq!(requests(&client).await.len(), 1);
    assert!(starts_with_certificate(&current));
}

/// Approves the request (its approval subresource) and signs it with a certificate the test
/// makes (its status subresource), as the controllers would. The test's certificate is not for
/// the request's key: kvol judges a certificate by its dates only (kubelet's load of the pair
/// would also refuse a key that does not match it; kvol does not check that).
async fn approve_and_sign(client: &kube::Client, name: &str) {
    let api: Api<CertificateSigningRequest> = Api::all(client.clone());
    let approve = json!({"status": {"conditions": [{"type": "Approved", "status": "True", "reason": "Test", "message": "ok"}]}});
    api.patch_subresource("approval", name, &PatchParams::default(), &Patch::Merge(approve)).await.unwrap();
    let (cert, _) = certificate("n1", 2100);
    let signed = json!({"status": {"certificate": base64::engine::general_purpose::STANDARD.encode(cert)}});
    api.patch_status(name, &PatchParams::default(), &Patch::Merge(signed)).await.unwrap();
}

fn starts_with_certificate(path: &Path) -> bool {
    std::fs::read_to_string(path).unwrap().starts_with("-----BEGIN CERTIFICATE-----")
}
