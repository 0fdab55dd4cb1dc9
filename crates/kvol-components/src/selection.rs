//! The one decision of what runs: the `storage` config checked against the catalogue, every
//! problem at once, and a verdict with its reason for every known component.

use std::collections::BTreeSet;
use std::fmt;

use kvol_api::StorageSection;

use crate::catalogue::{Catalogue, Entry};
use crate::definition::{NodeFeature, Role};

/// What the caller found out about the node (the decision itself does no I/O).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeFacts {
    pub features: BTreeSet<NodeFeature>,
}

/// Whether a component should run, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Run(String),
    /// Turned off by the config (or not chosen); left exactly as it is.
    Off(String),
    /// Wanted, but it cannot run here (a need the node lacks, or no standalone definition).
    Blocked(String),
}

impl Verdict {
    pub fn runs(&self) -> bool {
        matches!(self, Verdict::Run(_))
    }

    pub fn reason(&self) -> &str {
        match self {
            Verdict::Run(why) | Verdict::Off(why) | Verdict::Blocked(why) => why,
        }
    }

    /// One word for tables: run, off or blocked.
    pub fn word(&self) -> &'static str {
        match self {
            Verdict::Run(_) => "run",
            Verdict::Off(_) => "off",
            Verdict::Blocked(_) => "blocked",
        }
    }
}

/// The outcome for a valid config.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    /// Every component in the catalogue, in its order, with its verdict.
    pub verdicts: Vec<(String, Verdict)>,
    /// Accepted but worth saying: former names, `[]`, repeated names.
    pub warnings: Vec<String>,
}

impl Decision {
    pub fn verdict(&self, name: &str) -> Option<&Verdict> {
        self.verdicts.iter().find(|(n, _)| n == name).map(|(_, v)| v)
    }

    /// The components that should be running now.
    pub fn running(&self) -> impl Iterator<Item = &str> {
        self.verdicts.iter().filter(|(_, v)| v.runs()).map(|(n, _)| n.as_str())
    }
}

/// One thing wrong with the `storage` section, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct ConfigProblem {
    pub field: String,
    pub message: String,
}

const DRIVER_FIELD: &str = "storage.driver";
const OPTIONAL_FIELD: &str = "storage.optionalCsiComponents";

/// Decides which components run. An invalid section yields every problem at once and no
/// decision, so a caller keeps whatever it was running.
pub fn decide(
    storage: &StorageSection,
    catalogue: &Catalogue,
    node: &NodeFacts,
) -> Result<Decision, Vec<ConfigProblem>> {
    decide_with(storage, catalogue, node, |entry, wanted| runnable(entry, wanted, node))
}

/// The same decision for deploying into a cluster (`kvol components apply`): the same rules
/// for what the config asks, no node's facts (a driver that needs one runs only where the
/// node has it, which is its bundle's business), and a component runs only when its
/// definition has a cluster bundle.
pub fn decide_for_cluster(
    storage: &StorageSection,
    catalogue: &Catalogue,
) -> Result<Decision, Vec<ConfigProblem>> {
    let no_facts = NodeFacts::default();
    decide_with(storage, catalogue, &no_facts, |entry, wanted| match wanted {
        Verdict::Run(why) if entry.definition.cluster.is_none() => {
            Verdict::Blocked(format!("{why}, but its definition ({}) has no cluster bundle", entry.origin))
        }
        other => other,
    })
}

fn decide_with(
    storage: &StorageSection,
    catalogue: &Catalogue,
    node: &NodeFacts,
    deployable: impl Fn(&Entry, Verdict) -> Verdict,
) -> Result<Decision, Vec<ConfigProblem>> {
    let mut notes = Notes::default();
    let driver = choose_driver(storage.driver.as_deref(), catalogue, &mut notes);
    let optional = choose_optional(storage.optional_csi_components.as_deref(), catalogue, &mut notes);
    if !notes.problems.is_empty() {
        return Err(notes.problems);
    }
    let verdicts = catalogue
        .entries()
        .iter()
        .map(|entry| {
            let wanted = match entry.definition.role {
                Role::Driver => driver.verdict_for(entry, catalogue, node),
                Role::Optional => optional.verdict_for(entry),
            };
            (entry.definition.name.clone(), deployable(entry, wanted))
        })
        .collect();
    Ok(Decision { verdicts, warnings: notes.warnings })
}

#[derive(Default)]
struct Notes {
    problems: Vec<ConfigProblem>,
    warnings: Vec<String>,
}

impl Notes {
    fn problem(&mut self, field: &str, message: String) {
        self.problems.push(ConfigProblem { field: field.to_string(), message });
    }
}

/// What the config says about the driver.
enum DriverChoice {
    Default,
    None,
    Named(String),
    /// A retired former name: nothing runs for it.
    Retired,
    Invalid,
}

impl DriverChoice {
    fn verdict_for(&self, entry: &Entry, catalogue: &Catalogue, node: &NodeFacts) -> Verdict {
        let name = &entry.definition.name;
        match self {
            DriverChoice::Named(chosen) if chosen == name => {
                Verdict::Run(format!("{DRIVER_FIELD} is {name}"))
            }
            DriverChoice::Named(chosen) => Verdict::Off(format!("{DRIVER_FIELD} is {chosen}")),
            DriverChoice::None => Verdict::Off(format!("{DRIVER_FIELD} is none")),
            DriverChoice::Retired | DriverChoice::Invalid => {
                Verdict::Off(format!("{DRIVER_FIELD} names no driver"))
            }
            DriverChoice::Default => match default_driver(catalogue, node) {
                Some(default) if default == name => {
                    Verdict::Run(format!("{DRIVER_FIELD} is unset and {name} is this node's default driver"))
                }
                Some(default) => Verdict::Off(format!(
                    "{DRIVER_FIELD} is unset and this node's default driver is {default}"
                )),
                None => Verdict::Off(format!("{DRIVER_FIELD} is unset and no default driver fits this node")),
            },
        }
    }
}

fn choose_driver(written: Option<&str>, catalogue: &Catalogue, notes: &mut Notes) -> DriverChoice {
    let written = match written.map(str::trim) {
        None | Some("") => return DriverChoice::Default,
        Some("none") => return DriverChoice::None,
        Some(name) => name,
    };
    let drivers = names_of(catalogue, Role::Driver);
    match catalogue.resolve(written) {
        None => {
            notes.problem(DRIVER_FIELD, format!("unknown driver {written:?} (known: {drivers}, or none)"));
            DriverChoice::Invalid
        }
        Some((entry, _)) if entry.definition.role != Role::Driver => {
            let name = &entry.definition.name;
            notes.problem(DRIVER_FIELD, format!("{name:?} is an optional component, not a driver: list it in {OPTIONAL_FIELD} (drivers: {drivers})"));
            DriverChoice::Invalid
        }
        Some((_, Some(former))) if former.retired => {
            notes.warnings.push(retired_warning(DRIVER_FIELD, written, &former.note));
            DriverChoice::Retired
        }
        Some((entry, former)) => {
            if let Some(former) = former {
                notes.warnings.push(renamed_warning(
                    DRIVER_FIELD,
                    written,
                    &entry.definition.name,
                    &former.note,
                ));
            }
            DriverChoice::Named(entry.definition.name.clone())
        }
    }
}

/// The highest-ranked driver whose needs the node meets (ties by name).
fn default_driver<'c>(catalogue: &'c Catalogue, node: &NodeFacts) -> Option<&'c str> {
    catalogue
        .entries()
        .iter()
        .filter(|e| e.definition.role == Role::Driver && unmet_need(e, node).is_none())
        .filter_map(|e| Some((e.definition.default_rank?, e.definition.name.as_str())))
        .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)))
        .map(|(_, name)| name)
}

/// What the config says about optional components.
enum OptionalChoice {
    Default,
    None,
    Listed(BTreeSet<String>),
}

impl OptionalChoice {
    fn verdict_for(&self, entry: &Entry) -> Verdict {
        let name = &entry.definition.name;
        match self {
            OptionalChoice::Default if entry.definition.on_by_default => {
                Verdict::Run(format!("{OPTIONAL_FIELD} is unset or empty and {name} is on by default"))
            }
            OptionalChoice::Default => {
                Verdict::Off(format!("{OPTIONAL_FIELD} is unset or empty and {name} is off by default"))
            }
            OptionalChoice::None => Verdict::Off(format!("{OPTIONAL_FIELD} is [none]")),
            OptionalChoice::Listed(names) if names.contains(name) => {
                Verdict::Run(format!("{OPTIONAL_FIELD} lists {name}"))
            }
            OptionalChoice::Listed(_) => Verdict::Off(format!("{OPTIONAL_FIELD} does not list {name}")),
        }
    }
}

fn choose_optional(
    written: Option<&[Option<String>]>,
    catalogue: &Catalogue,
    notes: &mut Notes,
) -> OptionalChoice {
    let Some(items) = written else { return OptionalChoice::Default };
    let names: Vec<&str> =
        items.iter().map(|i| i.as_deref().unwrap_or("").trim()).filter(|n| !n.is_empty()).collect();
    if names.is_empty() {
        notes.warnings.push(format!(
            "{OPTIONAL_FIELD}: an empty list means the default ({}); write [none] to run none",
            default_optional(catalogue)
        ));
        return OptionalChoice::Default;
    }
    if names.contains(&"none") {
        if names.len() > 1 {
            let others: Vec<&str> = names.iter().copied().filter(|n| *n != "none").collect();
            notes.problem(
                OPTIONAL_FIELD,
                format!("none stands alone, but the list also has {}", others.join(", ")),
            );
        }
        check_each(names.iter().copied().filter(|n| *n != "none"), catalogue, notes);
        return OptionalChoice::None;
    }
    OptionalChoice::Listed(check_each(names.into_iter(), catalogue, notes))
}

/// Resolves each listed name; unknown names and drivers are problems even when storage is off.
fn check_each<'a>(
    names: impl Iterator<Item = &'a str>,
    catalogue: &Catalogue,
    notes: &mut Notes,
) -> BTreeSet<String> {
    let mut chosen = BTreeSet::new();
    for written in names {
        let Some((entry, former)) = catalogue.resolve(written) else {
            let known = names_of(catalogue, Role::Optional);
            notes.problem(OPTIONAL_FIELD, format!("unknown component {written:?} (known: {known}, or none)"));
            continue;
        };
        let name = &entry.definition.name;
        if entry.definition.role == Role::Driver {
            notes.problem(
                OPTIONAL_FIELD,
                format!("{name:?} is a driver, not an optional component: set {DRIVER_FIELD}: {name}"),
            );
            continue;
        }
        match former {
            Some(former) if former.retired => {
                notes.warnings.push(retired_warning(OPTIONAL_FIELD, written, &former.note));
                continue;
            }
            Some(former) => notes.warnings.push(renamed_warning(OPTIONAL_FIELD, written, name, &former.note)),
            None => {}
        }
        if !chosen.insert(name.clone()) {
            notes.warnings.push(format!("{OPTIONAL_FIELD}: {name} is listed more than once"));
        }
    }
    chosen
}

/// Applies the node's facts and the standalone definition to what the config wants.
fn runnable(entry: &Entry, wanted: Verdict, node: &NodeFacts) -> Verdict {
    let Verdict::Run(why) = wanted else { return wanted };
    if let Some(need) = unmet_need(entry, node) {
        return Verdict::Blocked(format!("{why}, but {}", need.missing()));
    }
    if entry.definition.standalone.is_none() {
        return Verdict::Blocked(format!(
            "{why}, but its definition ({}) says nothing about running standalone",
            entry.origin
        ));
    }
    Verdict::Run(why)
}

fn unmet_need(entry: &Entry, node: &NodeFacts) -> Option<NodeFeature> {
    entry.definition.needs.iter().copied().find(|need| !node.features.contains(need))
}

fn names_of(catalogue: &Catalogue, role: Role) -> String {
    let names: Vec<&str> = catalogue
        .entries()
        .iter()
        .filter(|e| e.definition.role == role)
        .map(|e| e.definition.name.as_str())
        .collect();
    if names.is_empty() { "none defined".to_string() } else { names.join(", ") }
}

fn default_optional(catalogue: &Catalogue) -> String {
    let names: Vec<&str> = catalogue
        .entries()
        .iter()
        .filter(|e| e.definition.role == Role::Optional && e.definition.on_by_default)
        .map(|e| e.definition.name.as_str())
        .collect();
    if names.is_empty() { "nothing".to_string() } else { names.join(", ") }
}

fn renamed_warning(field: &str, written: &str, name: &str, note: &str) -> String {
    format!("{field}: {written:?} is a former name of {name:?}{}; write {name}", parenthesised(note))
}

fn retired_warning(field: &str, written: &str, note: &str) -> String {
    format!("{field}: {written:?} is retired and nothing runs for it{}", parenthesised(note))
}

fn parenthesised(note: &str) -> String {
    if note.is_empty() { String::new() } else { format!(" ({note})") }
}

impl fmt::Display for Decision {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (name, verdict) in &self.verdicts {
            writeln!(f, "{name}: {}: {}", verdict.word(), verdict.reason())?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[path = "selection_tests.rs"]
mod tests;
