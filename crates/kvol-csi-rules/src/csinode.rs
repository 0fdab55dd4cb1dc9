//! What the kubelet records about a registered CSI driver: this node's CSINode entry, the Node's node-ID annotation and topology labels, and the migration annotation.
//!
//! Pure edits of the objects; reading and writing them (in memory or through the API server)
//! is the caller's. Callers can skip a write when the result equals what they read, as upstream
//! skips an unchanged update.

use std::collections::BTreeMap;

use k8s_openapi::api::storage::v1::{CSINode, CSINodeDriver, CSINodeSpec, VolumeNodeResources};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use kvol_api::keys::ANN_MIGRATED_PLUGINS;

/// The Node annotation holding a JSON map from CSI driver name to the node ID that driver
/// reported (`{"hostpath.csi.k8s.io":"node-1"}`).
pub const ANN_NODE_ID: &str = "csi.volume.kubernetes.io/nodeid";

/// A new CSINode for node `node_name`: no drivers, and the migration annotation for
/// `migrated_plugins` (the in-tree plugin names whose migration is on in this kubelet).
pub fn initial_csinode(node_name: &str, migrated_plugins: &[&str]) -> CSINode {
    let mut csinode = CSINode {
        metadata: ObjectMeta { name: Some(node_name.to_string()), ..ObjectMeta::default() },
        spec: CSINodeSpec { drivers: Vec::new() },
        ..CSINode::default()
    };
    set_migrated_plugins(&mut csinode, migrated_plugins);
    csinode
}

/// Makes the Node `node_name` (with `node_uid`) the owner of `csinode`, as upstream does when
/// it creates the object, so that deleting the Node deletes its CSINode. Cluster mode only:
/// standalone nodes have no uid.
pub fn set_node_owner(csinode: &mut CSINode, node_name: &str, node_uid: &str) {
    csinode.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "v1".to_string(),
        kind: "Node".to_string(),
        name: node_name.to_string(),
        uid: node_uid.to_string(),
        ..OwnerReference::default()
    }]);
}

/// Sets the migration annotation to the sorted, comma-joined `migrated_plugins`, or removes it
/// when there are none. Returns whether the set of names changed (upstream compares sets, so a
/// reordered annotation is left as it is).
pub fn set_migrated_plugins(csinode: &mut CSINode, migrated_plugins: &[&str]) -> bool {
    let mut wanted: Vec<&str> = migrated_plugins.iter().copied().filter(|p| !p.is_empty()).collect();
    wanted.sort_unstable();
    wanted.dedup();
    let had_annotations = csinode.metadata.annotations.is_some();
    let annotations = csinode.metadata.annotations.get_or_insert_with(BTreeMap::new);
    let mut current: Vec<&str> = annotations
        .get(ANN_MIGRATED_PLUGINS)
        .map(|v| v.split(',').filter(|p| !p.is_empty()).collect())
        .unwrap_or_default();
    current.sort_unstable();
    current.dedup();
    let changed = current != wanted;
    if changed {
        if wanted.is_empty() {
            annotations.remove(ANN_MIGRATED_PLUGINS);
        } else {
            annotations.insert(ANN_MIGRATED_PLUGINS.to_string(), wanted.join(","));
        }
    }
    if annotations.is_empty() && (changed || !had_annotations) {
        csinode.metadata.annotations = None;
    }
    changed
}

/// Records driver `driver` in the CSINode of node `node_name` (a new one when `csinode` is
/// `None`): its entry is replaced by `{name, nodeID, topologyKeys (sorted), allocatable}` and
/// moved last, other drivers are kept, and the migration annotation is brought up to date.
///
/// `max_volumes` is the driver's `max_volumes_per_node`: above 0 it becomes the allocatable
/// count (clamped to `i32::MAX`); 0 (unbounded) and negative values leave it unset.
pub fn install_driver<K: AsRef<str>>(
    csinode: Option<CSINode>,
    node_name: &str,
    driver: &str,
    node_id: &str,
    topology_keys: impl IntoIterator<Item = K>,
    max_volumes: i64,
    migrated_plugins: &[&str],
) -> Result<CSINode, String> {
    if node_id.is_empty() {
        return Err(format!(
            "csi driver {driver}: cannot record it on node {node_name}: it reported an empty node id"
        ));
    }
    let mut csinode = csinode.unwrap_or_else(|| initial_csinode(node_name, migrated_plugins));
    set_migrated_plugins(&mut csinode, migrated_plugins);
    let mut keys: Vec<String> = topology_keys.into_iter().map(|k| k.as_ref().to_string()).collect();
    keys.sort_unstable();
    keys.dedup();
    let allocatable = (max_volumes > 0)
        .then(|| VolumeNodeResources { count: Some(i32::try_from(max_volumes).unwrap_or(i32::MAX)) });
    if max_volumes < 0 {
        tracing::warn!(
            driver,
            max_volumes,
            "csi driver reported a negative volume limit; recording no limit"
        );
    }
    let entry = CSINodeDriver {
        name: driver.to_string(),
        node_id: node_id.to_string(),
        topology_keys: (!keys.is_empty()).then_some(keys),
        allocatable,
    };
    let drivers = &mut csinode.spec.drivers;
    match drivers.iter().position(|d| d.name == driver) {
        // Unchanged: keep its place so that an idempotent install leaves the object equal.
        Some(i) if same_entry(&drivers[i], &entry) => {}
        Some(i) => {
            drivers.remove(i);
            drivers.push(entry);
        }
        None => drivers.push(entry),
    }
    Ok(csinode)
}

/// Whether two entries of one driver carry the same information (topology keys as sets, an
/// empty allocatable as none), as upstream decides whether an update is needed.
fn same_entry(a: &CSINodeDriver, b: &CSINodeDriver) -> bool {
    let keys = |d: &CSINodeDriver| {
        let mut k = d.topology_keys.clone().unwrap_or_default();
        k.sort_unstable();
        k.dedup();
        k
    };
    let count = |d: &CSINodeDriver| d.allocatable.as_ref().and_then(|a| a.count);
    a.node_id == b.node_id && keys(a) == keys(b) && count(a) == count(b)
}

/// Removes driver `driver` from the CSINode. The object stays, even with no drivers left.
pub fn uninstall_driver(mut csinode: CSINode, driver: &str) -> CSINode {
    csinode.spec.drivers.retain(|d| d.name != driver);
    csinode
}

/// The Node's node-ID annotation after driver `driver` reported `node_id`: `existing` (the
/// current value, if any) with the driver's entry added or replaced. Fails when `existing` is
/// not a JSON map of strings.
pub fn node_id_annotation_set(existing: Option<&str>, driver: &str, node_id: &str) -> Result<String, String> {
    let mut map = parse_node_ids(existing)?;
    if map.get(driver).is_some_and(|v| v == node_id)
        && let Some(existing) = existing
    {
        return Ok(existing.to_string());
    }
    map.insert(driver.to_string(), node_id.to_string());
    Ok(go_json(&map))
}

/// The Node's node-ID annotation without driver `driver`: `None` when no entry is left (the
/// annotation is removed), the unchanged value when the driver had none. Fails when `existing`
/// is not a JSON map of strings.
pub fn node_id_annotation_remove(existing: Option<&str>, driver: &str) -> Result<Option<String>, String> {
    let Some(value) = existing.filter(|v| !v.is_empty()) else { return Ok(None) };
    let mut map = parse_node_ids(existing)?;
    if map.remove(driver).is_none() {
        return Ok(Some(value.to_string()));
    }
    Ok((!map.is_empty()).then(|| go_json(&map)))
}

fn parse_node_ids(existing: Option<&str>) -> Result<BTreeMap<String, String>, String> {
    match existing.filter(|v| !v.is_empty()) {
        None => Ok(BTreeMap::new()),
        // JSON `null` is an empty map, as Go's decoder reads it.
        Some(v) => serde_json::from_str::<Option<BTreeMap<String, String>>>(v)
            .map(Option::unwrap_or_default)
            .map_err(|e| format!("cannot parse the node annotation {ANN_NODE_ID} ({v:?}): {e}")),
    }
}

/// `map` as Go's `json.Marshal` writes it: keys sorted, no spaces, and `<`, `>`, `&`, U+2028
/// and U+2029 escaped. (Those characters only occur inside strings, so replacing them in the
/// output escapes exactly them.)
fn go_json(map: &BTreeMap<String, String>) -> String {
    let plain = serde_json::to_string(map).unwrap_or_else(|_| "{}".to_string());
    let mut out = String::with_capacity(plain.len());
    for c in plain.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out
}

/// The Node's labels after adding the topology `segments` a driver reported. Fails, naming the
/// key, when a label already exists with a different value (upstream's topology collision).
pub fn topology_labels<K: AsRef<str>, V: AsRef<str>>(
    existing: Option<&BTreeMap<String, String>>,
    segments: impl IntoIterator<Item = (K, V)>,
) -> Result<BTreeMap<String, String>, String> {
    let mut labels = existing.cloned().unwrap_or_default();
    let mut segments: Vec<(String, String)> =
        segments.into_iter().map(|(k, v)| (k.as_ref().to_string(), v.as_ref().to_string())).collect();
    // Sorted, so that the collision reported is always the same one.
    segments.sort();
    for (key, value) in &segments {
        if let Some(current) = labels.get(key)
            && current != value
        {
            return Err(format!(
                "topology collision on label {key}: the driver reports {value:?} but the node has {current:?}"
            ));
        }
    }
    labels.extend(segments);
    Ok(labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALL: &[&str] = &["kubernetes.io/aws-ebs", "kubernetes.io/gce-pd"];

    fn driver(name: &str, node_id: &str, keys: &[&str], count: Option<i32>) -> CSINodeDriver {
        CSINodeDriver {
            name: name.to_string(),
            node_id: node_id.to_string(),
            topology_keys: (!keys.is_empty()).then(|| keys.iter().map(|k| k.to_string()).collect()),
            allocatable: count.map(|c| VolumeNodeResources { count: Some(c) }),
        }
    }

    fn csinode(drivers: Vec<CSINodeDriver>, migrated: Option<&str>) -> CSINode {
        CSINode {
            metadata: ObjectMeta {
                name: Some("node-1".to_string()),
                annotations: migrated
                    .map(|m| BTreeMap::from([(ANN_MIGRATED_PLUGINS.to_string(), m.to_string())])),
                ..ObjectMeta::default()
            },
            spec: CSINodeSpec { drivers },
            ..CSINode::default()
        }
    }

    #[test]
    fn initial_csinode_carries_the_annotation() {
        let cases: &[(&[&str], Option<&str>)] = &[
            (&[], None),
            (
                &["kubernetes.io/gce-pd", "kubernetes.io/aws-ebs"],
                Some("kubernetes.io/aws-ebs,kubernetes.io/gce-pd"),
            ),
            (&["kubernetes.io/cinder", "kubernetes.io/cinder"], Some("kubernetes.io/cinder")),
        ];
        for (migrated, want) in cases {
            let got = initial_csinode("node-1", migrated);
            assert_eq!(got, csinode(vec![], *want), "{migrated:?}");
        }
    }

    #[test]
    fn install_driver_cases() {
        struct Case {
            name: &'static str,
            before: Option<CSINode>,
            driver: &'static str,
            node_id: &'static str,
            keys: &'static [&'static str],
            max_volumes: i64,
            migrated: &'static [&'static str],
            want: Result<CSINode, &'static str>,
        }
        let cases = vec![
            Case {
                name: "new csinode",
                before: None,
                driver: "d1",
                node_id: "n1",
                keys: &["zone", "region"],
                max_volumes: 10,
                migrated: ALL,
                want: Ok(csinode(
                    vec![driver("d1", "n1", &["region", "zone"], Some(10))],
                    Some("kubernetes.io/aws-ebs,kubernetes.io/gce-pd"),
                )),
            },
            Case {
                name: "zero volumes means no allocatable; no topology means no keys",
                before: Some(csinode(vec![], None)),
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: 0,
                migrated: &[],
                want: Ok(csinode(vec![driver("d1", "n1", &[], None)], None)),
            },
            Case {
                name: "negative volumes are not recorded",
                before: None,
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: -5,
                migrated: &[],
                want: Ok(csinode(vec![driver("d1", "n1", &[], None)], None)),
            },
            Case {
                name: "limit clamped to i32::MAX",
                before: None,
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: i64::from(i32::MAX) + 1,
                migrated: &[],
                want: Ok(csinode(vec![driver("d1", "n1", &[], Some(i32::MAX))], None)),
            },
            Case {
                name: "limit of exactly i32::MAX kept",
                before: None,
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: i64::from(i32::MAX),
                migrated: &[],
                want: Ok(csinode(vec![driver("d1", "n1", &[], Some(i32::MAX))], None)),
            },
            Case {
                name: "other drivers kept, this one replaced and moved last",
                before: Some(csinode(
                    vec![driver("d1", "old", &["zone"], Some(3)), driver("d2", "n2", &[], None)],
                    None,
                )),
                driver: "d1",
                node_id: "new",
                keys: &["zone"],
                max_volumes: 3,
                migrated: &[],
                want: Ok(csinode(
                    vec![driver("d2", "n2", &[], None), driver("d1", "new", &["zone"], Some(3))],
                    None,
                )),
            },
            Case {
                name: "unchanged entry keeps its place",
                before: Some(csinode(
                    vec![driver("d1", "n1", &["b", "a"], Some(3)), driver("d2", "n2", &[], None)],
                    None,
                )),
                driver: "d1",
                node_id: "n1",
                keys: &["a", "b"],
                max_volumes: 3,
                migrated: &[],
                want: Ok(csinode(
                    vec![driver("d1", "n1", &["b", "a"], Some(3)), driver("d2", "n2", &[], None)],
                    None,
                )),
            },
            Case {
                name: "a changed limit replaces the entry",
                before: Some(csinode(
                    vec![driver("d1", "n1", &[], Some(3)), driver("d2", "n2", &[], None)],
                    None,
                )),
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: 0,
                migrated: &[],
                want: Ok(csinode(vec![driver("d2", "n2", &[], None), driver("d1", "n1", &[], None)], None)),
            },
            Case {
                name: "annotation removed when nothing is migrated",
                before: Some(csinode(vec![], Some("kubernetes.io/aws-ebs"))),
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: 0,
                migrated: &[],
                want: Ok(csinode(vec![driver("d1", "n1", &[], None)], None)),
            },
            Case {
                name: "annotation updated",
                before: Some(csinode(vec![], Some("kubernetes.io/aws-ebs"))),
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: 0,
                migrated: &["kubernetes.io/gce-pd", "kubernetes.io/aws-ebs"],
                want: Ok(csinode(
                    vec![driver("d1", "n1", &[], None)],
                    Some("kubernetes.io/aws-ebs,kubernetes.io/gce-pd"),
                )),
            },
            Case {
                name: "an annotation with the same set in another order is left alone",
                before: Some(csinode(vec![], Some("kubernetes.io/gce-pd,kubernetes.io/aws-ebs"))),
                driver: "d1",
                node_id: "n1",
                keys: &[],
                max_volumes: 0,
                migrated: ALL,
                want: Ok(csinode(
                    vec![driver("d1", "n1", &[], None)],
                    Some("kubernetes.io/gce-pd,kubernetes.io/aws-ebs"),
                )),
            },
            Case {
                name: "empty node id",
                before: None,
                driver: "d1",
                node_id: "",
                keys: &[],
                max_volumes: 0,
                migrated: &[],
                want: Err("empty node id"),
            },
        ];
        for c in cases {
            let got =
                install_driver(c.before, "node-1", c.driver, c.node_id, c.keys, c.max_volumes, c.migrated);
            match (got, c.want) {
                (Ok(got), Ok(want)) => assert_eq!(got, want, "{}", c.name),
                (Err(e), Err(needle)) => {
                    assert!(e.contains(needle) && e.contains(c.driver), "{}: {e:?}", c.name)
                }
                (got, want) => panic!("{}: got {got:?}, want {want:?}", c.name),
            }
        }
    }

    #[test]
    fn uninstall_driver_cases() {
        let cases = [
            (
                "removes only that driver",
                csinode(vec![driver("d1", "n1", &[], None), driver("d2", "n2", &[], None)], Some("x")),
                "d1",
                csinode(vec![driver("d2", "n2", &[], None)], Some("x")),
            ),
            (
                "keeps an empty csinode",
                csinode(vec![driver("d1", "n1", &[], None)], None),
                "d1",
                csinode(vec![], None),
            ),
            (
                "unknown driver changes nothing",
                csinode(vec![driver("d1", "n1", &[], None)], None),
                "d9",
                csinode(vec![driver("d1", "n1", &[], None)], None),
            ),
        ];
        for (name, before, drv, want) in cases {
            assert_eq!(uninstall_driver(before, drv), want, "{name}");
        }
    }

    #[test]
    fn set_node_owner_points_at_the_node() {
        let mut c = initial_csinode("node-1", &[]);
        set_node_owner(&mut c, "node-1", "uid-1");
        let owner = &c.metadata.owner_references.unwrap()[0];
        assert_eq!(
            (owner.api_version.as_str(), owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("v1", "Node", "node-1", "uid-1")
        );
    }

    /// The annotation before, the driver, its node id, and the annotation after (or a piece
    /// of the error).
    type SetCase = (Option<&'static str>, &'static str, &'static str, Result<&'static str, &'static str>);

    #[test]
    fn node_id_annotation_set_cases() {
        let cases: &[SetCase] = &[
            (None, "d1", "n1", Ok(r#"{"d1":"n1"}"#)),
            (Some(""), "d1", "n1", Ok(r#"{"d1":"n1"}"#)),
            (Some("null"), "d1", "n1", Ok(r#"{"d1":"n1"}"#)),
            (Some(r#"{"d2":"n2"}"#), "d1", "n1", Ok(r#"{"d1":"n1","d2":"n2"}"#)),
            (Some(r#"{"d1":"old","d2":"n2"}"#), "d1", "n1", Ok(r#"{"d1":"n1","d2":"n2"}"#)),
            // Already right: the value is left byte for byte.
            (Some(r#"{ "d2": "n2", "d1": "n1" }"#), "d1", "n1", Ok(r#"{ "d2": "n2", "d1": "n1" }"#)),
            // Go's escaping, and JSON inside a node id.
            (None, "d1", "a<b>&c", Ok(r#"{"d1":"a\u003cb\u003e\u0026c"}"#)),
            (None, "d1", r#"{"HostName":"x"}"#, Ok(r#"{"d1":"{\"HostName\":\"x\"}"}"#)),
            (Some("not json"), "d1", "n1", Err(ANN_NODE_ID)),
            (Some(r#"{"d2":3}"#), "d1", "n1", Err(ANN_NODE_ID)),
            (Some(r#"["d2"]"#), "d1", "n1", Err(ANN_NODE_ID)),
        ];
        for (existing, drv, id, want) in cases {
            let got = node_id_annotation_set(*existing, drv, id);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, *w, "{existing:?}"),
                (Err(e), Err(needle)) => assert!(e.contains(needle), "{existing:?}: {e:?}"),
                (g, w) => panic!("{existing:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    /// The annotation before, the driver, and the annotation after (or a piece of the error).
    type RemoveCase = (Option<&'static str>, &'static str, Result<Option<&'static str>, &'static str>);

    #[test]
    fn node_id_annotation_remove_cases() {
        let cases: &[RemoveCase] = &[
            (None, "d1", Ok(None)),
            (Some(""), "d1", Ok(None)),
            (Some(r#"{"d1":"n1"}"#), "d1", Ok(None)),
            (Some(r#"{"d1":"n1","d2":"n2"}"#), "d1", Ok(Some(r#"{"d2":"n2"}"#))),
            (Some(r#"{ "d2": "n2" }"#), "d1", Ok(Some(r#"{ "d2": "n2" }"#))),
            (Some(r#"{"d1":"n1","d2":"a&b"}"#), "d1", Ok(Some(r#"{"d2":"a\u0026b"}"#))),
            (Some("{broken"), "d1", Err(ANN_NODE_ID)),
        ];
        for (existing, drv, want) in cases {
            let got = node_id_annotation_remove(*existing, drv);
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g.as_deref(), *w, "{existing:?}"),
                (Err(e), Err(needle)) => assert!(e.contains(needle), "{existing:?}: {e:?}"),
                (g, w) => panic!("{existing:?}: got {g:?}, want {w:?}"),
            }
        }
    }

    #[test]
    fn topology_labels_cases() {
        type Labels = &'static [(&'static str, &'static str)];
        let cases: &[(Option<Labels>, Labels, Result<Labels, &str>)] = &[
            (None, &[], Ok(&[])),
            (None, &[("zone", "a")], Ok(&[("zone", "a")])),
            (Some(&[("os", "linux")]), &[("zone", "a")], Ok(&[("os", "linux"), ("zone", "a")])),
            // Same value again is fine.
            (Some(&[("zone", "a")]), &[("zone", "a"), ("rack", "1")], Ok(&[("rack", "1"), ("zone", "a")])),
            (Some(&[("zone", "a")]), &[("rack", "1"), ("zone", "b")], Err("label zone")),
            (Some(&[("zone", "")]), &[("zone", "a")], Err("label zone")),
        ];
        let map =
            |l: Labels| l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>();
        for (existing, segments, want) in cases {
            let existing = existing.map(map);
            let got = topology_labels(existing.as_ref(), segments.iter().copied());
            match (got, want) {
                (Ok(g), Ok(w)) => assert_eq!(g, map(w), "{segments:?}"),
                (Err(e), Err(needle)) => assert!(e.contains(needle), "{segments:?}: {e:?}"),
                (g, w) => panic!("{segments:?}: got {g:?}, want {w:?}"),
            }
        }
    }
}
