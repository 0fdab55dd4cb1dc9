//! provisioning: CreateVolume → a pod writes and reads → DeleteVolume; volumes made from a snapshot and from a claim hold their source's data.

use kvol_csi::proto::csi::volume_content_source::{SnapshotSource, Type, VolumeSource};

use super::{CaseOutcome, Ctx, End};
use crate::data;
use crate::node::Want;
use crate::report::Failure;

/// Upstream's PVWriteReadSingleNodeCheck: a pod writes, a second pod on the node reads.
async fn write_read(ctx: &Ctx<'_>, volume: &crate::node::Volume, seed: &str) -> Result<(), Failure> {
    let bytes = data::pattern(seed, 4096);
    let writer = ctx.node.start_pod("writer", &[Want::Persistent { volume, read_only: false }]).await?;
    data::write(&writer.volumes[0].path, "data", &bytes)?;
    ctx.node.stop_pod(&writer).await?;
    let reader = ctx.node.start_pod("reader", &[Want::Persistent { volume, read_only: false }]).await?;
    data::expect(&reader.volumes[0].path, "data", &bytes, "the second pod on the node")?;
    ctx.node.stop_pod(&reader).await
}

/// Create (with the class's mount options when asked), write and read, delete; the capacity
/// CreateVolume reports must hold the request.
pub async fn defaults(ctx: &mut Ctx<'_>, mount_options: bool) -> CaseOutcome {
    let mut class = ctx.node.class.clone();
    if mount_options {
        // Upstream's class carries the supported and the required mount options.
        let info = &ctx.definition.driver_info;
        class.mount_options = Some(info.mount_options.union(&info.required_mount_options).cloned().collect());
    }
    let volume = ctx.node.provision_in(&class, ctx.size, None).await?;
    if volume.capacity != 0 && (volume.capacity as u64) < ctx.size {
        return Err(Failure::new(format!(
            "CreateVolume made volume {} of {} bytes for a claim of {} bytes",
            volume.handle, volume.capacity, ctx.size
        )));
    }
    write_read(ctx, &volume, "defaults").await?;
    ctx.node.delete(&volume).await?;
    Ok(End::Passed)
}

/// A volume restored from a snapshot holds what the source held when the snapshot was taken.
pub async fn from_snapshot(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let source = ctx.node.provision(ctx.size, None).await?;
    let before = data::pattern("snapshot-source", 8192);
    let pod =
        ctx.node.start_pod("injector", &[Want::Persistent { volume: &source, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "index.html", &before)?;
    ctx.node.stop_pod(&pod).await?;
    let snapshot = ctx.node.snapshot(&source).await?;
    // Written after the snapshot: the restored volume must not have it.
    let pod = ctx.node.start_pod("later", &[Want::Persistent { volume: &source, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "after-snapshot", b"later")?;
    ctx.node.stop_pod(&pod).await?;
    let restored =
        ctx.node.provision(ctx.size, Some(Type::Snapshot(SnapshotSource { snapshot_id: snapshot }))).await?;
    let pod =
        ctx.node.start_pod("checker", &[Want::Persistent { volume: &restored, read_only: false }]).await?;
    data::expect(&pod.volumes[0].path, "index.html", &before, "the volume restored from the snapshot")?;
    data::expect_absent(
        &pod.volumes[0].path,
        "after-snapshot",
        "the volume restored from the snapshot holds a file written after the snapshot",
    )?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// A volume cloned from a claim holds the source's data, and writes to either stay apart.
pub async fn from_claim(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let source = ctx.node.provision(ctx.size, None).await?;
    let content = data::pattern("clone-source", 8192);
    let pod =
        ctx.node.start_pod("injector", &[Want::Persistent { volume: &source, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "index.html", &content)?;
    ctx.node.stop_pod(&pod).await?;
    let clone = ctx
        .node
        .provision(ctx.size, Some(Type::Volume(VolumeSource { volume_id: source.handle.clone() })))
        .await?;
    let pod = ctx.node.start_pod("checker", &[Want::Persistent { volume: &clone, read_only: false }]).await?;
    data::expect(&pod.volumes[0].path, "index.html", &content, "the volume cloned from the claim")?;
    data::write(&pod.volumes[0].path, "clone-only", b"clone")?;
    ctx.node.stop_pod(&pod).await?;
    let pod = ctx.node.start_pod("source", &[Want::Persistent { volume: &source, read_only: false }]).await?;
    data::expect_absent(
        &pod.volumes[0].path,
        "clone-only",
        "the source volume shows a file written to its clone",
    )?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// Upstream's snapshottable case: the snapshot's fields, a restore that holds the data as it
/// was at the snapshot although the source changed after, and deletion (twice: the second is
/// the idempotent repeat CSI requires).
pub async fn snapshottable(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let source = ctx.node.provision(ctx.size, None).await?;
    let before = data::pattern("snapshottable-before", 4096);
    let pod = ctx.node.start_pod("source", &[Want::Persistent { volume: &source, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "data", &before)?;
    ctx.node.stop_pod(&pod).await?;
    let snapshot = ctx.node.take_snapshot(&source).await?;
    if let Some(problem) = snapshot_problem(&snapshot, &source.handle) {
        return Err(Failure::new(format!("CreateSnapshot answered a snapshot that {problem}: {snapshot:?}")));
    }
    let pod = ctx.node.start_pod("modify", &[Want::Persistent { volume: &source, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "data", b"modified after the snapshot")?;
    ctx.node.stop_pod(&pod).await?;
    let source_type = Type::Snapshot(SnapshotSource { snapshot_id: snapshot.snapshot_id.clone() });
    let restored = ctx.node.provision(ctx.size, Some(source_type)).await?;
    let pod =
        ctx.node.start_pod("restored", &[Want::Persistent { volume: &restored, read_only: false }]).await?;
    data::expect(
        &pod.volumes[0].path,
        "data",
        &before,
        "the volume restored from the snapshot (the source was modified after it)",
    )?;
    ctx.node.stop_pod(&pod).await?;
    ctx.node.delete_snapshot(&snapshot.snapshot_id).await?;
    ctx.node.delete_snapshot(&snapshot.snapshot_id).await.map_err(|f| {
        Failure::new(format!(
            "a second DeleteSnapshot of a deleted snapshot must succeed (CSI: idempotent): {}",
            f.message
        ))
    })?;
    Ok(End::Passed)
}

/// What is wrong with a ready snapshot of volume `source`. Pure.
pub fn snapshot_problem(snapshot: &kvol_csi::proto::csi::Snapshot, source: &str) -> Option<String> {
    if snapshot.snapshot_id.is_empty() {
        return Some("has no snapshot_id".to_string());
    }
    if snapshot.source_volume_id != source {
        return Some(format!("names source volume {:?}, not {source:?}", snapshot.source_volume_id));
    }
    if snapshot.creation_time.is_none() {
        return Some("has no creation_time".to_string());
    }
    if snapshot.size_bytes < 0 {
        return Some(format!("has a negative size_bytes {}", snapshot.size_bytes));
    }
    None
}

#[cfg(test)]
mod tests {
    use kvol_csi::proto::csi::Snapshot;

    use super::snapshot_problem;

    #[test]
    fn snapshot_fields_are_checked() {
        let good = Snapshot {
            snapshot_id: "s1".into(),
            source_volume_id: "v1".into(),
            creation_time: Some(Default::default()),
            size_bytes: 10,
            ready_to_use: true,
            ..Default::default()
        };
        // (snapshot, problem starts with)
        let table = [
            (good.clone(), None),
            (Snapshot { snapshot_id: String::new(), ..good.clone() }, Some("has no snapshot_id")),
            (Snapshot { source_volume_id: "v2".into(), ..good.clone() }, Some("names source volume \"v2\"")),
            (Snapshot { creation_time: None, ..good.clone() }, Some("has no creation_time")),
            (Snapshot { size_bytes: -1, ..good.clone() }, Some("has a negative size_bytes")),
        ];
        for (snapshot, problem) in table {
            let found = snapshot_problem(&snapshot, "v1");
            match problem {
                None => assert_eq!(found, None),
                Some(start) => assert!(found.as_deref().is_some_and(|f| f.starts_with(start)), "{found:?}"),
            }
        }
    }
}
