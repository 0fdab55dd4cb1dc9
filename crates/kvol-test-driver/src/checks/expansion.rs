//! volume-expand: a volume grown by ControllerExpandVolume (and NodeExpandVolume when the driver asks for it) while no pod uses it and while one does; the data kept, and a volume with a filesystem of its own shows the new size.

use super::{CaseOutcome, Ctx, End};
use crate::data;
use crate::node::{Published, Want};
use crate::report::Failure;

/// How much the cases grow a volume by.
const GROWTH: u64 = 64 << 20;

/// Checks the grown volume: its data, and its filesystem's growth when the volume had one of
/// its own (smaller than the new size before growing; a directory on the node's filesystem
/// shows that filesystem's size, which says nothing). A filesystem keeps some of its device
/// for itself, so the filesystem must have grown by half the growth at least.
fn check_grown(published: &Published, fs_before: u64, new_size: u64, content: &[u8]) -> Result<(), Failure> {
    data::expect(&published.path, "data", content, "the grown volume")?;
    let fs_after = data::filesystem_size(&published.path)?;
    if fs_before < new_size && fs_after < fs_before + GROWTH / 2 {
        return Err(Failure::new(format!(
            "the volume was grown to {new_size} bytes but its filesystem at {} is {fs_after} bytes (was {fs_before}): the filesystem was not grown",
            published.path.display()
        )));
    }
    Ok(())
}

/// ControllerExpandVolume's answer checked: the capacity it reports holds the request.
async fn grow(ctx: &Ctx<'_>, volume: &crate::node::Volume, new_size: u64) -> Result<bool, Failure> {
    let (capacity, node_expansion) = ctx.node.controller_expand(volume, new_size).await?;
    if capacity != 0 && (capacity as u64) < new_size {
        return Err(Failure::new(format!(
            "ControllerExpandVolume of volume {} to {new_size} bytes answered capacity {capacity}",
            volume.handle
        )));
    }
    Ok(node_expansion)
}

/// Offline: the pod goes, the volume is grown, a new pod gets it (and the node's part of the
/// growth, as kubelet grows a volume at its next mount).
pub async fn offline(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let content = data::pattern("offline", 4096);
    let pod = ctx.node.start_pod("before", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "data", &content)?;
    let fs_before = data::filesystem_size(&pod.volumes[0].path)?;
    ctx.node.stop_pod(&pod).await?;
    let new_size = ctx.size + GROWTH;
    let node_expansion = grow(ctx, &volume, new_size).await?;
    let pod = ctx.node.start_pod("after", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    if node_expansion && ctx.node.plugin.driver_capabilities().node.expand {
        ctx.node.node_expand(&pod.volumes[0], new_size, ctx.size).await?;
    }
    check_grown(&pod.volumes[0], fs_before, new_size, &content)?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// Online: the volume grown under a running pod, which sees the new size and keeps its data.
pub async fn online(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let content = data::pattern("online", 4096);
    let pod =
        ctx.node.start_pod("running", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    data::write(&pod.volumes[0].path, "data", &content)?;
    let fs_before = data::filesystem_size(&pod.volumes[0].path)?;
    let new_size = ctx.size + GROWTH;
    let node_expansion = grow(ctx, &volume, new_size).await?;
    if node_expansion && ctx.node.plugin.driver_capabilities().node.expand {
        ctx.node.node_expand(&pod.volumes[0], new_size, ctx.size).await?;
    }
    check_grown(&pod.volumes[0], fs_before, new_size, &content)?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}
