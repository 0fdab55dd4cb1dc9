//! The credentials an image is pulled with, from the pod's `imagePullSecrets` (docker config JSON Secrets), matched to the image's registry as kubelet's keyring matches them; pure.

use std::collections::BTreeMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD as BASE64;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kvol_api::ObjectSet;
use kvol_api::projection::secret_keys;
use kvol_cri as cri;

/// The registry kubelet's keyring files an image without a registry under.
const DEFAULT_REGISTRY: &str = "index.docker.io";

/// What reading the pod's pull secrets found: the keyring, and the secrets that could not be
/// used (kubelet goes on without them, warning `FailedToRetrieveImagePullSecret`).
#[derive(Debug, Default)]
pub struct Keyring {
    /// Schemeless registry keys (`host[:port][/path]`), each with its credentials in order.
    entries: BTreeMap<String, Vec<cri::AuthConfig>>,
    pub unusable: Vec<String>,
}

impl Keyring {
    /// The keyring of `pod`'s `imagePullSecrets`, read from `objects`.
    pub fn of(pod: &Pod, objects: &ObjectSet) -> Keyring {
        let mut keyring = Keyring::default();
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let names = pod.spec.as_ref().and_then(|s| s.image_pull_secrets.as_ref()).into_iter().flatten();
        for name in names.filter_map(|r| (!r.name.is_empty()).then_some(r.name.as_str())) {
            match objects.secrets.get(&format!("{namespace}/{name}")) {
                Some(secret) => {
                    if let Err(why) = keyring.add_secret(secret) {
                        keyring.unusable.push(format!("secret {namespace}/{name}: {why}"));
                    }
                }
                None => keyring.unusable.push(format!("secret {namespace}/{name} not found")),
            }
        }
        keyring
    }

    /// Adds a `kubernetes.io/dockerconfigjson` (`.dockerconfigjson`, `{"auths": {…}}`) or a
    /// `kubernetes.io/dockercfg` (`.dockercfg`, the registries at the top) Secret.
    fn add_secret(&mut self, secret: &Secret) -> Result<(), String> {
        let keys = secret_keys(secret);
        let (text, nested) = match (keys.get(".dockerconfigjson"), keys.get(".dockercfg")) {
            (Some(text), _) => (text, true),
            (None, Some(text)) => (text, false),
            (None, None) => return Err("has neither .dockerconfigjson nor .dockercfg".into()),
        };
        let json: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| format!("is not docker config JSON: {e}"))?;
        let registries = if nested { &json["auths"] } else { &json };
        let registries = registries.as_object().ok_or("names no registries")?;
        for (location, entry) in registries {
            self.add(location, auth_config(entry)?);
        }
        Ok(())
    }

    fn add(&mut self, location: &str, auth: cri::AuthConfig) {
        let (host, path) = split_schemeless(strip_scheme(location));
        // `/v1/` and `/v2/` name the registry itself, as the docker client reads them.
        let path = path.strip_prefix("/v1").or_else(|| path.strip_prefix("/v2")).unwrap_or(path);
        let key = if path.is_empty() || path == "/" { host.to_string() } else { format!("{host}{path}") };
        self.entries.entry(key).or_default().push(auth);
    }

    /// The credentials to try for `image`, most specific key first; none: pull anonymously.
    pub fn lookup(&self, image: &str) -> Vec<cri::AuthConfig> {
        let mut found: Vec<cri::AuthConfig> = Vec::new();
        // Longer keys sort after their prefixes: reversed, the most specific comes first.
        for (key, auths) in self.entries.iter().rev() {
            if key_matches(key, image) {
                found.extend(auths.iter().cloned());
            }
        }
        if found.is_empty() && is_default_registry(image) {
            found.extend(self.entries.get(DEFAULT_REGISTRY).into_iter().flatten().cloned());
        }
        found
    }
}

/// A docker config entry as CRI's AuthConfig; `auth` (base64 `user:password`) fills an
/// unset user and password.
fn auth_config(entry: &serde_json::Value) -> Result<cri::AuthConfig, String> {
    let field = |name: &str| entry.get(name).and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let mut auth = cri::AuthConfig {
        username: field("username"),
        password: field("password"),
        identity_token: field("identitytoken"),
        ..Default::default()
    };
    let encoded = field("auth");
    if !encoded.is_empty() {
        let decoded = BASE64.decode(encoded.trim()).map_err(|e| format!("its auth is not base64: {e}"))?;
        let text = String::from_utf8(decoded).map_err(|_| "its auth is not text".to_string())?;
        let (user, password) = text.split_once(':').ok_or("its auth is not user:password")?;
        if auth.username.is_empty() && auth.password.is_empty() {
            auth.username = user.to_string();
            auth.password = password.to_string();
        }
    }
    Ok(auth)
}

fn strip_scheme(location: &str) -> &str {
    location.strip_prefix("https://").or_else(|| location.strip_prefix("http://")).unwrap_or(location)
}

/// `host[:port]` and the path after it (with its `/`).
fn split_schemeless(url: &str) -> (&str, &str) {
    match url.find('/') {
        Some(i) => (&url[..i], &url[i..]),
        None => (url, ""),
    }
}

/// Whether a keyring key matches an image as kubelet's `URLsMatch` decides: the same port, as
/// many host labels each matching as a glob (`*.example.com`), and the key's path a prefix
/// of the image's.
fn key_matches(key: &str, image: &str) -> bool {
    let (key_host, key_path) = split_schemeless(key);
    let (image_host, image_path) = split_schemeless(image);
    let (key_name, key_port) = key_host.split_once(':').unwrap_or((key_host, ""));
    let (image_name, image_port) = image_host.split_once(':').unwrap_or((image_host, ""));
    let key_labels: Vec<&str> = key_name.split('.').collect();
    let image_labels: Vec<&str> = image_name.split('.').collect();
    key_port == image_port
        && key_labels.len() == image_labels.len()
        && key_labels.iter().zip(&image_labels).all(|(k, i)| glob(k, i))
        && image_path.starts_with(key_path)
}

/// A shell glob of `*` and `?` over one host label.
fn glob(pattern: &str, text: &str) -> bool {
    match pattern.split_once('*') {
        None => {
            pattern.len() == text.len() && pattern.chars().zip(text.chars()).all(|(p, t)| p == '?' || p == t)
        }
        Some((head, tail)) => {
            text.len() >= head.len()
                && glob(head, &text[..head.len()])
                && (head.len()..=text.len()).any(|i| glob(tail, &text[i..]))
        }
    }
}

/// Whether the image lives on Docker Hub: no registry part, `docker.io`, or a first part that
/// is no host (neither `.` nor `:` in it).
fn is_default_registry(image: &str) -> bool {
    match image.split_once('/') {
        None => !image.is_empty(),
        Some(("", _)) => false,
        Some(("docker.io", _)) => true,
        Some((first, _)) => !first.contains(['.', ':']),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn secret(name: &str, kind: &str, key: &str, config: serde_json::Value) -> Secret {
        let encoded = BASE64.encode(config.to_string().as_bytes());
        serde_json::from_value(json!({"metadata": {"name": name, "namespace": "shop"}, "type": kind,
            "data": {key: encoded}}))
        .unwrap()
    }

    fn keyring(secrets: Vec<Secret>, names: &[&str]) -> Keyring {
        let mut objects = ObjectSet::default();
        for s in secrets {
            objects.secrets.insert(format!("shop/{}", s.metadata.name.clone().unwrap()), s);
        }
        let refs: Vec<_> = names.iter().map(|n| json!({"name": n})).collect();
        let pod: Pod = serde_json::from_value(json!({"metadata": {"name": "p", "namespace": "shop"},
            "spec": {"containers": [], "imagePullSecrets": refs}}))
        .unwrap();
        Keyring::of(&pod, &objects)
    }

    #[test]
    fn registries_are_matched_as_kubelet_matches_them() {
        let user_pass = BASE64.encode(b"ann:s3cret");
        let config = json!({"auths": {
            "registry.example.com:5000": {"auth": user_pass},
            "https://index.docker.io/v1/": {"username": "hub", "password": "hubpw"},
            "*.corp.example": {"username": "corp", "password": "c"},
            "registry.example.com:5000/team": {"username": "team", "password": "t"},
        }});
        let ring = keyring(
            vec![secret("pull", "kubernetes.io/dockerconfigjson", ".dockerconfigjson", config)],
            &["pull", "absent"],
        );
        assert_eq!(ring.unusable, vec!["secret shop/absent not found".to_string()]);
        let users = |image: &str| ring.lookup(image).into_iter().map(|a| a.username).collect::<Vec<_>>();
        let cases: [(&str, &[&str]); 8] = [
            ("registry.example.com:5000/app:1", &["ann"]),
            ("registry.example.com:5000/team/app:1", &["team", "ann"]),
            ("registry.example.com/app:1", &[]),
            ("busybox", &["hub"]),
            ("library/busybox:1.36", &["hub"]),
            ("docker.io/library/busybox", &["hub"]),
            ("images.corp.example/app", &["corp"]),
            ("a.b.corp.example/app", &[]),
        ];
        for (image, want) in cases {
            assert_eq!(users(image), want.to_vec(), "{image}");
        }
        let ann = &ring.lookup("registry.example.com:5000/app")[0];
        assert_eq!((ann.username.as_str(), ann.password.as_str()), ("ann", "s3cret"));
    }

    #[test]
    fn the_older_dockercfg_and_bad_secrets() {
        let old = secret(
            "old",
            "kubernetes.io/dockercfg",
            ".dockercfg",
            json!({"quay.io": {"username": "q", "password": "p"}}),
        );
        let garbage = {
            let mut s = secret("garbage", "Opaque", ".dockerconfigjson", json!({}));
            s.data
                .as_mut()
                .unwrap()
                .insert(".dockerconfigjson".into(), k8s_openapi::ByteString(b"{not json".to_vec()));
            s
        };
        let plain = secret("plain", "Opaque", "token", json!("x"));
        let ring = keyring(vec![old, garbage, plain], &["old", "garbage", "plain"]);
        assert_eq!(ring.lookup("quay.io/org/app")[0].username, "q");
        assert_eq!(ring.unusable.len(), 2, "{:?}", ring.unusable);
        assert!(
            ring.unusable[0].starts_with("secret shop/garbage: is not docker config JSON"),
            "{:?}",
            ring.unusable
        );
        assert_eq!(ring.unusable[1], "secret shop/plain: has neither .dockerconfigjson nor .dockercfg");
    }

    #[test]
    fn globs() {
        for (pattern, text, want) in [
            ("*", "abc", true),
            ("a*c", "abbc", true),
            ("a?c", "abc", true),
            ("a*d", "abc", false),
            ("", "", true),
            ("x", "", false),
        ] {
            assert_eq!(glob(pattern, text), want, "{pattern} {text}");
        }
    }
}
