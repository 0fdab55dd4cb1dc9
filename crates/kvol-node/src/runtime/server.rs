//! The runtime API's server (`kvol.runtime.v1alpha1.PodVolumes`) on a unix socket under the state directory, owner-only: each call answered from the latest [`RuntimeView`], waits woken by the next one.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use kvol_runtime_api::mounts::{self, HostSide};
use kvol_runtime_api::proto::pod_volumes_server::{PodVolumes, PodVolumesServer};
use kvol_runtime_api::proto::{
    AdmitPodRequest, AdmitPodResponse, ContainerMountsRequest, ContainerMountsResponse, Device, Mount,
    PodVolumeStatus, ReleasePodRequest, ReleasePodResponse, VolumeState, WaitRequest, WatchRequest,
};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::runner_pods::{Refused, RunnerPods};
use super::view::{PodView, RuntimeView, reason};
use crate::model::ObjectSet;

/// The longest a wait may ask for.
const MAX_WAIT: Duration = Duration::from_secs(600);

/// What the server answers from.
#[derive(Clone, Debug)]
pub struct RuntimeService {
    view: watch::Receiver<Arc<RuntimeView>>,
    runner: Arc<RunnerPods>,
    pods_dir: PathBuf,
}

impl RuntimeService {
    /// `pods_dir` is `<root>/pods`.
    pub fn new(
        view: watch::Receiver<Arc<RuntimeView>>,
        runner: Arc<RunnerPods>,
        pods_dir: PathBuf,
    ) -> RuntimeService {
        RuntimeService { view, runner, pods_dir }
    }

    /// Waits until `done` holds for the pod's view (or its absence), or `timeout` passes; the
    /// pod's view then.
    async fn wait(
        &self,
        uid: &str,
        timeout: Duration,
        done: impl Fn(Option<&PodView>) -> bool,
    ) -> Option<PodView> {
        let mut view = self.view.clone();
        let deadline = tokio::time::Instant::now() + timeout.min(MAX_WAIT);
        loop {
            let now = view.borrow_and_update().pods.get(uid).cloned();
            if done(now.as_ref()) {
                return now;
            }
            match tokio::time::timeout_at(deadline, view.changed()).await {
                Ok(Ok(())) => {}
                // The deadline, or the agent stopping.
                _ => return view.borrow().pods.get(uid).cloned(),
            }
        }
    }
}

fn status_of(uid: &str, pod: Option<&PodView>, ready: bool) -> PodVolumeStatus {
    let Some(pod) = pod else {
        return PodVolumeStatus {
            pod_uid: uid.to_string(),
            ready,
            message: format!("no pod with uid {uid} is known"),
            ..Default::default()
        };
    };
    PodVolumeStatus {
        pod_uid: uid.to_string(),
        pod: pod.name.clone(),
        ready,
        volumes: pod
            .volumes
            .iter()
            .map(|v| VolumeState {
                name: v.volume.clone(),
                phase: serde_json::to_value(v.phase)
                    .ok()
                    .and_then(|p| p.as_str().map(str::to_string))
                    .unwrap_or_default(),
                plugin: v.plugin.clone().unwrap_or_default(),
                reason: if v.phase == crate::report::status::Phase::Published {
                    String::new()
                } else {
                    reason(v)
                },
                host_path: pod
                    .published
                    .get(&v.volume)
                    .map(|p| p.host_path.display().to_string())
                    .unwrap_or_default(),
            })
            .collect(),
        message: if ready && pod.gone() {
            format!("no volume of pod {} is left", pod.name)
        } else {
            pod.message()
        },
    }
}

fn timeout(ms: u32) -> Duration {
    Duration::from_millis(u64::from(ms))
}

type WatchStream = Pin<Box<dyn tokio_stream::Stream<Item = Result<PodVolumeStatus, Status>> + Send>>;

#[tonic::async_trait]
impl PodVolumes for RuntimeService {
    async fn wait_for_volumes(
        &self,
        request: Request<WaitRequest>,
    ) -> Result<Response<PodVolumeStatus>, Status> {
        let r = request.into_inner();
        let pod = self.wait(&r.pod_uid, timeout(r.timeout_ms), |p| p.is_some_and(PodView::ready)).await;
        if pod.as_ref().is_none_or(|p| p.pod.is_none()) {
            return Err(Status::not_found(format!("no pod with uid {} is known", r.pod_uid)));
        }
        let ready = pod.as_ref().is_some_and(PodView::ready);
        Ok(Response::new(status_of(&r.pod_uid, pod.as_ref(), ready)))
    }

    async fn wait_for_volumes_gone(
        &self,
        request: Request<WaitRequest>,
    ) -> Result<Response<PodVolumeStatus>, Status> {
        let r = request.into_inner();
        let gone = |p: Option<&PodView>| p.is_none_or(|p| p.pod.is_none() && p.gone());
        let pod = self.wait(&r.pod_uid, timeout(r.timeout_ms), gone).await;
        let ready = gone(pod.as_ref());
        let mut status = status_of(&r.pod_uid, pod.as_ref(), ready);
        if ready {
            status.message = format!("no volume of pod uid {} is left", r.pod_uid);
        } else if pod.as_ref().is_some_and(|p| p.pod.is_some()) {
            status.message = format!("pod {} is still wanted", status.pod);
        }
        Ok(Response::new(status))
    }

    async fn container_mounts(
        &self,
        request: Request<ContainerMountsRequest>,
    ) -> Result<Response<ContainerMountsResponse>, Status> {
        let r = request.into_inner();
        let view = self.view.borrow().pods.get(&r.pod_uid).cloned();
        let Some(pod_view) = view else {
            return Err(Status::not_found(format!("no pod with uid {} is known", r.pod_uid)));
        };
        let Some(pod) = pod_view.pod.clone() else {
            return Err(Status::not_found(format!("pod uid {} is being torn down", r.pod_uid)));
        };
        let pod_dir = self.pods_dir.join(&r.pod_uid);
        let plan = mounts::plan(&pod, &pod_dir, &r.container, &pod_view.published).map_err(|why| {
            let code = if why.contains("is not published") {
                tonic::Code::FailedPrecondition
            } else {
                tonic::Code::InvalidArgument
            };
            Status::new(code, format!("container {:?} of pod {}: {why}", r.container, pod_view.name))
        })?;
        let mut out = ContainerMountsResponse::default();
        for m in plan.mounts {
            let (host_path, sub_path) = match m.host {
                HostSide::Volume(path) => (path, String::new()),
                HostSide::SubPath { volume_dir, sub_path, dest } => {
                    let bound = bind_sub_path(volume_dir, sub_path.clone(), dest).await.map_err(|why| {
                        Status::failed_precondition(format!(
                            "container {:?} of pod {}: volumeMount {:?}: {why}",
                            r.container, pod_view.name, m.volume
                        ))
                    })?;
                    (bound, sub_path)
                }
            };
            out.mounts.push(Mount {
                container_path: m.container_path,
                host_path: host_path.display().to_string(),
                readonly: m.read_only,
                selinux_relabel: m.selinux_relabel,
                propagation: kvol_runtime_api::proto::MountPropagation::from(m.propagation) as i32,
                volume: m.volume,
                sub_path,
            });
        }
        out.devices = plan
            .devices
            .into_iter()
            .map(|d| Device {
                container_path: d.container_path,
                host_path: d.host_path.display().to_string(),
                permissions: d.permissions,
                volume: d.volume,
            })
            .collect();
        Ok(Response::new(out))
    }

    type WatchVolumesStream = WatchStream;

    async fn watch_volumes(&self, request: Request<WatchRequest>) -> Result<Response<WatchStream>, Status> {
        let only = request.into_inner().pod_uid;
        let mut view = self.view.clone();
        let (tx, rx) = tokio::sync::mpsc::channel(64);
        tokio::spawn(async move {
            let mut last: BTreeMap<String, PodVolumeStatus> = BTreeMap::new();
            loop {
                let now = view.borrow_and_update().clone();
                let mut seen = BTreeMap::new();
                for (uid, pod) in now.pods.iter().filter(|(uid, _)| only.is_empty() || **uid == only) {
                    seen.insert(uid.clone(), status_of(uid, Some(pod), pod.ready()));
                }
                for (uid, status) in &seen {
                    if last.get(uid) != Some(status) && tx.send(Ok(status.clone())).await.is_err() {
                        return;
                    }
                }
                for uid in last.keys().filter(|uid| !seen.contains_key(*uid)) {
                    let gone = PodVolumeStatus {
                        pod_uid: uid.clone(),
                        ready: false,
                        message: "gone".into(),
                        ..Default::default()
                    };
                    if tx.send(Ok(gone)).await.is_err() {
                        return;
                    }
                }
                last = seen;
                if view.changed().await.is_err() {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))))
    }

    async fn admit_pod(
        &self,
        request: Request<AdmitPodRequest>,
    ) -> Result<Response<AdmitPodResponse>, Status> {
        let text = String::from_utf8(request.into_inner().pod_json)
            .map_err(|_| Status::invalid_argument("the pod is not UTF-8 text"))?;
        // The other sources' pods, as the last pass saw them.
        let mut others = ObjectSet::default();
        for pod in self.view.borrow().pods.values().filter_map(|p| p.pod.as_ref()) {
            let uid = pod.metadata.uid.as_deref().unwrap_or_default();
            if !self.runner.holds(uid) {
                let key = format!(
                    "{}/{}",
                    pod.metadata.namespace.as_deref().unwrap_or_default(),
                    pod.metadata.name.as_deref().unwrap_or_default()
                );
                others.pods.insert(key, Arc::clone(pod));
            }
        }
        match self.runner.admit(&text, &others) {
            Ok(pod_uid) => Ok(Response::new(AdmitPodResponse { pod_uid })),
            Err(Refused::Invalid(why)) => Err(Status::invalid_argument(why)),
            Err(Refused::Exists(why)) => Err(Status::already_exists(why)),
            Err(Refused::Unsaved(why)) => {
                Err(Status::unavailable(format!("the pod could not be kept: {why}")))
            }
        }
    }

    async fn release_pod(
        &self,
        request: Request<ReleasePodRequest>,
    ) -> Result<Response<ReleasePodResponse>, Status> {
        let uid = request.into_inner().pod_uid;
        if self.runner.release(&uid) {
            Ok(Response::new(ReleasePodResponse {}))
        } else {
            Err(Status::not_found(format!("the runner handed over no pod with uid {uid}")))
        }
    }
}

/// Binds `sub_path` of the volume at `volume_dir` at `dest` (on a blocking thread: it walks and
/// mounts), creating a missing sub-path with the volume's own mode, as kubelet does.
async fn bind_sub_path(volume_dir: PathBuf, sub_path: String, dest: PathBuf) -> Result<PathBuf, String> {
    tokio::task::spawn_blocking(move || {
        let mode = kvol_plugin::subpath::creation_mode(&volume_dir).map_err(|e| e.to_string())?;
        kvol_plugin::subpath::prepare(&volume_dir, &sub_path, &dest, mode).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| format!("the sub-path binder failed: {e}"))?
}

/// A socket bound for [`serve`].
#[derive(Debug)]
pub struct Bound {
    listener: tokio::net::UnixListener,
    socket: PathBuf,
}

/// Binds `socket` (a stale one replaced; the new one 0600).
pub fn bind(socket: &Path) -> Result<Bound, String> {
    match std::fs::remove_file(socket) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("cannot remove the old socket {}: {e}", socket.display())),
    }
    let listener = tokio::net::UnixListener::bind(socket)
        .map_err(|e| format!("cannot listen on {}: {e}", socket.display()))?;
    std::fs::set_permissions(socket, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| format!("cannot make {} owner-only: {e}", socket.display()))?;
    Ok(Bound { listener, socket: socket.to_path_buf() })
}

/// Serves `service` on the bound socket until `stop`.
pub async fn serve(
    bound: Bound,
    service: RuntimeService,
    stop: impl std::future::Future<Output = ()> + Send + 'static,
) -> Result<(), String> {
    let Bound { listener, socket } = bound;
    tonic::transport::Server::builder()
        .add_service(PodVolumesServer::new(service))
        .serve_with_incoming_shutdown(tokio_stream::wrappers::UnixListenerStream::new(listener), stop)
        .await
        .map_err(|e| format!("the runtime api on {} stopped: {e}", socket.display()))
}
