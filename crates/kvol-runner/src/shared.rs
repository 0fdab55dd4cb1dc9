//! What a pod runner's workers share with its loop and each other: the runtime's and the runtime API's clients, the node's facts, every pod's status, and the loop's signals.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use kvol_api::projection::NodeResources;
use kvol_cri::CriClient;
use kvol_runtime_api::proto as rt;
use tokio::sync::{Notify, watch};

use crate::sandbox::SandboxContext;
use crate::status::PodView;

/// A client of kvol's runtime API.
pub type Volumes = rt::pod_volumes_client::PodVolumesClient<tonic::transport::Channel>;

/// What the workers share.
#[derive(Debug)]
pub struct Shared {
    pub cri: CriClient,
    pub volumes: Volumes,
    pub sandbox_context: SandboxContext,
    pub state_dir: PathBuf,
    pub node_name: String,
    pub host_ip: String,
    pub node: NodeResources,
    /// The node's labels (its node affinity is judged against them) and its pod limit.
    pub node_labels: BTreeMap<String, String>,
    pub max_pods: u32,
    /// The node's taints, as the Node has them now.
    pub node_taints: watch::Receiver<Vec<k8s_openapi::api::core::v1::Taint>>,
    /// What each admitted pod takes of the node, by uid (kubelet's admission counts them).
    pub(crate) admitted: Mutex<BTreeMap<String, crate::admission::Share>>,
    /// Every pod's status, by uid.
    pub status: watch::Sender<Arc<BTreeMap<String, PodView>>>,
    /// A worker did something: look at the runtime again now.
    pub relist: Notify,
    /// How many looks at the runtime have started: a worker acts only on a look that started
    /// after its last action (an older one may not show what it just made).
    pub looks: std::sync::atomic::AtomicU64,
    /// Workers that acted and wait for a look that shows it: by uid, the first such look.
    pub(crate) fresh_wanted: Mutex<BTreeMap<String, u64>>,
    /// Workers that finished (their pod is gone from the runtime and its volumes let go).
    pub(crate) finished: Mutex<Vec<String>>,
    /// Where each pod's API status goes, when someone writes it to an API server.
    pub reports: std::sync::OnceLock<tokio::sync::mpsc::UnboundedSender<kvol_api::pod::PodReport>>,
    /// The runtime's name (`containerd`), from CRI's Version: a `containerID`'s scheme.
    pub runtime_name: std::sync::OnceLock<String>,
}

impl Shared {
    /// A worker acted: the first look from now on is given to it, changed or not.
    pub fn want_fresh(&self, uid: &str) -> u64 {
        let from = self.looks.load(std::sync::atomic::Ordering::SeqCst) + 1;
        self.fresh_wanted.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string(), from);
        self.relist.notify_one();
        from
    }

    /// Hands a pod's report to its writer, if there is one.
    pub fn report(&self, report: kvol_api::pod::PodStatusReport) {
        if let Some(reports) = self.reports.get() {
            let _ = reports.send(kvol_api::pod::PodReport::Status(report));
        }
    }

    /// Reports one of kubelet's Events about `pod` itself (kept in the log too).
    pub fn event(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        kind: &'static str,
        reason: &str,
        message: String,
    ) {
        self.event_at(pod, String::new(), kind, reason, message);
    }

    /// Reports one of kubelet's Events about a container of `pod`: the pod with the
    /// container's field path (`spec.containers{name}`), as kubelet's container reference.
    pub fn container_event(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        container: &str,
        kind: &'static str,
        reason: &str,
        message: String,
    ) {
        self.event_at(pod, crate::labels::container_field_path(pod, container), kind, reason, message);
    }

    fn event_at(
        &self,
        pod: &k8s_openapi::api::core::v1::Pod,
        field_path: String,
        kind: &'static str,
        reason: &str,
        message: String,
    ) {
        let ids = crate::labels::PodIds::of(pod);
        tracing::debug!(pod = %ids.key(), kind, reason, %message, "pod event");
        if let Some(reports) = self.reports.get() {
            let _ = reports.send(kvol_api::pod::PodReport::Event(kvol_api::pod::PodEventReport {
                namespace: ids.namespace.to_string(),
                name: ids.name.to_string(),
                uid: ids.uid.to_string(),
                field_path,
                kind,
                reason: reason.to_string(),
                message,
            }));
        }
    }

    /// Admits the pod `uid` (`adopted`: it runs already, so it is counted, not judged), or
    /// says why the node does not take it.
    pub fn admit(
        &self,
        uid: &str,
        pod: &k8s_openapi::api::core::v1::Pod,
        adopted: bool,
    ) -> Result<(), crate::admission::Rejection> {
        let mut admitted = self.admitted.lock().unwrap_or_else(|e| e.into_inner());
        let share = if adopted {
            crate::admission::share_of(pod)
        } else {
            let others: Vec<_> = admitted.iter().filter(|(u, _)| *u != uid).map(|(_, s)| s.clone()).collect();
            let taints = self.node_taints.borrow().clone();
            let node = crate::admission::NodeView {
                name: &self.node_name,
                labels: &self.node_labels,
                allocatable: self.node,
                max_pods: self.max_pods,
                taints: &taints,
            };
            crate::admission::admit(pod, &node, &others)?
        };
        admitted.insert(uid.to_string(), share);
        Ok(())
    }

    pub fn forget(&self, uid: &str) {
        self.admitted.lock().unwrap_or_else(|e| e.into_inner()).remove(uid);
        self.finished.lock().unwrap_or_else(|e| e.into_inner()).push(uid.to_string());
        self.relist.notify_one();
    }
}
