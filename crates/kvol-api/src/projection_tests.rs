//! Table tests of the projections, with the kubelet peer's own outputs where it gave them.

use super::*;
use crate::objects::ObjectSet;

fn yaml<T: serde::de::DeserializeOwned>(text: &str) -> T {
    serde_saphyr::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"))
}

/// The oracle's pod (`/work/peers/oracle/pod.yaml` on the machine it was captured on), trimmed.
fn pod(security: &str) -> Pod {
    yaml(&format!(
        r#"
metadata:
  name: oracle-pod
  namespace: default
  uid: f5a896cc-fe7c-4919-980f-44d3a8c9deba
  labels: {{app: oracle, tier: test}}
  annotations: {{note: hello, "odd\"key": "line\nbreak"}}
spec:
  securityContext: {security}
  containers:
  - name: main
    resources:
      limits: {{cpu: 100m, memory: 64Mi}}
  - name: side
    resources:
      requests: {{cpu: 250m}}
"#
    ))
}

fn objects() -> ObjectSet {
    let mut set = ObjectSet::default();
    set.config_maps.insert(
        "default/oracle-cm".into(),
        yaml("metadata: {name: oracle-cm, namespace: default}\ndata: {a.txt: \"alpha\\n\", b.txt: \"bravo\\n\"}\nbinaryData: {bin: AAEC, a.txt: eHg=}"),
    );
    set.secrets.insert(
        "default/oracle-secret".into(),
        yaml("metadata: {name: oracle-secret, namespace: default}\ndata: {username: YWRtaW4=, password: czNjcjN0}\nstringData: {password: over}"),
    );
    set
}

fn node() -> NodeResources {
    NodeResources { cpu_millis: 2000, memory_bytes: 24 << 30, ephemeral_storage_bytes: 100 << 30 }
}

/// path → (content, mode, owner)
type Files = Vec<(&'static str, &'static [u8], u32, Option<u32>)>;

fn run(volume: &str, security: &str) -> Result<(Files, Projection), String> {
    let volume: Volume = yaml(volume);
    let pod = pod(security);
    let projected = project(
        &volume,
        PodRef { pod: &pod, namespace: "default", uid: "f5a896cc-fe7c-4919-980f-44d3a8c9deba" },
        &objects(),
        &node(),
    )
    .expect("a projection volume")?;
    let files = projected
        .files
        .iter()
        .map(|(p, f)| {
            let leaked: &'static str = Box::leak(p.clone().into_boxed_str());
            let data: &'static [u8] = Box::leak(f.data.clone().into_boxed_slice());
            (leaked, data, f.mode, f.fs_user)
        })
        .collect();
    Ok((files, projected))
}

#[test]
fn volumes_hold_what_kubelet_writes() {
    let cases: &[(&str, &str, &str, Result<Files, &str>)] = &[
        (
            "configMap items with modes and a nested path (the peer's volume cm)",
            "{name: cm, configMap: {name: oracle-cm, defaultMode: 420, items: [{key: a.txt, path: a.txt, mode: 384}, {key: b.txt, path: sub/dir/b.txt}]}}",
            "{}",
            Ok(vec![("a.txt", b"alpha\n", 0o600, None), ("sub/dir/b.txt", b"bravo\n", 0o644, None)]),
        ),
        (
            "configMap without items: every key, data winning over binaryData",
            "{name: cm, configMap: {name: oracle-cm}}",
            "{}",
            Ok(vec![
                ("a.txt", b"alpha\n", 0o644, None),
                ("b.txt", b"bravo\n", 0o644, None),
                ("bin", b"\x00\x01\x02", 0o644, None),
            ]),
        ),
        (
            "secret with defaultMode 0400 (the peer's volume sec), stringData over data",
            "{name: sec, secret: {secretName: oracle-secret, defaultMode: 256}}",
            "{}",
            Ok(vec![("password", b"over", 0o400, None), ("username", b"admin", 0o400, None)]),
        ),
        (
            "a missing optional configMap: an empty volume",
            "{name: cm, configMap: {name: nope, optional: true}}",
            "{}",
            Ok(vec![]),
        ),
        (
            "a missing key of an optional configMap is skipped",
            "{name: cm, configMap: {name: oracle-cm, optional: true, items: [{key: zz, path: z}, {key: b.txt, path: b}]}}",
            "{}",
            Ok(vec![("b", b"bravo\n", 0o644, None)]),
        ),
        (
            "downwardAPI labels and a memory limit in MiB (the peer's volume dapi)",
            "{name: dapi, downwardAPI: {defaultMode: 420, items: [{path: labels, fieldRef: {fieldPath: metadata.labels}}, {path: mem_limit, resourceFieldRef: {containerName: main, resource: limits.memory, divisor: 1Mi}}]}}",
            "{}",
            Ok(vec![
                ("labels", b"app=\"oracle\"\ntier=\"test\"", 0o644, None),
                ("mem_limit", b"64", 0o644, None),
            ]),
        ),
        (
            "downwardAPI one annotation, the escaped map, name, namespace, uid; paths cleaned",
            "{name: d, downwardAPI: {items: [{path: ./a//note, fieldRef: {fieldPath: \"metadata.annotations['note']\"}}, {path: all, mode: 256, fieldRef: {fieldPath: metadata.annotations}}, {path: missing, fieldRef: {fieldPath: \"metadata.labels['nope']\"}}, {path: n, fieldRef: {fieldPath: metadata.name}}, {path: ns, fieldRef: {fieldPath: metadata.namespace}}, {path: u, fieldRef: {fieldPath: metadata.uid}}]}}",
            "{}",
            Ok(vec![
                ("a/note", b"hello", 0o644, None),
                ("all", b"note=\"hello\"\nodd\"key=\"line\\nbreak\"", 0o400, None),
                ("missing", b"", 0o644, None),
                ("n", b"oracle-pod", 0o644, None),
                ("ns", b"default", 0o644, None),
                ("u", b"f5a896cc-fe7c-4919-980f-44d3a8c9deba", 0o644, None),
            ]),
        ),
        (
            "resources: an unset limit is the node's allocatable, an unset request its limit or zero",
            "{name: d, downwardAPI: {items: [{path: cpu, resourceFieldRef: {containerName: side, resource: limits.cpu, divisor: 1m}}, {path: mem, resourceFieldRef: {containerName: side, resource: limits.memory, divisor: 1Gi}}, {path: req, resourceFieldRef: {containerName: main, resource: requests.cpu, divisor: 1m}}, {path: req0, resourceFieldRef: {containerName: side, resource: requests.memory}}, {path: cores, resourceFieldRef: {containerName: main, resource: limits.cpu}}]}}",
            "{}",
            Ok(vec![
                ("cores", b"1", 0o644, None),
                ("cpu", b"2000", 0o644, None),
                ("mem", b"24", 0o644, None),
                ("req", b"100", 0o644, None),
                ("req0", b"0", 0o644, None),
            ]),
        ),
        (
            "projected: all four sources (the peer's volume proj); the token 0600 under an fsGroup",
            "{name: proj, projected: {defaultMode: 420, sources: [{configMap: {name: oracle-cm, items: [{key: a.txt, path: cm/a.txt}]}}, {secret: {name: oracle-secret, items: [{key: username, path: sec/username, mode: 256}]}}, {downwardAPI: {items: [{path: dapi/labels, fieldRef: {fieldPath: metadata.labels}}]}}, {serviceAccountToken: {audience: oracle, expirationSeconds: 3600, path: token}}]}}",
            "{fsGroup: 1234}",
            Ok(vec![
                ("cm/a.txt", b"alpha\n", 0o644, None),
                ("dapi/labels", b"app=\"oracle\"\ntier=\"test\"", 0o644, None),
                ("sec/username", b"admin", 0o400, None),
            ]),
        ),
        (
            "projected: a later source's file replaces an earlier one's; a missing optional source adds nothing",
            "{name: p, projected: {sources: [{configMap: {name: oracle-cm, items: [{key: a.txt, path: x}]}}, {secret: {name: oracle-secret, items: [{key: username, path: x}]}}, {secret: {name: gone, optional: true}}]}}",
            "{}",
            Ok(vec![("x", b"admin", 0o644, None)]),
        ),
        (
            "a missing configMap",
            "{name: cm, configMap: {name: nope}}",
            "{}",
            Err("configmap default/nope does not exist"),
        ),
        (
            "a missing key",
            "{name: cm, configMap: {name: oracle-cm, items: [{key: zz, path: z}]}}",
            "{}",
            Err("configmap default/oracle-cm has no key \"zz\""),
        ),
        (
            "every error of a projected volume, not the first",
            "{name: p, projected: {sources: [{secret: {name: gone}}, {configMap: {name: nope}}, {serviceAccountToken: {path: t, expirationSeconds: 60}}]}}",
            "{}",
            Err(
                "secret default/gone does not exist; configmap default/nope does not exist; serviceAccountToken expirationSeconds 60 is under 600",
            ),
        ),
        (
            "a field downwardAPI volumes do not serve",
            "{name: d, downwardAPI: {items: [{path: ip, fieldRef: {fieldPath: status.podIP}}]}}",
            "{}",
            Err("downwardAPI item \"ip\": fieldPath \"status.podIP\" is not served in volumes"),
        ),
        (
            "a container the pod does not have",
            "{name: d, downwardAPI: {items: [{path: m, resourceFieldRef: {containerName: ghost, resource: limits.memory}}]}}",
            "{}",
            Err("downwardAPI item \"m\": the pod has no container \"ghost\""),
        ),
        (
            "a path leaving the volume",
            "{name: cm, configMap: {name: oracle-cm, items: [{key: a.txt, path: ../../etc/passwd}]}}",
            "{}",
            Err("payload path \"../../etc/passwd\": it starts with '..'"),
        ),
        (
            "an absolute path",
            "{name: cm, configMap: {name: oracle-cm, items: [{key: a.txt, path: /etc/passwd}]}}",
            "{}",
            Err("payload path \"/etc/passwd\": it is absolute"),
        ),
        (
            "a '..' element",
            "{name: d, downwardAPI: {items: [{path: a/../../b, fieldRef: {fieldPath: metadata.name}}]}}",
            "{}",
            Err("payload path \"../b\": it starts with '..'"),
        ),
        (
            "a mode out of range",
            "{name: cm, configMap: {name: oracle-cm, defaultMode: 4095}}",
            "{}",
            Err("defaultMode: 0o7777 is not a mode from 0 to 0777"),
        ),
    ];
    for (name, volume, security, want) in cases {
        match (run(volume, security), want) {
            (Ok((got, _)), Ok(want)) => assert_eq!(&got, want, "{name}"),
            (Err(got), Err(want)) => assert!(got.starts_with(want), "{name}: {got}"),
            (got, want) => panic!("{name}: got {got:?}, want {want:?}"),
        }
    }
}

#[test]
fn tokens_are_asked_for_with_kubelets_mode_and_owner() {
    let volume = "{name: t, projected: {defaultMode: 292, sources: [{serviceAccountToken: {path: token}}, {serviceAccountToken: {path: v/token, audience: vault, expirationSeconds: 7200}}]}}";
    let cases: &[(&str, &str, u32, Option<u32>)] = &[
        ("no fsGroup, no runAsUser: defaultMode", "{}", 0o444, None),
        ("an fsGroup: 0600, the walk makes it 0640", "{fsGroup: 1234}", 0o600, None),
        ("one runAsUser for all: 0600, owned by it", "{runAsUser: 1000}", 0o600, Some(1000)),
    ];
    for (name, security, mode, owner) in cases {
        let (_, projection) = run(volume, security).expect(name);
        let want = vec![
            TokenFile {
                path: "token".into(),
                audience: String::new(),
                expiration_seconds: None,
                mode: *mode,
                fs_user: *owner,
            },
            TokenFile {
                path: "v/token".into(),
                audience: "vault".into(),
                expiration_seconds: Some(7200),
                mode: *mode,
                fs_user: *owner,
            },
        ];
        assert_eq!(projection.tokens, want, "{name}");
        assert!(projection.files.is_empty(), "{name}: tokens are not files until minted");
    }
}

#[test]
fn fs_user_is_the_one_user_every_container_runs_as() {
    let cases: &[(&str, &str, Option<u32>)] = &[
        ("nothing set", "{securityContext: {}, containers: [{name: a}]}", None),
        ("the pod's", "{securityContext: {runAsUser: 7}, containers: [{name: a}, {name: b}]}", Some(7)),
        (
            "a container's own wins",
            "{securityContext: {runAsUser: 7}, containers: [{name: a, securityContext: {runAsUser: 8}}]}",
            Some(8),
        ),
        (
            "two users",
            "{securityContext: {runAsUser: 7}, containers: [{name: a}, {name: b, securityContext: {runAsUser: 8}}]}",
            None,
        ),
        ("one without", "{containers: [{name: a, securityContext: {runAsUser: 8}}, {name: b}]}", None),
        (
            "init containers count",
            "{securityContext: {runAsUser: 7}, containers: [{name: a}], initContainers: [{name: i, securityContext: {runAsUser: 9}}]}",
            None,
        ),
    ];
    for (name, spec, want) in cases {
        let pod: Pod = yaml(&format!("metadata: {{name: p}}\nspec: {spec}"));
        assert_eq!(fs_user(&pod), *want, "{name}");
    }
}

#[test]
fn the_pod_memory_limit_sizes_memory_volumes() {
    let cases: &[(&str, &str, Option<u64>)] = &[
        (
            "one container (the peer's pod: size=65536k)",
            "{containers: [{name: a, resources: {limits: {memory: 64Mi}}}]}",
            Some(64 << 20),
        ),
        (
            "the sum",
            "{containers: [{name: a, resources: {limits: {memory: 64Mi}}}, {name: b, resources: {limits: {memory: 32Mi}}}]}",
            Some(96 << 20),
        ),
        (
            "a larger init container",
            "{containers: [{name: a, resources: {limits: {memory: 64Mi}}}], initContainers: [{name: i, resources: {limits: {memory: 1Gi}}}]}",
            Some(1 << 30),
        ),
        (
            "one container without: none",
            "{containers: [{name: a, resources: {limits: {memory: 64Mi}}}, {name: b}]}",
            None,
        ),
        ("no limits", "{containers: [{name: a}]}", None),
    ];
    for (name, spec, want) in cases {
        let pod: Pod = yaml(&format!("metadata: {{name: p}}\nspec: {spec}"));
        assert_eq!(pod_memory_limit(&pod), *want, "{name}");
    }
}

#[test]
fn paths_are_cleaned_as_go_cleans_them() {
    let cases = [
        ("a", "a"),
        ("./a//b/", "a/b"),
        ("a/../b", "b"),
        ("a/../../b", "../b"),
        ("..", ".."),
        ("", "."),
        ("/x/../../y", "/y"),
    ];
    for (path, want) in cases {
        assert_eq!(clean_path(path), want, "{path:?}");
    }
}

#[test]
fn digests_change_with_content_and_debug_never_shows_it() {
    let (_, a) = run("{name: sec, secret: {secretName: oracle-secret}}", "{}").unwrap();
    let (_, b) = run("{name: sec, secret: {secretName: oracle-secret, defaultMode: 256}}", "{}").unwrap();
    let (_, a2) = run("{name: sec, secret: {secretName: oracle-secret}}", "{}").unwrap();
    assert_eq!(a.digest(), a2.digest());
    assert_ne!(a.digest(), b.digest(), "a mode is content");
    let shown = format!("{a:?} {a:#?}");
    assert!(!shown.contains("admin") && !shown.contains("over"), "{shown}");
    assert!(!shown.contains("97, 100"), "no bytes either: {shown}");
}

#[test]
fn other_volumes_are_not_projections() {
    let pod = pod("{}");
    let volume: Volume = yaml("{name: e, emptyDir: {}}");
    let at = PodRef { pod: &pod, namespace: "default", uid: "u" };
    assert!(project(&volume, at, &objects(), &node()).is_none());
    assert_eq!(
        ProjectionKind::ALL.map(ProjectionKind::plugin_name),
        [
            "kubernetes.io/configmap",
            "kubernetes.io/downward-api",
            "kubernetes.io/projected",
            "kubernetes.io/secret",
        ]
    );
}
