//! The pods a runner hands kvol over the runtime API: a third object source beside the manifests directory and the API server, laid over their set.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use k8s_openapi::api::core::v1::Pod;
use tokio::sync::watch;

use crate::model::ObjectSet;

/// The runner's pods by uid, and a version that moves at every change (the loop wakes on it).
#[derive(Debug)]
pub struct RunnerPods {
    pods: Mutex<BTreeMap<String, Arc<Pod>>>,
    version: watch::Sender<u64>,
}

impl Default for RunnerPods {
    fn default() -> RunnerPods {
        RunnerPods { pods: Mutex::new(BTreeMap::new()), version: watch::channel(0).0 }
    }
}

impl RunnerPods {
    /// Takes `text` (a v1 Pod as JSON or YAML) as a runner's pod, checked and completed as a
    /// manifest's is; refused when `current` (the other sources' set) or the runner already has
    /// a pod of that namespace/name or uid. Returns its uid.
    pub fn admit(&self, text: &str, current: &ObjectSet) -> Result<String, Refused> {
        let (objects, problems) = crate::sources::parse::parse_manifests("runtime api", text);
        if let Some(problem) = problems.first() {
            return Err(Refused::Invalid(problem.reason.clone()));
        }
        let pod = match objects.as_slice() {
            [crate::sources::parse::Object::Pod(pod)] => Arc::clone(pod),
            [other] => return Err(Refused::Invalid(format!("{other} is not a Pod"))),
            _ => return Err(Refused::Invalid(format!("want one Pod, got {} objects", objects.len()))),
        };
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        let key = key_of(&pod);
        let mut pods = self.lock();
        let clash =
            current.pods.iter().find(|(k, p)| **k == key || p.metadata.uid.as_deref() == Some(uid.as_str()));
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
        pods.insert(uid.clone(), pod);
        drop(pods);
        self.version.send_modify(|v| *v += 1);
        Ok(uid)
    }

    /// Takes a runner's pod back; `false` when the runner has no pod of that uid.
    pub fn release(&self, uid: &str) -> bool {
        let removed = self.lock().remove(uid).is_some();
        if removed {
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
    /// namespace/name stays the source's, with a problem saying so.
    pub fn overlay(&self, set: &mut ObjectSet) {
        for pod in self.lock().values() {
            let key = key_of(pod);
            if set.pods.contains_key(&key) {
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
    fn bad_pods_and_other_sources_pods_are_refused_with_the_reason() {
        let runner = RunnerPods::default();
        let mut theirs = ObjectSet::default();
        let pod: Pod = serde_json::from_str(POD).unwrap();
        theirs.pods.insert("ci/job".into(), Arc::new(pod));
        assert!(
            matches!(runner.admit(POD, &theirs), Err(Refused::Exists(m)) if m.contains("another source's"))
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
}
