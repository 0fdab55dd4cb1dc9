//! The client's failures name the call and the endpoint: no socket, and a socket that never answers.

use std::time::Duration;

use kvol_cri::{Code, CriClient, CriError, Deadlines, VersionRequest};

fn quick() -> Deadlines {
    Deadlines {
        short: Duration::from_millis(300),
        long: Duration::from_millis(300),
        pull: Duration::from_millis(300),
    }
}

#[tokio::test]
async fn no_socket_is_unavailable_naming_call_and_endpoint() {
    let dir = tempfile::tempdir().unwrap();
    let endpoint = format!("unix://{}/none.sock", dir.path().display());
    let client = CriClient::new(&endpoint, quick()).unwrap();
    let err = client.version(VersionRequest::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    let text = err.to_string();
    assert!(text.starts_with(&format!("cri Version at {endpoint}: ")), "{text}");
}

#[tokio::test]
async fn a_runtime_that_never_answers_ends_at_the_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mute.sock");
    // Accepts connections and never speaks.
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let held = tokio::spawn(async move {
        let mut kept = Vec::new();
        while let Ok((stream, _)) = listener.accept().await {
            kept.push(stream);
        }
    });
    let endpoint = format!("unix://{}", path.display());
    let client = CriClient::new(&endpoint, quick()).unwrap();
    let started = std::time::Instant::now();
    let err = client.version(VersionRequest::default()).await.unwrap_err();
    assert!(matches!(err, CriError::Deadline { call: "Version", .. }), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(err.to_string().contains(&endpoint), "{err}");
    held.abort();
}

#[tokio::test]
async fn only_unix_endpoints() {
    let err = CriClient::new("tcp://127.0.0.1:1", quick()).unwrap_err();
    assert_eq!(
        err.to_string(),
        "bad container runtime endpoint \"tcp://127.0.0.1:1\": scheme \"tcp\" is not supported (only unix://)"
    );
}
