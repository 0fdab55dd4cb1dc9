//! Objects in: where the agent's object sets come from — a manifests directory ([`manifests`], read by [`parse`]), code ([`ChannelSource`]), or (in `kvol-cluster`) an API server.
//!
//! May import `model` and `kvol-plugin`'s watched directory; the rest of the loop reads
//! sources only through [`ObjectSource`], and nothing here imports the loop's other rooms.

use std::sync::Arc;

use tokio::sync::watch;

use crate::model::ObjectSet;

pub mod manifests;
pub mod parse;

pub use manifests::{
    Landing, MAX_DELAY, ManifestsSource, OpenWrites, QUIET, Quiet, SourceError, is_relevant, landing,
};
pub use parse::{
    DEFAULT_NAMESPACE, ManifestMemory, Object, ParseCache, is_manifest_name, load_dir, load_dir_cached,
    parse_manifests, parse_values, static_pod_uid,
};

/// Where the agent's objects come from: the manifests directory standalone, an API server's
/// watches in a cluster, or code that embeds kvol ([`ChannelSource`]). The agent reads the
/// current set on every pass and wakes when a new one is sent.
pub trait ObjectSource: Send + Sync {
    /// The object set as last known.
    fn current(&self) -> Arc<ObjectSet>;
    /// A receiver woken by every new object set.
    fn subscribe(&self) -> watch::Receiver<Arc<ObjectSet>>;
    /// Stops the source; receivers keep the last set.
    fn shutdown(self: Box<Self>);
}

/// An [`ObjectSource`] fed by code: whatever [`ChannelSource::send`] gets is the agent's next
/// object set. For embedding kvol, and for tests of the agent without a directory.
#[derive(Debug, Clone)]
pub struct ChannelSource {
    sets: Arc<watch::Sender<Arc<ObjectSet>>>,
}

impl ChannelSource {
    /// A source whose current set is `first`.
    pub fn new(first: ObjectSet) -> ChannelSource {
        ChannelSource { sets: Arc::new(watch::channel(Arc::new(first)).0) }
    }

    /// Makes `objects` the current set and wakes the agent.
    pub fn send(&self, objects: ObjectSet) {
        self.sets.send_replace(Arc::new(objects));
    }
}

impl ObjectSource for ChannelSource {
    fn current(&self) -> Arc<ObjectSet> {
        Arc::clone(&self.sets.borrow())
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ObjectSet>> {
        self.sets.subscribe()
    }

    fn shutdown(self: Box<Self>) {}
}

/// Sends `to` the set `from` has now, then every new one, until either side is gone (a pod
/// runner beside the agent gets the agent's objects so).
pub fn forward(mut from: watch::Receiver<Arc<ObjectSet>>, to: watch::Sender<Arc<ObjectSet>>) {
    tokio::spawn(async move {
        to.send_replace(Arc::clone(&from.borrow_and_update()));
        while from.changed().await.is_ok() {
            if to.send(Arc::clone(&from.borrow_and_update())).is_err() {
                return;
            }
        }
    });
}
