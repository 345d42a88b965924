//! Object record header (spec §17): a fixed 40-byte little-endian header
//! followed by exactly `extent` payload bytes on the edge stream.
//!
//! | offset | field        | width |
//! |--------|--------------|-------|
//! | 0      | `magic`      | u32 (`b"SWOB"`) |
//! | 4      | `version`    | u16 (1) |
//! | 6      | `header_len` | u16 (40) |
//! | 8      | `object_id`  | u64 |
//! | 16     | `sequence`   | u64 |
//! | 24     | `extent`     | u64 |
//! | 32     | `flags`      | u32 |
//! | 36     | `reserved`   | u32 (0) |

use std::fmt;

/// `b"SWOB"` read as a little-endian u32.
pub const OBJECT_MAGIC: u32 = u32::from_le_bytes(*b"SWOB");
/// Supported object header version.
pub const OBJECT_VERSION: u16 = 1;
/// Encoded header size in bytes.
pub const OBJECT_HEADER_LEN: usize = 40;

/// Spec §37 `ObjectFailure` values the parser can produce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectFailure {
    /// Short buffer, bad magic, bad header_len or non-zero reserved word.
    HeaderMalformed,
    /// `version` is not [`OBJECT_VERSION`].
    UnsupportedObjectVersion,
    /// `extent > ObjectSpec.max_extent`.
    ExtentExceedsMax,
    /// `extent` is not a multiple of `ObjectSpec.alignment`.
    ExtentAlignmentInvalid,
}

impl ObjectFailure {
    /// The spec's enum name.
    pub fn name(self) -> &'static str {
        match self {
            Self::HeaderMalformed => "HeaderMalformed",
            Self::UnsupportedObjectVersion => "UnsupportedObjectVersion",
            Self::ExtentExceedsMax => "ExtentExceedsMax",
            Self::ExtentAlignmentInvalid => "ExtentAlignmentInvalid",
        }
    }
}

/// A rejected header: the failure and a message naming the values.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ObjectError {
    /// Spec failure.
    pub failure: ObjectFailure,
    /// Detail.
    pub message: String,
}

impl fmt::Display for ObjectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.failure.name(), self.message)
    }
}

impl std::error::Error for ObjectError {}

fn fail(failure: ObjectFailure, message: String) -> ObjectError {
    ObjectError { failure, message }
}

/// The runtime facts of one object record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ObjectHeader {
    /// Object id.
    pub object_id: u64,
    /// Edge sequence number.
    pub sequence: u64,
    /// Payload bytes that follow the header.
    pub extent: u64,
    /// Flags (opaque to the parser).
    pub flags: u32,
}

fn u16_at(b: &[u8; OBJECT_HEADER_LEN], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn u32_at(b: &[u8; OBJECT_HEADER_LEN], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn u64_at(b: &[u8; OBJECT_HEADER_LEN], at: usize) -> u64 {
    let mut w = [0u8; 8];
    w.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(w)
}

impl ObjectHeader {
    /// Encode to the 40-byte wire form.
    pub fn encode(&self) -> [u8; OBJECT_HEADER_LEN] {
        let mut b = [0u8; OBJECT_HEADER_LEN];
        b[0..4].copy_from_slice(&OBJECT_MAGIC.to_le_bytes());
        b[4..6].copy_from_slice(&OBJECT_VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&(OBJECT_HEADER_LEN as u16).to_le_bytes());
        b[8..16].copy_from_slice(&self.object_id.to_le_bytes());
        b[16..24].copy_from_slice(&self.sequence.to_le_bytes());
        b[24..32].copy_from_slice(&self.extent.to_le_bytes());
        b[32..36].copy_from_slice(&self.flags.to_le_bytes());
        b
    }

    /// Parse and validate the first 40 bytes of `buf` against an ObjectSpec's
    /// `max_extent` and `alignment` (a power of two; 1 = unconstrained).
    /// Checks, in order: length, magic, version, header_len, reserved,
    /// extent <= max_extent, extent % alignment == 0.
    pub fn parse(buf: &[u8], max_extent: u64, alignment: u32) -> Result<Self, ObjectError> {
        debug_assert!(alignment.is_power_of_two());
        let Some(b) = buf.get(..OBJECT_HEADER_LEN) else {
            return Err(fail(
                ObjectFailure::HeaderMalformed,
                format!("header needs {OBJECT_HEADER_LEN} bytes, got {}", buf.len()),
            ));
        };
        let b: &[u8; OBJECT_HEADER_LEN] = b.try_into().map_err(|_| {
            fail(
                ObjectFailure::HeaderMalformed,
                "header slice has the wrong length".into(),
            )
        })?;
        let magic = u32_at(b, 0);
        if magic != OBJECT_MAGIC {
            return Err(fail(
                ObjectFailure::HeaderMalformed,
                format!("magic {magic:#010x} != {OBJECT_MAGIC:#010x}"),
            ));
        }
        let version = u16_at(b, 4);
        if version != OBJECT_VERSION {
            return Err(fail(
                ObjectFailure::UnsupportedObjectVersion,
                format!("object version {version} unsupported (expected {OBJECT_VERSION})"),
            ));
        }
        let header_len = u16_at(b, 6);
        if usize::from(header_len) != OBJECT_HEADER_LEN {
            return Err(fail(
                ObjectFailure::HeaderMalformed,
                format!("header_len {header_len} != {OBJECT_HEADER_LEN}"),
            ));
        }
        let reserved = u32_at(b, 36);
        if reserved != 0 {
            return Err(fail(
                ObjectFailure::HeaderMalformed,
                format!("reserved word is {reserved:#x}, not 0"),
            ));
        }
        let header = ObjectHeader {
            object_id: u64_at(b, 8),
            sequence: u64_at(b, 16),
            extent: u64_at(b, 24),
            flags: u32_at(b, 32),
        };
        if header.extent > max_extent {
            return Err(fail(
                ObjectFailure::ExtentExceedsMax,
                format!("extent {} exceeds max_extent {max_extent}", header.extent),
            ));
        }
        if header.extent % u64::from(alignment.max(1)) != 0 {
            return Err(fail(
                ObjectFailure::ExtentAlignmentInvalid,
                format!(
                    "extent {} is not a multiple of alignment {alignment}",
                    header.extent
                ),
            ));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> ObjectHeader {
        ObjectHeader {
            object_id: 9,
            sequence: 3,
            extent: 4096,
            flags: 1,
        }
    }

    #[test]
    fn roundtrip_and_byte_offsets() {
        let b = sample().encode();
        assert_eq!(&b[0..4], b"SWOB");
        assert_eq!(b[6], 40);
        assert_eq!(b[24..32], 4096u64.to_le_bytes());
        assert_eq!(ObjectHeader::parse(&b, 4096, 64).unwrap(), sample());
        let mut longer = b.to_vec();
        longer.extend_from_slice(&[0xAA; 10]);
        assert_eq!(ObjectHeader::parse(&longer, 4096, 64).unwrap(), sample());
    }

    #[test]
    fn each_check_maps_to_its_failure() {
        use ObjectFailure::*;
        let good = sample().encode();
        let patch = |at: usize, bytes: &[u8]| {
            let mut b = good;
            b[at..at + bytes.len()].copy_from_slice(bytes);
            b
        };
        let cases: [(&[u8], u64, u32, ObjectFailure); 8] = [
            (&good[..39], 4096, 1, HeaderMalformed),
            (&patch(0, b"XWOB"), 4096, 1, HeaderMalformed),
            (&patch(4, &2u16.to_le_bytes()), 4096, 1, UnsupportedObjectVersion),
            (&patch(6, &48u16.to_le_bytes()), 4096, 1, HeaderMalformed),
            (&patch(36, &1u32.to_le_bytes()), 4096, 1, HeaderMalformed),
            (&good, 4095, 1, ExtentExceedsMax),
            (&good, 4096, 8192, ExtentAlignmentInvalid),
            (
                &patch(24, &4097u64.to_le_bytes()),
                8192,
                2,
                ExtentAlignmentInvalid,
            ),
        ];
        for (buf, max, align, want) in cases {
            assert_eq!(ObjectHeader::parse(buf, max, align).unwrap_err().failure, want);
        }
    }
}
