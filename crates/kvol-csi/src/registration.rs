//! The plugin-registration watcher: finds plugin sockets in the kubelet's registration directory, registers each CSI plugin with a handler, and deregisters it when its socket goes.
//!
//! The protocol is the kubelet's (`pluginregistration` v1): the plugin (node-driver-registrar
//! for CSI) serves `Registration` on a unix socket in the directory; the watcher dials it
//! (10 s), asks `GetInfo` (1 s), hands name, endpoint and versions to the handler to validate
//! and register, and tells the plugin the outcome with `NotifyRegistrationStatus` (5 s).
//!
//! How it runs. One task owns the inotify watches and the table of sockets (the desired state).
//! It watches the directory and every subdirectory itself, one level each, adding a new
//! directory's watch *before* listing it, so that a socket bound right after its directory was
//! made is either listed or reported. Every event is checked against the file system (a socket
//! is a socket when `stat` says so, whatever its name). Each socket gets its own task, which
//! registers it, retries failures with exponential backoff, and, once told the socket is gone
//! or replaced, deregisters it; a slow or silent plugin therefore delays nobody else, and a
//! socket re-created at the same path is deregistered before it is registered again (its
//! task waits for the previous one). Lookups never touch any of this: they read the handler's
//! own state, and [`RegistrationWatcher::registered`] is a copy under a short lock.
//!
//! Every failure (dial, GetInfo, a foreign plugin type, a refusal, a failed `register`) ends
//! the attempt and is retried with backoff, as upstream retries a failed operation; refusals
//! are sent to the plugin each time (node-driver-registrar exits on one and comes back).
//!
//! Differences from upstream: registration is event-driven rather than polled every second; a
//! failed `register` is retried (upstream records the plugin first and never retries it,
//! kubernetes#118317); names with a `.`-component anywhere below the directory are ignored
//! (upstream checks the event's own name); the backoff cap defaults to 30 s (upstream 2 min 2 s);
//! the dial retries quickly within its 10 s (a socket exists from the plugin's `bind`, but is
//! refused until its `listen`), where upstream's blocking dial waits on gRPC's reconnect delay.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::fmt;
use std::io::ErrorKind;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use notify::event::{ModifyKind, RenameMode};
use notify::{Event, EventKind, RecommendedWatcher, RecursiveMode, Watcher};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tonic::transport::{Channel, Endpoint};

use crate::error::{CsiError, Result};
use crate::proto::registration::registration_client::RegistrationClient;
use crate::proto::registration::{InfoRequest, PluginInfo, RegistrationStatus};

/// The kubelet's plugin registration directory.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";

/// `PluginInfo.type` of a CSI plugin; the only type kvol handles.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";

/// What the watcher hands plugins to: for CSI, the CSI plugin (driver table, NodeGetInfo,
/// CSINode). Calls for one socket never overlap; calls for different sockets may.
#[async_trait::async_trait]
pub trait RegistrationHandler: Send + Sync + fmt::Debug {
    /// Whether driver `name` at `endpoint`, serving `versions`, may register. A refusal is sent
    /// to the plugin and the registration is tried again later, with backoff.
    async fn validate(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String>;
    /// Registers the driver. On failure the plugin is told why and the registration is tried
    /// again later (validation included), with backoff.
    async fn register(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String>;
    /// The driver's socket is gone or was replaced. `endpoint` tells which registration ends,
    /// for when a newer driver of the same name (a higher version) has replaced this one.
    async fn deregister(&self, name: &str, endpoint: &str);
}

/// Exponential backoff between attempts for one socket (kvol's one backoff policy).
pub use kvol_api::Backoff;

/// How the watcher is set up.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatcherConfig {
    /// The registration directory; created (0755) when missing.
    pub dir: PathBuf,
    /// How long dialling a plugin's socket may take.
    pub dial_timeout: Duration,
    /// How long `GetInfo` may take.
    pub get_info_timeout: Duration,
    /// How long `NotifyRegistrationStatus` may take.
    pub notify_timeout: Duration,
    /// Retries of a socket whose registration failed.
    pub backoff: Backoff,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        WatcherConfig {
            dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            dial_timeout: Duration::from_secs(10),
            get_info_timeout: Duration::from_secs(1),
            notify_timeout: Duration::from_secs(5),
            backoff: Backoff::default(),
        }
    }
}

impl WatcherConfig {
    /// The defaults, for the registration directory `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> WatcherConfig {
        WatcherConfig { dir: dir.into(), ..WatcherConfig::default() }
    }
}

/// A plugin the handler accepted, and the socket it registered through.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredPlugin {
    pub name: String,
    /// The plugin's own endpoint (`PluginInfo.endpoint`, or the socket when that was empty).
    pub endpoint: String,
    pub versions: Vec<String>,
    pub socket: PathBuf,
}

/// A socket whose registration keeps failing.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FailingSocket {
    pub socket: PathBuf,
    /// Failed attempts in a row.
    pub failures: u32,
    pub last_error: String,
    /// The wait before the next attempt.
    pub retry_in: Duration,
}

/// Counters of what the watcher did; `changed()` on [`RegistrationWatcher::progress`] wakes on
/// every step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Progress {
    /// Sockets the watcher currently tracks (registered, registering or retrying).
    pub sockets: usize,
    /// Successful `register` calls.
    pub registrations: u64,
    /// `deregister` calls.
    pub deregistrations: u64,
    /// Failed attempts (dial, GetInfo, type, validation or registration).
    pub failures: u64,
    /// File-system events handled.
    pub events: u64,
}

/// The running watcher. Dropping it stops the watching without deregistering anything;
/// [`RegistrationWatcher::shutdown`] also waits for the socket tasks.
#[derive(Debug)]
pub struct RegistrationWatcher {
    shared: Arc<Shared>,
    stop: watch::Sender<bool>,
    task: Option<JoinHandle<()>>,
}

impl RegistrationWatcher {
    /// Creates the directory if missing, watches it and its subdirectories, registers the
    /// sockets already there (their tasks are started when this returns) and keeps watching
    /// on its own task. Must be called within a tokio runtime.
    pub fn start(
        config: WatcherConfig,
        handler: Arc<dyn RegistrationHandler>,
    ) -> Result<RegistrationWatcher> {
        let mut config = config;
        // Event paths are the watched path joined with names: keep one spelling, absolute.
        config.dir = std::path::absolute(&config.dir).map_err(|e| CsiError::io("resolve", &config.dir, e))?;
        create_dir(&config.dir)?;
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let mut watcher = notify::recommended_watcher(move |res: notify::Result<Event>| {
            // The receiver only goes away when the watcher is stopping.
            let _ = events_tx.send(res);
        })
        .map_err(|e| CsiError::io("watch", &config.dir, notify_io(e)))?;
        watcher
            .watch(&config.dir, RecursiveMode::NonRecursive)
            .map_err(|e| CsiError::io("watch", &config.dir, notify_io(e)))?;
        let (progress, _) = watch::channel(Progress::default());
        let shared = Arc::new(Shared {
            registered: Mutex::new(BTreeMap::new()),
            failing: Mutex::new(BTreeMap::new()),
            progress,
        });
        let root = config.dir.clone();
        let ctx = Arc::new(Ctx { config, handler, shared: Arc::clone(&shared) });
        let mut table = Table {
            root: root.clone(),
            ctx,
            watcher,
            watched: BTreeSet::from([root.clone()]),
            sockets: BTreeMap::new(),
            draining: BTreeMap::new(),
        };
        table.reconcile_path(&root, false);
        let (stop, stop_rx) = watch::channel(false);
        let task = tokio::spawn(table.run(events_rx, stop_rx));
        Ok(RegistrationWatcher { shared, stop, task: Some(task) })
    }

    /// The plugins registered now, by socket path.
    pub fn registered(&self) -> Vec<RegisteredPlugin> {
        lock(&self.shared.registered).values().cloned().collect()
    }

    /// The sockets whose registration failed last time they were tried, by socket path.
    pub fn failing(&self) -> Vec<FailingSocket> {
        lock(&self.shared.failing).values().cloned().collect()
    }

    /// The counters; wait on it (`wait_for`) instead of sleeping.
    pub fn progress(&self) -> watch::Receiver<Progress> {
        self.shared.progress.subscribe()
    }

    /// Stops watching and waits for every socket task: registrations in flight finish,
    /// deregistrations already decided run, nothing else is deregistered.
    pub async fn shutdown(mut self) {
        self.stop.send_replace(true);
        if let Some(task) = self.task.take()
            && let Err(e) = task.await
            && e.is_panic()
        {
            tracing::error!(error = %e, "the plugin registration watcher task panicked");
        }
    }
}

impl Drop for RegistrationWatcher {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

fn create_dir(dir: &Path) -> Result<()> {
    match std::fs::DirBuilder::new().recursive(true).mode(0o755).create(dir) {
        Ok(()) if dir.is_dir() => Ok(()),
        Ok(()) => Err(CsiError::io("create", dir, std::io::Error::from(ErrorKind::NotADirectory))),
        Err(e) => Err(CsiError::io("create", dir, e)),
    }
}

fn notify_io(e: notify::Error) -> std::io::Error {
    match e.kind {
        notify::ErrorKind::Io(io) => io,
        other => std::io::Error::other(format!("{other:?}")),
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------------------------
// Pure decisions.

/// What one file-system event asks the watcher to look at.
#[derive(Debug, PartialEq, Eq)]
enum Classified {
    /// Events were lost: look at everything again.
    Rescan,
    /// Paths to check, each with whether the event says the file there went away (a removal
    /// or the source of a rename): whatever is at the path now is then a new file.
    Paths(Vec<(PathBuf, bool)>),
}

fn is_dot(name: &OsStr) -> bool {
    name.as_encoded_bytes().first() == Some(&b'.')
}

/// Whether `path` is `root` or below it with no `.`-named component on the way.
fn in_scope(root: &Path, path: &Path) -> bool {
    match path.strip_prefix(root) {
        Ok(rel) => rel.components().all(|c| match c {
            Component::Normal(name) => !is_dot(name),
            _ => false,
        }),
        Err(_) => false,
    }
}

fn classify(root: &Path, event: &Event) -> Classified {
    if event.need_rescan() {
        return Classified::Rescan;
    }
    let gone = match event.kind {
        EventKind::Other => return Classified::Rescan,
        // Opening, reading and writing a socket or its metadata makes no new socket.
        EventKind::Access(_) | EventKind::Modify(ModifyKind::Data(_) | ModifyKind::Metadata(_)) => {
            return Classified::Paths(Vec::new());
        }
        // notify also reports each half of a rename on its own; the pair adds nothing.
        EventKind::Modify(ModifyKind::Name(RenameMode::Both)) => return Classified::Paths(Vec::new()),
        EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(RenameMode::From)) => true,
        EventKind::Create(_) | EventKind::Modify(_) | EventKind::Any => false,
    };
    Classified::Paths(event.paths.iter().filter(|p| in_scope(root, p)).map(|p| (p.clone(), gone)).collect())
}

/// Which file is a socket: the device and inode, and the modification time (an inode number
/// can be reused by the next socket bound at the same path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SocketId {
    dev: u64,
    ino: u64,
    mtime_ns: i128,
}

/// What is at a path now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Observed {
    Missing,
    Directory,
    Socket(SocketId),
    /// A regular file, fifo, device, or a symlink to something that is not a socket.
    Other,
}

/// What to do about a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Decision {
    Nothing,
    /// Register the socket found there.
    Start,
    /// Deregister the known socket, then register the one found there.
    Restart,
    /// Forget the path and everything below it (deregistering sockets).
    Forget,
    /// Watch and list the directory; `forget_first` when what was known there is stale.
    Scan {
        forget_first: bool,
    },
}

fn decide(known: Option<SocketId>, observed: Observed, gone: bool) -> Decision {
    match (observed, known) {
        (Observed::Missing | Observed::Other, _) => Decision::Forget,
        (Observed::Directory, known) => Decision::Scan { forget_first: gone || known.is_some() },
        (Observed::Socket(_), None) => Decision::Start,
        (Observed::Socket(id), Some(k)) if id == k && !gone => Decision::Nothing,
        (Observed::Socket(_), Some(_)) => Decision::Restart,
    }
}

fn observe(path: &Path) -> Observed {
    let Ok(meta) = std::fs::symlink_metadata(path) else { return Observed::Missing };
    if meta.is_dir() {
        return Observed::Directory;
    }
    // A symlink counts as what it points at, except that directories are not followed.
    let meta = if meta.file_type().is_symlink() {
        match std::fs::metadata(path) {
            Ok(m) if !m.is_dir() => m,
            _ => return Observed::Other,
        }
    } else {
        meta
    };
    if meta.file_type().is_socket() {
        let mtime_ns = i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec());
        Observed::Socket(SocketId { dev: meta.dev(), ino: meta.ino(), mtime_ns })
    } else {
        Observed::Other
    }
}

// ---------------------------------------------------------------------------------------------
// The watching task.

#[derive(Debug)]
struct Shared {
    registered: Mutex<BTreeMap<PathBuf, RegisteredPlugin>>,
    failing: Mutex<BTreeMap<PathBuf, FailingSocket>>,
    progress: watch::Sender<Progress>,
}

#[derive(Debug)]
struct Ctx {
    config: WatcherConfig,
    handler: Arc<dyn RegistrationHandler>,
    shared: Arc<Shared>,
}

impl Ctx {
    fn count(&self, f: impl FnOnce(&mut Progress)) {
        self.shared.progress.send_modify(f);
    }
}

/// What a socket task is told.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Control {
    Run,
    /// The socket is gone or replaced: deregister once registered.
    Deregister,
    /// The watcher stops: end without deregistering.
    Stop,
}

/// A socket the watcher tracks.
#[derive(Debug)]
struct Active {
    id: SocketId,
    ctl: watch::Sender<Control>,
    task: JoinHandle<()>,
}

/// The watching task's state: the desired state of the world.
struct Table {
    root: PathBuf,
    ctx: Arc<Ctx>,
    watcher: RecommendedWatcher,
    /// Directories with a watch.
    watched: BTreeSet<PathBuf>,
    sockets: BTreeMap<PathBuf, Active>,
    /// Tasks of sockets that went away, still deregistering; the next task at the same path
    /// waits for its predecessor.
    draining: BTreeMap<PathBuf, JoinHandle<()>>,
}

impl Table {
    async fn run(
        mut self,
        mut events: mpsc::UnboundedReceiver<notify::Result<Event>>,
        mut stop: watch::Receiver<bool>,
    ) {
        loop {
            tokio::select! {
                biased;
                _ = stop.wait_for(|s| *s) => break,
                ev = events.recv() => match ev {
                    Some(ev) => self.on_event(ev),
                    None => break,
                },
            }
            self.draining.retain(|_, t| !t.is_finished());
        }
        let mut tasks: Vec<JoinHandle<()>> = Vec::new();
        for (_, active) in std::mem::take(&mut self.sockets) {
            active.ctl.send_replace(Control::Stop);
            tasks.push(active.task);
        }
        tasks.extend(std::mem::take(&mut self.draining).into_values());
        for task in tasks {
            if let Err(e) = task.await
                && e.is_panic()
            {
                tracing::error!(error = %e, "a plugin socket task panicked");
            }
        }
    }

    fn on_event(&mut self, ev: notify::Result<Event>) {
        self.ctx.count(|p| p.events += 1);
        let classified = match ev {
            Ok(event) => classify(&self.root, &event),
            Err(e) => {
                tracing::warn!(dir = %self.root.display(), error = %e, "plugin registration watch error; rescanning");
                Classified::Rescan
            }
        };
        match classified {
            Classified::Rescan => self.rescan(),
            Classified::Paths(paths) => {
                for (path, gone) in paths {
                    self.reconcile_path(&path, gone);
                }
            }
        }
    }

    /// Looks at everything again: the whole tree, then every socket and directory known.
    fn rescan(&mut self) {
        let root = self.root.clone();
        self.reconcile_path(&root, false);
        let known: Vec<PathBuf> = self.sockets.keys().chain(self.watched.iter()).cloned().collect();
        for path in known {
            self.reconcile_path(&path, false);
        }
    }

    fn reconcile_path(&mut self, path: &Path, gone: bool) {
        let observed = observe(path);
        let known = self.sockets.get(path).map(|a| a.id);
        match decide(known, observed, gone) {
            Decision::Nothing => {}
            Decision::Start => self.start_socket(path, observed),
            Decision::Restart => {
                self.stop_socket(path);
                self.start_socket(path, observed);
            }
            Decision::Forget => {
                if path == self.root {
                    tracing::error!(dir = %self.root.display(), "the plugin registration directory is gone; no plugin can register until it is back and the watcher restarted");
                }
                if matches!(observed, Observed::Other) && known.is_none() {
                    tracing::debug!(path = %path.display(), "ignoring a file that is not a socket");
                }
                self.forget(path);
            }
            Decision::Scan { forget_first } => {
                if forget_first {
                    self.forget(path);
                }
                self.watch_and_scan(path);
            }
        }
    }

    /// Watches `dir` (first, so nothing created from now on is missed) and looks at each entry.
    fn watch_and_scan(&mut self, dir: &Path) {
        if !self.watched.contains(dir) {
            match self.watcher.watch(dir, RecursiveMode::NonRecursive) {
                Ok(()) => {
                    self.watched.insert(dir.to_path_buf());
                }
                Err(e) => {
                    tracing::warn!(dir = %dir.display(), error = %e, "cannot watch a plugin directory; new sockets in it will not be seen");
                }
            }
        }
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) => {
                tracing::debug!(dir = %dir.display(), error = %e, "cannot list a plugin directory");
                return;
            }
        };
        for entry in entries.flatten() {
            if is_dot(&entry.file_name()) {
                continue;
            }
            self.reconcile_path(&entry.path(), false);
        }
    }

    fn start_socket(&mut self, path: &Path, observed: Observed) {
        let Observed::Socket(id) = observed else { return };
        if path.to_str().is_none() {
            tracing::warn!(socket = %path.display(), "ignoring a plugin socket whose path is not UTF-8");
            return;
        }
        tracing::debug!(socket = %path.display(), "found a plugin socket");
        let (ctl, ctl_rx) = watch::channel(Control::Run);
        let previous = self.draining.remove(path);
        let task = tokio::spawn(run_socket(Arc::clone(&self.ctx), path.to_path_buf(), ctl_rx, previous));
        self.sockets.insert(path.to_path_buf(), Active { id, ctl, task });
        let n = self.sockets.len();
        self.ctx.count(|p| p.sockets = n);
    }

    fn stop_socket(&mut self, path: &Path) {
        if let Some(active) = self.sockets.remove(path) {
            tracing::debug!(socket = %path.display(), "plugin socket gone or replaced");
            active.ctl.send_replace(Control::Deregister);
            self.draining.insert(path.to_path_buf(), active.task);
            let n = self.sockets.len();
            self.ctx.count(|p| p.sockets = n);
        }
    }

    /// Drops `path` and everything below it: sockets are deregistered, watches removed.
    fn forget(&mut self, path: &Path) {
        let sockets: Vec<PathBuf> = self.sockets.keys().filter(|p| p.starts_with(path)).cloned().collect();
        for socket in sockets {
            self.stop_socket(&socket);
        }
        let dirs: Vec<PathBuf> = self.watched.iter().filter(|d| d.starts_with(path)).cloned().collect();
        for dir in dirs {
            self.watched.remove(&dir);
            // The kernel drops the watch of a deleted directory by itself.
            let _ = self.watcher.unwatch(&dir);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// One socket's task.

async fn run_socket(
    ctx: Arc<Ctx>,
    socket: PathBuf,
    mut ctl: watch::Receiver<Control>,
    previous: Option<JoinHandle<()>>,
) {
    if let Some(previous) = previous {
        // The socket this one replaced deregisters first.
        let _ = previous.await;
    }
    let mut failures = 0u32;
    loop {
        if *ctl.borrow() != Control::Run {
            break;
        }
        // Dial, GetInfo and validation are abandoned when the socket goes.
        let prepared = tokio::select! {
            r = prepare(&ctx, &socket) => r,
            _ = until_stopped(&mut ctl) => break,
        };
        // Registration is not: once the handler is asked, its answer is awaited and undone
        // by a deregistration if the socket went meanwhile.
        let outcome = match prepared {
            Ok(p) => register(&ctx, &socket, p, &ctl).await,
            Err(reason) => Err(reason),
        };
        match outcome {
            Ok(plugin) => {
                let why = until_stopped(&mut ctl).await;
                if why == Control::Deregister {
                    ctx.handler.deregister(&plugin.name, &plugin.endpoint).await;
                    tracing::info!(driver = %plugin.name, endpoint = %plugin.endpoint, socket = %socket.display(), "csi driver deregistered");
                    lock(&ctx.shared.registered).remove(&socket);
                    ctx.count(|p| p.deregistrations += 1);
                }
                return;
            }
            Err(reason) => {
                failures = failures.saturating_add(1);
                let retry_in = ctx.config.backoff.delay(failures);
                let err = CsiError::Registration { socket: socket.clone(), reason: reason.clone() };
                tracing::warn!(error = %err, failures, ?retry_in, "plugin registration failed; will retry");
                lock(&ctx.shared.failing).insert(
                    socket.clone(),
                    FailingSocket { socket: socket.clone(), failures, last_error: reason, retry_in },
                );
                ctx.count(|p| p.failures += 1);
                tokio::select! {
                    _ = tokio::time::sleep(retry_in) => {}
                    _ = until_stopped(&mut ctl) => break,
                }
            }
        }
    }
    lock(&ctx.shared.failing).remove(&socket);
}

/// Waits until the task is told to stop or deregister (a dropped sender means stop).
async fn until_stopped(ctl: &mut watch::Receiver<Control>) -> Control {
    match ctl.wait_for(|c| *c != Control::Run).await {
        Ok(c) => *c,
        Err(_) => Control::Stop,
    }
}

/// Connects to the plugin's socket, trying again until `limit` has passed, as upstream's
/// blocking dial does: a socket is visible from its `bind`, but connections are refused until
/// the plugin's `listen`, moments later. The first retries are quick (10 ms, doubling to 1 s).
async fn dial(path: &str, limit: Duration) -> Result<Channel, String> {
    let endpoint = Endpoint::from_shared(format!("unix://{path}"))
        .map_err(|e| format!("cannot dial: {e}"))?
        .connect_timeout(limit);
    let deadline = tokio::time::Instant::now() + limit;
    let backoff = Backoff { initial: Duration::from_millis(10), max: Duration::from_secs(1) };
    let mut attempts = 0;
    loop {
        attempts += 1;
        let pause = backoff.delay(attempts);
        let last = match tokio::time::timeout_at(deadline, endpoint.connect()).await {
            Ok(Ok(channel)) => return Ok(channel),
            Ok(Err(e)) => error_chain(&e),
            Err(_) => return Err(format!("dialling did not finish within {limit:?}")),
        };
        if tokio::time::Instant::now() + pause >= deadline {
            return Err(format!("cannot dial within {limit:?}: {last}"));
        }
        tokio::time::sleep(pause).await;
    }
}

/// Asks the plugin serving `socket` who it is (dial, then GetInfo, with the configured
/// deadlines) without registering it or telling it anything: for read-only listings.
pub async fn plugin_info(socket: &Path, config: &WatcherConfig) -> Result<PluginInfo, String> {
    let path = socket.to_str().ok_or("the socket path is not UTF-8")?;
    let channel = dial(path, config.dial_timeout).await?;
    let mut client = RegistrationClient::new(channel);
    tokio::time::timeout(config.get_info_timeout, client.get_info(InfoRequest {}))
        .await
        .map_err(|_| format!("GetInfo did not answer within {:?}", config.get_info_timeout))?
        .map(tonic::Response::into_inner)
        .map_err(|s| format!("GetInfo failed ({:?}): {}", s.code(), s.message()))
}

/// The unix sockets under `dir` (subdirectories included, dot-names skipped), sorted.
pub fn sockets_under(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(d) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else { continue };
        for entry in entries.flatten() {
            if is_dot(&entry.file_name()) {
                continue;
            }
            match entry.file_type() {
                Ok(t) if t.is_dir() => pending.push(entry.path()),
                Ok(t) if t.is_socket() => found.push(entry.path()),
                _ => {}
            }
        }
    }
    found.sort();
    found
}

/// A plugin that answered GetInfo and passed validation.
struct Prepared {
    client: RegistrationClient<Channel>,
    info: PluginInfo,
    endpoint: String,
}

async fn prepare(ctx: &Ctx, socket: &Path) -> Result<Prepared, String> {
    let cfg = &ctx.config;
    let path = socket.to_str().ok_or("the socket path is not UTF-8")?;
    let channel = dial(path, cfg.dial_timeout).await?;
    let mut client = RegistrationClient::new(channel);
    let info = tokio::time::timeout(cfg.get_info_timeout, client.get_info(InfoRequest {}))
        .await
        .map_err(|_| format!("GetInfo did not answer within {:?}", cfg.get_info_timeout))?
        .map_err(|s| format!("GetInfo failed ({:?}): {}", s.code(), s.message()))?
        .into_inner();
    if info.r#type != CSI_PLUGIN_TYPE {
        let reason = format!("no handler for plugin type {:?} (socket {path})", info.r#type);
        notify_plugin(ctx, &mut client, socket, false, reason.clone()).await;
        return Err(reason);
    }
    let endpoint = if info.endpoint.is_empty() { path.to_string() } else { info.endpoint.clone() };
    if let Err(reason) = ctx.handler.validate(&info.name, &endpoint, &info.supported_versions).await {
        notify_plugin(ctx, &mut client, socket, false, format!("plugin validation failed: {reason}")).await;
        return Err(format!("csi driver {} refused: {reason}", info.name));
    }
    Ok(Prepared { client, info, endpoint })
}

async fn register(
    ctx: &Ctx,
    socket: &Path,
    prepared: Prepared,
    ctl: &watch::Receiver<Control>,
) -> Result<RegisteredPlugin, String> {
    let Prepared { mut client, info, endpoint } = prepared;
    let name = info.name;
    if let Err(reason) = ctx.handler.register(&name, &endpoint, &info.supported_versions).await {
        notify_plugin(ctx, &mut client, socket, false, format!("plugin registration failed: {reason}")).await;
        return Err(format!("csi driver {name}: registration failed: {reason}"));
    }
    let plugin =
        RegisteredPlugin { name, endpoint, versions: info.supported_versions, socket: socket.to_path_buf() };
    lock(&ctx.shared.failing).remove(socket);
    lock(&ctx.shared.registered).insert(socket.to_path_buf(), plugin.clone());
    ctx.count(|p| p.registrations += 1);
    tracing::info!(driver = %plugin.name, endpoint = %plugin.endpoint, socket = %socket.display(), "csi driver registered");
    // A plugin whose socket went meanwhile is deregistered next; it is not told "registered".
    if *ctl.borrow() == Control::Run {
        notify_plugin(ctx, &mut client, socket, true, String::new()).await;
    }
    Ok(plugin)
}

/// Tells the plugin the outcome. A plugin that does not listen changes nothing here (as
/// upstream, a registered plugin stays registered), so failures are only logged.
async fn notify_plugin(
    ctx: &Ctx,
    client: &mut RegistrationClient<Channel>,
    socket: &Path,
    registered: bool,
    error: String,
) {
    let limit = ctx.config.notify_timeout;
    let status = RegistrationStatus { plugin_registered: registered, error };
    match tokio::time::timeout(limit, client.notify_registration_status(status)).await {
        Ok(Ok(_)) => {}
        Ok(Err(s)) => {
            tracing::warn!(socket = %socket.display(), code = ?s.code(), message = s.message(), "plugin did not take its registration status");
        }
        Err(_) => {
            tracing::warn!(socket = %socket.display(), ?limit, "plugin did not take its registration status in time");
        }
    }
}

/// An error with its sources, for transport errors whose top level says little.
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use notify::event::{AccessKind, CreateKind, DataChange, MetadataKind, RemoveKind};

    fn ev(kind: EventKind, paths: &[&str]) -> Event {
        paths.iter().fold(Event::new(kind), |e, p| e.add_path(PathBuf::from(p)))
    }

    fn paths(list: &[(&str, bool)]) -> Classified {
        Classified::Paths(list.iter().map(|(p, g)| (PathBuf::from(p), *g)).collect())
    }

    #[test]
    fn classify_events() {
        let root = Path::new("/reg");
        let cases = vec![
            (ev(EventKind::Create(CreateKind::File), &["/reg/a.sock"]), paths(&[("/reg/a.sock", false)])),
            (ev(EventKind::Create(CreateKind::Folder), &["/reg/d"]), paths(&[("/reg/d", false)])),
            (
                ev(EventKind::Create(CreateKind::File), &["/reg/d/e/a.sock"]),
                paths(&[("/reg/d/e/a.sock", false)]),
            ),
            (ev(EventKind::Remove(RemoveKind::File), &["/reg/a.sock"]), paths(&[("/reg/a.sock", true)])),
            (ev(EventKind::Remove(RemoveKind::Folder), &["/reg/d"]), paths(&[("/reg/d", true)])),
            (
                ev(EventKind::Modify(ModifyKind::Name(RenameMode::From)), &["/reg/a"]),
                paths(&[("/reg/a", true)]),
            ),
            (
                ev(EventKind::Modify(ModifyKind::Name(RenameMode::To)), &["/reg/b"]),
                paths(&[("/reg/b", false)]),
            ),
            (ev(EventKind::Modify(ModifyKind::Name(RenameMode::Both)), &["/reg/a", "/reg/b"]), paths(&[])),
            (ev(EventKind::Modify(ModifyKind::Any), &["/reg/a"]), paths(&[("/reg/a", false)])),
            (ev(EventKind::Any, &["/reg/a"]), paths(&[("/reg/a", false)])),
            // The directory itself.
            (ev(EventKind::Remove(RemoveKind::Folder), &["/reg"]), paths(&[("/reg", true)])),
            // Noise.
            (ev(EventKind::Access(AccessKind::Any), &["/reg/a.sock"]), paths(&[])),
            (ev(EventKind::Modify(ModifyKind::Data(DataChange::Any)), &["/reg/a.sock"]), paths(&[])),
            (
                ev(EventKind::Modify(ModifyKind::Metadata(MetadataKind::Permissions)), &["/reg/a.sock"]),
                paths(&[]),
            ),
            // Dot names anywhere below the directory, and paths outside it.
            (ev(EventKind::Create(CreateKind::File), &["/reg/.a.sock"]), paths(&[])),
            (ev(EventKind::Create(CreateKind::File), &["/reg/.d/a.sock"]), paths(&[])),
            (ev(EventKind::Create(CreateKind::Folder), &["/reg/d/.tmp"]), paths(&[])),
            (ev(EventKind::Create(CreateKind::File), &["/other/a.sock"]), paths(&[])),
            (ev(EventKind::Create(CreateKind::File), &["/regx/a.sock"]), paths(&[])),
            (ev(EventKind::Create(CreateKind::File), &["/reg/../x.sock"]), paths(&[])),
            // Lost events.
            (ev(EventKind::Other, &[]), Classified::Rescan),
            (Event::new(EventKind::Any).set_flag(notify::event::Flag::Rescan), Classified::Rescan),
        ];
        for (event, want) in cases {
            assert_eq!(classify(root, &event), want, "{event:?}");
        }
    }

    #[test]
    fn a_dot_directory_root_is_fine() {
        // Temporary directories are often called `.tmpXXXX`; only names below the root count.
        let event = ev(EventKind::Create(CreateKind::File), &["/tmp/.tmp1/a.sock"]);
        assert_eq!(classify(Path::new("/tmp/.tmp1"), &event), paths(&[("/tmp/.tmp1/a.sock", false)]));
    }

    #[test]
    fn decisions() {
        let a = SocketId { dev: 1, ino: 10, mtime_ns: 5 };
        let b = SocketId { dev: 1, ino: 11, mtime_ns: 5 };
        let a_touched = SocketId { mtime_ns: 6, ..a };
        // (known, observed, gone, decision)
        let cases = [
            (None, Observed::Socket(a), false, Decision::Start),
            // A removal already followed by a new socket: register the new one.
            (None, Observed::Socket(a), true, Decision::Start),
            (Some(a), Observed::Socket(a), false, Decision::Nothing),
            // Re-created: another inode, or the same inode number with another time, or an
            // event saying the old one was removed.
            (Some(a), Observed::Socket(b), false, Decision::Restart),
            (Some(a), Observed::Socket(a_touched), false, Decision::Restart),
            (Some(a), Observed::Socket(a), true, Decision::Restart),
            (Some(a), Observed::Missing, true, Decision::Forget),
            (Some(a), Observed::Missing, false, Decision::Forget),
            (None, Observed::Missing, true, Decision::Forget),
            // A socket replaced by a regular file, and a regular file never known.
            (Some(a), Observed::Other, false, Decision::Forget),
            (None, Observed::Other, false, Decision::Forget),
            (None, Observed::Directory, false, Decision::Scan { forget_first: false }),
            // A directory replaced (what was known below it is stale), a socket replaced by one.
            (None, Observed::Directory, true, Decision::Scan { forget_first: true }),
            (Some(a), Observed::Directory, false, Decision::Scan { forget_first: true }),
        ];
        for (known, observed, gone, want) in cases {
            assert_eq!(decide(known, observed, gone), want, "{known:?} {observed:?} gone={gone}");
        }
    }

    #[test]
    fn defaults_are_upstreams_deadlines() {
        let c = WatcherConfig::default();
        assert_eq!(c.dir, Path::new("/var/lib/kubelet/plugins_registry"));
        assert_eq!(
            (c.dial_timeout, c.get_info_timeout, c.notify_timeout, c.backoff.initial),
            (
                Duration::from_secs(10),
                Duration::from_secs(1),
                Duration::from_secs(5),
                Duration::from_millis(500)
            )
        );
    }

    #[test]
    fn observe_tells_sockets_from_other_files() {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s.sock");
        let _listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        let file = dir.path().join("f.sock");
        std::fs::write(&file, b"").unwrap();
        let link = dir.path().join("l.sock");
        std::os::unix::fs::symlink(&sock, &link).unwrap();
        let dlink = dir.path().join("dlink");
        std::os::unix::fs::symlink(dir.path(), &dlink).unwrap();
        assert!(matches!(observe(&sock), Observed::Socket(_)));
        assert_eq!(observe(&link), observe(&sock), "a symlink counts as the socket it points at");
        assert_eq!(observe(&file), Observed::Other);
        assert_eq!(observe(&dlink), Observed::Other, "symlinked directories are not followed");
        assert_eq!(observe(dir.path()), Observed::Directory);
        assert_eq!(observe(&dir.path().join("missing")), Observed::Missing);
    }
}
