//! One shared arena mapping per process (spec §19): mapped once from a
//! file descriptor with `MAP_SHARED`, never remapped or resized, unmapped
//! when the last ring, span or handle referring to it is dropped.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

/// A `MAP_SHARED` read/write mapping of an arena file.
#[derive(Debug)]
pub struct Arena {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: `Arena` only holds the base address and length of a mapping it
// owns; the mapping is valid from any thread and all accesses to its memory
// go through atomics (headers) or through protocol-owned spans (ring data).
unsafe impl Send for Arena {}
// SAFETY: see `Send`; `&Arena` exposes no interior mutation of its own.
unsafe impl Sync for Arena {}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

impl Arena {
    /// Create a sparse memfd of `size` bytes (close-on-exec), sealed against
    /// shrinking and growing so no process can truncate it under a mapping.
    pub fn create_memfd(name: &str, size: u64) -> io::Result<OwnedFd> {
        if size == 0 {
            return Err(invalid("arena size must be > 0".into()));
        }
        if name.as_bytes().contains(&0) {
            return Err(invalid("arena name contains a NUL byte".into()));
        }
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)?;
        rustix::fs::ftruncate(&fd, size)?;
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)?;
        Ok(fd)
    }

    /// Map `size` bytes of `fd` shared and read/write. The fd is not kept:
    /// the mapping stays valid after the caller closes it. The file must be
    /// at least `size` bytes long (checked with fstat); a file that could
    /// later shrink (not a sealed memfd) would turn accesses into SIGBUS, so
    /// arenas should come from [`Arena::create_memfd`].
    pub fn map(fd: BorrowedFd<'_>, size: u64) -> io::Result<Arena> {
        if size == 0 {
            return Err(invalid("arena size must be > 0".into()));
        }
        let len = usize::try_from(size).map_err(|_| invalid(format!("arena size {size} too large")))?;
        let st = rustix::fs::fstat(fd.as_fd())?;
        let file_len = u64::try_from(st.st_size).unwrap_or(0);
        if file_len < size {
            return Err(invalid(format!(
                "arena fd is {file_len} bytes, smaller than the requested {size}"
            )));
        }
        // SAFETY: a fresh mapping at a kernel-chosen address (null hint), so
        // no existing Rust allocation is aliased or replaced. The file holds at
        // least `len` bytes (checked above).
        let ptr = unsafe {
            rustix::mm::mmap(
                std::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )?
        };
        let base = NonNull::new(ptr.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Arena { base, len })
    }

    /// Mapped length in bytes.
    pub fn len(&self) -> u64 {
        self.len as u64
    }

    /// Always false: arenas have a non-zero size.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Process-local base address (for diagnostics; never shared).
    pub fn base_address(&self) -> usize {
        self.base.as_ptr() as usize
    }

    /// Pointer to `offset` inside the mapping, if `offset + len` fits.
    pub(crate) fn ptr_at(&self, offset: u64, len: u64) -> Option<NonNull<u8>> {
        let end = offset.checked_add(len)?;
        if end > self.len as u64 {
            return None;
        }
        // `offset <= self.len`, so the result stays inside (or one past) the
        // mapping; wrapping_add keeps this computation itself in safe code.
        NonNull::new(self.base.as_ptr().wrapping_add(offset as usize))
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: `base`/`len` are exactly the mapping created in `map`; every
        // handle and span that points into it holds an `Arc<Arena>`, so no
        // reference into the mapping outlives this drop.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memfd_map_roundtrip_and_size_checks() {
        let fd = Arena::create_memfd("t", 1 << 20).unwrap();
        let a = Arena::map(fd.as_fd(), 1 << 20).unwrap();
        assert_eq!(a.len(), 1 << 20);
        assert!(a.ptr_at((1 << 20) - 8, 8).is_some());
        assert!(a.ptr_at((1 << 20) - 8, 9).is_none());
        assert!(a.ptr_at(u64::MAX, 2).is_none());
        assert_eq!(
            Arena::map(fd.as_fd(), 2 << 20).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
        // sealed: cannot shrink under the mapping
        assert!(rustix::fs::ftruncate(&fd, 4096).is_err());
    }
}
