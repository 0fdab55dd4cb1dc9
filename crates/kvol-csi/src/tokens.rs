//! Service-account tokens for drivers whose CSIDriver lists `tokenRequests`: the seam that mints them (the cluster's TokenRequest API); the pure parts live in [`kvol_csi_rules::tokens`].

use std::fmt;

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::TokenRequestStatus;
use kvol_plugin::plugin::PodInfo;

pub use kvol_csi_rules::tokens::{SERVICE_ACCOUNT_TOKENS_KEY, TokenAudience, tokens_value};

/// Mints a token of the pod's service account, bound to the pod.
#[async_trait]
pub trait TokenSource: Send + Sync + fmt::Debug {
    async fn token(&self, pod: &PodInfo, request: &TokenAudience) -> Result<TokenRequestStatus, String>;
}
