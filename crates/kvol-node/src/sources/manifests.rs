//! The standalone source: a manifests directory watched, read again whenever a change lands, its object set published to the agent.

use std::fmt;
use std::fs;
use std::io;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use kvol_plugin::watched_dir::{self, WatchedDir};
use tokio::sync::watch;

use super::ObjectSource;
use super::parse::{ManifestMemory, ParseCache, is_manifest_name, load_dir_cached};
use crate::model::ObjectSet;
pub use kvol_plugin::watched_dir::{Landing, MAX_DELAY, OpenWrites, QUIET, Quiet, landing};

/// Whether a change reported by the watcher can change what [`load_dir`] reads: opening and
/// reading files (the source's own reads among them) cannot, nor can changes to dot-files or
/// to files that are not manifests. A change to the directory itself, or a report that events
/// were lost, can.
pub fn is_relevant(event: &notify::Event, dir: &Path) -> bool {
    if !watched_dir::may_change_content(event) {
        return false;
    }
    if event.need_rescan() || event.paths.is_empty() {
        return true;
    }
    event.paths.iter().any(|path| {
        path.parent() != Some(dir) || path.file_name().and_then(|n| n.to_str()).is_some_and(is_manifest_name)
    })
}

/// Why the manifests source could not start.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error("cannot create the manifests directory {path}: {source}")]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("cannot watch the manifests directory {path}: {source}")]
    Watch { path: PathBuf, source: watched_dir::WatchError },
}

/// A watched manifests directory: the current object set, and a fresh one on a watch channel
/// whenever the directory's content changes.
///
/// Rebuilds run on the source's own thread, never the caller's: after a change the thread waits
/// until the directory has been quiet for [`QUIET`] (at most [`MAX_DELAY`]) — unless the change
/// landed whole and no other file is open for writing ([`OpenWrites`]) — reads it again, and
/// publishes the set if it differs from the last one. A change made while a rebuild runs brings
/// another, so the last change is always applied.
pub struct ManifestsSource {
    dir: PathBuf,
    watched: Option<WatchedDir>,
    sets: Arc<watch::Sender<Arc<ObjectSet>>>,
}

impl fmt::Debug for ManifestsSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ManifestsSource").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl ManifestsSource {
    /// Creates `dir` if missing (mode 0755, less the umask), starts watching it, and reads it
    /// once before returning, so [`ManifestsSource::current`] is complete from the start and
    /// never an empty set that would look like every pod gone. Needs no tokio runtime.
    pub fn start(dir: PathBuf) -> Result<ManifestsSource, SourceError> {
        ManifestsSource::start_with_memory(dir, None)
    }

    /// [`ManifestsSource::start`], remembering each file's last clean text in `memory` (when
    /// given), so that a file broken at start keeps the objects it last read cleanly.
    pub fn start_with_memory(
        dir: PathBuf,
        memory: Option<Arc<dyn ManifestMemory>>,
    ) -> Result<ManifestsSource, SourceError> {
        ManifestsSource::start_with(dir, memory, Quiet::default())
    }

    /// [`ManifestsSource::start_with_memory`] with its own quiet period.
    pub fn start_with(
        dir: PathBuf,
        memory: Option<Arc<dyn ManifestMemory>>,
        quiet: Quiet,
    ) -> Result<ManifestsSource, SourceError> {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&dir)
            .map_err(|source| SourceError::CreateDir { path: dir.clone(), source })?;
        let cache = match memory {
            Some(memory) => ParseCache::with_memory(&dir, memory),
            None => ParseCache::default(),
        };
        // Reads and publishes hold the cache's lock, so a change read on the watcher's thread
        // is never overwritten by the first read published here.
        let cache = Arc::new(std::sync::Mutex::new(cache));
        let sets = Arc::new(watch::channel(Arc::new(ObjectSet::default())).0);
        let reread = {
            let (dir, cache, sets) = (dir.clone(), Arc::clone(&cache), Arc::clone(&sets));
            move || {
                let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
                let set = load_dir_cached(&dir, &mut cache);
                publish(&dir, &sets, set);
            }
        };
        let watched = WatchedDir::start(dir.clone(), "kvol-manifests", is_relevant, quiet, reread)
            .map_err(|e| SourceError::Watch { path: dir.clone(), source: e })?;
        // Watching before the first read: a change made meanwhile is read again, never missed.
        {
            let mut cache = cache.lock().unwrap_or_else(|p| p.into_inner());
            let first = load_dir_cached(&dir, &mut cache);
            log_problems(&dir, &first, &ObjectSet::default());
            sets.send_replace(Arc::new(first));
        }
        Ok(ManifestsSource { dir, watched: Some(watched), sets })
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The object set as last read.
    pub fn current(&self) -> Arc<ObjectSet> {
        Arc::clone(&self.sets.borrow())
    }

    /// A receiver that sees every new object set (the current one marked seen).
    pub fn subscribe(&self) -> watch::Receiver<Arc<ObjectSet>> {
        self.sets.subscribe()
    }

    /// Stops watching and waits for the source's thread to end (at most the end of a rebuild in
    /// progress, one read of the directory). Receivers keep the last set.
    pub fn shutdown(mut self) {
        if let Some(watched) = self.watched.take() {
            watched.shutdown();
        }
    }
}

impl ObjectSource for ManifestsSource {
    fn current(&self) -> Arc<ObjectSet> {
        ManifestsSource::current(self)
    }

    fn subscribe(&self) -> watch::Receiver<Arc<ObjectSet>> {
        ManifestsSource::subscribe(self)
    }

    fn shutdown(self: Box<Self>) {
        ManifestsSource::shutdown(*self)
    }
}

/// Publishes `set` when it differs from the current one, logging its new problems.
fn publish(dir: &Path, sets: &watch::Sender<Arc<ObjectSet>>, set: ObjectSet) {
    sets.send_if_modified(|current| {
        if **current == set {
            return false;
        }
        log_problems(dir, &set, current);
        tracing::debug!(dir = %dir.display(), pods = set.pods.len(), problems = set.problems.len(), "manifests changed");
        *current = Arc::new(set);
        true
    });
}

/// Logs the problems of `set` that `before` did not have, so a standing problem is logged once.
fn log_problems(dir: &Path, set: &ObjectSet, before: &ObjectSet) {
    for problem in set.problems.iter().filter(|p| !before.problems.contains(p)) {
        tracing::warn!(dir = %dir.display(), "{problem}");
    }
}

#[cfg(test)]
mod tests {
    use notify::EventKind;
    use notify::event::{
        AccessKind, AccessMode, CreateKind, DataChange, MetadataKind, ModifyKind, RemoveKind, RenameMode,
    };

    use super::*;

    #[test]
    fn landings() {
        let cases = [
            (
                "closed after writing",
                EventKind::Access(AccessKind::Close(AccessMode::Write)),
                Landing::Settled,
            ),
            ("renamed into place", EventKind::Modify(ModifyKind::Name(RenameMode::To)), Landing::Settled),
            ("renamed, both names", EventKind::Modify(ModifyKind::Name(RenameMode::Both)), Landing::Settled),
            ("renamed away", EventKind::Modify(ModifyKind::Name(RenameMode::From)), Landing::Settled),
            ("removed", EventKind::Remove(RemoveKind::File), Landing::Settled),
            ("created", EventKind::Create(CreateKind::File), Landing::Open),
            ("written", EventKind::Modify(ModifyKind::Data(DataChange::Any)), Landing::Open),
            ("written, kind unknown", EventKind::Modify(ModifyKind::Any), Landing::Open),
            ("chmod", EventKind::Modify(ModifyKind::Metadata(MetadataKind::Any)), Landing::Open),
            ("renamed, side unknown", EventKind::Modify(ModifyKind::Name(RenameMode::Any)), Landing::Open),
            ("something else", EventKind::Other, Landing::Open),
        ];
        for (what, kind, want) in cases {
            assert_eq!(landing(&notify::Event::new(kind)), want, "{what}");
        }
        let lost = notify::Event::new(EventKind::Access(AccessKind::Close(AccessMode::Write)))
            .set_flag(notify::event::Flag::Rescan);
        assert_eq!(landing(&lost), Landing::Open, "events were lost");
    }

    #[test]
    fn a_settled_change_is_read_at_once_unless_another_file_is_still_open() {
        use Landing::{Open, Settled};
        let (a, b) = (PathBuf::from("/m/a.yaml"), PathBuf::from("/m/b.yaml"));
        // (what, the changes in order, whether the directory may be read after each)
        type Case = (&'static str, Vec<(Landing, Vec<PathBuf>)>, Vec<bool>);
        let cases: [Case; 6] = [
            ("renamed into place", vec![(Settled, vec![a.clone()])], vec![true]),
            (
                "created, written, closed",
                vec![(Open, vec![a.clone()]), (Open, vec![a.clone()]), (Settled, vec![a.clone()])],
                vec![false, false, true],
            ),
            (
                "one closed while another is still open",
                vec![(Open, vec![a.clone()]), (Open, vec![b.clone()]), (Settled, vec![a.clone()])],
                vec![false, false, false],
            ),
            (
                "both closed",
                vec![
                    (Open, vec![a.clone()]),
                    (Open, vec![b.clone()]),
                    (Settled, vec![a.clone()]),
                    (Settled, vec![b.clone()]),
                ],
                vec![false, false, false, true],
            ),
            (
                "lost events wait for quiet",
                vec![(Open, vec![]), (Settled, vec![a.clone()])],
                vec![false, false],
            ),
            ("removed", vec![(Settled, vec![b.clone()])], vec![true]),
        ];
        for (what, steps, want) in cases {
            let mut writes = OpenWrites::default();
            let got: Vec<bool> = steps.iter().map(|(landing, paths)| writes.note(*landing, paths)).collect();
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn relevant_events() {
        let dir = Path::new("/m");
        let event = |kind: EventKind, paths: &[&str]| {
            paths.iter().fold(notify::Event::new(kind), |e, p| e.add_path(PathBuf::from(p)))
        };
        let cases = [
            ("a manifest created", event(EventKind::Create(CreateKind::File), &["/m/a.yaml"]), true),
            ("a manifest written", event(EventKind::Modify(ModifyKind::Any), &["/m/a.json"]), true),
            (
                "a manifest closed after writing",
                event(EventKind::Access(AccessKind::Close(AccessMode::Write)), &["/m/a.yml"]),
                true,
            ),
            (
                "a manifest opened",
                event(EventKind::Access(AccessKind::Open(AccessMode::Any)), &["/m/a.yaml"]),
                false,
            ),
            (
                "a manifest read",
                event(EventKind::Access(AccessKind::Close(AccessMode::Read)), &["/m/a.yaml"]),
                false,
            ),
            ("a manifest removed", event(EventKind::Remove(RemoveKind::File), &["/m/a.yaml"]), true),
            ("a dot-file written", event(EventKind::Modify(ModifyKind::Any), &["/m/.a.yaml.tmp"]), false),
            ("another file written", event(EventKind::Modify(ModifyKind::Any), &["/m/notes.txt"]), false),
            (
                "a temp file renamed to a manifest",
                event(
                    EventKind::Modify(ModifyKind::Name(RenameMode::Both)),
                    &["/m/.a.yaml.tmp", "/m/a.yaml"],
                ),
                true,
            ),
            (
                "a manifest renamed away",
                event(EventKind::Modify(ModifyKind::Name(RenameMode::From)), &["/m/a.yaml"]),
                true,
            ),
            ("the directory removed", event(EventKind::Remove(RemoveKind::Folder), &["/m"]), true),
            ("no paths", event(EventKind::Other, &[]), true),
            (
                "events were lost",
                event(EventKind::Other, &["/m/.x"]).set_flag(notify::event::Flag::Rescan),
                true,
            ),
        ];
        for (what, event, want) in cases {
            assert_eq!(is_relevant(&event, dir), want, "{what}");
        }
    }
}
