//! Index maths of spans: pure functions over logical cursors, no memory.
//!
//! Logical cursors are monotonic u64 byte positions; the physical index of
//! a cursor is `cursor % capacity`. A span is contiguous physical memory, so
//! it never crosses the physical end of the data region.

/// A contiguous physical piece of the data region.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Offset from the start of the data region.
    pub phys: u64,
    /// Length in bytes; `phys + len <= capacity`.
    pub len: u64,
}

/// The contiguous span that starts at logical `cursor`, holding at most
/// `avail` bytes (free or readable, `avail <= capacity`) and at most `max`.
pub fn contiguous(cursor: u64, avail: u64, capacity: u64, max: u64) -> Piece {
    debug_assert!(capacity > 0);
    debug_assert!(avail <= capacity);
    let phys = cursor % capacity;
    let len = avail.min(capacity - phys).min(max);
    debug_assert!(phys + len <= capacity);
    Piece { phys, len }
}

/// `n <= capacity` bytes from logical `cursor`, as at most two physical
/// pieces (the second, possibly empty, starts at physical 0).
pub fn split(cursor: u64, n: u64, capacity: u64) -> [Piece; 2] {
    debug_assert!(n <= capacity);
    let first = contiguous(cursor, n, capacity, n);
    let second = Piece {
        phys: 0,
        len: n - first.len,
    };
    debug_assert!(second.len == 0 || first.phys + first.len == capacity);
    [first, second]
}

/// Bytes in `from .. to` given wrapping u64 cursors, or `None` when `to`
/// is behind `from` or further ahead than `capacity` (a corrupt cursor).
pub fn distance(from: u64, to: u64, capacity: u64) -> Option<u64> {
    let d = to.wrapping_sub(from);
    (d <= capacity).then_some(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_table() {
        // (cursor, avail, capacity, max) -> (phys, len)
        let table = [
            ((0, 10, 10, u64::MAX), (0, 10)),
            ((7, 10, 10, u64::MAX), (7, 3)),
            ((10, 10, 10, u64::MAX), (0, 10)),
            ((13, 4, 10, u64::MAX), (3, 4)),
            ((13, 4, 10, 2), (3, 2)),
            ((19, 5, 10, u64::MAX), (9, 1)),
            ((u64::MAX, 1, 16, u64::MAX), (15, 1)),
            ((5, 0, 10, u64::MAX), (5, 0)),
        ];
        for ((c, a, cap, m), (p, l)) in table {
            assert_eq!(
                contiguous(c, a, cap, m),
                Piece { phys: p, len: l },
                "{c} {a} {cap} {m}"
            );
        }
    }

    #[test]
    fn split_at_wrap() {
        assert_eq!(
            split(8, 5, 10),
            [Piece { phys: 8, len: 2 }, Piece { phys: 0, len: 3 }]
        );
        assert_eq!(
            split(20, 10, 10),
            [Piece { phys: 0, len: 10 }, Piece { phys: 0, len: 0 }]
        );
        assert_eq!(
            split(29, 10, 10),
            [Piece { phys: 9, len: 1 }, Piece { phys: 0, len: 9 }]
        );
    }

    #[test]
    fn distance_rejects_corrupt_cursors() {
        assert_eq!(distance(5, 9, 10), Some(4));
        assert_eq!(distance(5, 15, 10), Some(10));
        assert_eq!(distance(5, 16, 10), None);
        assert_eq!(distance(9, 5, 10), None);
        assert_eq!(distance(u64::MAX - 1, 2, 10), Some(4));
    }

    #[test]
    fn exhaustive_small_rings_never_cross_the_end() {
        for capacity in 1..=9u64 {
            for cursor in 0..3 * capacity {
                for avail in 0..=capacity {
                    let p = contiguous(cursor, avail, capacity, u64::MAX);
                    assert!(p.phys + p.len <= capacity);
                    assert_eq!(p.len, avail.min(capacity - cursor % capacity));
                    let [a, b] = split(cursor, avail, capacity);
                    assert_eq!(a.len + b.len, avail);
                }
            }
        }
    }
}
