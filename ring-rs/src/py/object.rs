//! `ObjectHeader` for Python (spec §17).

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::errors::object_err;
use super::handles::with_bytes;
use crate::object::{OBJECT_HEADER_LEN, OBJECT_MAGIC, OBJECT_VERSION, ObjectHeader};

/// Object record header: 40 bytes little-endian on the wire.
#[pyclass(frozen, eq, hash, name = "ObjectHeader", module = "swactor_ring")]
#[derive(PartialEq, Eq, Hash)]
pub struct PyObjectHeader(pub ObjectHeader);

#[pymethods]
impl PyObjectHeader {
    #[new]
    #[pyo3(signature = (object_id, sequence, extent, flags = 0))]
    fn new(object_id: u64, sequence: u64, extent: u64, flags: u32) -> Self {
        Self(ObjectHeader {
            object_id,
            sequence,
            extent,
            flags,
        })
    }

    /// Encoded size (40).
    #[classattr]
    const SIZE: usize = OBJECT_HEADER_LEN;
    /// `b"SWOB"` as a little-endian u32.
    #[classattr]
    const MAGIC: u32 = OBJECT_MAGIC;
    /// Supported version (1).
    #[classattr]
    const VERSION: u16 = OBJECT_VERSION;

    #[getter]
    fn object_id(&self) -> u64 {
        self.0.object_id
    }
    #[getter]
    fn sequence(&self) -> u64 {
        self.0.sequence
    }
    #[getter]
    fn extent(&self) -> u64 {
        self.0.extent
    }
    #[getter]
    fn flags(&self) -> u32 {
        self.0.flags
    }

    /// The 40-byte wire encoding.
    fn encode<'py>(&self, py: Python<'py>) -> Bound<'py, PyBytes> {
        PyBytes::new(py, &self.0.encode())
    }

    /// Parse and validate the first 40 bytes of `buf` (any bytes-like).
    /// Raises ObjectError with `.failure` in HeaderMalformed,
    /// UnsupportedObjectVersion, ExtentExceedsMax, ExtentAlignmentInvalid.
    #[staticmethod]
    #[pyo3(signature = (buf, max_extent, alignment = 1))]
    fn parse(py: Python<'_>, buf: &Bound<'_, PyAny>, max_extent: u64, alignment: u32) -> PyResult<Self> {
        if alignment == 0 || !alignment.is_power_of_two() {
            return Err(PyValueError::new_err(format!(
                "alignment {alignment} is not a power of two"
            )));
        }
        with_bytes(buf, |bytes| {
            ObjectHeader::parse(bytes, max_extent, alignment)
                .map(Self)
                .map_err(|e| object_err(py, e))
        })?
    }

    fn __repr__(&self) -> String {
        let h = &self.0;
        format!(
            "ObjectHeader(object_id={}, sequence={}, extent={}, flags={})",
            h.object_id, h.sequence, h.extent, h.flags
        )
    }
}
