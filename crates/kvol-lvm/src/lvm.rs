//! The lvm2 operations the driver makes — list, create (thick, thin, thin snapshot), extend, activate, remove — each one bounded command, udev-free, tags set by the command that creates.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::command::{self, CommandError, NO_UDEV_CONFIG};
use crate::lvs::{self, LVS_FIELDS, LogicalVolume, REPORT_CONFIG, VG_DETAIL_FIELDS, VgDetail};
use crate::naming::DRIVER_TAG;

/// Runs lvm2's tools with a deadline per call.
#[derive(Debug, Clone)]
pub struct Lvm {
    pub timeout: Duration,
}

/// How a new logical volume is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NewLv<'a> {
    /// `lvcreate -L`: extents of the volume group, with the class's stripes and options.
    Thick { vg: &'a str, size: u64, stripe: Option<u32>, stripe_size: &'a str, options: &'a [String] },
    /// `lvcreate -V --thinpool`: a thin volume of `size` virtual bytes.
    Thin { vg: &'a str, pool: &'a str, size: u64, options: &'a [String] },
    /// `lvcreate -s` of a thin volume or snapshot; `active` clears the activation-skip flag
    /// (a volume) or keeps it (a snapshot, never mounted).
    ThinSnapshot { vg: &'a str, origin: &'a str, active: bool },
}

/// The `lvcreate` arguments that make `name` as `how` with `tags` (pure).
pub fn lvcreate_args(name: &str, how: &NewLv, tags: &[String]) -> Vec<String> {
    let mut args: Vec<String> =
        vec!["--config".into(), NO_UDEV_CONFIG.into(), "-y".into(), "-n".into(), name.into()];
    for tag in tags {
        args.extend(["--addtag".into(), tag.clone()]);
    }
    match how {
        NewLv::Thick { vg, size, stripe, stripe_size, options } => {
            args.extend(["-W".into(), "y".into(), "-L".into(), format!("{size}b")]);
            if let Some(stripes) = stripe {
                args.extend(["-i".into(), stripes.to_string()]);
            }
            if !stripe_size.is_empty() {
                args.extend(["-I".into(), stripe_size.to_string()]);
            }
            args.extend(options.iter().cloned());
            args.push(vg.to_string());
        }
        NewLv::Thin { vg, pool, size, options } => {
            args.extend(["-V".into(), format!("{size}b"), "--thinpool".into(), pool.to_string()]);
            args.extend(options.iter().cloned());
            args.push(vg.to_string());
        }
        NewLv::ThinSnapshot { vg, origin, active } => {
            args.extend(["-s".into(), "-k".into(), if *active { "n" } else { "y" }.into()]);
            args.push(format!("{vg}/{origin}"));
        }
    }
    args
}

impl Lvm {
    pub fn new(timeout: Duration) -> Lvm {
        Lvm { timeout }
    }

    async fn run(&self, tool: &str, args: &[String]) -> Result<String, CommandError> {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        command::run(tool, &args, self.timeout).await
    }

    async fn report(&self, tool: &str, fields: &str, select: &[&str]) -> Result<String, CommandError> {
        let config = format!("{NO_UDEV_CONFIG} {REPORT_CONFIG}");
        let mut args: Vec<String> =
            ["--config", &config, "--reportformat", "json", "--units", "b", "--nosuffix", "-o", fields]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(select.iter().map(|s| s.to_string()));
        self.run(tool, &args).await
    }

    fn parsed<T>(tool: &str, result: Result<T, lvs::ReportError>) -> Result<T, CommandError> {
        result.map_err(|e| CommandError::Failed {
            command: tool.into(),
            status: "bad output".into(),
            stderr: e.to_string(),
        })
    }

    /// Every logical volume carrying driver `driver`'s tag, in any volume group.
    pub async fn owned(&self, driver: &str) -> Result<Vec<LogicalVolume>, CommandError> {
        let out = self.report("lvs", LVS_FIELDS, &[&format!("@{DRIVER_TAG}{driver}")]).await?;
        Self::parsed("lvs", lvs::parse_lvs(&out))
    }

    /// Every logical volume of volume group `vg` (thin pools included).
    pub async fn in_group(&self, vg: &str) -> Result<Vec<LogicalVolume>, CommandError> {
        let out = self.report("lvs", LVS_FIELDS, &[vg]).await?;
        Self::parsed("lvs", lvs::parse_lvs(&out))
    }

    /// Volume group `vg`'s size, free space and extent size.
    pub async fn group(&self, vg: &str) -> Result<VgDetail, CommandError> {
        let out = self.report("vgs", VG_DETAIL_FIELDS, &[vg]).await?;
        let groups = Self::parsed("vgs", lvs::parse_vg_details(&out))?;
        groups.into_iter().find(|g| g.name == vg).ok_or_else(|| CommandError::Failed {
            command: format!("vgs {vg}"),
            status: "no such volume group".into(),
            stderr: format!("volume group {vg} is not on this node"),
        })
    }

    /// Makes logical volume `name` as `how`, with `tags` set in the same metadata commit.
    pub async fn create(&self, name: &str, how: &NewLv<'_>, tags: &[String]) -> Result<(), CommandError> {
        self.run("lvcreate", &lvcreate_args(name, how, tags)).await.map(drop)
    }

    /// Grows `vg/lv` to `size` bytes.
    pub async fn extend(&self, lv: &LogicalVolume, size: u64) -> Result<(), CommandError> {
        let args = ["--config", NO_UDEV_CONFIG, "-L", &format!("{size}b"), &lv.full_name()].map(String::from);
        self.run("lvextend", &args).await.map(drop)
    }

    /// Activates `vg/lv`, even when it is flagged to be skipped.
    pub async fn activate(&self, lv: &LogicalVolume) -> Result<(), CommandError> {
        let args = ["--config", NO_UDEV_CONFIG, "-a", "y", "-K", &lv.full_name()].map(String::from);
        self.run("lvchange", &args).await.map(drop)
    }

    /// Removes `vg/lv`.
    pub async fn remove(&self, lv: &LogicalVolume) -> Result<(), CommandError> {
        let args = ["--config", NO_UDEV_CONFIG, "-y", "-f", &lv.full_name()].map(String::from);
        self.run("lvremove", &args).await.map(drop)
    }

    /// Makes the device nodes of `vg/lv` (where nothing else does, as without udev).
    pub async fn make_nodes(&self, lv: &LogicalVolume) -> Result<(), CommandError> {
        let args = ["--config", NO_UDEV_CONFIG, &lv.vg].map(String::from);
        self.run("vgmknodes", &args).await.map(drop)
    }

    /// The device node of an active `lv`: `/dev/<vg>/<lv>` or its device-mapper path,
    /// activating it and making its nodes when neither is there.
    pub async fn device(&self, lv: &LogicalVolume) -> Result<PathBuf, CommandError> {
        if let Some(path) = existing_device(lv) {
            return Ok(path);
        }
        if !lv.is_active() {
            self.activate(lv).await?;
        }
        if let Some(path) = existing_device(lv) {
            return Ok(path);
        }
        self.make_nodes(lv).await?;
        existing_device(lv).ok_or_else(|| CommandError::Failed {
            command: format!("vgmknodes {}", lv.vg),
            status: "no device node".into(),
            stderr: format!(
                "logical volume {} has no device node at {} or {} (is device-mapper in the kernel?)",
                lv.full_name(),
                lv.device_path().display(),
                lv.mapper_path().display()
            ),
        })
    }
}

/// The device node of `lv` if it has one now (`/dev/<vg>/<lv>`, else its device-mapper path).
pub fn existing_device(lv: &LogicalVolume) -> Option<PathBuf> {
    [lv.device_path(), lv.mapper_path()].into_iter().find(|p| is_block_device(p))
}

/// Whether `path` is (or links to) a block device.
pub fn is_block_device(path: &Path) -> bool {
    use std::os::unix::fs::FileTypeExt;
    std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lvcreate_arguments_per_kind() {
        let tags = ["kvol.driver=d".to_string()];
        let opts = ["--type=raid1".to_string()];
        let rows: Vec<(NewLv, &str)> = vec![
            (
                NewLv::Thick { vg: "vg0", size: 8 << 20, stripe: None, stripe_size: "", options: &[] },
                "-y -n v --addtag kvol.driver=d -W y -L 8388608b vg0",
            ),
            (
                NewLv::Thick { vg: "vg0", size: 4096, stripe: Some(2), stripe_size: "64k", options: &opts },
                "-y -n v --addtag kvol.driver=d -W y -L 4096b -i 2 -I 64k --type=raid1 vg0",
            ),
            (
                NewLv::Thin { vg: "vg0", pool: "pool", size: 1 << 30, options: &[] },
                "-y -n v --addtag kvol.driver=d -V 1073741824b --thinpool pool vg0",
            ),
            (
                NewLv::ThinSnapshot { vg: "vg0", origin: "vol-1", active: false },
                "-y -n v --addtag kvol.driver=d -s -k y vg0/vol-1",
            ),
            (
                NewLv::ThinSnapshot { vg: "vg0", origin: "snap-1", active: true },
                "-y -n v --addtag kvol.driver=d -s -k n vg0/snap-1",
            ),
        ];
        for (how, want) in rows {
            let args = lvcreate_args("v", &how, &tags);
            assert_eq!(&args[..2], ["--config", NO_UDEV_CONFIG], "{how:?}");
            assert_eq!(args[2..].join(" "), want, "{how:?}");
        }
    }
}
