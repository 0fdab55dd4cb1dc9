//! The hostpath driver's CSI Identity service: name, version, the volume backing (in the manifest), plugin capabilities, readiness.

use std::collections::HashMap;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::HostpathConfig;
use crate::backing::{BackingChoice, MANIFEST_KEY};
use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
use kvol_csi::proto::csi::{self, identity_server::Identity};

/// The driver's version, reported as vendor_version: the crate's.
pub const VENDOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The plugin capabilities: a controller service, volumes bound to this node's topology, a
/// group controller service (group snapshots), and expansion, online unless `offline` (the
/// controller records the new capacity; the node makes it the size the volume shows).
pub fn plugin_capabilities(offline: bool) -> Vec<csi::PluginCapability> {
    let expansion = if offline { volume_expansion::Type::Offline } else { volume_expansion::Type::Online };
    let service = |t: service::Type| csi::PluginCapability {
        r#type: Some(Type::Service(Service { r#type: t as i32 })),
    };
    vec![
        service(service::Type::ControllerService),
        service(service::Type::VolumeAccessibilityConstraints),
        service(service::Type::GroupControllerService),
        csi::PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion { r#type: expansion as i32 })),
        },
    ]
}

/// The Identity service.
#[derive(Debug, Clone)]
pub struct IdentityService {
    pub(crate) config: Arc<HostpathConfig>,
    /// Said in GetPluginInfo's manifest under [`MANIFEST_KEY`].
    pub(crate) backing: BackingChoice,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _request: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        Ok(Response::new(csi::GetPluginInfoResponse {
            name: self.config.driver_name.clone(),
            vendor_version: VENDOR_VERSION.to_string(),
            manifest: HashMap::from([(MANIFEST_KEY.to_string(), self.backing.describe())]),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _request: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse {
            capabilities: plugin_capabilities(self.config.offline_expansion),
        }))
    }

    async fn probe(
        &self,
        _request: Request<csi::ProbeRequest>,
    ) -> Result<Response<csi::ProbeResponse>, Status> {
        // Serving at all means ready: the state was loaded before the socket was bound.
        Ok(Response::new(csi::ProbeResponse { ready: Some(true) }))
    }
}
