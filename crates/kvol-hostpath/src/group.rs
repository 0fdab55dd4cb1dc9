//! The hostpath driver's CSI GroupController service: volume group snapshots, each a set of member snapshots made together and recorded in one commit, or not at all.

use tonic::{Request, Response, Status};

use crate::controller::now;
use crate::driver::{Hostpath, Shared, internal, required};
use crate::fsutil;
use crate::state::{GroupSnapshotRecord, SnapshotRecord, group_snapshot_id_for_name, member_snapshot_id};
use csi::group_controller_service_capability::rpc::Type as Rpc;
use kvol_csi::proto::csi::{self, group_controller_server::GroupController};

/// The source volume ids of a request, checked: at least one, none empty, no repeats (kept
/// in the order given).
pub fn source_volumes(name: &str, ids: &[String]) -> Result<Vec<String>, Status> {
    if ids.is_empty() {
        return Err(Status::invalid_argument(format!(
            "group snapshot {name}: source volume ids are missing"
        )));
    }
    let mut seen = std::collections::BTreeSet::new();
    for id in ids {
        if id.is_empty() {
            return Err(Status::invalid_argument(format!(
                "group snapshot {name}: a source volume id is empty"
            )));
        }
        if !seen.insert(id.as_str()) {
            return Err(Status::invalid_argument(format!(
                "group snapshot {name}: source volume {id} is named twice"
            )));
        }
    }
    Ok(ids.to_vec())
}

/// Checks the snapshot ids a Get or Delete names against the group's members: none named is
/// fine; otherwise they must be exactly the members (in any order).
pub fn members_match(group_id: &str, record: &GroupSnapshotRecord, named: &[String]) -> Result<(), Status> {
    if named.is_empty() {
        return Ok(());
    }
    let mut a: Vec<&String> = named.iter().collect();
    let mut b: Vec<&String> = record.snapshot_ids.iter().collect();
    a.sort();
    b.sort();
    if a != b {
        return Err(Status::invalid_argument(format!(
            "group snapshot {group_id} has snapshots {:?}, not {named:?}",
            record.snapshot_ids
        )));
    }
    Ok(())
}

impl Hostpath {
    fn group_message(&self, id: &str, record: &GroupSnapshotRecord) -> csi::VolumeGroupSnapshot {
        let snapshots = record
            .snapshot_ids
            .iter()
            .filter_map(|s| self.state.snapshots.get(s).map(|r| Self::snapshot_message(s, r)))
            .collect();
        csi::VolumeGroupSnapshot {
            group_snapshot_id: id.to_string(),
            snapshots,
            creation_time: Some(prost_types::Timestamp {
                seconds: record.created_seconds,
                nanos: record.created_nanos,
            }),
            ready_to_use: true,
        }
    }

    /// Copies every source volume into its member snapshot directory; on the first failure,
    /// removes the copies already made and returns the error: all members or none.
    fn copy_members(&self, members: &[(String, String)]) -> Result<(), Status> {
        for (done, (volume_id, snapshot_id)) in members.iter().enumerate() {
            let copied = match self.state.volumes.get(volume_id) {
                Some(v) => self.copy_to_snapshot(&self.layout.snapshot_dir(snapshot_id), volume_id, v),
                None => Err(Status::not_found(format!("source volume {volume_id} does not exist"))),
            };
            if let Err(e) = copied {
                for (_, made) in &members[..done] {
                    let _ = fsutil::remove_tree(&self.layout.snapshot_dir(made));
                }
                return Err(e);
            }
        }
        Ok(())
    }

    pub fn create_group_snapshot(
        &mut self,
        req: csi::CreateVolumeGroupSnapshotRequest,
    ) -> Result<csi::CreateVolumeGroupSnapshotResponse, Status> {
        let name = required(&req.name, "group snapshot name")?;
        let sources = source_volumes(name, &req.source_volume_ids)?;
        let id = group_snapshot_id_for_name(name);
        let members: Vec<(String, String)> =
            sources.iter().map(|v| (v.clone(), member_snapshot_id(&id, v))).collect();
        if let Some(existing) = self.state.group_snapshots.get(&id) {
            let same = existing.name == name
                && existing.snapshot_ids == members.iter().map(|(_, s)| s.clone()).collect::<Vec<_>>();
            if !same {
                return Err(Status::already_exists(format!(
                    "group snapshot {name} exists as {id} of other volumes"
                )));
            }
            return Ok(csi::CreateVolumeGroupSnapshotResponse {
                group_snapshot: Some(self.group_message(&id, existing)),
            });
        }
        for (volume_id, _) in &members {
            if self.state.volumes.get(volume_id).is_none_or(|v| v.ephemeral) {
                return Err(Status::not_found(format!(
                    "group snapshot {name}: source volume {volume_id} does not exist"
                )));
            }
        }
        self.copy_members(&members)
            .map_err(|s| Status::new(s.code(), format!("group snapshot {name}: {}", s.message())))?;
        let (created_seconds, created_nanos) = now();
        let mut next = self.state.clone();
        for (volume_id, snapshot_id) in &members {
            let size_bytes = self.state.volumes.get(volume_id).map_or(0, |v| v.capacity_bytes);
            let fs_type = self.state.volumes.get(volume_id).and_then(|v| v.fs_type);
            next.snapshots.insert(
                snapshot_id.clone(),
                SnapshotRecord {
                    name: format!("{name}/{volume_id}"),
                    source_volume_id: volume_id.clone(),
                    size_bytes,
                    created_seconds,
                    created_nanos,
                    group_snapshot_id: id.clone(),
                    fs_type,
                },
            );
        }
        let record = GroupSnapshotRecord {
            name: name.to_string(),
            snapshot_ids: members.iter().map(|(_, s)| s.clone()).collect(),
            created_seconds,
            created_nanos,
        };
        next.group_snapshots.insert(id.clone(), record.clone());
        if let Err(e) = self.commit(next) {
            for (_, snapshot_id) in &members {
                let _ = fsutil::remove_tree(&self.layout.snapshot_dir(snapshot_id));
            }
            return Err(e);
        }
        tracing::info!(group = %id, name, members = members.len(), "created group snapshot");
        Ok(csi::CreateVolumeGroupSnapshotResponse { group_snapshot: Some(self.group_message(&id, &record)) })
    }

    pub fn delete_group_snapshot(
        &mut self,
        req: csi::DeleteVolumeGroupSnapshotRequest,
    ) -> Result<csi::DeleteVolumeGroupSnapshotResponse, Status> {
        let id = required(&req.group_snapshot_id, "group snapshot id")?;
        let Some(record) = self.state.group_snapshots.get(id) else {
            return Ok(csi::DeleteVolumeGroupSnapshotResponse {});
        };
        members_match(id, record, &req.snapshot_ids)?;
        let dirs: Vec<_> = record.snapshot_ids.iter().map(|s| self.layout.snapshot_dir(s)).collect();
        for dir in &dirs {
            self.refuse_mounts_under(dir)?;
        }
        // Records first, in one commit: a crash afterwards leaves unrecorded directories,
        // never a group with some members gone.
        let mut next = self.state.clone();
        for s in &record.snapshot_ids {
            next.snapshots.remove(s);
        }
        next.group_snapshots.remove(id);
        self.commit(next)?;
        for dir in &dirs {
            fsutil::remove_tree(dir).map_err(internal)?;
        }
        tracing::info!(group = %id, "deleted group snapshot");
        Ok(csi::DeleteVolumeGroupSnapshotResponse {})
    }

    pub fn get_group_snapshot(
        &self,
        req: csi::GetVolumeGroupSnapshotRequest,
    ) -> Result<csi::GetVolumeGroupSnapshotResponse, Status> {
        let id = required(&req.group_snapshot_id, "group snapshot id")?;
        let Some(record) = self.state.group_snapshots.get(id) else {
            return Err(Status::not_found(format!("group snapshot {id} does not exist")));
        };
        members_match(id, record, &req.snapshot_ids)?;
        Ok(csi::GetVolumeGroupSnapshotResponse { group_snapshot: Some(self.group_message(id, record)) })
    }
}

/// The GroupController service over the shared driver state.
#[derive(Debug, Clone)]
pub struct GroupControllerService {
    pub(crate) core: Shared,
}

#[tonic::async_trait]
impl GroupController for GroupControllerService {
    async fn group_controller_get_capabilities(
        &self,
        _request: Request<csi::GroupControllerGetCapabilitiesRequest>,
    ) -> Result<Response<csi::GroupControllerGetCapabilitiesResponse>, Status> {
        use csi::group_controller_service_capability::{Rpc as RpcCapability, Type};
        let capabilities = vec![csi::GroupControllerServiceCapability {
            r#type: Some(Type::Rpc(RpcCapability { r#type: Rpc::CreateDeleteGetVolumeGroupSnapshot as i32 })),
        }];
        Ok(Response::new(csi::GroupControllerGetCapabilitiesResponse { capabilities }))
    }

    async fn create_volume_group_snapshot(
        &self,
        request: Request<csi::CreateVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::CreateVolumeGroupSnapshotResponse>, Status> {
        self.core.lock().await.create_group_snapshot(request.into_inner()).map(Response::new)
    }

    async fn delete_volume_group_snapshot(
        &self,
        request: Request<csi::DeleteVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::DeleteVolumeGroupSnapshotResponse>, Status> {
        self.core.lock().await.delete_group_snapshot(request.into_inner()).map(Response::new)
    }

    async fn get_volume_group_snapshot(
        &self,
        request: Request<csi::GetVolumeGroupSnapshotRequest>,
    ) -> Result<Response<csi::GetVolumeGroupSnapshotResponse>, Status> {
        self.core.lock().await.get_group_snapshot(request.into_inner()).map(Response::new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tonic::Code;

    #[test]
    fn source_volumes_are_checked() {
        let ids = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let cases: &[(&[&str], Result<(), &str>)] = &[
            (&["vol-a", "vol-b"], Ok(())),
            (&[], Err("source volume ids are missing")),
            (&["vol-a", ""], Err("a source volume id is empty")),
            (&["vol-a", "vol-a"], Err("source volume vol-a is named twice")),
        ];
        for (given, want) in cases {
            let got = source_volumes("g", &ids(given));
            match (want, got) {
                (Ok(()), Ok(v)) => assert_eq!(v, ids(given)),
                (Err(w), Err(s)) => {
                    assert_eq!(s.code(), Code::InvalidArgument);
                    assert_eq!(s.message(), format!("group snapshot g: {w}"));
                }
                (want, got) => panic!("{given:?}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn named_members_must_be_the_groups() {
        let record = GroupSnapshotRecord {
            snapshot_ids: vec!["snap-1".into(), "snap-2".into()],
            ..Default::default()
        };
        let cases: &[(&[&str], bool)] = &[
            (&[], true),
            (&["snap-2", "snap-1"], true),
            (&["snap-1"], false),
            (&["snap-1", "snap-2", "snap-3"], false),
            (&["snap-1", "snap-9"], false),
        ];
        for (named, ok) in cases {
            let named: Vec<String> = named.iter().map(|s| s.to_string()).collect();
            assert_eq!(members_match("group-x", &record, &named).is_ok(), *ok, "{named:?}");
        }
    }
}
