//! The example Flexvolume drivers in `examples/flexvolume/`, run as real child processes with the
//! exact argv kubelet (and kvol) uses, and their JSON replies checked field by field.
//!
//! Tests that mount run their body on a dedicated thread that first moves into a private mount
//! namespace (`unshare(CLONE_NEWNS)` + `/` made recursively private). Child processes inherit the
//! calling thread's namespace, so the drivers' mounts never leak to the host and vanish with the
//! thread. Loop devices are global, so the loop test detaches its devices in a drop guard, even when
//! an assertion fails.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags, mount, umount2};
use nix::sched::{CloneFlags, unshare};
use serde_json::{Value, json};

const NODE: &str = "node-1";

fn example(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../examples/flexvolume").join(relative)
}

fn tmpfs_driver() -> PathBuf {
    example("kvol~tmpfs/tmpfs")
}

fn loop_driver() -> PathBuf {
    example("kvol~loop/loop")
}

/// One driver call's reply.
#[derive(Debug)]
struct Reply {
    json: Value,
    exit_code: Option<i32>,
}

impl Reply {
    fn status(&self) -> &str {
        self.json["status"].as_str().unwrap_or_default()
    }

    /// Asserts a `{"status":"Failure","message":…}` reply and returns the message.
    fn failure_message(&self) -> String {
        assert_eq!(self.status(), "Failure", "{self:?}");
        assert_eq!(keys(&self.json), ["message", "status"], "{self:?}");
        assert_eq!(self.exit_code, Some(1), "{self:?}");
        let message = self.json["message"].as_str().unwrap().to_owned();
        assert!(!message.is_empty());
        message
    }
}

fn keys(value: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> = value.as_object().expect("a JSON object").keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}

/// Runs `<driver> <args…>` like kubelet does and parses its reply. Checks what every reply must
/// satisfy: exactly one JSON object on stdout, nothing on stderr (kubelet parses the combined
/// output), exit status 0 exactly when the status is Success.
fn call(driver: &Path, args: &[&str], envs: &[(&str, &Path)]) -> Reply {
    let output = Command::new(driver)
        .args(args)
        .envs(envs.iter().copied())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", driver.display()));
    let stdout = String::from_utf8(output.stdout).expect("UTF-8 stdout");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.is_empty(), "{} {args:?} wrote to stderr: {stderr}", driver.display());
    assert_eq!(
        stdout.lines().count(),
        1,
        "{} {args:?}: want one line of JSON, got {stdout:?}",
        driver.display()
    );
    let json: Value = serde_json::from_str(&stdout)
        .unwrap_or_else(|e| panic!("{} {args:?}: invalid JSON {stdout:?}: {e}", driver.display()));
    let reply = Reply { json, exit_code: output.status.code() };
    assert_eq!(
        reply.exit_code == Some(0),
        reply.status() == "Success",
        "{} {args:?}: exit status and JSON status disagree: {reply:?}",
        driver.display()
    );
    reply
}

fn success() -> Value {
    json!({"status": "Success"})
}

fn not_supported() -> Value {
    json!({"status": "Not supported"})
}

/// Runs `body` on a new thread inside a private mount namespace. Returns false (after saying why)
/// when the process may not create mount namespaces.
fn in_private_mount_namespace(test: &str, body: impl FnOnce() + Send + 'static) -> bool {
    let test = test.to_owned();
    let handle = std::thread::Builder::new()
        .name(test.clone())
        .spawn(move || {
            match unshare(CloneFlags::CLONE_NEWNS) {
                Ok(()) => {}
                Err(Errno::EPERM) => {
                    eprintln!("skipping {test}: no permission to create a mount namespace (needs root / CAP_SYS_ADMIN)");
                    return false;
                }
                Err(e) => panic!("unshare(CLONE_NEWNS): {e}"),
            }
            mount(
                None::<&str>,
                "/",
                None::<&str>,
                MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                None::<&str>,
            )
            .expect("make / recursively private");
            body();
            true
        })
        .expect("spawn test thread");
    match handle.join() {
        Ok(ran) => ran,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// One line of `/proc/thread-self/mountinfo`.
#[derive(Debug, Clone)]
struct MountEntry {
    major_minor: String,
    mount_point: PathBuf,
    mount_options: Vec<String>,
    fs_type: String,
    source: String,
    super_options: Vec<String>,
}

/// Undoes mountinfo's octal escapes (`\040` for a space, …).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4);
        if bytes[i] == b'\\' && octal.is_some_and(|d| d.iter().all(|b| (b'0'..=b'7').contains(b))) {
            let d = octal.unwrap();
            out.push((d[0] - b'0') * 64 + (d[1] - b'0') * 8 + (d[2] - b'0'));
            i += 4;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8(out).expect("UTF-8 mount point")
}

fn mount_table() -> Vec<MountEntry> {
    let text = std::fs::read_to_string("/proc/thread-self/mountinfo").expect("read mountinfo");
    text.lines()
        .map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            let dash = 6 + fields[6..].iter().position(|f| *f == "-").expect("mountinfo separator");
            MountEntry {
                major_minor: fields[2].to_owned(),
                mount_point: PathBuf::from(unescape_mountinfo(fields[4])),
                mount_options: fields[5].split(',').map(str::to_owned).collect(),
                fs_type: fields[dash + 1].to_owned(),
                source: unescape_mountinfo(fields[dash + 2]),
                super_options: fields[dash + 3].split(',').map(str::to_owned).collect(),
            }
        })
        .collect()
}

fn mounts_at(path: &Path) -> Vec<MountEntry> {
    mount_table().into_iter().filter(|entry| entry.mount_point == path).collect()
}

/// A temporary directory with its symlinks resolved, so that paths compare equal to mountinfo.
fn temp_root() -> (kvol_test_support::ScratchRoot, PathBuf) {
    let dir = kvol_test_support::ScratchRoot::new();
    let root = dir.path().canonicalize().expect("canonicalize tempdir");
    (dir, root)
}

/// Unmounts (lazily) whatever is still mounted at the given paths when dropped.
#[derive(Debug, Default)]
struct UnmountGuard(Vec<PathBuf>);

impl Drop for UnmountGuard {
    fn drop(&mut self) {
        for path in &self.0 {
            while !mounts_at(path).is_empty() {
                if umount2(path, MntFlags::MNT_DETACH).is_err() {
                    break;
                }
            }
        }
    }
}

/// The options JSON kubelet passes to `mount` for an inline volume, with the user's options
/// applied last.
fn pod_mount_options(volume: &str, read_only: bool, user: &[(&str, &str)]) -> String {
    let mut options = serde_json::Map::new();
    for (key, value) in [
        ("kubernetes.io/fsType", ""),
        ("kubernetes.io/readwrite", if read_only { "ro" } else { "rw" }),
        ("kubernetes.io/pvOrVolumeName", volume),
        ("kubernetes.io/pod.name", "web-0"),
        ("kubernetes.io/pod.namespace", "shop"),
        ("kubernetes.io/pod.uid", "0f4e1c2a-7d1b-4c55-9a53-3c2d0c1f6f00"),
        ("kubernetes.io/serviceAccount.name", "default"),
    ]
    .into_iter()
    .chain(user.iter().copied())
    {
        options.insert(key.to_owned(), Value::String(value.to_owned()));
    }
    Value::Object(options).to_string()
}

fn pod_volume_dir(root: &Path, volume: &str) -> PathBuf {
    root.join("pods/0f4e1c2a-7d1b-4c55-9a53-3c2d0c1f6f00/volumes/kvol~tmpfs").join(volume)
}

// ---- tmpfs: a mount-only driver --------------------------------------------------------------

#[test]
fn tmpfs_init_reports_a_mount_only_driver() {
    let reply = call(&tmpfs_driver(), &["init"], &[]);
    assert_eq!(reply.json, json!({"status": "Success", "capabilities": {"attach": false}}));
}

#[test]
fn tmpfs_answers_not_supported_to_every_other_command() {
    let driver = tmpfs_driver();
    let options = pod_mount_options("scratch", false, &[]);
    let calls: [&[&str]; 11] = [
        &["attach", &options, NODE],
        &["waitforattach", "/dev/null", &options],
        &["isattached", &options, NODE],
        &["detach", "scratch", NODE],
        &["mountdevice", "/nonexistent/dmp", "/dev/null", &options],
        &["unmountdevice", "/nonexistent/dmp"],
        &["getvolumename", &options],
        &["expandvolume", &options, "/nonexistent/dmp", "2048", "1024"],
        &["expandfs", &options, "/dev/null", "/nonexistent/dmp", "2048", "1024"],
        &["frobnicate"],
        &[],
    ];
    for args in calls {
        let reply = call(&driver, args, &[]);
        assert_eq!(reply.json, not_supported(), "{args:?}");
        assert_eq!(reply.exit_code, Some(1), "{args:?}");
    }
}

#[test]
fn tmpfs_mount_and_unmount_are_real_and_idempotent() {
    in_private_mount_namespace("tmpfs_mount_and_unmount_are_real_and_idempotent", || {
        let (_dir, root) = temp_root();
        let target = pod_volume_dir(&root, "scratch");
        let _guard = UnmountGuard(vec![target.clone()]);
        let driver = tmpfs_driver();
        let target_arg = target.to_str().unwrap();
        let options = pod_mount_options("scratch", false, &[("size", "64Mi"), ("mode", "0750")]);

        assert!(!target.exists());
        assert_eq!(call(&driver, &["mount", target_arg, &options], &[]).json, success());
        let mounts = mounts_at(&target);
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        let entry = &mounts[0];
        assert_eq!(entry.fs_type, "tmpfs");
        assert_eq!(entry.source, "kvol-tmpfs");
        assert!(entry.mount_options.iter().any(|o| o == "rw"), "{entry:?}");
        assert!(
            entry.super_options.iter().any(|o| o == "size=65536k"),
            "64Mi must become size=65536k: {entry:?}"
        );
        assert!(entry.super_options.iter().any(|o| o == "mode=750"), "{entry:?}");
        std::fs::write(target.join("data"), b"kept").unwrap();

        // A second mount is a no-op: nothing stacked, the data still visible.
        assert_eq!(call(&driver, &["mount", target_arg, &options], &[]).json, success());
        assert_eq!(mounts_at(&target).len(), 1);
        assert_eq!(std::fs::read(target.join("data")).unwrap(), b"kept");

        assert_eq!(call(&driver, &["unmount", target_arg], &[]).json, success());
        assert!(mounts_at(&target).is_empty());
        assert!(!target.exists(), "unmount removes the target directory");

        // Unmounting again (target gone) still succeeds.
        assert_eq!(call(&driver, &["unmount", target_arg], &[]).json, success());
        // So does unmounting a directory that exists but is not mounted.
        std::fs::create_dir_all(&target).unwrap();
        assert_eq!(call(&driver, &["unmount", target_arg], &[]).json, success());
        assert!(!target.exists());
    });
}

#[test]
fn tmpfs_read_only_volume_with_the_default_size() {
    in_private_mount_namespace("tmpfs_read_only_volume_with_the_default_size", || {
        let (_dir, root) = temp_root();
        let target = pod_volume_dir(&root, "config");
        let _guard = UnmountGuard(vec![target.clone()]);
        let driver = tmpfs_driver();
        let target_arg = target.to_str().unwrap();
        let options = pod_mount_options("config", true, &[]);

        assert_eq!(call(&driver, &["mount", target_arg, &options], &[]).json, success());
        let mounts = mounts_at(&target);
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        let entry = &mounts[0];
        assert_eq!(entry.fs_type, "tmpfs");
        assert!(entry.mount_options.iter().any(|o| o == "ro"), "{entry:?}");
        assert!(entry.super_options.iter().any(|o| o == "size=65536k"), "default size is 64Mi: {entry:?}");
        let err = std::fs::write(target.join("nope"), b"x").unwrap_err();
        assert_eq!(err.raw_os_error(), Some(Errno::EROFS as i32), "{err}");

        assert_eq!(call(&driver, &["unmount", target_arg], &[]).json, success());
        assert!(mounts_at(&target).is_empty());
        assert!(!target.exists());
    });
}

#[test]
fn tmpfs_sizes_and_json_parsing() {
    in_private_mount_namespace("tmpfs_sizes_and_json_parsing", || {
        let (_dir, root) = temp_root();
        let driver = tmpfs_driver();
        // Sizes chosen as multiples of 64 KiB, so the result does not depend on the page size.
        let cases: Vec<(String, &str)> = vec![
            (pod_mount_options("a", false, &[("size", "1Gi")]), "size=1048576k"),
            (pod_mount_options("b", false, &[("size", "128Ki")]), "size=128k"),
            // Decimal suffix: 2048000 × 1000 bytes.
            (pod_mount_options("c", false, &[("size", "2048000k")]), "size=2000000k"),
            // Plain bytes.
            (pod_mount_options("d", false, &[("size", "4194304")]), "size=4096k"),
            // An empty value means the default.
            (pod_mount_options("e", false, &[("size", "")]), "size=65536k"),
            // The key inside another value (escaped quotes) is not the key.
            (r#"{"note":"\"size\":\"1Mi\"","size":"2Mi","z":"\\\"size\":"}"#.to_owned(), "size=2048k"),
            // Whitespace and newlines between tokens, as a human might write it.
            ("{\n  \"size\" : \"4Mi\" ,\n\t\"mode\": \"0700\"\n}".to_owned(), "size=4096k"),
            // A repeated key: the last one wins, as with Go's encoding/json.
            (r#"{"size":"1Mi","size":"3Mi"}"#.to_owned(), "size=3072k"),
        ];
        for (i, (options, want)) in cases.iter().enumerate() {
            let target = root.join(format!("vol-{i}"));
            let _guard = UnmountGuard(vec![target.clone()]);
            let target_arg = target.to_str().unwrap();
            assert_eq!(call(&driver, &["mount", target_arg, options], &[]).json, success(), "{options}");
            let mounts = mounts_at(&target);
            assert_eq!(mounts.len(), 1, "{options}: {mounts:?}");
            assert!(
                mounts[0].super_options.iter().any(|o| o == want),
                "{options}: want {want}, got {:?}",
                mounts[0].super_options
            );
            assert_eq!(call(&driver, &["unmount", target_arg], &[]).json, success());
        }
    });
}

#[test]
fn tmpfs_bad_options_are_failures_that_leave_nothing_behind() {
    in_private_mount_namespace("tmpfs_bad_options_are_failures_that_leave_nothing_behind", || {
        let (_dir, root) = temp_root();
        let target = pod_volume_dir(&root, "bad");
        let _guard = UnmountGuard(vec![target.clone()]);
        let driver = tmpfs_driver();
        let target_arg = target.to_str().unwrap();
        let cases: Vec<(String, &str)> = vec![
            (pod_mount_options("bad", false, &[("size", "lots")]), r#"invalid size "lots""#),
            (pod_mount_options("bad", false, &[("size", "0")]), r#"invalid size "0""#),
            (pod_mount_options("bad", false, &[("size", "-1Mi")]), r#"invalid size "-1Mi""#),
            (pod_mount_options("bad", false, &[("size", "64MB")]), r#"invalid size "64MB""#),
            (pod_mount_options("bad", false, &[("size", "99999999999999999999")]), "invalid size"),
            // A quote in the value comes back correctly escaped in the message.
            (pod_mount_options("bad", false, &[("size", "6\"4")]), r#"invalid size "6"4""#),
            (pod_mount_options("bad", false, &[("mode", "999")]), r#"invalid mode "999""#),
            (
                pod_mount_options("bad", false, &[("kubernetes.io/readwrite", "yes")]),
                r#"invalid kubernetes.io/readwrite "yes""#,
            ),
            (r#"{"size":64}"#.to_owned(), r#"option "size" must be a JSON string"#),
            (r#"{"size":"6\u0034Mi"}"#.to_owned(), "JSON escapes"),
            ("size=64Mi".to_owned(), "options must be a JSON object"),
        ];
        for (options, want) in &cases {
            let reply = call(&driver, &["mount", target_arg, options], &[]);
            let message = reply.failure_message();
            assert!(
                message.starts_with("tmpfs: ") && message.contains(want),
                "{options}: want {want:?} in {message:?}"
            );
            assert!(mounts_at(&target).is_empty(), "{options}");
            assert!(!target.exists(), "{options}: target left behind");
        }

        let reply = call(&driver, &["mount", "relative/dir", "{}"], &[]);
        assert!(reply.failure_message().contains("not an absolute path"));
        let reply = call(&driver, &["mount", target_arg], &[]);
        assert!(reply.failure_message().contains("usage"));
    });
}

// ---- loop: an attachable driver ---------------------------------------------------------------

/// Why the loop lifecycle test cannot run here, if it cannot.
fn loop_test_blocker() -> Option<String> {
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control does not exist".to_owned());
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&path).collect();
    dirs.extend(["/usr/local/sbin", "/usr/sbin", "/sbin"].map(PathBuf::from));
    for tool in ["losetup", "mkfs.ext4", "blkid", "truncate", "mount", "umount"] {
        if !dirs.iter().any(|dir| dir.join(tool).is_file()) {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

/// Loop devices bound to `file`, read from sysfs (independently of the driver and of losetup).
fn loop_devices_bound_to(file: &Path) -> Vec<String> {
    let file = file.to_str().unwrap();
    let deleted = format!("{file} (deleted)");
    let mut devices = Vec::new();
    let Ok(entries) = std::fs::read_dir("/sys/class/block") else {
        return devices;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.starts_with("loop") {
            continue;
        }
        if let Ok(backing) = std::fs::read_to_string(entry.path().join("loop/backing_file")) {
            let backing = backing.trim_end_matches('\n');
            if backing == file || backing == deleted {
                devices.push(format!("/dev/{name}"));
            }
        }
    }
    devices.sort();
    devices
}

fn wait_until_unbound(file: &Path) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let devices = loop_devices_bound_to(file);
        if devices.is_empty() || Instant::now() > deadline {
            return devices;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn filesystem_uuid(device: &str) -> String {
    let output =
        Command::new("blkid").args(["-p", "-s", "UUID", "-o", "value", device]).output().expect("run blkid");
    assert!(output.status.success(), "blkid -p {device}: {output:?}");
    String::from_utf8(output.stdout).unwrap().trim().to_owned()
}

/// Unmounts the given paths and detaches every loop device bound to the given files when dropped,
/// so that a failed assertion leaves no loop device behind.
#[derive(Debug, Default)]
struct LoopGuard {
    mounts: UnmountGuard,
    files: Vec<PathBuf>,
}

impl Drop for LoopGuard {
    fn drop(&mut self) {
        // Unmount first: a mounted loop device is only released once unmounted.
        drop(std::mem::take(&mut self.mounts));
        for file in &self.files {
            for device in loop_devices_bound_to(file) {
                let _ = Command::new("losetup").args(["-d", &device]).status();
            }
        }
    }
}

/// The options JSON kubelet / the attach-detach controller pass for a PersistentVolume.
fn pv_options(pv: &str, read_only: bool, user: &[(&str, &str)]) -> String {
    let mut options = serde_json::Map::new();
    for (key, value) in [
        ("kubernetes.io/fsType", "ext4"),
        ("kubernetes.io/readwrite", if read_only { "ro" } else { "rw" }),
        ("kubernetes.io/pvOrVolumeName", pv),
    ]
    .into_iter()
    .chain(user.iter().copied())
    {
        options.insert(key.to_owned(), Value::String(value.to_owned()));
    }
    Value::Object(options).to_string()
}

fn device_mount_path(root: &Path, volume: &str) -> PathBuf {
    root.join("plugins/kubernetes.io/flexvolume/kvol/loop/mounts").join(volume)
}

#[test]
fn loop_init_reports_an_attachable_driver() {
    let reply = call(&loop_driver(), &["init"], &[]);
    assert_eq!(
        reply.json,
        json!({"status": "Success", "capabilities": {"attach": true, "requiresFSResize": true}})
    );
}

/// Everything the loop driver decides without touching a loop device.
#[test]
fn loop_refusals_and_fallbacks() {
    let (_dir, root) = temp_root();
    let state = root.join("state");
    let env = [("KVOL_LOOP_STATE_DIR", state.as_path())];
    let driver = loop_driver();
    let image = root.join("images/never.img");
    let image_arg = image.to_str().unwrap();

    // mount/unmount are left to kubelet/kvol (bind mount of the device mount path); the rest
    // are not implemented.
    let options = pv_options("pv-x", false, &[("backingFile", image_arg)]);
    let calls: [&[&str]; 6] = [
        &["mount", "/nonexistent/pod/vol", &options],
        &["unmount", "/nonexistent/pod/vol"],
        &["getvolumename", &options],
        // The node grows the filesystem itself (requiresFSResize, kubelet's generic resize).
        &["expandfs", &options, "/dev/null", "/nonexistent/dmp", "2048", "1024"],
        &["frobnicate"],
        &[],
    ];
    for args in calls {
        let reply = call(&driver, args, &env);
        assert_eq!(reply.json, not_supported(), "{args:?}");
        assert_eq!(reply.exit_code, Some(1), "{args:?}");
    }

    // expandvolume grows an existing backing file by a number of bytes, or says why not.
    let expand_cases = [
        (&["expandvolume", &options, "/nonexistent/dmp", "2048", "1024"][..], "does not exist"),
        (&["expandvolume", &options, "/nonexistent/dmp", "2Gi", "1024"][..], "is not a number of bytes"),
    ];
    for (args, want) in expand_cases {
        let reply = call(&driver, args, &env);
        assert_eq!(reply.status(), "Failure", "{args:?}");
        assert!(reply.failure_message().contains(want), "{args:?}: {}", reply.failure_message());
    }

    // attach needs a backing file and a volume name, both sane.
    let cases: Vec<(String, &str)> = vec![
        (pv_options("pv-x", false, &[]), r#"option "backingFile" is required"#),
        (pv_options("pv-x", false, &[("backingFile", "images/x.img")]), "is not an absolute path"),
        (
            format!(r#"{{"backingFile":"{image_arg}"}}"#),
            r#"option "kubernetes.io/pvOrVolumeName" is required"#,
        ),
        (pv_options("../escape", false, &[("backingFile", image_arg)]), r#"invalid volume name "../escape""#),
        (pv_options("pv-x", false, &[("backingFile", image_arg), ("size", "big")]), r#"invalid size "big""#),
        (pv_options("pv-x", false, &[("backingFile", root.to_str().unwrap())]), "is not a regular file"),
    ];
    for (options, want) in &cases {
        let message = call(&driver, &["attach", options, NODE], &env).failure_message();
        assert!(
            message.starts_with("loop: ") && message.contains(want),
            "{options}: want {want:?} in {message:?}"
        );
    }
    assert!(!image.exists(), "a refused attach creates no backing file");

    // A volume name already recorded with another backing file is refused before anything is
    // created.
    std::fs::create_dir_all(&state).unwrap();
    std::fs::write(state.join("pv-x"), "/elsewhere/other.img\n/dev/loop99\n").unwrap();
    let message = call(&driver, &["attach", &options, NODE], &env).failure_message();
    assert!(
        message.contains("already attached on this node with backing file /elsewhere/other.img"),
        "{message}"
    );
    assert!(!image.exists());
    std::fs::remove_file(state.join("pv-x")).unwrap();

    // Nothing attached: isattached says so, detach succeeds (idempotent).
    assert_eq!(
        call(&driver, &["isattached", &options, NODE], &env).json,
        json!({"status": "Success", "attached": false})
    );
    assert_eq!(call(&driver, &["detach", "pv-x", NODE], &env).json, success());
    let message = call(&driver, &["detach", "../etc", NODE], &env).failure_message();
    assert!(message.contains("invalid volume name"), "{message}");
    let message = call(&driver, &["isattached", "{}", NODE], &env).failure_message();
    assert!(message.contains(r#""backingFile" is required"#), "{message}");

    // waitforattach wants a block device.
    let message = call(&driver, &["waitforattach", "/nonexistent/loop", &options], &env).failure_message();
    assert!(message.contains("is not a block device"), "{message}");
    let message = call(&driver, &["attach", &options], &env).failure_message();
    assert!(message.contains("usage"), "{message}");
}

#[test]
fn loop_full_lifecycle_with_real_devices() {
    if let Some(why) = loop_test_blocker() {
        eprintln!("skipping loop_full_lifecycle_with_real_devices: {why}");
        return;
    }
    in_private_mount_namespace("loop_full_lifecycle_with_real_devices", || {
        let (_dir, root) = temp_root();
        let state = root.join("state");
        let env = [("KVOL_LOOP_STATE_DIR", state.as_path())];
        let driver = loop_driver();
        let image = root.join("images/pv-loop.img");
        let image_arg = image.to_str().unwrap();
        let mount_path = device_mount_path(&root, "pv-loop");
        let mount_arg = mount_path.to_str().unwrap();
        let ro_image = root.join("images/pv-ro.img");
        let ro_mount_path = device_mount_path(&root, "pv-ro");
        let _guard = LoopGuard {
            mounts: UnmountGuard(vec![mount_path.clone(), ro_mount_path.clone()]),
            files: vec![image.clone(), ro_image.clone()],
        };
        let options = pv_options("pv-loop", false, &[("backingFile", image_arg)]);

        // Not attached yet.
        assert_eq!(
            call(&driver, &["isattached", &options, NODE], &env).json,
            json!({"status": "Success", "attached": false})
        );

        // attach: creates a sparse 64Mi file, binds a loop device, records the volume.
        let reply = call(&driver, &["attach", &options, NODE], &env);
        assert_eq!(reply.status(), "Success", "{reply:?}");
        assert_eq!(keys(&reply.json), ["device", "status"]);
        let device = reply.json["device"].as_str().unwrap().to_owned();
        assert!(
            device
                .strip_prefix("/dev/loop")
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
            "{device}"
        );
        assert_eq!(loop_devices_bound_to(&image), vec![device.clone()]);
        {
            use std::os::unix::fs::MetadataExt;
            let meta = std::fs::metadata(&image).unwrap();
            assert_eq!(meta.len(), 64 << 20);
            assert!(meta.blocks() * 512 < 1 << 20, "backing file is sparse: {meta:?}");
        }
        assert_eq!(
            std::fs::read_to_string(state.join("pv-loop")).unwrap(),
            format!("{image_arg}\n{device}\n")
        );

        // attach again: the same device is reused, no second one bound.
        assert_eq!(
            call(&driver, &["attach", &options, NODE], &env).json,
            json!({"status": "Success", "device": device})
        );
        assert_eq!(loop_devices_bound_to(&image), vec![device.clone()]);

        assert_eq!(
            call(&driver, &["waitforattach", &device, &options], &env).json,
            json!({"status": "Success", "device": device})
        );
        assert_eq!(
            call(&driver, &["isattached", &options, NODE], &env).json,
            json!({"status": "Success", "attached": true})
        );

        // mountdevice: formats (ext4) and mounts; a second call is a no-op.
        assert_eq!(call(&driver, &["mountdevice", mount_arg, &device, &options], &env).json, success());
        let mounts = mounts_at(&mount_path);
        assert_eq!(mounts.len(), 1, "{mounts:?}");
        assert_eq!(mounts[0].fs_type, "ext4");
        assert_eq!(mounts[0].source, device);
        let sys_dev = Path::new("/sys/class/block").join(device.trim_start_matches("/dev/")).join("dev");
        assert_eq!(mounts[0].major_minor, std::fs::read_to_string(sys_dev).unwrap().trim());
        assert!(mounts[0].mount_options.iter().any(|o| o == "rw"), "{mounts:?}");
        let uuid = filesystem_uuid(&device);
        assert!(!uuid.is_empty());
        assert_eq!(call(&driver, &["mountdevice", mount_arg, &device, &options], &env).json, success());
        assert_eq!(mounts_at(&mount_path).len(), 1);

        std::fs::write(mount_path.join("hello.txt"), b"written before unmountdevice").unwrap();

        // detach refuses while the device is still mounted.
        let message = call(&driver, &["detach", "pv-loop", NODE], &env).failure_message();
        assert!(message.contains("still mounted"), "{message}");
        assert_eq!(loop_devices_bound_to(&image), vec![device.clone()]);

        // unmountdevice: unmounts and removes the directory; idempotent.
        assert_eq!(call(&driver, &["unmountdevice", mount_arg], &env).json, success());
        assert!(mounts_at(&mount_path).is_empty());
        assert!(!mount_path.exists());
        assert_eq!(call(&driver, &["unmountdevice", mount_arg], &env).json, success());

        // mountdevice again: the existing filesystem is kept, and with it the data.
        assert_eq!(call(&driver, &["mountdevice", mount_arg, &device, &options], &env).json, success());
        assert_eq!(filesystem_uuid(&device), uuid, "formatted only once");
        assert_eq!(std::fs::read(mount_path.join("hello.txt")).unwrap(), b"written before unmountdevice");
        // Asking for another filesystem type on a formatted device is refused.
        let other = pv_options("pv-loop", false, &[("kubernetes.io/fsType", "xfs")]);
        let other_mount = root.join("other-mount");
        let message = call(&driver, &["mountdevice", other_mount.to_str().unwrap(), &device, &other], &env)
            .failure_message();
        assert!(message.contains("already holds a ext4 filesystem, not the requested xfs"), "{message}");
        assert!(!other_mount.exists());
        assert_eq!(call(&driver, &["unmountdevice", mount_arg], &env).json, success());
        assert!(mounts_at(&mount_path).is_empty());

        // detach: the device is released and the record removed; idempotent.
        assert_eq!(call(&driver, &["detach", "pv-loop", NODE], &env).json, success());
        assert_eq!(wait_until_unbound(&image), Vec::<String>::new());
        let losetup = Command::new("losetup").arg("-j").arg(&image).output().unwrap();
        assert!(losetup.status.success() && losetup.stdout.is_empty(), "{losetup:?}");
        assert!(!state.join("pv-loop").exists());
        assert_eq!(
            call(&driver, &["isattached", &options, NODE], &env).json,
            json!({"status": "Success", "attached": false})
        );
        let message = call(&driver, &["waitforattach", &device, &options], &env).failure_message();
        assert!(message.contains("is not bound to"), "{message}");
        assert_eq!(call(&driver, &["detach", "pv-loop", NODE], &env).json, success());
        assert!(image.exists(), "detach keeps the data");

        // A read-only volume without a filesystem is never formatted.
        let ro_options =
            pv_options("pv-ro", true, &[("backingFile", ro_image.to_str().unwrap()), ("size", "8Mi")]);
        let reply = call(&driver, &["attach", &ro_options, NODE], &env);
        assert_eq!(reply.status(), "Success", "{reply:?}");
        let ro_device = reply.json["device"].as_str().unwrap().to_owned();
        assert_eq!(std::fs::metadata(&ro_image).unwrap().len(), 8 << 20);
        let message =
            call(&driver, &["mountdevice", ro_mount_path.to_str().unwrap(), &ro_device, &ro_options], &env)
                .failure_message();
        assert!(message.contains("a read-only volume cannot be formatted"), "{message}");
        assert!(!ro_mount_path.exists());
        let blkid = Command::new("blkid").args(["-p", &ro_device]).output().unwrap();
        assert_eq!(blkid.status.code(), Some(2), "still no filesystem: {blkid:?}");
        assert_eq!(call(&driver, &["detach", "pv-ro", NODE], &env).json, success());
        assert_eq!(wait_until_unbound(&ro_image), Vec::<String>::new());
    });
}
