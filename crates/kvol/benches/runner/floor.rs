//! The runtime's own floor for the runner bench: the sandbox and container configs the runner makes, issued straight to CRI (image status, sandbox, create, start), one pod at a time and then many at once, with no agent, no volumes and no status in between.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kvol_cri::{
    CreateContainerRequest, CriClient, CriError, ImageSpec, ImageStatusRequest, RemovePodSandboxRequest,
    RunPodSandboxRequest, StartContainerRequest, StopPodSandboxRequest,
};
use kvol_runner::container::{ContainerContext, ImageUser, container_config};
use kvol_runner::env::EnvContext;
use kvol_runner::sandbox::{SandboxContext, sandbox_config};

use super::{Cri, manifest};
use crate::support::containerd::Containerd;

/// What the floor measured: one pod's times (sorted) and `many` pods all started.
pub struct Floor {
    pub one: Vec<Duration>,
    pub all_up: Duration,
}

/// The floor's pod `f<i>`: the bench's pod with an emptyDir for its configMap (no volume is
/// mounted here; the runtime sees the same sandbox and container otherwise).
fn floor_pod(i: usize) -> Pod {
    let text = manifest(&format!("f{i}"), &format!("f1002000-0000-4000-8000-{i:012}"), "emptyDir: {}");
    serde_saphyr::from_str(&text).expect("the bench's pod parses")
}

/// One pod started as the runner starts it, without volumes; its sandbox's id.
async fn start_pod(client: &CriClient, pod: &Pod, context: &SandboxContext) -> Result<String, CriError> {
    let sandbox = sandbox_config(pod, 0, context);
    std::fs::create_dir_all(&sandbox.log_directory).expect("the pod's log directory");
    let request = RunPodSandboxRequest { config: Some(sandbox.clone()), runtime_handler: String::new() };
    let id = client.run_pod_sandbox(request).await?.pod_sandbox_id;
    let container = &pod.spec.as_ref().expect("a spec").containers[0];
    let image =
        ImageSpec { image: container.image.clone().unwrap_or_default(), annotations: Default::default() };
    let status = client.image_status(ImageStatusRequest { image: Some(image), verbose: false }).await?;
    let (objects, mounts) = (kvol_api::ObjectSet::default(), Default::default());
    let image_user = ImageUser::of(status.image.as_ref());
    let context = ContainerContext {
        env: EnvContext {
            objects: &objects,
            node_name: "floor",
            host_ip: "127.0.0.1",
            pod_ip: "127.0.0.1",
            node: Default::default(),
        },
        restart_count: 0,
        mounts: &mounts,
        termination_log: None,
        hosts_file: None,
        image_user: &image_user,
    };
    let config = container_config(pod, container, &context).expect("the bench's container is valid");
    let create = CreateContainerRequest {
        pod_sandbox_id: id.clone(),
        config: Some(config),
        sandbox_config: Some(sandbox),
    };
    let container_id = client.create_container(create).await?.container_id;
    client.start_container(StartContainerRequest { container_id }).await?;
    Ok(id)
}

/// Stops and removes the sandboxes `ids` (their containers with them), all at once.
async fn remove_pods(client: &CriClient, ids: Vec<String>) {
    let mut removals = tokio::task::JoinSet::new();
    for id in ids {
        let client = client.clone();
        removals.spawn(async move {
            let stop = StopPodSandboxRequest { pod_sandbox_id: id.clone() };
            client.stop_pod_sandbox(stop).await?;
            client.remove_pod_sandbox(RemovePodSandboxRequest { pod_sandbox_id: id }).await
        });
    }
    while let Some(done) = removals.join_next().await {
        if let Ok(Err(e)) = done {
            eprintln!("cri floor: {e}");
        }
    }
}

/// `many` pods started at once, each its own task on one client (the runner's one channel);
/// how long until every one's container was started.
async fn start_many(client: &CriClient, context: &SandboxContext, many: usize) -> (Duration, Vec<String>) {
    let started = Instant::now();
    let mut starts = tokio::task::JoinSet::new();
    for i in 0..many {
        let (client, context) = (client.clone(), context.clone());
        starts.spawn(async move { start_pod(&client, &floor_pod(i), &context).await });
    }
    let mut ids = Vec::new();
    while let Some(done) = starts.join_next().await {
        ids.push(done.expect("a start task").expect("a pod started through CRI"));
    }
    (started.elapsed(), ids)
}

/// The floor, on the bench's containerd after kvol's rounds (its pods removed).
pub fn cri_floor(containerd: &Containerd, rounds: usize, many: usize) -> Floor {
    let cri = Cri::new(&containerd.endpoint());
    let logs = kvol_test_support::ScratchRoot::new();
    let context = SandboxContext {
        log_root: logs.path().to_path_buf(),
        host_resolv_conf: std::fs::read_to_string(Path::new("/etc/resolv.conf")).unwrap_or_default(),
        cluster_dns: Vec::new(),
        cluster_domain: "cluster.local".into(),
    };
    let mut one = Vec::new();
    for round in 0..rounds {
        let pod = floor_pod(many + round);
        let started = Instant::now();
        let id = cri.runtime.block_on(start_pod(&cri.client, &pod, &context)).expect("one pod through CRI");
        one.push(started.elapsed());
        cri.runtime.block_on(remove_pods(&cri.client, vec![id]));
    }
    one.sort();
    println!(
        "cri floor: one pod: image status, sandbox, create, start, median {:.0?} (min {:.0?}, max {:.0?}) over {rounds} rounds",
        one[one.len() / 2],
        one[0],
        one[one.len() - 1]
    );
    let (all_up, ids) = cri.runtime.block_on(start_many(&cri.client, &context, many));
    println!("cri floor: {many} pods started at once → all running {all_up:.2?}");
    let removed = Instant::now();
    cri.runtime.block_on(remove_pods(&cri.client, ids));
    println!("cri floor: {many} pods removed in {:.2?}", removed.elapsed());
    Floor { one, all_up }
}
