//! swactor ring-rs: single-producer/single-consumer byte rings inside a
//! shared memfd arena (spec §17, §20–22).
//!
//! The crate has a pure-Rust core (`abi`, `layout`, `arena`, `span`, `ring`,
//! `wake`, `object`) and, behind the `python` feature, the PyO3 module
//! `swactor_ring`. It also carries the compute process's kernel launcher
//! (`launch`, x86-64 and AArch64 only), so that one extension is built at
//! install time. `unsafe` lives only where the shared-memory ABI demands it
//! (`arena`: mmap/munmap; `ring`: deriving header/data pointers and copying
//! payload bytes; `py::span`: the buffer protocol) and where the launcher
//! calls kernels by address, each block with a `// SAFETY:` line.
#![deny(unsafe_op_in_unsafe_fn)]
#![warn(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod arena;
pub mod error;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub mod launch;
pub mod layout;
pub mod object;
pub mod ring;
pub mod span;
pub mod wake;

#[cfg(feature = "python")]
mod py;

pub use abi::{RingHeader, RingState};
pub use arena::Arena;
pub use error::{RingError, RingFaultReason};
pub use layout::RingLayout;
pub use object::{ObjectFailure, ObjectHeader};
pub use ring::{Consumer, Producer, RingShared, RingStatus};
pub use wake::{EventFd, WaitOutcome};
