//! One field that breaks a rule, and the path rule that every path field shares; what validation and the volume-mode checks both speak.

use std::fmt;

/// One field that breaks a rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldError {
    /// The field's path in the object, e.g. `spec.volumes[2].name`.
    pub field: String,
    pub value: String,
    /// What the value is not, e.g. `a DNS-1123 label`.
    pub rule: &'static str,
    /// Why, e.g. `it contains "/"`.
    pub reason: String,
}

impl fmt::Display for FieldError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {:?} is not {}: {}", self.field, self.value, self.rule, self.reason)
    }
}

/// An absolute path in clean form: `/`, or `/`-separated components none of which is empty,
/// `.` or `..`; no NUL.
pub fn clean_absolute_path(value: &str) -> Result<(), String> {
    if value.contains('\0') {
        return Err("it contains NUL".to_string());
    }
    let Some(rest) = value.strip_prefix('/') else {
        return Err("it is not absolute".to_string());
    };
    if rest.is_empty() {
        return Ok(());
    }
    for part in rest.split('/') {
        match part {
            "" => return Err("it has an empty component (\"//\" or a trailing \"/\")".to_string()),
            "." => return Err("it has a \".\" component".to_string()),
            ".." => return Err("it has a \"..\" component".to_string()),
            _ => {}
        }
    }
    Ok(())
}
