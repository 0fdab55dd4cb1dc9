//! Publishing the volumes made of API objects, timed against an emptyDir publish in the same run: a configMap on disk, a secret on a tmpfs, each written whole by the atomic writer; and an unchanged republish.
//!
//! `cargo bench -p kvol-plugin --bench pod_objects [ROUNDS]` as root (the tmpfs mounts go into a
//! private mount namespace of this process); default 200 rounds. Each round publishes to a new
//! pod directory, so every publish does the whole work; medians are printed.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Volume;
use kvol_api::projection::{FileProjection, Projection};
use kvol_plugin::local::{EmptyDirPlugin, PodObjectPlugin};
use kvol_plugin::plugin::{PodInfo, PublishRequest, UnpublishRequest, VolumePlugin};
use kvol_plugin::{NodeInfo, NodePaths, PluginHost, SystemMounter, VolumeSpec};

fn volume(json: serde_json::Value) -> VolumeSpec {
    VolumeSpec::inline(serde_json::from_value::<Volume>(json).unwrap(), "default")
}

fn projection(files: &[(&str, &str)]) -> Projection {
    let files: BTreeMap<String, FileProjection> = files
        .iter()
        .map(|(p, d)| {
            (p.to_string(), FileProjection { data: d.as_bytes().to_vec(), mode: 0o644, fs_user: None })
        })
        .collect();
    Projection { files, tokens: Vec::new() }
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Publishes `spec` with `plugin` into a new pod directory per round; the publish times, and
/// the times of a second, unchanged publish of the same volume.
fn rounds(
    plugin: &dyn VolumePlugin,
    root: &Path,
    spec: &VolumeSpec,
    projection: Option<&Projection>,
    rounds: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let runtime = tokio::runtime::Builder::new_current_thread().build().unwrap();
    let mounter = plugin.mounter().expect("a mounter");
    let (mut first, mut again) = (Vec::new(), Vec::new());
    for i in 0..rounds {
        let pod = PodInfo { uid: format!("{}-{i}", spec.name()), ..PodInfo::default() };
        let target = NodePaths::new(root).pod_volume_dir(&pod.uid, plugin.name(), spec.name()).unwrap();
        let req = PublishRequest {
            spec,
            pod: &pod,
            pod_volume_name: spec.name(),
            target: &target,
            staging_path: None,
            device_path: None,
            read_only: false,
            mount_options: &[],
            projection,
        };
        let start = Instant::now();
        runtime.block_on(mounter.publish(&req)).unwrap();
        first.push(start.elapsed());
        let start = Instant::now();
        runtime.block_on(mounter.publish(&req)).unwrap();
        again.push(start.elapsed());
        let un =
            UnpublishRequest { pod_uid: &pod.uid, pod_volume_name: spec.name(), target: &target, spec: None };
        runtime.block_on(mounter.unpublish(&un)).unwrap();
    }
    (first, again)
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let n: usize = std::env::args().skip(1).find_map(|a| a.parse().ok()).unwrap_or(200);
    nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare (the bench needs root)");
    nix::mount::mount(
        None::<&str>,
        "/",
        None::<&str>,
        nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE,
        None::<&str>,
    )
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let root = std::fs::canonicalize(dir.path()).unwrap();
    let host = PluginHost::new(NodePaths::new(&root), NodeInfo::named("bench"), Arc::new(SystemMounter));
    let empty_dir = EmptyDirPlugin::new(host.clone());
    let plugins = PodObjectPlugin::all(&host);
    let find = |name: &str| plugins.iter().find(|p| p.name() == name).unwrap();
    let files = projection(&[("a.conf", "alpha\n"), ("b.conf", "bravo\n"), ("dir/c.conf", "charlie\n")]);
    let cases: [(&str, &dyn VolumePlugin, VolumeSpec, Option<&Projection>); 4] = [
        (
            "emptyDir (disk), the baseline",
            &empty_dir,
            volume(serde_json::json!({"name": "e", "emptyDir": {}})),
            None,
        ),
        (
            "emptyDir (memory)",
            &empty_dir,
            volume(serde_json::json!({"name": "m", "emptyDir": {"medium": "Memory"}})),
            None,
        ),
        (
            "configMap (disk), 3 files",
            find("kubernetes.io/configmap"),
            volume(serde_json::json!({"name": "c", "configMap": {"name": "x"}})),
            Some(&files),
        ),
        (
            "secret (tmpfs), 3 files",
            find("kubernetes.io/secret"),
            volume(serde_json::json!({"name": "s", "secret": {"secretName": "x"}})),
            Some(&files),
        ),
    ];
    println!("publish into a new pod directory, then the same publish again unchanged ({n} rounds, medians)");
    let mut baseline = None;
    for (what, plugin, spec, projection) in &cases {
        let (first, again) = rounds(*plugin, &root, spec, *projection, n);
        let (f, a) = (median(first), median(again));
        let base = *baseline.get_or_insert(f);
        println!(
            "  {what:32} {:8.1} µs  (x{:.2} of the baseline); unchanged again {:8.1} µs",
            us(f),
            f.as_secs_f64() / base.as_secs_f64(),
            us(a)
        );
    }
}
