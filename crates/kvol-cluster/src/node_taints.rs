//! The node's taints as its Node has them, followed by one watch of the Node, for the runner's admission (kubelet's admission reads its Node's taints from its informer).

use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// The taints of `node`, or none when it has no spec.
pub fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec.as_ref().and_then(|spec| spec.taints.clone()).unwrap_or_default()
}

/// How long [`follow`] waits for the Node's first taints.
const FIRST_WAIT: Duration = Duration::from_secs(5);

/// Follows the Node `name` and sends its taints to `taints` when they change, until the task is
/// aborted; a watch that fails is started again (with the watcher's backoff). Returns once the
/// first taints are in (or after [`FIRST_WAIT`]), so that pods admitted after it are judged by them.
pub async fn follow(
    client: Client,
    name: &str,
    taints: watch::Sender<Vec<Taint>>,
) -> tokio::task::JoinHandle<()> {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_string();
    let (first_tx, first) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        let mut first_tx = Some(first_tx);
        let mut stream = std::pin::pin!(watcher(nodes, config).default_backoff().applied_objects());
        while let Some(event) = stream.next().await {
            match event {
                Ok(node) => {
                    let now = taints_of(&node);
                    taints.send_if_modified(|current| {
                        let changed = *current != now;
                        if changed {
                            tracing::info!(node = %name, taints = ?now, "node taints");
                            *current = now;
                        }
                        changed
                    });
                    if let Some(tx) = first_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Err(e) => tracing::warn!(node = %name, error = %e, "watching the node's taints"),
            }
        }
    });
    let _ = tokio::time::timeout(FIRST_WAIT, first).await;
    task
}
