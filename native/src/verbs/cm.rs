//! Connection setup through rdma_cm: a client's connect (address and route resolution, connect, the
//! HELLO), and a listener whose event channel the server's loop polls.

use std::ffi::{c_void, CString};
use std::io;
use std::os::fd::RawFd;
use std::time::{Duration, Instant};

use super::end::VerbsEnd;
use super::ffi::{self, CmEvent};
use super::RETRY;

// enum rdma_cm_event_type
pub const ADDR_RESOLVED: i32 = 0;
pub const ADDR_ERROR: i32 = 1;
pub const ROUTE_RESOLVED: i32 = 2;
pub const ROUTE_ERROR: i32 = 3;
pub const CONNECT_REQUEST: i32 = 4;
pub const CONNECT_RESPONSE: i32 = 5;
pub const UNREACHABLE: i32 = 7;
pub const REJECTED: i32 = 8;
pub const ESTABLISHED: i32 = 9;

fn available() -> io::Result<()> {
    ffi::load().map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e))
}

fn os_err(what: String) -> io::Error {
    let e = io::Error::last_os_error();
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

pub fn event_name(kind: i32) -> String {
    // SAFETY: a static name from librdmacm
    ffi::name(unsafe { ffi::hv_event_name(kind) }).trim_start_matches("RDMA_CM_EVENT_").to_string()
}

fn c_host(host: &str) -> io::Result<CString> {
    CString::new(host).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a host name with a NUL"))
}

/// The next event on `ch` within the deadline (the channel is non-blocking: poll, then read).
fn next_event(ch: *mut c_void, fd: RawFd, deadline: Instant, step: &str, where_: &str) -> io::Result<CmEvent> {
    loop {
        let mut ev = CmEvent::empty();
        // SAFETY: a live channel
        if unsafe { ffi::hv_get_event(ch, &mut ev) } == 0 {
            return Ok(ev);
        }
        let now = Instant::now();
        if now >= deadline {
            return Err(io::Error::new(io::ErrorKind::TimedOut, format!("{step} for {where_} timed out")));
        }
        let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
        let ms = (deadline - now).as_millis().clamp(1, 1000) as i32;
        // SAFETY: one valid pollfd
        unsafe { libc::poll(&mut p, 1, ms) };
    }
}

fn expect(ch: *mut c_void, fd: RawFd, deadline: Instant, want: i32, step: &str, where_: &str) -> io::Result<()> {
    let ev = next_event(ch, fd, deadline, step, where_)?;
    if ev.kind == want {
        return Ok(());
    }
    let name = event_name(ev.kind);
    Err(match ev.kind {
        REJECTED => io::Error::new(io::ErrorKind::ConnectionRefused,
                                   format!("RDMA connection to {where_} refused (nobody listening there?)")),
        ADDR_ERROR | ROUTE_ERROR | UNREACHABLE => io::Error::new(io::ErrorKind::HostUnreachable,
            format!("{where_} is not reachable over RDMA ({name} during {step})")),
        _ => io::Error::new(io::ErrorKind::ConnectionAborted,
                            format!("RDMA connection to {where_} failed: {name} during {step}")),
    })
}

/// A connected client end to `host:port` (an IPv4 address on an RDMA device), its HELLO sent.
pub fn connect(host: &str, port: u16, timeout: Duration) -> io::Result<VerbsEnd> {
    available()?;
    let where_ = format!("{host}:{port}");
    let deadline = Instant::now() + timeout;
    let ms = timeout.as_millis().clamp(100, 60_000) as i32;
    // SAFETY: plain shim calls; every object is destroyed on the error paths or owned by the end
    unsafe {
        let ch = ffi::hv_channel_create();
        if ch.is_null() {
            return Err(os_err("creating an rdma_cm event channel failed".into()));
        }
        let fd = ffi::hv_channel_fd(ch);
        let id = ffi::hv_id_create(ch);
        if id.is_null() {
            let e = os_err("creating an rdma_cm id failed".into());
            ffi::hv_channel_destroy(ch);
            return Err(e);
        }
        let cleanup = |e: io::Error| {
            ffi::hv_id_destroy(id);
            ffi::hv_channel_destroy(ch);
            e
        };
        let h = c_host(host).map_err(cleanup)?;
        if ffi::hv_resolve_addr(id, h.as_ptr(), port as i32, ms) != 0 {
            return Err(cleanup(os_err(format!("cannot resolve {where_} to an RDMA device"))));
        }
        expect(ch, fd, deadline, ADDR_RESOLVED, "address resolution", &where_).map_err(cleanup)?;
        if ffi::hv_resolve_route(id, ms) != 0 {
            return Err(cleanup(os_err(format!("cannot resolve a route to {where_}"))));
        }
        expect(ch, fd, deadline, ROUTE_RESOLVED, "route resolution", &where_).map_err(cleanup)?;
        let end = VerbsEnd::create(id, ch, where_.clone(), false).map_err(cleanup)?;
        // from here the end owns id and channel
        if ffi::hv_connect(id, end.qpn(), RETRY) != 0 {
            return Err(os_err(format!("rdma_connect to {where_} failed")));
        }
        expect(ch, fd, deadline, CONNECT_RESPONSE, "connecting", &where_)?;
        end.bring_up()?;
        if ffi::hv_establish(id) != 0 {
            return Err(os_err(format!("rdma_establish with {where_} failed")));
        }
        end.hello()?;
        Ok(end)
    }
}

/// A listening cm id and its event channel: CONNECT_REQUESTs become ends in `accept`, and the
/// children's later events (DISCONNECTED) arrive here too.
pub struct VerbsListener {
    ch: *mut c_void,
    id: *mut c_void,
    pub fd: RawFd,
    pub port: u16,
}

unsafe impl Send for VerbsListener {}

/// What the listener's channel said.
pub enum Event {
    Connected(Box<VerbsEnd>), // boxed: an end is large, the other events a few words
    Failed(String),          // a connection request we could not serve
    Ended(*mut c_void, String), // a child's connection ended (its cm id, the event)
}

impl VerbsListener {
    pub fn bind(host: &str, port: u16) -> io::Result<VerbsListener> {
        available()?;
        // SAFETY: plain shim calls; destroyed on error or in Drop
        unsafe {
            let ch = ffi::hv_channel_create();
            if ch.is_null() {
                return Err(os_err("creating an rdma_cm event channel failed".into()));
            }
            let id = ffi::hv_id_create(ch);
            let h = c_host(host)?;
            if id.is_null() || ffi::hv_bind_listen(id, h.as_ptr(), port as i32, 1024) != 0 {
                let e = os_err(format!("cannot listen for RDMA connections on {host}:{port} (is there an RDMA device on that address?)"));
                if !id.is_null() {
                    ffi::hv_id_destroy(id);
                }
                ffi::hv_channel_destroy(ch);
                return Err(e);
            }
            let port = u16::from_be(ffi::hv_src_port(id) as u16);
            Ok(VerbsListener { ch, id, fd: ffi::hv_channel_fd(ch), port })
        }
    }

    /// The next event, or None when there is none now.
    pub fn next(&self) -> Option<Event> {
        let mut ev = CmEvent::empty();
        // SAFETY: our live channel
        if unsafe { ffi::hv_get_event(self.ch, &mut ev) } != 0 {
            return None;
        }
        Some(match ev.kind {
            CONNECT_REQUEST => match accept(ev.id) {
                Ok(end) => Event::Connected(Box::new(end)),
                Err(e) => Event::Failed(format!("accepting an RDMA connection failed: {e}")),
            },
            ESTABLISHED => return self.next(),
            kind => Event::Ended(ev.id, format!("RDMA connection ended: {}", event_name(kind))),
        })
    }
}

fn accept(id: *mut c_void) -> io::Result<VerbsEnd> {
    let end = match VerbsEnd::create(id, std::ptr::null_mut(), "rdma_cm peer".into(), true) {
        Ok(end) => end,
        Err(e) => {
            // SAFETY: the child id nobody else owns
            unsafe { ffi::hv_id_destroy(id) };
            return Err(e);
        }
    };
    end.bring_up()?;
    // SAFETY: the end's live cm id
    if unsafe { ffi::hv_accept(id, end.qpn(), RETRY) } != 0 {
        return Err(os_err("rdma_accept failed".into()));
    }
    Ok(end)
}

impl VerbsListener {
    /// Stops listening (new connection requests are refused) but keeps the event channel, which
    /// accepted ends still alive need until they are destroyed.
    pub fn stop_listening(&mut self) {
        if !self.id.is_null() {
            // SAFETY: our listening id, destroyed once
            unsafe { ffi::hv_id_destroy(self.id) };
            self.id = std::ptr::null_mut();
        }
    }
}

impl Drop for VerbsListener {
    fn drop(&mut self) {
        self.stop_listening();
        // SAFETY: ours; every child end was closed first
        unsafe { ffi::hv_channel_destroy(self.ch) };
    }
}
