//! Blocking filesystem calls run off the async threads, a few at a time, and a call that hangs (a dead mount) is left behind, not waited for or repeated.
//!
//! tokio's blocking pool grows to 512 threads: a burst of 100 claims' record fsyncs started
//! ~40 threads, each keeping an allocator heap and a stack (about 2.5 MiB more resident memory
//! at 100 volumes). And a `statvfs` of a dead NFS mount never returns: measured again on every
//! stats period, it used to pin one more pool thread each time, until the pool was exhausted.
//! [`BlockingCalls`] bounds both: at most `concurrent` calls run at once, and a call past its
//! deadline gives its slot back, marks its path stuck and is not started again for that path
//! until it returns. Threads in use are at most `concurrent` plus the stuck calls.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use tokio::sync::Semaphore;

/// How many blocking calls the agent runs at once. The 50-claim bench burst took the same time
/// with 4 and with 8; 8 leaves more fsyncs for a slow disk's journal to batch, and the memory
/// at 100 volumes was the same.
pub const CONCURRENT_CALLS: usize = 8;

/// Why a blocking call gave no result.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BlockingError {
    #[error("an earlier call on {} has not returned after its deadline (a dead mount?); not starting another", .0.display())]
    Stuck(PathBuf),
    #[error("no answer from {} within {} s; the call is left running", .0.display(), .1.as_secs_f64())]
    TimedOut(PathBuf, Duration),
    #[error("the call on {} panicked: {}", .0.display(), .1)]
    Panicked(PathBuf, String),
}

/// A bounded lane for blocking calls, keyed by the path each call works on.
#[derive(Clone)]
pub struct BlockingCalls {
    inner: Arc<Lane>,
}

impl std::fmt::Debug for BlockingCalls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let stuck: Vec<PathBuf> = self.inner.stuck().keys().cloned().collect();
        f.debug_struct("BlockingCalls")
            .field("free_slots", &self.inner.slots.available_permits())
            .field("stuck", &stuck)
            .finish()
    }
}

struct Lane {
    slots: Semaphore,
    /// Paths with calls past their deadline and still running, with how many.
    stuck: Mutex<HashMap<PathBuf, usize>>,
}

/// The process's lane: every blocking call of the agent goes through it, so the bound holds
/// for the process as tokio's pool's does.
pub fn shared() -> &'static BlockingCalls {
    static SHARED: LazyLock<BlockingCalls> = LazyLock::new(|| BlockingCalls::new(CONCURRENT_CALLS));
    &SHARED
}

impl BlockingCalls {
    pub fn new(concurrent: usize) -> Self {
        let lane = Lane { slots: Semaphore::new(concurrent.max(1)), stuck: Mutex::new(HashMap::new()) };
        Self { inner: Arc::new(lane) }
    }

    /// Runs `call` on a blocking thread once a slot is free and returns its result, or an error
    /// when `path` already has a stuck call, or when `call` has not returned `deadline` after it
    /// started. A dropped future counts as a missed deadline.
    pub async fn run<T, F>(&self, path: &Path, deadline: Duration, call: F) -> Result<T, BlockingError>
    where
        T: Send + 'static,
        F: FnOnce() -> T + Send + 'static,
    {
        if self.stuck_calls(path) > 0 {
            return Err(BlockingError::Stuck(path.to_path_buf()));
        }
        let _slot = self.inner.slots.acquire().await.expect("the lane's semaphore is never closed");
        let call_state = Arc::new(CallState::default());
        let mut watch = Abandon { lane: &self.inner, path, state: &call_state, armed: true };
        let mut handle = {
            let (lane, state, path) = (Arc::clone(&self.inner), Arc::clone(&call_state), path.to_path_buf());
            tokio::task::spawn_blocking(move || {
                // Dropped when `call` returns or panics: either way it is no longer stuck.
                let _finished = Finished { lane, path, state };
                call()
            })
        };
        let joined = match tokio::time::timeout(deadline, &mut handle).await {
            Ok(joined) => joined,
            Err(_) => {
                watch.fire();
                if call_state.abandoned.load(Ordering::Relaxed) {
                    return Err(BlockingError::TimedOut(path.to_path_buf(), deadline));
                }
                // It returned between the deadline and the check: take its result.
                handle.await
            }
        };
        watch.armed = false;
        joined.map_err(|e| BlockingError::Panicked(path.to_path_buf(), e.to_string()))
    }

    /// How many calls on `path` are past their deadline and still running.
    pub fn stuck_calls(&self, path: &Path) -> usize {
        self.inner.stuck().get(path).copied().unwrap_or(0)
    }
}

#[derive(Default)]
struct CallState {
    /// Set by the blocking thread when `call` returned.
    finished: AtomicBool,
    /// Set by the waiter when it gave up on the call.
    abandoned: AtomicBool,
}

impl Lane {
    fn stuck(&self) -> std::sync::MutexGuard<'_, HashMap<PathBuf, usize>> {
        self.stuck.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The blocking thread's end of a call: a call given up on stops counting as stuck.
    fn finished(&self, path: &Path, state: &CallState) {
        let mut stuck = self.stuck();
        state.finished.store(true, Ordering::Relaxed);
        if state.abandoned.load(Ordering::Relaxed)
            && let Some(count) = stuck.get_mut(path)
        {
            *count -= 1;
            if *count == 0 {
                stuck.remove(path);
            }
        }
    }

    /// The waiter's end: a call not finished when given up on counts as stuck until it returns.
    fn abandoned(&self, path: &Path, state: &CallState) {
        let mut stuck = self.stuck();
        if !state.finished.load(Ordering::Relaxed) {
            state.abandoned.store(true, Ordering::Relaxed);
            *stuck.entry(path.to_path_buf()).or_insert(0) += 1;
        }
    }
}

/// The blocking thread's end of a call, run on return and on panic alike.
struct Finished {
    lane: Arc<Lane>,
    path: PathBuf,
    state: Arc<CallState>,
}

impl Drop for Finished {
    fn drop(&mut self) {
        self.lane.finished(&self.path, &self.state);
    }
}

/// Marks the call stuck if the waiting future ends (deadline or drop) before the call did.
struct Abandon<'a> {
    lane: &'a Lane,
    path: &'a Path,
    state: &'a CallState,
    armed: bool,
}

impl Abandon<'_> {
    fn fire(&mut self) {
        if std::mem::take(&mut self.armed) {
            self.lane.abandoned(self.path, self.state);
        }
    }
}

impl Drop for Abandon<'_> {
    fn drop(&mut self) {
        self.fire();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::mpsc;

    const LONG: Duration = Duration::from_secs(3600);

    /// A call that blocks its thread until the returned sender is dropped or sent to.
    fn hanging() -> (mpsc::Sender<()>, impl FnOnce() -> u32 + Send + 'static) {
        let (release, wait) = mpsc::channel::<()>();
        (release, move || {
            let _ = wait.recv();
            7
        })
    }

    #[tokio::test]
    async fn a_call_returns_its_result() {
        let calls = BlockingCalls::new(2);
        assert_eq!(calls.run(Path::new("/a"), LONG, || 5).await, Ok(5));
        assert_eq!(calls.stuck_calls(Path::new("/a")), 0);
    }

    #[tokio::test]
    async fn a_hanging_call_is_stuck_until_it_returns_and_no_second_one_starts() {
        let calls = BlockingCalls::new(2);
        let dead = Path::new("/mnt/dead");
        let (release, call) = hanging();
        let err = calls.run(dead, Duration::from_millis(20), call).await.unwrap_err();
        assert_eq!(err, BlockingError::TimedOut(dead.to_path_buf(), Duration::from_millis(20)));
        assert_eq!(calls.stuck_calls(dead), 1);
        let started = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&started);
        let again = calls.run(dead, LONG, move || flag.store(true, Ordering::Relaxed)).await;
        assert_eq!(again, Err(BlockingError::Stuck(dead.to_path_buf())));
        assert!(!started.load(Ordering::Relaxed), "a second call on a stuck path must not start");
        assert_eq!(calls.run(Path::new("/mnt/live"), LONG, || 1).await, Ok(1), "other paths go on");
        release.send(()).unwrap();
        for _ in 0..200 {
            if calls.stuck_calls(dead) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(calls.stuck_calls(dead), 0, "a stuck call that returns frees its path");
        assert_eq!(calls.run(dead, LONG, || 2).await, Ok(2));
    }

    #[tokio::test]
    async fn a_stuck_call_gives_its_slot_back() {
        let calls = BlockingCalls::new(1);
        let (release, call) = hanging();
        assert!(calls.run(Path::new("/dead"), Duration::from_millis(10), call).await.is_err());
        let next = tokio::time::timeout(Duration::from_secs(5), calls.run(Path::new("/b"), LONG, || 3)).await;
        assert_eq!(next.expect("the only slot must be free again"), Ok(3));
        drop(release);
    }

    #[tokio::test]
    async fn a_dropped_wait_counts_as_a_missed_deadline() {
        let calls = BlockingCalls::new(2);
        let (release, call) = hanging();
        let dead = Path::new("/dead");
        let outer = tokio::time::timeout(Duration::from_millis(10), calls.run(dead, LONG, call)).await;
        assert!(outer.is_err());
        assert_eq!(calls.stuck_calls(dead), 1);
        drop(release);
    }

    #[tokio::test]
    async fn no_more_than_the_slots_run_at_once() {
        let calls = BlockingCalls::new(2);
        let running = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let most = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut all = tokio::task::JoinSet::new();
        for i in 0..8 {
            let (calls, running, most) = (calls.clone(), Arc::clone(&running), Arc::clone(&most));
            all.spawn(async move {
                let path = PathBuf::from(format!("/v{i}"));
                calls
                    .run(&path, LONG, move || {
                        let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        std::thread::sleep(Duration::from_millis(10));
                        running.fetch_sub(1, Ordering::SeqCst);
                    })
                    .await
            });
        }
        while let Some(done) = all.join_next().await {
            assert_eq!(done.unwrap(), Ok(()));
        }
        assert_eq!(most.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn a_stuck_call_that_panics_frees_its_path() {
        let calls = BlockingCalls::new(1);
        let (release, wait) = mpsc::channel::<()>();
        let dead = Path::new("/dead");
        let call = move || -> u8 {
            let _ = wait.recv();
            panic!("the stuck call failed")
        };
        assert!(calls.run(dead, Duration::from_millis(10), call).await.is_err());
        assert_eq!(calls.stuck_calls(dead), 1);
        drop(release);
        for _ in 0..200 {
            if calls.stuck_calls(dead) == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(calls.stuck_calls(dead), 0, "a stuck call that panics must not stay stuck");
    }

    #[tokio::test]
    async fn a_panicking_call_is_an_error_naming_the_path() {
        let calls = BlockingCalls::new(1);
        let err = calls.run(Path::new("/p"), LONG, || -> u8 { panic!("boom") }).await.unwrap_err();
        assert!(matches!(err, BlockingError::Panicked(ref p, _) if p == Path::new("/p")), "{err:?}");
        assert_eq!(calls.stuck_calls(Path::new("/p")), 0);
    }
}
