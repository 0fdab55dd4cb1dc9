//! The manifests source against real files and real inotify: what is in the directory is what is published.

use std::fs;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvol_node::ObjectSet;
use kvol_node::sources::{ManifestsSource, Quiet, static_pod_uid};
use tokio::sync::watch;

/// How long a change may take to arrive before a test fails.
const DEADLINE: Duration = Duration::from_secs(10);

/// Waits until a published set satisfies `done`, or fails naming `what` and the last set seen.
async fn wait_for(
    sets: &mut watch::Receiver<Arc<ObjectSet>>,
    what: &str,
    done: impl Fn(&ObjectSet) -> bool,
) -> Arc<ObjectSet> {
    let deadline = Instant::now() + DEADLINE;
    loop {
        let set = Arc::clone(&sets.borrow_and_update());
        if done(&set) {
            return set;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, sets.changed()).await {
            Ok(Ok(())) => {}
            Ok(Err(_)) => panic!("{what}: the source stopped"),
            Err(_) => panic!("{what}: not seen within {DEADLINE:?}; last set: {set:#?}"),
        }
    }
}

fn pod(name: &str, label: &str) -> String {
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  labels: {{v: {label}}}\nspec:\n  \
         containers: [{{name: c, image: i}}]\n  volumes: [{{name: data, emptyDir: {{}}}}]\n"
    )
}

fn claim(name: &str) -> String {
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {{name: {name}, namespace: ns}}\nspec: {{}}\n"
    )
}

fn label(set: &ObjectSet, key: &str) -> Option<String> {
    set.pods.get(key)?.metadata.labels.as_ref()?.get("v").cloned()
}

fn write(dir: &Path, name: &str, text: &str) {
    fs::write(dir.join(name), text).unwrap();
}

#[tokio::test]
async fn additions_changes_and_removals_are_published() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "a.yaml", &format!("{}---\n{}", pod("a", "one"), claim("c")));
    let source = ManifestsSource::start(dir.path().to_path_buf()).unwrap();

    // Present at once, with no waiting: the first set is read before start returns.
    let first = source.current();
    assert_eq!(first.pods.keys().collect::<Vec<_>>(), ["default/a"]);
    assert_eq!(first.claims.keys().collect::<Vec<_>>(), ["ns/c"]);
    assert!(first.problems.is_empty(), "{:?}", first.problems);
    let uid = first.pods["default/a"].metadata.uid.clone();
    assert_eq!(uid.as_deref(), Some(static_pod_uid("default", "a").as_str()));

    let mut sets = source.subscribe();
    write(
        dir.path(),
        "b.json",
        r#"{"apiVersion":"v1","kind":"Pod","metadata":{"name":"b","namespace":"x"}}"#,
    );
    wait_for(&mut sets, "pod x/b added", |s| s.pods.contains_key("x/b")).await;

    write(dir.path(), "a.yaml", &format!("{}---\n{}", pod("a", "two"), claim("c")));
    let changed =
        wait_for(&mut sets, "pod a changed", |s| label(s, "default/a").as_deref() == Some("two")).await;
    assert_eq!(changed.pods["default/a"].metadata.uid, uid, "an edit keeps the pod's uid");

    fs::remove_file(dir.path().join("a.yaml")).unwrap();
    let removed = wait_for(&mut sets, "a.yaml's objects gone", |s| !s.pods.contains_key("default/a")).await;
    assert!(removed.claims.is_empty(), "the claim went with its file");
    assert_eq!(removed.pods.keys().collect::<Vec<_>>(), ["x/b"]);
    assert_eq!(*source.current(), *removed);
    source.shutdown();
}

#[tokio::test]
async fn a_malformed_manifest_is_a_problem_for_its_file_only() {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "good.yaml", &pod("good", "one"));
    let source = ManifestsSource::start(dir.path().to_path_buf()).unwrap();
    let mut sets = source.subscribe();
    let bad = dir.path().join("bad.yaml").display().to_string();

    write(dir.path(), "bad.yaml", "apiVersion: v1\nkind: Pod\nmetadata: [1, 2\n");
    let set = wait_for(&mut sets, "a problem for bad.yaml", |s| !s.problems.is_empty()).await;
    assert_eq!(set.problems.len(), 1, "{:?}", set.problems);
    assert_eq!(set.problems[0].origin, bad);
    assert!(set.problems[0].reason.starts_with("cannot parse as YAML or JSON: "), "{}", set.problems[0]);
    assert_eq!(set.pods.keys().collect::<Vec<_>>(), ["default/good"], "the other file is unaffected");

    write(dir.path(), "bad.yaml", &pod("fixed", "one"));
    let set = wait_for(&mut sets, "bad.yaml fixed", |s| s.pods.contains_key("default/fixed")).await;
    assert!(set.problems.is_empty(), "{:?}", set.problems);
    assert_eq!(set.pods.len(), 2);
    source.shutdown();
}

#[tokio::test]
async fn an_atomic_write_is_seen_once_complete() {
    let dir = tempfile::tempdir().unwrap();
    let source = ManifestsSource::start(dir.path().to_path_buf()).unwrap();
    let mut sets = source.subscribe();

    // A temporary dot-file, half written: never read, even when the directory is read after it.
    let text = pod("c", "one");
    write(dir.path(), ".c.yaml.tmp", &text[..text.len() / 2]);
    write(dir.path(), ".c.yaml", "not: [valid");
    write(dir.path(), "marker.yaml", &pod("marker", "one"));
    let set = wait_for(&mut sets, "the marker", |s| s.pods.contains_key("default/marker")).await;
    assert!(set.problems.is_empty(), "dot-files are not read: {:?}", set.problems);
    assert_eq!(set.pods.len(), 1);

    fs::write(dir.path().join(".c.yaml.tmp"), &text).unwrap();
    fs::rename(dir.path().join(".c.yaml.tmp"), dir.path().join("c.yaml")).unwrap();
    let deadline = Instant::now() + DEADLINE;
    tokio::time::timeout_at(deadline.into(), sets.changed()).await.expect("a new set").unwrap();
    let set = Arc::clone(&sets.borrow_and_update());
    assert_eq!(label(&set, "default/c").as_deref(), Some("one"), "the first new set has the whole pod");
    assert!(set.problems.is_empty(), "{:?}", set.problems);
    assert_eq!(set.pods.len(), 2);
    source.shutdown();
}

#[tokio::test]
async fn a_burst_of_files_ends_complete() {
    let dir = tempfile::tempdir().unwrap();
    let source = ManifestsSource::start(dir.path().to_path_buf()).unwrap();
    let mut sets = source.subscribe();
    for i in 0..100 {
        write(dir.path(), &format!("p{i:03}.yaml"), &pod(&format!("p{i:03}"), "one"));
    }
    let set = wait_for(&mut sets, "all 100 pods", |s| s.pods.len() == 100).await;
    assert!(set.problems.is_empty(), "{:?}", set.problems);
    // And the last edit of another burst wins.
    for round in ["two", "three", "four"] {
        for i in 0..100 {
            write(dir.path(), &format!("p{i:03}.yaml"), &pod(&format!("p{i:03}"), round));
        }
    }
    wait_for(&mut sets, "every pod at its last edit", |s| {
        s.pods.len() == 100 && s.pods.keys().all(|k| label(s, k).as_deref() == Some("four"))
    })
    .await;
    source.shutdown();
}

#[tokio::test]
async fn a_missing_directory_is_created_and_watched() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("etc/kvol/manifests");
    let source = ManifestsSource::start(dir.clone()).unwrap();
    assert!(dir.is_dir());
    assert_eq!(*source.current(), ObjectSet::default());
    let mut sets = source.subscribe();
    write(&dir, "p.yml", &pod("p", "one"));
    wait_for(&mut sets, "the pod", |s| s.pods.contains_key("default/p")).await;
    source.shutdown();
}

#[tokio::test]
async fn a_file_in_the_way_is_an_error() {
    let parent = tempfile::tempdir().unwrap();
    let path = parent.path().join("manifests");
    fs::write(&path, "").unwrap();
    let err = ManifestsSource::start(path.clone()).unwrap_err().to_string();
    assert!(err.starts_with(&format!("cannot create the manifests directory {}: ", path.display())), "{err}");
}

#[tokio::test]
async fn shutdown_ends_the_watch() {
    let dir = tempfile::tempdir().unwrap();
    let source = ManifestsSource::start(dir.path().to_path_buf()).unwrap();
    let mut sets = source.subscribe();
    source.shutdown();
    // The source's thread and handle are gone, so the channel is closed.
    assert!(sets.changed().await.is_err());
    assert!(sets.borrow().pods.is_empty());
}

/// A file that did not change is not parsed again, but a change to it (same size, new content)
/// is seen.
#[test]
fn the_parse_cache_reuses_unchanged_files_and_sees_changed_ones() {
    let dir = tempfile::tempdir().unwrap();
    let pod =
        |label: &str| format!("apiVersion: v1\nkind: Pod\nmetadata: {{name: p, labels: {{v: {label}}}}}\n");
    std::fs::write(dir.path().join("a.yaml"), pod("one")).unwrap();
    std::fs::write(dir.path().join("b.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: q}\n").unwrap();
    let mut cache = kvol_node::sources::ParseCache::default();
    let first = kvol_node::sources::load_dir_cached(dir.path(), &mut cache);
    assert_eq!(first, kvol_node::sources::load_dir(dir.path()), "cached and uncached loads agree");
    std::thread::sleep(std::time::Duration::from_millis(20));
    // Rewritten via rename (a new inode), same length: the cache must not serve the old parse.
    let tmp = dir.path().join(".a.yaml.tmp");
    std::fs::write(&tmp, pod("two")).unwrap();
    std::fs::rename(&tmp, dir.path().join("a.yaml")).unwrap();
    std::fs::remove_file(dir.path().join("b.yaml")).unwrap();
    let second = kvol_node::sources::load_dir_cached(dir.path(), &mut cache);
    let labels = second.pods["default/p"].metadata.labels.clone().unwrap();
    assert_eq!(labels["v"], "two");
    assert!(!second.pods.contains_key("default/q"), "a removed file's objects are gone");
    assert_eq!(second, kvol_node::sources::load_dir(dir.path()));
}

/// An edit that breaks a manifest (bad YAML, a bad document) loses none of its objects: the
/// last good ones count, with a problem saying so, until the file reads cleanly again.
#[test]
fn a_broken_edit_keeps_the_last_good_objects_of_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("web.yaml");
    let good = |image: &str| {
        format!(
            "apiVersion: v1\nkind: Pod\nmetadata: {{name: web}}\nspec:\n  containers: [{{name: a, image: {image}}}]\n"
        )
    };
    let image = |set: &kvol_node::ObjectSet| {
        set.pods.get("default/web").map(|p| p.spec.as_ref().unwrap().containers[0].image.clone().unwrap())
    };
    let mut cache = kvol_node::sources::ParseCache::default();
    let mut load = |text: &str| {
        std::fs::write(&path, text).unwrap();
        // A new modification time or size for each step, so the cache reads the file again.
        std::thread::sleep(std::time::Duration::from_millis(15));
        kvol_node::sources::load_dir_cached(dir.path(), &mut cache)
    };
    let first = load(&good("one"));
    assert_eq!(image(&first).as_deref(), Some("one"));
    assert!(first.problems.is_empty());
    // (file text, image expected, whether a problem says the last good objects are kept)
    let rows = [
        ("apiVersion: v1\nkind: Pod\nmetadata: [oops\n".to_string(), Some("one"), true),
        (format!("{}---\nkind: 12\n", good("two")), Some("one"), true),
        (good("three"), Some("three"), false),
        ("".to_string(), None, false),
    ];
    for (text, expected, kept) in rows {
        let set = load(&text);
        assert_eq!(image(&set).as_deref(), expected, "{text:?}");
        let says_kept =
            set.problems.iter().any(|p| p.to_string().contains("keeping the 1 object(s) last read"));
        assert_eq!(says_kept, kept, "{text:?}: {:?}", set.problems);
    }
    // A file that never read cleanly has no last good objects: only what parses counts.
    let fresh = dir.path().join("new.yaml");
    std::fs::write(&fresh, "kind: [\n").unwrap();
    let set = kvol_node::sources::load_dir_cached(dir.path(), &mut cache);
    assert!(set.problems.iter().any(|p| p.to_string().contains("new.yaml")));
    assert!(!set.problems.iter().any(|p| p.to_string().contains("keeping")), "{:?}", set.problems);
}

/// Remembers manifests in memory, as the agent's journal does on disk.
#[derive(Debug, Default)]
struct MapMemory(std::sync::Mutex<std::collections::BTreeMap<String, String>>);

impl kvol_node::sources::ManifestMemory for MapMemory {
    fn recall(&self) -> std::collections::BTreeMap<String, String> {
        self.0.lock().unwrap().clone()
    }
    fn remember(&self, name: &str, text: Option<&str>) {
        let mut map = self.0.lock().unwrap();
        match text {
            Some(text) => map.insert(name.to_string(), text.to_string()),
            None => map.remove(name),
        };
    }
}

/// A restart does not forget a broken manifest's pods: the file's last clean text outlives the
/// cache (the agent keeps it in its journal), so a file broken at start keeps its last good
/// objects; a removed file is forgotten.
#[test]
fn a_file_broken_before_a_restart_keeps_the_objects_it_last_read_cleanly() {
    use kvol_node::sources::{ManifestMemory, ParseCache, load_dir_cached};
    let dir = tempfile::tempdir().unwrap();
    let memory = std::sync::Arc::new(MapMemory::default());
    let good = "apiVersion: v1\nkind: Pod\nmetadata: {name: web}\nspec:\n  volumes: [{name: m, emptyDir: {medium: Memory}}]\n";
    std::fs::write(dir.path().join("web.yaml"), good).unwrap();
    std::fs::write(dir.path().join("db.yaml"), "apiVersion: v1\nkind: Pod\nmetadata: {name: db}\n").unwrap();
    let first = load_dir_cached(dir.path(), &mut ParseCache::with_memory(dir.path(), memory.clone()));
    assert!(first.pods.contains_key("default/web"));
    assert_eq!(memory.recall().keys().collect::<Vec<_>>(), ["db.yaml", "web.yaml"]);

    // "Restart": a typo while the agent was down, and db.yaml deleted.
    std::fs::write(dir.path().join("web.yaml"), format!("{good}  oops: [\n")).unwrap();
    std::fs::remove_file(dir.path().join("db.yaml")).unwrap();
    let after = load_dir_cached(dir.path(), &mut ParseCache::with_memory(dir.path(), memory.clone()));
    assert_eq!(after.pods.get("default/web"), first.pods.get("default/web"), "the broken file's pod is kept");
    assert!(!after.pods.contains_key("default/db"), "a removed file's pod is gone");
    assert!(
        after
            .problems
            .iter()
            .any(|p| p.to_string().contains("web.yaml") && p.to_string().contains("keeping the 1 object(s)")),
        "{:?}",
        after.problems
    );
    assert_eq!(
        memory.recall().keys().collect::<Vec<_>>(),
        ["web.yaml"],
        "db.yaml is forgotten, web.yaml's good text kept"
    );
    assert_eq!(memory.recall()["web.yaml"], good);

    // Without memory (a fresh cache, as before this change), the pod would be lost.
    let forgetful = load_dir_cached(dir.path(), &mut ParseCache::default());
    assert!(!forgetful.pods.contains_key("default/web"));
}

/// A quiet period so long that a change read before it ended was read because it landed whole.
const LONG_QUIET: Quiet = Quiet { quiet: Duration::from_secs(30), max_delay: Duration::from_secs(60) };

#[tokio::test]
async fn a_manifest_renamed_into_place_is_read_at_once_without_waiting_for_quiet() {
    let dir = tempfile::tempdir().unwrap();
    let source = ManifestsSource::start_with(dir.path().to_path_buf(), None, LONG_QUIET).unwrap();
    let mut sets = source.subscribe();
    for (i, name) in ["a", "b", "c"].into_iter().enumerate() {
        write(dir.path(), &format!(".{name}.yaml.tmp"), &pod(name, "one"));
        let landed = Instant::now();
        fs::rename(dir.path().join(format!(".{name}.yaml.tmp")), dir.path().join(format!("{name}.yaml")))
            .unwrap();
        wait_for(&mut sets, name, |s| s.pods.len() == i + 1).await;
        let took = landed.elapsed();
        eprintln!("{name}.yaml renamed into place: read after {took:?}");
        assert!(took < DEADLINE, "read after {took:?}, not at once");
    }
    // Written in place and closed: read at once too.
    let landed = Instant::now();
    write(dir.path(), "a.yaml", &pod("a", "two"));
    wait_for(&mut sets, "a rewritten", |s| label(s, "default/a").as_deref() == Some("two")).await;
    eprintln!("a.yaml written and closed: read after {:?}", landed.elapsed());
    // Removed: at once.
    fs::remove_file(dir.path().join("b.yaml")).unwrap();
    wait_for(&mut sets, "b removed", |s| s.pods.len() == 2).await;
    source.shutdown();
}

#[tokio::test]
async fn a_manifest_still_open_for_writing_is_not_read_half_written() {
    use std::io::Write;
    let dir = tempfile::tempdir().unwrap();
    let source = ManifestsSource::start_with(dir.path().to_path_buf(), None, LONG_QUIET).unwrap();
    let mut sets = source.subscribe();
    let text = format!("{}---\n{}", pod("first", "one"), pod("second", "one"));
    let (head, tail) = text.split_at(text.find("---").unwrap() + 2);
    let mut file = fs::File::create(dir.path().join("slow.yaml")).unwrap();
    file.write_all(head.as_bytes()).unwrap();
    file.flush().unwrap();
    // Another manifest lands whole while slow.yaml is still open: it must wait with it.
    write(dir.path(), ".other.yaml.tmp", &pod("other", "one"));
    fs::rename(dir.path().join(".other.yaml.tmp"), dir.path().join("other.yaml")).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!sets.has_changed().unwrap(), "read while slow.yaml was open: {:#?}", sets.borrow());
    file.write_all(tail.as_bytes()).unwrap();
    drop(file);
    let set = wait_for(&mut sets, "the whole file", |s| s.pods.len() == 3).await;
    assert!(set.problems.is_empty(), "{:?}", set.problems);
    source.shutdown();
}
