//! What a run found, shown two ways: the terminal table and JUnit XML; secrets redacted from every driver answer shown; pure.

use std::fmt::Write as _;
use std::time::Duration;

use crate::cases::Case;

/// A driver call that went wrong, as the report shows it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallNote {
    /// The CSI RPC, e.g. `NodePublishVolume`.
    pub rpc: String,
    /// The request's fields that matter, secrets already left out.
    pub request: String,
    /// The driver's answer (its status, or what it did).
    pub answer: String,
    /// What kubelet would have done with that answer.
    pub kubelet: String,
}

/// Why a case failed: what was expected and what was seen, and the driver call behind it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    pub call: Option<CallNote>,
}

impl Failure {
    pub fn new(message: impl Into<String>) -> Failure {
        Failure { message: message.into(), call: None }
    }

    pub fn with_call(mut self, call: CallNote) -> Failure {
        self.call = Some(call);
        self
    }
}

/// How one case ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Passed,
    Failed(Failure),
    Skipped(String),
}

/// One case's line in the report.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaseResult {
    pub case: Case,
    pub outcome: Outcome,
    pub elapsed: Duration,
}

/// Passed, failed and skipped counts.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Totals {
    pub passed: usize,
    pub failed: usize,
    pub skipped: usize,
}

pub fn totals(results: &[CaseResult]) -> Totals {
    let mut totals = Totals::default();
    for result in results {
        match result.outcome {
            Outcome::Passed => totals.passed += 1,
            Outcome::Failed(_) => totals.failed += 1,
            Outcome::Skipped(_) => totals.skipped += 1,
        }
    }
    totals
}

/// Keys whose values are never shown, as kvol's logs redact driver arguments: a CSI `secrets`
/// map's entries and anything named like a credential.
const SECRET_WORDS: [&str; 5] = ["secret", "password", "token", "key", "credential"];

/// `text` with the value after any `<secret-looking key>=` or `"<secret-looking key>": ` cut
/// out, so a driver's error message that echoes its secrets does not reach the report.
pub fn redact(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some((before, value_start)) = next_secret_value(rest) {
        out.push_str(&rest[..before]);
        out.push_str("<redacted>");
        let value = &rest[value_start..];
        let end = match value.strip_prefix('"') {
            Some(quoted) => quoted.find('"').map_or(value.len(), |i| i + 2),
            None => {
                value.find(|c: char| c.is_whitespace() || matches!(c, ',' | '}' | ']')).unwrap_or(value.len())
            }
        };
        rest = &value[end..];
    }
    out.push_str(rest);
    out
}

/// Where the next secret value starts: (end of the text kept, start of the value).
fn next_secret_value(text: &str) -> Option<(usize, usize)> {
    let lower = text.to_ascii_lowercase();
    let mut best: Option<(usize, usize)> = None;
    for word in SECRET_WORDS {
        let mut from = 0;
        while let Some(at) = lower[from..].find(word) {
            let after_word = from + at + word.len();
            // The rest of the key (`secret_name`, `token"`), then `=`, `:` or `": `.
            let key_end = after_word
                + lower[after_word..]
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '-'))
                    .unwrap_or(lower.len() - after_word);
            let tail = &text[key_end..];
            // `key=`, `key:`, `"key":`, then any blanks.
            let unquoted = tail.strip_prefix('"').unwrap_or(tail);
            if let Some(after) = unquoted.strip_prefix('=').or_else(|| unquoted.strip_prefix(':')) {
                let blanks = after.len() - after.trim_start_matches(' ').len();
                let value_start = text.len() - after.len() + blanks;
                if best.is_none_or(|(b, _)| value_start < b) {
                    best = Some((value_start, value_start));
                }
                break;
            }
            from = after_word;
        }
    }
    best
}

/// Seconds with one decimal, as the table shows times.
fn seconds(elapsed: Duration) -> String {
    format!("{:.1}s", elapsed.as_secs_f64())
}

/// The terminal table: one line per case (its name, result, time, upstream name), then each
/// failure's message and driver call under it, then the totals.
pub fn table(driver: &str, results: &[CaseResult], total: Duration) -> String {
    let width = results.iter().map(|r| r.case.name.len()).max().unwrap_or(4).max(4);
    let mut out = String::new();
    let _ = writeln!(out, "{:width$}  {:7}  {:>6}  UPSTREAM", "CASE", "RESULT", "TIME");
    for result in results {
        let (word, detail) = match &result.outcome {
            Outcome::Passed => ("passed", None),
            Outcome::Failed(failure) => ("FAILED", Some(failure_lines(failure))),
            Outcome::Skipped(reason) => ("skipped", Some(format!("    {reason}\n"))),
        };
        let _ = writeln!(
            out,
            "{:width$}  {:7}  {:>6}  {}",
            result.case.name,
            word,
            seconds(result.elapsed),
            result.case.upstream_name()
        );
        if let Some(detail) = detail.filter(|_| !matches!(result.outcome, Outcome::Skipped(_))) {
            out.push_str(&detail);
        }
    }
    let t = totals(results);
    let _ = writeln!(
        out,
        "driver {driver}: {} passed, {} failed, {} skipped in {}",
        t.passed,
        t.failed,
        t.skipped,
        seconds(total)
    );
    out
}

/// The skipped cases and why, one per line (printed after the table when asked).
pub fn skip_reasons(results: &[CaseResult]) -> String {
    let mut out = String::new();
    for result in results {
        if let Outcome::Skipped(reason) = &result.outcome {
            let _ = writeln!(out, "skipped {}: {reason}", result.case.name);
        }
    }
    out
}

fn failure_lines(failure: &Failure) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "    {}", redact(&failure.message));
    if let Some(call) = &failure.call {
        let _ = writeln!(out, "    call:    {} {}", call.rpc, redact(&call.request));
        let _ = writeln!(out, "    answer:  {}", redact(&call.answer));
        if !call.kubelet.is_empty() {
            let _ = writeln!(out, "    kubelet: {}", call.kubelet);
        }
    }
    out
}

/// `text` escaped for XML text and attribute values.
pub fn xml_escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // XML 1.0 allows no other control characters.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// JUnit XML as CI systems read it (one `testsuite`, one `testcase` per case; `failure` and
/// `skipped` children), test names as upstream's ginkgo report gives them.
pub fn junit(driver: &str, results: &[CaseResult], total: Duration) -> String {
    let t = totals(results);
    let suite = format!("External Storage [Driver: {driver}]");
    let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        out,
        "<testsuites tests=\"{}\" failures=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
        results.len(),
        t.failed,
        t.skipped,
        total.as_secs_f64()
    );
    let _ = writeln!(
        out,
        "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"0\" skipped=\"{}\" time=\"{:.3}\">",
        xml_escape(&suite),
        results.len(),
        t.failed,
        t.skipped,
        total.as_secs_f64()
    );
    for result in results {
        let name = format!("{suite} {}", result.case.upstream_name());
        let _ = write!(
            out,
            "    <testcase name=\"{}\" classname=\"kvol.test-driver.{}\" time=\"{:.3}\"",
            xml_escape(&name),
            xml_escape(result.case.name),
            result.elapsed.as_secs_f64()
        );
        match &result.outcome {
            Outcome::Passed => out.push_str("/>\n"),
            Outcome::Skipped(reason) => {
                let _ =
                    writeln!(out, ">\n      <skipped message=\"{}\"/>\n    </testcase>", xml_escape(reason));
            }
            Outcome::Failed(failure) => {
                let _ = writeln!(
                    out,
                    ">\n      <failure message=\"{}\" type=\"Failure\">{}</failure>\n    </testcase>",
                    xml_escape(&redact(&failure.message)),
                    xml_escape(&failure_lines(failure))
                );
            }
        }
    }
    out.push_str("  </testsuite>\n</testsuites>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cases::{CASES, CaseId};

    fn case(id: CaseId) -> Case {
        *CASES.iter().find(|c| c.id == id).unwrap()
    }

    #[test]
    fn secrets_are_cut_out_of_what_a_driver_says() {
        // (text, shown)
        let table = [
            ("no secrets here", "no secrets here"),
            ("secrets: map[password:hunter2 user:bob]", "secrets: <redacted> user:bob]"),
            ("password=hunter2 next", "password=<redacted> next"),
            ("{\"token\": \"abc\", \"size\": 1}", "{\"token\": <redacted>, \"size\": 1}"),
            ("api-key: s3cr3t, zone a", "api-key: <redacted>, zone a"),
            (
                "csi.storage.k8s.io/node-stage-secret-name=creds",
                "csi.storage.k8s.io/node-stage-secret-name=<redacted>",
            ),
        ];
        for (text, shown) in table {
            assert_eq!(redact(text), shown, "{text}");
        }
    }

    fn results() -> Vec<CaseResult> {
        vec![
            CaseResult {
                case: case(CaseId::ProvisionDefaults),
                outcome: Outcome::Passed,
                elapsed: Duration::from_millis(1200),
            },
            CaseResult {
                case: case(CaseId::VolumesStoreData),
                outcome: Outcome::Failed(Failure::new("read \"a<b\" & token=xyz").with_call(CallNote {
                    rpc: "NodePublishVolume".into(),
                    request: "volume_id=v1 readonly=true".into(),
                    answer: "OK".into(),
                    kubelet: "kubelet starts the container".into(),
                })),
                elapsed: Duration::from_millis(300),
            },
            CaseResult {
                case: case(CaseId::ProvisionFromSnapshot),
                outcome: Outcome::Skipped("no snapshots".into()),
                elapsed: Duration::ZERO,
            },
        ]
    }

    #[test]
    fn the_table_shows_each_case_and_each_failures_call() {
        let text = table("d", &results(), Duration::from_secs(2));
        let lines: Vec<_> = text.lines().collect();
        assert!(
            lines[1].starts_with("provision-defaults ")
                && lines[1].contains("passed")
                && lines[1].contains("1.2s")
        );
        assert!(lines[2].contains("FAILED") && lines[2].ends_with("volumes should store data"), "{text}");
        assert_eq!(lines[3].trim(), "read \"a<b\" & token=<redacted>");
        assert_eq!(lines[4].trim(), "call:    NodePublishVolume volume_id=v1 readonly=true");
        assert!(lines[6].trim().starts_with("kubelet:"));
        assert!(lines[7].contains("skipped"));
        assert_eq!(lines.last().unwrap(), &"driver d: 1 passed, 1 failed, 1 skipped in 2.0s");
    }

    #[test]
    fn junit_counts_escapes_and_names_as_upstream() {
        let xml = junit("d", &results(), Duration::from_secs(2));
        assert!(xml.contains("<testsuite name=\"External Storage [Driver: d]\" tests=\"3\" failures=\"1\" errors=\"0\" skipped=\"1\""));
        assert!(xml.contains("name=\"External Storage [Driver: d] [Testpattern: Dynamic PV (default fs)] volumes should store data\""));
        assert!(xml.contains("<failure message=\"read &quot;a&lt;b&quot; &amp; token=&lt;redacted&gt;\""));
        assert!(xml.contains("<skipped message=\"no snapshots\"/>"));
        assert!(!xml.contains("xyz"));
        assert_eq!(xml.matches("<testcase ").count(), 3);
    }
}
