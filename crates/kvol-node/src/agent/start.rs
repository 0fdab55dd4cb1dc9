//! Start-up, in order: the node's directories, the journal and the actual state rebuilt from it and the node, the plugins (the Flexvolume drivers on disk loaded first), reconstruction, and CSI registration.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret;
use kvol_csi::registration::{RegistrationWatcher, WatcherConfig};
use kvol_csi::{CsiRegistrationHandler, MemoryObjects, Timeouts};
use kvol_flex::prober::{FlexProber, ProberConfig};
use kvol_plugin::{Mounter, NodeInfo, NodePaths, PluginHost, PluginRegistry, SecretStore, SystemMounter};

use crate::actual::damage::{Opened, open_journal, record_rebuilt};
use crate::actual::repair::reconstruct_at_start;
use crate::actual::store::Store;
use crate::config::AgentConfig;
use crate::model::{ActualState, ObjectSet};
use crate::report::metrics::Metrics;

/// The example Flexvolume drivers the embedded default installs: directory name and script.
const EXAMPLE_FLEX_DRIVERS: [(&str, &[u8]); 2] = [
    ("kvol~tmpfs", include_bytes!("../../../../examples/flexvolume/kvol~tmpfs/tmpfs")),
    ("kvol~loop", include_bytes!("../../../../examples/flexvolume/kvol~loop/loop")),
];

/// Secrets as the current objects hold them, for plugins.
#[derive(Default)]
pub(super) struct ObjectSecrets(RwLock<BTreeMap<String, Secret>>);

impl std::fmt::Debug for ObjectSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let secrets = self.0.read().unwrap_or_else(|e| e.into_inner());
        f.debug_tuple("ObjectSecrets").field(&kvol_plugin::host::RedactedSecrets(&secrets)).finish()
    }
}

impl SecretStore for ObjectSecrets {
    fn get(&self, namespace: &str, name: &str) -> Option<Secret> {
        self.0.read().unwrap_or_else(|p| p.into_inner()).get(&format!("{namespace}/{name}")).cloned()
    }
}

/// How long start-up waits for the store's lock, which a process the previous agent started
/// can hold for a moment after that agent was killed (a child between fork and exec).
const STORE_LOCK_WAIT: Duration = Duration::from_secs(5);

/// How long start-up waits for the Flexvolume drivers on disk to load before the first plan.
/// A driver still undecided then (its `init` still running: hung, or slow) holds up only the
/// volumes that may be its own, never the others.
const FIRST_PROBE_WAIT: Duration = Duration::from_secs(1);

/// The agent's directories made, and every path under the root spelled one way (resolved): the
/// mount table holds resolved paths.
pub(super) fn prepare_dirs(mut config: AgentConfig) -> Result<AgentConfig, String> {
    let registration_dir = config.registration_dir();
    for dir in [&config.state_dir, &config.root_dir, &config.volume_plugin_dir, &registration_dir] {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    }
    for dir in [&mut config.state_dir, &mut config.root_dir, &mut config.volume_plugin_dir] {
        *dir = std::fs::canonicalize(&*dir).map_err(|e| format!("cannot resolve {}: {e}", dir.display()))?;
    }
    Ok(config)
}

/// The node's side of the agent once started: the plugin host, the journal, the plugins, and the
/// actual state as the journal and the node say it is.
pub(super) struct NodeParts {
    pub mounter: Arc<dyn Mounter>,
    pub secrets: Arc<ObjectSecrets>,
    pub host: PluginHost,
    pub store: Arc<Store>,
    pub registry: Arc<PluginRegistry>,
    pub metrics: Arc<Metrics>,
    pub prober: FlexProber,
    /// The actual state to start from, reconstruction included.
    pub actual: ActualState,
    /// Pod volume directories no plugin could be named for, with why.
    pub orphans_left: Vec<(PathBuf, String)>,
    /// The damaged journal kept aside at start, if any, as `kvol status` says it.
    pub journal_damage: Option<String>,
}

impl NodeParts {
    /// Opens the journal (a damaged one kept aside and a new one begun), stops the driver calls a dead predecessor left running, rebuilds the
    /// actual state from the journal and the node, loads the plugins, then reconstructs what
    /// the node has and no record accounts for.
    pub async fn open(config: &AgentConfig) -> Result<NodeParts, String> {
        let mounter: Arc<dyn Mounter> = Arc::new(SystemMounter);
        let secrets = Arc::new(ObjectSecrets::default());
        let node = NodeInfo {
            allocatable: config.allocatable.unwrap_or_else(|| measured_capacity(&config.root_dir)),
            ..NodeInfo::named(&config.node_name)
        };
        let host = PluginHost::new(NodePaths::new(&config.root_dir), node, Arc::clone(&mounter))
            .with_secrets(secrets.clone())
            .with_allowed_host_paths(config.allowed_host_paths.clone())
            .with_tokens(config.tokens.clone());
        let Opened { store, loaded, set_aside } =
            open_journal(&config.state_dir.join("state.redb"), STORE_LOCK_WAIT).await?;
        stop_leftover_driver_calls(config);
        let seen =
            crate::actual::observe::observe(&host.paths, mounter.as_ref()).map_err(|e| e.to_string())?;
        let rebuilt = crate::actual::rebuild::rebuild(&loaded.actual, &loaded.incomplete, &seen);
        for note in &rebuilt.notes {
            tracing::info!(%note, "rebuilt state");
        }
        let (registry, metrics, prober) = start_plugins(config, &host).await?;
        // Reconstruction, once the plugins on disk are known: what the node has and no record
        // accounts for becomes an uncertain record, torn down (or published again) through its
        // plugin; what no plugin can be named for is cleared when empty, else reported.
        let (actual, orphans_left) = reconstruct_at_start(&rebuilt, &seen, &registry);
        let (store, set_aside) = record_rebuilt(store, set_aside, &actual)?;
        let (store, journal_damage) = (Arc::new(store), set_aside.map(|a| a.problem()));
        tracing::info!(
            published = actual.published.len(),
            staged = actual.staged.len(),
            attached = actual.attached.len(),
            interrupted = loaded.incomplete.len(),
            reconstructed = actual.published.values().filter(|p| p.uncertain).count(),
            "actual state rebuilt"
        );
        Ok(NodeParts {
            mounter,
            secrets,
            host,
            store,
            registry,
            metrics,
            prober,
            actual,
            orphans_left,
            journal_damage,
        })
    }
}

/// Driver calls the previous agent left running are stopped first, so the mount table read
/// next is final and no call of the old agent races one of this agent on a volume.
fn stop_leftover_driver_calls(config: &AgentConfig) {
    let leftovers = kvol_flex::leftovers::find(&config.volume_plugin_dir);
    for call in &leftovers {
        tracing::warn!(pid = call.pid, command = %call.command_line, "killing a flexvolume driver call the previous agent left running");
    }
    for call in kvol_flex::leftovers::stop(&leftovers, Duration::from_secs(5)) {
        tracing::warn!(pid = call.pid, command = %call.command_line, "a leftover flexvolume driver call is still there after SIGKILL");
    }
}

/// The compiled-in plugins registered and the Flexvolume prober started; the drivers already
/// on disk load before the first plan (bounded: a driver's `init` has its own deadline), so it
/// does not see their volumes as unresolved.
async fn start_plugins(
    config: &AgentConfig,
    host: &PluginHost,
) -> Result<(Arc<PluginRegistry>, Arc<Metrics>, FlexProber), String> {
    let (compiled, _) = kvol_plugin::catalog::compiled_in(host, &config.gates);
    let registry = Arc::new(PluginRegistry::new(compiled).map_err(|e| e.to_string())?);
    let metrics = Metrics::new();
    if config.example_flex_drivers {
        install_example_flex_drivers(config)?;
    }
    let prober =
        FlexProber::start(ProberConfig::new(&config.volume_plugin_dir), host.clone(), Arc::clone(&registry))
            .map_err(|e| e.to_string())?;
    let mut flex_progress = prober.progress();
    let first_probe = flex_progress.wait_for(|p| p.rescans >= 1 && !p.busy);
    if tokio::time::timeout(FIRST_PROBE_WAIT, first_probe).await.is_err() {
        tracing::warn!(dir = %config.volume_plugin_dir.display(), waited_s = FIRST_PROBE_WAIT.as_secs(), "flexvolume drivers still loading; starting without them (their volumes wait, no other does)");
    }
    Ok((registry, metrics, prober))
}

/// CSI drivers as they register: the handler that turns a registration into a plugin (and the
/// CSINode and the Node's annotation), the watcher of the registration directory, and the
/// sockets there at start.
pub(super) struct CsiParts {
    pub objects: MemoryObjects,
    pub handler: Arc<CsiRegistrationHandler>,
    pub watcher: RegistrationWatcher,
    /// The drivers registered before this start: the cluster is not told the node's storage
    /// until they are back or gone (see `may_report`).
    pub sockets_at_start: Vec<PathBuf>,
}

impl CsiParts {
    pub fn start(config: &AgentConfig, node: &NodeParts) -> Result<CsiParts, String> {
        let objects = MemoryObjects::new();
        let handler = Arc::new(
            CsiRegistrationHandler::new(
                Arc::clone(&node.registry),
                Arc::new(objects.clone()),
                node.host.clone(),
                &config.gates,
                Timeouts::with_call(config.csi_call_timeout),
            )
            .with_observer(node.metrics.clone())
            .with_attachments(config.attachments.clone())
            .with_tokens(config.tokens.clone()),
        );
        let sockets_at_start = kvol_csi::registration::sockets_under(&config.registration_dir());
        let watcher =
            RegistrationWatcher::start(WatcherConfig::new(config.registration_dir()), handler.clone())
                .map_err(|e| e.to_string())?;
        Ok(CsiParts { objects, handler, watcher, sockets_at_start })
    }
}

/// The Flexvolume drivers in `dir` (as `vendor/driver`) that `prober` has not decided on yet.
pub(super) fn undecided_flex_drivers(dir: &std::path::Path, prober: &FlexProber) -> BTreeSet<String> {
    let decided: BTreeSet<String> = prober.status().into_iter().map(|d| d.name).collect();
    let Ok(entries) = std::fs::read_dir(dir) else { return BTreeSet::new() };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().to_str().map(kvol_flex::naming::driver_name))
        .filter(|name| !decided.contains(name))
        .collect()
}

/// Copies the example drivers' scripts into the Flexvolume directory with the atomic
/// installer (unchanged ones are left alone).
fn install_example_flex_drivers(config: &AgentConfig) -> Result<(), String> {
    let scratch = config.state_dir.join(".flex-install");
    std::fs::create_dir_all(&scratch).map_err(|e| format!("cannot create {}: {e}", scratch.display()))?;
    for (dir_name, script) in EXAMPLE_FLEX_DRIVERS {
        let source = scratch.join(dir_name);
        std::fs::write(&source, script).map_err(|e| format!("cannot write {}: {e}", source.display()))?;
        std::fs::set_permissions(&source, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| format!("cannot chmod {}: {e}", source.display()))?;
        kvol_flex::install::install(&source, &config.volume_plugin_dir, dir_name)
            .map_err(|e| e.to_string())?;
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(())
}

pub(super) fn secrets_from(secrets: &ObjectSecrets, objects: &ObjectSet) {
    let mut map = secrets.0.write().unwrap_or_else(|p| p.into_inner());
    if *map != objects.secrets {
        *map = objects.secrets.clone();
    }
}

/// The node's capacity: its CPUs, its memory (`MemTotal`), and the filesystem of `root_dir`;
/// zero where they cannot be read.
pub fn measured_capacity(root_dir: &std::path::Path) -> kvol_api::projection::NodeResources {
    let cpus = std::thread::available_parallelism().map_or(0, |n| n.get() as u64);
    let memory_kib = std::fs::read_to_string("/proc/meminfo").ok().and_then(|text| {
        let line = text.lines().find(|l| l.starts_with("MemTotal:"))?;
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    let storage = kvol_plugin::plugin::VolumeStats::of_filesystem(root_dir)
        .ok()
        .and_then(|stats| stats.capacity_bytes)
        .unwrap_or(0);
    kvol_api::projection::NodeResources {
        cpu_millis: cpus * 1000,
        memory_bytes: memory_kib.unwrap_or(0).saturating_mul(1024),
        ephemeral_storage_bytes: storage,
    }
}
