//! VolumeAttachments read from the API server by name, for the CSI plugins of a node in cluster mode ([`kvol_csi::attachment`]).

use async_trait::async_trait;
use k8s_openapi::api::storage::v1::VolumeAttachment;
use kube::{Api, Client};
use kvol_csi::AttachmentSource;

/// [`AttachmentSource`] on the API server: one GET per read of the one object a volume needs
/// (no watch of all VolumeAttachments, whose number grows with the cluster).
#[derive(Clone)]
pub struct ApiAttachments {
    client: Client,
}

impl std::fmt::Debug for ApiAttachments {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiAttachments").finish_non_exhaustive()
    }
}

impl ApiAttachments {
    pub fn new(client: Client) -> ApiAttachments {
        ApiAttachments { client }
    }
}

#[async_trait]
impl AttachmentSource for ApiAttachments {
    async fn volume_attachment(&self, name: &str) -> Result<Option<VolumeAttachment>, String> {
        let api: Api<VolumeAttachment> = Api::all(self.client.clone());
        api.get_opt(name).await.map_err(|e| format!("cannot read volumeattachment {name}: {e}"))
    }

    async fn node_managed_by_controller(&self, node: &str) -> Result<Option<bool>, String> {
        let api: Api<k8s_openapi::api::core::v1::Node> = Api::all(self.client.clone());
        let found = api.get_opt(node).await.map_err(|e| format!("cannot read node {node}: {e}"))?;
        Ok(found.map(|n| {
            let annotations = n.metadata.annotations.unwrap_or_default();
            annotations.get(kvol_api::keys::ANN_CONTROLLER_MANAGED_ATTACH_DETACH).is_some_and(|v| v == "true")
        }))
    }
}
