//! Kubernetes documents in and out: a YAML or JSON stream to typed objects, results back to text.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kvol_node::sources::parse_values;
use serde_json::Value;

/// An object kvol can translate, as read from a document.
#[derive(Clone, Debug)]
pub enum Object {
    PersistentVolume(Box<PersistentVolume>),
    StorageClass(Box<StorageClass>),
    Pod(Box<Pod>),
}

/// One document of the input stream: its 1-based position and what it held.
#[derive(Debug)]
pub struct Document {
    pub position: usize,
    /// `Kind/name` for messages, as far as it could be read.
    pub label: String,
    pub object: Result<Object, String>,
}

/// Why a whole stream could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot parse {source_name} as YAML or JSON: {reason}")]
pub struct StreamError {
    pub source_name: String,
    pub reason: String,
}

/// Splits a YAML or JSON stream into documents and types each one. A `List` (as `kubectl get
/// -o yaml` writes) contributes its items; empty documents are skipped. A document that parses
/// but is not a supported object is returned with its error, so one bad document does not hide
/// the others.
pub fn read_stream(text: &str, source_name: &str) -> Result<Vec<Document>, StreamError> {
    let values =
        parse_values(text).map_err(|reason| StreamError { source_name: source_name.to_string(), reason })?;
    let mut docs = Vec::new();
    for value in values {
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                let items = map.get("items").and_then(Value::as_array).cloned().unwrap_or_default();
                for item in items {
                    docs.push(type_document(docs.len() + 1, item));
                }
            }
            other => docs.push(type_document(docs.len() + 1, other)),
        }
    }
    Ok(docs)
}

/// The documents of a YAML or JSON stream as plain values, a `List` expanded into its items and
/// empty documents skipped.
pub fn read_values(text: &str, source_name: &str) -> Result<Vec<Value>, StreamError> {
    let values =
        parse_values(text).map_err(|reason| StreamError { source_name: source_name.to_string(), reason })?;
    let mut out = Vec::new();
    for value in values {
        match value {
            Value::Null => {}
            Value::Object(ref map) if map.get("kind").and_then(Value::as_str) == Some("List") => {
                out.extend(map.get("items").and_then(Value::as_array).cloned().unwrap_or_default());
            }
            other => out.push(other),
        }
    }
    Ok(out)
}

fn label_of(value: &Value) -> String {
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("<no kind>");
    let name = value.pointer("/metadata/name").and_then(Value::as_str).unwrap_or("<no name>");
    format!("{kind}/{name}")
}

fn type_document(position: usize, value: Value) -> Document {
    let label = label_of(&value);
    let object = type_object(value);
    Document { position, label, object }
}

fn type_object(value: Value) -> Result<Object, String> {
    if !value.is_object() {
        return Err(format!(
            "not a Kubernetes object: a document must be a mapping, found {}",
            kvol_api::json_kind(&value)
        ));
    }
    let kind = value.get("kind").and_then(Value::as_str).ok_or("missing \"kind\"")?.to_string();
    let api_version =
        value.get("apiVersion").and_then(Value::as_str).ok_or("missing \"apiVersion\"")?.to_string();
    let want = match kind.as_str() {
        "PersistentVolume" | "Pod" => "v1",
        "StorageClass" => "storage.k8s.io/v1",
        _ => {
            return Err(format!(
                "unsupported kind {kind:?}: kvol translates PersistentVolume, StorageClass and Pod"
            ));
        }
    };
    if api_version != want {
        return Err(format!("unsupported apiVersion {api_version:?} for {kind}: want {want:?}"));
    }
    let invalid = |e: serde_json::Error| format!("invalid {kind}: {e}");
    Ok(match kind.as_str() {
        "PersistentVolume" => {
            Object::PersistentVolume(Box::new(serde_json::from_value(value).map_err(invalid)?))
        }
        "StorageClass" => Object::StorageClass(Box::new(serde_json::from_value(value).map_err(invalid)?)),
        _ => Object::Pod(Box::new(serde_json::from_value(value).map_err(invalid)?)),
    })
}

/// Output format of results.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A YAML stream, documents separated by `---`.
    Yaml,
    /// One pretty-printed JSON object per result, in order (a JSON stream, as `jq` reads).
    Json,
}

/// Renders results in order.
pub fn render<T: serde::Serialize>(results: &[T], format: Format) -> Result<String, String> {
    let mut out = String::new();
    for (i, r) in results.iter().enumerate() {
        match format {
            Format::Yaml => {
                if i > 0 {
                    out.push_str("---\n");
                }
                out.push_str(&serde_saphyr::to_string(r).map_err(|e| format!("cannot write yaml: {e}"))?);
            }
            Format::Json => {
                out.push_str(
                    &serde_json::to_string_pretty(r).map_err(|e| format!("cannot write json: {e}"))?,
                );
                out.push('\n');
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(docs: &[Document]) -> Vec<String> {
        docs.iter()
            .map(|d| match &d.object {
                Ok(_) => format!("{} {}", d.position, d.label),
                Err(e) => format!("{} {} error: {e}", d.position, d.label),
            })
            .collect()
    }

    #[test]
    fn streams_are_split_typed_and_numbered() {
        // (input, documents as "position label [error]")
        let cases: &[(&str, &[&str])] = &[
            (
                "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: a}\n---\n---\napiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata: {name: b}\nprovisioner: x\n",
                &["1 PersistentVolume/a", "2 StorageClass/b"],
            ),
            (
                r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"p"}} {"apiVersion":"v1","kind":"PersistentVolume","metadata":{"name":"q"}}"#,
                &["1 Pod/p", "2 PersistentVolume/q"],
            ),
            (
                "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: Pod, metadata: {name: p}}\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: c}}\n",
                &[
                    "1 Pod/p",
                    "2 ConfigMap/c error: unsupported kind \"ConfigMap\": kvol translates PersistentVolume, StorageClass and Pod",
                ],
            ),
            (
                "apiVersion: storage.k8s.io/v1beta1\nkind: StorageClass\nmetadata: {name: old}\nprovisioner: x\n",
                &[
                    "1 StorageClass/old error: unsupported apiVersion \"storage.k8s.io/v1beta1\" for StorageClass: want \"storage.k8s.io/v1\"",
                ],
            ),
            (
                "- a\n- b\n",
                &[
                    "1 <no kind>/<no name> error: not a Kubernetes object: a document must be a mapping, found a list",
                ],
            ),
            ("kind: Pod\nmetadata: {name: p}\n", &["1 Pod/p error: missing \"apiVersion\""]),
            ("", &[]),
        ];
        for (input, want) in cases {
            let docs = read_stream(input, "test").unwrap_or_else(|e| panic!("{input:?}: {e}"));
            assert_eq!(kinds(&docs), *want, "input {input:?}");
        }
    }

    #[test]
    fn invalid_fields_name_the_kind() {
        let docs = read_stream(
            "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: a}\nspec: {capacity: 5}\n",
            "t",
        )
        .unwrap();
        let err = docs[0].object.as_ref().unwrap_err();
        assert!(err.starts_with("invalid PersistentVolume: "), "{err}");
    }

    #[test]
    fn malformed_streams_are_refused_whole() {
        for input in ["a: [1, 2\n", "{\"kind\": \"Pod\"", "a: b\n  c: d\n"] {
            let err = read_stream(input, "in.yaml").unwrap_err().to_string();
            assert!(err.starts_with("cannot parse in.yaml as YAML or JSON: "), "{input:?}: {err}");
        }
    }
}
