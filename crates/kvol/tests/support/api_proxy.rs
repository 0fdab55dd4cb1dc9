//! A misbehaving API server for tests: a plain-HTTP proxy in front of a real kube-apiserver that forwards every request (watches streamed), or answers each with `429 Too Many Requests` or `500 Internal Server Error` while told to, cutting every open connection when told; it counts what it forwarded and refused.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use http_body_util::{BodyExt, Either, Full};
use hyper::body::{Bytes, Incoming};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

/// What the proxy does with each request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    Forward,
    TooManyRequests,
    InternalError,
}

/// Requests seen, by what became of them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub forwarded: u64,
    pub refused: u64,
}

struct Shared {
    client: kube::Client,
    answer: AtomicU8,
    forwarded: AtomicU64,
    refused: AtomicU64,
    /// Bumped to cut every open connection (its watches with it).
    cut: watch::Sender<u64>,
}

/// A running proxy on `port` of loopback; it runs on the runtime it was started on.
pub struct ApiProxy {
    pub port: u16,
    shared: Arc<Shared>,
}

impl ApiProxy {
    /// Serves on a free port of loopback, forwarding through `client` (the API server's
    /// admin client: its base URL and credentials). Call within a tokio runtime.
    pub async fn start(client: kube::Client) -> ApiProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("a port for the proxy");
        let port = listener.local_addr().unwrap().port();
        let shared = Arc::new(Shared {
            client,
            answer: AtomicU8::new(Answer::Forward as u8),
            forwarded: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            cut: watch::channel(0).0,
        });
        tokio::spawn(serve(listener, Arc::clone(&shared)));
        ApiProxy { port, shared }
    }

    /// From now on every request gets `answer`; with `cut`, the open connections (and the
    /// watches on them) end too, so what a client does next meets the new answer.
    pub fn set(&self, answer: Answer, cut: bool) {
        self.shared.answer.store(answer as u8, Ordering::SeqCst);
        if cut {
            self.shared.cut.send_modify(|n| *n += 1);
        }
    }

    pub fn counts(&self) -> Counts {
        Counts {
            forwarded: self.shared.forwarded.load(Ordering::SeqCst),
            refused: self.shared.refused.load(Ordering::SeqCst),
        }
    }
}

async fn serve(listener: tokio::net::TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else { continue };
        let shared = Arc::clone(&shared);
        let mut cut = shared.cut.subscribe();
        cut.mark_unchanged();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| answer(Arc::clone(&shared), request));
            let connection =
                hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), service);
            tokio::select! {
                _ = connection => {}
                _ = cut.changed() => {}
            }
        });
    }
}

type Body = Either<kube::client::Body, Full<Bytes>>;

async fn answer(shared: Arc<Shared>, request: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let refusal = match shared.answer.load(Ordering::SeqCst) {
        x if x == Answer::TooManyRequests as u8 => Some((StatusCode::TOO_MANY_REQUESTS, "TooManyRequests")),
        x if x == Answer::InternalError as u8 => Some((StatusCode::INTERNAL_SERVER_ERROR, "InternalError")),
        _ => None,
    };
    if let Some((code, reason)) = refusal {
        shared.refused.fetch_add(1, Ordering::SeqCst);
        return Ok(status(code, reason, "test proxy: refused"));
    }
    shared.forwarded.fetch_add(1, Ordering::SeqCst);
    let (parts, body) = request.into_parts();
    let body = body.collect().await.map(|b| b.to_bytes()).unwrap_or_default();
    let mut forward =
        Request::builder().method(parts.method).uri(parts.uri.path_and_query().map_or("/", |p| p.as_str()));
    for (name, value) in &parts.headers {
        if name != hyper::header::HOST && name != hyper::header::AUTHORIZATION {
            forward = forward.header(name, value);
        }
    }
    let forward = forward.body(kube::client::Body::from(body.to_vec())).expect("a request");
    match shared.client.send(forward).await {
        Ok(response) => Ok(response.map(Either::Left)),
        Err(e) => Ok(status(StatusCode::BAD_GATEWAY, "BadGateway", &format!("test proxy: {e}"))),
    }
}

/// A `Status` object answer, as the API server gives one.
fn status(code: StatusCode, reason: &str, message: &str) -> Response<Body> {
    let body = serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code.as_u16()});
    Response::builder()
        .status(code)
        .header(hyper::header::CONTENT_TYPE, "application/json")
        .header(hyper::header::RETRY_AFTER, "1")
        .body(Either::Right(Full::new(Bytes::from(body.to_string()))))
        .expect("a response")
}
