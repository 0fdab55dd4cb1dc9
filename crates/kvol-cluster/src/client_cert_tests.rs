use k8s_openapi::ByteString;
use k8s_openapi::api::certificates::v1::{
    CertificateSigningRequest, CertificateSigningRequestCondition, CertificateSigningRequestStatus,
};
use kube::config::Kubeconfig;
use rcgen::PublicKeyData;

use super::*;

/// A certificate for `node` valid from `from` to `to` (unix seconds), with its key, as PEM.
fn certificate(node: &str, from: i64, to: i64) -> (String, rcgen::KeyPair) {
    let key = rcgen::KeyPair::generate().unwrap();
    let mut params = rcgen::CertificateParams::default();
    params.distinguished_name.push(rcgen::DnType::CommonName, node_user(node));
    params.not_before = rcgen::date_time_ymd(1970, 1, 1) + time_offset(from);
    params.not_after = rcgen::date_time_ymd(1970, 1, 1) + time_offset(to);
    (params.self_signed(&key).unwrap().pem(), key)
}

fn time_offset(seconds: i64) -> std::time::Duration {
    std::time::Duration::from_secs(seconds as u64)
}

#[test]
fn a_certificate_is_usable_until_it_expires_and_only_when_there_is_one() {
    let (cert, key) = certificate("n1", 1_000, 2_000_000_000);
    let (old, _) = certificate("n1", 1_000, 1_500_000_000);
    let with_key = format!("{cert}{}", key.serialize_pem());
    let key_only = key.serialize_pem();
    let both = format!("{cert}{old}");
    let cases: Vec<(&str, &str, Result<(), &str>)> = vec![
        ("a valid certificate", &cert, Ok(())),
        ("the certificate and its key in one file (kubelet's store)", &with_key, Ok(())),
        ("an expired one", &old, Err("expired")),
        ("one valid, one expired: expired", &both, Err("expired")),
        ("a key and no certificate", &key_only, Err("no client certificate")),
        ("nothing", "", Err("no client certificate")),
        (
            "a broken certificate",
            "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n",
            Err("not a certificate"),
        ),
    ];
    for (what, pem, expected) in cases {
        let judged = judge_certificate(pem.as_bytes(), 1_700_000_000).map_err(|e| e.to_string());
        match expected {
            Ok(()) => assert_eq!(judged, Ok(()), "{what}"),
            Err(part) => assert!(judged.as_ref().is_err_and(|e| e.contains(part)), "{what}: {judged:?}"),
        }
    }
}

#[test]
fn the_request_names_the_node_in_its_group_and_its_name_follows_the_key() {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let pem = certificate_request(&key, "n1").unwrap();
    let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
    use x509_parser::prelude::FromDer;
    let (_, request) =
        x509_parser::certification_request::X509CertificationRequest::from_der(&block.contents).unwrap();
    assert_eq!(request.certification_request_info.subject.to_string(), "CN=system:node:n1, O=system:nodes");
    assert!(request.requested_extensions().is_none_or(|mut e| e.next().is_none()), "no SANs, no usages");
    let name = request_name(&key.subject_public_key_info(), "n1");
    let cases = [
        ("the same key and node: the same name", request_name(&key.subject_public_key_info(), "n1"), true),
        ("another key", request_name(&other.subject_public_key_info(), "n1"), false),
        ("another node", request_name(&key.subject_public_key_info(), "n2"), false),
    ];
    for (what, other_name, same) in cases {
        assert_eq!(other_name == name, same, "{what}");
    }
    // node-csr- and 43 characters of base64url (a 32-byte digest, unpadded), as kubelet's.
    assert!(name.starts_with("node-csr-") && name.len() == 9 + 43, "{name}");
    assert!(name[9..].chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_'), "{name}");
}

#[test]
fn the_request_name_is_kubelets_digest() {
    // Computed apart from this code (Python's hashlib sha512_256 and urlsafe base64 over
    // "AQID|c3lzdGVtOm5vZGU6bjE|c3lzdGVtOm5vZGVz|ZGlnaXRhbCBzaWduYXR1cmU|a2V5IGVuY2lwaGVybWVudA|Y2xpZW50IGF1dGg|",
    // kubelet's digestedName input for the public key [1, 2, 3] and node n1).
    assert_eq!(request_name(&[1, 2, 3], "n1"), "node-csr-uNJBdU2NyFEe78-WONsKm9EC7lBBFv8qHF0mam-9Mdk");
}

#[test]
fn a_request_found_under_our_name_is_ours_only_with_our_key_signer_and_usages() {
    let key = rcgen::KeyPair::generate().unwrap();
    let other = rcgen::KeyPair::generate().unwrap();
    let ours = request_object("x", &certificate_request(&key, "n1").unwrap());
    let mut signer = ours.clone();
    signer.spec.signer_name = "kubernetes.io/kube-apiserver-client".into();
    let mut usages = ours.clone();
    usages.spec.usages = Some(vec!["client auth".into()]);
    let another_key = request_object("x", &certificate_request(&other, "n1").unwrap());
    let mut garbage = ours.clone();
    garbage.spec.request = ByteString(b"nonsense".to_vec());
    let cases = [
        ("ours", &ours, None),
        ("another signer", &signer, Some("signer")),
        ("other usages", &usages, Some("usages")),
        ("another key", &another_key, Some("another private key")),
        ("no request", &garbage, Some("not PEM")),
    ];
    for (what, found, expected) in cases {
        let why = incompatibility(found, &key.subject_public_key_info());
        match expected {
            None => assert_eq!(why, None, "{what}"),
            Some(part) => assert!(why.as_ref().is_some_and(|w| w.contains(part)), "{what}: {why:?}"),
        }
    }
    assert_eq!(ours.spec.signer_name, "kubernetes.io/kube-apiserver-client-kubelet");
    assert_eq!(
        ours.spec.usages.as_deref(),
        Some(&["digital signature".to_string(), "key encipherment".into(), "client auth".into()][..])
    );
    assert_eq!(ours.spec.expiration_seconds, None, "the signer's default duration, as kubelet asks");
}

fn with_conditions(conditions: &[(&str, &str)], certificate: Option<&str>) -> CertificateSigningRequest {
    CertificateSigningRequest {
        status: Some(CertificateSigningRequestStatus {
            conditions: Some(
                conditions
                    .iter()
                    .map(|(kind, reason)| CertificateSigningRequestCondition {
                        type_: kind.to_string(),
                        status: "True".into(),
                        reason: Some(reason.to_string()),
                        message: Some(format!("{reason} said")),
                        ..Default::default()
                    })
                    .collect(),
            ),
            certificate: certificate.map(|c| ByteString(c.as_bytes().to_vec())),
        }),
        ..Default::default()
    }
}

#[test]
fn a_requests_answer_is_kubelets_reading_of_its_conditions() {
    let denied = |reason: &str| Answer::Denied { reason: reason.into(), message: format!("{reason} said") };
    let cases = [
        ("no status", CertificateSigningRequest::default(), Answer::Pending),
        ("approved, not signed yet", with_conditions(&[("Approved", "AutoApproved")], None), Answer::Pending),
        (
            "approved and signed",
            with_conditions(&[("Approved", "AutoApproved")], Some("PEM")),
            Answer::Issued(b"PEM".to_vec()),
        ),
        ("a certificate without approval", with_conditions(&[], Some("PEM")), Answer::Pending),
        ("denied", with_conditions(&[("Denied", "NotYou")], None), denied("NotYou")),
        (
            "approved then denied",
            with_conditions(&[("Approved", "A"), ("Denied", "NotYou")], Some("PEM")),
            denied("NotYou"),
        ),
        (
            "failed",
            with_conditions(&[("Approved", "A"), ("Failed", "SignerBroken")], None),
            Answer::Failed { reason: "SignerBroken".into(), message: "SignerBroken said".into() },
        ),
    ];
    for (what, csr, expected) in cases {
        assert_eq!(answer(&csr), expected, "{what}");
    }
}

#[test]
fn the_kubeconfig_written_keeps_the_bootstraps_server_and_points_at_the_certificate() {
    let bootstrap = |cluster: &str| {
        Kubeconfig::from_yaml(&format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n{cluster}\nusers:\n- name: b\n  user:\n    token: abcdef.0123456789abcdef\ncontexts:\n- name: x\n  context:\n    cluster: c\n    user: b\ncurrent-context: x\n"
        ))
        .unwrap()
    };
    let access = |server: &str, file: Option<&str>, data: Option<&str>, insecure: bool| ServerAccess {
        server: server.into(),
        certificate_authority: file.map(str::to_string),
        certificate_authority_data: data.map(str::to_string),
        insecure,
    };
    let cases = [
        (
            "CA data",
            "    server: https://10.0.0.1:6443\n    certificate-authority-data: Q0E=",
            access("https://10.0.0.1:6443", None, Some("Q0E="), false),
        ),
        (
            "a CA file wins over data",
            "    server: https://a:6443\n    certificate-authority: /etc/ca.crt\n    certificate-authority-data: Q0E=",
            access("https://a:6443", Some("/etc/ca.crt"), None, false),
        ),
        (
            "insecure",
            "    server: https://a:6443\n    insecure-skip-tls-verify: true",
            access("https://a:6443", None, None, true),
        ),
    ];
    for (what, cluster, expected) in cases {
        let found = ServerAccess::of(&bootstrap(cluster)).unwrap();
        assert_eq!(found, expected, "{what}");
        let text =
            serde_saphyr::to_string(&kubeconfig(&found, "/var/lib/kubelet/pki/kubelet-client-current.pem"))
                .unwrap();
        let read = Kubeconfig::from_yaml(&text).unwrap();
        assert_eq!(ServerAccess::of(&read).unwrap(), expected, "{what}: read back\n{text}");
        let user = read.auth_infos[0].auth_info.as_ref().unwrap();
        assert_eq!(
            user.client_certificate.as_deref(),
            Some("/var/lib/kubelet/pki/kubelet-client-current.pem"),
            "{what}"
        );
        assert_eq!(user.client_key, user.client_certificate, "{what}");
        assert!(user.token.is_none(), "{what}: the bootstrap token is not carried over");
    }
    let mut no_context = bootstrap("    server: https://a");
    no_context.current_context = None;
    assert!(ServerAccess::of(&no_context).unwrap_err().contains("current-context"));
    assert!(
        ServerAccess::of(&bootstrap("    insecure-skip-tls-verify: true")).unwrap_err().contains("no server")
    );
}

#[test]
fn an_issued_certificate_is_kept_under_kubelets_store_name() {
    let at = Timestamp::from_second(1_700_000_000).unwrap();
    assert_eq!(issued_file_name(at), "kubelet-client-2023-11-14-22-13-20.pem");
}

#[test]
fn a_certificate_is_rotated_at_70_to_90_per_cent_of_its_life() {
    // (not before, not after, jitter, deadline)
    let cases = [
        (1_000, 2_000, 0.0, 1_700),
        (1_000, 2_000, 1.0, 1_900),
        (1_000, 2_000, 0.5, 1_800),
        (0, 31_536_000, 0.25, 23_652_000),
        (1_000, 2_000, 7.0, 1_900),
        (2_000, 1_000, 0.5, 2_000),
    ];
    for (from, to, jitter, deadline) in cases {
        assert_eq!(rotation_deadline(from, to, jitter), deadline, "{from}..{to} at {jitter}");
    }
    let (cert, _) = certificate("n1", 1_000, 2_000_000_000);
    assert_eq!(validity(cert.as_bytes()), Some((1_000, 2_000_000_000)));
    assert_eq!(validity(b"not a certificate"), None);
}
