//! A CSIDriver's `tokenRequests` and the volume-context value kubelet hands service-account tokens over in.

use std::collections::BTreeMap;

use k8s_openapi::api::authentication::v1::TokenRequestStatus;

/// The volume-context key the tokens travel under, as kubelet sets it.
pub const SERVICE_ACCOUNT_TOKENS_KEY: &str = "csi.storage.k8s.io/serviceAccount.tokens";

/// One entry of a CSIDriver's `tokenRequests`.
pub use kvol_api::pod::TokenAudience;

/// The value of [`SERVICE_ACCOUNT_TOKENS_KEY`]: a JSON object from audience to the token's
/// status (`token`, `expirationTimestamp`), as kubelet writes it.
pub fn tokens_value(tokens: &BTreeMap<String, TokenRequestStatus>) -> String {
    serde_json::to_string(tokens).expect("token statuses serialise")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_a_json_object_by_audience_as_kubelet_writes_them() {
        let status = |token: &str| TokenRequestStatus {
            token: Some(token.into()),
            expiration_timestamp: serde_json::from_value(serde_json::json!("2026-11-26T22:00:00Z")).ok(),
        };
        let rows: [(&str, BTreeMap<String, TokenRequestStatus>, &str); 3] = [
            ("none", BTreeMap::new(), "{}"),
            (
                "one audience",
                BTreeMap::from([("vault".to_string(), status("t1"))]),
                r#"{"vault":{"expirationTimestamp":"2026-11-26T22:00:00Z","token":"t1"}}"#,
            ),
            (
                "the API server's audience and another",
                BTreeMap::from([("".to_string(), status("t0")), ("sts".to_string(), status("t2"))]),
                r#"{"":{"expirationTimestamp":"2026-11-26T22:00:00Z","token":"t0"},"sts":{"expirationTimestamp":"2026-11-26T22:00:00Z","token":"t2"}}"#,
            ),
        ];
        for (name, tokens, want) in rows {
            assert_eq!(tokens_value(&tokens), want, "{name}");
        }
    }
}
