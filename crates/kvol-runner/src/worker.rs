//! One pod's worker: holds its volumes through the runtime API, makes its sandbox, pulls images, creates and starts containers as `actions` decides, and on removal stops everything before its volumes are let go.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use k8s_openapi::api::core::v1::{Container, Pod};
use k8s_openapi::jiff::Timestamp;
use kvol_api::ObjectSet;
use kvol_api::pod::PodStatusReport;
use kvol_cri::{self as cri, CriClient};
use kvol_runtime_api::proto as rt;
use tokio::sync::watch;

use crate::actions::{self, PodSeen, State, Waiting};
use crate::api_status;
use crate::backoff::Backoff;
use crate::container::{ContainerContext, ImageUser, container_config};
use crate::env::EnvContext;
use crate::hosts;
use crate::labels::PodIds;
use crate::prober;
use crate::probes::{self, Kind};
use crate::pull_secrets;
use crate::sandbox::sandbox_config;
use crate::shared::{Shared, Volumes};
use crate::status::{PodView, pod_view};

/// What a worker is told at each look: the pod (None: no longer wanted), what the runtime has
/// of it, and the objects its environment is made from.
#[derive(Clone, Debug, Default)]
pub struct Input {
    pub pod: Option<Arc<Pod>>,
    pub seen: PodSeen,
    pub objects: Arc<ObjectSet>,
    /// The grace period the runtime's containers carry (for a pod known only from them).
    pub grace: Option<i64>,
    /// The number of the look `seen` comes from.
    pub look: u64,
}

impl Input {
    /// The same pod, runtime state, objects and grace period (the look's number aside).
    pub fn same_as(&self, other: &Input) -> bool {
        let same_pod = match (&self.pod, &other.pod) {
            (Some(a), Some(b)) => Arc::ptr_eq(a, b) || a == b,
            (None, None) => true,
            _ => false,
        };
        same_pod
            && self.seen == other.seen
            && Arc::ptr_eq(&self.objects, &other.objects)
            && self.grace == other.grace
    }
}

/// One pod's worker state.
#[derive(Debug)]
pub struct Worker {
    uid: String,
    shared: Arc<Shared>,
    cri: CriClient,
    volumes: Volumes,
    backoff: Backoff,
    image_backoff: Backoff,
    /// The runner's own reasons a container waits (image pulls, config errors).
    failures: BTreeMap<String, Waiting>,
    /// The pod was handed over to kvol (its volumes are held until released).
    held: bool,
    last_pod: Option<Arc<Pod>>,
    /// The first look that shows what this worker last did.
    fresh_from: u64,
    /// This pass changed something in the runtime.
    acted: bool,
    /// The probes of the pod's running containers, by container id.
    probes: BTreeMap<(String, probes::Kind), probes::Tracker>,
    /// The pod's address as its last container start found it (a preStop hook's httpGet goes there).
    pod_ip: String,
    /// When this node took the pod (its `startTime` unless the API has one).
    first_seen: Timestamp,
    /// The exited container each container's crash-loop back-off was last said for.
    backoff_said: BTreeMap<String, String>,
    /// The node admitted the pod (counted its share), or rejected it for good.
    admission: Option<Result<(), crate::admission::Rejection>>,
}

/// Now, as the API's times carry it.
fn timestamp_now() -> Timestamp {
    Timestamp::from_nanosecond(now().as_nanos() as i128).unwrap_or(Timestamp::UNIX_EPOCH)
}

fn now() -> Duration {
    SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default()
}

impl Worker {
    pub fn new(uid: String, shared: Arc<Shared>) -> Worker {
        let cri = shared.cri.clone();
        let volumes = shared.volumes.clone();
        Worker {
            uid,
            shared,
            cri,
            volumes,
            backoff: Backoff::default(),
            image_backoff: Backoff::default(),
            failures: BTreeMap::new(),
            held: false,
            last_pod: None,
            fresh_from: 0,
            acted: false,
            probes: BTreeMap::new(),
            pod_ip: String::new(),
            first_seen: timestamp_now(),
            admission: None,
            backoff_said: BTreeMap::new(),
        }
    }

    /// Runs until the pod is gone from the runtime and its volumes are let go.
    pub async fn run(mut self, mut input: watch::Receiver<Input>) {
        loop {
            let current = input.borrow_and_update().clone();
            if current.look < self.fresh_from {
                // What the runtime showed before the last action: wait for a newer look.
                if input.changed().await.is_err() {
                    return;
                }
                continue;
            }
            let wake = match current.pod.clone() {
                Some(pod) => {
                    self.last_pod = Some(Arc::clone(&pod));
                    self.sync(&pod, &current).await
                }
                None => {
                    if self.tear_down(&current).await {
                        self.shared.forget(&self.uid);
                        return;
                    }
                    Some(Duration::from_secs(1))
                }
            };
            if std::mem::take(&mut self.acted) {
                self.fresh_from = self.shared.want_fresh(&self.uid);
            }
            let sleep = wake.unwrap_or(Duration::from_secs(3600));
            tokio::select! {
                changed = input.changed() => if changed.is_err() { return },
                _ = tokio::time::sleep(sleep) => {}
            }
        }
    }

    /// Shows the pod's view, and hands its API status to the writer when there is one.
    fn publish(&self, pod: &Pod, seen: &PodSeen, view: PodView) {
        if self.shared.reports.get().is_some() {
            let ips: Vec<String> =
                Some(self.hook_ip(Some(pod))).filter(|ip| !ip.is_empty()).into_iter().collect();
            let context = api_status::StatusContext {
                host_ip: &self.shared.host_ip,
                pod_ips: &ips,
                runtime: self.shared.runtime_name.get().map(String::as_str).unwrap_or("cri"),
                start_time: self.first_seen,
                now: timestamp_now(),
            };
            let ids = PodIds::of(pod);
            let status = if view.reason.is_empty() {
                api_status::api_pod_status(pod, &view, seen, &context)
            } else {
                api_status::rejected_status(pod, &view)
            };
            self.shared.report(PodStatusReport {
                namespace: ids.namespace.to_string(),
                name: ids.name.to_string(),
                uid: self.uid.clone(),
                status: Some(Box::new(status)),
            });
        }
        self.shared.status.send_modify(|all| {
            Arc::make_mut(all).insert(self.uid.clone(), view);
        });
    }

    /// One pass for a wanted pod; returns when to look again at the latest.
    async fn sync(&mut self, pod: &Arc<Pod>, input: &Input) -> Option<Duration> {
        let ids = PodIds::of(pod);
        let key = ids.key();
        if let Err(rejection) = self.admitted(pod, &input.seen) {
            self.publish(pod, &input.seen, crate::status::rejected_view(pod, &rejection));
            return None;
        }
        if !self.held {
            match self.hold(pod).await {
                Ok(()) => self.held = true,
                Err(message) => {
                    self.publish(pod, &input.seen, pod_view(pod, &input.seen, &self.failures, &message));
                    return Some(Duration::from_secs(2));
                }
            }
        }
        let wait = rt::WaitRequest { pod_uid: self.uid.clone(), timeout_ms: 0 };
        let ready = match self.volumes.wait_for_volumes(wait).await {
            Ok(answer) => answer.into_inner(),
            Err(status) => {
                let message = format!("pod {key}: waiting for its volumes: {}", status.message());
                self.publish(pod, &input.seen, pod_view(pod, &input.seen, &self.failures, &message));
                return Some(Duration::from_millis(500));
            }
        };
        if !ready.ready {
            self.publish(pod, &input.seen, pod_view(pod, &input.seen, &self.failures, &ready.message));
            // The runtime API's wait returns as soon as they are ready.
            let wait = rt::WaitRequest { pod_uid: self.uid.clone(), timeout_ms: 1000 };
            let _ = self.volumes.wait_for_volumes(wait).await;
            return Some(Duration::ZERO);
        }
        self.adopt_pod_ip(pod, &input.seen).await;
        let mut seen = input.seen.clone();
        self.annotate_probes(pod, &mut seen);
        let input = &Input { seen, ..input.clone() };
        let mut decided = actions::compute(pod, &input.seen, &mut self.backoff, now());
        self.say_backoffs(pod, &input.seen, &decided);
        let mut wake = decided.wake_in;
        let message = match self.apply(pod, input, &mut decided).await {
            Ok(()) => String::new(),
            Err(message) => {
                wake = Some(wake.map_or(Duration::from_secs(1), |w| w.min(Duration::from_secs(1))));
                message
            }
        };
        let mut waiting = decided.waiting.clone();
        for (name, why) in &self.failures {
            waiting.entry(name.clone()).or_insert_with(|| why.clone());
        }
        if !self.failures.is_empty() {
            wake = Some(wake.map_or(Duration::from_secs(1), |w| w.min(Duration::from_secs(1))));
        }
        self.publish(pod, &input.seen, pod_view(pod, &input.seen, &waiting, &message));
        let (probe_wake, changed) = self.run_probes(pod, &input.seen, &decided).await;
        // A probe's result changed: decide and show again at once.
        let probe_wake = if changed { Some(Duration::ZERO) } else { probe_wake };
        match (wake, probe_wake) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// kubelet's BackOff Event for each container that waits out a crash-loop back-off, once
    /// per exited container.
    fn say_backoffs(&mut self, pod: &Pod, seen: &PodSeen, decided: &actions::PodActions) {
        for (name, waiting) in decided.waiting.iter().filter(|(_, w)| w.reason == "CrashLoopBackOff") {
            let exited = seen.latest(name).map(|c| c.id.clone()).unwrap_or_default();
            if self.backoff_said.get(name) == Some(&exited) {
                continue;
            }
            self.backoff_said.insert(name.clone(), exited);
            tracing::info!(pod = %PodIds::of(pod).key(), container = %name, message = %waiting.message, "crash-loop back-off");
            let message = format!(
                "Back-off restarting failed container {name} in pod {}",
                PodIds::of(pod).kubelet_format()
            );
            self.shared.container_event(pod, name, "Warning", "BackOff", message);
        }
    }

    /// Whether the node takes the pod: judged once, when it first comes (a pod the runtime runs
    /// already is counted, not judged); a rejection is said once and kept.
    fn admitted(&mut self, pod: &Pod, seen: &PodSeen) -> Result<(), crate::admission::Rejection> {
        if let Some(decided) = &self.admission {
            return decided.clone();
        }
        let adopted = !seen.sandboxes.is_empty() || !seen.containers.is_empty();
        let decided = self.shared.admit(&self.uid, pod, adopted);
        if let Err(rejection) = &decided {
            let key = PodIds::of(pod).key();
            tracing::warn!(pod = %key, reason = %rejection.reason, message = %rejection.message, "pod rejected by the node");
            self.shared.event(pod, "Warning", &rejection.reason, rejection.message.clone());
        }
        self.admission = Some(decided.clone());
        decided
    }

    /// Marks the running containers with what their probes say: a failed liveness or
    /// startup probe, and readiness.
    fn annotate_probes(&self, pod: &Pod, seen: &mut PodSeen) {
        let Some(spec) = pod.spec.as_ref() else { return };
        for c in seen.containers.iter_mut().filter(|c| c.state == State::Running) {
            let Some(container) = spec.containers.iter().find(|s| s.name == c.name) else { continue };
            let tracker = |kind: Kind| self.probes.get(&(c.id.clone(), kind));
            let failed = |kind: Kind| {
                kind.of(container)
                    .is_some_and(|p| tracker(kind).is_some_and(|t| t.failed(&probes::timing(p, kind))))
            };
            let started =
                Kind::Startup.of(container).is_none() || tracker(Kind::Startup).is_some_and(|t| t.passing);
            c.failed_probe = if failed(Kind::Startup) {
                Some(Kind::Startup)
            } else if started && failed(Kind::Liveness) {
                Some(Kind::Liveness)
            } else {
                None
            };
            c.probed_ready = match (started, Kind::Readiness.of(container)) {
                (false, _) => Some(false),
                (true, Some(_)) => Some(tracker(Kind::Readiness).is_some_and(|t| t.passing)),
                (true, None) => None,
            };
        }
    }

    /// Runs the probes that are due; when the next is due, and whether a result changed.
    async fn run_probes(
        &mut self,
        pod: &Pod,
        seen: &PodSeen,
        decided: &actions::PodActions,
    ) -> (Option<Duration>, bool) {
        let Some(spec) = pod.spec.as_ref() else { return (None, false) };
        let running: Vec<_> = seen
            .containers
            .iter()
            .filter(|c| c.state == State::Running && !decided.kill.iter().any(|(id, _)| *id == c.id))
            .collect();
        self.probes.retain(|(id, _), _| running.iter().any(|c| &c.id == id));
        let (mut wake, mut changed) = (None::<Duration>, false);
        for c in running {
            let Some(container) = spec.containers.iter().find(|s| s.name == c.name) else { continue };
            let started_at = Duration::from_nanos(c.created_at.max(0) as u64);
            for kind in [Kind::Startup, Kind::Liveness, Kind::Readiness] {
                let Some(probe) = kind.of(container) else { continue };
                let startup_passed =
                    self.probes.get(&(c.id.clone(), Kind::Startup)).is_some_and(|t| t.passing);
                let waits_for_startup =
                    kind != Kind::Startup && Kind::Startup.of(container).is_some() && !startup_passed;
                if waits_for_startup || (kind == Kind::Startup && startup_passed) {
                    continue;
                }
                let timing = probes::timing(probe, kind);
                let key = (c.id.clone(), kind);
                let due = self
                    .probes
                    .entry(key.clone())
                    .or_insert_with(|| probes::Tracker::new(kind))
                    .due_in(&timing, started_at, now());
                if due > Duration::ZERO {
                    wake = Some(wake.map_or(due, |w| w.min(due)));
                    continue;
                }
                let ip = self.hook_ip(Some(pod));
                let outcome =
                    crate::prober::run(&self.cri, &c.id, container, probe, &ip, timing.timeout).await;
                if let Err(why) = &outcome {
                    tracing::debug!(pod = %PodIds::of(pod).key(), container = %c.name, probe = kind.name(), %why, "probe failed");
                    let message = format!("{} probe failed: {why}", capitalised(kind.name()));
                    self.shared.container_event(pod, &c.name, "Warning", "Unhealthy", message);
                }
                let tracker = self.probes.get_mut(&key).expect("inserted above");
                if tracker.record(&timing, outcome.is_ok(), now()) {
                    changed = true;
                    tracing::info!(pod = %PodIds::of(pod).key(), container = %c.name, probe = kind.name(), passing = tracker.passing, "probe result changed");
                }
                changed |= kind != Kind::Readiness && tracker.failed(&timing);
                wake = Some(wake.map_or(timing.period, |w| w.min(timing.period)));
            }
        }
        (wake, changed)
    }

    /// Hands the pod over to kvol so its volumes stay until the runner releases them (a pod
    /// another source has is held, not doubled; one already held is fine).
    async fn hold(&mut self, pod: &Pod) -> Result<(), String> {
        let pod_json = serde_json::to_vec(pod).map_err(|e| e.to_string())?;
        match self.volumes.admit_pod(rt::AdmitPodRequest { pod_json }).await {
            Ok(_) => Ok(()),
            Err(status) if status.code() == tonic::Code::AlreadyExists => Ok(()),
            Err(status) => {
                Err(format!("pod {}: cannot hold its volumes: {}", PodIds::of(pod).key(), status.message()))
            }
        }
    }

    /// Does what was decided: kill, remove, make the sandbox, start containers.
    async fn apply(
        &mut self,
        pod: &Arc<Pod>,
        input: &Input,
        decided: &mut actions::PodActions,
    ) -> Result<(), String> {
        let grace = grace_of(Some(pod), input.grace);
        let live = input.seen.sandboxes.iter().any(|s| s.ready)
            || input.seen.containers.iter().any(|c| c.state != State::Exited);
        // A start that fails before the runtime makes anything (a pull, a config error)
        // changes nothing there: no new look is asked for it.
        self.acted |= (decided.kill_pod && live)
            || decided.create_sandbox.is_some()
            || !decided.kill.is_empty()
            || !decided.remove.is_empty()
            || !decided.remove_sandboxes.is_empty();
        if decided.kill_pod && live {
            self.stop_all(Some(pod), &input.seen, grace).await;
        }
        for (id, why) in &decided.kill {
            tracing::info!(pod = %PodIds::of(pod).key(), container = %id, reason = %why, "stopping container");
            if let Some(seen) = input.seen.containers.iter().find(|c| &c.id == id) {
                self.shared.container_event(
                    pod,
                    &seen.name,
                    "Normal",
                    "Killing",
                    format!("{why}, will be restarted"),
                );
                let _ = stop_one(&self.cri, Some(pod), seen, grace, &self.hook_ip(Some(pod))).await;
            }
        }
        for id in &decided.remove {
            let _ = self.cri.remove_container(cri::RemoveContainerRequest { container_id: id.clone() }).await;
        }
        for id in &decided.remove_sandboxes {
            let _ = self
                .cri
                .remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id: id.clone() })
                .await;
        }
        let (sandbox_id, attempt) = match (decided.create_sandbox, &decided.sandbox_id) {
            (Some(attempt), _) => (self.run_sandbox(pod, attempt).await?, attempt),
            (None, Some(id)) => {
                let attempt =
                    input.seen.sandboxes.iter().find(|s| &s.id == id).map(|s| s.attempt).unwrap_or(0);
                (id.clone(), attempt)
            }
            (None, None) => return Ok(()),
        };
        for id in &decided.start_created {
            tracing::info!(pod = %PodIds::of(pod).key(), container = %id, "starting a container made but never started");
            if let Err(e) =
                self.cri.start_container(cri::StartContainerRequest { container_id: id.clone() }).await
            {
                // Removed: the next pass makes it again.
                tracing::warn!(pod = %PodIds::of(pod).key(), container = %id, error = %e, "cannot start a container made before; removing it");
                let _ =
                    self.cri.remove_container(cri::RemoveContainerRequest { container_id: id.clone() }).await;
            }
            self.acted = true;
        }
        let names: Vec<String> = decided.start_init.iter().chain(decided.start.iter()).cloned().collect();
        for name in names {
            match self.start(pod, input, &sandbox_id, attempt, &name).await {
                Ok(()) => {
                    self.failures.remove(&name);
                }
                Err(waiting) => {
                    self.failures.insert(name, waiting);
                }
            }
        }
        Ok(())
    }

    async fn run_sandbox(&self, pod: &Pod, attempt: u32) -> Result<String, String> {
        let key = PodIds::of(pod).key();
        let config = sandbox_config(pod, attempt, &self.shared.sandbox_context);
        let dir = std::path::PathBuf::from(&config.log_directory);
        if let Err(e) = tokio::fs::create_dir_all(&dir).await {
            return Err(format!("pod {key}: cannot create its log directory {}: {e}", dir.display()));
        }
        let started = std::time::Instant::now();
        let request = cri::RunPodSandboxRequest { config: Some(config), runtime_handler: String::new() };
        let id = self
            .cri
            .run_pod_sandbox(request)
            .await
            .map_err(|e| format!("pod {key}: failed to create its sandbox: {e}"))?
            .pod_sandbox_id;
        tracing::info!(pod = %key, sandbox = %id, attempt, ms = started.elapsed().as_millis() as u64, "sandbox running");
        Ok(id)
    }

    /// Pulls (as its policy says), configures, creates and starts one container; the waiting
    /// reason kubelet shows when a step fails.
    async fn start(
        &mut self,
        pod: &Pod,
        input: &Input,
        sandbox_id: &str,
        attempt: u32,
        name: &str,
    ) -> Result<(), Waiting> {
        let ids = PodIds::of(pod);
        let spec = pod.spec.as_ref().expect("a wanted pod has a spec");
        let container = spec
            .init_containers
            .iter()
            .flatten()
            .chain(spec.containers.iter())
            .find(|c| c.name == name)
            .expect("decided containers are the pod's");
        let image_user = self.ensure_image(pod, container, &input.objects).await?;
        let config_error = |message: String| Waiting { reason: "CreateContainerConfigError".into(), message };
        let mounts = self
            .volumes
            .container_mounts(rt::ContainerMountsRequest {
                pod_uid: self.uid.clone(),
                container: name.to_string(),
            })
            .await
            .map_err(|s| {
                config_error(format!("pod {}: container {name}: its mounts: {}", ids.key(), s.message()))
            })?
            .into_inner();
        let restart_count = input.seen.latest(name).map(|c| c.restart_count + 1).unwrap_or(0);
        let termination_log = self.termination_log(name).await.map_err(config_error)?;
        let pod_ips = self.pod_ips(pod, sandbox_id).await;
        self.pod_ip = pod_ips.first().cloned().unwrap_or_default();
        let hosts_file = self.hosts_file(pod, &pod_ips).await.map_err(config_error)?;
        let context = ContainerContext {
            env: EnvContext {
                objects: &input.objects,
                node_name: &self.shared.node_name,
                host_ip: &self.shared.host_ip,
                pod_ip: pod_ips.first().map(String::as_str).unwrap_or_default(),
                node: self.shared.node,
            },
            restart_count,
            mounts: &mounts,
            termination_log: Some(&termination_log),
            hosts_file: hosts_file.as_deref(),
            image_user: &image_user,
        };
        let config = container_config(pod, container, &context).map_err(config_error)?;
        let sandbox_config = sandbox_config(pod, attempt, &self.shared.sandbox_context);
        let request = cri::CreateContainerRequest {
            pod_sandbox_id: sandbox_id.to_string(),
            config: Some(config),
            sandbox_config: Some(sandbox_config),
        };
        let id = self
            .cri
            .create_container(request)
            .await
            .map_err(|e| self.failed(pod, name, "CreateContainerError", e.runtime_message()))?
            .container_id;
        self.acted = true;
        self.shared.container_event(pod, name, "Normal", "Created", format!("Created container {name}"));
        self.cri
            .start_container(cri::StartContainerRequest { container_id: id.clone() })
            .await
            .map_err(|e| self.failed(pod, name, "RunContainerError", e.runtime_message()))?;
        tracing::info!(pod = %ids.key(), container = %name, id = %id, restart_count, "container started");
        self.shared.container_event(pod, name, "Normal", "Started", format!("Started container {name}"));
        if let Some(hook) = container.lifecycle.as_ref().and_then(|l| l.post_start.as_ref()) {
            let action = prober::Action::of_hook(hook);
            let ip = context.env.pod_ip.to_string();
            if let Err(why) = prober::run_action(&self.cri, &id, container, action, &ip, HOOK_LIMIT).await {
                // Kubelet's FailedPostStartHook: the container is killed, and its restart
                // policy decides what comes next.
                tracing::warn!(pod = %ids.key(), container = %name, reason = "FailedPostStartHook", %why, "postStart hook failed; killing the container");
                self.shared.container_event(
                    pod,
                    name,
                    "Warning",
                    "FailedPostStartHook",
                    format!("PostStartHook failed: {why}"),
                );
                let grace = grace_of(Some(pod), input.grace);
                let request = cri::StopContainerRequest { container_id: id.clone(), timeout: grace };
                let _ = self.cri.stop_container(request).await;
            }
        }
        Ok(())
    }

    /// The image per `imagePullPolicy`: `ErrImagePull` when a pull fails, `ImagePullBackOff`
    /// while the next pull waits, `ErrImageNeverPull` for a missing image under `Never`.
    async fn ensure_image(
        &mut self,
        pod: &Pod,
        container: &Container,
        objects: &ObjectSet,
    ) -> Result<ImageUser, Waiting> {
        let image = container.image.clone().unwrap_or_default();
        let policy =
            container.image_pull_policy.clone().unwrap_or_else(|| default_pull_policy(&image).into());
        let spec = cri::ImageSpec { image: image.clone(), annotations: Default::default() };
        let present = self.image_status(&spec).await?;
        match (policy.as_str(), &present) {
            ("Never", Some(found)) | ("IfNotPresent", Some(found)) => {
                let message = format!("Container image \"{image}\" already present on machine");
                self.shared.container_event(pod, &container.name, "Normal", "Pulled", message);
                return Ok(ImageUser::of(Some(found)));
            }
            ("Never", None) => {
                let message = format!("Container image \"{image}\" is not present with pull policy of Never");
                return Err(Waiting { reason: "ErrImageNeverPull".into(), message });
            }
            _ => {}
        }
        let key = format!("{}_{image}", self.uid);
        let now = now();
        if self.image_backoff.waiting_since_update(&key, now).is_some() {
            let message = format!("Back-off pulling image \"{image}\"");
            self.shared.container_event(pod, &container.name, "Normal", "BackOff", message.clone());
            return Err(Waiting { reason: "ImagePullBackOff".into(), message });
        }
        self.shared.container_event(
            pod,
            &container.name,
            "Normal",
            "Pulling",
            format!("Pulling image \"{image}\""),
        );
        let started = std::time::Instant::now();
        match self.pull(pod, &spec, objects).await {
            Ok(()) => {
                let took = started.elapsed().as_secs_f64();
                self.shared.container_event(
                    pod,
                    &container.name,
                    "Normal",
                    "Pulled",
                    format!("Successfully pulled image \"{image}\" in {took:.3}s"),
                );
                Ok(ImageUser::of(self.image_status(&spec).await?.as_ref()))
            }
            Err(e) => {
                self.image_backoff.next(&key, now, now);
                let message = format!("failed to pull image \"{image}\": {e}");
                tracing::warn!(pod = %PodIds::of(pod).key(), container = %container.name, %message, "image pull failed");
                self.shared.container_event(pod, &container.name, "Warning", "Failed", message.clone());
                self.shared.container_event(
                    pod,
                    &container.name,
                    "Warning",
                    "Failed",
                    "Error: ErrImagePull".to_string(),
                );
                Err(Waiting { reason: "ErrImagePull".into(), message })
            }
        }
    }

    /// Pulls as kubelet does: with each of the credentials the pod's pull secrets hold for the
    /// image's registry in turn until one works (the last one's error), else anonymously.
    async fn pull(&self, pod: &Pod, spec: &cri::ImageSpec, objects: &ObjectSet) -> Result<(), String> {
        let keyring = pull_secrets::Keyring::of(pod, objects);
        for why in &keyring.unusable {
            tracing::warn!(pod = %PodIds::of(pod).key(), reason = "FailedToRetrieveImagePullSecret", %why, "a pull secret cannot be used; going on without it");
        }
        let sandbox = sandbox_config(pod, 0, &self.shared.sandbox_context);
        let credentials = keyring.lookup(&spec.image);
        let attempts: Vec<Option<cri::AuthConfig>> =
            if credentials.is_empty() { vec![None] } else { credentials.into_iter().map(Some).collect() };
        let mut last = String::new();
        for auth in attempts {
            let request = cri::PullImageRequest {
                image: Some(spec.clone()),
                auth,
                sandbox_config: Some(sandbox.clone()),
            };
            match self.cri.pull_image(request).await {
                Ok(_) => return Ok(()),
                Err(e) => last = e.runtime_message(),
            }
        }
        Err(last)
    }

    /// A step's failure as the container's waiting reason, with kubelet's `Failed` Event.
    fn failed(&self, pod: &Pod, container: &str, reason: &str, message: String) -> Waiting {
        self.shared.container_event(pod, container, "Warning", "Failed", format!("Error: {message}"));
        Waiting { reason: reason.into(), message }
    }

    /// The runtime's status of an image (none: not present); `ErrImageInspect` when it cannot say.
    async fn image_status(&self, spec: &cri::ImageSpec) -> Result<Option<cri::Image>, Waiting> {
        let request = cri::ImageStatusRequest { image: Some(spec.clone()), verbose: false };
        match self.cri.image_status(request).await {
            Ok(answer) => Ok(answer.image),
            Err(e) => Err(Waiting { reason: "ErrImageInspect".into(), message: e.runtime_message() }),
        }
    }

    /// The pod's IPs: the node's under host networking, else what the runtime gave its sandbox.
    async fn pod_ips(&self, pod: &Pod, sandbox_id: &str) -> Vec<String> {
        if pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false) {
            return vec![self.shared.host_ip.clone()];
        }
        let request = cri::PodSandboxStatusRequest { pod_sandbox_id: sandbox_id.to_string(), verbose: false };
        let network = match self.cri.pod_sandbox_status(request).await {
            Ok(answer) => answer.status.and_then(|s| s.network),
            Err(e) => {
                tracing::warn!(pod = %PodIds::of(pod).key(), error = %e, "cannot read the sandbox's address");
                None
            }
        };
        let Some(network) = network.filter(|n| !n.ip.is_empty()) else { return Vec::new() };
        std::iter::once(network.ip).chain(network.additional_ips.into_iter().map(|i| i.ip)).collect()
    }

    /// The address of a pod on the pod network whose sandbox this worker did not start (the
    /// runner restarted under it), read back from the runtime once.
    async fn adopt_pod_ip(&mut self, pod: &Pod, seen: &PodSeen) {
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        if host_network || !self.pod_ip.is_empty() {
            return;
        }
        let Some(sandbox) = seen.sandboxes.iter().filter(|s| s.ready).max_by_key(|s| s.created_at) else {
            return;
        };
        self.pod_ip = self.pod_ips(pod, &sandbox.id).await.into_iter().next().unwrap_or_default();
    }

    /// Writes the pod's `etc-hosts` (kubelet's, beside its containers' files); none while the
    /// pod has no IP.
    async fn hosts_file(&self, pod: &Pod, pod_ips: &[String]) -> Result<Option<std::path::PathBuf>, String> {
        if pod_ips.is_empty() {
            return Ok(None);
        }
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network).unwrap_or(false);
        let node_hosts = if host_network {
            tokio::fs::read_to_string("/etc/hosts")
                .await
                .map_err(|e| format!("cannot read /etc/hosts: {e}"))?
        } else {
            String::new()
        };
        let text = hosts::hosts_file(pod, pod_ips, &node_hosts, &self.shared.sandbox_context.cluster_domain);
        let dir = self.shared.state_dir.join("pods").join(&self.uid);
        tokio::fs::create_dir_all(&dir).await.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let file = dir.join("etc-hosts");
        tokio::fs::write(&file, text).await.map_err(|e| format!("cannot write {}: {e}", file.display()))?;
        Ok(Some(file))
    }

    /// A fresh empty file for the container's termination message (kubelet's
    /// `pods/<uid>/containers/<name>/<id>`), under the runner's directory.
    async fn termination_log(&self, name: &str) -> Result<std::path::PathBuf, String> {
        let dir = self.shared.state_dir.join("pods").join(&self.uid).join("containers").join(name);
        tokio::fs::create_dir_all(&dir).await.map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let file = dir.join(format!("{:08x}", rand_id()));
        tokio::fs::write(&file, b"").await.map_err(|e| format!("cannot create {}: {e}", file.display()))?;
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::Permissions::from_mode(0o666);
        tokio::fs::set_permissions(&file, mode)
            .await
            .map_err(|e| format!("cannot chmod {}: {e}", file.display()))?;
        Ok(file)
    }

    /// Where a probe's or a hook's connection goes: the pod's address (the node's under host
    /// networking; a pod adopted after a restart has its address read back first).
    fn hook_ip(&self, pod: Option<&Pod>) -> String {
        let host_network = pod.and_then(|p| p.spec.as_ref()?.host_network).unwrap_or(false);
        if host_network { self.shared.host_ip.clone() } else { self.pod_ip.clone() }
    }

    /// Stops every running container of the pod (all at once, each with the grace period),
    /// then its sandboxes.
    async fn stop_all(&self, pod: Option<&Pod>, seen: &PodSeen, grace: i64) {
        let mut stopping = tokio::task::JoinSet::new();
        for c in seen
            .containers
            .iter()
            .filter(|c| matches!(c.state, State::Running | State::Created | State::Unknown))
        {
            if let Some(pod) = pod {
                self.shared.container_event(
                    pod,
                    &c.name,
                    "Normal",
                    "Killing",
                    format!("Stopping container {}", c.name),
                );
            }
            let (cri, c, ip) = (self.cri.clone(), c.clone(), self.hook_ip(pod));
            let pod = pod.cloned();
            stopping.spawn(async move { stop_one(&cri, pod.as_ref(), &c, grace, &ip).await });
        }
        while let Some(done) = stopping.join_next().await {
            if let Ok(Err(e)) = done {
                tracing::warn!(uid = %self.uid, error = %e, "cannot stop a container");
            }
        }
        for s in seen.sandboxes.iter().filter(|s| s.ready) {
            let request = cri::StopPodSandboxRequest { pod_sandbox_id: s.id.clone() };
            if let Err(e) = self.cri.stop_pod_sandbox(request).await {
                tracing::warn!(uid = %self.uid, error = %e, "cannot stop a sandbox");
            }
        }
    }

    /// A pod no longer wanted: containers stopped (grace period), sandboxes stopped and
    /// removed, and only then its volumes let go. True once nothing of it is left.
    async fn tear_down(&mut self, input: &Input) -> bool {
        self.acted |= !input.seen.sandboxes.is_empty() || !input.seen.containers.is_empty();
        if self.last_pod.is_none() {
            // A pod being deleted when the runner started (never wanted by this worker): its
            // object still names it, for its grace period, its hooks and its deletion.
            let uid = Some(self.uid.as_str());
            self.last_pod = input.objects.pods.values().find(|p| p.metadata.uid.as_deref() == uid).cloned();
        }
        let pod = self.last_pod.clone();
        let grace = grace_of(pod.as_deref(), input.grace);
        let started = std::time::Instant::now();
        self.stop_all(pod.as_deref(), &input.seen, grace).await;
        for s in &input.seen.sandboxes {
            let request = cri::RemovePodSandboxRequest { pod_sandbox_id: s.id.clone() };
            if let Err(e) = self.cri.remove_pod_sandbox(request).await {
                tracing::warn!(uid = %self.uid, error = %e, "cannot remove a sandbox");
                return false;
            }
        }
        if !input.seen.sandboxes.is_empty() {
            tracing::info!(uid = %self.uid, ms = started.elapsed().as_millis() as u64, "pod stopped and removed");
        }
        if !self.release().await {
            return false;
        }
        let dir = self.shared.state_dir.join("pods").join(&self.uid);
        let _ = tokio::fs::remove_dir_all(&dir).await;
        if let Some(pod) = &self.last_pod {
            let ids = PodIds::of(pod);
            let (namespace, name) = (ids.namespace.to_string(), ids.name.to_string());
            self.shared.report(PodStatusReport { namespace, name, uid: self.uid.clone(), status: None });
        }
        self.shared.status.send_modify(|all| {
            Arc::make_mut(all).remove(&self.uid);
        });
        true
    }

    /// Lets the pod's volumes go (when it holds them) and waits until they are.
    async fn release(&mut self) -> bool {
        let released = self.volumes.release_pod(rt::ReleasePodRequest { pod_uid: self.uid.clone() }).await;
        match released {
            Ok(_) => {}
            Err(s) if s.code() == tonic::Code::NotFound => {}
            Err(s) => {
                tracing::warn!(uid = %self.uid, error = %s.message(), "cannot release the pod's volumes");
                return false;
            }
        }
        self.held = false;
        let wait = rt::WaitRequest { pod_uid: self.uid.clone(), timeout_ms: 120_000 };
        match self.volumes.wait_for_volumes_gone(wait).await {
            Ok(answer) => answer.into_inner().ready,
            Err(s) if s.code() == tonic::Code::NotFound => true,
            Err(s) => {
                tracing::warn!(uid = %self.uid, error = %s.message(), "waiting for the pod's volumes to go");
                false
            }
        }
    }
}

/// `readiness` → `Readiness`, as kubelet's probe Events name the probe.
fn capitalised(word: &str) -> String {
    let mut chars = word.chars();
    chars.next().map(|first| first.to_uppercase().chain(chars).collect()).unwrap_or_default()
}

/// How long a hook with no limit of its own may run (kubelet sets none on postStart).
const HOOK_LIMIT: Duration = Duration::from_secs(3600);

/// The least grace a container is stopped with once its preStop hook has run (kubelet's
/// `minimumGracePeriodInSeconds`).
const MINIMUM_GRACE: i64 = 2;

/// Stops one container as kubelet's killContainer does: a running one's preStop hook first,
/// within the grace period, then StopContainer with what is left of it (2 s at least).
async fn stop_one(
    cri: &CriClient,
    pod: Option<&Pod>,
    seen: &actions::ContainerSeen,
    grace: i64,
    pod_ip: &str,
) -> Result<(), cri::CriError> {
    let spec = pod.and_then(|p| p.spec.as_ref());
    let container = spec.and_then(|s| s.containers.iter().find(|c| c.name == seen.name));
    let hook = container.and_then(|c| Some((c, c.lifecycle.as_ref()?.pre_stop.as_ref()?)));
    let mut timeout = grace;
    if let Some((container, hook)) = hook.filter(|_| seen.state == State::Running && grace > 0) {
        let started = std::time::Instant::now();
        let limit = Duration::from_secs(grace as u64);
        let ran = prober::run_action(cri, &seen.id, container, prober::Action::of_hook(hook), pod_ip, limit);
        if let Err(why) = ran.await {
            tracing::warn!(container = %seen.name, id = %seen.id, reason = "FailedPreStopHook", %why, "preStop hook failed");
        }
        timeout = (grace - started.elapsed().as_secs() as i64).max(MINIMUM_GRACE);
    }
    cri.stop_container(cri::StopContainerRequest { container_id: seen.id.clone(), timeout }).await.map(|_| ())
}

/// The grace period: the pod's `terminationGracePeriodSeconds`, else what its containers
/// carry, else kubelet's default of 30 s.
fn grace_of(pod: Option<&Pod>, carried: Option<i64>) -> i64 {
    pod.and_then(|p| p.spec.as_ref()?.termination_grace_period_seconds).or(carried).unwrap_or(30).max(0)
}

/// The API server's default pull policy: `Always` for `:latest` or no tag, else `IfNotPresent`.
pub fn default_pull_policy(image: &str) -> &'static str {
    let without_digest = image.split('@').next().unwrap_or(image);
    let last = without_digest.rsplit('/').next().unwrap_or(without_digest);
    match last.split_once(':') {
        Some((_, "latest")) | None if !image.contains('@') => "Always",
        _ => "IfNotPresent",
    }
}

fn rand_id() -> u32 {
    let nanos = SystemTime::now().duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default().subsec_nanos();
    nanos ^ std::process::id().rotate_left(16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pull_policy_defaults() {
        let cases = [
            ("busybox", "Always"),
            ("busybox:latest", "Always"),
            ("busybox:1.36", "IfNotPresent"),
            ("registry:5000/busybox", "Always"),
            ("registry:5000/busybox:1", "IfNotPresent"),
            ("busybox@sha256:abc", "IfNotPresent"),
        ];
        for (image, want) in cases {
            assert_eq!(default_pull_policy(image), want, "{image}");
        }
    }

    #[test]
    fn grace_periods() {
        let pod: Pod = serde_json::from_value(
            serde_json::json!({"spec": {"terminationGracePeriodSeconds": 3, "containers": []}}),
        )
        .unwrap();
        assert_eq!(grace_of(Some(&pod), Some(9)), 3);
        assert_eq!(grace_of(None, Some(9)), 9);
        assert_eq!(grace_of(None, None), 30);
    }
}
