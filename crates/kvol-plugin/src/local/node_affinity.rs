//! Whether this node satisfies a volume's required node affinity, and why not when it does not.
//!
//! The semantics are upstream's (`component-helpers/scheduling/corev1/nodeaffinity`): terms are
//! ORed; within a term every match expression (on labels) and every match field (on
//! `metadata.name`) must hold; an empty term, and an empty list of terms, match no node. A term
//! that is malformed (an unknown operator, `In` without values, `Gt` with a non-integer) does
//! not match, and its fault is reported only when no other term matches.

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement, NodeSelectorTerm};

use crate::host::NodeInfo;

/// The one node field a term may select on.
pub const NODE_NAME_FIELD: &str = "metadata.name";

/// Checks the node against the selector's terms: `Ok` when one term matches, else why none does.
pub fn check(selector: &NodeSelector, node: &NodeInfo) -> Result<(), String> {
    let terms = &selector.node_selector_terms;
    if terms.is_empty() {
        return Err("nodeSelectorTerms is empty, which matches no node".to_string());
    }
    let mut reasons = Vec::with_capacity(terms.len());
    for (index, term) in terms.iter().enumerate() {
        match check_term(term, node) {
            Ok(()) => return Ok(()),
            Err(reason) => reasons.push(format!("term {index}: {reason}")),
        }
    }
    Err(format!("no node selector term matches: {}", reasons.join("; ")))
}

/// Checks one term: `Ok` when all its expressions and fields hold.
fn check_term(term: &NodeSelectorTerm, node: &NodeInfo) -> Result<(), String> {
    let expressions = term.match_expressions.as_deref().unwrap_or_default();
    let fields = term.match_fields.as_deref().unwrap_or_default();
    if expressions.is_empty() && fields.is_empty() {
        return Err("the term is empty and matches no node".to_string());
    }
    // A malformed requirement spoils the whole term, whatever the others say.
    let labels = expressions
        .iter()
        .enumerate()
        .map(|(i, r)| {
            LabelRequirement::parse(r).map_err(|e| format!("matchExpressions[{i}] ({}): {e}", describe(r)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let names = fields
        .iter()
        .enumerate()
        .map(|(i, r)| {
            NameRequirement::parse(r).map_err(|e| format!("matchFields[{i}] ({}): {e}", describe(r)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    for ((i, requirement), label) in expressions.iter().enumerate().zip(&labels) {
        label
            .check(node)
            .map_err(|e| format!("matchExpressions[{i}] ({}) fails: {e}", describe(requirement)))?;
    }
    // Upstream matches fields only when the node has a name to match them against.
    if !node.name.is_empty() {
        for ((i, requirement), name) in fields.iter().enumerate().zip(&names) {
            name.check(&node.name)
                .map_err(|e| format!("matchFields[{i}] ({}) fails: {e}", describe(requirement)))?;
        }
    }
    Ok(())
}

/// `key Op [a, b]`, as an expression reads in a reason.
fn describe(requirement: &NodeSelectorRequirement) -> String {
    let values = requirement.values.as_deref().unwrap_or_default();
    if values.is_empty() {
        format!("{} {}", requirement.key, requirement.operator)
    } else {
        format!("{} {} [{}]", requirement.key, requirement.operator, values.join(", "))
    }
}

/// A validated requirement on a node label.
#[derive(Debug)]
enum LabelRequirement<'a> {
    In(&'a str, &'a [String]),
    NotIn(&'a str, &'a [String]),
    Exists(&'a str),
    DoesNotExist(&'a str),
    Gt(&'a str, i64),
    Lt(&'a str, i64),
}

impl<'a> LabelRequirement<'a> {
    fn parse(requirement: &'a NodeSelectorRequirement) -> Result<LabelRequirement<'a>, String> {
        let key = requirement.key.as_str();
        let values = requirement.values.as_deref().unwrap_or_default();
        let operator = requirement.operator.as_str();
        let integer = || -> Result<i64, String> {
            match values {
                [value] => value
                    .parse()
                    .map_err(|_| format!("value {value:?} of operator {operator} is not an integer")),
                _ => Err(format!("operator {operator} needs exactly one value, not {}", values.len())),
            }
        };
        let some_values = || {
            if values.is_empty() {
                Err(format!("operator {operator} needs at least one value"))
            } else {
                Ok(values)
            }
        };
        let no_values = || {
            if values.is_empty() { Ok(()) } else { Err(format!("operator {operator} takes no values")) }
        };
        match operator {
            "In" => Ok(LabelRequirement::In(key, some_values()?)),
            "NotIn" => Ok(LabelRequirement::NotIn(key, some_values()?)),
            "Exists" => no_values().map(|()| LabelRequirement::Exists(key)),
            "DoesNotExist" => no_values().map(|()| LabelRequirement::DoesNotExist(key)),
            "Gt" => Ok(LabelRequirement::Gt(key, integer()?)),
            "Lt" => Ok(LabelRequirement::Lt(key, integer()?)),
            other => {
                Err(format!("operator {other:?} is not supported (In, NotIn, Exists, DoesNotExist, Gt, Lt)"))
            }
        }
    }

    /// `Ok` when the node's labels satisfy the requirement, else what the node has instead.
    fn check(&self, node: &NodeInfo) -> Result<(), String> {
        let label = |key: &str| node.labels.get(key).map(String::as_str);
        let missing = |key: &str| format!("the node has no label {key}");
        let has = |key: &str, value: &str| format!("the node's label {key} is {value:?}");
        match *self {
            LabelRequirement::In(key, values) => match label(key) {
                None => Err(missing(key)),
                Some(value) if values.iter().any(|v| v == value) => Ok(()),
                Some(value) => Err(has(key, value)),
            },
            LabelRequirement::NotIn(key, values) => match label(key) {
                Some(value) if values.iter().any(|v| v == value) => Err(has(key, value)),
                _ => Ok(()),
            },
            LabelRequirement::Exists(key) => label(key).map(|_| ()).ok_or_else(|| missing(key)),
            LabelRequirement::DoesNotExist(key) => match label(key) {
                None => Ok(()),
                Some(value) => Err(has(key, value)),
            },
            LabelRequirement::Gt(key, bound) | LabelRequirement::Lt(key, bound) => {
                let value = label(key).ok_or_else(|| missing(key))?;
                let number: i64 =
                    value.parse().map_err(|_| format!("{}, not an integer", has(key, value)))?;
                let (holds, relation) = match self {
                    LabelRequirement::Gt(..) => (number > bound, "greater"),
                    _ => (number < bound, "less"),
                };
                if holds { Ok(()) } else { Err(format!("{}, not {relation} than {bound}", has(key, value))) }
            }
        }
    }
}

/// A validated requirement on the node's name (the only field nodes are selected by).
#[derive(Debug)]
enum NameRequirement<'a> {
    Is(&'a str),
    IsNot(&'a str),
}

impl<'a> NameRequirement<'a> {
    fn parse(requirement: &'a NodeSelectorRequirement) -> Result<NameRequirement<'a>, String> {
        if requirement.key != NODE_NAME_FIELD {
            return Err(format!("field {:?} is not supported (only {NODE_NAME_FIELD})", requirement.key));
        }
        let operator = requirement.operator.as_str();
        let value = match requirement.values.as_deref().unwrap_or_default() {
            [value] => value.as_str(),
            values => {
                return Err(format!(
                    "operator {operator} on a field needs exactly one value, not {}",
                    values.len()
                ));
            }
        };
        match operator {
            "In" => Ok(NameRequirement::Is(value)),
            "NotIn" => Ok(NameRequirement::IsNot(value)),
            other => Err(format!("operator {other:?} is not supported on fields (In, NotIn)")),
        }
    }

    fn check(&self, node_name: &str) -> Result<(), String> {
        let holds = match *self {
            NameRequirement::Is(name) => node_name == name,
            NameRequirement::IsNot(name) => node_name != name,
        };
        if holds { Ok(()) } else { Err(format!("the node's name is {node_name:?}")) }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn requirement(text: &str) -> NodeSelectorRequirement {
        // "key Op a,b" or "key Op".
        let mut parts = text.split(' ');
        let key = parts.next().unwrap().to_string();
        let operator = parts.next().unwrap().to_string();
        let values = parts.next().map(|v| v.split(',').map(str::to_string).collect());
        NodeSelectorRequirement { key, operator, values }
    }

    fn term(expressions: &[&str], fields: &[&str]) -> NodeSelectorTerm {
        let list =
            |items: &[&str]| (!items.is_empty()).then(|| items.iter().map(|t| requirement(t)).collect());
        NodeSelectorTerm { match_expressions: list(expressions), match_fields: list(fields) }
    }

    fn node() -> NodeInfo {
        NodeInfo {
            name: "node-a".to_string(),
            labels: BTreeMap::from([
                ("zone".to_string(), "z1".to_string()),
                ("disks".to_string(), "4".to_string()),
                ("kind".to_string(), "fast".to_string()),
            ]),
            allocatable: Default::default(),
        }
    }

    /// One table row: the terms, and `Ok` or a piece of the reason.
    type Case = (&'static str, Vec<NodeSelectorTerm>, Result<(), &'static str>);

    #[test]
    fn selectors_match_as_upstream() {
        let cases: Vec<Case> = vec![
            ("no terms", vec![], Err("nodeSelectorTerms is empty, which matches no node")),
            ("empty term", vec![term(&[], &[])], Err("term 0: the term is empty and matches no node")),
            ("empty term beside a match", vec![term(&[], &[]), term(&["zone In z1"], &[])], Ok(())),
            ("in", vec![term(&["zone In z0,z1"], &[])], Ok(())),
            (
                "in, other value",
                vec![term(&["zone In z2,z3"], &[])],
                Err("term 0: matchExpressions[0] (zone In [z2, z3]) fails: the node's label zone is \"z1\""),
            ),
            ("in, no label", vec![term(&["rack In r1"], &[])], Err("the node has no label rack")),
            ("not in", vec![term(&["zone NotIn z2"], &[])], Ok(())),
            ("not in, no label", vec![term(&["rack NotIn r1"], &[])], Ok(())),
            ("not in, listed", vec![term(&["zone NotIn z1,z2"], &[])], Err("label zone is \"z1\"")),
            ("exists", vec![term(&["kind Exists"], &[])], Ok(())),
            ("exists, no label", vec![term(&["rack Exists"], &[])], Err("the node has no label rack")),
            ("does not exist", vec![term(&["rack DoesNotExist"], &[])], Ok(())),
            (
                "does not exist, present",
                vec![term(&["kind DoesNotExist"], &[])],
                Err("label kind is \"fast\""),
            ),
            ("gt", vec![term(&["disks Gt 3"], &[])], Ok(())),
            ("gt, equal", vec![term(&["disks Gt 4"], &[])], Err("label disks is \"4\", not greater than 4")),
            ("lt", vec![term(&["disks Lt 5"], &[])], Ok(())),
            ("lt, equal", vec![term(&["disks Lt 4"], &[])], Err("not less than 4")),
            ("lt, negative bound", vec![term(&["disks Lt -1"], &[])], Err("not less than -1")),
            (
                "gt, label not an integer",
                vec![term(&["zone Gt 1"], &[])],
                Err("label zone is \"z1\", not an integer"),
            ),
            ("gt, no label", vec![term(&["rack Gt 1"], &[])], Err("the node has no label rack")),
            ("expressions are ANDed", vec![term(&["zone In z1", "kind In fast"], &[])], Ok(())),
            (
                "expressions are ANDed, second fails",
                vec![term(&["zone In z1", "kind In slow"], &[])],
                Err("term 0: matchExpressions[1] (kind In [slow]) fails"),
            ),
            ("terms are ORed", vec![term(&["zone In z9"], &[]), term(&["kind In fast"], &[])], Ok(())),
            (
                "every failing term is named",
                vec![term(&["zone In z9"], &[]), term(&["kind In slow"], &[])],
                Err(
                    "no node selector term matches: term 0: matchExpressions[0] (zone In [z9]) fails: the node's label zone is \"z1\"; term 1: matchExpressions[0] (kind In [slow]) fails",
                ),
            ),
            ("field in", vec![term(&[], &["metadata.name In node-a"])], Ok(())),
            (
                "field in, other node",
                vec![term(&[], &["metadata.name In node-b"])],
                Err("the node's name is \"node-a\""),
            ),
            ("field not in", vec![term(&[], &["metadata.name NotIn node-b"])], Ok(())),
            (
                "field not in, this node",
                vec![term(&[], &["metadata.name NotIn node-a"])],
                Err("matchFields[0]"),
            ),
            ("label and field ANDed", vec![term(&["zone In z1"], &["metadata.name In node-a"])], Ok(())),
            (
                "label and field ANDed, field fails",
                vec![term(&["zone In z1"], &["metadata.name In node-b"])],
                Err("matchFields[0] (metadata.name In [node-b]) fails"),
            ),
            (
                "unknown operator",
                vec![term(&["zone Near z1"], &[])],
                Err("matchExpressions[0] (zone Near [z1]): operator \"Near\" is not supported"),
            ),
            ("in without values", vec![term(&["zone In"], &[])], Err("operator In needs at least one value")),
            (
                "exists with values",
                vec![term(&["zone Exists z1"], &[])],
                Err("operator Exists takes no values"),
            ),
            (
                "gt with two values",
                vec![term(&["disks Gt 1,2"], &[])],
                Err("operator Gt needs exactly one value, not 2"),
            ),
            (
                "gt with a word",
                vec![term(&["disks Gt many"], &[])],
                Err("value \"many\" of operator Gt is not an integer"),
            ),
            (
                "a malformed expression spoils its term even when another holds",
                vec![term(&["zone In z1", "kind Near x"], &[])],
                Err("operator \"Near\" is not supported"),
            ),
            (
                "a malformed term does not hide a matching one",
                vec![term(&["zone Near z1"], &[]), term(&["zone In z1"], &[])],
                Ok(()),
            ),
            (
                "field other than the name",
                vec![term(&[], &["spec.unschedulable In true"])],
                Err("field \"spec.unschedulable\" is not supported"),
            ),
            (
                "field with two values",
                vec![term(&[], &["metadata.name In a,b"])],
                Err("on a field needs exactly one value, not 2"),
            ),
            ("field operator", vec![term(&[], &["metadata.name Exists"])], Err("exactly one value, not 0")),
            (
                "field operator with a value",
                vec![term(&[], &["metadata.name Gt 1"])],
                Err("operator \"Gt\" is not supported on fields"),
            ),
        ];
        for (name, terms, expected) in cases {
            let selector = NodeSelector { node_selector_terms: terms };
            match (check(&selector, &node()), expected) {
                (Ok(()), Ok(())) => {}
                (Err(reason), Err(part)) => {
                    assert!(reason.contains(part), "{name}: {reason:?} lacks {part:?}")
                }
                (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn a_nameless_node_skips_field_requirements_as_upstream() {
        let selector = NodeSelector { node_selector_terms: vec![term(&[], &["metadata.name In node-b"])] };
        let nameless = NodeInfo { name: String::new(), ..node() };
        assert_eq!(check(&selector, &nameless), Ok(()));
        assert!(check(&selector, &node()).is_err());
    }
}
