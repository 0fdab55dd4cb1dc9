//! volumeMode: a pod asking for a volume in the other mode is refused where kubelet refuses it — the container's mounts planned by kvol's makeMounts (`kvol_runtime_api::mounts::plan`) from the pod and the volumes the driver published.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod as PodObject;
use kvol_runtime_api::mounts::{self, PublishedVolume};
use serde_json::json;

use super::{CaseOutcome, Ctx, End};
use crate::node::{Pod, Want};
use crate::report::Failure;

/// A pod whose one container uses volume `v` (claim `claim`) as a device or as a mount.
fn pod_object(claim: &str, as_device: bool) -> Result<PodObject, Failure> {
    let container = if as_device {
        json!({"name": "c", "image": "busybox", "volumeDevices": [{"name": "v", "devicePath": "/dev/xvda"}]})
    } else {
        json!({"name": "c", "image": "busybox", "volumeMounts": [{"name": "v", "mountPath": "/mnt/volume1"}]})
    };
    serde_json::from_value(json!({
        "metadata": {"name": "mismatched", "namespace": crate::node::NAMESPACE},
        "spec": {"containers": [container], "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]}
    }))
    .map_err(|e| Failure::new(format!("cannot build the pod: {e}")))
}

/// The container's mounts as kvol plans them for `pod`, its volume `v` being what the driver
/// published.
fn plan(ctx: &Ctx<'_>, pod: &Pod, object: &PodObject) -> Result<mounts::ContainerPlan, String> {
    let published = &pod.volumes[0];
    let volume = PublishedVolume {
        host_path: published.target.clone(),
        read_only: published.read_only,
        managed: false,
        block: published.spec.is_block(),
    };
    let volumes = BTreeMap::from([("v".to_string(), volume)]);
    mounts::plan(object, &pod.dir(&ctx.node.root), "c", &volumes)
}

/// Publishes a volume of one mode, asks for it in the other, expects the refusal `said`.
async fn mismatched(ctx: &mut Ctx<'_>, block: bool, said: &str) -> CaseOutcome {
    let volume = if block {
        ctx.node.provision_block(ctx.size).await?
    } else {
        ctx.node.provision(ctx.size, None).await?
    };
    let pod =
        ctx.node.start_pod("mismatched", &[Want::Persistent { volume: &volume, read_only: false }]).await?;
    let object = pod_object(&volume.name, !block)?;
    let (mode, usage) = if block { ("Block", "volumeMounts") } else { ("Filesystem", "volumeDevices") };
    match plan(ctx, &pod, &object) {
        Ok(planned) => {
            return Err(Failure::new(format!(
                "a {mode} volume used through {usage} was given to the container: {planned:?}"
            )));
        }
        Err(why) if why.contains(said) => {}
        Err(why) => {
            return Err(Failure::new(format!(
                "the {mode} volume used through {usage} was refused, but not for its mode: {why}"
            )));
        }
    }
    ctx.node.stop_pod(&pod).await?;
    Ok(End::Passed)
}

/// A Block volume in a container's volumeMounts is refused.
pub async fn block_as_filesystem(ctx: &mut Ctx<'_>) -> CaseOutcome {
    mismatched(ctx, true, "the volume is a block volume: use volumeDevices").await
}

/// A Filesystem volume in a container's volumeDevices is refused.
pub async fn filesystem_as_block(ctx: &mut Ctx<'_>) -> CaseOutcome {
    mismatched(ctx, false, "the volume is not a block volume").await
}
