//! The registration watcher against real plugin sockets: tonic `Registration` servers (what node-driver-registrar serves) in a temporary directory, real inotify, a recording handler.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvol_csi::proto::registration::registration_server::{Registration, RegistrationServer};
use kvol_csi::proto::registration::{
    InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
};
use kvol_csi::registration::{
    Backoff, RegisteredPlugin, RegistrationHandler, RegistrationWatcher, WatcherConfig,
};
use kvol_csi::versions::{self, Version};
use tokio::net::UnixListener;
use tokio::sync::{Semaphore, oneshot};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::{Request, Response, Status};

// ---------------------------------------------------------------------------------------------
// A plugin: the Registration service on a socket.

#[derive(Debug, Default)]
struct PluginLog {
    get_info: Vec<Instant>,
    notifications: Vec<(bool, String)>,
}

#[derive(Clone)]
struct Registrar {
    info: PluginInfo,
    /// GetInfo never answers.
    silent: bool,
    log: Arc<Mutex<PluginLog>>,
}

#[async_trait::async_trait]
impl Registration for Registrar {
    async fn get_info(&self, _: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        self.log.lock().unwrap().get_info.push(Instant::now());
        if self.silent {
            std::future::pending::<()>().await;
        }
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let status = request.into_inner();
        self.log.lock().unwrap().notifications.push((status.plugin_registered, status.error));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

struct Plugin {
    socket: PathBuf,
    log: Arc<Mutex<PluginLog>>,
    bound_at: Instant,
    _stop: oneshot::Sender<()>,
}

impl Plugin {
    fn get_info_calls(&self) -> Vec<Instant> {
        self.log.lock().unwrap().get_info.clone()
    }

    fn notifications(&self) -> Vec<(bool, String)> {
        self.log.lock().unwrap().notifications.clone()
    }

    fn socket_str(&self) -> String {
        self.socket.to_str().unwrap().to_string()
    }
}

fn csi_info(name: &str, endpoint: &str, versions: &[&str]) -> PluginInfo {
    PluginInfo {
        r#type: "CSIPlugin".to_string(),
        name: name.to_string(),
        endpoint: endpoint.to_string(),
        supported_versions: versions.iter().map(|v| v.to_string()).collect(),
    }
}

/// Binds `socket` and serves Registration on it until the returned plugin is dropped.
fn serve(socket: &Path, info: PluginInfo, silent: bool) -> Plugin {
    let listener = UnixListener::bind(socket).unwrap();
    let bound_at = Instant::now();
    let log = Arc::new(Mutex::new(PluginLog::default()));
    let (stop, stopped) = oneshot::channel::<()>();
    let service = RegistrationServer::new(Registrar { info, silent, log: Arc::clone(&log) });
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming_shutdown(UnixListenerStream::new(listener), async {
                let _ = stopped.await;
            })
            .await
            .unwrap();
    });
    Plugin { socket: socket.to_path_buf(), log, bound_at, _stop: stop }
}

// ---------------------------------------------------------------------------------------------
// A handler that records its calls and applies the real version rules.

#[derive(Clone, Debug, PartialEq, Eq)]
enum Call {
    Validate { name: String, endpoint: String, versions: Vec<String> },
    Register { name: String, endpoint: String, versions: Vec<String> },
    Deregister { name: String, endpoint: String },
}

#[derive(Debug, Default)]
struct Recorder {
    calls: Mutex<Vec<(Instant, Call)>>,
    /// Registered drivers and their highest version, as the CSI plugin keeps them.
    drivers: Mutex<BTreeMap<String, Version>>,
    /// How many `register` calls fail before they succeed.
    failing_registers: AtomicU32,
    /// When set, `register` waits for a permit first.
    gate: Option<Semaphore>,
}

impl Recorder {
    fn new() -> Arc<Recorder> {
        Arc::new(Recorder::default())
    }

    fn calls(&self) -> Vec<Call> {
        self.calls.lock().unwrap().iter().map(|(_, c)| c.clone()).collect()
    }

    fn registers_of(&self, name: &str) -> Vec<(Instant, Call)> {
        let calls = self.calls.lock().unwrap();
        calls
            .iter()
            .filter(|(_, c)| matches!(c, Call::Register { name: n, .. } if n == name))
            .cloned()
            .collect()
    }

    fn record(&self, call: Call) {
        self.calls.lock().unwrap().push((Instant::now(), call));
    }

    fn check(&self, name: &str, versions: &[String]) -> Result<Version, String> {
        versions::validate_new(name, versions, self.drivers.lock().unwrap().get(name))
    }
}

#[async_trait::async_trait]
impl RegistrationHandler for Recorder {
    async fn validate(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String> {
        self.record(Call::Validate {
            name: name.into(),
            endpoint: endpoint.into(),
            versions: versions.to_vec(),
        });
        self.check(name, versions).map(|_| ())
    }

    async fn register(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String> {
        self.record(Call::Register {
            name: name.into(),
            endpoint: endpoint.into(),
            versions: versions.to_vec(),
        });
        if let Some(gate) = &self.gate {
            gate.acquire().await.unwrap().forget();
        }
        let version = self.check(name, versions)?;
        if self.failing_registers.load(Ordering::SeqCst) > 0 {
            self.failing_registers.fetch_sub(1, Ordering::SeqCst);
            return Err(format!("NodeGetInfo of {name} failed: driver not ready"));
        }
        self.drivers.lock().unwrap().insert(name.to_string(), version);
        Ok(())
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        self.record(Call::Deregister { name: name.into(), endpoint: endpoint.into() });
        self.drivers.lock().unwrap().remove(name);
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers.

/// Polls `f` every 5 ms until it gives a value, failing the test after 10 s.
async fn eventually<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn fast_config(dir: &Path) -> WatcherConfig {
    WatcherConfig {
        backoff: Backoff { initial: Duration::from_millis(50), max: Duration::from_millis(500) },
        ..WatcherConfig::new(dir)
    }
}

fn start(dir: &Path, handler: &Arc<Recorder>) -> RegistrationWatcher {
    RegistrationWatcher::start(fast_config(dir), Arc::clone(handler) as Arc<dyn RegistrationHandler>).unwrap()
}

fn register_call(name: &str, endpoint: &str, versions: &[&str]) -> Call {
    Call::Register {
        name: name.to_string(),
        endpoint: endpoint.to_string(),
        versions: versions.iter().map(|v| v.to_string()).collect(),
    }
}

fn deregister_call(name: &str, endpoint: &str) -> Call {
    Call::Deregister { name: name.to_string(), endpoint: endpoint.to_string() }
}

fn registered_names(w: &RegistrationWatcher) -> Vec<String> {
    w.registered().into_iter().map(|p| p.name).collect()
}

// ---------------------------------------------------------------------------------------------
// Tests.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registers_a_plugin_and_tells_it() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);

    let plugin = serve(
        &tmp.path().join("hostpath-reg.sock"),
        csi_info("hostpath.csi.k8s.io", "/var/lib/kubelet/plugins/hostpath/csi.sock", &["1.0.0"]),
        false,
    );
    let (at, call) =
        eventually("the handler's register", || handler.registers_of("hostpath.csi.k8s.io").pop()).await;
    println!("bind → handler.register: {:?}", at.duration_since(plugin.bound_at));
    assert_eq!(
        call,
        register_call("hostpath.csi.k8s.io", "/var/lib/kubelet/plugins/hostpath/csi.sock", &["1.0.0"])
    );
    // Validated first, with the same arguments.
    assert!(matches!(&handler.calls()[0], Call::Validate { name, .. } if name == "hostpath.csi.k8s.io"));

    let notes = eventually("Notify(true)", || Some(plugin.notifications()).filter(|n| !n.is_empty())).await;
    assert_eq!(notes, vec![(true, String::new())]);
    assert_eq!(
        watcher.registered(),
        vec![RegisteredPlugin {
            name: "hostpath.csi.k8s.io".to_string(),
            endpoint: "/var/lib/kubelet/plugins/hostpath/csi.sock".to_string(),
            versions: vec!["1.0.0".to_string()],
            socket: plugin.socket.clone(),
        }]
    );
    assert_eq!(watcher.progress().borrow().registrations, 1);
    assert!(watcher.failing().is_empty());
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_empty_endpoint_means_the_socket() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let plugin = serve(&tmp.path().join("d.sock"), csi_info("d.example.com", "", &["v1.2.0"]), false);
    let (_, call) = eventually("register", || handler.registers_of("d.example.com").pop()).await;
    assert_eq!(call, register_call("d.example.com", &plugin.socket_str(), &["v1.2.0"]));
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_in_directories_made_after_start() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    // A socket bound right after its directory (and its parent) was made: the watch on the new
    // directory may come after the bind, so only the rescan of the directory finds it.
    let mut plugins = Vec::new();
    for i in 0..5 {
        let dir = tmp.path().join(format!("driver-{i}")).join("nested");
        std::fs::create_dir_all(&dir).unwrap();
        plugins.push(serve(
            &dir.join("reg.sock"),
            csi_info(&format!("d{i}.example.com"), "", &["1.0.0"]),
            false,
        ));
    }
    for (i, plugin) in plugins.iter().enumerate() {
        let name = format!("d{i}.example.com");
        let (at, call) = eventually(&name, || handler.registers_of(&name).pop()).await;
        assert_eq!(call, register_call(&name, &plugin.socket_str(), &["1.0.0"]));
        println!(
            "{name} in a new directory: bind → handler.register: {:?}",
            at.duration_since(plugin.bound_at)
        );
    }
    // And a socket in an existing directory that is already watched.
    let late = serve(
        &tmp.path().join("driver-0/nested/late.sock"),
        csi_info("late.example.com", "", &["1.0.0"]),
        false,
    );
    eventually("late", || handler.registers_of("late.example.com").pop()).await;
    eventually("Notify(true) to late", || {
        Some(()).filter(|_| late.notifications() == vec![(true, String::new())])
    })
    .await;
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_removed_socket_is_deregistered() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let plugin = serve(
        &tmp.path().join("gone.sock"),
        csi_info("gone.example.com", "/plugins/gone/csi.sock", &["1.0.0"]),
        false,
    );
    eventually("registered", || Some(()).filter(|_| registered_names(&watcher) == ["gone.example.com"]))
        .await;

    std::fs::remove_file(&plugin.socket).unwrap();
    eventually("deregistered", || Some(()).filter(|_| watcher.registered().is_empty())).await;
    let calls = handler.calls();
    assert_eq!(calls.last(), Some(&deregister_call("gone.example.com", "/plugins/gone/csi.sock")));
    assert_eq!(calls.iter().filter(|c| matches!(c, Call::Deregister { .. })).count(), 1);
    let progress = *watcher.progress().borrow();
    assert_eq!((progress.sockets, progress.registrations, progress.deregistrations), (0, 1, 1));
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_socket_is_registered_again() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let socket = tmp.path().join("again.sock");
    let first = serve(&socket, csi_info("again.example.com", "", &["1.0.0"]), false);
    eventually("first registration", || handler.registers_of("again.example.com").pop()).await;
    eventually("first Notify", || Some(()).filter(|_| !first.notifications().is_empty())).await;

    // What a restarted node-driver-registrar does: unlink the old socket, bind a new one.
    std::fs::remove_file(&socket).unwrap();
    drop(first);
    let second = serve(&socket, csi_info("again.example.com", "", &["1.0.0"]), false);
    eventually("second registration", || {
        Some(()).filter(|_| handler.registers_of("again.example.com").len() == 2)
    })
    .await;
    eventually("Notify(true) to the new plugin", || {
        Some(()).filter(|_| second.notifications() == vec![(true, String::new())])
    })
    .await;
    let endpoint = socket.to_str().unwrap();
    let lifecycle: Vec<Call> =
        handler.calls().into_iter().filter(|c| !matches!(c, Call::Validate { .. })).collect();
    assert_eq!(
        lifecycle,
        vec![
            register_call("again.example.com", endpoint, &["1.0.0"]),
            deregister_call("again.example.com", endpoint),
            register_call("again.example.com", endpoint, &["1.0.0"]),
        ]
    );
    assert_eq!(registered_names(&watcher), ["again.example.com"]);
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsupported_versions_are_refused_and_the_plugin_told_why() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let plugin = serve(&tmp.path().join("old.sock"), csi_info("old.example.com", "", &["0.3.0"]), false);
    let (registered, error) = eventually("Notify(false)", || plugin.notifications().into_iter().next()).await;
    assert!(!registered);
    let expected = versions::validate_new("old.example.com", &["0.3.0"], None).unwrap_err();
    assert!(error.contains(&expected), "{error:?} should carry the handler's reason {expected:?}");
    // Refusals are retried (a plugin may be fixed in place), and keep being refused.
    eventually("a retry", || Some(()).filter(|_| plugin.notifications().len() >= 2)).await;
    assert!(plugin.notifications().iter().all(|(ok, _)| !ok));
    assert!(handler.registers_of("old.example.com").is_empty(), "register must not be called");
    assert!(watcher.registered().is_empty());
    let failing = watcher.failing();
    assert_eq!(failing.len(), 1);
    assert_eq!(failing[0].socket, plugin.socket);
    assert!(failing[0].last_error.contains("must be 1.x"), "{:?}", failing[0].last_error);
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_known_name_needs_a_higher_version() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let first = serve(&tmp.path().join("a.sock"), csi_info("same.example.com", "", &["1.0.0"]), false);
    eventually("the first", || Some(()).filter(|_| first.notifications() == vec![(true, String::new())]))
        .await;

    let equal = serve(&tmp.path().join("b.sock"), csi_info("same.example.com", "", &["v1.0.0"]), false);
    let (ok, error) =
        eventually("Notify(false) to the equal one", || equal.notifications().into_iter().next()).await;
    assert!(!ok);
    assert!(error.contains("already registered"), "{error:?}");
    assert_eq!(handler.registers_of("same.example.com").len(), 1);

    let higher =
        serve(&tmp.path().join("c.sock"), csi_info("same.example.com", "", &["1.0.0", "1.1.0"]), false);
    eventually("the higher one", || {
        Some(()).filter(|_| higher.notifications() == vec![(true, String::new())])
    })
    .await;
    let sockets: Vec<PathBuf> = watcher.registered().into_iter().map(|p| p.socket).collect();
    assert_eq!(sockets, vec![first.socket.clone(), higher.socket.clone()]);
    assert!(equal.notifications().iter().all(|(ok, _)| !ok));
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_plugin_types_are_refused() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let info =
        PluginInfo { r#type: "DevicePlugin".to_string(), ..csi_info("gpu.example.com", "", &["1.0.0"]) };
    let plugin = serve(&tmp.path().join("gpu.sock"), info, false);
    let (ok, error) = eventually("Notify(false)", || plugin.notifications().into_iter().next()).await;
    assert!(!ok);
    assert!(error.contains("no handler for plugin type \"DevicePlugin\""), "{error:?}");
    assert!(error.contains(&plugin.socket_str()), "{error:?} should name the socket");
    assert!(handler.calls().is_empty(), "the handler must not be asked: {:?}", handler.calls());
    assert!(watcher.registered().is_empty());
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_plugin_is_retried_with_backoff_and_delays_nobody() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let get_info_timeout = Duration::from_millis(1000);
    let backoff = Backoff { initial: Duration::from_millis(100), max: Duration::from_secs(1) };
    let config = WatcherConfig { get_info_timeout, backoff, ..WatcherConfig::new(tmp.path()) };
    let watcher =
        RegistrationWatcher::start(config, Arc::clone(&handler) as Arc<dyn RegistrationHandler>).unwrap();

    let silent = serve(&tmp.path().join("silent.sock"), csi_info("silent.example.com", "", &["1.0.0"]), true);
    eventually("the first GetInfo", || Some(()).filter(|_| silent.get_info_calls().len() == 1)).await;
    // While that GetInfo hangs, another plugin registers.
    let _prompt =
        serve(&tmp.path().join("prompt.sock"), csi_info("prompt.example.com", "", &["1.0.0"]), false);
    eventually("the prompt plugin", || handler.registers_of("prompt.example.com").pop()).await;
    assert_eq!(silent.get_info_calls().len(), 1);
    assert!(watcher.failing().is_empty(), "registered while the silent plugin's first GetInfo was pending");

    // The watcher's own account of each failure: the wait it chose doubles.
    let mut waits = BTreeMap::new();
    let calls = eventually("three GetInfo attempts", || {
        for f in watcher.failing() {
            waits.insert(f.failures, f.retry_in);
        }
        Some(silent.get_info_calls()).filter(|c| c.len() >= 3)
    })
    .await;
    assert_eq!(waits.get(&1), Some(&Duration::from_millis(100)), "{waits:?}");
    assert_eq!(waits.get(&2), Some(&Duration::from_millis(200)), "{waits:?}");
    // Seen from the plugin: each attempt waited out the GetInfo deadline, then the backoff.
    // (Stamped on arrival, while the deadline starts before sending: allow for that.)
    let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].duration_since(w[0])).collect();
    println!("silent plugin: GetInfo attempts {:?} apart", gaps);
    let slack = Duration::from_millis(50);
    assert!(gaps[0] + slack >= get_info_timeout + Duration::from_millis(100), "{gaps:?}");
    assert!(gaps[1] + slack >= get_info_timeout + Duration::from_millis(200), "{gaps:?}");
    let failing = watcher.failing();
    assert_eq!(failing.len(), 1);
    assert_eq!(failing[0].socket, silent.socket);
    assert!(failing[0].failures >= 2);
    assert!(failing[0].last_error.contains("GetInfo did not answer"), "{:?}", failing[0].last_error);
    assert!(handler.registers_of("silent.example.com").is_empty());
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_that_are_not_sockets_are_ignored() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    std::fs::write(tmp.path().join("file.sock"), b"not a socket").unwrap();
    nix::unistd::mkfifo(&tmp.path().join("fifo.sock"), nix::sys::stat::Mode::from_bits_truncate(0o600))
        .unwrap();
    // Events are handled in order: once this one registered, the two above were looked at.
    let real = serve(&tmp.path().join("real.sock"), csi_info("real.example.com", "", &["1.0.0"]), false);
    eventually("the real socket", || handler.registers_of("real.example.com").pop()).await;
    assert_eq!(watcher.progress().borrow().sockets, 1, "only the socket is tracked");
    assert_eq!(registered_names(&watcher), ["real.example.com"]);
    assert!(watcher.failing().is_empty());
    drop(real);
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_names_are_ignored() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let hidden =
        serve(&tmp.path().join(".hidden.sock"), csi_info("hidden.example.com", "", &["1.0.0"]), false);
    std::fs::create_dir(tmp.path().join(".staging")).unwrap();
    let staged =
        serve(&tmp.path().join(".staging/reg.sock"), csi_info("staged.example.com", "", &["1.0.0"]), false);
    let visible =
        serve(&tmp.path().join("visible.sock"), csi_info("visible.example.com", "", &["1.0.0"]), false);
    eventually("the visible socket", || {
        Some(()).filter(|_| visible.notifications() == vec![(true, String::new())])
    })
    .await;
    assert_eq!(watcher.progress().borrow().sockets, 1, "only the visible socket is tracked");
    assert!(hidden.get_info_calls().is_empty() && staged.get_info_calls().is_empty());
    assert_eq!(registered_names(&watcher), ["visible.example.com"]);
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sockets_present_before_start_are_found() {
    let tmp = kvol_test_support::ScratchRoot::new();
    // The directory does not exist yet: the watcher makes it, 0755.
    let dir = tmp.path().join("kubelet/plugins_registry");
    let handler = Recorder::new();
    let watcher = start(&dir, &handler);
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert!(mode & 0o700 == 0o700 && mode & !0o755 == 0, "mode {mode:o}");
    watcher.shutdown().await;

    std::fs::create_dir(dir.join("sub")).unwrap();
    let a = serve(&dir.join("a.sock"), csi_info("a.example.com", "", &["1.0.0"]), false);
    let b = serve(&dir.join("sub/b.sock"), csi_info("b.example.com", "", &["1.0.0"]), false);
    let watcher = start(&dir, &handler);
    assert_eq!(watcher.progress().borrow().sockets, 2, "both are tracked when start returns");
    eventually("both registered", || Some(()).filter(|_| watcher.registered().len() == 2)).await;
    let sockets: Vec<PathBuf> = watcher.registered().into_iter().map(|p| p.socket).collect();
    assert_eq!(sockets, vec![a.socket.clone(), b.socket.clone()]);
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_register_is_retried() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    handler.failing_registers.store(1, Ordering::SeqCst);
    let watcher = start(tmp.path(), &handler);
    let plugin = serve(&tmp.path().join("flaky.sock"), csi_info("flaky.example.com", "", &["1.0.0"]), false);
    let notes = eventually("Notify(false) then Notify(true)", || {
        Some(plugin.notifications()).filter(|n| n.len() == 2)
    })
    .await;
    assert!(!notes[0].0 && notes[0].1.contains("driver not ready"), "{notes:?}");
    assert_eq!(notes[1], (true, String::new()));
    assert_eq!(handler.registers_of("flaky.example.com").len(), 2);
    assert_eq!(registered_names(&watcher), ["flaky.example.com"]);
    assert!(watcher.failing().is_empty(), "success clears the failure");
    let progress = *watcher.progress().borrow();
    assert_eq!((progress.failures, progress.registrations), (1, 1));
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_socket_removed_during_register_is_deregistered_after_it() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Arc::new(Recorder { gate: Some(Semaphore::new(0)), ..Recorder::default() });
    let watcher = start(tmp.path(), &handler);
    let plugin = serve(&tmp.path().join("brief.sock"), csi_info("brief.example.com", "", &["1.0.0"]), false);
    eventually("register in flight", || handler.registers_of("brief.example.com").pop()).await;

    std::fs::remove_file(&plugin.socket).unwrap();
    let mut progress = watcher.progress();
    tokio::time::timeout(Duration::from_secs(10), progress.wait_for(|p| p.sockets == 0))
        .await
        .unwrap()
        .unwrap();
    handler.gate.as_ref().unwrap().add_permits(1);

    eventually("deregistered", || {
        Some(()).filter(|_| {
            handler.calls().last() == Some(&deregister_call("brief.example.com", &plugin.socket_str()))
        })
    })
    .await;
    assert!(handler.drivers.lock().unwrap().is_empty());
    eventually("registered() empty", || Some(()).filter(|_| watcher.registered().is_empty())).await;
    assert!(plugin.notifications().iter().all(|(ok, _)| !ok), "a plugin that went is not told it registered");
    watcher.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_deregisters_nothing_and_lets_go() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let handler = Recorder::new();
    let watcher = start(tmp.path(), &handler);
    let progress = watcher.progress();
    let plugin = serve(&tmp.path().join("stay.sock"), csi_info("stay.example.com", "", &["1.0.0"]), false);
    eventually("registered", || Some(()).filter(|_| plugin.notifications().len() == 1)).await;
    watcher.shutdown().await;
    assert!(handler.calls().iter().all(|c| !matches!(c, Call::Deregister { .. })), "{:?}", handler.calls());
    // Every task is gone: nothing holds the handler or the counters any more, so no later
    // event can reach the handler.
    assert_eq!(Arc::strong_count(&handler), 1);
    assert!(progress.has_changed().is_err(), "the progress sender is dropped");
}
