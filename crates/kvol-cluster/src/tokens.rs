//! Service-account tokens from the API server's TokenRequest API, bound to the pod, for the CSI drivers whose CSIDriver lists `tokenRequests` ([`kvol_csi::tokens`]).

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenRequestStatus,
};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::PostParams;
use kube::{Api, Client};
use kvol_csi::{TokenAudience, TokenSource};
use kvol_plugin::plugin::PodInfo;

/// The service account a pod runs as when its spec names none.
const DEFAULT_SERVICE_ACCOUNT: &str = "default";

/// [`TokenSource`] on the API server: one TokenRequest per audience and publish, bound to the
/// pod (the token dies with it), as kubelet asks for them.
#[derive(Clone)]
pub struct ApiTokens {
    client: Client,
}

impl std::fmt::Debug for ApiTokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiTokens").finish_non_exhaustive()
    }
}

impl ApiTokens {
    pub fn new(client: Client) -> ApiTokens {
        ApiTokens { client }
    }
}

/// The TokenRequest kubelet makes for `pod`: the audience (none: the API server's own), the
/// lifetime asked for, bound to the pod by name and uid.
pub fn token_request(pod: &PodInfo, request: &TokenAudience) -> TokenRequest {
    TokenRequest {
        spec: Some(TokenRequestSpec {
            // Always sent, empty for the API server's own audience (the field is required by
            // API servers before 1.27).
            audiences: Some(if request.audience.is_empty() {
                Vec::new()
            } else {
                vec![request.audience.clone()]
            }),
            expiration_seconds: request.expiration_seconds,
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.name.clone()),
                uid: Some(pod.uid.clone()),
            }),
            ..TokenRequestSpec::default()
        }),
        ..TokenRequest::default()
    }
}

#[async_trait]
impl TokenSource for ApiTokens {
    async fn token(&self, pod: &PodInfo, request: &TokenAudience) -> Result<TokenRequestStatus, String> {
        let account = if pod.service_account.is_empty() {
            DEFAULT_SERVICE_ACCOUNT
        } else {
            pod.service_account.as_str()
        };
        let api: Api<ServiceAccount> = Api::namespaced(self.client.clone(), &pod.namespace);
        let answer = api
            .create_token_request(account, &PostParams::default(), &token_request(pod, request))
            .await
            .map_err(|e| {
                format!("cannot request a token of serviceaccount {}/{account}: {e}", pod.namespace)
            })?;
        answer.status.ok_or_else(|| {
            format!(
                "the token request of serviceaccount {}/{account} came back without a token",
                pod.namespace
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_request_is_bound_to_the_pod_with_the_audience_and_lifetime_asked() {
        let pod =
            PodInfo { name: "web".into(), namespace: "shop".into(), uid: "u1".into(), ..PodInfo::default() };
        let rows = [
            ("an audience and a lifetime", "vault", Some(600), vec!["vault".to_string()]),
            ("the api server's audience", "", None, vec![]),
        ];
        for (name, audience, expiration_seconds, audiences) in rows {
            let request =
                token_request(&pod, &TokenAudience { audience: audience.into(), expiration_seconds });
            let spec = request.spec.expect("a spec");
            assert_eq!(spec.audiences, Some(audiences), "{name}");
            assert_eq!(spec.expiration_seconds, expiration_seconds, "{name}");
            let bound = spec.bound_object_ref.expect("bound to the pod");
            assert_eq!(
                (bound.kind.as_deref(), bound.name.as_deref(), bound.uid.as_deref()),
                (Some("Pod"), Some("web"), Some("u1")),
                "{name}"
            );
        }
    }
}
