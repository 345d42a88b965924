//! Errors of the ring core. Every bad input becomes one of these; none is UB.

use std::fmt;

/// The subset of spec §37 `RingFaultReason` that the ring helper can detect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RingFaultReason {
    /// Header `version` is not [`crate::abi::RING_VERSION`].
    UnsupportedRingVersion,
    /// The layout does not describe a ring inside this arena, or the header
    /// there does not match it (magic, header_len, capacity, ring_id).
    RingLayoutInvalid,
    /// Cursor, state or wake words hold impossible values.
    RingStateInvalid,
}

impl RingFaultReason {
    /// The spec's enum name.
    pub fn name(self) -> &'static str {
        match self {
            Self::UnsupportedRingVersion => "UnsupportedRingVersion",
            Self::RingLayoutInvalid => "RingLayoutInvalid",
            Self::RingStateInvalid => "RingStateInvalid",
        }
    }
}

/// What went wrong and which field was wrong.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ErrorKind {
    /// Header or layout validation failed; carries the spec fault reason.
    Fault(RingFaultReason),
    /// The operation needs an open ring (or, for consumers, a non-faulted
    /// one); carries the state found.
    NotOpen(crate::abi::RingState),
    /// A caller argument is out of range (e.g. advancing past the span).
    Usage,
    /// A wake syscall (poll/eventfd) failed.
    Io(std::io::ErrorKind),
}

/// A ring error: `field` names the header/layout field or argument at fault.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RingError {
    /// Field or argument name (`"magic"`, `"capacity"`, `"n"`, `"state"`...).
    pub field: &'static str,
    /// Classification.
    pub kind: ErrorKind,
    /// Human-readable detail naming the values involved.
    pub message: String,
}

impl RingError {
    pub(crate) fn fault(reason: RingFaultReason, field: &'static str, message: String) -> Self {
        Self {
            field,
            kind: ErrorKind::Fault(reason),
            message,
        }
    }
    pub(crate) fn layout(field: &'static str, message: String) -> Self {
        Self::fault(RingFaultReason::RingLayoutInvalid, field, message)
    }
    pub(crate) fn state(field: &'static str, message: String) -> Self {
        Self::fault(RingFaultReason::RingStateInvalid, field, message)
    }
    pub(crate) fn usage(field: &'static str, message: String) -> Self {
        Self {
            field,
            kind: ErrorKind::Usage,
            message,
        }
    }
    pub(crate) fn io(field: &'static str, err: &std::io::Error) -> Self {
        Self {
            field,
            kind: ErrorKind::Io(err.kind()),
            message: format!("{field}: {err}"),
        }
    }
    pub(crate) fn not_open(state: crate::abi::RingState, message: String) -> Self {
        Self {
            field: "state",
            kind: ErrorKind::NotOpen(state),
            message,
        }
    }

    /// Spec fault reason, if this is a header/layout fault.
    pub fn reason(&self) -> Option<RingFaultReason> {
        match self.kind {
            ErrorKind::Fault(r) => Some(r),
            _ => None,
        }
    }
}

impl fmt::Display for RingError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (field {})", self.message, self.field)
    }
}

impl std::error::Error for RingError {}
