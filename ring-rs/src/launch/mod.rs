//! Native replay of a captured graph of tinygrad CPU kernels, for
//! `swactor.worker.compute.replay`.
//!
//! Why native: a decode step of the default model is ~750 kernel calls, ~120
//! of them matvecs split into core_id slices over a few cores. From Python
//! each call costs ~1-2 us and each hand-off of slices to a thread pool ~50 us
//! (wake-up of a sleeping thread + a future), more than a small matvec takes;
//! here a whole step is one call (`Pool::run` over a `LaunchTable`), and the
//! slices of a matvec are taken one by one by the calling thread and by pool
//! threads that, between launches, spin for a short while before they sleep
//! on a futex (`dispatch`).

mod dispatch;
#[cfg(all(test, loom))]
mod model;
mod pool;
mod sync;
mod table;

pub use pool::Pool;
pub use table::{LaunchError, LaunchTable, MAX_ARGS};
