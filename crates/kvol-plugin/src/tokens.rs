//! Service-account tokens for the volumes that carry them (projected `serviceAccountToken`, CSI `tokenRequests`): the seam that mints them and the cache that rotates them as kubelet does.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use k8s_openapi::api::authentication::v1::TokenRequestStatus;
use kvol_api::pod::{PodInfo, TokenAudience};

/// Mints a token of the pod's service account, bound to the pod (in a cluster, the
/// TokenRequest API).
#[async_trait]
pub trait TokenSource: Send + Sync + fmt::Debug {
    async fn token(&self, pod: &PodInfo, request: &TokenAudience) -> Result<TokenRequestStatus, String>;
}

/// A token's age past which kubelet asks for a new one whatever its lifetime.
pub const MAX_TOKEN_AGE: Duration = Duration::from_secs(24 * 3600);
/// The share of a token's life after which kubelet asks for a new one.
pub const REFRESH_AT_LIFE_PERCENT: u32 = 80;
/// The lifetime assumed when neither the answer nor the request says (the API server's default).
const DEFAULT_LIFETIME: Duration = Duration::from_secs(3600);

/// Whether a token issued at `issued`, expiring at `expires`, is to be replaced at `now`
/// (kubelet's token manager): expired, older than 24 h, or past 80 % of its life. `held_for`
/// is how long it has been held by the monotonic clock, which a wall clock set back cannot
/// shorten: past 80 % of its life by that clock it is replaced too (kubelet, reading the wall
/// clock alone, keeps a token that expires while its node's clock runs an hour behind). Pure.
pub fn needs_refresh(issued: SystemTime, expires: SystemTime, now: SystemTime, held_for: Duration) -> bool {
    if now >= expires {
        return true;
    }
    let age = now.duration_since(issued).unwrap_or_default().max(held_for);
    let life = expires.duration_since(issued).unwrap_or_default();
    age >= MAX_TOKEN_AGE || age >= life * REFRESH_AT_LIFE_PERCENT / 100
}

/// A token and its times; its debug output never shows the token.
#[derive(Clone)]
struct Cached {
    token: String,
    issued: SystemTime,
    expires: SystemTime,
    /// When it was minted, by the monotonic clock.
    minted: std::time::Instant,
}

impl fmt::Debug for Cached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cached")
            .field("issued", &self.issued)
            .field("expires", &self.expires)
            .finish_non_exhaustive()
    }
}

/// Tokens by pod and audience, minted once and again only when [`needs_refresh`] says so: a
/// republish of an unchanged volume asks the API server for nothing.
#[derive(Debug)]
pub struct TokenCache {
    source: Arc<dyn TokenSource>,
    tokens: Mutex<HashMap<(String, TokenAudience), Cached>>,
}

impl TokenCache {
    pub fn new(source: Arc<dyn TokenSource>) -> TokenCache {
        TokenCache { source, tokens: Mutex::new(HashMap::new()) }
    }

    /// The pod's token for `want`, minted when there is none or it is due for refresh at `now`.
    pub async fn token(
        &self,
        pod: &PodInfo,
        want: &TokenAudience,
        now: SystemTime,
    ) -> Result<String, String> {
        let key = (pod.uid.clone(), want.clone());
        if let Some(cached) =
            self.lock().get(&key).filter(|c| !needs_refresh(c.issued, c.expires, now, c.minted.elapsed()))
        {
            return Ok(cached.token.clone());
        }
        let status = self.source.token(pod, want).await?;
        let token = status.token.clone().filter(|t| !t.is_empty()).ok_or_else(|| {
            format!("the token request of pod {}/{} came back without a token", pod.namespace, pod.name)
        })?;
        let asked =
            want.expiration_seconds.map_or(DEFAULT_LIFETIME, |s| Duration::from_secs(s.max(0) as u64));
        let expires = expiry(&status).unwrap_or(now + asked);
        let cached = Cached { token, issued: now, expires, minted: std::time::Instant::now() };
        self.lock().insert(key, cached.clone());
        Ok(cached.token)
    }

    /// Forgets the pod's tokens (its volumes are torn down).
    pub fn forget_pod(&self, pod_uid: &str) {
        self.lock().retain(|(uid, _), _| uid != pod_uid);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<(String, TokenAudience), Cached>> {
        self.tokens.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// When the answer says the token expires.
fn expiry(status: &TokenRequestStatus) -> Option<SystemTime> {
    let seconds = status.expiration_timestamp.as_ref()?.0.as_second();
    let seconds = u64::try_from(seconds).ok().filter(|s| *s > 0)?;
    Some(SystemTime::UNIX_EPOCH + Duration::from_secs(seconds))
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    #[test]
    fn tokens_are_refreshed_as_kubelet_refreshes_them() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let h = |hours: f64| Duration::from_secs_f64(hours * 3600.0);
        // (name, lifetime, age, refresh)
        let cases = [
            ("fresh", h(1.0), h(0.5), false),
            ("just under 80 %", h(1.0), h(0.79), false),
            ("at 80 %", h(1.0), h(0.8), true),
            ("expired", h(1.0), h(1.5), true),
            ("a two-day token at 23 h", h(48.0), h(23.0), false),
            ("a two-day token at 24 h", h(48.0), h(24.0), true),
            ("ten minutes, at 7 min", Duration::from_secs(600), Duration::from_secs(420), false),
            ("ten minutes, at 8 min", Duration::from_secs(600), Duration::from_secs(480), true),
        ];
        for (name, life, age, want) in cases {
            assert_eq!(needs_refresh(t0, t0 + life, t0 + age, age), want, "{name}");
        }
    }

    #[test]
    fn a_clock_jump_neither_keeps_a_token_past_its_life_nor_drops_a_fresh_one_for_long() {
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let min = |m: u64| Duration::from_secs(m * 60);
        let life = min(60);
        // (name, the wall clock's reading, held for by the monotonic clock, refresh)
        let cases = [
            ("no jump, 50 min in", t0 + min(50), min(50), true),
            ("set back an hour, 50 min in: the monotonic age counts", t0 - min(10), min(50), true),
            ("set back an hour, 10 min in", t0 - min(50), min(10), false),
            (
                "set forward an hour, 1 min in: looks expired, minted again (early, harmless)",
                t0 + min(61),
                min(1),
                true,
            ),
        ];
        for (name, now, held_for, want) in cases {
            assert_eq!(needs_refresh(t0, t0 + life, now, held_for), want, "{name}");
        }
    }

    #[derive(Debug, Default)]
    struct Counting(AtomicU32);

    #[async_trait]
    impl TokenSource for Counting {
        async fn token(&self, pod: &PodInfo, request: &TokenAudience) -> Result<TokenRequestStatus, String> {
            let n = self.0.fetch_add(1, Ordering::SeqCst) + 1;
            let mut status = TokenRequestStatus {
                token: Some(format!("{}-{}-{n}", pod.uid, request.audience)),
                ..Default::default()
            };
            // Expires an hour after 1,800,000,000.
            status.expiration_timestamp =
                serde_json::from_value(serde_json::json!("2027-01-15T09:00:00Z")).ok();
            Ok(status)
        }
    }

    #[test]
    fn a_cached_token_is_minted_once_until_it_is_due() {
        let source = Arc::new(Counting::default());
        let cache = TokenCache::new(source.clone());
        let pod = PodInfo { uid: "u1".into(), ..PodInfo::default() };
        let want = TokenAudience { audience: "vault".into(), expiration_seconds: Some(3600) };
        let t0 = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let rt = tokio::runtime::Builder::new_current_thread().build().unwrap();
        rt.block_on(async {
            assert_eq!(cache.token(&pod, &want, t0).await.unwrap(), "u1-vault-1");
            assert_eq!(cache.token(&pod, &want, t0 + Duration::from_secs(60)).await.unwrap(), "u1-vault-1");
            let other = TokenAudience { audience: String::new(), expiration_seconds: None };
            assert_eq!(
                cache.token(&pod, &other, t0).await.unwrap(),
                "u1--2",
                "another audience, another token"
            );
            assert_eq!(
                cache.token(&pod, &want, t0 + Duration::from_secs(2900)).await.unwrap(),
                "u1-vault-3",
                "past 80 %"
            );
            cache.forget_pod("u1");
            assert_eq!(cache.token(&pod, &want, t0 + Duration::from_secs(2901)).await.unwrap(), "u1-vault-4");
        });
        let shown = format!("{cache:?}");
        assert!(!shown.contains("u1-vault"), "{shown}");
    }
}
