//! Kubelet's volume stats: which published volumes come from a claim (pure), and the task that measures them on a cadence so a scrape only reads the last figures.
//!
//! As kubelet's `--volume-stats-agg-period` does, the measuring runs every period in the
//! background (a CSI driver's `NodeGetVolumeStats`, `statvfs` for local volumes), each call
//! bounded in time; `/metrics` then encodes what was last measured. Only volumes that come
//! from a PersistentVolumeClaim are reported (kubelet labels them by the claim), each claim
//! once however many pods use it.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kvol_plugin::plugin::{StatsRequest, VolumeStats};
use kvol_plugin::{PluginRegistry, VolumeSpec};
use tokio::sync::watch;

use crate::model::{PodVolumeKey, PublishedVolume};
use crate::report::metrics::{ClaimRef, Metrics};

/// A published volume that comes from a claim, with what measuring it needs.
#[derive(Clone, Debug, PartialEq)]
pub struct ClaimedVolume {
    pub claim: ClaimRef,
    pub key: PodVolumeKey,
    pub plugin: String,
    pub spec: VolumeSpec,
    pub target: PathBuf,
    pub staging_path: Option<PathBuf>,
}

/// The published volumes that come from a claim of their pod (`persistentVolumeClaim`, or a
/// generic ephemeral volume's `<pod>-<volume>` claim), one per claim (the first by pod uid);
/// a record whose outcome is uncertain, or whose pod is gone or has another uid, is left out.
pub fn claimed_volumes(
    pods: &BTreeMap<String, std::sync::Arc<Pod>>,
    published: &BTreeMap<PodVolumeKey, PublishedVolume>,
) -> Vec<ClaimedVolume> {
    let mut seen = BTreeMap::new();
    for (key, volume) in published.iter().filter(|(_, v)| !v.uncertain) {
        let Some(claim) = claim_of(pods, volume) else { continue };
        seen.entry(claim.clone()).or_insert_with(|| ClaimedVolume {
            claim,
            key: key.clone(),
            plugin: volume.plugin.clone(),
            spec: volume.spec.clone(),
            target: volume.target.clone(),
            staging_path: volume.staging_path.clone(),
        });
    }
    seen.into_values().collect()
}

/// The claim a published volume's pod names for it, if any.
fn claim_of(pods: &BTreeMap<String, std::sync::Arc<Pod>>, volume: &PublishedVolume) -> Option<ClaimRef> {
    let pod = pods.get(&format!("{}/{}", volume.pod.namespace, volume.pod.name))?;
    if pod.metadata.uid.as_deref() != Some(volume.pod.uid.as_str()) {
        return None;
    }
    let spec_volume = pod.spec.as_ref()?.volumes.as_ref()?.iter().find(|v| v.name == volume.key.volume)?;
    let name = match (&spec_volume.persistent_volume_claim, &spec_volume.ephemeral) {
        (Some(source), _) => source.claim_name.clone(),
        (None, Some(_)) => format!("{}-{}", volume.pod.name, spec_volume.name),
        (None, None) => return None,
    };
    Some(ClaimRef { namespace: volume.pod.namespace.clone(), name })
}

/// Measures each volume through its plugin's stats reader, all at once, each within
/// `timeout`; a volume whose plugin measures nothing, or whose measuring failed, is left out
/// (and the failure logged).
pub async fn measure(
    volumes: &[ClaimedVolume],
    registry: &PluginRegistry,
    timeout: Duration,
) -> BTreeMap<ClaimRef, VolumeStats> {
    let snapshot = registry.snapshot();
    let mut tasks = tokio::task::JoinSet::new();
    for volume in volumes {
        let Ok(plugin) = snapshot.find_by_name(&volume.plugin) else { continue };
        if plugin.stats_reader().is_none() {
            continue;
        }
        let (plugin, volume) = (Arc::clone(plugin), volume.clone());
        tasks.spawn(async move {
            let reader = plugin.stats_reader().expect("checked before spawning");
            let request = StatsRequest {
                spec: &volume.spec,
                pod_uid: &volume.key.pod_uid,
                target: &volume.target,
                staging_path: volume.staging_path.as_deref(),
            };
            let outcome = match tokio::time::timeout(timeout, reader.volume_stats(&request)).await {
                Ok(Ok(stats)) => Ok(stats),
                Ok(Err(e)) => Err(e.to_string()),
                Err(_) => Err(format!("no answer within {} s", timeout.as_secs_f64())),
            };
            (volume, outcome)
        });
    }
    let mut measured = BTreeMap::new();
    while let Some(joined) = tasks.join_next().await {
        let Ok((volume, outcome)) = joined else { continue };
        match outcome {
            Ok(stats) => {
                measured.insert(volume.claim, stats);
            }
            Err(error) => tracing::warn!(
                claim = %format!("{}/{}", volume.claim.namespace, volume.claim.name),
                volume = %volume.key,
                plugin = %volume.plugin,
                %error,
                "cannot measure the volume"
            ),
        }
    }
    measured
}

/// Measures the claimed volumes `volumes` holds every `period` into `metrics`, until `stop`
/// turns true. A claim that stops being published loses its stats at once.
pub async fn run_collector(
    period: Duration,
    mut volumes: watch::Receiver<Arc<Vec<ClaimedVolume>>>,
    registry: Arc<PluginRegistry>,
    metrics: Arc<Metrics>,
    mut stop: watch::Receiver<bool>,
) {
    let mut ticks = tokio::time::interval(period);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    enum Wake {
        Stop,
        Changed,
        Tick,
    }
    loop {
        let wake = tokio::select! {
            _ = stop.wait_for(|s| *s) => Wake::Stop,
            changed = volumes.changed() => if changed.is_ok() { Wake::Changed } else { Wake::Stop },
            _ = ticks.tick() => Wake::Tick,
        };
        let current = Arc::clone(&volumes.borrow_and_update());
        match wake {
            Wake::Stop => return,
            Wake::Changed => metrics.keep_volume_stats(|claim| current.iter().any(|v| &v.claim == claim)),
            Wake::Tick => {
                // Measuring gives up well before the next tick is due.
                let measured = measure(&current, &registry, period.min(MEASURE_TIMEOUT)).await;
                metrics.set_volume_stats(&measured);
            }
        }
    }
}

/// The longest one volume's measuring may take.
pub const MEASURE_TIMEOUT: Duration = Duration::from_secs(30);

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        EphemeralVolumeSource, PersistentVolumeClaimVolumeSource, PodSpec, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kvol_plugin::plugin::PodInfo;

    fn pod(name: &str, uid: &str, volumes: Vec<Volume>) -> (String, Pod) {
        let pod = Pod {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                uid: Some(uid.into()),
                ..ObjectMeta::default()
            },
            spec: Some(PodSpec { volumes: Some(volumes), ..PodSpec::default() }),
            ..Pod::default()
        };
        (format!("ns/{name}"), pod)
    }

    fn claim_volume(name: &str, claim: &str) -> Volume {
        Volume {
            name: name.into(),
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: claim.into(),
                read_only: None,
            }),
            ..Volume::default()
        }
    }

    fn ephemeral_volume(name: &str) -> Volume {
        Volume { name: name.into(), ephemeral: Some(EphemeralVolumeSource::default()), ..Volume::default() }
    }

    fn empty_dir_volume(name: &str) -> Volume {
        Volume { name: name.into(), empty_dir: Some(Default::default()), ..Volume::default() }
    }

    fn published(pod: &str, uid: &str, volume: &str, uncertain: bool) -> (PodVolumeKey, PublishedVolume) {
        let key = PodVolumeKey { pod_uid: uid.into(), volume: volume.into() };
        let record = PublishedVolume {
            projection: None,
            fs_size: None,
            expansion_deferred: None,
            key: key.clone(),
            pod: PodInfo { name: pod.into(), namespace: "ns".into(), uid: uid.into(), ..PodInfo::default() },
            pod_name: format!("ns/{pod}"),
            unique_name: format!("plugin^{volume}"),
            plugin: "plugin".into(),
            spec: VolumeSpec::inline(empty_dir_volume(volume), "ns"),
            target: PathBuf::from(format!("/pods/{uid}/volumes/plugin/{volume}")),
            staging_path: None,
            device_path: None,
            uncertain,
        };
        (key, record)
    }

    fn claims(found: &[ClaimedVolume]) -> Vec<(String, String)> {
        found.iter().map(|v| (v.claim.name.clone(), v.key.to_string())).collect()
    }

    #[test]
    fn only_volumes_from_claims_are_measured_once_per_claim() {
        type Row = (
            &'static str,
            Vec<(String, Pod)>,
            Vec<(PodVolumeKey, PublishedVolume)>,
            Vec<(&'static str, &'static str)>,
        );
        let rows: Vec<Row> = vec![
            (
                "a claim",
                vec![pod("a", "u1", vec![claim_volume("data", "c1")])],
                vec![published("a", "u1", "data", false)],
                vec![("c1", "u1/data")],
            ),
            (
                "a generic ephemeral volume is its <pod>-<volume> claim",
                vec![pod("a", "u1", vec![ephemeral_volume("scratch")])],
                vec![published("a", "u1", "scratch", false)],
                vec![("a-scratch", "u1/scratch")],
            ),
            (
                "an emptyDir is no claim",
                vec![pod("a", "u1", vec![empty_dir_volume("tmp")])],
                vec![published("a", "u1", "tmp", false)],
                vec![],
            ),
            (
                "two pods on one claim count once",
                vec![
                    pod("a", "u1", vec![claim_volume("data", "shared")]),
                    pod("b", "u2", vec![claim_volume("data", "shared")]),
                ],
                vec![published("a", "u1", "data", false), published("b", "u2", "data", false)],
                vec![("shared", "u1/data")],
            ),
            (
                "an uncertain record is not measured",
                vec![pod("a", "u1", vec![claim_volume("data", "c1")])],
                vec![published("a", "u1", "data", true)],
                vec![],
            ),
            (
                "a pod recreated with another uid is not the record's",
                vec![pod("a", "u9", vec![claim_volume("data", "c1")])],
                vec![published("a", "u1", "data", false)],
                vec![],
            ),
            ("a pod gone", vec![], vec![published("a", "u1", "data", false)], vec![]),
        ];
        for (name, pods, records, want) in rows {
            let pods: BTreeMap<_, _> = pods.into_iter().map(|(k, p)| (k, std::sync::Arc::new(p))).collect();
            let records: BTreeMap<_, _> = records.into_iter().collect();
            let want: Vec<(String, String)> =
                want.iter().map(|(c, k)| (c.to_string(), k.to_string())).collect();
            assert_eq!(claims(&claimed_volumes(&pods, &records)), want, "{name}");
        }
    }
}
