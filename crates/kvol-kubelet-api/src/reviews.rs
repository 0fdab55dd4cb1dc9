//! The API server's reviews for kubelet's API: a TokenReview per bearer token, a SubjectAccessReview per request, asked as the node.

use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec};
use kube::api::{Api, PostParams};

use crate::auth::{Attributes, Decision, Reviews, User};

/// Reviews asked of the API server through `client` (the node's credentials: kvol's RBAC
/// lets it create both kinds, as the node authorizer lets a kubelet).
#[derive(Clone)]
pub struct ApiReviews {
    client: kube::Client,
}

impl std::fmt::Debug for ApiReviews {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiReviews")
    }
}

impl ApiReviews {
    pub fn new(client: kube::Client) -> ApiReviews {
        ApiReviews { client }
    }
}

#[async_trait::async_trait]
impl Reviews for ApiReviews {
    async fn review_token(&self, token: &str) -> Result<Option<User>, String> {
        let review = TokenReview {
            spec: TokenReviewSpec { token: token.to_string(), audiences: None },
            ..Default::default()
        };
        let api: Api<TokenReview> = Api::all(self.client.clone());
        let answer =
            api.create(&PostParams::default(), &review).await.map_err(|e| format!("tokenreview: {e}"))?;
        let status = answer.status.unwrap_or_default();
        if status.authenticated != Some(true) {
            return Ok(None);
        }
        let info = status.user.unwrap_or_default();
        Ok(Some(User {
            name: info.username.unwrap_or_default(),
            uid: info.uid.unwrap_or_default(),
            groups: info.groups.unwrap_or_default(),
        }))
    }

    async fn review_access(
        &self,
        user: &User,
        attributes: Attributes,
        node: &str,
    ) -> Result<Decision, String> {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some(attributes.verb.to_string()),
                    version: Some("v1".into()),
                    resource: Some("nodes".into()),
                    subresource: Some(attributes.subresource.to_string()),
                    name: Some(node.to_string()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let api: Api<SubjectAccessReview> = Api::all(self.client.clone());
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| format!("subjectaccessreview for {}: {e}", user.name))?;
        let status = answer.status.unwrap_or_default();
        Ok(Decision { allowed: status.allowed, reason: status.reason.unwrap_or_default() })
    }
}
