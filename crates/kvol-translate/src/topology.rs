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
    if !topology_values(pv, zone_label).is_empty() {
        replace_topology_key(pv, zone_label, csi_zone_key);
    } else if let Some(label) = pv.metadata.labels.as_ref().and_then(|l| l.get(zone_label)) {
        let zones: Vec<String> = label.split(LABEL_MULTI_ZONE_DELIMITER).map(str::to_string).collect();
        add_topology(pv, csi_zone_key, &zones);
    }
    if region_label == LABEL_FAILURE_DOMAIN_BETA_REGION && !topology_values(pv, region_label).is_empty() {
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
