//! Referenced objects followed by watch (ConfigMaps and Secrets, claims and PersistentVolumes): one watch per object, shared by all its referrers, stopped when the last goes or the object is immutable.
//!
//! Kubelet's "Watch" change-detection strategy: a watch of one object (field selector
//! `metadata.name=<name>`) tells of a change as the API server makes it, where reading it
//! again every [`crate::watching::REFRESH`] would see it up to 30 s late. However many pods
//! reference an object, it has one watch. An immutable object cannot change: once seen, its
//! watch stops and its copy is kept for as long as something references it. Secrets pass
//! through here as values only: nothing here logs or formats one (logs carry the key). A
//! claim's or PersistentVolume's change (the resizer grew the volume, marked the claim's
//! filesystem for resizing) reaches the node within a second, not at the next reread.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Secret};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::mpsc;

use crate::refs;
use crate::watching::{Traffic, WatchBackoff};

/// A kind whose referenced objects are followed by watch.
pub(crate) trait Followed:
    Resource<DynamicType = ()> + Clone + PartialEq + DeserializeOwned + fmt::Debug + Send + Sync + 'static
{
    /// Whether the object can never change (`immutable: true`).
    fn immutable(&self) -> bool {
        false
    }

    /// Where the object of `key` (`namespace/name`, or a cluster-scoped name) is read and
    /// watched, and its name.
    fn api_of(client: Client, key: &str) -> (Api<Self>, &str);
}

/// [`Followed::api_of`] for a namespaced kind.
fn namespaced<K>(client: Client, key: &str) -> (Api<K>, &str)
where
    K: Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>,
{
    let (ns, name) = refs::split_key(key);
    (Api::namespaced(client, ns), name)
}

impl Followed for ConfigMap {
    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }

    fn api_of(client: Client, key: &str) -> (Api<Self>, &str) {
        namespaced(client, key)
    }
}

impl Followed for Secret {
    fn immutable(&self) -> bool {
        self.immutable == Some(true)
    }

    fn api_of(client: Client, key: &str) -> (Api<Self>, &str) {
        namespaced(client, key)
    }
}

impl Followed for PersistentVolumeClaim {
    fn api_of(client: Client, key: &str) -> (Api<Self>, &str) {
        namespaced(client, key)
    }
}

impl Followed for PersistentVolume {
    fn api_of(client: Client, key: &str) -> (Api<Self>, &str) {
        (Api::all(client), key)
    }
}

/// What a watch tells of its object.
enum Change<K> {
    /// The object as it is now (listed, added or modified).
    Seen(K),
    /// The object does not exist (deleted, or absent from a list).
    Gone,
    /// A list is complete: the object is as last told.
    Listed,
    /// The watch failed; it is retried, and the last known object stays.
    Failed,
}

/// One thing a watch told, tagged with the watch, as a stopped watch's messages may still
/// be queued when a new watch of the same key starts.
struct Message<K> {
    key: String,
    watch: u64,
    change: Change<K>,
}

/// A running watch task: aborted, and no longer counted, when dropped.
struct Watch {
    task: tokio::task::JoinHandle<()>,
    traffic: Arc<Traffic>,
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
        self.traffic.watch_stopped();
    }
}

/// One followed object.
struct Entry<K> {
    object: Option<K>,
    /// Whether its first list is in (or its watch failed before one was).
    settled: bool,
    /// The id its watch's messages carry.
    id: u64,
    /// `None` once the object was seen immutable.
    watch: Option<Watch>,
}

/// The followed objects of kind `K`, by `namespace/name`, and their watches.
pub(crate) struct Follows<K> {
    client: Client,
    traffic: Arc<Traffic>,
    entries: BTreeMap<String, Entry<K>>,
    next_id: u64,
    sender: mpsc::UnboundedSender<Message<K>>,
    receiver: mpsc::UnboundedReceiver<Message<K>>,
}

impl<K> fmt::Debug for Follows<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Keys only: the objects may be Secrets.
        f.debug_struct("Follows").field("keys", &self.entries.keys().collect::<Vec<_>>()).finish()
    }
}

impl<K: Followed> Follows<K> {
    pub(crate) fn new(client: Client, traffic: Arc<Traffic>) -> Follows<K> {
        let (sender, receiver) = mpsc::unbounded_channel();
        Follows { client, traffic, entries: BTreeMap::new(), next_id: 0, sender, receiver }
    }

    /// Follows exactly the `wanted` objects: a watch starts for each new key; the objects no
    /// longer wanted are forgotten and their watches stopped.
    pub(crate) fn follow(&mut self, wanted: &BTreeSet<String>) {
        self.entries.retain(|key, _| wanted.contains(key));
        for key in wanted {
            if !self.entries.contains_key(key) {
                let entry = self.start(key);
                self.entries.insert(key.clone(), entry);
            }
        }
    }

    fn start(&mut self, key: &str) -> Entry<K> {
        self.next_id += 1;
        let id = self.next_id;
        let (api, name) = K::api_of(self.client.clone(), key);
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let task = tokio::spawn(watch_one(
            watcher(api.clone(), config),
            Some((api, name.to_string())),
            key.to_string(),
            id,
            self.sender.clone(),
            Arc::clone(&self.traffic),
        ));
        self.traffic.watch_started();
        tracing::debug!(kind = %K::kind(&()), object = key, "watching a referenced object");
        Entry {
            object: None,
            settled: false,
            id,
            watch: Some(Watch { task, traffic: Arc::clone(&self.traffic) }),
        }
    }

    /// Waits until every followed object's first list is in (or its watch failed), taking in
    /// whatever the watches tell meanwhile.
    pub(crate) async fn settle(&mut self) {
        while self.entries.values().any(|e| !e.settled) {
            let message = self.next_message().await;
            self.apply(message);
        }
    }

    /// Waits for the next thing a watch tells, then takes it in with all that is queued;
    /// whether a followed object changed. Cancel-safe.
    pub(crate) async fn changed(&mut self) -> bool {
        let first = self.next_message().await;
        let mut changed = self.apply(first);
        while let Ok(message) = self.receiver.try_recv() {
            changed |= self.apply(message);
        }
        changed
    }

    async fn next_message(&mut self) -> Message<K> {
        match self.receiver.recv().await {
            Some(message) => message,
            // Never: `self` holds a sender.
            None => std::future::pending().await,
        }
    }

    /// Takes in one message of the running watch of its key (what a stopped one had queued
    /// is dropped: an immutable object's copy stays); whether the object changed.
    fn apply(&mut self, message: Message<K>) -> bool {
        let current = |e: &&mut Entry<K>| e.id == message.watch && e.watch.is_some();
        let Some(entry) = self.entries.get_mut(&message.key).filter(current) else {
            return false;
        };
        match message.change {
            Change::Seen(object) => {
                if object.immutable() && entry.watch.take().is_some() {
                    entry.settled = true;
                    tracing::debug!(kind = %K::kind(&()), object = %message.key, "immutable; its watch stops, the copy stays");
                }
                let changed = entry.object.as_ref() != Some(&object);
                entry.object = Some(object);
                changed
            }
            Change::Gone => entry.object.take().is_some(),
            Change::Listed | Change::Failed => {
                entry.settled = true;
                false
            }
        }
    }

    /// The followed objects that exist, by key.
    pub(crate) fn objects(&self) -> BTreeMap<String, K> {
        self.entries.iter().filter_map(|(key, e)| Some((key.clone(), e.object.clone()?))).collect()
    }
}

/// Runs one object's watch, telling `sender` what it sees, until aborted. A (re)list that
/// does not find the object says it is gone. When the API server forbids the watch (a role
/// that grants `get` only, so the agent cannot list the cluster's Secrets), the object is read
/// by name through `read` every [`crate::watching::REFRESH`] instead: slower to follow a change,
/// never blind to it.
async fn watch_one<K, S>(
    events: S,
    read: Option<(Api<K>, String)>,
    key: String,
    watch: u64,
    sender: mpsc::UnboundedSender<Message<K>>,
    traffic: Arc<Traffic>,
) where
    K: Followed,
    S: futures::Stream<Item = watcher::Result<watcher::Event<K>>> + Send,
{
    let mut events = std::pin::pin!(events.backoff(WatchBackoff::new()));
    let mut found = false;
    while let Some(event) = events.next().await {
        let changes = match event {
            Ok(watcher::Event::Init) => {
                found = false;
                continue;
            }
            Ok(watcher::Event::InitApply(object) | watcher::Event::Apply(object)) => {
                traffic.watched();
                found = true;
                vec![Change::Seen(object)]
            }
            Ok(watcher::Event::Delete(_)) => {
                traffic.watched();
                found = false;
                vec![Change::Gone]
            }
            Ok(watcher::Event::InitDone) if found => vec![Change::Listed],
            Ok(watcher::Event::InitDone) => vec![Change::Gone, Change::Listed],
            Err(e) if forbidden(&e) && read.is_some() => {
                tracing::warn!(kind = %K::kind(&()), object = %key, error = %e,
                    "not allowed to watch {key}; reading it by name every {:?} instead (grant list and watch, \
                     or run kvol with the node's credentials, for changes within a second)", crate::watching::REFRESH);
                let (api, name) = read.expect("checked");
                read_by_name(api, &name, key, watch, sender, traffic).await;
                return;
            }
            Err(e) => {
                tracing::warn!(kind = %K::kind(&()), object = %key, error = %e,
                    "watch of referenced object {key} failed; retrying, the last known object stays");
                vec![Change::Failed]
            }
        };
        for change in changes {
            if sender.send(Message { key: key.clone(), watch, change }).is_err() {
                return;
            }
        }
    }
}

/// Whether the API server refused a watch as forbidden (HTTP 403).
fn forbidden(error: &watcher::Error) -> bool {
    match error {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status))
        | watcher::Error::WatchFailed(kube::Error::Api(status)) => status.code == 403,
        watcher::Error::WatchError(status) => status.code == 403,
        _ => false,
    }
}

/// Follows one object by reading it by name every [`crate::watching::REFRESH`], telling
/// `sender` as a watch would, until aborted; a failed read keeps the last known object.
async fn read_by_name<K: Followed>(
    api: Api<K>,
    name: &str,
    key: String,
    watch: u64,
    sender: mpsc::UnboundedSender<Message<K>>,
    traffic: Arc<Traffic>,
) {
    loop {
        traffic.read();
        let changes = match api.get_opt(name).await {
            Ok(Some(object)) => vec![Change::Seen(object), Change::Listed],
            Ok(None) => vec![Change::Gone, Change::Listed],
            Err(e) => {
                tracing::warn!(kind = %K::kind(&()), object = %key, error = %e, "cannot read {key}; the last known object stays");
                vec![Change::Failed]
            }
        };
        for change in changes {
            if sender.send(Message { key: key.clone(), watch, change }).is_err() {
                return;
            }
        }
        tokio::time::sleep(crate::watching::REFRESH).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config_map(value: &str, immutable: bool) -> ConfigMap {
        ConfigMap {
            data: Some([("k".to_string(), value.to_string())].into()),
            immutable: immutable.then_some(true),
            ..ConfigMap::default()
        }
    }

    fn label(change: &Change<ConfigMap>) -> String {
        match change {
            Change::Seen(c) => format!("seen {}", c.data.as_ref().map(|d| d["k"].as_str()).unwrap_or("?")),
            Change::Gone => "gone".into(),
            Change::Listed => "listed".into(),
            Change::Failed => "failed".into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_watchs_events_become_changes_and_a_list_without_the_object_says_it_is_gone() {
        use watcher::Event;
        let events: Vec<watcher::Result<Event<ConfigMap>>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(config_map("1", false))),
            Ok(Event::InitDone),
            Ok(Event::Apply(config_map("2", false))),
            Ok(Event::Delete(config_map("2", false))),
            Err(watcher::Error::NoResourceVersion),
            // The relist after the failure: still gone.
            Ok(Event::Init),
            Ok(Event::InitDone),
            Ok(Event::Apply(config_map("3", false))),
            // A relist finding it.
            Ok(Event::Init),
            Ok(Event::InitApply(config_map("3", false))),
            Ok(Event::InitDone),
        ];
        let (sender, mut receiver) = mpsc::unbounded_channel();
        let traffic = Arc::new(Traffic::default());
        watch_one(futures::stream::iter(events), None, "ns/c".into(), 7, sender, Arc::clone(&traffic)).await;
        let mut seen = Vec::new();
        while let Ok(m) = receiver.try_recv() {
            assert_eq!((m.key.as_str(), m.watch), ("ns/c", 7));
            seen.push(label(&m.change));
        }
        let want =
            ["seen 1", "listed", "seen 2", "gone", "failed", "gone", "listed", "seen 3", "seen 3", "listed"];
        assert_eq!(seen, want);
        assert_eq!(traffic.count().watched_objects, 5, "applied, listed and deleted objects count");
    }

    /// A client whose every request fails at once (nothing listens on its port).
    fn unreachable_client() -> Client {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = kube::Config::new(format!("http://127.0.0.1:{port}").parse().unwrap());
        Client::try_from(config).expect("a client")
    }

    fn set(keys: &[&str]) -> BTreeSet<String> {
        keys.iter().map(|k| k.to_string()).collect()
    }

    fn told(follows: &Follows<ConfigMap>, key: &str, change: Change<ConfigMap>) {
        let watch = follows.entries[key].id;
        follows.sender.send(Message { key: key.into(), watch, change }).unwrap();
    }

    #[tokio::test]
    async fn one_watch_per_object_stopped_when_unreferenced_or_immutable_and_stale_news_ignored() {
        let traffic = Arc::new(Traffic::default());
        let mut follows: Follows<ConfigMap> = Follows::new(unreachable_client(), Arc::clone(&traffic));
        follows.follow(&set(&["ns/a", "ns/b"]));
        follows.follow(&set(&["ns/a", "ns/b"]));
        assert_eq!((traffic.count().object_watches, traffic.count().object_watches_started), (2, 2));
        // Failing watches settle (the first set is not held up by them), and know no object.
        tokio::time::timeout(std::time::Duration::from_secs(30), follows.settle()).await.expect("settled");
        assert!(follows.objects().is_empty());

        told(&follows, "ns/a", Change::Seen(config_map("1", false)));
        while !follows.changed().await {}
        assert_eq!(follows.objects()["ns/a"], config_map("1", false));
        // A failure (the API server away) keeps what was known.
        assert!(!follows.apply(Message {
            key: "ns/a".into(),
            watch: follows.entries["ns/a"].id,
            change: Change::Failed
        }));
        assert_eq!(follows.objects()["ns/a"], config_map("1", false));

        told(&follows, "ns/b", Change::Seen(config_map("frozen", true)));
        while !follows.changed().await {}
        assert_eq!(traffic.count().object_watches, 1, "b's watch stopped");
        // What b's stopped watch had queued after the immutable object is not taken.
        assert!(!follows.apply(Message {
            key: "ns/b".into(),
            watch: follows.entries["ns/b"].id,
            change: Change::Gone
        }));
        assert_eq!(follows.objects().keys().collect::<Vec<_>>(), ["ns/a", "ns/b"]);

        let old = follows.entries["ns/a"].id;
        follows.follow(&set(&["ns/b"]));
        assert_eq!(traffic.count().object_watches, 0);
        assert_eq!(follows.objects().keys().collect::<Vec<_>>(), ["ns/b"], "the immutable copy stays");

        // Referenced again: a new watch; what the old one had queued is not taken.
        follows.follow(&set(&["ns/a", "ns/b"]));
        assert_eq!((traffic.count().object_watches, traffic.count().object_watches_started), (1, 3));
        let stale =
            Message { key: "ns/a".into(), watch: old, change: Change::Seen(config_map("old", false)) };
        assert!(!follows.apply(stale));
        told(&follows, "ns/a", Change::Seen(config_map("2", false)));
        while !follows.changed().await {}
        assert_eq!(follows.objects()["ns/a"], config_map("2", false));
        told(&follows, "ns/a", Change::Gone);
        while !follows.changed().await {}
        assert_eq!(follows.objects().keys().collect::<Vec<_>>(), ["ns/b"]);
        assert_eq!(format!("{follows:?}"), r#"Follows { keys: ["ns/a", "ns/b"] }"#);
        drop(follows);
        assert_eq!(traffic.count().object_watches, 0);
    }
}
