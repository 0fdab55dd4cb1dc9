//! The downward API's file contents as kubelet writes them: a pod's labels or annotations as sorted `key="value"` lines, and a container's resource as a whole number of its divisor; pure.
//!
//! Facts from the kubelet v1.26 peer (a pod with labels `app: oracle`, `tier: test` and a
//! `limits.memory` of 64Mi with divisor 1Mi): the labels file is `app="oracle"\ntier="test"`
//! with no newline at the end, the memory file `64`. Values are quoted as Go's `%q` quotes.

use std::collections::BTreeMap;

use crate::quantity::parse_bytes;

/// Labels or annotations as kubelet's `formatMap` writes them: one `key="value"` line per key,
/// in key order, the value quoted as Go's `%q`, no newline after the last.
pub fn format_map(map: &BTreeMap<String, String>) -> String {
    map.iter().map(|(key, value)| format!("{key}={}", go_quote(value))).collect::<Vec<_>>().join("\n")
}

/// A string quoted as Go's `strconv.Quote` (`%q`): `"` and `\` escaped, the C escapes for
/// `\a \b \f \n \r \t \v`, other control characters as `\xNN` (below 0x80) or `\uNNNN`; every
/// other character as it is (Go keeps printable Unicode; this keeps all non-control
/// characters, which differs only for Unicode's few non-printable, non-control ones).
pub fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    out.push('"');
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{b}' => out.push_str("\\v"),
            c if c.is_control() && (c as u32) < 0x80 => out.push_str(&format!("\\x{:02x}", c as u32)),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// A container's resource (`limits.cpu`, `requests.memory`, `limits.ephemeral-storage` …) as
/// kubelet writes it: the quantity divided by `divisor` (`"1"` when unset or zero, as kubelet
/// reads it: the API server fills an unset divisor with `"0"`), rounded up — CPU in thousandths,
/// memory and storage in bytes. An unknown resource or a bad quantity is an error naming it.
pub fn resource_value(resource: &str, quantity: &str, divisor: Option<&str>) -> Result<String, String> {
    let divisor = divisor.filter(|d| !d.is_empty()).unwrap_or("1");
    let kind = resource.split_once('.').map(|(_, kind)| kind).unwrap_or(resource);
    let bad = |what: &str, text: &str, e: String| format!("{resource}: {what} {text:?}: {e}");
    let (value, per) = match kind {
        "cpu" => (
            milli_value(quantity).map_err(|e| bad("quantity", quantity, e))?,
            milli_value(divisor).map_err(|e| bad("divisor", divisor, e))?,
        ),
        "memory" | "ephemeral-storage" => (
            parse_bytes(quantity).map_err(|e| bad("quantity", quantity, e.to_string()))?,
            parse_bytes(divisor).map_err(|e| bad("divisor", divisor, e.to_string()))?,
        ),
        _ => {
            return Err(format!(
                "{resource}: not a resource the downward API serves (cpu, memory, ephemeral-storage)"
            ));
        }
    };
    // A zero divisor means "1" of the resource's unit: a core in thousandths, a byte.
    let per = match (per, kind) {
        (0, "cpu") => 1000,
        (0, _) => 1,
        (per, _) => per,
    };
    Ok(value.div_ceil(per).to_string())
}

/// A quantity in thousandths, rounded up (Kubernetes' `MilliValue`): the quantity read with its
/// decimal exponent raised by three, or its binary value times 1,000.
fn milli_value(text: &str) -> Result<u64, String> {
    let split =
        text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let exponent = match suffix {
        "" => Some(0),
        "n" => Some(-9),
        "u" => Some(-6),
        "m" => Some(-3),
        "k" => Some(3),
        "M" => Some(6),
        "G" => Some(9),
        "T" => Some(12),
        "P" => Some(15),
        "E" => Some(18),
        s if s.starts_with(['e', 'E']) => Some(s[1..].parse::<i32>().map_err(|e| e.to_string())?),
        _ => None,
    };
    match exponent {
        Some(exponent) => parse_bytes(&format!("{number}e{}", exponent + 3)).map_err(|e| e.to_string()),
        None => parse_bytes(text)
            .map_err(|e| e.to_string())?
            .checked_mul(1000)
            .ok_or_else(|| "too large".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_annotations_are_kubelets_lines() {
        let map =
            |pairs: &[(&str, &str)]| pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        // The kubelet peer's own file, byte for byte.
        assert_eq!(format_map(&map(&[("tier", "test"), ("app", "oracle")])), "app=\"oracle\"\ntier=\"test\"");
        assert_eq!(
            format_map(&map(&[("kubernetes.io/config.source", "api"), ("note", "hello")])),
            "kubernetes.io/config.source=\"api\"\nnote=\"hello\""
        );
        assert_eq!(format_map(&BTreeMap::new()), "");
    }

    #[test]
    fn values_are_quoted_as_go_quotes_them() {
        let rows: &[(&str, &str)] = &[
            ("plain", "\"plain\""),
            ("say \"hi\"", "\"say \\\"hi\\\"\""),
            ("a\\b", "\"a\\\\b\""),
            ("two\nlines\ttab", "\"two\\nlines\\ttab\""),
            ("\u{7}\u{8}\u{c}\r\u{b}", "\"\\a\\b\\f\\r\\v\""),
            ("nul\u{0}del\u{7f}", "\"nul\\x00del\\x7f\""),
            ("c1\u{85}", "\"c1\\u0085\""),
            ("grüße 日本", "\"grüße 日本\""),
            ("", "\"\""),
        ];
        for (value, want) in rows {
            assert_eq!(go_quote(value), *want, "{value:?}");
        }
    }

    #[test]
    fn resources_are_whole_divisors_rounded_up() {
        // (resource, quantity, divisor, value or error words)
        type Row<'a> = (&'a str, &'a str, Option<&'a str>, Result<&'a str, &'a str>);
        let rows: &[Row] = &[
            ("limits.memory", "64Mi", Some("1Mi"), Ok("64")), // the kubelet peer's
            ("limits.memory", "64Mi", None, Ok("67108864")),
            ("requests.memory", "100Mi", Some("1Gi"), Ok("1")),
            ("limits.ephemeral-storage", "1G", Some("1M"), Ok("1000")),
            ("limits.cpu", "100m", None, Ok("1")),
            ("limits.cpu", "100m", Some("1m"), Ok("100")),
            ("limits.cpu", "2", Some("1m"), Ok("2000")),
            ("requests.cpu", "1500m", Some("1"), Ok("2")),
            ("limits.cpu", "1Ki", Some("1"), Ok("1024")),
            ("limits.cpu", "0.5", Some("100m"), Ok("5")),
            // The API server's default for an unset divisor: read as 1, as kubelet reads it.
            ("limits.memory", "1Gi", Some("0"), Ok("1073741824")),
            ("limits.memory", "64Mi", Some("0Mi"), Ok("67108864")),
            ("limits.cpu", "1500m", Some("0"), Ok("2")),
            ("requests.cpu", "250m", Some("0m"), Ok("1")),
            ("limits.memory", "lots", None, Err("quantity \"lots\"")),
            ("limits.gpu", "1", None, Err("not a resource")),
        ];
        for (resource, quantity, divisor, want) in rows {
            let got = resource_value(resource, quantity, *divisor);
            match want {
                Ok(value) => assert_eq!(got.as_deref(), Ok(*value), "{resource} {quantity} / {divisor:?}"),
                Err(words) => {
                    assert!(got.as_ref().is_err_and(|e| e.contains(words)), "{resource} {quantity}: {got:?}")
                }
            }
        }
    }
}
