//! The real `kvol lvm-driver` serving CSI on real lvm2 (loop-device volume groups the tests make and remove): volumes idempotent by name, capacity, expansion, refusals, lvmd.yaml reload (kept when it would orphan volumes), and kill -9 mid-CreateVolume leaving exactly one logical volume after the retry.
//!
//! Needs root and lvm2's tools; skips with the reason otherwise. On a kernel without
//! device-mapper (containers, some VMs) logical volumes cannot be activated, so these tests run
//! lvm with activation disabled (`LVM_SYSTEM_DIR` pointing at an lvm.conf with
//! `global { activation = 0 }`): the metadata operations, tags and sizes are lvm's own, nothing is
//! mounted. Thin pools need device-mapper and are tested in kvol-lvm's lifecycle test.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvol_csi::proto::csi::{self, controller_client::ControllerClient, identity_client::IdentityClient};
use kvol_lvm::lvs::{LVS_FIELDS, LogicalVolume, parse_lvs};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

const NO_UDEV: &str = kvol_lvm::command::NO_UDEV_CONFIG;
const MIB: i64 = 1 << 20;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Where lvm runs: with activation off (a private lvm.conf) when the kernel has no device-mapper.
struct LvmEnv {
    system_dir: Option<tempfile::TempDir>,
}

impl LvmEnv {
    fn detect() -> Result<LvmEnv, String> {
        if !nix::unistd::Uid::effective().is_root() {
            return Err("not root".into());
        }
        for tool in ["vgcreate", "lvs", "losetup"] {
            let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
            if !found.map(|o| o.status.success()).unwrap_or(false) {
                return Err(format!("{tool} is not installed (apt-get install lvm2)"));
            }
        }
        let misc = std::fs::read_to_string("/proc/misc").unwrap_or_default();
        if misc.contains("device-mapper") {
            return Ok(LvmEnv { system_dir: None });
        }
        eprintln!("note: the kernel has no device-mapper; lvm runs with activation disabled");
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(dir.path().join("lvm.conf"), "global { activation = 0 }\n")
            .map_err(|e| e.to_string())?;
        Ok(LvmEnv { system_dir: Some(dir) })
    }

    fn apply(&self, cmd: &mut Command) {
        cmd.env("DM_DISABLE_UDEV", "1");
        if let Some(dir) = &self.system_dir {
            cmd.env("LVM_SYSTEM_DIR", dir.path());
        }
    }

    fn lvm(&self, tool: &str, args: &[&str]) -> Result<String, String> {
        let mut cmd = Command::new(tool);
        cmd.arg("--config").arg(NO_UDEV).args(args);
        self.apply(&mut cmd);
        let out = cmd.output().map_err(|e| format!("{tool}: {e}"))?;
        if !out.status.success() {
            return Err(format!("{tool} {args:?}: {}", text(&out.stderr)));
        }
        Ok(text(&out.stdout))
    }

    /// The logical volumes tagged for `driver`.
    fn owned(&self, driver: &str) -> Vec<LogicalVolume> {
        let tag = format!("@kvol.driver={driver}");
        let out = self
            .lvm("lvs", &["--reportformat", "json", "--units", "b", "--nosuffix", "-o", LVS_FIELDS, &tag])
            .expect("lvs answers");
        parse_lvs(&out).expect("lvs json")
    }
}

/// A loop device carrying a volume group; both removed on drop, even when the test fails.
struct LoopVg<'a> {
    env: &'a LvmEnv,
    device: String,
    vg: String,
}

impl<'a> LoopVg<'a> {
    fn create(env: &'a LvmEnv, dir: &Path, vg: &str, mib: u64) -> Result<LoopVg<'a>, String> {
        let image = dir.join(format!("{vg}.img"));
        std::fs::File::create(&image).and_then(|f| f.set_len(mib << 20)).map_err(|e| e.to_string())?;
        let out =
            Command::new("losetup").args(["-f", "--show"]).arg(&image).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("losetup: {}", text(&out.stderr)));
        }
        let device = text(&out.stdout).trim().to_string();
        let guard = LoopVg { env, device: device.clone(), vg: vg.to_string() };
        env.lvm("vgcreate", &["-s", "4m", vg, &device])?;
        Ok(guard)
    }
}

impl Drop for LoopVg<'_> {
    fn drop(&mut self) {
        let _ = self.env.lvm("vgremove", &["-f", &self.vg]);
        let _ = Command::new("losetup").args(["-d", &self.device]).output();
    }
}

/// The driver process, its stderr lines on a channel; killed on drop.
struct Driver {
    child: Child,
    lines: mpsc::Receiver<String>,
    socket: PathBuf,
}

impl Driver {
    fn start(env: &LvmEnv, config: &Path, socket: &Path, name: &str, path_prefix: Option<&Path>) -> Driver {
        let _ = std::fs::remove_file(socket);
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_kvol"));
        cmd.args(["lvm-driver", "--node-name", "node-a", "--no-register", "--lvm-timeout-seconds", "20"])
            .arg(format!("--name={name}"))
            .arg(format!("--lvmd-config={}", config.display()))
            .arg(format!("--csi-socket={}", socket.display()))
            .env_remove("KVOL_CONFIG")
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        env.apply(&mut cmd);
        if let Some(prefix) = path_prefix {
            let path = std::env::var("PATH").unwrap_or_default();
            cmd.env("PATH", format!("{}:{path}", prefix.display()));
        }
        let mut child = cmd.spawn().expect("kvol lvm-driver starts");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                eprintln!("driver: {line}");
                let _ = tx.send(line);
            }
        });
        let started = Instant::now();
        while !socket.exists() {
            if let Ok(Some(status)) = child.try_wait() {
                panic!("the driver exited: {status}");
            }
            assert!(started.elapsed() < Duration::from_secs(20), "no socket at {}", socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
        Driver { child, lines, socket: socket.to_path_buf() }
    }

    async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(channel(&self.socket).await)
    }

    /// Waits for a stderr line containing `needle`; the lines seen on the way.
    fn wait_line(&self, needle: &str) -> Vec<String> {
        let mut seen = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(line) = self.lines.recv_timeout(Duration::from_millis(100)) {
                let found = line.contains(needle);
                seen.push(line);
                if found {
                    return seen;
                }
            }
        }
        panic!("the driver never said {needle:?}; it said {seen:#?}");
    }

    fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    fn kill9(mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }

    fn stop(mut self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        let status = self.child.wait().unwrap();
        assert!(status.success(), "the driver stops cleanly: {status}");
    }
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}

fn mount_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

fn create_request(name: &str, bytes: i64, class: Option<&str>) -> csi::CreateVolumeRequest {
    csi::CreateVolumeRequest {
        name: name.into(),
        capacity_range: Some(csi::CapacityRange { required_bytes: bytes, limit_bytes: 0 }),
        volume_capabilities: vec![mount_cap()],
        parameters: class
            .map(|c| [("topolvm.io/device-class".to_string(), c.to_string())].into())
            .unwrap_or_default(),
        ..Default::default()
    }
}

fn thick_config(classes: &[(&str, &str, bool)]) -> String {
    let mut out = String::from("device-classes:\n");
    for (name, vg, default) in classes {
        out += &format!("  - name: {name}\n    volume-group: {vg}\n    spare-gb: 0\n");
        if *default {
            out += "    default: true\n";
        }
    }
    out
}

fn skip_reason() -> Option<LvmEnv> {
    match LvmEnv::detect() {
        Ok(env) => Some(env),
        Err(why) => {
            eprintln!("skipping: {why}");
            None
        }
    }
}

#[tokio::test(flavor = "current_thread")]
async fn volumes_on_real_lvm_are_idempotent_sized_expanded_and_deleted() {
    let Some(env) = skip_reason() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let vg_name = format!("kvolctl{}", std::process::id());
    let vg = LoopVg::create(&env, scratch.path(), &vg_name, 128).expect("a loop-device volume group");
    let driver_name = format!("ctl{}.lvm.csi.kvol.io", std::process::id());
    let config = scratch.path().join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("hdd", &vg.vg, true)])).unwrap();
    let driver = Driver::start(&env, &config, &scratch.path().join("csi.sock"), &driver_name, None);
    let ch = channel(&driver.socket).await;
    let mut identity = IdentityClient::new(ch.clone());
    let info = identity.get_plugin_info(csi::GetPluginInfoRequest {}).await.unwrap().into_inner();
    assert_eq!(info.name, driver_name);
    let probe = identity.probe(csi::ProbeRequest {}).await.unwrap().into_inner();
    assert_eq!(probe.ready, Some(true));
    let mut ctl = driver.controller().await;

    let free_before =
        ctl.get_capacity(csi::GetCapacityRequest::default()).await.unwrap().into_inner().available_capacity;
    assert_eq!(free_before, 124 * MIB, "a 128 MiB PV holds 31 extents of 4 MiB");

    let made = ctl
        .create_volume(create_request("pvc-a", 10 * MIB, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(made.capacity_bytes, 12 * MIB, "10 MiB rounded up to whole extents");
    assert_eq!(made.volume_id, kvol_lvm::naming::volume_id("pvc-a"));
    let topology = &made.accessible_topology[0].segments;
    assert_eq!(topology.get(&format!("topology.{driver_name}/node")).map(String::as_str), Some("node-a"));
    let again = ctl
        .create_volume(create_request("pvc-a", 10 * MIB, None))
        .await
        .unwrap()
        .into_inner()
        .volume
        .unwrap();
    assert_eq!(again.volume_id, made.volume_id, "the same name is the same volume");
    let lvs = env.owned(&driver_name);
    assert_eq!(lvs.len(), 1, "{lvs:?}");
    assert_eq!((lvs[0].vg.as_str(), lvs[0].size), (vg.vg.as_str(), 12 << 20));
    assert!(lvs[0].tags.contains(&"kvol.name=pvc-a".to_string()), "{:?}", lvs[0].tags);
    assert!(lvs[0].tags.contains(&"kvol.class=hdd".to_string()), "{:?}", lvs[0].tags);

    let err = ctl.create_volume(create_request("pvc-a", 40 * MIB, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists, "{err:?}");
    let err = ctl.create_volume(create_request("pvc-huge", 200 * MIB, None)).await.unwrap_err();
    assert_eq!(err.code(), Code::ResourceExhausted, "{err:?}");
    assert!(err.message().contains("device class hdd has 117440512 bytes left"), "{}", err.message());
    let err = ctl.create_volume(create_request("pvc-x", MIB, Some("nvme"))).await.unwrap_err();
    assert_eq!(
        (err.code(), err.message()),
        (Code::InvalidArgument, "volume pvc-x: device class \"nvme\" is not in lvmd.yaml (it has: hdd)")
    );
    assert_eq!(env.owned(&driver_name).len(), 1, "refused creates make nothing");
    let free =
        ctl.get_capacity(csi::GetCapacityRequest::default()).await.unwrap().into_inner().available_capacity;
    assert_eq!(free, free_before - 12 * MIB);

    let grown = ctl
        .controller_expand_volume(csi::ControllerExpandVolumeRequest {
            volume_id: made.volume_id.clone(),
            capacity_range: Some(csi::CapacityRange { required_bytes: 30 * MIB, limit_bytes: 0 }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((grown.capacity_bytes, grown.node_expansion_required), (32 * MIB, true));
    assert_eq!(env.owned(&driver_name)[0].size, 32 << 20);

    let err = ctl
        .create_snapshot(csi::CreateSnapshotRequest {
            name: "snap-a".into(),
            source_volume_id: made.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("is a thick volume"), "{}", err.message());

    for _ in 0..2 {
        ctl.delete_volume(csi::DeleteVolumeRequest {
            volume_id: made.volume_id.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    }
    assert!(env.owned(&driver_name).is_empty());
    drop(ctl);
    driver.stop();
}

#[tokio::test(flavor = "current_thread")]
async fn lvmd_yaml_reloads_at_once_but_never_orphans_volumes() {
    let Some(env) = skip_reason() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    let vga = LoopVg::create(&env, scratch.path(), &format!("kvolrla{pid}"), 64).expect("volume group a");
    let vgb = LoopVg::create(&env, scratch.path(), &format!("kvolrlb{pid}"), 64).expect("volume group b");
    let driver_name = format!("rl{pid}.lvm.csi.kvol.io");
    let config = scratch.path().join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("a", &vga.vg, true)])).unwrap();
    let driver = Driver::start(&env, &config, &scratch.path().join("csi.sock"), &driver_name, None);
    let mut ctl = driver.controller().await;
    let v1 =
        ctl.create_volume(create_request("pvc-1", 4 * MIB, None)).await.unwrap().into_inner().volume.unwrap();

    // Moving class a to the other VG while it holds pvc-1 is refused; the running config stays.
    std::fs::write(&config, thick_config(&[("a", &vgb.vg, true)])).unwrap();
    driver.signal(nix::sys::signal::Signal::SIGHUP);
    let said = driver.wait_line("not reloaded").join("\n");
    let _ = driver.wait_line(&format!("device class a moves from {} to {}", vga.vg, vgb.vg));
    let _ = said;
    ctl.create_volume(create_request("pvc-2", 4 * MIB, None)).await.unwrap();
    let placed: Vec<String> = env.owned(&driver_name).iter().map(|lv| lv.vg.clone()).collect();
    assert_eq!(placed, [vga.vg.clone(), vga.vg.clone()], "still carved from the running class's VG");

    // Emptied, the class may move: the file watcher applies the next change without a signal.
    for name in ["pvc-1", "pvc-2"] {
        let id = kvol_lvm::naming::volume_id(name);
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await.unwrap();
    }
    let _ = v1;
    std::fs::write(&config, thick_config(&[("a", &vgb.vg, true), ("b", &vga.vg, false)])).unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match ctl.create_volume(create_request("pvc-3", 4 * MIB, Some("b"))).await {
            Ok(_) => break,
            Err(e) if e.code() == Code::InvalidArgument && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the new class never came: {e:?}"),
        }
    }
    ctl.create_volume(create_request("pvc-4", 4 * MIB, None)).await.unwrap();
    let mut placed: Vec<(String, String)> = env
        .owned(&driver_name)
        .iter()
        .map(|lv| {
            (
                lv.vg.clone(),
                kvol_lvm::naming::tag_value(&lv.tags, "kvol.name=").unwrap_or_default().to_string(),
            )
        })
        .collect();
    placed.sort();
    let mut want = vec![(vga.vg.clone(), "pvc-3".to_string()), (vgb.vg.clone(), "pvc-4".to_string())];
    want.sort();
    assert_eq!(placed, want);

    // An invalid file is not applied either: every problem logged, the classes stay.
    std::fs::write(&config, "device-classes:\n  - name: a\n").unwrap();
    driver.signal(nix::sys::signal::Signal::SIGHUP);
    let _ = driver.wait_line("volume-group: should not be empty");
    ctl.create_volume(create_request("pvc-5", 4 * MIB, Some("b"))).await.unwrap();
    for name in ["pvc-3", "pvc-4", "pvc-5"] {
        let id = kvol_lvm::naming::volume_id(name);
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: id, ..Default::default() }).await.unwrap();
    }
    assert!(env.owned(&driver_name).is_empty());
    drop(ctl);
    driver.stop();
}

/// An `lvcreate` on PATH that runs the real one before (`after`) or after (`before`) it records
/// its pid and hangs, so the test can kill -9 the driver at that moment.
fn hanging_lvcreate(dir: &Path, when: &str) -> PathBuf {
    let bin = dir.join(format!("bin-{when}"));
    std::fs::create_dir_all(&bin).unwrap();
    let real = text(&Command::new("sh").args(["-c", "command -v lvcreate"]).output().unwrap().stdout)
        .trim()
        .to_string();
    let marker = dir.join(format!("hung-{when}"));
    let body = match when {
        "after" => format!(
            "#!/bin/sh\n{real} \"$@\" || exit $?\necho $$ > {m}.tmp && mv {m}.tmp {m}\nexec sleep 60\n",
            m = marker.display()
        ),
        _ => format!(
            "#!/bin/sh\necho $$ > {m}.tmp && mv {m}.tmp {m}\nsleep 60\nexec {real} \"$@\"\n",
            m = marker.display()
        ),
    };
    let script = bin.join("lvcreate");
    std::fs::write(&script, body).unwrap();
    Command::new("chmod").arg("755").arg(&script).status().unwrap();
    bin
}

#[tokio::test(flavor = "current_thread")]
async fn kill_9_mid_create_leaves_one_lv_after_the_retry_and_none_after_delete() {
    let Some(env) = skip_reason() else { return };
    let scratch = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    let vg = LoopVg::create(&env, scratch.path(), &format!("kvolcr{pid}"), 64).expect("a volume group");
    let config = scratch.path().join("lvmd.yaml");
    std::fs::write(&config, thick_config(&[("hdd", &vg.vg, true)])).unwrap();
    let socket = scratch.path().join("csi.sock");
    // Killed once lvcreate has committed (the LV exists, no answer was sent), or before it ran.
    for (when, lvs_after_kill) in [("after", 1), ("before", 0)] {
        let driver_name = format!("cr{when}{pid}.lvm.csi.kvol.io");
        let bin = hanging_lvcreate(scratch.path(), when);
        let marker = scratch.path().join(format!("hung-{when}"));
        let driver = Driver::start(&env, &config, &socket, &driver_name, Some(&bin));
        let mut ctl = driver.controller().await;
        let call =
            tokio::spawn(async move { ctl.create_volume(create_request("pvc-crash", 8 * MIB, None)).await });
        let started = Instant::now();
        while !marker.exists() {
            assert!(started.elapsed() < Duration::from_secs(20), "lvcreate never ran ({when})");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        driver.kill9();
        let hung: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(hung), nix::sys::signal::Signal::SIGKILL);
        assert!(call.await.unwrap().is_err(), "the killed driver never answered ({when})");
        assert_eq!(env.owned(&driver_name).len(), lvs_after_kill, "killed {when} lvcreate");

        let driver = Driver::start(&env, &config, &socket, &driver_name, None);
        let mut ctl = driver.controller().await;
        let retried =
            ctl.create_volume(create_request("pvc-crash", 8 * MIB, None)).await.unwrap().into_inner();
        let volume = retried.volume.unwrap();
        let lvs = env.owned(&driver_name);
        assert_eq!(lvs.len(), 1, "exactly one LV after the retry ({when}): {lvs:?}");
        assert_eq!(lvs[0].name, volume.volume_id);
        ctl.delete_volume(csi::DeleteVolumeRequest { volume_id: volume.volume_id, ..Default::default() })
            .await
            .unwrap();
        assert!(env.owned(&driver_name).is_empty(), "none after delete ({when})");
        drop(ctl);
        driver.stop();
    }
}
