//! kubelet's TLS bootstrap: when the node's kubeconfig is missing or its client certificate unusable, the bootstrap kubeconfig (a bootstrap token) asks the API for the node's client certificate by a CertificateSigningRequest, waits for it, and writes the certificate and a kubeconfig using it.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::config::Kubeconfig;
use kube::{Api, Client};
use rcgen::PublicKeyData;

use crate::client_cert::{
    Answer, CURRENT_FILE, PENDING_KEY_FILE, ServerAccess, Unusable, answer, certificate_request,
    incompatibility, issued_file_name, judge_certificate, kubeconfig, request_name, request_object,
    rotation_deadline, validity,
};

/// How long kubelet waits for its request to be answered.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(3600);
/// How long an API server that does not answer yet is waited for (kubelet's `waitForServer`).
const SERVER_WAIT: Duration = Duration::from_secs(60);

/// What the bootstrap needs: kubelet's `--bootstrap-kubeconfig`, `--kubeconfig` and `--cert-dir`.
#[derive(Clone, Debug)]
pub struct Bootstrap {
    pub bootstrap_kubeconfig: PathBuf,
    pub kubeconfig: PathBuf,
    pub cert_dir: PathBuf,
    pub node: String,
    /// How long the request may stay unanswered ([`ANSWER_TIMEOUT`] as kubelet).
    pub timeout: Duration,
}

/// What the bootstrap did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Joined {
    /// The kubeconfig's certificate is usable: nothing asked.
    Kept,
    /// A certificate was issued for the request of this name, and the kubeconfig written.
    Issued { request: String },
}

#[derive(Debug, thiserror::Error)]
pub enum BootstrapError {
    #[error("node {node}: cannot use the bootstrap kubeconfig {}: {why}", path.display())]
    BootstrapKubeconfig { node: String, path: PathBuf, why: String },
    #[error("node {node}: {}: {source}", path.display())]
    File { node: String, path: PathBuf, source: std::io::Error },
    #[error("node {0}: cannot make the private key or the certificate request: {1}")]
    Key(String, rcgen::Error),
    #[error("node {node}: cannot ask for a client certificate: {why}")]
    Request { node: String, why: String },
    #[error(
        "node {node}: certificate signing request {name} was denied (reason {reason:?}, message {message:?}); the node asks again once it is deleted (`kubectl delete csr {name}`)"
    )]
    Denied { node: String, name: String, reason: String, message: String },
    #[error(
        "node {node}: certificate signing request {name} failed (reason {reason:?}, message {message:?})"
    )]
    Failed { node: String, name: String, reason: String, message: String },
    #[error(
        "node {node}: certificate signing request {name} was not approved and signed within {timeout:?} (`kubectl certificate approve {name}` approves it)"
    )]
    Timeout { node: String, name: String, timeout: Duration },
    #[error(
        "node {node}: certificate signing request {name} was deleted or replaced while it was waited for"
    )]
    Gone { node: String, name: String },
    #[error("node {node}: the certificate issued for {name} is unusable: {why}")]
    Issued { node: String, name: String, why: Unusable },
}

/// Makes sure `b.kubeconfig` holds a usable client certificate, bootstrapping one when not.
pub async fn ensure(b: &Bootstrap) -> Result<Joined, BootstrapError> {
    match kubeconfig_certificate(&b.kubeconfig) {
        Ok(()) => return Ok(Joined::Kept),
        Err(why) => tracing::info!(
            node = %b.node,
            kubeconfig = %b.kubeconfig.display(),
            %why,
            "asking for the node's client certificate with the bootstrap kubeconfig"
        ),
    }
    let (access, client) = bootstrap_client(b).await?;
    let file_error = |path: &Path| {
        let (node, path) = (b.node.clone(), path.to_path_buf());
        move |source| BootstrapError::File { node, path, source }
    };
    std::fs::create_dir_all(&b.cert_dir).map_err(file_error(&b.cert_dir))?;
    let key = pending_key(b)?;
    let public_key = key.subject_public_key_info();
    let name = request_name(&public_key, &b.node);
    let pem = certificate_request(&key, &b.node).map_err(|e| BootstrapError::Key(b.node.clone(), e))?;
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let uid = create_or_find(&api, b, &name, &pem, &public_key).await?;
    let current = wait_and_keep(&api, b, &name, &uid, &key).await?;
    let pending = b.cert_dir.join(PENDING_KEY_FILE);
    if let Err(e) = std::fs::remove_file(&pending) {
        tracing::warn!(node = %b.node, path = %pending.display(), error = %e, "pending key not removed");
    }
    let config = kubeconfig(&access, &current.to_string_lossy());
    let text = serde_saphyr::to_string(&config).expect("a kubeconfig serializes");
    write_private(&b.kubeconfig, text.as_bytes()).map_err(file_error(&b.kubeconfig))?;
    tracing::info!(node = %b.node, request = name, kubeconfig = %b.kubeconfig.display(), "client certificate issued");
    Ok(Joined::Issued { request: name })
}

/// kubelet's client certificate rotation (`--rotate-certificates`): once the current
/// certificate is 70–90 % through its life, a new key and a request made with the node's own
/// credentials (`client`; the API names it `csr-…`), waited for and kept as the current
/// certificate, which the kubeconfig written by [`ensure`] points at; then `rotated` is told
/// the request's name. Only a kubeconfig that uses the certificate directory's current file is
/// rotated. A failed request is asked again after a minute.
pub fn keep_rotating(
    client: Client,
    b: Bootstrap,
    rotated: tokio::sync::oneshot::Sender<String>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let current = b.cert_dir.join(CURRENT_FILE);
        if !uses_current_file(&b.kubeconfig, &current) {
            tracing::warn!(node = %b.node, kubeconfig = %b.kubeconfig.display(), "not rotated: the kubeconfig's certificate is not {}", current.display());
            return;
        }
        let Some((from, to)) = std::fs::read(&current).ok().and_then(|pem| validity(&pem)) else {
            tracing::warn!(node = %b.node, path = %current.display(), "not rotated: the current certificate is unreadable");
            return;
        };
        let deadline = rotation_deadline(from, to, jitter());
        let wait = deadline.saturating_sub(Timestamp::now().as_second()).max(0) as u64;
        tracing::info!(node = %b.node, rotate_in_s = wait, "client certificate rotation planned");
        tokio::time::sleep(Duration::from_secs(wait)).await;
        loop {
            match renew(client.clone(), &b).await {
                Ok(name) => {
                    let _ = rotated.send(name);
                    return;
                }
                Err(e) => {
                    tracing::warn!(node = %b.node, error = %e, "client certificate not rotated; again in a minute");
                    tokio::time::sleep(Duration::from_secs(60)).await;
                }
            }
        }
    })
}

/// Whether the kubeconfig's client certificate is the file `current`.
fn uses_current_file(kubeconfig: &Path, current: &Path) -> bool {
    let Ok(config) = Kubeconfig::read_from(kubeconfig) else { return false };
    let user = crate::client_cert::current_user(&config);
    user.and_then(|u| u.client_certificate.as_deref()).is_some_and(|file| Path::new(file) == current)
}

/// A number from 0 to 1, random; `KVOL_ROTATION_JITTER` fixes it (tests: a rotation at a known
/// point of the certificate's life).
fn jitter() -> f64 {
    if let Some(fixed) = std::env::var("KVOL_ROTATION_JITTER").ok().and_then(|v| v.parse().ok()) {
        return fixed;
    }
    let mut bytes = [0u8; 4];
    let _ = ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes);
    f64::from(u32::from_le_bytes(bytes)) / f64::from(u32::MAX)
}

/// One rotation: a new key, a request named by the API, the certificate kept as current.
async fn renew(client: Client, b: &Bootstrap) -> Result<String, BootstrapError> {
    let key = rcgen::KeyPair::generate().map_err(|e| BootstrapError::Key(b.node.clone(), e))?;
    let pem = certificate_request(&key, &b.node).map_err(|e| BootstrapError::Key(b.node.clone(), e))?;
    let mut object = request_object("", &pem);
    object.metadata.name = None;
    object.metadata.generate_name = Some("csr-".into());
    let api: Api<CertificateSigningRequest> = Api::all(client);
    let made = api.create(&PostParams::default(), &object).await.map_err(|e| BootstrapError::Request {
        node: b.node.clone(),
        why: format!("cannot create a request to rotate the client certificate: {e}"),
    })?;
    let (name, uid) = (made.metadata.name.unwrap_or_default(), made.metadata.uid.unwrap_or_default());
    wait_and_keep(&api, b, &name, &uid, &key).await?;
    tracing::info!(node = %b.node, request = name, "client certificate rotated");
    Ok(name)
}

/// Whether the kubeconfig at `path` has a usable client certificate.
pub fn kubeconfig_certificate(path: &Path) -> Result<(), Unusable> {
    if !path.exists() {
        return Err(Unusable::Missing);
    }
    let config = Kubeconfig::read_from(path).map_err(|e| Unusable::Unreadable(e.to_string()))?;
    let user = crate::client_cert::current_user(&config).ok_or(Unusable::NoCertificate)?;
    let pem = match (&user.client_certificate_data, &user.client_certificate) {
        (Some(data), _) => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD
                .decode(data.trim())
                .map_err(|e| Unusable::Unreadable(format!("client-certificate-data: {e}")))?
        }
        (None, Some(file)) => {
            std::fs::read(file).map_err(|e| Unusable::Unreadable(format!("{file}: {e}")))?
        }
        (None, None) => return Err(Unusable::NoCertificate),
    };
    judge_certificate(&pem, Timestamp::now().as_second())
}

/// The bootstrap kubeconfig's server and a client with its credentials.
async fn bootstrap_client(b: &Bootstrap) -> Result<(ServerAccess, Client), BootstrapError> {
    let bad = |why: String| BootstrapError::BootstrapKubeconfig {
        node: b.node.clone(),
        path: b.bootstrap_kubeconfig.clone(),
        why,
    };
    let config = Kubeconfig::read_from(&b.bootstrap_kubeconfig).map_err(|e| bad(e.to_string()))?;
    let access = ServerAccess::of(&config).map_err(bad)?;
    let client =
        crate::client::client(Some(&b.bootstrap_kubeconfig)).await.map_err(|e| bad(e.to_string()))?;
    Ok((access, client))
}

/// The private key of the request: the one a request not yet answered was made with (kept in
/// the certificate directory across restarts, as kubelet's), or a new one (ECDSA P-256) kept there.
fn pending_key(b: &Bootstrap) -> Result<rcgen::KeyPair, BootstrapError> {
    let path = b.cert_dir.join(PENDING_KEY_FILE);
    if let Ok(text) = std::fs::read_to_string(&path) {
        match rcgen::KeyPair::from_pem(&text) {
            Ok(key) => return Ok(key),
            Err(e) => {
                tracing::warn!(node = %b.node, path = %path.display(), error = %e, "pending key unreadable: a new one")
            }
        }
    }
    let key = rcgen::KeyPair::generate().map_err(|e| BootstrapError::Key(b.node.clone(), e))?;
    write_private(&path, key.serialize_pem().as_bytes()).map_err(|source| BootstrapError::File {
        node: b.node.clone(),
        path,
        source,
    })?;
    Ok(key)
}

/// Creates the request, or finds ours of the same name (a restart while it was pending); its
/// uid. An API server that does not answer yet is tried again for a minute.
async fn create_or_find(
    api: &Api<CertificateSigningRequest>,
    b: &Bootstrap,
    name: &str,
    pem: &str,
    public_key: &[u8],
) -> Result<String, BootstrapError> {
    let failed = |why: String| BootstrapError::Request { node: b.node.clone(), why };
    let start = Instant::now();
    let made = loop {
        match api.create(&PostParams::default(), &request_object(name, pem)).await {
            Ok(made) => break made,
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let found = api.get(name).await.map_err(|e| failed(format!("cannot read {name}: {e}")))?;
                if let Some(why) = incompatibility(&found, public_key) {
                    return Err(failed(format!("{name} exists and is not this node's request: {why}")));
                }
                tracing::info!(node = %b.node, request = name, "the request made before is still there: waiting for it");
                break found;
            }
            Err(e @ kube::Error::Api(_)) => return Err(failed(format!("cannot create {name}: {e}"))),
            Err(e) if start.elapsed() < SERVER_WAIT => {
                tracing::info!(node = %b.node, error = %e, "the api server does not answer yet");
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            Err(e) => return Err(failed(format!("cannot reach the api server: {e}"))),
        }
    };
    Ok(made.metadata.uid.unwrap_or_default())
}

/// Waits for the request `name` (`uid`) to be signed, checks the certificate it gets, and keeps
/// it with `key` as the current one; the current file's path.
async fn wait_and_keep(
    api: &Api<CertificateSigningRequest>,
    b: &Bootstrap,
    name: &str,
    uid: &str,
    key: &rcgen::KeyPair,
) -> Result<PathBuf, BootstrapError> {
    tracing::info!(node = %b.node, request = name, "waiting for the client certificate to be approved and signed");
    let certificate = wait_issued(api, b, name, uid).await?;
    judge_certificate(&certificate, Timestamp::now().as_second()).map_err(|why| BootstrapError::Issued {
        node: b.node.clone(),
        name: name.to_string(),
        why,
    })?;
    keep_certificate(b, &certificate, &key.serialize_pem())
}

/// Watches the request until it is issued, denied or failed, deleted, or `b.timeout` passes.
async fn wait_issued(
    api: &Api<CertificateSigningRequest>,
    b: &Bootstrap,
    name: &str,
    uid: &str,
) -> Result<Vec<u8>, BootstrapError> {
    let ended = |csr: Option<&CertificateSigningRequest>| match csr {
        Some(csr) if csr.metadata.uid.as_deref() == Some(uid) => answer(csr) != Answer::Pending,
        _ => true,
    };
    let deadline = Instant::now() + b.timeout;
    let (node, name_) = (b.node.clone(), name.to_string());
    let found = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let waited =
            tokio::time::timeout(left, kube::runtime::wait::await_condition(api.clone(), name, ended));
        match waited.await {
            Err(_) => return Err(BootstrapError::Timeout { node, name: name_, timeout: b.timeout }),
            Ok(Ok(found)) => break found,
            Ok(Err(e)) => {
                tracing::warn!(node = %b.node, request = name, error = %e, "watching the request: again");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    };
    let Some(csr) = found.filter(|csr| csr.metadata.uid.as_deref() == Some(uid)) else {
        return Err(BootstrapError::Gone { node, name: name_ });
    };
    match answer(&csr) {
        Answer::Issued(certificate) => Ok(certificate),
        Answer::Denied { reason, message } => {
            Err(BootstrapError::Denied { node, name: name_, reason, message })
        }
        Answer::Failed { reason, message } => {
            Err(BootstrapError::Failed { node, name: name_, reason, message })
        }
        Answer::Pending => unreachable!("the wait ends on an answer"),
    }
}

/// Keeps the certificate and its key in one PEM file of the certificate directory and points
/// [`CURRENT_FILE`] at it (kubelet's store); the current file's path.
fn keep_certificate(b: &Bootstrap, certificate: &[u8], key_pem: &str) -> Result<PathBuf, BootstrapError> {
    let issued = b.cert_dir.join(issued_file_name(Timestamp::now()));
    let current = b.cert_dir.join(CURRENT_FILE);
    let file_error = |path: &Path| {
        let (node, path) = (b.node.clone(), path.to_path_buf());
        move |source| BootstrapError::File { node, path, source }
    };
    let mut pem = certificate.to_vec();
    if !pem.ends_with(b"\n") {
        pem.push(b'\n');
    }
    pem.extend_from_slice(key_pem.as_bytes());
    write_private(&issued, &pem).map_err(file_error(&issued))?;
    let link = b.cert_dir.join(format!("{CURRENT_FILE}.tmp"));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink(issued.file_name().expect("a file name"), &link).map_err(file_error(&link))?;
    std::fs::rename(&link, &current).map_err(file_error(&current))?;
    Ok(current)
}

/// Writes `data` to `path` readable by its owner only, whole or not at all (its directory made
/// when missing, as kubelet writes its kubeconfig).
fn write_private(path: &Path, data: &[u8]) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let tmp = path.with_extension("kvol-tmp");
    let mut file =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp)?;
    file.write_all(data)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}
