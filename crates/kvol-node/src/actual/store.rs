//! The journal store: the agent's actual state and the operations under way, in one redb file, every change durable before the call returns.
//!
//! # Layout
//!
//! One redb database (schema 2). Values are JSON text (serde_json) of the model types, so a
//! record stays readable with any redb tool; a record that does not parse (or whose key does not
//! match its content) is an error naming the store, the table and the key.
//!
//! | table       | key                          | value                                        |
//! |-------------|------------------------------|----------------------------------------------|
//! | `meta`      | `&str`                       | `u64`: `schema` (1), `next_journal_id`       |
//! | `attached`  | unique volume name           | [`AttachedVolume`]                           |
//! | `staged`    | unique volume name           | [`StagedVolume`]                             |
//! | `published` | `(pod uid, pod volume name)` | [`PublishedVolume`]                          |
//! | `journal`   | journal id (`u64`, rising)   | `{"operation": Operation, "startedUnixMs"}`  |
//! | `manifests` | manifest file name           | the file's text when it last read cleanly    |
//!
//! Unique volume names are `<plugin>/<name>` (see [`crate::model::unique_volume_name`]). A store
//! of schema 1 (unique names without the plugin) is converted when opened, in one transaction
//! ([`convert_v1_names`]).
//!
//! # Protocol
//!
//! The executor calls [`Store::begin`] before an operation touches the node and
//! [`Store::finish`] after it, with the change to the actual state the operation made (or
//! [`ActualChange::Nothing`] when it failed; a published record replaces any other of its pod
//! at its target). `finish` removes the journal entry and applies the
//! change in one write transaction, so after a crash at any point the store holds either the
//! entry (the operation may or may not have happened: [`crate::actual::rebuild`] looks at the node to
//! decide) or the change, never both and never neither. Every commit uses redb's default
//! durability (`Immediate`: fsynced before `commit` returns). The executor writes through
//! [`GroupCommit`], which puts the writes of operations that begin or end together into one
//! transaction (one fsync) and answers each only once it is durable: the protocol per
//! operation is unchanged.
//!
//! Journal ids come from `meta.next_journal_id`, so they keep rising across restarts and
//! [`Store::replace_actual`]; [`Loaded::incomplete`] lists entries in id order, which is the
//! order the operations started.
//!
//! Opening verifies every page's checksum (`check_integrity`, a few milliseconds for a store
//! of this size), so a damaged file is refused at open rather than panicking redb in a later
//! read. A file that is not a redb database, a damaged one, or a redb database that is not a
//! kvol store (tables this module does not know, a missing or different schema version) is
//! refused with an error naming the path. A file that is not a redb database is never written
//! to.

use std::fmt;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use redb::{
    Database, MultimapTableHandle, ReadableDatabase, ReadableTable, TableDefinition, TableHandle,
    WriteTransaction,
};
use serde::{Deserialize, Serialize};

use crate::model::{ActualState, AttachedVolume, Operation, PodVolumeKey, PublishedVolume, StagedVolume};

const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const ATTACHED: TableDefinition<&str, &str> = TableDefinition::new("attached");
const STAGED: TableDefinition<&str, &str> = TableDefinition::new("staged");
const PUBLISHED: TableDefinition<(&str, &str), &str> = TableDefinition::new("published");
const JOURNAL: TableDefinition<u64, &str> = TableDefinition::new("journal");
const MANIFESTS: TableDefinition<&str, &str> = TableDefinition::new("manifests");

/// Every table of a kvol store; any other table makes a database foreign.
const TABLES: [&str; 6] = ["meta", "attached", "staged", "published", "journal", "manifests"];
/// The `meta` key of the layout version.
const SCHEMA_KEY: &str = "schema";
/// The layout this module reads and writes.
const SCHEMA: u64 = 2;
/// The layout before unique names carried their plugin; converted on open.
const SCHEMA_V1: u64 = 1;
/// The `meta` key of the id the next journal entry gets.
const NEXT_ID_KEY: &str = "next_journal_id";

/// A store that cannot be opened, read or written; every message names the store's path.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("cannot create the directory of store {}: {source}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot create store {}: {source}", path.display())]
    Create {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot open store {}: {source}", path.display())]
    Open {
        path: PathBuf,
        #[source]
        source: redb::DatabaseError,
    },
    #[error("store {} is in use by another process (is another kvol agent running with this root?)", path.display())]
    InUse { path: PathBuf },
    #[error("store {} is corrupt: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("{} is not a kvol store: {reason}", path.display())]
    Foreign { path: PathBuf, reason: String },
    #[error("store {}: {source}", path.display())]
    Database {
        path: PathBuf,
        #[source]
        source: redb::Error,
    },
    #[error("store {}: record {key:?} of table {table} is unreadable: {reason}", path.display())]
    Record { path: PathBuf, table: &'static str, key: String, reason: String },
    #[error("store {}: cannot encode {what}: {source}", path.display())]
    Encode {
        path: PathBuf,
        what: String,
        #[source]
        source: serde_json::Error,
    },
    #[error("store {}: there is no journal entry {id} to finish", path.display())]
    UnknownEntry { path: PathBuf, id: u64 },
    #[error("the journal's writing thread has stopped")]
    Closed,
    #[error("store {} is being opened again after an i/o error", path.display())]
    Reopening { path: PathBuf },
}

/// One write to the journal: an operation begun, or one finished with its change.
#[derive(Clone, Debug, PartialEq)]
pub enum JournalWrite {
    Begin(Operation),
    Finish(u64, ActualChange),
}

/// What a [`JournalWrite`] gave: the new entry's id, or that the entry is finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum JournalDone {
    Began(u64),
    Finished,
}

/// Makes journal writes durable in groups, on a thread of its own: the writes that arrive while
/// a commit is on its way to disk share the next commit (one fsync for all), and each caller is
/// answered only once its own write is durable. A lone write is committed at once, as
/// [`Store::begin`] would; async callers never hold a runtime thread while the disk works.
#[derive(Clone, Debug)]
pub struct GroupCommit {
    queue: std::sync::mpsc::Sender<QueuedWrite>,
}

type QueuedWrite = (JournalWrite, tokio::sync::oneshot::Sender<Result<JournalDone, StoreError>>);

impl GroupCommit {
    /// Starts the committing thread; it ends when the last `GroupCommit` clone is dropped.
    pub fn start(store: Arc<Store>) -> GroupCommit {
        let (queue, writes) = std::sync::mpsc::channel::<QueuedWrite>();
        std::thread::Builder::new()
            .name("kvol-journal".into())
            .spawn(move || {
                while let Ok(first) = writes.recv() {
                    let mut group = vec![first];
                    group.extend(writes.try_iter());
                    let (batch, replies): (Vec<JournalWrite>, Vec<_>) = group.into_iter().unzip();
                    for (reply, done) in replies.into_iter().zip(store.write_group(&batch)) {
                        let _ = reply.send(done);
                    }
                }
            })
            .expect("cannot start the journal thread");
        GroupCommit { queue }
    }

    /// [`Store::begin`], committed with whatever other writes are waiting.
    pub async fn begin(&self, operation: &Operation) -> Result<u64, StoreError> {
        match self.write(JournalWrite::Begin(operation.clone())).await? {
            JournalDone::Began(id) => Ok(id),
            JournalDone::Finished => unreachable!("a begin is answered with its id"),
        }
    }

    /// [`Store::finish`], committed with whatever other writes are waiting.
    pub async fn finish(&self, id: u64, change: &ActualChange) -> Result<(), StoreError> {
        self.write(JournalWrite::Finish(id, change.clone())).await.map(|_| ())
    }

    async fn write(&self, write: JournalWrite) -> Result<JournalDone, StoreError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        self.queue.send((write, reply)).map_err(|_| StoreError::Closed)?;
        answer.await.map_err(|_| StoreError::Closed)?
    }
}

/// An operation begun and not finished.
#[derive(Clone, Debug, PartialEq)]
pub struct JournalEntry {
    pub id: u64,
    pub operation: Operation,
    /// When [`Store::begin`] recorded it, in milliseconds since the Unix epoch.
    pub started_unix_ms: u64,
}

/// What a finished operation changed in the actual state.
#[derive(Clone, Debug, PartialEq)]
#[expect(
    clippy::large_enum_variant,
    reason = "one value per finished operation, passed by reference; the executor matches on the plain records"
)]
pub enum ActualChange {
    /// Adds or replaces the attached record of the volume's unique name.
    SetAttached(AttachedVolume),
    /// Removes the attached record of this unique name (absent: no change).
    RemoveAttached(String),
    SetStaged(StagedVolume),
    RemoveStaged(String),
    SetPublished(PublishedVolume),
    RemovePublished(PodVolumeKey),
    /// The operation changed nothing (it failed before touching the node, or was a no-op).
    Nothing,
}

/// Everything in the store at one moment, read in one transaction.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Loaded {
    pub actual: ActualState,
    /// Journal entries not finished, in id order.
    pub incomplete: Vec<JournalEntry>,
}

/// A journal entry as stored (owned, for reading).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct StoredEntry {
    operation: Operation,
    started_unix_ms: u64,
}

/// A journal entry as stored (borrowed, for writing).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct StoredEntryRef<'a> {
    operation: &'a Operation,
    started_unix_ms: u64,
}

/// The journal store. Share it behind an `Arc`: redb serialises write transactions and lets
/// reads run beside them.
#[derive(Debug)]
pub struct Store {
    path: PathBuf,
    /// The database; `None` while it is being opened again after an I/O error (redb refuses
    /// every transaction after a failed write until it is closed and opened again).
    db: std::sync::RwLock<Option<Arc<Database>>>,
    /// Set by an I/O error: the next transaction opens the database again first, so a disk
    /// that was full or read-only for a while is written again once it is not, without a
    /// restart.
    reopen: std::sync::atomic::AtomicBool,
    /// Whether writes fail for an I/O error now: said once when they begin to, once when a
    /// group of the executor's writes is durable again.
    failing: std::sync::atomic::AtomicBool,
}

impl Store {
    /// Opens the store at `path`, creating the file (and its parent directory, mode 0700) if
    /// missing. A file that is not a kvol store, or is damaged, is an error naming the path.
    pub fn open(path: &Path) -> Result<Store, StoreError> {
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(parent)
                .map_err(|source| StoreError::CreateDir { path: path.to_path_buf(), source })?;
        }
        if !path.exists() {
            create_atomically(path)?;
        }
        let store = Store::over(path, open_checked(path)?);
        store.initialise()?;
        Ok(store)
    }

    /// The file the store lives in.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The actual state and the unfinished journal entries (in id order), from one snapshot.
    pub fn load(&self) -> Result<Loaded, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_error(e))?;
        let actual = self.read_actual(&txn)?;
        let journal = txn.open_table(JOURNAL).map_err(|e| self.db_error(e))?;
        let mut incomplete = Vec::new();
        for row in journal.iter().map_err(|e| self.db_error(e))? {
            let (id, text) = row.map_err(|e| self.db_error(e))?;
            let id = id.value();
            let entry: StoredEntry = serde_json::from_str(text.value())
                .map_err(|e| self.record_error("journal", id.to_string(), e.to_string()))?;
            incomplete.push(JournalEntry {
                id,
                operation: entry.operation,
                started_unix_ms: entry.started_unix_ms,
            });
        }
        Ok(Loaded { actual, incomplete })
    }

    /// Journals `operation` as begun and returns its id; the entry is on disk when this returns.
    pub fn begin(&self, operation: &Operation) -> Result<u64, StoreError> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
        let id = self.begin_in(&txn, operation)?;
        txn.commit().map_err(|e| self.db_error(e))?;
        Ok(id)
    }

    /// Removes journal entry `id` and applies `change`, in one durable write transaction. An
    /// unknown `id` is an error and changes nothing.
    pub fn finish(&self, id: u64, change: &ActualChange) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
        // On an error the transaction is dropped uncommitted, which aborts it.
        self.finish_in(&txn, id, change)?;
        txn.commit().map_err(|e| self.db_error(e))
    }

    /// Makes `writes` durable in one write transaction (one fsync), answering each in order.
    /// Should any write fail, nothing of the group is kept and each write is made again in a
    /// transaction of its own, so one bad write costs the others nothing.
    pub fn write_group(&self, writes: &[JournalWrite]) -> Vec<Result<JournalDone, StoreError>> {
        let together = (|| {
            let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
            let done = writes.iter().map(|w| self.write_in(&txn, w)).collect::<Result<Vec<_>, _>>()?;
            txn.commit().map_err(|e| self.db_error(e))?;
            Ok::<_, StoreError>(done)
        })();
        if together.is_ok() && self.failing.swap(false, std::sync::atomic::Ordering::SeqCst) {
            tracing::info!(store = %self.path.display(), "the journal is written again");
        }
        match together {
            Ok(done) => done.into_iter().map(Ok).collect(),
            Err(_) if writes.len() > 1 => writes.iter().map(|w| self.write_alone(w)).collect(),
            Err(e) => vec![Err(e)],
        }
    }

    fn write_alone(&self, write: &JournalWrite) -> Result<JournalDone, StoreError> {
        match write {
            JournalWrite::Begin(operation) => self.begin(operation).map(JournalDone::Began),
            JournalWrite::Finish(id, change) => self.finish(*id, change).map(|()| JournalDone::Finished),
        }
    }

    fn write_in(&self, txn: &WriteTransaction, write: &JournalWrite) -> Result<JournalDone, StoreError> {
        match write {
            JournalWrite::Begin(operation) => self.begin_in(txn, operation).map(JournalDone::Began),
            JournalWrite::Finish(id, change) => {
                self.finish_in(txn, *id, change).map(|()| JournalDone::Finished)
            }
        }
    }

    /// Inside `txn`: a new journal entry for `operation`; its id.
    fn begin_in(&self, txn: &WriteTransaction, operation: &Operation) -> Result<u64, StoreError> {
        let started_unix_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
        let text = self.encode(&StoredEntryRef { operation, started_unix_ms }, || {
            format!("the journal entry of {}", operation.name())
        })?;
        let mut meta = txn.open_table(META).map_err(|e| self.db_error(e))?;
        let id = meta.get(NEXT_ID_KEY).map_err(|e| self.db_error(e))?.map_or(1, |g| g.value());
        meta.insert(NEXT_ID_KEY, id + 1).map_err(|e| self.db_error(e))?;
        let mut journal = txn.open_table(JOURNAL).map_err(|e| self.db_error(e))?;
        journal.insert(id, text.as_str()).map_err(|e| self.db_error(e))?;
        Ok(id)
    }

    /// Inside `txn`: journal entry `id` removed and `change` applied.
    fn finish_in(&self, txn: &WriteTransaction, id: u64, change: &ActualChange) -> Result<(), StoreError> {
        {
            let mut journal = txn.open_table(JOURNAL).map_err(|e| self.db_error(e))?;
            if journal.remove(id).map_err(|e| self.db_error(e))?.is_none() {
                return Err(StoreError::UnknownEntry { path: self.path.clone(), id });
            }
        }
        self.apply(txn, change)
    }

    /// Replaces the whole actual state with `actual` and empties the journal, in one durable
    /// write transaction (after a rebuild has settled every unfinished entry).
    pub fn replace_actual(&self, actual: &ActualState) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
        self.write_actual(&txn, actual)?;
        txn.commit().map_err(|e| self.db_error(e))
    }

    /// Inside `txn`: empties the journal and the record tables and writes `actual`.
    fn write_actual(&self, txn: &WriteTransaction, actual: &ActualState) -> Result<(), StoreError> {
        {
            let mut journal = txn.open_table(JOURNAL).map_err(|e| self.db_error(e))?;
            journal.retain(|_, _| false).map_err(|e| self.db_error(e))?;
            let mut attached = txn.open_table(ATTACHED).map_err(|e| self.db_error(e))?;
            attached.retain(|_, _| false).map_err(|e| self.db_error(e))?;
            let mut staged = txn.open_table(STAGED).map_err(|e| self.db_error(e))?;
            staged.retain(|_, _| false).map_err(|e| self.db_error(e))?;
            let mut published = txn.open_table(PUBLISHED).map_err(|e| self.db_error(e))?;
            published.retain(|_, _| false).map_err(|e| self.db_error(e))?;
        }
        for volume in actual.attached.values() {
            self.apply(txn, &ActualChange::SetAttached(volume.clone()))?;
        }
        for volume in actual.staged.values() {
            self.apply(txn, &ActualChange::SetStaged(volume.clone()))?;
        }
        for volume in actual.published.values() {
            self.apply(txn, &ActualChange::SetPublished(volume.clone()))?;
        }
        Ok(())
    }

    /// The actual state as recorded.
    pub fn actual(&self) -> Result<ActualState, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_error(e))?;
        self.read_actual(&txn)
    }

    /// Creates the tables of a new store, or checks that an existing database is a kvol store
    /// of this schema.
    fn initialise(&self) -> Result<(), StoreError> {
        let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
        let tables: Vec<String> =
            txn.list_tables().map_err(|e| self.db_error(e))?.map(|t| t.name().to_string()).collect();
        let multimaps: Vec<String> =
            txn.list_multimap_tables().map_err(|e| self.db_error(e))?.map(|t| t.name().to_string()).collect();
        let foreign = |reason: String| StoreError::Foreign { path: self.path.clone(), reason };
        if let Some(other) = tables.iter().chain(&multimaps).find(|t| !TABLES.contains(&t.as_str())) {
            return Err(foreign(format!("it has a table {other:?}")));
        }
        let schema = if tables.iter().any(|t| t == "meta") {
            let meta = txn.open_table(META).map_err(|e| self.db_error(e))?;
            meta.get(SCHEMA_KEY).map_err(|e| self.db_error(e))?.map(|g| g.value())
        } else {
            None
        };
        match schema {
            Some(SCHEMA) => {
                // Existing store: nothing to write.
                txn.abort().map_err(|e| self.db_error(e))?;
                Ok(())
            }
            Some(SCHEMA_V1) => {
                txn.abort().map_err(|e| self.db_error(e))?;
                self.upgrade_from_v1()
            }
            Some(other) => Err(foreign(format!("it has schema version {other}, this kvol reads {SCHEMA}"))),
            None if !tables.is_empty() => Err(foreign("it has no schema version".to_string())),
            None => {
                {
                    let mut meta = txn.open_table(META).map_err(|e| self.db_error(e))?;
                    meta.insert(SCHEMA_KEY, SCHEMA).map_err(|e| self.db_error(e))?;
                    meta.insert(NEXT_ID_KEY, 1).map_err(|e| self.db_error(e))?;
                    txn.open_table(ATTACHED).map_err(|e| self.db_error(e))?;
                    txn.open_table(STAGED).map_err(|e| self.db_error(e))?;
                    txn.open_table(PUBLISHED).map_err(|e| self.db_error(e))?;
                    txn.open_table(JOURNAL).map_err(|e| self.db_error(e))?;
                    txn.open_table(MANIFESTS).map_err(|e| self.db_error(e))?;
                }
                txn.commit().map_err(|e| self.db_error(e))
            }
        }
    }

    /// Converts a schema 1 store in place: unique names gain their plugin, in the records and
    /// in the unfinished journal entries; the `manifests` table is added. One transaction.
    fn upgrade_from_v1(&self) -> Result<(), StoreError> {
        let old = self.load()?;
        let (actual, journal) = convert_v1_names(&old.actual, &old.incomplete);
        let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
        self.write_actual(&txn, &actual)?;
        {
            let mut table = txn.open_table(JOURNAL).map_err(|e| self.db_error(e))?;
            for entry in &journal {
                let stored =
                    StoredEntryRef { operation: &entry.operation, started_unix_ms: entry.started_unix_ms };
                let text =
                    self.encode(&stored, || format!("the journal entry of {}", entry.operation.name()))?;
                table.insert(entry.id, text.as_str()).map_err(|e| self.db_error(e))?;
            }
            txn.open_table(MANIFESTS).map_err(|e| self.db_error(e))?;
            let mut meta = txn.open_table(META).map_err(|e| self.db_error(e))?;
            meta.insert(SCHEMA_KEY, SCHEMA).map_err(|e| self.db_error(e))?;
        }
        txn.commit().map_err(|e| self.db_error(e))?;
        tracing::info!(store = %self.path.display(), "converted the store from schema 1 (unique volume names now carry their plugin)");
        Ok(())
    }

    /// The text of every manifest file as it last read cleanly, by file name.
    pub fn manifests(&self) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        let txn = self.db()?.begin_read().map_err(|e| self.db_error(e))?;
        let table = txn.open_table(MANIFESTS).map_err(|e| self.db_error(e))?;
        let mut all = std::collections::BTreeMap::new();
        for row in table.iter().map_err(|e| self.db_error(e))? {
            let (name, text) = row.map_err(|e| self.db_error(e))?;
            all.insert(name.value().to_string(), text.value().to_string());
        }
        Ok(all)
    }

    /// Records `text` as manifest file `name`'s last clean read (`None`: the file is gone);
    /// unchanged text is not written again.
    pub fn remember_manifest(&self, name: &str, text: Option<&str>) -> Result<(), StoreError> {
        self.remember_manifests(&[(name, text)])
    }

    /// [`Store::remember_manifest`] for several files, in one durable write transaction (none
    /// when nothing changed).
    pub fn remember_manifests(&self, files: &[(&str, Option<&str>)]) -> Result<(), StoreError> {
        let changed: Vec<&(&str, Option<&str>)> = {
            let txn = self.db()?.begin_read().map_err(|e| self.db_error(e))?;
            let table = txn.open_table(MANIFESTS).map_err(|e| self.db_error(e))?;
            let mut changed = Vec::new();
            for file in files {
                let current = table.get(file.0).map_err(|e| self.db_error(e))?;
                if current.as_ref().map(|g| g.value()) != file.1 {
                    changed.push(file);
                }
            }
            changed
        };
        if changed.is_empty() {
            return Ok(());
        }
        let txn = self.db()?.begin_write().map_err(|e| self.db_error(e))?;
        {
            let mut table = txn.open_table(MANIFESTS).map_err(|e| self.db_error(e))?;
            for (name, text) in changed {
                match text {
                    Some(text) => table.insert(*name, *text).map(|_| ()),
                    None => table.remove(*name).map(|_| ()),
                }
                .map_err(|e| self.db_error(e))?;
            }
        }
        txn.commit().map_err(|e| self.db_error(e))
    }

    /// Applies one change inside `txn`.
    fn apply(&self, txn: &WriteTransaction, change: &ActualChange) -> Result<(), StoreError> {
        match change {
            ActualChange::SetAttached(volume) => {
                let text = self.encode(volume, || format!("attached volume {}", volume.unique_name))?;
                let mut table = txn.open_table(ATTACHED).map_err(|e| self.db_error(e))?;
                table.insert(volume.unique_name.as_str(), text.as_str()).map_err(|e| self.db_error(e))?;
            }
            ActualChange::RemoveAttached(name) => {
                let mut table = txn.open_table(ATTACHED).map_err(|e| self.db_error(e))?;
                table.remove(name.as_str()).map_err(|e| self.db_error(e))?;
            }
            ActualChange::SetStaged(volume) => {
                let text = self.encode(volume, || format!("staged volume {}", volume.unique_name))?;
                let mut table = txn.open_table(STAGED).map_err(|e| self.db_error(e))?;
                table.insert(volume.unique_name.as_str(), text.as_str()).map_err(|e| self.db_error(e))?;
            }
            ActualChange::RemoveStaged(name) => {
                let mut table = txn.open_table(STAGED).map_err(|e| self.db_error(e))?;
                table.remove(name.as_str()).map_err(|e| self.db_error(e))?;
            }
            ActualChange::SetPublished(volume) => {
                let text = self.encode(volume, || format!("published volume {}", volume.key))?;
                let mut table = txn.open_table(PUBLISHED).map_err(|e| self.db_error(e))?;
                for other in self.same_target(&table, volume)? {
                    table
                        .remove((volume.key.pod_uid.as_str(), other.as_str()))
                        .map_err(|e| self.db_error(e))?;
                }
                let key = (volume.key.pod_uid.as_str(), volume.key.volume.as_str());
                table.insert(key, text.as_str()).map_err(|e| self.db_error(e))?;
            }
            ActualChange::RemovePublished(key) => {
                let mut table = txn.open_table(PUBLISHED).map_err(|e| self.db_error(e))?;
                table.remove((key.pod_uid.as_str(), key.volume.as_str())).map_err(|e| self.db_error(e))?;
            }
            ActualChange::Nothing => {}
        }
        Ok(())
    }

    /// The other records of `volume`'s pod at its target (one reconstructed under its
    /// directory's name): a published record replaces them, as [`crate::executor::apply`] does.
    fn same_target(
        &self,
        table: &redb::Table<(&str, &str), &str>,
        volume: &PublishedVolume,
    ) -> Result<Vec<String>, StoreError> {
        let pod = volume.key.pod_uid.as_str();
        let mut others = Vec::new();
        for row in table.range((pod, "")..).map_err(|e| self.db_error(e))? {
            let (key, text) = row.map_err(|e| self.db_error(e))?;
            let (uid, name) = key.value();
            if uid != pod {
                break;
            }
            if name == volume.key.volume {
                continue;
            }
            let other: PublishedVolume = self.decode("published", &format!("{uid}/{name}"), text.value())?;
            if other.target == volume.target {
                others.push(name.to_string());
            }
        }
        Ok(others)
    }

    /// The three record tables, from the snapshot `txn` reads. A record whose key does not
    /// match its content is unreadable, as a record that does not parse.
    fn read_actual(&self, txn: &redb::ReadTransaction) -> Result<ActualState, StoreError> {
        let mut actual = ActualState::default();
        let table = txn.open_table(ATTACHED).map_err(|e| self.db_error(e))?;
        for row in table.iter().map_err(|e| self.db_error(e))? {
            let (key, text) = row.map_err(|e| self.db_error(e))?;
            let key = key.value().to_string();
            let volume: AttachedVolume = self.decode("attached", &key, text.value())?;
            if volume.unique_name != key {
                return Err(self.record_error("attached", key, format!("it names {}", volume.unique_name)));
            }
            actual.attached.insert(key, volume);
        }
        let table = txn.open_table(STAGED).map_err(|e| self.db_error(e))?;
        for row in table.iter().map_err(|e| self.db_error(e))? {
            let (key, text) = row.map_err(|e| self.db_error(e))?;
            let key = key.value().to_string();
            let volume: StagedVolume = self.decode("staged", &key, text.value())?;
            if volume.unique_name != key {
                return Err(self.record_error("staged", key, format!("it names {}", volume.unique_name)));
            }
            actual.staged.insert(key, volume);
        }
        let table = txn.open_table(PUBLISHED).map_err(|e| self.db_error(e))?;
        for row in table.iter().map_err(|e| self.db_error(e))? {
            let (key, text) = row.map_err(|e| self.db_error(e))?;
            let (pod_uid, volume_name) = key.value();
            let key = PodVolumeKey { pod_uid: pod_uid.to_string(), volume: volume_name.to_string() };
            let volume: PublishedVolume = self.decode("published", &key.to_string(), text.value())?;
            if volume.key != key {
                return Err(self.record_error(
                    "published",
                    key.to_string(),
                    format!("it names {}", volume.key),
                ));
            }
            actual.published.insert(key, volume);
        }
        Ok(actual)
    }

    fn encode<T: Serialize>(&self, value: &T, what: impl FnOnce() -> String) -> Result<String, StoreError> {
        serde_json::to_string(value).map_err(|source| StoreError::Encode {
            path: self.path.clone(),
            what: what(),
            source,
        })
    }

    fn decode<T: for<'de> Deserialize<'de>>(
        &self,
        table: &'static str,
        key: &str,
        text: &str,
    ) -> Result<T, StoreError> {
        serde_json::from_str(text).map_err(|e| self.record_error(table, key.to_string(), e.to_string()))
    }

    fn record_error(&self, table: &'static str, key: String, reason: String) -> StoreError {
        StoreError::Record { path: self.path.clone(), table, key, reason }
    }

    fn db_error(&self, e: impl Into<redb::Error>) -> StoreError {
        let source = e.into();
        if matches!(source, redb::Error::Io(_) | redb::Error::PreviousIo) {
            self.reopen.store(true, std::sync::atomic::Ordering::SeqCst);
            if !self.failing.swap(true, std::sync::atomic::Ordering::SeqCst) {
                tracing::warn!(store = %self.path.display(), error = %source, "the journal cannot be written: no operation starts until it can (retried with backoff)");
            }
        }
        StoreError::Database { path: self.path.clone(), source }
    }

    fn over(path: &Path, db: Database) -> Store {
        Store {
            path: path.to_path_buf(),
            db: std::sync::RwLock::new(Some(Arc::new(db))),
            reopen: std::sync::atomic::AtomicBool::new(false),
            failing: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// The database, opened again first when an I/O error asked for it. Should another
    /// transaction still hold the old one, or the file not open yet, the error is returned and
    /// the next call tries again.
    fn db(&self) -> Result<Arc<Database>, StoreError> {
        use std::sync::atomic::Ordering;
        if self.reopen.load(Ordering::SeqCst) {
            let mut db = self.db.write().unwrap_or_else(|p| p.into_inner());
            if self.reopen.load(Ordering::SeqCst) {
                let old = db.take();
                let still_held = old.is_some_and(|old| Arc::into_inner(old).is_none());
                if still_held {
                    return Err(StoreError::Reopening { path: self.path.clone() });
                }
                *db = Some(Arc::new(open_checked(&self.path)?));
                self.reopen.store(false, Ordering::SeqCst);
                tracing::debug!(store = %self.path.display(), "the journal store was opened again after an i/o error");
            }
        }
        let db = self.db.read().unwrap_or_else(|p| p.into_inner());
        db.clone().ok_or_else(|| StoreError::Reopening { path: self.path.clone() })
    }
}

/// Opens (or creates) the database and verifies every page's checksum, so a damaged file is an
/// error here rather than a panic in a later read. redb may repair a file whose last commit is
/// damaged by going back to the one before; that is logged. redb's debug builds check their
/// page allocator while opening and panic on some damage; that panic is caught and reported as
/// a corrupt store.
/// Creates a new, initialised store beside `path` and renames it into place (then syncs the
/// directory), so an agent killed while creating its store leaves no file, or a whole one —
/// never a half-written database that every later start refuses.
fn create_atomically(path: &Path) -> Result<(), StoreError> {
    let fresh = PathBuf::from(format!("{}.new", path.display()));
    let io_error = |source| StoreError::Create { path: path.to_path_buf(), source };
    match std::fs::remove_file(&fresh) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_error(e)),
        _ => {}
    }
    {
        Store::over(&fresh, open_checked(&fresh)?).initialise()?;
    }
    std::fs::rename(&fresh, path).map_err(io_error)?;
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::File::open(parent).and_then(|d| d.sync_all()).map_err(io_error)?;
    }
    Ok(())
}

fn open_checked(path: &Path) -> Result<Database, StoreError> {
    let open_error = |source| StoreError::Open { path: path.to_path_buf(), source };
    let opened = std::panic::catch_unwind(|| -> Result<Database, redb::DatabaseError> {
        let mut db = Database::create(path)?;
        if !db.check_integrity()? {
            tracing::warn!(path = %path.display(), "the journal store was damaged and repaired to its last intact commit");
        }
        Ok(db)
    });
    match opened {
        Ok(Err(redb::DatabaseError::DatabaseAlreadyOpen)) => {
            Err(StoreError::InUse { path: path.to_path_buf() })
        }
        Ok(result) => result.map_err(open_error),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            let reason = format!("redb panicked reading it: {reason}");
            Err(StoreError::Corrupt { path: path.to_path_buf(), reason })
        }
    }
}

impl fmt::Display for JournalEntry {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "journal entry {} ({} {})", self.id, self.operation.name(), self.operation.lock_key())
    }
}

impl crate::sources::ManifestMemory for Store {
    fn recall(&self) -> std::collections::BTreeMap<String, String> {
        self.manifests().unwrap_or_else(|e| {
            tracing::warn!(error = %e, "cannot read the remembered manifests");
            Default::default()
        })
    }

    fn remember(&self, name: &str, text: Option<&str>) {
        if let Err(e) = self.remember_manifest(name, text) {
            tracing::warn!(file = name, error = %e, "cannot remember the manifest's last clean text");
        }
    }

    fn remember_all(&self, files: &[(String, Option<String>)]) {
        let files: Vec<(&str, Option<&str>)> =
            files.iter().map(|(n, t)| (n.as_str(), t.as_deref())).collect();
        if let Err(e) = self.remember_manifests(&files) {
            let names: Vec<&str> = files.iter().map(|(n, _)| *n).collect();
            tracing::warn!(files = ?names, error = %e, "cannot remember the manifests' last clean text");
        }
    }
}

/// Schema 1's unique names (the plugin's own volume name) as schema 2 writes them
/// (`<plugin>/<name>`, or `<plugin>/<pod uid>-<name>` for a volume only published); pure.
///
/// The plugin part is the record's plugin, except that every CSI driver (a plugin name without
/// `/`) files under `kubernetes.io/csi`, as kubelet names CSI volumes. A published volume is
/// node-wide when it was staged (it has a staging path) or a record of the same old name is
/// attached or staged; otherwise it is per pod.
pub fn convert_v1_names(actual: &ActualState, journal: &[JournalEntry]) -> (ActualState, Vec<JournalEntry>) {
    let node_wide: std::collections::BTreeSet<&str> =
        actual.attached.keys().chain(actual.staged.keys()).map(String::as_str).collect();
    let prefix = |plugin: &str| {
        if plugin.contains('/') { plugin.to_string() } else { "kubernetes.io/csi".to_string() }
    };
    let wide = |plugin: &str, name: &str| crate::model::unique_volume_name(&prefix(plugin), name, true, "");
    let published = |v: &PublishedVolume| {
        let unique = if v.staging_path.is_some() || node_wide.contains(v.unique_name.as_str()) {
            wide(&v.plugin, &v.unique_name)
        } else {
            crate::model::unique_volume_name(&prefix(&v.plugin), v.spec.name(), false, &v.key.pod_uid)
        };
        PublishedVolume { unique_name: unique, ..v.clone() }
    };
    let attached =
        |v: &AttachedVolume| AttachedVolume { unique_name: wide(&v.plugin, &v.unique_name), ..v.clone() };
    let staged =
        |v: &StagedVolume| StagedVolume { unique_name: wide(&v.plugin, &v.unique_name), ..v.clone() };
    let converted = ActualState {
        attached: actual.attached.values().map(attached).map(|v| (v.unique_name.clone(), v)).collect(),
        staged: actual.staged.values().map(staged).map(|v| (v.unique_name.clone(), v)).collect(),
        published: actual.published.values().map(published).map(|v| (v.key.clone(), v)).collect(),
    };
    let operation = |op: &Operation| match op {
        Operation::Unpublish { volume } => Operation::Unpublish { volume: published(volume) },
        Operation::Publish { volume, mount_options } => {
            Operation::Publish { volume: published(volume), mount_options: mount_options.clone() }
        }
        Operation::Expand { volume, new_size } => {
            Operation::Expand { volume: published(volume), new_size: *new_size }
        }
        Operation::Unstage { volume } => Operation::Unstage { volume: staged(volume) },
        Operation::Detach { volume } => Operation::Detach { volume: attached(volume) },
        Operation::Attach { unique_name, plugin, spec } => Operation::Attach {
            unique_name: wide(plugin, unique_name),
            plugin: plugin.clone(),
            spec: spec.clone(),
        },
        Operation::Stage { unique_name, plugin, spec, device_path, staging_path } => Operation::Stage {
            unique_name: wide(plugin, unique_name),
            plugin: plugin.clone(),
            spec: spec.clone(),
            device_path: device_path.clone(),
            staging_path: staging_path.clone(),
        },
    };
    let journal =
        journal.iter().map(|e| JournalEntry { operation: operation(&e.operation), ..e.clone() }).collect();
    (converted, journal)
}
