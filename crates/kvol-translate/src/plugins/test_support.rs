//! Helpers for the plugins' data-driven test tables: objects from JSON, readable mismatches.

use k8s_openapi::api::core::v1::{PersistentVolume, Volume};
use k8s_openapi::api::storage::v1::StorageClass;
use serde_json::Value;

/// A PersistentVolume from its JSON form (`serde_json::json!`), as the API would send it.
pub(crate) fn pv(json: Value) -> PersistentVolume {
    serde_json::from_value(json).expect("test table holds an invalid PersistentVolume")
}

/// A pod volume from its JSON form.
pub(crate) fn vol(json: Value) -> Volume {
    serde_json::from_value(json).expect("test table holds an invalid Volume")
}

/// A StorageClass from its JSON form. `provisioner` may be left out; it defaults to "".
pub(crate) fn sc(mut json: Value) -> StorageClass {
    if let Value::Object(map) = &mut json {
        map.entry("provisioner").or_insert(Value::String(String::new()));
    }
    serde_json::from_value(json).expect("test table holds an invalid StorageClass")
}

/// Asserts equality of two API objects, printing both as JSON when they differ.
/// Equality is on the Rust values, so an absent map and an empty one differ, as upstream's
/// `reflect.DeepEqual` makes them differ.
#[track_caller]
pub(crate) fn assert_same<T: PartialEq + serde::Serialize>(case: &str, got: &T, want: &T) {
    if got != want {
        panic!(
            "case {case:?}: translation differs\n got: {}\nwant: {}",
            serde_json::to_string(got).unwrap(),
            serde_json::to_string(want).unwrap()
        );
    }
}

/// One row of a translation table: the input object as JSON, and the expected output as JSON
/// (`None` when the translation must fail).
pub(crate) struct Case {
    pub(crate) name: &'static str,
    pub(crate) input: Value,
    pub(crate) want: Option<Value>,
}

/// Checks one table row's outcome: equal to `want`, or an error when `want` is `None`.
#[track_caller]
pub(crate) fn check_result<T: PartialEq + serde::Serialize + std::fmt::Debug>(
    case: &str,
    got: crate::Result<T>,
    want: Option<T>,
) {
    match want {
        Some(want) => assert_same(case, &got.unwrap_or_else(|e| panic!("case {case:?}: {e}")), &want),
        None => assert!(got.is_err(), "case {case:?}: want an error, got {got:?}"),
    }
}

/// A PV node affinity as JSON: one node-selector term per slice, each `key In values`.
pub(crate) fn affinity(terms: &[&[(&str, &[&str])]]) -> Value {
    let terms: Vec<Value> = terms
        .iter()
        .map(|reqs| {
            let exprs: Vec<Value> = reqs
                .iter()
                .map(|(k, v)| serde_json::json!({"key": k, "operator": "In", "values": v}))
                .collect();
            serde_json::json!({"matchExpressions": exprs})
        })
        .collect();
    serde_json::json!({"required": {"nodeSelectorTerms": terms}})
}
