//! The synchronisation primitives the dispatch protocol is written against:
//! std atomics and a Linux futex in the build, loom's modelled ones under
//! `cfg(all(test, loom))` (loom is a dev-dependency), so the model test
//! checks the protocol's own code.

#[cfg(all(test, loom))]
pub(crate) use loom::sync::Arc;
#[cfg(all(test, loom))]
pub(crate) use loom::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, fence};
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::Arc;
#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU32, AtomicU64, fence};

/// How many spins an idle worker makes between looks at the clock and the
/// parked flag (one under loom: every spin is a scheduling point there).
pub(crate) const CHECK_EVERY: u32 = if cfg!(all(test, loom)) { 1 } else { 64 };

/// One busy-wait step: a CPU pause hint (a loom yield in the model, where a
/// spin must let the other threads run).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(all(test, loom))]
    loom::thread::yield_now();
    #[cfg(not(all(test, loom)))]
    std::hint::spin_loop();
}

/// Give the core to another thread (sched_yield).
pub(crate) fn yield_now() {
    #[cfg(all(test, loom))]
    loom::thread::yield_now();
    #[cfg(not(all(test, loom)))]
    std::thread::yield_now();
}

/// A time budget for spinning; under loom it is spent at once (time is not
/// modelled, and a waiter that sleeps at its first chance covers the
/// interleavings a longer spin has too).
pub(crate) struct SpinBudget {
    #[cfg(not(all(test, loom)))]
    until: std::time::Instant,
}

impl SpinBudget {
    pub(crate) fn new(spin_ns: u64) -> Self {
        #[cfg(all(test, loom))]
        let _ = spin_ns;
        Self {
            #[cfg(not(all(test, loom)))]
            until: std::time::Instant::now() + std::time::Duration::from_nanos(spin_ns),
        }
    }

    pub(crate) fn spent(&self) -> bool {
        #[cfg(all(test, loom))]
        return true;
        #[cfg(not(all(test, loom)))]
        return std::time::Instant::now() >= self.until;
    }
}

/// A 32-bit word threads can sleep on until it changes: a private futex.
/// The model stands a mutex and condition variable in for the kernel's
/// futex queue: the compare-and-sleep in `wait` and the wake-up in `wake_all`
/// are atomic with respect to each other, as the kernel makes them.
pub(crate) struct FutexWord {
    pub(crate) value: AtomicU32,
    #[cfg(all(test, loom))]
    queue: (loom::sync::Mutex<()>, loom::sync::Condvar),
}

impl FutexWord {
    pub(crate) fn new(value: u32) -> Self {
        Self {
            value: AtomicU32::new(value),
            #[cfg(all(test, loom))]
            queue: (loom::sync::Mutex::new(()), loom::sync::Condvar::new()),
        }
    }

    /// Sleep while the word is `expected`; may return spuriously.
    pub(crate) fn wait(&self, expected: u32) {
        #[cfg(all(test, loom))]
        {
            let guard = self.queue.0.lock().unwrap();
            if self.value.load(std::sync::atomic::Ordering::Relaxed) == expected {
                drop(self.queue.1.wait(guard).unwrap());
            }
        }
        #[cfg(not(all(test, loom)))]
        {
            use rustix::thread::futex;
            // EAGAIN (the word changed) and EINTR are the spurious returns the
            // caller's loop re-checks; nothing else can fail on a valid word.
            let _ = futex::wait(&self.value, futex::Flags::PRIVATE, expected, None);
        }
    }

    /// Wake every thread sleeping in `wait`.
    pub(crate) fn wake_all(&self) {
        #[cfg(all(test, loom))]
        {
            let _guard = self.queue.0.lock().unwrap();
            self.queue.1.notify_all();
        }
        #[cfg(not(all(test, loom)))]
        {
            use rustix::thread::futex;
            let _ = futex::wake(&self.value, futex::Flags::PRIVATE, i32::MAX as u32);
        }
    }
}
