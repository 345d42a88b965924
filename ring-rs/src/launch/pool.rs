//! The thread pool that runs launch tables: the calling thread plus
//! `threads - 1` workers sharing each sliced launch (see `dispatch`).

use std::io;
use std::sync::{Mutex, PoisonError};
use std::thread::JoinHandle;

use super::dispatch::Caller;
use super::table::{Launch, LaunchTable};

/// Runs launch tables, one at a time.
pub struct Pool {
    threads: usize,
    /// Held for a whole run: one caller at a time, as the protocol needs.
    caller: Mutex<Caller<Launch>>,
    workers: Vec<JoinHandle<()>>,
}

impl Pool {
    /// A pool of `threads` threads (the caller of `run` counts as one; the
    /// others start now). An idle worker spins `spin_ns` before it sleeps.
    pub fn new(threads: usize, spin_ns: u64) -> io::Result<Self> {
        if threads < 1 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a pool needs at least 1 thread",
            ));
        }
        let mut pool = Self {
            threads,
            caller: Mutex::new(Caller::new()),
            workers: Vec::with_capacity(threads - 1),
        };
        for i in 1..threads {
            let dispatch = pool
                .caller
                .get_mut()
                .unwrap_or_else(PoisonError::into_inner)
                .dispatch();
            let worker = std::thread::Builder::new()
                .name(format!("swactor-launch-{i}"))
                .spawn(move || {
                    // SAFETY: a slice handed out by the dispatch belongs to a
                    // launch of a table `run` is running; `push`'s contract covers
                    // running its slices on this thread too.
                    dispatch.work(spin_ns, |l: &Launch, s| unsafe { l.run_slice(s) });
                });
            pool.workers.push(worker?); // on error, drop stops and joins the ones that started
        }
        Ok(pool)
    }

    /// Threads that run a sliced launch, the caller included.
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// Run the table's launches in order; returns when all have finished.
    /// Unsliced launches run on the calling thread while the workers wait; a
    /// sliced launch's slices are shared out. Concurrent calls queue.
    pub fn run(&self, table: &LaunchTable) {
        let mut caller = self.caller.lock().unwrap_or_else(PoisonError::into_inner);
        caller.unpark();
        for l in table.launches() {
            if !l.is_sliced() {
                // SAFETY: `push`'s contract holds for every launch of the table.
                unsafe { l.run() };
            } else if self.workers.is_empty() {
                for s in 0..u32::from(l.slices()) {
                    // SAFETY: as above, for a slice below the launch's count.
                    unsafe { l.run_slice(s) };
                }
            } else {
                // SAFETY: as above; the dispatch hands out each slice below
                // the count once, to this thread or a worker.
                caller.run_sliced(l, l.slices(), |l, s| unsafe { l.run_slice(s) });
            }
        }
        caller.park();
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        self.caller
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .stop();
        for w in self.workers.drain(..) {
            let _ = w.join(); // a worker only runs kernels, which do not unwind
        }
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    use super::*;
    use crate::launch::MAX_ARGS;

    thread_local!(static MARK: u8 = const { 0 });
    /// The thread running serial launches (the caller), as the address of
    /// its `MARK`; `check` records it.
    static CALLER: AtomicUsize = AtomicUsize::new(0);

    fn this_thread() -> usize {
        MARK.with(|m| std::ptr::from_ref(m) as usize)
    }

    /// Sliced test kernel: a plain (non-atomic) count of the slice, so that a
    /// slice still running when another thread reads the counters is a race
    /// the checks (and a race detector) see. The caller gives its core away
    /// for a moment in each slice it runs, so that workers get slices even on
    /// a busy host; a worker's slice takes longer, so that it is still running
    /// when the caller has taken the rest.
    unsafe extern "C" fn bump(count: u64, slice: u64) {
        let caller = CALLER.load(Ordering::Relaxed) == this_thread();
        std::thread::sleep(Duration::from_micros(if caller { 20 } else { 200 }));
        // SAFETY: `count` points to the test's counters, one per slice.
        unsafe { *(count as *mut u64).add(slice as usize) += 1 };
    }

    /// Serial test kernel: one more round; every slice counter must have
    /// reached it, else state[1] counts a miss.
    unsafe extern "C" fn check(count: u64, state: u64, slices: u64) {
        CALLER.store(this_thread(), Ordering::Relaxed);
        let (count, state) = (count as *const u64, state as *mut u64);
        // SAFETY: the test's counters (`slices` of them) and its 2-word state.
        unsafe {
            *state += 1;
            for i in 0..slices as usize {
                if *count.add(i) != *state {
                    *state.add(1) += 1;
                }
            }
        }
    }

    /// Serial test kernel writing its MAX_ARGS (32) parameters to `out` (parameter 0).
    unsafe extern "C" fn record(
        out: u64,
        a1: u64,
        a2: u64,
        a3: u64,
        a4: u64,
        a5: u64,
        a6: u64,
        a7: u64,
        a8: u64,
        a9: u64,
        a10: u64,
        a11: u64,
        a12: u64,
        a13: u64,
        a14: u64,
        a15: u64,
        a16: u64,
        a17: u64,
        a18: u64,
        a19: u64,
        a20: u64,
        a21: u64,
        a22: u64,
        a23: u64,
        a24: u64,
        a25: u64,
        a26: u64,
        a27: u64,
        a28: u64,
        a29: u64,
        a30: u64,
        a31: u64,
    ) {
        let args = [
            out, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11, a12, a13, a14, a15, a16, a17, a18, a19, a20,
            a21, a22, a23, a24, a25, a26, a27, a28, a29, a30, a31,
        ];
        // SAFETY: `out` points to MAX_ARGS words.
        unsafe { std::ptr::copy_nonoverlapping(args.as_ptr(), out as *mut u64, MAX_ARGS) };
    }

    /// (bump, check) pairs per run.
    const PAIRS: u64 = 8;

    type Bump = unsafe extern "C" fn(u64, u64);
    type Check = unsafe extern "C" fn(u64, u64, u64);

    fn bump_check_table(count: &mut [u64], state: &mut [u64; 2]) -> LaunchTable {
        let (c, s, n) = (
            count.as_mut_ptr() as u64,
            state.as_mut_ptr() as u64,
            count.len() as u64,
        );
        let mut t = LaunchTable::new();
        for _ in 0..PAIRS {
            // back to back: each bump reuses the counters the check before it
            // read; several pairs per run, as workers sleep when a run ends
            // SAFETY: the kernels take these parameters; `count` and `state`
            // outlive the table's runs, which access them only through it.
            unsafe {
                t.push(bump as Bump as usize, &[c, 0], Some(1), n as u16).unwrap();
                t.push(check as Check as usize, &[c, s, n], None, 0).unwrap();
            }
        }
        t
    }

    #[test]
    fn every_slice_once_and_serial_after_all() {
        for threads in [1, 2, 3, 5] {
            let (mut count, mut state, runs) = ([0u64; 12], [0u64; 2], 30);
            let table = bump_check_table(&mut count, &mut state);
            let pool = Pool::new(threads, 1_000_000).unwrap();
            for _ in 0..runs {
                pool.run(&table);
            }
            drop(pool);
            drop(table);
            assert_eq!(
                state[1], 0,
                "{threads} threads: {} checks saw a slice unfinished",
                state[1]
            );
            assert_eq!(state[0], PAIRS * runs, "{threads} threads");
            assert!(
                count.iter().all(|&c| c == PAIRS * runs),
                "{threads} threads: {count:?}"
            );
        }
    }

    #[test]
    fn pools_start_and_stop_repeatedly() {
        for threads in [1, 2, 4].repeat(10) {
            drop(Pool::new(threads, 0).unwrap()); // spin 0: asleep at once, stop must wake them
        }
        assert_eq!(
            Pool::new(0, 0).err().map(|e| e.kind()),
            Some(std::io::ErrorKind::InvalidInput)
        );
    }

    #[test]
    fn variables_fill_their_slots_within_bounds() {
        type Record = unsafe extern "C" fn(
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
            u64,
        );
        let mut out = [0u64; MAX_ARGS];
        let mut args: Vec<u64> = (0..MAX_ARGS as u64).map(|i| 100 + i).collect();
        args[0] = out.as_mut_ptr() as u64;
        let mut t = LaunchTable::new();
        // SAFETY: `record` takes 32 integer parameters and writes 32 words to
        // parameter 0, which `out` provides for the table's life.
        unsafe {
            t.push(record as Record as usize, &args, None, 0).unwrap();
            t.bind("start_pos", 0, 3, 0, 511).unwrap();
            t.bind("start_pos", 0, 15, 0, 511).unwrap();
            t.bind("row", 0, 7, -4, 4).unwrap();
        }
        assert_eq!(
            (t.variable_count(), t.variable_name(0), t.variable_name(1)),
            (2, "start_pos", "row")
        );
        t.set_variable(0, 511).unwrap();
        t.set_variable(1, -4).unwrap();
        assert!(t.set_variable(0, 512).unwrap_err().0.contains("outside 0..=511"));
        let pool = Pool::new(2, 0).unwrap();
        pool.run(&t);
        let mut want: Vec<u64> = args.clone();
        (want[3], want[15], want[7]) = (511, 511, -4i64 as u64);
        assert_eq!(out.to_vec(), want);
    }

    #[test]
    fn table_refuses_what_it_cannot_call() {
        let mut t = LaunchTable::new();
        let k = bump as Bump as usize;
        // SAFETY: every call below is refused before anything is stored.
        unsafe {
            assert!(t.push(0, &[], None, 0).unwrap_err().0.contains("address is 0"));
            assert!(
                t.push(k, &[0; MAX_ARGS + 1], None, 0)
                    .unwrap_err()
                    .0
                    .contains("at most 32")
            );
            assert!(
                t.push(k, &[0, 0], Some(2), 4)
                    .unwrap_err()
                    .0
                    .contains("core slot 2")
            );
            assert!(t.bind("v", 0, 0, 0, 1).unwrap_err().0.contains("no launch 0"));
            assert!(t.set_slices(0, 1).unwrap_err().0.contains("no launch 0"));
        }
        // SAFETY: never run.
        unsafe {
            t.push(k, &[0, 0], Some(1), 4).unwrap();
            assert!(
                t.bind("v", 0, 1, 0, 1)
                    .unwrap_err()
                    .0
                    .contains("not a variable slot")
            );
            assert!(
                t.bind("v", 0, 2, 0, 1)
                    .unwrap_err()
                    .0
                    .contains("not a variable slot")
            );
            assert!(t.bind("v", 0, 0, 2, 1).unwrap_err().0.contains("empty range"));
            t.bind("v", 0, 0, 0, 1).unwrap();
            assert!(
                t.bind("v", 0, 0, 0, 2)
                    .unwrap_err()
                    .0
                    .contains("before with 0..=1")
            );
            t.push(k, &[0, 0], None, 0).unwrap();
            assert!(t.set_slices(1, 2).unwrap_err().0.contains("not sliced"));
            t.set_slices(0, 2).unwrap();
        }
        assert_eq!(t.launches()[0].slices(), 2);
        assert_eq!(t.len(), 2);
    }
}
