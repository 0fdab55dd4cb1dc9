//! `exec`, `attach` and `portForward` as kubelet serves them: the runtime is asked (CRI Exec, Attach, PortForward) for a session on its streaming server, and the caller's upgraded connection (SPDY or WebSocket, whichever it asked for) is spliced to that session.

use std::path::Path;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, Response, StatusCode};
use kvol_cri::{self as cri, CriClient};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::Body;

/// Which session a path asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Session {
    Exec { namespace: String, pod: String, container: String },
    Attach { namespace: String, pod: String, container: String },
    PortForward { namespace: String, pod: String },
}

impl Session {
    /// `/exec/{ns}/{pod}/{container}`, `/attach/…`, `/portForward/{ns}/{pod}`.
    pub fn of(path: &str) -> Option<Session> {
        let parts: Vec<String> = path.trim_start_matches('/').split('/').map(str::to_string).collect();
        match parts.as_slice() {
            [kind, namespace, pod, container] if kind == "exec" => Some(Session::Exec {
                namespace: namespace.clone(),
                pod: pod.clone(),
                container: container.clone(),
            }),
            [kind, namespace, pod, container] if kind == "attach" => Some(Session::Attach {
                namespace: namespace.clone(),
                pod: pod.clone(),
                container: container.clone(),
            }),
            [kind, namespace, pod] if kind == "portForward" => {
                Some(Session::PortForward { namespace: namespace.clone(), pod: pod.clone() })
            }
            _ => None,
        }
    }
}

/// A query's values for `key`, decoded (`%XX`, `+`), in order.
pub fn query_values(query: &str, key: &str) -> Vec<String> {
    query
        .split('&')
        .filter_map(|pair| pair.split_once('=').or(Some((pair, ""))))
        .filter(|(k, _)| *k == key)
        .map(|(_, v)| decode(v))
        .collect()
}

fn flag(query: &str, key: &str) -> bool {
    query_values(query, key).iter().any(|v| v == "1" || v == "true")
}

fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn text(status: StatusCode, body: String) -> Response<Body> {
    let mut response = Response::new(Full::new(Bytes::from(body)).boxed());
    *response.status_mut() = status;
    response
}

/// Asks the runtime for the session and splices the caller to it.
pub async fn serve(
    runner_dir: &Path,
    session: Session,
    request: Request<hyper::body::Incoming>,
) -> Response<Body> {
    match session_url(runner_dir, &session, request.uri().query().unwrap_or_default()).await {
        Ok(url) => proxy(&url, request).await,
        Err((status, why)) => text(status, format!("{why}\n")),
    }
}

/// The runner's status file: its pods and the runtime's endpoint.
fn runner_status(runner_dir: &Path) -> Option<kvol_runner::runner::StatusFile> {
    serde_json::from_slice(&std::fs::read(runner_dir.join(kvol_runner::runner::STATUS_FILE)).ok()?).ok()
}

/// The running container `container` of the pod `namespace/pod`, as the runtime has it now
/// (by kubelet's labels; the runner's status file may lag a moment behind a start).
async fn running_container(
    cri: &CriClient,
    namespace: &str,
    pod: &str,
    container: &str,
) -> Result<Option<String>, cri::CriError> {
    use kvol_runner::labels::{CONTAINER_NAME, POD_NAME, POD_NAMESPACE};
    let filter = cri::ContainerFilter {
        state: Some(cri::ContainerStateValue { state: cri::ContainerState::ContainerRunning as i32 }),
        label_selector: [(POD_NAMESPACE, namespace), (POD_NAME, pod), (CONTAINER_NAME, container)]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        ..Default::default()
    };
    let listed = cri.list_containers(cri::ListContainersRequest { filter: Some(filter) }).await?;
    Ok(listed.containers.into_iter().max_by_key(|c| c.created_at).map(|c| c.id))
}

async fn session_url(
    runner_dir: &Path,
    session: &Session,
    query: &str,
) -> Result<String, (StatusCode, String)> {
    let not_found = |what: String| (StatusCode::NOT_FOUND, what);
    let status = runner_status(runner_dir).ok_or_else(|| not_found("no pods run on this node".into()))?;
    let cri = CriClient::new(&status.endpoint, Default::default())
        .map_err(|e| (StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let failed = |e: cri::CriError| (StatusCode::INTERNAL_SERVER_ERROR, e.runtime_message());
    let running = async |namespace: &str, pod: &str, container: &str| {
        running_container(&cri, namespace, pod, container).await.map_err(failed)?.ok_or_else(|| {
            not_found(format!("container {container} of pod {namespace}/{pod} is not running on this node"))
        })
    };
    // kubelet's names for the streams (the API server's `stdin` is `input` here, and so on).
    let (stdin, stdout, stderr, tty) =
        (flag(query, "input"), flag(query, "output"), flag(query, "error"), flag(query, "tty"));
    match session {
        Session::Exec { namespace, pod, container } => {
            let container_id = running(namespace, pod, container).await?;
            let cmd = query_values(query, "command");
            let request = cri::ExecRequest { container_id, cmd, tty, stdin, stdout, stderr };
            cri.exec(request).await.map(|r| r.url).map_err(failed)
        }
        Session::Attach { namespace, pod, container } => {
            let container_id = running(namespace, pod, container).await?;
            let request = cri::AttachRequest { container_id, stdin, tty, stdout, stderr };
            cri.attach(request).await.map(|r| r.url).map_err(failed)
        }
        Session::PortForward { namespace, pod } => {
            let uid = status
                .pods
                .iter()
                .find(|p| p["pod"] == format!("{namespace}/{pod}").as_str())
                .and_then(|p| p["uid"].as_str().map(str::to_string));
            let uid = uid.ok_or_else(|| not_found(format!("pod {namespace}/{pod} is not on this node")))?;
            let filter = cri::PodSandboxFilter {
                label_selector: [("io.kubernetes.pod.uid".to_string(), uid)].into_iter().collect(),
                state: Some(cri::PodSandboxStateValue { state: cri::PodSandboxState::SandboxReady as i32 }),
                ..Default::default()
            };
            let listed = cri
                .list_pod_sandbox(cri::ListPodSandboxRequest { filter: Some(filter) })
                .await
                .map_err(failed)?;
            let sandbox = listed
                .items
                .into_iter()
                .next()
                .ok_or_else(|| not_found(format!("pod {namespace}/{pod} has no sandbox running")))?;
            let ports = query_values(query, "port").iter().filter_map(|p| p.parse().ok()).collect();
            cri.port_forward(cri::PortForwardRequest { pod_sandbox_id: sandbox.id, port: ports })
                .await
                .map(|r| r.url)
                .map_err(failed)
        }
    }
}

/// Sends the caller's request on to `url` (the runtime's streaming server), hands back its
/// answer, and after a `101 Switching Protocols` copies bytes both ways until either side ends.
async fn proxy(url: &str, request: Request<hyper::body::Incoming>) -> Response<Body> {
    let bad_gateway = |why: String| {
        text(StatusCode::BAD_GATEWAY, format!("the runtime's streaming server at {url}: {why}"))
    };
    let Some(rest) = url.strip_prefix("http://") else { return bad_gateway("not an http url".into()) };
    let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
    let mut backend = match tokio::net::TcpStream::connect(authority).await {
        Ok(stream) => stream,
        Err(e) => return bad_gateway(e.to_string()),
    };
    let mut head = format!(
        "{} {} HTTP/1.1\r\nHost: {authority}\r\n",
        request.method(),
        if path.is_empty() { "/" } else { path }
    );
    for (name, value) in request.headers().iter().filter(|(n, _)| *n != hyper::header::HOST) {
        head.push_str(&format!("{name}: {}\r\n", String::from_utf8_lossy(value.as_bytes())));
    }
    head.push_str("\r\n");
    if let Err(e) = backend.write_all(head.as_bytes()).await {
        return bad_gateway(e.to_string());
    }
    let (status, headers, leftover) = match read_head(&mut backend).await {
        Ok(parsed) => parsed,
        Err(why) => return bad_gateway(why),
    };
    let mut response = Response::new(Full::new(Bytes::new()).boxed());
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            hyper::header::HeaderName::from_bytes(name.as_bytes()),
            hyper::header::HeaderValue::from_bytes(&value),
        ) {
            response.headers_mut().append(name, value);
        }
    }
    if status != 101 {
        let mut body = leftover;
        let _ = tokio::time::timeout(std::time::Duration::from_secs(2), backend.read_to_end(&mut body)).await;
        *response.body_mut() = Full::new(Bytes::from(body)).boxed();
        return response;
    }
    tokio::spawn(async move {
        let Ok(upgraded) = hyper::upgrade::on(request).await else { return };
        let mut caller = hyper_util::rt::TokioIo::new(upgraded);
        if !leftover.is_empty() && caller.write_all(&leftover).await.is_err() {
            return;
        }
        let _ = tokio::io::copy_bidirectional(&mut caller, &mut backend).await;
    });
    response
}

/// The backend's response head: status, headers, and what came after it.
async fn read_head(
    backend: &mut tokio::net::TcpStream,
) -> Result<(u16, Vec<(String, Vec<u8>)>, Vec<u8>), String> {
    let mut buffer = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        let n = backend.read(&mut chunk).await.map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("it closed the connection before answering".into());
        }
        buffer.extend_from_slice(&chunk[..n]);
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        match parsed.parse(&buffer).map_err(|e| e.to_string())? {
            httparse::Status::Complete(end) => {
                let status = parsed.code.unwrap_or(502);
                let headers = parsed.headers.iter().map(|h| (h.name.to_string(), h.value.to_vec())).collect();
                return Ok((status, headers, buffer[end..].to_vec()));
            }
            httparse::Status::Partial if buffer.len() > 64 * 1024 => {
                return Err("its answer's head is too long".into());
            }
            httparse::Status::Partial => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_queries_as_the_api_server_sends_them() {
        assert_eq!(
            Session::of("/exec/default/web/main"),
            Some(Session::Exec { namespace: "default".into(), pod: "web".into(), container: "main".into() })
        );
        assert_eq!(
            Session::of("/portForward/default/web"),
            Some(Session::PortForward { namespace: "default".into(), pod: "web".into() })
        );
        assert_eq!(Session::of("/exec/default/web"), None);
        let query = "command=sh&command=-c&command=echo+hi%20there&output=1&input=true&tty=0";
        assert_eq!(query_values(query, "command"), ["sh", "-c", "echo hi there"]);
        assert!(
            flag(query, "output") && flag(query, "input") && !flag(query, "tty") && !flag(query, "error")
        );
    }
}
