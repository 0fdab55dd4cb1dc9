//! Who calls kubelet's API and whether they may, as kubelet decides it: the caller is a client certificate's subject or a bearer token's TokenReview, and its request (kubelet's attributes: `nodes/<subresource>` of this node, the verb by method) is allowed outright or by a SubjectAccessReview; the reviews' answers are cached as kubelet caches them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// An authenticated caller.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct User {
    pub name: String,
    pub uid: String,
    pub groups: Vec<String>,
}

/// What a request asks to do, as kubelet names it to its authorizer: `verb` on the resource
/// `nodes`, `subresource`, of this node.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attributes {
    pub verb: &'static str,
    pub subresource: &'static str,
}

/// kubelet's attributes of a request (`server/auth.go`): the verb by method; the subresource
/// `stats`, `metrics` or `log` for those paths, `proxy` for every other one.
pub fn attributes(method: &str, path: &str) -> Attributes {
    let verb = match method {
        "POST" => "create",
        "GET" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        _ => "",
    };
    let subresource = if is_under(path, "/stats/") {
        "stats"
    } else if is_under(path, "/metrics") {
        "metrics"
    } else if is_under(path, "/logs/") {
        "log"
    } else {
        "proxy"
    };
    Attributes { verb, subresource }
}

/// Whether `path` is `prefix` (its trailing `/` aside) or below it.
fn is_under(path: &str, prefix: &str) -> bool {
    let prefix = prefix.trim_end_matches('/');
    path == prefix || path.strip_prefix(prefix).is_some_and(|rest| rest.starts_with('/'))
}

/// The user a client certificate names: its subject's common name, its organizations as
/// groups (the API server's x509 authenticator's reading); none without a common name.
pub fn certificate_user(der: &[u8]) -> Option<User> {
    let (_, certificate) = x509_parser::parse_x509_certificate(der).ok()?;
    let subject = certificate.subject();
    let name = subject.iter_common_name().next()?.as_str().ok()?.to_string();
    let groups = subject.iter_organization().filter_map(|o| o.as_str().ok().map(str::to_string)).collect();
    Some(User { name, uid: String::new(), groups })
}

/// The token of an `Authorization: Bearer …` header.
pub fn bearer_token(header: Option<&str>) -> Option<&str> {
    let (scheme, token) = header?.trim().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// A SubjectAccessReview's answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub allowed: bool,
    pub reason: String,
}

/// The API server's reviews, asked by kubelet's API: TokenReview for a bearer token,
/// SubjectAccessReview for a request. The seam the server is tested through.
#[async_trait::async_trait]
pub trait Reviews: Send + Sync {
    /// The token's user; `None`: the API server does not know the token.
    async fn review_token(&self, token: &str) -> Result<Option<User>, String>;
    /// Whether `user` may do `attributes` on the node `node`.
    async fn review_access(
        &self,
        user: &User,
        attributes: Attributes,
        node: &str,
    ) -> Result<Decision, String>;
}

/// How callers are authorized (kubelet's `--authorization-mode`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Authorization {
    /// Every authenticated caller may do everything.
    AlwaysAllow,
    /// A SubjectAccessReview decides each request.
    #[default]
    Webhook,
}

impl std::str::FromStr for Authorization {
    type Err = String;
    fn from_str(text: &str) -> Result<Authorization, String> {
        match text {
            "AlwaysAllow" => Ok(Authorization::AlwaysAllow),
            "Webhook" => Ok(Authorization::Webhook),
            other => Err(format!("authorization mode {other:?}: not AlwaysAllow or Webhook")),
        }
    }
}

/// Who may call, and how that is found out.
#[derive(Clone, Default)]
pub struct Access {
    /// The API server's reviews; none: bearer tokens are refused, and `Webhook` refuses all.
    pub reviews: Option<Arc<dyn Reviews>>,
    /// Whether bearer tokens are reviewed (kubelet's `--authentication-token-webhook`).
    pub token_webhook: bool,
    pub authorization: Authorization,
    cache: Arc<Cache>,
}

impl std::fmt::Debug for Access {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Access")
            .field("reviews", &self.reviews.is_some())
            .field("token_webhook", &self.token_webhook)
            .field("authorization", &self.authorization)
            .finish()
    }
}

/// How a request is answered when it may not go on.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// 401: no caller is known.
    Unauthorized,
    /// 403, with kubelet's sentence.
    Forbidden(String),
    /// 500: a review could not be asked.
    Error(String),
}

/// How long kubelet keeps a review's answer: a token's 2 minutes, an allowed request's
/// 5 minutes, a refused one's 30 seconds.
const TOKEN_TTL: Duration = Duration::from_secs(120);
const ALLOWED_TTL: Duration = Duration::from_secs(300);
const DENIED_TTL: Duration = Duration::from_secs(30);
/// Answers kept at most, of each kind.
const CACHE_ENTRIES: usize = 4096;

/// Answers by a digest of what was asked, each with the moment its time is up.
type Answers<V> = Mutex<HashMap<[u8; 32], (Instant, V)>>;

/// Reviews' answers, until their time is up.
#[derive(Default)]
struct Cache {
    tokens: Answers<Option<User>>,
    decisions: Answers<Decision>,
}

fn digest(parts: &[&str]) -> [u8; 32] {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    for part in parts {
        context.update(&(part.len() as u64).to_le_bytes());
        context.update(part.as_bytes());
    }
    let mut key = [0; 32];
    key.copy_from_slice(context.finish().as_ref());
    key
}

fn cached<V: Clone>(map: &Answers<V>, key: &[u8; 32]) -> Option<V> {
    let map = map.lock().unwrap_or_else(|e| e.into_inner());
    map.get(key).filter(|(until, _)| Instant::now() < *until).map(|(_, v)| v.clone())
}

fn keep<V>(map: &Answers<V>, key: [u8; 32], ttl: Duration, value: V) {
    let mut map = map.lock().unwrap_or_else(|e| e.into_inner());
    let now = Instant::now();
    if map.len() >= CACHE_ENTRIES {
        map.retain(|_, (until, _)| now < *until);
    }
    if map.len() < CACHE_ENTRIES {
        map.insert(key, (now + ttl, value));
    }
}

impl Access {
    /// Access decided by `authorization`, bearer tokens reviewed when `token_webhook`, both
    /// through `reviews`.
    pub fn new(
        reviews: Option<Arc<dyn Reviews>>,
        token_webhook: bool,
        authorization: Authorization,
    ) -> Access {
        Access { reviews, token_webhook, authorization, cache: Arc::default() }
    }

    /// The caller: the certificate's user, else the bearer token's.
    pub async fn authenticate(
        &self,
        certificate: Option<&User>,
        authorization_header: Option<&str>,
    ) -> Result<User, Refusal> {
        if let Some(user) = certificate {
            return Ok(user.clone());
        }
        let token = bearer_token(authorization_header).ok_or(Refusal::Unauthorized)?;
        let reviews = self.reviews.as_ref().filter(|_| self.token_webhook).ok_or(Refusal::Unauthorized)?;
        let key = digest(&[token]);
        if let Some(known) = cached(&self.cache.tokens, &key) {
            return known.ok_or(Refusal::Unauthorized);
        }
        let user = reviews.review_token(token).await.map_err(|e| {
            tracing::warn!(error = %e, "kubelet api: cannot review a bearer token");
            Refusal::Unauthorized
        })?;
        keep(&self.cache.tokens, key, TOKEN_TTL, user.clone());
        user.ok_or(Refusal::Unauthorized)
    }

    /// Whether `user` may make the request `attributes` names, on `node`.
    pub async fn authorize(&self, user: &User, attributes: Attributes, node: &str) -> Result<(), Refusal> {
        if self.authorization == Authorization::AlwaysAllow {
            return Ok(());
        }
        let forbidden = || {
            Refusal::Forbidden(format!(
                "Forbidden (user={}, verb={}, resource=nodes, subresource={})",
                user.name, attributes.verb, attributes.subresource
            ))
        };
        let Some(reviews) = &self.reviews else { return Err(forbidden()) };
        let groups = user.groups.join("\n");
        let key = digest(&[&user.name, &user.uid, &groups, attributes.verb, attributes.subresource, node]);
        let decision = match cached(&self.cache.decisions, &key) {
            Some(decision) => decision,
            None => {
                let decision = reviews.review_access(user, attributes, node).await.map_err(|e| {
                    tracing::warn!(user = %user.name, error = %e, "kubelet api: cannot review a request");
                    Refusal::Error(format!(
                        "Authorization error (user={}, verb={}, resource=nodes, subresource={})",
                        user.name, attributes.verb, attributes.subresource
                    ))
                })?;
                let ttl = if decision.allowed { ALLOWED_TTL } else { DENIED_TTL };
                keep(&self.cache.decisions, key, ttl, decision.clone());
                decision
            }
        };
        if decision.allowed { Ok(()) } else { Err(forbidden()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn requests_named_as_kubelet_names_them() {
        // (method, path, verb, subresource)
        let table = [
            ("GET", "/containerLogs/default/web/main", "get", "proxy"),
            ("POST", "/exec/default/web/main", "create", "proxy"),
            ("GET", "/exec/default/web/main", "get", "proxy"),
            ("POST", "/portForward/default/web", "create", "proxy"),
            ("GET", "/metrics", "get", "metrics"),
            ("GET", "/metrics/cadvisor", "get", "metrics"),
            ("GET", "/metricsx", "get", "proxy"),
            ("GET", "/stats/summary", "get", "stats"),
            ("GET", "/stats", "get", "stats"),
            ("GET", "/logs/syslog", "get", "log"),
            ("GET", "/logs", "get", "log"),
            ("PUT", "/pods", "update", "proxy"),
            ("PATCH", "/pods", "patch", "proxy"),
            ("DELETE", "/pods", "delete", "proxy"),
            ("HEAD", "/pods", "", "proxy"),
        ];
        for (method, path, verb, subresource) in table {
            assert_eq!(attributes(method, path), Attributes { verb, subresource }, "{method} {path}");
        }
    }

    #[test]
    fn bearer_tokens_read_from_the_header() {
        // (header, token)
        let table = [
            (Some("Bearer abc"), Some("abc")),
            (Some("bearer  abc "), Some("abc")),
            (Some("Basic abc"), None),
            (Some("Bearer "), None),
            (Some("Bearer"), None),
            (None, None),
        ];
        for (header, token) in table {
            assert_eq!(bearer_token(header), token, "{header:?}");
        }
    }

    #[test]
    fn a_certificates_subject_is_its_user() {
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(rcgen::DnType::CommonName, "kube-apiserver-kubelet-client");
        params.distinguished_name.push(rcgen::DnType::OrganizationName, "system:masters");
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = params.self_signed(&key).unwrap();
        let user = certificate_user(certificate.der()).unwrap();
        assert_eq!(user.name, "kube-apiserver-kubelet-client");
        assert_eq!(user.groups, vec!["system:masters".to_string()]);
        let mut nameless = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        nameless.distinguished_name = rcgen::DistinguishedName::new();
        let nameless = nameless.self_signed(&key).unwrap();
        assert_eq!(certificate_user(nameless.der()), None);
        assert_eq!(certificate_user(b"not a certificate"), None);
    }

    /// Reviews from tables, counting the calls.
    #[derive(Default)]
    struct Tables {
        tokens: HashMap<String, User>,
        allowed: Vec<(String, &'static str)>,
        calls: AtomicUsize,
        failing: bool,
    }

    #[async_trait::async_trait]
    impl Reviews for Tables {
        async fn review_token(&self, token: &str) -> Result<Option<User>, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.failing {
                return Err("connection refused".into());
            }
            Ok(self.tokens.get(token).cloned())
        }
        async fn review_access(
            &self,
            user: &User,
            attributes: Attributes,
            _: &str,
        ) -> Result<Decision, String> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if self.failing {
                return Err("connection refused".into());
            }
            let allowed = self.allowed.iter().any(|(n, s)| *n == user.name && *s == attributes.subresource);
            Ok(Decision { allowed, reason: String::new() })
        }
    }

    fn user(name: &str) -> User {
        User { name: name.into(), ..Default::default() }
    }

    #[tokio::test]
    async fn callers_known_by_certificate_or_by_token_review() {
        let tables =
            Arc::new(Tables { tokens: [("t1".to_string(), user("alice"))].into(), ..Default::default() });
        let access = Access::new(Some(tables.clone()), true, Authorization::Webhook);
        let certified = user("apiserver");
        // (certificate, header, outcome)
        let table = [
            (Some(&certified), Some("Bearer t1"), Ok(certified.clone())),
            (None, Some("Bearer t1"), Ok(user("alice"))),
            (None, Some("Bearer t2"), Err(Refusal::Unauthorized)),
            (None, None, Err(Refusal::Unauthorized)),
        ];
        for (certificate, header, outcome) in table {
            assert_eq!(access.authenticate(certificate, header).await, outcome, "{header:?}");
        }
        let calls = tables.calls.load(Ordering::SeqCst);
        access.authenticate(None, Some("Bearer t1")).await.unwrap();
        access.authenticate(None, Some("Bearer t2")).await.unwrap_err();
        assert_eq!(tables.calls.load(Ordering::SeqCst), calls, "answers are cached, unknown tokens too");
        let without_webhook = Access::new(Some(tables), false, Authorization::Webhook);
        assert_eq!(without_webhook.authenticate(None, Some("Bearer t1")).await, Err(Refusal::Unauthorized));
        let failing = Access::new(
            Some(Arc::new(Tables { failing: true, ..Default::default() })),
            true,
            Authorization::Webhook,
        );
        assert_eq!(failing.authenticate(None, Some("Bearer t1")).await, Err(Refusal::Unauthorized));
    }

    #[tokio::test]
    async fn requests_allowed_by_review_or_outright() {
        let tables = Arc::new(Tables { allowed: vec![("alice".into(), "log")], ..Default::default() });
        let webhook = Access::new(Some(tables.clone()), true, Authorization::Webhook);
        let logs = Attributes { verb: "get", subresource: "log" };
        let proxy = Attributes { verb: "create", subresource: "proxy" };
        assert_eq!(webhook.authorize(&user("alice"), logs, "n1").await, Ok(()));
        assert_eq!(
            webhook.authorize(&user("alice"), proxy, "n1").await,
            Err(Refusal::Forbidden(
                "Forbidden (user=alice, verb=create, resource=nodes, subresource=proxy)".into()
            ))
        );
        let calls = tables.calls.load(Ordering::SeqCst);
        webhook.authorize(&user("alice"), logs, "n1").await.unwrap();
        webhook.authorize(&user("alice"), proxy, "n1").await.unwrap_err();
        assert_eq!(tables.calls.load(Ordering::SeqCst), calls, "both answers cached");
        let always = Access::new(None, false, Authorization::AlwaysAllow);
        assert_eq!(always.authorize(&user("anyone"), proxy, "n1").await, Ok(()));
        let no_reviews = Access::new(None, false, Authorization::Webhook);
        assert!(matches!(no_reviews.authorize(&user("alice"), logs, "n1").await, Err(Refusal::Forbidden(_))));
        let failing = Access::new(
            Some(Arc::new(Tables { failing: true, ..Default::default() })),
            true,
            Authorization::Webhook,
        );
        assert_eq!(
            failing.authorize(&user("alice"), logs, "n1").await,
            Err(Refusal::Error(
                "Authorization error (user=alice, verb=get, resource=nodes, subresource=log)".into()
            ))
        );
    }
}
