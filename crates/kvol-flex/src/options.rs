//! The options JSON handed to drivers: upstream's keys, mount-only extras, Secrets, user options last.
//!
//! Merge order (later wins): `kubernetes.io/fsType`, `kubernetes.io/readwrite`,
//! `kubernetes.io/pvOrVolumeName`; then, for `mount` only, the pod's name, namespace, uid and
//! service account, one `kubernetes.io/secret/<key>` per key of the referenced Secret (base64)
//! and `kubernetes.io/mounterArgs.FsGroup`; then the user's `options` map. The JSON is an object
//! with sorted keys and Go's HTML-safe escaping, byte for byte what kubelet passes.

use std::collections::BTreeMap;

use base64::Engine;
use k8s_openapi::api::core::v1::Secret;
use kvol_plugin::VolumeSpec;
use kvol_plugin::plugin::PodInfo;

/// The filesystem type of the volume (`fsType` of the source, may be empty).
pub const OPTION_FS_TYPE: &str = "kubernetes.io/fsType";
/// `ro` or `rw`.
pub const OPTION_READ_WRITE: &str = "kubernetes.io/readwrite";
/// The PV's name or the pod's name for the inline volume.
pub const OPTION_PV_OR_VOLUME_NAME: &str = "kubernetes.io/pvOrVolumeName";
/// The prefix of Secret keys: `kubernetes.io/secret/<key>`.
pub const OPTION_SECRET_PREFIX: &str = "kubernetes.io/secret";
/// The pod's fsGroup, in decimal.
pub const OPTION_FS_GROUP: &str = "kubernetes.io/mounterArgs.FsGroup";
pub const OPTION_POD_NAME: &str = "kubernetes.io/pod.name";
pub const OPTION_POD_NAMESPACE: &str = "kubernetes.io/pod.namespace";
pub const OPTION_POD_UID: &str = "kubernetes.io/pod.uid";
pub const OPTION_SERVICE_ACCOUNT_NAME: &str = "kubernetes.io/serviceAccount.name";

/// Driver options, by key.
pub type Options = BTreeMap<String, String>;

/// The Flexvolume source of a spec, inline or persistent, as the options need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlexSource<'a> {
    pub driver: &'a str,
    pub fs_type: &'a str,
    /// Upstream's `getReadOnly`: the inline source's `readOnly`; for a PV the spec's read-only
    /// flag (the claim's or the pod's), not the PV source's.
    pub read_only: bool,
    pub options: Option<&'a BTreeMap<String, String>>,
    pub secret_ref: Option<SecretRef<'a>>,
    pub persistent: bool,
}

/// Where a source's Secret is: a name, and for a PV maybe a namespace.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SecretRef<'a> {
    pub name: &'a str,
    /// Only PVs name a namespace; empty or absent means the pod's.
    pub namespace: Option<&'a str>,
}

impl<'a> FlexSource<'a> {
    /// The spec's Flexvolume source, if it has one.
    pub fn of(spec: &'a VolumeSpec) -> Option<FlexSource<'a>> {
        if let Some(pv) = spec.pv() {
            let source = pv.spec.as_ref()?.flex_volume.as_ref()?;
            Some(FlexSource {
                driver: &source.driver,
                fs_type: source.fs_type.as_deref().unwrap_or_default(),
                read_only: spec.read_only,
                options: source.options.as_ref(),
                secret_ref: source.secret_ref.as_ref().map(|r| SecretRef {
                    name: r.name.as_deref().unwrap_or_default(),
                    namespace: r.namespace.as_deref(),
                }),
                persistent: true,
            })
        } else {
            let source = spec.inline_volume()?.flex_volume.as_ref()?;
            Some(FlexSource {
                driver: &source.driver,
                fs_type: source.fs_type.as_deref().unwrap_or_default(),
                read_only: source.read_only.unwrap_or(false),
                options: source.options.as_ref(),
                secret_ref: source.secret_ref.as_ref().map(|r| SecretRef { name: &r.name, namespace: None }),
                persistent: false,
            })
        }
    }

    /// Where the Secret is (`namespace`, `name`): an inline volume's in the pod's namespace, a PV's
    /// in its own namespace or else the pod's. `None` when there is no reference, or its name or
    /// the namespace is empty (upstream then passes no Secret).
    pub fn secret_location(&self, pod_namespace: &'a str) -> Option<(&'a str, &'a str)> {
        let secret = self.secret_ref?;
        let namespace = secret.namespace.filter(|ns| !ns.is_empty()).unwrap_or(pod_namespace);
        (!secret.name.is_empty() && !namespace.is_empty()).then_some((namespace, secret.name))
    }
}

/// The options of every call that takes a spec: the base keys, then `extra`, then the user's
/// options.
pub fn driver_options(source: &FlexSource<'_>, volume_name: &str, extra: Options) -> Options {
    let mut options = Options::new();
    options.insert(OPTION_FS_TYPE.to_string(), source.fs_type.to_string());
    options.insert(OPTION_READ_WRITE.to_string(), if source.read_only { "ro" } else { "rw" }.to_string());
    options.insert(OPTION_PV_OR_VOLUME_NAME.to_string(), volume_name.to_string());
    options.extend(extra);
    if let Some(user) = source.options {
        options.extend(user.iter().map(|(k, v)| (k.clone(), v.clone())));
    }
    options
}

/// The extras of `mount`: the pod, the Secret's keys (base64 of each value) and the fsGroup.
pub fn mount_extras(pod: &PodInfo, secret: &BTreeMap<String, Vec<u8>>) -> Options {
    let mut extra = Options::new();
    extra.insert(OPTION_POD_NAME.to_string(), pod.name.clone());
    extra.insert(OPTION_POD_NAMESPACE.to_string(), pod.namespace.clone());
    extra.insert(OPTION_POD_UID.to_string(), pod.uid.clone());
    extra.insert(OPTION_SERVICE_ACCOUNT_NAME.to_string(), pod.service_account.clone());
    for (key, value) in secret {
        let encoded = base64::engine::general_purpose::STANDARD.encode(value);
        extra.insert(format!("{OPTION_SECRET_PREFIX}/{key}"), encoded);
    }
    if let Some(fs_group) = pod.fs_group {
        extra.insert(OPTION_FS_GROUP.to_string(), fs_group.to_string());
    }
    extra
}

/// The values of a Secret for driver `driver`, refused unless its `type` is the driver name
/// (upstream's `GetSecretForPV`). `stringData` counts too, over `data`, as the API server would
/// merge it: standalone manifests may carry it.
pub fn secret_values(secret: &Secret, driver: &str) -> Result<BTreeMap<String, Vec<u8>>, String> {
    let secret_type = secret.type_.as_deref().unwrap_or_default();
    if secret_type != driver {
        return Err(format!(
            "it has type {secret_type:?}, and a flexvolume driver only reads secrets \
             of its own name as type ({driver:?})"
        ));
    }
    let mut values: BTreeMap<String, Vec<u8>> = BTreeMap::new();
    for (key, value) in secret.data.iter().flatten() {
        values.insert(key.clone(), value.0.clone());
    }
    for (key, value) in secret.string_data.iter().flatten() {
        values.insert(key.clone(), value.clone().into_bytes());
    }
    Ok(values)
}

/// The options as the one JSON argument: an object with sorted keys, escaped as Go's
/// `json.Marshal` escapes (`<`, `>`, `&`, U+2028 and U+2029 as `\uXXXX`).
pub fn to_json(options: &Options) -> String {
    // Serialising a map of strings cannot fail.
    let json = serde_json::to_string(options).unwrap_or_default();
    // These characters can only appear inside JSON strings, so replacing them everywhere is safe.
    let mut escaped = String::with_capacity(json.len());
    for c in json.chars() {
        match c {
            '<' => escaped.push_str("\\u003c"),
            '>' => escaped.push_str("\\u003e"),
            '&' => escaped.push_str("\\u0026"),
            '\u{2028}' => escaped.push_str("\\u2028"),
            '\u{2029}' => escaped.push_str("\\u2029"),
            c => escaped.push(c),
        }
    }
    escaped
}

/// Driver arguments as logs show them: in an options JSON the values of Secret keys are
/// replaced (upstream logs them as they are). Formats only when a log line is written.
#[derive(Clone, Copy)]
pub struct RedactedArgs<'a>(pub &'a [String]);

impl std::fmt::Debug for RedactedArgs<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.0.iter().map(|arg| redact_secrets(arg))).finish()
    }
}

/// One driver argument as logs may show it: an options JSON with the values of its
/// `kubernetes.io/secret/…` keys replaced; any other argument mentioning Secrets hidden whole.
pub fn redact_secrets(arg: &str) -> String {
    const HIDDEN: &str = "<redacted>";
    if !arg.contains(OPTION_SECRET_PREFIX) {
        return arg.to_string();
    }
    match serde_json::from_str::<Options>(arg) {
        Ok(mut options) => {
            let prefix = format!("{OPTION_SECRET_PREFIX}/");
            for (_, value) in options.iter_mut().filter(|(key, _)| key.starts_with(&prefix)) {
                *value = HIDDEN.to_string();
            }
            serde_json::to_string(&options).unwrap_or_default()
        }
        Err(_) => HIDDEN.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::{
        FlexPersistentVolumeSource, FlexVolumeSource, LocalObjectReference, PersistentVolumeSpec,
        SecretReference, Volume,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use kvol_plugin::testing::{inline, pv, volume};

    use super::*;

    fn map(pairs: &[(&str, &str)]) -> Options {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn inline_flex(source: FlexVolumeSource) -> VolumeSpec {
        inline(Volume { flex_volume: Some(source), ..volume("vol") })
    }

    fn pv_flex(source: FlexPersistentVolumeSource, read_only: bool) -> VolumeSpec {
        pv("pv-1", PersistentVolumeSpec { flex_volume: Some(source), ..PersistentVolumeSpec::default() })
            .with_read_only(read_only)
    }

    #[test]
    fn sources_read_like_upstream_getters() {
        let user = map(&[("size", "1Gi")]);
        let inline_ro = inline_flex(FlexVolumeSource {
            driver: "acme/lvm".into(),
            fs_type: Some("xfs".into()),
            read_only: Some(true),
            options: Some(user.clone()),
            secret_ref: Some(LocalObjectReference { name: "creds".into() }),
        });
        let source = FlexSource::of(&inline_ro).unwrap();
        assert_eq!(
            source,
            FlexSource {
                driver: "acme/lvm",
                fs_type: "xfs",
                read_only: true,
                options: Some(&user),
                secret_ref: Some(SecretRef { name: "creds", namespace: None }),
                persistent: false,
            }
        );
        // An inline volume's readOnly comes from its source, not the spec flag.
        let inline_spec_ro =
            inline_flex(FlexVolumeSource { driver: "d".into(), ..Default::default() }).with_read_only(true);
        assert!(!FlexSource::of(&inline_spec_ro).unwrap().read_only);
        // A PV's comes from the spec flag, not its source.
        let pv_source_ro =
            FlexPersistentVolumeSource { driver: "d".into(), read_only: Some(true), ..Default::default() };
        assert!(!FlexSource::of(&pv_flex(pv_source_ro.clone(), false)).unwrap().read_only);
        assert!(FlexSource::of(&pv_flex(pv_source_ro, true)).unwrap().read_only);
        assert_eq!(FlexSource::of(&kvol_plugin::testing::inline_empty_dir("e")), None);
        assert_eq!(FlexSource::of(&kvol_plugin::testing::csi_pv("c", "csi.example.com")), None);
    }

    #[test]
    fn secret_locations_follow_upstream() {
        let pv_ref = |name: Option<&str>, namespace: Option<&str>| {
            pv_flex(
                FlexPersistentVolumeSource {
                    driver: "d".into(),
                    secret_ref: Some(SecretReference {
                        name: name.map(str::to_string),
                        namespace: namespace.map(str::to_string),
                    }),
                    ..Default::default()
                },
                false,
            )
        };
        let inline_ref = |name: &str| {
            inline_flex(FlexVolumeSource {
                driver: "d".into(),
                secret_ref: Some(LocalObjectReference { name: name.into() }),
                ..Default::default()
            })
        };
        let no_ref = inline_flex(FlexVolumeSource { driver: "d".into(), ..Default::default() });
        type Location<'a> = Option<(&'a str, &'a str)>;
        let cases: Vec<(VolumeSpec, &str, Location<'_>)> = vec![
            (inline_ref("creds"), "pods", Some(("pods", "creds"))),
            (inline_ref(""), "pods", None),
            (inline_ref("creds"), "", None),
            (no_ref, "pods", None),
            (pv_ref(Some("creds"), Some("vault")), "pods", Some(("vault", "creds"))),
            (pv_ref(Some("creds"), Some("")), "pods", Some(("pods", "creds"))),
            (pv_ref(Some("creds"), None), "pods", Some(("pods", "creds"))),
            (pv_ref(Some("creds"), None), "", None),
            (pv_ref(None, Some("vault")), "pods", None),
        ];
        for (spec, pod_namespace, expected) in cases {
            let source = FlexSource::of(&spec).unwrap();
            assert_eq!(source.secret_location(pod_namespace), expected, "{source:?} in {pod_namespace:?}");
        }
    }

    #[test]
    fn options_merge_in_upstream_order() {
        let pod = PodInfo {
            name: "web-0".into(),
            namespace: "shop".into(),
            uid: "uid-1".into(),
            service_account: "builder".into(),
            fs_group: Some(2000),
            fs_group_change_policy: kvol_plugin::plugin::FsGroupChangePolicy::Always,
            memory_limit: None,
        };
        let secret = BTreeMap::from([("password".to_string(), b"s3cr3t".to_vec())]);
        let overrides =
            map(&[("kubernetes.io/fsType", "btrfs"), (OPTION_POD_NAME, "spoofed"), ("size", "1Gi")]);
        let source = |read_only| FlexSource {
            driver: "acme/lvm",
            fs_type: "ext4",
            read_only,
            options: None,
            secret_ref: None,
            persistent: true,
        };
        let base =
            map(&[(OPTION_FS_TYPE, "ext4"), (OPTION_READ_WRITE, "rw"), (OPTION_PV_OR_VOLUME_NAME, "pv-1")]);
        let with_mount = {
            let mut m = base.clone();
            m.extend(map(&[
                (OPTION_POD_NAME, "web-0"),
                (OPTION_POD_NAMESPACE, "shop"),
                (OPTION_POD_UID, "uid-1"),
                (OPTION_SERVICE_ACCOUNT_NAME, "builder"),
                ("kubernetes.io/secret/password", "czNjcjN0"),
                (OPTION_FS_GROUP, "2000"),
            ]));
            m
        };
        let cases: Vec<(FlexSource<'_>, Options, Options)> = vec![
            (source(false), Options::new(), base.clone()),
            (source(true), Options::new(), {
                let mut m = base.clone();
                m.insert(OPTION_READ_WRITE.into(), "ro".into());
                m
            }),
            (source(false), mount_extras(&pod, &secret), with_mount.clone()),
            // The user's options come last and override everything, the extras included.
            (FlexSource { options: Some(&overrides), ..source(false) }, mount_extras(&pod, &secret), {
                let mut m = with_mount.clone();
                m.insert(OPTION_FS_TYPE.into(), "btrfs".into());
                m.insert(OPTION_POD_NAME.into(), "spoofed".into());
                m.insert("size".into(), "1Gi".into());
                m
            }),
        ];
        for (source, extra, expected) in cases {
            assert_eq!(driver_options(&source, "pv-1", extra), expected, "{source:?}");
        }
        // No fsGroup, no key; no Secret, no secret keys; the pod keys are always there.
        let bare = mount_extras(&PodInfo::default(), &BTreeMap::new());
        assert_eq!(
            bare,
            map(&[
                (OPTION_POD_NAME, ""),
                (OPTION_POD_NAMESPACE, ""),
                (OPTION_POD_UID, ""),
                (OPTION_SERVICE_ACCOUNT_NAME, ""),
            ])
        );
    }

    #[test]
    fn secrets_encode_every_byte_in_standard_base64() {
        let secret = BTreeMap::from([
            ("empty".to_string(), Vec::new()),
            ("binary".to_string(), vec![0, 0xff, 0xfe, b'\n']),
            ("pad1".to_string(), b"ab".to_vec()),
        ]);
        let extra = mount_extras(&PodInfo::default(), &secret);
        assert_eq!(extra["kubernetes.io/secret/empty"], "");
        assert_eq!(extra["kubernetes.io/secret/binary"], "AP/+Cg==");
        assert_eq!(extra["kubernetes.io/secret/pad1"], "YWI=");
    }

    #[test]
    fn secrets_must_have_the_driver_name_as_type() {
        let secret = |type_: Option<&str>| Secret {
            metadata: ObjectMeta {
                name: Some("creds".into()),
                namespace: Some("shop".into()),
                ..Default::default()
            },
            type_: type_.map(str::to_string),
            data: Some(BTreeMap::from([
                ("user".to_string(), ByteString(b"admin".to_vec())),
                ("token".to_string(), ByteString(b"old".to_vec())),
            ])),
            string_data: Some(BTreeMap::from([("token".to_string(), "new".to_string())])),
            ..Default::default()
        };
        let values = secret_values(&secret(Some("acme/lvm")), "acme/lvm").unwrap();
        assert_eq!(
            values,
            BTreeMap::from([("token".to_string(), b"new".to_vec()), ("user".to_string(), b"admin".to_vec())])
        );
        let cases = [(Some("Opaque"), "\"Opaque\""), (None, "\"\""), (Some("acme/LVM"), "\"acme/LVM\"")];
        for (type_, shown) in cases {
            let err = secret_values(&secret(type_), "acme/lvm").unwrap_err();
            assert!(err.starts_with(&format!("it has type {shown}")), "{err}");
            assert!(err.contains("(\"acme/lvm\")"), "{err}");
        }
    }

    #[test]
    fn logs_never_show_secret_values() {
        let with_secret = to_json(&map(&[
            ("kubernetes.io/secret/password", "czNjcjN0"),
            ("kubernetes.io/pod.name", "web-0"),
        ]));
        let cases = [
            ("/var/lib/kubelet/pods/x", "/var/lib/kubelet/pods/x".to_string()),
            (r#"{"kubernetes.io/fsType":"ext4"}"#, r#"{"kubernetes.io/fsType":"ext4"}"#.to_string()),
            (
                with_secret.as_str(),
                r#"{"kubernetes.io/pod.name":"web-0","kubernetes.io/secret/password":"<redacted>"}"#
                    .to_string(),
            ),
            ("not json kubernetes.io/secret/x=1", "<redacted>".to_string()),
        ];
        for (arg, shown) in cases {
            assert_eq!(redact_secrets(arg), shown, "{arg}");
        }
        let args = vec!["/target".to_string(), with_secret.clone()];
        let logged = format!("{:?}", RedactedArgs(&args));
        assert!(logged.starts_with(r#"["/target", "{"#), "{logged}");
        assert!(!logged.contains("czNjcjN0"), "{logged}");
    }

    #[test]
    fn json_is_sorted_and_escaped_like_go() {
        let cases = [
            (map(&[]), "{}"),
            (map(&[("b", "2"), ("a", "1")]), r#"{"a":"1","b":"2"}"#),
            (map(&[("k", "a<b>&c")]), r#"{"k":"a\u003cb\u003e\u0026c"}"#),
            (map(&[("k", "quote\" back\\ nl\n tab\t")]), r#"{"k":"quote\" back\\ nl\n tab\t"}"#),
            (map(&[("k", "\u{2028}\u{2029}é")]), "{\"k\":\"\\u2028\\u2029é\"}"),
            (map(&[("<&>", "")]), r#"{"\u003c\u0026\u003e":""}"#),
        ];
        for (options, expected) in cases {
            let json = to_json(&options);
            assert_eq!(json, expected);
            let back: Options = serde_json::from_str(&json).unwrap();
            assert_eq!(back, options, "the JSON reads back as the options");
        }
    }
}
