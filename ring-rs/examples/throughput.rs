//! Pure-Rust two-thread ring throughput (no Python), to separate hardware
//! limits from binding overhead: `cargo run --release --example throughput`.

use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::Instant;

use swactor_ring::ring::Ring;
use swactor_ring::{Arena, Consumer, EventFd, Producer, RingLayout, RingShared};

fn main() {
    let total: u64 = 4 << 30;
    for (chunk, capacity) in [(64usize << 10, 1u64 << 20), (1 << 20, 4 << 20)] {
        let size = 16 << 20;
        let fd = Arena::create_memfd("throughput", size).unwrap();
        let arena = Arc::new(Arena::map(fd.as_fd(), size).unwrap());
        let layout = RingLayout::for_range(1, 0, capacity, 4096).unwrap();
        Ring::init(arena.clone(), &layout).unwrap();
        let shared = Arc::new(RingShared::new(
            Ring::open(arena.clone(), &layout).unwrap(),
            EventFd::new().unwrap(),
            EventFd::new().unwrap(),
        ));
        let mut p = Producer::new(shared.clone());
        let mut c = Consumer::new(shared);
        let src = vec![7u8; chunk];
        let mut dst = vec![0u8; chunk];
        let t0 = Instant::now();
        let reader = std::thread::spawn(move || {
            let mut got = 0u64;
            while got < total {
                let n = c.read_into(&mut dst).unwrap();
                got += n as u64;
                if n == 0 {
                    c.wait(None).unwrap();
                }
            }
        });
        let mut sent = 0u64;
        while sent < total {
            let mut off = 0;
            while off < chunk {
                let n = p.write(&src[off..]).unwrap();
                off += n;
                if n == 0 {
                    p.wait(None).unwrap();
                }
            }
            sent += chunk as u64;
        }
        reader.join().unwrap();
        let ring = total as f64 / t0.elapsed().as_secs_f64() / 1e9;
        let mut a = vec![1u8; chunk];
        let b = vec![2u8; chunk];
        let t1 = Instant::now();
        for _ in 0..total / chunk as u64 {
            a.copy_from_slice(std::hint::black_box(&b));
            std::hint::black_box(&mut a);
        }
        let memcpy = total as f64 / t1.elapsed().as_secs_f64() / 1e9;
        println!(
            "chunk {:>7} ring {:>7}: ring write+read_into {ring:6.2} GB/s, memcpy {memcpy:6.2} GB/s ({:.2}x)",
            chunk,
            capacity,
            ring / memcpy
        );
    }
}
