//! `kvol translate`: each document of a stream to its CSI (or in-tree) form, in order.

use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kvol_translate as translate;
use serde_json::Value;

use crate::documents::{Document, Object};

/// Which way to translate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    /// In-tree PVs, StorageClasses and Pods' inline volumes to CSI.
    ToCsi,
    /// CSI PVs of migrated drivers back to their in-tree source.
    ToInTree,
}

/// A document that could not be translated, with where it was.
#[derive(Debug, PartialEq, Eq)]
pub struct DocumentError {
    pub position: usize,
    pub label: String,
    pub reason: String,
}

impl std::fmt::Display for DocumentError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "document {} ({}): {}", self.position, self.label, self.reason)
    }
}

/// Translates every document. Either all succeed (results in input order; a Pod contributes
/// one PV per inline volume with a migratable source) or the errors of every failing document
/// are returned and no result is.
pub fn translate_documents(
    docs: Vec<Document>,
    direction: Direction,
    namespace: Option<&str>,
) -> Result<Vec<Value>, Vec<DocumentError>> {
    let mut results = Vec::new();
    let mut errors = Vec::new();
    for doc in docs {
        let outcome = doc.object.and_then(|object| translate_object(object, direction, namespace));
        match outcome {
            Ok(values) => results.extend(values),
            Err(reason) => errors.push(DocumentError { position: doc.position, label: doc.label, reason }),
        }
    }
    if errors.is_empty() { Ok(results) } else { Err(errors) }
}

fn to_value<T: serde::Serialize>(object: &T) -> Result<Value, String> {
    serde_json::to_value(object).map_err(|e| format!("cannot serialise the result: {e}"))
}

fn translate_object(
    object: Object,
    direction: Direction,
    namespace: Option<&str>,
) -> Result<Vec<Value>, String> {
    match (direction, object) {
        (Direction::ToCsi, Object::PersistentVolume(pv)) => {
            let out = translate::translate_in_tree_pv_to_csi_owned(*pv).map_err(|e| e.to_string())?;
            Ok(vec![to_value(&out)?])
        }
        (Direction::ToCsi, Object::StorageClass(sc)) => {
            let plugin = sc.provisioner.clone();
            let out = translate::translate_in_tree_storage_class_to_csi_owned(&plugin, *sc)
                .map_err(|e| e.to_string())?;
            Ok(vec![to_value(&out)?])
        }
        (Direction::ToCsi, Object::Pod(pod)) => translate_pod(&pod, namespace),
        (Direction::ToInTree, Object::PersistentVolume(pv)) => {
            let out = translate::translate_csi_pv_to_in_tree_owned(*pv).map_err(|e| e.to_string())?;
            Ok(vec![to_value(&out)?])
        }
        (Direction::ToInTree, Object::StorageClass(_) | Object::Pod(_)) => {
            Err("--to-in-tree translates only PersistentVolumes with a CSI source".to_string())
        }
    }
}

/// The namespace inline volumes are translated in: the Pod's own, else `--namespace`.
fn pod_namespace<'a>(pod: &'a Pod, flag: Option<&'a str>) -> Result<&'a str, String> {
    match (pod.metadata.namespace.as_deref(), flag) {
        (Some(own), Some(flag)) if own != flag => {
            Err(format!("the pod is in namespace {own:?} but --namespace says {flag:?}"))
        }
        (Some(own), _) => Ok(own),
        (None, Some(flag)) => Ok(flag),
        (None, None) => Ok(""),
    }
}

fn translate_pod(pod: &Pod, namespace: Option<&str>) -> Result<Vec<Value>, String> {
    let ns = pod_namespace(pod, namespace)?;
    let volumes = pod.spec.as_ref().and_then(|s| s.volumes.as_ref());
    let mut out = Vec::new();
    for vol in volumes.into_iter().flatten() {
        // Volumes with no migratable source (emptyDir, configMap, CSI, ...) are not translated,
        // as upstream does; a migratable one that fails (or is not compiled in) is an error.
        let migratable = translate::inline_sources(vol).iter().any(|(_, plugin)| plugin.is_some());
        if !migratable {
            continue;
        }
        let pv: PersistentVolume = translate::translate_in_tree_inline_volume_to_csi(vol, ns)
            .map_err(|e| format!("volume {:?}: {e}", vol.name))?;
        out.push(to_value(&pv)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::documents::read_stream;

    fn run(input: &str, direction: Direction, ns: Option<&str>) -> Result<Vec<Value>, Vec<String>> {
        let docs = read_stream(input, "test").unwrap();
        translate_documents(docs, direction, ns)
            .map_err(|errs| errs.iter().map(ToString::to_string).collect())
    }

    const POD_NS: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: p, namespace: team}\nspec:\n  containers: []\n  volumes:\n  - {name: scratch, emptyDir: {}}\n";

    #[test]
    fn pods_without_migratable_volumes_yield_nothing() {
        assert_eq!(run(POD_NS, Direction::ToCsi, None).unwrap(), Vec::<Value>::new());
    }

    #[test]
    fn errors_name_position_kind_and_reason() {
        let input = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: nfs-pv}\nspec: {nfs: {server: s, path: /x}}\n---\napiVersion: v1\nkind: Service\nmetadata: {name: s}\n";
        let errs = run(input, Direction::ToCsi, None).unwrap_err();
        assert_eq!(
            errs,
            vec![
                "document 1 (PersistentVolume/nfs-pv): persistent volume \"nfs-pv\" has no in-tree source that can be translated to CSI".to_string(),
                "document 2 (Service/s): unsupported kind \"Service\": kvol translates PersistentVolume, StorageClass and Pod".to_string(),
            ]
        );
    }

    #[test]
    fn namespace_flag_must_agree_with_the_pod() {
        let errs = run(POD_NS, Direction::ToCsi, Some("other")).unwrap_err();
        assert_eq!(
            errs,
            vec!["document 1 (Pod/p): the pod is in namespace \"team\" but --namespace says \"other\""]
        );
        assert!(run(POD_NS, Direction::ToCsi, Some("team")).is_ok());
    }

    #[test]
    fn to_in_tree_takes_only_persistent_volumes() {
        let errs = run(POD_NS, Direction::ToInTree, None).unwrap_err();
        assert_eq!(
            errs,
            vec!["document 1 (Pod/p): --to-in-tree translates only PersistentVolumes with a CSI source"]
        );
        let native = "apiVersion: v1\nkind: PersistentVolume\nmetadata: {name: n}\nspec: {csi: {driver: hostpath.csi.kvol.io, volumeHandle: h}}\n";
        let errs = run(native, Direction::ToInTree, None).unwrap_err();
        assert_eq!(
            errs,
            vec![
                "document 1 (PersistentVolume/n): no in-tree plugin translation for CSI driver \"hostpath.csi.kvol.io\""
            ]
        );
    }
}
