//! A driver's reply: upstream's `DriverStatus` JSON read the way Go's `encoding/json` reads it, then judged.
//!
//! Go matches object keys to struct fields case-insensitively (`Status`, `CAPABILITIES` and
//! `requiresfsresize` all count), keeps the last of repeated keys, leaves absent fields (and
//! fields set to `null`) at their defaults, ignores unknown keys and refuses values of the wrong
//! type. [`parse_status`] does the same; [`judge`] then applies upstream's `handleCmdResponse`
//! and its exit-status rules.

use std::fmt;

use serde::Deserializer;
use serde::de::{self, IgnoredAny, MapAccess, Visitor};

use crate::error::{FlexError, Result};
use crate::protocol::{Command, DriverCapabilities, DriverStatus};

/// The status a driver prints when a command worked.
pub const STATUS_SUCCESS: &str = "Success";
/// The status a driver prints for a command it does not implement.
pub const STATUS_NOT_SUPPORTED: &str = "Not supported";

/// How many characters of bad output an error quotes.
const HEAD_CHARS: usize = 200;

/// Reads a driver's output as a status over the defaults (default capabilities included), or
/// says why it is not one. Invalid UTF-8 becomes U+FFFD first, as Go's decoder does in strings.
pub fn parse_status(output: &[u8]) -> std::result::Result<DriverStatus, String> {
    let text = String::from_utf8_lossy(output);
    let mut de = serde_json::Deserializer::from_str(&text);
    let status = de.deserialize_any(StatusVisitor).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    Ok(status)
}

/// Judges one finished call: `output` is what the driver printed (stdout and stderr together),
/// `failed_exit` describes its exit status when it was not zero.
///
/// - output that is not a status: [`FlexError::BadOutput`];
/// - status `Not supported`: [`FlexError::NotSupported`];
/// - any status but `Success`: [`FlexError::Failed`];
/// - a `Success` body with a non-zero exit: [`FlexError::SuccessWithFailedExit`] (upstream logs a
///   driver bug and fails the call with the exit error);
/// - otherwise the status.
pub fn judge(
    driver: &str,
    command: Command,
    output: &[u8],
    failed_exit: Option<&str>,
) -> Result<DriverStatus> {
    let judged = match parse_status(output) {
        Err(reason) => Err(FlexError::BadOutput {
            driver: driver.to_string(),
            command: command.as_str(),
            reason,
            head: head(output),
        }),
        Ok(status) if status.status == STATUS_NOT_SUPPORTED => {
            Err(FlexError::NotSupported { driver: driver.to_string(), command: command.as_str() })
        }
        Ok(status) if status.status != STATUS_SUCCESS => Err(FlexError::Failed {
            driver: driver.to_string(),
            command: command.as_str(),
            status: status.status,
            message: status.message,
        }),
        Ok(status) => Ok(status),
    };
    match (failed_exit, judged) {
        (Some(exit), Ok(_)) => Err(FlexError::SuccessWithFailedExit {
            driver: driver.to_string(),
            command: command.as_str(),
            exit: exit.to_string(),
        }),
        (_, judged) => judged,
    }
}

/// The first characters of some output, for error messages.
fn head(output: &[u8]) -> String {
    String::from_utf8_lossy(output).chars().take(HEAD_CHARS).collect()
}

/// Whether a JSON key names `field` the way Go's decoder decides it: equal under Unicode simple
/// case folding. Field names are ASCII, so besides ASCII case only `ſ` (U+017F, folds to `s`)
/// and the Kelvin sign (U+212A, folds to `k`) can match.
fn key_is(key: &str, field: &str) -> bool {
    let mut key_chars = key.chars();
    for f in field.chars() {
        let Some(k) = key_chars.next() else { return false };
        let k = match k {
            '\u{017F}' => 's',
            '\u{212A}' => 'k',
            k => k.to_ascii_lowercase(),
        };
        if k != f.to_ascii_lowercase() {
            return false;
        }
    }
    key_chars.next().is_none()
}

struct StatusVisitor;

impl<'de> Visitor<'de> for StatusVisitor {
    type Value = DriverStatus;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    /// A top-level `null` leaves everything at its default, as in Go (and then fails as an empty status).
    fn visit_unit<E: de::Error>(self) -> std::result::Result<DriverStatus, E> {
        Ok(DriverStatus::default())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<DriverStatus, A::Error> {
        let mut status = DriverStatus::default();
        while let Some(key) = map.next_key::<String>()? {
            if key_is(&key, "status") {
                set(&mut status.status, map.next_value()?);
            } else if key_is(&key, "message") {
                set(&mut status.message, map.next_value()?);
            } else if key_is(&key, "device") {
                set(&mut status.device, map.next_value()?);
            } else if key_is(&key, "volumeName") {
                set(&mut status.volume_name, map.next_value()?);
            } else if key_is(&key, "attached") {
                set(&mut status.attached, map.next_value()?);
            } else if key_is(&key, "capabilities") {
                // Go decodes into the existing defaults, so a partial object keeps the rest.
                map.next_value_seed(CapabilitiesSeed(&mut status.capabilities))?;
            } else if key_is(&key, "volumeNewSize") {
                // Present in upstream's struct and unused; still refused when not an integer.
                map.next_value::<Option<i64>>()?;
            } else {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(status)
    }
}

/// Sets a field unless the JSON said `null` (Go leaves non-pointer fields alone on `null`).
fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(value) = value {
        *field = value;
    }
}

/// Decodes a `capabilities` object over the capabilities already there.
struct CapabilitiesSeed<'a>(&'a mut DriverCapabilities);

impl<'de> de::DeserializeSeed<'de> for CapabilitiesSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CapabilitiesSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a capabilities object")
    }

    /// `"capabilities": null` keeps the defaults. (Go would set its pointer to nil and kubelet
    /// would then crash dereferencing it in `init`; keeping the defaults is the sane reading.)
    fn visit_unit<E: de::Error>(self) -> std::result::Result<(), E> {
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<(), A::Error> {
        let caps = self.0;
        while let Some(key) = map.next_key::<String>()? {
            let field = if key_is(&key, "attach") {
                &mut caps.attach
            } else if key_is(&key, "selinuxRelabel") {
                &mut caps.selinux_relabel
            } else if key_is(&key, "supportsMetrics") {
                &mut caps.supports_metrics
            } else if key_is(&key, "fsGroup") {
                &mut caps.fs_group
            } else if key_is(&key, "requiresFSResize") {
                &mut caps.requires_fs_resize
            } else {
                map.next_value::<IgnoredAny>()?;
                continue;
            };
            set(field, map.next_value()?);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn caps(attach: bool, selinux: bool, metrics: bool, fs_group: bool, resize: bool) -> DriverCapabilities {
        DriverCapabilities {
            attach,
            selinux_relabel: selinux,
            supports_metrics: metrics,
            fs_group,
            requires_fs_resize: resize,
        }
    }

    fn status(status: &str) -> DriverStatus {
        DriverStatus { status: status.to_string(), ..DriverStatus::default() }
    }

    #[test]
    fn statuses_parse_like_go_encoding_json() {
        let defaults = DriverCapabilities::default();
        assert_eq!(defaults, caps(true, true, false, true, true), "upstream's defaultCapabilities");
        let cases: Vec<(&str, DriverStatus)> = vec![
            (r#"{"status":"Success"}"#, status("Success")),
            (" \n{\"status\" : \"Success\"}\n\n", status("Success")),
            (
                r#"{"status":"Success","message":"ok","device":"/dev/sdb","volumeName":"v","attached":true}"#,
                DriverStatus {
                    message: "ok".into(),
                    device: "/dev/sdb".into(),
                    volume_name: "v".into(),
                    attached: true,
                    ..status("Success")
                },
            ),
            // Keys match case-insensitively, Unicode folding included.
            (
                r#"{"Status":"Success","MESSAGE":"m"}"#,
                DriverStatus { message: "m".into(), ..status("Success") },
            ),
            (r#"{"ſtatuſ":"Success"}"#, status("Success")),
            (
                r#"{"VolumeName":"x","DEVICE":"/d"}"#,
                DriverStatus { volume_name: "x".into(), device: "/d".into(), ..status("") },
            ),
            // The last of repeated keys wins, whatever their case.
            (r#"{"status":"Failure","Status":"Success"}"#, status("Success")),
            (r#"{"Status":"Success","status":"Failure"}"#, status("Failure")),
            // Capabilities: absent keys keep the defaults, any case of the keys counts.
            (
                r#"{"status":"Success","capabilities":{"attach":false}}"#,
                DriverStatus { capabilities: caps(false, true, false, true, true), ..status("Success") },
            ),
            (
                concat!(
                    r#"{"status":"Success","Capabilities":{"Attach":false,"SELINUXRELABEL":false,"#,
                    r#""supportsmetrics":true,"FsGroup":false,"requiresFSResize":false}}"#
                ),
                DriverStatus { capabilities: caps(false, false, true, false, false), ..status("Success") },
            ),
            (
                r#"{"status":"Success","capabilities":{"requiresfsresize":false,"unknown":1}}"#,
                DriverStatus { capabilities: caps(true, true, false, true, false), ..status("Success") },
            ),
            // Two capabilities objects merge, as Go decodes both into one struct.
            (
                r#"{"status":"Success","capabilities":{"attach":false},"CAPABILITIES":{"fsGroup":false}}"#,
                DriverStatus { capabilities: caps(false, true, false, false, true), ..status("Success") },
            ),
            // null leaves a field alone; unknown keys of any type are ignored.
            (r#"{"status":"Success","message":null,"attached":null,"capabilities":null}"#, status("Success")),
            (r#"{"status":"Success","extra":{"a":[1,2,{"b":null}]},"n":1.5}"#, status("Success")),
            (r#"{"status":"Success","volumeNewSize":1073741824}"#, status("Success")),
            // An empty object or a top-level null is an empty status (which then fails).
            ("{}", status("")),
            ("null", status("")),
        ];
        for (output, expected) in cases {
            assert_eq!(parse_status(output.as_bytes()), Ok(expected), "{output}");
        }
    }

    #[test]
    fn outputs_that_are_no_status_say_why() {
        let cases = [
            ("", "EOF"),
            ("   ", "EOF"),
            ("not json", "expected"),
            (r#"{"status":"Success""#, "EOF"),
            (r#"{"status":"Success"} trailing"#, "trailing"),
            (r#"{"status":"Success"}{"status":"Success"}"#, "trailing"),
            ("[]", "expected a JSON object"),
            (r#""Success""#, "expected a JSON object"),
            ("42", "expected a JSON object"),
            (r#"{"status":1}"#, "invalid type: integer `1`, expected a string"),
            (r#"{"attached":"yes"}"#, "invalid type: string \"yes\", expected a boolean"),
            (r#"{"capabilities":{"attach":"false"}}"#, "expected a boolean"),
            (r#"{"capabilities":[]}"#, "expected a capabilities object"),
            (r#"{"volumeNewSize":1.5}"#, "expected i64"),
            ("log line\n{\"status\":\"Success\"}", "expected"),
        ];
        for (output, reason) in cases {
            let err = parse_status(output.as_bytes()).expect_err(output);
            assert!(err.contains(reason), "{output:?}: {err}");
        }
    }

    #[test]
    fn invalid_utf8_inside_strings_becomes_replacement_characters() {
        let output = b"{\"status\":\"Failure\",\"message\":\"bad \xff byte\"}";
        assert_eq!(parse_status(output).unwrap().message, "bad \u{fffd} byte");
    }

    #[test]
    fn judging_follows_handle_cmd_response_and_the_exit_status() {
        type Expect = std::result::Result<&'static str, &'static str>;
        let long_garbage = "x".repeat(500);
        let cases: Vec<(&str, Option<&str>, Expect)> = vec![
            (r#"{"status":"Success","device":"/dev/sdb"}"#, None, Ok("/dev/sdb")),
            (
                r#"{"status":"Not supported"}"#,
                None,
                Err("flexvolume driver acme/lvm: mount is not supported"),
            ),
            (
                r#"{"status":"Failure","message":"no such volume"}"#,
                None,
                Err("flexvolume driver acme/lvm: mount command failed, status: Failure, \
                     reason: no such volume"),
            ),
            (
                r#"{"status":"success"}"#,
                None,
                Err("flexvolume driver acme/lvm: mount command failed, status: success, reason: "),
            ),
            ("{}", None, Err("flexvolume driver acme/lvm: mount command failed, status: , reason: ")),
            (
                "oops",
                None,
                Err("flexvolume driver acme/lvm: mount printed output that is not a driver status \
                     (expected value at line 1 column 1): \"oops\""),
            ),
            // A non-zero exit with a Success body is a driver bug and fails.
            (
                r#"{"status":"Success"}"#,
                Some("exit status: 1"),
                Err("flexvolume driver acme/lvm: mount exited with exit status: 1 \
                     although it printed status Success"),
            ),
            // A non-zero exit otherwise fails with what the body says.
            (
                r#"{"status":"Failure","message":"busy"}"#,
                Some("exit status: 1"),
                Err("flexvolume driver acme/lvm: mount command failed, status: Failure, reason: busy"),
            ),
            (
                r#"{"status":"Not supported"}"#,
                Some("exit status: 1"),
                Err("flexvolume driver acme/lvm: mount is not supported"),
            ),
            (
                "",
                Some("signal: 9 (SIGKILL)"),
                Err("printed output that is not a driver status \
                     (EOF while parsing a value at line 1 column 0): \"\""),
            ),
        ];
        for (output, exit, expected) in cases {
            let got = judge("acme/lvm", Command::Mount, output.as_bytes(), exit);
            match (got, expected) {
                (Ok(status), Ok(device)) => assert_eq!(status.device, device, "{output}"),
                (Err(e), Err(message)) => assert!(e.to_string().ends_with(message), "{output}: {e}"),
                (got, expected) => panic!("{output}: got {got:?}, expected {expected:?}"),
            }
        }
        let err = judge("acme/lvm", Command::Init, long_garbage.as_bytes(), None).unwrap_err();
        match err {
            FlexError::BadOutput { head, command, .. } => {
                assert_eq!(head.len(), HEAD_CHARS);
                assert_eq!(command, "init");
            }
            other => panic!("{other:?}"),
        }
        assert!(
            judge("d", Command::Attach, br#"{"status":"Not supported"}"#, None)
                .unwrap_err()
                .is_not_supported()
        );
    }

    #[test]
    fn keys_fold_only_where_go_folds() {
        let cases = [
            ("status", "status", true),
            ("STATUS", "status", true),
            ("ſtatus", "status", true),
            ("\u{212A}ey", "key", true),
            ("statu", "status", false),
            ("statuss", "status", false),
            ("stätus", "status", false),
            ("volume_name", "volumeName", false),
            ("volumename", "volumeName", true),
        ];
        for (key, field, expected) in cases {
            assert_eq!(key_is(key, field), expected, "{key} vs {field}");
        }
    }
}
