//! The raw-socket ping-pong floor: length-prefixed messages (4-byte big-endian length + payload)
//! echoed back whole, the same wire as `pytest_hpcnet.workloads.socket_floor`. What a round trip
//! costs with no RPC at all; the RPC's figures are read against it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub const MAX_SIZE: usize = 64 << 20;

pub struct FloorServer {
    pub address: SocketAddr,
    stopping: Arc<AtomicBool>,
}

impl FloorServer {
    /// Listens on `addr` and echoes on a thread per connection (a ping-pong needs one).
    pub fn start(addr: SocketAddr) -> io::Result<FloorServer> {
        let listener = TcpListener::bind(addr)?;
        let address = listener.local_addr()?;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        std::thread::Builder::new().name("hpcnet-floor".into()).spawn(move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if let Ok(conn) = conn {
                    let _ = std::thread::Builder::new().name("hpcnet-floor-conn".into())
                        .spawn(move || echo(conn));
                }
            }
        })?;
        Ok(FloorServer { address, stopping })
    }

    pub fn stop(&self) {
        if !self.stopping.swap(true, Ordering::SeqCst) {
            let _ = TcpStream::connect_timeout(&self.address, Duration::from_secs(1)); // wakes accept
        }
    }
}

fn echo(conn: TcpStream) {
    let _ = conn.set_nodelay(true);
    echo_frames(|buf| (&conn).read_exact(buf), |buf| (&conn).write_all(buf));
}

/// The floor server's side of the wire, over any pair of blocking calls: a frame read whole, then
/// echoed whole, until either fails or a frame announces more than `MAX_SIZE`.
pub fn echo_frames(mut read_exact: impl FnMut(&mut [u8]) -> io::Result<()>,
                   mut write_all: impl FnMut(&[u8]) -> io::Result<()>) {
    let mut buf = vec![0u8; 4 + 65536];
    loop {
        if read_exact(&mut buf[..4]).is_err() {
            return;
        }
        let size = u32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
        if size > MAX_SIZE {
            return; // garbage or a hostile peer: drop the connection
        }
        if buf.len() < 4 + size {
            buf.resize(4 + size, 0);
        }
        if read_exact(&mut buf[4..4 + size]).is_err() || write_all(&buf[..4 + size]).is_err() {
            return;
        }
    }
}

/// Round-trip times in microseconds of `iterations` ping-pongs of `size` bytes (after `warmup`).
pub fn pingpong(addr: SocketAddr, size: usize, iterations: usize, warmup: usize, timeout: Duration)
                -> io::Result<Vec<f64>> {
    let s = TcpStream::connect_timeout(&addr, timeout)?;
    s.set_nodelay(true)?;
    s.set_read_timeout(Some(timeout))?;
    s.set_write_timeout(Some(timeout))?;
    PingPong { stream: s, message: message(size), reply: vec![0; 4 + size] }.samples(iterations, warmup)
}

fn message(size: usize) -> Vec<u8> {
    let mut m = (size as u32).to_be_bytes().to_vec();
    m.resize(4 + size, 0);
    m
}

/// A connection to a floor server that times round trips on demand (interleaved with other paths).
pub struct PingPong {
    stream: TcpStream,
    message: Vec<u8>,
    reply: Vec<u8>,
}

impl PingPong {
    pub fn connect(addr: SocketAddr, size: usize, timeout: Duration) -> io::Result<PingPong> {
        let s = TcpStream::connect_timeout(&addr, timeout)?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(timeout))?;
        s.set_write_timeout(Some(timeout))?;
        Ok(PingPong { stream: s, message: message(size), reply: vec![0; 4 + size] })
    }

    pub fn samples(&mut self, iterations: usize, warmup: usize) -> io::Result<Vec<f64>> {
        let mut out = Vec::with_capacity(iterations);
        for i in 0..warmup + iterations {
            let t0 = Instant::now();
            self.stream.write_all(&self.message)?;
            self.stream.read_exact(&mut self.reply)?;
            let dt = t0.elapsed();
            if i >= warmup {
                out.push(dt.as_secs_f64() * 1e6);
            }
        }
        Ok(out)
    }
}
