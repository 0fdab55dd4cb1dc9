//! The node's volume groups from `vgs --reportformat json --units b --nosuffix` output (pure).

use serde::Deserialize;

/// The `vgs` arguments whose output [`parse_vgs`] reads.
pub const VGS_ARGS: &[&str] =
    &["--reportformat", "json", "--units", "b", "--nosuffix", "-o", "vg_name,vg_size,vg_free"];

/// One volume group, sizes in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeGroup {
    pub name: String,
    pub size: u64,
    pub free: u64,
}

#[derive(Deserialize)]
struct Report {
    report: Vec<ReportSection>,
}

#[derive(Deserialize)]
struct ReportSection {
    #[serde(default)]
    vg: Vec<RawVg>,
}

#[derive(Deserialize)]
struct RawVg {
    vg_name: String,
    vg_size: String,
    vg_free: String,
}

/// The output could not be read.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum VgsError {
    #[error("vgs output is not its json report: {0}")]
    Json(String),
    #[error(
        "vgs reports volume group {vg:?} with {field} {value:?}, not a byte count (run with --units b --nosuffix)"
    )]
    Size { vg: String, field: &'static str, value: String },
}

/// The volume groups in `vgs` JSON output, in the order reported.
pub fn parse_vgs(output: &str) -> Result<Vec<VolumeGroup>, VgsError> {
    let report: Report = serde_json::from_str(output).map_err(|e| VgsError::Json(e.to_string()))?;
    let raw = report.report.into_iter().flat_map(|s| s.vg);
    raw.map(|vg| {
        let size = bytes(&vg.vg_name, "vg_size", &vg.vg_size)?;
        let free = bytes(&vg.vg_name, "vg_free", &vg.vg_free)?;
        Ok(VolumeGroup { name: vg.vg_name, size, free })
    })
    .collect()
}

fn bytes(vg: &str, field: &'static str, value: &str) -> Result<u64, VgsError> {
    value.trim().parse().map_err(|_| VgsError::Size { vg: vg.to_string(), field, value: value.to_string() })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Captured from lvm2 2.03 (`vgs` with [`VGS_ARGS`]) on two 64 MiB loop devices.
    const TWO_VGS: &str = r#"  {
      "report": [
          {
              "vg": [
                  {"vg_name":"kvt16a", "vg_size":"62914560", "vg_free":"62914560"},
                  {"vg_name":"kvt16b", "vg_size":"62914560", "vg_free":"62914560"}
              ]
          }
      ]
  }
"#;
    /// Captured: `vgs` naming a volume group that does not exist (exit status 5).
    const NONE: &str = r#"  {
      "report": [
          {
              "vg": [
              ]
          }
      ]
  }
"#;

    #[test]
    fn parses_captured_reports() {
        let vg = |name: &str| VolumeGroup { name: name.into(), size: 62914560, free: 62914560 };
        let rows: Vec<(&str, Result<Vec<VolumeGroup>, VgsError>)> = vec![
            (TWO_VGS, Ok(vec![vg("kvt16a"), vg("kvt16b")])),
            (NONE, Ok(vec![])),
            (
                r#"{"report":[{"vg":[{"vg_name":"a","vg_size":"<10.00g","vg_free":"0"}]}]}"#,
                Err(VgsError::Size { vg: "a".into(), field: "vg_size", value: "<10.00g".into() }),
            ),
        ];
        for (text, expected) in rows {
            assert_eq!(parse_vgs(text), expected, "{text}");
        }
        assert!(matches!(parse_vgs("  Volume group \"x\" not found"), Err(VgsError::Json(_))));
    }
}
