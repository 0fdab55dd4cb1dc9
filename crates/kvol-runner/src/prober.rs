//! Runs one probe or lifecycle hook of a running container: exec through CRI's ExecSync, tcpSocket by connecting, httpGet by one HTTP/1.1 GET, over TLS for https without checking the certificate as kubelet (a status of 200–399 passes), grpc by the standard health service's Check (SERVING passes), each within its timeout.

use std::time::Duration;

use k8s_openapi::api::core::v1::{
    Container, ExecAction, GRPCAction, HTTPGetAction, LifecycleHandler, Probe, TCPSocketAction,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kvol_cri::{self as cri, CriClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// What a probe or a hook does: one of its actions.
#[derive(Clone, Copy, Debug, Default)]
pub struct Action<'a> {
    pub exec: Option<&'a ExecAction>,
    pub http_get: Option<&'a HTTPGetAction>,
    pub tcp_socket: Option<&'a TCPSocketAction>,
    pub grpc: Option<&'a GRPCAction>,
}

impl<'a> Action<'a> {
    pub fn of_probe(probe: &'a Probe) -> Action<'a> {
        Action {
            exec: probe.exec.as_ref(),
            http_get: probe.http_get.as_ref(),
            tcp_socket: probe.tcp_socket.as_ref(),
            grpc: probe.grpc.as_ref(),
        }
    }

    pub fn of_hook(hook: &'a LifecycleHandler) -> Action<'a> {
        Action {
            exec: hook.exec.as_ref(),
            http_get: hook.http_get.as_ref(),
            tcp_socket: hook.tcp_socket.as_ref(),
            grpc: None,
        }
    }
}

/// The probe's outcome: `Ok` passes, `Err` says why it failed.
pub async fn run(
    cri: &CriClient,
    container_id: &str,
    container: &Container,
    probe: &Probe,
    pod_ip: &str,
    timeout: Duration,
) -> Result<(), String> {
    run_action(cri, container_id, container, Action::of_probe(probe), pod_ip, timeout).await
}

/// Does `action` in (or towards) the container; a zero `timeout` is no limit for exec (as
/// kubelet runs a hook's command).
pub async fn run_action(
    cri: &CriClient,
    container_id: &str,
    container: &Container,
    action: Action<'_>,
    pod_ip: &str,
    timeout: Duration,
) -> Result<(), String> {
    if let Some(exec) = action.exec {
        let request = cri::ExecSyncRequest {
            container_id: container_id.to_string(),
            cmd: exec.command.clone().unwrap_or_default(),
            timeout: timeout.as_secs() as i64,
        };
        let answer = cri.exec_sync(request).await.map_err(|e| e.runtime_message())?;
        return match answer.exit_code {
            0 => Ok(()),
            code => Err(format!("command exited {code}: {}", String::from_utf8_lossy(&answer.stdout).trim())),
        };
    }
    if let Some(tcp) = action.tcp_socket {
        let host = tcp.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.to_string());
        let port = port_of(&tcp.port, container)?;
        let connect = tokio::net::TcpStream::connect((host.as_str(), port));
        return match tokio::time::timeout(timeout, connect).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("dial tcp {host}:{port}: {e}")),
            Err(_) => Err(format!("dial tcp {host}:{port}: i/o timeout")),
        };
    }
    if let Some(http) = action.http_get {
        let tls = http.scheme.as_deref().is_some_and(|s| s.eq_ignore_ascii_case("HTTPS"));
        let scheme = if tls { "https" } else { "http" };
        let host = http.host.clone().filter(|h| !h.is_empty()).unwrap_or_else(|| pod_ip.to_string());
        let port = port_of(&http.port, container)?;
        let path = http.path.clone().filter(|p| !p.is_empty()).unwrap_or_else(|| "/".to_string());
        let headers: Vec<(String, String)> =
            http.http_headers.iter().flatten().map(|h| (h.name.clone(), h.value.clone())).collect();
        return match tokio::time::timeout(timeout, http_get(&host, port, &path, &headers, tls)).await {
            Ok(Ok(status)) if (200..400).contains(&status) => Ok(()),
            Ok(Ok(status)) => Err(format!("HTTP probe failed with statuscode: {status}")),
            Ok(Err(e)) => Err(format!("Get \"{scheme}://{host}:{port}{path}\": {e}")),
            Err(_) => Err(format!("Get \"{scheme}://{host}:{port}{path}\": context deadline exceeded")),
        };
    }
    if let Some(grpc) = action.grpc {
        let port = u16::try_from(grpc.port).ok().filter(|p| *p > 0);
        let port = port.ok_or_else(|| format!("invalid port number: {}", grpc.port))?;
        let service = grpc.service.clone().unwrap_or_default();
        return match tokio::time::timeout(timeout, grpc_check(pod_ip, port, service)).await {
            Ok(outcome) => outcome,
            Err(_) => Err(format!("timeout: health rpc did not complete within {}s", timeout.as_secs_f64())),
        };
    }
    Err("no action: a probe or hook names exec, httpGet, tcpSocket or grpc".to_string())
}

/// One `grpc.health.v1.Health/Check` at `host:port`: passes when the service is SERVING.
async fn grpc_check(host: &str, port: u16, service: String) -> Result<(), String> {
    use tonic_health::pb::health_check_response::ServingStatus;
    let target = format!("http://{host}:{port}");
    let channel = tonic::transport::Endpoint::from_shared(target.clone())
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("failed to connect service {target:?} within the probe's timeout: {e}"))?;
    let mut client = tonic_health::pb::health_client::HealthClient::new(channel);
    let answer = client
        .check(tonic_health::pb::HealthCheckRequest { service })
        .await
        .map_err(|e| format!("health rpc failed: {}", e.message()))?
        .into_inner();
    match ServingStatus::try_from(answer.status) {
        Ok(ServingStatus::Serving) => Ok(()),
        Ok(other) => Err(format!("service unhealthy (responded with {:?})", other.as_str_name())),
        Err(_) => Err(format!("service unhealthy (responded with status {})", answer.status)),
    }
}

/// A probe's port: a number, or the name of one of the container's ports.
fn port_of(port: &IntOrString, container: &Container) -> Result<u16, String> {
    let number = match port {
        IntOrString::Int(n) => *n,
        IntOrString::String(name) => match name.parse::<i32>() {
            Ok(n) => n,
            Err(_) => container
                .ports
                .iter()
                .flatten()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port)
                .ok_or_else(|| format!("couldn't find port: {name} in container {}", container.name))?,
        },
    };
    u16::try_from(number).ok().filter(|n| *n > 0).ok_or_else(|| format!("invalid port number: {number}"))
}

/// One GET; the response's status code.
async fn http_get(
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
    tls: bool,
) -> Result<u16, String> {
    let stream = tokio::net::TcpStream::connect((host, port)).await.map_err(|e| format!("dial tcp: {e}"))?;
    if !tls {
        return exchange(stream, host, port, path, headers).await;
    }
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).map_err(|e| e.to_string())?;
    let stream =
        crate::insecure_tls::connector().connect(name, stream).await.map_err(|e| format!("tls: {e}"))?;
    exchange(stream, host, port, path, headers).await
}

/// One GET over `stream`; the answer's status code.
async fn exchange(
    mut stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
    host: &str,
    port: u16,
    path: &str,
    headers: &[(String, String)],
) -> Result<u16, String> {
    let mut request = format!(
        "GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.26\r\nAccept: */*\r\nConnection: close\r\n"
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    stream.write_all(request.as_bytes()).await.map_err(|e| e.to_string())?;
    let mut head = vec![0u8; 256];
    let mut read = 0;
    while read < head.len() && !head[..read].contains(&b'\n') {
        let n = stream.read(&mut head[read..]).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        read += n;
    }
    status_code(&String::from_utf8_lossy(&head[..read]))
}

/// The code of an HTTP status line (`HTTP/1.1 200 OK`).
fn status_code(head: &str) -> Result<u16, String> {
    let line = head.lines().next().unwrap_or_default();
    let mut words = line.split_whitespace();
    match (words.next(), words.next().and_then(|c| c.parse().ok())) {
        (Some(version), Some(code)) if version.starts_with("HTTP/") => Ok(code),
        _ => Err(format!("malformed HTTP response {line:?}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ports_and_status_lines() {
        let container: Container = serde_json::from_value(serde_json::json!({
            "name": "c", "ports": [{"name": "http", "containerPort": 8080}]
        }))
        .unwrap();
        let cases = [
            (IntOrString::Int(80), Ok(80)),
            (IntOrString::String("http".into()), Ok(8080)),
            (IntOrString::String("9090".into()), Ok(9090)),
            (IntOrString::String("nope".into()), Err("couldn't find port: nope in container c".to_string())),
            (IntOrString::Int(0), Err("invalid port number: 0".to_string())),
        ];
        for (port, want) in cases {
            assert_eq!(port_of(&port, &container), want, "{port:?}");
        }
        assert_eq!(status_code("HTTP/1.1 204 No Content\r\n"), Ok(204));
        assert!(status_code("SSH-2.0\r\n").is_err());
    }

    #[tokio::test]
    async fn http_and_tcp_against_a_local_listener() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            for status in ["200 OK", "503 Service Unavailable"] {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut buf = [0u8; 1024];
                let n = stream.read(&mut buf).await.unwrap();
                assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /healthz HTTP/1.1\r\n"));
                stream.write_all(format!("HTTP/1.1 {status}\r\n\r\n").as_bytes()).await.unwrap();
            }
        });
        assert_eq!(http_get("127.0.0.1", port, "/healthz", &[], false).await, Ok(200));
        assert_eq!(http_get("127.0.0.1", port, "/healthz", &[], false).await, Ok(503));
        server.await.unwrap();
        assert!(http_get("127.0.0.1", port, "/", &[], false).await.unwrap_err().starts_with("dial tcp"));
    }

    #[tokio::test]
    async fn https_against_a_self_signed_server() {
        use std::sync::Arc;
        let made = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let key = rustls::pki_types::PrivateKeyDer::try_from(made.signing_key.serialize_der()).unwrap();
        let config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(vec![made.cert.der().clone()], key)
                .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let server = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(stream).await.unwrap();
            let mut buf = [0u8; 1024];
            let n = tls.read(&mut buf).await.unwrap();
            assert!(String::from_utf8_lossy(&buf[..n]).starts_with("GET /ready HTTP/1.1\r\n"));
            tls.write_all(b"HTTP/1.1 204 No Content\r\n\r\n").await.unwrap();
            tls.shutdown().await.unwrap();
        });
        assert_eq!(
            http_get("localhost", port, "/ready", &[], true).await,
            Ok(204),
            "a self-signed certificate is taken"
        );
        server.await.unwrap();
    }

    #[tokio::test]
    async fn grpc_against_a_local_health_service() {
        use tonic_health::ServingStatus;
        let (reporter, service) = tonic_health::server::health_reporter();
        reporter.set_service_status("shop", ServingStatus::Serving).await;
        reporter.set_service_status("cart", ServingStatus::NotServing).await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let incoming = tokio_stream::wrappers::TcpListenerStream::new(listener);
        let server = tokio::spawn(
            tonic::transport::Server::builder().add_service(service).serve_with_incoming(incoming),
        );
        assert_eq!(grpc_check("127.0.0.1", port, "shop".into()).await, Ok(()));
        assert_eq!(grpc_check("127.0.0.1", port, String::new()).await, Ok(()), "the server as a whole");
        assert_eq!(
            grpc_check("127.0.0.1", port, "cart".into()).await,
            Err("service unhealthy (responded with \"NOT_SERVING\")".into())
        );
        let unknown = grpc_check("127.0.0.1", port, "nope".into()).await.unwrap_err();
        assert!(unknown.starts_with("health rpc failed"), "{unknown}");
        server.abort();
        let refused = grpc_check("127.0.0.1", port, String::new()).await.unwrap_err();
        assert!(refused.starts_with("failed to connect service"), "{refused}");
    }
}
