//! What the pods on this node want: every volume of every running pod, resolved to a spec or pending with the reason; pure.
//!
//! Choices beyond what the kubelet does:
//!
//! - configMap, secret, downwardAPI and projected volumes get what they are to hold here
//!   ([`kvol_api::projection`]), from the same objects as everything else; a missing object or
//!   key, a bad path or field keeps the volume pending with every reason (kubelet fails the
//!   mount and retries). A projected service-account token with no API server to mint it
//!   (standalone) keeps its volume pending with that reason; the pod's other volumes go on.
//! - image volumes are the container runtime's, and gitRepo (deprecated upstream) is not
//!   served; both are listed, pending with the reason, so status shows every volume of a pod.
//! - A volume with no source or more than one is pending here with the reason, rather than
//!   handed on to fail in plugin lookup.
//! - A PersistentVolume without a `claimRef` serves the claim whose `volumeName` names it: in
//!   standalone mode nothing else would ever bind it. One whose `claimRef` names another claim,
//!   or the same claim with another uid (an earlier claim of the same name), does not.
//! - The claim of a generic ephemeral volume must have been created for the pod when it has a
//!   controller owner; a claim without owners (written as a manifest) is taken as is.
//! - Two pods with the same uid cannot both have their volumes: the first by `namespace/name`
//!   keeps them.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Volume};
use kvol_api::VolumeMode;
use kvol_api::projection::{NodeResources, PodRef, Projection, project};
use kvol_plugin::VolumeSpec;
use kvol_plugin::plugin::{FsGroupChangePolicy, PodInfo};

use crate::model::{DesiredState, DesiredVolume, ObjectSet, PodVolumeKey};
use crate::sources::{DEFAULT_NAMESPACE, static_pod_uid};

/// Volume sources the container runtime sets up; no storage plugin serves them.
pub const RUNTIME_SOURCES: &[&str] = &["image"];

/// What the desired state is made with besides the objects: the node's name and allocatable
/// resources (the downward API's unset limits), and whether service-account tokens can be
/// minted (cluster mode).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeContext {
    pub node_name: String,
    pub allocatable: NodeResources,
    pub mints_tokens: bool,
}

/// [`desired_state_on`] a node of that name, with no allocatable resources known and no tokens.
pub fn desired_state(objects: &ObjectSet, node_name: &str) -> DesiredState {
    desired_state_on(objects, &NodeContext { node_name: node_name.to_string(), ..NodeContext::default() })
}

/// The volumes the pods bound to the node want. A pod is on the node when its
/// `spec.nodeName` is unset or names the node; a pod that has finished (phase Succeeded or
/// Failed) wants nothing. A pod being deleted still wants what it has until it is gone (its
/// containers may run out their grace period), but nothing new: its volumes are marked
/// [`DesiredVolume::terminating`].
pub fn desired_state_on(objects: &ObjectSet, node: &NodeContext) -> DesiredState {
    let mut state = DesiredState::default();
    for pod in objects.pods.values().filter(|pod| wants_volumes(pod, &node.node_name)) {
        let (volumes, unused) = pod_volumes(objects, node, pod);
        for volume in volumes {
            state.volumes.entry(volume.key.clone()).or_insert(volume);
        }
        for (key, pod_name) in unused {
            state.unused.entry(key).or_insert(pod_name);
        }
    }
    state
}

fn wants_volumes(pod: &Pod, node_name: &str) -> bool {
    let on_node = pod
        .spec
        .as_ref()
        .and_then(|s| s.node_name.as_deref())
        .is_none_or(|name| name.is_empty() || name == node_name);
    let finished =
        matches!(pod.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded") | Some("Failed"));
    on_node && !finished
}

/// What kvol's plugins are told about a pod: its uid is `metadata.uid`, or [`static_pod_uid`]
/// when it has none; its service account `default` when it names none.
pub fn pod_info(pod: &Pod) -> PodInfo {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let namespace = non_empty(pod.metadata.namespace.as_deref()).unwrap_or(DEFAULT_NAMESPACE).to_string();
    let uid = match non_empty(pod.metadata.uid.as_deref()) {
        Some(uid) => uid.to_string(),
        None => static_pod_uid(&namespace, &name),
    };
    let spec = pod.spec.as_ref();
    let service_account = spec
        .and_then(|s| {
            non_empty(s.service_account_name.as_deref()).or(non_empty(s.service_account.as_deref()))
        })
        .unwrap_or("default")
        .to_string();
    let context = spec.and_then(|s| s.security_context.as_ref());
    let fs_group = context.and_then(|c| c.fs_group);
    let fs_group_change_policy = match context.and_then(|c| c.fs_group_change_policy.as_deref()) {
        Some("OnRootMismatch") => FsGroupChangePolicy::OnRootMismatch,
        _ => FsGroupChangePolicy::Always,
    };
    let memory_limit = kvol_api::projection::pod_memory_limit(pod);
    PodInfo { name, namespace, uid, service_account, fs_group, fs_group_change_policy, memory_limit }
}

fn non_empty(s: Option<&str>) -> Option<&str> {
    s.filter(|s| !s.is_empty())
}

/// A pod's volumes and its pod's `namespace/name`, as [`DesiredState::unused`] keeps them.
type Unused = Vec<(PodVolumeKey, String)>;

/// One desired volume per volume name of the pod that some container uses, and the names of
/// those none uses (kubelet's rule: a volume no container mounts or maps is not set up).
fn pod_volumes(objects: &ObjectSet, node: &NodeContext, pod: &Pod) -> (Vec<DesiredVolume>, Unused) {
    let info = pod_info(pod);
    let pod_name = format!("{}/{}", info.namespace, info.name);
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_deref()).unwrap_or_default();
    let invalid = invalid_volumes(volumes).map(|reason| format!("pod {pod_name} is invalid: {reason}"));
    let used = kvol_api::volume_mode::pod_use(pod);
    let mut out: Vec<DesiredVolume> = Vec::new();
    let mut unused = Unused::new();
    for volume in volumes {
        if out.iter().any(|d| d.key.volume == volume.name) {
            continue;
        }
        if invalid.is_none() && !used.mounted.contains(&volume.name) && !used.as_device(&volume.name) {
            let key = PodVolumeKey { pod_uid: info.uid.clone(), volume: volume.name.clone() };
            unused.push((key, pod_name.clone()));
            continue;
        }
        let resolved = match &invalid {
            Some(reason) => Err(reason.clone()),
            None => resolve(objects, &info, &pod_name, volume)
                .and_then(|resolved| used_as_its_mode(&resolved.0, &used, &volume.name).map(|()| resolved)),
        };
        let projection = match &resolved {
            Ok(_) => projection(objects, node, pod, &info, volume).transpose(),
            Err(_) => Ok(None),
        };
        let (spec, pending, mount_options, projection) = match (resolved, projection) {
            (Ok((spec, mount_options)), Ok(projection)) => (Some(spec), None, mount_options, projection),
            (Err(reason), _) | (_, Err(reason)) => (None, Some(reason), Vec::new(), None),
        };
        out.push(DesiredVolume {
            key: PodVolumeKey { pod_uid: info.uid.clone(), volume: volume.name.clone() },
            pod: info.clone(),
            pod_name: pod_name.clone(),
            spec,
            pending,
            mount_options,
            terminating: pod.metadata.deletion_timestamp.is_some(),
            projection,
            claim_size: claim_size(objects, &info, volume),
        });
    }
    (out, unused)
}

/// What a configMap, secret, downwardAPI or projected volume is to hold, or why it cannot be
/// made; `None` for every other volume.
fn projection(
    objects: &ObjectSet,
    node: &NodeContext,
    pod: &Pod,
    info: &PodInfo,
    volume: &Volume,
) -> Option<Result<Arc<Projection>, String>> {
    let at = PodRef { pod, namespace: &info.namespace, uid: &info.uid };
    let made = project(volume, at, objects, &node.allocatable)?;
    Some(match made {
        Ok(p) if !p.tokens.is_empty() && !node.mints_tokens => Err(format!(
            "volume {:?} holds a serviceAccountToken, which needs the API server's TokenRequest; \
             kvol runs standalone, without one",
            volume.name
        )),
        Ok(p) => Ok(Arc::new(p)),
        Err(why) => Err(format!("volume {:?}: {why}", volume.name)),
    })
}

/// Why the pod's volume list cannot be used as a whole: a volume without a name, or a name
/// used twice (the volumes' directories would collide).
fn invalid_volumes(volumes: &[Volume]) -> Option<String> {
    if volumes.iter().any(|v| v.name.is_empty()) {
        return Some("a volume has no name".to_string());
    }
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for volume in volumes {
        *counts.entry(&volume.name).or_default() += 1;
    }
    let repeated: Vec<String> =
        counts.into_iter().filter(|(_, n)| *n > 1).map(|(v, _)| format!("{v:?}")).collect();
    (!repeated.is_empty()).then(|| format!("more than one volume is named {}", repeated.join(", ")))
}

type Resolved = Result<(VolumeSpec, Vec<String>), String>;

/// The pod uses the volume as its mode says (a Block volume in volumeDevices only).
fn used_as_its_mode(
    spec: &VolumeSpec,
    used: &kvol_api::volume_mode::PodUse,
    name: &str,
) -> Result<(), String> {
    let mode = spec.pv().map(VolumeMode::of_pv).transpose()?;
    kvol_api::volume_mode::check_use(name, used.as_device(name), mode)
}

/// A volume's spec and mount options, or why it is pending.
fn resolve(objects: &ObjectSet, pod: &PodInfo, pod_name: &str, volume: &Volume) -> Resolved {
    let sources: Vec<&str> = kvol_translate::inline_sources(volume).into_iter().map(|(f, _)| f).collect();
    match sources.as_slice() {
        [] => Err(format!("volume {:?} sets no volume source", volume.name)),
        [_, _, ..] => {
            Err(format!("volume {:?} sets more than one volume source: {}", volume.name, sources.join(", ")))
        }
        ["persistentVolumeClaim"] => {
            let source = volume.persistent_volume_claim.as_ref().expect("the source is set");
            let claim = claim(objects, &pod.namespace, &source.claim_name)?;
            let (spec, options) = bound_volume(objects, &pod.namespace, &source.claim_name, claim)?;
            Ok((spec.with_read_only(source.read_only.unwrap_or(false)), options))
        }
        ["ephemeral"] => {
            let claim_name = format!("{}-{}", pod.name, volume.name);
            let Some(claim) = objects.claims.get(&format!("{}/{claim_name}", pod.namespace)) else {
                return Err(format!(
                    "persistentvolumeclaim {}/{claim_name} of ephemeral volume {:?} does not exist; kvol \
                     does not create ephemeral volume claims in standalone mode, write the claim as a \
                     manifest",
                    pod.namespace, volume.name
                ));
            };
            created_for(claim, pod, pod_name, &claim_name)?;
            let claim = live(claim, &pod.namespace, &claim_name)?;
            bound_volume(objects, &pod.namespace, &claim_name, claim)
        }
        [field] if RUNTIME_SOURCES.contains(field) => {
            Err(format!("{field} volumes are not served by kvol (they are the container runtime's)"))
        }
        ["gitRepo"] => {
            Err("gitRepo volumes are not served by kvol (deprecated upstream): clone into an emptyDir from \
             an init container"
                .to_string())
        }
        [_] => Ok((VolumeSpec::inline(volume.clone(), pod.namespace.clone()), Vec::new())),
    }
}

/// The size a pod volume's claim says it has (`status.capacity`), for a claim or generic
/// ephemeral volume whose claim has a status.
fn claim_size(objects: &ObjectSet, pod: &PodInfo, volume: &Volume) -> Option<u64> {
    let name = match (&volume.persistent_volume_claim, &volume.ephemeral) {
        (Some(source), _) => source.claim_name.clone(),
        (None, Some(_)) => format!("{}-{}", pod.name, volume.name),
        (None, None) => return None,
    };
    let claim = objects.claims.get(&format!("{}/{name}", pod.namespace))?;
    let quantity = claim.status.as_ref()?.capacity.as_ref()?.get("storage")?;
    kvol_api::quantity::parse_bytes(&quantity.0).ok()
}

/// The claim `namespace/name`, if it exists and is not being deleted.
fn claim<'a>(
    objects: &'a ObjectSet,
    namespace: &str,
    name: &str,
) -> Result<&'a PersistentVolumeClaim, String> {
    let claim = objects
        .claims
        .get(&format!("{namespace}/{name}"))
        .ok_or_else(|| format!("persistentvolumeclaim {namespace}/{name} does not exist"))?;
    live(claim, namespace, name)
}

fn live<'a>(
    claim: &'a PersistentVolumeClaim,
    namespace: &str,
    name: &str,
) -> Result<&'a PersistentVolumeClaim, String> {
    match claim.metadata.deletion_timestamp {
        Some(_) => Err(format!("persistentvolumeclaim {namespace}/{name} is being deleted")),
        None => Ok(claim),
    }
}

/// An ephemeral volume's claim must be the pod's: if it has a controller, that is the pod.
fn created_for(
    claim: &PersistentVolumeClaim,
    pod: &PodInfo,
    pod_name: &str,
    claim_name: &str,
) -> Result<(), String> {
    let owners = claim.metadata.owner_references.as_deref().unwrap_or_default();
    match owners.iter().find(|o| o.controller == Some(true)) {
        Some(o) if !(o.kind == "Pod" && o.name == pod.name && o.uid == pod.uid) => Err(format!(
            "persistentvolumeclaim {}/{claim_name} was not created for pod {pod_name}: its controller is \
             {}/{} (uid {})",
            pod.namespace, o.kind, o.name, o.uid
        )),
        _ => Ok(()),
    }
}

/// The persistent volume a claim is bound to, as a spec, with its mount options.
fn bound_volume(
    objects: &ObjectSet,
    namespace: &str,
    claim_name: &str,
    claim: &PersistentVolumeClaim,
) -> Resolved {
    let volume_name =
        claim.spec.as_ref().and_then(|s| non_empty(s.volume_name.as_deref())).ok_or_else(|| {
            format!("persistentvolumeclaim {namespace}/{claim_name} is not bound to a volume yet")
        })?;
    let pv = objects.persistent_volumes.get(volume_name).ok_or_else(|| {
        format!("persistentvolume {volume_name} (bound to claim {namespace}/{claim_name}) does not exist")
    })?;
    let pv_spec = pv.spec.as_ref();
    if let Some(claim_ref) = pv_spec.and_then(|s| s.claim_ref.as_ref()) {
        let ref_namespace = non_empty(claim_ref.namespace.as_deref()).unwrap_or(DEFAULT_NAMESPACE);
        let ref_name = claim_ref.name.as_deref().unwrap_or_default();
        if (ref_namespace, ref_name) != (namespace, claim_name) {
            return Err(format!(
                "persistentvolume {volume_name} is bound to claim {ref_namespace}/{ref_name}, not to \
                 persistentvolumeclaim {namespace}/{claim_name}"
            ));
        }
        if let (Some(ref_uid), Some(uid)) =
            (non_empty(claim_ref.uid.as_deref()), non_empty(claim.metadata.uid.as_deref()))
            && ref_uid != uid
        {
            return Err(format!(
                "persistentvolume {volume_name} is bound to an earlier claim {namespace}/{claim_name} (uid \
                 {ref_uid}), not to persistentvolumeclaim {namespace}/{claim_name} (uid {uid})"
            ));
        }
    }
    let claim_key = format!("{namespace}/{claim_name}");
    kvol_api::volume_mode::check_binding(
        volume_name,
        VolumeMode::of_pv(pv)?,
        &claim_key,
        VolumeMode::of_claim(claim)?,
    )?;
    let options = pv_spec.and_then(|s| s.mount_options.clone()).unwrap_or_default();
    Ok((VolumeSpec::persistent(std::sync::Arc::clone(pv)), options))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::parse::SetBuilder;
    use serde_json::{Value, json};

    /// An object set of the given objects; they must all be valid.
    fn objects(values: Vec<Value>) -> ObjectSet {
        let mut builder = SetBuilder::default();
        builder.add_text("test", &Value::Array(values).to_string());
        let set = builder.finish();
        assert!(set.problems.is_empty(), "{:?}", set.problems);
        set
    }

    /// The claims and volumes every case can use, all in namespace `ns`.
    fn storage() -> Vec<Value> {
        let claim = |name: &str, uid: &str, spec: Value| {
            json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                   "metadata": {"name": name, "namespace": "ns", "uid": uid}, "spec": spec})
        };
        let pv = |name: &str, spec: Value| {
            let mut spec = spec;
            spec["csi"] = json!({"driver": "d.example.com", "volumeHandle": name});
            json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": name}, "spec": spec})
        };
        let owned_by = |mut claim: Value, kind: &str, name: &str, uid: &str| {
            claim["metadata"]["ownerReferences"] =
                json!([{"apiVersion": "v1", "kind": kind, "name": name, "uid": uid, "controller": true}]);
            claim
        };
        vec![
            claim("bound", "c-bound", json!({"volumeName": "pv-bound"})),
            pv(
                "pv-bound",
                json!({"claimRef": {"namespace": "ns", "name": "bound", "uid": "c-bound"},
                       "mountOptions": ["noatime", "nfsvers=4"]}),
            ),
            claim("unbound", "c-unbound", json!({})),
            claim("lost", "c-lost", json!({"volumeName": "pv-gone"})),
            claim("taken", "c-taken", json!({"volumeName": "pv-taken"})),
            pv("pv-taken", json!({"claimRef": {"namespace": "other", "name": "taken"}})),
            claim("recreated", "c-new", json!({"volumeName": "pv-old"})),
            pv("pv-old", json!({"claimRef": {"namespace": "ns", "name": "recreated", "uid": "c-old"}})),
            claim("prebound", "", json!({"volumeName": "pv-free"})),
            pv("pv-free", json!({})),
            {
                let mut c = claim("leaving", "c-leaving", json!({"volumeName": "pv-free"}));
                c["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
                c
            },
            owned_by(claim("p-scratch", "c-s", json!({"volumeName": "pv-scratch"})), "Pod", "p", "u-p"),
            pv("pv-scratch", json!({"claimRef": {"namespace": "ns", "name": "p-scratch"}})),
            owned_by(
                claim("p-foreign", "c-f", json!({"volumeName": "pv-free"})),
                "StatefulSet",
                "db",
                "u-db",
            ),
            owned_by(claim("p-stale", "c-st", json!({"volumeName": "pv-free"})), "Pod", "p", "u-earlier"),
            claim("p-manual", "c-m", json!({"volumeName": "pv-manual"})),
            pv("pv-manual", json!({})),
            claim("p-waiting", "c-w", json!({})),
            claim("blk", "c-blk", json!({"volumeName": "pv-blk", "volumeMode": "Block"})),
            pv("pv-blk", json!({"volumeMode": "Block"})),
            claim("fs-on-blk", "c-fob", json!({"volumeName": "pv-blk2"})),
            pv("pv-blk2", json!({"volumeMode": "Block"})),
        ]
    }

    /// Pod `ns/p` (uid `u-p`) with the given volumes, each mounted by its container `c`, and
    /// extra spec and status fields (which may replace the containers).
    fn pod(volumes: Value, extra: Value) -> Value {
        let mounts: Vec<Value> = volumes
            .as_array()
            .into_iter()
            .flatten()
            .map(|v| json!({"name": v["name"], "mountPath": format!("/{}", v["name"].as_str().unwrap_or("x"))}))
            .collect();
        let mut pod = json!({"apiVersion": "v1", "kind": "Pod",
                             "metadata": {"name": "p", "namespace": "ns", "uid": "u-p"},
                             "spec": {"containers": [{"name": "c", "image": "i", "volumeMounts": mounts}],
                                      "volumes": volumes}});
        for (path, value) in extra.as_object().cloned().unwrap_or_default() {
            let (part, field) = path.split_once('.').expect("extra fields are part.field");
            pod[part][field] = value;
        }
        pod
    }

    /// A desired volume as one line: its name, then its spec or why it is pending.
    fn describe(v: &DesiredVolume) -> String {
        let what = match (&v.spec, &v.pending) {
            (Some(spec), None) => {
                format!("{spec} read_only={} options={:?}", spec.read_only, v.mount_options)
            }
            (None, Some(reason)) => format!("pending: {reason}"),
            other => panic!("a volume has a spec or is pending, not {other:?}"),
        };
        let terminating = if v.terminating { " (terminating)" } else { "" };
        format!("{}: {what}{terminating}", v.key.volume)
    }

    #[test]
    fn volumes_resolve_or_say_why_not() {
        let claim = |name: &str| json!({"name": "v", "persistentVolumeClaim": {"claimName": name}});
        let ephemeral = |name: &str| {
            let template = json!({"spec": {"accessModes": ["ReadWriteOnce"]}});
            json!({"name": name, "ephemeral": {"volumeClaimTemplate": template}})
        };
        let bound = |read_only: bool| {
            format!(
                r#"v: persistent volume "pv-bound" read_only={read_only} options=["noatime", "nfsvers=4"]"#
            )
        };
        let runtime_pending = |field: &str| {
            format!("v: pending: {field} volumes are not served by kvol (they are the container runtime's)")
        };
        const DUPLICATE: &str = r#"pod ns/p is invalid: more than one volume is named "a""#;
        let empty_dir = || json!([{"name": "v", "emptyDir": {}}]);
        // (what, pod volumes, extra pod fields, the desired volumes described)
        let device = |name: &str| {
            json!({"containers": [{"name": "c", "image": "i",
                                                         "volumeDevices": [{"name": name, "devicePath": "/dev/xvda"}]}]})
        };
        let cases: Vec<(&str, Value, Value, Vec<String>)> = vec![
            (
                "a block claim used as a device",
                json!([claim("blk")]),
                json!({"spec.containers": device("v")["containers"].clone()}),
                vec![r#"v: persistent volume "pv-blk" read_only=false options=[]"#.into()],
            ),
            (
                "a block claim mounted as a filesystem",
                json!([claim("blk")]),
                json!({}),
                vec![r#"v: pending: volume "v" has volumeMode Block, so it must be in volumeDevices, not volumeMounts"#.into()],
            ),
            (
                "a filesystem claim bound to a block volume",
                json!([claim("fs-on-blk")]),
                json!({"spec.containers": device("v")["containers"].clone()}),
                vec![
                    "v: pending: volume mode mismatch: persistentvolume pv-blk2 has volumeMode Block, but \
                     persistentvolumeclaim ns/fs-on-blk asks for Filesystem"
                        .into(),
                ],
            ),
            (
                "a filesystem claim used as a device",
                json!([claim("bound")]),
                json!({"spec.containers": device("v")["containers"].clone()}),
                vec![r#"v: pending: volume "v" is in volumeDevices, but its persistent volume has volumeMode Filesystem"#.into()],
            ),
            (
                "an inline volume used as a device",
                json!([{"name": "v", "emptyDir": {}}]),
                json!({"spec.containers": device("v")["containers"].clone()}),
                vec![r#"v: pending: volume "v" is in volumeDevices, but it is an inline volume; only a persistent volume with volumeMode Block can be a block device"#.into()],
            ),
            (
                "a bound claim: its volume, its mount options",
                json!([claim("bound")]),
                json!({}),
                vec![bound(false)],
            ),
            (
                "a read-only claim",
                json!([{"name": "v", "persistentVolumeClaim": {"claimName": "bound", "readOnly": true}}]),
                json!({}),
                vec![bound(true)],
            ),
            (
                "a missing claim",
                json!([claim("nope")]),
                json!({}),
                vec!["v: pending: persistentvolumeclaim ns/nope does not exist".into()],
            ),
            (
                "an unbound claim",
                json!([claim("unbound")]),
                json!({}),
                vec!["v: pending: persistentvolumeclaim ns/unbound is not bound to a volume yet".into()],
            ),
            (
                "a claim bound to a missing volume",
                json!([claim("lost")]),
                json!({}),
                vec!["v: pending: persistentvolume pv-gone (bound to claim ns/lost) does not exist".into()],
            ),
            (
                "a volume bound to another claim",
                json!([claim("taken")]),
                json!({}),
                vec![
                    "v: pending: persistentvolume pv-taken is bound to claim other/taken, not to \
                      persistentvolumeclaim ns/taken"
                        .into(),
                ],
            ),
            (
                "a volume bound to an earlier claim of the same name",
                json!([claim("recreated")]),
                json!({}),
                vec![
                    "v: pending: persistentvolume pv-old is bound to an earlier claim ns/recreated (uid \
                      c-old), not to persistentvolumeclaim ns/recreated (uid c-new)"
                        .into(),
                ],
            ),
            (
                "a volume without a claimRef serves the claim naming it",
                json!([claim("prebound")]),
                json!({}),
                vec![r#"v: persistent volume "pv-free" read_only=false options=[]"#.into()],
            ),
            (
                "a claim being deleted",
                json!([claim("leaving")]),
                json!({}),
                vec!["v: pending: persistentvolumeclaim ns/leaving is being deleted".into()],
            ),
            (
                "an ephemeral volume's claim, created for the pod",
                json!([ephemeral("scratch")]),
                json!({}),
                vec![r#"scratch: persistent volume "pv-scratch" read_only=false options=[]"#.into()],
            ),
            (
                "an ephemeral volume's claim written by hand, without owners",
                json!([ephemeral("manual")]),
                json!({}),
                vec![r#"manual: persistent volume "pv-manual" read_only=false options=[]"#.into()],
            ),
            (
                "an ephemeral volume without its claim",
                json!([ephemeral("missing")]),
                json!({}),
                vec![
                    "missing: pending: persistentvolumeclaim ns/p-missing of ephemeral volume \"missing\" \
                      does not exist; kvol does not create ephemeral volume claims in standalone mode, write \
                      the claim as a manifest"
                        .into(),
                ],
            ),
            (
                "an ephemeral volume's claim controlled by something else",
                json!([ephemeral("foreign")]),
                json!({}),
                vec![
                    "foreign: pending: persistentvolumeclaim ns/p-foreign was not created for pod ns/p: \
                      its controller is StatefulSet/db (uid u-db)"
                        .into(),
                ],
            ),
            (
                "an ephemeral volume's claim created for an earlier pod of the same name",
                json!([ephemeral("stale")]),
                json!({}),
                vec![
                    "stale: pending: persistentvolumeclaim ns/p-stale was not created for pod ns/p: its \
                      controller is Pod/p (uid u-earlier)"
                        .into(),
                ],
            ),
            (
                "an ephemeral volume's claim not bound yet",
                json!([ephemeral("waiting")]),
                json!({}),
                vec![
                    "waiting: pending: persistentvolumeclaim ns/p-waiting is not bound to a volume yet"
                        .into(),
                ],
            ),
            (
                "a configMap that does not exist",
                json!([{"name": "v", "configMap": {"name": "x"}}]),
                json!({}),
                vec![r#"v: pending: volume "v": configmap ns/x does not exist"#.into()],
            ),
            (
                "an optional configMap that does not exist: an empty volume",
                json!([{"name": "v", "configMap": {"name": "x", "optional": true}}]),
                json!({}),
                vec![r#"v: inline volume "v" read_only=false options=[]"#.into()],
            ),
            (
                "a secret that does not exist",
                json!([{"name": "v", "secret": {"secretName": "x"}}]),
                json!({}),
                vec![r#"v: pending: volume "v": secret ns/x does not exist"#.into()],
            ),
            (
                "projected without sources",
                json!([{"name": "v", "projected": {"sources": []}}]),
                json!({}),
                vec![r#"v: inline volume "v" read_only=false options=[]"#.into()],
            ),
            (
                "a projected token with no API server to mint it; the pod's other volumes go on",
                json!([{"name": "v", "projected": {"sources": [{"serviceAccountToken": {"path": "t"}}]}},
                       {"name": "w", "downwardAPI": {}}]),
                json!({}),
                vec![
                    "v: pending: volume \"v\" holds a serviceAccountToken, which needs the API server's \
                     TokenRequest; kvol runs standalone, without one"
                        .into(),
                    r#"w: inline volume "w" read_only=false options=[]"#.into(),
                ],
            ),
            (
                "image",
                json!([{"name": "v", "image": {"reference": "r"}}]),
                json!({}),
                vec![runtime_pending("image")],
            ),
            (
                "gitRepo",
                json!([{"name": "v", "gitRepo": {"repository": "r"}}]),
                json!({}),
                vec![
                    "v: pending: gitRepo volumes are not served by kvol (deprecated upstream): clone into \
                     an emptyDir from an init container"
                        .into(),
                ],
            ),
            (
                "inline sources, in volume name order",
                json!([
                    {"name": "e", "emptyDir": {}},
                    {"name": "h", "hostPath": {"path": "/srv"}},
                    {"name": "c", "csi": {"driver": "d.example.com"}},
                    {"name": "n", "nfs": {"server": "s", "path": "/x", "readOnly": true}},
                    {"name": "f", "flexVolume": {"driver": "v/d"}},
                ]),
                json!({}),
                ["c", "e", "f", "h", "n"]
                    .map(|v| format!(r#"{v}: inline volume "{v}" read_only=false options=[]"#))
                    .to_vec(),
            ),
            (
                "a volume without a source",
                json!([{"name": "v"}]),
                json!({}),
                vec![r#"v: pending: volume "v" sets no volume source"#.into()],
            ),
            (
                "a volume with two sources",
                json!([{"name": "v", "emptyDir": {}, "persistentVolumeClaim": {"claimName": "bound"}}]),
                json!({}),
                vec![
                    "v: pending: volume \"v\" sets more than one volume source: emptyDir, \
                      persistentVolumeClaim"
                        .into(),
                ],
            ),
            (
                "a volume name used twice: every volume of the pod is pending",
                json!([
                    {"name": "a", "emptyDir": {}},
                    {"name": "b", "hostPath": {"path": "/x"}},
                    {"name": "a", "hostPath": {"path": "/y"}},
                ]),
                json!({}),
                ["a", "b"].map(|v| format!("{v}: pending: {DUPLICATE}")).to_vec(),
            ),
            // A volume without a name never gets here from the manifests source: validation
            // refuses the pod (source::tests::objects_with_names_that_would_escape_...).
            ("a pod without volumes", json!([]), json!({}), vec![]),
            (
                "a pod bound to this node",
                empty_dir(),
                json!({"spec.nodeName": "node-1"}),
                vec![r#"v: inline volume "v" read_only=false options=[]"#.into()],
            ),
            (
                "a pod with an empty nodeName",
                empty_dir(),
                json!({"spec.nodeName": ""}),
                vec![r#"v: inline volume "v" read_only=false options=[]"#.into()],
            ),
            (
                "a running pod",
                empty_dir(),
                json!({"status.phase": "Running"}),
                vec![r#"v: inline volume "v" read_only=false options=[]"#.into()],
            ),
            ("a pod on another node", empty_dir(), json!({"spec.nodeName": "node-2"}), vec![]),
            ("a pod that succeeded", empty_dir(), json!({"status.phase": "Succeeded"}), vec![]),
            ("a pod that failed", empty_dir(), json!({"status.phase": "Failed"}), vec![]),
            (
                "a pod being deleted keeps its volumes, marked terminating",
                empty_dir(),
                json!({"metadata.deletionTimestamp": "2025-01-01T00:00:00Z"}),
                vec![r#"v: inline volume "v" read_only=false options=[] (terminating)"#.into()],
            ),
        ];
        for (what, volumes, extra, want) in cases {
            let mut values = storage();
            values.push(pod(volumes, extra));
            let state = desired_state(&objects(values), "node-1");
            let got: Vec<String> = state.volumes.values().map(describe).collect();
            assert_eq!(got, want, "{what}");
            for (key, volume) in &state.volumes {
                assert_eq!(key, &volume.key, "{what}");
                assert_eq!(key.pod_uid, "u-p", "{what}");
                assert_eq!(volume.pod_name, "ns/p", "{what}");
            }
        }
    }

    #[test]
    fn only_the_volumes_some_container_uses_are_wanted() {
        let volumes = json!([{"name": "init", "emptyDir": {}}, {"name": "app", "emptyDir": {}},
                             {"name": "debug", "emptyDir": {}}, {"name": "dev", "persistentVolumeClaim": {"claimName": "blk"}},
                             {"name": "idle", "emptyDir": {}}, {"name": "idle-claim", "persistentVolumeClaim": {"claimName": "bound"}}]);
        let mount = |name: &str| json!([{"name": name, "mountPath": "/m"}]);
        // (what, containers, init containers, ephemeral containers, the wanted and the unused names)
        let cases = [
            (
                "no container mounts anything",
                json!([{"name": "c"}]),
                json!([]),
                json!([]),
                vec![],
                vec!["app", "debug", "dev", "idle", "idle-claim", "init"],
            ),
            (
                "each kind of container counts, and a device counts",
                json!([{"name": "c", "volumeMounts": mount("app"), "volumeDevices": [{"name": "dev", "devicePath": "/dev/x"}]}]),
                json!([{"name": "i", "volumeMounts": mount("init")}]),
                json!([{"name": "e", "volumeMounts": mount("debug")}]),
                vec!["app", "debug", "dev", "init"],
                vec!["idle", "idle-claim"],
            ),
        ];
        for (what, containers, init, ephemeral, wanted, unused) in cases {
            let mut values = storage();
            values.push(pod(
                volumes.clone(),
                json!({"spec.containers": containers, "spec.initContainers": init, "spec.ephemeralContainers": ephemeral}),
            ));
            let state = desired_state(&objects(values), "node-1");
            let names =
                |keys: Vec<&PodVolumeKey>| keys.into_iter().map(|k| k.volume.clone()).collect::<Vec<_>>();
            assert_eq!(names(state.volumes.keys().collect()), wanted, "{what}");
            assert_eq!(names(state.unused.keys().collect()), unused, "{what}");
            assert!(state.unused.values().all(|pod| pod == "ns/p"), "{what}");
            assert!(state.volumes.values().all(|v| v.pending.is_none()), "{what}: {state:#?}");
        }
    }

    #[test]
    fn specs_carry_the_pod_namespace_and_the_whole_volume() {
        let values =
            vec![pod(json!([{"name": "v", "azureFile": {"secretName": "s", "shareName": "sh"}}]), json!({}))];
        let state = desired_state(&objects(values), "node-1");
        let spec = state.volumes.values().next().and_then(|v| v.spec.clone()).expect("a spec");
        match spec.source {
            kvol_plugin::SpecSource::Inline { volume, pod_namespace } => {
                assert_eq!(pod_namespace, "ns");
                assert_eq!(volume.azure_file.map(|a| a.share_name), Some("sh".to_string()));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pod_info_comes_from_the_pod() {
        // (what, pod metadata and spec fields, want)
        let cases = [
            (
                "everything given",
                json!({"metadata": {"name": "a", "namespace": "ns", "uid": "u-a"},
                       "spec": {"serviceAccountName": "sa", "securityContext": {"fsGroup": 2000},
                                "containers": [{"name": "c", "resources": {"limits": {"memory": "64Mi"}}}]}}),
                PodInfo {
                    name: "a".into(),
                    namespace: "ns".into(),
                    uid: "u-a".into(),
                    service_account: "sa".into(),
                    fs_group: Some(2000),
                    fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
                    memory_limit: Some(64 << 20),
                },
            ),
            (
                "the deprecated serviceAccount field",
                json!({"metadata": {"name": "a", "namespace": "ns", "uid": "u-a"},
                       "spec": {"serviceAccount": "old"}}),
                PodInfo {
                    name: "a".into(),
                    namespace: "ns".into(),
                    uid: "u-a".into(),
                    service_account: "old".into(),
                    fs_group: None,
                    fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
                    memory_limit: None,
                },
            ),
            (
                "defaults: namespace, uid, service account",
                json!({"metadata": {"name": "a"}, "spec": {"serviceAccountName": ""}}),
                PodInfo {
                    name: "a".into(),
                    namespace: "default".into(),
                    uid: static_pod_uid("default", "a"),
                    service_account: "default".into(),
                    fs_group: None,
                    fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
                    memory_limit: None,
                },
            ),
        ];
        for (what, fields, want) in cases {
            // Straight from JSON, not through the source, so the defaults are pod_info's own.
            let pod: Pod = serde_json::from_value(fields).unwrap();
            assert_eq!(pod_info(&pod), want, "{what}");
        }
    }

    #[test]
    fn pods_are_keyed_by_uid_and_a_repeated_uid_keeps_the_first() {
        let volume = json!([{"name": "v", "emptyDir": {}}]);
        let named = |name: &str, uid: Option<&str>| {
            let mut p = pod(volume.clone(), json!({}));
            p["metadata"]["name"] = json!(name);
            match uid {
                Some(uid) => p["metadata"]["uid"] = json!(uid),
                None => drop(p["metadata"].as_object_mut().unwrap().remove("uid")),
            }
            p
        };
        let state = desired_state(
            &objects(vec![named("b", Some("same")), named("a", Some("same")), named("s", None)]),
            "node-1",
        );
        let got: Vec<(String, String)> =
            state.volumes.iter().map(|(k, v)| (k.to_string(), v.pod_name.clone())).collect();
        let mut want = vec![
            ("same/v".to_string(), "ns/a".to_string()),
            (format!("{}/v", static_pod_uid("ns", "s")), "ns/s".to_string()),
        ];
        want.sort();
        assert_eq!(got, want);
    }
}
