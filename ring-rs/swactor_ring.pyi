"""swactor_ring: shared-memory SPSC byte rings in a memfd arena (spec §17, §20-22), and the compute process's native
kernel launcher (LaunchTable, LaunchPool; x86-64 and AArch64 builds only).

See docs/ring.md for the ABI, cursor invariants, wake protocol and span rule; docs/compute.md for the launcher.
"""

from collections.abc import Sequence
from typing import ClassVar, final

from typing_extensions import Buffer

__version__: str
HEADER_LEN: int  # 256: ring header bytes, padding included
RING_MAGIC: int  # b"SWRG" as little-endian u32
RING_VERSION: int  # 1
WAKE_CONSUMER_WAITING: int  # header wake bit 1
WAKE_PRODUCER_WAITING: int  # header wake bit 2
OBJECT_HEADER_LEN: int  # 40
OBJECT_MAGIC: int  # b"SWOB" as little-endian u32
OBJECT_VERSION: int  # 1
LAUNCH_MAX_ARGS: int  # 16: most parameters a launched kernel may have

class RingError(ValueError):
    """Header/layout/cursor/argument error."""

    field: str  # header/layout field or argument at fault ("magic", "capacity", "n", ...)
    reason: str | None  # RingFaultReason name, None for usage errors

class RingClosedError(RingError):
    """Operation needs an open ring (consumers: a non-faulted one)."""

    state: str  # "closed" | "faulted"

class ObjectError(ValueError):
    """Object header rejected (spec §17)."""

    failure: str  # HeaderMalformed | UnsupportedObjectVersion | ExtentExceedsMax | ExtentAlignmentInvalid

@final
class Arena:
    """One MAP_SHARED mapping of an arena fd, never remapped or resized."""

    @staticmethod
    def create_memfd(name: str, size: int) -> int:
        """New sparse close-on-exec memfd sealed against shrink/grow; caller owns the fd."""

    @staticmethod
    def from_fd(fd: int, size: int) -> Arena:
        """Map `size` bytes of `fd`. The fd is not dup'ed or kept; close it whenever."""

    @property
    def size(self) -> int: ...

@final
class RingLayout:
    """Arena-relative ring layout (spec §18). header_offset/data_offset are absolute arena offsets."""

    def __new__(
        cls,
        ring_id: int,
        arena_offset: int,
        total_len: int,
        header_offset: int,
        data_offset: int,
        data_capacity: int,
        alignment: int,
    ) -> RingLayout: ...
    @staticmethod
    def for_range(ring_id: int, arena_offset: int, data_capacity: int, alignment: int = 64) -> RingLayout:
        """Header at arena_offset (a multiple of range_alignment(alignment)), data at the next aligned boundary."""

    @staticmethod
    def required_len(data_capacity: int, alignment: int = 64) -> int:
        """Range length for_range() will use: roundup(256, max(alignment, 64)) + data_capacity."""

    @staticmethod
    def range_alignment(alignment: int = 64) -> int:
        """max(alignment, 64)."""

    def validate(self, arena_size: int) -> None:
        """Raise RingError(field=...) unless the layout fits an arena of arena_size bytes."""

    @property
    def ring_id(self) -> int: ...
    @property
    def arena_offset(self) -> int: ...
    @property
    def total_len(self) -> int: ...
    @property
    def header_offset(self) -> int: ...
    @property
    def data_offset(self) -> int: ...
    @property
    def data_capacity(self) -> int: ...
    @property
    def alignment(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class RingState:
    OPEN: ClassVar[RingState]  # == 1
    CLOSED: ClassVar[RingState]  # == 2
    FAULTED: ClassVar[RingState]  # == 3
    def __int__(self) -> int: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class RingStatus:
    """Snapshot of the shared header words."""

    ring_id: int
    capacity: int
    commit: int
    consume: int
    state: RingState
    consumer_waiting: bool
    producer_waiting: bool
    @property
    def readable(self) -> int: ...

@final
class Span:
    """Zero-copy contiguous window into ring data (buffer protocol).

    Producer spans are writable, consumer spans read-only. A span is valid until
    its handle advances; its handle refuses to advance (BufferError) while any
    export (memoryview, numpy array) of its spans is alive, and a stale span
    refuses new exports.
    """

    # The C buffer slot (bf_getbuffer) at runtime; declared so type checkers accept a Span as a Buffer.
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __len__(self) -> int: ...
    @property
    def cursor(self) -> int:
        """Logical ring position of the first byte."""
    @property
    def arena_offset(self) -> int: ...
    @property
    def address(self) -> int:
        """Process-local address of the first byte; unguarded (finish before advancing)."""
    @property
    def readonly(self) -> bool: ...
    @property
    def valid(self) -> bool: ...

def init_ring(arena: Arena, layout: RingLayout) -> None:
    """Write a fresh header (cursors 0, OPEN) at layout. Arena owner only, before any handle exists."""

def open_ring(arena: Arena, layout: RingLayout) -> RingStatus:
    """Validate the header at layout (RingError with .field on mismatch)."""

def fault_ring(
    arena: Arena, layout: RingLayout, *, readable_fd: int | None = None, writable_fd: int | None = None
) -> None:
    """Mark the ring faulted from a supervisor; signals the given eventfds so waiters wake."""

def eventfd() -> int:
    """New non-blocking close-on-exec eventfd; caller owns it."""

@final
class Producer:
    """The single producer of a ring. Eventfd args are dup'ed; None creates fresh eventfds."""

    def __new__(
        cls,
        arena: Arena,
        layout: RingLayout,
        *,
        readable_fd: int | None = None,
        writable_fd: int | None = None,
    ) -> Producer: ...
    def free(self) -> int: ...
    def writable_span(self, max_len: int | None = None) -> Span: ...
    def advance_commit(self, n: int) -> None: ...
    def write(self, data: Buffer) -> int:
        """Copy as much as fits (across the wrap), one commit; returns bytes written."""
    def arm_writable(self) -> bool:
        """True: space free or ring not open (don't sleep). False: armed, await writable_fd."""
    def ack_wake(self) -> bool: ...
    def wait_writable(self, timeout_s: float | None = None) -> bool: ...
    def close(self) -> None: ...
    def fault(self) -> None: ...
    @property
    def state(self) -> RingState: ...
    def status(self) -> RingStatus: ...
    @property
    def commit(self) -> int: ...
    @property
    def write_cursor(self) -> int: ...
    @property
    def ring_id(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def readable_fd(self) -> int: ...
    @property
    def writable_fd(self) -> int: ...
    def fileno(self) -> int:
        """writable_fd: the fd this side waits on."""

@final
class Consumer:
    """The single consumer of a ring. Eventfd args are dup'ed; None creates fresh eventfds."""

    def __new__(
        cls,
        arena: Arena,
        layout: RingLayout,
        *,
        readable_fd: int | None = None,
        writable_fd: int | None = None,
    ) -> Consumer: ...
    def readable(self) -> int: ...
    def readable_span(self, max_len: int | None = None) -> Span: ...
    def advance_consume(self, n: int) -> None: ...
    def read_into(self, buf: Buffer) -> int:
        """Copy up to len(buf) bytes (across the wrap) and consume them."""
    def peek_into(self, buf: Buffer) -> int:
        """Copy up to len(buf) bytes without consuming."""
    def read(self, max_len: int) -> bytes: ...
    def arm_readable(self) -> bool:
        """True: bytes readable or ring not open (don't sleep). False: armed, await readable_fd."""
    def ack_wake(self) -> bool: ...
    def wait_readable(self, timeout_s: float | None = None) -> bool: ...
    def close(self) -> None: ...
    def fault(self) -> None: ...
    @property
    def state(self) -> RingState: ...
    def status(self) -> RingStatus: ...
    @property
    def consume(self) -> int: ...
    @property
    def ring_id(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def readable_fd(self) -> int: ...
    @property
    def writable_fd(self) -> int: ...
    def fileno(self) -> int:
        """readable_fd: the fd this side waits on."""

@final
class ObjectHeader:
    """Object record header (spec §17), 40 bytes little-endian."""

    SIZE: ClassVar[int]
    MAGIC: ClassVar[int]
    VERSION: ClassVar[int]
    def __new__(cls, object_id: int, sequence: int, extent: int, flags: int = 0) -> ObjectHeader: ...
    @property
    def object_id(self) -> int: ...
    @property
    def sequence(self) -> int: ...
    @property
    def extent(self) -> int: ...
    @property
    def flags(self) -> int: ...
    def encode(self) -> bytes: ...
    @staticmethod
    def parse(buf: Buffer, max_extent: int, alignment: int = 1) -> ObjectHeader: ...
    def __eq__(self, other: object, /) -> bool: ...
    def __hash__(self) -> int: ...

@final
class LaunchTable:
    """The kernels of a captured graph in run order, with resolved arguments and bound variables.

    Trusted input: a table calls the C functions at the addresses it is given with the arguments it is given (as ctypes
    does). Only swactor.worker.compute.replay builds tables, from tinygrad CPU programs whose buffers it keeps alive;
    the checks here (parameter counts, slots, variable ranges) raise ValueError on mistakes.
    """

    def __new__(cls) -> LaunchTable: ...
    def __len__(self) -> int: ...
    def push(self, kernel: int, args: Sequence[int], core_slot: int | None = None, slices: int = 0) -> int:
        """Append a launch of the C function at `kernel` with all its parameter values `args` (<= LAUNCH_MAX_ARGS;
        variable slots are filled at run time); a kernel split into core_id slices names the parameter that takes the
        slice index in `core_slot`. Returns the launch's index."""
    def bind(self, name: str, launch: int, slot: int, lo: int, hi: int) -> None:
        """Parameter `slot` of launch `launch` takes variable `name`, accepted in lo..=hi at run time."""
    def set_slices(self, launch: int, slices: int) -> None:
        """Slice count of a sliced launch whose count depends on variables."""

@final
class LaunchPool:
    """The calling thread plus threads-1 native workers that run launch tables. Idle workers spin spin_ns, then sleep;
    when a run ends they sleep at once. Runs from several Python threads queue."""

    def __new__(cls, threads: int, spin_ns: int = 200_000) -> LaunchPool: ...
    @property
    def threads(self) -> int: ...
    def run(self, table: LaunchTable, var_vals: dict[str, int]) -> None:
        """Give the table's variables their values (ValueError when one is missing or out of its range), then run
        its launches in order with the GIL released; returns when all have finished."""
