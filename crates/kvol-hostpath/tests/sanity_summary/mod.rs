//! csi-sanity's closing line, parsed: shared by the conformance tests of kvol's drivers.

/// What csi-sanity (ginkgo) reports in its closing line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    pub passed: u32,
    pub failed: u32,
    pub pending: u32,
    pub skipped: u32,
}

/// Parses ginkgo's summary line, `SUCCESS! -- 73 Passed | 0 Failed | 1 Pending | 18 Skipped`
/// (or `FAIL! -- …`), from csi-sanity's output.
pub fn parse_summary(output: &str) -> Option<Counts> {
    let line = output.lines().rev().find(|l| l.contains(" Passed | ") && l.contains(" -- "))?;
    let (_, counts) = line.split_once(" -- ")?;
    let mut c = Counts::default();
    for part in counts.split('|') {
        let mut words = part.split_whitespace();
        let n: u32 = words.next()?.parse().ok()?;
        match words.next()? {
            "Passed" => c.passed = n,
            "Failed" => c.failed = n,
            "Pending" => c.pending = n,
            "Skipped" => c.skipped = n,
            _ => return None,
        }
    }
    Some(c)
}

#[test]
fn summaries_are_parsed() {
    let cases: &[(&str, Option<Counts>)] = &[
        (
            "Ran 73 of 92 Specs\nSUCCESS! -- 73 Passed | 0 Failed | 1 Pending | 18 Skipped\nPASS",
            Some(Counts { passed: 73, failed: 0, pending: 1, skipped: 18 }),
        ),
        (
            "FAIL! -- 60 Passed | 2 Failed | 1 Pending | 29 Skipped",
            Some(Counts { passed: 60, failed: 2, pending: 1, skipped: 29 }),
        ),
        ("no summary here", None),
        ("SUCCESS! -- many Passed | 0 Failed", None),
    ];
    for (output, want) in cases {
        assert_eq!(parse_summary(output), *want, "{output}");
    }
}
