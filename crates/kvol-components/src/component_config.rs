//! The config file kvol writes for a component process: the user's settings over its definition's defaults, decided without I/O.
//!
//! The agent reads the user's file, asks [`render`] what the runtime copy should hold, runs the
//! definition's check on it, and only then replaces the copy and tells the process; a refused
//! edit leaves the copy (and so the running component) as it was.

use serde_json::{Map, Value};

use crate::definition::ConfigFileSpec;

/// What the runtime copy of a component's config should be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rendered {
    /// This text.
    File(String),
    /// No file: no user file and no defaults, so the component makes its own default.
    Absent,
}

/// The runtime copy for `component` from the user's file text (`None`: there is none), named
/// `origin` in errors and in the copy's first line. An empty file is refused as a save cut
/// short, as is anything but a YAML mapping. A user value of `null` removes that default.
pub fn render(
    component: &str,
    spec: &ConfigFileSpec,
    user: Option<&str>,
    origin: &str,
) -> Result<Rendered, String> {
    let defaults = spec.defaults.clone().unwrap_or(Value::Object(Map::new()));
    let merged = match user {
        None if spec.defaults.is_none() => return Ok(Rendered::Absent),
        None => defaults,
        Some(text) => merge(defaults, parse_user(text, origin)?),
    };
    let yaml = serde_saphyr::to_string(&merged).map_err(|e| format!("cannot render {origin}: {e}"))?;
    let from =
        if user.is_some() { format!("{origin} over its defaults") } else { "its defaults".to_string() };
    Ok(Rendered::File(format!(
        "# written by kvol for component {component} from {from}; edit {origin}, not this copy\n{yaml}"
    )))
}

fn parse_user(text: &str, origin: &str) -> Result<Value, String> {
    if text.trim().is_empty() {
        return Err(format!(
            "{origin} is empty (write {{}} for the defaults; remove the file for the component's own)"
        ));
    }
    let value: Value = serde_saphyr::from_str(text).map_err(|e| format!("invalid yaml in {origin}: {e}"))?;
    match value {
        Value::Object(_) => Ok(value),
        other => Err(format!("{origin} must be a mapping of settings, not {}", kind(&other))),
    }
}

fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "nothing",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// `over` laid on `under`: mappings merge key by key, anything else from `over` replaces, and
/// `null` in `over` removes the key.
fn merge(under: Value, over: Value) -> Value {
    match (under, over) {
        (Value::Object(mut base), Value::Object(top)) => {
            for (key, value) in top {
                if value.is_null() {
                    base.remove(&key);
                    continue;
                }
                let merged = match base.remove(&key) {
                    Some(old) => merge(old, value),
                    None => value,
                };
                base.insert(key, merged);
            }
            Value::Object(base)
        }
        (_, over) => over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn spec(defaults: Option<Value>) -> ConfigFileSpec {
        ConfigFileSpec { defaults, check: None }
    }

    /// The YAML body of a rendered file, parsed back, so rows compare values, not formatting.
    fn body(rendered: Rendered) -> Option<Value> {
        match rendered {
            Rendered::File(text) => {
                assert!(text.starts_with("# written by kvol for component c from "), "{text}");
                Some(serde_saphyr::from_str(&text).unwrap())
            }
            Rendered::Absent => None,
        }
    }

    #[test]
    fn the_user_file_is_laid_over_the_defaults() {
        let defaults = json!({"socket-name": "/run/lvmd.sock", "device-classes": [{"name": "ssd"}], "log": {"level": "info", "json": false}});
        // (what, defaults, user text, Ok(body) or Err(words))
        type Row<'a> = (&'a str, Option<Value>, Option<&'a str>, Result<Option<Value>, &'a str>);
        let rows: Vec<Row> = vec![
            ("no file, no defaults: the component's own", None, None, Ok(None)),
            ("no file: the defaults", Some(defaults.clone()), None, Ok(Some(defaults.clone()))),
            ("no defaults: the file", None, Some("a: 1\n"), Ok(Some(json!({"a": 1})))),
            (
                "a key replaced, a nested key merged, a list replaced whole",
                Some(defaults.clone()),
                Some("socket-name: /x.sock\nlog: {level: debug}\ndevice-classes: [{name: hdd}]\n"),
                Ok(Some(
                    json!({"socket-name": "/x.sock", "device-classes": [{"name": "hdd"}], "log": {"level": "debug", "json": false}}),
                )),
            ),
            (
                "null removes a default",
                Some(defaults.clone()),
                Some("log: ~\n"),
                Ok(Some(json!({"socket-name": "/run/lvmd.sock", "device-classes": [{"name": "ssd"}]}))),
            ),
            ("{} keeps the defaults", Some(defaults.clone()), Some("{}\n"), Ok(Some(defaults.clone()))),
            ("empty: a save cut short", Some(defaults.clone()), Some("  \n"), Err("is empty")),
            (
                "cut mid-value",
                None,
                Some("device-classes: [{name: ss"),
                Err("invalid yaml in /etc/kvol/c.yaml"),
            ),
            ("a list is not settings", None, Some("- a\n"), Err("must be a mapping of settings, not a list")),
            ("a scalar is not settings", None, Some("hello\n"), Err("not a string")),
        ];
        for (what, defaults, user, want) in rows {
            let got = render("c", &spec(defaults), user, "/etc/kvol/c.yaml");
            match (got, want) {
                (Ok(rendered), Ok(body_wanted)) => assert_eq!(body(rendered), body_wanted, "{what}"),
                (Err(e), Err(words)) => assert!(e.contains(words), "{what}: {e}"),
                (got, _) => panic!("{what}: {got:?}"),
            }
        }
    }

    #[test]
    fn the_copy_says_where_to_edit() {
        let Rendered::File(text) = render("lvm", &spec(None), Some("a: 1\n"), "/etc/kvol/lvm.yaml").unwrap()
        else {
            panic!("a file")
        };
        assert!(text.lines().next().unwrap().contains("edit /etc/kvol/lvm.yaml, not this copy"), "{text}");
    }
}
