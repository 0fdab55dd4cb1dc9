//! A damaged journal: which failures to open or read it are damage (pure, [`damage`]), and the damaged file kept aside for a post-mortem so the agent starts from the node as after a lost journal.
//!
//! Damage is what no retry changes: redb finds the file corrupt (a bad checksum, a length no
//! layout has, a magic number that is not redb's, a panic while checking it), a record that
//! does not parse, a table of this schema missing, an empty file (a store is created whole, so
//! a zero-length one is a crash's leftover), a directory where the file should be. Everything
//! else is not: a lock a dying predecessor still holds (waited for), a file of another program
//! or of a newer kvol (left alone, refused), and I/O errors such as `ENOSPC`, `EROFS`, `EACCES`
//! or `EIO` (the start fails and is tried again; the file is not moved for a fault of the disk
//! under it).

use std::io::ErrorKind;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redb::{DatabaseError, StorageError};

use super::store::{Loaded, Store, StoreError};
use crate::model::ActualState;

/// How many damaged journals are kept beside the store; older ones are removed.
pub const KEPT_DAMAGED: usize = 3;

/// Why `error` means the journal file is damaged, or `None` when it does not (see the module's
/// doc). Pure.
pub fn damage(error: &StoreError) -> Option<String> {
    match error {
        StoreError::Corrupt { reason, .. } => Some(reason.clone()),
        StoreError::Record { table, key, reason, .. } => {
            Some(format!("record {key:?} of table {table} is unreadable: {reason}"))
        }
        StoreError::Open { source: DatabaseError::Storage(storage), .. } => storage_damage(storage),
        StoreError::Database { source, .. } => match source {
            redb::Error::Corrupted(reason) => Some(format!("corrupted: {reason}")),
            redb::Error::TableDoesNotExist(table) => Some(format!("its table {table} is missing")),
            redb::Error::Io(e) => io_damage(e),
            _ => None,
        },
        _ => None,
    }
}

fn storage_damage(error: &StorageError) -> Option<String> {
    match error {
        StorageError::Corrupted(reason) => Some(format!("corrupted: {reason}")),
        StorageError::Io(e) => io_damage(e),
        _ => None,
    }
}

fn io_damage(error: &std::io::Error) -> Option<String> {
    matches!(error.kind(), ErrorKind::InvalidData | ErrorKind::UnexpectedEof | ErrorKind::IsADirectory)
        .then(|| error.to_string())
}

/// The name a damaged `store_name` is kept under, beside the names `existing` in its
/// directory: `<store>.damaged-<unix seconds>`, then `.1`, `.2` … within the same second, each
/// numbered past every one of that second still there — never a lower number pruning freed,
/// which [`to_remove`] would take for the oldest and remove at once. Pure.
pub fn aside_name(store_name: &str, existing: &[String], now_secs: u64) -> String {
    let base = format!("{store_name}.damaged-{now_secs}");
    let numbers = existing.iter().filter_map(|name| match name.strip_prefix(&base)? {
        "" => Some(0),
        rest => rest.strip_prefix('.')?.parse::<u64>().ok(),
    });
    match numbers.max() {
        None => base,
        Some(last) => format!("{base}.{}", last + 1),
    }
}

/// The damaged journals among `existing` to remove so that the newest `keep` stay (by the time
/// in their name, then their number). Pure.
pub fn to_remove(store_name: &str, existing: &[String], keep: usize) -> Vec<String> {
    let prefix = format!("{store_name}.damaged-");
    let mut kept: Vec<((u64, u64), &String)> = existing
        .iter()
        .filter_map(|name| {
            let rest = name.strip_prefix(&prefix)?;
            let (secs, n) = rest.split_once('.').unwrap_or((rest, "0"));
            Some(((secs.parse().ok()?, n.parse().ok()?), name))
        })
        .collect();
    kept.sort();
    let surplus = kept.len().saturating_sub(keep);
    kept.into_iter().take(surplus).map(|(_, name)| name.clone()).collect()
}

/// A damaged journal kept aside.
#[derive(Clone, Debug, PartialEq)]
pub struct SetAside {
    pub journal: PathBuf,
    pub kept: PathBuf,
    pub reason: String,
}

impl SetAside {
    /// The line `kvol status` shows among its problems.
    pub fn problem(&self) -> String {
        format!(
            "journal {} was damaged ({}): kept as {} for a post-mortem; the actual state was rebuilt from the node",
            self.journal.display(),
            self.reason,
            self.kept.display()
        )
    }
}

/// Moves the damaged journal at `path` aside (renamed, the directory synced), removes the
/// oldest kept ones beyond [`KEPT_DAMAGED`], and says so once in the log.
pub fn set_aside(path: &Path, reason: String) -> Result<SetAside, String> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let store_name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let names = |dir: &Path| -> Vec<String> {
        std::fs::read_dir(dir)
            .map(|d| d.flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default()
    };
    let now = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let kept = dir.join(aside_name(&store_name, &names(dir), now));
    std::fs::rename(path, &kept).map_err(|e| {
        format!("cannot keep the damaged journal {} as {}: {e}", path.display(), kept.display())
    })?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| format!("cannot sync {}: {e}", dir.display()))?;
    for old in to_remove(&store_name, &names(dir), KEPT_DAMAGED) {
        let old = dir.join(old);
        let removed = if old.is_dir() { std::fs::remove_dir_all(&old) } else { std::fs::remove_file(&old) };
        if let Err(e) = removed {
            tracing::warn!(path = %old.display(), error = %e, "cannot remove an old damaged journal");
        }
    }
    tracing::warn!(journal = %path.display(), kept = %kept.display(), %reason, "the journal was damaged: kept aside; the actual state is rebuilt from the node, as after a lost journal");
    Ok(SetAside { journal: path.to_path_buf(), kept, reason })
}

/// The journal opened and read, and the damaged file it replaced, if any.
#[derive(Debug)]
pub struct Opened {
    pub store: Store,
    pub loaded: Loaded,
    pub set_aside: Option<SetAside>,
}

/// Opens and reads the journal at `path`, waiting up to `lock_wait` for a lock a dying
/// predecessor's child still holds. A damaged file (see [`damage`]) is kept aside once and a
/// new journal started; any other failure is an error naming the path.
pub async fn open_journal(path: &Path, lock_wait: Duration) -> Result<Opened, String> {
    let mut aside = None;
    let is_empty = std::fs::symlink_metadata(path).is_ok_and(|m| m.is_file() && m.len() == 0);
    if is_empty {
        aside = Some(set_aside(path, "it is empty (0 bytes)".to_string())?);
    }
    loop {
        let failed = match open_waiting(path, lock_wait).await {
            Ok(store) => match store.load() {
                Ok(loaded) => return Ok(Opened { store, loaded, set_aside: aside }),
                Err(e) => e,
            },
            Err(e) => e,
        };
        match damage(&failed) {
            Some(reason) if aside.is_none() => aside = Some(set_aside(path, reason)?),
            _ => return Err(failed.to_string()),
        }
    }
}

/// Writes the rebuilt `actual` as the journal's whole state; should the journal prove damaged
/// only now (and was not set aside already), it is kept aside and a new one written.
pub fn record_rebuilt(
    store: Store,
    aside: Option<SetAside>,
    actual: &ActualState,
) -> Result<(Store, Option<SetAside>), String> {
    let failed = match store.replace_actual(actual) {
        Ok(()) => return Ok((store, aside)),
        Err(e) => e,
    };
    let reason = match damage(&failed) {
        Some(reason) if aside.is_none() => reason,
        _ => return Err(failed.to_string()),
    };
    let path = store.path().to_path_buf();
    drop(store);
    let aside = set_aside(&path, reason)?;
    let store = Store::open(&path).map_err(|e| e.to_string())?;
    store.replace_actual(actual).map_err(|e| e.to_string())?;
    Ok((store, Some(aside)))
}

/// [`Store::open`], again every 50 ms while another process holds the lock, for `lock_wait`.
async fn open_waiting(path: &Path, lock_wait: Duration) -> Result<Store, StoreError> {
    let deadline = Instant::now() + lock_wait;
    loop {
        match Store::open(path) {
            Err(StoreError::InUse { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn path() -> PathBuf {
        PathBuf::from("/var/lib/kvol/state.redb")
    }

    fn io(kind: ErrorKind) -> std::io::Error {
        std::io::Error::new(kind, format!("{kind:?}"))
    }

    #[test]
    fn which_failures_are_damage() {
        let open = |source| StoreError::Open { path: path(), source };
        let db = |source| StoreError::Database { path: path(), source };
        // (failure, damage?)
        let table: Vec<(StoreError, bool)> = vec![
            (open(DatabaseError::Storage(StorageError::Corrupted("file truncated".into()))), true),
            (open(DatabaseError::Storage(StorageError::Io(io(ErrorKind::InvalidData)))), true),
            (open(DatabaseError::Storage(StorageError::Io(io(ErrorKind::UnexpectedEof)))), true),
            (open(DatabaseError::Storage(StorageError::Io(io(ErrorKind::IsADirectory)))), true),
            (StoreError::Corrupt { path: path(), reason: "redb panicked reading it".into() }, true),
            (
                StoreError::Record {
                    path: path(),
                    table: "published",
                    key: "p/v".into(),
                    reason: "expected value".into(),
                },
                true,
            ),
            (db(redb::Error::Corrupted("bad checksum".into())), true),
            (db(redb::Error::TableDoesNotExist("journal".into())), true),
            (db(redb::Error::Io(io(ErrorKind::UnexpectedEof))), true),
            // A predecessor's lock: waited for, never damage.
            (StoreError::InUse { path: path() }, false),
            (open(DatabaseError::DatabaseAlreadyOpen), false),
            // The disk, not the file: tried again, the file left where it is.
            (open(DatabaseError::Storage(StorageError::Io(io(ErrorKind::StorageFull)))), false),
            (open(DatabaseError::Storage(StorageError::Io(io(ErrorKind::ReadOnlyFilesystem)))), false),
            (open(DatabaseError::Storage(StorageError::Io(io(ErrorKind::PermissionDenied)))), false),
            (open(DatabaseError::Storage(StorageError::Io(std::io::Error::from_raw_os_error(5)))), false),
            (db(redb::Error::Io(io(ErrorKind::StorageFull))), false),
            (db(redb::Error::PreviousIo), false),
            (open(DatabaseError::RepairAborted), false),
            (open(DatabaseError::UpgradeRequired(2)), false),
            (StoreError::Create { path: path(), source: io(ErrorKind::ReadOnlyFilesystem) }, false),
            // Another program's data, or a newer kvol's: refused, left alone.
            (StoreError::Foreign { path: path(), reason: "it has a table \"counters\"".into() }, false),
            (StoreError::Foreign { path: path(), reason: "it has schema version 3".into() }, false),
            (StoreError::Closed, false),
        ];
        for (failure, want) in table {
            assert_eq!(damage(&failure).is_some(), want, "{failure:?}");
        }
    }

    #[test]
    fn damaged_journals_are_named_by_time_and_only_the_newest_kept() {
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        // (existing, now, the new name)
        let naming: [(&[&str], u64, &str); 4] = [
            (&["state.redb"], 100, "state.redb.damaged-100"),
            (&["state.redb", "state.redb.damaged-100"], 100, "state.redb.damaged-100.1"),
            (&["state.redb.damaged-100", "state.redb.damaged-100.1"], 100, "state.redb.damaged-100.2"),
            // The oldest of the second pruned: the next is still numbered past the newest.
            (&["state.redb.damaged-100.1", "state.redb.damaged-100.2"], 100, "state.redb.damaged-100.3"),
        ];
        for (existing, now, want) in naming {
            assert_eq!(aside_name("state.redb", &names(existing), now), want, "{existing:?}");
        }
        // (existing, keep, removed)
        let pruning: [(&[&str], usize, &[&str]); 4] = [
            (&["state.redb", "state.redb.damaged-5"], 3, &[]),
            (
                &[
                    "state.redb.damaged-900",
                    "state.redb.damaged-1000",
                    "state.redb.damaged-80",
                    "state.redb.damaged-1000.1",
                ],
                3,
                &["state.redb.damaged-80"],
            ),
            (
                &["state.redb.damaged-9", "state.redb.damaged-9.1", "state.redb.damaged-10"],
                1,
                &["state.redb.damaged-9", "state.redb.damaged-9.1"],
            ),
            // Not ours: another store's, or a name that is not a time.
            (&["other.redb.damaged-1", "state.redb.damaged-x", "state.redb.new"], 0, &[]),
        ];
        for (existing, keep, want) in pruning {
            assert_eq!(to_remove("state.redb", &names(existing), keep), names(want), "{existing:?}");
        }
    }
}
