//! The API source: an `ObjectSource` fed by watches of this node's pods and of CSIDrivers, and by reads or watches of only the objects those pods reference.
//!
//! StorageClasses are read by name and read again every [`REFRESH`]; the claims,
//! PersistentVolumes, ConfigMaps and Secrets the pods and their volumes reference are followed
//! by one watch each (`follow.rs`), so a change (a volume grown by the resizer, a ConfigMap
//! edited) reaches the set as the API server makes it.
//!
//! kube-runtime's watcher resumes a broken watch from its resource version and lists again
//! after `410 Gone`; this module does neither itself. When the API server goes away the last
//! known objects stay the agent's desired state: nothing is dropped and nothing unmounted
//! until the API says a pod is gone.

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolume, PersistentVolumeClaim, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use kvol_node::model::ObjectSet;
use kvol_node::sources::ObjectSource;
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use crate::follow::Follows;
use crate::refs;
use crate::watching::WatchBackoff;
pub use crate::watching::{REFRESH, Traffic, TrafficCount, WATCH_BACKOFF};

/// An [`ObjectSource`] fed by the API server for the node `node_name`.
#[derive(Debug)]
pub struct ApiSource {
    sets: Arc<watch::Sender<Arc<ObjectSet>>>,
    task: tokio::task::JoinHandle<()>,
    traffic: Arc<Traffic>,
}

impl ApiSource {
    /// Starts the watches and returns once the first complete lists of the node's pods and of
    /// the CSIDrivers are in, and the objects those pods reference read or listed, so the
    /// agent's first pass never sees a node without its pods or their ConfigMaps and Secrets.
    pub async fn start(client: Client, node_name: &str) -> ApiSource {
        let pod_api: Api<Pod> = Api::all(client.clone());
        let driver_api: Api<CSIDriver> = Api::all(client.clone());
        let (pods, pod_writer) = reflector::store();
        let (drivers, driver_writer) = reflector::store();
        let pod_config = watcher::Config::default().fields(&format!("spec.nodeName={node_name}"));
        let pod_events =
            reflector::reflector(pod_writer, watcher(pod_api, pod_config)).backoff(WatchBackoff::new());
        let driver_events =
            reflector::reflector(driver_writer, watcher(driver_api, watcher::Config::default()))
                .backoff(WatchBackoff::new());
        let mut pod_events = Box::pin(pod_events);
        let mut driver_events = Box::pin(driver_events);
        let traffic = Arc::new(Traffic::default());
        // The first lists: drive both streams until both stores are ready.
        {
            let ready = async {
                let _ = tokio::join!(pods.wait_until_ready(), drivers.wait_until_ready());
            };
            tokio::pin!(ready);
            loop {
                tokio::select! {
                    _ = &mut ready => break,
                    event = pod_events.next() => { log_event("pods", event, &traffic); }
                    event = driver_events.next() => { log_event("csidrivers", event, &traffic); }
                }
            }
        }
        let mut state = State {
            claims: Follows::new(client.clone(), Arc::clone(&traffic)),
            volumes: Follows::new(client.clone(), Arc::clone(&traffic)),
            config_maps: Follows::new(client.clone(), Arc::clone(&traffic)),
            secrets: Follows::new(client.clone(), Arc::clone(&traffic)),
            client,
            pods,
            drivers,
            cache: Cache::default(),
            traffic: Arc::clone(&traffic),
        };
        let first = state.rebuild(false).await;
        let sets = Arc::new(watch::channel(Arc::new(first)).0);
        let task = tokio::spawn(run(state, pod_events, driver_events, Arc::clone(&sets)));
        ApiSource { sets, task, traffic }
    }

    /// What the source has taken from the API server since it started.
    pub fn traffic(&self) -> TrafficCount {
        self.traffic.count()
    }
}

/// Whether a watch event went well (logging it when not), counting the object it carries.
fn log_event<K, E: std::fmt::Display>(
    what: &str,
    event: Option<Result<watcher::Event<K>, E>>,
    traffic: &Traffic,
) -> bool {
    match event {
        Some(Ok(event)) => {
            if matches!(
                event,
                watcher::Event::Apply(_) | watcher::Event::InitApply(_) | watcher::Event::Delete(_)
            ) {
                traffic.watched();
            }
            true
        }
        Some(Err(e)) => {
            tracing::warn!(watch = what, error = %e, "api watch failed; retrying, the last known objects stay");
            false
        }
        None => false,
    }
}

async fn run<P, D, EP, ED>(
    mut state: State,
    mut pod_events: std::pin::Pin<Box<P>>,
    mut driver_events: std::pin::Pin<Box<D>>,
    sets: Arc<watch::Sender<Arc<ObjectSet>>>,
) where
    P: Stream<Item = Result<watcher::Event<Pod>, EP>>,
    D: Stream<Item = Result<watcher::Event<CSIDriver>, ED>>,
    EP: std::fmt::Display,
    ED: std::fmt::Display,
{
    let mut refresh = tokio::time::interval(REFRESH);
    refresh.tick().await;
    loop {
        let wake = tokio::select! {
            event = pod_events.next() => { if !log_event("pods", event, &state.traffic) { continue } Wake::Objects }
            event = driver_events.next() => { if !log_event("csidrivers", event, &state.traffic) { continue } Wake::Objects }
            changed = state.claims.changed() => { if !changed { continue } Wake::Objects }
            changed = state.volumes.changed() => { if !changed { continue } Wake::Objects }
            changed = state.config_maps.changed() => { if !changed { continue } Wake::Followed }
            changed = state.secrets.changed() => { if !changed { continue } Wake::Followed }
            _ = refresh.tick() => Wake::Reread,
        };
        let set = match wake {
            // The pods' store changes only as their stream is polled, each time followed by
            // a rebuild: its pods are the ones the references were taken from.
            Wake::Followed => state.object_set(&state.pods.state()),
            Wake::Objects => state.rebuild(false).await,
            Wake::Reread => state.rebuild(true).await,
        };
        sets.send_if_modified(|current| {
            if **current == set {
                return false;
            }
            *current = Arc::new(set);
            true
        });
    }
}

/// Why the source makes its set again.
enum Wake {
    /// A pod, CSIDriver, claim or PersistentVolume changed: what the pods reference may have
    /// too.
    Objects,
    /// A followed ConfigMap or Secret changed: the references did not.
    Followed,
    /// [`REFRESH`] is up: the objects read by name are read again.
    Reread,
}

struct State {
    client: Client,
    pods: Store<Pod>,
    drivers: Store<CSIDriver>,
    cache: Cache,
    claims: Follows<PersistentVolumeClaim>,
    volumes: Follows<PersistentVolume>,
    config_maps: Follows<ConfigMap>,
    secrets: Follows<Secret>,
    traffic: Arc<Traffic>,
}

/// The referenced objects last read, by key; an object the API said is gone is absent.
#[derive(Default)]
struct Cache {
    storage_classes: BTreeMap<String, StorageClass>,
}

impl State {
    /// The object set from the stores and the referenced objects; with `reread`, every
    /// StorageClass is read again, else only the ones not read yet. The claims, volumes,
    /// ConfigMaps and Secrets referenced are followed, and those newly referenced listed
    /// before the set is made (a claim before the volume it names).
    async fn rebuild(&mut self, reread: bool) -> ObjectSet {
        let pods: Vec<Arc<Pod>> = self.pods.state();
        let mut wanted = refs::pod_refs(pods.iter().map(|p| p.as_ref()));
        let client = Reader { client: self.client.clone(), traffic: Arc::clone(&self.traffic) };
        self.claims.follow(&wanted.claims);
        self.claims.settle().await;
        refs::add_claim_refs(&mut wanted, self.claims.objects().values());
        self.volumes.follow(&wanted.persistent_volumes);
        self.volumes.settle().await;
        refs::add_volume_refs(&mut wanted, self.volumes.objects().values());
        sync_cluster(&client, &mut self.cache.storage_classes, &wanted.storage_classes, reread).await;
        self.config_maps.follow(&wanted.config_maps);
        self.secrets.follow(&wanted.secrets);
        tokio::join!(self.config_maps.settle(), self.secrets.settle());
        self.object_set(&pods)
    }

    /// The set of `pods` (the store's, as the references were taken from) and what is known
    /// of the objects.
    fn object_set(&self, pods: &[Arc<Pod>]) -> ObjectSet {
        let mut set = ObjectSet::default();
        for pod in pods {
            let ns = pod.metadata.namespace.as_deref().unwrap_or(kvol_node::sources::DEFAULT_NAMESPACE);
            let name = pod.metadata.name.as_deref().unwrap_or_default();
            set.pods.insert(format!("{ns}/{name}"), Arc::clone(pod));
        }
        for driver in self.drivers.state() {
            set.csi_drivers
                .insert(driver.metadata.name.clone().unwrap_or_default(), CSIDriver::clone(&driver));
        }
        set.claims = self.claims.objects();
        set.persistent_volumes =
            self.volumes.objects().into_iter().map(|(name, pv)| (name, Arc::new(pv))).collect();
        set.storage_classes = self.cache.storage_classes.clone();
        set.secrets = self.secrets.objects();
        set.config_maps = self.config_maps.objects();
        set
    }
}

/// The client referenced objects are read with, and where the reads are counted.
struct Reader {
    client: Client,
    traffic: Arc<Traffic>,
}

/// Makes `cache` hold exactly the `wanted` cluster-scoped objects, reading the missing ones
/// (all with `reread`).
async fn sync_cluster<K>(
    client: &Reader,
    cache: &mut BTreeMap<String, K>,
    wanted: &std::collections::BTreeSet<String>,
    reread: bool,
) where
    K: Resource<Scope = k8s_openapi::ClusterResourceScope, DynamicType = ()>
        + Clone
        + DeserializeOwned
        + std::fmt::Debug,
{
    cache.retain(|key, _| wanted.contains(key));
    for key in wanted {
        if !reread && cache.contains_key(key) {
            continue;
        }
        let api: Api<K> = Api::all(client.client.clone());
        client.traffic.read();
        read_into(cache, key, api.get_opt(key).await);
    }
}

/// Records one read: found replaces, not found removes, a failed read keeps what was known.
fn read_into<K: Resource<DynamicType = ()>>(
    cache: &mut BTreeMap<String, K>,
    key: &str,
    read: kube::Result<Option<K>>,
) {
    match read {
        Ok(Some(object)) => {
            cache.insert(key.to_string(), object);
        }
        Ok(None) => {
            cache.remove(key);
        }
        Err(e) => {
            tracing::warn!(kind = %K::kind(&Default::default()), key, error = %e, "cannot read; the last known object stays")
        }
    }
}

impl ObjectSource for ApiSource {
    fn current(&self) -> Arc<ObjectSet> {
        Arc::clone(&self.sets.borrow())
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ObjectSet>> {
        self.sets.subscribe()
    }

    fn shutdown(self: Box<Self>) {
        self.task.abort();
    }
}
