//! Arena-relative ring layouts (spec §18). Offsets only, never pointers.
//!
//! `header_offset` and `data_offset` are absolute offsets from the arena
//! base (not relative to `arena_offset`); `arena_offset .. arena_offset +
//! total_len` is the leased range that must contain header and data.

use crate::abi::{HEADER_ALIGN, HEADER_LEN};
use crate::error::RingError;

/// Where one ring lives inside an arena.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RingLayout {
    /// Node-unique ring id, also stored in the header.
    pub ring_id: u64,
    /// Start of the leased range.
    pub arena_offset: u64,
    /// Length of the leased range.
    pub total_len: u64,
    /// Arena offset of the [`crate::RingHeader`] (64-byte aligned).
    pub header_offset: u64,
    /// Arena offset of the first data byte (`alignment`-aligned).
    pub data_offset: u64,
    /// Data bytes; a non-zero multiple of `alignment`.
    pub data_capacity: u64,
    /// Data alignment; a power of two.
    pub alignment: u32,
}

fn round_up(value: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(value.checked_add(align - 1)? & !(align - 1))
}

fn check_alignment(alignment: u32) -> Result<u64, RingError> {
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(RingError::layout(
            "alignment",
            format!("alignment {alignment} is not a power of two"),
        ));
    }
    Ok(u64::from(alignment))
}

fn check_capacity(data_capacity: u64, alignment: u64) -> Result<(), RingError> {
    if data_capacity == 0 || data_capacity % alignment != 0 {
        return Err(RingError::layout(
            "data_capacity",
            format!("data_capacity {data_capacity} is not a non-zero multiple of alignment {alignment}"),
        ));
    }
    Ok(())
}

impl RingLayout {
    /// Alignment an arena-manager must give a ring range start:
    /// `max(alignment, 64)`.
    pub fn range_alignment(alignment: u32) -> Result<u64, RingError> {
        Ok(check_alignment(alignment)?.max(HEADER_ALIGN))
    }

    /// Bytes a range needs for `data_capacity` data bytes at `alignment`,
    /// when the range starts at a multiple of [`Self::range_alignment`].
    pub fn required_len(data_capacity: u64, alignment: u32) -> Result<u64, RingError> {
        let align = Self::range_alignment(alignment)?;
        check_capacity(data_capacity, u64::from(alignment))?;
        round_up(HEADER_LEN, align)
            .and_then(|h| h.checked_add(data_capacity))
            .ok_or_else(|| {
                RingError::layout(
                    "data_capacity",
                    format!("data_capacity {data_capacity} overflows"),
                )
            })
    }

    /// Mint the canonical layout for a range starting at `arena_offset`:
    /// header first, data at the next `max(alignment, 64)` boundary.
    pub fn for_range(
        ring_id: u64,
        arena_offset: u64,
        data_capacity: u64,
        alignment: u32,
    ) -> Result<Self, RingError> {
        let align = Self::range_alignment(alignment)?;
        if arena_offset % align != 0 {
            return Err(RingError::layout(
                "arena_offset",
                format!("arena_offset {arena_offset} is not a multiple of {align}"),
            ));
        }
        let total_len = Self::required_len(data_capacity, alignment)?;
        let data_offset = arena_offset
            .checked_add(total_len - data_capacity)
            .filter(|d| d.checked_add(data_capacity).is_some())
            .ok_or_else(|| {
                RingError::layout("arena_offset", format!("arena_offset {arena_offset} overflows"))
            })?;
        Ok(Self {
            ring_id,
            arena_offset,
            total_len,
            header_offset: arena_offset,
            data_offset,
            data_capacity,
            alignment,
        })
    }

    /// Check the layout against an arena of `arena_len` bytes. On success the
    /// header and data ranges are in bounds, aligned and disjoint.
    pub fn validate(&self, arena_len: u64) -> Result<(), RingError> {
        let alignment = check_alignment(self.alignment)?;
        check_capacity(self.data_capacity, alignment)?;
        let range_end = self.arena_offset.checked_add(self.total_len).ok_or_else(|| {
            RingError::layout(
                "total_len",
                format!("arena_offset + total_len overflows ({self:?})"),
            )
        })?;
        if range_end > arena_len {
            return Err(RingError::layout(
                "total_len",
                format!(
                    "range {}..{range_end} lies outside the {arena_len}-byte arena",
                    self.arena_offset
                ),
            ));
        }
        if self.header_offset % HEADER_ALIGN != 0 {
            return Err(RingError::layout(
                "header_offset",
                format!("header_offset {} is not 64-byte aligned", self.header_offset),
            ));
        }
        if self.header_offset < self.arena_offset {
            return Err(RingError::layout(
                "header_offset",
                format!(
                    "header_offset {} precedes arena_offset {}",
                    self.header_offset, self.arena_offset
                ),
            ));
        }
        let header_end = self.header_offset.saturating_add(HEADER_LEN);
        if header_end > self.data_offset {
            return Err(RingError::layout(
                "data_offset",
                format!(
                    "data_offset {} overlaps the header ending at {header_end}",
                    self.data_offset
                ),
            ));
        }
        if self.data_offset % alignment != 0 {
            return Err(RingError::layout(
                "data_offset",
                format!("data_offset {} is not {alignment}-byte aligned", self.data_offset),
            ));
        }
        let data_end = self.data_offset.saturating_add(self.data_capacity);
        if data_end > range_end {
            return Err(RingError::layout(
                "data_capacity",
                format!(
                    "data {}..{data_end} exceeds the range end {range_end}",
                    self.data_offset
                ),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn for_range_is_valid_and_tight() {
        let l = RingLayout::for_range(7, 4096, 65536, 64).unwrap();
        assert_eq!(l.header_offset, 4096);
        assert_eq!(l.data_offset, 4096 + 256);
        assert_eq!(l.total_len, 256 + 65536);
        assert_eq!(RingLayout::required_len(65536, 64).unwrap(), l.total_len);
        l.validate(4096 + l.total_len).unwrap();
        assert_eq!(l.validate(4096 + l.total_len - 1).unwrap_err().field, "total_len");
        let big = RingLayout::for_range(1, 0, 4096 * 4, 4096).unwrap();
        assert_eq!(big.data_offset, 4096);
        big.validate(big.total_len).unwrap();
    }

    #[test]
    fn bad_layouts_name_their_field() {
        let good = RingLayout::for_range(1, 0, 1024, 64).unwrap();
        let cases: [(RingLayout, &str); 8] = [
            (RingLayout { alignment: 3, ..good }, "alignment"),
            (
                RingLayout {
                    data_capacity: 0,
                    ..good
                },
                "data_capacity",
            ),
            (
                RingLayout {
                    data_capacity: 1000,
                    ..good
                },
                "data_capacity",
            ),
            (
                RingLayout {
                    header_offset: 8,
                    ..good
                },
                "header_offset",
            ),
            (
                RingLayout {
                    data_offset: 128,
                    ..good
                },
                "data_offset",
            ),
            (
                RingLayout {
                    data_offset: 320,
                    ..good
                },
                "data_capacity",
            ),
            (
                RingLayout {
                    arena_offset: u64::MAX,
                    ..good
                },
                "total_len",
            ),
            (
                RingLayout {
                    total_len: 1 << 40,
                    ..good
                },
                "total_len",
            ),
        ];
        for (layout, field) in cases {
            assert_eq!(layout.validate(1 << 20).unwrap_err().field, field, "{layout:?}");
        }
        assert_eq!(
            RingLayout::for_range(1, 32, 1024, 64).unwrap_err().field,
            "arena_offset"
        );
        assert_eq!(
            RingLayout::for_range(1, 0, 100, 64).unwrap_err().field,
            "data_capacity"
        );
    }
}
