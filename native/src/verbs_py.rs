//! `VerbsConnection` and `VerbsListener`: the native verbs end (`verbs::conn`) as Python sees it, for
//! pytest_hpcnet/reference/transport/verbs/native.py. Every wait releases the GIL. Errors: TimeoutError
//! (a deadline passed), ConnectionError (the peer or the connection is gone), OverflowError((length,
//! limit)) (a frame over `max_length`), ValueError (bad arguments), OSError (anything else).

use std::collections::HashMap;
use std::io;
use std::sync::{Arc, Mutex};

use pyo3::buffer::PyBuffer;
use pyo3::exceptions::{PyConnectionError, PyOSError, PyOverflowError, PyTimeoutError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::pybuf::contiguous;
use crate::verbs::conn::{Conn, Listener, RecvError};

fn io_err(e: io::Error) -> PyErr {
    use io::ErrorKind::*;
    match e.kind() {
        TimedOut | WouldBlock => PyTimeoutError::new_err(e.to_string()),
        ConnectionReset | ConnectionAborted | ConnectionRefused | BrokenPipe | NotConnected | UnexpectedEof =>
            PyConnectionError::new_err(e.to_string()),
        InvalidInput => PyValueError::new_err(e.to_string()),
        _ => PyOSError::new_err(e.to_string()),
    }
}

fn seconds(s: f64) -> PyResult<std::time::Duration> {
    std::time::Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("bad timeout {s}")))
}

fn writable(buf: &PyBuffer<u8>, what: &str) -> PyResult<(*mut u8, usize)> {
    if buf.readonly() {
        return Err(PyValueError::new_err(format!("{what} must be a writable buffer")));
    }
    let s = contiguous(buf, what)?;
    Ok((s.as_ptr() as *mut u8, s.len()))
}

/// Raw pointers cross `allow_threads`: the PyBuffer they come from stays exported meanwhile.
struct Ptr(*mut u8);
// SAFETY: only dereferenced by the shim/NIC while the exporting PyBuffer is held by the caller
unsafe impl Send for Ptr {}

/// One native verbs connection (client or accepted).
#[pyclass(frozen, name = "VerbsConnection", module = "pytest_hpcnet_native._native")]
pub struct PyVerbsConnection {
    pub(crate) conn: Arc<Conn>,
    pinned: Mutex<HashMap<u64, PyBuffer<u8>>>,   // registered memory stays exported (alive, unresized)
}

#[pymethods]
impl PyVerbsConnection {
    /// Connects to a listener (native or pyverbs) at `host:port`, an address on an RDMA device.
    #[staticmethod]
    #[pyo3(signature = (host, port, timeout=10.0))]
    fn connect(py: Python<'_>, host: &str, port: u16, timeout: f64) -> PyResult<Self> {
        let t = seconds(timeout)?;
        let conn = py.allow_threads(|| Conn::connect(host, port, t)).map_err(io_err)?;
        Ok(PyVerbsConnection { conn: Arc::new(conn), pinned: Mutex::new(HashMap::new()) })
    }

    #[getter]
    fn peer(&self) -> String {
        self.conn.peer().to_string()
    }

    /// One framed message: a 4-byte big-endian length, then the parts (gathered, not joined).
    fn send(&self, py: Python<'_>, parts: Vec<PyBuffer<u8>>, timeout: f64) -> PyResult<()> {
        let t = seconds(timeout)?;
        let mut slices: Vec<&[u8]> = Vec::with_capacity(parts.len() + 1);
        for p in &parts {
            slices.push(contiguous(p, "a message part")?);
        }
        let total: usize = slices.iter().map(|s| s.len()).sum();
        let hdr = u32::try_from(total).map_err(|_| PyOverflowError::new_err((total, u32::MAX as usize)))?.to_be_bytes();
        slices.insert(0, &hdr);
        let c = self.conn.clone();
        py.allow_threads(|| c.write_all(&slices, t)).map_err(io_err)
    }

    /// Unframed bytes (the run-credential handshake).
    fn send_raw(&self, py: Python<'_>, data: PyBuffer<u8>, timeout: f64) -> PyResult<()> {
        let t = seconds(timeout)?;
        let bytes = contiguous(&data, "data")?;
        let c = self.conn.clone();
        py.allow_threads(|| c.write_all(&[bytes], t)).map_err(io_err)
    }

    /// One framed message's body; a timeout keeps what arrived for the next call.
    fn recv<'py>(&self, py: Python<'py>, timeout: f64, max_length: usize) -> PyResult<Bound<'py, PyBytes>> {
        let t = seconds(timeout)?;
        let c = self.conn.clone();
        match py.allow_threads(|| c.recv(t, max_length)) {
            Ok(body) => Ok(PyBytes::new(py, &body)),
            Err(RecvError::Oversized(n)) => Err(PyOverflowError::new_err((n, max_length))),
            Err(RecvError::Io(e)) => Err(io_err(e)),
        }
    }

    /// Exactly `nbytes` unframed bytes.
    fn recv_raw<'py>(&self, py: Python<'py>, nbytes: usize, timeout: f64) -> PyResult<Bound<'py, PyBytes>> {
        let t = seconds(timeout)?;
        let c = self.conn.clone();
        let mut buf = vec![0u8; nbytes];
        py.allow_threads(|| c.read_exact(&mut buf, t)).map_err(io_err)?;
        Ok(PyBytes::new(py, &buf))
    }

    /// Registers a writable buffer in place for the peer's READ/WRITE: (id, address, rkey). It stays
    /// exported until `deregister(id)` or `close()`.
    fn register(&self, buffer: PyBuffer<u8>) -> PyResult<(u64, u64, u32)> {
        let (ptr, len) = writable(&buffer, "a registered buffer")?;
        let (id, rkey) = self.conn.register(ptr, len).map_err(io_err)?;
        self.pinned.lock().unwrap().insert(id, buffer);
        Ok((id, ptr as u64, rkey))
    }

    fn deregister(&self, id: u64) {
        self.conn.deregister(id);
        self.pinned.lock().unwrap().remove(&id);
    }

    /// RDMA READ of `len(target)` bytes at the peer's `address` (rkey `rkey`) straight into `target`.
    fn get_into(&self, py: Python<'_>, address: u64, rkey: u32, target: PyBuffer<u8>, timeout: f64) -> PyResult<()> {
        let t = seconds(timeout)?;
        let (ptr, len) = writable(&target, "the target")?;
        let (c, p) = (self.conn.clone(), Ptr(ptr));
        py.allow_threads(move || { let p = p; c.one_sided(true, p.0, len, address, rkey, t) }).map_err(io_err)
    }

    /// RDMA WRITE of `data` to the peer's `address` (rkey `rkey`).
    fn put(&self, py: Python<'_>, address: u64, rkey: u32, data: PyBuffer<u8>, timeout: f64) -> PyResult<()> {
        let t = seconds(timeout)?;
        let bytes = contiguous(&data, "data")?;
        let (c, p, len) = (self.conn.clone(), Ptr(bytes.as_ptr() as *mut u8), bytes.len());
        py.allow_threads(move || { let p = p; c.one_sided(false, p.0, len, address, rkey, t) }).map_err(io_err)
    }

    fn close(&self, py: Python<'_>) {
        let c = self.conn.clone();
        py.allow_threads(|| c.close());
        self.pinned.lock().unwrap().clear();
    }
}

/// A native verbs listener: `accept` hands out `VerbsConnection`s.
#[pyclass(frozen, name = "VerbsListener", module = "pytest_hpcnet_native._native")]
pub struct PyVerbsListener {
    inner: Listener,
    #[pyo3(get)]
    port: u16,
}

#[pymethods]
impl PyVerbsListener {
    #[new]
    fn new(host: &str, port: u16) -> PyResult<Self> {
        let inner = Listener::bind(host, port).map_err(io_err)?;
        let port = inner.port;
        Ok(PyVerbsListener { inner, port })
    }

    fn accept(&self, py: Python<'_>, timeout: f64) -> PyResult<PyVerbsConnection> {
        let t = seconds(timeout)?;
        let conn = py.allow_threads(|| self.inner.accept(t)).map_err(io_err)?;
        Ok(PyVerbsConnection { conn: Arc::new(conn), pinned: Mutex::new(HashMap::new()) })
    }

    fn close(&self) {
        self.inner.close()
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyVerbsConnection>()?;
    m.add_class::<PyVerbsListener>()?;
    Ok(())
}
