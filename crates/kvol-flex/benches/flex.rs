//! Flexvolume end-to-end numbers: install-to-usable latency, CPU for an event storm, lookups with 1,000 drivers.
//!
//! `cargo bench -p kvol-flex --bench flex` prints each number with a baseline measured in the same
//! run: a bare `init` exec for the latency, a bare inotify read loop for an event storm's CPU,
//! and a `HashMap` lookup for the registry.

use std::collections::HashMap;
use std::hint::black_box;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvol_flex::install::install;
use kvol_flex::prober::{FlexProber, ProberConfig};
use kvol_flex::{CallLimits, Command, FlexDriver};
use kvol_plugin::testing::flex_pv;
use kvol_plugin::{NodeInfo, NodePaths, PluginHost, PluginRegistry, RecordingMounter};
use nix::sys::resource::{UsageWho, getrusage};

const DRIVER: &str = "#!/bin/sh\ncase \"$1\" in\n  init) echo '{\"status\":\"Success\",\"capabilities\":{\"attach\":false}}' ;;\n  *) echo '{\"status\":\"Not supported\"}' ;;\nesac\n";

fn host(root: &Path) -> PluginHost {
    PluginHost::new(NodePaths::new(root), NodeInfo::named("bench"), Arc::new(RecordingMounter::new()))
}

fn config(dir: &Path) -> ProberConfig {
    ProberConfig { owner_uid: nix::unistd::getuid().as_raw(), ..ProberConfig::new(dir) }
}

/// Polls until `ready` holds; returns how long it took.
async fn until(ready: impl Fn() -> bool, limit: Duration) -> Duration {
    let start = Instant::now();
    while !ready() {
        assert!(start.elapsed() < limit, "gave up after {limit:?}");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
    start.elapsed()
}

fn cpu_time() -> Duration {
    let usage = getrusage(UsageWho::RUSAGE_SELF).expect("getrusage");
    let tv = |t: nix::sys::time::TimeVal| Duration::new(t.tv_sec() as u64, t.tv_usec() as u32 * 1000);
    tv(usage.user_time()) + tv(usage.system_time())
}

const STORM_FILES: u32 = 10_000;

/// Creates and removes [`STORM_FILES`] files in `dir` from a child shell, then a `done` marker;
/// returns once the child exited.
fn storm(dir: &Path) {
    let script = format!(
        "cd \"$1\" && i=0; while [ $i -lt {STORM_FILES} ]; do : > s$i; i=$((i+1)); done; rm -f s*; : > done; rm -f done"
    );
    let status = std::process::Command::new("sh").args(["-c", &script, "storm"]).arg(dir).status().unwrap();
    assert!(status.success(), "the storm script failed in {}", dir.display());
}

/// The floor: this process's CPU to read every inotify event of a storm with kubelet's watch mask.
fn bare_inotify_storm_cpu(dir: &Path) -> Duration {
    use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify};
    let inotify = Inotify::init(InitFlags::IN_CLOEXEC).unwrap();
    let mask = AddWatchFlags::IN_CREATE
        | AddWatchFlags::IN_DELETE
        | AddWatchFlags::IN_MODIFY
        | AddWatchFlags::IN_ATTRIB
        | AddWatchFlags::IN_MOVED_FROM
        | AddWatchFlags::IN_MOVED_TO
        | AddWatchFlags::IN_DELETE_SELF
        | AddWatchFlags::IN_MOVE_SELF;
    inotify.add_watch(dir, mask).unwrap();
    let before = cpu_time();
    let reader = std::thread::spawn(move || {
        let mut events = 0u64;
        loop {
            for event in inotify.read_events().unwrap() {
                events += 1;
                if event.name.as_deref() == Some(std::ffi::OsStr::new("done"))
                    && event.mask.contains(AddWatchFlags::IN_DELETE)
                {
                    return events;
                }
            }
        }
    });
    storm(dir);
    let events = reader.join().unwrap();
    let cpu = cpu_time() - before;
    println!("  (bare loop read {events} events)");
    cpu
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let work = tempfile::tempdir().unwrap();
    let source = work.path().join("driver");
    std::fs::write(&source, DRIVER).unwrap();
    std::fs::set_permissions(&source, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();

    // 1. Install finishing → driver usable (in the registry), against one bare `init` exec.
    let plugins = work.path().join("plugins");
    std::fs::create_dir(&plugins).unwrap();
    let registry = Arc::new(PluginRegistry::new(Vec::new()).unwrap());
    let prober = FlexProber::start(config(&plugins), host(work.path()), Arc::clone(&registry)).unwrap();
    prober.wait_idle().await;
    let mut latencies = Vec::new();
    let mut execs = Vec::new();
    for i in 0..30 {
        let name = format!("bench~d{i}");
        install(&source, &plugins, &name).unwrap();
        let installed = Instant::now();
        let plugin_name = format!("bench/d{i}");
        until(|| registry.snapshot().find_by_name(&plugin_name).is_ok(), Duration::from_secs(10)).await;
        latencies.push(installed.elapsed());
        let exe = plugins.join(&name).join(format!("d{i}"));
        let driver = FlexDriver {
            name: plugin_name,
            executable: exe,
            limits: CallLimits::default(),
            owner_uid: nix::unistd::geteuid().as_raw(),
        };
        let start = Instant::now();
        driver.call(Command::Init, &[]).await.unwrap();
        execs.push(start.elapsed());
    }
    latencies.sort();
    execs.sort();
    let (p50, base) = (percentile(&latencies, 0.5), percentile(&execs, 0.5));
    println!("install → usable, 30 drivers (target < 250 ms)");
    println!(
        "  median {:.1} ms, p95 {:.1} ms, max {:.1} ms; one bare init exec {:.1} ms (ratio {:.1}x); {}",
        ms(p50),
        ms(percentile(&latencies, 0.95)),
        ms(*latencies.last().unwrap()),
        ms(base),
        p50.as_secs_f64() / base.as_secs_f64(),
        if percentile(&latencies, 0.95) < Duration::from_millis(250) {
            "under target"
        } else {
            "OVER TARGET"
        }
    );

    // 2. An event storm made by another process: 10,000 files created and removed in one driver's
    // directory. Only this process's CPU counts; the baseline is a bare inotify read loop over
    // the same storm, in the same run.
    let bare = work.path().join("bare");
    std::fs::create_dir(&bare).unwrap();
    let baseline_cpu = bare_inotify_storm_cpu(&bare);
    let inits_before = prober.progress().borrow().inits;
    let before = cpu_time();
    let started = Instant::now();
    storm(&plugins.join("bench~d0"));
    let storm_wall = started.elapsed();
    // The kernel may still hold events, and the trailing probe the rate limit schedules lands
    // within one interval: give both time, then count.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    prober.wait_idle().await;
    let storm_cpu = cpu_time() - before;
    let inits = prober.progress().borrow().inits - inits_before;
    let usable = registry.snapshot().find_by_name("bench/d0").is_ok();
    println!(
        "event storm: {STORM_FILES} files created and removed in one driver directory by another process ({:.0} ms)",
        ms(storm_wall)
    );
    println!(
        "  process CPU {:.1} ms with the prober vs {:.1} ms for a bare inotify read loop ({:.1}x); goal <= 100 ms, {}; {inits} init(s) ran; driver usable after: {usable}",
        ms(storm_cpu),
        ms(baseline_cpu),
        storm_cpu.as_secs_f64() / baseline_cpu.as_secs_f64().max(1e-6),
        if storm_cpu <= Duration::from_millis(100) { "met" } else { "NOT MET" }
    );

    // 3. Lookups with 1,000 installed drivers.
    let many = work.path().join("many");
    std::fs::create_dir(&many).unwrap();
    for i in 0..1000 {
        install(&source, &many, &format!("vendor{i}~drv")).unwrap();
    }
    let registry = Arc::new(PluginRegistry::new(Vec::new()).unwrap());
    let started = Instant::now();
    let prober = FlexProber::start(config(&many), host(work.path()), Arc::clone(&registry)).unwrap();
    let loaded = until(|| registry.snapshot().plugins().len() == 1000, Duration::from_secs(120)).await;
    println!("1,000 drivers probed and registered at start in {:.0} ms", ms(loaded.max(started.elapsed())));
    let names: Vec<String> = (0..1000).map(|i| format!("vendor{i}/drv")).collect();
    let specs: Vec<_> = names.iter().map(|n| flex_pv("pv", n)).collect();
    let map: HashMap<String, usize> = names.iter().cloned().enumerate().map(|(i, n)| (n, i)).collect();
    let rounds = 1_000_000;
    let time = |f: &dyn Fn(usize) -> bool| {
        let start = Instant::now();
        let mut ok = 0usize;
        for i in 0..rounds {
            ok += usize::from(f(i % 1000));
        }
        assert_eq!(ok, rounds);
        start.elapsed().as_nanos() as f64 / rounds as f64
    };
    let base = time(&|i| black_box(map.get(names[i].as_str())).is_some());
    let by_name = time(&|i| registry.snapshot().find_by_name(black_box(&names[i])).is_ok());
    let by_spec = time(&|i| registry.snapshot().find_by_spec(black_box(&specs[i])).is_ok());
    println!("lookups with 1,000 Flexvolume drivers registered ({rounds} each, snapshot() included)");
    println!(
        "  HashMap::get baseline {base:.1} ns; find_by_name {by_name:.1} ns ({:.1}x); find_by_spec {by_spec:.1} ns ({:.1}x)",
        by_name / base,
        by_spec / base
    );
    prober.shutdown().await;
}
