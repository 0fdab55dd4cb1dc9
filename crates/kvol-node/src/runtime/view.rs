//! The node as the runtime API answers from it: each pod's volumes, their phase and why not published, and where the published ones are; pure, made by the loop at each pass that changed something.

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kvol_runtime_api::mounts::PublishedVolume;

use crate::model::{ActualState, ObjectSet};
use crate::report::status::{Phase, VolumeStatus};

/// One pod, as the runtime API sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PodView {
    /// The pod, while a source has it.
    pub pod: Option<Arc<Pod>>,
    /// `namespace/name`.
    pub name: String,
    /// Every volume the pod wants or the node still has for it.
    pub volumes: Vec<VolumeStatus>,
    /// The published volumes by the pod's names for them.
    pub published: BTreeMap<String, PublishedVolume>,
}

impl PodView {
    /// Whether every volume the pod wants is published (a pod without volumes: as soon as it
    /// is known); a volume no container uses is not waited for.
    pub fn ready(&self) -> bool {
        self.pod.is_some() && self.volumes.iter().all(|v| matches!(v.phase, Phase::Published | Phase::Unused))
    }

    /// Whether nothing of the pod is left on the node (a volume no container uses never was).
    pub fn gone(&self) -> bool {
        self.volumes.iter().all(|v| v.phase == Phase::Unused)
    }

    /// Kubelet's "unmounted volumes=[…]" sentence, with each volume's reason.
    pub fn message(&self) -> String {
        let waiting: Vec<&VolumeStatus> =
            self.volumes.iter().filter(|v| !matches!(v.phase, Phase::Published | Phase::Unused)).collect();
        if waiting.is_empty() {
            return format!("every volume of pod {} is published", self.name);
        }
        let names: Vec<&str> = waiting.iter().map(|v| v.volume.as_str()).collect();
        let reasons: Vec<String> = waiting.iter().map(|v| format!("{}: {}", v.volume, reason(v))).collect();
        format!("unmounted volumes=[{}]: {}", names.join(" "), reasons.join("; "))
    }
}

/// Why a volume is not published, in words.
pub fn reason(v: &VolumeStatus) -> String {
    v.pending_reason
        .clone()
        .or_else(|| v.last_error.clone())
        .or_else(|| v.progress.clone())
        .unwrap_or_else(|| format!("{:?}", v.phase).to_lowercase())
}

/// Every pod the node knows, by uid.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RuntimeView {
    pub pods: BTreeMap<String, PodView>,
}

/// Plugins whose volumes' files kvol makes itself (kubelet has the runtime relabel those).
const MANAGED: &[&str] = &[
    "kubernetes.io/empty-dir",
    "kubernetes.io/configmap",
    "kubernetes.io/secret",
    "kubernetes.io/downward-api",
    "kubernetes.io/projected",
];

/// The view from the objects, the volumes' statuses and the node's published records.
pub fn make(objects: &ObjectSet, volumes: Vec<VolumeStatus>, actual: &ActualState) -> RuntimeView {
    let mut view = RuntimeView::default();
    for pod in objects.pods.values() {
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or(crate::sources::DEFAULT_NAMESPACE);
        let name = format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or_default());
        view.pods.insert(uid, PodView { pod: Some(Arc::clone(pod)), name, ..PodView::default() });
    }
    for status in volumes {
        let entry = view.pods.entry(status.pod_uid.clone()).or_default();
        if entry.name.is_empty() {
            entry.name = status.pod.clone();
        }
        entry.volumes.push(status);
    }
    for (key, published) in &actual.published {
        let Some(entry) = view.pods.get_mut(&key.pod_uid) else { continue };
        if published.uncertain {
            continue;
        }
        let block = published.spec.is_block();
        // A CSI filesystem volume is mounted one level down (`…/kubernetes.io~csi/<pv>/mount`).
        let csi =
            published.target.parent().and_then(|p| p.file_name()).is_some_and(|n| n == "kubernetes.io~csi");
        let host_path = if csi && !block {
            kvol_csi::paths::publish_path(&published.target)
        } else {
            published.target.clone()
        };
        let volume = PublishedVolume {
            host_path,
            read_only: published.spec.read_only
                || kvol_api::projection::ProjectionKind::ALL
                    .iter()
                    .any(|k| k.plugin_name() == published.plugin),
            managed: MANAGED.contains(&published.plugin.as_str()),
            block,
        };
        entry.published.insert(key.volume.clone(), volume);
    }
    view
}
