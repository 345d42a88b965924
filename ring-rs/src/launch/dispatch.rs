//! How the slices of one sliced launch are shared between the calling thread
//! and the pool's workers, and how idle workers wait for the next launch.
//!
//! Slices are handed out one at a time from a ticket, not in fixed shares: on
//! a busy host a worker may not get a core for milliseconds, and a fixed
//! share would make the whole step wait for it. This way the caller runs
//! whatever nobody else took and waits only for slices that are running.
//!
//! Protocol (one caller, any number of workers):
//! 1. The caller publishes launch `e`: it stores `cur` and `done = 0`, then
//!    `ticket = (e, next 0, count)` with Release, then the epoch word `e`.
//! 2. Anyone holding epoch `e` takes slice `next` by a compare-exchange
//!    `(e, next, count) -> (e, next + 1, count)` (Acquire); only after winning
//!    it does it read `cur`, run the slice and add one to `done` (Release).
//! 3. The caller takes slices the same way, then waits until `done == count`
//!    (Acquire): every slice's writes happen before the caller goes on.
//!
//! A stale worker (it saw epoch `e`, then was descheduled while the caller
//! moved on) cannot take a slice of a later launch: its compare-exchange
//! succeeds only while the ticket still carries `e` with slices left, and
//! until all of `e`'s slices are done the caller neither stores the next
//! launch nor a new ticket. Nor does it read a launch that may be gone: the
//! slice count sits in the ticket itself, so nobody dereferences `cur`
//! without holding a slice of it.
//!
//! Sleeping: an idle worker spins for a while (the next launch of a step
//! comes within microseconds), then sleeps on the epoch word (a futex). The
//! caller wakes sleepers only when `sleepers > 0`; the SeqCst fences after
//! "caller stores the epoch" and after "worker counts itself a sleeper" make
//! one of the two see the other, so no worker sleeps through a launch.
//! These claims are checked by the loom model in `model.rs`.

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release, SeqCst};

use super::sync::{
    Arc, AtomicBool, AtomicPtr, AtomicU32, AtomicU64, CHECK_EVERY, FutexWord, SpinBudget, fence, spin_hint,
    yield_now,
};

/// A ticket packs (epoch: 32 bits, next slice: 16, slice count: 16).
fn pack(epoch: u32, next: u16, count: u16) -> u64 {
    (u64::from(epoch) << 32) | (u64::from(next) << 16) | u64::from(count)
}

fn unpack(ticket: u64) -> (u32, u16, u16) {
    ((ticket >> 32) as u32, (ticket >> 16) as u16, ticket as u16)
}

/// The state the caller and the workers share.
pub(crate) struct Dispatch<T> {
    /// Bumped by the caller for every sliced launch, and once to stop; idle
    /// workers sleep on it.
    epoch: FutexWord,
    /// The next slice of the current launch to hand out (see `pack`).
    ticket: AtomicU64,
    /// Slices of the current launch that have finished.
    done: AtomicU32,
    /// Workers asleep (or about to sleep) on `epoch`.
    sleepers: AtomicU32,
    /// Set when a run ends: spinning for the next launch is pointless until
    /// the next run (in a pipeline the stage's output is then on its way to
    /// the next host, whose services want this core).
    parked: AtomicBool,
    /// Set once, before the last epoch bump: workers return.
    stop: AtomicBool,
    /// The current launch: stored before its ticket is published, read only
    /// by whoever holds one of its slices.
    cur: AtomicPtr<T>,
}

impl<T: Sync> Dispatch<T> {
    /// Take slices of epoch `e`'s launch and run them until none is left.
    fn help(&self, e: u32, run: &impl Fn(&T, u32)) {
        let mut ticket = self.ticket.load(Relaxed);
        loop {
            let (epoch, next, count) = unpack(ticket);
            if epoch != e || next >= count {
                return;
            }
            // next < count <= u16::MAX: the increment stays inside `next`.
            match self
                .ticket
                .compare_exchange_weak(ticket, ticket + (1 << 16), Acquire, Relaxed)
            {
                Ok(_) => {
                    let launch = self.cur.load(Relaxed);
                    // SAFETY: winning slice `next` of epoch `e` read the ticket
                    // the caller published with Release after storing `cur`,
                    // so `cur` is e's launch; the caller keeps that `&T` alive
                    // and stores no other launch until `done` counts this
                    // slice, which happens only after `run` returns.
                    run(unsafe { &*launch }, u32::from(next));
                    self.done.fetch_add(1, Release);
                    ticket = self.ticket.load(Relaxed);
                }
                Err(now) => ticket = now,
            }
        }
    }

    /// A worker thread's life: wait for a launch, help with it, until stopped.
    pub(crate) fn work(&self, spin_ns: u64, run: impl Fn(&T, u32)) {
        let mut seen = 0u32;
        loop {
            let budget = SpinBudget::new(spin_ns);
            let mut until_check = CHECK_EVERY;
            loop {
                let e = self.epoch.value.load(Acquire);
                if e != seen {
                    seen = e;
                    break;
                }
                until_check -= 1;
                if until_check > 0 {
                    spin_hint();
                } else if self.parked.load(Relaxed) || budget.spent() {
                    self.sleep(seen);
                    until_check = CHECK_EVERY;
                } else {
                    until_check = CHECK_EVERY;
                    spin_hint();
                }
            }
            if self.stop.load(Relaxed) {
                return;
            }
            self.help(seen, &run);
        }
    }

    /// Sleep until the epoch is no longer `seen`.
    fn sleep(&self, seen: u32) {
        self.sleepers.fetch_add(1, Relaxed);
        fence(SeqCst); // pairs with the caller's fence in `publish`
        while self.epoch.value.load(Relaxed) == seen {
            self.epoch.wait(seen);
        }
        self.sleepers.fetch_sub(1, Relaxed);
    }
}

/// The side that publishes launches. The protocol has a single caller:
/// `Caller::new` makes a fresh dispatch with exactly one, it is not `Clone`,
/// and publishing takes `&mut self` (`Pool` keeps it behind a mutex).
pub(crate) struct Caller<T> {
    shared: Arc<Dispatch<T>>,
    /// The last epoch published; only the caller writes the epoch word.
    epoch: u32,
}

impl<T: Sync> Caller<T> {
    /// A new dispatch and its only caller.
    pub(crate) fn new() -> Self {
        Self {
            shared: Arc::new(Dispatch {
                epoch: FutexWord::new(0),
                ticket: AtomicU64::new(pack(0, 0, 0)),
                done: AtomicU32::new(0),
                sleepers: AtomicU32::new(0),
                parked: AtomicBool::new(true),
                stop: AtomicBool::new(false),
                cur: AtomicPtr::new(std::ptr::null_mut()),
            }),
            epoch: 0,
        }
    }

    /// The shared state, for a worker thread.
    pub(crate) fn dispatch(&self) -> Arc<Dispatch<T>> {
        self.shared.clone()
    }

    /// Run `count` slices of `launch` with the workers; returns when all have
    /// finished, their writes visible to this thread.
    pub(crate) fn run_sliced(&mut self, launch: &T, count: u16, run: impl Fn(&T, u32)) {
        // SAFETY: `launch` is borrowed for this whole call, which returns only
        // after `wait(count)`.
        let e = unsafe { self.publish(launch, count) };
        self.shared.help(e, &run);
        self.wait(count);
    }

    /// Step 1 of the protocol; returns the launch's epoch.
    ///
    /// # Safety
    /// `launch` stays alive and in place until `wait(count)` has returned:
    /// workers dereference the pointer stored here until then.
    pub(crate) unsafe fn publish(&mut self, launch: &T, count: u16) -> u32 {
        let d = &*self.shared;
        let e = self.epoch.wrapping_add(1);
        self.epoch = e;
        d.cur.store(std::ptr::from_ref(launch).cast_mut(), Relaxed);
        d.done.store(0, Relaxed);
        d.ticket.store(pack(e, 0, count), Release);
        d.epoch.value.store(e, Release);
        fence(SeqCst); // pairs with the sleeper's fence in `sleep`: one sees the other
        if d.sleepers.load(Relaxed) > 0 {
            d.epoch.wake_all();
        }
        e
    }

    /// Wait until all `count` slices of the current launch are done.
    pub(crate) fn wait(&self, count: u16) {
        let mut spins = 0u32;
        while self.shared.done.load(Acquire) < u32::from(count) {
            spins = spins.wrapping_add(1);
            if spins % 1024 == 0 {
                yield_now(); // a worker was descheduled mid-slice: let it have a core
            } else {
                spin_hint();
            }
        }
    }

    /// A run starts: idle workers may spin for the next launch again.
    pub(crate) fn unpark(&self) {
        self.shared.parked.store(false, Relaxed);
    }

    /// A run ended: idle workers go to sleep at once.
    pub(crate) fn park(&self) {
        self.shared.parked.store(true, Relaxed);
    }

    /// Make every worker return from `work` (call once, then join them).
    pub(crate) fn stop(&mut self) {
        let d = &*self.shared;
        d.stop.store(true, Relaxed);
        // Release: a worker that sees this epoch sees `stop` too
        d.epoch.value.fetch_add(1, Release);
        d.epoch.wake_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_fields_round_trip() {
        for (e, n, c) in [(0, 0, 0), (1, 2, 3), (u32::MAX, u16::MAX - 1, u16::MAX)] {
            assert_eq!(unpack(pack(e, n, c)), (e, n, c));
        }
        // taking the last slice does not carry into the epoch
        let t = pack(7, u16::MAX - 1, u16::MAX) + (1 << 16);
        assert_eq!(unpack(t), (7, u16::MAX, u16::MAX));
    }
}
