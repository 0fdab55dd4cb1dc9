//! kubelet's API on a kvol node (`--port`, 10250) for the API server: `/healthz`, `/containerLogs/{namespace}/{pod}/{container}` (follow, previous, tailLines, timestamps, sinceSeconds, sinceTime, limitBytes), and `/exec`, `/attach` and `/portForward` spliced to the runtime's streaming server, so `kubectl logs`, `exec`, `attach` and `port-forward` work through the API server.
//!
//! Over TLS (the `--tls-cert-file` pair, else a self-signed certificate for the node). A caller
//! is a client certificate of `--client-ca-file` (the API server's
//! `--kubelet-client-certificate`) or a bearer token the API server's TokenReview knows; its
//! request is allowed by a SubjectAccessReview (`--authorization-mode Webhook`, the default) or
//! outright (`AlwaysAllow`) — [`auth`]. `/healthz` answers anyone; no anonymous caller gets
//! further. `/metrics` is the agent's metrics endpoint, passed through.

pub mod auth;
pub mod logs;
pub mod reviews;
pub mod streams;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody, combinators::BoxBody};
use hyper::body::Frame;
use hyper::{Request, Response, StatusCode};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;
use tokio::sync::{mpsc, watch};

use crate::logs::{LogOptions, render};

/// How the API is served.
#[derive(Clone, Debug)]
pub struct KubeletApiConfig {
    pub address: SocketAddr,
    /// The serving certificate and key (PEM files); none: a self-signed one for `node_name`.
    pub tls_files: Option<(PathBuf, PathBuf)>,
    /// The CA whose client certificates may call (PEM); none: callers are known by bearer
    /// token only.
    pub client_ca: Option<PathBuf>,
    /// How callers are known and what they may do.
    pub access: auth::Access,
    /// The agent's metrics endpoint (`/metrics` is passed through to it); none: not found.
    pub metrics_address: Option<SocketAddr>,
    pub node_name: String,
    /// The runner's directory (its `pods.json`).
    pub runner_dir: PathBuf,
    /// Where pods' log directories are.
    pub log_root: PathBuf,
}

/// Why the API could not be served.
#[derive(Debug, thiserror::Error)]
pub enum KubeletApiError {
    #[error("kubelet api: {0}")]
    Tls(String),
    #[error("kubelet api: cannot listen on {address}: {source}")]
    Listen { address: SocketAddr, source: std::io::Error },
}

pub(crate) type Body = BoxBody<Bytes, Infallible>;

/// Binds and serves until `stop` turns true.
pub async fn serve(config: KubeletApiConfig, mut stop: watch::Receiver<bool>) -> Result<(), KubeletApiError> {
    let tls = tls_config(&config)?;
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));
    let listener = tokio::net::TcpListener::bind(config.address)
        .await
        .map_err(|source| KubeletApiError::Listen { address: config.address, source })?;
    tracing::info!(
        address = %config.address,
        certificates = config.client_ca.is_some(),
        tokens = config.access.token_webhook,
        authorization = ?config.access.authorization,
        "kubelet api served"
    );
    let config = Arc::new(config);
    loop {
        let (stream, _) = tokio::select! {
            _ = stop.wait_for(|s| *s) => return Ok(()),
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => { tracing::warn!(error = %e, "kubelet api: accept failed"); continue }
            },
        };
        let (acceptor, config) = (acceptor.clone(), Arc::clone(&config));
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else { return };
            let certificate = tls.get_ref().1.peer_certificates().and_then(|c| c.first());
            let certificate = certificate.and_then(|c| auth::certificate_user(c.as_ref()));
            let service = hyper::service::service_fn(move |request| {
                let (config, certificate) = (Arc::clone(&config), certificate.clone());
                async move { Ok::<_, Infallible>(answer(&config, certificate.as_ref(), request).await) }
            });
            let io = hyper_util::rt::TokioIo::new(tls);
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(io, service)
                .with_upgrades()
                .await;
        });
    }
}

fn tls_config(config: &KubeletApiConfig) -> Result<rustls::ServerConfig, KubeletApiError> {
    let tls_error = |what: &str, e: &dyn std::fmt::Display| KubeletApiError::Tls(format!("{what}: {e}"));
    let (certs, key) = match &config.tls_files {
        Some((cert, key)) => (
            CertificateDer::pem_file_iter(cert)
                .and_then(|i| i.collect::<Result<Vec<_>, _>>())
                .map_err(|e| tls_error(&format!("cannot read {}", cert.display()), &e))?,
            PrivateKeyDer::from_pem_file(key)
                .map_err(|e| tls_error(&format!("cannot read {}", key.display()), &e))?,
        ),
        None => self_signed(&config.node_name, config.address)?,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| tls_error("protocol versions", &e))?;
    let builder = match &config.client_ca {
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_file_iter(ca)
                .map_err(|e| tls_error(&format!("cannot read {}", ca.display()), &e))?
            {
                let cert = cert.map_err(|e| tls_error(&format!("cannot read {}", ca.display()), &e))?;
                roots
                    .add(cert)
                    .map_err(|e| tls_error(&format!("{} holds no usable CA", ca.display()), &e))?;
            }
            let verifier =
                rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider)
                    .allow_unauthenticated()
                    .build()
                    .map_err(|e| tls_error("client verifier", &e))?;
            builder.with_client_cert_verifier(verifier)
        }
        None => builder.with_no_client_auth(),
    };
    builder.with_single_cert(certs, key).map_err(|e| tls_error("serving certificate", &e))
}

/// A self-signed serving certificate for the node's name and address.
fn self_signed(
    node: &str,
    address: SocketAddr,
) -> Result<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), KubeletApiError> {
    let mut names = vec![node.to_string(), "localhost".to_string()];
    if !address.ip().is_unspecified() {
        names.push(address.ip().to_string());
    }
    let made = rcgen::generate_simple_self_signed(names)
        .map_err(|e| KubeletApiError::Tls(format!("self-signed certificate: {e}")))?;
    let key = PrivateKeyDer::try_from(made.signing_key.serialize_der())
        .map_err(|e| KubeletApiError::Tls(e.to_string()))?;
    Ok((vec![made.cert.der().clone()], key))
}

fn text(status: StatusCode, body: impl Into<Bytes>) -> Response<Body> {
    let mut response = Response::new(Full::new(body.into()).boxed());
    *response.status_mut() = status;
    response
}

/// One request's answer; `certificate`: the user of the client certificate its session showed
/// (the verifier checked it against the CA; a session without one gets through the handshake
/// for `/healthz` and bearer tokens).
async fn answer(
    config: &KubeletApiConfig,
    certificate: Option<&auth::User>,
    request: Request<hyper::body::Incoming>,
) -> Response<Body> {
    let path = request.uri().path().to_string();
    let query = request.uri().query().unwrap_or_default().to_string();
    if path == "/healthz" {
        return text(StatusCode::OK, "ok");
    }
    if let Err(refusal) = admitted(config, certificate, &request).await {
        return match refusal {
            auth::Refusal::Unauthorized => text(StatusCode::UNAUTHORIZED, "Unauthorized"),
            auth::Refusal::Forbidden(why) => text(StatusCode::FORBIDDEN, why),
            auth::Refusal::Error(why) => text(StatusCode::INTERNAL_SERVER_ERROR, why),
        };
    }
    if path == "/metrics" {
        return metrics(config.metrics_address).await;
    }
    if let Some(session) = streams::Session::of(&path) {
        return streams::serve(&config.runner_dir, session, request).await;
    }
    match path.strip_prefix("/containerLogs/").map(|rest| rest.split('/').collect::<Vec<_>>()).as_deref() {
        Some([namespace, pod, container]) => container_logs(config, namespace, pod, container, &query).await,
        _ => text(StatusCode::NOT_FOUND, format!("not found: {path}\n")),
    }
}

/// Whether the request's caller is known and may make it.
async fn admitted<B>(
    config: &KubeletApiConfig,
    certificate: Option<&auth::User>,
    request: &Request<B>,
) -> Result<(), auth::Refusal> {
    let header = request.headers().get(hyper::header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    let user = config.access.authenticate(certificate, header).await?;
    let attributes = auth::attributes(request.method().as_str(), request.uri().path());
    config.access.authorize(&user, attributes, &config.node_name).await.inspect_err(|refusal| {
        tracing::info!(user = %user.name, verb = attributes.verb, subresource = attributes.subresource, ?refusal, "kubelet api: request refused");
    })
}

/// The agent's metrics, fetched from its own endpoint.
async fn metrics(address: Option<SocketAddr>) -> Response<Body> {
    let Some(address) = address else {
        return text(StatusCode::NOT_FOUND, "metrics are off on this node (--no-metrics)\n");
    };
    match fetch_metrics(address).await {
        Ok(body) => {
            let mut response = text(StatusCode::OK, body);
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        Err(e) => text(StatusCode::BAD_GATEWAY, format!("metrics at {address}: {e}\n")),
    }
}

async fn fetch_metrics(address: SocketAddr) -> Result<Bytes, String> {
    let stream = tokio::net::TcpStream::connect(address).await.map_err(|e| e.to_string())?;
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .map_err(|e| e.to_string())?;
    tokio::spawn(connection);
    let request = Request::get("/metrics")
        .header(hyper::header::HOST, address.to_string())
        .body(http_body_util::Empty::<Bytes>::new())
        .map_err(|e| e.to_string())?;
    let response = sender.send_request(request).await.map_err(|e| e.to_string())?;
    if !response.status().is_success() {
        return Err(format!("answered {}", response.status()));
    }
    Ok(response.into_body().collect().await.map_err(|e| e.to_string())?.to_bytes())
}

/// The pod's status and the container's, from the runner's status file.
fn find(runner_dir: &Path, namespace: &str, pod: &str, container: &str) -> Option<(Value, Value)> {
    let text = std::fs::read(runner_dir.join(kvol_runner::runner::STATUS_FILE)).ok()?;
    let status: kvol_runner::runner::StatusFile = serde_json::from_slice(&text).ok()?;
    let key = format!("{namespace}/{pod}");
    let pod = status.pods.into_iter().find(|p| p["pod"] == key.as_str())?;
    let found = ["initContainers", "containers"]
        .iter()
        .flat_map(|k| pod[*k].as_array().cloned().unwrap_or_default())
        .find(|c| c["name"] == container)?;
    Some((pod, found))
}

async fn container_logs(
    config: &KubeletApiConfig,
    namespace: &str,
    pod: &str,
    container: &str,
    query: &str,
) -> Response<Body> {
    let options = match LogOptions::parse(query, since_seconds_ago) {
        Ok(options) => options,
        Err(why) => return text(StatusCode::BAD_REQUEST, format!("{why}\n")),
    };
    let Some((pod_status, container_status)) = find(&config.runner_dir, namespace, pod, container) else {
        return text(
            StatusCode::NOT_FOUND,
            format!("container {container} of pod {namespace}/{pod} is not on this node\n"),
        );
    };
    let restarts = container_status["restartCount"].as_u64().unwrap_or(0);
    let attempt = match (options.previous, restarts) {
        (true, 0) => {
            return text(
                StatusCode::BAD_REQUEST,
                format!("previous terminated container \"{container}\" in pod \"{pod}\" not found\n"),
            );
        }
        (true, n) => n - 1,
        (false, n) => n,
    };
    let uid = pod_status["uid"].as_str().unwrap_or_default();
    let file = config
        .log_root
        .join(format!("{namespace}_{pod}_{uid}"))
        .join(container)
        .join(format!("{attempt}.log"));
    let log = tokio::fs::read_to_string(&file).await.unwrap_or_default();
    let first = render(&log, &options);
    if !options.follow || options.previous {
        return text(StatusCode::OK, first);
    }
    let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(16);
    let _ = tx.send(Ok(Frame::data(Bytes::from(first)))).await;
    let (runner_dir, names) =
        (config.runner_dir.clone(), (namespace.to_string(), pod.to_string(), container.to_string()));
    tokio::spawn(follow(file, log.len(), options, runner_dir, names, tx));
    Response::new(BodyExt::boxed(StreamBody::new(tokio_stream::wrappers::ReceiverStream::new(rx))))
}

/// Sends what is appended to the log until the container no longer runs or the client goes.
async fn follow(
    file: PathBuf,
    mut offset: usize,
    options: LogOptions,
    runner_dir: PathBuf,
    (namespace, pod, container): (String, String, String),
    tx: mpsc::Sender<Result<Frame<Bytes>, Infallible>>,
) {
    let options = LogOptions { tail_lines: None, limit_bytes: None, since: None, ..options };
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let bytes = tokio::fs::read(&file).await.unwrap_or_default();
        if let Some(end) = bytes.get(offset..).and_then(|rest| rest.iter().rposition(|b| *b == b'\n')) {
            let chunk = render(&String::from_utf8_lossy(&bytes[offset..offset + end + 1]), &options);
            offset += end + 1;
            if tx.send(Ok(Frame::data(Bytes::from(chunk)))).await.is_err() {
                return;
            }
        }
        let running =
            find(&runner_dir, &namespace, &pod, &container).is_some_and(|(_, c)| c["state"] == "running");
        if !running || tx.is_closed() {
            return;
        }
    }
}

/// RFC 3339 of `seconds` before now (UTC, seconds precision), as the log's times compare.
fn since_seconds_ago(seconds: u64) -> String {
    let now =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default().as_secs();
    rfc3339(now.saturating_sub(seconds))
}

/// Seconds since the epoch as `YYYY-MM-DDTHH:MM:SSZ` (the civil-from-days algorithm).
fn rfc3339(epoch: u64) -> String {
    let (days, rest) = ((epoch / 86_400) as i64, epoch % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z", rest / 3600, rest % 3600 / 60, rest % 60)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_as_the_log_writes_them() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_796_638_861), "2026-12-07T10:21:01Z");
    }

    #[tokio::test]
    async fn a_containers_log_from_the_runners_files() {
        let dir = tempfile::tempdir().unwrap();
        let (runner_dir, log_root) = (dir.path().join("runner"), dir.path().join("logs"));
        std::fs::create_dir_all(&runner_dir).unwrap();
        std::fs::create_dir_all(log_root.join("default_web_u1/main")).unwrap();
        let pods = r#"{"pods":[{"pod":"default/web","uid":"u1","containers":[{"name":"main","state":"running","restartCount":1}]}]}"#;
        std::fs::write(runner_dir.join("pods.json"), pods).unwrap();
        std::fs::write(log_root.join("default_web_u1/main/1.log"), "2026-12-07T10:00:00.1Z stdout F now\n")
            .unwrap();
        std::fs::write(
            log_root.join("default_web_u1/main/0.log"),
            "2026-12-07T09:00:00.1Z stdout F before\n",
        )
        .unwrap();
        let config = KubeletApiConfig {
            address: "127.0.0.1:0".parse().unwrap(),
            tls_files: None,
            client_ca: None,
            access: auth::Access::default(),
            metrics_address: None,
            node_name: "n1".into(),
            runner_dir,
            log_root,
        };
        let body = |r: Response<Body>| async move { r.into_body().collect().await.unwrap().to_bytes() };
        // (query, status, body)
        let cases = [
            ("", 200, "now\n"),
            ("previous=true", 200, "before\n"),
            ("tailLines=x", 400, "tailLines: \"x\" is not a number\n"),
        ];
        for (query, status, want) in cases {
            let answer = container_logs(&config, "default", "web", "main", query).await;
            assert_eq!(answer.status().as_u16(), status, "{query}");
            assert_eq!(body(answer).await, want.as_bytes(), "{query}");
        }
        let missing = container_logs(&config, "default", "db", "main", "").await;
        assert_eq!(missing.status(), StatusCode::NOT_FOUND);
    }
}
