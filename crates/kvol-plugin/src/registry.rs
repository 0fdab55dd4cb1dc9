//! The plugin registry: compiled-in plugins plus dynamic ones, looked up through an immutable snapshot.
//!
//! Discovery (the Flexvolume prober, CSI registration) sends [`ProbeEvent`]s to
//! [`PluginRegistry::apply`], which builds a new [`Snapshot`] and swaps it in. Lookups load the
//! current snapshot without a lock and never touch the disk, so they neither wait on discovery
//! nor slow down as drivers come and go.

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex};

use arc_swap::ArcSwap;
use serde::Serialize;

use crate::error::{PluginError, Result};
use crate::plugin::{PluginKind, PluginRef, VolumePlugin};
use crate::spec::{SourceKey, VolumeSpec};

/// A source of dynamic plugins. Each owns its plugins: an event from one source never
/// replaces or removes a plugin of another.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DynamicSource {
    Flexvolume,
    Csi,
}

impl fmt::Display for DynamicSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DynamicSource::Flexvolume => "the flexvolume prober",
            DynamicSource::Csi => "csi registration",
        })
    }
}

/// A change reported by a dynamic source.
#[derive(Clone, Debug)]
pub enum ProbeEvent {
    /// A plugin appeared or changed (a new driver, a driver whose executable was replaced).
    AddOrUpdate(PluginRef),
    /// The plugin of this name is gone.
    Remove(String),
}

/// The registry: writes are serialised and rare, reads are lock-free.
#[derive(Debug)]
pub struct PluginRegistry {
    current: ArcSwap<Snapshot>,
    sources: Mutex<Sources>,
}

#[derive(Debug, Default)]
struct Sources {
    compiled_in: Vec<PluginRef>,
    dynamic: BTreeMap<DynamicSource, BTreeMap<String, PluginRef>>,
    generation: u64,
}

impl PluginRegistry {
    /// A registry of the compiled-in plugins, each registered once; two with one name is an error.
    pub fn new(compiled_in: Vec<PluginRef>) -> Result<PluginRegistry> {
        let mut seen = BTreeMap::new();
        for p in &compiled_in {
            if seen.insert(p.name().to_string(), ()).is_some() {
                return Err(PluginError::DuplicateName { name: p.name().to_string(), by: None });
            }
        }
        let sources = Sources { compiled_in, ..Sources::default() };
        let snapshot = Snapshot::build(&sources);
        Ok(PluginRegistry { current: ArcSwap::from_pointee(snapshot), sources: Mutex::new(sources) })
    }

    /// The current snapshot; hold it for a consistent view across several lookups.
    pub fn snapshot(&self) -> Arc<Snapshot> {
        self.current.load_full()
    }

    /// Applies a batch of events from one source and publishes one new snapshot. Events that
    /// would take a name another source owns are refused; the refusals are returned (and the
    /// rest of the batch still applies).
    pub fn apply(
        &self,
        source: DynamicSource,
        events: impl IntoIterator<Item = ProbeEvent>,
    ) -> Vec<PluginError> {
        let mut sources = self.lock();
        let refused = sources.apply(source, events);
        self.publish(&mut sources);
        refused
    }

    /// Replaces every plugin of `source` at once (a full rescan); returns the refusals.
    pub fn replace(&self, source: DynamicSource, plugins: Vec<PluginRef>) -> Vec<PluginError> {
        // One lock for the removal and the re-adding: a snapshot published in between (by
        // another source's apply) would lack every plugin of this source.
        let mut sources = self.lock();
        sources.dynamic.remove(&source);
        let refused = sources.apply(source, plugins.into_iter().map(ProbeEvent::AddOrUpdate));
        self.publish(&mut sources);
        refused
    }

    fn publish(&self, sources: &mut Sources) {
        sources.generation += 1;
        self.current.store(Arc::new(Snapshot::build(sources)));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Sources> {
        self.sources.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Sources {
    /// Applies `events` of `source` in order; returns the refusals.
    fn apply(
        &mut self,
        source: DynamicSource,
        events: impl IntoIterator<Item = ProbeEvent>,
    ) -> Vec<PluginError> {
        let mut refused = Vec::new();
        for event in events {
            match event {
                ProbeEvent::AddOrUpdate(plugin) => {
                    let name = plugin.name().to_string();
                    if let Some(owner) = self.owner_of(&name).filter(|o| *o != Some(source)) {
                        let by = owner.map_or_else(|| "compiled-in".to_string(), |s| s.to_string());
                        tracing::warn!(plugin = %name, %source, owner = %by, "refused dynamic plugin: name taken");
                        refused.push(PluginError::DuplicateName { name, by: Some(by) });
                        continue;
                    }
                    tracing::info!(plugin = %name, %source, "volume plugin added or updated");
                    self.dynamic.entry(source).or_default().insert(name, plugin);
                }
                ProbeEvent::Remove(name) => {
                    if self.dynamic.get_mut(&source).and_then(|m| m.remove(&name)).is_some() {
                        tracing::info!(plugin = %name, %source, "volume plugin removed");
                    }
                }
            }
        }
        refused
    }

    /// Who holds `name`: `Some(None)` compiled-in, `Some(Some(s))` a dynamic source, `None` nobody.
    fn owner_of(&self, name: &str) -> Option<Option<DynamicSource>> {
        if self.compiled_in.iter().any(|p| p.name() == name) {
            return Some(None);
        }
        self.dynamic.iter().find(|(_, plugins)| plugins.contains_key(name)).map(|(s, _)| Some(*s))
    }
}

/// One registered plugin and where it came from.
#[derive(Clone, Debug)]
pub struct Registered {
    pub plugin: PluginRef,
    /// `None` for compiled-in plugins.
    pub source: Option<DynamicSource>,
}

/// An immutable view of every registered plugin, indexed for lookups.
#[derive(Debug, Default)]
pub struct Snapshot {
    generation: u64,
    plugins: Vec<Registered>,
    by_name: HashMap<Box<str>, usize>,
    by_field: HashMap<&'static str, Vec<usize>>,
    by_csi: HashMap<Box<str>, Vec<usize>>,
    by_flex: HashMap<Box<str>, Vec<usize>>,
}

impl Snapshot {
    fn build(sources: &Sources) -> Snapshot {
        let mut snap = Snapshot { generation: sources.generation, ..Snapshot::default() };
        let compiled = sources.compiled_in.iter().map(|p| (p, None));
        let dynamic = sources.dynamic.iter().flat_map(|(s, ps)| ps.values().map(move |p| (p, Some(*s))));
        for (plugin, source) in compiled.chain(dynamic) {
            let i = snap.plugins.len();
            snap.by_name.insert(plugin.name().into(), i);
            for key in plugin.serves() {
                match key {
                    SourceKey::Field(f) => snap.by_field.entry(f).or_default().push(i),
                    SourceKey::Csi(d) => snap.by_csi.entry(d.into()).or_default().push(i),
                    SourceKey::Flex(d) => snap.by_flex.entry(d.into()).or_default().push(i),
                }
            }
            snap.plugins.push(Registered { plugin: Arc::clone(plugin), source });
        }
        snap
    }

    /// Increases with every change published.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// Every registered plugin: compiled-in first, then each dynamic source by name.
    pub fn plugins(&self) -> &[Registered] {
        &self.plugins
    }

    /// The one plugin that supports `spec`.
    pub fn find_by_spec(&self, spec: &VolumeSpec) -> Result<&PluginRef> {
        let key = spec.source_key()?;
        let candidates: &[usize] = match key {
            SourceKey::Field(f) => self.by_field.get(f),
            SourceKey::Csi(d) => self.by_csi.get(d),
            SourceKey::Flex(d) => self.by_flex.get(d),
        }
        .map_or(&[], Vec::as_slice);
        let mut matched = candidates.iter().map(|i| &self.plugins[*i].plugin).filter(|p| p.can_support(spec));
        match (matched.next(), matched.next()) {
            (Some(one), None) => Ok(one),
            (None, _) => {
                Err(PluginError::NoPluginMatched { spec: spec.to_string(), source_key: key.to_string() })
            }
            (Some(_), Some(_)) => {
                let mut names: Vec<String> = candidates
                    .iter()
                    .map(|i| &self.plugins[*i].plugin)
                    .filter(|p| p.can_support(spec))
                    .map(|p| p.name().to_string())
                    .collect();
                names.sort();
                Err(PluginError::MultiplePluginsMatched { spec: spec.to_string(), names })
            }
        }
    }

    /// The plugin called `name`.
    pub fn find_by_name(&self, name: &str) -> Result<&PluginRef> {
        self.by_name
            .get(name)
            .map(|i| &self.plugins[*i].plugin)
            .ok_or_else(|| PluginError::NoPluginNamed { name: name.to_string() })
    }

    /// The plugin for `spec` if it serves persistent volumes.
    pub fn find_persistent_by_spec(&self, spec: &VolumeSpec) -> Result<&PluginRef> {
        require(self.find_by_spec(spec)?, |p| p.is_persistent(), "serve persistent volumes")
    }

    /// The plugin called `name` if it serves persistent volumes.
    pub fn find_persistent_by_name(&self, name: &str) -> Result<&PluginRef> {
        require(self.find_by_name(name)?, |p| p.is_persistent(), "serve persistent volumes")
    }

    /// The plugin for `spec` if this spec needs attaching; `Ok(None)` if it does not.
    pub fn find_attachable_by_spec(&self, spec: &VolumeSpec) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_spec(spec)?)?;
        Ok(p.can_attach(spec).then_some(p))
    }

    /// The plugin called `name` if it can attach; `Ok(None)` if it cannot.
    pub fn find_attachable_by_name(&self, name: &str) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_name(name)?)?;
        Ok(p.attacher().is_some().then_some(p))
    }

    /// The plugin for `spec` if this spec needs staging; `Ok(None)` if it does not.
    pub fn find_device_mountable_by_spec(&self, spec: &VolumeSpec) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_spec(spec)?)?;
        Ok(p.can_device_mount(spec).then_some(p))
    }

    /// The plugin called `name` if it can stage; `Ok(None)` if it cannot.
    pub fn find_device_mountable_by_name(&self, name: &str) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_name(name)?)?;
        Ok(p.device_mounter().is_some().then_some(p))
    }

    /// The plugin for `spec` if it can grow volumes on the storage side; `Ok(None)` if not.
    pub fn find_expandable_by_spec(&self, spec: &VolumeSpec) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_spec(spec)?)?;
        Ok(p.controller_expander().is_some().then_some(p))
    }

    /// The plugin called `name` if it can grow volumes on the storage side; `Ok(None)` if not.
    pub fn find_expandable_by_name(&self, name: &str) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_name(name)?)?;
        Ok(p.controller_expander().is_some().then_some(p))
    }

    /// The plugin for `spec` if it can grow filesystems on the node; `Ok(None)` if not.
    pub fn find_node_expandable_by_spec(&self, spec: &VolumeSpec) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_spec(spec)?)?;
        Ok(p.node_expander().is_some().then_some(p))
    }

    /// The plugin called `name` if it can grow filesystems on the node; `Ok(None)` if not.
    pub fn find_node_expandable_by_name(&self, name: &str) -> Result<Option<&PluginRef>> {
        let p = with_code(self.find_by_name(name)?)?;
        Ok(p.node_expander().is_some().then_some(p))
    }

    /// The plugin called `name` (a StorageClass provisioner) if it can provision.
    pub fn find_provisionable_by_name(&self, name: &str) -> Result<&PluginRef> {
        require(with_code(self.find_by_name(name)?)?, |p| p.provisioner().is_some(), "provision volumes")
    }

    /// The plugin for `spec` if it can delete the volume's storage.
    pub fn find_deletable_by_spec(&self, spec: &VolumeSpec) -> Result<&PluginRef> {
        require(with_code(self.find_by_spec(spec)?)?, |p| p.deleter().is_some(), "delete volumes")
    }

    /// The plugin called `name` if it can delete volumes.
    pub fn find_deletable_by_name(&self, name: &str) -> Result<&PluginRef> {
        require(with_code(self.find_by_name(name)?)?, |p| p.deleter().is_some(), "delete volumes")
    }
}

fn require<'a>(
    p: &'a PluginRef,
    ok: impl Fn(&dyn VolumePlugin) -> bool,
    what: &'static str,
) -> Result<&'a PluginRef> {
    if ok(p.as_ref()) { Ok(p) } else { Err(PluginError::Unsupported { plugin: p.name().to_string(), what }) }
}

/// Refuses in-tree descriptors for operations: kvol has no in-tree code, only their CSI drivers.
fn with_code(p: &PluginRef) -> Result<&PluginRef> {
    match (p.kind(), p.migrates()) {
        (PluginKind::InTree, Some(plugin)) => Err(PluginError::NoInTreeCode { plugin }),
        _ => Ok(p),
    }
}

#[cfg(test)]
#[path = "registry_tests.rs"]
mod tests;
