//! Growing a mounted filesystem to fill its grown device, as kubelet's generic resize does it for plugins that ask for a resize and do not do it: the filesystem `blkid` finds on the device, then `resize2fs` (ext2/3/4, on the device) or `xfs_growfs` (xfs, on a mount point).

use std::ffi::OsString;
use std::path::Path;
use std::time::Duration;

/// The command that grows filesystem `fs` on `device`, mounted at `mount_path`, to fill the
/// device; kubelet's resizer grows ext2/3/4 and xfs and nothing else. Pure.
pub fn grow_command(
    fs: &str,
    device: &Path,
    mount_path: &Path,
) -> Result<(&'static str, Vec<OsString>), String> {
    match fs {
        "ext2" | "ext3" | "ext4" => Ok(("resize2fs", vec![device.as_os_str().to_owned()])),
        "xfs" => Ok(("xfs_growfs", vec!["-d".into(), mount_path.as_os_str().to_owned()])),
        "" => Err(format!("{} holds no filesystem to grow", device.display())),
        other => Err(format!(
            "{} holds {other}, which cannot be grown on the node (ext2, ext3, ext4 and xfs can)",
            device.display()
        )),
    }
}

/// The filesystem type in `blkid -p -s TYPE -o value` output (empty: none found).
pub fn blkid_type(output: &str) -> String {
    output.lines().next().unwrap_or_default().trim().to_string()
}

/// Grows the filesystem on `device`, mounted at `mount_path`, to fill the device: the
/// filesystem found by `blkid`, then [`grow_command`]; each tool is given `deadline`.
pub async fn grow_mounted(device: &Path, mount_path: &Path, deadline: Duration) -> Result<(), String> {
    let probe = ["-p", "-s", "TYPE", "-o", "value"].map(OsString::from);
    let found = run("blkid", &[&probe[..], &[device.as_os_str().to_owned()]].concat(), deadline).await;
    // blkid exits 2 when the device holds nothing it knows.
    let fs = match found {
        Ok(output) => blkid_type(&output),
        Err(Failure::Exited(2, _)) => String::new(),
        Err(e) => return Err(e.describe("blkid", device)),
    };
    let (program, args) = grow_command(&fs, device, mount_path)?;
    tracing::info!(device = %device.display(), mount = %mount_path.display(), fs, program, "growing the filesystem");
    run(program, &args, deadline).await.map(drop).map_err(|e| e.describe(program, device))
}

/// How a tool failed.
enum Failure {
    Exited(i32, String),
    Other(String),
}

impl Failure {
    fn describe(&self, program: &str, device: &Path) -> String {
        match self {
            Failure::Exited(code, output) => {
                format!("{program} on {} exited with {code}: {}", device.display(), output.trim())
            }
            Failure::Other(e) => format!("{program} on {}: {e}", device.display()),
        }
    }
}

/// Runs `program` with `args` to completion within `deadline` (killed past it); its stdout, or
/// how it failed with its output.
async fn run(program: &str, args: &[OsString], deadline: Duration) -> Result<String, Failure> {
    let child = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output();
    let output = match tokio::time::timeout(deadline, child).await {
        Ok(Ok(output)) => output,
        Ok(Err(e)) => return Err(Failure::Other(format!("cannot run it: {e}"))),
        Err(_) => return Err(Failure::Other(format!("did not finish within {deadline:?}; killed"))),
    };
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    match output.status.code() {
        Some(0) => Ok(stdout),
        Some(code) => {
            Err(Failure::Exited(code, format!("{stdout}{}", String::from_utf8_lossy(&output.stderr))))
        }
        None => Err(Failure::Other("killed by a signal".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ext_and_xfs_grow_and_nothing_else_does() {
        let (device, mount) = (Path::new("/dev/loop7"), Path::new("/mnt/v"));
        // (fs, the command, or the start of the refusal)
        let cases = [
            ("ext4", Ok("resize2fs /dev/loop7")),
            ("ext3", Ok("resize2fs /dev/loop7")),
            ("ext2", Ok("resize2fs /dev/loop7")),
            ("xfs", Ok("xfs_growfs -d /mnt/v")),
            ("", Err("/dev/loop7 holds no filesystem to grow")),
            ("btrfs", Err("/dev/loop7 holds btrfs, which cannot be grown")),
        ];
        for (fs, want) in cases {
            let got = grow_command(fs, device, mount).map(|(p, args)| {
                std::iter::once(p.to_string())
                    .chain(args.iter().map(|a| a.to_string_lossy().into_owned()))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            match (got, want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{fs}"),
                (Err(got), Err(want)) => assert!(got.starts_with(want), "{fs}: {got}"),
                (got, want) => panic!("{fs}: {got:?}, want {want:?}"),
            }
        }
        assert_eq!(blkid_type("xfs\n"), "xfs");
        assert_eq!(blkid_type(""), "");
    }
}
