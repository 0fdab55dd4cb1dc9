//! What the API source's parts share: the backoff a failed watch is retried on, how often referenced objects are read again, and the count of what was taken from the API server.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::time::Duration;

/// How a failed watch is retried: kvol's one backoff (`kvol_api::Backoff`), 500 ms doubling
/// to 8 s, reset by the first event after a failure. Quicker than kubelet's reflector (800 ms
/// to 30 s, jittered up to twice that, seen here to wait 47 s after a one-minute outage): a node
/// agent's watches are cheap to retry, and its pods wait for them. The watches of referenced
/// ConfigMaps and Secrets retry on it too.
#[derive(Debug)]
pub(crate) struct WatchBackoff {
    backoff: kvol_api::Backoff,
    failures: u32,
}

/// The bounds of [`WatchBackoff`].
pub const WATCH_BACKOFF: kvol_api::Backoff =
    kvol_api::Backoff { initial: Duration::from_millis(500), max: Duration::from_secs(8) };

impl WatchBackoff {
    pub(crate) fn new() -> WatchBackoff {
        WatchBackoff { backoff: WATCH_BACKOFF, failures: 0 }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        self.failures = self.failures.saturating_add(1);
        Some(self.backoff.delay(self.failures))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.failures = 0;
    }
}

/// How often the referenced claims, PersistentVolumes and StorageClasses are read again, so a
/// claim bound after its pod arrived is seen without a watch per object. (ConfigMaps and
/// Secrets are watched, not read again.)
pub const REFRESH: Duration = Duration::from_secs(30);

/// What the source has taken from the API server so far: the objects its watches delivered
/// (listed or changed), its reads of referenced objects, and its watches of single referenced
/// objects (running now, started in all). A node's load: it grows with the node's own pods
/// and the objects they reference, not with the cluster.
#[derive(Debug, Default)]
pub struct Traffic {
    watched_objects: AtomicU64,
    reads: AtomicU64,
    object_watches: AtomicU64,
    object_watches_started: AtomicU64,
}

/// A reading of [`Traffic`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TrafficCount {
    /// Objects the watches delivered: pods, CSIDrivers, followed ConfigMaps and Secrets.
    pub watched_objects: u64,
    /// Reads by name (claims, PersistentVolumes, StorageClasses).
    pub reads: u64,
    /// Watches of one referenced ConfigMap or Secret running now: one per object, however
    /// many pods share it; none for an immutable object once seen.
    pub object_watches: u64,
    /// Watches of one referenced object started since the source started.
    pub object_watches_started: u64,
}

impl Traffic {
    pub(crate) fn count(&self) -> TrafficCount {
        TrafficCount {
            watched_objects: self.watched_objects.load(Relaxed),
            reads: self.reads.load(Relaxed),
            object_watches: self.object_watches.load(Relaxed),
            object_watches_started: self.object_watches_started.load(Relaxed),
        }
    }

    pub(crate) fn watched(&self) {
        self.watched_objects.fetch_add(1, Relaxed);
    }

    pub(crate) fn read(&self) {
        self.reads.fetch_add(1, Relaxed);
    }

    pub(crate) fn watch_started(&self) {
        self.object_watches.fetch_add(1, Relaxed);
        self.object_watches_started.fetch_add(1, Relaxed);
    }

    pub(crate) fn watch_stopped(&self) {
        self.object_watches.fetch_sub(1, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_watch_is_retried_within_seconds_and_the_backoff_resets() {
        use kube::runtime::utils::Backoff;
        let mut backoff = WatchBackoff::new();
        let ms: Vec<u128> = (0..6).map(|_| backoff.next().unwrap().as_millis()).collect();
        assert_eq!(ms, [500, 1000, 2000, 4000, 8000, 8000]);
        backoff.reset();
        assert_eq!(backoff.next(), Some(Duration::from_millis(500)));
    }
}
