//! CSI driver versions: parsing as upstream's `ParseGeneric`, picking the highest usable one, and the duplicate-name rule.
//!
//! Everything here is pure. The rules, as the kubelet applies them when a CSI driver registers:
//! a driver lists the CSI versions it serves; entries that do not parse and entries with a major
//! version above 1 are skipped; the highest of the rest must be a 1.x. A driver whose name is
//! already registered is accepted only when its highest version is strictly higher than the
//! registered one's (so the same driver registering twice at the same version is refused).

use std::cmp::Ordering;
use std::fmt;
use std::str::FromStr;

/// A "generic" version: two or more dot-separated numbers, compared numerically with missing
/// components counting as 0 (`1.2` equals `1.2.0`). Anything after the numbers is accepted and
/// dropped, as upstream's `ParseGeneric` does (`1.2.3-rc.1` is `1.2.3`).
#[derive(Clone, Debug)]
pub struct Version {
    components: Vec<u64>,
}

impl Version {
    /// Parses `s` as upstream's `ParseGeneric`: optional surrounding whitespace, an optional
    /// leading `v`, at least two dot-separated decimal numbers (the first without leading
    /// zeros), then anything.
    pub fn parse(s: &str) -> Result<Version, String> {
        let trimmed = s.trim_start_matches(is_go_space);
        let body = trimmed.strip_prefix('v').unwrap_or(trimmed);
        // The numeric part: digit runs joined by single dots; a dot not followed by a digit
        // belongs to the uninterpreted rest.
        let bytes = body.as_bytes();
        let mut end = 0;
        loop {
            let start = end;
            while end < bytes.len() && bytes[end].is_ascii_digit() {
                end += 1;
            }
            if end == start {
                // Only reachable for the first run (a dot is only consumed before a digit).
                return Err(format!("cannot parse {s:?} as a version: no leading number"));
            }
            if end + 1 < bytes.len() && bytes[end] == b'.' && bytes[end + 1].is_ascii_digit() {
                end += 1;
            } else {
                break;
            }
        }
        let fields: Vec<&str> = body[..end].split('.').collect();
        if fields.len() < 2 {
            return Err(format!("cannot parse {s:?} as a version: it needs at least major.minor"));
        }
        if fields[0].len() > 1 && fields[0].starts_with('0') {
            return Err(format!(
                "cannot parse {s:?} as a version: the major number {:?} has a leading zero",
                fields[0]
            ));
        }
        let components = fields
            .iter()
            .map(|f| {
                f.parse::<u64>().map_err(|e| format!("cannot parse {s:?} as a version: component {f:?}: {e}"))
            })
            .collect::<Result<Vec<u64>, String>>()?;
        Ok(Version { components })
    }

    pub fn major(&self) -> u64 {
        self.components[0]
    }

    pub fn minor(&self) -> u64 {
        self.components[1]
    }

    /// The third component, or 0 when there is none.
    pub fn patch(&self) -> u64 {
        self.components.get(2).copied().unwrap_or(0)
    }

    /// All numeric components as parsed (at least two).
    pub fn components(&self) -> &[u64] {
        &self.components
    }
}

/// Go's `\s` in RE2: space, tab, newline, form feed, carriage return.
fn is_go_space(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\x0c' | '\r')
}

impl FromStr for Version {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Version::parse(s)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, c) in self.components.iter().enumerate() {
            if i > 0 {
                f.write_str(".")?;
            }
            write!(f, "{c}")?;
        }
        Ok(())
    }
}

impl Ord for Version {
    fn cmp(&self, other: &Self) -> Ordering {
        let n = self.components.len().max(other.components.len());
        (0..n)
            .map(|i| {
                let a = self.components.get(i).copied().unwrap_or(0);
                let b = other.components.get(i).copied().unwrap_or(0);
                a.cmp(&b)
            })
            .find(|o| o.is_ne())
            .unwrap_or(Ordering::Equal)
    }
}

impl PartialOrd for Version {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Version {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other).is_eq()
    }
}

impl Eq for Version {}

/// The highest version of `versions` this kubelet can use: entries that do not parse and
/// entries with a major above 1 are skipped; the highest remaining one must be a 1.x.
pub fn highest_supported<S: AsRef<str>>(versions: &[S]) -> Result<Version, String> {
    if versions.is_empty() {
        return Err("the driver reports no supported versions".to_string());
    }
    let mut highest: Option<Version> = None;
    let mut first_error: Option<String> = None;
    for raw in versions {
        match Version::parse(raw.as_ref()) {
            Ok(v) if v.major() > 1 => {}
            Ok(v) => {
                if highest.as_ref().is_none_or(|h| *h < v) {
                    highest = Some(v);
                }
            }
            Err(e) => {
                first_error.get_or_insert(e);
            }
        }
    }
    let listed = versions.iter().map(|v| format!("{:?}", v.as_ref())).collect::<Vec<_>>().join(", ");
    let Some(highest) = highest else {
        let why = first_error.map(|e| format!(" ({e})")).unwrap_or_default();
        return Err(format!(
            "none of the reported versions [{listed}] is usable: each is unparsable or above 1.x{why}"
        ));
    };
    if highest.major() != 1 {
        return Err(format!("the highest usable version of [{listed}] is {highest}, but it must be 1.x"));
    }
    Ok(highest)
}

/// Validates a driver called `name` reporting `versions`, when a driver of that name is already
/// registered with highest version `existing` (or none is): returns the new driver's highest
/// version, or why it is refused.
pub fn validate_new<S: AsRef<str>>(
    name: &str,
    versions: &[S],
    existing: Option<&Version>,
) -> Result<Version, String> {
    let new = highest_supported(versions).map_err(|e| format!("csi driver {name}: {e}"))?;
    if let Some(existing) = existing
        && *existing >= new
    {
        return Err(format!(
            "csi driver {name} is already registered with version {existing}; \
             a new registration needs a higher version, got {new}"
        ));
    }
    Ok(new)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_generic() {
        // (input, Some(components) or None for an error)
        let cases: &[(&str, Option<&[u64]>)] = &[
            ("1.0.0", Some(&[1, 0, 0])),
            ("v1.0.0", Some(&[1, 0, 0])),
            ("v1.2", Some(&[1, 2])),
            ("0.3.0", Some(&[0, 3, 0])),
            ("1.2.3.4", Some(&[1, 2, 3, 4])),
            ("  v1.2.3 ", Some(&[1, 2, 3])),
            ("\t1.2", Some(&[1, 2])),
            // Uninterpreted rest, with or without punctuation.
            ("1.2.3-rc.1+build.5", Some(&[1, 2, 3])),
            ("1.2.3beta", Some(&[1, 2, 3])),
            ("1.2.x", Some(&[1, 2])),
            ("1.2.", Some(&[1, 2])),
            // Only the first component may not have a leading zero.
            ("1.02.003", Some(&[1, 2, 3])),
            ("0.1", Some(&[0, 1])),
            ("01.2", None),
            ("1", None),
            ("v1", None),
            ("1.", None),
            ("", None),
            ("v", None),
            ("V1.0", None),
            ("vv1.0", None),
            ("boo", None),
            ("x1.0", None),
            ("-1.0", None),
            ("1.99999999999999999999", None),
        ];
        for (input, want) in cases {
            let got = Version::parse(input);
            match want {
                Some(c) => assert_eq!(got.as_ref().map(Version::components), Ok(*c), "{input:?}"),
                None => assert!(got.is_err(), "{input:?} parsed as {got:?}"),
            }
        }
    }

    #[test]
    fn compare_with_missing_components_as_zero() {
        let cases = [
            ("1.0", "1.0.0", Ordering::Equal),
            ("1.0.0.0", "v1.0", Ordering::Equal),
            ("1.0.1", "1.0", Ordering::Greater),
            ("1.2", "1.10", Ordering::Less),
            ("1.0.0-rc1", "1.0.0", Ordering::Equal),
            ("0.3.0", "1.0.0", Ordering::Less),
            ("2.0.1", "1.99.99", Ordering::Greater),
        ];
        for (a, b, want) in cases {
            let (va, vb) = (Version::parse(a).unwrap(), Version::parse(b).unwrap());
            assert_eq!(va.cmp(&vb), want, "{a} vs {b}");
            assert_eq!(vb.cmp(&va), want.reverse(), "{b} vs {a}");
            assert_eq!(va == vb, want.is_eq(), "{a} == {b}");
        }
    }

    #[test]
    fn display_drops_the_prefix_and_the_rest() {
        for (input, want) in [("v1.2.3", "1.2.3"), ("1.0", "1.0"), ("1.2.3-rc.1", "1.2.3"), (" 1.02 ", "1.2")]
        {
            assert_eq!(Version::parse(input).unwrap().to_string(), want);
        }
    }

    /// Upstream's `TestHighestSupportedVersion` (16 cases) and the extra cases of
    /// `TestValidatePlugin` (13, most shared), plus our own edges.
    #[test]
    fn highest_supported_version() {
        let cases: &[(&[&str], Option<&str>)] = &[
            // TestHighestSupportedVersion
            (&["v1.0.0"], Some("1.0.0")),
            (&["0.3.0"], None),
            (&["0.2.0"], None),
            (&["1.0.0"], Some("1.0.0")),
            (&["v0.3.0"], None),
            (&["0.2.0"], None),
            (&["0.2.0", "v0.3.0"], None),
            (&["0.2.0", "v1.0.0"], Some("1.0.0")),
            (&["0.2.0", "v1.2.3"], Some("1.2.3")),
            (&["v1.2.3", "v0.3.0"], Some("1.2.3")),
            (&["v1.2.3", "v0.3.0", "2.0.1"], Some("1.2.3")),
            (&["v1.2.3", "4.9.12", "v0.3.0", "2.0.1"], Some("1.2.3")),
            (&["4.9.12", "2.0.1"], None),
            (&["v1.2.3", "boo", "v0.3.0", "2.0.1"], Some("1.2.3")),
            (&[], None),
            (&["var", "boo", "foo"], None),
            // Ours: order does not matter, equal spellings, the highest 1.x wins.
            (&["1.10.0", "1.9.0", "1.2"], Some("1.10.0")),
            (&["1.0", "v1.0.0"], Some("1.0")),
            (&["2.0.0", "1.5.0", "0.9.0"], Some("1.5.0")),
            (&["1"], None),
        ];
        for (versions, want) in cases {
            let got = highest_supported(versions);
            match want {
                Some(w) => assert_eq!(got, Ok(Version::parse(w).unwrap()), "{versions:?}"),
                None => assert!(got.is_err(), "{versions:?} gave {got:?}"),
            }
        }
    }

    #[test]
    fn highest_supported_errors_say_why() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "no supported versions"),
            (&["var", "boo"], "\"var\""),
            (&["4.9.12", "2.0.1"], "none of the reported versions"),
            (&["0.3.0", "v0.2.0"], "0.3.0, but it must be 1.x"),
        ];
        for (versions, needle) in cases {
            let err = highest_supported(versions).unwrap_err();
            assert!(err.contains(needle), "{versions:?}: {err:?} lacks {needle:?}");
        }
    }

    /// Upstream's `TestValidatePluginExistingDriver`, plus a lower version and an
    /// unparsable new list with an existing driver.
    #[test]
    fn validate_new_against_an_existing_driver() {
        /// Existing name, existing versions, new name, new versions, accepted.
        type Case = (&'static str, &'static [&'static str], &'static str, &'static [&'static str], bool);
        let cases: &[Case] = &[
            ("test.plugin", &["v1.0.0"], "test.plugin2", &["v1.0.0"], true),
            ("test.plugin", &["v1.0.0"], "test.plugin", &["v1.0.0"], false),
            ("test.plugin", &["v0.3.0", "v0.2.0", "v1.0.0"], "test.plugin", &["v1.0.1"], true),
            ("test.plugin", &["v1.2.0"], "test.plugin", &["v1.1.0"], false),
            ("test.plugin", &["v1.0.0"], "test.plugin", &["1.0"], false),
            ("test.plugin", &["v1.0.0"], "test.plugin", &["0.3.0"], false),
        ];
        for (old_name, old_versions, new_name, new_versions, ok) in cases {
            let existing = highest_supported(old_versions).unwrap();
            let known = (old_name == new_name).then_some(&existing);
            let got = validate_new(new_name, new_versions, known);
            assert_eq!(
                got.is_ok(),
                *ok,
                "{old_name}@{old_versions:?} then {new_name}@{new_versions:?}: {got:?}"
            );
            if let Err(e) = got {
                assert!(e.contains(new_name), "{e:?} should name the driver");
            }
        }
    }

    /// Upstream's `TestValidatePlugin` (no driver registered yet).
    #[test]
    fn validate_new_without_an_existing_driver() {
        let cases: &[(&[&str], bool)] = &[
            (&["v1.0.0"], true),
            (&["0.3.0"], false),
            (&["0.2.0"], false),
            (&["0.2.0", "v0.3.0"], false),
            (&["0.2.0", "v1.0.0"], true),
            (&["0.2.0", "v1.2.3"], true),
            (&["v1.2.3", "v0.3.0"], true),
            (&["v1.2.3", "v0.3.0", "2.0.1"], true),
            (&["v1.2.3", "4.9.12", "v0.3.0", "2.0.1"], true),
            (&["v1.2.3", "boo", "v0.3.0", "2.0.1"], true),
            (&["4.9.12", "2.0.1"], false),
            (&[], false),
            (&["var", "boo", "foo"], false),
        ];
        for (versions, ok) in cases {
            let got = validate_new("test.plugin", versions, None);
            assert_eq!(got.is_ok(), *ok, "{versions:?}: {got:?}");
        }
    }
}
