//! Capacity of the hostpath driver: `--capacity` values parsed, and what GetCapacity reports from statvfs of the state directory and the configured caps.

/// The storage-class parameter that names a volume's kind, as upstream's hostpath driver names it.
pub const KIND_PARAMETER: &str = "kind";

/// Parses one `--capacity` value: `<kind>=<quantity>`, or a bare `<quantity>` for volumes
/// without a kind. Quantities are whole numbers of bytes with an optional Kubernetes suffix
/// (binary `Ki Mi Gi Ti Pi Ei` or decimal `k M G T P E`); fractions and exponents are not
/// accepted.
pub fn parse_capacity(value: &str) -> Result<(String, i64), String> {
    let (kind, quantity) = match value.split_once('=') {
        Some((kind, quantity)) => (kind.trim(), quantity.trim()),
        None => ("", value.trim()),
    };
    let bytes = parse_quantity(quantity).map_err(|e| format!("capacity {value:?}: {e}"))?;
    Ok((kind.to_string(), bytes))
}

/// Parses a quantity such as `10Gi`, `500M` or `1048576` into bytes.
pub fn parse_quantity(text: &str) -> Result<i64, String> {
    const SUFFIXES: [(&str, i64); 12] = [
        ("Ki", 1 << 10),
        ("Mi", 1 << 20),
        ("Gi", 1 << 30),
        ("Ti", 1 << 40),
        ("Pi", 1 << 50),
        ("Ei", 1 << 60),
        ("k", 1_000),
        ("M", 1_000_000),
        ("G", 1_000_000_000),
        ("T", 1_000_000_000_000),
        ("P", 1_000_000_000_000_000),
        ("E", 1_000_000_000_000_000_000),
    ];
    let (digits, factor) = SUFFIXES
        .iter()
        .find_map(|(suffix, factor)| text.strip_suffix(suffix).map(|d| (d, *factor)))
        .unwrap_or((text, 1));
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!(
            "quantity {text:?} is not a whole number with an optional suffix (Ki, Mi, Gi, Ti, Pi, Ei, k, M, G, T, P, E)"
        ));
    }
    digits
        .parse::<i64>()
        .ok()
        .and_then(|n| n.checked_mul(factor))
        .ok_or_else(|| format!("quantity {text:?} is too large"))
}

/// What GetCapacity reports: the bytes the filesystem holding the state directory has free
/// for unprivileged users, lowered to what is left of the kind's cap (the cap less the
/// capacities of the volumes of that kind) when caps are configured. With caps configured, a
/// kind without one has none left, as upstream's driver reports.
pub fn available_capacity(
    filesystem_available: i64,
    cap: Option<i64>,
    caps_configured: bool,
    allocated: i64,
) -> i64 {
    let left = match (caps_configured, cap) {
        (false, _) => return filesystem_available.max(0),
        (true, None) => 0,
        (true, Some(cap)) => cap.saturating_sub(allocated),
    };
    left.min(filesystem_available).max(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn capacity_values_parse_like_upstreams_flag() {
        type Want<'a> = Result<(&'a str, i64), &'a str>;
        let cases: &[(&str, Want)] = &[
            ("slow=10Gi", Ok(("slow", 10 << 30))),
            ("fast=500M", Ok(("fast", 500_000_000))),
            ("1Ti", Ok(("", 1 << 40))),
            ("=4096", Ok(("", 4096))),
            ("k=7", Ok(("k", 7))),
            ("slow=", Err("is not a whole number")),
            ("slow=1.5Gi", Err("is not a whole number")),
            ("slow=-1", Err("is not a whole number")),
            ("slow=10Zi", Err("is not a whole number")),
            ("slow=9Ei", Err("is too large")),
        ];
        for (value, want) in cases {
            let got = parse_capacity(value);
            match (want, &got) {
                (Ok((kind, bytes)), Ok((k, b))) => assert_eq!((*kind, *bytes), (k.as_str(), *b), "{value}"),
                (Err(w), Err(g)) => {
                    assert!(g.contains(w) && g.starts_with(&format!("capacity {value:?}")), "{value}: {g}")
                }
                _ => panic!("{value}: want {want:?}, got {got:?}"),
            }
        }
    }

    #[test]
    fn available_capacity_is_the_smaller_of_filesystem_and_cap() {
        // (filesystem, cap, configured, allocated) -> available
        let cases: &[(i64, Option<i64>, bool, i64, i64)] = &[
            (1000, None, false, 0, 1000),
            (1000, None, false, 5000, 1000),
            (-1, None, false, 0, 0),
            (1000, Some(300), true, 100, 200),
            (1000, Some(3000), true, 100, 1000),
            (1000, Some(300), true, 400, 0),
            (1000, None, true, 0, 0),
        ];
        for (fs, cap, configured, allocated, want) in cases {
            assert_eq!(
                available_capacity(*fs, *cap, *configured, *allocated),
                *want,
                "{fs} {cap:?} {configured} {allocated}"
            );
        }
    }
}
