//! Memory registered with a connection's protection domain that the connection owns.

use std::ffi::c_void;
use std::io;
use std::sync::atomic::AtomicU64;

use super::ffi::{self, Ep, Mr};

/// Registered memory we own (page-aligned), deregistered and freed on drop.
pub struct Region {
    ptr: *mut u8,
    pub(super) len: usize,
    pub(super) mr: Mr,
}

unsafe impl Send for Region {}

impl Region {
    pub fn new(ep: *mut Ep, len: usize, access: i32) -> io::Result<Region> {
        let layout = std::alloc::Layout::from_size_align(len.max(64), 4096).map_err(io::Error::other)?;
        // SAFETY: a non-zero-sized layout; freed in Drop with the same layout
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(io::Error::new(io::ErrorKind::OutOfMemory, "cannot allocate a registered region"));
        }
        let mut mr = Mr { mr: std::ptr::null_mut(), lkey: 0, rkey: 0 };
        // SAFETY: `ptr` is valid for `len.max(64)` bytes for as long as the MR lives (dropped first)
        if unsafe { ffi::hv_reg(ep, ptr as *mut c_void, len.max(64), access, &mut mr) } != 0 {
            let e = io::Error::last_os_error();
            // SAFETY: allocated above with this layout
            unsafe { std::alloc::dealloc(ptr, layout) };
            return Err(io::Error::new(e.kind(), format!("registering {len} bytes failed: {e}")));
        }
        Ok(Region { ptr, len, mr })
    }

    pub fn addr(&self) -> u64 {
        self.ptr as u64
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: our allocation of at least `len` bytes; RDMA writes into it are ordered by the
        // completions we poll before reading
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    #[allow(clippy::mut_from_ref)]
    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and `&mut self` is the only Rust access
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }

    pub(super) fn word(&self, off: usize) -> &AtomicU64 {
        // SAFETY: 8-aligned inside a page-aligned allocation; the peer RDMA-WRITEs it
        unsafe { AtomicU64::from_ptr(self.ptr.add(off) as *mut u64) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        if self.ptr.is_null() {
            return;
        }
        // SAFETY: the MR registered in `new`, then the allocation it covered
        unsafe {
            ffi::hv_dereg(self.mr.mr);
            std::alloc::dealloc(self.ptr, std::alloc::Layout::from_size_align_unchecked(self.len.max(64), 4096));
        }
    }
}

impl Region {
    /// A placeholder that owns nothing (what a closed connection holds).
    pub(super) fn dangling() -> Region {
        Region { ptr: std::ptr::null_mut(), len: 0, mr: Mr { mr: std::ptr::null_mut(), lkey: 0, rkey: 0 } }
    }
}
