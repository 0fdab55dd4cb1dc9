//! The hostpath driver's registrar: the kubelet plugin-registration service node-driver-registrar would serve, naming the CSI socket and recording the kubelet's verdict.

use std::path::Path;

use tokio::sync::watch;
use tonic::{Request, Response, Status};

use kvol_csi::proto::registration::{
    self, InfoRequest, PluginInfo, RegistrationStatus, RegistrationStatusResponse,
    registration_server::Registration,
};

/// The plugin type of a CSI driver in the registration protocol.
pub const CSI_PLUGIN_TYPE: &str = "CSIPlugin";
/// The CSI versions the driver speaks, as the registration protocol lists them.
pub const SUPPORTED_VERSIONS: [&str; 1] = ["1.0.0"];

/// What the kubelet last reported through NotifyRegistrationStatus.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegistrationOutcome {
    pub registered: bool,
    /// The kubelet's reason when it did not register the driver.
    pub error: String,
}

/// The answer to GetInfo for driver `name` whose CSI socket is `endpoint`.
pub fn plugin_info(name: &str, endpoint: &Path) -> PluginInfo {
    PluginInfo {
        r#type: CSI_PLUGIN_TYPE.to_string(),
        name: name.to_string(),
        endpoint: endpoint.display().to_string(),
        supported_versions: SUPPORTED_VERSIONS.iter().map(|v| v.to_string()).collect(),
    }
}

/// The Registration service: GetInfo names the driver and its CSI socket; each
/// NotifyRegistrationStatus is logged and published on a watch channel.
#[derive(Debug)]
pub struct RegistrarService {
    info: PluginInfo,
    outcomes: watch::Sender<Option<RegistrationOutcome>>,
}

impl RegistrarService {
    pub fn new(info: PluginInfo, outcomes: watch::Sender<Option<RegistrationOutcome>>) -> RegistrarService {
        RegistrarService { info, outcomes }
    }
}

#[tonic::async_trait]
impl Registration for RegistrarService {
    async fn get_info(&self, _request: Request<InfoRequest>) -> Result<Response<PluginInfo>, Status> {
        tracing::debug!(driver = %self.info.name, "kubelet asked for the plugin info");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<RegistrationStatus>,
    ) -> Result<Response<RegistrationStatusResponse>, Status> {
        let registration::RegistrationStatus { plugin_registered, error } = request.into_inner();
        if plugin_registered {
            tracing::info!(driver = %self.info.name, "kubelet registered the driver");
        } else {
            tracing::error!(driver = %self.info.name, "kubelet did not register the driver: {error}");
        }
        self.outcomes.send_replace(Some(RegistrationOutcome { registered: plugin_registered, error }));
        Ok(Response::new(RegistrationStatusResponse {}))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plugin_info_names_the_csi_socket_and_version_one() {
        let info = plugin_info("d.example", Path::new("/var/lib/kubelet/plugins/d.example/csi.sock"));
        assert_eq!(info.r#type, "CSIPlugin");
        assert_eq!(info.name, "d.example");
        assert_eq!(info.endpoint, "/var/lib/kubelet/plugins/d.example/csi.sock");
        assert_eq!(info.supported_versions, ["1.0.0"]);
    }

    #[tokio::test]
    async fn notifications_are_published_in_order() {
        let (tx, mut rx) = watch::channel(None);
        let service = RegistrarService::new(plugin_info("d", Path::new("/s")), tx);
        for (registered, error) in [(false, "version 0.3 is not supported"), (true, "")] {
            let status = RegistrationStatus { plugin_registered: registered, error: error.to_string() };
            service.notify_registration_status(Request::new(status)).await.unwrap();
            rx.changed().await.unwrap();
            let got = rx.borrow_and_update().clone();
            assert_eq!(got, Some(RegistrationOutcome { registered, error: error.to_string() }));
        }
        let info = service.get_info(Request::new(InfoRequest {})).await.unwrap().into_inner();
        assert_eq!(info.name, "d");
    }
}
