//! Zone and region topology shared by the plugins: PV node affinity, PV labels, allowed topologies.
//!
//! These follow upstream's `in_tree_volume.go` rules exactly, including their quirks: an
//! in-tree key is renamed in place (never merged with an existing CSI key), zones taken from a
//! label are trimmed, de-duplicated and sorted, and existing labels are never overwritten.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{
    NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, PersistentVolume,
    TopologySelectorLabelRequirement, TopologySelectorTerm, VolumeNodeAffinity,
};
use kvol_api::keys::{
    LABEL_FAILURE_DOMAIN_BETA_REGION, LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_MULTI_ZONE_DELIMITER,
    LABEL_TOPOLOGY_REGION, LABEL_TOPOLOGY_ZONE,
};

/// Derives one region from the zones of one node-selector term.
pub(crate) type RegionParser = fn(&[String]) -> Result<String, String>;

fn terms(pv: &PersistentVolume) -> Option<&Vec<NodeSelectorTerm>> {
    let terms = &pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref()?.node_selector_terms;
    (!terms.is_empty()).then_some(terms)
}

fn terms_mut(pv: &mut PersistentVolume) -> Option<&mut Vec<NodeSelectorTerm>> {
    let terms = &mut pv.spec.as_mut()?.node_affinity.as_mut()?.required.as_mut()?.node_selector_terms;
    (!terms.is_empty()).then_some(terms)
}

/// Whether any node-selector term of the affinity has a match expression with `key`.
pub(crate) fn topology_key_exists(key: &str, affinity: Option<&VolumeNodeAffinity>) -> bool {
    let Some(required) = affinity.and_then(|a| a.required.as_ref()) else { return false };
    required
        .node_selector_terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .any(|r| r.key == key)
}

/// Renames every match expression key `old` to `new`, in place; values and order are kept.
pub(crate) fn replace_topology_key(pv: &mut PersistentVolume, old: &str, new: &str) {
    let Some(terms) = terms_mut(pv) else { return };
    for req in terms.iter_mut().flat_map(|t| t.match_expressions.iter_mut().flatten()) {
        if req.key == old {
            req.key = new.to_string();
        }
    }
}

/// All distinct values of match expressions with `key`, across terms, sorted.
pub(crate) fn topology_values(pv: &PersistentVolume, key: &str) -> Vec<String> {
    let Some(terms) = terms(pv) else { return Vec::new() };
    let values: BTreeSet<&String> = terms
        .iter()
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|r| r.key == key)
        .flat_map(|r| r.values.iter().flatten())
        .collect();
    values.into_iter().cloned().collect()
}

/// Whether any match expression with `key` has a value: `!topology_values(..).is_empty()`
/// without collecting.
pub(crate) fn has_topology_values(pv: &PersistentVolume, key: &str) -> bool {
    terms(pv).is_some_and(|terms| {
        terms
            .iter()
            .flat_map(|t| t.match_expressions.iter().flatten())
            .any(|r| r.key == key && r.values.as_ref().is_some_and(|v| !v.is_empty()))
    })
}

/// Appends `key In zones` (trimmed, non-empty, distinct, sorted) to every term, creating one
/// term when there is none. Does nothing when no zone is left after filtering.
pub(crate) fn add_topology<S: AsRef<str>>(pv: &mut PersistentVolume, key: &str, zones: &[S]) -> bool {
    let zones: BTreeSet<&str> = zones.iter().map(|z| z.as_ref().trim()).filter(|z| !z.is_empty()).collect();
    if zones.is_empty() {
        return false;
    }
    let requirement = NodeSelectorRequirement {
        key: key.to_string(),
        operator: "In".to_string(),
        values: Some(zones.into_iter().map(str::to_string).collect()),
    };
    let spec = pv.spec.get_or_insert_with(Default::default);
    let required = spec
        .node_affinity
        .get_or_insert_with(Default::default)
        .required
        .get_or_insert_with(NodeSelector::default);
    if required.node_selector_terms.is_empty() {
        required.node_selector_terms.push(NodeSelectorTerm::default());
    }
    for term in &mut required.node_selector_terms {
        term.match_expressions.get_or_insert_with(Vec::new).push(requirement.clone());
    }
    true
}

/// The zone and region label family a PV uses: GA or beta, looked up in node affinity first,
/// then in labels; GA when neither says.
pub(crate) fn topology_labels(pv: &PersistentVolume) -> (&'static str, &'static str) {
    let affinity = pv.spec.as_ref().and_then(|s| s.node_affinity.as_ref());
    let has_label = |k: &str| pv.metadata.labels.as_ref().is_some_and(|l| l.contains_key(k));
    let ga = (LABEL_TOPOLOGY_ZONE, LABEL_TOPOLOGY_REGION);
    let beta = (LABEL_FAILURE_DOMAIN_BETA_ZONE, LABEL_FAILURE_DOMAIN_BETA_REGION);
    if topology_key_exists(LABEL_TOPOLOGY_ZONE, affinity) {
        ga
    } else if topology_key_exists(LABEL_FAILURE_DOMAIN_BETA_ZONE, affinity) {
        beta
    } else if has_label(LABEL_TOPOLOGY_ZONE) {
        ga
    } else if has_label(LABEL_FAILURE_DOMAIN_BETA_ZONE) {
        beta
    } else {
        ga
    }
}

/// In-tree zone topology to the CSI key: node affinity wins over the zone label; a beta
/// region key in node affinity becomes the GA one.
pub(crate) fn translate_topology_in_tree_to_csi(pv: &mut PersistentVolume, csi_zone_key: &str) {
    let (zone_label, region_label) = topology_labels(pv);
    if has_topology_values(pv, zone_label) {
        replace_topology_key(pv, zone_label, csi_zone_key);
    } else if let Some(label) = pv.metadata.labels.as_ref().and_then(|l| l.get(zone_label)) {
        let zones: Vec<String> = label.split(LABEL_MULTI_ZONE_DELIMITER).map(str::to_string).collect();
        add_topology(pv, csi_zone_key, &zones);
    }
    if region_label == LABEL_FAILURE_DOMAIN_BETA_REGION && has_topology_values(pv, region_label) {
        replace_topology_key(pv, region_label, LABEL_TOPOLOGY_REGION);
    }
}

/// CSI zone topology back to the Kubernetes zone key; region terms from `region_parser` when
/// given; zone (and a single region) labels added where absent.
pub(crate) fn translate_topology_csi_to_in_tree(
    pv: &mut PersistentVolume,
    csi_zone_key: &str,
    region_parser: Option<RegionParser>,
) -> Result<(), String> {
    let (zone_label, _) = topology_labels(pv);
    replace_topology_key(pv, csi_zone_key, zone_label);
    if let Some(parser) = region_parser {
        add_region_topology(pv, parser)
            .map_err(|e| format!("cannot derive the region from the zones: {e}"))?;
    }
    let zones = topology_values(pv, zone_label);
    if !zones.is_empty() {
        let labels = pv.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.entry(zone_label.to_string()).or_insert_with(|| zones.join(LABEL_MULTI_ZONE_DELIMITER));
    }
    Ok(())
}

/// For each term without a region requirement, adds one parsed from the term's zones; sets
/// the region label when exactly one region results and the label is absent.
fn add_region_topology(pv: &mut PersistentVolume, parser: RegionParser) -> Result<(), String> {
    let (zone_label, region_label) = topology_labels(pv);
    let Some(terms) = terms_mut(pv) else { return Ok(()) };
    for term in terms.iter_mut() {
        let mut zones = Vec::new();
        let mut has_region = false;
        for req in term.match_expressions.iter().flatten() {
            if req.key == region_label {
                has_region = true;
                break;
            } else if req.key == zone_label {
                zones.extend(req.values.iter().flatten().cloned());
            }
        }
        if has_region {
            continue;
        }
        let region = parser(&zones)?;
        term.match_expressions.get_or_insert_with(Vec::new).push(NodeSelectorRequirement {
            key: region_label.to_string(),
            operator: "In".to_string(),
            values: Some(vec![region]),
        });
    }
    let regions = topology_values(pv, region_label);
    if let [region] = regions.as_slice() {
        let labels = pv.metadata.labels.get_or_insert_with(BTreeMap::new);
        labels.entry(region_label.to_string()).or_insert_with(|| region.clone());
    }
    Ok(())
}

/// Allowed topologies with the beta or GA zone key renamed to `csi_key`; other keys unchanged.
pub(crate) fn translate_allowed_topologies(
    terms: &[TopologySelectorTerm],
    csi_key: &str,
) -> Vec<TopologySelectorTerm> {
    terms
        .iter()
        .map(|term| TopologySelectorTerm {
            // Like upstream, a term without expressions comes out with none (absent, not empty).
            match_label_expressions: term.match_label_expressions.as_ref().filter(|e| !e.is_empty()).map(
                |exprs| {
                    exprs
                        .iter()
                        .map(|e| {
                            if e.key == LABEL_FAILURE_DOMAIN_BETA_ZONE || e.key == LABEL_TOPOLOGY_ZONE {
                                TopologySelectorLabelRequirement {
                                    key: csi_key.to_string(),
                                    values: e.values.clone(),
                                }
                            } else {
                                e.clone()
                            }
                        })
                        .collect()
                },
            ),
        })
        .collect()
}

/// One allowed-topology term: `key in values`.
pub(crate) fn topology_selector(key: &str, values: Vec<String>) -> Vec<TopologySelectorTerm> {
    vec![TopologySelectorTerm {
        match_label_expressions: Some(vec![TopologySelectorLabelRequirement {
            key: key.to_string(),
            values,
        }]),
    }]
}

#[cfg(test)]
mod tests {
    //! Ports of upstream's `plugins/in_tree_volume_test.go` tables, plus a few cases of the same rules.

    use serde_json::{Value, json};

    use super::*;
    use crate::plugins::test_support::{assert_same, pv};

    const GCE_KEY: &str = "topology.gke.io/zone";
    const CINDER_KEY: &str = "topology.cinder.csi.openstack.org/zone";
    const GA_ZONE: &str = LABEL_TOPOLOGY_ZONE;
    const GA_REGION: &str = LABEL_TOPOLOGY_REGION;
    const BETA_ZONE: &str = LABEL_FAILURE_DOMAIN_BETA_ZONE;
    const BETA_REGION: &str = LABEL_FAILURE_DOMAIN_BETA_REGION;

    /// Upstream's GCE region parser, which its tests use: every zone `{locale}-{region}-{zone}`,
    /// all in one region `{locale}-{region}`.
    fn gce_region(zones: &[String]) -> Result<String, String> {
        let mut regions = BTreeSet::new();
        for zone in zones {
            let parts: Vec<&str> = zone.split('-').collect();
            let [locale, region, _] = parts.as_slice() else { return Err(format!("bad zone {zone:?}")) };
            regions.insert(format!("{locale}-{region}"));
        }
        match regions.len() {
            1 => Ok(regions.into_iter().next().unwrap_or_default()),
            _ => Err(format!("want one region, got {regions:?}")),
        }
    }

    fn req(key: &str, values: &[&str]) -> Value {
        json!({"key": key, "operator": "In", "values": values})
    }

    fn pv_with_terms(labels: Value, terms: Value) -> PersistentVolume {
        pv(json!({
            "metadata": {"name": "gcepd", "namespace": "myns", "labels": labels},
            "spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}
        }))
    }

    fn terms_of(pv: &PersistentVolume) -> Option<&Vec<NodeSelectorTerm>> {
        pv.spec.as_ref()?.node_affinity.as_ref()?.required.as_ref().map(|r| &r.node_selector_terms)
    }

    fn from_json<T: serde::de::DeserializeOwned>(v: Value) -> T {
        serde_json::from_value(v).expect("test table holds an invalid object")
    }

    #[test]
    fn translate_topology_from_csi_to_in_tree() {
        struct Case {
            name: &'static str,
            key: &'static str,
            parser: Option<RegionParser>,
            labels: Value,
            terms: Value,
            want_terms: Value,
            want_labels: Value,
            want_err: bool,
        }
        let ga_labels = json!({GA_ZONE: "us-east1-a", GA_REGION: "us-east1"});
        let beta_labels = json!({BETA_ZONE: "us-west2-b", BETA_REGION: "us-west2"});
        let ga_zone_first =
            json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"]), req(GA_REGION, &["us-east1"])]}]);
        let ga_region_first =
            json!([{"matchExpressions": [req(GA_REGION, &["us-east1"]), req(GA_ZONE, &["us-east1-a"])]}]);
        let beta_zone_first =
            json!([{"matchExpressions": [req(BETA_ZONE, &["us-west2-b"]), req(BETA_REGION, &["us-west2"])]}]);
        let beta_region_first =
            json!([{"matchExpressions": [req(BETA_REGION, &["us-west2"]), req(BETA_ZONE, &["us-west2-b"])]}]);
        let existing = json!({GA_ZONE: "existingZone", GA_REGION: "existingRegion"});
        let cases = [
            // TestTranslateTopologyFromCSIToInTree (in_tree_volume_test.go).
            Case {
                name: "Remove CSI Topology Key and do not change existing GA Kubernetes topology",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: ga_labels.clone(),
                terms: json!([{"matchExpressions": [req(GA_REGION, &["us-east1"]), req(GCE_KEY, &["us-east1-a"])]}]),
                want_terms: ga_region_first,
                want_labels: ga_labels.clone(),
                want_err: false,
            },
            Case {
                name: "Remove CSI Topology Key and do not change existing Beta Kubernetes topology",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: beta_labels.clone(),
                terms: json!([{"matchExpressions": [req(BETA_REGION, &["us-west2"]), req(GCE_KEY, &["us-west2-b"])]}]),
                want_terms: beta_region_first,
                want_labels: beta_labels.clone(),
                want_err: false,
            },
            Case {
                name: "Remove CSI Topology Key and add Kubernetes topology from NodeAffinity, ignore labels",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: existing.clone(),
                terms: json!([{"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]}]),
                want_terms: ga_zone_first.clone(),
                want_labels: existing.clone(),
                want_err: false,
            },
            Case {
                name: "No CSI topology label exists and no change to the NodeAffinity",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: existing.clone(),
                terms: json!([]),
                want_terms: json!([]),
                want_labels: existing,
                want_err: false,
            },
            Case {
                name: "Generate GA labels and kubernetes topology only from CSI topology",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: Value::Null,
                terms: json!([{"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]}]),
                want_terms: ga_zone_first,
                want_labels: ga_labels,
                want_err: false,
            },
            Case {
                name: "Generate Beta labels and kubernetes topology from Beta NodeAffinity",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: Value::Null,
                terms: json!([{"matchExpressions": [req(BETA_ZONE, &["us-west2-b"])]}]),
                want_terms: beta_zone_first,
                want_labels: beta_labels,
                want_err: false,
            },
            Case {
                name: "regionParser is missing and only zone labels get generated",
                key: GCE_KEY,
                parser: None,
                labels: Value::Null,
                terms: json!([{"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]}]),
                want_terms: json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"])]}]),
                want_labels: json!({GA_ZONE: "us-east1-a"}),
                want_err: false,
            },
            Case {
                name: "Replace multi-term CSI Topology Key and add Region Kubernetes topology for both",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: Value::Null,
                terms: json!([
                    {"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]},
                    {"matchExpressions": [req(GCE_KEY, &["us-east1-c"])]}
                ]),
                want_terms: json!([
                    {"matchExpressions": [req(GA_ZONE, &["us-east1-a"]), req(GA_REGION, &["us-east1"])]},
                    {"matchExpressions": [req(GA_ZONE, &["us-east1-c"]), req(GA_REGION, &["us-east1"])]}
                ]),
                want_labels: json!({GA_ZONE: "us-east1-a__us-east1-c", GA_REGION: "us-east1"}),
                want_err: false,
            },
            Case {
                name: "cinder translation",
                key: CINDER_KEY,
                parser: None,
                labels: Value::Null,
                terms: json!([{"matchExpressions": [req(CINDER_KEY, &["nova"])]}]),
                want_terms: json!([{"matchExpressions": [req(GA_ZONE, &["nova"])]}]),
                want_labels: json!({GA_ZONE: "nova"}),
                want_err: false,
            },
            // The same rules, beyond upstream's table.
            Case {
                name: "region parser failure is an error",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: Value::Null,
                terms: json!([{"matchExpressions": [req(GCE_KEY, &["useast1a"])]}]),
                want_terms: json!([{"matchExpressions": [req(GA_ZONE, &["useast1a"])]}]),
                want_labels: Value::Null,
                want_err: true,
            },
            Case {
                name: "two regions: region terms added, no region label",
                key: GCE_KEY,
                parser: Some(gce_region),
                labels: Value::Null,
                terms: json!([
                    {"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]},
                    {"matchExpressions": [req(GCE_KEY, &["eu-west1-b"])]}
                ]),
                want_terms: json!([
                    {"matchExpressions": [req(GA_ZONE, &["us-east1-a"]), req(GA_REGION, &["us-east1"])]},
                    {"matchExpressions": [req(GA_ZONE, &["eu-west1-b"]), req(GA_REGION, &["eu-west1"])]}
                ]),
                want_labels: json!({GA_ZONE: "eu-west1-b__us-east1-a"}),
                want_err: false,
            },
        ];
        for case in cases {
            let mut pv = pv_with_terms(case.labels, case.terms);
            let got = translate_topology_csi_to_in_tree(&mut pv, case.key, case.parser);
            assert_eq!(got.is_err(), case.want_err, "case {:?}: {got:?}", case.name);
            let want_terms: Vec<NodeSelectorTerm> = from_json(case.want_terms);
            assert_same(case.name, &terms_of(&pv), &Some(&want_terms));
            let want_labels: Option<BTreeMap<String, String>> = from_json(case.want_labels);
            assert_same(case.name, &pv.metadata.labels, &want_labels);
        }
    }

    #[test]
    fn translate_topology_from_in_tree_to_csi() {
        let ga_labels = json!({GA_ZONE: "us-east1-a", GA_REGION: "us-east1"});
        let cases = [
            // TestTranslateTopologyFromInTreeToCSI (in_tree_volume_test.go).
            (
                "Replace GA Kubernetes Zone Topology to GCE CSI Topology",
                ga_labels.clone(),
                json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"]), req(GA_REGION, &["us-east1"])]}]),
                json!([{"matchExpressions": [req(GCE_KEY, &["us-east1-a"]), req(GA_REGION, &["us-east1"])]}]),
            ),
            (
                "Replace Beta Kubernetes Topology to GCE CSI Topology and upgrade region label",
                ga_labels,
                json!([{"matchExpressions": [req(BETA_ZONE, &["us-west2-b"]), req(BETA_REGION, &["us-west2"])]}]),
                json!([{"matchExpressions": [req(GCE_KEY, &["us-west2-b"]), req(GA_REGION, &["us-west2"])]}]),
            ),
            // The same rules, beyond upstream's table.
            (
                "zone key without values: zones come from the label and are appended",
                json!({GA_ZONE: "b__ a__b__"}),
                json!([{"matchExpressions": [{"key": GA_ZONE, "operator": "Exists"}]}]),
                json!([{"matchExpressions": [{"key": GA_ZONE, "operator": "Exists"}, req(GCE_KEY, &["a", "b"])]}]),
            ),
            (
                "GA region key is left alone",
                json!({BETA_ZONE: "z"}),
                json!([{"matchExpressions": [req(GA_REGION, &["r"])]}]),
                json!([{"matchExpressions": [req(GA_REGION, &["r"]), req(GCE_KEY, &["z"])]}]),
            ),
        ];
        for (name, labels, terms, want) in cases {
            let mut pv = pv_with_terms(labels, terms);
            translate_topology_in_tree_to_csi(&mut pv, GCE_KEY);
            let want: Vec<NodeSelectorTerm> = from_json(want);
            assert_same(name, &terms_of(&pv), &Some(&want));
        }
        // No labels and no node affinity: nothing is added.
        let mut bare = pv(json!({"spec": {}}));
        translate_topology_in_tree_to_csi(&mut bare, GCE_KEY);
        assert_same("bare", &bare, &pv(json!({"spec": {}})));
    }

    #[test]
    fn translate_allowed_topologies_cases() {
        let cases = [
            // TestTranslateAllowedTopologies (in_tree_volume_test.go).
            (
                "no translation",
                json!([{"matchLabelExpressions": [{"key": GCE_KEY, "values": ["foo", "bar"]}]}]),
                json!([{"matchLabelExpressions": [{"key": GCE_KEY, "values": ["foo", "bar"]}]}]),
            ),
            (
                "translate",
                json!([{"matchLabelExpressions": [{"key": BETA_ZONE, "values": ["foo", "bar"]}]}]),
                json!([{"matchLabelExpressions": [{"key": GCE_KEY, "values": ["foo", "bar"]}]}]),
            ),
            (
                "combo",
                json!([{"matchLabelExpressions": [
                    {"key": BETA_ZONE, "values": ["foo", "bar"]}, {"key": GCE_KEY, "values": ["boo", "baz"]}
                ]}]),
                json!([{"matchLabelExpressions": [
                    {"key": GCE_KEY, "values": ["foo", "bar"]}, {"key": GCE_KEY, "values": ["boo", "baz"]}
                ]}]),
            ),
            (
                "some other key",
                json!([{"matchLabelExpressions": [{"key": "test", "values": ["foo", "bar"]}]}]),
                json!([{"matchLabelExpressions": [{"key": "test", "values": ["foo", "bar"]}]}]),
            ),
            // The same rules, beyond upstream's table.
            (
                "GA key, and terms with no or empty expressions come out with none",
                json!([{"matchLabelExpressions": [{"key": GA_ZONE, "values": ["a"]}]}, {"matchLabelExpressions": []}, {}]),
                json!([{"matchLabelExpressions": [{"key": GCE_KEY, "values": ["a"]}]}, {}, {}]),
            ),
        ];
        for (name, input, want) in cases {
            let input: Vec<TopologySelectorTerm> = from_json(input);
            let want: Vec<TopologySelectorTerm> = from_json(want);
            assert_same(name, &translate_allowed_topologies(&input, GCE_KEY), &want);
        }
        assert_same(
            "topology_selector",
            &topology_selector(GCE_KEY, vec!["foo".to_string(), "bar".to_string()]),
            &from_json::<Vec<TopologySelectorTerm>>(
                json!([{"matchLabelExpressions": [{"key": GCE_KEY, "values": ["foo", "bar"]}]}]),
            ),
        );
    }

    #[test]
    fn add_topology_cases() {
        let cases: [(&str, &[&str], Option<Value>); 5] = [
            // TestAddTopology (in_tree_volume_test.go); upstream's errors are `false` here.
            ("empty zones", &[], None),
            ("only whitespace-named zones", &[" ", "\n", "\t", "  "], None),
            (
                "including whitespace-named zones",
                &[" ", "us-central1-a"],
                Some(json!({"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [req(GCE_KEY, &["us-central1-a"])]}
                ]}})),
            ),
            (
                "unsorted zones",
                &["us-central1-f", "us-central1-a", "us-central1-c", "us-central1-b"],
                Some(json!({"required": {"nodeSelectorTerms": [
                    {"matchExpressions": [req(GCE_KEY, &["us-central1-a", "us-central1-b", "us-central1-c", "us-central1-f"])]}
                ]}})),
            ),
            // Beyond upstream's table: trimmed and de-duplicated.
            (
                "padded duplicates",
                &[" b ", "a", "b", "a\u{a0}"],
                Some(
                    json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [req(GCE_KEY, &["a", "b"])]}]}}),
                ),
            ),
        ];
        for (name, zones, want) in cases {
            let mut pv = pv(json!({"spec": {}}));
            let added = add_topology(&mut pv, GCE_KEY, zones);
            assert_eq!(added, want.is_some(), "case {name:?}");
            let want: Option<VolumeNodeAffinity> = want.map(from_json);
            assert_same(name, &pv.spec.and_then(|s| s.node_affinity), &want);
        }
        // Every existing term gets the requirement.
        let mut two = pv_with_terms(
            Value::Null,
            json!([{"matchExpressions": [req("rack", &["r1"])]}, {"matchFields": [req("metadata.name", &["n"])]}]),
        );
        assert!(add_topology(&mut two, GCE_KEY, &["z"]));
        let want: Vec<NodeSelectorTerm> = from_json(json!([
            {"matchExpressions": [req("rack", &["r1"]), req(GCE_KEY, &["z"])]},
            {"matchFields": [req("metadata.name", &["n"])], "matchExpressions": [req(GCE_KEY, &["z"])]}
        ]));
        assert_same("two terms", &terms_of(&two), &Some(&want));
    }

    #[test]
    fn replace_topology_cases() {
        let cases = [
            // TestReplaceTopology (in_tree_volume_test.go).
            (
                "Replace single csi topology from PV",
                json!([{"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]}]),
                json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"])]}]),
            ),
            (
                "Not found the topology key so do nothing",
                json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"])]}]),
                json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"])]}]),
            ),
            (
                "Replace the topology key from multiple terms",
                json!([
                    {"matchExpressions": [req(GCE_KEY, &["us-east1-a"])]},
                    {"matchExpressions": [req(GCE_KEY, &["us-east1-c"])]}
                ]),
                json!([
                    {"matchExpressions": [req(GA_ZONE, &["us-east1-a"])]},
                    {"matchExpressions": [req(GA_ZONE, &["us-east1-c"])]}
                ]),
            ),
            (
                "Replace the topology key from single term and not combine topology key",
                json!([{"matchExpressions": [req(GCE_KEY, &["us-east1-a"]), req(GA_ZONE, &["us-east1-c"])]}]),
                json!([{"matchExpressions": [req(GA_ZONE, &["us-east1-a"]), req(GA_ZONE, &["us-east1-c"])]}]),
            ),
        ];
        for (name, terms, want) in cases {
            let mut pv = pv(json!({"spec": {"nodeAffinity": {"required": {"nodeSelectorTerms": terms}}}}));
            replace_topology_key(&mut pv, GCE_KEY, GA_ZONE);
            let want: VolumeNodeAffinity = from_json(json!({"required": {"nodeSelectorTerms": want}}));
            assert_same(name, &pv.spec.and_then(|s| s.node_affinity), &Some(want));
        }
    }

    #[test]
    fn topology_label_family() {
        let cases = [
            ("nothing: GA", Value::Null, json!([]), (GA_ZONE, GA_REGION)),
            ("beta label", json!({BETA_ZONE: "z"}), json!([]), (BETA_ZONE, BETA_REGION)),
            (
                "GA label beats beta label",
                json!({BETA_ZONE: "z", GA_ZONE: "z"}),
                json!([]),
                (GA_ZONE, GA_REGION),
            ),
            (
                "beta affinity beats GA label",
                json!({GA_ZONE: "z"}),
                json!([{"matchExpressions": [req(BETA_ZONE, &["z"])]}]),
                (BETA_ZONE, BETA_REGION),
            ),
            (
                "GA affinity beats beta affinity, in any term",
                Value::Null,
                json!([{"matchExpressions": [req(BETA_ZONE, &["z"])]}, {"matchExpressions": [req(GA_ZONE, &["z"])]}]),
                (GA_ZONE, GA_REGION),
            ),
        ];
        for (name, labels, terms, want) in cases {
            assert_eq!(topology_labels(&pv_with_terms(labels, terms)), want, "case {name:?}");
        }
    }
}
