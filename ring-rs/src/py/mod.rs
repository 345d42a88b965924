//! The `swactor_ring` Python module.

mod errors;
mod handles;
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
mod launch;
mod object;

use pyo3::prelude::*;

use crate::abi::{HEADER_LEN, RING_MAGIC, RING_VERSION, WAKE_CONSUMER_WAITING, WAKE_PRODUCER_WAITING};
use crate::object::{OBJECT_HEADER_LEN, OBJECT_MAGIC, OBJECT_VERSION};

#[pymodule]
fn swactor_ring(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add_class::<handles::PyArena>()?;
    m.add_class::<handles::PyRingLayout>()?;
    m.add_class::<handles::PyRingState>()?;
    m.add_class::<handles::PyRingStatus>()?;
    m.add_class::<handles::PySpan>()?;
    m.add_class::<handles::PyProducer>()?;
    m.add_class::<handles::PyConsumer>()?;
    m.add_class::<object::PyObjectHeader>()?;
    m.add_function(wrap_pyfunction!(handles::init_ring, m)?)?;
    m.add_function(wrap_pyfunction!(handles::open_ring, m)?)?;
    m.add_function(wrap_pyfunction!(handles::eventfd, m)?)?;
    m.add_function(wrap_pyfunction!(handles::fault_ring, m)?)?;
    m.add("RingError", py.get_type::<errors::RingError>())?;
    m.add("RingClosedError", py.get_type::<errors::RingClosedError>())?;
    m.add("ObjectError", py.get_type::<errors::ObjectError>())?;
    m.add("HEADER_LEN", HEADER_LEN)?;
    m.add("RING_MAGIC", RING_MAGIC)?;
    m.add("RING_VERSION", RING_VERSION)?;
    m.add("WAKE_CONSUMER_WAITING", WAKE_CONSUMER_WAITING)?;
    m.add("WAKE_PRODUCER_WAITING", WAKE_PRODUCER_WAITING)?;
    m.add("OBJECT_HEADER_LEN", OBJECT_HEADER_LEN)?;
    m.add("OBJECT_MAGIC", OBJECT_MAGIC)?;
    m.add("OBJECT_VERSION", OBJECT_VERSION)?;
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    launch::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
