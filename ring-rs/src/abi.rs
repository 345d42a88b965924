//! The ring header as it lives in shared memory (spec §20).
//!
//! Field order and widths are the spec's. Byte offsets (little-endian, x86-64):
//!
//! | offset | field        | width | written by                   |
//! |--------|--------------|-------|------------------------------|
//! | 0      | `magic`      | u32   | `init_ring` only             |
//! | 4      | `version`    | u16   | `init_ring` only             |
//! | 6      | `header_len` | u16   | `init_ring` only (= 256)     |
//! | 8      | `ring_id`    | u64   | `init_ring` only             |
//! | 16     | `capacity`   | u64   | `init_ring` only             |
//! | 64     | `commit`     | u64   | producer (Release)           |
//! | 128    | `consume`    | u64   | consumer (Release)           |
//! | 192    | `state`      | u32   | either side (close / fault)  |
//! | 196    | `wake`       | u32   | waiter sets, other side clears|
//!
//! `commit` and `consume` sit on their own 64-byte cache lines so producer
//! and consumer never false-share; `header_len` (256) covers that padding.
//! The identity fields are plain integers in the ABI; Rust declares them
//! atomic (identical size and alignment) only so that reading memory another
//! process could scribble on is defined behaviour. They are accessed Relaxed.

use core::mem::{offset_of, size_of};
use core::sync::atomic::{AtomicU16, AtomicU32, AtomicU64};

/// `b"SWRG"` read as a little-endian u32.
pub const RING_MAGIC: u32 = u32::from_le_bytes(*b"SWRG");
/// ABI version of [`RingHeader`].
pub const RING_VERSION: u16 = 1;
/// Bytes covered by the header, padding included.
pub const HEADER_LEN: u64 = 256;
/// Alignment of the header (and minimum alignment of a ring range).
pub const HEADER_ALIGN: u64 = 64;

/// `wake` bit: the consumer is (about to be) asleep waiting for readable bytes.
pub const WAKE_CONSUMER_WAITING: u32 = 1;
/// `wake` bit: the producer is (about to be) asleep waiting for free space.
pub const WAKE_PRODUCER_WAITING: u32 = 2;
/// Every bit that may legally be set in `wake`.
pub const WAKE_ALL: u32 = WAKE_CONSUMER_WAITING | WAKE_PRODUCER_WAITING;

/// Shared ring header. Never constructed by value: it is only ever viewed
/// in place inside an arena mapping (see `ring::Ring::header`).
#[repr(C, align(64))]
pub struct RingHeader {
    /// [`RING_MAGIC`].
    pub magic: AtomicU32,
    /// [`RING_VERSION`].
    pub version: AtomicU16,
    /// [`HEADER_LEN`]: size of this struct, padding included.
    pub header_len: AtomicU16,
    /// Node-unique ring id; never reused (spec §6).
    pub ring_id: AtomicU64,
    /// Data capacity in bytes; equals the layout's `data_capacity`.
    pub capacity: AtomicU64,
    _pad_identity: [AtomicU64; 5],
    /// Logical position one past the committed readable prefix. Written only
    /// by the producer, with Release, after the bytes below it are valid.
    /// Invariant: `consume <= commit <= consume + capacity` (wrapping u64).
    pub commit: AtomicU64,
    _pad_commit: [AtomicU64; 7],
    /// Logical position of the first byte the consumer has not released.
    /// Written only by the consumer, with Release, after it no longer reads
    /// the bytes below it. Monotonic, never passes `commit`.
    pub consume: AtomicU64,
    _pad_consume: [AtomicU64; 7],
    /// One of [`RingState`] as u32 (0 = never initialised).
    pub state: AtomicU32,
    /// Pending-waiter bits ([`WAKE_CONSUMER_WAITING`], [`WAKE_PRODUCER_WAITING`]).
    pub wake: AtomicU32,
    _pad_tail: [AtomicU64; 7],
}

const _: () = {
    assert!(offset_of!(RingHeader, magic) == 0);
    assert!(offset_of!(RingHeader, version) == 4);
    assert!(offset_of!(RingHeader, header_len) == 6);
    assert!(offset_of!(RingHeader, ring_id) == 8);
    assert!(offset_of!(RingHeader, capacity) == 16);
    assert!(offset_of!(RingHeader, commit) == 64);
    assert!(offset_of!(RingHeader, consume) == 128);
    assert!(offset_of!(RingHeader, state) == 192);
    assert!(offset_of!(RingHeader, wake) == 196);
    assert!(size_of::<RingHeader>() as u64 == HEADER_LEN);
    assert!(core::mem::align_of::<RingHeader>() as u64 == HEADER_ALIGN);
};

/// Lifecycle word of a ring (header `state`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum RingState {
    /// Bytes may be produced and consumed.
    Open = 1,
    /// Orderly end: no more commits; the consumer may drain what is committed.
    Closed = 2,
    /// Broken: neither side may make progress.
    Faulted = 3,
}

impl RingState {
    /// Decode the raw header word; `None` for anything but 1, 2, 3.
    pub fn from_raw(raw: u32) -> Option<Self> {
        match raw {
            1 => Some(Self::Open),
            2 => Some(Self::Closed),
            3 => Some(Self::Faulted),
            _ => None,
        }
    }

    /// Lower-case name, as used in errors and docs.
    pub fn name(self) -> &'static str {
        match self {
            Self::Open => "open",
            Self::Closed => "closed",
            Self::Faulted => "faulted",
        }
    }
}
