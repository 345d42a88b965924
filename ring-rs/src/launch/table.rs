//! A launch table: the kernels of a captured graph with their arguments
//! resolved, in the order they run, and the argument slots that take the
//! values of bound variables (`start_pos`, ...) at each run.
//!
//! Kernel ABI this relies on: a tinygrad CPU program is `void f(T0 a0, ...,
//! Tn an)` whose parameters are all buffer pointers or `int` variables. A
//! launch calls it through `unsafe extern "C" fn(u64, ...)` with exactly its
//! parameter count: under the x86-64 SysV and AArch64 procedure call
//! standards a pointer and a `u64` travel in the same integer register or
//! 8-byte stack slot, and an `int` parameter reads the low 32 bits of its
//! slot. That is a platform-ABI guarantee, not one of Rust's abstract
//! machine (which does not call pointer and `u64` parameters compatible), so
//! the module exists only on those two architectures.

use std::fmt;
use std::num::NonZeroUsize;

/// The most parameters a kernel may have.
/// (A batched step of 8 runs binds 16 variables, a slot and a position per run, beside its buffers.)
pub const MAX_ARGS: usize = 32;

/// What was wrong with a table operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaunchError(pub String);

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for LaunchError {}

fn err<T>(message: String) -> Result<T, LaunchError> {
    Err(LaunchError(message))
}

/// One kernel call, or one sliced kernel (called once per core_id slice).
#[derive(Clone, Copy, Debug)]
pub struct Launch {
    kernel: NonZeroUsize,
    nargs: u8,
    /// `None`: one call on the calling thread; else `args[slot]` = slice
    /// index (tinygrad's core_id) and the slices are shared out.
    core_slot: Option<u8>,
    slices: u16,
    args: [u64; MAX_ARGS],
}

/// Call `$kernel` with the first N words of `$args`, N = number of indices.
macro_rules! call_with {
    ($kernel:expr, $args:expr; $($i:literal)*) => {{
        // SAFETY: the caller of `Launch::call` guarantees the push contract:
        // `$kernel` is the entry of a function whose parameters are exactly
        // these N pointer or integer values (module doc: platform ABI).
        let f: unsafe extern "C" fn($(call_with!(@word $i)),*) = unsafe { std::mem::transmute($kernel) };
        // SAFETY: as above; the arguments are the ones the contract vouches for.
        unsafe { f($($args[$i]),*) }
    }};
    (@word $i:literal) => { u64 };
}

impl Launch {
    pub(crate) fn slices(&self) -> u16 {
        self.slices
    }

    pub(crate) fn is_sliced(&self) -> bool {
        self.core_slot.is_some()
    }

    /// # Safety
    /// The contract of [`LaunchTable::push`] holds for this launch and `args`
    /// differs from `self.args` at most in the core slot (a slice < `slices`).
    unsafe fn call(&self, args: &[u64; MAX_ARGS]) {
        let k = self.kernel.get();
        match self.nargs {
            0 => call_with!(k, args;),
            1 => call_with!(k, args; 0),
            2 => call_with!(k, args; 0 1),
            3 => call_with!(k, args; 0 1 2),
            4 => call_with!(k, args; 0 1 2 3),
            5 => call_with!(k, args; 0 1 2 3 4),
            6 => call_with!(k, args; 0 1 2 3 4 5),
            7 => call_with!(k, args; 0 1 2 3 4 5 6),
            8 => call_with!(k, args; 0 1 2 3 4 5 6 7),
            9 => call_with!(k, args; 0 1 2 3 4 5 6 7 8),
            10 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9),
            11 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10),
            12 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11),
            13 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12),
            14 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13),
            15 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14),
            16 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15),
            17 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16),
            18 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17),
            19 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18),
            20 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19),
            21 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20),
            22 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21),
            23 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22),
            24 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23),
            25 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24),
            26 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25),
            27 => call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26),
            28 => {
                call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27)
            }
            29 => {
                call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28)
            }
            30 => {
                call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29)
            }
            31 => {
                call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30)
            }
            32 => {
                call_with!(k, args; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31)
            }
            n => unreachable!("push refuses {n} > {MAX_ARGS} parameters"),
        }
    }

    /// Run an unsliced launch.
    ///
    /// # Safety
    /// The contract of [`LaunchTable::push`] holds for this launch.
    pub(crate) unsafe fn run(&self) {
        // SAFETY: forwarded from the caller; the arguments are the launch's own.
        unsafe { self.call(&self.args) }
    }

    /// Run slice `slice` of a sliced launch.
    ///
    /// # Safety
    /// The contract of [`LaunchTable::push`] holds for this launch, it is
    /// sliced and `slice < self.slices()`.
    pub(crate) unsafe fn run_slice(&self, slice: u32) {
        let mut args = self.args;
        if let Some(slot) = self.core_slot {
            args[usize::from(slot)] = u64::from(slice);
        }
        // SAFETY: forwarded from the caller; only the core slot changed, to a
        // slice index below the launch's slice count.
        unsafe { self.call(&args) }
    }
}

/// A variable bound into argument slots of the table's launches.
#[derive(Clone, Debug)]
struct Variable {
    name: String,
    lo: i64,
    hi: i64,
    slots: Vec<(usize, usize)>, // (launch, argument)
}

/// The launches of one plan, in order, and its variables.
#[derive(Clone, Debug, Default)]
pub struct LaunchTable {
    launches: Vec<Launch>,
    variables: Vec<Variable>,
}

impl LaunchTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of launches.
    pub fn len(&self) -> usize {
        self.launches.len()
    }

    /// Whether there are no launches.
    pub fn is_empty(&self) -> bool {
        self.launches.is_empty()
    }

    pub(crate) fn launches(&self) -> &[Launch] {
        &self.launches
    }

    /// Append a launch of the kernel at address `kernel` with the parameters
    /// `args` (its full parameter list; variable slots are filled by `set`).
    /// `core_slot`: the parameter that takes the core_id slice index, for a
    /// kernel split into `slices` slices. Returns the launch's index.
    ///
    /// # Safety
    /// Every time the table is run (by [`super::Pool::run`]), until it is
    /// dropped: `kernel` is the entry of a C-ABI function with exactly
    /// `args.len()` pointer or integer parameters that may be called with
    /// `args` (each core slot value below `slices` in turn, slices possibly
    /// at once on different threads, and every variable value `bind` admits);
    /// the memory the pointers name stays valid for the accesses it makes, and
    /// nothing else accesses that memory during a run.
    pub unsafe fn push(
        &mut self,
        kernel: usize,
        args: &[u64],
        core_slot: Option<usize>,
        slices: u16,
    ) -> Result<usize, LaunchError> {
        let Some(kernel) = NonZeroUsize::new(kernel) else {
            return err("kernel address is 0".into());
        };
        if args.len() > MAX_ARGS {
            return err(format!(
                "kernel has {} parameters, at most {MAX_ARGS} are supported",
                args.len()
            ));
        }
        if let Some(slot) = core_slot.filter(|&slot| slot >= args.len()) {
            return err(format!(
                "core slot {slot} is not one of the kernel's {} parameters",
                args.len()
            ));
        }
        let mut words = [0u64; MAX_ARGS];
        words[..args.len()].copy_from_slice(args);
        self.launches.push(Launch {
            kernel,
            nargs: args.len() as u8,
            core_slot: core_slot.map(|s| s as u8),
            slices: if core_slot.is_some() { slices } else { 0 },
            args: words,
        });
        Ok(self.launches.len() - 1)
    }

    /// Make parameter `slot` of launch `launch` take the value of variable
    /// `name`, which `set` accepts in `lo..=hi`.
    ///
    /// # Safety
    /// The parameter is an integer the kernel was compiled to take any value
    /// in `lo..=hi` in (the contract of `push`, for these values).
    pub unsafe fn bind(
        &mut self,
        name: &str,
        launch: usize,
        slot: usize,
        lo: i64,
        hi: i64,
    ) -> Result<(), LaunchError> {
        let Some(l) = self.launches.get(launch) else {
            return err(format!(
                "no launch {launch} (the table has {})",
                self.launches.len()
            ));
        };
        if slot >= usize::from(l.nargs) || l.core_slot == Some(slot as u8) {
            return err(format!(
                "parameter {slot} of launch {launch} is not a variable slot"
            ));
        }
        if lo > hi {
            return err(format!("variable {name}: empty range {lo}..={hi}"));
        }
        match self.variables.iter_mut().find(|v| v.name == name) {
            Some(v) if (v.lo, v.hi) != (lo, hi) => {
                return err(format!(
                    "variable {name} bound with range {lo}..={hi}, before with {}..={}",
                    v.lo, v.hi
                ));
            }
            Some(v) => v.slots.push((launch, slot)),
            None => self.variables.push(Variable {
                name: name.into(),
                lo,
                hi,
                slots: vec![(launch, slot)],
            }),
        }
        Ok(())
    }

    /// Change the slice count of sliced launch `launch` (a count that depends
    /// on variables).
    ///
    /// # Safety
    /// The kernel takes every core_id below `slices` (the contract of `push`).
    pub unsafe fn set_slices(&mut self, launch: usize, slices: u16) -> Result<(), LaunchError> {
        match self.launches.get_mut(launch) {
            Some(l) if l.is_sliced() => {
                l.slices = slices;
                Ok(())
            }
            Some(_) => err(format!("launch {launch} is not sliced")),
            None => err(format!(
                "no launch {launch} (the table has {})",
                self.launches.len()
            )),
        }
    }

    /// Number of bound variables.
    pub fn variable_count(&self) -> usize {
        self.variables.len()
    }

    /// Name of variable `i` (`i < variable_count()`).
    pub fn variable_name(&self, i: usize) -> &str {
        &self.variables[i].name
    }

    /// Give variable `i` the value `value` in every slot it is bound to.
    pub fn set_variable(&mut self, i: usize, value: i64) -> Result<(), LaunchError> {
        let v = &self.variables[i];
        if !(v.lo..=v.hi).contains(&value) {
            return err(format!(
                "variable {} = {value} is outside {}..={}",
                v.name, v.lo, v.hi
            ));
        }
        for &(launch, slot) in &v.slots {
            self.launches[launch].args[slot] = value as u64;
        }
        Ok(())
    }
}
