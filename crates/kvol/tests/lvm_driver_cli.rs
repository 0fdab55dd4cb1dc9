//! The real `kvol lvm-driver` binary: `--check` lists every problem of a user's lvmd.yaml and touches nothing; `--prepare` generates the file from a real volume group on a loop device; the run mode refuses an invalid file.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn kvol_lvm(config: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_kvol"))
        .arg("lvm-driver")
        .arg(format!("--lvmd-config={}", config.display()))
        .args(extra)
        .env_remove("KVOL_CONFIG")
        .output()
        .expect("the kvol binary runs")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

#[test]
fn check_lists_every_problem_on_its_own_line_and_exits_1() {
    let scratch = kvol_test_support::ScratchRoot::new();
    let path = scratch.path().join("lvmd.yaml");
    let bad = "device-classes:\n  - name: a\n  - name: a\n    volume-group: vg\n    type: thin\n";
    std::fs::write(&path, bad).unwrap();
    let out = kvol_lvm(&path, &["--check"]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let shown = path.display();
    let expected = format!(
        "{shown}: device-classes[0] (\"a\").volume-group: should not be empty\n\
         {shown}: device-classes[1] (\"a\").thin-pool: type is thin but thin-pool is missing\n\
         {shown}: device-classes[1] (\"a\").name: duplicate device-class name\n"
    );
    assert_eq!(text(&out.stderr), expected);
    assert_eq!(std::fs::read_to_string(&path).unwrap(), bad, "--check touches nothing");

    std::fs::write(&path, "device-classes:\n  - name: ssd\n    volume-group: vg0\n    default: true\n")
        .unwrap();
    let out = kvol_lvm(&path, &["--check"]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("device class ssd: vg0, default"), "{}", text(&out.stdout));

    let missing = scratch.path().join("absent.yaml");
    let out = kvol_lvm(&missing, &["--check"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).starts_with(&format!("cannot read {}", missing.display())),
        "{}",
        text(&out.stderr)
    );
    assert!(!missing.exists(), "--check creates nothing");
}

#[test]
fn the_driver_refuses_to_start_on_an_invalid_users_file_listing_every_problem() {
    let scratch = kvol_test_support::ScratchRoot::new();
    let path = scratch.path().join("lvmd.yaml");
    let bad = "device-classes:\n  - name: a\n  - name: a\n    volume-group: vg\n";
    std::fs::write(&path, bad).unwrap();
    let socket = scratch.path().join("csi.sock");
    let out = kvol_lvm(&path, &["--no-register", &format!("--csi-socket={}", socket.display())]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    let shown = path.display();
    assert_eq!(
        text(&out.stderr),
        format!(
            "{shown}: device-classes[0] (\"a\").volume-group: should not be empty\n\
             {shown}: device-classes[1] (\"a\").name: duplicate device-class name\n\
             kvol: the lvm driver does not start until {shown} is valid\n"
        )
    );
    assert!(!socket.exists(), "nothing is served");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), bad, "a user's file is never replaced");
}

const NO_UDEV: &str = "devices { obtain_device_list_from_udev=0 } activation { udev_sync=0 udev_rules=0 }";

/// A loop device carrying a volume group; both removed on drop, even when the test fails.
struct LoopVg {
    image: PathBuf,
    device: String,
    vg: String,
}

impl LoopVg {
    fn create(dir: &Path, vg: &str) -> Result<LoopVg, String> {
        let image = dir.join(format!("{vg}.img"));
        std::fs::File::create(&image).and_then(|f| f.set_len(64 << 20)).map_err(|e| e.to_string())?;
        let out =
            Command::new("losetup").args(["-f", "--show"]).arg(&image).output().map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("losetup: {}", text(&out.stderr)));
        }
        let device = text(&out.stdout).trim().to_string();
        let guard = LoopVg { image, device: device.clone(), vg: vg.to_string() };
        let out = Command::new("vgcreate")
            .args(["--config", NO_UDEV, vg, &device])
            .env("DM_DISABLE_UDEV", "1")
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!("vgcreate: {}", text(&out.stderr)));
        }
        Ok(guard)
    }
}

impl Drop for LoopVg {
    fn drop(&mut self) {
        let _ = Command::new("vgremove")
            .args(["--config", NO_UDEV, "-f", &self.vg])
            .env("DM_DISABLE_UDEV", "1")
            .output();
        let _ = Command::new("losetup").args(["-d", &self.device]).output();
        let _ = std::fs::remove_file(&self.image);
    }
}

fn lvm_available() -> Result<(), String> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err("not root".into());
    }
    for tool in ["vgcreate", "vgs", "losetup"] {
        let found = Command::new("sh").args(["-c", &format!("command -v {tool}")]).output();
        if !found.map(|o| o.status.success()).unwrap_or(false) {
            return Err(format!("{tool} is not installed (apt-get install lvm2)"));
        }
    }
    Ok(())
}

#[test]
fn prepare_generates_from_a_real_volume_group_and_never_replaces_a_users_file() {
    if let Err(why) = lvm_available() {
        eprintln!("skipping: {why}");
        return;
    }
    let scratch = kvol_test_support::ScratchRoot::new();
    let vg_name = format!("kvolcli{}", std::process::id());
    let vg = match LoopVg::create(scratch.path(), &vg_name) {
        Ok(vg) => vg,
        Err(why) => {
            eprintln!("skipping: cannot make a loop-device volume group here: {why}");
            return;
        }
    };
    let path = scratch.path().join("etc/lvmd.yaml");
    let out = kvol_lvm(&path, &["--prepare", "--volume-group", &vg.vg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let written = std::fs::read_to_string(&path).unwrap();
    assert!(kvol_lvm::generate::is_generated(&written), "{written}");
    let config = kvol_lvm::lvmd::parse(&written).unwrap();
    assert_eq!(config.device_classes[0].volume_group, vg_name);
    assert_eq!(config.device_classes[0].spare_gb, Some(0));
    assert!(config.device_classes[0].default);

    let out = kvol_lvm(&path, &["--prepare", "--volume-group", "kvol-no-such-vg"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("volume group \"kvol-no-such-vg\" is not on this node"),
        "{}",
        text(&out.stderr)
    );

    let mine = format!("device-classes:\n  - name: mine\n    volume-group: {vg_name}\n");
    std::fs::write(&path, &mine).unwrap();
    let out = kvol_lvm(&path, &["--prepare", "--volume-group", &vg.vg]);
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), mine, "a user's file is never replaced");
}
