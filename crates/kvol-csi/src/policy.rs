//! CSIDriver semantics for the gRPC layer: the pure rules of [`kvol_csi_rules::policy`], re-exported, and the volume capability built from them.

pub use kvol_csi_rules::policy::*;

use crate::proto::csi::VolumeCapability;
use crate::proto::csi::volume_capability::{AccessType, BlockVolume, MountVolume};

impl From<kvol_csi_rules::PolicyRefusal> for crate::CsiError {
    fn from(refusal: kvol_csi_rules::PolicyRefusal) -> crate::CsiError {
        crate::CsiError::Policy { driver: refusal.driver, reason: refusal.reason }
    }
}

/// A volume capability: a raw block device, or a filesystem of `fs_type` (empty: the driver's
/// default) mounted with `mount_flags`, whose group is `volume_mount_group` when the driver
/// applies the pod's fsGroup itself.
pub fn volume_capability(
    mode: AccessMode,
    block: bool,
    fs_type: &str,
    mount_flags: &[String],
    volume_mount_group: Option<i64>,
) -> VolumeCapability {
    let access_type = if block {
        AccessType::Block(BlockVolume {})
    } else {
        AccessType::Mount(MountVolume {
            fs_type: fs_type.to_string(),
            mount_flags: mount_flags.to_vec(),
            volume_mount_group: volume_mount_group.map(|g| g.to_string()).unwrap_or_default(),
        })
    };
    let access_mode = crate::proto::csi::volume_capability::AccessMode { mode: mode as i32 };
    VolumeCapability { access_mode: Some(access_mode), access_type: Some(access_type) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::csi::volume_capability::access_mode::Mode;

    fn strings(items: &[&str]) -> Vec<String> {
        items.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn access_modes_are_numbered_as_the_csi_spec() {
        let table = [
            (AccessMode::Unknown, Mode::Unknown),
            (AccessMode::SingleNodeWriter, Mode::SingleNodeWriter),
            (AccessMode::SingleNodeReaderOnly, Mode::SingleNodeReaderOnly),
            (AccessMode::MultiNodeReaderOnly, Mode::MultiNodeReaderOnly),
            (AccessMode::MultiNodeSingleWriter, Mode::MultiNodeSingleWriter),
            (AccessMode::MultiNodeMultiWriter, Mode::MultiNodeMultiWriter),
            (AccessMode::SingleNodeSingleWriter, Mode::SingleNodeSingleWriter),
            (AccessMode::SingleNodeMultiWriter, Mode::SingleNodeMultiWriter),
        ];
        for (ours, theirs) in table {
            assert_eq!(Mode::try_from(ours as i32), Ok(theirs), "{ours:?}");
        }
    }

    #[test]
    fn capabilities_are_block_or_mount_with_flags_and_group() {
        let flags = strings(&["noatime", "discard"]);
        let cap = volume_capability(AccessMode::SingleNodeWriter, false, "xfs", &flags, Some(2000));
        assert_eq!(
            cap.access_mode,
            Some(crate::proto::csi::volume_capability::AccessMode { mode: Mode::SingleNodeWriter as i32 })
        );
        assert_eq!(
            cap.access_type,
            Some(AccessType::Mount(MountVolume {
                fs_type: "xfs".into(),
                mount_flags: flags.clone(),
                volume_mount_group: "2000".into()
            }))
        );
        let cap = volume_capability(AccessMode::MultiNodeReaderOnly, false, "", &[], None);
        assert_eq!(cap.access_type, Some(AccessType::Mount(MountVolume::default())));
        let cap = volume_capability(AccessMode::SingleNodeWriter, true, "ext4", &flags, Some(1));
        assert_eq!(cap.access_type, Some(AccessType::Block(BlockVolume {})), "block ignores mount fields");
    }
}
