//! The components kvol knows: its built-in definitions, then those a user drops in a directory.

use std::fmt;
use std::path::{Path, PathBuf};

use crate::definition::{ComponentDefinition, FormerName};

/// The definitions kvol ships, as the files a user would write.
const BUILT_IN: &[(&str, &str)] = &[
    ("hostpath.yaml", include_str!("../definitions/hostpath.yaml")),
    ("lvm.yaml", include_str!("../definitions/lvm.yaml")),
    ("snapshot-controller.yaml", include_str!("../definitions/snapshot-controller.yaml")),
];

/// Where a definition came from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    BuiltIn(&'static str),
    File(PathBuf),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::BuiltIn(name) => write!(f, "built-in {name}"),
            Origin::File(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A usable definition and its origin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    pub definition: ComponentDefinition,
    pub origin: Origin,
}

/// A definition left out of the catalogue, and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{origin}: {message}")]
pub struct CatalogueProblem {
    pub origin: String,
    pub message: String,
}

/// Every usable component definition, sorted by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Catalogue {
    entries: Vec<Entry>,
}

impl Catalogue {
    /// Only the definitions kvol ships.
    pub fn built_in() -> Catalogue {
        let (catalogue, problems) = Catalogue::with_documents(Vec::new());
        debug_assert!(problems.is_empty(), "built-in definitions: {problems:?}");
        catalogue
    }

    /// The built-ins plus `documents` (origin, text). A user definition with a built-in's name
    /// replaces it; a document that does not parse or check is left out with its problems, and
    /// the rest stay usable.
    pub fn with_documents(documents: Vec<(Origin, String)>) -> (Catalogue, Vec<CatalogueProblem>) {
        let built_in = BUILT_IN.iter().map(|(name, text)| (Origin::BuiltIn(name), text.to_string()));
        let mut catalogue = Catalogue::default();
        let mut problems = Vec::new();
        for (origin, text) in built_in.chain(documents) {
            match parse_checked(&origin, &text) {
                Ok(definition) => catalogue.admit(Entry { definition, origin }, &mut problems),
                Err(mut found) => problems.append(&mut found),
            }
        }
        catalogue.entries.sort_by(|a, b| a.definition.name.cmp(&b.definition.name));
        (catalogue, problems)
    }

    /// The built-ins plus every `*.yaml` / `*.yml` file in `dir` (in name order; dot files,
    /// which editors write while saving, are skipped). A missing directory holds nothing.
    pub fn load(dir: &Path) -> (Catalogue, Vec<CatalogueProblem>) {
        let (documents, mut problems) = read_documents(dir);
        let (catalogue, mut more) = Catalogue::with_documents(documents);
        problems.append(&mut more);
        (catalogue, problems)
    }

    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The entry named `name`, by its current name only.
    pub fn get(&self, name: &str) -> Option<&Entry> {
        self.entries.iter().find(|e| e.definition.name == name)
    }

    /// What a name written in the config refers to: the entry, and the former name used, if any.
    pub fn resolve(&self, written: &str) -> Option<(&Entry, Option<&FormerName>)> {
        if let Some(entry) = self.get(written) {
            return Some((entry, None));
        }
        self.entries.iter().find_map(|entry| {
            let former = entry.definition.former_names.iter().find(|f| f.name == written)?;
            Some((entry, Some(former)))
        })
    }

    /// Every name the config may use, current ones first.
    pub fn known_names(&self) -> Vec<&str> {
        let current = self.entries.iter().map(|e| e.definition.name.as_str());
        let former =
            self.entries.iter().flat_map(|e| e.definition.former_names.iter().map(|f| f.name.as_str()));
        current.chain(former).collect()
    }

    fn admit(&mut self, entry: Entry, problems: &mut Vec<CatalogueProblem>) {
        let name = entry.definition.name.clone();
        if let Some(existing) = self.entries.iter().position(|e| e.definition.name == name) {
            if matches!(self.entries[existing].origin, Origin::BuiltIn(_)) {
                self.entries.remove(existing);
            } else {
                let first = self.entries[existing].origin.to_string();
                return problems.push(problem(
                    &entry.origin,
                    format!("component {name:?} is already defined by {first}"),
                ));
            }
        }
        if let Some(clash) = self.clash(&entry.definition) {
            return problems.push(problem(&entry.origin, clash));
        }
        self.entries.push(entry);
    }

    /// Why `definition` cannot sit beside the admitted ones: a shared CSI driver or name.
    fn clash(&self, definition: &ComponentDefinition) -> Option<String> {
        let names = std::iter::once(definition.name.as_str())
            .chain(definition.former_names.iter().map(|f| f.name.as_str()));
        for name in names {
            if let Some((other, _)) = self.resolve(name) {
                return Some(format!(
                    "name {name:?} is already used by component {:?}",
                    other.definition.name
                ));
            }
        }
        let driver = definition.provides.csi_driver.as_deref()?;
        let other =
            self.entries.iter().find(|e| e.definition.provides.csi_driver.as_deref() == Some(driver))?;
        Some(format!("CSI driver {driver:?} is already provided by component {:?}", other.definition.name))
    }
}

fn problem(origin: &Origin, message: String) -> CatalogueProblem {
    CatalogueProblem { origin: origin.to_string(), message }
}

fn parse_checked(origin: &Origin, text: &str) -> Result<ComponentDefinition, Vec<CatalogueProblem>> {
    let definition = ComponentDefinition::parse(text, &origin.to_string()).map_err(|message| {
        vec![CatalogueProblem { origin: origin.to_string(), message: strip(&message, origin) }]
    })?;
    let problems = definition.check();
    if problems.is_empty() {
        return Ok(definition);
    }
    Err(problems.into_iter().map(|p| problem(origin, p.to_string())).collect())
}

/// `parse` prefixes its error with the origin; the problem carries the origin separately.
fn strip(message: &str, origin: &Origin) -> String {
    let prefix = format!("{origin}: ");
    message.strip_prefix(&prefix).unwrap_or(message).to_string()
}

fn read_documents(dir: &Path) -> (Vec<(Origin, String)>, Vec<CatalogueProblem>) {
    let mut problems = Vec::new();
    let listing = match std::fs::read_dir(dir) {
        Ok(listing) => listing,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (Vec::new(), problems),
        Err(e) => {
            let message = format!("cannot read the definitions directory: {e}");
            return (Vec::new(), vec![problem(&Origin::File(dir.to_path_buf()), message)]);
        }
    };
    let mut paths: Vec<PathBuf> =
        listing.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| is_definition_file(p)).collect();
    paths.sort();
    let mut documents = Vec::new();
    for path in paths {
        match std::fs::read_to_string(&path) {
            Ok(text) => documents.push((Origin::File(path), text)),
            Err(e) => problems.push(problem(&Origin::File(path), format!("cannot read: {e}"))),
        }
    }
    (documents, problems)
}

fn is_definition_file(path: &Path) -> bool {
    let Some(name) = path.file_name().and_then(|n| n.to_str()) else { return false };
    !name.starts_with('.') && (name.ends_with(".yaml") || name.ends_with(".yml"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(name: &str, text: &str) -> (Origin, String) {
        (Origin::File(PathBuf::from(format!("/etc/kvol/components/{name}"))), text.to_string())
    }

    #[test]
    fn built_ins_check_clean() {
        let (catalogue, problems) = Catalogue::with_documents(Vec::new());
        assert_eq!(problems, vec![]);
        let names: Vec<_> = catalogue.entries().iter().map(|e| e.definition.name.as_str()).collect();
        assert_eq!(names, ["hostpath", "lvm", "snapshot-controller"]);
    }

    #[test]
    fn user_definitions_add_replace_or_are_left_out_with_a_reason() {
        let extra = "name: nfs\nrole: driver\nprovides: {csiDriver: nfs.csi.k8s.io}\n";
        let replaced =
            "name: hostpath\nrole: driver\nprovides: {csiDriver: hostpath.csi.kvol.io}\ndescription: mine\n";
        let (catalogue, problems) = Catalogue::with_documents(vec![
            user("a-nfs.yaml", extra),
            user("b-again.yaml", extra),
            user("c-hostpath.yaml", replaced),
            user("d-broken.yaml", "name: [\n"),
            user("e-thief.yaml", "name: thief\nrole: driver\nprovides: {csiDriver: lvm.csi.kvol.io}\n"),
            user(
                "f-alias.yaml",
                "name: snap2\nrole: optional\nformerNames: [{name: csi-snapshot-controller}]\n",
            ),
        ]);
        assert_eq!(catalogue.get("nfs").unwrap().origin, user("a-nfs.yaml", "").0);
        assert_eq!(catalogue.get("hostpath").unwrap().definition.description, "mine");
        assert!(catalogue.get("thief").is_none() && catalogue.get("snap2").is_none());
        let text: Vec<String> = problems.iter().map(|p| p.to_string()).collect();
        let expect = [
            "/etc/kvol/components/b-again.yaml: component \"nfs\" is already defined by /etc/kvol/components/a-nfs.yaml",
            "/etc/kvol/components/d-broken.yaml: ",
            "/etc/kvol/components/e-thief.yaml: CSI driver \"lvm.csi.kvol.io\" is already provided by component \"lvm\"",
            "/etc/kvol/components/f-alias.yaml: name \"csi-snapshot-controller\" is already used by component \"snapshot-controller\"",
        ];
        assert_eq!(text.len(), expect.len(), "{text:#?}");
        for (line, start) in text.iter().zip(expect) {
            assert!(line.starts_with(start), "{line} should start with {start}");
        }
    }

    #[test]
    fn former_names_resolve_to_their_component() {
        let catalogue = Catalogue::built_in();
        let (entry, former) = catalogue.resolve("csi-snapshot-controller").unwrap();
        assert_eq!(entry.definition.name, "snapshot-controller");
        assert!(!former.unwrap().retired);
        let (_, former) = catalogue.resolve("snapshot-webhook").unwrap();
        assert!(former.unwrap().retired);
        assert!(catalogue.resolve("nope").is_none());
    }

    #[test]
    fn a_directory_is_read_in_name_order_skipping_dot_files() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("z.yaml"), "name: zed\nrole: optional\n").unwrap();
        std::fs::write(dir.path().join(".z.yaml.swp"), "garbage").unwrap();
        std::fs::write(dir.path().join("notes.txt"), "garbage").unwrap();
        std::fs::write(dir.path().join("a.yml"), "name: zed\nrole: optional\n").unwrap();
        let (catalogue, problems) = Catalogue::load(dir.path());
        assert_eq!(catalogue.get("zed").unwrap().origin, Origin::File(dir.path().join("a.yml")));
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].origin.ends_with("z.yaml"), "{problems:?}");
        let (catalogue, problems) = Catalogue::load(&dir.path().join("absent"));
        assert_eq!((catalogue, problems), (Catalogue::built_in(), vec![]));
    }
}
