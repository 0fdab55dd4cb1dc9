//! Component processes under the agent's supervisor, for real: the bundled driver started as a
//! child, probed over its CSI socket, restarted after kill -9 and after failed probes, stopped.

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::time::Duration;

use kvol_api::Backoff;
use kvol_components_runtime::supervisor::{ProcessSpec, ProcessState, Supervised, SupervisorSettings};

fn quick() -> SupervisorSettings {
    SupervisorSettings {
        backoff: Backoff { initial: Duration::from_millis(20), max: Duration::from_millis(200) },
        stable_after: Duration::from_secs(60),
        probe_every: Duration::from_millis(100),
        probe_until_healthy_every: Duration::from_millis(100),
        startup_grace: Duration::from_millis(300),
        failed_probes_to_restart: 3,
        stop_grace: Duration::from_secs(5),
    }
}

/// Waits (real time: these are real processes) until `done` holds for the state.
async fn until(supervised: &Supervised, what: &str, done: impl Fn(&ProcessState) -> bool) -> ProcessState {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = supervised.state();
        if done(&state) {
            return state;
        }
        assert!(std::time::Instant::now() < deadline, "{}: never {what}: {state:?}", supervised.name());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn alive(pid: u32) -> bool {
    // A zombie still answers kill(0); /proc/<pid>/stat says Z for it.
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

fn bundled_driver(dir: &Path) -> ProcessSpec {
    let socket = dir.join("csi.sock");
    let state = dir.join("state");
    let command = [
        env!("CARGO_BIN_EXE_kvol"),
        "csi-driver",
        "--node-name",
        "node-a",
        "--state-dir",
        state.to_str().unwrap(),
        "--csi-socket",
        socket.to_str().unwrap(),
        "--no-register",
    ];
    ProcessSpec {
        name: "hostpath".into(),
        command: command.map(String::from).to_vec(),
        csi_socket: Some(socket),
        log_file: dir.join("logs/hostpath.log"),
        pid_file: Some(dir.join("hostpath.pid")),
        config: None,
        reload: Default::default(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bundled_driver_as_a_component_is_probed_restarted_after_kill_9_and_stopped() {
    let dir = kvol_test_support::ScratchRoot::new();
    let supervised = Supervised::start(bundled_driver(dir.path()), quick());
    let first = until(&supervised, "healthy", |s| s.healthy == Some(true)).await;
    let pid = first.pid.unwrap();
    assert_eq!(first.starts, 1);
    // What it says it is, asked once it answered its first probe.
    assert_eq!(first.version.as_deref(), Some(concat!("hostpath.csi.kvol.io ", env!("CARGO_PKG_VERSION"))));

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL)
        .unwrap();
    let second =
        until(&supervised, "restarted and healthy", |s| s.starts == 2 && s.healthy == Some(true)).await;
    assert_ne!(second.pid, Some(pid));
    assert_eq!(second.last_exit.as_deref(), Some("the process signal: 9 (SIGKILL)"));

    let pid = second.pid.unwrap();
    supervised.stop().await;
    assert!(!alive(pid), "the driver outlived stop");
    let log = std::fs::read_to_string(dir.path().join("logs/hostpath.log")).unwrap();
    assert_eq!(log.matches("--- kvol: starting hostpath").count(), 2, "{log}");
}

/// The agent killed with -9 leaves its driver running; the next agent's supervisor finds it
/// through the pid file and stops it before starting its own on the same socket and state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_an_earlier_supervisor_left_running_is_stopped_first() {
    let dir = kvol_test_support::ScratchRoot::new();
    let spec = bundled_driver(dir.path());
    std::fs::create_dir_all(dir.path().join("logs")).unwrap();
    let (program, args) = spec.command.split_first().unwrap();
    let mut orphan = std::process::Command::new(program)
        .args(args)
        .stderr(std::fs::File::create(dir.path().join("logs/orphan.log")).unwrap())
        .spawn()
        .unwrap();
    std::fs::write(dir.path().join("hostpath.pid"), format!("{}\n", orphan.id())).unwrap();
    // An unrelated process under a stale pid file is left alone: only the same command line counts.
    let mut bystander = std::process::Command::new("sleep").arg("600").spawn().unwrap();
    let other = ProcessSpec { pid_file: Some(dir.path().join("other.pid")), ..spec.clone() };
    std::fs::write(dir.path().join("other.pid"), format!("{}\n", bystander.id())).unwrap();
    let left_alone = Supervised::start(
        ProcessSpec { name: "other".into(), command: vec!["true".into()], csi_socket: None, ..other },
        quick(),
    );

    let supervised = Supervised::start(spec, quick());
    let state = until(&supervised, "healthy", |s| s.healthy == Some(true)).await;
    let status = orphan.wait().unwrap();
    // SIGTERM: the driver exits cleanly once its handler is in place, or dies of the signal
    // if it came sooner; either way it was asked, not killed.
    assert!(
        status.success() || status.signal() == Some(15),
        "the orphan was not stopped with SIGTERM: {status}"
    );
    assert_ne!(state.pid, Some(orphan.id()));
    let recorded = std::fs::read_to_string(dir.path().join("hostpath.pid")).unwrap();
    assert_eq!(recorded.trim(), state.pid.unwrap().to_string());
    supervised.stop().await;
    assert!(!dir.path().join("hostpath.pid").exists(), "a clean stop removes the pid file");
    left_alone.stop().await;
    assert!(bystander.try_wait().unwrap().is_none(), "the unrelated process was signalled");
    bystander.kill().unwrap();
    let _ = bystander.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_never_answers_probe_is_killed_and_restarted() {
    let dir = kvol_test_support::ScratchRoot::new();
    let spec = ProcessSpec {
        name: "mute".into(),
        command: ["sleep", "600"].map(String::from).to_vec(),
        csi_socket: Some(dir.path().join("nobody.sock")),
        log_file: dir.path().join("mute.log"),
        pid_file: None,
        config: None,
        reload: Default::default(),
    };
    let supervised = Supervised::start(spec, quick());
    let state = until(&supervised, "restarted for failed probes", |s| s.starts >= 2).await;
    let reason = state.last_exit.unwrap();
    assert!(reason.starts_with("3 probes in a row failed, the last: "), "{reason}");
    assert!(reason.contains("nobody.sock"), "{reason}");
    supervised.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_keeps_failing_is_restarted_with_growing_pauses_and_says_why() {
    let dir = kvol_test_support::ScratchRoot::new();
    let spec = ProcessSpec {
        name: "failing".into(),
        command: ["sh", "-c", "echo cannot find my config >&2; exit 3"].map(String::from).to_vec(),
        csi_socket: None,
        log_file: dir.path().join("failing.log"),
        pid_file: None,
        config: None,
        reload: Default::default(),
    };
    let started = std::time::Instant::now();
    let supervised = Supervised::start(spec, quick());
    let state = until(&supervised, "started 5 times", |s| s.starts >= 5).await;
    // Pauses of 20, 40, 80 and 160 ms come between the five starts.
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    assert_eq!(state.last_exit.as_deref(), Some("the process exit status: 3"));
    supervised.stop().await;
    let log = std::fs::read_to_string(dir.path().join("failing.log")).unwrap();
    assert!(log.matches("cannot find my config").count() >= 5, "{log}");

    let missing = ProcessSpec {
        name: "missing".into(),
        command: vec!["/nonexistent/driver".into()],
        csi_socket: None,
        log_file: dir.path().join("missing.log"),
        pid_file: None,
        config: None,
        reload: Default::default(),
    };
    let supervised = Supervised::start(missing, quick());
    let state = until(&supervised, "a failed start recorded", |s| s.last_exit.is_some()).await;
    assert!(state.last_exit.unwrap().starts_with("cannot start /nonexistent/driver: "));
    assert_eq!(state.starts, 0);
    supervised.stop().await;
}
