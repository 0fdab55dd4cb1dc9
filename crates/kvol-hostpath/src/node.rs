//! The hostpath driver's CSI Node service: stage and publish as bind mounts through the mount seam, ephemeral inline volumes, volume statistics.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tonic::{Request, Response, Status};

use crate::EPHEMERAL_CONTEXT_KEY;
use crate::controller::{access_type_problem, capability_problem, fs_type_problem};
use crate::driver::{Hostpath, Shared, internal, required, required_path};
use crate::fsutil;
use crate::loopfs::{self, FsType};
use crate::state::{Publication, VolumeRecord};
use crate::usage::{block_usage, counters, usage, volume_usage};
use csi::node_service_capability::rpc::Type as Rpc;
use csi::volume_capability::access_mode::Mode;
use kvol_csi::proto::csi::{self, node_server::Node};

/// The node RPCs this driver serves.
pub const NODE_CAPABILITIES: [Rpc; 4] =
    [Rpc::StageUnstageVolume, Rpc::GetVolumeStats, Rpc::ExpandVolume, Rpc::VolumeCondition];

/// What to do for a stage or publish request on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MountAction {
    /// The volume is already mounted there as asked: nothing to do (idempotent).
    Done,
    /// Record the path and mount.
    Mount,
}

/// What to do for an unstage or unpublish request on a path.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UnmountAction {
    /// The path is not this volume's: leave it alone and succeed (idempotent).
    Nothing,
    /// The volume's record of the path outlived its mount: drop the record.
    Forget,
    /// Unmount, then drop the record.
    Unmount,
}

/// Stage decision for volume `id` on `path`, given the volume recorded there (`owner`) and
/// whether anything is mounted there.
pub fn stage_action(
    id: &str,
    path: &Path,
    owner: Option<&str>,
    mounted: bool,
) -> Result<MountAction, Status> {
    match (owner, mounted) {
        (Some(o), true) if o == id => Ok(MountAction::Done),
        (Some(o), false) if o == id => Ok(MountAction::Mount),
        (Some(other), _) => Err(Status::already_exists(format!(
            "volume {id}: staging path {} already holds volume {other}",
            path.display()
        ))),
        (None, true) => Err(Status::already_exists(format!(
            "volume {id}: something this driver did not stage is mounted on {}",
            path.display()
        ))),
        (None, false) => Ok(MountAction::Mount),
    }
}

/// Publish decision for volume `id` on `path` read-only or not, given the volume recorded
/// there and the mount there (`Some(read_only)`), if any. Published with the other flag is
/// ALREADY_EXISTS, as the CSI spec asks.
pub fn publish_action(
    id: &str,
    path: &Path,
    owner: Option<&str>,
    mounted_read_only: Option<bool>,
    read_only: bool,
) -> Result<MountAction, Status> {
    let how = |ro: bool| if ro { "read-only" } else { "read-write" };
    match (owner, mounted_read_only) {
        (Some(o), Some(ro)) if o == id && ro == read_only => Ok(MountAction::Done),
        (Some(o), Some(ro)) if o == id => Err(Status::already_exists(format!(
            "volume {id} is already published {} on {}, not {}",
            how(ro),
            path.display(),
            how(read_only)
        ))),
        (Some(o), None) if o == id => Ok(MountAction::Mount),
        (Some(other), _) => Err(Status::already_exists(format!(
            "volume {id}: target path {} already holds volume {other}",
            path.display()
        ))),
        (None, Some(_)) => Err(Status::already_exists(format!(
            "volume {id}: something this driver did not publish is mounted on {}",
            path.display()
        ))),
        (None, None) => Ok(MountAction::Mount),
    }
}

/// Unstage or unpublish decision for volume `id`, given the volume recorded on the path and
/// whether anything is mounted there. Never unmounts what the volume's records do not name.
pub fn unmount_action(id: &str, owner: Option<&str>, mounted: bool) -> UnmountAction {
    match (owner, mounted) {
        (Some(o), true) if o == id => UnmountAction::Unmount,
        (Some(o), false) if o == id => UnmountAction::Forget,
        _ => UnmountAction::Nothing,
    }
}

/// Whether a publish is read-only: asked for, or implied by a reader-only access mode.
pub fn effective_read_only(readonly: bool, capability: &csi::VolumeCapability) -> bool {
    let mode = capability.access_mode.map(|m| Mode::try_from(m.mode));
    readonly || matches!(mode, Some(Ok(Mode::SingleNodeReaderOnly | Mode::MultiNodeReaderOnly)))
}

/// Whether the volume context marks a CSI ephemeral inline volume.
pub fn is_ephemeral(context: &HashMap<String, String>) -> bool {
    context.get(EPHEMERAL_CONTEXT_KEY).is_some_and(|v| v == "true")
}

/// The size a NodeExpandVolume asking for `range` gives a volume of capacity `capacity` now
/// showing `visible` bytes: the required bytes (the capacity when none are given), never less
/// than it shows. Past the capacity is OUT_OF_RANGE: the controller grows a volume first.
pub fn node_expanded_size(
    capacity: i64,
    visible: i64,
    range: Option<&csi::CapacityRange>,
) -> Result<i64, Status> {
    let required = range.map_or(0, |r| r.required_bytes);
    if required < 0 {
        return Err(Status::invalid_argument(format!("required bytes {required} are negative")));
    }
    let wanted = if required > 0 { required } else { capacity };
    if wanted > capacity {
        return Err(Status::out_of_range(format!(
            "{wanted} bytes are more than the volume's capacity of {capacity} bytes; expand it through the controller first"
        )));
    }
    Ok(wanted.max(visible))
}

fn capability<'a>(
    id: &str,
    cap: Option<&'a csi::VolumeCapability>,
) -> Result<&'a csi::VolumeCapability, Status> {
    let cap =
        cap.ok_or_else(|| Status::invalid_argument(format!("volume {id}: volume capability is missing")))?;
    match capability_problem(cap) {
        Some(problem) => Err(Status::invalid_argument(format!("volume {id}: {problem}"))),
        None => Ok(cap),
    }
}

/// Removes a target the driver made: an empty directory, or the empty file a block volume's
/// device was bound on. Gone already is success; anything holding data stays.
pub fn remove_target(target: &Path) -> std::io::Result<()> {
    let result = match std::fs::symlink_metadata(target) {
        Ok(m) if m.is_file() && m.len() == 0 => std::fs::remove_file(target),
        Ok(_) => std::fs::remove_dir(target),
        Err(e) => Err(e),
    };
    match result {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        other => other,
    }
}

fn with_context(id: &str, status: Status) -> Status {
    Status::new(status.code(), format!("volume {id}: {}", status.message()))
}

/// Where a publish mounts from.
struct PublishSource {
    dir: PathBuf,
    /// The ephemeral volume to create with the publication (not yet recorded).
    new_ephemeral: Option<VolumeRecord>,
}

impl Hostpath {
    fn persistent(&self, id: &str) -> Result<&VolumeRecord, Status> {
        self.state
            .volumes
            .get(id)
            .filter(|v| !v.ephemeral)
            .ok_or_else(|| Status::not_found(format!("volume {id} does not exist")))
    }

    /// Takes on a persistent volume the driver did not create, at its first stage, when
    /// static volumes are served: an empty directory, recorded before anything is mounted.
    fn adopt_if_static(&mut self, id: &str, cap: &csi::VolumeCapability) -> Result<(), Status> {
        if !self.config.static_volumes || self.state.volumes.contains_key(id) {
            return Ok(());
        }
        if let Some(problem) = access_type_problem(false, cap) {
            return Err(Status::invalid_argument(format!(
                "volume {id}: static volumes are filesystem volumes: {problem}"
            )));
        }
        let record = VolumeRecord { adopted: true, ..VolumeRecord::default() };
        let dir = self.layout.volume_dir(id, &record);
        std::fs::create_dir_all(&dir)
            .map_err(|e| Status::internal(format!("volume {id}: cannot create {}: {e}", dir.display())))?;
        let mut next = self.state.clone();
        next.volumes.insert(id.to_string(), record);
        self.commit(next)?;
        tracing::info!(volume = %id, path = %dir.display(), "took on a static volume");
        Ok(())
    }

    pub fn stage_volume(
        &mut self,
        req: csi::NodeStageVolumeRequest,
    ) -> Result<csi::NodeStageVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        log_secret_keys("NodeStageVolume", id, &req.secrets);
        let staging = required_path(&req.staging_target_path, "staging target path")
            .map_err(|s| with_context(id, s))?;
        let cap = capability(id, req.volume_capability.as_ref())?;
        self.adopt_if_static(id, cap)?;
        let record = self.persistent(id)?;
        if let Some(problem) = access_type_problem(record.block, cap) {
            return Err(Status::invalid_argument(format!("volume {id}: {problem}")));
        }
        if self.config.enable_attach
            && record.attached.as_ref().is_none_or(|a| a.node != self.config.node_name)
        {
            return Err(Status::failed_precondition(format!(
                "volume {id} is not attached to node {}: controller publish it first",
                self.config.node_name
            )));
        }
        if let Some(problem) = fs_type_problem(record.fs_type, cap) {
            return Err(Status::invalid_argument(format!("volume {id}: {problem}")));
        }
        if let Some(fs) = record.fs_type {
            return self.stage_loop(id, fs, staging);
        }
        let source = self.layout.volume_dir(id, record);
        if record.block {
            return self.stage_block(id, &source, staging);
        }
        let mounted = self.is_mounted(&staging)?;
        if stage_action(id, &staging, self.state.staged_on(&staging), mounted)? == MountAction::Done {
            return Ok(csi::NodeStageVolumeResponse {});
        }
        // Record first: a crash after the mount leaves a record, which a retry or an unstage
        // completes; never a mount nobody knows of.
        self.record_staged(id, &staging)?;
        let mounted = std::fs::create_dir_all(&staging)
            .map_err(|e| Status::internal(format!("volume {id}: cannot create {}: {e}", staging.display())))
            .and_then(|()| {
                self.mounter.bind(&source, &staging, false).map_err(|e| with_context(id, internal(e)))
            });
        if let Err(e) = mounted {
            let mut next = self.state.clone();
            if let Some(v) = next.volumes.get_mut(id) {
                v.staged.remove(&staging);
            }
            self.commit(next)?;
            return Err(e);
        }
        tracing::info!(volume = %id, path = %staging.display(), "staged volume");
        Ok(csi::NodeStageVolumeResponse {})
    }

    /// Stages a block volume: its image attached to a loop device (the one already holding
    /// it, after a restart), the staging path recorded. Nothing is mounted there.
    fn stage_block(
        &mut self,
        id: &str,
        dir: &Path,
        staging: PathBuf,
    ) -> Result<csi::NodeStageVolumeResponse, Status> {
        if let Some(other) = self.state.staged_on(&staging).filter(|o| *o != id) {
            return Err(Status::already_exists(format!(
                "volume {id}: staging path {} already holds volume {other}",
                staging.display()
            )));
        }
        let device = crate::block::attach(&crate::block::image(dir)).map_err(|e| with_context(id, e))?;
        if !self.state.volumes.get(id).is_some_and(|v| v.staged.contains(&staging)) {
            self.record_staged(id, &staging)?;
        }
        tracing::info!(volume = %id, path = %staging.display(), device = %device.display(), "staged block volume");
        Ok(csi::NodeStageVolumeResponse {})
    }

    /// Stages a loop-backed volume: its image attached to a loop device (the one already
    /// holding it, after a restart), the device mounted on the staging path, the filesystem
    /// grown when it is smaller than the image. Recorded before anything is attached.
    fn stage_loop(
        &mut self,
        id: &str,
        fs: FsType,
        staging: PathBuf,
    ) -> Result<csi::NodeStageVolumeResponse, Status> {
        let mounted = self.is_mounted(&staging)?;
        if stage_action(id, &staging, self.state.staged_on(&staging), mounted)? == MountAction::Done {
            return Ok(csi::NodeStageVolumeResponse {});
        }
        self.record_staged(id, &staging)?;
        let image = self.layout.volume_image(id);
        let shared =
            self.state.volumes.get(id).is_some_and(|v| v.staged.len() > 1 || !v.published.is_empty());
        match self.mount_image(id, fs, &image, &staging, shared) {
            Ok(grown) => {
                if grown {
                    let mut next = self.state.clone();
                    if let Some(v) = next.volumes.get_mut(id) {
                        v.node_size_bytes = v.capacity_bytes;
                    }
                    self.commit(next)?;
                }
                tracing::info!(volume = %id, path = %staging.display(), fs = fs.name(), "staged loop-backed volume");
                Ok(csi::NodeStageVolumeResponse {})
            }
            Err(e) => {
                if !shared && let Err(d) = crate::block::detach(&image) {
                    tracing::warn!(volume = %id, "cannot detach {}: {}", image.display(), d.message());
                }
                let mut next = self.state.clone();
                if let Some(v) = next.volumes.get_mut(id) {
                    v.staged.remove(&staging);
                }
                self.commit(next)?;
                Err(e)
            }
        }
    }

    /// Attaches `image` and mounts its filesystem on `staging`, growing it to the image's size
    /// when the record says it is smaller (true then): ext4 before it is mounted (unless
    /// another staging path has it mounted already), xfs once mounted. A fresh filesystem's root (owned by
    /// root, 0755, holding nothing but `lost+found`) is opened to every pod user (0777), as a
    /// directory volume is.
    fn mount_image(
        &self,
        id: &str,
        fs: FsType,
        image: &Path,
        staging: &Path,
        shared: bool,
    ) -> Result<bool, Status> {
        if !image.exists() {
            return Err(Status::failed_precondition(format!(
                "volume {id}: its image {} is missing",
                image.display()
            )));
        }
        let device = crate::block::attach(image).map_err(|e| with_context(id, e))?;
        std::fs::create_dir_all(staging).map_err(|e| {
            Status::internal(format!("volume {id}: cannot create {}: {e}", staging.display()))
        })?;
        let record = self.persistent(id)?;
        let grow = record.visible_size() < record.capacity_bytes;
        let offline = grow && fs == FsType::Ext4 && !shared && !self.is_mounted(staging)?;
        if offline {
            loopfs::grow_unmounted_ext4(&device).map_err(|e| with_context(id, e))?;
        }
        let source = device.to_string_lossy();
        self.mounter.mount(&source, staging, fs.name(), false, &[]).map_err(|e| {
            Status::internal(format!(
                "volume {id}: cannot mount {source} ({}) on {}: {}",
                image.display(),
                staging.display(),
                e
            ))
        })?;
        // From now on the mount alone holds the device: it is detached with the mount, however
        // that goes. Not marked, it would only outlive a lost mount, so a failure is said, not
        // returned.
        if let Err(e) = crate::block::detach_when_unused(&device) {
            tracing::warn!(volume = %id, device = %device.display(), "{}", e.message());
        }
        let done = open_fresh_root(staging)
            .map_err(|e| Status::internal(format!("volume {id}: cannot open up {}: {e}", staging.display())))
            .and_then(|()| {
                if grow && !offline {
                    loopfs::grow_filesystem(&device, staging, fs).map_err(|e| with_context(id, e))
                } else {
                    Ok(())
                }
            });
        if let Err(e) = done {
            let _ = self.mounter.unmount(staging);
            return Err(e);
        }
        Ok(grow)
    }

    /// Unstages a loop-backed volume: unmounted, its loop device detached once no staging
    /// path is left.
    fn unstage_loop(&mut self, id: &str, staging: PathBuf) -> Result<csi::NodeUnstageVolumeResponse, Status> {
        let mounted = self.is_mounted(&staging)?;
        match unmount_action(id, self.state.staged_on(&staging), mounted) {
            UnmountAction::Nothing => return Ok(csi::NodeUnstageVolumeResponse {}),
            UnmountAction::Unmount => {
                self.mounter.unmount(&staging).map_err(|e| with_context(id, internal(e)))?
            }
            UnmountAction::Forget => {}
        }
        let record = self.persistent(id)?;
        if record.staged.len() == 1 && record.published.is_empty() {
            crate::block::detach(&self.layout.volume_image(id)).map_err(|e| with_context(id, e))?;
        }
        let _ = std::fs::remove_dir(&staging);
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.staged.remove(&staging);
        }
        self.commit(next)?;
        tracing::info!(volume = %id, path = %staging.display(), "unstaged loop-backed volume");
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    /// Unstages a block volume: its loop device detached once no staging path is left.
    fn unstage_block(
        &mut self,
        id: &str,
        staging: PathBuf,
    ) -> Result<csi::NodeUnstageVolumeResponse, Status> {
        let Some(record) = self.state.volumes.get(id) else { return Ok(csi::NodeUnstageVolumeResponse {}) };
        if !record.staged.contains(&staging) {
            return Ok(csi::NodeUnstageVolumeResponse {});
        }
        if record.staged.len() == 1 && record.published.is_empty() {
            let image = crate::block::image(&self.layout.volume_dir(id, record));
            crate::block::detach(&image).map_err(|e| with_context(id, e))?;
        }
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.staged.remove(&staging);
        }
        self.commit(next)?;
        tracing::info!(volume = %id, path = %staging.display(), "unstaged block volume");
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    /// Binds the loop device of a staged block volume onto `target`, a file made for it.
    fn bind_loop_device(&self, id: &str, target: &Path, read_only: bool) -> Result<(), Status> {
        let record = self.persistent(id)?;
        let image = crate::block::image(&self.layout.volume_dir(id, record));
        let device = crate::block::attach(&image).map_err(|e| with_context(id, e))?;
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(target)
            .map_err(|e| Status::internal(format!("volume {id}: cannot create {}: {e}", target.display())))?;
        self.mounter.bind(&device, target, read_only).map_err(|e| with_context(id, internal(e)))
    }

    pub fn unstage_volume(
        &mut self,
        req: csi::NodeUnstageVolumeRequest,
    ) -> Result<csi::NodeUnstageVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let staging = required_path(&req.staging_target_path, "staging target path")
            .map_err(|s| with_context(id, s))?;
        let record = self.persistent(id)?;
        if record.fs_type.is_some() {
            return self.unstage_loop(id, staging);
        }
        if record.block {
            return self.unstage_block(id, staging);
        }
        let mounted = self.is_mounted(&staging)?;
        match unmount_action(id, self.state.staged_on(&staging), mounted) {
            UnmountAction::Nothing => return Ok(csi::NodeUnstageVolumeResponse {}),
            UnmountAction::Unmount => {
                self.mounter.unmount(&staging).map_err(|e| with_context(id, internal(e)))?
            }
            UnmountAction::Forget => {}
        }
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.staged.remove(&staging);
        }
        self.commit(next)?;
        tracing::info!(volume = %id, path = %staging.display(), "unstaged volume");
        Ok(csi::NodeUnstageVolumeResponse {})
    }

    /// The source of a publish: the staging path of a persistent volume (which must be staged
    /// there), or the directory of an ephemeral one (made now if it is new).
    fn publish_source(&self, id: &str, req: &csi::NodePublishVolumeRequest) -> Result<PublishSource, Status> {
        if is_ephemeral(&req.volume_context) {
            return match self.state.volumes.get(id) {
                Some(v) if v.ephemeral => {
                    Ok(PublishSource { dir: self.layout.volume_dir(id, v), new_ephemeral: None })
                }
                Some(_) => Err(Status::invalid_argument(format!(
                    "volume {id} is a persistent volume and cannot be published as an ephemeral one"
                ))),
                None => {
                    let record = VolumeRecord { ephemeral: true, ..VolumeRecord::default() };
                    Ok(PublishSource {
                        dir: self.layout.volume_dir(id, &record),
                        new_ephemeral: Some(record),
                    })
                }
            };
        }
        let record = self.persistent(id)?;
        if req.staging_target_path.is_empty() {
            return Err(Status::failed_precondition(format!(
                "volume {id}: staging target path is missing, and this driver stages volumes"
            )));
        }
        let staging = required_path(&req.staging_target_path, "staging target path")
            .map_err(|s| with_context(id, s))?;
        if !record.staged.contains(&staging) || (!record.block && !self.is_mounted(&staging)?) {
            return Err(Status::failed_precondition(format!(
                "volume {id} is not staged on {}",
                staging.display()
            )));
        }
        Ok(PublishSource { dir: staging, new_ephemeral: None })
    }

    pub fn publish_volume(
        &mut self,
        req: csi::NodePublishVolumeRequest,
    ) -> Result<csi::NodePublishVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        log_secret_keys("NodePublishVolume", id, &req.secrets);
        let target = required_path(&req.target_path, "target path").map_err(|s| with_context(id, s))?;
        let cap = capability(id, req.volume_capability.as_ref())?;
        let read_only = effective_read_only(req.readonly, cap);
        let block = self.state.volumes.get(id).is_some_and(|v| v.block && !v.ephemeral);
        if let Some(problem) = access_type_problem(block, cap) {
            return Err(Status::invalid_argument(format!("volume {id}: {problem}")));
        }
        let source = self.publish_source(id, &req)?;
        let mounted_read_only = self.mount_on(&target)?.map(|m| m.read_only());
        let owner = self.state.published_on(&target).map(|(owner, _)| owner);
        if publish_action(id, &target, owner, mounted_read_only, read_only)? == MountAction::Done {
            return Ok(csi::NodePublishVolumeResponse {});
        }
        let created = source.new_ephemeral.is_some();
        let mut next = self.state.clone();
        if let Some(record) = source.new_ephemeral {
            self.make_dir(&source.dir, None)?;
            next.volumes.insert(id.to_string(), record);
        }
        if let Some(v) = next.volumes.get_mut(id) {
            v.published.insert(target.clone(), Publication { read_only });
        }
        if let Err(e) = self.commit(next) {
            if created {
                let _ = fsutil::remove_tree(&source.dir);
            }
            return Err(e);
        }
        let mounted = if block {
            self.bind_loop_device(id, &target, read_only)
        } else {
            std::fs::create_dir_all(&target)
                .map_err(|e| {
                    Status::internal(format!("volume {id}: cannot create {}: {e}", target.display()))
                })
                .and_then(|()| {
                    self.mounter
                        .bind(&source.dir, &target, read_only)
                        .map_err(|e| with_context(id, internal(e)))
                })
        };
        if let Err(e) = mounted {
            let mut next = self.state.clone();
            if created {
                next.volumes.remove(id);
            } else {
                if let Some(v) = next.volumes.get_mut(id) {
                    v.published.remove(&target);
                }
            }
            self.commit(next)?;
            if created {
                let _ = fsutil::remove_tree(&source.dir);
            }
            let _ = remove_target(&target);
            return Err(e);
        }
        tracing::info!(
            volume = %id,
            path = %target.display(),
            read_only,
            ephemeral = created,
            "published volume"
        );
        Ok(csi::NodePublishVolumeResponse {})
    }

    pub fn unpublish_volume(
        &mut self,
        req: csi::NodeUnpublishVolumeRequest,
    ) -> Result<csi::NodeUnpublishVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let target = required_path(&req.target_path, "target path").map_err(|s| with_context(id, s))?;
        let mounted = self.is_mounted(&target)?;
        match unmount_action(id, self.state.published_on(&target).map(|(owner, _)| owner), mounted) {
            UnmountAction::Nothing => return Ok(csi::NodeUnpublishVolumeResponse {}),
            UnmountAction::Unmount => {
                self.mounter.unmount(&target).map_err(|e| with_context(id, internal(e)))?
            }
            UnmountAction::Forget => {}
        }
        // The driver made the target directory; it removes it. One that is not empty holds
        // data written while nothing was mounted: it is kept, not deleted.
        if let Err(e) = remove_target(&target) {
            tracing::warn!(volume = %id, path = %target.display(), "cannot remove the target: {e}");
        }
        let mut next = self.state.clone();
        let Some(record) = next.volumes.get_mut(id) else { return Ok(csi::NodeUnpublishVolumeResponse {}) };
        record.published.remove(&target);
        if record.ephemeral && record.published.is_empty() {
            let dir = self.layout.volume_dir(id, record);
            // Deleted without reading the mount table (a node running containers has thousands
            // of mounts; a read per teardown costs them all): the removal itself refuses to go
            // through a mount, and finds one without asking its filesystem.
            fsutil::remove_tree_on_its_mount(&dir)
                .map_err(|e| with_context(id, Status::failed_precondition(e.to_string())))?;
            next.volumes.remove(id);
            tracing::info!(volume = %id, "deleted ephemeral volume");
        }
        self.commit(next)?;
        tracing::info!(volume = %id, path = %target.display(), "unpublished volume");
        Ok(csi::NodeUnpublishVolumeResponse {})
    }

    pub fn volume_stats(
        &self,
        req: csi::NodeGetVolumeStatsRequest,
    ) -> Result<csi::NodeGetVolumeStatsResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let path: PathBuf = Path::new(required(&req.volume_path, "volume path")?).components().collect();
        let Some(record) = self.state.volumes.get(id) else {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        };
        if !record.published.contains_key(&path) && !record.staged.contains(&path) {
            return Err(Status::not_found(format!(
                "volume {id} is neither staged nor published on {}",
                path.display()
            )));
        }
        if !self.is_mounted(&path)? {
            return Err(Status::not_found(format!("volume {id} is not mounted on {}", path.display())));
        }
        let volume_condition = Some(self.condition(id, record));
        if record.block {
            return Ok(csi::NodeGetVolumeStatsResponse {
                usage: block_usage(record.visible_size()),
                volume_condition,
            });
        }
        if record.fs_type.is_some() {
            // The volume's own filesystem: its figures are the volume's.
            return Ok(csi::NodeGetVolumeStatsResponse {
                usage: usage(counters(&path).map_err(|e| with_context(id, e))?),
                volume_condition,
            });
        }
        let used = fsutil::disk_usage(&path).map_err(|e| with_context(id, internal(e)))?;
        let usage = volume_usage(counters(&path)?, record.visible_size(), used);
        Ok(csi::NodeGetVolumeStatsResponse { usage, volume_condition })
    }

    /// `VOLUME_CONDITION`: a volume whose data under the driver's state directory is gone
    /// (removed behind the driver's back) is abnormal, and the message says which path.
    fn condition(&self, id: &str, record: &VolumeRecord) -> csi::VolumeCondition {
        let dir = self.layout.volume_dir(id, record);
        let data = if record.fs_type.is_some() {
            self.layout.volume_image(id)
        } else if record.block {
            crate::block::image(&dir)
        } else {
            dir
        };
        match std::fs::symlink_metadata(&data) {
            Ok(_) => {
                csi::VolumeCondition { abnormal: false, message: "the volume's data is in place".into() }
            }
            Err(e) => csi::VolumeCondition {
                abnormal: true,
                message: format!("the data of volume {id} at {} cannot be reached: {e}", data.display()),
            },
        }
    }

    pub fn node_expand(
        &mut self,
        req: csi::NodeExpandVolumeRequest,
    ) -> Result<csi::NodeExpandVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let path = required(&req.volume_path, "volume path").map_err(|s| with_context(id, s))?;
        let record = self.persistent(id)?;
        let path: PathBuf = Path::new(path).components().collect();
        if !record.published.contains_key(&path) && !record.staged.contains(&path) {
            return Err(Status::not_found(format!(
                "volume {id} is neither staged nor published on {}",
                path.display()
            )));
        }
        if let Some(cap) = req.volume_capability.as_ref() {
            capability(id, Some(cap))?;
        }
        let size =
            node_expanded_size(record.capacity_bytes, record.visible_size(), req.capacity_range.as_ref())
                .map_err(|s| with_context(id, s))?;
        if let Some(fs) = record.fs_type {
            return self.node_expand_loop(id, fs, &path);
        }
        if record.block {
            // The loop devices of the image reread its size: the pod's device grows.
            let image = crate::block::image(&self.layout.volume_dir(id, record));
            crate::block::reread_size(&image).map_err(|e| with_context(id, e))?;
        }
        if size != record.visible_size() {
            let mut next = self.state.clone();
            if let Some(v) = next.volumes.get_mut(id) {
                v.node_size_bytes = size;
            }
            self.commit(next)?;
            tracing::info!(volume = %id, size, "expanded volume on the node");
        }
        Ok(csi::NodeExpandVolumeResponse { capacity_bytes: size })
    }
}

impl Hostpath {
    /// Records volume `id` as staged on `staging` (before it is mounted there: a crash after
    /// the mount leaves a record a retry or an unstage completes, never a mount nobody knows of).
    fn record_staged(&mut self, id: &str, staging: &Path) -> Result<(), Status> {
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.staged.insert(staging.to_path_buf());
        }
        self.commit(next)
    }

    /// Grows a loop-backed volume's filesystem online to its image's size: the loop device
    /// rereads the size, then resize2fs (ext4) or xfs_growfs (xfs, on a mount point of it).
    fn node_expand_loop(
        &mut self,
        id: &str,
        fs: FsType,
        path: &Path,
    ) -> Result<csi::NodeExpandVolumeResponse, Status> {
        if !self.is_mounted(path)? {
            return Err(Status::failed_precondition(format!(
                "volume {id} is not mounted on {}",
                path.display()
            )));
        }
        let record = self.persistent(id)?;
        let image = self.layout.volume_image(id);
        let Some(device) =
            crate::block::devices_of(&image).map_err(|e| with_context(id, e))?.into_iter().next()
        else {
            return Err(Status::failed_precondition(format!(
                "volume {id}: its image {} is on no loop device; stage it first",
                image.display()
            )));
        };
        let mount_point = record.staged.iter().next().cloned().unwrap_or_else(|| path.to_path_buf());
        loopfs::grow_filesystem(&device, &mount_point, fs).map_err(|e| with_context(id, e))?;
        let size = loopfs::image_len(&image).map_err(|e| with_context(id, e))?;
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.node_size_bytes = size.max(v.capacity_bytes);
        }
        self.commit(next)?;
        tracing::info!(volume = %id, size, fs = fs.name(), "grew the filesystem on the node");
        Ok(csi::NodeExpandVolumeResponse { capacity_bytes: size })
    }
}

/// Opens a freshly made filesystem's root to every pod user (0777): only a root owned by root
/// with mode 0755 holding nothing but `lost+found`, which is how mkfs leaves it.
fn open_fresh_root(root: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(root)?;
    if meta.uid() != 0 || meta.mode() & 0o7777 != 0o755 {
        return Ok(());
    }
    for entry in std::fs::read_dir(root)? {
        if entry?.file_name() != "lost+found" {
            return Ok(());
        }
    }
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(crate::driver::VOLUME_DIR_MODE))
}

/// The Node service over the shared driver state.
#[derive(Debug, Clone)]
pub struct NodeService {
    pub(crate) core: Shared,
}

#[tonic::async_trait]
impl Node for NodeService {
    async fn node_stage_volume(
        &self,
        request: Request<csi::NodeStageVolumeRequest>,
    ) -> Result<Response<csi::NodeStageVolumeResponse>, Status> {
        self.core.lock().await.stage_volume(request.into_inner()).map(Response::new)
    }

    async fn node_unstage_volume(
        &self,
        request: Request<csi::NodeUnstageVolumeRequest>,
    ) -> Result<Response<csi::NodeUnstageVolumeResponse>, Status> {
        self.core.lock().await.unstage_volume(request.into_inner()).map(Response::new)
    }

    async fn node_publish_volume(
        &self,
        request: Request<csi::NodePublishVolumeRequest>,
    ) -> Result<Response<csi::NodePublishVolumeResponse>, Status> {
        self.core.lock().await.publish_volume(request.into_inner()).map(Response::new)
    }

    async fn node_unpublish_volume(
        &self,
        request: Request<csi::NodeUnpublishVolumeRequest>,
    ) -> Result<Response<csi::NodeUnpublishVolumeResponse>, Status> {
        self.core.lock().await.unpublish_volume(request.into_inner()).map(Response::new)
    }

    async fn node_get_volume_stats(
        &self,
        request: Request<csi::NodeGetVolumeStatsRequest>,
    ) -> Result<Response<csi::NodeGetVolumeStatsResponse>, Status> {
        self.core.lock().await.volume_stats(request.into_inner()).map(Response::new)
    }

    async fn node_expand_volume(
        &self,
        request: Request<csi::NodeExpandVolumeRequest>,
    ) -> Result<Response<csi::NodeExpandVolumeResponse>, Status> {
        self.core.lock().await.node_expand(request.into_inner()).map(Response::new)
    }

    async fn node_get_capabilities(
        &self,
        _request: Request<csi::NodeGetCapabilitiesRequest>,
    ) -> Result<Response<csi::NodeGetCapabilitiesResponse>, Status> {
        use csi::node_service_capability::{Rpc as RpcCapability, Type};
        let capabilities = NODE_CAPABILITIES
            .iter()
            .map(|rpc| csi::NodeServiceCapability {
                r#type: Some(Type::Rpc(RpcCapability { r#type: *rpc as i32 })),
            })
            .collect();
        Ok(Response::new(csi::NodeGetCapabilitiesResponse { capabilities }))
    }

    async fn node_get_info(
        &self,
        _request: Request<csi::NodeGetInfoRequest>,
    ) -> Result<Response<csi::NodeGetInfoResponse>, Status> {
        let core = self.core.lock().await;
        Ok(Response::new(csi::NodeGetInfoResponse {
            node_id: core.config.node_name.clone(),
            max_volumes_per_node: core.config.max_volumes_per_node,
            accessible_topology: Some(core.topology()),
        }))
    }
}

/// Says which secret keys a call carried (never their values), so an operator can tell a
/// secret reached the driver.
fn log_secret_keys(rpc: &str, volume: &str, secrets: &HashMap<String, String>) {
    if !secrets.is_empty() {
        let mut keys: Vec<&str> = secrets.keys().map(String::as_str).collect();
        keys.sort_unstable();
        tracing::debug!(rpc, volume, keys = %keys.join(","), "call carries secrets");
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use kvol_plugin::mount::{MountCall, RecordingMounter};
    use tonic::Code;

    use super::*;
    use crate::HostpathConfig;
    use crate::state::volume_id_for_name;

    #[test]
    fn stage_decisions() {
        let p = Path::new("/stage");
        let cases: &[(Option<&str>, bool, Result<MountAction, Code>)] = &[
            (Some("v"), true, Ok(MountAction::Done)),
            (Some("v"), false, Ok(MountAction::Mount)),
            (Some("w"), true, Err(Code::AlreadyExists)),
            (Some("w"), false, Err(Code::AlreadyExists)),
            (None, true, Err(Code::AlreadyExists)),
            (None, false, Ok(MountAction::Mount)),
        ];
        for (owner, mounted, want) in cases {
            assert_eq!(
                stage_action("v", p, *owner, *mounted).map_err(|s| s.code()),
                *want,
                "{owner:?} {mounted}"
            );
        }
        let msg = stage_action("v", p, Some("w"), true).unwrap_err();
        assert_eq!(msg.message(), "volume v: staging path /stage already holds volume w");
    }

    #[test]
    fn publish_decisions() {
        let p = Path::new("/t");
        type Case<'a> = (Option<&'a str>, Option<bool>, bool, Result<MountAction, Code>);
        let cases: &[Case] = &[
            (Some("v"), Some(false), false, Ok(MountAction::Done)),
            (Some("v"), Some(true), true, Ok(MountAction::Done)),
            (Some("v"), Some(true), false, Err(Code::AlreadyExists)),
            (Some("v"), Some(false), true, Err(Code::AlreadyExists)),
            (Some("v"), None, true, Ok(MountAction::Mount)),
            (Some("w"), None, false, Err(Code::AlreadyExists)),
            (Some("w"), Some(false), false, Err(Code::AlreadyExists)),
            (None, Some(false), false, Err(Code::AlreadyExists)),
            (None, None, false, Ok(MountAction::Mount)),
        ];
        for (owner, mounted, ro, want) in cases {
            let got = publish_action("v", p, *owner, *mounted, *ro).map_err(|s| s.code());
            assert_eq!(got, *want, "{owner:?} {mounted:?} {ro}");
        }
        let msg = publish_action("v", p, Some("v"), Some(true), false).unwrap_err();
        assert_eq!(msg.message(), "volume v is already published read-only on /t, not read-write");
    }

    #[test]
    fn unmount_decisions() {
        let cases = [
            (Some("v"), true, UnmountAction::Unmount),
            (Some("v"), false, UnmountAction::Forget),
            (Some("w"), true, UnmountAction::Nothing),
            (Some("w"), false, UnmountAction::Nothing),
            (None, true, UnmountAction::Nothing),
            (None, false, UnmountAction::Nothing),
        ];
        for (owner, mounted, want) in cases {
            assert_eq!(unmount_action("v", owner, mounted), want, "{owner:?} {mounted}");
        }
    }

    #[test]
    fn read_only_comes_from_the_flag_or_a_reader_only_mode() {
        let cap = |mode: Mode| csi::VolumeCapability {
            access_type: None,
            access_mode: Some(csi::volume_capability::AccessMode { mode: mode as i32 }),
        };
        let cases = [
            (false, Mode::SingleNodeWriter, false),
            (true, Mode::SingleNodeWriter, true),
            (false, Mode::SingleNodeReaderOnly, true),
            (false, Mode::MultiNodeReaderOnly, true),
            (false, Mode::MultiNodeMultiWriter, false),
        ];
        for (flag, mode, want) in cases {
            assert_eq!(effective_read_only(flag, &cap(mode)), want, "{flag} {mode:?}");
        }
    }

    #[test]
    fn only_a_true_ephemeral_key_marks_an_ephemeral_volume() {
        let ctx = |v: &str| HashMap::from([(EPHEMERAL_CONTEXT_KEY.to_string(), v.to_string())]);
        assert!(is_ephemeral(&ctx("true")));
        assert!(!is_ephemeral(&ctx("false")));
        assert!(!is_ephemeral(&ctx("True")));
        assert!(!is_ephemeral(&HashMap::new()));
    }

    /// The node flow on the recording mounter: what is mounted where, and the records.
    #[test]
    fn stage_and_publish_go_through_the_mount_seam_and_are_recorded() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let config =
            HostpathConfig { state_dir: root.join("state"), ..HostpathConfig::new("d.example", "n") };
        let mounter = Arc::new(RecordingMounter::new());
        let mut hp = Hostpath::open(Arc::new(config), mounter.clone()).unwrap();
        let cap = csi::VolumeCapability {
            access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
            access_mode: Some(csi::volume_capability::AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        };
        hp.create_volume(csi::CreateVolumeRequest {
            name: "pvc".into(),
            volume_capabilities: vec![cap.clone()],
            ..Default::default()
        })
        .unwrap();
        let id = volume_id_for_name("pvc");
        let stage = root.join("stage");
        let target = root.join("pod/target");
        let stage_req = csi::NodeStageVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: stage.display().to_string(),
            volume_capability: Some(cap.clone()),
            ..Default::default()
        };
        hp.stage_volume(stage_req.clone()).unwrap();
        hp.stage_volume(stage_req).unwrap();
        let publish = csi::NodePublishVolumeRequest {
            volume_id: id.clone(),
            staging_target_path: stage.display().to_string(),
            target_path: target.display().to_string(),
            volume_capability: Some(cap),
            readonly: true,
            ..Default::default()
        };
        hp.publish_volume(publish.clone()).unwrap();
        hp.publish_volume(publish.clone()).unwrap();
        let err =
            hp.publish_volume(csi::NodePublishVolumeRequest { readonly: false, ..publish }).unwrap_err();
        assert_eq!(err.code(), Code::AlreadyExists);
        assert_eq!(
            mounter.calls(),
            [
                MountCall::Bind {
                    source: root.join("state/volumes").join(&id),
                    target: stage.clone(),
                    read_only: false
                },
                MountCall::Bind { source: stage.clone(), target: target.clone(), read_only: true },
            ]
        );
        let reloaded = crate::state::State::load(&root.join("state/state.json")).unwrap();
        assert_eq!(reloaded.published_on(&target), Some((id.as_str(), Publication { read_only: true })));
        assert_eq!(reloaded.staged_on(&stage), Some(id.as_str()));

        // A failing unmount keeps the record, so a retry can finish the job.
        mounter.fail_next(std::io::ErrorKind::ResourceBusy);
        let unpublish = csi::NodeUnpublishVolumeRequest {
            volume_id: id.clone(),
            target_path: target.display().to_string(),
        };
        let err = hp.unpublish_volume(unpublish.clone()).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(
            err.message().starts_with(&format!("volume {id}: cannot unmount {}", target.display())),
            "{err:?}"
        );
        assert!(hp.state.published_on(&target).is_some());
        hp.unpublish_volume(unpublish.clone()).unwrap();
        hp.unpublish_volume(unpublish).unwrap();
        assert!(hp.state.published_on(&target).is_none());
        assert!(!target.exists(), "the target directory is removed");
    }

    #[test]
    fn a_failed_mount_leaves_no_record_and_no_ephemeral_directory() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let config =
            HostpathConfig { state_dir: root.join("state"), ..HostpathConfig::new("d.example", "n") };
        let mounter = Arc::new(RecordingMounter::new());
        let mut hp = Hostpath::open(Arc::new(config), mounter.clone()).unwrap();
        mounter.fail_next(std::io::ErrorKind::PermissionDenied);
        let req = csi::NodePublishVolumeRequest {
            volume_id: "csi-eph".into(),
            target_path: root.join("t").display().to_string(),
            volume_capability: Some(csi::VolumeCapability {
                access_type: Some(csi::volume_capability::AccessType::Mount(Default::default())),
                access_mode: Some(csi::volume_capability::AccessMode { mode: Mode::SingleNodeWriter as i32 }),
            }),
            volume_context: HashMap::from([(EPHEMERAL_CONTEXT_KEY.to_string(), "true".to_string())]),
            ..Default::default()
        };
        let err = hp.publish_volume(req).unwrap_err();
        assert_eq!(err.code(), Code::Internal);
        assert!(hp.state.volumes.is_empty());
        assert_eq!(std::fs::read_dir(root.join("state/ephemeral")).unwrap().count(), 0);
        assert!(!root.join("t").exists());
    }

    #[test]
    fn static_volumes_are_taken_on_at_first_stage_only_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().canonicalize().unwrap();
        let mount = |block: bool| csi::VolumeCapability {
            access_type: Some(if block {
                csi::volume_capability::AccessType::Block(Default::default())
            } else {
                csi::volume_capability::AccessType::Mount(Default::default())
            }),
            access_mode: Some(csi::volume_capability::AccessMode { mode: Mode::SingleNodeWriter as i32 }),
        };
        // A migrated GCE PD's handle: slashes and all, never a path component as it is.
        let id = "projects/UNSPECIFIED/zones/zone-a/disks/../../etc";
        let stage = |block: bool| csi::NodeStageVolumeRequest {
            volume_id: id.into(),
            staging_target_path: root.join("stage").display().to_string(),
            volume_capability: Some(mount(block)),
            ..Default::default()
        };
        let rows = [
            ("off: an unknown id is not found", false, false, Some(Code::NotFound)),
            ("on: a block capability is refused", true, true, Some(Code::InvalidArgument)),
            ("on: a filesystem volume is taken on", true, false, None),
        ];
        for (name, static_volumes, block, want) in rows {
            let config = HostpathConfig {
                state_dir: root.join("state"),
                static_volumes,
                ..HostpathConfig::new("d.example", "n")
            };
            let mounter = Arc::new(RecordingMounter::new());
            let mut hp = Hostpath::open(Arc::new(config), mounter.clone()).unwrap();
            let got = hp.stage_volume(stage(block)).err().map(|e| e.code());
            assert_eq!(got, want, "{name}");
            if want.is_some() {
                assert!(hp.state.volumes.is_empty(), "{name}: nothing recorded");
                assert!(mounter.calls().is_empty(), "{name}: nothing mounted");
                continue;
            }
            let record = &hp.state.volumes[id];
            assert!(record.adopted && !record.ephemeral, "{name}: {record:?}");
            let source = root.join("state/static").join(crate::state::ephemeral_dir_name(id));
            assert!(source.is_dir(), "{name}: {} made", source.display());
            assert_eq!(
                mounter.calls(),
                [MountCall::Bind { source, target: root.join("stage"), read_only: false }],
                "{name}"
            );
            // From now on it is a volume like any other: staging again is a no-op.
            hp.stage_volume(stage(false)).unwrap();
            assert_eq!(mounter.calls().len(), 1, "{name}");
        }
    }
}
