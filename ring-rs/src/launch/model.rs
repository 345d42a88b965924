//! Model test of the dispatch protocol with loom: every interleaving of the
//! caller and the workers (up to loom's preemption bound) under the C11
//! memory model, running the protocol's own code (`sync.rs` swaps in loom's
//! atomics, mutex and condvar). Run with
//! `RUSTFLAGS="--cfg loom" cargo test --release --lib launch::model` (tests/run.sh
//! does, ~30 s on a busy 2-core box). The preemption bounds are set per test
//! for that budget; deeper runs passed too: the two-worker model at bound 2
//! (4-6 min), the one-worker models at 3 (1-2 min), set with
//! `LOOM_MAX_PREEMPTIONS`.
//!
//! What a pass proves, for the launches modelled here:
//! - every slice of a launch runs exactly once, with that launch's data (a
//!   stale worker never takes a slice of a later launch);
//! - each slice's writes happen before the caller returns from the launch
//!   (loom's `UnsafeCell` fails on any access not ordered by happens-before),
//!   and no worker touches a launch after that: the caller retires each launch
//!   with a write that would race with any later read;
//! - no worker sleeps through a launch: with a caller that does not help,
//!   every launch completes only if a sleeping worker is woken;
//! - `stop` ends every worker (a lost wake-up there is a deadlock loom reports).
//!
//! Not covered: loom treats SeqCst loads/stores as AcqRel (so the protocol
//! uses SeqCst fences, which loom does model) and does not explore every
//! load-buffering execution; epochs wrap after 2^32 launches, which no model
//! reaches.

use loom::cell::UnsafeCell;
use loom::thread;

use super::dispatch::Caller;
use super::sync::Arc;

/// A launch of the model: one counter per slice, and a liveness flag the
/// caller clears when the launch has returned.
struct Launch {
    hits: Vec<UnsafeCell<u32>>,
    live: UnsafeCell<bool>,
}

// SAFETY: the cells are shared exactly as the protocol under test says they
// may be (each slice's counter by its one taker, then the caller); loom's
// `UnsafeCell` checks every access against that and fails the model if not.
unsafe impl Sync for Launch {}

impl Launch {
    fn new(slices: usize) -> Self {
        Self {
            hits: (0..slices).map(|_| UnsafeCell::new(0)).collect(),
            live: UnsafeCell::new(true),
        }
    }
}

fn run_slice(l: &Launch, s: u32) {
    // SAFETY: a read of the flag; loom fails the model if it races with the
    // caller's retiring write.
    let live = l.live.with(|p| unsafe { *p });
    assert!(live, "a slice ran after its launch returned");
    // SAFETY: slice `s` is handed out once; loom checks it.
    l.hits[s as usize].with_mut(|p| unsafe { *p += 1 });
}

/// The caller's checks once launch `l` has returned: every slice ran once and
/// its write is visible; then the launch is retired.
fn retire(l: &Launch) {
    for (s, h) in l.hits.iter().enumerate() {
        // SAFETY: read after the launch returned; loom checks the ordering.
        assert_eq!(h.with(|p| unsafe { *p }), 1, "slice {s} ran other than once");
    }
    // SAFETY: the caller's write; a worker still reading would race with it.
    l.live.with_mut(|p| unsafe { *p = false });
}

fn spawn_workers(caller: &Caller<Launch>, n: usize) -> Vec<thread::JoinHandle<()>> {
    (0..n)
        .map(|_| {
            let d = caller.dispatch();
            thread::spawn(move || d.work(0, run_slice))
        })
        .collect()
}

/// loom's builder with `preemptions` as the bound unless LOOM_MAX_PREEMPTIONS
/// sets another.
fn builder(preemptions: usize) -> loom::model::Builder {
    let mut b = loom::model::Builder::new();
    if std::env::var_os("LOOM_MAX_PREEMPTIONS").is_none() {
        b.preemption_bound = Some(preemptions);
    }
    b
}

/// Two workers and the caller contend for three slices of one launch.
#[test]
fn two_workers_share_a_launch() {
    builder(1).check(|| {
        let launch = Arc::new(Launch::new(3));
        let mut caller = Caller::new();
        let workers = spawn_workers(&caller, 2);
        caller.unpark();
        caller.run_sliced(&*launch, 3, run_slice);
        retire(&launch);
        caller.park();
        caller.stop();
        for w in workers {
            w.join().unwrap();
        }
    });
}

/// Two launches, the run parked and resumed between them: the stale-worker
/// and retire races with one worker.
#[test]
fn one_worker_across_a_park() {
    builder(2).check(|| {
        let launches: Vec<Arc<Launch>> = (0..2).map(|_| Arc::new(Launch::new(2))).collect();
        let mut caller = Caller::new();
        let workers = spawn_workers(&caller, 1);
        caller.unpark();
        caller.run_sliced(&*launches[0], 2, run_slice);
        retire(&launches[0]);
        caller.park();
        caller.unpark();
        caller.run_sliced(&*launches[1], 2, run_slice);
        retire(&launches[1]);
        caller.stop();
        for w in workers {
            w.join().unwrap();
        }
    });
}

/// The caller publishes and waits without helping: each launch completes only
/// if the (sleeping) worker is woken for it.
#[test]
fn no_worker_sleeps_through_a_launch() {
    builder(3).check(|| {
        let launches: Vec<Arc<Launch>> = (0..2).map(|_| Arc::new(Launch::new(1))).collect();
        let mut caller = Caller::new();
        let workers = spawn_workers(&caller, 1);
        for l in &launches {
            // SAFETY: `l` lives in `launches` until the model ends, after the wait.
            unsafe { caller.publish(&**l, 1) };
            caller.wait(1);
            retire(l);
        }
        caller.stop();
        for w in workers {
            w.join().unwrap();
        }
    });
}
