//! Shared by the LVM driver's end-to-end tests: lvm run as the driver runs it (activation off on a kernel without device-mapper), loop-device volume groups removed on drop, and the `kvol lvm-driver` process with its stderr lines.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use kvol_csi::proto::csi::{self, controller_client::ControllerClient};
use kvol_lvm::lvs::{LVS_FIELDS, LogicalVolume, parse_lvs};
use tonic::transport::{Channel, Endpoint};

pub const NO_UDEV: &str = kvol_lvm::command::NO_UDEV_CONFIG;
pub const MIB: i64 = 1 << 20;

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Where lvm runs: with activation off (a private lvm.conf) when the kernel has no device-mapper.
pub struct LvmEnv {
    pub system_dir: Option<kvol_test_support::ScratchRoot>,
}

impl LvmEnv {
    pub fn detect() -> Result<LvmEnv, String> {
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
        let dir = kvol_test_support::ScratchRoot::new();
        std::fs::write(dir.path().join("lvm.conf"), "global { activation = 0 }\n")
            .map_err(|e| e.to_string())?;
        Ok(LvmEnv { system_dir: Some(dir) })
    }

    pub fn apply(&self, cmd: &mut Command) {
        cmd.env("DM_DISABLE_UDEV", "1");
        if let Some(dir) = &self.system_dir {
            cmd.env("LVM_SYSTEM_DIR", dir.path());
        }
    }

    pub fn lvm(&self, tool: &str, args: &[&str]) -> Result<String, String> {
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
    pub fn owned(&self, driver: &str) -> Vec<LogicalVolume> {
        let tag = format!("@kvol.driver={driver}");
        let out = self
            .lvm("lvs", &["--reportformat", "json", "--units", "b", "--nosuffix", "-o", LVS_FIELDS, &tag])
            .expect("lvs answers");
        parse_lvs(&out).expect("lvs json")
    }
}

/// A loop device carrying a volume group; both removed on drop, even when the test fails.
pub struct LoopVg<'a> {
    env: &'a LvmEnv,
    pub device: String,
    pub vg: String,
}

impl<'a> LoopVg<'a> {
    pub fn create(env: &'a LvmEnv, dir: &Path, vg: &str, mib: u64) -> Result<LoopVg<'a>, String> {
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
pub struct Driver {
    pub child: Child,
    pub lines: mpsc::Receiver<String>,
    pub socket: PathBuf,
}

impl Driver {
    pub fn start(
        env: &LvmEnv,
        config: &Path,
        socket: &Path,
        name: &str,
        path_prefix: Option<&Path>,
    ) -> Driver {
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

    pub async fn controller(&self) -> ControllerClient<Channel> {
        ControllerClient::new(channel(&self.socket).await)
    }

    /// Waits for a stderr line containing `needle`; the lines seen on the way.
    pub fn wait_line(&self, needle: &str) -> Vec<String> {
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

    pub fn signal(&self, sig: nix::sys::signal::Signal) {
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.child.id() as i32), sig).unwrap();
    }

    pub fn kill9(mut self) {
        self.signal(nix::sys::signal::Signal::SIGKILL);
        let _ = self.child.wait();
    }

    /// Stops the driver once the runtime closed the dropped clients' connections (the driver
    /// waits for open connections on shutdown).
    pub async fn stop_async(self) {
        tokio::time::sleep(Duration::from_millis(100)).await;
        self.stop();
    }

    pub fn stop(mut self) {
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

pub async fn channel(socket: &Path) -> Channel {
    Endpoint::from_shared(format!("unix://{}", socket.display()))
        .unwrap()
        .connect()
        .await
        .unwrap_or_else(|e| panic!("connect to {}: {e}", socket.display()))
}

pub fn mount_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, MountVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Mount(MountVolume::default())),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}

pub fn create_request(name: &str, bytes: i64, class: Option<&str>) -> csi::CreateVolumeRequest {
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

pub fn thick_config(classes: &[(&str, &str, bool)]) -> String {
    let mut out = String::from("device-classes:\n");
    for (name, vg, default) in classes {
        out += &format!("  - name: {name}\n    volume-group: {vg}\n    spare-gb: 0\n");
        if *default {
            out += "    default: true\n";
        }
    }
    out
}

pub fn skip_reason() -> Option<LvmEnv> {
    match LvmEnv::detect() {
        Ok(env) => Some(env),
        Err(why) => {
            eprintln!("skipping: {why}");
            None
        }
    }
}

impl LoopVg<'_> {
    /// Makes thin pool `name` of `mib` MiB in the group (needs device-mapper).
    pub fn thin_pool(&self, name: &str, mib: u64) -> Result<(), String> {
        self.env
            .lvm("lvcreate", &["-y", "-T", "-L", &format!("{mib}m"), &format!("{}/{name}", self.vg)])
            .map(drop)
    }
}

impl LvmEnv {
    /// Whether logical volumes can be activated here (the kernel has device-mapper).
    pub fn activates(&self) -> bool {
        self.system_dir.is_none()
    }
}

/// Moves the calling thread (and the processes it starts) into a mount namespace of its own
/// whose mounts propagate nowhere.
pub fn enter_private_mount_namespace() {
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)
        .expect("unshare the mount namespace (needs root)");
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .expect("make every mount private");
}

/// A class on a thin pool.
pub fn thin_class(name: &str, vg: &str, pool: &str, ratio: f64, default: bool) -> String {
    let mut out = format!(
        "  - name: {name}\n    volume-group: {vg}\n    spare-gb: 0\n    type: thin\n    thin-pool:\n      name: {pool}\n      overprovision-ratio: {ratio}\n"
    );
    if default {
        out += "    default: true\n";
    }
    out
}

/// Whether this process has CAP_SYS_RESOURCE, which ext4's online resize needs (containers
/// often drop it).
pub fn has_sys_resource() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).map(str::trim).unwrap_or("0");
    u64::from_str_radix(eff, 16).is_ok_and(|bits| bits & (1 << 24) != 0)
}

pub fn block_cap() -> csi::VolumeCapability {
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, access_mode::Mode};
    csi::VolumeCapability {
        access_type: Some(AccessType::Block(BlockVolume {})),
        access_mode: Some(AccessMode { mode: Mode::SingleNodeWriter as i32 }),
    }
}
