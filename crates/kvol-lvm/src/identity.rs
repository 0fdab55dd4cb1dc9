//! The LVM driver's CSI Identity service: name, version, plugin capabilities, and readiness (lvm answers).

use std::collections::HashMap;

use tonic::{Request, Response, Status};

use crate::driver::Shared;
use csi::plugin_capability::{Service, Type, VolumeExpansion, service, volume_expansion};
use kvol_csi::proto::csi::{self, identity_server::Identity};

/// The driver's version, reported as vendor_version: the crate's.
pub const VENDOR_VERSION: &str = env!("CARGO_PKG_VERSION");

/// The plugin capabilities: a controller service, volumes bound to this node's topology, and
/// online expansion.
pub fn plugin_capabilities() -> Vec<csi::PluginCapability> {
    let service = |t: service::Type| csi::PluginCapability {
        r#type: Some(Type::Service(Service { r#type: t as i32 })),
    };
    vec![
        service(service::Type::ControllerService),
        service(service::Type::VolumeAccessibilityConstraints),
        csi::PluginCapability {
            r#type: Some(Type::VolumeExpansion(VolumeExpansion {
                r#type: volume_expansion::Type::Online as i32,
            })),
        },
    ]
}

/// The Identity service.
#[derive(Debug, Clone)]
pub struct IdentityService {
    pub(crate) core: Shared,
}

#[tonic::async_trait]
impl Identity for IdentityService {
    async fn get_plugin_info(
        &self,
        _: Request<csi::GetPluginInfoRequest>,
    ) -> Result<Response<csi::GetPluginInfoResponse>, Status> {
        let name = self.core.lock().await.config.driver_name.clone();
        Ok(Response::new(csi::GetPluginInfoResponse {
            name,
            vendor_version: VENDOR_VERSION.to_string(),
            manifest: HashMap::new(),
        }))
    }

    async fn get_plugin_capabilities(
        &self,
        _: Request<csi::GetPluginCapabilitiesRequest>,
    ) -> Result<Response<csi::GetPluginCapabilitiesResponse>, Status> {
        Ok(Response::new(csi::GetPluginCapabilitiesResponse { capabilities: plugin_capabilities() }))
    }

    /// Ready when lvm answers for the driver's logical volumes within the deadline.
    async fn probe(&self, _: Request<csi::ProbeRequest>) -> Result<Response<csi::ProbeResponse>, Status> {
        let core = self.core.lock().await;
        match core.owned().await {
            Ok(_) => Ok(Response::new(csi::ProbeResponse { ready: Some(true) })),
            Err(e) => Err(Status::failed_precondition(format!("lvm does not answer: {}", e.message()))),
        }
    }
}
