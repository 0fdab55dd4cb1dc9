//! The journal store on a real redb file, and the node observation on a real tree with a real bind mount (that test needs root, as kvol does).

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use kvol_node::actual::observe::{PodVolumeDir, observe};
use kvol_node::actual::rebuild::{clear_orphan, rebuild};
use kvol_node::actual::store::{
    ActualChange, GroupCommit, JournalDone, JournalEntry, JournalWrite, Loaded, Store, StoreError,
};
use kvol_node::{ActualState, AttachedVolume, Operation, PodVolumeKey, PublishedVolume, StagedVolume};
use kvol_plugin::plugin::PodInfo;
use kvol_plugin::testing::{csi_pv, inline_empty_dir};
use kvol_plugin::{Mounter, NodePaths, SystemMounter};
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

const CSI: &str = "kubernetes.io/csi";
const EMPTY_DIR: &str = "kubernetes.io/empty-dir";

fn attached(unique: &str, device: Option<&str>) -> AttachedVolume {
    AttachedVolume {
        unique_name: unique.into(),
        plugin: CSI.into(),
        spec: csi_pv(unique, "d.csi"),
        device_path: device.map(str::to_string),
        uncertain: false,
    }
}

fn staged(unique: &str) -> StagedVolume {
    StagedVolume {
        unique_name: unique.into(),
        plugin: CSI.into(),
        spec: csi_pv(unique, "d.csi"),
        staging_path: PathBuf::from(format!("/k/plugins/kubernetes.io/csi/d.csi/{unique}/globalmount")),
        device_path: Some("/dev/sdb".into()),
        uncertain: false,
    }
}

fn published_at(paths: &NodePaths, pod: &str, plugin: &str, volume: &str) -> PublishedVolume {
    let spec = if plugin == EMPTY_DIR { inline_empty_dir(volume) } else { csi_pv(volume, "d.csi") };
    PublishedVolume {
        projection: None,
        fs_size: None,
        expansion_deferred: None,
        key: PodVolumeKey { pod_uid: pod.into(), volume: volume.into() },
        pod: PodInfo { uid: pod.into(), name: pod.into(), namespace: "ns".into(), ..PodInfo::default() },
        pod_name: format!("ns/{pod}"),
        unique_name: volume.into(),
        plugin: plugin.into(),
        spec,
        target: paths.pod_volume_dir(pod, plugin, volume).unwrap(),
        staging_path: None,
        device_path: None,
        uncertain: false,
    }
}

fn published(pod: &str, volume: &str) -> PublishedVolume {
    published_at(&NodePaths::new("/k"), pod, CSI, volume)
}

fn attach(unique: &str) -> Operation {
    Operation::Attach { unique_name: unique.into(), plugin: CSI.into(), spec: csi_pv(unique, "d.csi") }
}

fn now_ms() -> u64 {
    u64::try_from(SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis()).unwrap()
}

/// The ids and operations of the unfinished entries.
fn journal(loaded: &Loaded) -> Vec<(u64, Operation)> {
    loaded.incomplete.iter().map(|e| (e.id, e.operation.clone())).collect()
}

#[test]
fn the_store_is_shareable_between_threads() {
    fn shared<T: Send + Sync>() {}
    shared::<Store>();
}

#[test]
fn open_creates_the_file_and_its_directory_and_starts_empty() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("state/kvol/agent.redb");
    let store = Store::open(&path).unwrap();
    assert!(path.is_file(), "the store file exists");
    assert_eq!(store.load().unwrap(), Loaded::default());
    assert_eq!(store.actual().unwrap(), ActualState::default());
}

#[test]
fn a_store_open_elsewhere_is_in_use_and_opens_once_released() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("agent.redb");
    let first = Store::open(&path).unwrap();
    let error = Store::open(&path).unwrap_err();
    assert!(matches!(error, StoreError::InUse { .. }), "{error:?}");
    let text = error.to_string();
    assert!(text.contains(&path.display().to_string()) && text.contains("in use"), "{text}");
    drop(first);
    Store::open(&path).expect("free again once the holder closes it");
}

#[test]
fn every_change_round_trips_through_begin_and_finish() {
    let dir = kvol_test_support::ScratchRoot::new();
    let store = Store::open(&dir.path().join("agent.redb")).unwrap();
    let p1 = published("p1", "v1");
    // (the operation, the change its finish applies, the actual state after it)
    let steps: Vec<(Operation, ActualChange, ActualState)> = {
        let mut state = ActualState::default();
        let mut steps = Vec::new();
        let mut step = |op: Operation, change: ActualChange, edit: &dyn Fn(&mut ActualState)| {
            edit(&mut state);
            steps.push((op, change, state.clone()));
        };
        step(attach("v1"), ActualChange::SetAttached(attached("v1", Some("/dev/sdb"))), &|s| {
            s.attached.insert("v1".into(), attached("v1", Some("/dev/sdb")));
        });
        let stage = Operation::Stage {
            unique_name: "v1".into(),
            plugin: CSI.into(),
            spec: csi_pv("v1", "d.csi"),
            device_path: Some("/dev/sdb".into()),
            staging_path: staged("v1").staging_path,
        };
        step(stage, ActualChange::SetStaged(staged("v1")), &|s| {
            s.staged.insert("v1".into(), staged("v1"));
        });
        let publish = Operation::Publish { volume: p1.clone(), mount_options: vec!["noatime".into()] };
        step(publish.clone(), ActualChange::SetPublished(p1.clone()), &|s| {
            s.published.insert(p1.key.clone(), p1.clone());
        });
        // A failed operation changes nothing but still leaves the journal.
        step(publish, ActualChange::Nothing, &|_| {});
        step(
            Operation::Unpublish { volume: p1.clone() },
            ActualChange::RemovePublished(p1.key.clone()),
            &|s| {
                s.published.clear();
            },
        );
        step(Operation::Unstage { volume: staged("v1") }, ActualChange::RemoveStaged("v1".into()), &|s| {
            s.staged.clear();
        });
        step(
            Operation::Detach { volume: attached("v1", Some("/dev/sdb")) },
            ActualChange::RemoveAttached("v1".into()),
            &|s| s.attached.clear(),
        );
        steps
    };
    let mut last_id = 0;
    for (op, change, want) in steps {
        let before = now_ms();
        let id = store.begin(&op).unwrap();
        assert!(id > last_id, "ids rise: {id} after {last_id}");
        last_id = id;
        let loaded = store.load().unwrap();
        assert_eq!(loaded.incomplete.len(), 1, "{}: one entry under way", op.name());
        let entry = &loaded.incomplete[0];
        assert_eq!((entry.id, &entry.operation), (id, &op));
        assert!((before..=now_ms()).contains(&entry.started_unix_ms), "{}: start time", op.name());
        store.finish(id, &change).unwrap();
        let loaded = store.load().unwrap();
        assert_eq!(loaded.incomplete, vec![], "{}: journal empty after finish", op.name());
        assert_eq!(loaded.actual, want, "{}: {change:?} applied", op.name());
        assert_eq!(store.actual().unwrap(), want);
    }
}

#[test]
fn a_reopened_store_shows_the_same_state_and_the_unfinished_entries() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("agent.redb");
    let unpublish = Operation::Unpublish { volume: published("p1", "v3") };
    // Each session drops the store with operations under way: a crash mid-operation.
    let (before, second, third) = {
        let store = Store::open(&path).unwrap();
        let first = store.begin(&attach("v1")).unwrap();
        let second = store.begin(&attach("v2")).unwrap();
        let third = store.begin(&unpublish).unwrap();
        store.finish(first, &ActualChange::SetAttached(attached("v1", Some("/dev/sdb")))).unwrap();
        (store.load().unwrap(), second, third)
    };
    assert_eq!(journal(&before), vec![(second, attach("v2")), (third, unpublish.clone())]);
    let before = {
        let store = Store::open(&path).unwrap();
        assert_eq!(store.load().unwrap(), before, "state and unfinished entries survive a restart");
        let fourth = store.begin(&attach("v4")).unwrap();
        assert!(fourth > third, "ids keep rising across restarts");
        store.finish(fourth, &ActualChange::SetAttached(attached("v4", None))).unwrap();
        store.load().unwrap()
    };
    let after = Store::open(&path).unwrap().load().unwrap();
    assert_eq!(after, before, "the state survives a second restart");
    assert_eq!(journal(&after), vec![(second, attach("v2")), (third, unpublish)]);
    let attached_now: Vec<&AttachedVolume> = after.actual.attached.values().collect();
    assert_eq!(
        attached_now,
        [&attached("v1", Some("/dev/sdb")), &attached("v4", None)],
        "finished changes are durable"
    );
}

#[test]
fn unfinished_entries_come_back_in_the_order_they_began() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("agent.redb");
    let ops: Vec<Operation> = (0..12).map(|i| attach(&format!("v{i}"))).collect();
    let ids: Vec<u64> = {
        let store = Store::open(&path).unwrap();
        let ids: Vec<u64> = ops.iter().map(|op| store.begin(op).unwrap()).collect();
        // Finish every third: the rest stay under way.
        for id in ids.iter().step_by(3) {
            store.finish(*id, &ActualChange::Nothing).unwrap();
        }
        ids
    };
    let loaded = Store::open(&path).unwrap().load().unwrap();
    let want: Vec<(u64, Operation)> = ids
        .iter()
        .zip(&ops)
        .enumerate()
        .filter(|(i, _)| i % 3 != 0)
        .map(|(_, (id, op))| (*id, op.clone()))
        .collect();
    assert_eq!(journal(&loaded), want);
}

#[test]
fn finish_removes_the_entry_and_applies_the_change_together() {
    let dir = kvol_test_support::ScratchRoot::new();
    let store = Arc::new(Store::open(&dir.path().join("agent.redb")).unwrap());

    // An unknown id is refused and changes nothing.
    let id = store.begin(&attach("v0")).unwrap();
    let err = store.finish(id + 100, &ActualChange::SetAttached(attached("v0", None))).unwrap_err();
    assert!(matches!(err, StoreError::UnknownEntry { .. }), "{err:?}");
    assert!(err.to_string().contains("agent.redb"), "{err}");
    let loaded = store.load().unwrap();
    assert_eq!(journal(&loaded), vec![(id, attach("v0"))], "the entry is still there");
    assert!(loaded.actual.attached.is_empty(), "the refused change was not applied");
    store.finish(id, &ActualChange::Nothing).unwrap();
    let err = store.finish(id, &ActualChange::SetAttached(attached("v0", None))).unwrap_err();
    assert!(matches!(err, StoreError::UnknownEntry { .. }), "finishing twice is refused: {err:?}");
    assert!(store.actual().unwrap().attached.is_empty());

    // Watched from another thread, every volume begun is either journaled or attached, never
    // both and never neither (which two transactions would show between their commits).
    let volumes = 60;
    let begun = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (store, begun, done) = (Arc::clone(&store), Arc::clone(&begun), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut snapshots = 0;
            while !done.load(Ordering::Acquire) {
                let at_least = begun.load(Ordering::Acquire);
                let loaded = store.load().unwrap();
                let journaled: BTreeSet<String> = loaded
                    .incomplete
                    .iter()
                    .map(|e| match &e.operation {
                        Operation::Attach { unique_name, .. } => unique_name.clone(),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                let recorded: BTreeSet<String> = loaded.actual.attached.keys().cloned().collect();
                assert!(
                    journaled.is_disjoint(&recorded),
                    "both journaled and recorded: {journaled:?} {recorded:?}"
                );
                for i in 0..at_least {
                    let name = format!("w{i:03}");
                    assert!(
                        journaled.contains(&name) || recorded.contains(&name),
                        "{name} neither journaled nor recorded"
                    );
                }
                snapshots += 1;
            }
            snapshots
        })
    };
    for i in 0..volumes {
        let name = format!("w{i:03}");
        let id = store.begin(&attach(&name)).unwrap();
        begun.store(i + 1, Ordering::Release);
        store.finish(id, &ActualChange::SetAttached(attached(&name, Some("/dev/sdc")))).unwrap();
    }
    done.store(true, Ordering::Release);
    let snapshots = watcher.join().expect("the watcher saw only consistent snapshots");
    println!("finish atomicity: {snapshots} snapshots checked");
    assert!(snapshots > 0);
    assert_eq!(store.actual().unwrap().attached.len(), volumes);
}

#[test]
fn replace_actual_replaces_everything_and_empties_the_journal() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("agent.redb");
    let store = Store::open(&path).unwrap();
    let id = store.begin(&attach("old")).unwrap();
    store.finish(id, &ActualChange::SetAttached(attached("old", Some("/dev/sda")))).unwrap();
    let id =
        store.begin(&Operation::Publish { volume: published("p0", "old"), mount_options: vec![] }).unwrap();
    store.finish(id, &ActualChange::SetPublished(published("p0", "old"))).unwrap();
    let last = store.begin(&attach("v1")).unwrap();
    store.begin(&Operation::Unstage { volume: staged("v9") }).unwrap();
    assert_eq!(store.load().unwrap().incomplete.len(), 2);

    let mut new = ActualState::default();
    new.attached.insert("v1".into(), attached("v1", None));
    new.staged.insert("v2".into(), staged("v2"));
    for p in [published("p1", "v2"), published("p2", "v2")] {
        new.published.insert(p.key.clone(), p);
    }
    store.replace_actual(&new).unwrap();
    let want = Loaded { actual: new.clone(), incomplete: vec![] };
    assert_eq!(store.load().unwrap(), want);
    drop(store);
    let store = Store::open(&path).unwrap();
    assert_eq!(store.load().unwrap(), want, "durable");
    assert!(store.begin(&attach("v3")).unwrap() > last, "ids are not reused after the journal was emptied");
    store.replace_actual(&ActualState::default()).unwrap();
    assert_eq!(store.load().unwrap(), Loaded::default());
}

/// Opens `path`, expecting an error whose message names it; returns the message.
fn open_error(path: &Path) -> String {
    let err = Store::open(path).expect_err("not a kvol store");
    let message = err.to_string();
    assert!(message.contains(&path.display().to_string()), "{message}");
    message
}

#[test]
fn a_corrupt_or_foreign_file_is_refused_and_left_alone() {
    let dir = kvol_test_support::ScratchRoot::new();
    // (file name, contents)
    let not_redb: [(&str, Vec<u8>); 3] = [
        ("text.redb", b"{\"attached\": {}}\n".to_vec()),
        ("noise.redb", (0..65536u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect()),
        ("zeros.redb", vec![0; 8192]),
    ];
    for (name, bytes) in not_redb {
        let path = dir.path().join(name);
        fs::write(&path, &bytes).unwrap();
        let message = open_error(&path);
        println!("{name}: {message}");
        assert_eq!(fs::read(&path).unwrap(), bytes, "{name} was not modified");
    }

    // A directory where the file should be.
    let path = dir.path().join("a-directory");
    fs::create_dir(&path).unwrap();
    open_error(&path);

    // Another program's redb database.
    let path = dir.path().join("other.redb");
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("counters")).unwrap().insert("x", 1).unwrap();
        txn.commit().unwrap();
    }
    let message = open_error(&path);
    assert!(message.contains("not a kvol store") && message.contains("counters"), "{message}");

    // A kvol store of another schema version.
    let path = dir.path().join("future.redb");
    drop(Store::open(&path).unwrap());
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<&str, u64>::new("meta")).unwrap().insert("schema", 3).unwrap();
        txn.commit().unwrap();
    }
    let message = open_error(&path);
    assert!(message.contains("schema version 3"), "{message}");
}

#[test]
fn a_damaged_store_is_refused_at_open() {
    let dir = kvol_test_support::ScratchRoot::new();
    type Damage = fn(&mut Vec<u8>);
    // (damage, what it does to the file's bytes)
    let damages: [(&str, Damage); 4] = [
        ("truncated-to-half", |b| b.truncate(b.len() / 2)),
        ("truncated-to-100-bytes", |b| b.truncate(100)),
        ("header-scrambled", |b| b[64..512].iter_mut().for_each(|x| *x ^= 0x5a)),
        ("pages-scrambled", |b| b[4096..].iter_mut().for_each(|x| *x ^= 0xff)),
    ];
    for (damage, apply) in damages {
        let path = dir.path().join(format!("{damage}.redb"));
        {
            let store = Store::open(&path).unwrap();
            for i in 0..50 {
                let name = format!("v{i}");
                let id = store.begin(&attach(&name)).unwrap();
                store.finish(id, &ActualChange::SetAttached(attached(&name, Some("/dev/sdb")))).unwrap();
            }
        }
        let mut bytes = fs::read(&path).unwrap();
        apply(&mut bytes);
        fs::write(&path, &bytes).unwrap();
        let message = open_error(&path);
        println!("{damage}: {message}");
    }
}

#[test]
fn an_unreadable_record_is_an_error_naming_the_store_table_and_key() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("agent.redb");
    let store = Store::open(&path).unwrap();
    let id = store.begin(&attach("v1")).unwrap();
    store.finish(id, &ActualChange::SetAttached(attached("v1", None))).unwrap();
    drop(store);
    // (table, key, value written behind the store's back, a phrase of the message)
    let text_table = redb::TableDefinition::<&str, &str>::new("attached");
    let rows: [(&str, &str, &str); 2] = [
        ("v1", "{not json", "record \"v1\" of table attached"),
        (
            "v1",
            &{
                let mut other = serde_json::to_value(attached("v2", None)).unwrap();
                other["uniqueName"] = "v2".into();
                other.to_string()
            },
            "it names v2",
        ),
    ];
    for (key, value, phrase) in rows {
        {
            let db = redb::Database::create(&path).unwrap();
            let txn = db.begin_write().unwrap();
            txn.open_table(text_table).unwrap().insert(key, value).unwrap();
            txn.commit().unwrap();
        }
        let store = Store::open(&path).unwrap();
        for err in [store.load().unwrap_err(), store.actual().unwrap_err()] {
            let message = err.to_string();
            assert!(matches!(err, StoreError::Record { .. }), "{err:?}");
            assert!(message.contains(&path.display().to_string()) && message.contains(phrase), "{message}");
        }
    }

    // A journal entry that is not an operation.
    let path = dir.path().join("journal.redb");
    drop(Store::open(&path).unwrap());
    {
        let db = redb::Database::create(&path).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(redb::TableDefinition::<u64, &str>::new("journal"))
            .unwrap()
            .insert(3, r#"{"operation":{"op":"explode"},"startedUnixMs":1}"#)
            .unwrap();
        txn.commit().unwrap();
    }
    let message = Store::open(&path).unwrap().load().unwrap_err().to_string();
    assert!(
        message.contains("record \"3\" of table journal") && message.contains("journal.redb"),
        "{message}"
    );
}

#[test]
fn begin_and_finish_timing() {
    let dir = kvol_test_support::ScratchRoot::new();
    let store = Store::open(&dir.path().join("agent.redb")).unwrap();
    let iterations = 200;
    let volume = published("p1", "v1");
    let publish = Operation::Publish { volume: volume.clone(), mount_options: vec![] };
    let mut worst = Duration::ZERO;
    let start = Instant::now();
    for _ in 0..iterations {
        let one = Instant::now();
        let id = store.begin(&publish).unwrap();
        store.finish(id, &ActualChange::SetPublished(volume.clone())).unwrap();
        worst = worst.max(one.elapsed());
    }
    let total = start.elapsed();
    println!(
        "begin+finish: {iterations} pairs in {total:?}, {:?} per pair, worst {worst:?} (two durable commits each, on {})",
        total / iterations,
        dir.path().display()
    );
    assert_eq!(store.load().unwrap().incomplete, Vec::<JournalEntry>::new());
}

#[test]
fn a_group_of_writes_is_answered_in_order_and_a_bad_write_costs_the_others_nothing() {
    let dir = kvol_test_support::ScratchRoot::new();
    let store = Store::open(&dir.path().join("agent.redb")).unwrap();
    let first = store.begin(&attach("a")).unwrap();
    let good = [
        JournalWrite::Begin(attach("b")),
        JournalWrite::Finish(first, ActualChange::SetAttached(attached("a", None))),
        JournalWrite::Begin(attach("c")),
    ];
    let done: Vec<JournalDone> = store.write_group(&good).into_iter().map(Result::unwrap).collect();
    assert_eq!(done, [JournalDone::Began(first + 1), JournalDone::Finished, JournalDone::Began(first + 2)]);
    let loaded = store.load().unwrap();
    assert_eq!(journal(&loaded), [(first + 1, attach("b")), (first + 2, attach("c"))]);
    assert!(loaded.actual.attached.contains_key("a"));

    // An entry that does not exist: that write fails alone, the others are kept.
    let mixed = [
        JournalWrite::Finish(first + 1, ActualChange::SetAttached(attached("b", None))),
        JournalWrite::Finish(999, ActualChange::SetAttached(attached("ghost", None))),
        JournalWrite::Finish(first + 2, ActualChange::Nothing),
    ];
    let results = store.write_group(&mixed);
    assert!(matches!(results[0], Ok(JournalDone::Finished)), "{results:?}");
    assert!(matches!(results[1], Err(StoreError::UnknownEntry { id: 999, .. })), "{results:?}");
    assert!(matches!(results[2], Ok(JournalDone::Finished)), "{results:?}");
    let loaded = store.load().unwrap();
    assert!(loaded.incomplete.is_empty(), "{:?}", loaded.incomplete);
    let names: Vec<&String> = loaded.actual.attached.keys().collect();
    assert_eq!(names, ["a", "b"], "the ghost's change was not applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_made_at_once_through_the_group_commit_are_all_durable() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("agent.redb");
    let store = Arc::new(Store::open(&path).unwrap());
    let journal = GroupCommit::start(Arc::clone(&store));
    let started = Instant::now();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..50 {
        let journal = journal.clone();
        tasks.spawn(async move {
            let unique = format!("v{i}");
            let id = journal.begin(&attach(&unique)).await.unwrap();
            journal.finish(id, &ActualChange::SetAttached(attached(&unique, None))).await.unwrap();
            id
        });
    }
    let mut ids = BTreeSet::new();
    while let Some(id) = tasks.join_next().await {
        assert!(ids.insert(id.unwrap()), "every entry has its own id");
    }
    let grouped = started.elapsed();
    drop(journal);
    let loaded = store.load().unwrap();
    assert!(loaded.incomplete.is_empty(), "{:?}", loaded.incomplete);
    assert_eq!(loaded.actual.attached.len(), 50);
    let started = Instant::now();
    for i in 0..50 {
        let id = store.begin(&attach(&format!("w{i}"))).unwrap();
        store.finish(id, &ActualChange::Nothing).unwrap();
    }
    println!(
        "50 operations begun and finished at once: {grouped:?} through the group commit, {:?} one commit each",
        started.elapsed()
    );
}

/// Unmounts whatever is left below `root` when dropped, so a failing test never leaves a
/// mount for the temporary directory's removal to reach through.
struct UnmountBelow(PathBuf);

impl Drop for UnmountBelow {
    fn drop(&mut self) {
        if let Ok(mounts) = SystemMounter.mounts_under(&self.0) {
            for m in mounts.iter().rev() {
                let _ = nix::mount::umount2(&m.target, MntFlags::MNT_DETACH);
            }
        }
    }
}

#[test]
fn observe_sees_the_real_mount_table_and_pod_volume_directories() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (this test needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");

    let tmp = kvol_test_support::ScratchRoot::new();
    let root = fs::canonicalize(tmp.path()).unwrap();
    let _guard = UnmountBelow(root.clone());
    let paths = NodePaths::new(root.join("kubelet"));

    // No pods directory yet: nothing to see, no error.
    let empty = observe(&paths, &SystemMounter).unwrap();
    assert!(empty.pod_volume_dirs.is_empty());
    assert!(!empty.mount_points.iter().any(|m| m.starts_with(&root)));

    let csi_data = paths.pod_volume_dir("u1", CSI, "data").unwrap();
    let csi_gone = paths.pod_volume_dir("u1", CSI, "gone").unwrap();
    let cache = paths.pod_volume_dir("u1", EMPTY_DIR, "cache").unwrap();
    let stray = paths.pod_volume_dir("u2", CSI, "stray").unwrap();
    for dir in [csi_data.join("mount"), csi_gone.clone(), cache.clone(), stray.clone()] {
        fs::create_dir_all(dir).unwrap();
    }
    fs::create_dir_all(paths.pod_dir("u3").unwrap()).unwrap(); // a pod without volumes
    fs::create_dir_all(paths.pod_dir("u5").unwrap().join("volumes")).unwrap(); // no plugins yet
    fs::write(paths.root().join("pods/not-a-pod"), b"").unwrap();
    // A link is not followed out of the tree.
    let elsewhere = root.join("elsewhere/volumes/kubernetes.io~csi/secret");
    fs::create_dir_all(&elsewhere).unwrap();
    std::os::unix::fs::symlink(root.join("elsewhere"), paths.pod_dir("u4").unwrap()).unwrap();
    let source = root.join("disk");
    fs::create_dir(&source).unwrap();
    SystemMounter.bind(&source, &csi_data.join("mount"), false).unwrap();

    let seen = observe(&paths, &SystemMounter).unwrap();
    let ours: BTreeSet<PathBuf> =
        seen.mount_points.iter().filter(|m| m.starts_with(&root)).cloned().collect();
    assert_eq!(ours, BTreeSet::from([csi_data.join("mount")]));
    let dir = |pod: &str, plugin: &str, volume: &str, path: &Path| PodVolumeDir {
        pod_uid: pod.into(),
        plugin_dir: plugin.into(),
        volume: volume.into(),
        path: path.to_path_buf(),
    };
    assert_eq!(
        seen.pod_volume_dirs,
        vec![
            dir("u1", "kubernetes.io~csi", "data", &csi_data),
            dir("u1", "kubernetes.io~csi", "gone", &csi_gone),
            dir("u1", "kubernetes.io~empty-dir", "cache", &cache),
            dir("u2", "kubernetes.io~csi", "stray", &stray),
        ]
    );

    // What a restart makes of it.
    let mut stored = ActualState::default();
    for p in [
        published_at(&paths, "u1", CSI, "data"),
        published_at(&paths, "u1", CSI, "gone"),
        published_at(&paths, "u1", EMPTY_DIR, "cache"),
    ] {
        stored.published.insert(p.key.clone(), p);
    }
    let rebuilt = rebuild(&stored, &[], &seen);
    let kept: Vec<String> = certain(&rebuilt.actual);
    assert_eq!(kept, ["u1/cache", "u1/data"], "notes: {:?}", rebuilt.notes);
    assert!(
        rebuilt.actual.published[&PodVolumeKey { pod_uid: "u1".into(), volume: "gone".into() }].uncertain
    );
    assert!(
        rebuilt.notes.iter().any(|n| n.contains("u1/gone") && n.contains("mount gone")),
        "{:?}",
        rebuilt.notes
    );
    let orphans: Vec<&Path> = rebuilt.orphans.iter().map(|o| o.path.as_path()).collect();
    assert_eq!(orphans, [stray.as_path()], "the uncertain record accounts for its directory");

    // The mount goes away behind the agent's back: the record becomes uncertain on the next
    // rebuild (published again if wanted, torn down if not).
    SystemMounter.unmount(&csi_data.join("mount")).unwrap();
    let seen = observe(&paths, &SystemMounter).unwrap();
    assert!(!seen.mount_points.iter().any(|m| m.starts_with(&root)));
    let rebuilt = rebuild(&stored, &[], &seen);
    assert_eq!(certain(&rebuilt.actual), ["u1/cache"]);
}

/// The published records that are not uncertain, as `uid/volume`.
fn certain(actual: &ActualState) -> Vec<String> {
    actual.published.iter().filter(|(_, p)| !p.uncertain).map(|(k, _)| k.to_string()).collect()
}

/// Orphans are cleared only when empty and unmounted, with their empty parents; any other is
/// left with the reason, and no data is ever deleted.
#[test]
fn only_empty_unmounted_orphans_are_cleared() {
    nix::sched::unshare(CloneFlags::CLONE_NEWNS).expect("unshare the mount namespace (this test needs root)");
    nix::mount::mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)
        .expect("make every mount private");
    let tmp = kvol_test_support::ScratchRoot::new();
    let root = fs::canonicalize(tmp.path()).unwrap();
    let _guard = UnmountBelow(root.clone());
    let paths = NodePaths::new(root.join("kubelet"));
    let empty = paths.pod_volume_dir("u1", CSI, "empty").unwrap();
    let with_data = paths.pod_volume_dir("u2", EMPTY_DIR, "cache").unwrap();
    let mounted = paths.pod_volume_dir("u3", CSI, "busy").unwrap();
    let half_written = paths.pod_volume_dir("u4", CSI, "half").unwrap();
    for dir in [&empty, &with_data, &mounted.join("mount"), &half_written] {
        fs::create_dir_all(dir).unwrap();
    }
    fs::write(with_data.join("kept"), b"data").unwrap();
    // A kill between writing a CSI record's temporary copy and renaming it.
    fs::write(half_written.join(".vol_data.json.4242.tmp"), b"{\"driverName\":").unwrap();
    fs::write(with_data.join(".vol_data.json.not-a-pid.tmp"), b"not kvol's").unwrap();
    let source = root.join("disk");
    fs::create_dir(&source).unwrap();
    SystemMounter.bind(&source, &mounted.join("mount"), false).unwrap();

    let seen = observe(&paths, &SystemMounter).unwrap();
    let rebuilt = rebuild(&ActualState::default(), &[], &seen);
    assert_eq!(rebuilt.orphans.len(), 4, "{:?}", rebuilt.orphans);
    let outcomes: Vec<(String, Option<String>)> =
        rebuilt.orphans.iter().map(|o| (o.volume.clone(), clear_orphan(o, &seen.mount_points))).collect();
    for (volume, outcome) in &outcomes {
        match volume.as_str() {
            "empty" | "half" => assert_eq!(outcome, &None, "{volume}"),
            "cache" => assert!(outcome.as_deref().is_some_and(|r| r.contains("is not empty")), "{outcome:?}"),
            "busy" => {
                assert!(outcome.as_deref().is_some_and(|r| r.contains("mounted at or below")), "{outcome:?}")
            }
            other => panic!("unexpected orphan {other}"),
        }
    }
    assert!(!paths.pod_dir("u1").unwrap().exists(), "the empty orphan and its empty parents are gone");
    assert!(!paths.pod_dir("u4").unwrap().exists(), "a half-written record is kvol's own: cleared");
    assert_eq!(fs::read(with_data.join("kept")).unwrap(), b"data");
    assert!(with_data.join(".vol_data.json.not-a-pid.tmp").exists(), "only kvol's own names are removed");
    assert!(SystemMounter.is_mount_point(&mounted.join("mount")).unwrap());
    SystemMounter.unmount(&mounted.join("mount")).unwrap();
}

/// Writes a schema 1 store by hand: unique names without their plugin, as kvol wrote them
/// before unique names carried it.
fn write_v1_store(path: &Path, actual: &ActualState, journal: &[(u64, Operation)]) {
    use redb::TableDefinition;
    let db = redb::Database::create(path).unwrap();
    let txn = db.begin_write().unwrap();
    {
        let mut meta = txn.open_table(TableDefinition::<&str, u64>::new("meta")).unwrap();
        meta.insert("schema", 1).unwrap();
        meta.insert("next_journal_id", 10).unwrap();
        let mut attached = txn.open_table(TableDefinition::<&str, &str>::new("attached")).unwrap();
        for v in actual.attached.values() {
            attached.insert(v.unique_name.as_str(), serde_json::to_string(v).unwrap().as_str()).unwrap();
        }
        let mut staged = txn.open_table(TableDefinition::<&str, &str>::new("staged")).unwrap();
        for v in actual.staged.values() {
            staged.insert(v.unique_name.as_str(), serde_json::to_string(v).unwrap().as_str()).unwrap();
        }
        let mut published = txn.open_table(TableDefinition::<(&str, &str), &str>::new("published")).unwrap();
        for v in actual.published.values() {
            let key = (v.key.pod_uid.as_str(), v.key.volume.as_str());
            published.insert(key, serde_json::to_string(v).unwrap().as_str()).unwrap();
        }
        let mut table = txn.open_table(TableDefinition::<u64, &str>::new("journal")).unwrap();
        for (id, op) in journal {
            let text = serde_json::json!({ "operation": op, "startedUnixMs": 1 }).to_string();
            table.insert(*id, text.as_str()).unwrap();
        }
    }
    txn.commit().unwrap();
}

#[test]
fn a_schema_1_store_is_converted_to_unique_names_with_their_plugin_once() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("state.redb");
    // A CSI volume attached, staged and published (node-wide), a flex volume published
    // without staging, an emptyDir (per pod), and an attach of a CSI volume under way.
    let mut staged_pub = published("p1", "data");
    staged_pub.unique_name = "d.csi^h1".into();
    staged_pub.staging_path = Some(PathBuf::from("/k/plugins/kubernetes.io/csi/d.csi/x/globalmount"));
    let mut flex = published_at(&NodePaths::new("/k"), "p2", "kvol/tmpfs", "v");
    flex.unique_name = "v".into();
    let mut cache = published_at(&NodePaths::new("/k"), "p3", EMPTY_DIR, "cache");
    cache.unique_name = "cache".into();
    let mut old = ActualState::default();
    old.attached
        .insert("d.csi^h1".into(), AttachedVolume { unique_name: "d.csi^h1".into(), ..attached("x", None) });
    old.staged.insert("d.csi^h1".into(), StagedVolume { unique_name: "d.csi^h1".into(), ..staged("x") });
    for v in [&staged_pub, &flex, &cache] {
        old.published.insert(v.key.clone(), v.clone());
    }
    write_v1_store(&path, &old, &[(7, attach("d.csi^h2"))]);

    let store = Store::open(&path).unwrap();
    let loaded = store.load().unwrap();
    let names = |a: &ActualState| {
        let mut all: Vec<String> = a.attached.keys().chain(a.staged.keys()).cloned().collect();
        all.extend(a.published.values().map(|p| format!("{} {}", p.key, p.unique_name)));
        all
    };
    assert_eq!(
        names(&loaded.actual),
        [
            "kubernetes.io/csi/d.csi^h1",
            "kubernetes.io/csi/d.csi^h1",
            "p1/data kubernetes.io/csi/d.csi^h1",
            "p2/v kvol/tmpfs/p2-v",
            "p3/cache kubernetes.io/empty-dir/p3-cache",
        ]
    );
    match &loaded.incomplete[..] {
        [JournalEntry { id: 7, operation: Operation::Attach { unique_name, .. }, .. }] => {
            assert_eq!(unique_name, "kubernetes.io/csi/d.csi^h2")
        }
        other => panic!("the unfinished attach should be kept, converted: {other:?}"),
    }
    // Journal ids keep rising after the conversion; a second open converts nothing again.
    assert_eq!(store.begin(&attach("z")).unwrap(), 10);
    drop(store);
    let again = Store::open(&path).unwrap().load().unwrap();
    assert_eq!(names(&again.actual), names(&loaded.actual));
}

#[test]
fn manifests_last_read_cleanly_are_remembered_and_forgotten() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("state.redb");
    let store = Store::open(&path).unwrap();
    assert!(store.manifests().unwrap().is_empty());
    store.remember_manifest("web.yaml", Some("kind: Pod")).unwrap();
    store.remember_manifest("db.yaml", Some("kind: Pod\n")).unwrap();
    store.remember_manifest("web.yaml", Some("kind: Pod # v2")).unwrap();
    drop(store);
    let store = Store::open(&path).unwrap();
    let all = store.manifests().unwrap();
    assert_eq!(all.get("web.yaml").map(String::as_str), Some("kind: Pod # v2"));
    assert_eq!(all.len(), 2);
    store.remember_manifest("db.yaml", None).unwrap();
    assert_eq!(store.manifests().unwrap().keys().collect::<Vec<_>>(), ["web.yaml"]);
}

#[test]
fn a_store_half_created_by_a_killed_agent_does_not_stop_the_next_start() {
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("state.redb");
    // What a kill while creating leaves: a partial file beside the store, never the store.
    fs::write(dir.path().join("state.redb.new"), b"half a database").unwrap();
    let store = Store::open(&path).unwrap();
    assert!(store.load().unwrap().actual == ActualState::default());
    assert!(!dir.path().join("state.redb.new").exists(), "the partial file is gone");
    drop(store);
    Store::open(&path).unwrap();
}

#[test]
fn a_published_record_replaces_another_of_its_pod_at_its_target() {
    let dir = kvol_test_support::ScratchRoot::new();
    let store = Store::open(&dir.path().join("agent.redb")).unwrap();
    // Reconstructed under the directory's name (the PV's), and the pod's other volume.
    let reconstructed = PublishedVolume { uncertain: true, ..published("p1", "pv-1") };
    let neighbour = published("p1", "cache");
    let other_pod = PublishedVolume { target: reconstructed.target.clone(), ..published("p2", "pv-1") };
    let mut expected = ActualState::default();
    for record in [&reconstructed, &neighbour, &other_pod] {
        let id = store.begin(&attach("x")).unwrap();
        store.finish(id, &ActualChange::SetPublished(record.clone())).unwrap();
        kvol_node::executor::apply(&mut expected, ActualChange::SetPublished(record.clone()));
    }
    // Published again under the pod's name for it, at the same target.
    let named = PublishedVolume {
        key: PodVolumeKey { pod_uid: "p1".into(), volume: "data".into() },
        ..published("p1", "pv-1")
    };
    let id = store.begin(&attach("x")).unwrap();
    store.finish(id, &ActualChange::SetPublished(named.clone())).unwrap();
    kvol_node::executor::apply(&mut expected, ActualChange::SetPublished(named));
    let keys: Vec<String> = store.actual().unwrap().published.keys().map(|k| k.to_string()).collect();
    assert_eq!(keys, ["p1/cache", "p1/data", "p2/pv-1"], "the reconstructed record went, nothing else");
    assert_eq!(store.actual().unwrap(), expected, "the store and the executor agree");
}

#[tokio::test]
async fn a_damaged_journal_is_kept_aside_a_new_one_begun_and_only_the_newest_few_kept() {
    use kvol_node::actual::damage::{KEPT_DAMAGED, open_journal};
    let dir = kvol_test_support::ScratchRoot::new();
    let path = dir.path().join("state.redb");
    for round in 0..KEPT_DAMAGED + 2 {
        {
            let store = Store::open(&path).unwrap();
            let id = store.begin(&attach("v1")).unwrap();
            store.finish(id, &ActualChange::SetAttached(attached("v1", None))).unwrap();
        }
        let mut bytes = fs::read(&path).unwrap();
        bytes[..4096].fill(0);
        fs::write(&path, &bytes).unwrap();
        let opened = open_journal(&path, Duration::from_millis(100)).await.unwrap();
        assert_eq!(opened.loaded, Loaded::default(), "round {round}: a new journal");
        let aside = opened.set_aside.expect("kept aside");
        assert_eq!(fs::read(&aside.kept).unwrap(), bytes, "round {round}: kept as it was");
        assert!(aside.problem().contains(&aside.kept.display().to_string()));
    }
    let kept = fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("state.redb.damaged-"))
        .count();
    assert_eq!(kept, KEPT_DAMAGED);
    // A journal in use is not damage: refused once the wait is over, never moved.
    let _held = Store::open(&path).unwrap();
    let err = open_journal(&path, Duration::from_millis(100)).await.unwrap_err();
    assert!(err.contains("in use") && err.contains(&path.display().to_string()), "{err}");
    assert!(path.is_file());
}
