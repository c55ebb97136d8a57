//! `pytest_hpcnet_native._native`: the compiled data path of pytest-hpcnet's reference
//! implementation (issue 16). Python reaches it through `pytest_hpcnet/reference/native.py`.
//!
//! Every blocking call releases the GIL, and the timing drivers (`pingpong`, `PingPong.samples`,
//! `Client.echo_samples`) return per-call samples so no interpreter sits inside a timed call.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};

mod blocking;
mod buffers;
mod checksum;
mod dfs;
mod dfs_floor;
mod dfs_reader;
mod dfs_sender;
mod dfs_wire;
mod dfs_writer;
mod fetch;
mod link;
mod client;
mod floor;
mod map_sort;
mod merge;
mod pybuf;
mod sendfile;
mod server;
mod shm;
mod trace;
mod verbs;
mod verbs_py;
mod wire;

use buffers::{BufferStats, Design};
use client::{CallError, Client, Dial};
use server::{Config, Listen, Reply, Server, Shared};

create_exception!(_native, NativeError, PyException,
                  "A call failed: args are (kind, class_name, message, error_detail); kind is one of \
                   timeout, lost, error, fatal.");

fn call_err(e: CallError) -> PyErr {
    match e {
        CallError::Timeout(m) => NativeError::new_err(("timeout", "", m, None::<u64>)),
        CallError::Lost(m) => NativeError::new_err(("lost", "", m, None::<u64>)),
        CallError::Remote { class_name, message, detail } => {
            NativeError::new_err(("error", class_name, message, detail))
        }
        CallError::Fatal { class_name, message, detail } => {
            NativeError::new_err(("fatal", class_name, message, detail))
        }
    }
}

fn resolve(host: &str, port: u16) -> PyResult<SocketAddr> {
    (host.trim_matches(|c| c == '[' || c == ']'), port)
        .to_socket_addrs()
        .map_err(|e| PyOSError::new_err(format!("{host}:{port}: {e}")))?
        .next()
        .ok_or_else(|| PyOSError::new_err(format!("{host}:{port}: no address")))
}

fn design(name: &str) -> PyResult<Design> {
    Design::parse(name).ok_or_else(|| PyValueError::new_err(format!(
        "unknown buffer design {name:?}; choose pooled or naive")))
}

fn stats_dict<'py>(py: Python<'py>, stats: &BufferStats) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (k, v) in stats.snapshot() {
        d.set_item(k, v)?;
    }
    Ok(d)
}

fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("bad duration {s}")))
}

/// Why native verbs cannot run here (built without rdma-core's headers, or libibverbs/librdmacm do not
/// load), or None. Loads the libraries on first use.
#[pyfunction]
fn verbs_unavailable() -> Option<String> {
    verbs::unavailable()
}

/// The round-trip points kept while `HPCNET_TRACE` is set (native/src/trace.rs), as (point name,
/// CLOCK_MONOTONIC nanoseconds) in the order taken; taking them empties the store.
#[pyfunction]
fn trace_take() -> Vec<(&'static str, u64)> {
    trace::take().into_iter().map(|(p, t)| (p.name(), t)).collect()
}

/// A Hadoop IPC v9 client connection over tcp.
#[pyclass(frozen, name = "Client", module = "pytest_hpcnet_native._native")]
struct PyClient {
    inner: Arc<Client>,
}

#[pymethods]
impl PyClient {
    #[new]
    #[pyo3(signature = (host, port, client_id, user, protocol, connect_timeout=10.0,
                        max_data_length=wire::MAX_DATA_LENGTH, buffers="pooled", transport="tcp"))]
    #[allow(clippy::too_many_arguments)]
    fn new(py: Python<'_>, host: &str, port: u16, client_id: &[u8], user: &str, protocol: &str,
           connect_timeout: f64, max_data_length: usize, buffers: &str, transport: &str) -> PyResult<Self> {
        let t = seconds(connect_timeout)?;
        let cid = client_id.to_vec();
        let d = design(buffers)?;
        let dial = match transport {
            "tcp" => Dial::Tcp(resolve(host, port)?),
            "shm" => Dial::Shm(host, port),
            "verbs" => Dial::Verbs(host, port),
            other => return Err(PyValueError::new_err(format!("the native core speaks tcp, shm and verbs, not {other:?}"))),
        };
        let inner = py.allow_threads(|| Client::connect(dial, cid, user, protocol, t, max_data_length, d))
            .map_err(call_err)?;
        Ok(PyClient { inner: Arc::new(inner) })
    }

    /// The serialized response of `method` called with a serialized request.
    fn call<'py>(&self, py: Python<'py>, method: &str, request: &[u8], timeout: f64)
                 -> PyResult<Bound<'py, PyBytes>> {
        let t = seconds(timeout)?;
        let c = self.inner.clone();
        let body = py.allow_threads(|| c.call(method, request, t)).map_err(call_err)?;
        Ok(PyBytes::new(py, &body))
    }

    /// The built-in echo, request and response encoded here.
    fn echo<'py>(&self, py: Python<'py>, payload: &[u8], timeout: f64) -> PyResult<Bound<'py, PyBytes>> {
        let t = seconds(timeout)?;
        let c = self.inner.clone();
        let body = py.allow_threads(|| c.echo(payload, t)).map_err(call_err)?;
        Ok(PyBytes::new(py, &body))
    }

    /// Round-trip times (microseconds) of `iterations` echo calls of `size` bytes, after `warmup`.
    #[pyo3(signature = (size, iterations, warmup=0, timeout=30.0))]
    fn echo_samples(&self, py: Python<'_>, size: usize, iterations: usize, warmup: usize, timeout: f64)
                    -> PyResult<Vec<f64>> {
        let t = seconds(timeout)?;
        let c = self.inner.clone();
        py.allow_threads(|| c.echo_samples(size, iterations, warmup, t)).map_err(call_err)
    }

    /// Echo calls of `size` bytes back to back for `seconds`: how many completed inside that time.
    #[pyo3(signature = (size, seconds, timeout=30.0))]
    fn echo_for(&self, py: Python<'_>, size: usize, seconds: f64, timeout: f64) -> PyResult<u64> {
        let t = self::seconds(timeout)?;
        let c = self.inner.clone();
        py.allow_threads(|| c.echo_for(size, seconds, t)).map_err(call_err)
    }

    fn send_ping(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.inner.clone();
        py.allow_threads(|| c.send_ping()).map_err(call_err)
    }

    fn close(&self, py: Python<'_>) {
        let c = self.inner.clone();
        py.allow_threads(|| c.close())
    }

    /// The buffer counters of this connection (names as pytest_hpcnet.reference.buffers.BufferStats).
    fn buffer_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.inner.stats)
    }
}

/// (conn, call_id, retry_count, method, request bytes)
type PyCallTuple<'py> = (u64, i32, i32, String, Bound<'py, PyBytes>);

/// The event-driven Hadoop IPC v9 server over tcp; `echo` and `ping` are answered natively, every
/// other method is queued for `next_call` (Python handler threads).
#[pyclass(frozen, name = "Server", module = "pytest_hpcnet_native._native")]
struct PyServer {
    server: Mutex<Option<Server>>,
    shared: Arc<Shared>,
    #[pyo3(get)]
    address: (String, u16),
}

#[pymethods]
impl PyServer {
    #[new]
    #[pyo3(signature = (host, port, protocol, max_data_length=wire::MAX_DATA_LENGTH,
                        max_connections=1024, max_pending=4096, handshake_timeout=10.0,
                        idle_timeout=20.0, write_timeout=30.0, queue_size=400, buffers="pooled",
                        transport="tcp", idle_threshold=512))]
    #[allow(clippy::too_many_arguments)]
    fn new(host: &str, port: u16, protocol: String, max_data_length: usize,
           max_connections: usize, max_pending: usize, handshake_timeout: f64, idle_timeout: f64,
           write_timeout: f64, queue_size: usize, buffers: &str, transport: &str,
           idle_threshold: usize) -> PyResult<Self> {
        let cfg = Config {
            protocol,
            max_data_length,
            max_connections,
            max_pending: max_pending.max(1),
            handshake_timeout: seconds(handshake_timeout)?,
            idle_timeout: seconds(idle_timeout)?,
            idle_threshold,
            write_timeout: seconds(write_timeout)?,
            queue_size,
            design: design(buffers)?,
        };
        let listen = match transport {
            "tcp" => Listen::Tcp(resolve(host, port)?),
            "shm" => Listen::Shm(host.to_string(), port),
            "verbs" => Listen::Verbs(host.to_string(), port),
            other => return Err(PyValueError::new_err(format!("the native core speaks tcp, shm and verbs, not {other:?}"))),
        };
        let server = Server::start(listen, cfg)
            .map_err(|e| PyOSError::new_err(format!("cannot listen on {transport} {host}:{port}: {e}")))?;
        let address = server.address.clone();
        Ok(PyServer { shared: server.shared.clone(), server: Mutex::new(Some(server)), address })
    }

    /// The next call for a Python handler: (conn, call_id, retry_count, method, request bytes), or None.
    fn next_call<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Option<PyCallTuple<'py>>> {
        let t = seconds(timeout)?;
        let shared = self.shared.clone();
        Ok(py.allow_threads(|| shared.next_call(t))
            .map(|c| (c.conn, c.call_id, c.retry_count, c.method, PyBytes::new(py, &c.body))))
    }

    fn respond(&self, conn: u64, call_id: i32, retry_count: i32, body: &[u8]) {
        self.shared.reply(conn, Reply::Success { call_id, retry_count, body: body.to_vec() });
    }

    fn respond_error(&self, conn: u64, call_id: i32, retry_count: i32, class_name: String, message: String,
                     code: u64) {
        self.shared.reply(conn, Reply::Error { call_id, retry_count, class_name, message, code });
    }

    fn respond_fatal(&self, conn: u64, call_id: i32, message: String, code: u64) {
        self.shared.reply(conn, Reply::Fatal { call_id, message, code });
    }

    #[getter]
    fn connections(&self) -> usize {
        self.shared.open.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn counters<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.shared.counters;
        let d = PyDict::new(py);
        for (k, v) in [("connections", &c.connections), ("calls", &c.calls), ("errors", &c.errors),
                       ("fatals", &c.fatals), ("pings", &c.pings), ("native_calls", &c.native_calls),
                       ("python_calls", &c.python_calls)] {
            d.set_item(k, v.load(Relaxed))?;
        }
        Ok(d)
    }

    /// The buffer counters of every connection together.
    fn buffer_stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        stats_dict(py, &self.shared.buffers)
    }

    fn closed_reasons<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (k, v) in self.shared.closed_reasons.lock().unwrap().iter() {
            d.set_item(k, *v)?;
        }
        Ok(d)
    }

    fn stop(&self, py: Python<'_>) {
        let taken = self.server.lock().unwrap().take();
        if let Some(mut s) = taken {
            py.allow_threads(move || s.stop());
        }
    }
}

/// The raw-socket ping-pong echo server (one thread per connection).
#[pyclass(frozen, name = "FloorServer", module = "pytest_hpcnet_native._native")]
struct PyFloorServer {
    inner: floor::FloorServer,
    #[pyo3(get)]
    address: (String, u16),
}

#[pymethods]
impl PyFloorServer {
    #[new]
    fn new(host: &str, port: u16) -> PyResult<Self> {
        let inner = floor::FloorServer::start(resolve(host, port)?)
            .map_err(|e| PyOSError::new_err(format!("cannot listen on {host}:{port}: {e}")))?;
        let address = (inner.address.ip().to_string(), inner.address.port());
        Ok(PyFloorServer { inner, address })
    }

    fn stop(&self) {
        self.inner.stop()
    }
}

/// A floor connection that times `size`-byte round trips on demand.
#[pyclass(name = "PingPong", module = "pytest_hpcnet_native._native")]
struct PyPingPong {
    inner: floor::PingPong,
}

#[pymethods]
impl PyPingPong {
    #[new]
    #[pyo3(signature = (host, port, size, timeout=30.0))]
    fn new(py: Python<'_>, host: &str, port: u16, size: usize, timeout: f64) -> PyResult<Self> {
        let addr = resolve(host, port)?;
        let t = seconds(timeout)?;
        let inner = py.allow_threads(|| floor::PingPong::connect(addr, size, t))?;
        Ok(PyPingPong { inner })
    }

    #[pyo3(signature = (iterations, warmup=0))]
    fn samples(&mut self, py: Python<'_>, iterations: usize, warmup: usize) -> PyResult<Vec<f64>> {
        let inner = &mut self.inner;
        Ok(py.allow_threads(|| inner.samples(iterations, warmup))?)
    }
}

/// Round-trip times in microseconds of `iterations` raw ping-pongs of `size` bytes.
#[pyfunction]
#[pyo3(signature = (host, port, size, iterations, warmup=0, timeout=30.0))]
fn pingpong(py: Python<'_>, host: &str, port: u16, size: usize, iterations: usize, warmup: usize,
            timeout: f64) -> PyResult<Vec<f64>> {
    let addr = resolve(host, port)?;
    let t = seconds(timeout)?;
    Ok(py.allow_threads(|| floor::pingpong(addr, size, iterations, warmup, t))?)
}

/// The verbs ping-pong echo server (`verbs::floor`): a thread per connection, on an RDMA address.
#[pyclass(name = "VerbsFloorServer", module = "pytest_hpcnet_native._native")]
struct PyVerbsFloorServer {
    inner: verbs::floor::VerbsFloorServer,
    #[pyo3(get)]
    address: (String, u16),
}

#[pymethods]
impl PyVerbsFloorServer {
    #[new]
    fn new(host: &str, port: u16) -> PyResult<Self> {
        let inner = verbs::floor::VerbsFloorServer::start(host, port)
            .map_err(|e| PyOSError::new_err(format!("cannot listen for RDMA on {host}:{port}: {e}")))?;
        let address = (host.to_string(), inner.port);
        Ok(PyVerbsFloorServer { inner, address })
    }

    fn stop(&mut self, py: Python<'_>) {
        let inner = &mut self.inner;
        py.allow_threads(|| inner.stop())
    }
}

/// Round-trip times in microseconds of `iterations` verbs ping-pongs of `size` bytes (no RPC).
#[pyfunction]
#[pyo3(signature = (host, port, size, iterations, warmup=0, timeout=30.0))]
fn verbs_pingpong(py: Python<'_>, host: &str, port: u16, size: usize, iterations: usize, warmup: usize,
                  timeout: f64) -> PyResult<Vec<f64>> {
    let t = seconds(timeout)?;
    Ok(py.allow_threads(|| verbs::floor::pingpong(host, port, size, iterations, warmup, t))?)
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("NativeError", m.py().get_type::<NativeError>())?;
    m.add_function(wrap_pyfunction!(verbs_unavailable, m)?)?;
    m.add_function(wrap_pyfunction!(trace_take, m)?)?;
    m.add("VERBS_BUILT", verbs::ffi::built())?;
    m.add_class::<PyClient>()?;
    m.add_class::<PyServer>()?;
    m.add_class::<PyFloorServer>()?;
    m.add_class::<PyPingPong>()?;
    m.add_function(wrap_pyfunction!(pingpong, m)?)?;
    m.add_class::<PyVerbsFloorServer>()?;
    m.add_function(wrap_pyfunction!(verbs_pingpong, m)?)?;
    dfs::register(m)?;
    dfs_reader::register(m)?;
    dfs_sender::register(m)?;
    m.add_class::<dfs_writer::PyPacketWriter>()?;
    sendfile::register(m)?;
    merge::register(m)?;
    map_sort::register(m)?;
    fetch::register(m)?;
    verbs_py::register(m)?;
    Ok(())
}
