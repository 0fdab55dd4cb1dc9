//! The Flexvolume protocol's vocabulary: the commands drivers receive and the reply they print (upstream's `DriverStatus`, with `init`'s capabilities).

use std::fmt;

use serde::Serialize;

/// The Flexvolume commands, spelled as drivers receive them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Command {
    Init,
    Attach,
    Detach,
    WaitForAttach,
    IsAttached,
    MountDevice,
    UnmountDevice,
    Mount,
    Unmount,
    GetVolumeName,
    ExpandVolume,
    ExpandFs,
}

impl Command {
    /// Every command.
    pub const ALL: [Command; 12] = [
        Command::Init,
        Command::Attach,
        Command::Detach,
        Command::WaitForAttach,
        Command::IsAttached,
        Command::MountDevice,
        Command::UnmountDevice,
        Command::Mount,
        Command::Unmount,
        Command::GetVolumeName,
        Command::ExpandVolume,
        Command::ExpandFs,
    ];

    pub const fn as_str(self) -> &'static str {
        match self {
            Command::Init => "init",
            Command::Attach => "attach",
            Command::Detach => "detach",
            Command::WaitForAttach => "waitforattach",
            Command::IsAttached => "isattached",
            Command::MountDevice => "mountdevice",
            Command::UnmountDevice => "unmountdevice",
            Command::Mount => "mount",
            Command::Unmount => "unmount",
            Command::GetVolumeName => "getvolumename",
            Command::ExpandVolume => "expandvolume",
            Command::ExpandFs => "expandfs",
        }
    }
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What `init` says a driver can do; absent keys keep upstream's defaults.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DriverCapabilities {
    pub attach: bool,
    pub selinux_relabel: bool,
    pub supports_metrics: bool,
    pub fs_group: bool,
    #[serde(rename = "requiresFSResize")]
    pub requires_fs_resize: bool,
}

impl Default for DriverCapabilities {
    fn default() -> Self {
        DriverCapabilities {
            attach: true,
            selinux_relabel: true,
            supports_metrics: false,
            fs_group: true,
            requires_fs_resize: true,
        }
    }
}

/// A driver's reply to one command (upstream's `DriverStatus`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriverStatus {
    pub status: String,
    pub message: String,
    pub device: String,
    pub volume_name: String,
    pub attached: bool,
    pub capabilities: DriverCapabilities,
}
