//! The shim's flat C API (src/verbs/shim.c). Built without rdma-core's headers (no `hpcnet_verbs`
//! cfg), the same functions exist as stubs: `load()` then fails saying why, so nothing else is called.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

#[repr(C)]
#[derive(Clone, Copy)]
pub struct CmEvent {
    pub kind: c_int,
    pub status: c_int,
    pub id: *mut c_void,
    pub listen_id: *mut c_void,
}

impl CmEvent {
    pub fn empty() -> CmEvent {
        CmEvent { kind: -1, status: 0, id: std::ptr::null_mut(), listen_id: std::ptr::null_mut() }
    }
}


#[repr(C)]
#[derive(Default, Clone, Copy)]
pub struct Wc {
    pub wr_id: u64,
    pub status: u32,
    pub byte_len: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct Mr {
    pub mr: *mut c_void,
    pub lkey: u32,
    pub rkey: u32,
}

pub type Ep = c_void;

macro_rules! shim {
    ($(fn $name:ident($($arg:ident: $t:ty),*) -> $ret:ty;)*) => {
        #[cfg(hpcnet_verbs)]
        extern "C" {
            $(pub fn $name($($arg: $t),*) -> $ret;)*
        }
        $(
            #[cfg(not(hpcnet_verbs))]
            #[allow(unused_variables, clippy::missing_safety_doc)]
            pub unsafe fn $name($($arg: $t),*) -> $ret { unreachable!("native verbs is not built") }
        )*
    };
}

shim! {
    fn hv_channel_create() -> *mut c_void;
    fn hv_channel_fd(ch: *mut c_void) -> c_int;
    fn hv_channel_destroy(ch: *mut c_void) -> ();
    fn hv_id_create(ch: *mut c_void) -> *mut c_void;
    fn hv_id_destroy(id: *mut c_void) -> c_int;
    fn hv_bind_listen(id: *mut c_void, host: *const c_char, port: c_int, backlog: c_int) -> c_int;
    fn hv_src_port(id: *mut c_void) -> c_int;
    fn hv_resolve_addr(id: *mut c_void, host: *const c_char, port: c_int, timeout_ms: c_int) -> c_int;
    fn hv_resolve_route(id: *mut c_void, timeout_ms: c_int) -> c_int;
    fn hv_get_event(ch: *mut c_void, out: *mut CmEvent) -> c_int;
    fn hv_event_name(kind: c_int) -> *const c_char;
    fn hv_connect(id: *mut c_void, qpn: u32, retry: c_int) -> c_int;
    fn hv_accept(id: *mut c_void, qpn: u32, retry: c_int) -> c_int;
    fn hv_establish(id: *mut c_void) -> c_int;
    fn hv_ep_create(id: *mut c_void, send_depth: c_int, recv_depth: c_int, cq_depth: c_int, max_inline: c_int) -> *mut Ep;
    fn hv_ep_qpn(ep: *mut Ep) -> u32;
    fn hv_ep_fd(ep: *mut Ep) -> c_int;
    fn hv_ep_modify(ep: *mut Ep, id: *mut c_void, state: c_int, timeout: c_int, retry: c_int) -> c_int;
    fn hv_ep_destroy(ep: *mut Ep) -> ();
    fn hv_reg(ep: *mut Ep, addr: *mut c_void, len: usize, access: c_int, out: *mut Mr) -> c_int;
    fn hv_dereg(mr: *mut c_void) -> c_int;
    fn hv_post_recv(ep: *mut Ep, wr_id: u64, addr: u64, len: u32, lkey: u32) -> c_int;
    fn hv_post_send(ep: *mut Ep, wr_id: u64, opcode: c_int, addr: u64, len: u32, lkey: u32,
                    remote_addr: u64, rkey: u32) -> c_int;
    fn hv_poll(ep: *mut Ep, out: *mut Wc, n: c_int) -> c_int;
    fn hv_arm(ep: *mut Ep) -> c_int;
    fn hv_take_events(ep: *mut Ep) -> c_int;
    fn hv_wc_status_name(status: c_int) -> *const c_char;
}

#[cfg(hpcnet_verbs)]
extern "C" {
    fn hv_load(err: *mut c_char, errlen: c_int) -> c_int;
}

#[allow(dead_code)] // only the no-headers build says it
pub const NO_HEADERS: &str = "built without rdma-core headers: install libibverbs-dev and librdmacm-dev";

/// Ok once libibverbs and librdmacm are loaded; else why native verbs cannot run here (one line).
pub fn load() -> Result<(), String> {
    static LOADED: OnceLock<Result<(), String>> = OnceLock::new();
    LOADED.get_or_init(|| {
        #[cfg(hpcnet_verbs)]
        {
            let mut buf = [0 as c_char; 256];
            // SAFETY: the shim writes at most `errlen` bytes, NUL-terminated
            if unsafe { hv_load(buf.as_mut_ptr(), buf.len() as c_int) } == 0 {
                return Ok(());
            }
            // SAFETY: NUL-terminated by snprintf above
            Err(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
        }
        #[cfg(not(hpcnet_verbs))]
        Err(NO_HEADERS.to_string())
    }).clone()
}

pub fn built() -> bool {
    cfg!(hpcnet_verbs)
}

/// A C string from the shim (an event or status name), owned.
pub fn name(p: *const c_char) -> String {
    if p.is_null() {
        return "?".into();
    }
    // SAFETY: the shim's names are static NUL-terminated strings from rdma-core
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}
