//! disruptive: the driver killed (SIGKILL) and started again between NodeStageVolume and NodePublishVolume; the volume published after it holds the data written before, and survives a full unstage and stage.

use super::{CaseOutcome, Ctx, End};
use crate::data;
use crate::node::Want;
use crate::report::Failure;

pub async fn restart_between_stage_and_publish(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let content = data::pattern("before-restart", 64 << 10);
    // The first pod keeps the volume staged while the driver restarts.
    let holder = ctx.node.start_pod("holder", &want).await?;
    data::write(&holder.volumes[0].path, "data", &content)?;
    ctx.driver.restart().await.map_err(|e| Failure::new(format!("cannot restart the driver: {e}")))?;
    // Published from the staging made by the driver's previous life.
    let after = ctx.node.start_pod("after-restart", &want).await?;
    data::expect(
        &after.volumes[0].path,
        "data",
        &content,
        "a pod published after the driver restarted (staged before)",
    )?;
    data::write(&after.volumes[0].path, "after", b"after the restart")?;
    ctx.node.stop_pod(&after).await?;
    ctx.node.stop_pod(&holder).await?;
    // Unstaged and staged again by the new driver.
    let last = ctx.node.start_pod("restaged", &want).await?;
    data::expect(&last.volumes[0].path, "data", &content, "the volume staged again after the restart")?;
    data::expect(
        &last.volumes[0].path,
        "after",
        b"after the restart",
        "the volume staged again after the restart",
    )?;
    ctx.node.stop_pod(&last).await?;
    Ok(End::Passed)
}
