//! Feature gates for CSI migration and volume expansion: parsing, defaults, locks and consistency checks.
//!
//! Gate names and defaults follow upstream Kubernetes today: the cloud plugins' migration
//! gates and `CSIMigrationPortworx` are GA and locked on, `CSIMigrationRBD` and every
//! `InTreePlugin<X>Unregister` default off. `CSIMigrationInTreeOff` is the umbrella switch of
//! the original design: it turns in-tree code off for every plugin whose migration is on.

use std::collections::BTreeMap;
use std::fmt;

use crate::plugin::MigratablePlugin;

/// A feature gate kvol knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Gate {
    /// `CSIMigration`: the umbrella migration gate.
    CsiMigration,
    /// `CSIMigrationInTreeOff`: in-tree code off for every migrated plugin.
    CsiMigrationInTreeOff,
    /// `CSIMigration<X>`: migration of one plugin.
    Migration(MigratablePlugin),
    /// `InTreePlugin<X>Unregister`: in-tree code of one plugin off.
    Unregister(MigratablePlugin),
    /// `RecoverVolumeExpansionFailure`: claims carry the resize status and allocated size
    /// (kubelet v1.26: alpha, off).
    RecoverVolumeExpansionFailure,
}

/// Maturity of a gate, as upstream reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Alpha,
    Beta,
    /// GA and locked to its default.
    Ga,
    /// Still accepted, slated for removal.
    Deprecated,
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Stage::Alpha => "alpha",
            Stage::Beta => "beta",
            Stage::Ga => "GA",
            Stage::Deprecated => "deprecated",
        })
    }
}

/// What kvol knows about one gate: its default, whether it is locked, its maturity.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GateSpec {
    pub default: bool,
    pub locked: bool,
    pub stage: Stage,
}

impl Gate {
    /// Every gate, in a stable order (the order of `kvol gates` listings).
    pub fn all() -> impl Iterator<Item = Gate> {
        [Gate::CsiMigration, Gate::CsiMigrationInTreeOff]
            .into_iter()
            .chain(MigratablePlugin::ALL.into_iter().map(Gate::Migration))
            .chain(MigratablePlugin::ALL.into_iter().map(Gate::Unregister))
            .chain([Gate::RecoverVolumeExpansionFailure])
    }

    /// The gate's name as written on a command line.
    pub fn name(self) -> String {
        match self {
            Gate::CsiMigration => "CSIMigration".to_string(),
            Gate::CsiMigrationInTreeOff => "CSIMigrationInTreeOff".to_string(),
            Gate::Migration(p) => format!("CSIMigration{}", p.gate_suffix()),
            Gate::Unregister(p) => format!("InTreePlugin{}Unregister", p.gate_suffix()),
            Gate::RecoverVolumeExpansionFailure => "RecoverVolumeExpansionFailure".to_string(),
        }
    }

    /// Parses a gate name; exact and case-sensitive, as upstream.
    pub fn from_name(name: &str) -> Option<Gate> {
        Gate::all().find(|g| g.name() == name)
    }

    /// Default, lock and maturity of the gate.
    pub fn spec(self) -> GateSpec {
        use MigratablePlugin::*;
        let ga_on = GateSpec { default: true, locked: true, stage: Stage::Ga };
        let alpha_off = GateSpec { default: false, locked: false, stage: Stage::Alpha };
        match self {
            Gate::CsiMigration => ga_on,
            Gate::CsiMigrationInTreeOff => alpha_off,
            Gate::Migration(AwsEbs | GcePd | AzureDisk | AzureFile | Cinder | Vsphere | Portworx) => ga_on,
            Gate::Migration(Rbd) | Gate::Unregister(Rbd) => {
                GateSpec { default: false, locked: false, stage: Stage::Deprecated }
            }
            Gate::Unregister(_) | Gate::RecoverVolumeExpansionFailure => alpha_off,
        }
    }
}

impl fmt::Display for Gate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// One thing wrong with a set of gates.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateProblem {
    #[error("unknown feature gate {name:?}{}", suggestion.as_ref().map(|s| format!(" (did you mean {s}?)")).unwrap_or_default())]
    Unknown { name: String, suggestion: Option<String> },
    #[error("feature gate {gate} is {stage} and locked to {locked_to}; remove \"{gate}={}\"", !locked_to)]
    Locked { gate: Gate, stage: Stage, locked_to: bool },
    #[error(
        "{gate}=true turns off the in-tree code of {plugin} but its migration is off, so its volumes would have no plugin; set {needs}=true or {gate}=false"
    )]
    InTreeOffWithoutMigration { gate: Gate, plugin: MigratablePlugin, needs: Gate },
    #[error(
        "CSIMigrationInTreeOff=true needs CSIMigration=true; set CSIMigration=true or CSIMigrationInTreeOff=false"
    )]
    UmbrellaOffWithoutMigration,
}

/// Errors from parsing or validating feature gates.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum GateError {
    #[error("invalid --feature-gates entry {entry:?}: {reason}")]
    Syntax { entry: String, reason: &'static str },
    #[error("invalid value {value:?} for feature gate {name}: want true or false")]
    Value { name: String, value: String },
    #[error("invalid feature gates: {}", .0.iter().map(|p| p.to_string()).collect::<Vec<_>>().join("; "))]
    Invalid(Vec<GateProblem>),
}

/// A validated set of feature gates. Build with [`FeatureGates::builder`] or parse with
/// [`FeatureGates::parse`]; a value of this type has passed every check.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct FeatureGates {
    /// Only the gates explicitly set; everything else is at its default.
    set: BTreeMap<Gate, bool>,
}

/// Collects gate settings from several sources (config file, then command line), then validates.
#[derive(Clone, Debug, Default)]
pub struct FeatureGatesBuilder {
    set: BTreeMap<Gate, bool>,
    problems: Vec<GateProblem>,
}

impl FeatureGatesBuilder {
    /// Sets one gate by name. Later settings override earlier ones; unknown names are
    /// collected and reported by [`FeatureGatesBuilder::build`].
    pub fn set(&mut self, name: &str, enabled: bool) -> &mut Self {
        match Gate::from_name(name) {
            Some(gate) => {
                self.set.insert(gate, enabled);
            }
            None => {
                self.problems.push(GateProblem::Unknown { name: name.to_string(), suggestion: suggest(name) })
            }
        }
        self
    }

    /// Applies a `A=true,B=false` string, the `--feature-gates` form.
    pub fn parse_flag(&mut self, flag: &str) -> Result<&mut Self, GateError> {
        for entry in flag.split(',') {
            let entry = entry.trim();
            if entry.is_empty() {
                continue;
            }
            let Some((name, value)) = entry.split_once('=') else {
                return Err(GateError::Syntax {
                    entry: entry.to_string(),
                    reason: "want Name=true or Name=false",
                });
            };
            let name = name.trim();
            if name.is_empty() {
                return Err(GateError::Syntax { entry: entry.to_string(), reason: "missing gate name" });
            }
            let enabled = parse_bool(value.trim()).ok_or_else(|| GateError::Value {
                name: name.to_string(),
                value: value.trim().to_string(),
            })?;
            self.set(name, enabled);
        }
        Ok(self)
    }

    /// Validates everything set so far: unknown names, locks, and consistency.
    pub fn build(&self) -> Result<FeatureGates, GateError> {
        let mut problems = self.problems.clone();
        for (&gate, &value) in &self.set {
            let spec = gate.spec();
            if spec.locked && value != spec.default {
                problems.push(GateProblem::Locked { gate, stage: spec.stage, locked_to: spec.default });
            }
        }
        let gates = FeatureGates { set: self.set.clone() };
        if gates.enabled(Gate::CsiMigrationInTreeOff) && !gates.enabled(Gate::CsiMigration) {
            problems.push(GateProblem::UmbrellaOffWithoutMigration);
        }
        for plugin in MigratablePlugin::ALL {
            let unregister = Gate::Unregister(plugin);
            if gates.enabled(unregister) && !gates.is_migrated(plugin) {
                let needs = if gates.enabled(Gate::CsiMigration) {
                    Gate::Migration(plugin)
                } else {
                    Gate::CsiMigration
                };
                problems.push(GateProblem::InTreeOffWithoutMigration { gate: unregister, plugin, needs });
            }
        }
        if problems.is_empty() { Ok(gates) } else { Err(GateError::Invalid(problems)) }
    }
}

impl FeatureGates {
    /// A builder to which config-file and command-line settings are applied in order.
    pub fn builder() -> FeatureGatesBuilder {
        FeatureGatesBuilder::default()
    }

    /// Parses and validates a `--feature-gates` value.
    pub fn parse(flag: &str) -> Result<FeatureGates, GateError> {
        FeatureGates::builder().parse_flag(flag)?.build()
    }

    /// Whether a gate is on: its explicit setting, else its default.
    pub fn enabled(&self, gate: Gate) -> bool {
        self.set.get(&gate).copied().unwrap_or(gate.spec().default)
    }

    /// The gates explicitly set, in name order.
    pub fn explicit(&self) -> impl Iterator<Item = (Gate, bool)> + '_ {
        self.set.iter().map(|(g, v)| (*g, *v))
    }

    /// Whether specs of `plugin` are served through its CSI driver: `CSIMigration` and
    /// `CSIMigration<X>` both on.
    pub fn is_migrated(&self, plugin: MigratablePlugin) -> bool {
        self.enabled(Gate::CsiMigration) && self.enabled(Gate::Migration(plugin))
    }

    /// Whether the in-tree code of `plugin` is off (not registered): its
    /// `InTreePlugin<X>Unregister` gate, or the `CSIMigrationInTreeOff` umbrella for a migrated plugin.
    pub fn is_in_tree_off(&self, plugin: MigratablePlugin) -> bool {
        self.enabled(Gate::Unregister(plugin))
            || (self.enabled(Gate::CsiMigrationInTreeOff) && self.is_migrated(plugin))
    }

    /// Whether migration of `plugin` is complete: migrated and its in-tree code off, so that
    /// no node needs to be asked (upstream's `IsMigrationCompleteForPlugin`).
    pub fn is_migration_complete(&self, plugin: MigratablePlugin) -> bool {
        self.is_migrated(plugin) && self.is_in_tree_off(plugin)
    }

    /// In-tree names of the migrated plugins, sorted: the CSINode `migrated-plugins` set.
    pub fn migrated_plugin_names(&self) -> Vec<&'static str> {
        let mut names: Vec<_> = MigratablePlugin::ALL
            .into_iter()
            .filter(|p| self.is_migrated(*p))
            .map(|p| p.in_tree_name())
            .collect();
        names.sort_unstable();
        names
    }
}

/// Go's `strconv.ParseBool`, which upstream's gate parser uses.
fn parse_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Some(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Some(false),
        _ => None,
    }
}

/// The known gate whose name matches `name` ignoring case, for "did you mean".
fn suggest(name: &str) -> Option<String> {
    Gate::all().map(Gate::name).find(|known| known.eq_ignore_ascii_case(name))
}

/// The provisioner that should act for a StorageClass: the CSI driver when the class's in-tree
/// provisioner is migrated, else the class's own (upstream's PV controller).
pub fn provisioner_for<'p>(gates: &FeatureGates, provisioner: &'p str) -> &'p str {
    match crate::MigratablePlugin::from_in_tree_name(provisioner) {
        Some(plugin) if gates.is_migrated(plugin) => plugin.csi_driver(),
        _ => provisioner,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MigratablePlugin::*;

    #[test]
    fn defaults_follow_upstream_today() {
        let g = FeatureGates::default();
        for p in [AwsEbs, GcePd, AzureDisk, AzureFile, Cinder, Vsphere, Portworx] {
            assert!(g.is_migrated(p), "{p} should be migrated by default");
            assert!(!g.is_in_tree_off(p), "{p} in-tree code should be on by default");
        }
        assert!(!g.is_migrated(Rbd));
        assert!(!g.is_in_tree_off(Rbd));
        assert_eq!(
            g.migrated_plugin_names(),
            vec![
                "kubernetes.io/aws-ebs",
                "kubernetes.io/azure-disk",
                "kubernetes.io/azure-file",
                "kubernetes.io/cinder",
                "kubernetes.io/gce-pd",
                "kubernetes.io/portworx-volume",
                "kubernetes.io/vsphere-volume",
            ]
        );
    }

    #[test]
    fn names_round_trip_and_are_unique() {
        let names: Vec<String> = Gate::all().map(Gate::name).collect();
        let unique: std::collections::BTreeSet<_> = names.iter().collect();
        assert_eq!(names.len(), unique.len());
        assert_eq!(names.len(), 19);
        for g in Gate::all() {
            assert_eq!(Gate::from_name(&g.name()), Some(g));
        }
        assert_eq!(Gate::Migration(Cinder).name(), "CSIMigrationOpenStack");
        assert_eq!(Gate::Unregister(Vsphere).name(), "InTreePluginvSphereUnregister");
    }

    /// (flag, plugin, migrated, in-tree off, complete)
    const DECISIONS: &[(&str, MigratablePlugin, bool, bool, bool)] = &[
        ("", Portworx, true, false, false),
        ("InTreePluginPortworxUnregister=true", Portworx, true, true, true),
        ("CSIMigrationInTreeOff=true", Portworx, true, true, true),
        ("CSIMigrationInTreeOff=true", AwsEbs, true, true, true),
        ("CSIMigrationInTreeOff=true", Rbd, false, false, false),
        ("CSIMigrationRBD=true", Rbd, true, false, false),
        ("CSIMigrationRBD=true,InTreePluginRBDUnregister=true", Rbd, true, true, true),
        ("CSIMigrationRBD=true,CSIMigrationInTreeOff=true", Rbd, true, true, true),
        ("InTreePluginAWSUnregister=true", AwsEbs, true, true, true),
        ("InTreePluginAWSUnregister=true", GcePd, true, false, false),
        (" CSIMigrationRBD = 1 , ,InTreePluginRBDUnregister=T", Rbd, true, true, true),
        ("CSIMigrationRBD=true,CSIMigrationRBD=false", Rbd, false, false, false),
    ];

    #[test]
    fn migration_decisions() {
        for &(flag, plugin, migrated, off, complete) in DECISIONS {
            let g = FeatureGates::parse(flag).unwrap_or_else(|e| panic!("{flag:?}: {e}"));
            assert_eq!(g.is_migrated(plugin), migrated, "{flag:?} migrated({plugin})");
            assert_eq!(g.is_in_tree_off(plugin), off, "{flag:?} in_tree_off({plugin})");
            assert_eq!(g.is_migration_complete(plugin), complete, "{flag:?} complete({plugin})");
        }
    }

    /// (flag, the complete error message)
    const ERRORS: &[(&str, &str)] = &[
        ("Foo=true", "invalid feature gates: unknown feature gate \"Foo\""),
        (
            "csimigrationaws=true",
            "invalid feature gates: unknown feature gate \"csimigrationaws\" (did you mean CSIMigrationAWS?)",
        ),
        (
            "CSIMigrationAWS=false",
            "invalid feature gates: feature gate CSIMigrationAWS is GA and locked to true; remove \"CSIMigrationAWS=false\"",
        ),
        (
            "CSIMigration=false",
            "invalid feature gates: feature gate CSIMigration is GA and locked to true; remove \"CSIMigration=false\"",
        ),
        (
            "CSIMigrationPortworx=false,InTreePluginPortworxUnregister=true",
            "invalid feature gates: feature gate CSIMigrationPortworx is GA and locked to true; remove \"CSIMigrationPortworx=false\"; InTreePluginPortworxUnregister=true turns off the in-tree code of kubernetes.io/portworx-volume but its migration is off, so its volumes would have no plugin; set CSIMigrationPortworx=true or InTreePluginPortworxUnregister=false",
        ),
        (
            "InTreePluginRBDUnregister=true",
            "invalid feature gates: InTreePluginRBDUnregister=true turns off the in-tree code of kubernetes.io/rbd but its migration is off, so its volumes would have no plugin; set CSIMigrationRBD=true or InTreePluginRBDUnregister=false",
        ),
        (
            "CSIMigration=false,CSIMigrationInTreeOff=true",
            "invalid feature gates: feature gate CSIMigration is GA and locked to true; remove \"CSIMigration=false\"; CSIMigrationInTreeOff=true needs CSIMigration=true; set CSIMigration=true or CSIMigrationInTreeOff=false",
        ),
        (
            "CSIMigrationRBD",
            "invalid --feature-gates entry \"CSIMigrationRBD\": want Name=true or Name=false",
        ),
        ("=true", "invalid --feature-gates entry \"=true\": missing gate name"),
        ("CSIMigrationRBD=yes", "invalid value \"yes\" for feature gate CSIMigrationRBD: want true or false"),
    ];

    #[test]
    fn invalid_sets_are_rejected_with_the_gate_to_change() {
        for &(flag, want) in ERRORS {
            let err = FeatureGates::parse(flag).expect_err(flag);
            assert_eq!(err.to_string(), want, "flag {flag:?}");
        }
    }

    #[test]
    fn later_sources_override_earlier_ones() {
        let mut b = FeatureGates::builder();
        b.set("CSIMigrationRBD", true); // from a config file
        b.parse_flag("CSIMigrationRBD=false").unwrap(); // from the command line
        assert!(!b.build().unwrap().is_migrated(Rbd));
    }
}
