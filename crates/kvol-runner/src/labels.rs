//! The labels and annotations kubelet puts on sandboxes and containers (its labels.go), so that crictl, ctr and log collectors find kvol's as they find kubelet's, and the runner finds its own again after a restart; pure.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::{Container, Pod};

pub const POD_NAME: &str = "io.kubernetes.pod.name";
pub const POD_NAMESPACE: &str = "io.kubernetes.pod.namespace";
pub const POD_UID: &str = "io.kubernetes.pod.uid";
pub const CONTAINER_NAME: &str = "io.kubernetes.container.name";
pub const CONTAINER_HASH: &str = "io.kubernetes.container.hash";
pub const CONTAINER_RESTART_COUNT: &str = "io.kubernetes.container.restartCount";
pub const TERMINATION_MESSAGE_PATH: &str = "io.kubernetes.container.terminationMessagePath";
pub const TERMINATION_MESSAGE_POLICY: &str = "io.kubernetes.container.terminationMessagePolicy";
pub const POD_TERMINATION_GRACE_PERIOD: &str = "io.kubernetes.pod.terminationGracePeriod";
/// kvol's own mark on the sandboxes its runner made: the runner stops and removes only what
/// carries it (a kubelet sharing the runtime keeps its pods).
pub const MANAGED_BY: &str = "io.kvol.runner";

/// The pod's identity as the labels carry it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodIds<'a> {
    pub namespace: &'a str,
    pub name: &'a str,
    pub uid: &'a str,
}

impl<'a> PodIds<'a> {
    pub fn of(pod: &'a Pod) -> PodIds<'a> {
        let meta = &pod.metadata;
        PodIds {
            namespace: meta.namespace.as_deref().unwrap_or("default"),
            name: meta.name.as_deref().unwrap_or_default(),
            uid: meta.uid.as_deref().unwrap_or_default(),
        }
    }

    /// `ns/name`, as kvol's messages name a pod.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }

    /// The pod as kubelet's messages name it: `name_namespace(uid)`.
    pub fn kubelet_format(&self) -> String {
        format!("{}_{}({})", self.name, self.namespace, self.uid)
    }
}

/// A sandbox's labels: the pod's own, then kubelet's three (which win), then kvol's mark.
pub fn sandbox_labels(pod: &Pod) -> HashMap<String, String> {
    let ids = PodIds::of(pod);
    let mut labels: HashMap<String, String> =
        pod.metadata.labels.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect();
    labels.insert(POD_NAME.into(), ids.name.into());
    labels.insert(POD_NAMESPACE.into(), ids.namespace.into());
    labels.insert(POD_UID.into(), ids.uid.into());
    labels.insert(MANAGED_BY.into(), "true".into());
    labels
}

/// A sandbox's annotations: the pod's.
pub fn sandbox_annotations(pod: &Pod) -> HashMap<String, String> {
    pod.metadata.annotations.iter().flatten().map(|(k, v)| (k.clone(), v.clone())).collect()
}

/// A container's labels: kubelet's four (not the pod's labels).
pub fn container_labels(pod: &Pod, container: &Container) -> HashMap<String, String> {
    let ids = PodIds::of(pod);
    HashMap::from([
        (CONTAINER_NAME.to_string(), container.name.clone()),
        (POD_NAME.to_string(), ids.name.to_string()),
        (POD_NAMESPACE.to_string(), ids.namespace.to_string()),
        (POD_UID.to_string(), ids.uid.to_string()),
        (MANAGED_BY.to_string(), "true".to_string()),
    ])
}

/// A container's annotations: its spec's hash, its restart count, where its termination
/// message is and how it is read, and the pod's grace period when set.
pub fn container_annotations(
    pod: &Pod,
    container: &Container,
    restart_count: u32,
) -> HashMap<String, String> {
    let mut annotations = HashMap::from([
        (CONTAINER_HASH.to_string(), format!("{:x}", container_hash(container))),
        (CONTAINER_RESTART_COUNT.to_string(), restart_count.to_string()),
        (
            TERMINATION_MESSAGE_PATH.to_string(),
            container
                .termination_message_path
                .clone()
                .unwrap_or_else(|| DEFAULT_TERMINATION_MESSAGE_PATH.into()),
        ),
        (
            TERMINATION_MESSAGE_POLICY.to_string(),
            container.termination_message_policy.clone().unwrap_or_else(|| "File".into()),
        ),
    ]);
    if let Some(grace) = pod.spec.as_ref().and_then(|s| s.termination_grace_period_seconds) {
        annotations.insert(POD_TERMINATION_GRACE_PERIOD.into(), grace.to_string());
    }
    annotations
}

/// The API server's default for `terminationMessagePath`.
pub const DEFAULT_TERMINATION_MESSAGE_PATH: &str = "/dev/termination-log";

/// The field path of the container `name` in `pod`, as kubelet's container reference names it
/// (`spec.containers{name}`, `spec.initContainers{name}`, `spec.ephemeralContainers{name}`);
/// empty for a name the pod does not have.
pub fn container_field_path(pod: &Pod, name: &str) -> String {
    let Some(spec) = pod.spec.as_ref() else { return String::new() };
    let has = |list: Option<&Vec<Container>>| list.is_some_and(|l| l.iter().any(|c| c.name == name));
    let ephemeral = spec.ephemeral_containers.iter().flatten().any(|c| c.name == name);
    let field = if has(spec.init_containers.as_ref()) {
        "initContainers"
    } else if has(Some(&spec.containers)) {
        "containers"
    } else if ephemeral {
        "ephemeralContainers"
    } else {
        return String::new();
    };
    format!("spec.{field}{{{name}}}")
}

/// A container spec's hash: FNV-1a (32 bits) of its JSON. Kubelet hashes its Go dump of the
/// spec; the number differs from kubelet's, its use is the same: a changed spec is a new hash,
/// and a running container of an older hash is restarted.
pub fn container_hash(container: &Container) -> u32 {
    let json = serde_json::to_vec(container).unwrap_or_default();
    json.iter().fold(0x811c_9dc5u32, |hash, byte| (hash ^ u32::from(*byte)).wrapping_mul(0x0100_0193))
}

/// The restart count a container's annotations carry (0 when absent or unreadable).
pub fn restart_count_of(annotations: &HashMap<String, String>) -> u32 {
    annotations.get(CONTAINER_RESTART_COUNT).and_then(|v| v.parse().ok()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod() -> Pod {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1",
                "labels": {"app": "web", "io.kubernetes.pod.name": "spoofed"},
                "annotations": {"note": "x"}},
            "spec": {"terminationGracePeriodSeconds": 7, "containers": [{"name": "c", "image": "i"}]}
        }))
        .unwrap()
    }

    #[test]
    fn container_field_paths_are_kubelets() {
        let mut pod = pod();
        pod.spec.as_mut().unwrap().init_containers = pod.spec.as_ref().map(|s| s.containers.clone());
        pod.spec.as_mut().unwrap().init_containers.as_mut().unwrap()[0].name = "setup".into();
        assert_eq!(container_field_path(&pod, "c"), "spec.containers{c}");
        assert_eq!(container_field_path(&pod, "setup"), "spec.initContainers{setup}");
        assert_eq!(container_field_path(&pod, "nobody"), "");
    }

    #[test]
    fn sandbox_and_container_labels_are_kubelets() {
        let pod = pod();
        let container = &pod.spec.as_ref().unwrap().containers[0];
        type Map = HashMap<String, String>;
        let cases: &[(&str, Map, &str, Option<&str>)] = &[
            ("pod label kept", sandbox_labels(&pod), "app", Some("web")),
            ("kubelet's name wins over the pod's", sandbox_labels(&pod), POD_NAME, Some("web")),
            ("namespace", sandbox_labels(&pod), POD_NAMESPACE, Some("shop")),
            ("uid", sandbox_labels(&pod), POD_UID, Some("u-1")),
            ("kvol's mark", sandbox_labels(&pod), MANAGED_BY, Some("true")),
            ("annotations are the pod's", sandbox_annotations(&pod), "note", Some("x")),
            ("container name", container_labels(&pod, container), CONTAINER_NAME, Some("c")),
            ("container has no pod labels", container_labels(&pod, container), "app", None),
            ("restart count", container_annotations(&pod, container, 3), CONTAINER_RESTART_COUNT, Some("3")),
            (
                "termination path defaulted",
                container_annotations(&pod, container, 0),
                TERMINATION_MESSAGE_PATH,
                Some("/dev/termination-log"),
            ),
            (
                "grace period",
                container_annotations(&pod, container, 0),
                POD_TERMINATION_GRACE_PERIOD,
                Some("7"),
            ),
        ];
        for (name, map, key, want) in cases {
            assert_eq!(map.get(*key).map(String::as_str), *want, "{name}");
        }
    }

    #[test]
    fn hash_follows_the_spec() {
        let pod = pod();
        let mut container = pod.spec.as_ref().unwrap().containers[0].clone();
        let before = container_hash(&container);
        assert_eq!(before, container_hash(&container));
        container.image = Some("other".into());
        assert_ne!(before, container_hash(&container));
        let annotations = container_annotations(&pod, &container, 5);
        assert_eq!(restart_count_of(&annotations), 5);
        assert_eq!(restart_count_of(&HashMap::new()), 0);
    }
}
