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
