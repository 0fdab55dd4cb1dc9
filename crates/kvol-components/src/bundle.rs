//! Cluster deployment as a pure plan: which bundle objects to apply (dependencies first), which deployed objects to prune, and which to leave alone because their component is off.
//!
//! Every object kvol applies carries the label [`COMPONENT_LABEL`] naming its component; what
//! the cluster holds under that label is the deployed state the plan compares against. A
//! component that does not run is never touched: not applied, not pruned, not deleted (a
//! restart must not bring back, nor take away, what the user turned off).

use std::collections::BTreeSet;

use serde_json::Value;

use crate::{Catalogue, Decision};

/// The label on every object kvol applies for a component.
pub const COMPONENT_LABEL: &str = "components.kvol.io/name";

/// The placeholder a bundle writes for kvol's own container image.
pub const IMAGE_PLACEHOLDER: &str = "{image}";

/// What the bundles' placeholders stand for on one `kvol components apply`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct BundleValues {
    /// [`IMAGE_PLACEHOLDER`]: kvol's container image (`--image`); kvol publishes none, so the
    /// user builds it (`deploy/kvol/Containerfile`) and names it.
    pub image: Option<String>,
}

/// One object as the API names it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectRef {
    pub api_version: String,
    pub kind: String,
    /// Empty for a cluster-scoped object.
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for ObjectRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.namespace.as_str() {
            "" => write!(f, "{} {}", self.kind, self.name),
            ns => write!(f, "{} {ns}/{}", self.kind, self.name),
        }
    }
}

impl ObjectRef {
    /// The reference of an object's text; `None` without `apiVersion`, `kind` or a name.
    pub fn of(object: &Value) -> Option<ObjectRef> {
        let text = |pointer: &str| object.pointer(pointer).and_then(Value::as_str).map(str::to_string);
        Some(ObjectRef {
            api_version: text("/apiVersion")?,
            kind: text("/kind")?,
            namespace: text("/metadata/namespace").unwrap_or_default(),
            name: text("/metadata/name").filter(|n| !n.is_empty())?,
        })
    }
}

/// An object the cluster holds under [`COMPONENT_LABEL`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Deployed {
    pub object: ObjectRef,
    pub component: String,
}

/// What `kvol components apply` does.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BundlePlan {
    /// Objects to apply, labelled, in dependency order; each with its component.
    pub apply: Vec<(String, Value)>,
    /// Deployed objects of running components that their bundle no longer has, dependents
    /// first.
    pub prune: Vec<Deployed>,
    /// Components that do not run and still have objects deployed: left exactly as they are.
    pub left_alone: Vec<String>,
    /// Bundle objects that cannot be applied, with why.
    pub problems: Vec<String>,
}

/// Where a kind goes in the apply order: definitions and namespaces first, then identities and
/// permissions, then configuration and storage objects, workloads last.
pub fn apply_rank(kind: &str) -> u8 {
    match kind {
        "CustomResourceDefinition" => 0,
        "Namespace" => 1,
        "ServiceAccount" | "ClusterRole" | "Role" => 2,
        "ClusterRoleBinding" | "RoleBinding" => 3,
        "ConfigMap" | "Secret" => 4,
        "DaemonSet" | "Deployment" | "StatefulSet" | "Job" | "Pod" => 6,
        _ => 5,
    }
}

/// The plan for `decision` over what is `deployed`, placeholders filled from `values`. A
/// component whose bundle cannot be filled (no image given) is not applied, and nothing of it
/// is pruned either; the problem says what to pass. Pure.
pub fn plan(
    decision: &Decision,
    catalogue: &Catalogue,
    deployed: &[Deployed],
    values: &BundleValues,
) -> BundlePlan {
    let mut out = BundlePlan::default();
    let running: BTreeSet<&str> = decision.running().collect();
    let mut wanted: BTreeSet<ObjectRef> = BTreeSet::new();
    for entry in catalogue.entries() {
        let name = entry.definition.name.as_str();
        let Some(bundle) = entry.definition.cluster.as_ref().filter(|_| running.contains(name)) else {
            continue;
        };
        let mut objects = Vec::new();
        for (i, object) in bundle.objects.iter().enumerate() {
            match ObjectRef::of(object) {
                Some(reference) => {
                    wanted.insert(reference);
                    objects.push(labelled(object, name));
                }
                None => out.problems.push(format!(
                    "component {name}: cluster.objects[{i}] needs apiVersion, kind and metadata.name"
                )),
            }
        }
        match objects.into_iter().map(|o| filled(o, values)).collect::<Option<Vec<Value>>>() {
            Some(objects) => out.apply.extend(objects.into_iter().map(|o| (name.to_string(), o))),
            None => out.problems.push(format!(
                "component {name}: its bundle runs kvol's own container image, and kvol publishes none: \
                 build it (deploy/kvol/Containerfile), push it where the nodes pull from, and pass --image; \
                 nothing of {name} was applied"
            )),
        }
    }
    out.apply.sort_by_key(|(_, object)| apply_rank(object["kind"].as_str().unwrap_or_default()));
    out.prune = deployed
        .iter()
        .filter(|d| running.contains(d.component.as_str()) && !wanted.contains(&d.object))
        .cloned()
        .collect();
    out.prune.sort_by_key(|d| std::cmp::Reverse(apply_rank(&d.object.kind)));
    let mut left: Vec<String> = deployed
        .iter()
        .filter(|d| !running.contains(d.component.as_str()))
        .map(|d| d.component.clone())
        .collect();
    left.dedup();
    out.left_alone = left.into_iter().collect::<BTreeSet<_>>().into_iter().collect();
    out
}

/// What uninstalling `component` from a cluster deletes, in order: its deployed objects,
/// workloads first and definitions last (the reverse of the apply order). A
/// CustomResourceDefinition another component's bundle also has is kept, and listed apart.
/// Pure.
pub fn removal(
    component: &str,
    deployed: &[Deployed],
    catalogue: &Catalogue,
) -> (Vec<ObjectRef>, Vec<ObjectRef>) {
    let shared: BTreeSet<ObjectRef> = catalogue
        .entries()
        .iter()
        .filter(|e| e.definition.name != component)
        .filter_map(|e| e.definition.cluster.as_ref())
        .flat_map(|bundle| bundle.objects.iter().filter_map(ObjectRef::of))
        .filter(|r| r.kind == "CustomResourceDefinition")
        .collect();
    let mut delete: Vec<ObjectRef> =
        deployed.iter().filter(|d| d.component == component).map(|d| d.object.clone()).collect();
    let kept: Vec<ObjectRef> = delete.iter().filter(|r| shared.contains(r)).cloned().collect();
    delete.retain(|r| !shared.contains(r));
    delete.sort_by_key(|r| std::cmp::Reverse(apply_rank(&r.kind)));
    (delete, kept)
}

/// `object` with every [`IMAGE_PLACEHOLDER`] in its strings replaced; `None` when it has one
/// and `values` names no image.
fn filled(object: Value, values: &BundleValues) -> Option<Value> {
    match object {
        Value::String(text) if text.contains(IMAGE_PLACEHOLDER) => {
            Some(Value::String(text.replace(IMAGE_PLACEHOLDER, values.image.as_deref()?)))
        }
        Value::Array(items) => {
            items.into_iter().map(|v| filled(v, values)).collect::<Option<_>>().map(Value::Array)
        }
        Value::Object(map) => map
            .into_iter()
            .map(|(k, v)| filled(v, values).map(|v| (k, v)))
            .collect::<Option<serde_json::Map<_, _>>>()
            .map(Value::Object),
        other => Some(other),
    }
}

/// `object` with [`COMPONENT_LABEL`] set to `component`.
fn labelled(object: &Value, component: &str) -> Value {
    let mut object = object.clone();
    if let Some(metadata) = object.get_mut("metadata").and_then(Value::as_object_mut) {
        let labels = metadata.entry("labels").or_insert_with(|| Value::Object(Default::default()));
        if let Some(labels) = labels.as_object_mut() {
            labels.insert(COMPONENT_LABEL.to_string(), Value::String(component.to_string()));
        }
    }
    object
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalogue::Origin;
    use crate::decide_for_cluster;
    use kvol_api::StorageSection;

    const DRIVER: &str = "
name: cloud
role: driver
provides: {csiDriver: cloud.csi.example}
cluster:
  objects:
  - {apiVersion: apps/v1, kind: DaemonSet, metadata: {name: cloud-node, namespace: kube-system},
     spec: {template: {spec: {containers: [{name: node, image: \"{image}\", args: [\"--x={image}\"]}]}}}}
  - {apiVersion: storage.k8s.io/v1, kind: CSIDriver, metadata: {name: cloud.csi.example}}
  - {apiVersion: v1, kind: ServiceAccount, metadata: {name: cloud, namespace: kube-system}}
  - {apiVersion: rbac.authorization.k8s.io/v1, kind: ClusterRoleBinding, metadata: {name: cloud}}
  - {apiVersion: apiextensions.k8s.io/v1, kind: CustomResourceDefinition, metadata: {name: clouds.example.com}}
";

    const EXTRA: &str = "
name: extra
role: optional
cluster:
  objects:
  - {apiVersion: v1, kind: ConfigMap, metadata: {name: extra, namespace: kube-system}}
  - {apiVersion: v1, kind: ConfigMap}
";

    fn catalogue() -> Catalogue {
        let docs = [("cloud.yaml", DRIVER), ("extra.yaml", EXTRA)]
            .map(|(f, t)| (Origin::File(format!("/d/{f}").into()), t.to_string()));
        let (catalogue, problems) = Catalogue::with_documents(docs.to_vec());
        assert!(problems.is_empty(), "{problems:?}");
        catalogue
    }

    fn decision(driver: &str, optional: &[&str]) -> Decision {
        let storage = StorageSection {
            driver: Some(driver.into()),
            optional_csi_components: Some(optional.iter().map(|o| Some(o.to_string())).collect()),
        };
        decide_for_cluster(&storage, &catalogue()).unwrap()
    }

    fn deployed(kind: &str, name: &str, component: &str) -> Deployed {
        let api_version = match kind {
            "ConfigMap" | "ServiceAccount" => "v1",
            "CSIDriver" => "storage.k8s.io/v1",
            _ => "apps/v1",
        };
        let namespace = if kind == "CSIDriver" { "" } else { "kube-system" };
        Deployed {
            object: ObjectRef {
                api_version: api_version.into(),
                kind: kind.into(),
                namespace: namespace.into(),
                name: name.into(),
            },
            component: component.into(),
        }
    }

    #[test]
    fn bundles_apply_in_dependency_order_with_their_label() {
        let plan = plan(&decision("cloud", &["none"]), &catalogue(), &[], &image());
        let kinds: Vec<&str> = plan.apply.iter().map(|(_, o)| o["kind"].as_str().unwrap()).collect();
        assert_eq!(
            kinds,
            ["CustomResourceDefinition", "ServiceAccount", "ClusterRoleBinding", "CSIDriver", "DaemonSet"]
        );
        for (component, object) in &plan.apply {
            assert_eq!(component, "cloud");
            assert_eq!(object["metadata"]["labels"][COMPONENT_LABEL], "cloud", "{object}");
        }
        assert!(plan.prune.is_empty() && plan.left_alone.is_empty() && plan.problems.is_empty());
    }

    #[test]
    fn dropped_objects_are_pruned_and_components_turned_off_are_left_alone() {
        let cluster = [
            deployed("DaemonSet", "cloud-node", "cloud"),
            deployed("DaemonSet", "cloud-node-old", "cloud"),
            deployed("ConfigMap", "cloud-old", "cloud"),
            deployed("ConfigMap", "extra", "extra"),
            deployed("ConfigMap", "extra-old", "extra"),
        ];
        let rows: [(&str, Decision, &[&str], &[&str]); 3] = [
            (
                "both run: each prunes what its bundle dropped, workloads first",
                decision("cloud", &["extra"]),
                &[
                    "DaemonSet kube-system/cloud-node-old",
                    "ConfigMap kube-system/cloud-old",
                    "ConfigMap kube-system/extra-old",
                ],
                &[],
            ),
            (
                "extra off: its objects are left exactly as they are",
                decision("cloud", &["none"]),
                &["DaemonSet kube-system/cloud-node-old", "ConfigMap kube-system/cloud-old"],
                &["extra"],
            ),
            (
                "all off: nothing applied, nothing pruned",
                decision("none", &["none"]),
                &[],
                &["cloud", "extra"],
            ),
        ];
        for (what, decision, prune, left) in rows {
            let plan = plan(&decision, &catalogue(), &cluster, &image());
            let pruned: Vec<String> = plan.prune.iter().map(|d| d.object.to_string()).collect();
            assert_eq!(pruned, prune, "{what}");
            assert_eq!(plan.left_alone, left, "{what}");
        }
        let off = plan(&decision("none", &["none"]), &catalogue(), &cluster, &image());
        assert!(off.apply.is_empty(), "a component turned off is never applied: {:?}", off.apply);
    }

    fn image() -> BundleValues {
        BundleValues { image: Some("registry.example/kvol:1".into()) }
    }

    #[test]
    fn kvols_image_is_filled_in_or_its_component_waits_untouched() {
        let with = plan(&decision("cloud", &["none"]), &catalogue(), &[], &image());
        let daemonset = with.apply.iter().find(|(_, o)| o["kind"] == "DaemonSet").unwrap().1.clone();
        let container = &daemonset["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(container["image"], "registry.example/kvol:1");
        assert_eq!(container["args"][0], "--x=registry.example/kvol:1", "filled inside a string too");

        let deployed_before = [deployed("DaemonSet", "cloud-node", "cloud")];
        let without =
            plan(&decision("cloud", &["none"]), &catalogue(), &deployed_before, &BundleValues::default());
        assert!(without.apply.is_empty(), "nothing of the component is applied: {:?}", without.apply);
        assert!(without.prune.is_empty(), "nor pruned: {:?}", without.prune);
        assert_eq!(without.problems.len(), 1, "{:?}", without.problems);
        assert!(
            without.problems[0].starts_with("component cloud: ") && without.problems[0].contains("--image")
        );
    }

    #[test]
    fn an_object_without_a_name_is_a_problem_naming_its_place() {
        let plan = plan(&decision("none", &["extra"]), &catalogue(), &[], &image());
        assert_eq!(plan.apply.len(), 1);
        assert_eq!(
            plan.problems,
            ["component extra: cluster.objects[1] needs apiVersion, kind and metadata.name"]
        );
    }

    #[test]
    fn uninstall_deletes_workloads_first_and_keeps_a_crd_another_component_uses() {
        const OTHER: &str = "
name: other
role: optional
cluster:
  objects:
  - {apiVersion: apiextensions.k8s.io/v1, kind: CustomResourceDefinition, metadata: {name: clouds.example.com}}
";
        let docs = [("cloud.yaml", DRIVER), ("other.yaml", OTHER)]
            .map(|(f, t)| (Origin::File(format!("/d/{f}").into()), t.to_string()));
        let (with_other, problems) = Catalogue::with_documents(docs.to_vec());
        assert!(problems.is_empty(), "{problems:?}");
        let crd = Deployed {
            object: ObjectRef {
                api_version: "apiextensions.k8s.io/v1".into(),
                kind: "CustomResourceDefinition".into(),
                namespace: String::new(),
                name: "clouds.example.com".into(),
            },
            component: "cloud".into(),
        };
        let cluster = [
            crd.clone(),
            deployed("ServiceAccount", "cloud", "cloud"),
            deployed("DaemonSet", "cloud-node", "cloud"),
            deployed("ConfigMap", "extra", "extra"),
        ];
        let names = |refs: &[ObjectRef]| refs.iter().map(ToString::to_string).collect::<Vec<_>>();
        let (delete, kept) = removal("cloud", &cluster, &catalogue());
        assert_eq!(
            names(&delete),
            [
                "DaemonSet kube-system/cloud-node",
                "ServiceAccount kube-system/cloud",
                "CustomResourceDefinition clouds.example.com"
            ]
        );
        assert!(kept.is_empty());
        let (delete, kept) = removal("cloud", &cluster, &with_other);
        assert_eq!(names(&delete), ["DaemonSet kube-system/cloud-node", "ServiceAccount kube-system/cloud"]);
        assert_eq!(names(&kept), ["CustomResourceDefinition clouds.example.com"]);
    }
}
