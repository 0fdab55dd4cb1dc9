//! The prober against real inotify and real driver processes: installs, updates, removals, broken and untrusted drivers, floods.

use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvol_flex::install::install;
use kvol_flex::prober::{DriverState, FlexProber, ProbedDriver, ProberConfig, probe_all_once};
use kvol_flex::{CallLimits, DriverCapabilities};
use kvol_plugin::{NodeInfo, NodePaths, PluginHost, PluginKind, PluginRegistry, RecordingMounter};

const DEADLINE: Duration = Duration::from_secs(5);

const INIT_OK: &str = r#"echo '{"status":"Success","capabilities":{"attach":false}}'"#;
const INIT_ATTACH: &str = r#"echo '{"status":"Success","capabilities":{"attach":true}}'"#;
const INIT_GARBAGE: &str = "echo 'this is not json'";
const INIT_FAILS: &str = r#"echo '{"status":"Failure","message":"no backend here"}'; exit 1"#;
const INIT_HANGS: &str = "sleep 30";

fn host() -> PluginHost {
    PluginHost::new(
        NodePaths::new("/var/lib/kvol-test"),
        NodeInfo::named("node-1"),
        Arc::new(RecordingMounter::new()),
    )
}

/// A plugin dir and a work dir (sources, init counters) in one tempdir, and a prober on it.
struct Env {
    _tmp: kvol_test_support::ScratchRoot,
    plugin_dir: PathBuf,
    work: PathBuf,
    registry: Arc<PluginRegistry>,
    prober: FlexProber,
}

fn config(plugin_dir: &Path, timeout: Duration) -> ProberConfig {
    ProberConfig {
        dir: plugin_dir.to_path_buf(),
        min_reprobe_interval: Duration::from_secs(1),
        owner_uid: nix::unistd::geteuid().as_raw(),
        limits: CallLimits { timeout, ..CallLimits::default() },
    }
}

impl Env {
    fn start() -> Env {
        Env::start_with(Duration::from_secs(2))
    }

    /// Starts a prober whose driver calls time out after `timeout`.
    fn start_with(timeout: Duration) -> Env {
        let tmp = kvol_test_support::ScratchRoot::new();
        let plugin_dir = tmp.path().join("exec");
        let work = tmp.path().join("work");
        std::fs::create_dir(&work).unwrap();
        std::fs::create_dir(&plugin_dir).unwrap();
        let registry = Arc::new(PluginRegistry::new(vec![]).unwrap());
        let prober = FlexProber::start(config(&plugin_dir, timeout), host(), Arc::clone(&registry)).unwrap();
        Env { _tmp: tmp, plugin_dir, work, registry, prober }
    }

    /// The script of driver `tag`: logs every command to its counter file, then runs `init_body` for init.
    fn script(&self, tag: &str, init_body: &str) -> String {
        let counter = self.work.join(format!("{tag}.calls"));
        format!(
            "#!/bin/sh\necho \"$1\" >> '{}'\ncase \"$1\" in\n  init) {init_body} ;;\n  *) echo '{{\"status\":\"Not supported\"}}' ;;\nesac\n",
            counter.display()
        )
    }

    /// Installs driver `dir_name` (`vendor~tag`) with the real installer.
    fn install(&self, dir_name: &str, init_body: &str) {
        let tag = dir_name.rsplit('~').next().unwrap();
        let src = self.work.join(format!("{tag}.src"));
        std::fs::write(&src, self.script(tag, init_body)).unwrap();
        install(&src, &self.plugin_dir, dir_name).unwrap();
    }

    /// How many times driver `tag` ran init.
    fn inits(&self, tag: &str) -> usize {
        std::fs::read_to_string(self.work.join(format!("{tag}.calls")))
            .map(|s| s.lines().filter(|l| *l == "init").count())
            .unwrap_or(0)
    }

    fn registered(&self, name: &str) -> bool {
        self.registry.snapshot().find_by_name(name).is_ok()
    }

    fn attachable(&self, name: &str) -> Option<bool> {
        self.registry.snapshot().find_by_name(name).ok().map(|p| p.capabilities().attachable)
    }

    fn state(&self, dir: &str) -> Option<DriverState> {
        self.prober.status().into_iter().find(|d| d.dir == dir).map(|d| d.state)
    }

    fn failure(&self, dir: &str) -> Option<String> {
        match self.state(dir) {
            Some(DriverState::Failed { reason }) => Some(reason),
            _ => None,
        }
    }
}

/// Polls `check` until it holds, for up to five seconds.
async fn eventually(what: &str, mut check: impl FnMut() -> bool) {
    let start = Instant::now();
    while !check() {
        assert!(start.elapsed() < DEADLINE, "{what}: not within {DEADLINE:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn write_executable(path: &Path, text: &str) {
    use std::io::Write;
    let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o755).open(path).unwrap();
    f.write_all(text.as_bytes()).unwrap();
}

fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_update_and_removal_follow_the_disk() {
    let env = Env::start();
    env.prober.wait_idle().await;
    assert!(env.prober.status().is_empty());

    let t = Instant::now();
    env.install("example.com~nfs", INIT_OK);
    let installed = t.elapsed();
    eventually("the installed driver is registered", || env.registered("example.com/nfs")).await;
    let latency = t.elapsed() - installed;
    eprintln!("install finished → driver in the registry: {latency:?}");
    assert_eq!(env.attachable("example.com/nfs"), Some(false));
    let plugin = env.registry.snapshot().find_by_name("example.com/nfs").unwrap().clone();
    assert_eq!(plugin.kind(), PluginKind::Flexvolume);
    assert_eq!(
        env.prober.status(),
        [ProbedDriver {
            dir: "example.com~nfs".into(),
            name: "example.com/nfs".into(),
            state: DriverState::Loaded {
                capabilities: DriverCapabilities { attach: false, ..DriverCapabilities::default() }
            },
        }]
    );

    // New bytes: re-probed, and the new capabilities are what the registry serves.
    let before = env.inits("nfs");
    env.install("example.com~nfs", INIT_ATTACH);
    eventually("the update is re-probed", || env.attachable("example.com/nfs") == Some(true)).await;
    assert_eq!(env.inits("nfs"), before + 1);

    // The executable removed: the driver leaves; the directory stays, so the status says why.
    std::fs::remove_file(env.plugin_dir.join("example.com~nfs/nfs")).unwrap();
    eventually("a removed executable unregisters", || !env.registered("example.com/nfs")).await;
    eventually("status says the executable is missing", || {
        env.failure("example.com~nfs").is_some_and(|r| r.contains("has no executable nfs"))
    })
    .await;

    // Back, then the whole directory removed.
    env.install("example.com~nfs", INIT_OK);
    eventually("reinstalled", || env.registered("example.com/nfs")).await;
    std::fs::remove_dir_all(env.plugin_dir.join("example.com~nfs")).unwrap();
    eventually("a removed driver dir unregisters and is forgotten", || {
        !env.registered("example.com/nfs") && env.prober.status().is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn broken_drivers_are_not_loaded_and_say_why() {
    let env = Env::start_with(Duration::from_millis(500));
    env.install("v~garbage", INIT_GARBAGE);
    env.install("v~fails", INIT_FAILS);
    env.install("v~hangs", INIT_HANGS);
    env.install("v~good", INIT_OK);
    for (dir, says) in [
        ("v~garbage", "printed output that is not a driver status"),
        ("v~fails", "no backend here"),
        ("v~hangs", "did not finish within 500ms"),
    ] {
        eventually(&format!("{dir} refused"), || env.failure(dir).is_some_and(|r| r.contains(says))).await;
    }
    eventually("the good one loads", || env.registered("v/good")).await;
    assert!(env.registered("v/good"));
    for name in ["v/garbage", "v/fails", "v/hangs"] {
        assert!(!env.registered(name), "{name} must not be registered");
    }
    let rows = env.prober.not_registered();
    let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
    assert_eq!(names, ["v/fails", "v/garbage", "v/hangs"]);
    assert!(rows.iter().all(|r| r.kind == PluginKind::Flexvolume));

    // A loaded driver whose new version fails init is removed, not kept from before.
    env.install("v~good", INIT_FAILS);
    eventually("the failing update unloads the driver", || !env.registered("v/good")).await;
    assert!(env.failure("v~good").unwrap().contains("no backend here"));
    // And a fixed version loads again.
    env.install("v~good", INIT_OK);
    eventually("the fixed driver loads", || env.registered("v/good")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_written_right_after_its_directory_is_found() {
    let env = Env::start();
    env.prober.wait_idle().await;
    // No pause between mkdir and the file: the file's own event may be lost (the directory's
    // watch is not there yet), so the directory's Create must make the prober look inside.
    for i in 0..10 {
        let dir = env.plugin_dir.join(format!("race~d{i}"));
        std::fs::create_dir(&dir).unwrap();
        write_executable(&dir.join(format!("d{i}")), &env.script(&format!("d{i}"), INIT_OK));
    }
    for i in 0..10 {
        let name = format!("race/d{i}");
        eventually(&format!("{name} is found"), || env.registered(&name)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dot_files_and_dot_directories_are_never_probed() {
    let env = Env::start();
    env.install("v~x", INIT_OK);
    eventually("x loaded", || env.registered("v/x")).await;
    // The install's own events may still bring one (rate-limited, trailing) re-probe of x: let
    // it happen before counting, so only what the dot files do is measured.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    env.prober.wait_idle().await;
    let x_inits = env.inits("x");
    assert!((1..=2).contains(&x_inits), "{x_inits}");

    // A new version being copied in as `.x`, touched for longer than the rate limit: were dot
    // files events, x would be re-probed (its init run) at least once meanwhile.
    let dir = env.plugin_dir.join("v~x");
    let temp = dir.join(".x");
    write_executable(&temp, &env.script("xnew", INIT_ATTACH));
    // A dot directory holding a complete driver.
    let hidden = env.plugin_dir.join(".v~y");
    std::fs::create_dir(&hidden).unwrap();
    write_executable(&hidden.join("y"), &env.script("y", INIT_OK));
    for _ in 0..15 {
        chmod(&temp, 0o755);
        chmod(&hidden.join("y"), 0o755);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // inotify delivers in order: once a later driver is in, every event above was handled.
    env.install("v~z", INIT_OK);
    eventually("z loaded", || env.registered("v/z")).await;
    assert_eq!(
        (env.inits("x"), env.inits("xnew"), env.inits("y")),
        (x_inits, 0, 0),
        "no dot file event probed"
    );
    assert!(env.state(".v~y").is_none());

    // The rename that finishes the install is what reloads it.
    std::fs::rename(&temp, dir.join("x")).unwrap();
    eventually("the renamed driver reloads", || env.attachable("v/x") == Some(true)).await;
    assert_eq!((env.inits("x"), env.inits("xnew")), (x_inits, 1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_plugin_dir_is_recreated_and_watched_again() {
    let env = Env::start();
    env.install("v~a", INIT_OK);
    eventually("a loaded", || env.registered("v/a")).await;

    std::fs::remove_dir_all(&env.plugin_dir).unwrap();
    eventually("a unloaded and the plugin dir recreated", || {
        !env.registered("v/a") && env.plugin_dir.is_dir()
    })
    .await;
    env.install("v~b", INIT_OK);
    eventually("a driver in the recreated dir is found", || env.registered("v/b")).await;

    // Deleted and recreated by someone else at once (the prober may get there first).
    std::fs::remove_dir_all(&env.plugin_dir).unwrap();
    std::fs::create_dir_all(&env.plugin_dir).unwrap();
    env.install("v~c", INIT_OK);
    eventually("c found, b gone", || env.registered("v/c") && !env.registered("v/b")).await;
    env.install("v~d", INIT_OK);
    eventually("the new dir is watched", || env.registered("v/d")).await;

    // Moved away: the old inode is not followed; the path is recreated and watched.
    let moved = env.work.join("moved");
    std::fs::rename(&env.plugin_dir, &moved).unwrap();
    eventually("moved drivers unload", || !env.registered("v/c") && !env.registered("v/d")).await;
    eventually("the plugin dir is recreated", || env.plugin_dir.is_dir()).await;
    env.install("v~e", INIT_OK);
    eventually("e found", || env.registered("v/e")).await;
    std::fs::remove_file(moved.join("v~c/c")).unwrap();
    env.install("v~e", INIT_ATTACH);
    eventually("e updated", || env.attachable("v/e") == Some(true)).await;
    assert!(!env.registered("v/c") && !env.registered("v/d"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_events_is_coalesced_and_the_last_change_applies() {
    let env = Env::start();
    env.install("v~busy", INIT_OK);
    eventually("loaded", || env.registered("v/busy")).await;
    env.prober.wait_idle().await;
    let before = env.inits("busy");
    let progress_before = *env.prober.progress().borrow();

    // 10,000 touches of a file in the driver dir, spread over about 2.5 s so the rate limit
    // lets a few probes through during the flood, not just one after it.
    let start = Instant::now();
    let stamp = std::fs::File::create(env.plugin_dir.join("v~busy/stamp")).unwrap();
    for batch in 0..20u64 {
        for i in 0..500 {
            stamp
                .set_modified(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(batch * 500 + i))
                .unwrap();
        }
        tokio::time::sleep(Duration::from_millis(125)).await;
    }
    let flood = start.elapsed();
    // The last change: a new version, which must win over the flood.
    env.install("v~busy", INIT_ATTACH);
    eventually("the last change applied", || env.attachable("v/busy") == Some(true)).await;
    let progress = env.prober.wait_idle().await;
    let elapsed = start.elapsed();
    let inits = env.inits("busy") - before;
    let bound = (elapsed.as_secs_f64() / 1.0).floor() as usize + 2;
    eprintln!(
        "10000 events in {flood:?}: {inits} inits in {elapsed:?} (bound {bound}); prober counted {} inits",
        progress.inits - progress_before.inits
    );
    assert!((1..=bound).contains(&inits), "{inits} inits in {elapsed:?}");
    assert_eq!(progress.inits - progress_before.inits, inits as u64);
    assert!(matches!(env.state("v~busy"), Some(DriverState::Loaded { capabilities }) if capabilities.attach));
}

/// A child shell creating and removing files in a directory until dropped.
struct Storm(std::process::Child);

impl Storm {
    fn start(dir: &Path) -> Storm {
        let script = "cd \"$1\" && while :; do i=0; while [ $i -lt 500 ]; do : > s$i; i=$((i+1)); done; rm -f s*; done";
        Storm(std::process::Command::new("sh").args(["-c", script, "storm"]).arg(dir).spawn().unwrap())
    }
}

impl Drop for Storm {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_made_during_an_event_storm_are_not_lost() {
    let env = Env::start();
    env.install("v~busy", INIT_OK);
    eventually("loaded", || env.registered("v/busy")).await;
    let storm = Storm::start(&env.plugin_dir.join("v~busy"));
    // Let the storm run long enough that the driver has a probe queued behind the rate limit,
    // so its events are being dropped as held when the real change lands.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    env.install("v~busy", INIT_ATTACH);
    env.install("v~other", INIT_OK);
    let other_installed = Instant::now();
    eventually("another driver installed during the storm", || env.registered("v/other")).await;
    let other_usable = other_installed.elapsed();
    eventually("the change made during the storm applied", || env.attachable("v/busy") == Some(true)).await;
    drop(storm);
    eprintln!("a driver installed during the storm was usable after {other_usable:?}");
    assert!(matches!(env.state("v~busy"), Some(DriverState::Loaded { capabilities }) if capabilities.attach));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stormed_driver_directory_stops_reaching_the_prober_until_its_probe() {
    let env = Env::start();
    env.install("v~busy", INIT_OK);
    eventually("loaded", || env.registered("v/busy")).await;
    env.prober.wait_idle().await;
    let before = env.prober.events_seen();
    // 5,000 files created (create, open, close-write) and removed: 20,000 inotify events.
    const FILES: u64 = 5000;
    let script = "cd \"$1\" && i=0; while [ $i -lt $2 ]; do : > s$i; i=$((i+1)); done; rm -f s*";
    let dir = env.plugin_dir.join("v~busy");
    let status = std::process::Command::new("sh")
        .args(["-c", script, "storm"])
        .arg(&dir)
        .arg(FILES.to_string())
        .status()
        .unwrap();
    assert!(status.success(), "the storm script failed in {}", dir.display());
    env.prober.wait_idle().await;
    let seen = env.prober.events_seen() - before;
    eprintln!("a storm of {} events in a driver directory: {seen} reached the prober", FILES * 4);
    assert!(seen < FILES * 2, "{seen} of {} storm events reached the prober", FILES * 4);
    // The probe that followed put the watch back: a change now is seen.
    env.install("v~busy", INIT_ATTACH);
    eventually("a change after the storm applied", || env.attachable("v/busy") == Some(true)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn untrusted_drivers_are_refused_with_the_reason() {
    let env = Env::start();
    env.install("v~drv", INIT_OK);
    eventually("loaded", || env.registered("v/drv")).await;
    let exe = env.plugin_dir.join("v~drv/drv");
    let dir = env.plugin_dir.join("v~drv");
    let before = env.inits("drv");

    chmod(&exe, 0o777);
    eventually("a world-writable driver is unloaded", || !env.registered("v/drv")).await;
    assert_eq!(
        env.failure("v~drv").unwrap(),
        format!("refusing flexvolume driver {}: is world-writable (mode 0777)", exe.display())
    );
    chmod(&exe, 0o755);
    eventually("fixed, it loads again", || env.registered("v/drv")).await;

    nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(1000)), None).unwrap();
    eventually("a foreign-owned driver dir is refused", || !env.registered("v/drv")).await;
    let me = nix::unistd::geteuid().as_raw();
    assert_eq!(
        env.failure("v~drv").unwrap(),
        format!("refusing flexvolume driver {}: is owned by uid 1000, not {me}", dir.display())
    );
    nix::unistd::chown(&dir, Some(nix::unistd::Uid::from_raw(me)), None).unwrap();
    eventually("fixed again", || env.registered("v/drv")).await;
    assert_eq!(env.inits("drv"), before + 2, "refused drivers never ran");

    // A driver that is a symlink out of the plugin dir.
    let outside = env.work.join("outside");
    write_executable(&outside, &env.script("outside", INIT_OK));
    let link_dir = env.plugin_dir.join("v~outside");
    std::fs::create_dir(&link_dir).unwrap();
    std::os::unix::fs::symlink(&outside, link_dir.join("outside")).unwrap();
    eventually("the symlinked driver is refused", || {
        env.failure("v~outside").is_some_and(|r| r.contains("outside the driver directory"))
    })
    .await;
    assert_eq!(env.inits("outside"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hanging_init_does_not_hold_up_other_drivers() {
    let env = Env::start_with(Duration::from_secs(4));
    env.install("v~slow", INIT_HANGS);
    eventually("slow's init started", || env.inits("slow") == 1).await;
    let t = Instant::now();
    env.install("v~quick", INIT_OK);
    eventually("quick is found while slow hangs", || env.registered("v/quick")).await;
    let waited = t.elapsed();
    eprintln!("quick driver registered {waited:?} after install while another init hung");
    assert!(waited < Duration::from_secs(2), "{waited:?}");
    assert!(env.state("v~slow").is_none_or(|s| !matches!(s, DriverState::Loaded { .. })));
    assert!(!env.registered("v/slow"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_finds_what_is_installed_and_probe_all_once_lists_it() {
    let tmp = kvol_test_support::ScratchRoot::new();
    let plugin_dir = tmp.path().join("exec");
    std::fs::create_dir(&plugin_dir).unwrap();
    let env_like = |dir_name: &str, body: &str| {
        let src = tmp.path().join(format!("{dir_name}.src"));
        std::fs::write(&src, format!("#!/bin/sh\ncase \"$1\" in init) {body} ;; esac\n")).unwrap();
        install(&src, &plugin_dir, dir_name).unwrap();
    };
    env_like("v~one", INIT_OK);
    env_like("v~two", INIT_FAILS);
    std::fs::create_dir(plugin_dir.join("Bad_Name")).unwrap();

    let cfg = config(&plugin_dir, Duration::from_secs(2));
    let (plugins, failed) = probe_all_once(&cfg, host()).await;
    assert_eq!(plugins.iter().map(|p| p.name()).collect::<Vec<_>>(), ["v/one"]);
    let failed: Vec<(&str, bool)> =
        failed.iter().map(|f| (f.name.as_str(), f.kind == PluginKind::Flexvolume)).collect();
    assert_eq!(failed, [("Bad_Name", true), ("v/two", true)]);
    let missing = probe_all_once(&config(&tmp.path().join("missing"), Duration::from_secs(1)), host()).await;
    assert!(missing.0.is_empty() && missing.1.is_empty());
    assert!(!tmp.path().join("missing").exists(), "a one-shot probe creates nothing");

    let registry = Arc::new(PluginRegistry::new(vec![]).unwrap());
    let prober = FlexProber::start(cfg, host(), Arc::clone(&registry)).unwrap();
    let mut progress = prober.progress();
    progress.wait_for(|p| p.rescans >= 1 && !p.busy).await.unwrap();
    let snapshot = registry.snapshot();
    assert_eq!(snapshot.plugins().iter().map(|r| r.plugin.name()).collect::<Vec<_>>(), ["v/one"]);
    let status: Vec<(String, bool)> =
        prober.status().into_iter().map(|d| (d.dir, matches!(d.state, DriverState::Loaded { .. }))).collect();
    assert_eq!(status, [("Bad_Name".into(), false), ("v~one".into(), true), ("v~two".into(), false)]);
    prober.shutdown().await;

    // Nothing changes once shut down.
    std::fs::remove_dir_all(plugin_dir.join("v~one")).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(registry.snapshot().generation(), snapshot.generation());
}
