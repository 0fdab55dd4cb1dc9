//! Driver calls against real driver processes: argv, replies, limits, process groups and failures to start.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kvol_flex::{CallLimits, Command, FlexDriver, FlexError};

/// Writes an executable `#!/bin/sh` driver with `body` and returns its path.
fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    path
}

fn limits(timeout_ms: u64, max_output: usize) -> CallLimits {
    CallLimits {
        timeout: Duration::from_millis(timeout_ms),
        wait_for_attach_timeout: Duration::from_millis(timeout_ms),
        max_output,
    }
}

fn driver(executable: PathBuf) -> FlexDriver {
    FlexDriver {
        name: "acme/lvm".to_string(),
        executable,
        limits: limits(20_000, 1 << 20),
        owner_uid: nix::unistd::geteuid().as_raw(),
    }
}

fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|a| a.to_string()).collect()
}

/// Whether process `pid` is gone (or a zombie nobody reaped yet: dead all the same).
fn is_dead(pid: i32) -> bool {
    match fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        // The state follows the command name, which is in parentheses.
        Ok(stat) => stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

/// Waits up to `within` for `pid` to die.
async fn dies_within(pid: i32, within: Duration) -> bool {
    let start = Instant::now();
    while start.elapsed() < within {
        if is_dead(pid) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    is_dead(pid)
}

fn read_pid(path: &Path) -> i32 {
    fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).trim().parse().unwrap()
}

#[tokio::test]
async fn every_command_reaches_the_driver_with_its_arguments_verbatim() {
    let dir = kvol_test_support::ScratchRoot::new();
    let record = dir.path().join("argv");
    let body = format!(
        "{{ echo \"$#\"; printf '%s\\n' \"$@\"; }} > '{}'\necho '{{\"status\":\"Success\"}}'",
        record.display()
    );
    let d = driver(script(dir.path(), "lvm", &body));
    let awkward = args(&[
        r#"{"kubernetes.io/fsType":"ext4","kubernetes.io/readwrite":"rw"}"#,
        "",
        "two words",
        "$HOME * ; `id` 'quoted' \"dq\"",
        "ünïcödé",
    ]);
    for command in Command::ALL {
        let status = d.call(command, &awkward).await.unwrap_or_else(|e| panic!("{command}: {e}"));
        assert_eq!(status.status, "Success");
        let seen = fs::read_to_string(&record).unwrap();
        let mut expected = vec![(awkward.len() + 1).to_string(), command.as_str().to_string()];
        expected.extend(awkward.iter().cloned());
        assert_eq!(seen.lines().collect::<Vec<_>>(), expected, "{command}");
    }
    // init takes no arguments at all.
    d.call(Command::Init, &[]).await.unwrap();
    assert_eq!(fs::read_to_string(&record).unwrap(), "1\ninit\n");
}

#[tokio::test]
async fn a_hanging_driver_is_killed_with_its_whole_process_group() {
    let dir = kvol_test_support::ScratchRoot::new();
    let pids = dir.path().join("pids");
    let body = format!("sleep 1000 &\necho \"$$ $!\" > '{}'\nsleep 1000", pids.display());
    let d = FlexDriver { limits: limits(500, 1 << 20), ..driver(script(dir.path(), "lvm", &body)) };
    let start = Instant::now();
    let err = d.call(Command::Mount, &args(&["/target", "{}"])).await.unwrap_err();
    let took = start.elapsed();
    assert!(
        matches!(err, FlexError::Timeout { command: "mount", limit, .. } if limit.as_millis() == 500),
        "{err:?}"
    );
    assert_eq!(
        err.to_string(),
        "flexvolume driver acme/lvm: mount did not finish within 500ms; its process group was killed"
    );
    assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(5), "took {took:?}");
    let recorded = fs::read_to_string(&pids).unwrap();
    let (shell, background) = recorded.trim().split_once(' ').unwrap();
    let (shell, background): (i32, i32) = (shell.parse().unwrap(), background.parse().unwrap());
    assert!(dies_within(shell, Duration::from_secs(3)).await, "the driver {shell} survived");
    assert!(
        dies_within(background, Duration::from_secs(3)).await,
        "its background child {background} survived"
    );
}

#[tokio::test]
async fn waitforattach_has_its_own_deadline() {
    let dir = kvol_test_support::ScratchRoot::new();
    let body = "sleep 1\necho '{\"status\":\"Success\",\"device\":\"/dev/sdz\"}'";
    let d = FlexDriver {
        limits: CallLimits {
            timeout: Duration::from_millis(200),
            wait_for_attach_timeout: Duration::from_secs(20),
            max_output: 1 << 20,
        },
        ..driver(script(dir.path(), "lvm", body))
    };
    let status = d.call(Command::WaitForAttach, &args(&["/dev/sdz", "{}"])).await.unwrap();
    assert_eq!(status.device, "/dev/sdz");
    let err = d.call(Command::Attach, &args(&["{}", "node"])).await.unwrap_err();
    assert!(matches!(err, FlexError::Timeout { command: "attach", .. }), "{err:?}");
}

#[tokio::test]
async fn a_dropped_call_kills_the_driver_group_too() {
    let dir = kvol_test_support::ScratchRoot::new();
    let pids = dir.path().join("pids");
    let body = format!("sleep 1000 &\necho \"$$ $!\" > '{}'\nsleep 1000", pids.display());
    let d = driver(script(dir.path(), "lvm", &body));
    let mount_args = args(&["/target", "{}"]);
    let call = d.call(Command::Mount, &mount_args);
    assert!(tokio::time::timeout(Duration::from_millis(500), call).await.is_err(), "the call gave up");
    let recorded = fs::read_to_string(&pids).unwrap();
    for pid in recorded.split_whitespace() {
        let pid: i32 = pid.parse().unwrap();
        assert!(dies_within(pid, Duration::from_secs(3)).await, "{pid} survived the dropped call");
    }
}

#[tokio::test]
async fn a_stuck_driver_does_not_delay_another_call() {
    let dir = kvol_test_support::ScratchRoot::new();
    let stuck =
        FlexDriver { limits: limits(3_000, 1 << 20), ..driver(script(dir.path(), "stuck", "sleep 1000")) };
    let fast = driver(script(dir.path(), "fast", "echo '{\"status\":\"Success\"}'"));
    let start = Instant::now();
    let slow_args = args(&["/a", "{}"]);
    let slow_call = stuck.call(Command::Mount, &slow_args);
    let fast_call = async {
        // Let the stuck call start first.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let result = fast.call(Command::Mount, &args(&["/b", "{}"])).await;
        (result, start.elapsed())
    };
    let (slow, (fast_result, fast_done)) = tokio::join!(slow_call, fast_call);
    fast_result.unwrap();
    assert!(fast_done < Duration::from_millis(1_500), "the fast call took {fast_done:?}");
    assert!(matches!(slow, Err(FlexError::Timeout { .. })), "{slow:?}");
}

#[tokio::test]
async fn garbage_output_is_refused_with_its_beginning() {
    let dir = kvol_test_support::ScratchRoot::new();
    let d = driver(script(dir.path(), "lvm", "echo 'this is not json'"));
    let err = d.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err();
    match &err {
        FlexError::BadOutput { command, head, reason, .. } => {
            assert_eq!(*command, "mount");
            assert_eq!(head, "this is not json\n");
            assert!(reason.contains("at line 1 column"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        err.to_string()
            .starts_with("flexvolume driver acme/lvm: mount printed output that is not a driver status")
    );
}

#[tokio::test]
async fn a_flooding_driver_is_stopped_at_the_cap() {
    let dir = kvol_test_support::ScratchRoot::new();
    // `yes` never stops on its own: only the cap ends this call.
    let d = FlexDriver {
        limits: limits(20_000, 64 * 1024),
        ..driver(script(dir.path(), "lvm", "exec yes 0123456789"))
    };
    let start = Instant::now();
    let err = d.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err();
    assert!(matches!(err, FlexError::OutputTooLarge { limit: 65536, .. }), "{err:?}");
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    assert_eq!(
        err.to_string(),
        "flexvolume driver acme/lvm: mount wrote more than 65536 bytes of output; \
         its process group was killed"
    );
}

#[tokio::test]
async fn the_cap_is_exact() {
    let dir = kvol_test_support::ScratchRoot::new();
    // 20 bytes, no newline.
    let path = script(dir.path(), "lvm", "printf '%s' '{\"status\":\"Success\"}'");
    let at_cap = FlexDriver { limits: limits(20_000, 20), ..driver(path.clone()) };
    at_cap.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap();
    let under = FlexDriver { limits: limits(20_000, 19), ..driver(path) };
    let err = under.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err();
    assert!(matches!(err, FlexError::OutputTooLarge { limit: 19, .. }), "{err:?}");
}

#[tokio::test]
async fn output_larger_than_a_pipe_buffer_is_read_while_the_driver_writes() {
    let dir = kvol_test_support::ScratchRoot::new();
    let body = concat!(
        "printf '{\"status\":\"Failure\",\"message\":\"'\n",
        "head -c 300000 /dev/zero | tr '\\0' m\n",
        "printf '\"}'"
    );
    let d = driver(script(dir.path(), "lvm", body));
    match d.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err() {
        FlexError::Failed { message, .. } => assert_eq!(message, "m".repeat(300_000)),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_success_body_with_a_failed_exit_is_a_driver_bug() {
    let dir = kvol_test_support::ScratchRoot::new();
    let d = driver(script(dir.path(), "lvm", "echo '{\"status\":\"Success\"}'\nexit 3"));
    let err = d.call(Command::Unmount, &args(&["/t"])).await.unwrap_err();
    assert!(matches!(&err, FlexError::SuccessWithFailedExit { command: "unmount", .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "flexvolume driver acme/lvm: unmount exited with exit status: 3 although it printed status Success"
    );
}

#[tokio::test]
async fn failures_carry_upstreams_message_whatever_the_exit() {
    let dir = kvol_test_support::ScratchRoot::new();
    let reply = "echo '{\"status\":\"Failure\",\"message\":\"volume busy\"}'";
    for (name, exit) in [("zero", ""), ("one", "\nexit 1")] {
        let d = driver(script(dir.path(), name, &format!("{reply}{exit}")));
        let err = d.call(Command::Detach, &args(&["pv-1", "node-a"])).await.unwrap_err();
        assert_eq!(
            err.to_string(),
            "flexvolume driver acme/lvm: detach command failed, status: Failure, reason: volume busy",
            "{name}"
        );
    }
}

#[tokio::test]
async fn not_supported_is_its_own_error() {
    let dir = kvol_test_support::ScratchRoot::new();
    for (name, exit) in [("zero", ""), ("one", "\nexit 1")] {
        let d = driver(script(dir.path(), name, &format!("echo '{{\"status\":\"Not supported\"}}'{exit}")));
        let err = d.call(Command::Attach, &args(&["{}", "node-a"])).await.unwrap_err();
        assert!(err.is_not_supported(), "{name}: {err:?}");
        assert_eq!(err.to_string(), "flexvolume driver acme/lvm: attach is not supported");
    }
}

#[tokio::test]
async fn keys_are_matched_case_insensitively() {
    let dir = kvol_test_support::ScratchRoot::new();
    let body = concat!(
        r#"echo '{"STATUS":"Success","Device":"/dev/sdq","ATTACHED":true,"#,
        r#""capabilities":{"Attach":false,"requiresfsresize":false}}'"#
    );
    let d = driver(script(dir.path(), "lvm", body));
    let status = d.call(Command::Init, &[]).await.unwrap();
    assert_eq!(status.device, "/dev/sdq");
    assert!(status.attached);
    assert!(!status.capabilities.attach);
    assert!(!status.capabilities.requires_fs_resize);
    assert!(status.capabilities.selinux_relabel && status.capabilities.fs_group, "absent keys keep defaults");
    assert!(!status.capabilities.supports_metrics);
}

#[tokio::test]
async fn stdout_and_stderr_are_one_output_in_write_order() {
    let dir = kvol_test_support::ScratchRoot::new();
    // The reply is only valid JSON when both streams are read, in the order written.
    let body = "printf '{\"status\":' \nprintf '\"Failure\",' >&2\nprintf '\"message\":\"from both\"}'";
    let d = driver(script(dir.path(), "lvm", body));
    match d.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err() {
        FlexError::Failed { message, .. } => assert_eq!(message, "from both"),
        other => panic!("{other:?}"),
    }
    // So a driver logging to stderr breaks its reply, as it does upstream.
    let noisy =
        driver(script(dir.path(), "noisy", "echo 'debug: hello' >&2\necho '{\"status\":\"Success\"}'"));
    let err = noisy.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err();
    assert!(
        matches!(&err, FlexError::BadOutput { head, .. } if head.starts_with("debug: hello\n{")),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_background_process_holding_the_output_neither_blocks_nor_dies() {
    let dir = kvol_test_support::ScratchRoot::new();
    let pid_file = dir.path().join("daemon");
    let body = format!("sleep 1000 &\necho $! > '{}'\necho '{{\"status\":\"Success\"}}'", pid_file.display());
    let d = driver(script(dir.path(), "lvm", &body));
    let start = Instant::now();
    d.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap();
    assert!(start.elapsed() < Duration::from_secs(5), "took {:?}", start.elapsed());
    let daemon = read_pid(&pid_file);
    assert!(!is_dead(daemon), "a daemon the driver left behind is the driver's business");
    // Clean up the process this test started.
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), nix::sys::signal::Signal::SIGKILL).unwrap();
}

#[tokio::test]
async fn drivers_that_cannot_start_are_spawn_errors() {
    let dir = kvol_test_support::ScratchRoot::new();
    let missing = driver(dir.path().join("missing"));
    let err = missing.call(Command::Init, &[]).await.unwrap_err();
    match &err {
        FlexError::Spawn { command: "init", source, .. } => {
            assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
        }
        other => panic!("{other:?}"),
    }
    assert!(err.to_string().starts_with("flexvolume driver acme/lvm: cannot run init: "), "{err}");

    let plain = dir.path().join("plain");
    fs::write(&plain, "#!/bin/sh\necho '{\"status\":\"Success\"}'\n").unwrap();
    fs::set_permissions(&plain, fs::Permissions::from_mode(0o644)).unwrap();
    let err = driver(plain).call(Command::Init, &[]).await.unwrap_err();
    // Checked before it runs: not executable is a refusal that says so.
    match &err {
        FlexError::Untrusted { reason, .. } => assert_eq!(reason, "is not executable (mode 0644)"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_driver_killed_by_a_signal_fails_with_its_output_judged() {
    let dir = kvol_test_support::ScratchRoot::new();
    let d = driver(script(dir.path(), "lvm", "echo '{\"status\":\"Success\"}'\nkill -9 $$"));
    let err = d.call(Command::Mount, &args(&["/t", "{}"])).await.unwrap_err();
    match &err {
        FlexError::SuccessWithFailedExit { exit, .. } => assert!(exit.contains("signal: 9"), "{exit}"),
        other => panic!("{other:?}"),
    }
}

const SAYS_A: &str = "echo '{\"status\":\"Success\",\"message\":\"checked A\"}'";
const SAYS_B: &str = "echo '{\"status\":\"Success\",\"message\":\"swapped B\"}'";

#[tokio::test]
async fn a_file_swapped_in_after_the_check_never_runs() {
    let dir = kvol_test_support::ScratchRoot::new();
    let exe = script(dir.path(), "lvm", SAYS_A);
    let uid = nix::unistd::geteuid().as_raw();
    let checked = kvol_flex::trust::open_executable(&exe, uid).unwrap();
    // Another file takes the executable's name between the check and the exec.
    let other = script(dir.path(), "other", SAYS_B);
    fs::rename(&other, &exe).unwrap();
    let output =
        std::process::Command::new(kvol_flex::driver::exec_path(&checked)).arg("init").output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("checked A") && !stdout.contains("swapped B"), "{stdout}");
    // A call opens and checks afresh: the swapped-in file is what runs now, and only because
    // it passes the checks.
    let status = driver(exe.clone()).call(Command::Init, &[]).await.unwrap();
    assert_eq!(status.message, "swapped B");
}

#[tokio::test]
async fn a_swapped_in_file_that_fails_the_checks_is_refused() {
    let dir = kvol_test_support::ScratchRoot::new();
    let exe = script(dir.path(), "lvm", SAYS_A);
    let d = driver(exe.clone());
    assert_eq!(d.call(Command::Init, &[]).await.unwrap().message, "checked A");
    let writable = script(dir.path(), "writable", SAYS_B);
    fs::set_permissions(&writable, fs::Permissions::from_mode(0o777)).unwrap();
    fs::rename(&writable, &exe).unwrap();
    let err = d.call(Command::Init, &[]).await.unwrap_err();
    assert!(matches!(err, FlexError::Untrusted { .. }), "{err}");
    assert!(err.to_string().contains("is world-writable (mode 0777)"), "{err}");
    // A symlink at the executable's name is resolved; one leading to a file the checks refuse is refused.
    fs::remove_file(&exe).unwrap();
    std::os::unix::fs::symlink(dir.path().join("nowhere"), &exe).unwrap();
    d.call(Command::Init, &[]).await.unwrap_err();
}

#[test]
fn a_world_writable_plugin_directory_refuses_its_drivers() {
    let plugins = kvol_test_support::ScratchRoot::new();
    let driver_dir = plugins.path().join("acme~lvm");
    fs::create_dir(&driver_dir).unwrap();
    script(&driver_dir, "lvm", SAYS_A);
    let uid = nix::unistd::geteuid().as_raw();
    kvol_flex::trust::verify_driver_dir(plugins.path(), &driver_dir, uid).unwrap();
    fs::set_permissions(plugins.path(), fs::Permissions::from_mode(0o777)).unwrap();
    let err = kvol_flex::trust::verify_driver_dir(plugins.path(), &driver_dir, uid).unwrap_err();
    let plugin_dir = fs::canonicalize(plugins.path()).unwrap();
    assert_eq!(
        err.to_string(),
        FlexError::Untrusted {
            path: driver_dir.clone(),
            reason: format!(
                "is in the plugin directory {}, which is world-writable (mode 0777)",
                plugin_dir.display()
            ),
        }
        .to_string()
    );
}
