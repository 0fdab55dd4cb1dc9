//! AWS EBS (`kubernetes.io/aws-ebs`) to and from the `ebs.csi.aws.com` CSI driver, as upstream translates it.

use std::borrow::Cow;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    AWSElasticBlockStoreVolumeSource, CSIPersistentVolumeSource, PersistentVolume, PersistentVolumeSpec,
    Volume,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kvol_api::MigratablePlugin;
use kvol_api::keys::PARAM_CSI_FSTYPE;

use super::Translator;
use crate::go::key_is;
use crate::topology::{
    topology_selector, translate_allowed_topologies, translate_topology_csi_to_in_tree,
    translate_topology_in_tree_to_csi,
};
use crate::{Result, TranslateError};

pub(crate) struct AwsEbs;

const PLUGIN: MigratablePlugin = MigratablePlugin::AwsEbs;
const DRIVER: &str = PLUGIN.csi_driver();
/// The zone key of the EBS CSI driver's topology.
const TOPOLOGY_KEY: &str = "topology.ebs.csi.aws.com/zone";
/// Volume attribute carrying the partition number.
const PARTITION: &str = "partition";
/// StorageClass parameter the CSI driver needs next to `iopsPerGB` to keep in-tree behaviour.
const ALLOW_AUTO_IOPS: &str = "allowautoiopspergbincrease";

impl Translator for AwsEbs {
    fn storage_class_to_csi(&self, mut sc: StorageClass) -> Result<StorageClass> {
        let mut params = BTreeMap::new();
        let mut zones: Option<Vec<String>> = None;
        // Upstream ranges over a Go map, in random order. Where two keys fold into one result
        // (`zone` and `zones`, `fstype` and `FSType`, `fstype` and `csi.storage.k8s.io/fstype`,
        // `iopsPerGB` and an explicit `allowautoiopspergbincrease`), the last key in BTreeMap
        // key order wins here.
        for (key, value) in sc.parameters.take().unwrap_or_default() {
            if key_is(&key, "fstype") {
                params.insert(PARAM_CSI_FSTYPE.to_string(), value);
            } else if key_is(&key, "zone") {
                zones = Some(vec![value]);
            } else if key_is(&key, "zones") {
                zones = Some(value.split(',').map(str::to_string).collect());
            } else if key_is(&key, "iopspergb") {
                params.insert(key, value);
                params.insert(ALLOW_AUTO_IOPS.to_string(), "true".to_string());
            } else {
                params.insert(key, value);
            }
        }
        let has_allowed = sc.allowed_topologies.as_ref().is_some_and(|t| !t.is_empty());
        match zones {
            Some(_) if has_allowed => {
                return Err(TranslateError::plugin(
                    PLUGIN,
                    format!(
                        "storage class {:?} sets both allowed topologies and zone/zones parameters",
                        sc.metadata.name.as_deref().unwrap_or_default()
                    ),
                ));
            }
            Some(zones) => sc.allowed_topologies = Some(topology_selector(TOPOLOGY_KEY, zones)),
            None if has_allowed => {
                sc.allowed_topologies =
                    sc.allowed_topologies.map(|terms| translate_allowed_topologies(&terms, TOPOLOGY_KEY));
            }
            None => {}
        }
        // Always a map, empty when there were no parameters, as upstream.
        sc.parameters = Some(params);
        Ok(sc)
    }

    fn inline_to_csi(&self, vol: &Volume, _pod_namespace: &str) -> Result<PersistentVolume> {
        let ebs = vol.aws_elastic_block_store.as_ref().ok_or_else(|| {
            TranslateError::plugin(
                PLUGIN,
                format!("inline volume {:?} has no awsElasticBlockStore source", vol.name),
            )
        })?;
        let handle = ebs_volume_id(ebs.volume_id.clone()).map_err(|e| TranslateError::plugin(PLUGIN, e))?;
        // The name must be unique per disk: kubelet uses it in the staging path.
        let mut name = String::with_capacity(DRIVER.len() + 1 + handle.len());
        name.push_str(DRIVER);
        name.push('-');
        name.push_str(&handle);
        Ok(PersistentVolume {
            metadata: ObjectMeta { name: Some(name), ..Default::default() },
            spec: Some(PersistentVolumeSpec {
                csi: Some(csi_source(handle, ebs.read_only, ebs.fs_type.clone(), ebs.partition)),
                access_modes: Some(vec!["ReadWriteOnce".to_string()]),
                ..Default::default()
            }),
            status: None,
        })
    }

    fn pv_to_csi(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(ebs) = pv.spec.as_mut().and_then(|s| s.aws_elastic_block_store.take()) else {
            return Err(no_source(pv, "awsElasticBlockStore"));
        };
        let handle = ebs_volume_id(ebs.volume_id).map_err(|e| TranslateError::plugin(PLUGIN, e))?;
        let csi = csi_source(handle, ebs.read_only, ebs.fs_type, ebs.partition);
        translate_topology_in_tree_to_csi(pv, TOPOLOGY_KEY);
        pv.spec.get_or_insert_with(Default::default).csi = Some(csi);
        Ok(())
    }

    fn csi_pv_to_in_tree(&self, pv: &mut PersistentVolume) -> Result<()> {
        let Some(csi) = pv.spec.as_mut().and_then(|s| s.csi.take()) else {
            return Err(no_source(pv, "csi"));
        };
        let partition = match csi.volume_attributes.as_ref().and_then(|a| a.get(PARTITION)) {
            Some(text) => parse_partition(text).ok_or_else(|| {
                TranslateError::plugin(PLUGIN, format!("invalid partition {text:?}: want a decimal integer"))
            })?,
            None => None,
        };
        let ebs = AWSElasticBlockStoreVolumeSource {
            volume_id: csi.volume_handle,
            fs_type: csi.fs_type,
            read_only: csi.read_only,
            partition,
        };
        translate_topology_csi_to_in_tree(pv, TOPOLOGY_KEY, Some(region_from_zones)).map_err(|e| {
            let name = pv.metadata.name.as_deref().unwrap_or_default();
            TranslateError::plugin(PLUGIN, format!("persistent volume {name:?}: {e}"))
        })?;
        pv.spec.get_or_insert_with(Default::default).aws_elastic_block_store = Some(ebs);
        Ok(())
    }
}

fn no_source(pv: &PersistentVolume, field: &str) -> TranslateError {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    TranslateError::plugin(PLUGIN, format!("persistent volume {name:?} has no {field} source"))
}

fn csi_source(
    handle: String,
    read_only: Option<bool>,
    fs_type: Option<String>,
    partition: Option<i32>,
) -> CSIPersistentVolumeSource {
    CSIPersistentVolumeSource {
        driver: DRIVER.to_string(),
        volume_handle: handle,
        read_only,
        fs_type,
        // Always present, "0" for no partition.
        volume_attributes: Some(BTreeMap::from([(
            PARTITION.to_string(),
            match partition {
                None | Some(0) => "0".to_string(),
                Some(p) => p.to_string(),
            },
        )])),
        ..Default::default()
    }
}

/// The partition attribute as Go's `strconv.Atoi` then `int32(...)` reads it: optional sign,
/// decimal digits, 64-bit range, then truncated to 32 bits. `None` when unparsable.
/// Zero, Go's "no partition", comes back as an absent field.
fn parse_partition(text: &str) -> Option<Option<i32>> {
    let value = text.parse::<i64>().ok()?;
    // Go's int32 conversion keeps the low 32 bits; so does `as`.
    let value = value as i32;
    Some((value != 0).then_some(value))
}

/// The EBS volume ID behind a Kubernetes volume ID: `aws://{zone}/vol-{id}`, `aws:///vol-{id}`
/// or anything else, which is taken as it is (upstream does not check it).
fn ebs_volume_id(kube_id: String) -> Result<String, String> {
    if !kube_id.starts_with("aws://") {
        return Ok(kube_id);
    }
    let bad = |why: &str| {
        format!(
            "invalid volume ID {kube_id:?}: {why}; want aws://{{zone}}/vol-{{id}}, aws:///vol-{{id}} \
             or a bare volume ID"
        )
    };
    let path = go_url::aws_url_path(&kube_id).map_err(bad)?;
    let start = path.iter().position(|&b| b != b'/').unwrap_or(path.len());
    let end = path.iter().rposition(|&b| b != b'/').map_or(start, |i| i + 1);
    let id = path.get(start..end).unwrap_or_default();
    if !id.starts_with(b"vol-") || id.contains(&b'/') {
        return Err(bad("the path is not vol-{id}"));
    }
    // Without escapes the ID is a piece of the input: cut the input down to it, no copy.
    let offset = id.as_ptr().addr().wrapping_sub(kube_id.as_ptr().addr());
    let range = offset..offset.wrapping_add(id.len());
    let in_place = matches!(path, Cow::Borrowed(_))
        && range.end <= kube_id.len()
        && kube_id.is_char_boundary(range.start)
        && kube_id.is_char_boundary(range.end);
    if in_place {
        let mut kube_id = kube_id;
        kube_id.truncate(range.end);
        kube_id.drain(..range.start);
        return Ok(kube_id);
    }
    Ok(go_string(id))
}

/// Bytes as Go's JSON encoder prints a string holding them: every byte that is not part of
/// valid UTF-8 becomes U+FFFD (one per byte, as Go decodes invalid input a byte at a time).
fn go_string(bytes: &[u8]) -> String {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return s.to_string();
    }
    let mut out = String::with_capacity(bytes.len() + 8);
    let mut rest = bytes;
    loop {
        match std::str::from_utf8(rest) {
            Ok(s) => {
                out.push_str(s);
                return out;
            }
            Err(e) => {
                let Some((good, bad)) = rest.split_at_checked(e.valid_up_to()) else { return out };
                out.push_str(std::str::from_utf8(good).unwrap_or_default());
                out.push(char::REPLACEMENT_CHARACTER);
                rest = bad.get(1..).unwrap_or_default();
            }
        }
    }
}

/// The AWS region of a node-selector term's zones: `us-west-2a`, `us-gov-east-1a` (letter
/// suffix), local zones `us-west-2-lax-1a` and wavelength zones `us-east-1-wl1-bos-wlz-1`.
/// All zones must be in one region.
fn region_from_zones(zones: &[String]) -> Result<String, String> {
    let mut region: Option<String> = None;
    for zone in zones {
        let this = zone_region(zone).ok_or_else(|| format!("{zone:?} is not a valid AWS zone"))?;
        match &region {
            None => region = Some(this),
            Some(first) if *first == this => {}
            Some(first) => {
                return Err(format!("the zones span more than one region: {first:?} and {this:?}"));
            }
        }
    }
    region.ok_or_else(|| "no zones given".to_string())
}

fn zone_region(zone: &str) -> Option<String> {
    match zone.split('-').count() {
        3 | 4 => {
            let (head, last) = zone.rsplit_once('-')?;
            // A one-letter suffix after a one-digit number; two-digit region numbers would break this.
            if last.len() != 2 {
                return None;
            }
            let mut region = String::with_capacity(zone.len());
            region.push_str(head);
            region.push('-');
            // Upstream keeps the first byte. Where that splits a character, Go holds invalid
            // UTF-8, which it prints as U+FFFD.
            region.push_str(last.get(..1).unwrap_or("\u{FFFD}"));
            Some(region)
        }
        5 | 7 => zone.match_indices('-').nth(2).and_then(|(i, _)| zone.get(..i)).map(str::to_string),
        _ => None,
    }
}

/// Just enough of Go's `net/url.Parse` to accept and reject `aws://` volume IDs as upstream
/// does, and to get their unescaped path. This is Go 1.26's parser, whose colon and IP-literal
/// rules for a scheme other than http(s) are: a port after the last colon, and brackets only
/// around a valid IPv6 address.
mod go_url {
    use std::borrow::Cow;

    /// Which part of a URL is being unescaped; they differ in what they let through.
    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Part {
        /// Path, fragment or user info: any byte, `%` must start a valid escape.
        Any,
        /// Host: only a few ASCII bytes, and escapes only for non-ASCII bytes (or `%25`).
        Host,
        /// IPv6 zone: like the host, but escapes of host bytes and space are allowed too.
        Zone,
    }

    /// The unescaped path of an ID that starts with `aws://`, or why Go refuses the ID.
    pub(super) fn aws_url_path(raw: &str) -> Result<Cow<'_, [u8]>, &'static str> {
        let raw = raw.as_bytes();
        let (url, fragment) = cut(raw, b'#');
        if url.iter().any(|&b| b < 0x20 || b == 0x7f) {
            return Err("it holds a control character");
        }
        let rest = url.strip_prefix(b"aws:").ok_or("it does not start with aws://")?;
        let rest = match rest.strip_suffix(b"?") {
            Some(head) if !head.contains(&b'?') => head,
            _ => cut(rest, b'?').0,
        };
        let rest = rest.strip_prefix(b"//").ok_or("it does not start with aws://")?;
        let (authority, path) = match rest.iter().position(|&b| b == b'/') {
            Some(i) => rest.split_at_checked(i).unwrap_or((rest, b"")),
            None => (rest, &[][..]),
        };
        check_authority(authority)?;
        let path = unescape(path, Part::Any).ok_or("its path has an invalid % escape")?;
        if let Some(fragment) = fragment {
            unescape(fragment, Part::Any).ok_or("its fragment has an invalid % escape")?;
        }
        Ok(path)
    }

    /// `s` up to the first `sep`, and what follows it if there is one.
    fn cut(s: &[u8], sep: u8) -> (&[u8], Option<&[u8]>) {
        match s.iter().position(|&b| b == sep) {
            Some(i) => (s.get(..i).unwrap_or_default(), s.get(i + 1..)),
            None => (s, None),
        }
    }

    fn check_authority(authority: &[u8]) -> Result<(), &'static str> {
        let (user, host) = match authority.iter().rposition(|&b| b == b'@') {
            Some(i) => (authority.get(..i), authority.get(i + 1..).unwrap_or_default()),
            None => (None, authority),
        };
        check_host(host)?;
        if let Some(user) = user {
            let valid = user.iter().all(|&c| c.is_ascii_alphanumeric() || b"-._:~!$&'()*+,;=%@".contains(&c));
            if !valid {
                return Err("its user info has an invalid character");
            }
            unescape(user, Part::Any).ok_or("its user info has an invalid % escape")?;
        }
        Ok(())
    }

    fn check_host(host: &[u8]) -> Result<(), &'static str> {
        match host.iter().rposition(|&b| b == b'[') {
            Some(0) => {
                let close = host.iter().rposition(|&b| b == b']').ok_or("its host lacks a closing ]")?;
                if !valid_optional_port(host.get(close + 1..).unwrap_or_default()) {
                    return Err("its port is not a number");
                }
                let inner = host.get(1..close).unwrap_or_default();
                let address = match find(inner, b"%25") {
                    Some(z) => {
                        let (addr, zone) = inner.split_at_checked(z).unwrap_or((inner, b""));
                        let mut address =
                            unescape(addr, Part::Host).ok_or("its host is malformed")?.into_owned();
                        address
                            .extend_from_slice(&unescape(zone, Part::Zone).ok_or("its host is malformed")?);
                        Cow::Owned(address)
                    }
                    None => unescape(inner, Part::Host).ok_or("its host is malformed")?,
                };
                if !is_ipv6_address(&address) {
                    return Err("its host in brackets is not an IPv6 address");
                }
                Ok(())
            }
            Some(_) => Err("its host has a [ after the start"),
            None => {
                if let Some(i) = host.iter().rposition(|&b| b == b':')
                    && !valid_optional_port(host.get(i..).unwrap_or_default())
                {
                    return Err("its port is not a number");
                }
                unescape(host, Part::Host).map(drop).ok_or("its host is malformed")
            }
        }
    }

    fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
        hay.windows(needle.len()).position(|w| w == needle)
    }

    /// Empty, or a colon and decimal digits.
    fn valid_optional_port(port: &[u8]) -> bool {
        match port.split_first() {
            None => true,
            Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
            Some(_) => false,
        }
    }

    /// An ASCII byte a host may hold as it is.
    fn host_byte(c: u8) -> bool {
        c.is_ascii_alphanumeric() || b"!$&'()*+,;=:[]<>\"-_.~".contains(&c)
    }

    fn hex(c: u8) -> Option<u8> {
        char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok())
    }

    /// `s` with `%XX` escapes decoded (borrowed when it has none), or `None` where Go's
    /// unescape fails for this part.
    fn unescape(s: &[u8], part: Part) -> Option<Cow<'_, [u8]>> {
        for (i, &c) in s.iter().enumerate() {
            if c == b'%' {
                return decode(s, i, part).map(Cow::Owned);
            }
            if part != Part::Any && c.is_ascii() && !host_byte(c) {
                return None;
            }
        }
        Some(Cow::Borrowed(s))
    }

    /// The slow path of [`unescape`], from the first `%` at `start`.
    fn decode(s: &[u8], start: usize, part: Part) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(s.len());
        out.extend_from_slice(s.get(..start)?);
        let mut i = start;
        while let Some(&c) = s.get(i) {
            if c == b'%' {
                let high = s.get(i + 1).copied().and_then(hex)?;
                let low = s.get(i + 2).copied().and_then(hex)?;
                let byte = (high << 4) | low;
                let refused = match part {
                    Part::Any => false,
                    Part::Host => high < 8 && byte != b'%',
                    Part::Zone => byte != b'%' && byte != b' ' && !host_byte(byte),
                };
                if refused {
                    return None;
                }
                out.push(byte);
                i += 3;
            } else {
                if part != Part::Any && c.is_ascii() && !host_byte(c) {
                    return None;
                }
                out.push(c);
                i += 1;
            }
        }
        Some(out)
    }

    /// Whether Go's `netip.ParseAddr` reads the text as an IPv6 address (with an optional
    /// zone). IPv4 is refused in brackets, so only the IPv6 form matters.
    pub(super) fn is_ipv6_address(s: &[u8]) -> bool {
        match s.iter().find(|&&b| matches!(b, b'.' | b':' | b'%')) {
            Some(b':') => ipv6(s),
            _ => false,
        }
    }

    fn ipv6(input: &[u8]) -> bool {
        let mut s = match input.iter().position(|&b| b == b'%') {
            Some(i) if i + 1 == input.len() => return false,
            Some(i) => input.get(..i).unwrap_or_default(),
            None => input,
        };
        let mut ellipsis: Option<usize> = None;
        if let Some(tail) = s.strip_prefix(b"::") {
            if tail.is_empty() {
                return true;
            }
            ellipsis = Some(0);
            s = tail;
        }
        let mut filled = 0;
        while filled < 16 {
            let digits = s.iter().take_while(|c| c.is_ascii_hexdigit()).count();
            if digits == 0 || digits > 4 {
                return false;
            }
            if s.get(digits) == Some(&b'.') {
                // An embedded IPv4 address takes the last four bytes.
                if (ellipsis.is_none() && filled != 12) || filled + 4 > 16 || !ipv4(s) {
                    return false;
                }
                s = b"";
                filled += 4;
                break;
            }
            filled += 2;
            s = s.get(digits..).unwrap_or_default();
            let Some((&first, tail)) = s.split_first() else { break };
            if first != b':' || tail.is_empty() {
                return false;
            }
            s = tail;
            if let Some(tail) = s.strip_prefix(b":") {
                if ellipsis.is_some() {
                    return false;
                }
                ellipsis = Some(filled);
                s = tail;
                if s.is_empty() {
                    break;
                }
            }
        }
        // Whole input used; a `::` stands for at least one zero field, and only it may shorten.
        s.is_empty() && (filled < 16) == ellipsis.is_some()
    }

    /// Four decimal fields 0-255 without leading zeros, as `netip` reads an embedded IPv4.
    fn ipv4(s: &[u8]) -> bool {
        let (mut value, mut dots, mut digits) = (0u32, 0, 0);
        for (i, &c) in s.iter().enumerate() {
            if c.is_ascii_digit() {
                if digits == 1 && value == 0 {
                    return false;
                }
                value = value * 10 + u32::from(c - b'0');
                digits += 1;
                if value > 255 {
                    return false;
                }
            } else if c == b'.' {
                let after_dot = i.checked_sub(1).and_then(|p| s.get(p)) == Some(&b'.');
                if i == 0 || i + 1 == s.len() || after_dot || dots == 3 {
                    return false;
                }
                dots += 1;
                value = 0;
                digits = 0;
            } else {
                return false;
            }
        }
        dots == 3
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use super::go_url::is_ipv6_address;
    use super::*;
    use crate::plugins::test_support::{affinity, assert_same, pv, sc, vol};

    const VOL: &str = "vol-02399794d890f9375";
    const BETA_ZONE: &str = "failure-domain.beta.kubernetes.io/zone";
    const BETA_REGION: &str = "failure-domain.beta.kubernetes.io/region";
    const GA_ZONE: &str = "topology.kubernetes.io/zone";
    const GA_REGION: &str = "topology.kubernetes.io/region";

    #[test]
    fn kubernetes_volume_id_to_ebs_volume_id() {
        let cases: &[(&str, &str, Option<&str>)] = &[
            // TestKubernetesVolumeIDToEBSVolumeID (aws_ebs_test.go).
            ("normal ID format", VOL, Some(VOL)),
            ("aws:///{volumeId} format", "aws:///vol-02399794d890f9375", Some(VOL)),
            ("aws://{zone}/{volumeId} format", "aws://us-west-2a/vol-02399794d890f9375", Some(VOL)),
            ("fails on invalid volume ID", "aws://us-west-2a/02399794d890f9375", None),
            // Reference 4.6.1: a bare ID is not checked; prefix matching is case-sensitive.
            ("bare ID not checked", "vol01", Some("vol01")),
            ("upper-case scheme is a bare ID", "AWS://zone/x", Some("AWS://zone/x")),
            // Go net/url: slashes trimmed, escapes decoded, query and fragment ignored.
            ("trailing slash trimmed", "aws:///vol-1/", Some("vol-1")),
            ("empty authority, doubled slash", "aws:////vol-1", Some("vol-1")),
            ("escape decoded", "aws://z/vol-%31", Some("vol-1")),
            ("escaped slash breaks the ID", "aws://z/vol-1%2Fx", None),
            ("inner slash breaks the ID", "aws://z/a/vol-1", None),
            ("query ignored", "aws://z/vol-1?x=y", Some("vol-1")),
            ("lone question mark ignored", "aws://z/vol-1?", Some("vol-1")),
            ("fragment ignored", "aws://z/vol-1#frag", Some("vol-1")),
            ("control byte in fragment allowed", "aws://z/vol-1#\u{1}", Some("vol-1")),
            ("control byte refused", "aws://z/vol-1\u{7f}", None),
            ("bad escape in path", "aws://z/vol-%zz", None),
            ("bad escape in fragment", "aws://z/vol-1#%", None),
            ("no path", "aws://us-west-2a", None),
            ("invalid byte escaped in path", "aws://z/vol-%FF", Some("vol-\u{FFFD}")),
            ("space in host", "aws://us west/vol-1", None),
            ("ASCII escape in host", "aws://%41/vol-1", None),
            ("non-ASCII escape in host", "aws://%C3%A9/vol-1", Some("vol-1")),
            ("numeric port", "aws://z:80/vol-1", Some("vol-1")),
            ("non-numeric port", "aws://z:http/vol-1", None),
            ("last colon starts the port outside http(s)", "aws://a:b:80/vol-1", Some("vol-1")),
            ("user info", "aws://me:pw@z/vol-1", Some("vol-1")),
            ("bad user info", "aws://m e@z/vol-1", None),
            ("bad escape in user info", "aws://m%4@z/vol-1", None),
            ("IPv6 host", "aws://[::1]:443/vol-1", Some("vol-1")),
            ("IPv6 host with zone", "aws://[fe80::1%25en0]/vol-1", Some("vol-1")),
            ("IPv6 host with empty zone", "aws://[fe80::1%25]/vol-1", None),
            ("IPv4 in brackets", "aws://[10.0.0.1]/vol-1", None),
            ("IPv4-mapped IPv6 in brackets", "aws://[::ffff:10.0.0.1]/vol-1", Some("vol-1")),
            ("unclosed bracket", "aws://[::1/vol-1", None),
            ("bracket after the start", "aws://x[::1]/vol-1", None),
        ];
        for (name, input, want) in cases {
            let got = ebs_volume_id((*input).to_string());
            assert_eq!(got.as_deref().ok(), *want, "case {name:?}: {got:?}");
        }
    }

    #[test]
    fn ipv6_addresses_as_netip_reads_them() {
        let cases: &[(&str, bool)] = &[
            ("::", true),
            ("::1", true),
            ("1:2:3:4:5:6:7:8", true),
            ("1:2:3:4:5:6:7:8:9", false),
            ("1:2:3:4:5:6:7::8", false),
            ("1::2::3", false),
            ("12345::", false),
            ("1:", false),
            (":1", false),
            ("g::", false),
            ("fe80::1%en0", true),
            ("fe80::1%", false),
            ("::1.2.3.4", true),
            ("::ffff:1.2.3.4", true),
            ("1:2:3:4:5:6:1.2.3.4", true),
            ("1:2:3:4:5:1.2.3.4", false),
            ("::01.2.3.4", false),
            ("::1.2.3.256", false),
            ("::1.2.3", false),
            ("1.2.3.4", false),
            ("%en0", false),
            ("", false),
        ];
        for (input, want) in cases {
            assert_eq!(is_ipv6_address(input.as_bytes()), *want, "{input:?}");
        }
    }

    #[test]
    fn region_from_zones_cases() {
        let cases: &[(&str, &[&str], Option<&str>)] = &[
            // TestGetAwsRegionFromZones (aws_ebs_test.go).
            ("commercial zone", &["us-west-2a", "us-west-2b"], Some("us-west-2")),
            ("govcloud zone", &["us-gov-east-1a"], Some("us-gov-east-1")),
            ("wavelength zone", &["us-east-1-wl1-bos-wlz-1"], Some("us-east-1")),
            ("local zone", &["us-west-2-lax-1a"], Some("us-west-2")),
            ("invalid: empty zones", &[], None),
            ("invalid: multiple regions", &["us-west-2a", "us-east-1a"], None),
            ("invalid: region name only", &["us-west-2"], None),
            ("invalid: invalid suffix", &["us-west-2ab"], None),
            ("invalid: not enough fields", &["us-west"], None),
            // Beyond upstream's table, following its rules.
            ("six fields", &["a-b-c-d-e-f"], None),
            ("local and regular zone agree", &["us-west-2-lax-1a", "us-west-2c"], Some("us-west-2")),
            ("one bad zone among good ones", &["us-west-2a", "bad"], None),
            ("first byte of a two-byte suffix", &["us-west-\u{e9}"], Some("us-west-\u{FFFD}")),
        ];
        for (name, zones, want) in cases {
            let zones: Vec<String> = zones.iter().map(|z| (*z).to_string()).collect();
            let got = region_from_zones(&zones);
            assert_eq!(got.as_deref().ok(), *want, "case {name:?}: {got:?}");
        }
    }

    #[test]
    fn storage_class_to_csi() {
        struct Case {
            name: &'static str,
            input: Value,
            want: Option<Value>,
        }
        let topo =
            |key: &str, values: &[&str]| json!([{"matchLabelExpressions": [{"key": key, "values": values}]}]);
        let cases = [
            // TestTranslateEBSInTreeStorageClassToCSI (aws_ebs_test.go); 1 and 2 also reference 5.3.
            Case {
                name: "translate normal",
                input: json!({"parameters": {"foo": "bar"}}),
                want: Some(json!({"parameters": {"foo": "bar"}})),
            },
            Case {
                name: "translate empty map",
                input: json!({"parameters": {}}),
                want: Some(json!({"parameters": {}})),
            },
            Case {
                name: "translate with fstype",
                input: json!({"parameters": {"fstype": "ext3"}}),
                want: Some(json!({"parameters": {"csi.storage.k8s.io/fstype": "ext3"}})),
            },
            Case {
                name: "translate with iops",
                input: json!({"parameters": {"iopsPerGB": "100"}}),
                want: Some(json!({"parameters": {"iopsPerGB": "100", "allowautoiopspergbincrease": "true"}})),
            },
            // Upstream's rules beyond its table (reference 4.5, 4.6.1).
            Case {
                name: "no parameters gives an empty map",
                input: json!({}),
                want: Some(json!({"parameters": {}})),
            },
            Case {
                name: "keys are matched case-insensitively, others keep their case",
                input: json!({"parameters": {"FsType": "xfs", "Type": "gp3", "IOPSPERGB": "10"}}),
                want: Some(json!({"parameters": {
                    "csi.storage.k8s.io/fstype": "xfs", "Type": "gp3", "IOPSPERGB": "10",
                    "allowautoiopspergbincrease": "true"
                }})),
            },
            Case {
                name: "Go lower-cases a dotted capital I to i",
                input: json!({"parameters": {"\u{130}opsPerGB": "10"}}),
                want: Some(json!({"parameters": {
                    "\u{130}opsPerGB": "10", "allowautoiopspergbincrease": "true"
                }})),
            },
            Case {
                name: "explicit allowAutoIOPSPerGBIncrease keeps its own key",
                input: json!({"parameters": {"iopsPerGB": "10", "allowAutoIOPSPerGBIncrease": "false"}}),
                want: Some(json!({"parameters": {
                    "iopsPerGB": "10", "allowAutoIOPSPerGBIncrease": "false",
                    "allowautoiopspergbincrease": "true"
                }})),
            },
            Case {
                name: "zone becomes allowed topology",
                input: json!({"parameters": {"zone": "us-east-1a", "type": "gp2"}}),
                want: Some(json!({
                    "parameters": {"type": "gp2"},
                    "allowedTopologies": topo(TOPOLOGY_KEY, &["us-east-1a"])
                })),
            },
            Case {
                name: "zones are split on commas, untrimmed, order kept",
                input: json!({"parameters": {"Zones": "us-east-1c,us-east-1a, us-east-1b"}}),
                want: Some(json!({
                    "parameters": {},
                    "allowedTopologies": topo(TOPOLOGY_KEY, &["us-east-1c", "us-east-1a", " us-east-1b"])
                })),
            },
            Case {
                // Upstream picks at random here; kvol takes the last key in key order.
                name: "zone and zones: zones wins",
                input: json!({"parameters": {"zone": "a", "zones": "b,c"}}),
                want: Some(json!({"parameters": {}, "allowedTopologies": topo(TOPOLOGY_KEY, &["b", "c"])})),
            },
            Case {
                name: "zone with allowed topologies is refused",
                input: json!({
                    "parameters": {"zone": "us-east-1a"},
                    "allowedTopologies": topo(BETA_ZONE, &["us-east-1a"])
                }),
                want: None,
            },
            Case {
                name: "zone with an empty allowed-topologies list",
                input: json!({"parameters": {"zone": "a"}, "allowedTopologies": []}),
                want: Some(json!({"parameters": {}, "allowedTopologies": topo(TOPOLOGY_KEY, &["a"])})),
            },
            Case {
                name: "allowed topologies: zone keys renamed, others kept, empty terms kept empty",
                input: json!({
                    "provisioner": "kubernetes.io/aws-ebs",
                    "metadata": {"name": "gp2"},
                    "reclaimPolicy": "Retain",
                    "allowedTopologies": [
                        {"matchLabelExpressions": [
                            {"key": BETA_ZONE, "values": ["a", "b"]},
                            {"key": "rack", "values": ["r1"]},
                            {"key": GA_ZONE, "values": ["c"]}
                        ]},
                        {"matchLabelExpressions": []},
                        {}
                    ]
                }),
                want: Some(json!({
                    "provisioner": "kubernetes.io/aws-ebs",
                    "metadata": {"name": "gp2"},
                    "reclaimPolicy": "Retain",
                    "parameters": {},
                    "allowedTopologies": [
                        {"matchLabelExpressions": [
                            {"key": TOPOLOGY_KEY, "values": ["a", "b"]},
                            {"key": "rack", "values": ["r1"]},
                            {"key": TOPOLOGY_KEY, "values": ["c"]}
                        ]},
                        {},
                        {}
                    ]
                })),
            },
            Case {
                name: "empty allowed-topologies list stays as it is",
                input: json!({"allowedTopologies": []}),
                want: Some(json!({"parameters": {}, "allowedTopologies": []})),
            },
        ];
        for case in cases {
            let input = sc(case.input);
            let got = crate::translate_in_tree_storage_class_to_csi("kubernetes.io/aws-ebs", &input);
            match (got, case.want) {
                (Ok(got), Some(want)) => assert_same(case.name, &got, &sc(want)),
                (Err(_), None) => {}
                (got, want) => panic!("case {:?}: got {got:?}, want {want:?}", case.name),
            }
        }
    }

    #[test]
    fn inline_volume_to_csi() {
        // TestTranslateInTreeInlineVolumeToCSI (aws_ebs_test.go): PV name and handle.
        let cases: &[(&str, Value, Option<&str>)] = &[
            ("normal ID format", json!({"volumeID": VOL}), Some(VOL)),
            ("aws:///{volumeId} format", json!({"volumeID": "aws:///vol-02399794d890f9375"}), Some(VOL)),
            (
                "aws://{zone}/{volumeId} format",
                json!({"volumeID": "aws://us-west-2a/vol-02399794d890f9375"}),
                Some(VOL),
            ),
            ("fails on invalid volume ID", json!({"volumeID": "aws://us-west-2a/02399794d890f9375"}), None),
            ("fails on empty volume source", Value::Null, None),
        ];
        for (name, source, want) in cases {
            let mut input = json!({"name": "volume"});
            if !source.is_null() {
                input["awsElasticBlockStore"] = source.clone();
            }
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input), "");
            match (got, want) {
                (Ok(got), Some(handle)) => {
                    assert_eq!(
                        got.metadata.name.as_deref(),
                        Some(format!("ebs.csi.aws.com-{handle}").as_str())
                    );
                    let csi = got.spec.and_then(|s| s.csi).map(|c| c.volume_handle);
                    assert_eq!(csi.as_deref(), Some(*handle), "case {name:?}");
                }
                (Err(_), None) => {}
                (got, want) => panic!("case {name:?}: got {got:?}, want {want:?}"),
            }
        }
    }

    #[test]
    fn inline_volume_to_csi_whole_object() {
        let cases = [
            (
                "every field; volume mode from the wrapper",
                json!({"name": "v", "awsElasticBlockStore": {
                    "volumeID": "aws://us-east-1a/vol-1", "fsType": "ext4", "partition": 2, "readOnly": true
                }}),
                json!({
                    "metadata": {"name": "ebs.csi.aws.com-vol-1"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem",
                        "csi": {
                            "driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "fsType": "ext4",
                            "readOnly": true, "volumeAttributes": {"partition": "2"}
                        }
                    }
                }),
            ),
            (
                "partition defaults to 0, unset fields stay unset",
                json!({"name": "v", "awsElasticBlockStore": {"volumeID": "vol-2"}}),
                json!({
                    "metadata": {"name": "ebs.csi.aws.com-vol-2"},
                    "spec": {
                        "accessModes": ["ReadWriteOnce"],
                        "volumeMode": "Filesystem",
                        "csi": {
                            "driver": "ebs.csi.aws.com", "volumeHandle": "vol-2",
                            "volumeAttributes": {"partition": "0"}
                        }
                    }
                }),
            ),
        ];
        for (name, input, want) in cases {
            let got = crate::translate_in_tree_inline_volume_to_csi(&vol(input), "ns").unwrap();
            assert_same(name, &got, &pv(want));
        }
        // translate_test.go TestTranslateInTreeInlineVolumeToCSINameUniqueness, for this driver.
        let name_of = |id: &str| {
            let input = vol(json!({"name": "v", "awsElasticBlockStore": {"volumeID": id}}));
            crate::translate_in_tree_inline_volume_to_csi(&input, "").unwrap().metadata.name
        };
        assert_ne!(
            name_of("0c9f4d3e-7a51-4b8e-9b4f-2d7c1e0a6b11"),
            name_of("5a2e8c71-3f0d-4c6a-8e19-b7d4f2a09c35")
        );
    }

    #[test]
    fn pv_to_csi_and_back() {
        struct Case {
            name: &'static str,
            input: Value,
            csi: Value,
            back: Value,
        }
        let ebs = json!({"volumeID": "vol01", "fsType": "ext3", "partition": 1, "readOnly": true});
        let csi = json!({
            "driver": "ebs.csi.aws.com", "volumeHandle": "vol01", "fsType": "ext3", "readOnly": true,
            "volumeAttributes": {"partition": "1"}
        });
        let beta_labels = json!({BETA_ZONE: "us-east-1a", BETA_REGION: "us-east-1"});
        let ga_labels = json!({GA_ZONE: "us-east-1a", GA_REGION: "us-east-1"});
        let cases = [
            // TestTranslationStability (translate_test.go), "AWS EBS PV Source": the round trip is exact.
            Case {
                name: "translation stability",
                input: json!({"spec": {"awsElasticBlockStore": ebs}}),
                csi: json!({"spec": {"csi": csi}}),
                back: json!({"spec": {"awsElasticBlockStore": ebs}}),
            },
            // TestTopologyTranslation (translate_test.go), the AWS cases; upstream checks the CSI
            // node affinity and that the way back succeeds. The way back here follows upstream's rules.
            // Also reference 5.3 AWS 7.
            Case {
                name: "AWS EBS with beta zone labels",
                input: json!({"metadata": {"labels": beta_labels}, "spec": {"awsElasticBlockStore": ebs}}),
                csi: json!({"metadata": {"labels": beta_labels}, "spec": {
                    "csi": csi, "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-east-1a"])]])
                }}),
                back: json!({"metadata": {"labels": beta_labels}, "spec": {
                    "awsElasticBlockStore": ebs,
                    "nodeAffinity": affinity(&[&[(BETA_ZONE, &["us-east-1a"]), (BETA_REGION, &["us-east-1"])]])
                }}),
            },
            Case {
                name: "AWS EBS with beta zone labels and topology",
                input: json!({"metadata": {"labels": beta_labels}, "spec": {
                    "awsElasticBlockStore": ebs, "nodeAffinity": affinity(&[&[(BETA_ZONE, &["us-east-2a"])]])
                }}),
                csi: json!({"metadata": {"labels": beta_labels}, "spec": {
                    "csi": csi, "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-east-2a"])]])
                }}),
                back: json!({"metadata": {"labels": beta_labels}, "spec": {
                    "awsElasticBlockStore": ebs,
                    "nodeAffinity": affinity(&[&[(BETA_ZONE, &["us-east-2a"]), (BETA_REGION, &["us-east-2"])]])
                }}),
            },
            Case {
                name: "AWS EBS with GA zone labels",
                input: json!({"metadata": {"labels": ga_labels}, "spec": {"awsElasticBlockStore": ebs}}),
                csi: json!({"metadata": {"labels": ga_labels}, "spec": {
                    "csi": csi, "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-east-1a"])]])
                }}),
                back: json!({"metadata": {"labels": ga_labels}, "spec": {
                    "awsElasticBlockStore": ebs,
                    "nodeAffinity": affinity(&[&[(GA_ZONE, &["us-east-1a"]), (GA_REGION, &["us-east-1"])]])
                }}),
            },
            Case {
                name: "AWS EBS with GA zone labels and topology",
                input: json!({"metadata": {"labels": ga_labels}, "spec": {
                    "awsElasticBlockStore": ebs, "nodeAffinity": affinity(&[&[(GA_ZONE, &["us-east-2a"])]])
                }}),
                csi: json!({"metadata": {"labels": ga_labels}, "spec": {
                    "csi": csi, "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-east-2a"])]])
                }}),
                back: json!({"metadata": {"labels": ga_labels}, "spec": {
                    "awsElasticBlockStore": ebs,
                    "nodeAffinity": affinity(&[&[(GA_ZONE, &["us-east-2a"]), (GA_REGION, &["us-east-2"])]])
                }}),
            },
            // Upstream's rules beyond its tables.
            Case {
                name: "other fields kept, URL ID shortened, absent partition written as 0",
                input: json!({"metadata": {"name": "pv1", "annotations": {"a": "b"}}, "spec": {
                    "awsElasticBlockStore": {"volumeID": "aws://us-west-2a/vol-9"},
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "claimRef": {"namespace": "ns", "name": "claim"}, "mountOptions": ["debug"],
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "gp2"
                }}),
                csi: json!({"metadata": {"name": "pv1", "annotations": {"a": "b"}}, "spec": {
                    "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-9",
                            "volumeAttributes": {"partition": "0"}},
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "claimRef": {"namespace": "ns", "name": "claim"}, "mountOptions": ["debug"],
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "gp2"
                }}),
                back: json!({"metadata": {"name": "pv1", "annotations": {"a": "b"}}, "spec": {
                    "awsElasticBlockStore": {"volumeID": "vol-9"},
                    "accessModes": ["ReadWriteOnce"], "capacity": {"storage": "1Gi"},
                    "claimRef": {"namespace": "ns", "name": "claim"}, "mountOptions": ["debug"],
                    "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "gp2"
                }}),
            },
            Case {
                name: "beta region in node affinity becomes GA; multi-zone label; two terms",
                input: json!({"metadata": {"labels": {BETA_ZONE: "us-west-2b__us-west-2a"}}, "spec": {
                    "awsElasticBlockStore": {"volumeID": "vol-3"},
                    "nodeAffinity": affinity(&[&[(BETA_REGION, &["us-west-2"])], &[("rack", &["r1"])]])
                }}),
                csi: json!({"metadata": {"labels": {BETA_ZONE: "us-west-2b__us-west-2a"}}, "spec": {
                    "csi": {"driver": "ebs.csi.aws.com", "volumeHandle": "vol-3",
                            "volumeAttributes": {"partition": "0"}},
                    "nodeAffinity": affinity(&[
                        &[(GA_REGION, &["us-west-2"]), (TOPOLOGY_KEY, &["us-west-2a", "us-west-2b"])],
                        &[("rack", &["r1"]), (TOPOLOGY_KEY, &["us-west-2a", "us-west-2b"])]
                    ])
                }}),
                // Back: the beta family is chosen from the label; GA region in term 1 is not the
                // beta region key, so a beta region is added to both terms, and set as a label.
                back: json!({"metadata": {"labels": {
                    BETA_ZONE: "us-west-2b__us-west-2a", BETA_REGION: "us-west-2"
                }}, "spec": {
                    "awsElasticBlockStore": {"volumeID": "vol-3"},
                    "nodeAffinity": affinity(&[
                        &[(GA_REGION, &["us-west-2"]), (BETA_ZONE, &["us-west-2a", "us-west-2b"]),
                          (BETA_REGION, &["us-west-2"])],
                        &[("rack", &["r1"]), (BETA_ZONE, &["us-west-2a", "us-west-2b"]),
                          (BETA_REGION, &["us-west-2"])]
                    ])
                }}),
            },
        ];
        for case in cases {
            let input = pv(case.input);
            let got = crate::translate_in_tree_pv_to_csi(&input).unwrap();
            assert_same(case.name, &got, &pv(case.csi));
            let back = crate::translate_csi_pv_to_in_tree(&got).unwrap();
            assert_same(case.name, &back, &pv(case.back));
        }
    }

    #[test]
    fn pv_to_csi_refusals() {
        // TestKubernetesVolumeIDToEBSVolumeID's invalid ID, through a PV (reference 5.3 AWS 4).
        let input =
            pv(json!({"spec": {"awsElasticBlockStore": {"volumeID": "aws://us-west-2a/02399794d890f9375"}}}));
        let err = crate::translate_in_tree_pv_to_csi(&input).unwrap_err().to_string();
        assert!(err.contains("aws://us-west-2a/02399794d890f9375"), "{err}");
    }

    #[test]
    fn csi_pv_to_in_tree() {
        struct Case {
            name: &'static str,
            input: Value,
            want: Option<Value>,
        }
        let csi = |attrs: Value| json!({"driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "volumeAttributes": attrs});
        let cases = [
            Case {
                name: "partition with a plus sign",
                input: json!({"spec": {"csi": csi(json!({"partition": "+7"}))}}),
                want: Some(json!({"spec": {"awsElasticBlockStore": {"volumeID": "vol-1", "partition": 7}}})),
            },
            Case {
                name: "partition 0 is no partition",
                input: json!({"spec": {"csi": csi(json!({"partition": "0"}))}}),
                want: Some(json!({"spec": {"awsElasticBlockStore": {"volumeID": "vol-1"}}})),
            },
            Case {
                name: "partition keeps its low 32 bits, as Go's int32 conversion",
                input: json!({"spec": {"csi": csi(json!({"partition": "4294967297"}))}}),
                want: Some(json!({"spec": {"awsElasticBlockStore": {"volumeID": "vol-1", "partition": 1}}})),
            },
            Case {
                name: "non-numeric partition is refused",
                input: json!({"spec": {"csi": csi(json!({"partition": "one"}))}}),
                want: None,
            },
            Case {
                name: "partition beyond 64 bits is refused",
                input: json!({"spec": {"csi": csi(json!({"partition": "99999999999999999999"}))}}),
                want: None,
            },
            Case {
                name: "other attributes and secrets dropped, no attributes no partition",
                input: json!({"spec": {"csi": {
                    "driver": "ebs.csi.aws.com", "volumeHandle": "vol-1", "fsType": "xfs", "readOnly": false,
                    "nodeStageSecretRef": {"name": "s", "namespace": "n"}
                }}}),
                want: Some(json!({"spec": {"awsElasticBlockStore": {
                    "volumeID": "vol-1", "fsType": "xfs"
                }}})),
            },
            Case {
                name: "terms in two regions: a region each, no region label, zones joined sorted",
                input: json!({"spec": {"csi": csi(json!({})), "nodeAffinity": affinity(&[
                    &[(TOPOLOGY_KEY, &["us-west-2a"])], &[(TOPOLOGY_KEY, &["us-east-1b"])]
                ])}}),
                want: Some(json!({"metadata": {"labels": {GA_ZONE: "us-east-1b__us-west-2a"}}, "spec": {
                    "awsElasticBlockStore": {"volumeID": "vol-1"},
                    "nodeAffinity": affinity(&[
                        &[(GA_ZONE, &["us-west-2a"]), (GA_REGION, &["us-west-2"])],
                        &[(GA_ZONE, &["us-east-1b"]), (GA_REGION, &["us-east-1"])]
                    ])
                }})),
            },
            Case {
                name: "local zone region; existing labels are kept",
                input: json!({"metadata": {"labels": {GA_ZONE: "mine"}}, "spec": {
                    "csi": csi(json!({})), "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-west-2-lax-1a"])]])
                }}),
                want: Some(
                    json!({"metadata": {"labels": {GA_ZONE: "mine", GA_REGION: "us-west-2"}}, "spec": {
                        "awsElasticBlockStore": {"volumeID": "vol-1"},
                        "nodeAffinity": affinity(&[&[(GA_ZONE, &["us-west-2-lax-1a"]), (GA_REGION, &["us-west-2"])]])
                    }}),
                ),
            },
            Case {
                name: "unparsable zone is refused",
                input: json!({"spec": {"csi": csi(json!({})), "nodeAffinity": affinity(&[&[(TOPOLOGY_KEY, &["us-west-2ab"])]])}}),
                want: None,
            },
            Case {
                name: "one term spanning two regions is refused",
                input: json!({"spec": {"csi": csi(json!({})), "nodeAffinity": affinity(&[
                    &[(TOPOLOGY_KEY, &["us-west-2a", "us-east-1a"])]
                ])}}),
                want: None,
            },
            Case {
                name: "term without zones is refused (the parser gets no zones)",
                input: json!({"spec": {"csi": csi(json!({})), "nodeAffinity": affinity(&[&[("rack", &["r1"])]])}}),
                want: None,
            },
        ];
        for case in cases {
            let got = crate::translate_csi_pv_to_in_tree(&pv(case.input));
            match (got, case.want) {
                (Ok(got), Some(want)) => assert_same(case.name, &got, &pv(want)),
                (Err(_), None) => {}
                (got, want) => panic!("case {:?}: got {got:?}, want {want:?}", case.name),
            }
        }
    }

    #[test]
    fn helpers_follow_go() {
        assert_eq!(parse_partition("-1"), Some(Some(-1)));
        assert_eq!(parse_partition(""), None);
        assert_eq!(parse_partition("+"), None);
        assert_eq!(parse_partition(" 1"), None);
        assert_eq!(parse_partition("1_0"), None);
        assert_eq!(go_string(b"a\xe2\x82b"), "a\u{FFFD}\u{FFFD}b");
        assert_eq!(go_string(b"ok\xff"), "ok\u{FFFD}");
        assert!(key_is("IopsPerGB", "iopspergb"));
        assert!(!key_is("iopspergb2", "iopspergb"));
        assert!(!key_is("\u{131}opspergb", "iopspergb"));
        assert_eq!(AwsEbs.repair_volume_handle("vol-1", "node").unwrap(), "vol-1");
    }
}
