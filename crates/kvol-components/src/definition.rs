//! What a component is: a definition read from YAML and checked, with no I/O.

use kvol_api::validation::{csi_driver_name, dns1123_label};
use serde::Deserialize;

/// A storage component kvol can run: a CSI driver, or an optional piece such as snapshots.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ComponentDefinition {
    /// The name users write in `storage.driver` or `storage.optionalCsiComponents`.
    pub name: String,
    /// One line for `kvol components list`.
    #[serde(default)]
    pub description: String,
    pub role: Role,
    #[serde(default)]
    pub provides: Provides,
    /// What the node must have for the component to run at all.
    #[serde(default)]
    pub needs: Vec<NodeFeature>,
    /// Drivers only: with `storage.driver` unset, the highest-ranked driver whose needs the node
    /// meets is chosen.
    #[serde(default)]
    pub default_rank: Option<u32>,
    /// Optional components only: runs when `storage.optionalCsiComponents` is unset or empty.
    #[serde(default)]
    pub on_by_default: bool,
    /// Names this component was known by, still accepted in the config with a warning.
    #[serde(default)]
    pub former_names: Vec<FormerName>,
    /// How the component runs on a standalone node; absent means it cannot.
    #[serde(default)]
    pub standalone: Option<Standalone>,
    /// How the component is deployed into a cluster; absent means it is not.
    #[serde(default)]
    pub cluster: Option<ClusterBundle>,
}

/// The objects a component is in a cluster, applied by `kvol components apply` (see
/// [`crate::bundle`]).
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterBundle {
    /// Kubernetes objects, each with `apiVersion`, `kind` and `metadata.name`.
    pub objects: Vec<serde_json::Value>,
}

/// Whether a component is the node's CSI driver or an optional addition.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    Driver,
    Optional,
}

/// What a component brings to the node.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Provides {
    /// The CSI driver name it registers.
    #[serde(default)]
    pub csi_driver: Option<String>,
    /// VolumeSnapshot support.
    #[serde(default)]
    pub snapshots: bool,
}

/// Something about the node a component depends on, found out by the caller.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeFeature {
    /// At least one LVM volume group (and the lvm2 tools).
    LvmVolumeGroup,
}

impl NodeFeature {
    /// How a person would say the node lacks it.
    pub fn missing(self) -> &'static str {
        match self {
            NodeFeature::LvmVolumeGroup => "the node has no LVM volume group (or no lvm2 tools)",
        }
    }
}

/// A name a component used to have.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FormerName {
    pub name: String,
    /// `true`: the old name stands for nothing any more (it is accepted and ignored);
    /// `false`: it is another way of writing this component's name.
    #[serde(default)]
    pub retired: bool,
    /// Why, in words for the warning.
    #[serde(default)]
    pub note: String,
}

/// How a component runs standalone.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub enum Standalone {
    /// A child process the agent supervises.
    Process(ProcessSpec),
    /// A part of the agent itself, switched on by the selection.
    InAgent(AgentFeature),
}

/// The command line of a supervised component, with placeholders the agent fills in.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ProcessSpec {
    /// The program and its arguments; see [`PLACEHOLDERS`].
    pub command: Vec<String>,
    /// A registrar to run beside it (e.g. node-driver-registrar); absent: the process
    /// registers itself.
    #[serde(default)]
    pub registrar: Option<Vec<String>>,
    /// What a change to the component's config file does.
    #[serde(default)]
    pub reload: Reload,
    /// How kvol writes the component's config file (`{config}`) from the user's.
    #[serde(default)]
    pub config: ConfigFileSpec,
}

/// The component config file kvol writes for a process: `{config}` is kvol's runtime copy,
/// rendered from the user's `<config dir>/<component>.yaml` over `defaults`, checked by `check`,
/// and replaced whole; the process never reads a half-saved or refused edit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ConfigFileSpec {
    /// Settings (a mapping) the user's file is merged over, key by key; with no user file the
    /// component runs with these. Absent, and with no user file, the runtime copy is removed and
    /// the component makes its own default.
    #[serde(default)]
    pub defaults: Option<serde_json::Value>,
    /// A command that checks a candidate file (`{candidate}`) before it is put in place: a
    /// non-zero exit refuses it, and what it printed says why.
    #[serde(default)]
    pub check: Option<Vec<String>>,
}

/// How a running component learns its config changed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Reload {
    #[default]
    Restart,
    Sighup,
}

/// Agent features a component can stand for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AgentFeature {
    /// Acting on VolumeSnapshot manifests through the node's CSI driver.
    Snapshots,
}

/// Placeholders a command line may contain; the agent substitutes each.
pub const PLACEHOLDERS: &[&str] =
    &["{kvol}", "{node}", "{socket}", "{registration-dir}", "{state-dir}", "{config}"];

/// The placeholder of a config check command for the file it checks (besides [`PLACEHOLDERS`]).
pub const CANDIDATE: &str = "{candidate}";

/// One thing wrong with a definition, naming the field.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("component {component:?}: {field}: {message}")]
pub struct DefinitionError {
    pub component: String,
    pub field: String,
    pub message: String,
}

impl ComponentDefinition {
    /// Parses one definition document; `origin` names it in the error.
    pub fn parse(text: &str, origin: &str) -> Result<ComponentDefinition, String> {
        serde_saphyr::from_str(text).map_err(|e| format!("{origin}: {e}"))
    }

    /// Every problem with this definition on its own (the catalogue checks them together).
    pub fn check(&self) -> Vec<DefinitionError> {
        let mut problems = Vec::new();
        let mut fail = |field: &str, message: String| {
            problems.push(DefinitionError { component: self.name.clone(), field: field.to_string(), message })
        };
        if let Err(e) = dns1123_label(&self.name) {
            fail("name", format!("{:?} is not a DNS-1123 label: {e}", self.name));
        }
        if self.name == "none" {
            fail("name", "\"none\" is reserved: it turns components off".into());
        }
        match self.role {
            Role::Driver => {
                match &self.provides.csi_driver {
                    None => fail("provides.csiDriver", "a driver component must name its CSI driver".into()),
                    Some(name) => {
                        if let Err(e) = csi_driver_name(name) {
                            fail("provides.csiDriver", format!("{name:?} is not a CSI driver name: {e}"));
                        }
                    }
                }
                if self.on_by_default {
                    fail("onByDefault", "only optional components have it; drivers use defaultRank".into());
                }
            }
            Role::Optional => {
                if self.default_rank.is_some() {
                    fail("defaultRank", "only drivers have it; optional components use onByDefault".into());
                }
            }
        }
        for (i, former) in self.former_names.iter().enumerate() {
            if let Err(e) = dns1123_label(&former.name) {
                fail(
                    &format!("formerNames[{i}].name"),
                    format!("{:?} is not a DNS-1123 label: {e}", former.name),
                );
            }
            if former.name == self.name {
                fail(&format!("formerNames[{i}].name"), "is the component's own name".into());
            }
        }
        if let Some(Standalone::Process(spec)) = &self.standalone {
            check_command(&spec.command, "standalone.process.command", PLACEHOLDERS, &mut fail);
            if let Some(registrar) = &spec.registrar {
                check_command(registrar, "standalone.process.registrar", PLACEHOLDERS, &mut fail);
            }
            check_config_spec(spec, &mut fail);
        }
        problems
    }
}

fn check_config_spec(spec: &ProcessSpec, fail: &mut impl FnMut(&str, String)) {
    let ConfigFileSpec { defaults, check } = &spec.config;
    if (defaults.is_some() || check.is_some()) && !spec.command.iter().any(|a| a.contains("{config}")) {
        fail("standalone.process.config", "the command never names {config}, so no file is written".into());
    }
    if defaults.as_ref().is_some_and(|d| !d.is_object()) {
        fail("standalone.process.config.defaults", "must be a mapping of settings".into());
    }
    if let Some(check) = check {
        let known: Vec<&str> = PLACEHOLDERS.iter().copied().chain([CANDIDATE]).collect();
        check_command(check, "standalone.process.config.check", &known, fail);
        if !check.iter().any(|a| a.contains(CANDIDATE)) {
            fail("standalone.process.config.check", format!("must name the file it checks, {CANDIDATE}"));
        }
    }
}

fn check_command(command: &[String], field: &str, known: &[&str], fail: &mut impl FnMut(&str, String)) {
    if command.first().is_none_or(|program| program.trim().is_empty()) {
        fail(field, "must name a program".into());
    }
    for (i, arg) in command.iter().enumerate() {
        if let Err(e) = check_placeholders(arg, known) {
            fail(&format!("{field}[{i}]"), e);
        }
    }
}

/// Checks that every `{…}` in `arg` is one of the `known` placeholders and braces balance.
pub fn check_placeholders(arg: &str, known: &[&str]) -> Result<(), String> {
    let mut rest = arg;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err(format!("{arg:?} has a '}}' without its '{{'"));
        }
        let Some(len) = rest[open..].find('}') else {
            return Err(format!("{arg:?} has a '{{' without its '}}'"));
        };
        let token = &rest[open..open + len + 1];
        if !known.contains(&token) {
            return Err(format!("{token} is not a placeholder (known: {})", known.join(", ")));
        }
        rest = &rest[open + len + 1..];
    }
    Ok(())
}

/// Fills the placeholders of `command` from `values` (placeholder → value).
pub fn fill_command(command: &[String], values: &[(&str, &str)]) -> Vec<String> {
    command
        .iter()
        .map(|arg| values.iter().fold(arg.clone(), |arg, (key, value)| arg.replace(key, value)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn driver(extra: &str) -> String {
        format!(
            "name: fast\nrole: driver\nprovides: {{csiDriver: fast.csi.example.com}}\n\
             standalone:\n  process:\n    command: [\"{{kvol}}\", csi-driver, --csi-socket, \"{{socket}}\"]\n{extra}"
        )
    }

    #[test]
    fn a_good_definition_has_no_problems() {
        let def = ComponentDefinition::parse(&driver("defaultRank: 3\n"), "fast.yaml").unwrap();
        assert_eq!(def.check(), vec![]);
        assert_eq!(def.default_rank, Some(3));
        let Some(Standalone::Process(spec)) = &def.standalone else { panic!("{def:?}") };
        assert_eq!(spec.reload, Reload::Restart);
        assert_eq!(
            fill_command(&spec.command, &[("{kvol}", "/bin/kvol"), ("{socket}", "/run/x.sock")]),
            ["/bin/kvol", "csi-driver", "--csi-socket", "/run/x.sock"]
        );
    }

    #[test]
    fn each_rule_names_its_field() {
        // (document, field the problem names, words in the message)
        let rows: &[(&str, &str, &str)] = &[
            ("name: Fast\nrole: optional\n", "name", "DNS-1123 label"),
            ("name: none\nrole: optional\n", "name", "reserved"),
            ("name: fast\nrole: driver\n", "provides.csiDriver", "must name its CSI driver"),
            ("name: fast\nrole: driver\nprovides: {csiDriver: \"a b\"}\n", "provides.csiDriver", "a b"),
            (
                "name: fast\nrole: driver\nprovides: {csiDriver: f.io}\nonByDefault: true\n",
                "onByDefault",
                "only optional",
            ),
            ("name: snap\nrole: optional\ndefaultRank: 1\n", "defaultRank", "only drivers"),
            ("name: snap\nrole: optional\nformerNames: [{name: snap}]\n", "formerNames[0].name", "own name"),
            (
                "name: snap\nrole: optional\nformerNames: [{name: Old_Snap}]\n",
                "formerNames[0].name",
                "DNS-1123",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: []}}\n",
                "standalone.process.command",
                "must name a program",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: [x, \"{sockt}\"]}}\n",
                "standalone.process.command[1]",
                "{sockt} is not a placeholder",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: [x], registrar: [r, \"--a={socket\"]}}\n",
                "standalone.process.registrar[1]",
                "without its '}'",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: [x], config: {defaults: {a: 1}}}}\n",
                "standalone.process.config",
                "never names {config}",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: [x, \"{config}\"], config: {defaults: [a]}}}\n",
                "standalone.process.config.defaults",
                "a mapping",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: [x, \"{config}\"], config: {check: [x, --check]}}}\n",
                "standalone.process.config.check",
                "{candidate}",
            ),
            (
                "name: snap\nrole: optional\nstandalone: {process: {command: [x, \"{candidate}\"]}}\n",
                "standalone.process.command[1]",
                "{candidate} is not a placeholder",
            ),
        ];
        for (doc, field, words) in rows {
            let def = ComponentDefinition::parse(doc, "t.yaml").unwrap_or_else(|e| panic!("{doc}: {e}"));
            let problems = def.check();
            assert!(
                problems.iter().any(|p| p.field == *field && p.to_string().contains(words)),
                "{doc}: expected {field}: …{words}…, got {problems:?}"
            );
        }
    }

    #[test]
    fn unknown_fields_and_values_are_parse_errors() {
        for (doc, words) in [
            ("name: a\nrole: driver\ncommand: [x]\n", "command"),
            ("name: a\nrole: sidecar\n", "sidecar"),
            ("name: a\nrole: optional\nneeds: [gpu]\n", "gpu"),
            ("name: a\nrole: optional\nstandalone: {process: {command: [x], reload: sigusr1}}\n", "sigusr1"),
        ] {
            let err = ComponentDefinition::parse(doc, "bad.yaml").unwrap_err();
            assert!(err.starts_with("bad.yaml: ") && err.contains(words), "{doc}: {err}");
        }
    }

    #[test]
    fn placeholders_table() {
        for (arg, ok) in [
            ("plain", true),
            ("{kvol}", true),
            ("--endpoint=unix://{socket}", true),
            ("{node}-{state-dir}", true),
            ("{", false),
            ("}", false),
            ("{unknown}", false),
            ("{kvol", false),
        ] {
            assert_eq!(check_placeholders(arg, PLACEHOLDERS).is_ok(), ok, "{arg}");
        }
    }
}
