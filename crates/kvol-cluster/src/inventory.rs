//! Every object `kvol migrate check` reads, listed from the API server: PersistentVolumes, Pods, StorageClasses, CSIDrivers, CSINodes, and the Secrets by their metadata only.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{PersistentVolume, Pod, Secret};
use k8s_openapi::api::storage::v1::{CSIDriver, CSINode, StorageClass};
use kube::api::ListParams;
use kube::{Api, Client};

/// The objects a migration check reads.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    pub persistent_volumes: Vec<PersistentVolume>,
    pub pods: Vec<Pod>,
    pub storage_classes: Vec<StorageClass>,
    pub csi_drivers: Vec<CSIDriver>,
    pub csi_nodes: Vec<CSINode>,
    /// The Secrets that exist, as `namespace/name` (their data is never read).
    pub secrets: BTreeSet<String>,
}

/// A Secret's key in [`Inventory::secrets`].
pub fn secret_key(meta: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta) -> String {
    format!("{}/{}", meta.namespace.as_deref().unwrap_or("default"), meta.name.as_deref().unwrap_or_default())
}

/// Lists the cluster's objects of the kinds a check reads; an error names the kind.
pub async fn list_inventory(client: &Client) -> Result<Inventory, String> {
    let all = ListParams::default();
    let failed = |what: &'static str| move |e: kube::Error| format!("cannot list {what}: {e}");
    let secrets = Api::<Secret>::all(client.clone()).list_metadata(&all).await.map_err(failed("secrets"))?;
    Ok(Inventory {
        persistent_volumes: Api::all(client.clone())
            .list(&all)
            .await
            .map_err(failed("persistentvolumes"))?
            .items,
        pods: Api::all(client.clone()).list(&all).await.map_err(failed("pods"))?.items,
        storage_classes: Api::all(client.clone()).list(&all).await.map_err(failed("storageclasses"))?.items,
        csi_drivers: Api::all(client.clone()).list(&all).await.map_err(failed("csidrivers"))?.items,
        csi_nodes: Api::all(client.clone()).list(&all).await.map_err(failed("csinodes"))?.items,
        secrets: secrets.items.iter().map(|s| secret_key(&s.metadata)).collect(),
    })
}
