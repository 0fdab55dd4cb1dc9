//! ephemeral: CSI inline volumes from the definition's `InlineVolumes`, published straight into pods (no stage): read-write, read-only, two pods with the same definition, several in one pod; and a generic ephemeral volume, a claim that lives and dies with its pod.

use std::collections::BTreeMap;

use super::{CaseOutcome, Ctx, End};
use crate::data;
use crate::definition::InlineVolume;
use crate::node::Want;

/// The definition's inline volume number `n` (reused when there are fewer, as upstream).
fn volume<'a>(ctx: &'a Ctx<'_>, n: usize) -> &'a InlineVolume {
    let volumes = &ctx.definition.inline_volumes;
    &volumes[n % volumes.len()]
}

fn writable<'a>(ctx: &'a Ctx<'_>) -> Option<&'a InlineVolume> {
    ctx.definition.inline_volumes.iter().find(|v| !v.read_only)
}

const ALL_READ_ONLY: &str = "every InlineVolumes entry is ReadOnly: the driver cannot mount them read/write";

pub async fn read_write(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let Some(inline) = writable(ctx) else { return Ok(End::Skipped(ALL_READ_ONLY.to_string())) };
    let want = [Want::Inline { name: "my-volume", attributes: &inline.attributes, read_only: false }];
    let pod = ctx.node.start_pod("inline", &want).await?;
    data::write(&pod.volumes[0].path, "data", b"inline")?;
    data::expect(&pod.volumes[0].path, "data", b"inline", "the inline volume")?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

pub async fn read_only(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let inline = volume(ctx, 0);
    let want = [Want::Inline { name: "my-volume", attributes: &inline.attributes, read_only: true }];
    let pod = ctx.node.start_pod("inline-ro", &want).await?;
    super::volumes::expect_read_only_publish(&pod.volumes[0], "the pod's read-only inline volume")?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// Two pods with the same inline definition both start; unless the definition says the
/// volume is shared, what one writes the other does not see.
pub async fn two_pods(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let Some(inline) = writable(ctx) else { return Ok(End::Skipped(ALL_READ_ONLY.to_string())) };
    let want = [Want::Inline { name: "my-volume", attributes: &inline.attributes, read_only: false }];
    let first = ctx.node.start_pod("inline-a", &want).await?;
    let second = ctx.node.start_pod("inline-b", &want).await?;
    data::write(&first.volumes[0].path, "from-first", b"first")?;
    if !inline.shared {
        data::expect_absent(
            &second.volumes[0].path,
            "from-first",
            "the second pod sees the first pod's file in a volume that is not shared",
        )?;
    }
    ctx.node.stop_pod(&second).await?;
    ctx.node.stop_pod(&first).await?;
    Ok(End::Passed)
}

/// Several inline volumes in one pod, each its own (written and read separately).
pub async fn multiple(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let Some(inline) = writable(ctx) else { return Ok(End::Skipped(ALL_READ_ONLY.to_string())) };
    let names = ["my-volume-0", "my-volume-1"];
    let attributes: Vec<&BTreeMap<String, String>> = vec![&inline.attributes, &inline.attributes];
    let want: Vec<Want<'_>> = names
        .iter()
        .zip(attributes)
        .map(|(name, attributes)| Want::Inline { name, attributes, read_only: false })
        .collect();
    let pod = ctx.node.start_pod("inline-many", &want).await?;
    for (i, published) in pod.volumes.iter().enumerate() {
        data::write(&published.path, "data", &data::pattern(names[i], 512))?;
    }
    for (i, published) in pod.volumes.iter().enumerate() {
        data::expect(
            &published.path,
            "data",
            &data::pattern(names[i], 512),
            &format!("inline volume {}", names[i]),
        )?;
    }
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// A generic ephemeral volume: a claim made for the pod from its template, provisioned,
/// published read/write, and deleted with the pod.
pub async fn generic_read_write(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let volume = ctx.node.provision(ctx.size, None).await?;
    let want = [Want::Persistent { volume: &volume, read_only: false }];
    let pod = ctx.node.start_pod("generic-ephemeral", &want).await?;
    data::write(&pod.volumes[0].path, "data", b"generic ephemeral")?;
    data::expect(&pod.volumes[0].path, "data", b"generic ephemeral", "the generic ephemeral volume")?;
    ctx.node.stop_pod(&pod).await?;
    // The claim goes with its pod, and its volume with the claim.
    ctx.node.delete(&volume).await?;
    Ok(End::Passed)
}
