//! A node's client certificate by kubelet's TLS bootstrap, the pure part: the CertificateSigningRequest kubelet makes and its name, whether a kubeconfig's certificate is still usable, what a request's status says, and the kubeconfig written for the issued certificate.

use std::collections::BTreeMap;

use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{CertificateSigningRequest, CertificateSigningRequestSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::config::{AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext};

/// The signer of nodes' client certificates (kubelet's `KubeAPIServerClientKubeletSignerName`).
pub const SIGNER: &str = "kubernetes.io/kube-apiserver-client-kubelet";
/// The usages kubelet asks for, in its order.
pub const USAGES: [&str; 3] = ["digital signature", "key encipherment", "client auth"];
/// The group of nodes' certificates.
pub const NODES_GROUP: &str = "system:nodes";
/// The private key of a request not yet answered, kept in the certificate directory so that a
/// restart asks again with the same key (the same request name), as kubelet's.
pub const PENDING_KEY_FILE: &str = "kubelet-client.key.tmp";
/// The link to the current certificate and key (one PEM), as kubelet's certificate store.
pub const CURRENT_FILE: &str = "kubelet-client-current.pem";

/// The user a node's certificate names: `system:node:<node>`.
pub fn node_user(node: &str) -> String {
    format!("system:node:{node}")
}

/// The request's name, kubelet's `digestedName`: `node-csr-` and the unpadded base64url of a
/// SHA-512/256 over the base64url of the public key (DER, SubjectPublicKeyInfo), the common
/// name, the organization and the usages, each followed by `|`. The same key asks under the
/// same name: a restart finds its request again.
pub fn request_name(public_key_der: &[u8], node: &str) -> String {
    use base64::Engine;
    let encode = |data: &[u8]| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(data);
    let mut input = String::new();
    let user = node_user(node);
    let parts = [public_key_der, user.as_bytes(), NODES_GROUP.as_bytes()];
    for part in parts.into_iter().chain(USAGES.iter().map(|u| u.as_bytes())) {
        input.push_str(&encode(part));
        input.push('|');
    }
    let digest = ring::digest::digest(&ring::digest::SHA512_256, input.as_bytes());
    format!("node-csr-{}", encode(digest.as_ref()))
}

/// The PKCS#10 request (PEM) for `node`'s client certificate: subject CN `system:node:<node>`,
/// O `system:nodes`, no extensions (the usages are the API object's).
pub fn certificate_request(key: &rcgen::KeyPair, node: &str) -> Result<String, rcgen::Error> {
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name = rcgen::DistinguishedName::new();
    params.distinguished_name.push(rcgen::DnType::CommonName, node_user(node));
    params.distinguished_name.push(rcgen::DnType::OrganizationName, NODES_GROUP);
    params.serialize_request(key)?.pem()
}

/// The API object of the request `pem` under `name`, for kubelet's signer and usages.
pub fn request_object(name: &str, pem: &str) -> CertificateSigningRequest {
    CertificateSigningRequest {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: CertificateSigningRequestSpec {
            request: ByteString(pem.as_bytes().to_vec()),
            signer_name: SIGNER.to_string(),
            usages: Some(USAGES.iter().map(|u| u.to_string()).collect()),
            ..Default::default()
        },
        status: None,
    }
}

/// Why a request of the same name found in the API is not ours to wait for (kubelet's
/// `ensureCompatible`): another signer, other usages, or another key.
pub fn incompatibility(found: &CertificateSigningRequest, public_key_der: &[u8]) -> Option<String> {
    if found.spec.signer_name != SIGNER {
        return Some(format!("its signer is {}, not {SIGNER}", found.spec.signer_name));
    }
    let usages: Vec<&str> = found.spec.usages.iter().flatten().map(String::as_str).collect();
    if usages != USAGES {
        return Some(format!("its usages are {usages:?}, not {USAGES:?}"));
    }
    match request_public_key(&found.spec.request.0) {
        Ok(key) if key == public_key_der => None,
        Ok(_) => Some("it was made with another private key".into()),
        Err(why) => Some(why),
    }
}

/// The public key (SubjectPublicKeyInfo, DER) of a PEM PKCS#10 request.
fn request_public_key(pem: &[u8]) -> Result<Vec<u8>, String> {
    use x509_parser::prelude::FromDer;
    let (_, block) =
        x509_parser::pem::parse_x509_pem(pem).map_err(|e| format!("its request is not PEM: {e}"))?;
    let (_, request) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents)
            .map_err(|e| format!("its request does not parse: {e}"))?;
    Ok(request.certification_request_info.subject_pki.raw.to_vec())
}

/// What a request's status says (kubelet's `WaitForCertificate`: a Denied or Failed condition
/// ends the wait; Approved with a certificate is done).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Answer {
    Pending,
    Issued(Vec<u8>),
    Denied { reason: String, message: String },
    Failed { reason: String, message: String },
}

pub fn answer(csr: &CertificateSigningRequest) -> Answer {
    let Some(status) = &csr.status else { return Answer::Pending };
    let mut approved = false;
    for condition in status.conditions.iter().flatten() {
        let said =
            || (condition.reason.clone().unwrap_or_default(), condition.message.clone().unwrap_or_default());
        match condition.type_.as_str() {
            "Denied" => {
                let (reason, message) = said();
                return Answer::Denied { reason, message };
            }
            "Failed" => {
                let (reason, message) = said();
                return Answer::Failed { reason, message };
            }
            "Approved" => approved = true,
            _ => {}
        }
    }
    match &status.certificate {
        Some(cert) if approved && !cert.0.is_empty() => Answer::Issued(cert.0.clone()),
        _ => Answer::Pending,
    }
}

/// Why a kubeconfig's client certificate cannot be used (kubelet's
/// `isClientConfigStillValid`): then the node bootstraps.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Unusable {
    #[error("it is missing")]
    Missing,
    #[error("it cannot be read: {0}")]
    Unreadable(String),
    #[error("it has no client certificate")]
    NoCertificate,
    #[error("its client certificate expired at {0}")]
    Expired(String),
}

/// Whether the client certificate(s) `pem` (the `CERTIFICATE` blocks; others, such as the key,
/// are passed over) are usable at `now` (unix seconds): some, every one parses, none expired.
pub fn judge_certificate(pem: &[u8], now: i64) -> Result<(), Unusable> {
    let mut count = 0;
    for block in x509_parser::pem::Pem::iter_from_buffer(pem) {
        let block = block.map_err(|e| Unusable::Unreadable(format!("not PEM: {e}")))?;
        if block.label != "CERTIFICATE" {
            continue;
        }
        let cert = block.parse_x509().map_err(|e| Unusable::Unreadable(format!("not a certificate: {e}")))?;
        let not_after = cert.validity().not_after;
        if now > not_after.timestamp() {
            return Err(Unusable::Expired(not_after.to_string()));
        }
        count += 1;
    }
    if count == 0 {
        return Err(Unusable::NoCertificate);
    }
    Ok(())
}

/// The validity of the first certificate in `pem`: not before, not after (unix seconds).
pub fn validity(pem: &[u8]) -> Option<(i64, i64)> {
    let block = x509_parser::pem::Pem::iter_from_buffer(pem).flatten().find(|b| b.label == "CERTIFICATE")?;
    let cert = block.parse_x509().ok()?;
    Some((cert.validity().not_before.timestamp(), cert.validity().not_after.timestamp()))
}

/// When kubelet's certificate manager rotates a certificate valid from `not_before` to
/// `not_after` (unix seconds): at 70 % to 90 % of its life, where in that span chosen by
/// `jitter` (0 to 1, random per node, so that nodes that joined together do not rotate together).
pub fn rotation_deadline(not_before: i64, not_after: i64, jitter: f64) -> i64 {
    let life = (not_after - not_before).max(0) as f64;
    not_before + (life * (0.7 + 0.2 * jitter.clamp(0.0, 1.0))).round() as i64
}

/// How the bootstrap kubeconfig reaches the API server, kept in the kubeconfig written.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ServerAccess {
    pub server: String,
    pub certificate_authority: Option<String>,
    pub certificate_authority_data: Option<String>,
    pub insecure: bool,
}

impl ServerAccess {
    /// The current context's cluster of `config`, or why there is none.
    pub fn of(config: &Kubeconfig) -> Result<ServerAccess, String> {
        let context_name = config.current_context.as_deref().ok_or("it has no current-context")?;
        let context = config
            .contexts
            .iter()
            .find(|c| c.name == context_name)
            .and_then(|c| c.context.as_ref())
            .ok_or_else(|| format!("its context {context_name} is missing"))?;
        let cluster = config
            .clusters
            .iter()
            .find(|c| c.name == context.cluster)
            .and_then(|c| c.cluster.as_ref())
            .ok_or_else(|| format!("its cluster {} is missing", context.cluster))?;
        Ok(ServerAccess {
            server: cluster
                .server
                .clone()
                .ok_or_else(|| format!("its cluster {} has no server", context.cluster))?,
            // A file's CA wins over data, as kubelet writes it.
            certificate_authority_data: match &cluster.certificate_authority {
                Some(_) => None,
                None => cluster.certificate_authority_data.clone(),
            },
            certificate_authority: cluster.certificate_authority.clone(),
            insecure: cluster.insecure_skip_tls_verify.unwrap_or(false),
        })
    }
}

/// The user of `config`'s current context.
pub fn current_user(config: &Kubeconfig) -> Option<&AuthInfo> {
    let context_name = config.current_context.as_deref()?;
    let context = config.contexts.iter().find(|c| c.name == context_name)?.context.as_ref()?;
    let user = context.user.as_deref()?;
    config.auth_infos.iter().find(|a| a.name == user)?.auth_info.as_ref()
}

/// The kubeconfig kubelet writes after its bootstrap (`writeKubeconfigFromBootstrapping`): the
/// bootstrap kubeconfig's server, the certificate and key both from `pem_path`.
pub fn kubeconfig(access: &ServerAccess, pem_path: &str) -> Kubeconfig {
    Kubeconfig {
        clusters: vec![NamedCluster {
            name: "default-cluster".into(),
            cluster: Some(Cluster {
                server: Some(access.server.clone()),
                insecure_skip_tls_verify: access.insecure.then_some(true),
                certificate_authority: access.certificate_authority.clone(),
                certificate_authority_data: access.certificate_authority_data.clone(),
                ..Default::default()
            }),
            other: BTreeMap::new(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: "default-auth".into(),
            auth_info: Some(AuthInfo {
                client_certificate: Some(pem_path.into()),
                client_key: Some(pem_path.into()),
                ..Default::default()
            }),
            other: BTreeMap::new(),
        }],
        contexts: vec![NamedContext {
            name: "default-context".into(),
            context: Some(Context {
                cluster: "default-cluster".into(),
                user: Some("default-auth".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: BTreeMap::new(),
        }],
        current_context: Some("default-context".into()),
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        ..Default::default()
    }
}

/// The file a certificate issued at `at` is kept in (kubelet's store:
/// `kubelet-client-2006-01-02-15-04-05.pem`, UTC), [`CURRENT_FILE`] linking to it.
pub fn issued_file_name(at: Timestamp) -> String {
    format!("kubelet-client-{}.pem", at.strftime("%Y-%m-%d-%H-%M-%S"))
}

#[cfg(test)]
#[path = "client_cert_tests.rs"]
mod tests;
