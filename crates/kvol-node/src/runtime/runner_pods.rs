//! The pods a runner hands kvol over the runtime API: a third object source beside the manifests directory and the API server, laid over their set, and kept across restarts until taken back.
//!
//! A handed-over pod is written to `<state dir>/runner-pods/<uid>.json` before it is taken
//! (synced), and that file is removed when the runner takes it back: a restarted agent has the
//! runner's pods from its first pass, so it never tears down the volumes of running containers
//! because the runner has not handed them over again yet.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use crate::model::ObjectSet;

/// The runner's pods by uid, where they are kept (`None`: in memory only), and a version that
/// moves at every change (the loop wakes on it).
#[derive(Debug)]
pub struct RunnerPods {
    pods: Mutex<BTreeMap<String, Arc<Pod>>>,
    /// The uids the runner took back: finished on this node (its containers stopped). A pod
    /// a source still has, being deleted, loses its volumes then, as kubelet lets a terminated
    /// pod's volumes go before its object is deleted. Forgotten once no source has the uid.
    finished: Mutex<std::collections::BTreeSet<String>>,
    dir: Option<PathBuf>,
    version: watch::Sender<u64>,
}

impl Default for RunnerPods {
    fn default() -> RunnerPods {
        RunnerPods {
            pods: Mutex::new(BTreeMap::new()),
            finished: Mutex::new(Default::default()),
            dir: None,
            version: watch::channel(0).0,
        }
    }
}

/// The directory of the runner's pods under the state directory.
pub const RUNNER_PODS_DIR: &str = "runner-pods";

impl RunnerPods {
    /// The runner's pods kept in `dir` (made if missing); a file that is not a pod kvol takes
    /// is left where it is and returned as a problem.
    pub fn open(dir: &Path) -> Result<(RunnerPods, Vec<String>), String> {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
        let (mut pods, mut problems) = (BTreeMap::new(), Vec::new());
        for entry in entries.flatten() {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            match one_pod(&text) {
                Ok(pod) => {
                    pods.insert(pod.metadata.uid.clone().unwrap_or_default(), pod);
                }
                Err(Refused::Invalid(why) | Refused::Exists(why) | Refused::Unsaved(why)) => {
                    problems.push(format!("runner pod {} is left alone: {why}", path.display()))
                }
            }
        }
        let runner =
            RunnerPods { pods: Mutex::new(pods), dir: Some(dir.to_path_buf()), ..RunnerPods::default() };
        Ok((runner, problems))
    }

    fn file_of(&self, uid: &str) -> Option<PathBuf> {
        self.dir.as_ref().map(|d| d.join(format!("{uid}.json")))
    }

    /// Takes `text` (a v1 Pod as JSON or YAML) as a runner's pod, checked and completed as a
    /// manifest's is; refused when `current` (the other sources' set) has another pod of that
    /// namespace/name or uid, or the runner already has one. The very pod a source has (same
    /// namespace/name and uid) is taken as held: the source's copy is used while it has it, and
    /// the volumes stay after it drops it until the runner takes the pod back. Returns its uid.
    pub fn admit(&self, text: &str, current: &ObjectSet) -> Result<String, Refused> {
        let pod = one_pod(text)?;
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = key_of(&pod);
        let mut pods = self.lock();
        // The very pod a source has (same namespace/name and uid) is held: its volumes stay
        // after the source drops it, until the runner takes it back (its containers stopped).
        let same_uid = |p: &Pod| p.metadata.uid.as_deref() == Some(uid.as_str());
        let clash = current.pods.iter().find(|(k, p)| (**k == key) != same_uid(p));
        if let Some((other, _)) = clash {
            return Err(Refused::Exists(format!("pod {other} (uid {uid}) is another source's")));
        }
        if let Some(p) = pods.get(&uid) {
            return Err(Refused::Exists(format!("pod {} (uid {uid}) was handed over already", key_of(p))));
        }
        if let Some(p) = pods.values().find(|p| key_of(p) == key) {
            let theirs = p.metadata.uid.clone().unwrap_or_default();
            return Err(Refused::Exists(format!("pod {key} was handed over already, with uid {theirs}")));
        }
        if let Some(file) = self.file_of(&uid) {
            let json = serde_json::to_vec(pod.as_ref()).map_err(|e| Refused::Invalid(e.to_string()))?;
            kvol_plugin::atomic_file::replace(&file, &json, kvol_plugin::atomic_file::Durability::Synced)
                .map_err(|e| Refused::Unsaved(e.to_string()))?;
        }
        pods.insert(uid.clone(), pod);
        drop(pods);
        self.version.send_modify(|v| *v += 1);
        Ok(uid)
    }

    /// Takes a runner's pod back; `false` when the runner has no pod of that uid. Either way
    /// the pod is finished on this node: being deleted, its volumes go.
    pub fn release(&self, uid: &str) -> bool {
        let newly_finished = self.finished.lock().unwrap_or_else(|e| e.into_inner()).insert(uid.to_string());
        let removed = self.lock().remove(uid).is_some();
        if let Some(file) = self.file_of(uid).filter(|_| removed)
            && let Err(e) = std::fs::remove_file(&file)
        {
            tracing::warn!(file = %file.display(), error = %e, "cannot remove a released runner pod's file");
        }
        if removed || newly_finished {
            self.version.send_modify(|v| *v += 1);
        }
        removed
    }

    /// Whether the runner handed over the pod of that uid.
    pub fn holds(&self, uid: &str) -> bool {
        self.lock().contains_key(uid)
    }

    /// The version now (0 until the first change).
    pub fn version(&self) -> u64 {
        *self.version.borrow()
    }

    /// Woken at every change.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.version.subscribe()
    }

    /// Lays the runner's pods over `set`; a pod a source has since brought under the same
    /// namespace/name stays the source's, with a problem saying so. A pod being deleted that
    /// the runner finished is taken out (its volumes go).
    pub fn overlay(&self, set: &mut ObjectSet) {
        self.drop_finished(set);
        for pod in self.lock().values() {
            let key = key_of(pod);
            if let Some(theirs) = set.pods.get(&key) {
                if theirs.metadata.uid == pod.metadata.uid {
                    // Held while its source still has it.
                    continue;
                }
                set.problems.push(kvol_api::SourceProblem {
                    origin: "runtime api".to_string(),
                    document: None,
                    reason: format!(
                        "pod {key} handed over by the runner is also another source's; that one is used"
                    ),
                });
                continue;
            }
            set.pods.insert(key, Arc::clone(pod));
        }
    }

    /// Takes the finished pods being deleted out of `set`; forgets those no source has.
    fn drop_finished(&self, set: &mut ObjectSet) {
        let mut finished = self.finished.lock().unwrap_or_else(|e| e.into_inner());
        if finished.is_empty() {
            return;
        }
        let uid_of = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
        finished.retain(|uid| set.pods.values().any(|p| uid_of(p) == *uid));
        set.pods.retain(|_, p| !(p.metadata.deletion_timestamp.is_some() && finished.contains(&uid_of(p))));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<Pod>>> {
        self.pods.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Why a pod was not taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a pod kvol takes (with every reason).
    Invalid(String),
    /// A pod of that name or uid is there already.
    Exists(String),
    /// It could not be kept on disk (and was not taken).
    Unsaved(String),
}

/// The one pod `text` holds, checked and completed as a manifest's is.
fn one_pod(text: &str) -> Result<Arc<Pod>, Refused> {
    let (objects, problems) = crate::sources::parse::parse_manifests("runtime api", text);
    if let Some(problem) = problems.first() {
        return Err(Refused::Invalid(problem.reason.clone()));
    }
    match objects.as_slice() {
        [crate::sources::parse::Object::Pod(pod)] => Ok(Arc::clone(pod)),
        [other] => Err(Refused::Invalid(format!("{other} is not a Pod"))),
        _ => Err(Refused::Invalid(format!("want one Pod, got {} objects", objects.len()))),
    }
}

fn key_of(pod: &Pod) -> String {
    let namespace = pod.metadata.namespace.as_deref().unwrap_or(crate::sources::DEFAULT_NAMESPACE);
    format!("{namespace}/{}", pod.metadata.name.as_deref().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "job", "namespace": "ci", "uid": "u-1"},
        "spec": {"containers": [{"name": "c"}], "volumes": [{"name": "s", "emptyDir": {}}]}}"#;

    #[test]
    fn pods_are_handed_over_once_and_taken_back() {
        let runner = RunnerPods::default();
        let empty = ObjectSet::default();
        assert_eq!(runner.admit(POD, &empty), Ok("u-1".to_string()));
        assert_eq!(runner.version(), 1);
        let again = runner.admit(POD, &empty).unwrap_err();
        assert_eq!(again, Refused::Exists("pod ci/job (uid u-1) was handed over already".into()));
        let renamed = POD.replace("u-1", "u-2");
        assert!(
            matches!(runner.admit(&renamed, &empty), Err(Refused::Exists(m)) if m.contains("with uid u-1"))
        );
        let mut set = ObjectSet::default();
        runner.overlay(&mut set);
        assert_eq!(set.pods.keys().collect::<Vec<_>>(), ["ci/job"]);
        assert!(runner.release("u-1"));
        assert!(!runner.release("u-1"), "taken back already");
        assert_eq!(runner.version(), 2);
    }

    #[test]
    fn handed_over_pods_are_kept_until_taken_back() {
        let dir = tempfile::tempdir().unwrap();
        let (runner, problems) = RunnerPods::open(dir.path()).unwrap();
        assert!(problems.is_empty());
        runner.admit(POD, &ObjectSet::default()).unwrap();
        std::fs::write(dir.path().join("junk.json"), "{").unwrap();
        let (again, problems) = RunnerPods::open(dir.path()).unwrap();
        assert!(again.holds("u-1"), "kept across a restart");
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].contains("junk.json") && problems[0].contains("left alone"), "{problems:?}");
        assert!(again.release("u-1"));
        let (after, _) = RunnerPods::open(dir.path()).unwrap();
        assert!(!after.holds("u-1"), "gone once taken back");
    }

    #[test]
    fn bad_pods_and_other_sources_pods_are_refused_with_the_reason() {
        let runner = RunnerPods::default();
        let mut theirs = ObjectSet::default();
        let pod: Pod = serde_json::from_str(POD).unwrap();
        theirs.pods.insert("ci/job".into(), Arc::new(pod));
        let other_uid = POD.replace("u-1", "u-9");
        assert!(
            matches!(runner.admit(&other_uid, &theirs), Err(Refused::Exists(m)) if m.contains("another source's"))
        );
        let other_name = POD.replace("\"job\"", "\"job2\"");
        assert!(
            matches!(runner.admit(&other_name, &theirs), Err(Refused::Exists(m)) if m.contains("another source's"))
        );
        let cases = [
            (r#"{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "Bad_Name"}}"#, "metadata.name"),
            (r#"{"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}}"#, "is not a Pod"),
            ("not json: [", "yaml"),
        ];
        for (text, want) in cases {
            match runner.admit(text, &ObjectSet::default()) {
                Err(Refused::Invalid(m)) => assert!(m.contains(want), "{text}: {m}"),
                other => panic!("{text}: {other:?}"),
            }
        }
        assert_eq!(runner.version(), 0, "nothing taken");
    }

    #[test]
    fn a_sources_own_pod_is_held_until_taken_back() {
        let runner = RunnerPods::default();
        let mut theirs = ObjectSet::default();
        let pod: Pod = serde_json::from_str(POD).unwrap();
        theirs.pods.insert("ci/job".into(), Arc::new(pod));
        assert_eq!(runner.admit(POD, &theirs), Ok("u-1".to_string()));
        let mut set = theirs.clone();
        runner.overlay(&mut set);
        assert_eq!(set.pods.len(), 1);
        assert!(set.problems.is_empty(), "held silently while the source has it: {:?}", set.problems);
        let mut dropped = ObjectSet::default();
        runner.overlay(&mut dropped);
        assert_eq!(dropped.pods.keys().collect::<Vec<_>>(), ["ci/job"], "kept once the source drops it");
        assert!(runner.release("u-1"));
        let mut after = ObjectSet::default();
        runner.overlay(&mut after);
        assert!(after.pods.is_empty());
    }

    #[test]
    fn a_pod_being_deleted_that_the_runner_finished_loses_its_volumes() {
        let runner = RunnerPods::default();
        let pod: Pod = serde_json::from_str(POD).unwrap();
        let mut deleting = pod.clone();
        deleting.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
        ));
        let set_with = |p: &Pod| {
            let mut set = ObjectSet::default();
            set.pods.insert("ci/job".into(), Arc::new(p.clone()));
            set
        };
        // (case, the source's pod, released by the runner, kept)
        let cases = [
            ("being deleted, not finished: kept", &deleting, false, true),
            ("being deleted and finished: its volumes go", &deleting, true, false),
            ("finished but not being deleted: kept", &pod, true, true),
        ];
        for (name, source, released, kept) in cases {
            let runner = RunnerPods::default();
            if released {
                runner.release("u-1");
            }
            let mut set = set_with(source);
            runner.overlay(&mut set);
            assert_eq!(set.pods.contains_key("ci/job"), kept, "{name}");
        }
        // Forgotten once no source has the uid.
        runner.release("u-1");
        runner.overlay(&mut ObjectSet::default());
        let mut set = set_with(&deleting);
        runner.overlay(&mut set);
        assert!(set.pods.contains_key("ci/job"), "a forgotten uid holds nothing back");
    }
}
