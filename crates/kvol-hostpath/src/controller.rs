//! The hostpath driver's CSI Controller service: volumes and snapshots as directories, created and deleted idempotently by name and id.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use tonic::{Request, Response, Status};

use crate::capacity::{KIND_PARAMETER, available_capacity};
use crate::driver::{Hostpath, Shared, internal, required};
use crate::fsutil;
use crate::loopfs::{self, FsType};
use crate::state::{
    Attachment, ContentSource, SnapshotRecord, VolumeRecord, is_snapshot_id, is_volume_id,
    snapshot_id_for_name, volume_id_for_name,
};
use crate::{HostpathConfig, VolumeBacking};
use csi::controller_service_capability::rpc::Type as Rpc;
use csi::volume_capability::{AccessType, access_mode::Mode};
use csi::volume_content_source::{SnapshotSource, Type as SourceType, VolumeSource};
use kvol_csi::proto::csi::{self, controller_server::Controller};

/// Capacities are rounded up to whole mebibytes (when the limit allows).
pub const CAPACITY_STEP: i64 = 1 << 20;

/// The controller RPCs this driver always serves.
pub const CONTROLLER_CAPABILITIES: [Rpc; 7] = [
    Rpc::CreateDeleteVolume,
    Rpc::CreateDeleteSnapshot,
    Rpc::ListSnapshots,
    Rpc::ListVolumes,
    Rpc::CloneVolume,
    Rpc::ExpandVolume,
    Rpc::GetCapacity,
];

/// The controller RPCs a driver configured as `config` serves: the fixed ones, attach (with
/// read-only attachments) when `enable_attach`, modify when `enable_controller_modify_volume`.
pub fn controller_capabilities(config: &HostpathConfig) -> Vec<Rpc> {
    let mut rpcs = CONTROLLER_CAPABILITIES.to_vec();
    if config.enable_attach {
        rpcs.extend([Rpc::PublishUnpublishVolume, Rpc::PublishReadonly]);
    }
    if config.enable_controller_modify_volume {
        rpcs.push(Rpc::ModifyVolume);
    }
    rpcs
}

/// Why `parameters` cannot be set as mutable parameters, if they cannot: modify must be on and
/// each name accepted.
pub fn mutable_parameters_problem(
    config: &HostpathConfig,
    parameters: &HashMap<String, String>,
) -> Option<String> {
    let mut names: Vec<&String> = parameters.keys().collect();
    names.sort();
    let first = names.first()?;
    if !config.enable_controller_modify_volume {
        return Some(format!("mutable parameter {first:?} is not supported: volume modification is off"));
    }
    let refused: Vec<&str> = names
        .into_iter()
        .filter(|n| !config.accepted_mutable_parameter_names.contains(n.as_str()))
        .map(String::as_str)
        .collect();
    (!refused.is_empty()).then(|| {
        let accepted: Vec<&str> =
            config.accepted_mutable_parameter_names.iter().map(String::as_str).collect();
        format!("mutable parameters {refused:?} are not accepted (accepted: {accepted:?})")
    })
}

/// Why one more volume of `wanted` bytes and kind `kind` cannot be made, if it cannot: the
/// node's volume limit (`max_volumes_per_node`, 0 none) with `count` volumes made, or the
/// kind's capacity cap with `allocated` bytes of that kind made.
pub fn create_limit_problem(
    config: &HostpathConfig,
    count: usize,
    kind: &str,
    allocated: i64,
    wanted: i64,
) -> Option<String> {
    let max = config.max_volumes_per_node;
    if max > 0 && count as i64 >= max {
        return Some(format!("node {} already has {count} volumes, its limit of {max}", config.node_name));
    }
    if config.capacity.is_empty() {
        return None;
    }
    match config.capacity.get(kind) {
        None => Some(format!("no capacity is configured for kind {kind:?}")),
        Some(cap) if allocated.saturating_add(wanted) > *cap => Some(format!(
            "kind {kind:?} has {} of its {cap} bytes left, less than the {wanted} asked for",
            cap.saturating_sub(allocated).max(0)
        )),
        Some(_) => None,
    }
}

/// Why the driver cannot serve `capability`, if it cannot: mount or block access, in any
/// known access mode (volumes are on one node, and all access happens there).
pub fn capability_problem(capability: &csi::VolumeCapability) -> Option<String> {
    if capability.access_type.is_none() {
        return Some("a volume capability has no access type (mount or block)".to_string());
    }
    let Some(mode) = capability.access_mode else {
        return Some("a volume capability has no access mode".to_string());
    };
    match Mode::try_from(mode.mode) {
        Ok(Mode::Unknown) | Err(_) => Some(format!("access mode {} is unknown", mode.mode)),
        Ok(_) => None,
    }
}

/// Whether a capability asks for block access.
pub fn is_block(capability: &csi::VolumeCapability) -> bool {
    matches!(capability.access_type, Some(AccessType::Block(_)))
}

/// Why `capability` does not fit a volume that is (`block`) or is not a block volume.
pub fn access_type_problem(block: bool, capability: &csi::VolumeCapability) -> Option<String> {
    match (block, is_block(capability)) {
        (true, false) => Some("it is a block volume, and mount access was asked for".to_string()),
        (false, true) => {
            Some("it is a filesystem volume (a directory), and block access was asked for".to_string())
        }
        _ => None,
    }
}

/// Why `capability` does not fit a volume holding a filesystem of `fs` (`None`: a directory,
/// which takes any), if it does not: a mount capability naming another type.
pub fn fs_type_problem(fs: Option<FsType>, capability: &csi::VolumeCapability) -> Option<String> {
    let (Some(fs), Some(AccessType::Mount(m))) = (fs, &capability.access_type) else { return None };
    (!m.fs_type.is_empty() && m.fs_type != fs.name())
        .then(|| format!("it holds a {} filesystem, and {:?} was asked for", fs.name(), m.fs_type))
}

fn with_id(id: &str, status: Status) -> Status {
    Status::new(status.code(), format!("volume {id}: {}", status.message()))
}

/// Whether capabilities ask for a block volume; both block and mount access is refused.
pub fn wants_block(capabilities: &[csi::VolumeCapability]) -> Result<bool, String> {
    match capabilities.iter().filter(|c| is_block(c)).count() {
        0 => Ok(false),
        n if n == capabilities.len() => Ok(true),
        _ => {
            Err("capabilities ask for both block and mount access; a volume is one or the other".to_string())
        }
    }
}

/// The capacity to record for a capacity range: the required bytes (or the limit, when only
/// that is given) rounded up to [`CAPACITY_STEP`], unless rounding passes the limit; 0 when
/// no range is given. A negative value or required bytes above the limit is INVALID_ARGUMENT.
pub fn capacity_for(range: Option<&csi::CapacityRange>) -> Result<i64, Status> {
    let Some(range) = range else { return Ok(0) };
    let (required, limit) = (range.required_bytes, range.limit_bytes);
    if required < 0 || limit < 0 {
        return Err(Status::invalid_argument(format!(
            "capacity range (required {required}, limit {limit}) has a negative value"
        )));
    }
    if limit > 0 && required > limit {
        return Err(Status::invalid_argument(format!(
            "required bytes {required} exceed the limit of {limit} bytes"
        )));
    }
    let wanted = if required > 0 { required } else { limit };
    let rounded =
        wanted.checked_add(CAPACITY_STEP - 1).map(|n| n / CAPACITY_STEP * CAPACITY_STEP).unwrap_or(wanted);
    Ok(if limit > 0 && rounded > limit { wanted } else { rounded })
}

/// Whether an existing capacity satisfies a range (no range is satisfied by anything).
pub fn capacity_satisfies(capacity: i64, range: Option<&csi::CapacityRange>) -> bool {
    range.is_none_or(|r| capacity >= r.required_bytes && (r.limit_bytes == 0 || capacity <= r.limit_bytes))
}

/// The capacity of a volume made from a source of `source_size` bytes: the range's capacity,
/// grown to the source's size when smaller; OUT_OF_RANGE when the source passes the limit.
pub fn restore_capacity(range: Option<&csi::CapacityRange>, source_size: i64) -> Result<i64, Status> {
    let capacity = capacity_for(range)?;
    let limit = range.map_or(0, |r| r.limit_bytes);
    if limit > 0 && source_size > limit {
        return Err(Status::out_of_range(format!(
            "the source holds {source_size} bytes, more than the limit of {limit} bytes"
        )));
    }
    Ok(capacity.max(source_size))
}

/// The capacity after an expansion request: unchanged when the current one satisfies the
/// range (volumes never shrink), else the range's capacity. No range is INVALID_ARGUMENT; a
/// current capacity above the limit is OUT_OF_RANGE.
pub fn expanded_capacity(current: i64, range: Option<&csi::CapacityRange>) -> Result<i64, Status> {
    let Some(r) = range else { return Err(Status::invalid_argument("capacity range is missing")) };
    let wanted = capacity_for(Some(r))?;
    if capacity_satisfies(current, Some(r)) {
        return Ok(current);
    }
    if r.limit_bytes > 0 && current > r.limit_bytes {
        return Err(Status::out_of_range(format!(
            "the volume has {current} bytes, more than the limit of {} bytes, and cannot shrink",
            r.limit_bytes
        )));
    }
    Ok(wanted)
}

/// Whether a volume on a node with topology `ours` meets the requirement: with requisite
/// topologies, one of them must be a subset of ours; preferred ones only order, never refuse.
pub fn topology_allows(requirement: Option<&csi::TopologyRequirement>, ours: &csi::Topology) -> bool {
    let Some(req) = requirement.filter(|r| !r.requisite.is_empty()) else { return true };
    req.requisite.iter().any(|t| t.segments.iter().all(|(k, v)| ours.segments.get(k) == Some(v)))
}

/// One page of `items` (sorted by id): those from the id `token` on (all when empty), at most
/// `max_entries` of them (all when 0), and the token of the next page (empty on the last).
/// A token that is not one of this driver's ids is ABORTED, as the CSI spec asks.
pub fn page<T>(
    items: Vec<(String, T)>,
    max_entries: i32,
    token: &str,
    valid_token: fn(&str) -> bool,
) -> Result<(Vec<T>, String), Status> {
    if max_entries < 0 {
        return Err(Status::invalid_argument(format!("max entries {max_entries} is negative")));
    }
    if !token.is_empty() && !valid_token(token) {
        return Err(Status::aborted(format!("starting token {token:?} is not valid")));
    }
    let mut rest: Vec<_> = items.into_iter().filter(|(id, _)| id.as_str() >= token).collect();
    let take = if max_entries == 0 { rest.len() } else { (max_entries as usize).min(rest.len()) };
    let next = rest.get(take).map(|(id, _)| id.clone()).unwrap_or_default();
    rest.truncate(take);
    Ok((rest.into_iter().map(|(_, item)| item).collect(), next))
}

/// The content source of a request, checked for a non-empty id.
fn content_source(source: Option<&csi::VolumeContentSource>) -> Result<Option<ContentSource>, Status> {
    match source.and_then(|s| s.r#type.as_ref()) {
        None => Ok(None),
        Some(SourceType::Snapshot(s)) => {
            Ok(Some(ContentSource::Snapshot(required(&s.snapshot_id, "content source snapshot id")?.into())))
        }
        Some(SourceType::Volume(v)) => {
            Ok(Some(ContentSource::Volume(required(&v.volume_id, "content source volume id")?.into())))
        }
    }
}

fn source_message(source: &ContentSource) -> csi::VolumeContentSource {
    let r#type = match source {
        ContentSource::Snapshot(id) => SourceType::Snapshot(SnapshotSource { snapshot_id: id.clone() }),
        ContentSource::Volume(id) => SourceType::Volume(VolumeSource { volume_id: id.clone() }),
    };
    csi::VolumeContentSource { r#type: Some(r#type) }
}

/// A volume's or snapshot's data.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum SourceData {
    /// A directory tree.
    Dir(PathBuf),
    /// A filesystem image, and where it is mounted (a staged volume's staging path), if it is.
    Image { path: PathBuf, fs: FsType, mounted_on: Option<PathBuf> },
}

pub(crate) fn now() -> (i64, i32) {
    let since = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    (since.as_secs() as i64, since.subsec_nanos() as i32)
}

impl Hostpath {
    fn volume_message(&self, id: &str, record: &VolumeRecord) -> csi::Volume {
        csi::Volume {
            capacity_bytes: record.capacity_bytes,
            volume_id: id.to_string(),
            volume_context: HashMap::new(),
            content_source: record.source.as_ref().map(source_message),
            accessible_topology: vec![self.topology()],
        }
    }

    pub(crate) fn snapshot_message(id: &str, record: &SnapshotRecord) -> csi::Snapshot {
        csi::Snapshot {
            size_bytes: record.size_bytes,
            snapshot_id: id.to_string(),
            source_volume_id: record.source_volume_id.clone(),
            creation_time: Some(prost_types::Timestamp {
                seconds: record.created_seconds,
                nanos: record.created_nanos,
            }),
            ready_to_use: true,
            group_snapshot_id: record.group_snapshot_id.clone(),
        }
    }

    /// The data and size of a content source; NOT_FOUND when it does not exist.
    fn source_data(&self, source: &ContentSource) -> Result<(SourceData, i64), Status> {
        match source {
            ContentSource::Snapshot(id) => match self.state.snapshots.get(id) {
                Some(s) => {
                    let data = match s.fs_type {
                        Some(fs) => {
                            SourceData::Image { path: self.layout.snapshot_image(id), fs, mounted_on: None }
                        }
                        None => SourceData::Dir(self.layout.snapshot_dir(id)),
                    };
                    Ok((data, s.size_bytes))
                }
                None => Err(Status::not_found(format!("source snapshot {id} does not exist"))),
            },
            ContentSource::Volume(id) => match self.state.volumes.get(id) {
                Some(v) => Ok((self.volume_data(id, v), v.capacity_bytes)),
                None => Err(Status::not_found(format!("source volume {id} does not exist"))),
            },
        }
    }

    /// Where volume `id`'s data is: its directory, or its image (and where it is staged).
    pub(crate) fn volume_data(&self, id: &str, record: &VolumeRecord) -> SourceData {
        match record.fs_type {
            Some(fs) => SourceData::Image {
                path: self.layout.volume_image(id),
                fs,
                mounted_on: record.staged.iter().next().cloned(),
            },
            None => SourceData::Dir(self.layout.volume_dir(id, record)),
        }
    }

    /// Makes the snapshot directory `dir` as a copy of volume `volume_id`'s data: its tree, or
    /// its image (the filesystem frozen while it is copied when the volume is staged).
    pub(crate) fn copy_to_snapshot(
        &self,
        dir: &Path,
        volume_id: &str,
        record: &VolumeRecord,
    ) -> Result<(), Status> {
        match self.volume_data(volume_id, record) {
            SourceData::Dir(from) => self.make_dir(dir, Some(&from)),
            SourceData::Image { path, mounted_on, .. } => self
                .make_dir_with(dir, |tmp| {
                    loopfs::copy_image(&path, &tmp.join(loopfs::SNAPSHOT_IMAGE), mounted_on.as_deref())
                })
                .map_err(|e| Status::new(e.code(), format!("volume {volume_id}: {}", e.message()))),
        }
    }

    pub fn create_volume(
        &mut self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, Status> {
        let name = required(&req.name, "volume name")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument(format!("volume {name}: volume capabilities are missing")));
        }
        if let Some(problem) = req.volume_capabilities.iter().find_map(capability_problem) {
            return Err(Status::invalid_argument(format!("volume {name}: {problem}")));
        }
        let range = req.capacity_range.as_ref();
        capacity_for(range).map_err(|s| Status::new(s.code(), format!("volume {name}: {}", s.message())))?;
        let source = content_source(req.volume_content_source.as_ref())?;
        if let Some(problem) = mutable_parameters_problem(&self.config, &req.mutable_parameters) {
            return Err(Status::invalid_argument(format!("volume {name}: {problem}")));
        }
        let block = wants_block(&req.volume_capabilities)
            .map_err(|p| Status::invalid_argument(format!("volume {name}: {p}")))?;
        let kind = req.parameters.get(KIND_PARAMETER).cloned().unwrap_or_default();
        let requested_fs = if block {
            None
        } else {
            loopfs::requested_fs_type(&req.volume_capabilities, &req.parameters)
                .map_err(|p| Status::invalid_argument(format!("volume {name}: {p}")))?
        };
        let id = volume_id_for_name(name);
        if let Some(existing) = self.state.volumes.get(&id) {
            if let (Some(fs), Some(asked)) = (existing.fs_type, requested_fs)
                && fs != asked
            {
                return Err(Status::already_exists(format!(
                    "volume {name} exists as {id} with a {} filesystem, not {}",
                    fs.name(),
                    asked.name()
                )));
            }
            if existing.name != name {
                return Err(Status::internal(format!(
                    "volume {name}: its id {id} is taken by volume {}",
                    existing.name
                )));
            }
            if !capacity_satisfies(existing.capacity_bytes, range) {
                return Err(Status::already_exists(format!(
                    "volume {name} exists as {id} with {} bytes, outside the requested range",
                    existing.capacity_bytes
                )));
            }
            if existing.block != block {
                return Err(Status::already_exists(format!(
                    "volume {name} exists as {id} with another access type (block: {})",
                    existing.block
                )));
            }
            if existing.source != source {
                return Err(Status::already_exists(format!(
                    "volume {name} exists as {id} with another content source"
                )));
            }
            return Ok(csi::CreateVolumeResponse { volume: Some(self.volume_message(&id, existing)) });
        }
        if !topology_allows(req.accessibility_requirements.as_ref(), &self.topology()) {
            return Err(Status::resource_exhausted(format!(
                "volume {name}: no requisite topology includes node {}",
                self.config.node_name
            )));
        }
        let (source_data, capacity) = match &source {
            None => (None, capacity_for(range)?),
            Some(s) => {
                let (data, size) = self.source_data(s)?;
                let capacity = restore_capacity(range, size)
                    .map_err(|st| Status::new(st.code(), format!("volume {name}: {}", st.message())))?;
                (Some((data, size)), capacity)
            }
        };
        // The backing: a volume made from a source takes the source's; a new filesystem volume
        // the configured one.
        let fs_type = match &source_data {
            _ if block => {
                if let Some((SourceData::Image { .. }, _)) = &source_data {
                    return Err(Status::invalid_argument(format!(
                        "volume {name}: a block volume cannot be made from a filesystem image"
                    )));
                }
                None
            }
            Some((SourceData::Image { fs, .. }, _)) => {
                if let Some(asked) = requested_fs.filter(|a| a != fs) {
                    return Err(Status::invalid_argument(format!(
                        "volume {name}: its source holds a {} filesystem, not {}",
                        fs.name(),
                        asked.name()
                    )));
                }
                Some(*fs)
            }
            Some((SourceData::Dir(_), _)) => None,
            None if self.config.volume_backing == VolumeBacking::Loop => {
                Some(requested_fs.unwrap_or(FsType::Ext4))
            }
            None => None,
        };
        let capacity = match (fs_type, &source_data) {
            (Some(fs), None) => {
                let limit = range.map_or(0, |r| r.limit_bytes);
                loopfs::image_size(fs, capacity, limit)
                    .map_err(|p| Status::out_of_range(format!("volume {name}: {p}")))?
            }
            _ => capacity,
        };
        let count = self.state.volumes.values().filter(|v| !v.ephemeral).count();
        if let Some(problem) =
            create_limit_problem(&self.config, count, &kind, self.allocated(&kind), capacity)
        {
            return Err(Status::resource_exhausted(format!("volume {name}: {problem}")));
        }
        // A restored image's filesystem is the source's size until the node grows it at stage.
        let node_size_bytes = match &source_data {
            Some((SourceData::Image { .. }, size)) if fs_type.is_some() => (*size).min(capacity),
            _ => capacity,
        };
        let record = VolumeRecord {
            name: name.to_string(),
            capacity_bytes: capacity,
            node_size_bytes,
            kind,
            mutable_parameters: req.mutable_parameters.into_iter().collect(),
            source,
            block,
            fs_type,
            ..VolumeRecord::default()
        };
        if let Some(fs) = fs_type {
            let image = self.layout.volume_image(&id);
            let from = match &source_data {
                Some((SourceData::Image { path, mounted_on, .. }, _)) => {
                    Some((path.as_path(), mounted_on.as_deref()))
                }
                _ => None,
            };
            loopfs::create_image(&image, capacity, fs, from)
                .map_err(|e| Status::new(e.code(), format!("volume {name} ({id}): {}", e.message())))?;
            let mut next = self.state.clone();
            next.volumes.insert(id.clone(), record.clone());
            if let Err(e) = self.commit(next) {
                let _ = std::fs::remove_file(&image);
                return Err(e);
            }
            tracing::info!(volume = %id, name, capacity, fs = fs.name(), "created loop-backed volume");
            return Ok(csi::CreateVolumeResponse { volume: Some(self.volume_message(&id, &record)) });
        }
        let source_dir = match &source_data {
            Some((SourceData::Dir(dir), _)) => Some(dir.clone()),
            _ => None,
        };
        let dir = self.layout.volume_dir(&id, &record);
        self.make_dir(&dir, source_dir.as_deref())?;
        if block && source_dir.is_none() {
            let size = if capacity > 0 { capacity } else { crate::block::DEFAULT_BLOCK_BYTES };
            if let Err(e) = crate::block::create_image(&dir, size) {
                let _ = fsutil::remove_tree(&dir);
                return Err(e);
            }
        }
        let mut next = self.state.clone();
        next.volumes.insert(id.clone(), record.clone());
        if let Err(e) = self.commit(next) {
            let _ = fsutil::remove_tree(&dir);
            return Err(e);
        }
        tracing::info!(volume = %id, name, capacity, "created volume");
        Ok(csi::CreateVolumeResponse { volume: Some(self.volume_message(&id, &record)) })
    }

    pub fn delete_volume(
        &mut self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let Some(record) = self.state.volumes.get(id) else {
            return Ok(csi::DeleteVolumeResponse {});
        };
        if record.ephemeral {
            return Err(Status::failed_precondition(format!(
                "volume {id} is an ephemeral volume in use; it goes away when it is unpublished"
            )));
        }
        if let Some(path) = record.published.keys().next().or(record.staged.iter().next()) {
            return Err(Status::failed_precondition(format!(
                "volume {id} is still in use: mounted on {}",
                path.display()
            )));
        }
        if let Some(a) = &record.attached {
            return Err(Status::failed_precondition(format!(
                "volume {id} is still attached to node {}",
                a.node
            )));
        }
        if record.fs_type.is_some() {
            let image = self.layout.volume_image(id);
            if image.exists()
                && let Some(device) =
                    crate::block::devices_of(&image).map_err(|e| with_id(id, e))?.into_iter().next()
            {
                return Err(Status::failed_precondition(format!(
                    "volume {id} is still attached: its image {} is on {}",
                    image.display(),
                    device.display()
                )));
            }
            match std::fs::remove_file(&image) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Status::internal(format!(
                        "volume {id}: cannot remove {}: {e}",
                        image.display()
                    )));
                }
                _ => {}
            }
        }
        let dir = self.layout.volume_dir(id, record);
        self.refuse_mounts_under(&dir)?;
        if record.block {
            crate::block::detach(&crate::block::image(&dir))?;
        }
        fsutil::remove_tree(&dir).map_err(internal)?;
        let mut next = self.state.clone();
        next.volumes.remove(id);
        self.commit(next)?;
        tracing::info!(volume = %id, "deleted volume");
        Ok(csi::DeleteVolumeResponse {})
    }

    pub fn validate_volume_capabilities(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument(format!("volume {id}: volume capabilities are missing")));
        }
        let Some(record) = self.state.volumes.get(id).filter(|v| !v.ephemeral) else {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        };
        let problem = |c: &csi::VolumeCapability| {
            capability_problem(c)
                .or_else(|| access_type_problem(record.block, c))
                .or_else(|| fs_type_problem(record.fs_type, c))
        };
        if let Some(problem) = req.volume_capabilities.iter().find_map(problem) {
            return Ok(csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message: problem });
        }
        let confirmed = csi::validate_volume_capabilities_response::Confirmed {
            volume_context: req.volume_context,
            volume_capabilities: req.volume_capabilities,
            parameters: req.parameters,
            mutable_parameters: req.mutable_parameters,
        };
        Ok(csi::ValidateVolumeCapabilitiesResponse { confirmed: Some(confirmed), message: String::new() })
    }

    pub fn list_volumes(&self, req: csi::ListVolumesRequest) -> Result<csi::ListVolumesResponse, Status> {
        let items = self
            .state
            .volumes
            .iter()
            .filter(|(_, v)| !v.ephemeral)
            .map(|(id, v)| (id.clone(), self.volume_message(id, v)))
            .collect();
        let (volumes, next_token) = page(items, req.max_entries, &req.starting_token, is_volume_id)?;
        let entries = volumes
            .into_iter()
            .map(|volume| csi::list_volumes_response::Entry { volume: Some(volume), status: None })
            .collect();
        Ok(csi::ListVolumesResponse { entries, next_token })
    }

    pub fn expand_volume(
        &mut self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        if req.capacity_range.is_none() {
            return Err(Status::invalid_argument(format!("volume {id}: capacity range is missing")));
        }
        let Some(record) = self.state.volumes.get(id).filter(|v| !v.ephemeral) else {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        };
        let capacity = expanded_capacity(record.capacity_bytes, req.capacity_range.as_ref())
            .map_err(|s| Status::new(s.code(), format!("volume {id}: {}", s.message())))?;
        if capacity != record.capacity_bytes && self.config.offline_expansion && record.in_use() {
            return Err(Status::failed_precondition(format!(
                "volume {id} is in use on the node: this driver grows volumes offline only"
            )));
        }
        if capacity != record.capacity_bytes {
            if record.fs_type.is_some() {
                let image = self.layout.volume_image(id);
                loopfs::grow_image(&image, capacity).map_err(|e| with_id(id, e))?;
            } else if record.block {
                // The device grows when the node rereads the image's size (NodeExpandVolume).
                let image = crate::block::image(&self.layout.volume_dir(id, record));
                loopfs::grow_image(&image, capacity).map_err(|e| with_id(id, e))?;
            }
            let mut next = self.state.clone();
            if let Some(v) = next.volumes.get_mut(id) {
                v.capacity_bytes = capacity;
            }
            self.commit(next)?;
            tracing::info!(volume = %id, capacity, "expanded volume");
        }
        // The node makes the new size visible (NodeExpandVolume), as a filesystem would grow.
        let node_expansion_required = self.state.volumes.get(id).is_some_and(|v| v.visible_size() < capacity);
        Ok(csi::ControllerExpandVolumeResponse { capacity_bytes: capacity, node_expansion_required })
    }

    pub fn create_snapshot(
        &mut self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, Status> {
        let name = required(&req.name, "snapshot name")?;
        let source_id = required(&req.source_volume_id, "source volume id")?;
        let id = snapshot_id_for_name(name);
        if let Some(existing) = self.state.snapshots.get(&id) {
            if existing.name != name {
                return Err(Status::internal(format!(
                    "snapshot {name}: its id {id} is taken by snapshot {}",
                    existing.name
                )));
            }
            if existing.source_volume_id != source_id {
                return Err(Status::already_exists(format!(
                    "snapshot {name} exists as {id} of volume {}, not of volume {source_id}",
                    existing.source_volume_id
                )));
            }
            return Ok(csi::CreateSnapshotResponse { snapshot: Some(Self::snapshot_message(&id, existing)) });
        }
        let Some(volume) = self.state.volumes.get(source_id) else {
            return Err(Status::not_found(format!(
                "snapshot {name}: source volume {source_id} does not exist"
            )));
        };
        let (created_seconds, created_nanos) = now();
        let record = SnapshotRecord {
            name: name.to_string(),
            source_volume_id: source_id.to_string(),
            size_bytes: volume.capacity_bytes,
            created_seconds,
            created_nanos,
            group_snapshot_id: String::new(),
            fs_type: volume.fs_type,
        };
        let dir = self.layout.snapshot_dir(&id);
        self.copy_to_snapshot(&dir, source_id, volume)?;
        let mut next = self.state.clone();
        next.snapshots.insert(id.clone(), record.clone());
        if let Err(e) = self.commit(next) {
            let _ = fsutil::remove_tree(&dir);
            return Err(e);
        }
        tracing::info!(snapshot = %id, name, volume = source_id, "created snapshot");
        Ok(csi::CreateSnapshotResponse { snapshot: Some(Self::snapshot_message(&id, &record)) })
    }

    pub fn delete_snapshot(
        &mut self,
        req: csi::DeleteSnapshotRequest,
    ) -> Result<csi::DeleteSnapshotResponse, Status> {
        let id = required(&req.snapshot_id, "snapshot id")?;
        let Some(record) = self.state.snapshots.get(id) else {
            return Ok(csi::DeleteSnapshotResponse {});
        };
        if !record.group_snapshot_id.is_empty() {
            return Err(Status::failed_precondition(format!(
                "snapshot {id} belongs to group snapshot {}; delete the group snapshot",
                record.group_snapshot_id
            )));
        }
        let dir = self.layout.snapshot_dir(id);
        self.refuse_mounts_under(&dir)?;
        fsutil::remove_tree(&dir).map_err(internal)?;
        let mut next = self.state.clone();
        next.snapshots.remove(id);
        self.commit(next)?;
        tracing::info!(snapshot = %id, "deleted snapshot");
        Ok(csi::DeleteSnapshotResponse {})
    }

    pub fn list_snapshots(
        &self,
        req: csi::ListSnapshotsRequest,
    ) -> Result<csi::ListSnapshotsResponse, Status> {
        let items = self
            .state
            .snapshots
            .iter()
            .filter(|(id, _)| req.snapshot_id.is_empty() || **id == req.snapshot_id)
            .filter(|(_, s)| req.source_volume_id.is_empty() || s.source_volume_id == req.source_volume_id)
            .map(|(id, s)| (id.clone(), Self::snapshot_message(id, s)))
            .collect();
        let (snapshots, next_token) = page(items, req.max_entries, &req.starting_token, is_snapshot_id)?;
        let entries = snapshots
            .into_iter()
            .map(|snapshot| csi::list_snapshots_response::Entry { snapshot: Some(snapshot) })
            .collect();
        Ok(csi::ListSnapshotsResponse { entries, next_token })
    }
}

impl Hostpath {
    /// The bytes of capacity the volumes of `kind` hold.
    fn allocated(&self, kind: &str) -> i64 {
        self.state.volumes.values().filter(|v| !v.ephemeral && v.kind == kind).map(|v| v.capacity_bytes).sum()
    }

    pub fn get_capacity(&self, req: csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse, Status> {
        if let Some(problem) = req.volume_capabilities.iter().find_map(capability_problem) {
            return Err(Status::invalid_argument(problem));
        }
        let ours = self.topology();
        let here = req
            .accessible_topology
            .as_ref()
            .is_none_or(|t| t.segments.iter().all(|(k, v)| ours.segments.get(k) == Some(v)));
        let available = if here {
            let kind = req.parameters.get(KIND_PARAMETER).map(String::as_str).unwrap_or_default();
            let filesystem = crate::usage::filesystem_available(self.layout.root())?;
            let cap = self.config.capacity.get(kind).copied();
            available_capacity(filesystem, cap, !self.config.capacity.is_empty(), self.allocated(kind))
        } else {
            0
        };
        Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: Some(0),
        })
    }

    pub fn controller_publish(
        &mut self,
        req: csi::ControllerPublishVolumeRequest,
    ) -> Result<csi::ControllerPublishVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let node = required(&req.node_id, "node id")?;
        let cap = req
            .volume_capability
            .as_ref()
            .ok_or_else(|| Status::invalid_argument(format!("volume {id}: volume capability is missing")))?;
        if let Some(problem) = capability_problem(cap) {
            return Err(Status::invalid_argument(format!("volume {id}: {problem}")));
        }
        let Some(record) = self.state.volumes.get(id).filter(|v| !v.ephemeral) else {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        };
        if node != self.config.node_name {
            return Err(Status::not_found(format!(
                "volume {id}: node {node} does not exist (this is node {})",
                self.config.node_name
            )));
        }
        let wanted = Attachment { node: node.to_string(), read_only: req.readonly };
        match &record.attached {
            Some(a) if *a == wanted => return Ok(csi::ControllerPublishVolumeResponse::default()),
            Some(a) => {
                return Err(Status::already_exists(format!(
                    "volume {id} is already attached to node {} {}",
                    a.node,
                    if a.read_only { "read-only" } else { "read-write" }
                )));
            }
            None => {}
        }
        let max = self.config.max_volumes_per_node;
        let attached = self.state.volumes.values().filter(|v| v.attached.is_some()).count() as i64;
        if max > 0 && attached >= max {
            return Err(Status::resource_exhausted(format!(
                "volume {id}: node {node} already has {attached} volumes attached, its limit of {max}"
            )));
        }
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.attached = Some(wanted);
        }
        self.commit(next)?;
        tracing::info!(volume = %id, node, "attached volume");
        Ok(csi::ControllerPublishVolumeResponse::default())
    }

    pub fn controller_unpublish(
        &mut self,
        req: csi::ControllerUnpublishVolumeRequest,
    ) -> Result<csi::ControllerUnpublishVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        // Unknown volumes, and volumes attached elsewhere, are detached from that node already.
        let Some(record) = self.state.volumes.get(id) else {
            return Ok(csi::ControllerUnpublishVolumeResponse {});
        };
        let Some(attachment) = &record.attached else { return Ok(csi::ControllerUnpublishVolumeResponse {}) };
        if !req.node_id.is_empty() && req.node_id != attachment.node {
            return Ok(csi::ControllerUnpublishVolumeResponse {});
        }
        if let Some(path) = record.published.keys().next().or(record.staged.iter().next()) {
            return Err(Status::failed_precondition(format!(
                "volume {id} cannot be detached: it is still mounted on {}",
                path.display()
            )));
        }
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.attached = None;
        }
        self.commit(next)?;
        tracing::info!(volume = %id, "detached volume");
        Ok(csi::ControllerUnpublishVolumeResponse {})
    }

    pub fn modify_volume(
        &mut self,
        req: csi::ControllerModifyVolumeRequest,
    ) -> Result<csi::ControllerModifyVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        if self.state.volumes.get(id).is_none_or(|v| v.ephemeral) {
            return Err(Status::not_found(format!("volume {id} does not exist")));
        }
        if let Some(problem) = mutable_parameters_problem(&self.config, &req.mutable_parameters) {
            return Err(Status::invalid_argument(format!("volume {id}: {problem}")));
        }
        let mut next = self.state.clone();
        if let Some(v) = next.volumes.get_mut(id) {
            v.mutable_parameters.extend(req.mutable_parameters);
        }
        self.commit(next)?;
        tracing::info!(volume = %id, "modified volume");
        Ok(csi::ControllerModifyVolumeResponse {})
    }
}

/// The Controller service over the shared driver state.
#[derive(Debug, Clone)]
pub struct ControllerService {
    pub(crate) core: Shared,
}

fn unsupported(rpc: &str) -> Status {
    Status::unimplemented(format!("{rpc} is not supported by the hostpath driver"))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        request: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.core.lock().await.create_volume(request.into_inner()).map(Response::new)
    }

    async fn delete_volume(
        &self,
        request: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.core.lock().await.delete_volume(request.into_inner()).map(Response::new)
    }

    async fn controller_publish_volume(
        &self,
        request: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        let mut core = self.core.lock().await;
        if !core.config.enable_attach {
            return Err(unsupported("controller publish (attach is off; see --enable-attach)"));
        }
        core.controller_publish(request.into_inner()).map(Response::new)
    }

    async fn controller_unpublish_volume(
        &self,
        request: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        let mut core = self.core.lock().await;
        if !core.config.enable_attach {
            return Err(unsupported("controller unpublish (attach is off; see --enable-attach)"));
        }
        core.controller_unpublish(request.into_inner()).map(Response::new)
    }

    async fn controller_modify_volume(
        &self,
        request: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        let mut core = self.core.lock().await;
        if !core.config.enable_controller_modify_volume {
            return Err(unsupported("controller modify volume (see --enable-controller-modify-volume)"));
        }
        core.modify_volume(request.into_inner()).map(Response::new)
    }

    async fn validate_volume_capabilities(
        &self,
        request: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.core.lock().await.validate_volume_capabilities(request.into_inner()).map(Response::new)
    }

    async fn list_volumes(
        &self,
        request: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        self.core.lock().await.list_volumes(request.into_inner()).map(Response::new)
    }

    async fn get_capacity(
        &self,
        request: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.core.lock().await.get_capacity(request.into_inner()).map(Response::new)
    }

    async fn controller_get_capabilities(
        &self,
        _request: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc as RpcCapability, Type};
        let rpcs = controller_capabilities(&self.core.lock().await.config);
        let capabilities = rpcs
            .iter()
            .map(|rpc| csi::ControllerServiceCapability {
                r#type: Some(Type::Rpc(RpcCapability { r#type: *rpc as i32 })),
            })
            .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities }))
    }

    async fn create_snapshot(
        &self,
        request: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.core.lock().await.create_snapshot(request.into_inner()).map(Response::new)
    }

    async fn delete_snapshot(
        &self,
        request: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.core.lock().await.delete_snapshot(request.into_inner()).map(Response::new)
    }

    async fn list_snapshots(
        &self,
        request: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        self.core.lock().await.list_snapshots(request.into_inner()).map(Response::new)
    }

    async fn controller_expand_volume(
        &self,
        request: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.core.lock().await.expand_volume(request.into_inner()).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    const MIB: i64 = 1 << 20;

    fn range(required_bytes: i64, limit_bytes: i64) -> Option<csi::CapacityRange> {
        Some(csi::CapacityRange { required_bytes, limit_bytes })
    }

    fn mount_cap(mode: i32) -> csi::VolumeCapability {
        csi::VolumeCapability {
            access_type: Some(AccessType::Mount(csi::volume_capability::MountVolume::default())),
            access_mode: Some(csi::volume_capability::AccessMode { mode }),
        }
    }

    #[test]
    fn capabilities_are_mount_or_block_with_a_known_mode() {
        let block = csi::VolumeCapability {
            access_type: Some(AccessType::Block(csi::volume_capability::BlockVolume {})),
            ..mount_cap(Mode::SingleNodeWriter as i32)
        };
        let cases = [
            (mount_cap(Mode::SingleNodeWriter as i32), None),
            (mount_cap(Mode::MultiNodeMultiWriter as i32), None),
            (mount_cap(Mode::SingleNodeReaderOnly as i32), None),
            (mount_cap(Mode::Unknown as i32), Some("access mode 0 is unknown")),
            (mount_cap(99), Some("access mode 99 is unknown")),
            (block.clone(), None),
            (csi::VolumeCapability { access_type: None, ..mount_cap(1) }, Some("has no access type")),
            (csi::VolumeCapability { access_mode: None, ..mount_cap(1) }, Some("has no access mode")),
        ];
        let mount = mount_cap(Mode::SingleNodeWriter as i32);
        assert_eq!(access_type_problem(true, &block), None);
        assert_eq!(access_type_problem(false, &mount), None);
        assert!(access_type_problem(true, &mount).unwrap().contains("it is a block volume"));
        assert!(access_type_problem(false, &block).unwrap().contains("block access was asked for"));
        assert_eq!(wants_block(&[block.clone(), block.clone()]), Ok(true));
        assert_eq!(wants_block(std::slice::from_ref(&mount)), Ok(false));
        assert!(wants_block(&[mount, block]).unwrap_err().contains("both block and mount"));
        for (cap, want) in cases {
            let got = capability_problem(&cap);
            match (want, &got) {
                (None, None) => {}
                (Some(w), Some(g)) if g.contains(w) => {}
                _ => panic!("{cap:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn capacities_round_up_to_mebibytes_within_the_limit() {
        let cases: &[(Option<csi::CapacityRange>, Result<i64, Code>)] = &[
            (None, Ok(0)),
            (range(0, 0), Ok(0)),
            (range(1, 0), Ok(MIB)),
            (range(MIB, 0), Ok(MIB)),
            (range(MIB + 1, 0), Ok(2 * MIB)),
            (range(0, 3 * MIB), Ok(3 * MIB)),
            (range(MIB + 1, MIB + 10), Ok(MIB + 1)),
            (range(MIB + 1, 2 * MIB), Ok(2 * MIB)),
            (range(5, 5), Ok(5)),
            (range(i64::MAX, 0), Ok(i64::MAX)),
            (range(-1, 0), Err(Code::InvalidArgument)),
            (range(0, -1), Err(Code::InvalidArgument)),
            (range(10, 5), Err(Code::InvalidArgument)),
        ];
        for (r, want) in cases {
            assert_eq!(capacity_for(r.as_ref()).map_err(|s| s.code()), *want, "{r:?}");
        }
    }

    #[test]
    fn existing_capacities_satisfy_ranges_they_fall_in() {
        let cases = [
            (0, None, true),
            (MIB, None, true),
            (MIB, range(MIB, 0), true),
            (2 * MIB, range(MIB, 0), true),
            (MIB, range(2 * MIB, 0), false),
            (2 * MIB, range(MIB, MIB), false),
            (0, range(1, 0), false),
            (0, range(0, MIB), true),
        ];
        for (capacity, r, want) in cases {
            assert_eq!(capacity_satisfies(capacity, r.as_ref()), want, "{capacity} {r:?}");
        }
    }

    #[test]
    fn restores_are_at_least_as_large_as_their_source() {
        let cases: &[(Option<csi::CapacityRange>, i64, Result<i64, Code>)] = &[
            (None, 3 * MIB, Ok(3 * MIB)),
            (range(MIB, 0), 3 * MIB, Ok(3 * MIB)),
            (range(5 * MIB, 0), 3 * MIB, Ok(5 * MIB)),
            (range(MIB, 2 * MIB), 3 * MIB, Err(Code::OutOfRange)),
            (range(MIB, 3 * MIB), 3 * MIB, Ok(3 * MIB)),
            (range(-1, 0), 0, Err(Code::InvalidArgument)),
        ];
        for (r, size, want) in cases {
            assert_eq!(restore_capacity(r.as_ref(), *size).map_err(|s| s.code()), *want, "{r:?} {size}");
        }
    }

    #[test]
    fn expansions_grow_and_never_shrink() {
        let cases: &[(i64, Option<csi::CapacityRange>, Result<i64, Code>)] = &[
            (MIB, range(3 * MIB, 0), Ok(3 * MIB)),
            (MIB, range(3 * MIB - 1, 0), Ok(3 * MIB)),
            (3 * MIB, range(MIB, 0), Ok(3 * MIB)),
            (3 * MIB, range(3 * MIB, 0), Ok(3 * MIB)),
            (3 * MIB, range(MIB, 2 * MIB), Err(Code::OutOfRange)),
            (MIB, None, Err(Code::InvalidArgument)),
            (MIB, range(5, 1), Err(Code::InvalidArgument)),
        ];
        for (current, r, want) in cases {
            assert_eq!(
                expanded_capacity(*current, r.as_ref()).map_err(|s| s.code()),
                *want,
                "{current} {r:?}"
            );
        }
    }

    #[test]
    fn requisite_topologies_must_include_this_node() {
        let topo = |pairs: &[(&str, &str)]| csi::Topology {
            segments: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        };
        let ours = topo(&[("t/node", "a")]);
        let req = |requisite: Vec<csi::Topology>, preferred: Vec<csi::Topology>| {
            Some(csi::TopologyRequirement { requisite, preferred })
        };
        let cases = [
            (None, true),
            (req(vec![], vec![topo(&[("t/node", "b")])]), true),
            (req(vec![topo(&[("t/node", "a")])], vec![]), true),
            (req(vec![topo(&[("t/node", "b")]), topo(&[("t/node", "a")])], vec![]), true),
            (req(vec![topo(&[("t/node", "b")])], vec![]), false),
            (req(vec![topo(&[("t/node", "a"), ("zone", "z")])], vec![]), false),
            (req(vec![topo(&[])], vec![]), true),
        ];
        for (r, want) in cases {
            assert_eq!(topology_allows(r.as_ref(), &ours), want, "{r:?}");
        }
    }

    #[test]
    fn pages_start_at_the_token_and_name_the_next() {
        let ids = ["vol-a", "vol-b", "vol-c"];
        let items = || ids.iter().map(|id| (id.to_string(), *id)).collect::<Vec<_>>();
        let valid: fn(&str) -> bool = |t| t.starts_with("vol-");
        type Page<'a> = Result<(&'a [&'a str], &'a str), Code>;
        let cases: &[(i32, &str, Page)] = &[
            (0, "", Ok((&["vol-a", "vol-b", "vol-c"], ""))),
            (2, "", Ok((&["vol-a", "vol-b"], "vol-c"))),
            (2, "vol-c", Ok((&["vol-c"], ""))),
            (1, "vol-b", Ok((&["vol-b"], "vol-c"))),
            (3, "", Ok((&["vol-a", "vol-b", "vol-c"], ""))),
            (5, "vol-bb", Ok((&["vol-c"], ""))),
            (0, "vol-z", Ok((&[], ""))),
            (0, "invalid-token", Err(Code::Aborted)),
            (-1, "", Err(Code::InvalidArgument)),
        ];
        for (max, token, want) in cases {
            let got = page(items(), *max, token, valid).map_err(|s| s.code());
            let want = want.map(|(v, t)| (v.to_vec(), t.to_string()));
            assert_eq!(got, want, "max {max} token {token}");
        }
    }
}
