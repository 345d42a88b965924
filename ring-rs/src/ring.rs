//! Ring handles over an arena (spec §20–22): header init/validation, the
//! producer and consumer cursor protocol, and the wake (pending-bit) protocol.
//!
//! Cursor protocol: the producer publishes `commit` with Release after the
//! bytes below it are written; the consumer loads it with Acquire before
//! reading. Symmetrically the consumer publishes `consume` with Release after
//! it stops reading bytes below it; the producer loads it with Acquire before
//! reusing them. Every value loaded from shared memory is range-checked
//! before it is used for index maths, so a corrupt peer yields `RingError`,
//! never an out-of-bounds access.
//!
//! Wake protocol (Dekker-style, see docs/ring.md): a waiter sets its pending
//! bit in `wake` (SeqCst RMW), issues a SeqCst fence, re-checks the cursors
//! and sleeps on its eventfd only if still not ready. A publisher stores its
//! cursor, issues a SeqCst fence, loads `wake`, and signals the eventfd only
//! when it atomically clears a set bit. The two fences guarantee that either
//! the waiter's re-check sees the new cursor or the publisher sees the bit.

use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{Ordering, fence};
use std::time::Instant;

use crate::abi::{
    HEADER_LEN, RING_MAGIC, RING_VERSION, RingHeader, RingState, WAKE_ALL, WAKE_CONSUMER_WAITING,
    WAKE_PRODUCER_WAITING,
};
use crate::arena::Arena;
use crate::error::{RingError, RingFaultReason};
use crate::layout::RingLayout;
use crate::span::{Piece, contiguous, distance, split};
use crate::wake::{EventFd, WaitOutcome, remaining};

/// A validated ring inside an arena mapping: header and data pointers are
/// derived from this process's base plus the layout's offsets.
#[derive(Debug)]
pub struct Ring {
    arena: Arc<Arena>,
    header: NonNull<RingHeader>,
    data: NonNull<u8>,
    capacity: u64,
    ring_id: u64,
    data_offset: u64,
}

// SAFETY: `Ring` points into a mapping kept alive by its `Arc<Arena>`. The
// header is accessed only through atomics and the data region only through
// `copy_in`/`copy_out`/`piece_ptr`, whose callers own the bytes by protocol.
unsafe impl Send for Ring {}
// SAFETY: see `Send`; shared access goes through atomics only.
unsafe impl Sync for Ring {}

/// A snapshot of the shared header words (for status and quiescence checks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RingStatus {
    /// Header ring id.
    pub ring_id: u64,
    /// Header capacity.
    pub capacity: u64,
    /// Published commit cursor.
    pub commit: u64,
    /// Published consume cursor.
    pub consume: u64,
    /// Raw state word.
    pub state: u32,
    /// Raw wake word.
    pub wake: u32,
}

impl Ring {
    fn locate(arena: Arc<Arena>, layout: &RingLayout) -> Result<Ring, RingError> {
        layout.validate(arena.len())?;
        let header = arena
            .ptr_at(layout.header_offset, HEADER_LEN)
            .ok_or_else(|| RingError::layout("header_offset", "header outside the arena".into()))?
            .cast::<RingHeader>();
        let data = arena
            .ptr_at(layout.data_offset, layout.data_capacity)
            .ok_or_else(|| RingError::layout("data_offset", "data outside the arena".into()))?;
        // mmap bases are page aligned and validate() checked header_offset % 64.
        debug_assert_eq!(header.as_ptr() as usize % 64, 0);
        Ok(Ring {
            arena,
            header,
            data,
            capacity: layout.data_capacity,
            ring_id: layout.ring_id,
            data_offset: layout.data_offset,
        })
    }

    /// Write a fresh header (cursors 0, state open, no waiters) in place.
    /// Only the arena owner does this, before any handle to the ring exists.
    pub fn init(arena: Arc<Arena>, layout: &RingLayout) -> Result<Ring, RingError> {
        let ring = Self::locate(arena, layout)?;
        let h = ring.header();
        h.magic.store(0, Ordering::Relaxed);
        h.commit.store(0, Ordering::Relaxed);
        h.consume.store(0, Ordering::Relaxed);
        h.wake.store(0, Ordering::Relaxed);
        h.version.store(RING_VERSION, Ordering::Relaxed);
        h.header_len.store(HEADER_LEN as u16, Ordering::Relaxed);
        h.ring_id.store(layout.ring_id, Ordering::Relaxed);
        h.capacity.store(layout.data_capacity, Ordering::Relaxed);
        h.state.store(RingState::Open as u32, Ordering::Relaxed);
        h.magic.store(RING_MAGIC, Ordering::Release);
        Ok(ring)
    }

    /// Validate an initialised header against `layout`.
    pub fn open(arena: Arc<Arena>, layout: &RingLayout) -> Result<Ring, RingError> {
        let ring = Self::locate(arena, layout)?;
        let h = ring.header();
        let magic = h.magic.load(Ordering::Acquire);
        if magic != RING_MAGIC {
            return Err(RingError::layout(
                "magic",
                format!("ring magic {magic:#010x} != {RING_MAGIC:#010x}"),
            ));
        }
        let version = h.version.load(Ordering::Relaxed);
        if version != RING_VERSION {
            return Err(RingError::fault(
                RingFaultReason::UnsupportedRingVersion,
                "version",
                format!("ring version {version} unsupported (expected {RING_VERSION})"),
            ));
        }
        let header_len = h.header_len.load(Ordering::Relaxed);
        if u64::from(header_len) != HEADER_LEN {
            return Err(RingError::layout(
                "header_len",
                format!("header_len {header_len} != {HEADER_LEN}"),
            ));
        }
        let capacity = h.capacity.load(Ordering::Relaxed);
        if capacity != layout.data_capacity {
            return Err(RingError::layout(
                "capacity",
                format!(
                    "header capacity {capacity} != layout data_capacity {}",
                    layout.data_capacity
                ),
            ));
        }
        let ring_id = h.ring_id.load(Ordering::Relaxed);
        if ring_id != layout.ring_id {
            return Err(RingError::layout(
                "ring_id",
                format!("header ring_id {ring_id} != layout ring_id {}", layout.ring_id),
            ));
        }
        ring.state()?;
        let wake = h.wake.load(Ordering::Relaxed);
        if wake & !WAKE_ALL != 0 {
            return Err(RingError::state(
                "wake",
                format!("wake word {wake:#x} has unknown bits"),
            ));
        }
        let consume = h.consume.load(Ordering::Acquire);
        let commit = h.commit.load(Ordering::Acquire);
        if distance(consume, commit, capacity).is_none() {
            let field = if commit < consume { "consume" } else { "commit" };
            return Err(RingError::state(
                field,
                format!("commit {commit} is not within consume {consume} + capacity {capacity}"),
            ));
        }
        Ok(ring)
    }

    /// Mark this ring faulted without being its producer or consumer (e.g. a
    /// supervisor after a worker crash). Waiters wake only if the caller also
    /// signals the ring's eventfds. The ring must still validate against the
    /// layout (magic, ring_id, ...), so a stale request cannot fault a ring
    /// that has since replaced it in the same range (ring ids are unique).
    pub fn set_faulted(&self) {
        self.header()
            .state
            .store(RingState::Faulted as u32, Ordering::SeqCst);
        fence(Ordering::SeqCst);
    }

    /// The shared header.
    pub fn header(&self) -> &RingHeader {
        // SAFETY: `header` is in bounds of the mapping (checked in `locate`),
        // 64-byte aligned, and the mapping lives as long as `self.arena`.
        // `RingHeader` consists solely of atomics, so shared references to
        // memory other processes mutate concurrently are sound.
        unsafe { self.header.as_ref() }
    }

    /// Data capacity in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Ring id.
    pub fn ring_id(&self) -> u64 {
        self.ring_id
    }

    /// Arena offset of the data region.
    pub fn data_offset(&self) -> u64 {
        self.data_offset
    }

    /// The arena this ring lives in.
    pub fn arena(&self) -> &Arc<Arena> {
        &self.arena
    }

    /// Decoded state word; an unknown value is `RingStateInvalid`.
    pub fn state(&self) -> Result<RingState, RingError> {
        let raw = self.header().state.load(Ordering::Acquire);
        RingState::from_raw(raw)
            .ok_or_else(|| RingError::state("state", format!("ring state word {raw} is invalid")))
    }

    /// Raw header words.
    pub fn status(&self) -> RingStatus {
        let h = self.header();
        RingStatus {
            ring_id: h.ring_id.load(Ordering::Relaxed),
            capacity: h.capacity.load(Ordering::Relaxed),
            commit: h.commit.load(Ordering::Acquire),
            consume: h.consume.load(Ordering::Acquire),
            state: h.state.load(Ordering::Acquire),
            wake: h.wake.load(Ordering::Relaxed),
        }
    }

    /// Process-local pointer to `piece` of the data region.
    pub(crate) fn piece_ptr(&self, piece: Piece) -> NonNull<u8> {
        assert!(
            piece
                .phys
                .checked_add(piece.len)
                .is_some_and(|end| end <= self.capacity)
        );
        // `phys <= capacity` and the data region lies inside the mapping, so
        // the pointer stays in bounds; wrapping_add keeps this safe code.
        let p = self.data.as_ptr().wrapping_add(piece.phys as usize);
        NonNull::new(p).unwrap_or(self.data)
    }

    /// Copy `src` into `piece` (`src.len() == piece.len`). The caller owns
    /// `piece` as producer: it lies in free space, beyond `commit`.
    fn copy_in(&self, piece: Piece, src: &[u8]) {
        assert_eq!(src.len() as u64, piece.len);
        let dst = self.piece_ptr(piece);
        // SAFETY: `dst .. dst + len` is inside the data region (asserted in
        // `piece_ptr`) and owned by the producer by the cursor protocol, so
        // the consumer does not read it concurrently. `ptr::copy` tolerates
        // `src` overlapping the arena.
        unsafe { std::ptr::copy(src.as_ptr(), dst.as_ptr(), src.len()) }
    }

    /// Copy `piece` into `dst` (`dst.len() == piece.len`). The caller owns
    /// `piece` as consumer: it lies in `consume .. commit`.
    fn copy_out(&self, piece: Piece, dst: &mut [u8]) {
        assert_eq!(dst.len() as u64, piece.len);
        let src = self.piece_ptr(piece);
        // SAFETY: `src .. src + len` is inside the data region and committed
        // (the producer published it with Release and we loaded commit with
        // Acquire), so the producer does not write it concurrently.
        unsafe { std::ptr::copy(src.as_ptr(), dst.as_mut_ptr(), dst.len()) }
    }
}

/// Which side of the ring a handle is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Writes bytes, advances `commit`, waits for free space.
    Producer,
    /// Reads bytes, advances `consume`, waits for readable bytes.
    Consumer,
}

/// The process-shared part of one handle: the ring plus both eventfds.
/// `Sync`, so waits, close and fault can run beside the cursor-owning side.
#[derive(Debug)]
pub struct RingShared {
    ring: Ring,
    readable: EventFd,
    writable: EventFd,
}

impl RingShared {
    /// Combine an opened ring with its readable-hint and writable-hint eventfds.
    pub fn new(ring: Ring, readable: EventFd, writable: EventFd) -> Self {
        Self {
            ring,
            readable,
            writable,
        }
    }

    /// The ring.
    pub fn ring(&self) -> &Ring {
        &self.ring
    }

    /// Eventfd the producer signals and the consumer waits on.
    pub fn readable_fd(&self) -> &EventFd {
        &self.readable
    }

    /// Eventfd the consumer signals and the producer waits on.
    pub fn writable_fd(&self) -> &EventFd {
        &self.writable
    }

    /// Free bytes for a producer whose write cursor is `write`.
    pub fn free_from(&self, write: u64) -> Result<u64, RingError> {
        let consume = self.ring.header().consume.load(Ordering::Acquire);
        let used = distance(consume, write, self.ring.capacity).ok_or_else(|| {
            RingError::state(
                "consume",
                format!(
                    "consume {consume} is inconsistent with write cursor {write} (capacity {})",
                    self.ring.capacity
                ),
            )
        })?;
        Ok(self.ring.capacity - used)
    }

    /// Readable bytes for a consumer whose cursor is `consume`.
    pub fn avail_from(&self, consume: u64) -> Result<u64, RingError> {
        let commit = self.ring.header().commit.load(Ordering::Acquire);
        distance(consume, commit, self.ring.capacity).ok_or_else(|| {
            RingError::state(
                "commit",
                format!(
                    "commit {commit} is inconsistent with consume {consume} (capacity {})",
                    self.ring.capacity
                ),
            )
        })
    }

    fn ready(&self, side: Side, cursor: u64) -> Result<bool, RingError> {
        if self.ring.state()? != RingState::Open {
            return Ok(true);
        }
        Ok(match side {
            Side::Producer => self.free_from(cursor)? > 0,
            Side::Consumer => self.avail_from(cursor)? > 0,
        })
    }

    fn bit_and_fd(&self, side: Side) -> (u32, &EventFd) {
        match side {
            Side::Producer => (WAKE_PRODUCER_WAITING, &self.writable),
            Side::Consumer => (WAKE_CONSUMER_WAITING, &self.readable),
        }
    }

    /// Prepare to sleep: returns `true` when `side` is ready now (bytes or
    /// space available, or ring not open) and must not sleep; otherwise the
    /// pending bit is set and a later publish by the peer will signal the
    /// side's eventfd.
    pub fn arm(&self, side: Side, cursor: u64) -> Result<bool, RingError> {
        if self.ready(side, cursor)? {
            return Ok(true);
        }
        #[cfg(test)]
        race::hit(race::Point::BeforeArm);
        let (bit, _) = self.bit_and_fd(side);
        let wake = &self.ring.header().wake;
        wake.fetch_or(bit, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        #[cfg(test)]
        race::hit(race::Point::BeforeRecheck);
        if self.ready(side, cursor)? {
            wake.fetch_and(!bit, Ordering::SeqCst);
            return Ok(true);
        }
        Ok(false)
    }

    fn disarm(&self, side: Side) {
        let (bit, _) = self.bit_and_fd(side);
        self.ring.header().wake.fetch_and(!bit, Ordering::SeqCst);
    }

    /// Wake the peer of `publisher` if it announced that it sleeps.
    fn notify_peer(&self, publisher: Side) {
        let peer = match publisher {
            Side::Producer => Side::Consumer,
            Side::Consumer => Side::Producer,
        };
        let (bit, fd) = self.bit_and_fd(peer);
        fence(Ordering::SeqCst);
        let wake = &self.ring.header().wake;
        if wake.load(Ordering::Relaxed) & bit != 0 && wake.fetch_and(!bit, Ordering::AcqRel) & bit != 0 {
            fd.signal();
        }
    }

    /// Block until `side` is ready or `deadline` passes. `Interrupted`
    /// lets an embedding runtime check for signals and call again.
    pub fn wait(&self, side: Side, cursor: u64, deadline: Option<Instant>) -> Result<WaitOutcome, RingError> {
        let (_, fd) = self.bit_and_fd(side);
        loop {
            if self.arm(side, cursor)? {
                return Ok(WaitOutcome::Ready);
            }
            match fd
                .wait(remaining(deadline))
                .map_err(|e| RingError::io("wake", &e))?
            {
                WaitOutcome::Ready => {
                    fd.drain();
                }
                other => {
                    self.disarm(side);
                    if self.ready(side, cursor)? {
                        return Ok(WaitOutcome::Ready);
                    }
                    return Ok(other);
                }
            }
        }
    }

    /// Reset this side's eventfd after an external poller (asyncio) saw it.
    pub fn ack(&self, side: Side) -> bool {
        self.bit_and_fd(side).1.drain()
    }

    /// Open -> Closed (a faulted ring stays faulted); wakes both sides.
    pub fn close(&self) -> Result<RingState, RingError> {
        let state = &self.ring.header().state;
        let _ = state.compare_exchange(
            RingState::Open as u32,
            RingState::Closed as u32,
            Ordering::SeqCst,
            Ordering::SeqCst,
        );
        self.wake_both();
        self.ring.state()
    }

    /// Any state -> Faulted; wakes both sides.
    pub fn fault(&self) {
        self.ring
            .header()
            .state
            .store(RingState::Faulted as u32, Ordering::SeqCst);
        self.wake_both();
    }

    fn wake_both(&self) {
        fence(Ordering::SeqCst);
        self.readable.signal();
        self.writable.signal();
    }
}

fn require_open(shared: &RingShared) -> Result<(), RingError> {
    match shared.ring.state()? {
        RingState::Open => Ok(()),
        s => Err(RingError::not_open(
            s,
            format!("ring {} is {}", shared.ring.ring_id, s.name()),
        )),
    }
}

fn require_not_faulted(shared: &RingShared) -> Result<(), RingError> {
    match shared.ring.state()? {
        RingState::Faulted => Err(RingError::not_open(
            RingState::Faulted,
            format!("ring {} is faulted", shared.ring.ring_id),
        )),
        _ => Ok(()),
    }
}

/// The single producer of a ring. Owns the write side of the cursors.
#[derive(Debug)]
pub struct Producer {
    shared: Arc<RingShared>,
    /// Last published commit; only this handle writes header `commit`.
    commit: u64,
    /// Length of the span handed out by the last `writable_span`; the local
    /// write cursor is `commit + reserved`. Invariant: `reserved <= free`.
    reserved: u64,
}

impl Producer {
    /// Attach to an opened ring; the write cursor resumes at `commit`.
    pub fn new(shared: Arc<RingShared>) -> Self {
        let commit = shared.ring.header().commit.load(Ordering::Acquire);
        Self {
            shared,
            commit,
            reserved: 0,
        }
    }

    /// Shared part (ring, eventfds).
    pub fn shared(&self) -> &Arc<RingShared> {
        &self.shared
    }

    /// Local write cursor: `commit + reserved`.
    pub fn write_cursor(&self) -> u64 {
        self.commit.wrapping_add(self.reserved)
    }

    /// Published commit cursor.
    pub fn commit(&self) -> u64 {
        self.commit
    }

    /// Free bytes now (not limited to one contiguous span).
    pub fn free(&self) -> Result<u64, RingError> {
        self.shared.free_from(self.commit)
    }

    /// Reserve the contiguous free span at `commit`, at most `max` bytes.
    /// Replaces any earlier reservation. Empty when the ring is full.
    pub fn writable_span(&mut self, max: u64) -> Result<Piece, RingError> {
        require_open(&self.shared)?;
        let free = self.free()?;
        let piece = contiguous(self.commit, free, self.shared.ring.capacity, max);
        self.reserved = piece.len;
        Ok(piece)
    }

    /// Publish `n` bytes of the reserved span (Release) and wake the consumer
    /// if it sleeps. `n` may not exceed the reservation.
    pub fn advance_commit(&mut self, n: u64) -> Result<(), RingError> {
        if n > self.reserved {
            return Err(RingError::usage(
                "n",
                format!(
                    "advance_commit({n}) exceeds the {}-byte writable span",
                    self.reserved
                ),
            ));
        }
        if n == 0 {
            return Ok(());
        }
        require_open(&self.shared)?;
        self.publish(n);
        Ok(())
    }

    fn publish(&mut self, n: u64) {
        self.commit = self.commit.wrapping_add(n);
        self.reserved = 0;
        self.shared
            .ring
            .header()
            .commit
            .store(self.commit, Ordering::Release);
        self.shared.notify_peer(Side::Producer);
    }

    /// Copy as much of `src` as fits (across the wrap) and publish it in one
    /// commit. Returns the byte count (0 when full). Drops any reservation.
    pub fn write(&mut self, src: &[u8]) -> Result<usize, RingError> {
        require_open(&self.shared)?;
        self.reserved = 0;
        let n = self.free()?.min(src.len() as u64);
        if n == 0 {
            return Ok(0);
        }
        let mut off = 0usize;
        for piece in split(self.commit, n, self.shared.ring.capacity) {
            let len = piece.len as usize;
            self.shared.ring.copy_in(piece, &src[off..off + len]);
            off += len;
        }
        debug_assert_eq!(off as u64, n);
        self.publish(n);
        Ok(off)
    }

    /// See [`RingShared::arm`].
    pub fn arm(&self) -> Result<bool, RingError> {
        self.shared.arm(Side::Producer, self.commit)
    }

    /// Block until free space exists or the ring is not open.
    pub fn wait(&self, deadline: Option<Instant>) -> Result<WaitOutcome, RingError> {
        self.shared.wait(Side::Producer, self.commit, deadline)
    }
}

/// The single consumer of a ring. Owns the read side of the cursors.
#[derive(Debug)]
pub struct Consumer {
    shared: Arc<RingShared>,
    /// Last published consume; only this handle writes header `consume`.
    consume: u64,
}

impl Consumer {
    /// Attach to an opened ring; reading resumes at `consume`.
    pub fn new(shared: Arc<RingShared>) -> Self {
        let consume = shared.ring.header().consume.load(Ordering::Acquire);
        Self { shared, consume }
    }

    /// Shared part (ring, eventfds).
    pub fn shared(&self) -> &Arc<RingShared> {
        &self.shared
    }

    /// Published consume cursor.
    pub fn consume(&self) -> u64 {
        self.consume
    }

    /// Committed, unconsumed bytes now.
    pub fn readable(&self) -> Result<u64, RingError> {
        self.shared.avail_from(self.consume)
    }

    /// The contiguous readable span at `consume`, at most `max` bytes.
    /// Allowed on an open or closed ring (draining), not on a faulted one.
    pub fn readable_span(&self, max: u64) -> Result<Piece, RingError> {
        require_not_faulted(&self.shared)?;
        let avail = self.readable()?;
        Ok(contiguous(self.consume, avail, self.shared.ring.capacity, max))
    }

    /// Release `n` read bytes to the producer (Release) and wake it if it
    /// sleeps. `n` may not exceed the readable count.
    pub fn advance_consume(&mut self, n: u64) -> Result<(), RingError> {
        if n == 0 {
            return Ok(());
        }
        require_not_faulted(&self.shared)?;
        let avail = self.readable()?;
        if n > avail {
            return Err(RingError::usage(
                "n",
                format!("advance_consume({n}) exceeds the {avail} readable bytes"),
            ));
        }
        self.release(n);
        Ok(())
    }

    fn release(&mut self, n: u64) {
        self.consume = self.consume.wrapping_add(n);
        self.shared
            .ring
            .header()
            .consume
            .store(self.consume, Ordering::Release);
        self.shared.notify_peer(Side::Consumer);
    }

    fn copy_readable(&self, dst: &mut [u8]) -> Result<usize, RingError> {
        require_not_faulted(&self.shared)?;
        let n = self.readable()?.min(dst.len() as u64);
        let mut off = 0usize;
        for piece in split(self.consume, n, self.shared.ring.capacity) {
            let len = piece.len as usize;
            self.shared.ring.copy_out(piece, &mut dst[off..off + len]);
            off += len;
        }
        Ok(off)
    }

    /// Copy up to `dst.len()` readable bytes (across the wrap) and release
    /// them in one consume. Returns the count (0 when empty).
    pub fn read_into(&mut self, dst: &mut [u8]) -> Result<usize, RingError> {
        let n = self.copy_readable(dst)?;
        if n > 0 {
            self.release(n as u64);
        }
        Ok(n)
    }

    /// Copy up to `dst.len()` readable bytes without consuming them.
    pub fn peek_into(&self, dst: &mut [u8]) -> Result<usize, RingError> {
        self.copy_readable(dst)
    }

    /// See [`RingShared::arm`].
    pub fn arm(&self) -> Result<bool, RingError> {
        self.shared.arm(Side::Consumer, self.consume)
    }

    /// Block until bytes are readable or the ring is not open.
    pub fn wait(&self, deadline: Option<Instant>) -> Result<WaitOutcome, RingError> {
        self.shared.wait(Side::Consumer, self.consume, deadline)
    }
}

/// Deterministic interleavings of the wake protocol: a test installs a
/// closure that runs at a chosen point inside `arm`, playing the peer.
#[cfg(test)]
mod race {
    use std::cell::RefCell;

    #[derive(Clone, Copy, PartialEq, Eq, Debug)]
    pub enum Point {
        BeforeArm,
        BeforeRecheck,
    }

    type Hook = (Point, Box<dyn FnOnce()>);

    thread_local! {
        static HOOK: RefCell<Option<Hook>> = const { RefCell::new(None) };
    }

    pub fn install(point: Point, f: impl FnOnce() + 'static) {
        HOOK.with(|h| *h.borrow_mut() = Some((point, Box::new(f))));
    }

    pub fn hit(point: Point) {
        let hook = HOOK.with(|h| {
            let mut h = h.borrow_mut();
            if h.as_ref().is_some_and(|(p, _)| *p == point) {
                h.take()
            } else {
                None
            }
        });
        if let Some((_, f)) = hook {
            f();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::race::{Point, install};
    use super::*;
    use std::cell::RefCell;
    use std::os::fd::AsFd;
    use std::rc::Rc;
    use std::time::Duration;

    fn pair() -> (Rc<RefCell<Producer>>, Consumer) {
        let fd = Arena::create_memfd("race", 1 << 16).unwrap();
        let arena = Arc::new(Arena::map(fd.as_fd(), 1 << 16).unwrap());
        let layout = RingLayout::for_range(1, 0, 64, 64).unwrap();
        Ring::init(arena.clone(), &layout).unwrap();
        let shared = Arc::new(RingShared::new(
            Ring::open(arena, &layout).unwrap(),
            EventFd::new().unwrap(),
            EventFd::new().unwrap(),
        ));
        (
            Rc::new(RefCell::new(Producer::new(shared.clone()))),
            Consumer::new(shared),
        )
    }

    fn soon() -> Option<Instant> {
        Some(Instant::now() + Duration::from_millis(200))
    }

    /// The peer publishes after the waiter's first check but before its bit
    /// is set: the publisher sees no bit and sends no hint, so only the
    /// waiter's re-check after arming prevents sleeping on a readable ring.
    #[test]
    fn publish_between_check_and_arm_is_not_lost() {
        let (p, mut c) = pair();
        let peer = p.clone();
        install(Point::BeforeArm, move || {
            assert_eq!(peer.borrow_mut().write(b"x").unwrap(), 1);
        });
        assert!(
            c.arm().unwrap(),
            "waiter must see the byte published before it armed"
        );
        assert_eq!(c.shared().ring().status().wake, 0);
        assert_eq!(c.wait(soon()).unwrap(), WaitOutcome::Ready);
        assert_eq!(c.read_into(&mut [0; 4]).unwrap(), 1);
    }

    /// The peer publishes after the bit is set: it must signal (the waiter's
    /// re-check also sees the byte); the stale hint then only causes one
    /// spurious, harmless wakeup.
    #[test]
    fn publish_after_arm_signals_and_stale_hint_is_harmless() {
        let (p, mut c) = pair();
        let peer = p.clone();
        install(Point::BeforeRecheck, move || {
            assert_eq!(peer.borrow_mut().write(b"y").unwrap(), 1);
        });
        assert!(c.arm().unwrap());
        assert!(
            c.shared().readable_fd().drain(),
            "publisher saw the bit and signalled"
        );
        assert_eq!(c.read_into(&mut [0; 4]).unwrap(), 1);
        c.shared().readable_fd().signal(); // a stale hint left over
        assert_eq!(
            c.wait(Some(Instant::now() + Duration::from_millis(30))).unwrap(),
            WaitOutcome::TimedOut
        );
    }

    /// Same race on the producer side: the consumer frees space between the
    /// producer's full check and its arming.
    #[test]
    fn free_between_check_and_arm_is_not_lost() {
        let (p, c) = pair();
        assert_eq!(p.borrow_mut().write(&[7; 64]).unwrap(), 64);
        install(Point::BeforeArm, move || {
            let mut c = c;
            assert_eq!(c.read_into(&mut [0; 8]).unwrap(), 8);
        });
        assert!(
            p.borrow().arm().unwrap(),
            "producer must see the space freed before it armed"
        );
        assert_eq!(p.borrow().wait(soon()).unwrap(), WaitOutcome::Ready);
    }
}
