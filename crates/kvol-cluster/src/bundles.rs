//! Component bundles in the API: what is deployed under kvol's component label, and a [`BundlePlan`] carried out with server-side apply (field manager `kvol`) and deletes.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiResource, Scope, pinned_kind};
use kvol_components::Catalogue;
use kvol_components::bundle::{BundlePlan, COMPONENT_LABEL, Deployed, ObjectRef};

/// The field manager of kvol's applies.
pub const FIELD_MANAGER: &str = "kvol";

/// Every kind any component's bundle has, as `(apiVersion, kind)`: where deployed objects are
/// looked for.
pub fn bundle_kinds(catalogue: &Catalogue) -> BTreeSet<(String, String)> {
    catalogue
        .entries()
        .iter()
        .filter_map(|e| e.definition.cluster.as_ref())
        .flat_map(|bundle| bundle.objects.iter().filter_map(ObjectRef::of))
        .map(|r| (r.api_version, r.kind))
        .collect()
}

/// Where kvol remembers which kinds it has deployed objects of, so an object of a kind every
/// bundle has since dropped is still found and pruned: ConfigMap `kube-system/kvol-components`.
pub const INVENTORY_NAMESPACE: &str = "kube-system";
pub const INVENTORY_NAME: &str = "kvol-components";

/// The kinds the inventory lists (none when there is no inventory yet).
pub async fn inventory_kinds(client: &kube::Client) -> Result<BTreeSet<(String, String)>, String> {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), INVENTORY_NAMESPACE);
    let inventory = api
        .get_opt(INVENTORY_NAME)
        .await
        .map_err(|e| format!("cannot read configmap {INVENTORY_NAMESPACE}/{INVENTORY_NAME}: {e}"))?;
    let text = inventory.and_then(|c| c.data).and_then(|d| d.get("kinds").cloned()).unwrap_or_default();
    Ok(text
        .lines()
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(api_version, kind)| (api_version.to_string(), kind.to_string()))
        .collect())
}

/// Records `kinds` (one `apiVersion kind` per line) in the inventory.
pub async fn write_inventory(
    client: &kube::Client,
    kinds: &BTreeSet<(String, String)>,
) -> Result<(), String> {
    let lines: Vec<String> = kinds.iter().map(|(v, k)| format!("{v} {k}")).collect();
    let body = serde_json::json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": INVENTORY_NAME, "namespace": INVENTORY_NAMESPACE},
        "data": {"kinds": lines.join("\n")},
    });
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), INVENTORY_NAMESPACE);
    api.patch(INVENTORY_NAME, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&body))
        .await
        .map(drop)
        .map_err(|e| format!("cannot write configmap {INVENTORY_NAMESPACE}/{INVENTORY_NAME}: {e}"))
}

/// The objects of `kinds` that carry the component label, with their component.
pub async fn deployed(
    client: &kube::Client,
    kinds: &BTreeSet<(String, String)>,
) -> Result<Vec<Deployed>, String> {
    Ok(deployed_objects(client, kinds).await?.into_iter().map(|(deployed, _)| deployed).collect())
}

/// [`deployed`], each with the API's copy of the object (its spec and status as JSON).
pub async fn deployed_objects(
    client: &kube::Client,
    kinds: &BTreeSet<(String, String)>,
) -> Result<Vec<(Deployed, serde_json::Value)>, String> {
    let mut out = Vec::new();
    for (api_version, kind) in kinds {
        let (resource, _) = resource(client, api_version, kind).await?;
        let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
        let listed = api
            .list(&ListParams::default().labels(COMPONENT_LABEL))
            .await
            .map_err(|e| format!("cannot list {kind} ({api_version}) labelled {COMPONENT_LABEL}: {e}"))?;
        for object in listed {
            let component = object.metadata.labels.as_ref().and_then(|l| l.get(COMPONENT_LABEL)).cloned();
            let (Some(component), Some(name)) = (component, object.metadata.name.clone()) else { continue };
            let deployed = Deployed {
                object: ObjectRef {
                    api_version: api_version.clone(),
                    kind: kind.clone(),
                    namespace: object.metadata.namespace.clone().unwrap_or_default(),
                    name,
                },
                component,
            };
            out.push((deployed, object.data));
        }
    }
    Ok(out)
}

/// Every PersistentVolume in the cluster (a component's footprint counts its driver's).
pub async fn persistent_volumes(
    client: &kube::Client,
) -> Result<Vec<k8s_openapi::api::core::v1::PersistentVolume>, String> {
    Api::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .map_err(|e| format!("cannot list persistentvolumes: {e}"))
}

/// What [`carry_out`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    pub applied: Vec<String>,
    pub pruned: Vec<String>,
    pub failed: Vec<String>,
}

/// Applies the plan's objects in order, then prunes; each failure is kept with the object's
/// name and the rest still done.
pub async fn carry_out(client: &kube::Client, plan: &BundlePlan) -> Outcome {
    let mut outcome = Outcome::default();
    for (component, object) in &plan.apply {
        let Some(reference) = ObjectRef::of(object) else { continue };
        match apply_one(client, &reference, object).await {
            Ok(()) => outcome.applied.push(format!("{reference} ({component})")),
            Err(e) => outcome.failed.push(format!("cannot apply {reference} of component {component}: {e}")),
        }
    }
    for deployed in &plan.prune {
        match delete_one(client, &deployed.object).await {
            Ok(()) => outcome.pruned.push(format!("{} ({})", deployed.object, deployed.component)),
            Err(e) => outcome
                .failed
                .push(format!("cannot prune {} of component {}: {e}", deployed.object, deployed.component)),
        }
    }
    outcome
}

async fn apply_one(
    client: &kube::Client,
    reference: &ObjectRef,
    object: &serde_json::Value,
) -> Result<(), String> {
    let api = api_for(client, reference).await?;
    let params = PatchParams::apply(FIELD_MANAGER).force();
    api.patch(&reference.name, &params, &Patch::Apply(object)).await.map(drop).map_err(|e| e.to_string())
}

async fn delete_one(client: &kube::Client, reference: &ObjectRef) -> Result<(), String> {
    let api = api_for(client, reference).await?;
    match api.delete(&reference.name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
        Err(e) => Err(e.to_string()),
    }
}

async fn api_for(client: &kube::Client, reference: &ObjectRef) -> Result<Api<DynamicObject>, String> {
    let (resource, scope) = resource(client, &reference.api_version, &reference.kind).await?;
    Ok(match scope {
        Scope::Namespaced => {
            let namespace = if reference.namespace.is_empty() { "default" } else { &reference.namespace };
            Api::namespaced_with(client.clone(), namespace, &resource)
        }
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    })
}

/// The API resource of `apiVersion`/`kind`, asked of the server (a kind it does not serve,
/// such as a CRD not installed yet, is an error naming it).
async fn resource(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
) -> Result<(ApiResource, Scope), String> {
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let gvk = GroupVersionKind::gvk(group, version, kind);
    let (resource, capabilities) = pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("the api server does not serve {kind} ({api_version}): {e}"))?;
    Ok((resource, capabilities.scope))
}

/// What still depends on `definition`'s driver in the cluster: PersistentVolumes (in-tree ones
/// that migrate to it included), claims, and snapshot objects when the snapshot kinds are
/// served (a cluster without them has none).
pub async fn holders(
    client: &kube::Client,
    definition: &kvol_components::ComponentDefinition,
) -> Result<Vec<kvol_components::uninstall::Holder>, String> {
    use k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use k8s_openapi::api::storage::v1::StorageClass;
    use kvol_components::uninstall::{Inventory, holders};
    let all = ListParams::default();
    let failed = |what: &'static str| move |e: kube::Error| format!("cannot list {what}: {e}");
    let volumes = persistent_volumes(client).await?;
    let claims = Api::<PersistentVolumeClaim>::all(client.clone())
        .list(&all)
        .await
        .map_err(failed("persistentvolumeclaims"))?;
    let classes =
        Api::<StorageClass>::all(client.clone()).list(&all).await.map_err(failed("storageclasses"))?;
    let snapshots = snapshot_objects(client).await?;
    Ok(holders(
        definition,
        &Inventory {
            volumes: &volumes,
            claims: &claims.items,
            classes: &classes.items,
            snapshots: &snapshots,
        },
    ))
}

/// VolumeSnapshotContents (their `spec.driver`) and VolumeSnapshots (their class's driver),
/// when the API serves the snapshot kinds.
async fn snapshot_objects(
    client: &kube::Client,
) -> Result<Vec<kvol_components::uninstall::SnapshotObject>, String> {
    use kvol_components::uninstall::SnapshotObject;
    const GROUP: &str = "snapshot.storage.k8s.io/v1";
    let list = |kind: &'static str| async move {
        let Ok((resource, _)) = resource(client, GROUP, kind).await else { return Ok(Vec::new()) };
        Api::<DynamicObject>::all_with(client.clone(), &resource)
            .list(&ListParams::default())
            .await
            .map(|l| l.items)
            .map_err(|e| format!("cannot list {kind}: {e}"))
    };
    let classes = list("VolumeSnapshotClass").await?;
    let class_driver = |name: &str| {
        classes
            .iter()
            .find(|c| c.metadata.name.as_deref() == Some(name))
            .and_then(|c| c.data.get("driver").and_then(|d| d.as_str()).map(str::to_string))
    };
    let mut out = Vec::new();
    for content in list("VolumeSnapshotContent").await? {
        out.push(SnapshotObject {
            kind: "VolumeSnapshotContent",
            name: content.metadata.name.clone().unwrap_or_default(),
            driver: content.data.pointer("/spec/driver").and_then(|d| d.as_str()).map(str::to_string),
        });
    }
    for snapshot in list("VolumeSnapshot").await? {
        let class = snapshot.data.pointer("/spec/volumeSnapshotClassName").and_then(|c| c.as_str());
        out.push(SnapshotObject {
            kind: "VolumeSnapshot",
            name: format!(
                "{}/{}",
                snapshot.metadata.namespace.as_deref().unwrap_or("default"),
                snapshot.metadata.name.as_deref().unwrap_or_default()
            ),
            driver: class.and_then(class_driver),
        });
    }
    Ok(out)
}

/// Deletes `objects` in the order given; each failure is named, the rest still deleted.
pub async fn delete_all(client: &kube::Client, objects: &[ObjectRef]) -> Outcome {
    let mut outcome = Outcome::default();
    for object in objects {
        match delete_one(client, object).await {
            Ok(()) => outcome.pruned.push(object.to_string()),
            Err(e) => outcome.failed.push(format!("cannot delete {object}: {e}")),
        }
    }
    outcome
}
