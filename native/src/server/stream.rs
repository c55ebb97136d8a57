//! A connection's byte stream, whichever transport carries it: reads, writes, and how it is
//! registered with the loop's poll.

use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;

use mio::net::TcpStream;
use mio::unix::SourceFd;
use mio::{Interest, Registry, Token};

use crate::shm::ShmEnd;
use crate::verbs::VerbsEnd;

use super::SUB_SPACE;

/// A connection's bytes: a tcp socket, the server's end of shm rings, or a verbs connection.
pub(super) enum Io {
    Tcp(TcpStream),
    Shm(ShmEnd),
    Verbs(Box<VerbsEnd>), // boxed: an end is large, a socket a word
}

impl Io {
    pub(super) fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Io::Tcp(s) => s.read(buf),
            Io::Shm(e) => e.read(buf),
            Io::Verbs(e) => e.read(buf),
        }
    }

    pub(super) fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Io::Tcp(s) => s.write(buf),
            Io::Shm(e) => match e.write(buf) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    e.set_writer_waiting(true); // then look again: the reader may have just made room
                    e.write(buf)
                }
                other => other,
            },
            Io::Verbs(e) => e.write(buf),
        }
    }

    /// `head` then `body`, as far as they go now (tcp: one writev). Two slices on the stack, no Vec:
    /// under emulation an allocation per message is a measurable share of a verbs round trip.
    pub(super) fn write_pair(&mut self, head: &[u8], body: &[u8]) -> io::Result<usize> {
        match self {
            Io::Tcp(s) => s.write_vectored(&[io::IoSlice::new(head), io::IoSlice::new(body)]),
            Io::Shm(e) => match e.write_vectored(&[head, body]) {
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => {
                    e.set_writer_waiting(true); // then look again: the reader may have just made room
                    e.write_vectored(&[head, body])
                }
                other => other,
            },
            Io::Verbs(e) => e.write_vectored(&[head, body]),
        }
    }

    pub(super) fn register(&mut self, r: &Registry, id: usize) -> io::Result<()> {
        match self {
            Io::Tcp(s) => r.register(s, Token(id << 2), Interest::READABLE),
            Io::Shm(e) => {
                e.always_ring_on_data();
                r.register(&mut SourceFd(&e.my_data.as_raw_fd()), Token(id << 2), Interest::READABLE)?;
                r.register(&mut SourceFd(&e.my_space.as_raw_fd()), Token(id << 2 | SUB_SPACE), Interest::READABLE)?;
                r.register(&mut SourceFd(&e.live.as_raw_fd()), Token(id << 2 | 2), Interest::READABLE)
            }
            Io::Verbs(e) => r.register(&mut SourceFd(&e.comp_fd), Token(id << 2), Interest::READABLE),
        }
    }

    pub(super) fn want_writable(&mut self, r: &Registry, id: usize, on: bool) {
        match self {
            Io::Tcp(s) => {
                let interest = if on { Interest::READABLE | Interest::WRITABLE } else { Interest::READABLE };
                let _ = r.reregister(s, Token(id << 2), interest);
            }
            Io::Shm(e) => {
                if !on {
                    e.set_writer_waiting(false);
                }
            }
            Io::Verbs(_) => {} // the loop looks at its credits every CREDIT_LOOK while it wants to write
        }
    }

    pub(super) fn close(&mut self, r: &Registry) {
        match self {
            Io::Tcp(s) => {
                let _ = r.deregister(s);
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            Io::Shm(e) => {
                for fd in [e.my_data.as_raw_fd(), e.my_space.as_raw_fd(), e.live.as_raw_fd()] {
                    let _ = r.deregister(&mut SourceFd(&fd));
                }
                e.close();
            }
            Io::Verbs(e) => {
                let _ = r.deregister(&mut SourceFd(&e.comp_fd));
                e.close();
            }
        }
    }

    /// A short read means the socket is drained only on tcp (a ring read also stops at its end).
    pub(super) fn short_read_drains(&self) -> bool {
        matches!(self, Io::Tcp(_))
    }
}

