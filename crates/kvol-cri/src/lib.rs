//! CRI v1 for kvol: the part of `runtime.v1` (RuntimeService, ImageService) its runner calls, and [`CriClient`], a client over the runtime's unix socket with a deadline per call.

use std::future::Future;
use std::time::Duration;

use tonic::transport::{Channel, Endpoint};

/// The generated protocol, `runtime.v1` (our own subset of cri-api's api.proto).
pub mod proto {
    tonic::include_proto!("runtime.v1");
}

pub use proto::*;
pub use tonic::Code;

/// What a CRI call can end in; each names the call and the runtime's endpoint.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("bad container runtime endpoint {endpoint:?}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    #[error("cri {call} at {endpoint}: no answer within {deadline:?}")]
    Deadline { call: &'static str, endpoint: String, deadline: Duration },
    #[error("cri {call} at {endpoint}: {code:?}: {message}")]
    Rpc { call: &'static str, endpoint: String, code: Code, message: String },
}

impl CriError {
    /// The gRPC code the runtime answered with (`DeadlineExceeded` for a call kvol gave up on).
    pub fn code(&self) -> Code {
        match self {
            CriError::Endpoint { .. } => Code::InvalidArgument,
            CriError::Deadline { .. } => Code::DeadlineExceeded,
            CriError::Rpc { code, .. } => *code,
        }
    }

    /// The runtime's own words (its status message), or this error's sentence.
    pub fn runtime_message(&self) -> String {
        match self {
            CriError::Rpc { message, .. } => message.clone(),
            other => other.to_string(),
        }
    }
}

pub type Result<T, E = CriError> = std::result::Result<T, E>;

/// How long each kind of call may take: quick reads, calls that change things (kubelet's
/// 2 minutes), and image pulls (which kubelet does not bound; kvol does, generously).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Deadlines {
    pub short: Duration,
    pub long: Duration,
    pub pull: Duration,
}

impl Default for Deadlines {
    fn default() -> Deadlines {
        Deadlines {
            short: Duration::from_secs(10),
            long: Duration::from_secs(120),
            pull: Duration::from_secs(600),
        }
    }
}

/// A client of one runtime's CRI socket. Cheap to clone (one channel, dialled lazily and again
/// after a break).
#[derive(Clone, Debug)]
pub struct CriClient {
    channel: Channel,
    endpoint: String,
    deadlines: Deadlines,
}

impl CriClient {
    /// A client of `endpoint` (`unix:///run/containerd/containerd.sock`, as kubelet's
    /// `--container-runtime-endpoint`; a bare absolute path is taken as a unix socket). Nothing
    /// is dialled yet. Must be called inside a tokio runtime.
    pub fn new(endpoint: &str, deadlines: Deadlines) -> Result<CriClient> {
        let refused =
            |reason: &str| CriError::Endpoint { endpoint: endpoint.to_string(), reason: reason.to_string() };
        let path = socket_path(endpoint).map_err(|e| refused(&e))?;
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(refused("a cri client must be created inside a tokio runtime"));
        }
        let channel = Endpoint::from_shared(format!("unix://{path}"))
            .map_err(|e| refused(&e.to_string()))?
            .connect_timeout(deadlines.short)
            .connect_lazy();
        Ok(CriClient { channel, endpoint: endpoint.to_string(), deadlines })
    }

    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn runtime(&self) -> runtime_service_client::RuntimeServiceClient<Channel> {
        runtime_service_client::RuntimeServiceClient::new(self.channel.clone())
    }

    fn image(&self) -> image_service_client::ImageServiceClient<Channel> {
        image_service_client::ImageServiceClient::new(self.channel.clone())
    }

    fn request<T>(&self, message: T, deadline: Duration) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(deadline);
        request
    }

    /// One call with its deadline enforced here too (a runtime that never answers, or a dial
    /// that hangs, ends at the deadline).
    async fn run<T>(
        &self,
        call: &'static str,
        deadline: Duration,
        future: impl Future<Output = std::result::Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T> {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(deadline, future).await {
            Err(_) => Err(CriError::Deadline { call, endpoint: self.endpoint.clone(), deadline }),
            Ok(Ok(response)) => Ok(response.into_inner()),
            // tonic ends a request past its timeout as Cancelled ("Timeout expired").
            Ok(Err(status))
                if status.code() == Code::DeadlineExceeded
                    || (status.code() == Code::Cancelled && started.elapsed() >= deadline) =>
            {
                Err(CriError::Deadline { call, endpoint: self.endpoint.clone(), deadline })
            }
            Ok(Err(status)) => Err(CriError::Rpc {
                call,
                endpoint: self.endpoint.clone(),
                code: status.code(),
                message: status.message().to_string(),
            }),
        }
    }

    /// `StopContainer`: the runtime sends SIGTERM, and SIGKILL after `timeout` seconds; the
    /// call may take that long plus the long deadline.
    pub async fn stop_container(&self, request: StopContainerRequest) -> Result<StopContainerResponse> {
        let deadline = self.deadlines.long + Duration::from_secs(request.timeout.max(0) as u64);
        let mut client = self.runtime();
        self.run("StopContainer", deadline, client.stop_container(self.request(request, deadline))).await
    }

    /// `ExecSync`: may take the command's own `timeout` seconds plus the short deadline.
    pub async fn exec_sync(&self, request: ExecSyncRequest) -> Result<ExecSyncResponse> {
        let deadline = self.deadlines.short + Duration::from_secs(request.timeout.max(0) as u64);
        let mut client = self.runtime();
        self.run("ExecSync", deadline, client.exec_sync(self.request(request, deadline))).await
    }

    /// `Exec`, `Attach`, `PortForward`: a URL of the runtime's streaming server for the session.
    pub async fn exec(&self, request: ExecRequest) -> Result<ExecResponse> {
        let mut client = self.runtime();
        self.run("Exec", self.deadlines.short, client.exec(self.request(request, self.deadlines.short))).await
    }

    pub async fn attach(&self, request: AttachRequest) -> Result<AttachResponse> {
        let mut client = self.runtime();
        self.run("Attach", self.deadlines.short, client.attach(self.request(request, self.deadlines.short)))
            .await
    }

    pub async fn port_forward(&self, request: PortForwardRequest) -> Result<PortForwardResponse> {
        let mut client = self.runtime();
        let call = client.port_forward(self.request(request, self.deadlines.short));
        self.run("PortForward", self.deadlines.short, call).await
    }

    /// `Version`.
    pub async fn version(&self, request: VersionRequest) -> Result<VersionResponse> {
        let mut client = self.runtime();
        self.run("Version", self.deadlines.short, client.version(self.request(request, self.deadlines.short)))
            .await
    }

    /// `RunPodSandbox`.
    pub async fn run_pod_sandbox(&self, request: RunPodSandboxRequest) -> Result<RunPodSandboxResponse> {
        let mut client = self.runtime();
        self.run(
            "RunPodSandbox",
            self.deadlines.long,
            client.run_pod_sandbox(self.request(request, self.deadlines.long)),
        )
        .await
    }

    /// `StopPodSandbox`.
    pub async fn stop_pod_sandbox(&self, request: StopPodSandboxRequest) -> Result<StopPodSandboxResponse> {
        let mut client = self.runtime();
        self.run(
            "StopPodSandbox",
            self.deadlines.long,
            client.stop_pod_sandbox(self.request(request, self.deadlines.long)),
        )
        .await
    }

    /// `RemovePodSandbox`.
    pub async fn remove_pod_sandbox(
        &self,
        request: RemovePodSandboxRequest,
    ) -> Result<RemovePodSandboxResponse> {
        let mut client = self.runtime();
        self.run(
            "RemovePodSandbox",
            self.deadlines.long,
            client.remove_pod_sandbox(self.request(request, self.deadlines.long)),
        )
        .await
    }

    /// `PodSandboxStatus`.
    pub async fn pod_sandbox_status(
        &self,
        request: PodSandboxStatusRequest,
    ) -> Result<PodSandboxStatusResponse> {
        let mut client = self.runtime();
        self.run(
            "PodSandboxStatus",
            self.deadlines.short,
            client.pod_sandbox_status(self.request(request, self.deadlines.short)),
        )
        .await
    }

    /// `ListPodSandbox`.
    pub async fn list_pod_sandbox(&self, request: ListPodSandboxRequest) -> Result<ListPodSandboxResponse> {
        let mut client = self.runtime();
        self.run(
            "ListPodSandbox",
            self.deadlines.short,
            client.list_pod_sandbox(self.request(request, self.deadlines.short)),
        )
        .await
    }

    /// `CreateContainer`.
    pub async fn create_container(&self, request: CreateContainerRequest) -> Result<CreateContainerResponse> {
        let mut client = self.runtime();
        self.run(
            "CreateContainer",
            self.deadlines.long,
            client.create_container(self.request(request, self.deadlines.long)),
        )
        .await
    }

    /// `StartContainer`.
    pub async fn start_container(&self, request: StartContainerRequest) -> Result<StartContainerResponse> {
        let mut client = self.runtime();
        self.run(
            "StartContainer",
            self.deadlines.long,
            client.start_container(self.request(request, self.deadlines.long)),
        )
        .await
    }

    /// `RemoveContainer`.
    pub async fn remove_container(&self, request: RemoveContainerRequest) -> Result<RemoveContainerResponse> {
        let mut client = self.runtime();
        self.run(
            "RemoveContainer",
            self.deadlines.long,
            client.remove_container(self.request(request, self.deadlines.long)),
        )
        .await
    }

    /// `ListContainers`.
    pub async fn list_containers(&self, request: ListContainersRequest) -> Result<ListContainersResponse> {
        let mut client = self.runtime();
        self.run(
            "ListContainers",
            self.deadlines.short,
            client.list_containers(self.request(request, self.deadlines.short)),
        )
        .await
    }

    /// `ContainerStatus`.
    pub async fn container_status(&self, request: ContainerStatusRequest) -> Result<ContainerStatusResponse> {
        let mut client = self.runtime();
        self.run(
            "ContainerStatus",
            self.deadlines.short,
            client.container_status(self.request(request, self.deadlines.short)),
        )
        .await
    }

    /// `ListImages`.
    pub async fn list_images(&self, request: ListImagesRequest) -> Result<ListImagesResponse> {
        let mut client = self.image();
        self.run(
            "ListImages",
            self.deadlines.short,
            client.list_images(self.request(request, self.deadlines.short)),
        )
        .await
    }

    /// `ImageStatus`.
    pub async fn image_status(&self, request: ImageStatusRequest) -> Result<ImageStatusResponse> {
        let mut client = self.image();
        self.run(
            "ImageStatus",
            self.deadlines.short,
            client.image_status(self.request(request, self.deadlines.short)),
        )
        .await
    }

    /// `PullImage`.
    pub async fn pull_image(&self, request: PullImageRequest) -> Result<PullImageResponse> {
        let mut client = self.image();
        self.run(
            "PullImage",
            self.deadlines.pull,
            client.pull_image(self.request(request, self.deadlines.pull)),
        )
        .await
    }
}

/// The socket path of a `unix://` endpoint (or of a bare absolute path).
fn socket_path(endpoint: &str) -> std::result::Result<&str, String> {
    let path = match endpoint.split_once("://") {
        Some(("unix", path)) => path,
        Some((scheme, _)) => return Err(format!("scheme {scheme:?} is not supported (only unix://)")),
        None => endpoint,
    };
    if !path.starts_with('/') {
        return Err("the socket path must be absolute".to_string());
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints() {
        let cases: &[(&str, Result<&str, &str>)] = &[
            ("unix:///run/containerd/containerd.sock", Ok("/run/containerd/containerd.sock")),
            ("/run/crio/crio.sock", Ok("/run/crio/crio.sock")),
            ("tcp://1.2.3.4:5", Err("scheme \"tcp\" is not supported (only unix://)")),
            ("unix://relative.sock", Err("the socket path must be absolute")),
            ("relative.sock", Err("the socket path must be absolute")),
        ];
        for (endpoint, want) in cases {
            let got = socket_path(endpoint);
            assert_eq!(got.as_deref().map_err(|e| e.as_str()), *want, "{endpoint}");
        }
    }
}
