//! Core ring tests: header init/validation/corruption, spans at the wrap,
//! the wake protocol, and a two-thread stress over thousands of wraps.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use swactor_ring::abi::HEADER_LEN;
use swactor_ring::error::{ErrorKind, RingFaultReason};
use swactor_ring::ring::Ring;
use swactor_ring::{Arena, Consumer, EventFd, Producer, RingLayout, RingShared, RingState, WaitOutcome};

fn arena(size: u64) -> Arc<Arena> {
    let fd = Arena::create_memfd("ring-test", size).unwrap();
    Arc::new(Arena::map(fd.as_fd(), size).unwrap())
}

fn pair(arena: &Arc<Arena>, layout: &RingLayout) -> (Producer, Consumer) {
    Ring::init(arena.clone(), layout).unwrap();
    let readable = EventFd::new().unwrap();
    let writable = EventFd::new().unwrap();
    let p_shared = RingShared::new(Ring::open(arena.clone(), layout).unwrap(), readable, writable);
    let c_shared = RingShared::new(
        Ring::open(arena.clone(), layout).unwrap(),
        EventFd::dup_from(p_shared.readable_fd().as_fd()).unwrap(),
        EventFd::dup_from(p_shared.writable_fd().as_fd()).unwrap(),
    );
    (
        Producer::new(Arc::new(p_shared)),
        Consumer::new(Arc::new(c_shared)),
    )
}

#[test]
fn init_then_open_validates() {
    let a = arena(1 << 20);
    let layout = RingLayout::for_range(42, 4096, 8192, 64).unwrap();
    let ring = Ring::init(a.clone(), &layout).unwrap();
    let st = ring.status();
    assert_eq!(
        (st.ring_id, st.capacity, st.commit, st.consume, st.state, st.wake),
        (42, 8192, 0, 0, 1, 0)
    );
    Ring::open(a.clone(), &layout).unwrap();
    // uninitialised memory elsewhere in the arena is not a ring
    let other = RingLayout::for_range(43, 65536, 8192, 64).unwrap();
    assert_eq!(Ring::open(a.clone(), &other).unwrap_err().field, "magic");
    // a layout that does not match the header
    let wrong_id = RingLayout {
        ring_id: 41,
        ..layout
    };
    assert_eq!(Ring::open(a.clone(), &wrong_id).unwrap_err().field, "ring_id");
    let wrong_cap = RingLayout {
        data_capacity: 4096,
        ..layout
    };
    assert_eq!(Ring::open(a.clone(), &wrong_cap).unwrap_err().field, "capacity");
    let outside = RingLayout::for_range(42, (1 << 20) - 4096, 8192, 64).unwrap();
    assert_eq!(Ring::open(a, &outside).unwrap_err().field, "total_len");
}

#[test]
fn corrupt_header_fields_are_named() {
    let a = arena(1 << 16);
    let layout = RingLayout::for_range(7, 0, 4096, 64).unwrap();
    type Corrupt = fn(&swactor_ring::RingHeader);
    let cases: [(Corrupt, &str, Option<RingFaultReason>); 8] = [
        (
            |h| h.magic.store(0xdead_beef, Ordering::Relaxed),
            "magic",
            Some(RingFaultReason::RingLayoutInvalid),
        ),
        (
            |h| h.version.store(9, Ordering::Relaxed),
            "version",
            Some(RingFaultReason::UnsupportedRingVersion),
        ),
        (
            |h| h.header_len.store(64, Ordering::Relaxed),
            "header_len",
            Some(RingFaultReason::RingLayoutInvalid),
        ),
        (
            |h| h.capacity.store(1 << 40, Ordering::Relaxed),
            "capacity",
            Some(RingFaultReason::RingLayoutInvalid),
        ),
        (
            |h| h.ring_id.store(8, Ordering::Relaxed),
            "ring_id",
            Some(RingFaultReason::RingLayoutInvalid),
        ),
        (
            |h| h.state.store(77, Ordering::Relaxed),
            "state",
            Some(RingFaultReason::RingStateInvalid),
        ),
        (
            |h| h.wake.store(0x80, Ordering::Relaxed),
            "wake",
            Some(RingFaultReason::RingStateInvalid),
        ),
        (
            |h| h.commit.store(5000, Ordering::Relaxed),
            "commit",
            Some(RingFaultReason::RingStateInvalid),
        ),
    ];
    for (corrupt, field, reason) in cases {
        let ring = Ring::init(a.clone(), &layout).unwrap();
        corrupt(ring.header());
        let err = Ring::open(a.clone(), &layout).unwrap_err();
        assert_eq!(err.field, field, "{err}");
        assert_eq!(err.reason(), reason, "{err}");
    }
}

#[test]
fn corrupt_cursor_at_runtime_is_an_error_not_ub() {
    let a = arena(1 << 16);
    let layout = RingLayout::for_range(1, 0, 4096, 64).unwrap();
    let (mut p, mut c) = pair(&a, &layout);
    assert_eq!(p.write(&[1; 100]).unwrap(), 100);
    // consumer scribbles a consume far ahead of the producer's write cursor
    p.shared()
        .ring()
        .header()
        .consume
        .store(1 << 50, Ordering::Release);
    assert_eq!(p.write(&[1; 10]).unwrap_err().field, "consume");
    p.shared().ring().header().consume.store(0, Ordering::Release);
    p.shared().ring().header().commit.store(9999, Ordering::Release);
    assert_eq!(c.read_into(&mut [0; 10]).unwrap_err().field, "commit");
}

#[test]
fn spans_stop_at_the_physical_end() {
    let a = arena(1 << 16);
    let layout = RingLayout::for_range(1, 0, 1024, 64).unwrap();
    let (mut p, mut c) = pair(&a, &layout);
    // move both cursors to 1000
    assert_eq!(p.write(&[0; 1000]).unwrap(), 1000);
    assert_eq!(c.read_into(&mut [0; 1000]).unwrap(), 1000);
    let span = p.writable_span(u64::MAX).unwrap();
    assert_eq!((span.phys, span.len), (1000, 24));
    p.advance_commit(24).unwrap();
    let span = p.writable_span(u64::MAX).unwrap();
    assert_eq!((span.phys, span.len), (0, 1000));
    assert_eq!(p.advance_commit(1001).unwrap_err().kind, ErrorKind::Usage);
    p.advance_commit(100).unwrap();
    let r = c.readable_span(u64::MAX).unwrap();
    assert_eq!((r.phys, r.len), (1000, 24));
    assert_eq!(c.readable().unwrap(), 124);
    assert_eq!(c.advance_consume(125).unwrap_err().field, "n");
    c.advance_consume(24).unwrap();
    let r = c.readable_span(50).unwrap();
    assert_eq!((r.phys, r.len), (0, 50));
    // write across the wrap and read it back in one call
    let mut c2 = [0u8; 100];
    assert_eq!(c.read_into(&mut c2).unwrap(), 100);
    let data: Vec<u8> = (0..=255).cycle().take(1024).collect();
    assert_eq!(p.write(&data).unwrap(), 1024);
    assert_eq!(p.write(&data).unwrap(), 0, "full ring takes nothing");
    assert_eq!(p.writable_span(u64::MAX).unwrap().len, 0);
    let mut peek = vec![0u8; 1024];
    assert_eq!(c.peek_into(&mut peek).unwrap(), 1024);
    let mut back = vec![0u8; 1024];
    assert_eq!(c.read_into(&mut back).unwrap(), 1024);
    assert_eq!(back, data);
    assert_eq!(peek, data);
    assert_eq!(p.shared().ring().status().commit, 1000 + 24 + 100 + 1024);
}

#[test]
fn close_and_fault_semantics() {
    let a = arena(1 << 16);
    let layout = RingLayout::for_range(1, 0, 1024, 64).unwrap();
    let (mut p, mut c) = pair(&a, &layout);
    p.write(b"tail").unwrap();
    assert_eq!(p.shared().close().unwrap(), RingState::Closed);
    assert_eq!(
        p.write(b"x").unwrap_err().kind,
        ErrorKind::NotOpen(RingState::Closed)
    );
    // consumer drains a closed ring, then sees EOF; waits return at once
    assert_eq!(c.wait(None).unwrap(), WaitOutcome::Ready);
    let mut buf = [0u8; 8];
    assert_eq!(c.read_into(&mut buf).unwrap(), 4);
    assert_eq!(c.read_into(&mut buf).unwrap(), 0);
    c.shared().fault();
    assert_eq!(
        c.shared().close().unwrap(),
        RingState::Faulted,
        "faulted stays faulted"
    );
    assert_eq!(
        c.read_into(&mut buf).unwrap_err().kind,
        ErrorKind::NotOpen(RingState::Faulted)
    );
}

#[test]
fn waits_time_out_and_wake() {
    let a = arena(1 << 16);
    let layout = RingLayout::for_range(1, 0, 64, 64).unwrap();
    let (mut p, mut c) = pair(&a, &layout);
    let t0 = Instant::now();
    let deadline = Some(t0 + Duration::from_millis(30));
    assert_eq!(c.wait(deadline).unwrap(), WaitOutcome::TimedOut);
    assert!(t0.elapsed() >= Duration::from_millis(30));
    assert_eq!(
        c.shared().ring().status().wake,
        0,
        "timeout clears the pending bit"
    );
    p.write(&[0; 64]).unwrap();
    assert_eq!(
        p.wait(Some(Instant::now() + Duration::from_millis(5))).unwrap(),
        WaitOutcome::TimedOut
    );
    let t = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(20));
        c.read_into(&mut [0; 1]).unwrap();
        c
    });
    assert_eq!(
        p.wait(Some(Instant::now() + Duration::from_secs(10))).unwrap(),
        WaitOutcome::Ready
    );
    assert_eq!(p.free().unwrap(), 1);
    t.join().unwrap();
    assert_eq!(HEADER_LEN, 256);
}

/// Deterministic byte stream: byte i of the stream.
fn stream_byte(i: u64) -> u8 {
    let x = i.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    (x >> 56) as u8 ^ (i as u8)
}

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn stress(capacity: u64, alignment: u32, total: u64, seed: u64) {
    let a = arena(1 << 20);
    let layout = RingLayout::for_range(5, 0, capacity, alignment).unwrap();
    let (mut p, mut c) = pair(&a, &layout);
    let consumer = std::thread::spawn(move || {
        let mut rng = Rng(seed ^ 0xABCD);
        let mut pos = 0u64;
        let mut buf = vec![0u8; capacity as usize * 2];
        let deadline = Some(Instant::now() + Duration::from_secs(60));
        while pos < total {
            // alternate zero-copy spans and bulk copies
            if rng.next() % 2 == 0 {
                let max = 1 + rng.next() % (capacity * 2);
                let n = c.read_into(&mut buf[..max as usize]).unwrap();
                for (k, b) in buf[..n].iter().enumerate() {
                    assert_eq!(*b, stream_byte(pos + k as u64), "at {}", pos + k as u64);
                }
                pos += n as u64;
                if n > 0 {
                    continue;
                }
            } else {
                let piece = c.readable_span(1 + rng.next() % capacity).unwrap();
                if piece.len > 0 {
                    let mut tmp = vec![0u8; piece.len as usize];
                    assert_eq!(c.peek_into(&mut tmp).unwrap(), piece.len as usize);
                    for (k, b) in tmp.iter().enumerate() {
                        assert_eq!(*b, stream_byte(pos + k as u64));
                    }
                    c.advance_consume(piece.len).unwrap();
                    pos += piece.len;
                    continue;
                }
            }
            assert_eq!(
                c.wait(deadline).unwrap(),
                WaitOutcome::Ready,
                "consumer wait timed out"
            );
        }
        assert_eq!(c.read_into(&mut buf).unwrap(), 0);
        pos
    });
    let mut rng = Rng(seed);
    let mut pos = 0u64;
    let mut chunk = Vec::new();
    let deadline = Some(Instant::now() + Duration::from_secs(60));
    while pos < total {
        let want = (1 + rng.next() % (capacity * 3 / 2)).min(total - pos);
        chunk.clear();
        chunk.extend((pos..pos + want).map(stream_byte));
        let mut off = 0usize;
        while off < chunk.len() {
            let n = p.write(&chunk[off..]).unwrap();
            off += n;
            if n == 0 {
                assert_eq!(
                    p.wait(deadline).unwrap(),
                    WaitOutcome::Ready,
                    "producer wait timed out"
                );
            }
        }
        pos += want;
    }
    assert_eq!(consumer.join().unwrap(), total);
}

#[test]
fn two_thread_stress_over_wraparound() {
    // odd capacity (multiple of alignment 1) exercises the wrap at every phase
    stress(1021, 1, 24 << 20, 0x1234_5678);
    stress(4096, 64, 24 << 20, 0x8765_4321);
}
