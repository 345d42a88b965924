//! Arena, RingLayout, Producer, Consumer and Span for Python (spec §18–22).
//!
//! Threading: handles are `frozen` pyclasses; local cursors sit behind a
//! mutex and blocking waits release the GIL. Span-export bookkeeping relies
//! on the GIL: the export check and the epoch bump in `advance_*` run
//! without releasing it, so no export can slip in between.

use std::os::fd::{BorrowedFd, IntoRawFd};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::{io_err, ring_err, usage_err};
use crate::abi::{RingState, WAKE_CONSUMER_WAITING, WAKE_PRODUCER_WAITING};
use crate::arena::Arena;
use crate::layout::RingLayout;
use crate::ring::{Consumer, Producer, Ring, RingShared, RingStatus, Side};
use crate::span::Piece;
use crate::wake::{EventFd, WaitOutcome};

/// Borrow a C-contiguous bytes-like object as `&[u8]` for the duration of `f`.
pub fn with_bytes<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&[u8]) -> R) -> PyResult<R> {
    let buf = PyUntypedBuffer::get(obj)?;
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err("buffer must be C-contiguous"));
    }
    let len = buf.len_bytes();
    if len == 0 {
        return Ok(f(&[]));
    }
    // SAFETY: the buffer export pins `len` contiguous, initialised bytes at
    // `buf_ptr` until `buf` is dropped after `f` returns; the GIL is held
    // throughout, so no Python code resizes or frees the exporter meanwhile.
    let bytes = unsafe { std::slice::from_raw_parts(buf.buf_ptr().cast::<u8>(), len) };
    Ok(f(bytes))
}

/// Borrow a writable C-contiguous buffer as `&mut [u8]` for the duration of `f`.
pub fn with_bytes_mut<R>(obj: &Bound<'_, PyAny>, f: impl FnOnce(&mut [u8]) -> R) -> PyResult<R> {
    let buf = PyUntypedBuffer::get(obj)?;
    if buf.readonly() {
        return Err(PyTypeError::new_err("destination buffer is read-only"));
    }
    if !buf.is_c_contiguous() {
        return Err(PyBufferError::new_err("buffer must be C-contiguous"));
    }
    let len = buf.len_bytes();
    if len == 0 {
        return Ok(f(&mut []));
    }
    // SAFETY: as in `with_bytes`, and the exporter declared the memory
    // writable. No other Rust reference to it exists during `f` (spans of
    // the same handle are refused by the export guard before we get here).
    let bytes = unsafe { std::slice::from_raw_parts_mut(buf.buf_ptr().cast::<u8>(), len) };
    Ok(f(bytes))
}

fn borrow_fd(py: Python<'_>, fd: i32, field: &str) -> PyResult<BorrowedFd<'static>> {
    if fd < 0 {
        return Err(usage_err(
            py,
            field,
            format!("{field} {fd} is not a file descriptor"),
        ));
    }
    // SAFETY: the fd is only used for the duration of the calling function
    // (fstat/mmap or dup), during which the caller keeps it open; a closed fd
    // makes those syscalls fail with EBADF, which we report.
    Ok(unsafe { BorrowedFd::borrow_raw(fd) })
}

fn deadline(timeout_s: Option<f64>) -> PyResult<Option<Instant>> {
    match timeout_s {
        None => Ok(None),
        Some(t) if t.is_finite() && t >= 0.0 => {
            Ok(Some(Instant::now() + Duration::from_secs_f64(t.min(1e9))))
        }
        Some(t) => Err(PyValueError::new_err(format!(
            "timeout_s {t} must be a finite number >= 0 or None"
        ))),
    }
}

fn wait_loop(
    py: Python<'_>,
    shared: &Arc<RingShared>,
    side: Side,
    cursor: u64,
    timeout_s: Option<f64>,
) -> PyResult<bool> {
    let deadline = deadline(timeout_s)?;
    loop {
        let outcome = py.detach(|| shared.wait(side, cursor, deadline));
        match outcome.map_err(|e| ring_err(py, e))? {
            WaitOutcome::Ready => return Ok(true),
            WaitOutcome::TimedOut => return Ok(false),
            WaitOutcome::Interrupted => py.check_signals()?,
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn max_len(max_len: Option<u64>) -> u64 {
    max_len.unwrap_or(u64::MAX)
}

/// A shared memory arena mapped once in this process.
#[pyclass(frozen, name = "Arena", module = "swactor_ring")]
pub struct PyArena {
    pub(crate) inner: Arc<Arena>,
}

#[pymethods]
impl PyArena {
    /// Create a sparse, close-on-exec memfd of `size` bytes, sealed against
    /// shrink/grow. Returns the fd; the caller owns (and closes) it.
    #[staticmethod]
    fn create_memfd(name: &str, size: u64) -> PyResult<i32> {
        Ok(Arena::create_memfd(name, size).map_err(io_err)?.into_raw_fd())
    }

    /// Map `size` bytes of `fd` (MAP_SHARED, read/write), once. The fd is
    /// neither dup'ed nor kept: the caller may close it right after; the
    /// mapping lives until this Arena and every ring/span using it are gone.
    #[staticmethod]
    fn from_fd(py: Python<'_>, fd: i32, size: u64) -> PyResult<Self> {
        let fd = borrow_fd(py, fd, "fd")?;
        Ok(Self {
            inner: Arc::new(Arena::map(fd, size).map_err(io_err)?),
        })
    }

    /// Mapped size in bytes.
    #[getter]
    fn size(&self) -> u64 {
        self.inner.len()
    }

    fn __repr__(&self) -> String {
        format!("Arena(size={})", self.inner.len())
    }
}

/// Arena-relative ring layout (spec §18); offsets only.
#[pyclass(frozen, eq, hash, name = "RingLayout", module = "swactor_ring")]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct PyRingLayout(pub RingLayout);

#[pymethods]
impl PyRingLayout {
    #[new]
    #[pyo3(signature = (ring_id, arena_offset, total_len, header_offset, data_offset, data_capacity, alignment))]
    fn new(
        ring_id: u64,
        arena_offset: u64,
        total_len: u64,
        header_offset: u64,
        data_offset: u64,
        data_capacity: u64,
        alignment: u32,
    ) -> Self {
        Self(RingLayout {
            ring_id,
            arena_offset,
            total_len,
            header_offset,
            data_offset,
            data_capacity,
            alignment,
        })
    }

    /// Canonical layout for a leased range starting at `arena_offset`
    /// (a multiple of `range_alignment(alignment)`).
    #[staticmethod]
    #[pyo3(signature = (ring_id, arena_offset, data_capacity, alignment = 64))]
    fn for_range(
        py: Python<'_>,
        ring_id: u64,
        arena_offset: u64,
        data_capacity: u64,
        alignment: u32,
    ) -> PyResult<Self> {
        RingLayout::for_range(ring_id, arena_offset, data_capacity, alignment)
            .map(Self)
            .map_err(|e| ring_err(py, e))
    }

    /// Bytes a range needs for `data_capacity` at `alignment`.
    #[staticmethod]
    #[pyo3(signature = (data_capacity, alignment = 64))]
    fn required_len(py: Python<'_>, data_capacity: u64, alignment: u32) -> PyResult<u64> {
        RingLayout::required_len(data_capacity, alignment).map_err(|e| ring_err(py, e))
    }

    /// Alignment a range start needs: max(alignment, 64).
    #[staticmethod]
    #[pyo3(signature = (alignment = 64))]
    fn range_alignment(py: Python<'_>, alignment: u32) -> PyResult<u64> {
        RingLayout::range_alignment(alignment).map_err(|e| ring_err(py, e))
    }

    /// Raise RingError unless the layout fits an arena of `arena_size` bytes.
    fn validate(&self, py: Python<'_>, arena_size: u64) -> PyResult<()> {
        self.0.validate(arena_size).map_err(|e| ring_err(py, e))
    }

    #[getter]
    fn ring_id(&self) -> u64 {
        self.0.ring_id
    }
    #[getter]
    fn arena_offset(&self) -> u64 {
        self.0.arena_offset
    }
    #[getter]
    fn total_len(&self) -> u64 {
        self.0.total_len
    }
    #[getter]
    fn header_offset(&self) -> u64 {
        self.0.header_offset
    }
    #[getter]
    fn data_offset(&self) -> u64 {
        self.0.data_offset
    }
    #[getter]
    fn data_capacity(&self) -> u64 {
        self.0.data_capacity
    }
    #[getter]
    fn alignment(&self) -> u32 {
        self.0.alignment
    }

    fn __repr__(&self) -> String {
        let l = &self.0;
        format!(
            "RingLayout(ring_id={}, arena_offset={}, total_len={}, header_offset={}, data_offset={}, data_capacity={}, alignment={})",
            l.ring_id,
            l.arena_offset,
            l.total_len,
            l.header_offset,
            l.data_offset,
            l.data_capacity,
            l.alignment
        )
    }
}

/// Ring lifecycle word.
#[pyclass(
    eq,
    eq_int,
    frozen,
    hash,
    rename_all = "UPPERCASE",
    name = "RingState",
    module = "swactor_ring"
)]
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub enum PyRingState {
    Open = 1,
    Closed = 2,
    Faulted = 3,
}

impl From<RingState> for PyRingState {
    fn from(s: RingState) -> Self {
        match s {
            RingState::Open => Self::Open,
            RingState::Closed => Self::Closed,
            RingState::Faulted => Self::Faulted,
        }
    }
}

/// Snapshot of a ring header's shared words.
#[pyclass(frozen, get_all, name = "RingStatus", module = "swactor_ring")]
pub struct PyRingStatus {
    ring_id: u64,
    capacity: u64,
    commit: u64,
    consume: u64,
    state: PyRingState,
    consumer_waiting: bool,
    producer_waiting: bool,
}

#[pymethods]
impl PyRingStatus {
    /// Committed, unconsumed bytes (`commit - consume`).
    #[getter]
    fn readable(&self) -> u64 {
        self.commit.wrapping_sub(self.consume)
    }

    fn __repr__(&self) -> String {
        format!(
            "RingStatus(ring_id={}, capacity={}, commit={}, consume={}, state=RingState.{}, consumer_waiting={}, producer_waiting={})",
            self.ring_id,
            self.capacity,
            self.commit,
            self.consume,
            state_name(self.state),
            py_bool(self.consumer_waiting),
            py_bool(self.producer_waiting)
        )
    }
}

fn state_name(s: PyRingState) -> &'static str {
    match s {
        PyRingState::Open => "OPEN",
        PyRingState::Closed => "CLOSED",
        PyRingState::Faulted => "FAULTED",
    }
}

fn py_bool(b: bool) -> &'static str {
    if b { "True" } else { "False" }
}

fn status_of(py: Python<'_>, ring: &Ring) -> PyResult<PyRingStatus> {
    let st: RingStatus = ring.status();
    let state = RingState::from_raw(st.state).ok_or_else(|| {
        ring_err(
            py,
            crate::error::RingError::state("state", format!("ring state word {} is invalid", st.state)),
        )
    })?;
    Ok(PyRingStatus {
        ring_id: st.ring_id,
        capacity: st.capacity,
        commit: st.commit,
        consume: st.consume,
        state: state.into(),
        consumer_waiting: st.wake & WAKE_CONSUMER_WAITING != 0,
        producer_waiting: st.wake & WAKE_PRODUCER_WAITING != 0,
    })
}

/// Write a fresh ring header for `layout` into `arena` (cursors 0, open).
#[pyfunction]
pub fn init_ring(py: Python<'_>, arena: &PyArena, layout: &PyRingLayout) -> PyResult<()> {
    Ring::init(arena.inner.clone(), &layout.0)
        .map(drop)
        .map_err(|e| ring_err(py, e))
}

/// Validate the header at `layout` and return a status snapshot.
#[pyfunction]
pub fn open_ring(py: Python<'_>, arena: &PyArena, layout: &PyRingLayout) -> PyResult<PyRingStatus> {
    let ring = Ring::open(arena.inner.clone(), &layout.0).map_err(|e| ring_err(py, e))?;
    status_of(py, &ring)
}

/// Mark the ring at `layout` faulted from any process that maps the arena
/// (a supervisor), then signal the given eventfds so both sides' waiters
/// wake. The header must validate, so a stale request cannot hit a newer ring.
#[pyfunction]
#[pyo3(signature = (arena, layout, *, readable_fd = None, writable_fd = None))]
pub fn fault_ring(
    py: Python<'_>,
    arena: &PyArena,
    layout: &PyRingLayout,
    readable_fd: Option<i32>,
    writable_fd: Option<i32>,
) -> PyResult<()> {
    let fds = [(readable_fd, "readable_fd"), (writable_fd, "writable_fd")];
    let mut wake = Vec::new();
    for (fd, field) in fds {
        if let Some(fd) = fd {
            wake.push(EventFd::dup_from(borrow_fd(py, fd, field)?).map_err(io_err)?);
        }
    }
    let ring = Ring::open(arena.inner.clone(), &layout.0).map_err(|e| ring_err(py, e))?;
    ring.set_faulted();
    for efd in &wake {
        efd.signal();
    }
    Ok(())
}

/// A new non-blocking, close-on-exec eventfd; the caller owns the fd.
#[pyfunction]
pub fn eventfd() -> PyResult<i32> {
    Ok(EventFd::new().map_err(io_err)?.into_raw_fd())
}

/// Epoch and live export count of the spans one handle has issued.
#[derive(Default)]
pub struct SpanGuard {
    epoch: AtomicU64,
    exports: AtomicUsize,
}

impl SpanGuard {
    fn check_released(&self, op: &str) -> PyResult<()> {
        let n = self.exports.load(Ordering::SeqCst);
        if n != 0 {
            return Err(PyBufferError::new_err(format!(
                "{op}: {n} buffer export(s) of a span of this ring are still alive; \
                 release them (memoryview.release(), del the array) before advancing"
            )));
        }
        Ok(())
    }

    fn retire(&self) {
        self.epoch.fetch_add(1, Ordering::SeqCst);
    }
}

/// A contiguous, zero-copy window into ring data (buffer protocol).
/// Writable for producer spans, read-only for consumer spans. Valid until
/// the issuing handle advances; then new exports raise BufferError, and the
/// handle refuses to advance while any export (memoryview, numpy array) of
/// its spans is alive.
#[pyclass(frozen, name = "Span", module = "swactor_ring")]
pub struct PySpan {
    shared: Arc<RingShared>,
    guard: Arc<SpanGuard>,
    epoch: u64,
    piece: Piece,
    cursor: u64,
    writable: bool,
}

#[pymethods]
impl PySpan {
    /// # Safety
    /// Called by CPython with a valid `view` to fill.
    unsafe fn __getbuffer__(slf: Bound<'_, Self>, view: *mut ffi::Py_buffer, flags: c_int) -> PyResult<()> {
        let span = slf.get();
        if span.guard.epoch.load(Ordering::SeqCst) != span.epoch {
            return Err(PyBufferError::new_err(
                "stale span: its ring handle advanced since the span was issued; ask for a new span",
            ));
        }
        if !span.writable && flags & ffi::PyBUF_WRITABLE != 0 {
            return Err(PyBufferError::new_err("consumer spans are read-only"));
        }
        let ptr = span.shared.ring().piece_ptr(span.piece);
        span.guard.exports.fetch_add(1, Ordering::SeqCst);
        // SAFETY: `view` is the Py_buffer CPython asked us to fill. `ptr ..
        // ptr + len` lies inside the ring's data region of a mapping kept
        // alive by `span.shared` (the view holds a reference to `slf`, which
        // owns it). The bytes belong to this handle's side by the cursor
        // protocol until it advances, which it refuses while exports live.
        let rc = unsafe {
            ffi::PyBuffer_FillInfo(
                view,
                slf.as_ptr(),
                ptr.as_ptr().cast(),
                span.piece.len as ffi::Py_ssize_t,
                c_int::from(!span.writable),
                flags,
            )
        };
        if rc != 0 {
            span.guard.exports.fetch_sub(1, Ordering::SeqCst);
            return Err(PyErr::fetch(slf.py()));
        }
        Ok(())
    }

    /// # Safety
    /// Called by CPython once per successful `__getbuffer__`.
    unsafe fn __releasebuffer__(&self, _view: *mut ffi::Py_buffer) {
        self.guard.exports.fetch_sub(1, Ordering::SeqCst);
    }

    fn __len__(&self) -> usize {
        self.piece.len as usize
    }

    /// Logical ring position of the first byte.
    #[getter]
    fn cursor(&self) -> u64 {
        self.cursor
    }

    /// Arena offset of the first byte.
    #[getter]
    fn arena_offset(&self) -> u64 {
        self.shared.ring().data_offset() + self.piece.phys
    }

    /// Process-local address of the first byte (for device copies). Not
    /// guarded: the caller must finish using it before the handle advances.
    #[getter]
    fn address(&self) -> usize {
        self.shared.ring().piece_ptr(self.piece).as_ptr() as usize
    }

    /// True for consumer spans.
    #[getter]
    fn readonly(&self) -> bool {
        !self.writable
    }

    /// False once the issuing handle has advanced.
    #[getter]
    fn valid(&self) -> bool {
        self.guard.epoch.load(Ordering::SeqCst) == self.epoch
    }

    fn __repr__(&self) -> String {
        format!(
            "Span(cursor={}, len={}, readonly={}, valid={})",
            self.cursor,
            self.piece.len,
            !self.writable,
            self.valid()
        )
    }
}

fn open_shared(
    py: Python<'_>,
    arena: &PyArena,
    layout: &PyRingLayout,
    readable_fd: Option<i32>,
    writable_fd: Option<i32>,
) -> PyResult<Arc<RingShared>> {
    let ring = Ring::open(arena.inner.clone(), &layout.0).map_err(|e| ring_err(py, e))?;
    let efd = |fd: Option<i32>, field: &str| -> PyResult<EventFd> {
        match fd {
            None => EventFd::new().map_err(io_err),
            Some(fd) => EventFd::dup_from(borrow_fd(py, fd, field)?).map_err(io_err),
        }
    };
    let readable = efd(readable_fd, "readable_fd")?;
    let writable = efd(writable_fd, "writable_fd")?;
    Ok(Arc::new(RingShared::new(ring, readable, writable)))
}

fn ring_state(py: Python<'_>, shared: &RingShared) -> PyResult<PyRingState> {
    shared.ring().state().map(Into::into).map_err(|e| ring_err(py, e))
}

/// The single producer of a ring (spec §21).
#[pyclass(frozen, name = "Producer", module = "swactor_ring")]
pub struct PyProducer {
    shared: Arc<RingShared>,
    core: Mutex<Producer>,
    guard: Arc<SpanGuard>,
}

#[pymethods]
impl PyProducer {
    /// Open (validate) the ring at `layout` as its producer. `readable_fd` /
    /// `writable_fd` are existing eventfds (e.g. received via SCM_RIGHTS);
    /// they are dup'ed, the caller keeps its own. None creates fresh ones.
    #[new]
    #[pyo3(signature = (arena, layout, *, readable_fd = None, writable_fd = None))]
    fn new(
        py: Python<'_>,
        arena: &PyArena,
        layout: &PyRingLayout,
        readable_fd: Option<i32>,
        writable_fd: Option<i32>,
    ) -> PyResult<Self> {
        let shared = open_shared(py, arena, layout, readable_fd, writable_fd)?;
        Ok(Self {
            core: Mutex::new(Producer::new(shared.clone())),
            shared,
            guard: Arc::default(),
        })
    }

    /// Free bytes now (may span the wrap).
    fn free(&self, py: Python<'_>) -> PyResult<u64> {
        lock(&self.core).free().map_err(|e| ring_err(py, e))
    }

    /// Zero-copy writable span at the commit cursor: contiguous, never
    /// crossing the physical end, at most `max_len` bytes; empty when full.
    #[pyo3(signature = (max_len = None))]
    fn writable_span(&self, py: Python<'_>, max_len: Option<u64>) -> PyResult<PySpan> {
        let mut core = lock(&self.core);
        let piece = core
            .writable_span(self::max_len(max_len))
            .map_err(|e| ring_err(py, e))?;
        Ok(PySpan {
            shared: self.shared.clone(),
            guard: self.guard.clone(),
            epoch: self.guard.epoch.load(Ordering::SeqCst),
            piece,
            cursor: core.commit(),
            writable: true,
        })
    }

    /// Publish the first `n` bytes of the last writable span (Release) and
    /// wake a sleeping consumer. Raises RingError(field='n') if `n` exceeds
    /// the span, BufferError while a span export is alive.
    fn advance_commit(&self, py: Python<'_>, n: u64) -> PyResult<()> {
        self.guard.check_released("advance_commit")?;
        lock(&self.core).advance_commit(n).map_err(|e| ring_err(py, e))?;
        if n > 0 {
            self.guard.retire();
        }
        Ok(())
    }

    /// Copy as much of `data` (bytes-like) as fits, across the wrap, and
    /// publish it with one commit. Returns the byte count (0 when full).
    fn write(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.guard.check_released("write")?;
        let n = with_bytes(data, |bytes| lock(&self.core).write(bytes))?.map_err(|e| ring_err(py, e))?;
        self.guard.retire();
        Ok(n)
    }

    /// Set the producer-waiting bit unless space is free (or the ring is not
    /// open). True: do not sleep. False: armed; await `writable_fd`, then
    /// call `ack_wake()` and retry.
    fn arm_writable(&self, py: Python<'_>) -> PyResult<bool> {
        lock(&self.core).arm().map_err(|e| ring_err(py, e))
    }

    /// Drain this side's eventfd (`writable_fd`); True if a hint was pending.
    fn ack_wake(&self) -> bool {
        self.shared.ack(Side::Producer)
    }

    /// Block (GIL released) until space is free or the ring is not open.
    /// False on timeout. `timeout_s=None` waits forever.
    #[pyo3(signature = (timeout_s = None))]
    fn wait_writable(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<bool> {
        let cursor = lock(&self.core).commit();
        wait_loop(py, &self.shared, Side::Producer, cursor, timeout_s)
    }

    /// Open -> closed (orderly end of stream); wakes both sides.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.close().map(drop).map_err(|e| ring_err(py, e))
    }

    /// Mark the ring faulted; wakes both sides.
    fn fault(&self) {
        self.shared.fault()
    }

    #[getter]
    fn state(&self, py: Python<'_>) -> PyResult<PyRingState> {
        ring_state(py, &self.shared)
    }

    fn status(&self, py: Python<'_>) -> PyResult<PyRingStatus> {
        status_of(py, self.shared.ring())
    }

    /// Published commit cursor.
    #[getter]
    fn commit(&self) -> u64 {
        lock(&self.core).commit()
    }

    /// Local write cursor (commit + current reservation).
    #[getter]
    fn write_cursor(&self) -> u64 {
        lock(&self.core).write_cursor()
    }

    #[getter]
    fn ring_id(&self) -> u64 {
        self.shared.ring().ring_id()
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.shared.ring().capacity()
    }

    /// Eventfd the producer signals (consumer waits on it).
    #[getter]
    fn readable_fd(&self) -> i32 {
        self.shared.readable_fd().raw()
    }

    /// Eventfd the producer waits on (consumer signals it).
    #[getter]
    fn writable_fd(&self) -> i32 {
        self.shared.writable_fd().raw()
    }

    /// The fd to poll for this side: `writable_fd`.
    fn fileno(&self) -> i32 {
        self.shared.writable_fd().raw()
    }

    fn __repr__(&self) -> String {
        format!(
            "Producer(ring_id={}, capacity={})",
            self.shared.ring().ring_id(),
            self.shared.ring().capacity()
        )
    }
}

/// The single consumer of a ring (spec §21).
#[pyclass(frozen, name = "Consumer", module = "swactor_ring")]
pub struct PyConsumer {
    shared: Arc<RingShared>,
    core: Mutex<Consumer>,
    guard: Arc<SpanGuard>,
}

#[pymethods]
impl PyConsumer {
    /// Open (validate) the ring at `layout` as its consumer; eventfd
    /// arguments as for Producer.
    #[new]
    #[pyo3(signature = (arena, layout, *, readable_fd = None, writable_fd = None))]
    fn new(
        py: Python<'_>,
        arena: &PyArena,
        layout: &PyRingLayout,
        readable_fd: Option<i32>,
        writable_fd: Option<i32>,
    ) -> PyResult<Self> {
        let shared = open_shared(py, arena, layout, readable_fd, writable_fd)?;
        Ok(Self {
            core: Mutex::new(Consumer::new(shared.clone())),
            shared,
            guard: Arc::default(),
        })
    }

    /// Committed, unconsumed bytes now (may span the wrap).
    fn readable(&self, py: Python<'_>) -> PyResult<u64> {
        lock(&self.core).readable().map_err(|e| ring_err(py, e))
    }

    /// Zero-copy read-only span at the consume cursor: contiguous, never
    /// crossing the physical end, at most `max_len` bytes; empty when none.
    #[pyo3(signature = (max_len = None))]
    fn readable_span(&self, py: Python<'_>, max_len: Option<u64>) -> PyResult<PySpan> {
        let core = lock(&self.core);
        let piece = core
            .readable_span(self::max_len(max_len))
            .map_err(|e| ring_err(py, e))?;
        Ok(PySpan {
            shared: self.shared.clone(),
            guard: self.guard.clone(),
            epoch: self.guard.epoch.load(Ordering::SeqCst),
            piece,
            cursor: core.consume(),
            writable: false,
        })
    }

    /// Release `n` bytes to the producer (Release) and wake it if it sleeps.
    /// `n` may not exceed `readable()`; BufferError while a span export lives.
    fn advance_consume(&self, py: Python<'_>, n: u64) -> PyResult<()> {
        self.guard.check_released("advance_consume")?;
        lock(&self.core).advance_consume(n).map_err(|e| ring_err(py, e))?;
        if n > 0 {
            self.guard.retire();
        }
        Ok(())
    }

    /// Copy up to len(buf) readable bytes (across the wrap) into the
    /// writable buffer `buf` and consume them. Returns the count.
    fn read_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.guard.check_released("read_into")?;
        let n =
            with_bytes_mut(buf, |bytes| lock(&self.core).read_into(bytes))?.map_err(|e| ring_err(py, e))?;
        if n > 0 {
            self.guard.retire();
        }
        Ok(n)
    }

    /// Copy up to len(buf) readable bytes into `buf` without consuming.
    fn peek_into(&self, py: Python<'_>, buf: &Bound<'_, PyAny>) -> PyResult<usize> {
        with_bytes_mut(buf, |bytes| lock(&self.core).peek_into(bytes))?.map_err(|e| ring_err(py, e))
    }

    /// Consume and return up to `max_len` bytes as a new bytes object.
    fn read<'py>(&self, py: Python<'py>, max_len: usize) -> PyResult<Bound<'py, PyBytes>> {
        self.guard.check_released("read")?;
        let mut core = lock(&self.core);
        let avail = core.readable().map_err(|e| ring_err(py, e))?;
        let n = (avail.min(max_len as u64)) as usize;
        let mut tmp = vec![0u8; n];
        let got = core.read_into(&mut tmp).map_err(|e| ring_err(py, e))?;
        if got > 0 {
            self.guard.retire();
        }
        Ok(PyBytes::new(py, &tmp[..got]))
    }

    /// Set the consumer-waiting bit unless bytes are readable (or the ring
    /// is not open). True: do not sleep. False: armed; await `readable_fd`,
    /// then call `ack_wake()` and retry.
    fn arm_readable(&self, py: Python<'_>) -> PyResult<bool> {
        lock(&self.core).arm().map_err(|e| ring_err(py, e))
    }

    /// Drain this side's eventfd (`readable_fd`); True if a hint was pending.
    fn ack_wake(&self) -> bool {
        self.shared.ack(Side::Consumer)
    }

    /// Block (GIL released) until bytes are readable or the ring is not
    /// open. False on timeout. `timeout_s=None` waits forever.
    #[pyo3(signature = (timeout_s = None))]
    fn wait_readable(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<bool> {
        let cursor = lock(&self.core).consume();
        wait_loop(py, &self.shared, Side::Consumer, cursor, timeout_s)
    }

    /// Open -> closed; wakes both sides.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.close().map(drop).map_err(|e| ring_err(py, e))
    }

    /// Mark the ring faulted; wakes both sides.
    fn fault(&self) {
        self.shared.fault()
    }

    #[getter]
    fn state(&self, py: Python<'_>) -> PyResult<PyRingState> {
        ring_state(py, &self.shared)
    }

    fn status(&self, py: Python<'_>) -> PyResult<PyRingStatus> {
        status_of(py, self.shared.ring())
    }

    /// Published consume cursor.
    #[getter]
    fn consume(&self) -> u64 {
        lock(&self.core).consume()
    }

    #[getter]
    fn ring_id(&self) -> u64 {
        self.shared.ring().ring_id()
    }

    #[getter]
    fn capacity(&self) -> u64 {
        self.shared.ring().capacity()
    }

    /// Eventfd the consumer waits on (producer signals it).
    #[getter]
    fn readable_fd(&self) -> i32 {
        self.shared.readable_fd().raw()
    }

    /// Eventfd the consumer signals (producer waits on it).
    #[getter]
    fn writable_fd(&self) -> i32 {
        self.shared.writable_fd().raw()
    }

    /// The fd to poll for this side: `readable_fd`.
    fn fileno(&self) -> i32 {
        self.shared.readable_fd().raw()
    }

    fn __repr__(&self) -> String {
        format!(
            "Consumer(ring_id={}, capacity={})",
            self.shared.ring().ring_id(),
            self.shared.ring().capacity()
        )
    }
}
