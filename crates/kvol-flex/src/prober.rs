//! The Flexvolume prober: watches the driver directory, loads drivers as they come and go, and publishes them to the plugin registry.
//!
//! Discovery runs on its own task and never on the lookup path: it publishes through
//! [`PluginRegistry::apply`] (one driver changed) and [`PluginRegistry::replace`] (a full
//! rescan), and lookups read the registry's snapshot.
//!
//! Watches are explicit and one level deep: the plugin directory and each driver directory
//! (`vendor~driver`), never recursive. The driver layout is one level, so that is everything
//! that matters; a driver cannot make the prober spend inotify watches on a deep tree; a
//! symlink out of the plugin directory is never watched (the trust check refuses it before the
//! watch is added); and the prober adds a driver directory's watch itself, *before* it looks
//! inside, so a file created right after its directory is either seen by that look or reported
//! by the watch. (notify's recursive mode adds the watch only after the directory's Create has
//! been handed out, and a probe run in between would miss the file for good.)
//!
//! The pure parts: [`classify`] maps a notify event to the driver directory it concerns and
//! what to do; [`Pending`] coalesces (last event per driver wins, and an event for a driver
//! whose probe is already queued adds nothing: the watch thread drops it without waking
//! anyone, and the first such event has that driver's directory watch dropped until the probe
//! starts and adds it back before it looks, so a storm costs a few events a second instead of
//! every event); [`Scheduler`] decides when a
//! driver may be probed (one probe at a time per driver, at most one `init` per
//! `min_reprobe_interval`, and the last request is always run eventually, by a trailing
//! probe). The I/O around them: the notify handler, the discovery task and the probe tasks.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use kvol_plugin::catalog::NotRegistered;
use kvol_plugin::{DynamicSource, PluginHost, PluginKind, PluginRef, PluginRegistry, ProbeEvent};
use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{Notify, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::driver::CallLimits;
use crate::error::{FlexError, Result};
use crate::install::DEFAULT_PLUGIN_DIR;
use crate::plugin::FlexVolumePlugin;
use crate::protocol::DriverCapabilities;
use crate::{naming, trust};

/// How the prober is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProberConfig {
    /// The plugin directory holding one `vendor~driver` directory per driver.
    pub dir: PathBuf,
    /// At most one `init` of one driver per this interval, however many events arrive.
    pub min_reprobe_interval: Duration,
    /// The owner every driver directory and executable must have (root on a real node).
    pub owner_uid: u32,
    /// Limits on the driver calls, `init` included.
    pub limits: CallLimits,
}

impl Default for ProberConfig {
    fn default() -> Self {
        ProberConfig {
            dir: PathBuf::from(DEFAULT_PLUGIN_DIR),
            min_reprobe_interval: Duration::from_secs(1),
            owner_uid: 0,
            limits: CallLimits::default(),
        }
    }
}

impl ProberConfig {
    /// The defaults, for the plugin directory `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> ProberConfig {
        ProberConfig { dir: dir.into(), ..ProberConfig::default() }
    }
}

/// How the last probe of a driver went.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DriverState {
    /// `init` succeeded and the plugin is registered.
    Loaded { capabilities: DriverCapabilities },
    /// The driver is not registered, and why.
    Failed { reason: String },
}

/// One driver directory the prober knows, with the result of its last probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbedDriver {
    /// The directory name, `vendor~driver`.
    pub dir: String,
    /// The plugin name `vendor/driver` (the directory name when it is not a valid one).
    pub name: String,
    pub state: DriverState,
}

impl ProbedDriver {
    /// The row `kvol plugins` shows for a driver that did not load.
    pub fn not_registered(&self) -> Option<NotRegistered> {
        match &self.state {
            DriverState::Loaded { .. } => None,
            DriverState::Failed { reason } => Some(NotRegistered {
                name: self.name.clone(),
                kind: PluginKind::Flexvolume,
                reason: reason.clone(),
            }),
        }
    }
}

/// Counters of the discovery task, for waiting on it (tests, readiness).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Probes and removals finished.
    pub completed: u64,
    /// Probes that ran the driver's `init`.
    pub inits: u64,
    /// Full rescans finished (the first scan included).
    pub rescans: u64,
    /// Whether events are waiting or probes are queued or running.
    pub busy: bool,
}

// ---------------------------------------------------------------------------------------------
// Pure decisions: events to actions, coalescing, scheduling.

/// What one driver directory needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    /// Probe it (load, reload, or find it broken).
    Probe,
    /// It or its executable went away: remove it at once, unless it is back by then.
    Gone,
}

/// What an event asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Re-list the plugin directory and probe everything (queue overflow, watcher errors).
    Rescan,
    /// The plugin directory itself was removed or moved: recreate it, watch it, rescan.
    PluginDirChanged,
    Driver {
        dir: String,
        op: Op,
    },
}

/// The file name of the executable of driver directory `dir_name` (`vendor~driver` → `driver`).
fn executable_name(dir_name: &str) -> &str {
    dir_name.rsplit('~').next().unwrap_or(dir_name)
}

fn is_dot(name: &[u8]) -> bool {
    name.first() == Some(&b'.')
}

/// What `event` asks of the prober watching `plugin_dir`.
pub fn classify(plugin_dir: &Path, event: &Event) -> Vec<Action> {
    let mut actions = Vec::new();
    for_each_action(plugin_dir, event, |found| {
        actions.push(match found {
            Found::Rescan => Action::Rescan,
            Found::PluginDirChanged => Action::PluginDirChanged,
            Found::Driver(dir, op) => Action::Driver { dir: dir.to_string(), op },
        });
    });
    actions
}

/// An action as [`for_each_action`] finds it, borrowing the driver directory from the event.
enum Found<'a> {
    Rescan,
    PluginDirChanged,
    Driver(&'a str, Op),
}

/// Calls `found` for each action `event` asks for; allocates nothing (events arrive in storms).
fn for_each_action<'a>(plugin_dir: &Path, event: &'a Event, mut found: impl FnMut(Found<'a>)) {
    if event.need_rescan() {
        return found(Found::Rescan);
    }
    match event.kind {
        // A finished write is a change; opens and reads are not (running `init` opens the driver).
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => {}
        EventKind::Access(_) => return,
        // notify reports each half of a rename as well; the pair adds nothing.
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => return,
        EventKind::Other => return found(Found::Rescan),
        _ => {}
    }
    let gone =
        matches!(event.kind, EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)));
    let renamed = matches!(event.kind, EventKind::Modify(ModifyKind::Name(_)));
    let prefix = plugin_dir.as_os_str().as_encoded_bytes();
    for path in &event.paths {
        // Byte slices rather than `Path::strip_prefix`/`components`: this runs once per event.
        let Some(rel) = relative_bytes(path.as_os_str().as_encoded_bytes(), prefix) else { continue };
        let mut parts = rel.split(|b| *b == b'/').filter(|p| !p.is_empty() && *p != b".");
        let Some(first) = parts.next() else {
            if gone || renamed {
                found(Found::PluginDirChanged);
            }
            continue;
        };
        let second = parts.next();
        // The atomic-install convention: `.driver` is a copy in progress, `.x/` is not a driver.
        let mut deeper = false;
        let dotted = is_dot(first) || second.is_some_and(is_dot) || {
            let mut rest = parts.peekable();
            deeper = rest.peek().is_some();
            rest.any(is_dot)
        };
        if dotted {
            continue;
        }
        let Ok(dir) = std::str::from_utf8(first) else {
            tracing::debug!(path = %path.display(), "ignoring a driver directory whose name is not UTF-8");
            continue;
        };
        let removes_driver = !deeper && second.is_none_or(|name| name == executable_name(dir).as_bytes());
        let op = if gone && removes_driver { Op::Gone } else { Op::Probe };
        found(Found::Driver(dir, op));
    }
}

/// `path` below `prefix` (empty for `prefix` itself), or none when it is not below it.
fn relative_bytes<'a>(path: &'a [u8], prefix: &[u8]) -> Option<&'a [u8]> {
    let rest = path.strip_prefix(prefix.strip_suffix(b"/").unwrap_or(prefix))?;
    (rest.is_empty() || rest[0] == b'/').then_some(rest)
}

/// Actions recorded since the discovery task last looked: one op per driver, the last one.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Pending {
    pub rescan: bool,
    pub plugin_dir_changed: bool,
    pub drivers: BTreeMap<String, Op>,
    /// Drivers that already have a probe queued behind the rate limit or a running probe: a
    /// probe it would start later reads what any event until then changed, so such events
    /// are dropped here without waking the discovery task (what keeps event storms cheap).
    pub held: BTreeSet<String>,
    /// Held drivers whose directory watch the discovery task is asked to drop: the first event
    /// dropped as held asks, so a storm stops reaching the process at all until the probe, which
    /// adds the watch again before it looks (kubelet's "mark dirty, look later", done by the kernel).
    pub quiet: BTreeSet<String>,
    /// Held drivers whose directory watch is dropped (or being dropped); cleared when their
    /// probe starts.
    pub quieted: BTreeSet<String>,
}

impl Pending {
    /// Records `action`; false when it adds nothing to what is recorded or held already.
    pub fn record(&mut self, action: Action) -> bool {
        match action {
            Action::Rescan => !std::mem::replace(&mut self.rescan, true),
            Action::PluginDirChanged => !std::mem::replace(&mut self.plugin_dir_changed, true),
            Action::Driver { dir, op: Op::Probe } if self.held.contains(&dir) => self.ask_quiet(&dir),
            Action::Driver { dir, op } => self.drivers.insert(dir, op) != Some(op),
        }
    }

    /// [`Pending::record`] without allocating when the action adds nothing.
    fn record_found(&mut self, found: Found<'_>) -> bool {
        match found {
            Found::Rescan => self.record(Action::Rescan),
            Found::PluginDirChanged => self.record(Action::PluginDirChanged),
            Found::Driver(dir, Op::Probe) if self.held.contains(dir) => self.ask_quiet(dir),
            Found::Driver(dir, op) if self.drivers.get(dir) == Some(&op) => false,
            Found::Driver(dir, op) => self.record(Action::Driver { dir: dir.to_string(), op }),
        }
    }

    /// Asks once per held period for held driver `dir`'s watch to be dropped; false when asked already.
    fn ask_quiet(&mut self, dir: &str) -> bool {
        if self.quieted.contains(dir) || self.quiet.contains(dir) {
            return false;
        }
        self.quiet.insert(dir.to_string())
    }

    /// Takes the recorded actions (and requests to quiet), leaving `held` and `quieted` in place.
    pub fn take_actions(&mut self) -> Pending {
        Pending {
            rescan: std::mem::take(&mut self.rescan),
            plugin_dir_changed: std::mem::take(&mut self.plugin_dir_changed),
            drivers: std::mem::take(&mut self.drivers),
            quiet: std::mem::take(&mut self.quiet),
            ..Pending::default()
        }
    }

    pub fn is_empty(&self) -> bool {
        !self.rescan && !self.plugin_dir_changed && self.drivers.is_empty() && self.quiet.is_empty()
    }
}

#[derive(Debug, Default)]
struct Slot {
    queued: Option<Op>,
    in_flight: bool,
    /// When the last `init` of this driver started.
    last_init: Option<Instant>,
    /// The next op started belongs to the running rescan.
    in_round: bool,
}

/// An op the scheduler lets start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Start {
    pub dir: String,
    pub op: Op,
    /// Part of a full rescan: the rescan completes when all its ops finished.
    pub round: bool,
}

/// When each driver may be probed: one op at a time per driver, a `Probe` at most once per
/// `min_interval` after the last `init` started (later requests coalesce into one trailing
/// probe), a `Gone` at once.
#[derive(Debug)]
pub struct Scheduler {
    min_interval: Duration,
    slots: BTreeMap<String, Slot>,
    /// The drivers a running full rescan still waits for.
    round: Option<BTreeSet<String>>,
}

impl Scheduler {
    pub fn new(min_interval: Duration) -> Scheduler {
        Scheduler { min_interval, slots: BTreeMap::new(), round: None }
    }

    /// Queues `op` for `dir`, replacing what was queued (the last request wins).
    pub fn enqueue(&mut self, dir: &str, op: Op) {
        self.slots.entry(dir.to_string()).or_default().queued = Some(op);
    }

    /// Starts a full rescan: probe every driver `present`, and `Gone` for every one in `known`
    /// that is not. Completes when each of them ran once more.
    pub fn begin_round(&mut self, present: &BTreeSet<String>, known: &BTreeSet<String>) {
        for (dir, op) in
            present.iter().map(|d| (d, Op::Probe)).chain(known.difference(present).map(|d| (d, Op::Gone)))
        {
            self.enqueue(dir, op);
            self.slots.get_mut(dir).expect("just queued").in_round = true;
            self.round.get_or_insert_default().insert(dir.clone());
        }
        // An empty directory and nothing known: the rescan is complete right away.
        self.round.get_or_insert_default();
    }

    /// Whether a rescan round is complete (it then ends); call after [`Scheduler::finished`].
    pub fn take_completed_round(&mut self) -> bool {
        if self.round.as_ref().is_some_and(BTreeSet::is_empty) {
            self.round = None;
            return true;
        }
        false
    }

    /// The ops that may start at `now` (marked running), and when the next held-back one may.
    pub fn ready(&mut self, now: Instant) -> (Vec<Start>, Option<Instant>) {
        let mut starts = Vec::new();
        let mut wake: Option<Instant> = None;
        let min = self.min_interval;
        for (dir, slot) in &mut self.slots {
            let Some(op) = slot.queued.filter(|_| !slot.in_flight) else { continue };
            let earliest = match (op, slot.last_init) {
                (Op::Probe, Some(last)) => last + min,
                _ => now,
            };
            if earliest <= now {
                slot.queued = None;
                slot.in_flight = true;
                starts.push(Start { dir: dir.clone(), op, round: std::mem::take(&mut slot.in_round) });
            } else {
                wake = Some(wake.map_or(earliest, |w| w.min(earliest)));
            }
        }
        // Forget drivers with nothing to do whose rate limit has run out.
        self.slots.retain(|_, s| {
            s.queued.is_some() || s.in_flight || s.in_round || s.last_init.is_some_and(|t| t + min > now)
        });
        (starts, wake)
    }

    /// Records that the op started for `dir` finished; `init_started` says when it ran `init`.
    pub fn finished(&mut self, dir: &str, init_started: Option<Instant>, round: bool) {
        let slot = self.slots.entry(dir.to_string()).or_default();
        slot.in_flight = false;
        if init_started.is_some() {
            slot.last_init = init_started;
        }
        if round && let Some(r) = &mut self.round {
            r.remove(dir);
        }
    }

    /// Turns a started `Gone` back into a queued `Probe` (the driver is there after all).
    pub fn requeue_as_probe(&mut self, start: &Start) {
        let slot = self.slots.entry(start.dir.clone()).or_default();
        slot.in_flight = false;
        slot.in_round |= start.round;
        if slot.queued.is_none() {
            slot.queued = Some(Op::Probe);
        }
    }

    /// The drivers with a probe queued that has not started (held back by the rate limit or
    /// by a running op of the same driver).
    pub fn queued_probes(&self) -> impl Iterator<Item = &str> {
        self.slots.iter().filter(|(_, s)| s.queued == Some(Op::Probe)).map(|(dir, _)| dir.as_str())
    }

    /// Whether anything is queued, running, or a rescan is unfinished.
    pub fn busy(&self) -> bool {
        self.round.is_some() || self.slots.values().any(|s| s.queued.is_some() || s.in_flight)
    }
}

// ---------------------------------------------------------------------------------------------
// Probing one driver.

/// What a probe found.
enum Outcome {
    /// No driver directory (any more): forget it.
    Absent,
    Loaded {
        name: String,
        plugin: PluginRef,
        capabilities: DriverCapabilities,
    },
    Failed {
        name: String,
        reason: String,
    },
}

/// The result of one probe task.
struct Probed {
    dir: String,
    outcome: Outcome,
    init_started: Option<Instant>,
    round: bool,
}

/// What every probe needs.
#[derive(Debug)]
struct Context {
    dir: PathBuf,
    owner_uid: u32,
    limits: CallLimits,
    host: PluginHost,
    /// One line per driver directory per second: a directory churning logs a summary.
    log_gate: crate::log_gate::LogGate,
}

type SharedWatcher = Arc<Mutex<RecommendedWatcher>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// The checks before `init`, all on the disk: the driver is there, its name is valid, it is
/// trusted. Adds the driver directory's watch (when given a watcher) before looking inside.
fn prepare(
    ctx: &Context,
    dir_name: &str,
    watcher: Option<&SharedWatcher>,
) -> Result<crate::FlexDriver, Outcome> {
    let dir = ctx.dir.join(dir_name);
    match std::fs::symlink_metadata(&dir) {
        Ok(m) if m.is_dir() || m.file_type().is_symlink() => {}
        Ok(_) => return Err(Outcome::Absent),
        Err(e) if e.kind() == ErrorKind::NotFound => return Err(Outcome::Absent),
        Err(e) => {
            let reason = FlexError::io("inspect", &dir, e).to_string();
            return Err(Outcome::Failed { name: dir_name.to_string(), reason });
        }
    }
    let mut driver = naming::driver_in_dir(&dir, ctx.limits)
        .map_err(|e| Outcome::Failed { name: dir_name.to_string(), reason: e.to_string() })?;
    driver.owner_uid = ctx.owner_uid;
    let failed = |e: FlexError| Outcome::Failed { name: driver.name.clone(), reason: e.to_string() };
    let canonical_dir = match trust::verify_driver_dir(&ctx.dir, &dir, ctx.owner_uid) {
        Ok(d) => d,
        // Removed since the look above (a dangling symlink is a failure, not an absence).
        Err(FlexError::Io { source, .. })
            if source.kind() == ErrorKind::NotFound && std::fs::symlink_metadata(&dir).is_err() =>
        {
            return Err(Outcome::Absent);
        }
        Err(e) => return Err(failed(e)),
    };
    if let Some(w) = watcher
        && let Err(e) = lock(w).watch(&dir, RecursiveMode::NonRecursive)
        && let Some(held_back) = ctx.log_gate.pass(dir_name)
    {
        tracing::warn!(dir = %dir.display(), error = %e, held_back, "cannot watch flexvolume driver directory");
    }
    match std::fs::symlink_metadata(&driver.executable) {
        Ok(_) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {
            return Err(Outcome::Failed {
                name: driver.name.clone(),
                reason: format!(
                    "driver directory {} has no executable {}",
                    dir.display(),
                    executable_name(dir_name)
                ),
            });
        }
        Err(e) => return Err(failed(FlexError::io("inspect", &driver.executable, e))),
    }
    trust::verify_executable(&ctx.dir, &canonical_dir, &driver.executable, ctx.owner_uid).map_err(failed)?;
    Ok(driver)
}

/// How long a driver directory's checks (stat, canonicalize, ownership) may take.
const PREPARE_DEADLINE: Duration = Duration::from_secs(30);

/// Probes driver directory `dir_name`: checks, then `init`. Returns the outcome and when `init` started.
async fn probe(
    ctx: Arc<Context>,
    dir_name: String,
    watcher: Option<SharedWatcher>,
) -> (Outcome, Option<Instant>) {
    let prepared = {
        let (ctx, dir_name) = (Arc::clone(&ctx), dir_name.clone());
        let dir = ctx.dir.join(&dir_name);
        kvol_plugin::blocking::shared()
            .run(&dir, PREPARE_DEADLINE, move || prepare(&ctx, &dir_name, watcher.as_ref()))
            .await
    };
    let driver = match prepared {
        Ok(Ok(driver)) => driver,
        Ok(Err(outcome)) => return (outcome, None),
        Err(e) => {
            let reason = format!("the probe of {dir_name} failed: {e}");
            return (Outcome::Failed { name: dir_name, reason }, None);
        }
    };
    let name = driver.name.clone();
    let started = Instant::now();
    let outcome = match FlexVolumePlugin::load(driver, ctx.host.clone()).await {
        Ok(plugin) => {
            let capabilities = plugin.driver_capabilities();
            Outcome::Loaded { name, plugin: Arc::new(plugin), capabilities }
        }
        Err(e) => Outcome::Failed { name, reason: e.to_string() },
    };
    (outcome, Some(started))
}

/// Lists the driver directories in `dir`: entries not starting with `.` that are directories
/// or symlinks (the trust check decides where those lead).
fn list_driver_dirs(dir: &Path) -> std::io::Result<BTreeSet<String>> {
    let mut found = BTreeSet::new();
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        if is_dot(name.as_encoded_bytes()) {
            continue;
        }
        let Ok(ty) = entry.file_type() else { continue };
        if !(ty.is_dir() || ty.is_symlink()) {
            continue;
        }
        match name.into_string() {
            Ok(name) => {
                found.insert(name);
            }
            Err(name) => tracing::debug!(?name, "ignoring a driver directory whose name is not UTF-8"),
        }
    }
    Ok(found)
}

/// `mkdir -p dir` with mode 0755 for what it creates.
fn create_plugin_dir(dir: &Path) -> Result<()> {
    if dir.is_dir() {
        return Ok(());
    }
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(dir)
        .and_then(|()| std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)))
        .map_err(|e| FlexError::io("create plugin directory", dir, e))
}

/// Probes every driver in `config.dir` once, concurrently, without watching or registering:
/// the plugins that loaded and the rows of those that did not (for `kvol plugins`). A missing
/// plugin directory means no drivers.
pub async fn probe_all_once(config: &ProberConfig, host: PluginHost) -> (Vec<PluginRef>, Vec<NotRegistered>) {
    let ctx = Arc::new(Context {
        dir: config.dir.clone(),
        owner_uid: config.owner_uid,
        limits: config.limits,
        host,
        log_gate: crate::log_gate::LogGate::default(),
    });
    let dirs = match list_driver_dirs(&config.dir) {
        Ok(d) => d,
        Err(e) if e.kind() == ErrorKind::NotFound => BTreeSet::new(),
        Err(e) => {
            let reason = FlexError::io("list plugin directory", &config.dir, e).to_string();
            let row = NotRegistered {
                name: config.dir.display().to_string(),
                kind: PluginKind::Flexvolume,
                reason,
            };
            return (Vec::new(), vec![row]);
        }
    };
    let mut tasks = JoinSet::new();
    for dir in dirs {
        tasks.spawn(probe(Arc::clone(&ctx), dir, None));
    }
    let (mut plugins, mut failed) = (Vec::new(), Vec::new());
    while let Some(done) = tasks.join_next().await {
        match done {
            Ok((Outcome::Loaded { plugin, .. }, _)) => plugins.push(plugin),
            Ok((Outcome::Failed { name, reason }, _)) => {
                failed.push(NotRegistered { name, kind: PluginKind::Flexvolume, reason })
            }
            Ok((Outcome::Absent, _)) => {}
            Err(e) => tracing::warn!(error = %e, "a flexvolume probe task failed"),
        }
    }
    plugins.sort_by(|a, b| a.name().cmp(b.name()));
    failed.sort_by(|a, b| a.name.cmp(&b.name));
    (plugins, failed)
}

// ---------------------------------------------------------------------------------------------
// The watcher and the discovery task.

/// What the notify handler and the discovery task share.
#[derive(Debug)]
struct Shared {
    pending: Mutex<Pending>,
    wake: Notify,
    stop: Notify,
    status: Mutex<BTreeMap<String, ProbedDriver>>,
    progress: watch::Sender<Progress>,
    /// Events the notify handler was given (to show what quieting spares).
    events: AtomicU64,
}

/// A running prober. Dropping it stops discovery; [`FlexProber::shutdown`] also waits for it.
#[derive(Debug)]
pub struct FlexProber {
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl FlexProber {
    /// Creates the plugin directory if missing (0755), watches it, and starts discovery on its
    /// own task with a full scan. Returns once the watch is in place; drivers appear in
    /// `registry` as their `init` succeeds. Must be called within a tokio runtime.
    pub fn start(
        mut config: ProberConfig,
        host: PluginHost,
        registry: Arc<PluginRegistry>,
    ) -> Result<FlexProber> {
        // Event paths are the watched path joined with names: keep one spelling, absolute.
        config.dir =
            std::path::absolute(&config.dir).map_err(|e| FlexError::io("resolve", &config.dir, e))?;
        create_plugin_dir(&config.dir)?;
        let (progress, _) = watch::channel(Progress { busy: true, ..Progress::default() });
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending { rescan: true, ..Pending::default() }),
            wake: Notify::new(),
            stop: Notify::new(),
            status: Mutex::new(BTreeMap::new()),
            progress,
            events: AtomicU64::new(0),
        });
        let handler = {
            let (shared, dir) = (Arc::clone(&shared), config.dir.clone());
            move |res: notify::Result<Event>| {
                shared.events.fetch_add(1, Ordering::Relaxed);
                let event = match res {
                    Ok(event) => event,
                    Err(e) => {
                        tracing::warn!(dir = %dir.display(), error = %e, "flexvolume watch error; rescanning");
                        Event::new(EventKind::Other)
                    }
                };
                let mut pending = lock(&shared.pending);
                let mut changed = false;
                for_each_action(&dir, &event, |found| changed |= pending.record_found(found));
                if !changed {
                    return;
                }
                // Under the pending lock, so the discovery task cannot report idle over this.
                shared.progress.send_if_modified(|p| !std::mem::replace(&mut p.busy, true));
                drop(pending);
                shared.wake.notify_one();
            }
        };
        let mut watcher = notify::recommended_watcher(handler)
            .map_err(|e| FlexError::io("watch", &config.dir, notify_io(e)))?;
        watcher
            .watch(&config.dir, RecursiveMode::NonRecursive)
            .map_err(|e| FlexError::io("watch", &config.dir, notify_io(e)))?;
        let discovery = Discovery {
            ctx: Arc::new(Context {
                dir: config.dir.clone(),
                owner_uid: config.owner_uid,
                limits: config.limits,
                host,
                log_gate: crate::log_gate::LogGate::default(),
            }),
            watcher: Arc::new(Mutex::new(watcher)),
            registry,
            shared: Arc::clone(&shared),
            sched: Scheduler::new(config.min_reprobe_interval),
            published: BTreeMap::new(),
            tasks: JoinSet::new(),
            running: HashMap::new(),
            recover_at: None,
            progress: Progress::default(),
        };
        // The first full scan is pending already; wake the task for it.
        shared.wake.notify_one();
        let task = tokio::spawn(discovery.run());
        Ok(FlexProber { shared, task: Some(task) })
    }

    /// Every driver directory probed, with how it went, by directory name.
    pub fn status(&self) -> Vec<ProbedDriver> {
        lock(&self.shared.status).values().cloned().collect()
    }

    /// The drivers that did not load, as `kvol plugins` rows.
    pub fn not_registered(&self) -> Vec<NotRegistered> {
        lock(&self.shared.status).values().filter_map(ProbedDriver::not_registered).collect()
    }

    /// How many watch events have reached the prober since it started.
    pub fn events_seen(&self) -> u64 {
        self.shared.events.load(Ordering::Relaxed)
    }

    /// The discovery counters; `changed()` on it wakes on every step.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.shared.progress.subscribe()
    }

    /// Waits until nothing is pending, queued or running. Events the kernel has not delivered
    /// yet are not known, so wait for an effect (a registry change) when one is expected.
    pub async fn wait_idle(&self) -> Progress {
        let mut rx = self.progress();
        *rx.wait_for(|p| !p.busy).await.expect("the progress sender lives in the handle")
    }

    /// Stops discovery: no more probes or registry changes once this returns.
    pub async fn shutdown(mut self) {
        self.shared.stop.notify_one();
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            tracing::error!(error = %e, "the flexvolume discovery task panicked");
        }
    }
}

impl Drop for FlexProber {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn notify_io(e: notify::Error) -> std::io::Error {
    match e.kind {
        notify::ErrorKind::Io(io) => io,
        other => std::io::Error::other(format!("{other:?}")),
    }
}

/// The discovery task's state.
struct Discovery {
    ctx: Arc<Context>,
    watcher: SharedWatcher,
    registry: Arc<PluginRegistry>,
    shared: Arc<Shared>,
    sched: Scheduler,
    /// What this prober registered, by driver directory.
    published: BTreeMap<String, PluginRef>,
    tasks: JoinSet<Probed>,
    /// The driver directory (and round flag) of each running probe task, to finish it if it panics.
    running: HashMap<tokio::task::Id, (String, bool)>,
    /// When to try again to recreate and watch a vanished plugin directory.
    recover_at: Option<Instant>,
    progress: Progress,
}

impl Discovery {
    async fn run(mut self) {
        loop {
            let wake = self.dispatch();
            self.report();
            let wake = match (wake, self.recover_at) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            tokio::select! {
                biased;
                () = self.shared.stop.notified() => break,
                Some(done) = self.tasks.join_next_with_id(), if !self.tasks.is_empty() => match done {
                    Ok((id, probed)) => {
                        self.running.remove(&id);
                        self.finish(probed);
                    }
                    Err(e) => self.task_failed(e),
                },
                () = self.shared.wake.notified() => self.drain(),
                () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {
                    if self.recover_at.is_some_and(|t| t <= Instant::now()) {
                        self.recover_at = None;
                        self.recover_plugin_dir();
                    }
                }
            }
        }
        self.tasks.shutdown().await;
    }

    /// Publishes the counters and whether anything is left to do.
    fn report(&mut self) {
        // Held while sending, so an event recorded meanwhile is not reported idle over.
        let mut pending = lock(&self.shared.pending);
        if !pending.held.iter().map(String::as_str).eq(self.sched.queued_probes()) {
            pending.held = self.sched.queued_probes().map(str::to_string).collect();
        }
        self.progress.busy =
            !pending.is_empty() || self.sched.busy() || !self.tasks.is_empty() || self.recover_at.is_some();
        let now = self.progress;
        self.shared.progress.send_if_modified(|p| std::mem::replace(p, now) != now);
        drop(pending);
    }

    /// Takes the recorded actions into the scheduler.
    fn drain(&mut self) {
        let pending = lock(&self.shared.pending).take_actions();
        if pending.plugin_dir_changed {
            self.recover_plugin_dir();
        } else if pending.rescan {
            self.rescan();
        }
        for (dir, op) in pending.drivers {
            self.sched.enqueue(&dir, op);
        }
        for dir in pending.quiet {
            self.quiet(dir);
        }
    }

    /// Drops held driver `dir`'s directory watch until its queued probe starts, which adds it
    /// again before it looks inside; a driver whose probe started meanwhile keeps its watch.
    fn quiet(&mut self, dir: String) {
        if !self.sched.queued_probes().any(|d| d == dir) {
            return;
        }
        let path = self.ctx.dir.join(&dir);
        // Recorded first, so that events still in flight are dropped without asking again.
        lock(&self.shared.pending).quieted.insert(dir);
        // Not under the pending lock: the notify thread takes it to deliver events.
        let _ = lock(&self.watcher).unwatch(&path);
        tracing::trace!(dir = %path.display(), "flexvolume driver directory quieted until its probe");
    }

    /// Adds `dir`'s watch again (a `Gone` of a quieted driver whose directory stays).
    fn rewatch(&self, dir: &Path) {
        if let Err(e) = lock(&self.watcher).watch(dir, RecursiveMode::NonRecursive)
            && let Some(held_back) = self.ctx.log_gate.pass(&dir.to_string_lossy())
        {
            tracing::warn!(dir = %dir.display(), error = %e, held_back, "cannot watch flexvolume driver directory");
        }
    }

    /// The plugin directory was removed or moved: drop the stale watches, recreate it, watch it
    /// again and rescan; retried after `min_reprobe_interval` if that fails.
    fn recover_plugin_dir(&mut self) {
        let dir = self.ctx.dir.clone();
        {
            let mut watcher = lock(&self.watcher);
            let _ = watcher.unwatch(&dir);
            for name in self.known() {
                let _ = watcher.unwatch(&dir.join(name));
            }
        }
        let watched = create_plugin_dir(&dir).and_then(|()| {
            lock(&self.watcher)
                .watch(&dir, RecursiveMode::NonRecursive)
                .map_err(|e| FlexError::io("watch", &dir, notify_io(e)))
        });
        match watched {
            Ok(()) => {
                tracing::info!(dir = %dir.display(), "flexvolume plugin directory recreated and watched again");
                self.rescan();
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot restore the flexvolume plugin directory; retrying");
                self.recover_at = Some(Instant::now() + self.sched.min_interval);
            }
        }
    }

    /// Every driver directory this prober has a record of.
    fn known(&self) -> BTreeSet<String> {
        let status = lock(&self.shared.status);
        self.published.keys().chain(status.keys()).cloned().collect()
    }

    /// Re-lists the plugin directory and queues a probe of every driver in it and a removal of
    /// every known one that is gone; the registry is replaced when they all finished.
    fn rescan(&mut self) {
        let present = match list_driver_dirs(&self.ctx.dir) {
            Ok(p) => p,
            Err(e) if e.kind() == ErrorKind::NotFound => return self.recover_plugin_dir(),
            Err(e) => {
                tracing::error!(dir = %self.ctx.dir.display(), error = %e, "cannot list the flexvolume plugin directory");
                return;
            }
        };
        tracing::debug!(dir = %self.ctx.dir.display(), drivers = present.len(), "flexvolume full rescan");
        let known = self.known();
        self.sched.begin_round(&present, &known);
    }

    /// Starts what the scheduler lets start; returns when to look again.
    fn dispatch(&mut self) -> Option<Instant> {
        loop {
            let (starts, wake) = self.sched.ready(Instant::now());
            // Before a probe starts, events for its driver must count again: it may read the
            // directory before they happen. (A probe adds a quieted driver's watch back itself.)
            let mut rewatch = BTreeSet::new();
            if !starts.is_empty() {
                let mut pending = lock(&self.shared.pending);
                for start in &starts {
                    pending.held.remove(&start.dir);
                    if pending.quieted.remove(&start.dir) && start.op == Op::Gone {
                        rewatch.insert(start.dir.clone());
                    }
                }
            }
            let mut again = false;
            for start in starts {
                if rewatch.contains(&start.dir) {
                    self.rewatch(&self.ctx.dir.join(&start.dir));
                }
                match start.op {
                    Op::Probe => {
                        let (ctx, watcher) = (Arc::clone(&self.ctx), Arc::clone(&self.watcher));
                        let Start { dir, round, .. } = start;
                        let task_dir = dir.clone();
                        let handle = self.tasks.spawn(async move {
                            let (outcome, init_started) = probe(ctx, dir.clone(), Some(watcher)).await;
                            Probed { dir, outcome, init_started, round }
                        });
                        self.running.insert(handle.id(), (task_dir, round));
                    }
                    Op::Gone => again |= self.gone(start),
                }
            }
            if !again {
                self.complete_round_if_done();
                return wake;
            }
        }
    }

    /// Handles a started `Gone`: removes the driver at once if its executable is really gone;
    /// if it is back, queues a probe instead (returns true then).
    fn gone(&mut self, start: Start) -> bool {
        let dir = self.ctx.dir.join(&start.dir);
        let exe = dir.join(executable_name(&start.dir));
        if std::fs::symlink_metadata(&exe).is_ok() {
            self.sched.requeue_as_probe(&start);
            return true;
        }
        let outcome = if std::fs::symlink_metadata(&dir).is_ok() {
            let name = lock(&self.shared.status)
                .get(&start.dir)
                .map_or_else(|| start.dir.clone(), |s| s.name.clone());
            let reason = format!(
                "driver directory {} has no executable {}",
                dir.display(),
                executable_name(&start.dir)
            );
            Outcome::Failed { name, reason }
        } else {
            Outcome::Absent
        };
        self.finish(Probed { dir: start.dir, outcome, init_started: None, round: start.round });
        false
    }

    /// A probe task panicked: its driver counts as failed, so it is probed again on its next event.
    fn task_failed(&mut self, e: tokio::task::JoinError) {
        tracing::error!(error = %e, "a flexvolume probe task failed");
        if let Some((dir, round)) = self.running.remove(&e.id()) {
            let name = lock(&self.shared.status).get(&dir).map_or_else(|| dir.clone(), |s| s.name.clone());
            let reason = format!("probing driver directory {dir} failed: {e}");
            self.finish(Probed { dir, outcome: Outcome::Failed { name, reason }, init_started: None, round });
        }
    }

    /// Applies a finished probe to the registry and the status table.
    fn finish(&mut self, probed: Probed) {
        let Probed { dir, outcome, init_started, round } = probed;
        self.sched.finished(&dir, init_started, round);
        self.progress.completed += 1;
        self.progress.inits += u64::from(init_started.is_some());
        match outcome {
            Outcome::Loaded { name, plugin, capabilities } => {
                let refused = self
                    .registry
                    .apply(DynamicSource::Flexvolume, [ProbeEvent::AddOrUpdate(Arc::clone(&plugin))]);
                if let Some(refusal) = refused.first() {
                    self.unpublish(&dir);
                    self.set_status(&dir, name, DriverState::Failed { reason: refusal.to_string() });
                } else {
                    self.published.insert(dir.clone(), plugin);
                    self.set_status(&dir, name, DriverState::Loaded { capabilities });
                }
            }
            Outcome::Failed { name, reason } => {
                self.unpublish(&dir);
                self.set_status(&dir, name, DriverState::Failed { reason });
            }
            Outcome::Absent => {
                self.unpublish(&dir);
                if lock(&self.shared.status).remove(&dir).is_some()
                    && let Some(held_back) = self.ctx.log_gate.pass(&dir)
                {
                    tracing::info!(dir = %dir, held_back, "flexvolume driver directory gone");
                }
            }
        }
        self.complete_round_if_done();
    }

    /// Removes what this prober registered for `dir` (a failed re-init does not keep the old one).
    fn unpublish(&mut self, dir: &str) {
        if let Some(plugin) = self.published.remove(dir) {
            self.registry.apply(DynamicSource::Flexvolume, [ProbeEvent::Remove(plugin.name().to_string())]);
        }
    }

    /// Records a driver's state; logs only changes, so a driver failing over and over logs once.
    fn set_status(&mut self, dir: &str, name: String, state: DriverState) {
        let entry = ProbedDriver { dir: dir.to_string(), name, state };
        let mut status = lock(&self.shared.status);
        if status.get(dir) == Some(&entry) {
            return;
        }
        // A directory coming and going thousands of times a second: a line a second, with the
        // count of those held back.
        let gate = self.ctx.log_gate.pass(dir);
        match (&entry.state, gate) {
            (_, None) => {}
            (DriverState::Loaded { capabilities }, Some(held_back)) => {
                tracing::info!(driver = %entry.name, dir = %dir, ?capabilities, held_back, "flexvolume driver loaded")
            }
            (DriverState::Failed { reason }, Some(held_back)) => {
                tracing::warn!(driver = %entry.name, dir = %dir, %reason, held_back, "flexvolume driver not loaded")
            }
        }
        status.insert(dir.to_string(), entry);
    }

    /// When a full rescan's probes all finished, republishes this source's plugins in one go,
    /// which also drops anything registered that this prober no longer has.
    fn complete_round_if_done(&mut self) {
        if !self.sched.take_completed_round() {
            return;
        }
        let refused =
            self.registry.replace(DynamicSource::Flexvolume, self.published.values().cloned().collect());
        for refusal in refused {
            tracing::warn!(error = %refusal, "flexvolume plugin refused by the registry");
        }
        self.progress.rescans += 1;
    }
}

#[cfg(test)]
mod tests {
    use notify::event::{CreateKind, DataChange, MetadataKind, RemoveKind};

    use super::*;

    const ROOT: &str = "/exec";

    fn ev(kind: EventKind, paths: &[&str]) -> Event {
        paths.iter().fold(Event::new(kind), |e, p| e.add_path(PathBuf::from(p)))
    }

    fn drv(dir: &str, op: Op) -> Action {
        Action::Driver { dir: dir.to_string(), op }
    }

    /// (event, expected actions)
    #[test]
    fn events_map_to_driver_dirs_and_ops() {
        use EventKind::{Access, Create, Modify, Remove};
        use Op::{Gone, Probe};
        let rename = |m| Modify(ModifyKind::Name(m));
        let rows: Vec<(Event, Vec<Action>)> = vec![
            // A new driver directory, a new executable, a finished write, a chmod.
            (ev(Create(CreateKind::Folder), &["/exec/v~d"]), vec![drv("v~d", Probe)]),
            (ev(Create(CreateKind::File), &["/exec/v~d/d"]), vec![drv("v~d", Probe)]),
            (ev(Modify(ModifyKind::Data(DataChange::Any)), &["/exec/v~d/d"]), vec![drv("v~d", Probe)]),
            (ev(Access(AccessKind::Close(AccessMode::Write)), &["/exec/v~d/d"]), vec![drv("v~d", Probe)]),
            (ev(Modify(ModifyKind::Metadata(MetadataKind::Any)), &["/exec/v~d"]), vec![drv("v~d", Probe)]),
            // The atomic install: the dot copy is ignored, the rename into place probes.
            (ev(Create(CreateKind::File), &["/exec/v~d/.d"]), vec![]),
            (ev(Modify(ModifyKind::Data(DataChange::Any)), &["/exec/v~d/.d"]), vec![]),
            (ev(rename(RenameMode::From), &["/exec/v~d/.d"]), vec![]),
            (ev(rename(RenameMode::To), &["/exec/v~d/d"]), vec![drv("v~d", Probe)]),
            (ev(rename(RenameMode::Both), &["/exec/v~d/.d", "/exec/v~d/d"]), vec![]),
            // Dot directories are not drivers.
            (ev(Create(CreateKind::Folder), &["/exec/.staging"]), vec![]),
            (ev(Create(CreateKind::File), &["/exec/.staging/x"]), vec![]),
            // Opens and reads (running init opens the driver) are no change.
            (ev(Access(AccessKind::Open(AccessMode::Any)), &["/exec/v~d/d"]), vec![]),
            (ev(Access(AccessKind::Close(AccessMode::Read)), &["/exec/v~d/d"]), vec![]),
            // The executable or the directory going away removes; other files only re-probe.
            (ev(Remove(RemoveKind::File), &["/exec/v~d/d"]), vec![drv("v~d", Gone)]),
            (ev(rename(RenameMode::From), &["/exec/v~d/d"]), vec![drv("v~d", Gone)]),
            (ev(Remove(RemoveKind::Folder), &["/exec/v~d"]), vec![drv("v~d", Gone)]),
            (ev(rename(RenameMode::From), &["/exec/v~d"]), vec![drv("v~d", Gone)]),
            (ev(Remove(RemoveKind::File), &["/exec/v~d/config"]), vec![drv("v~d", Probe)]),
            (ev(Remove(RemoveKind::Folder), &["/exec/v~d/d/x"]), vec![drv("v~d", Probe)]),
            (ev(Remove(RemoveKind::File), &["/exec/nfs/nfs"]), vec![drv("nfs", Gone)]),
            (ev(Remove(RemoveKind::File), &["/exec/a~b~c/c"]), vec![drv("a~b~c", Gone)]),
            (ev(Remove(RemoveKind::File), &["/exec/a~b~c/b"]), vec![drv("a~b~c", Probe)]),
            // The plugin directory itself.
            (ev(Remove(RemoveKind::Folder), &["/exec"]), vec![Action::PluginDirChanged]),
            (ev(rename(RenameMode::From), &["/exec"]), vec![Action::PluginDirChanged]),
            (ev(Modify(ModifyKind::Metadata(MetadataKind::Any)), &["/exec"]), vec![]),
            // Overflow and unknown events rescan; paths elsewhere are not ours.
            (Event::new(EventKind::Other).set_flag(notify::event::Flag::Rescan), vec![Action::Rescan]),
            (Event::new(EventKind::Other), vec![Action::Rescan]),
            (ev(Create(CreateKind::File), &["/execfoo/v~d"]), vec![]),
            (ev(Create(CreateKind::File), &["/elsewhere/v~d/d"]), vec![]),
        ];
        for (event, want) in rows {
            assert_eq!(classify(Path::new(ROOT), &event), want, "{event:?}");
        }
    }

    #[test]
    fn the_last_event_per_driver_wins() {
        let mut p = Pending::default();
        assert!(p.is_empty());
        for a in [drv("a", Op::Probe), drv("b", Op::Gone), drv("a", Op::Gone), drv("b", Op::Probe)] {
            p.record(a);
        }
        p.record(Action::Rescan);
        let want = BTreeMap::from([("a".to_string(), Op::Gone), ("b".to_string(), Op::Probe)]);
        assert_eq!(p, Pending { rescan: true, drivers: want, ..Pending::default() });
    }

    #[test]
    fn only_actions_that_add_something_wake_discovery() {
        // (already recorded, held, quieted, action) → whether recording it changes anything.
        type Row =
            (&'static [(&'static str, Op)], &'static [&'static str], &'static [&'static str], Action, bool);
        let rows: &[Row] = &[
            (&[], &[], &[], drv("a", Op::Probe), true),
            (&[("a", Op::Probe)], &[], &[], drv("a", Op::Probe), false),
            (&[("a", Op::Probe)], &[], &[], drv("a", Op::Gone), true),
            (&[("a", Op::Gone)], &[], &[], drv("a", Op::Probe), true),
            // A probe already queued reads whatever this event changed; the first such event
            // asks for the driver's watch to be dropped until then, the rest add nothing.
            (&[], &["a"], &[], drv("a", Op::Probe), true),
            (&[], &["a"], &["a"], drv("a", Op::Probe), false),
            // A removal still counts: the queued probe must not be what reports it.
            (&[], &["a"], &["a"], drv("a", Op::Gone), true),
            (&[], &["a"], &["a"], drv("b", Op::Probe), true),
            (&[], &["a"], &["a"], Action::Rescan, true),
            (&[], &[], &[], Action::PluginDirChanged, true),
        ];
        for (recorded, held, quieted, action, want) in rows {
            let names = |dirs: &[&str]| dirs.iter().map(|d| d.to_string()).collect::<BTreeSet<_>>();
            let mut p = Pending {
                drivers: recorded.iter().map(|(d, op)| (d.to_string(), *op)).collect(),
                held: names(held),
                quieted: names(quieted),
                ..Pending::default()
            };
            let found = match action {
                Action::Rescan => Found::Rescan,
                Action::PluginDirChanged => Found::PluginDirChanged,
                Action::Driver { dir, op } => Found::Driver(dir, *op),
            };
            let context = format!("{action:?} over {recorded:?}, held {held:?}, quieted {quieted:?}");
            assert_eq!(p.clone().record(action.clone()), *want, "record {context}");
            assert_eq!(p.record_found(found), *want, "record_found {context}");
            if *want {
                assert!(!p.record(action.clone()), "a second {context} adds nothing");
            }
        }
        let mut p = Pending { held: BTreeSet::from(["a".to_string()]), ..Pending::default() };
        p.record(Action::Rescan);
        assert!(p.record(drv("a", Op::Probe)), "a held driver's first event asks to quiet it");
        let taken = p.take_actions();
        assert!(taken.rescan && taken.quiet.contains("a"), "the request to quiet is taken with the actions");
        assert!(p.is_empty() && p.held.contains("a"), "taking actions keeps what is held");
    }

    /// One step of a scheduler scenario, at a time in milliseconds from the start.
    #[derive(Debug)]
    enum Step {
        Queue(&'static str, Op),
        /// Ask what may start at `ms`: expect these (dir, op) and this next wake time.
        Ready(u64, &'static [(&'static str, Op)], Option<u64>),
        /// `dir` finished; it ran init at this time (if it did).
        Finish(&'static str, Option<u64>),
        Busy(bool),
    }

    #[test]
    fn probes_are_rate_limited_per_driver_and_the_last_request_still_runs() {
        use Op::{Gone, Probe};
        use Step::{Busy, Finish, Queue, Ready};
        let scenarios: &[(&str, &[Step])] = &[
            (
                "first probe at once; a flood while it runs coalesces into one trailing probe a second later",
                &[
                    Queue("a", Probe),
                    Ready(0, &[("a", Probe)], None),
                    Queue("a", Probe),
                    Queue("a", Probe),
                    Ready(10, &[], None),
                    Finish("a", Some(5)),
                    Ready(20, &[], Some(1005)),
                    Queue("a", Probe),
                    Ready(900, &[], Some(1005)),
                    Ready(1005, &[("a", Probe)], None),
                    Finish("a", Some(1006)),
                    Busy(false),
                    Ready(1500, &[], None),
                ],
            ),
            (
                "a probe that ran no init (no executable yet) does not hold the next one back",
                &[
                    Queue("a", Probe),
                    Ready(0, &[("a", Probe)], None),
                    Finish("a", None),
                    Queue("a", Probe),
                    Ready(1, &[("a", Probe)], None),
                ],
            ),
            (
                "drivers are limited separately",
                &[
                    Queue("a", Probe),
                    Ready(0, &[("a", Probe)], None),
                    Finish("a", Some(0)),
                    Queue("a", Probe),
                    Queue("b", Probe),
                    Ready(1, &[("b", Probe)], Some(1000)),
                ],
            ),
            (
                "a removal is not rate limited but waits for the running probe; the last request wins",
                &[
                    Queue("a", Probe),
                    Ready(0, &[("a", Probe)], None),
                    Queue("a", Gone),
                    Ready(1, &[], None),
                    Finish("a", Some(0)),
                    Ready(2, &[("a", Gone)], None),
                    Finish("a", None),
                    Queue("a", Gone),
                    Queue("a", Probe),
                    Ready(3, &[], Some(1000)),
                    Busy(true),
                ],
            ),
        ];
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        for (name, steps) in scenarios {
            let mut s = Scheduler::new(Duration::from_secs(1));
            for (i, step) in steps.iter().enumerate() {
                match step {
                    Queue(dir, op) => s.enqueue(dir, *op),
                    Ready(ms, want, wake) => {
                        let (starts, next) = s.ready(at(*ms));
                        let got: Vec<(&str, Op)> = starts.iter().map(|st| (st.dir.as_str(), st.op)).collect();
                        assert_eq!(got, *want, "{name}: step {i} {step:?}");
                        assert_eq!(next, wake.map(at), "{name}: step {i} {step:?}");
                    }
                    Finish(dir, init) => s.finished(dir, init.map(at), false),
                    Busy(b) => assert_eq!(s.busy(), *b, "{name}: step {i}"),
                }
            }
        }
    }

    #[test]
    fn a_rescan_round_completes_when_all_its_drivers_ran() {
        let mut s = Scheduler::new(Duration::from_secs(1));
        let t0 = Instant::now();
        let set = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<BTreeSet<_>>();
        s.begin_round(&set(&["a", "b"]), &set(&["b", "c"]));
        assert!(s.busy() && !s.take_completed_round());
        let (starts, _) = s.ready(t0);
        let got: Vec<(&str, Op, bool)> = starts.iter().map(|st| (st.dir.as_str(), st.op, st.round)).collect();
        assert_eq!(got, [("a", Op::Probe, true), ("b", Op::Probe, true), ("c", Op::Gone, true)]);
        s.finished("a", Some(t0), true);
        s.finished("c", None, true);
        assert!(!s.take_completed_round());
        // `b` turned out gone-then-back: requeued, it still belongs to the round.
        s.requeue_as_probe(&starts[1]);
        let (again, _) = s.ready(t0);
        assert_eq!(again, [Start { dir: "b".into(), op: Op::Probe, round: true }]);
        s.finished("b", Some(t0), true);
        assert!(s.take_completed_round());
        assert!(!s.take_completed_round(), "a round completes once");
        assert!(!s.busy());

        // An empty directory with nothing known completes at once.
        s.begin_round(&BTreeSet::new(), &BTreeSet::new());
        assert!(s.take_completed_round());
    }

    #[test]
    fn the_executable_is_the_last_part_of_the_name() {
        for (dir, exe) in [("example.com~nfs", "nfs"), ("nfs", "nfs"), ("a~b~c", "c")] {
            assert_eq!(executable_name(dir), exe);
        }
    }
}
