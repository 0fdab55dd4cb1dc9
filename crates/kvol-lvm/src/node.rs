//! The LVM driver's CSI Node service: stage formats a logical volume on first use (never one holding data) and mounts it, publish bind-mounts it (or binds its device for raw block), expansion grows the filesystem, statistics from statvfs.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use crate::controller::volume_capability_problem;
use crate::driver::{Core, Shared, internal, lvm_error, required, required_path};
use crate::filesystem::{self, Prepare};
use crate::lvs::LogicalVolume;
use csi::node_service_capability::rpc::Type as Rpc;
use csi::volume_capability::AccessType;
use kvol_csi::proto::csi::{self, node_server::Node};
use kvol_hostpath::controller::is_block;
use kvol_hostpath::node::{effective_read_only, remove_target};
use kvol_hostpath::usage::{block_usage, counters, usage};

/// The node RPCs this driver serves.
pub const NODE_CAPABILITIES: [Rpc; 3] = [Rpc::StageUnstageVolume, Rpc::ExpandVolume, Rpc::GetVolumeStats];

/// What a path holds, seen from a stage or publish of one device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Held {
    /// Nothing is mounted there.
    Nothing,
    /// The volume's device (its filesystem, or the device itself) is mounted there.
    This,
    /// Something else is mounted there.
    Other,
}

/// What to do for a stage or publish on a path holding `held`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MountAction {
    Mount,
    Done,
}

/// Stage or publish of volume `id` on `path` holding `held`: mount, done already (idempotent),
/// or ALREADY_EXISTS when another volume or filesystem is there.
pub fn mount_action(id: &str, path: &Path, held: Held) -> Result<MountAction, Status> {
    match held {
        Held::Nothing => Ok(MountAction::Mount),
        Held::This => Ok(MountAction::Done),
        Held::Other => Err(Status::already_exists(format!(
            "volume {id}: something else is mounted on {}",
            path.display()
        ))),
    }
}

/// Publish of volume `id` on `path` holding `held`, read-only or not (`read_only`), the mount
/// there being read-only or not (`mounted_read_only`): as [`mount_action`], and published
/// already with the other flag is ALREADY_EXISTS, as the CSI spec asks.
pub fn publish_action(
    id: &str,
    path: &Path,
    held: Held,
    mounted_read_only: Option<bool>,
    read_only: bool,
) -> Result<MountAction, Status> {
    let how = |ro: bool| if ro { "read-only" } else { "read-write" };
    match (mount_action(id, path, held)?, mounted_read_only) {
        (MountAction::Done, Some(ro)) if ro != read_only => Err(Status::already_exists(format!(
            "volume {id} is already published {} on {}, not {}",
            how(ro),
            path.display(),
            how(read_only)
        ))),
        (action, _) => Ok(action),
    }
}

/// Whether unstage or unpublish unmounts `path` holding `held`: only this volume's mount, or a
/// mount whose volume is gone (`known` false), is taken down.
pub fn should_unmount(held: Held, known: bool) -> bool {
    match held {
        Held::Nothing => false,
        Held::This => true,
        Held::Other => !known,
    }
}

/// The device number behind `path`: a device node's own, or the filesystem's holding it.
fn device_number(path: &Path) -> Option<u64> {
    let meta = std::fs::metadata(path).ok()?;
    Some(if meta.file_type().is_block_device() { meta.rdev() } else { meta.dev() })
}

impl Core {
    /// What `path` holds relative to `device`.
    fn held(&self, path: &Path, device: Option<&Path>) -> Result<Held, Status> {
        if std::fs::symlink_metadata(path).is_err() || !self.mounter.is_mount_point(path).map_err(internal)? {
            return Ok(Held::Nothing);
        }
        let wanted = device.and_then(|d| std::fs::metadata(d).ok()).map(|m| m.rdev());
        Ok(if wanted.is_some() && device_number(path) == wanted { Held::This } else { Held::Other })
    }

    /// The volume's logical volume and device node (activated when needed).
    async fn device(&self, id: &str) -> Result<(LogicalVolume, PathBuf), Status> {
        let lv = self.get(id).await?;
        let device = self.lvm.device(&lv).await.map_err(|e| lvm_error(id, e))?;
        Ok((lv, device))
    }

    pub async fn stage(
        &self,
        req: csi::NodeStageVolumeRequest,
    ) -> Result<csi::NodeStageVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let staging = required_path(id, &req.staging_target_path, "staging target path")?;
        let cap = capability(id, req.volume_capability.as_ref())?;
        let (_, device) = self.device(id).await?;
        let Some(AccessType::Mount(mount)) = &cap.access_type else {
            // A raw block volume is published straight from its device: nothing to stage.
            return Ok(csi::NodeStageVolumeResponse {});
        };
        let fs = filesystem::fs_type(&mount.fs_type)
            .map_err(|e| Status::invalid_argument(format!("volume {id}: {e}")))?;
        if !mount.mount_flags.is_empty() {
            return Err(Status::invalid_argument(format!(
                "volume {id}: mount flags {:?} are not supported by this driver",
                mount.mount_flags
            )));
        }
        if mount_action(id, &staging, self.held(&staging, Some(&device))?)? == MountAction::Done {
            return Ok(csi::NodeStageVolumeResponse {});
        }
        let timeout = self.lvm.timeout;
        let probe = filesystem::probe(&device, timeout).await.map_err(|e| lvm_error(id, e))?;
        let decision = filesystem::decide(&device, &probe, fs)
            .map_err(|e| Status::failed_precondition(format!("volume {id}: {e}")))?;
        if decision == Prepare::Format {
            filesystem::make(&device, fs, timeout).await.map_err(|e| lvm_error(id, e))?;
            tracing::info!(volume = %id, device = %device.display(), fs, "formatted volume");
        }
        std::fs::create_dir_all(&staging).map_err(|e| {
            Status::internal(format!("volume {id}: cannot create {}: {e}", staging.display()))
        })?;
        self.mounter
            .mount(&device.to_string_lossy(), &staging, fs, false, &[])
            .map_err(|e| Status::internal(format!("volume {id}: {e}")))?;
        tracing::info!(volume = %id, path = %staging.display(), "staged volume");
        Ok(csi::NodeStageVolumeResponse {})
    }

    pub async fn unstage(
        &self,
        req: csi::NodeUnstageVolumeRequest,
    ) -> Result<csi::NodeUnstageVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let staging = required_path(id, &req.staging_target_path, "staging target path")?;
        self.take_down(id, &staging, false).await?;
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    /// Unmounts `path` if it holds volume `id` (or a mount of a volume gone), removing the
    /// target the driver made when `remove`. Nothing mounted there: nothing to ask lvm.
    async fn take_down(&self, id: &str, path: &Path, remove: bool) -> Result<(), Status> {
        let held = match self.held(path, None)? {
            Held::Nothing => Held::Nothing,
            _ => {
                let lv = self.find(id).await?;
                // An inactive volume has no device node, and nothing of it can be mounted.
                let device = lv.as_ref().and_then(crate::lvm::existing_device);
                let held = self.held(path, device.as_deref())?;
                if should_unmount(held, lv.is_some()) {
                    self.mounter.unmount(path).map_err(|e| Status::internal(format!("volume {id}: {e}")))?;
                    tracing::info!(volume = %id, path = %path.display(), "unmounted volume");
                } else {
                    tracing::warn!(volume = %id, path = %path.display(), "another volume is mounted there; left alone");
                    return Ok(());
                }
                held
            }
        };
        if remove {
            remove_target(path).map_err(|e| {
                Status::internal(format!(
                    "volume {id}: cannot remove {} ({held:?} was mounted): {e}",
                    path.display()
                ))
            })?;
        }
        Ok(())
    }

    pub async fn publish(
        &self,
        req: csi::NodePublishVolumeRequest,
    ) -> Result<csi::NodePublishVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let target = required_path(id, &req.target_path, "target path")?;
        let cap = capability(id, req.volume_capability.as_ref())?;
        let read_only = effective_read_only(req.readonly, cap);
        let (_, device) = self.device(id).await?;
        let held = self.held(&target, Some(&device))?;
        let mounted_read_only = match held {
            Held::This => self
                .mounter
                .mount_points()
                .map_err(internal)?
                .into_iter()
                .rfind(|m| m.target == target)
                .map(|m| m.read_only()),
            _ => None,
        };
        if publish_action(id, &target, held, mounted_read_only, read_only)? == MountAction::Done {
            return Ok(csi::NodePublishVolumeResponse {});
        }
        if is_block(cap) {
            return self.publish_block(id, &device, &target, read_only);
        }
        let staging = required_path(id, &req.staging_target_path, "staging target path")
            .map_err(|s| Status::failed_precondition(s.message().to_string()))?;
        if self.held(&staging, Some(&device))? != Held::This {
            return Err(Status::failed_precondition(format!(
                "volume {id} is not staged on {}",
                staging.display()
            )));
        }
        std::fs::create_dir_all(&target)
            .map_err(|e| Status::internal(format!("volume {id}: cannot create {}: {e}", target.display())))?;
        self.mounter
            .bind(&staging, &target, read_only)
            .map_err(|e| Status::internal(format!("volume {id}: {e}")))?;
        tracing::info!(volume = %id, path = %target.display(), read_only, "published volume");
        Ok(csi::NodePublishVolumeResponse {})
    }

    /// Binds the device node onto `target`, a file made for it.
    fn publish_block(
        &self,
        id: &str,
        device: &Path,
        target: &Path,
        read_only: bool,
    ) -> Result<csi::NodePublishVolumeResponse, Status> {
        if let Some(dir) = target.parent() {
            std::fs::create_dir_all(dir).map_err(|e| {
                Status::internal(format!("volume {id}: cannot create {}: {e}", dir.display()))
            })?;
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(target)
            .map_err(|e| Status::internal(format!("volume {id}: cannot create {}: {e}", target.display())))?;
        if let Err(e) = self.mounter.bind(device, target, read_only) {
            let _ = remove_target(target);
            return Err(Status::internal(format!("volume {id}: {e}")));
        }
        tracing::info!(volume = %id, path = %target.display(), device = %device.display(), "published block volume");
        Ok(csi::NodePublishVolumeResponse {})
    }

    pub async fn unpublish(
        &self,
        req: csi::NodeUnpublishVolumeRequest,
    ) -> Result<csi::NodeUnpublishVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let target = required_path(id, &req.target_path, "target path")?;
        self.take_down(id, &target, true).await?;
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    /// Checks that `path` (relative paths are not volume paths) exists and holds volume
    /// `id`'s device; NOT_FOUND for a volume that does not exist, before anything else.
    async fn on_path(&self, id: &str, path: &str) -> Result<(LogicalVolume, PathBuf, PathBuf, bool), Status> {
        let lv = self.get(id).await?;
        let path =
            required_path(id, path, "volume path").map_err(|s| Status::not_found(s.message().to_string()))?;
        let device = crate::lvm::existing_device(&lv).ok_or_else(|| {
            Status::not_found(format!("volume {id} is not active, so not on {}", path.display()))
        })?;
        let meta = std::fs::metadata(&path)
            .map_err(|e| Status::not_found(format!("volume {id}: {}: {e}", path.display())))?;
        let wanted = std::fs::metadata(&device).map(|m| m.rdev()).ok();
        if device_number(&path) != wanted {
            return Err(Status::not_found(format!("volume {id} is not mounted on {}", path.display())));
        }
        Ok((lv, device, path, meta.file_type().is_block_device()))
    }

    pub async fn stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        required(&req.volume_path, "volume path").map_err(|s| with_id(id, s))?;
        let (lv, _, path, block) = self.on_path(id, &req.volume_path).await?;
        let usage = if block { block_usage(lv.size as i64) } else { usage(counters(&path)?) };
        Ok(csi::NodeGetVolumeStatsResponse { usage, volume_condition: None })
    }

    pub async fn node_expand(
        &self,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        required(&req.volume_path, "volume path").map_err(|s| with_id(id, s))?;
        let (lv, device, path, block) = self.on_path(id, &req.volume_path).await?;
        if !block && !req.volume_capability.as_ref().is_some_and(is_block) {
            let timeout = self.lvm.timeout;
            let probe = filesystem::probe(&device, timeout).await.map_err(|e| lvm_error(id, e))?;
            let fs = probe.kind.ok_or_else(|| {
                Status::failed_precondition(format!("volume {id}: {} holds no filesystem", device.display()))
            })?;
            filesystem::grow(&fs, &device, &path, timeout).await.map_err(|e| lvm_error(id, e))?;
            tracing::info!(volume = %id, path = %path.display(), fs, size = lv.size, "grew filesystem");
        }
        Ok(csi::NodeExpandVolumeResponse { capacity_bytes: lv.size as i64 })
    }
}

fn with_id(id: &str, status: Status) -> Status {
    Status::new(status.code(), format!("volume {id}: {}", status.message()))
}

fn capability<'a>(
    id: &str,
    cap: Option<&'a csi::VolumeCapability>,
) -> Result<&'a csi::VolumeCapability, Status> {
    let cap =
        cap.ok_or_else(|| Status::invalid_argument(format!("volume {id}: volume capability is missing")))?;
    match volume_capability_problem(cap) {
        Some(problem) => Err(Status::invalid_argument(format!("volume {id}: {problem}"))),
        None => Ok(cap),
    }
}

/// The Node service.
#[derive(Debug, Clone)]
pub struct NodeService {
    pub(crate) core: Shared,
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        r: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.core.lock().await.stage(r.into_inner()).await.map(Response::new)
    }
    async fn node_unstage_volume(
        &self,
        r: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.core.lock().await.unstage(r.into_inner()).await.map(Response::new)
    }
    async fn node_publish_volume(
        &self,
        r: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.core.lock().await.publish(r.into_inner()).await.map(Response::new)
    }
    async fn node_unpublish_volume(
        &self,
        r: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.core.lock().await.unpublish(r.into_inner()).await.map(Response::new)
    }
    async fn node_get_volume_stats(
        &self,
        r: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        self.core.lock().await.stats(r.into_inner()).await.map(Response::new)
    }
    async fn node_expand_volume(
        &self,
        r: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        self.core.lock().await.node_expand(r.into_inner()).await.map(Response::new)
    }
    async fn node_get_capabilities(
        &self,
        _: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc as RpcCap, Type};
        let capabilities = NODE_CAPABILITIES
            .iter()
            .map(|t| csi::NodeServiceCapability { r#type: Some(Type::Rpc(RpcCap { r#type: *t as i32 })) })
            .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }
    async fn node_get_info(
        &self,
        _: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let core = self.core.lock().await;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: core.config.node_name.clone(),
            max_volumes_per_node: 0,
            accessible_topology: Some(core.topology()),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn paths_are_mounted_once_and_never_over_another_volume() {
        let path = Path::new("/staging/v");
        let rows = [
            (Held::Nothing, Ok(MountAction::Mount)),
            (Held::This, Ok(MountAction::Done)),
            (
                Held::Other,
                Err((Code::AlreadyExists, "volume vol-1: something else is mounted on /staging/v")),
            ),
        ];
        for (held, want) in rows {
            let got = mount_action("vol-1", path, held).map_err(|s| (s.code(), s.message().to_string()));
            assert_eq!(got, want.map_err(|(c, m)| (c, m.to_string())), "{held:?}");
        }
    }

    #[test]
    fn a_publication_is_done_only_with_the_same_flag() {
        let path = Path::new("/pods/p/mount");
        let rows = [
            (Held::Nothing, None, false, Ok(MountAction::Mount)),
            (Held::This, Some(false), false, Ok(MountAction::Done)),
            (Held::This, Some(true), true, Ok(MountAction::Done)),
            (Held::This, None, true, Ok(MountAction::Done)),
            (
                Held::This,
                Some(false),
                true,
                Err((
                    Code::AlreadyExists,
                    "volume v is already published read-write on /pods/p/mount, not read-only",
                )),
            ),
            (
                Held::Other,
                None,
                false,
                Err((Code::AlreadyExists, "volume v: something else is mounted on /pods/p/mount")),
            ),
        ];
        for (held, mounted, read_only, want) in rows {
            let got = publish_action("v", path, held, mounted, read_only)
                .map_err(|s| (s.code(), s.message().to_string()));
            assert_eq!(got, want.map_err(|(c, m)| (c, m.to_string())), "{held:?} {mounted:?} {read_only}");
        }
    }

    #[test]
    fn only_the_volumes_own_mounts_are_taken_down() {
        let rows = [
            (Held::Nothing, true, false),
            (Held::Nothing, false, false),
            (Held::This, true, true),
            (Held::Other, true, false),
            (Held::Other, false, true),
        ];
        for (held, known, want) in rows {
            assert_eq!(should_unmount(held, known), want, "{held:?} known={known}");
        }
    }
}
