//! Eventfd wake hints (spec §21). One eventfd per direction:
//! the *readable* eventfd is signalled by the producer and waited on by the
//! consumer; the *writable* eventfd the other way round. Hints carry no
//! data: the woken side always reloads cursors from shared memory.

use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use rustix::event::{EventfdFlags, PollFd, PollFlags, Timespec};
use rustix::fs::OFlags;

/// Result of one blocking wait on an eventfd.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WaitOutcome {
    /// Ready: the eventfd became readable (a hint arrived, possibly stale)
    /// or, at ring level, the awaited condition holds.
    Ready,
    /// The timeout elapsed.
    TimedOut,
    /// A signal interrupted the wait (EINTR); the caller may check signals
    /// and wait again for the remaining time.
    Interrupted,
}

/// An owned, non-blocking, close-on-exec eventfd.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    /// A fresh eventfd (counter 0, `EFD_CLOEXEC | EFD_NONBLOCK`).
    pub fn new() -> io::Result<Self> {
        Ok(Self(rustix::event::eventfd(
            0,
            EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK,
        )?))
    }

    /// Take a private duplicate of an existing eventfd (e.g. one received
    /// with SCM_RIGHTS); the caller keeps ownership of `fd`. The shared file
    /// description is switched to non-blocking. Fails with InvalidInput when
    /// `fd` is not an eventfd.
    pub fn dup_from(fd: BorrowedFd<'_>) -> io::Result<Self> {
        let link = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
        if link.as_os_str() != "anon_inode:[eventfd]" {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("fd {} is not an eventfd ({})", fd.as_raw_fd(), link.display()),
            ));
        }
        let owned = rustix::io::dup(fd)?;
        rustix::io::fcntl_setfd(&owned, rustix::io::FdFlags::CLOEXEC)?;
        let fl = rustix::fs::fcntl_getfl(&owned)?;
        rustix::fs::fcntl_setfl(&owned, fl | OFlags::NONBLOCK)?;
        Ok(Self(owned))
    }

    /// Give up ownership of the fd (the caller must close it).
    pub fn into_raw_fd(self) -> RawFd {
        std::os::fd::IntoRawFd::into_raw_fd(self.0)
    }

    /// Raw fd number, for SCM_RIGHTS or `loop.add_reader`.
    pub fn raw(&self) -> RawFd {
        self.0.as_raw_fd()
    }

    /// Add one to the counter. A full counter (EAGAIN) already means
    /// "signalled", so it is not an error.
    pub fn signal(&self) {
        match rustix::io::write(&self.0, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => {}
            Err(e) => debug_assert!(false, "eventfd write failed: {e}"),
        }
    }

    /// Reset the counter to zero; returns whether it was non-zero.
    pub fn drain(&self) -> bool {
        let mut buf = [0u8; 8];
        matches!(rustix::io::read(&self.0, &mut buf), Ok(8))
    }

    /// Block until the counter is non-zero or `timeout` (None = forever)
    /// elapses. Does not drain.
    pub fn wait(&self, timeout: Option<Duration>) -> io::Result<WaitOutcome> {
        let ts = timeout.map(|t| Timespec {
            tv_sec: t.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: i64::from(t.subsec_nanos()),
        });
        let mut fds = [PollFd::new(&self.0, PollFlags::IN)];
        match rustix::event::poll(&mut fds, ts.as_ref()) {
            Ok(0) => Ok(WaitOutcome::TimedOut),
            Ok(_) => Ok(WaitOutcome::Ready),
            Err(rustix::io::Errno::INTR) => Ok(WaitOutcome::Interrupted),
            Err(e) => Err(e.into()),
        }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

/// Remaining time until `deadline` (None = no deadline).
pub(crate) fn remaining(deadline: Option<Instant>) -> Option<Duration> {
    deadline.map(|d| d.saturating_duration_since(Instant::now()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signal_wait_drain() {
        let e = EventFd::new().unwrap();
        assert_eq!(e.wait(Some(Duration::ZERO)).unwrap(), WaitOutcome::TimedOut);
        e.signal();
        e.signal();
        assert_eq!(
            e.wait(Some(Duration::from_millis(10))).unwrap(),
            WaitOutcome::Ready
        );
        assert!(e.drain());
        assert!(!e.drain());
        let d = EventFd::dup_from(e.as_fd()).unwrap();
        d.signal();
        assert!(e.drain());
    }

    #[test]
    fn dup_rejects_non_eventfd() {
        let (r, _w) = rustix::pipe::pipe().unwrap();
        assert_eq!(
            EventFd::dup_from(r.as_fd()).unwrap_err().kind(),
            io::ErrorKind::InvalidInput
        );
    }
}
