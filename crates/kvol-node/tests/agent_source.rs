//! The agent in-process on an `ObjectSource` other than the manifests directory (the seam the cluster source plugs into): objects sent by code are mounted and torn down for real, in a private mount namespace of the test thread.

use std::path::Path;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Pod;
use kvol_node::AgentConfig;
use kvol_node::ObjectSet;
use kvol_node::agent::run_agent_with_source;
use kvol_node::report::status::{Phase, StatusReport, read_status};
use kvol_node::sources::{ChannelSource, Object, parse_manifests};
use kvol_plugin::{Mounter, SystemMounter};
use nix::mount::MsFlags;
use nix::sched::CloneFlags;

fn pod(text: &str) -> Pod {
    let (objects, problems) = parse_manifests("test", text);
    assert!(problems.is_empty(), "{problems:?}");
    match objects.into_iter().next() {
        Some(Object::Pod(pod)) => Pod::clone(&pod),
        other => panic!("not a pod: {other:?}"),
    }
}

async fn wait_for(root: &Path, what: &str, ok: impl Fn(&StatusReport) -> bool) -> StatusReport {
    let start = Instant::now();
    loop {
        if let Ok(report) = read_status(root)
            && ok(&report)
        {
            return report;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "timed out waiting for {what}: {:#?}",
            read_status(root)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[test]
fn objects_sent_through_a_channel_source_are_mounted_and_torn_down() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (this test needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let dir = kvol_test_support::ScratchRoot::new();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let mut config = AgentConfig::embedded(&root, "node-a");
    config.example_flex_drivers = false;
    // Set to a directory that does not exist: a channel source must not read it.
    config.manifests_dir = root.join("never-read");

    let host = root.join("host-data");
    let web = pod(&format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: web, namespace: shop}}\nspec:\n  containers: [{{name: a, image: b, volumeMounts: [{{name: cache, mountPath: /c}}, {{name: host, mountPath: /h}}]}}]\n  volumes:\n  - {{name: cache, emptyDir: {{medium: Memory, sizeLimit: 8Mi}}}}\n  - {{name: host, hostPath: {{path: {}, type: DirectoryOrCreate}}}}\n",
        host.display()
    ));
    let mut objects = ObjectSet::default();
    objects.pods.insert("shop/web".into(), web.into());
    let source = ChannelSource::new(objects);

    // A current-thread runtime: every task runs on this thread, in its mount namespace.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let agent = tokio::spawn(run_agent_with_source(config, Box::new(source.clone()), async move {
            let _ = stop_rx.await;
        }));
        let published = |r: &StatusReport| {
            ["cache", "host"]
                .iter()
                .all(|v| r.volumes.iter().any(|s| s.volume == *v && s.phase == Phase::Published))
        };
        let report = wait_for(&root, "both volumes published", published).await;
        let cache = report.volumes.iter().find(|v| v.volume == "cache").unwrap().target.clone().unwrap();
        let mounts = SystemMounter.mounts_under(&root).unwrap();
        assert!(mounts.iter().any(|m| m.target == cache && m.fstype == "tmpfs"), "{mounts:#?}");
        assert!(host.is_dir(), "DirectoryOrCreate made the host directory");
        assert!(!root.join("never-read").exists(), "the manifests directory was not used");

        // The pod goes: everything comes down, the host data stays.
        source.send(ObjectSet::default());
        wait_for(&root, "torn down", |r| r.volumes.is_empty() && r.node_volumes.is_empty()).await;
        let start = Instant::now();
        while !SystemMounter.mounts_under(&root).unwrap().is_empty() {
            assert!(start.elapsed() < Duration::from_secs(10), "{:#?}", SystemMounter.mounts_under(&root));
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(host.is_dir());

        stop_tx.send(()).unwrap();
        agent.await.unwrap().expect("the agent stops cleanly");
    });
}
