//! Two sources as one: the API's objects with a manifests directory's static pods (and the objects they need) beside them — the static pods named and marked as kubelet's, the API's mirror pods of them left out (they are never run).

use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Pod;
use kvol_node::model::ObjectSet;
use kvol_node::sources::ObjectSource;
use tokio::sync::watch;

use crate::mirror_pods;

/// `primary`'s objects but its mirror pods, with `secondary`'s added where `primary` has no
/// object of that kind and key, its pods as `node`'s static pods; the problems of both.
pub fn merge(primary: &ObjectSet, secondary: &ObjectSet, node: &str) -> ObjectSet {
    fn add<V: Clone>(into: &mut BTreeMap<String, V>, from: &BTreeMap<String, V>) {
        for (key, value) in from {
            into.entry(key.clone()).or_insert_with(|| value.clone());
        }
    }
    let mut set = primary.clone();
    set.pods.retain(|_, p| !mirror_pods::is_mirror(p));
    let statics: BTreeMap<String, Arc<Pod>> = secondary
        .pods
        .values()
        .map(|p| {
            let made = mirror_pods::as_static(p, node);
            let key = format!(
                "{}/{}",
                made.metadata.namespace.as_deref().unwrap_or("default"),
                made.metadata.name.as_deref().unwrap_or("")
            );
            (key, Arc::new(made))
        })
        .collect();
    add(&mut set.pods, &statics);
    add(&mut set.persistent_volumes, &secondary.persistent_volumes);
    add(&mut set.claims, &secondary.claims);
    add(&mut set.storage_classes, &secondary.storage_classes);
    add(&mut set.csi_drivers, &secondary.csi_drivers);
    add(&mut set.secrets, &secondary.secrets);
    add(&mut set.config_maps, &secondary.config_maps);
    set.problems.extend(secondary.problems.iter().cloned());
    set
}

/// An [`ObjectSource`] whose sets are [`merge`] of two sources' current sets.
pub struct MergedSource {
    sets: Arc<watch::Sender<Arc<ObjectSet>>>,
    task: tokio::task::JoinHandle<()>,
    parts: Vec<Box<dyn ObjectSource>>,
}

impl std::fmt::Debug for MergedSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MergedSource").field("current", &self.sets.borrow()).finish_non_exhaustive()
    }
}

impl MergedSource {
    /// Merges `primary` and `secondary` (the static pods of `node`) now and whenever either
    /// changes.
    pub fn start(
        primary: Box<dyn ObjectSource>,
        secondary: Box<dyn ObjectSource>,
        node: String,
    ) -> MergedSource {
        let mut a = primary.subscribe();
        let mut b = secondary.subscribe();
        let first = merge(&a.borrow_and_update(), &b.borrow_and_update(), &node);
        let sets = Arc::new(watch::channel(Arc::new(first)).0);
        let out = Arc::clone(&sets);
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    changed = a.changed() => if changed.is_err() { break },
                    changed = b.changed() => if changed.is_err() { break },
                }
                let set = merge(&a.borrow_and_update(), &b.borrow_and_update(), &node);
                out.send_replace(Arc::new(set));
            }
        });
        MergedSource { sets, task, parts: vec![primary, secondary] }
    }
}

impl ObjectSource for MergedSource {
    fn current(&self) -> Arc<ObjectSet> {
        Arc::clone(&self.sets.borrow())
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ObjectSet>> {
        self.sets.subscribe()
    }

    fn shutdown(self: Box<Self>) {
        self.task.abort();
        for part in self.parts {
            part.shutdown();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::Pod;
    use kvol_node::model::SourceProblem;
    use kvol_node::sources::ChannelSource;

    fn pod(name: &str, uid: &str) -> Pod {
        serde_json::from_value(
            serde_json::json!({"metadata": {"name": name, "namespace": "default", "uid": uid}}),
        )
        .unwrap()
    }

    fn set(pods: &[(&str, &str)], problem: Option<&str>) -> ObjectSet {
        let mut set = ObjectSet::default();
        for (name, uid) in pods {
            set.pods.insert(format!("default/{name}"), pod(name, uid).into());
        }
        set.problems.extend(problem.map(|p| SourceProblem {
            origin: p.into(),
            document: None,
            reason: "bad".into(),
        }));
        set
    }

    #[test]
    fn the_primary_wins_a_key_both_have_and_both_add_the_rest() {
        type Pods<'a> = &'a [(&'a str, &'a str)];
        // (the API's pods, the directory's, the merged pods' keys and uids); the directory's
        // are the node's static pods, `<name>-<node>`.
        let cases: &[(Pods, Pods, Pods)] = &[
            (&[], &[], &[]),
            (&[("a", "1")], &[], &[("default/a", "1")]),
            (&[], &[("s", "9")], &[("default/s-n1", "9")]),
            (
                &[("a", "1")],
                &[("a", "2"), ("s", "9")],
                &[("default/a", "1"), ("default/a-n1", "2"), ("default/s-n1", "9")],
            ),
            (&[("a-n1", "1")], &[("a", "2")], &[("default/a-n1", "1")]),
        ];
        for (primary, secondary, want) in cases {
            let merged = merge(&set(primary, None), &set(secondary, None), "n1");
            let got: Vec<(&str, &str)> = merged
                .pods
                .iter()
                .map(|(k, p)| (k.as_str(), p.metadata.uid.as_deref().unwrap_or("")))
                .collect();
            assert_eq!(got, *want, "{primary:?} + {secondary:?}");
        }
        let mut with_mirror = set(&[("a", "1"), ("m-n1", "2")], None);
        let mirror = Arc::make_mut(with_mirror.pods.get_mut("default/m-n1").unwrap());
        mirror.metadata.annotations =
            Some([(mirror_pods::CONFIG_MIRROR.to_string(), "9".to_string())].into());
        let merged = merge(&with_mirror, &set(&[("m", "9")], None), "n1");
        let statics: Vec<bool> = merged.pods.values().map(|p| mirror_pods::is_static(p)).collect();
        assert_eq!(
            merged.pods.keys().collect::<Vec<_>>(),
            ["default/a", "default/m-n1"],
            "the mirror left out"
        );
        assert_eq!(statics, [false, true], "the static pod in its place");
        let merged = merge(&set(&[], Some("api")), &set(&[], Some("a.yaml")), "n1");
        let origins: Vec<&str> = merged.problems.iter().map(|p| p.origin.as_str()).collect();
        assert_eq!(origins, ["api", "a.yaml"]);
    }

    #[test]
    fn config_maps_and_secrets_merge_as_pods_do() {
        use k8s_openapi::api::core::v1::{ConfigMap, Secret};
        let config_map = |value: &str| ConfigMap {
            data: Some([("k".to_string(), value.to_string())].into()),
            ..ConfigMap::default()
        };
        let mut api = ObjectSet::default();
        api.config_maps.insert("default/both".into(), config_map("api"));
        api.secrets.insert("default/s".into(), Secret::default());
        let mut dir = ObjectSet::default();
        dir.config_maps.insert("default/both".into(), config_map("dir"));
        dir.config_maps.insert("kube-system/static".into(), config_map("dir"));
        let merged = merge(&api, &dir, "n1");
        assert_eq!(merged.config_maps.keys().collect::<Vec<_>>(), ["default/both", "kube-system/static"]);
        assert_eq!(merged.config_maps["default/both"], config_map("api"));
        assert_eq!(merged.secrets.keys().collect::<Vec<_>>(), ["default/s"]);
    }

    #[tokio::test]
    async fn a_change_in_either_source_is_merged_and_sent() {
        let api = ChannelSource::new(set(&[("a", "1")], None));
        let dir = ChannelSource::new(ObjectSet::default());
        let merged = MergedSource::start(Box::new(api.clone()), Box::new(dir.clone()), "n1".into());
        let mut rx = merged.subscribe();
        assert_eq!(merged.current().pods.len(), 1);
        dir.send(set(&[("static", "s")], None));
        rx.changed().await.unwrap();
        assert_eq!(
            rx.borrow_and_update().pods.keys().collect::<Vec<_>>(),
            ["default/a", "default/static-n1"]
        );
        api.send(ObjectSet::default());
        rx.changed().await.unwrap();
        assert_eq!(rx.borrow_and_update().pods.keys().collect::<Vec<_>>(), ["default/static-n1"]);
        Box::new(merged).shutdown();
    }
}
