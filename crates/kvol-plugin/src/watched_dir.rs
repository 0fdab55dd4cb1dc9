//! A directory watched for changes that land whole: one thread waits for a relevant change, for quiet while a file is still being written, then calls its reader; shared by every watched directory of the agent (manifests, config).

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use notify::event::{AccessKind, AccessMode, ModifyKind, RenameMode};
use notify::{EventKind, RecommendedWatcher, RecursiveMode, Watcher};

/// How long the directory must be quiet after a change to a file still open for writing before
/// it is read again (a file that lands whole is read at once: see [`landing`]).
pub const QUIET: Duration = Duration::from_millis(50);

/// The longest a rebuild waits for the directory to go quiet: a directory that never stops
/// changing is still read at least this often.
pub const MAX_DELAY: Duration = Duration::from_millis(500);

/// How a relevant change landed: whole, or perhaps still being written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Landing {
    /// The file is complete as it stands: closed after writing (`IN_CLOSE_WRITE`), renamed into
    /// or out of place (`IN_MOVED_TO`, `IN_MOVED_FROM`), or removed.
    Settled,
    /// A writer may still hold the file (created, written, metadata changed), or the watcher
    /// lost events: wait for quiet.
    Open,
}

/// Whether `event` can change a file's content: opening and reading files (the watcher's own
/// reads among them) cannot; closing a file written can. Pure.
pub fn may_change_content(event: &notify::Event) -> bool {
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write)) => true,
        EventKind::Access(_) => false,
        _ => true,
    }
}

/// How `event` landed; pure.
pub fn landing(event: &notify::Event) -> Landing {
    if event.need_rescan() {
        return Landing::Open;
    }
    match event.kind {
        EventKind::Access(AccessKind::Close(AccessMode::Write))
        | EventKind::Modify(ModifyKind::Name(RenameMode::To | RenameMode::From | RenameMode::Both))
        | EventKind::Remove(_) => Landing::Settled,
        _ => Landing::Open,
    }
}

/// The manifests written but not yet closed since the last read: a settled change is read at
/// once only when no other file is still open for writing, so a half-written file is never
/// read for want of waiting.
#[derive(Debug, Default)]
pub struct OpenWrites {
    open: std::collections::BTreeSet<PathBuf>,
    unknown: bool,
}

impl OpenWrites {
    /// Notes a relevant change of `paths`; returns whether the directory can be read now.
    pub fn note(&mut self, landing: Landing, paths: &[PathBuf]) -> bool {
        match landing {
            Landing::Open if paths.is_empty() => self.unknown = true,
            Landing::Open => self.open.extend(paths.iter().cloned()),
            Landing::Settled => {
                for path in paths {
                    self.open.remove(path);
                }
            }
        }
        landing == Landing::Settled && self.open.is_empty() && !self.unknown
    }
}

/// How long the source waits for a directory still being written to go quiet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Quiet {
    /// The quiet needed after a change to a file still open for writing.
    pub quiet: Duration,
    /// The longest wait: a directory that never goes quiet is still read this often.
    pub max_delay: Duration,
}

impl Default for Quiet {
    fn default() -> Self {
        Quiet { quiet: QUIET, max_delay: MAX_DELAY }
    }
}

/// Why a directory could not be watched.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    #[error("cannot watch {path}: {source}")]
    Watch { path: PathBuf, source: notify::Error },
    #[error("cannot start the watcher thread for {path}: {source}")]
    Thread { path: PathBuf, source: std::io::Error },
}

enum Signal {
    Changed(Landing, Vec<PathBuf>),
    Stop,
}

/// A watched directory: after every relevant change (once it has landed, see [`Landing`] and
/// [`OpenWrites`]) its reader runs on the watcher's own thread. A change made while the reader
/// runs brings another run, so the last change is always read.
pub struct WatchedDir {
    dir: PathBuf,
    watcher: Option<RecommendedWatcher>,
    signals: mpsc::Sender<Signal>,
    thread: Option<thread::JoinHandle<()>>,
}

impl std::fmt::Debug for WatchedDir {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchedDir").field("dir", &self.dir).finish_non_exhaustive()
    }
}

impl WatchedDir {
    /// Starts watching `dir` (which must exist); `relevant` tells which events can change what
    /// `read` reads. The watch is in place when this returns, so a caller that reads once
    /// afterwards misses no change.
    pub fn start(
        dir: PathBuf,
        thread_name: &str,
        relevant: impl Fn(&notify::Event, &Path) -> bool + Send + 'static,
        quiet: Quiet,
        mut read: impl FnMut() + Send + 'static,
    ) -> Result<WatchedDir, WatchError> {
        let (signals, received) = mpsc::channel();
        let to_thread = signals.clone();
        let watched = dir.clone();
        let mut watcher = notify::recommended_watcher(move |event: notify::Result<notify::Event>| {
            let signal = match event {
                Ok(event) if relevant(&event, &watched) => Signal::Changed(landing(&event), event.paths),
                Ok(_) => return,
                Err(e) => {
                    tracing::warn!(dir = %watched.display(), "watcher error, rereading: {e}");
                    Signal::Changed(Landing::Open, Vec::new())
                }
            };
            let _ = to_thread.send(signal);
        })
        .map_err(|source| WatchError::Watch { path: dir.clone(), source })?;
        watcher
            .watch(&dir, RecursiveMode::NonRecursive)
            .map_err(|source| WatchError::Watch { path: dir.clone(), source })?;
        let thread = thread::Builder::new()
            .name(thread_name.to_string())
            .spawn(move || run(&received, quiet, &mut read))
            .map_err(|source| WatchError::Thread { path: dir.clone(), source })?;
        Ok(WatchedDir { dir, watcher: Some(watcher), signals, thread: Some(thread) })
    }

    /// The watched directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Stops watching and waits for the thread (at most the end of a read in progress).
    pub fn shutdown(mut self) {
        self.stop();
        if let Some(thread) = self.thread.take()
            && thread.join().is_err()
        {
            tracing::error!(dir = %self.dir.display(), "the watcher thread panicked");
        }
    }

    fn stop(&mut self) {
        drop(self.watcher.take());
        let _ = self.signals.send(Signal::Stop);
    }
}

impl Drop for WatchedDir {
    /// Stops the watch without waiting for the thread.
    fn drop(&mut self) {
        self.stop();
    }
}

/// The watcher's thread: waits for a change, for quiet, then reads.
fn run(signals: &mpsc::Receiver<Signal>, quiet: Quiet, read: &mut dyn FnMut()) {
    loop {
        let mut writes = OpenWrites::default();
        let mut read_now = match signals.recv() {
            Ok(Signal::Changed(landing, paths)) => writes.note(landing, &paths),
            Ok(Signal::Stop) | Err(_) => return,
        };
        // What already arrived with it (a rename's To and Both) is one change.
        loop {
            match signals.try_recv() {
                Ok(Signal::Changed(landing, paths)) => read_now = writes.note(landing, &paths),
                Ok(Signal::Stop) | Err(mpsc::TryRecvError::Disconnected) => return,
                Err(mpsc::TryRecvError::Empty) => break,
            }
        }
        let first = Instant::now();
        while !read_now {
            let left = quiet.max_delay.saturating_sub(first.elapsed());
            if left.is_zero() {
                break;
            }
            match signals.recv_timeout(quiet.quiet.min(left)) {
                Ok(Signal::Changed(landing, paths)) => read_now = writes.note(landing, &paths),
                Ok(Signal::Stop) | Err(mpsc::RecvTimeoutError::Disconnected) => return,
                Err(mpsc::RecvTimeoutError::Timeout) => break,
            }
        }
        read();
    }
}
