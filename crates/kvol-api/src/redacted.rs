//! Secrets as debug output and logs may show them: namespace, name, type and keys, never a value.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Secret;

/// A Secret as debug output may show it: namespace, name, type and the keys of its data,
/// never a value.
#[derive(Clone, Copy)]
pub struct RedactedSecret<'a>(pub &'a Secret);

impl std::fmt::Debug for RedactedSecret<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.0;
        let keys: Vec<&String> = s
            .data
            .iter()
            .flatten()
            .map(|(k, _)| k)
            .chain(s.string_data.iter().flatten().map(|(k, _)| k))
            .collect();
        f.debug_struct("Secret")
            .field("namespace", &s.metadata.namespace)
            .field("name", &s.metadata.name)
            .field("type", &s.type_)
            .field("keys", &keys)
            .finish_non_exhaustive()
    }
}

/// Secrets by key as debug output may show them: see [`RedactedSecret`].
#[derive(Clone, Copy)]
pub struct RedactedSecrets<'a, K>(pub &'a BTreeMap<K, Secret>);

impl<K: std::fmt::Debug> std::fmt::Debug for RedactedSecrets<'_, K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.0.iter().map(|(k, s)| (k, RedactedSecret(s)))).finish()
    }
}
