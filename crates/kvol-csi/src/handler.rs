//! The CSI registration handler: a validated driver becomes a `CsiPlugin` in the registry and an entry in this node's CSINode; deregistration undoes both.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use kvol_api::FeatureGates;
use kvol_plugin::{DynamicSource, PluginHost, PluginRegistry, ProbeEvent};

use crate::attachment::AttachmentSource;
use crate::client::{CsiClient, RpcObserver, Timeouts};
use crate::csinode;
use crate::objects::NodeObjects;
use crate::plugin::CsiPlugin;
use crate::registration::{RegistrationHandler, WatcherConfig, plugin_info, sockets_under};
use crate::versions::{self, Version};

/// A driver this handler registered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegisteredDriver {
    pub name: String,
    pub endpoint: String,
    pub version: Version,
    pub node_id: String,
    /// NodeGetInfo's `accessible_topology` segments: labels for the Node.
    pub topology: BTreeMap<String, String>,
    /// What `GetPluginCapabilities` said (its expansion modes tell a resizer whether a volume
    /// may grow while published); the default when the driver would not say.
    pub plugin: crate::client::PluginCapabilities,
}

/// Registers CSI drivers with the plugin registry and keeps the node's CSINode (and its
/// driver → node ID annotation) true as drivers come and go.
#[derive(Debug)]
pub struct CsiRegistrationHandler {
    registry: Arc<PluginRegistry>,
    objects: Arc<dyn NodeObjects>,
    host: PluginHost,
    migrated_plugins: Vec<&'static str>,
    timeouts: Timeouts,
    /// Given to the client of every driver registered from now on.
    observer: Option<Arc<dyn RpcObserver>>,
    /// Cluster mode: given to every driver's plugin, which then waits for VolumeAttachments.
    attachments: Option<Arc<dyn AttachmentSource>>,
    /// Cluster mode: given to every driver's plugin, which then hands drivers that ask for them
    /// the pods' service-account tokens.
    tokens: Option<Arc<dyn crate::tokens::TokenSource>>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    drivers: BTreeMap<String, RegisteredDriver>,
    /// The value of the Node's `csi.volume.kubernetes.io/nodeid` annotation.
    node_id_annotation: Option<String>,
}

impl CsiRegistrationHandler {
    /// A handler for the node `host.node.name`. The node's CSINode is created at once with the
    /// migrated-plugins annotation the gates give, as kubelet does at start.
    pub fn new(
        registry: Arc<PluginRegistry>,
        objects: Arc<dyn NodeObjects>,
        host: PluginHost,
        gates: &FeatureGates,
        timeouts: Timeouts,
    ) -> CsiRegistrationHandler {
        let migrated_plugins = gates.migrated_plugin_names();
        let node = host.node.name.clone();
        let csinode = match objects.csi_node(&node) {
            Some(mut existing) => {
                csinode::set_migrated_plugins(&mut existing, &migrated_plugins);
                existing
            }
            None => csinode::initial_csinode(&node, &migrated_plugins),
        };
        objects.put_csi_node(csinode);
        CsiRegistrationHandler {
            registry,
            objects,
            host,
            migrated_plugins,
            timeouts,
            observer: None,
            attachments: None,
            tokens: None,
            state: Mutex::default(),
        }
    }

    /// This handler giving `observer` to the client of every driver it registers, so each CSI
    /// call those drivers' plugins make is reported.
    pub fn with_observer(self, observer: Arc<dyn RpcObserver>) -> Self {
        CsiRegistrationHandler { observer: Some(observer), ..self }
    }

    /// This handler giving its drivers' plugins `attachments` (cluster mode: attach through
    /// VolumeAttachments); `None` keeps node-driven attach.
    pub fn with_attachments(self, attachments: Option<Arc<dyn AttachmentSource>>) -> Self {
        CsiRegistrationHandler { attachments, ..self }
    }

    /// This handler giving its drivers' plugins `tokens` (cluster mode: the TokenRequest API);
    /// `None`: a driver whose CSIDriver asks for tokens cannot publish.
    pub fn with_tokens(self, tokens: Option<Arc<dyn crate::tokens::TokenSource>>) -> Self {
        CsiRegistrationHandler { tokens, ..self }
    }

    /// The drivers registered now, by name.
    pub fn drivers(&self) -> Vec<RegisteredDriver> {
        self.lock().drivers.values().cloned().collect()
    }

    /// The topology labels of every registered driver, for the Node: a key two drivers report
    /// is one label (registration refuses a second driver reporting another value).
    pub fn topology_labels(&self) -> BTreeMap<String, String> {
        topology_of(self.lock().drivers.values())
    }

    /// The Node annotation `csi.volume.kubernetes.io/nodeid` as it stands.
    pub fn node_id_annotation(&self) -> Option<String> {
        self.lock().node_id_annotation.clone()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn existing_version(&self, name: &str) -> Option<Version> {
        self.lock().drivers.get(name).map(|d| d.version.clone())
    }

    /// Takes driver `name` out of the registry, the CSINode and the annotation.
    fn remove(&self, name: &str) {
        self.registry.apply(DynamicSource::Csi, [ProbeEvent::Remove(name.to_string())]);
        let node = &self.host.node.name;
        if let Some(current) = self.objects.csi_node(node) {
            self.objects.put_csi_node(csinode::uninstall_driver(current, name));
        }
        let mut state = self.lock();
        state.drivers.remove(name);
        match csinode::node_id_annotation_remove(state.node_id_annotation.as_deref(), name) {
            Ok(value) => state.node_id_annotation = value,
            Err(e) => tracing::warn!(driver = name, error = %e, "cannot update the node ID annotation"),
        }
    }

    async fn try_register(
        &self,
        name: &str,
        endpoint: &str,
        version: Version,
    ) -> Result<RegisteredDriver, String> {
        let mut client =
            CsiClient::new(name, Path::new(endpoint), self.timeouts).map_err(|e| e.to_string())?;
        if let Some(observer) = &self.observer {
            client = client.with_observer(Arc::clone(observer));
        }
        let info = client.node_get_info().await.map_err(|e| e.to_string())?;
        let plugin_capabilities = client.plugin_capabilities().await.unwrap_or_else(|e| {
            tracing::warn!(driver = %name, error = %e, "GetPluginCapabilities failed; taken as none");
            crate::client::PluginCapabilities::default()
        });
        let objects = Arc::clone(&self.objects);
        let plugin = CsiPlugin::connect(name, client, self.host.clone(), objects, info.node_id.clone())
            .await
            .map_err(|e| e.to_string())?
            .with_version(version.to_string())
            .with_attachments(self.attachments.clone())
            .with_tokens(self.tokens.clone());
        let node = &self.host.node.name;
        let mut keys: Vec<String> = info
            .accessible_topology
            .as_ref()
            .map(|t| t.segments.keys().cloned().collect())
            .unwrap_or_default();
        keys.sort();
        let topology: BTreeMap<String, String> =
            info.accessible_topology.map(|t| t.segments.into_iter().collect()).unwrap_or_default();
        let others = topology_of(self.lock().drivers.values().filter(|d| d.name != name));
        csinode::topology_labels(Some(&others), &topology)
            .map_err(|e| format!("{e} (reported by another registered csi driver)"))?;
        let csinode = csinode::install_driver(
            self.objects.csi_node(node),
            node,
            name,
            &info.node_id,
            &keys,
            info.max_volumes_per_node,
            &self.migrated_plugins,
        )?;
        let annotation = {
            let state = self.lock();
            csinode::node_id_annotation_set(state.node_id_annotation.as_deref(), name, &info.node_id)?
        };
        if let Some(refused) =
            self.registry.apply(DynamicSource::Csi, [ProbeEvent::AddOrUpdate(Arc::new(plugin))]).pop()
        {
            return Err(refused.to_string());
        }
        self.objects.put_csi_node(csinode);
        let driver = RegisteredDriver {
            name: name.to_string(),
            endpoint: endpoint.to_string(),
            version,
            node_id: info.node_id,
            topology,
            plugin: plugin_capabilities,
        };
        let mut state = self.lock();
        state.node_id_annotation = Some(annotation);
        state.drivers.insert(name.to_string(), driver.clone());
        Ok(driver)
    }
}

#[async_trait]
impl RegistrationHandler for CsiRegistrationHandler {
    async fn validate(&self, name: &str, _endpoint: &str, versions: &[String]) -> Result<(), String> {
        versions::validate_new(name, versions, self.existing_version(name).as_ref()).map(|_| ())
    }

    async fn register(&self, name: &str, endpoint: &str, versions: &[String]) -> Result<(), String> {
        let version = versions::validate_new(name, versions, self.existing_version(name).as_ref())?;
        match self.try_register(name, endpoint, version).await {
            Ok(driver) => {
                tracing::info!(driver = name, endpoint, version = %driver.version, node_id = %driver.node_id, "csi driver registered");
                Ok(())
            }
            Err(reason) => {
                // Nothing half-done: a driver that failed here is in neither the registry nor the CSINode.
                if !self.lock().drivers.contains_key(name) {
                    self.remove(name);
                }
                tracing::warn!(driver = name, endpoint, %reason, "csi driver registration failed");
                Err(reason)
            }
        }
    }

    async fn deregister(&self, name: &str, endpoint: &str) {
        let current = self.lock().drivers.get(name).map(|d| d.endpoint.clone());
        if current.as_deref() != Some(endpoint) {
            tracing::info!(
                driver = name,
                endpoint,
                ?current,
                "ignoring deregistration of a replaced registration"
            );
            return;
        }
        self.remove(name);
        tracing::info!(driver = name, endpoint, "csi driver deregistered");
    }
}

/// The union of `drivers`' topology segments.
fn topology_of<'a>(drivers: impl Iterator<Item = &'a RegisteredDriver>) -> BTreeMap<String, String> {
    drivers.flat_map(|d| d.topology.iter().map(|(k, v)| (k.clone(), v.clone()))).collect()
}

/// Registers every CSI driver whose registration socket is under `dir`, once, without telling
/// the plugins anything: for read-only listings (`kvol plugins`). Returns the failures, per
/// socket.
pub async fn register_present_once(
    dir: &Path,
    config: &WatcherConfig,
    handler: &CsiRegistrationHandler,
) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    for socket in sockets_under(dir) {
        let outcome = async {
            let info = plugin_info(&socket, config).await?;
            if info.r#type != crate::registration::CSI_PLUGIN_TYPE {
                return Err(format!("plugin type {:?} is not CSIPlugin", info.r#type));
            }
            let endpoint =
                if info.endpoint.is_empty() { socket.display().to_string() } else { info.endpoint.clone() };
            handler
                .register(&info.name, &endpoint, &info.supported_versions)
                .await
                .map_err(|e| format!("csi driver {}: {e}", info.name))
        }
        .await;
        if let Err(reason) = outcome {
            failures.push((socket.display().to_string(), reason));
        }
    }
    failures
}
