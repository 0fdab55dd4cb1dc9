//! The node's taints as its Node has them, followed by one watch of the Node, for the runner's admission (kubelet's admission reads its Node's taints from its informer).

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client};
use tokio::sync::watch;

/// The taints of `node`, or none when it has no spec.
pub fn taints_of(node: &Node) -> Vec<Taint> {
    node.spec.as_ref().and_then(|spec| spec.taints.clone()).unwrap_or_default()
}

/// Follows the Node `name` and sends its taints to `taints` when they change, until the task is
/// aborted; a watch that fails is started again (with the watcher's backoff).
pub fn follow(client: Client, name: &str, taints: watch::Sender<Vec<Taint>>) -> tokio::task::JoinHandle<()> {
    let nodes: Api<Node> = Api::all(client);
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let name = name.to_string();
    tokio::spawn(async move {
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
                }
                Err(e) => tracing::warn!(node = %name, error = %e, "watching the node's taints"),
            }
        }
    })
}
