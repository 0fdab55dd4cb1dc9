//! The cases' bodies: each drives the node ([`crate::node::Node`]) the way upstream's test drives a cluster and checks what a container would see, through the published path on the host.

mod disruptive;
mod ephemeral;
mod expansion;
mod provisioning;
mod subpath;
mod volume_mode;
mod volumes;

use crate::cases::CaseId;
use crate::definition::DriverDefinition;
use crate::driver::Driver;
use crate::node::Node;
use crate::report::Failure;

/// What a case has to work with.
#[derive(Debug)]
pub struct Ctx<'a> {
    pub node: &'a Node,
    pub driver: &'a mut Driver,
    pub definition: &'a DriverDefinition,
    /// The size the cases' claims ask for, in bytes.
    pub size: u64,
    /// Real containers, when runc and a static busybox were given.
    pub containers: Option<&'a crate::container::Runtime>,
}

/// How a case that did not fail ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum End {
    Passed,
    /// Found out only while running (e.g. the definition's inline volumes are all read-only).
    Skipped(String),
}

pub type CaseOutcome = Result<End, Failure>;

/// Runs one case's body (cleaning up is the caller's).
pub async fn run(id: CaseId, ctx: &mut Ctx<'_>) -> CaseOutcome {
    match id {
        CaseId::ProvisionDefaults => provisioning::defaults(ctx, false).await,
        CaseId::ProvisionMountOptions => provisioning::defaults(ctx, true).await,
        CaseId::ProvisionFromSnapshot => provisioning::from_snapshot(ctx).await,
        CaseId::ProvisionFromClaim => provisioning::from_claim(ctx).await,
        CaseId::Snapshottable => provisioning::snapshottable(ctx).await,
        CaseId::VolumesStoreData => volumes::store_data(ctx).await,
        CaseId::VolumesExec => volumes::exec(ctx).await,
        CaseId::BlockStoreData => volumes::block_store_data(ctx).await,
        CaseId::VolumeModeBlockAsFilesystem => volume_mode::block_as_filesystem(ctx).await,
        CaseId::VolumeModeFilesystemAsBlock => volume_mode::filesystem_as_block(ctx).await,
        CaseId::FsGroupAlways => volumes::fs_group_always(ctx).await,
        CaseId::FsGroupOnRootMismatch => volumes::fs_group_on_root_mismatch(ctx).await,
        CaseId::VolumeIo => volumes::volume_io(ctx).await,
        CaseId::SubPathNonExistent => subpath::non_existent(ctx).await,
        CaseId::SubPathExistingDirectory => subpath::existing_directory(ctx).await,
        CaseId::SubPathFile => subpath::file(ctx).await,
        CaseId::SubPathSymlinkOutside => subpath::symlink_outside(ctx).await,
        CaseId::SubPathBackstepping => subpath::backstepping(ctx).await,
        CaseId::MultiVolumeTwoVolumes => volumes::two_volumes(ctx).await,
        CaseId::MultiVolumeSameVolumeTwoPods => volumes::same_volume_two_pods(ctx).await,
        CaseId::MultiVolumeReadOnly => volumes::read_only(ctx).await,
        CaseId::ExpandOffline => expansion::offline(ctx).await,
        CaseId::ExpandOnline => expansion::online(ctx).await,
        CaseId::EphemeralReadWrite => ephemeral::read_write(ctx).await,
        CaseId::EphemeralReadOnly => ephemeral::read_only(ctx).await,
        CaseId::EphemeralTwoPods => ephemeral::two_pods(ctx).await,
        CaseId::EphemeralMultiple => ephemeral::multiple(ctx).await,
        CaseId::GenericEphemeralReadWrite => ephemeral::generic_read_write(ctx).await,
        CaseId::VolumeStats => volumes::stats(ctx).await,
        CaseId::DriverRestartBetweenStageAndPublish => {
            disruptive::restart_between_stage_and_publish(ctx).await
        }
    }
}
