//! subPath: a volumeMount's sub-path bound by kvol's subPath code (kubelet's makeMounts) inside the driver's published volume — a new directory, an existing one, a file — and the hostile ones refused: a symlink out of the volume, `..` out of it.

use std::path::PathBuf;

use kvol_plugin::subpath;

use super::{CaseOutcome, Ctx, End};
use crate::data;
use crate::node::{Pod, Want};
use crate::report::Failure;

const CONTAINER: &str = "test-container";

/// A pod with one fresh volume.
async fn pod_with_volume(ctx: &Ctx<'_>) -> Result<Pod, Failure> {
    let volume = ctx.node.provision(ctx.size, None).await?;
    ctx.node.start_pod("subpath", &[Want::Persistent { volume: &volume, read_only: false }]).await
}

/// Binds `sub_path` of the pod's volume as mount number `index` of the container; the bind's
/// path, as the runtime would be given it.
fn bind(ctx: &Ctx<'_>, pod: &Pod, sub_path: &str, index: usize) -> Result<PathBuf, subpath::SubPathError> {
    let published = &pod.volumes[0];
    let dest = subpath::bind_target(&pod.dir(&ctx.node.root), published.spec.name(), CONTAINER, index)?;
    let mode = subpath::creation_mode(&published.path)?;
    subpath::prepare(&published.path, sub_path, &dest, mode)
}

fn bound(ctx: &Ctx<'_>, pod: &Pod, sub_path: &str, index: usize) -> Result<PathBuf, Failure> {
    bind(ctx, pod, sub_path, index)
        .map_err(|e| Failure::new(format!("subPath {sub_path:?} was not bound: {e}")))
}

/// A sub-path that does not exist is made (as a directory) and bound; what the container
/// writes there lands in the volume at that path.
pub async fn non_existent(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let pod = pod_with_volume(ctx).await?;
    let dest = bound(ctx, &pod, "provisioning/new/dir", 0)?;
    data::write(&dest, "file", b"through the subpath")?;
    data::expect(
        &pod.volumes[0].path.join("provisioning/new/dir"),
        "file",
        b"through the subpath",
        "the volume, under the sub-path",
    )?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// An existing directory of the volume is bound with what it holds.
pub async fn existing_directory(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let pod = pod_with_volume(ctx).await?;
    let dir = pod.volumes[0].path.join("existing");
    std::fs::create_dir(&dir).map_err(|e| Failure::new(format!("cannot make {}: {e}", dir.display())))?;
    data::write(&dir, "before", b"made before the bind")?;
    let dest = bound(ctx, &pod, "existing", 0)?;
    data::expect(&dest, "before", b"made before the bind", "the container, through the sub-path")?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// A file of the volume bound as the sub-path: the container's file is the volume's file.
pub async fn file(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let pod = pod_with_volume(ctx).await?;
    data::write(&pod.volumes[0].path, "single-file", b"one file")?;
    let dest = bound(ctx, &pod, "single-file", 0)?;
    let found = std::fs::read(&dest)
        .map_err(|e| Failure::new(format!("cannot read the bound file {}: {e}", dest.display())))?;
    if found != b"one file" {
        return Err(Failure::new(format!(
            "the file bound at {} does not hold the volume's file",
            dest.display()
        )));
    }
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// Checks that binding `sub_path` is refused and nothing is mounted in its place.
fn expect_refused(ctx: &Ctx<'_>, pod: &Pod, sub_path: &str) -> CaseOutcome {
    match bind(ctx, pod, sub_path, 0) {
        Ok(dest) => Err(Failure::new(format!(
            "subPath {sub_path:?} was bound at {} although it leads out of the volume: a container would reach the node's files",
            dest.display()
        ))),
        Err(e) if e.is_refusal() => Ok(End::Passed),
        Err(e) => Err(Failure::new(format!("subPath {sub_path:?} failed, but not as refused: {e}"))),
    }
}

/// A sub-path through a symlink (made inside the volume, as a container can) pointing at a
/// directory of the node outside the volume is refused.
pub async fn symlink_outside(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let pod = pod_with_volume(ctx).await?;
    let link = pod.volumes[0].path.join("escape");
    std::os::unix::fs::symlink("/etc", &link)
        .map_err(|e| Failure::new(format!("cannot make the symlink {}: {e}", link.display())))?;
    let relative = pod.volumes[0].path.join("climb");
    std::os::unix::fs::symlink("../../../../../../../../etc", &relative)
        .map_err(|e| Failure::new(format!("cannot make the symlink {}: {e}", relative.display())))?;
    for sub_path in ["escape", "climb"] {
        expect_refused(ctx, &pod, sub_path)?;
    }
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// A sub-path with `..` stepping out of the volume is refused.
pub async fn backstepping(ctx: &mut Ctx<'_>) -> CaseOutcome {
    let pod = pod_with_volume(ctx).await?;
    expect_refused(ctx, &pod, "../")?;
    expect_refused(ctx, &pod, "a/../../outside")?;
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}
