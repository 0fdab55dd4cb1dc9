//! The LVM driver's CSI Controller service: volumes as logical volumes (thick or thin) and thin snapshots, idempotent by name through the tags lvcreate sets; capacity per device class.

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use crate::capacity::{self, Space};
use crate::driver::{Core, Shared, choose_class, lvm_error, required};
use crate::lvm::NewLv;
use crate::lvmd::{ClassKind, DeviceClass};
use crate::lvs::LogicalVolume;
use crate::naming::{self, SNAPSHOT_PREFIX, SOURCE_TAG, VOLUME_PREFIX};
use csi::controller_service_capability::rpc::Type as Rpc;
use csi::volume_capability::access_mode::Mode;
use csi::volume_content_source::{SnapshotSource, Type as SourceType};
use kvol_csi::proto::csi::{self, controller_server::Controller};
use kvol_hostpath::controller::capability_problem;

/// The controller RPCs this driver serves.
pub const CONTROLLER_CAPABILITIES: [Rpc; 4] =
    [Rpc::CreateDeleteVolume, Rpc::CreateDeleteSnapshot, Rpc::ExpandVolume, Rpc::GetCapacity];

/// The volume-context key naming the device class a volume was made in.
pub const CLASS_CONTEXT_KEY: &str = "kvol.io/device-class";

/// Why the driver cannot serve `capability`, if it cannot: a logical volume lives on one node,
/// so only single-node access modes are served.
pub fn volume_capability_problem(capability: &csi::VolumeCapability) -> Option<String> {
    if let Some(problem) = capability_problem(capability) {
        return Some(problem);
    }
    let mode = capability.access_mode.map(|m| Mode::try_from(m.mode));
    match mode {
        Some(Ok(Mode::MultiNodeReaderOnly | Mode::MultiNodeSingleWriter | Mode::MultiNodeMultiWriter)) => {
            Some("multi-node access modes are not served: a logical volume lives on one node".into())
        }
        _ => None,
    }
}

/// Why a volume cannot be made on `node` (topology key `key`) for `requirement`, if it cannot:
/// a requisite topology must include this node.
pub fn topology_problem(
    requirement: Option<&csi::TopologyRequirement>,
    key: &str,
    node: &str,
) -> Option<String> {
    let requisite = &requirement?.requisite;
    if requisite.is_empty() || requisite.iter().any(|t| t.segments.get(key).is_some_and(|n| n == node)) {
        return None;
    }
    Some(format!(
        "the requisite topology does not include node {node} ({key}), the only one this driver serves"
    ))
}

/// Why the existing logical volume `lv` does not answer a create request for `required`..`limit`
/// bytes from `source` (an id, or none) in a class on `target`, if it does not.
pub fn existing_problem(
    lv: &LogicalVolume,
    target: &str,
    required: i64,
    limit: i64,
    source: Option<&str>,
) -> Option<String> {
    let lv_target = crate::reload::target_of(&lv.vg, lv.pool.as_deref());
    let lv_source = naming::tag_value(&lv.tags, SOURCE_TAG);
    if lv_target != target {
        Some(format!("it exists in {lv_target}, not in {target}"))
    } else if !capacity::size_fits(lv.size, required, limit) {
        Some(format!("it exists with {} bytes, outside {required}..{limit}", lv.size))
    } else if lv_source != source {
        Some(format!("it exists with content source {lv_source:?}, not {source:?}"))
    } else {
        None
    }
}

/// Why volume `name` of class `class` cannot be restored from snapshot `snap` (found as
/// `origin`, if it is the driver's): it must exist, and the class be thin on the snapshot's pool
/// (a restored volume is a thin snapshot of it, in its pool).
pub fn restore_problem(
    name: &str,
    class: &DeviceClass,
    origin: Option<&LogicalVolume>,
    snap: &str,
) -> Result<(), Status> {
    let Some(origin) = origin else {
        return Err(Status::not_found(format!("volume {name}: snapshot {snap} does not exist")));
    };
    if class.class_kind() != Some(ClassKind::Thin) {
        return Err(Status::invalid_argument(format!(
            "volume {name}: device class {} is thick; volumes are restored from snapshots in thin classes only",
            class.name
        )));
    }
    let origin_target = crate::reload::target_of(&origin.vg, origin.pool.as_deref());
    if origin_target != class.target() {
        return Err(Status::invalid_argument(format!(
            "volume {name}: snapshot {snap} is in {origin_target}, and device class {} is {}; restore it in its own class",
            class.name,
            class.target()
        )));
    }
    Ok(())
}

fn capabilities_problem(id: &str, caps: &[csi::VolumeCapability]) -> Result<(), Status> {
    if caps.is_empty() {
        return Err(Status::invalid_argument(format!("volume {id}: volume capabilities are missing")));
    }
    match caps.iter().find_map(volume_capability_problem) {
        Some(problem) => Err(Status::invalid_argument(format!("volume {id}: {problem}"))),
        None => Ok(()),
    }
}

/// The snapshot a create request restores, if any; cloning a volume is refused.
fn snapshot_source(name: &str, source: Option<&csi::VolumeContentSource>) -> Result<Option<String>, Status> {
    match source.and_then(|s| s.r#type.as_ref()) {
        None => Ok(None),
        Some(SourceType::Snapshot(SnapshotSource { snapshot_id })) => Ok(Some(snapshot_id.clone())),
        Some(SourceType::Volume(_)) => Err(Status::invalid_argument(format!(
            "volume {name}: cloning a volume is not supported; take a snapshot and restore it"
        ))),
    }
}

impl Core {
    fn volume_response(
        &self,
        lv: &LogicalVolume,
        class: &str,
        source: Option<&csi::VolumeContentSource>,
    ) -> csi::Volume {
        csi::Volume {
            capacity_bytes: lv.size as i64,
            volume_id: lv.name.clone(),
            volume_context: HashMap::from([(CLASS_CONTEXT_KEY.to_string(), class.to_string())]),
            content_source: source.cloned(),
            accessible_topology: vec![self.topology()],
        }
    }

    async fn shortage(&self, class: &DeviceClass, space: Option<Space>, extra: u64) -> Result<(), Status> {
        let space = match space {
            Some(s) => s,
            None => self.space(class).await?,
        };
        match capacity::shortage(class, space, extra) {
            Some(reason) => Err(Status::resource_exhausted(reason)),
            None => Ok(()),
        }
    }

    pub async fn create_volume(
        &self,
        req: csi::CreateVolumeRequest,
    ) -> Result<csi::CreateVolumeResponse, Status> {
        let name = required(&req.name, "volume name")?;
        capabilities_problem(name, &req.volume_capabilities)?;
        let class = choose_class(&self.lvmd, &self.config.driver_name, &req.parameters)
            .map_err(|e| Status::invalid_argument(format!("volume {name}: {e}")))?;
        if let Some(problem) = topology_problem(
            req.accessibility_requirements.as_ref(),
            &self.config.topology_key(),
            &self.config.node_name,
        ) {
            return Err(Status::resource_exhausted(format!("volume {name}: {problem}")));
        }
        let snapshot = snapshot_source(name, req.volume_content_source.as_ref())?;
        let (required_bytes, limit) =
            req.capacity_range.as_ref().map_or((0, 0), |r| (r.required_bytes, r.limit_bytes));
        let id = naming::volume_id(name);
        let owned = self.owned().await?;
        let origin = match &snapshot {
            Some(snap) => Some(self.restorable(name, class, &owned, snap)?),
            None => None,
        };
        let target =
            origin.map_or_else(|| class.target(), |o| crate::reload::target_of(&o.vg, o.pool.as_deref()));
        if let Some(lv) = owned.iter().find(|lv| lv.name == id) {
            if let Some(problem) = existing_problem(lv, &target, required_bytes, limit, snapshot.as_deref()) {
                return Err(Status::already_exists(format!("volume {name} ({id}): {problem}")));
            }
            let lv = self.finish_restore(&id, lv.clone(), required_bytes).await?;
            return Ok(csi::CreateVolumeResponse {
                volume: Some(self.volume_response(&lv, &class.name, req.volume_content_source.as_ref())),
            });
        }
        let extent = self.extent(&class.volume_group).await?;
        let size = capacity::volume_size(required_bytes, limit, extent)
            .map_err(|e| Status::out_of_range(format!("volume {name}: {e}")))?;
        let tags = naming::tags(&self.config.driver_name, name, &class.name, snapshot.as_deref());
        match origin {
            Some(origin) => {
                let extra = size.max(origin.size);
                self.shortage(class, None, extra).await.map_err(|s| with_name(name, s))?;
                let how = NewLv::ThinSnapshot { vg: &origin.vg, origin: &origin.name, active: true };
                self.lvm.create(&id, &how, &tags).await.map_err(|e| lvm_error(&id, e))?;
            }
            None => {
                self.shortage(class, None, size).await.map_err(|s| with_name(name, s))?;
                self.lvm.create(&id, &new_lv(class, size), &tags).await.map_err(|e| lvm_error(&id, e))?;
            }
        }
        let lv = self.get(&id).await?;
        let lv = self.finish_restore(&id, lv, size as i64).await?;
        tracing::info!(volume = %id, name, class = %class.name, size = lv.size, "created volume");
        Ok(csi::CreateVolumeResponse {
            volume: Some(self.volume_response(&lv, &class.name, req.volume_content_source.as_ref())),
        })
    }

    /// The snapshot `snap` a volume of class `class` is restored from (see [`restore_problem`]).
    fn restorable<'a>(
        &self,
        name: &str,
        class: &DeviceClass,
        owned: &'a [LogicalVolume],
        snap: &str,
    ) -> Result<&'a LogicalVolume, Status> {
        let origin = owned.iter().find(|lv| lv.name == snap && naming::is_id(snap, SNAPSHOT_PREFIX));
        restore_problem(name, class, origin, snap)?;
        origin.ok_or_else(|| Status::not_found(format!("volume {name}: snapshot {snap} does not exist")))
    }

    /// A volume restored from a snapshot grown to `required` bytes, if smaller (a crash may
    /// have come between lvcreate and lvextend).
    async fn finish_restore(
        &self,
        id: &str,
        lv: LogicalVolume,
        required: i64,
    ) -> Result<LogicalVolume, Status> {
        if naming::tag_value(&lv.tags, SOURCE_TAG).is_none() || lv.size >= required.max(0) as u64 {
            return Ok(lv);
        }
        let extent = self.extent(&lv.vg).await?;
        let size = capacity::volume_size(required, 0, extent)
            .map_err(|e| Status::out_of_range(format!("volume {id}: {e}")))?;
        self.lvm.extend(&lv, size).await.map_err(|e| lvm_error(id, e))?;
        self.get(id).await
    }

    pub async fn delete_volume(
        &self,
        req: csi::DeleteVolumeRequest,
    ) -> Result<csi::DeleteVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        if let Some(lv) = self.find(id).await?.filter(|_| naming::is_id(id, VOLUME_PREFIX)) {
            self.lvm.remove(&lv).await.map_err(|e| lvm_error(id, e))?;
            tracing::info!(volume = %id, lv = %lv.full_name(), "deleted volume");
        }
        Ok(csi::DeleteVolumeResponse {})
    }

    pub async fn validate(
        &self,
        req: csi::ValidateVolumeCapabilitiesRequest,
    ) -> Result<csi::ValidateVolumeCapabilitiesResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        if req.volume_capabilities.is_empty() {
            return Err(Status::invalid_argument(format!("volume {id}: volume capabilities are missing")));
        }
        self.get(id).await?;
        let problem = req.volume_capabilities.iter().find_map(volume_capability_problem);
        Ok(match problem {
            Some(message) => csi::ValidateVolumeCapabilitiesResponse { confirmed: None, message },
            None => csi::ValidateVolumeCapabilitiesResponse {
                confirmed: Some(csi::validate_volume_capabilities_response::Confirmed {
                    volume_context: req.volume_context,
                    volume_capabilities: req.volume_capabilities,
                    parameters: req.parameters,
                    mutable_parameters: req.mutable_parameters,
                }),
                message: String::new(),
            },
        })
    }

    pub async fn capacity(&self, req: csi::GetCapacityRequest) -> Result<csi::GetCapacityResponse, Status> {
        let class = choose_class(&self.lvmd, &self.config.driver_name, &req.parameters)
            .map_err(Status::invalid_argument)?;
        let elsewhere = req.accessible_topology.as_ref().is_some_and(|t| {
            t.segments.get(&self.config.topology_key()).is_none_or(|n| *n != self.config.node_name)
        });
        let available = if elsewhere { 0 } else { capacity::available(class, self.space(class).await?) };
        let available = i64::try_from(available).unwrap_or(i64::MAX);
        Ok(csi::GetCapacityResponse {
            available_capacity: available,
            maximum_volume_size: Some(available),
            minimum_volume_size: None,
        })
    }

    pub async fn expand(
        &self,
        req: csi::ControllerExpandVolumeRequest,
    ) -> Result<csi::ControllerExpandVolumeResponse, Status> {
        let id = required(&req.volume_id, "volume id")?;
        let range = req
            .capacity_range
            .as_ref()
            .ok_or_else(|| Status::invalid_argument(format!("volume {id}: capacity range is missing")))?;
        let lv = self.get(id).await?;
        let block = req.volume_capability.as_ref().is_some_and(kvol_hostpath::controller::is_block);
        let extent = self.extent(&lv.vg).await?;
        let size = capacity::volume_size(range.required_bytes, range.limit_bytes, extent)
            .map_err(|e| Status::out_of_range(format!("volume {id}: {e}")))?;
        if size > lv.size {
            let class = self.class_of(&lv).ok_or_else(|| {
                Status::failed_precondition(format!(
                    "volume {id}: no device class of lvmd.yaml holds {}",
                    lv.full_name()
                ))
            })?;
            self.shortage(class, None, size - lv.size).await.map_err(|s| with_name(id, s))?;
            self.lvm.extend(&lv, size).await.map_err(|e| lvm_error(id, e))?;
            tracing::info!(volume = %id, from = lv.size, to = size, "expanded volume");
        }
        Ok(csi::ControllerExpandVolumeResponse {
            capacity_bytes: size.max(lv.size) as i64,
            node_expansion_required: !block,
        })
    }

    pub async fn create_snapshot(
        &self,
        req: csi::CreateSnapshotRequest,
    ) -> Result<csi::CreateSnapshotResponse, Status> {
        let name = required(&req.name, "snapshot name")?;
        let source_id = required(&req.source_volume_id, "source volume id")?;
        let owned = self.owned().await?;
        let source = owned
            .iter()
            .find(|lv| lv.name == source_id && naming::is_id(source_id, VOLUME_PREFIX))
            .ok_or_else(|| {
                Status::not_found(format!("snapshot {name}: source volume {source_id} does not exist"))
            })?;
        if source.pool.is_none() {
            return Err(Status::failed_precondition(format!(
                "snapshot {name}: volume {source_id} is a thick volume ({}); snapshots are taken of volumes in thin device classes only",
                source.full_name()
            )));
        }
        let id = naming::snapshot_id(name);
        let lv = match owned.iter().find(|lv| lv.name == id) {
            Some(lv) if naming::tag_value(&lv.tags, SOURCE_TAG) == Some(source_id) => lv.clone(),
            Some(lv) => {
                return Err(Status::already_exists(format!(
                    "snapshot {name} ({id}) exists with source volume {:?}, not {source_id}",
                    naming::tag_value(&lv.tags, SOURCE_TAG)
                )));
            }
            None => {
                let class = self.class_of(source).map(|c| c.name.clone()).unwrap_or_default();
                if let Some(c) = self.class_of(source) {
                    self.shortage(c, None, source.size).await.map_err(|s| with_name(name, s))?;
                }
                let tags = naming::tags(&self.config.driver_name, name, &class, Some(source_id));
                let how = NewLv::ThinSnapshot { vg: &source.vg, origin: &source.name, active: false };
                self.lvm.create(&id, &how, &tags).await.map_err(|e| lvm_error(&id, e))?;
                tracing::info!(snapshot = %id, name, source = %source_id, "created snapshot");
                self.get(&id).await?
            }
        };
        Ok(csi::CreateSnapshotResponse {
            snapshot: Some(csi::Snapshot {
                size_bytes: lv.size as i64,
                snapshot_id: id,
                source_volume_id: source_id.to_string(),
                creation_time: Some(prost_types::Timestamp { seconds: lv.created, nanos: 0 }),
                ready_to_use: true,
                group_snapshot_id: String::new(),
            }),
        })
    }

    pub async fn delete_snapshot(
        &self,
        req: csi::DeleteSnapshotRequest,
    ) -> Result<csi::DeleteSnapshotResponse, Status> {
        let id = required(&req.snapshot_id, "snapshot id")?;
        if let Some(lv) = self.find(id).await?.filter(|_| naming::is_id(id, SNAPSHOT_PREFIX)) {
            self.lvm.remove(&lv).await.map_err(|e| Status::internal(format!("snapshot {id}: {e}")))?;
            tracing::info!(snapshot = %id, "deleted snapshot");
        }
        Ok(csi::DeleteSnapshotResponse {})
    }
}

/// How a class makes a new volume of `size` bytes.
fn new_lv(class: &DeviceClass, size: u64) -> NewLv<'_> {
    match (class.class_kind(), &class.thin_pool) {
        (Some(ClassKind::Thin), Some(pool)) => {
            NewLv::Thin { vg: &class.volume_group, pool: &pool.name, size, options: &class.lvcreate_options }
        }
        _ => NewLv::Thick {
            vg: &class.volume_group,
            size,
            stripe: class.stripe,
            stripe_size: &class.stripe_size,
            options: &class.lvcreate_options,
        },
    }
}

fn with_name(name: &str, status: Status) -> Status {
    Status::new(status.code(), format!("volume {name}: {}", status.message()))
}

/// The Controller service.
#[derive(Debug, Clone)]
pub struct ControllerService {
    pub(crate) core: Shared,
}

fn unimplemented<T>(what: &str) -> Result<Response<T>, Status> {
    Err(Status::unimplemented(format!("{what} is not served by this driver")))
}

#[tonic::async_trait]
impl Controller for ControllerService {
    async fn create_volume(
        &self,
        r: Request<csi::CreateVolumeRequest>,
    ) -> Result<Response<csi::CreateVolumeResponse>, Status> {
        self.core.lock().await.create_volume(r.into_inner()).await.map(Response::new)
    }
    async fn delete_volume(
        &self,
        r: Request<csi::DeleteVolumeRequest>,
    ) -> Result<Response<csi::DeleteVolumeResponse>, Status> {
        self.core.lock().await.delete_volume(r.into_inner()).await.map(Response::new)
    }
    async fn controller_publish_volume(
        &self,
        _: Request<csi::ControllerPublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerPublishVolumeResponse>, Status> {
        unimplemented("ControllerPublishVolume")
    }
    async fn controller_unpublish_volume(
        &self,
        _: Request<csi::ControllerUnpublishVolumeRequest>,
    ) -> Result<Response<csi::ControllerUnpublishVolumeResponse>, Status> {
        unimplemented("ControllerUnpublishVolume")
    }
    async fn validate_volume_capabilities(
        &self,
        r: Request<csi::ValidateVolumeCapabilitiesRequest>,
    ) -> Result<Response<csi::ValidateVolumeCapabilitiesResponse>, Status> {
        self.core.lock().await.validate(r.into_inner()).await.map(Response::new)
    }
    async fn list_volumes(
        &self,
        _: Request<csi::ListVolumesRequest>,
    ) -> Result<Response<csi::ListVolumesResponse>, Status> {
        unimplemented("ListVolumes")
    }
    async fn get_capacity(
        &self,
        r: Request<csi::GetCapacityRequest>,
    ) -> Result<Response<csi::GetCapacityResponse>, Status> {
        self.core.lock().await.capacity(r.into_inner()).await.map(Response::new)
    }
    async fn controller_get_capabilities(
        &self,
        _: Request<csi::ControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::ControllerGetCapabilitiesResponse>, Status> {
        use csi::controller_service_capability::{Rpc as RpcCap, Type};
        let capabilities = CONTROLLER_CAPABILITIES
            .iter()
            .map(|t| csi::ControllerServiceCapability {
                r#type: Some(Type::Rpc(RpcCap { r#type: *t as i32 })),
            })
            .collect();
        Ok(Response::new(csi::ControllerGetCapabilitiesResponse { capabilities }))
    }
    async fn create_snapshot(
        &self,
        r: Request<csi::CreateSnapshotRequest>,
    ) -> Result<Response<csi::CreateSnapshotResponse>, Status> {
        self.core.lock().await.create_snapshot(r.into_inner()).await.map(Response::new)
    }
    async fn delete_snapshot(
        &self,
        r: Request<csi::DeleteSnapshotRequest>,
    ) -> Result<Response<csi::DeleteSnapshotResponse>, Status> {
        self.core.lock().await.delete_snapshot(r.into_inner()).await.map(Response::new)
    }
    async fn list_snapshots(
        &self,
        _: Request<csi::ListSnapshotsRequest>,
    ) -> Result<Response<csi::ListSnapshotsResponse>, Status> {
        unimplemented("ListSnapshots")
    }
    async fn controller_expand_volume(
        &self,
        r: Request<csi::ControllerExpandVolumeRequest>,
    ) -> Result<Response<csi::ControllerExpandVolumeResponse>, Status> {
        self.core.lock().await.expand(r.into_inner()).await.map(Response::new)
    }
    async fn controller_modify_volume(
        &self,
        _: Request<csi::ControllerModifyVolumeRequest>,
    ) -> Result<Response<csi::ControllerModifyVolumeResponse>, Status> {
        unimplemented("ControllerModifyVolume")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use csi::volume_capability::{AccessMode, AccessType, BlockVolume, MountVolume};
    use tonic::Code;

    fn cap(mode: Mode, block: bool) -> csi::VolumeCapability {
        let access_type =
            if block { AccessType::Block(BlockVolume {}) } else { AccessType::Mount(MountVolume::default()) };
        csi::VolumeCapability {
            access_type: Some(access_type),
            access_mode: Some(AccessMode { mode: mode as i32 }),
        }
    }

    #[test]
    fn only_single_node_modes_are_served() {
        let rows = [
            (cap(Mode::SingleNodeWriter, false), None),
            (cap(Mode::SingleNodeReaderOnly, true), None),
            (cap(Mode::SingleNodeMultiWriter, false), None),
            (
                cap(Mode::MultiNodeMultiWriter, false),
                Some("multi-node access modes are not served: a logical volume lives on one node"),
            ),
            (
                csi::VolumeCapability { access_type: None, ..cap(Mode::SingleNodeWriter, false) },
                Some("a volume capability has no access type (mount or block)"),
            ),
        ];
        for (c, want) in rows {
            assert_eq!(volume_capability_problem(&c).as_deref(), want, "{c:?}");
        }
    }

    #[test]
    fn requisite_topology_must_include_the_node() {
        let key = "topology.lvm.csi.kvol.io/node";
        let topo =
            |node: &str| csi::Topology { segments: HashMap::from([(key.to_string(), node.to_string())]) };
        let req = |nodes: &[&str]| csi::TopologyRequirement {
            requisite: nodes.iter().map(|n| topo(n)).collect(),
            preferred: vec![],
        };
        let rows = [
            (None, true),
            (Some(req(&[])), true),
            (Some(req(&["a"])), true),
            (Some(req(&["b", "a"])), true),
            (Some(req(&["b"])), false),
        ];
        for (requirement, ok) in rows {
            assert_eq!(topology_problem(requirement.as_ref(), key, "a").is_none(), ok, "{requirement:?}");
        }
    }

    #[test]
    fn snapshots_are_restored_only_in_their_own_thin_class() {
        use crate::lvmd::ThinPool;
        let thin = |pool: &str| DeviceClass {
            name: "fast".into(),
            volume_group: "vg0".into(),
            kind: "thin".into(),
            thin_pool: Some(ThinPool { name: pool.into(), overprovision_ratio: 2.0 }),
            ..Default::default()
        };
        let thick = DeviceClass { name: "hdd".into(), volume_group: "vg0".into(), ..Default::default() };
        let snap = LogicalVolume {
            name: "snap-1".into(),
            vg: "vg0".into(),
            pool: Some("pool".into()),
            ..Default::default()
        };
        type Row<'a> = (DeviceClass, Option<&'a LogicalVolume>, Result<(), (Code, &'a str)>);
        let rows: Vec<Row> = vec![
            (thin("pool"), Some(&snap), Ok(())),
            (thin("pool"), None, Err((Code::NotFound, "volume v: snapshot snap-1 does not exist"))),
            (
                thick.clone(),
                Some(&snap),
                Err((
                    Code::InvalidArgument,
                    "volume v: device class hdd is thick; volumes are restored from snapshots in thin classes only",
                )),
            ),
            (
                thin("other"),
                Some(&snap),
                Err((
                    Code::InvalidArgument,
                    "volume v: snapshot snap-1 is in vg0/pool, and device class fast is vg0/other; restore it in its own class",
                )),
            ),
        ];
        for (class, origin, want) in rows {
            let got = restore_problem("v", &class, origin, "snap-1")
                .map_err(|s| (s.code(), s.message().to_string()));
            assert_eq!(got, want.map_err(|(c, m)| (c, m.to_string())), "{}", class.name);
        }
    }

    #[test]
    fn an_existing_volume_answers_only_the_same_request() {
        let lv = LogicalVolume {
            name: "vol-1".into(),
            vg: "vg0".into(),
            size: 8 << 20,
            pool: Some("pool".into()),
            tags: vec!["kvol.source=snap-1".into()],
            ..Default::default()
        };
        type Row<'a> = (&'a str, i64, i64, Option<&'a str>, Option<&'a str>);
        let rows: Vec<Row> = vec![
            ("vg0/pool", 8 << 20, 0, Some("snap-1"), None),
            ("vg0/pool", 1, 8 << 20, Some("snap-1"), None),
            ("vg0", 1, 0, Some("snap-1"), Some("it exists in vg0/pool, not in vg0")),
            (
                "vg0/pool",
                9 << 20,
                0,
                Some("snap-1"),
                Some("it exists with 8388608 bytes, outside 9437184..0"),
            ),
            ("vg0/pool", 1, 0, None, Some("it exists with content source Some(\"snap-1\"), not None")),
        ];
        for (target, required, limit, source, want) in rows {
            assert_eq!(
                existing_problem(&lv, target, required, limit, source).as_deref(),
                want,
                "{target} {required} {source:?}"
            );
        }
    }
}
