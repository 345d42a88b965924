//! LaunchTable and LaunchPool for Python (`swactor.worker.compute.replay`).
//!
//! Trust: a table runs machine code at the addresses it is given, with the
//! arguments it is given, like ctypes does. Only `replay.plan` builds tables,
//! from tinygrad CPU programs whose buffers the plan keeps alive; the checks
//! here (parameter counts, slots, variable ranges) catch mistakes, they cannot
//! make a wrong address safe.

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::launch::{LaunchError, LaunchTable, Pool};

fn value_err(e: LaunchError) -> PyErr {
    PyValueError::new_err(e.0)
}

/// The kernels of a captured graph in run order, with resolved arguments and
/// bound variables. Trusted input: see `push`.
#[pyclass(name = "LaunchTable", module = "swactor_ring")]
pub struct PyLaunchTable {
    table: LaunchTable,
}

#[pymethods]
impl PyLaunchTable {
    #[new]
    fn new() -> Self {
        Self {
            table: LaunchTable::new(),
        }
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    /// Append a launch of the C function at `kernel` with the parameter values
    /// `args` (all of them; variable slots are filled at run time). A kernel
    /// split into core_id slices names the parameter that takes the slice
    /// index in `core_slot`. The caller vouches that the function takes these
    /// parameters and that the buffers they point to outlive the table.
    #[pyo3(signature = (kernel, args, core_slot=None, slices=0))]
    fn push(
        &mut self,
        kernel: usize,
        args: Vec<u64>,
        core_slot: Option<usize>,
        slices: u16,
    ) -> PyResult<usize> {
        // SAFETY: the caller's promise above (`replay.plan`: the entry of a
        // tinygrad CPU program, buffer addresses of buffers the plan keeps).
        unsafe { self.table.push(kernel, &args, core_slot, slices) }.map_err(value_err)
    }

    /// Make parameter `slot` of launch `launch` take variable `name`'s value,
    /// which `LaunchPool.run` then accepts in `lo..=hi` (the variable's bounds
    /// the kernel was compiled for).
    fn bind(&mut self, name: &str, launch: usize, slot: usize, lo: i64, hi: i64) -> PyResult<()> {
        // SAFETY: the caller passes the kernel's own variable parameter and
        // bounds (`replay.plan`: tinygrad's vars and their vmin/vmax).
        unsafe { self.table.bind(name, launch, slot, lo, hi) }.map_err(value_err)
    }

    /// Set the slice count of a sliced launch whose count depends on variables.
    fn set_slices(&mut self, launch: usize, slices: u16) -> PyResult<()> {
        // SAFETY: the caller passes the kernel's global size for this run.
        unsafe { self.table.set_slices(launch, slices) }.map_err(value_err)
    }
}

/// The calling thread plus `threads - 1` native workers that run launch
/// tables; idle workers spin `spin_ns`, then sleep.
#[pyclass(frozen, name = "LaunchPool", module = "swactor_ring")]
pub struct PyLaunchPool {
    pool: Pool,
}

#[pymethods]
impl PyLaunchPool {
    #[new]
    #[pyo3(signature = (threads, spin_ns=200_000))]
    fn new(threads: usize, spin_ns: u64) -> PyResult<Self> {
        if threads < 1 {
            return Err(PyValueError::new_err(format!(
                "threads must be >= 1, got {threads}"
            )));
        }
        let pool = Pool::new(threads, spin_ns).map_err(|e| {
            PyOSError::new_err(format!("could not start {} launch threads: {e}", threads - 1))
        })?;
        Ok(Self { pool })
    }

    #[getter]
    fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// Give the table's variables their values from `var_vals` (name -> int),
    /// then run its launches in order with the GIL released; returns when all
    /// have finished. The table cannot be changed meanwhile.
    fn run(
        &self,
        py: Python<'_>,
        mut table: PyRefMut<'_, PyLaunchTable>,
        var_vals: &Bound<'_, PyDict>,
    ) -> PyResult<()> {
        let t = &mut table.table;
        for i in 0..t.variable_count() {
            let name = t.variable_name(i);
            let Some(value) = var_vals.get_item(name)? else {
                return Err(PyValueError::new_err(format!("no value for variable {name}")));
            };
            let value: i64 = value.extract()?;
            t.set_variable(i, value).map_err(value_err)?;
        }
        let t = &table.table;
        py.detach(|| self.pool.run(t));
        Ok(())
    }
}

/// Add the launcher's classes and constant to the module.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyLaunchTable>()?;
    m.add_class::<PyLaunchPool>()?;
    m.add("LAUNCH_MAX_ARGS", crate::launch::MAX_ARGS)
}
