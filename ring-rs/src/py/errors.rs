//! Python exception types and the mapping from core errors.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::{PyErr, create_exception};

use crate::error::{ErrorKind, RingError as CoreRingError};
use crate::object::ObjectError as CoreObjectError;

create_exception!(
    swactor_ring,
    RingError,
    PyValueError,
    "Ring header, layout, cursor or argument error. Attributes: field (str), reason (str | None: RingFaultReason name)."
);
create_exception!(
    swactor_ring,
    RingClosedError,
    RingError,
    "The operation needs an open ring (consumers: a non-faulted ring). Attribute state: 'closed' | 'faulted'."
);
create_exception!(
    swactor_ring,
    ObjectError,
    PyValueError,
    "Object header rejected. Attribute failure (str): ObjectFailure name."
);

fn with_attrs(py: Python<'_>, err: PyErr, attrs: &[(&str, Option<&str>)]) -> PyErr {
    for (name, value) in attrs {
        if let Err(e) = err.value(py).setattr(*name, *value) {
            return e;
        }
    }
    err
}

/// Convert a core ring error into the matching Python exception.
pub fn ring_err(py: Python<'_>, e: CoreRingError) -> PyErr {
    match e.kind {
        ErrorKind::Io(_) => PyOSError::new_err(e.to_string()),
        ErrorKind::NotOpen(state) => {
            let state = state.name();
            with_attrs(
                py,
                RingClosedError::new_err(e.to_string()),
                &[("field", Some(e.field)), ("reason", None), ("state", Some(state))],
            )
        }
        ErrorKind::Fault(reason) => with_attrs(
            py,
            RingError::new_err(e.to_string()),
            &[("field", Some(e.field)), ("reason", Some(reason.name()))],
        ),
        ErrorKind::Usage => with_attrs(
            py,
            RingError::new_err(e.to_string()),
            &[("field", Some(e.field)), ("reason", None)],
        ),
    }
}

/// A usage error on a named argument (reason None).
pub fn usage_err(py: Python<'_>, field: &str, message: String) -> PyErr {
    with_attrs(
        py,
        RingError::new_err(message),
        &[("field", Some(field)), ("reason", None)],
    )
}

/// Convert an object-header rejection.
pub fn object_err(py: Python<'_>, e: CoreObjectError) -> PyErr {
    with_attrs(
        py,
        ObjectError::new_err(e.to_string()),
        &[("failure", Some(e.failure.name()))],
    )
}

/// io::Error -> ValueError for invalid input, OSError otherwise.
pub fn io_err(e: std::io::Error) -> PyErr {
    if e.kind() == std::io::ErrorKind::InvalidInput {
        PyValueError::new_err(e.to_string())
    } else {
        PyErr::from(e)
    }
}
