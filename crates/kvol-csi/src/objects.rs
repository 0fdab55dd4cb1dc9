//! The API objects CSI needs on a node (CSIDriver, CSINode), behind one seam: in memory for standalone mode and tests, the API server in cluster mode.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::storage::v1::{CSIDriver, CSINode};

/// Reads CSIDriver objects and keeps this node's CSINode.
pub trait NodeObjects: Send + Sync + std::fmt::Debug {
    /// The CSIDriver named after `driver`, if one exists (none means upstream's defaults).
    fn csi_driver(&self, driver: &str) -> Option<CSIDriver>;
    /// The CSINode named `node`, if it exists.
    fn csi_node(&self, node: &str) -> Option<CSINode>;
    /// Stores `csinode` (created or replaced, by its name).
    fn put_csi_node(&self, csinode: CSINode);
}

/// Objects held in memory: standalone mode fills it from its manifests, tests directly.
#[derive(Debug, Default, Clone)]
pub struct MemoryObjects {
    inner: Arc<Mutex<Inner>>,
}

#[derive(Debug, Default)]
struct Inner {
    drivers: BTreeMap<String, CSIDriver>,
    nodes: BTreeMap<String, CSINode>,
}

impl MemoryObjects {
    pub fn new() -> MemoryObjects {
        MemoryObjects::default()
    }

    /// Adds or replaces a CSIDriver (by its name).
    pub fn put_csi_driver(&self, driver: CSIDriver) {
        let name = driver.metadata.name.clone().unwrap_or_default();
        self.lock().drivers.insert(name, driver);
    }

    /// Removes the CSIDriver called `name`.
    pub fn remove_csi_driver(&self, name: &str) {
        self.lock().drivers.remove(name);
    }

    /// Makes `drivers` the whole set of CSIDrivers, at once: a driver missing from it has no
    /// CSIDriver any more, so upstream's defaults apply to it again.
    pub fn set_csi_drivers(&self, drivers: impl IntoIterator<Item = CSIDriver>) {
        let drivers = drivers.into_iter().map(|d| (d.metadata.name.clone().unwrap_or_default(), d)).collect();
        self.lock().drivers = drivers;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl NodeObjects for MemoryObjects {
    fn csi_driver(&self, driver: &str) -> Option<CSIDriver> {
        self.lock().drivers.get(driver).cloned()
    }

    fn csi_node(&self, node: &str) -> Option<CSINode> {
        self.lock().nodes.get(node).cloned()
    }

    fn put_csi_node(&self, csinode: CSINode) {
        let name = csinode.metadata.name.clone().unwrap_or_default();
        self.lock().nodes.insert(name, csinode);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::storage::v1::CSIDriverSpec;

    fn driver(name: &str, attach: bool) -> CSIDriver {
        CSIDriver {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: CSIDriverSpec { attach_required: Some(attach), ..Default::default() },
        }
    }

    #[test]
    fn setting_the_drivers_drops_the_ones_not_given() {
        let objects = MemoryObjects::new();
        objects.set_csi_drivers([driver("a.csi", false), driver("b.csi", true)]);
        assert!(objects.csi_driver("b.csi").is_some());
        objects.set_csi_drivers([driver("a.csi", true)]);
        assert_eq!(objects.csi_driver("a.csi").and_then(|d| d.spec.attach_required), Some(true));
        assert!(objects.csi_driver("b.csi").is_none(), "a removed CSIDriver no longer applies");
    }
}
