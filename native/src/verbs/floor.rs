//! The verbs ping-pong floor: the raw-socket floor's wire (a 4-byte big-endian length, then the
//! payload, echoed back whole) over one `VerbsEnd` per connection, with no RPC on top. Between
//! perftest's `ib_send_lat` (the device alone) and the native RPC echo (the whole stack) it says
//! what the endpoint itself costs (eager sends, credits, its waits) and what the RPC layer adds.
//! The server's connection threads busy-poll as long as the RPC server's loop does
//! (`server_spin`); the client waits as the RPC client does.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::cm::{self, Event, VerbsListener};
use super::VerbsEnd;
use crate::floor::MAX_SIZE;
use crate::trace::{self, Point}; // the raw-socket floor's wire and limit

const LOOK: Duration = Duration::from_millis(100); // how often a waiting thread looks at `stopping`

pub struct VerbsFloorServer {
    pub port: u16,
    stopping: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl VerbsFloorServer {
    pub fn start(host: &str, port: u16) -> io::Result<VerbsFloorServer> {
        let listener = VerbsListener::bind(host, port)?;
        let port = listener.port;
        let stopping = Arc::new(AtomicBool::new(false));
        let stop = stopping.clone();
        let thread = std::thread::Builder::new().name("hpcnet-verbs-floor".into())
            .spawn(move || serve(listener, &stop))?;
        Ok(VerbsFloorServer { port, stopping, thread: Some(thread) })
    }

    pub fn stop(&mut self) {
        self.stopping.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for VerbsFloorServer {
    fn drop(&mut self) {
        self.stop();
    }
}

fn serve(listener: VerbsListener, stop: &Arc<AtomicBool>) {
    let mut conns: Vec<(Arc<VerbsEnd>, JoinHandle<()>)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let mut fds = [libc::pollfd { fd: listener.fd, events: libc::POLLIN, revents: 0 }];
        // SAFETY: one valid pollfd
        unsafe { libc::poll(fds.as_mut_ptr(), 1, LOOK.as_millis() as i32) };
        while let Some(event) = listener.next() {
            match event {
                Event::Connected(end) => {
                    let end = Arc::new(*end);
                    let (e, s) = (end.clone(), stop.clone());
                    if let Ok(t) = std::thread::Builder::new().name("hpcnet-verbs-floor-conn".into())
                        .spawn(move || echo(&e, &s)) {
                        conns.push((end, t));
                    }
                }
                Event::Failed(why) => eprintln!("hpcnet verbs floor: {why}"),
                Event::Ended(id, why) => {
                    if let Some((end, _)) = conns.iter().find(|(e, _)| e.cm_id == id) {
                        end.fail(why);
                    }
                }
            }
        }
    }
    for (end, t) in conns {
        end.close();
        let _ = t.join();
    }
    // the listener goes last: its children's ends are closed
}

fn echo(end: &VerbsEnd, stop: &AtomicBool) {
    let spin = super::server_spin();
    crate::floor::echo_frames(|buf| read_until(end, buf, spin, Some(stop), None),
                              |buf| write_all(end, buf, spin, Some(stop), Duration::from_secs(60)));
    end.close();
}

fn stopped(stop: Option<&AtomicBool>) -> bool {
    stop.is_some_and(|s| s.load(Ordering::Relaxed))
}

/// `buf` filled from the stream, waiting until `deadline` (None: until `stop`).
fn read_until(end: &VerbsEnd, buf: &mut [u8], spin: Duration, stop: Option<&AtomicBool>, deadline: Option<Instant>)
              -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match end.read(&mut buf[got..]) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                let now = Instant::now();
                if deadline.is_some_and(|d| now >= d) || stopped(stop) {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, format!(
                        "no reply from {} ({got} of {} bytes)", end.peer, buf.len())));
                }
                let left = deadline.map_or(LOOK, |d| (d - now).min(LOOK));
                end.wait_spinning(false, left, spin);
            }
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The RPC client's write loop (`client::write_pair`), its waits spinning `spin` and given up on `stop`.
fn write_all(end: &VerbsEnd, buf: &[u8], spin: Duration, stop: Option<&AtomicBool>, timeout: Duration)
             -> io::Result<()> {
    crate::client::write_pair(buf, &[], timeout, |bufs| end.write_vectored(bufs), |left| {
        end.wait_spinning(true, left.min(LOOK), spin);
        !stopped(stop) // write_pair itself gives up at its deadline
    }, "the floor's peer returned no send credits")
}

/// Round-trip times in microseconds of `iterations` ping-pongs of `size` bytes (after `warmup`)
/// with a floor server at `host:port`, over one connection, timed here.
pub fn pingpong(host: &str, port: u16, size: usize, iterations: usize, warmup: usize, timeout: Duration)
                -> io::Result<Vec<f64>> {
    if size > MAX_SIZE {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("{size} bytes is above the floor's {MAX_SIZE}")));
    }
    let end = cm::connect(host, port, timeout)?;
    let mut message = (size as u32).to_be_bytes().to_vec();
    message.resize(4 + size, 0);
    let mut reply = vec![0u8; 4 + size];
    let spin = super::spin();
    let mut out = Vec::with_capacity(iterations);
    let result = (|| {
        for i in 0..warmup + iterations {
            trace::mark(Point::Start);
            let t0 = Instant::now();
            write_all(&end, &message, spin, None, timeout)?;
            read_until(&end, &mut reply, spin, None, Some(t0 + timeout))?;
            let dt = t0.elapsed();
            trace::mark(Point::End);
            if reply[..4] != message[..4] {
                return Err(io::Error::new(io::ErrorKind::InvalidData, "the floor server echoed another length"));
            }
            if i >= warmup {
                out.push(dt.as_secs_f64() * 1e6);
            }
        }
        Ok(())
    })();
    end.close();
    result.map(|_| out)
}
