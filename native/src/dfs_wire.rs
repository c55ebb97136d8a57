//! The block store's datanode packet path, without sockets or threads: the message format of
//! `pytest_hpcnet/reference/dfs/wire.py` and the receive/verify/write/forward loop over any
//! `Read`/`Write`, so the fuzz targets drive exactly the code the datanode runs.
//!
//! A transport frame is a 4-byte big-endian length and a message; a message is a 4-byte big-endian
//! length of a JSON header, the header, and a binary payload. A `packet` header is
//! `{"op":"packet","seq":S,"offset":O,"len":N,"last":B}` and its payload is one checksum per chunk
//! (4 bytes each) followed by the N data bytes. Acknowledgements are header-only messages
//! `{"op":"ack","seq":S,"status":"ok"}`, or `"status":"error"` with `bad` (the pipeline index at
//! fault) and a one-line `reason`.

use std::io::{self, Read, Write};

use serde_json::{Map, Value};

use crate::checksum::{self, Kind, Mismatch};

pub const BYTES_PER_CHECKSUM: usize = 512;
pub const MAX_HEADER: usize = 64 * 1024;
/// Largest frame a datanode accepts: 16 MiB of data, its checksums and a header (wire.py MAX_MESSAGE).
pub const MAX_MESSAGE: usize = 16 * 1024 * 1024 + (16 * 1024 * 1024 / BYTES_PER_CHECKSUM) * 4 + MAX_HEADER;
/// Largest acknowledgement a datanode reads from its downstream.
pub const MAX_ACK: usize = MAX_HEADER + 4;
/// A frame's buffer starts at most this large, so a peer that announces a long message and sends
/// nothing costs little (as the Python server's `eager_limit`).
const GROW_STEP: usize = 1 << 20;

/// A message's JSON header and its payload.
pub fn split_message(msg: &[u8]) -> Result<(Map<String, Value>, &[u8]), String> {
    if msg.len() < 4 {
        return Err(format!("message of {} bytes is too short for a header", msg.len()));
    }
    let n = u32::from_be_bytes([msg[0], msg[1], msg[2], msg[3]]) as usize;
    if n > MAX_HEADER || n > msg.len() - 4 {
        return Err(format!("header length {n} is impossible in a {}-byte message", msg.len()));
    }
    match serde_json::from_slice::<Value>(&msg[4..4 + n]) {
        Ok(Value::Object(map)) => Ok((map, &msg[4 + n..])),
        Ok(_) => Err("header is not a JSON object".into()),
        Err(e) => Err(format!("header is not JSON: {e}")),
    }
}

/// One data packet of a block's write pipeline.
#[derive(Debug)]
pub struct Packet<'a> {
    pub seq: i64,
    pub offset: Option<u64>,
    pub last: bool,
    pub sums: &'a [u8],
    pub data: &'a [u8],
}

fn int_field(h: &Map<String, Value>, key: &str) -> Result<Option<i64>, String> {
    match h.get(key) {
        None => Ok(None),
        Some(Value::Number(n)) => n.as_i64().map(Some).ok_or_else(|| format!("packet {key} {n} is not an integer")),
        Some(v) => Err(format!("packet {key} is not an integer: {}", short(&v.to_string()))),
    }
}

/// A packet message; anything else (another op, missing or impossible fields) is an error.
pub fn parse_packet(msg: &[u8]) -> Result<Packet<'_>, String> {
    let (h, payload) = split_message(msg)?;
    match h.get("op") {
        Some(Value::String(op)) if op == "packet" => {}
        Some(Value::String(op)) => return Err(format!("expected a packet, got {:?}", short(op))),
        _ => return Err("message header has no 'op'".into()),
    }
    let seq = int_field(&h, "seq")?.ok_or("packet has no seq")?;
    let n = int_field(&h, "len")?.ok_or("packet has no len")?;
    if n < 0 || n as u64 > payload.len() as u64 {
        return Err(format!("packet length {n} is impossible in a {}-byte payload", payload.len()));
    }
    let offset = match int_field(&h, "offset")? {
        Some(o) if o < 0 => return Err(format!("packet offset {o} is negative")),
        o => o.map(|o| o as u64),
    };
    let last = match h.get("last") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(v) => return Err(format!("packet last is not a boolean: {}", short(&v.to_string()))),
    };
    let (sums, data) = payload.split_at(payload.len() - n as usize);
    Ok(Packet { seq, offset, last, sums, data })
}

fn short(s: &str) -> String {
    s.chars().take(40).collect()
}

/// A header-only message as one transport frame.
pub fn encode_frame(header: &Value) -> Vec<u8> {
    let mut out = Vec::new();
    start_frame(&mut out, header, 0);
    out
}

/// Appends the start of a frame to `out`: the length prefix, the header's length and the JSON header,
/// `payload` bytes (checksums, data) to follow.
pub fn start_frame(out: &mut Vec<u8>, header: &Value, payload: usize) {
    let body = serde_json::to_vec(header).expect("a JSON value serializes");
    out.reserve(8 + body.len() + payload);
    out.extend_from_slice(&((4 + body.len() + payload) as u32).to_be_bytes());
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
}

pub fn ok_ack(seq: i64) -> Vec<u8> {
    encode_frame(&serde_json::json!({"op": "ack", "seq": seq, "status": "ok"}))
}

pub fn error_ack(bad: u64, reason: &str) -> Vec<u8> {
    encode_frame(&serde_json::json!({"op": "ack", "seq": -1, "status": "error", "bad": bad,
                                     "reason": reason.replace('\n', " ")}))
}

/// Reads one frame into `buf` (length prefix kept at the front, so it can be forwarded as it is);
/// returns the message's length. A length over `limit` is refused before anything is allocated.
pub fn read_frame<R: Read>(r: &mut R, buf: &mut Vec<u8>, limit: usize) -> Result<usize, FrameError> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len).map_err(FrameError::Io)?;
    let n = u32::from_be_bytes(len) as usize;
    if n > limit {
        return Err(FrameError::TooLarge(n, limit));
    }
    buf.clear();
    buf.extend_from_slice(&len);
    // read_to_end grows the buffer as bytes arrive (no zeroing, nothing allocated for bytes never sent)
    buf.reserve(n.min(GROW_STEP));
    r.by_ref().take(n as u64).read_to_end(buf).map_err(FrameError::Io)?;
    if buf.len() != 4 + n {
        return Err(FrameError::Io(io::Error::new(io::ErrorKind::UnexpectedEof, "frame cut short")));
    }
    Ok(n)
}

#[derive(Debug)]
pub enum FrameError {
    Io(io::Error),
    TooLarge(usize, usize),
}

impl FrameError {
    pub fn describe(&self) -> String {
        match self {
            FrameError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => "the peer closed the connection".into(),
            FrameError::Io(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                "no message within the timeout".into()
            }
            FrameError::Io(e) => e.to_string(),
            FrameError::TooLarge(n, limit) => format!("message of {n} bytes exceeds the limit of {limit} bytes"),
        }
    }
}

/// What the receiver tells the responder, in packet order.
#[derive(Debug, PartialEq, Eq)]
pub enum Ack {
    /// This packet is written here; acknowledge it once the downstream did.
    Ok { seq: i64, last: bool },
    /// Send this error acknowledgement and stop.
    Error { bad: u64, reason: String },
    /// Stop without a word (the upstream is gone, or spoke garbage).
    Stop,
}

/// How a block's packet stream ended at this datanode.
#[derive(Debug, PartialEq, Eq)]
pub enum End {
    /// The last packet is written (its `Ack::Ok` is not yet queued: the replica is made final first).
    Last { seq: i64 },
    /// A chunk did not verify; an error ack naming this node is queued; the replica is to be dropped.
    Checksum(String),
    /// The next datanode is gone; an error ack naming it is queued.
    Downstream(String),
    /// The upstream broke the protocol, went quiet or away; `Ack::Stop` is queued.
    Upstream(String),
    /// Writing to the local disk failed; an error ack naming this node is queued.
    Disk(String),
}

/// A pipeline stage's settings.
pub struct Stage<'a> {
    pub kind: Kind,
    pub bpc: usize,
    /// This node's index in the pipeline (error acks name `index` or `index + 1`).
    pub index: u64,
    /// Bytes of the replica before the first packet (a recovery or an append resumes there).
    pub offset: u64,
    /// "datanode NAME block ID", the start of every message.
    pub label: &'a str,
}

/// Receives packets from `up` until the last one or an error: each is forwarded to `down` first (the
/// frame as it came), verified chunk by chunk, and written (`data`, `meta`); `acks` hears of each.
/// Returns how the stream ended and the replica's length.
pub fn receive_packets<R: Read, D: Write, W: Write, M: Write>(
    stage: &Stage, up: &mut R, mut down: Option<&mut D>, data: &mut W, meta: &mut M,
    acks: &mut dyn FnMut(Ack), buf: &mut Vec<u8>,
) -> (End, u64) {
    let mut length = stage.offset;
    loop {
        let n = match read_frame(up, buf, MAX_MESSAGE) {
            Ok(n) => n,
            Err(e) => {
                acks(Ack::Stop);
                return (End::Upstream(format!("{}: {}", stage.label, e.describe())), length);
            }
        };
        let packet = match parse_packet(&buf[4..4 + n]) {
            Ok(p) => p,
            Err(e) => {
                acks(Ack::Stop);
                return (End::Upstream(format!("{}: {e}", stage.label)), length);
            }
        };
        if let Some(o) = packet.offset {
            if o != length {
                acks(Ack::Stop);
                return (End::Upstream(format!("{}: packet {} starts at byte {o}, the replica has {length}",
                                              stage.label, packet.seq)), length);
            }
        }
        if let Some(d) = down.as_deref_mut() {
            if let Err(e) = d.write_all(&buf[..4 + n]) {
                let reason = format!("{} lost the next datanode: {e}", stage.label);
                acks(Ack::Error { bad: stage.index + 1, reason: reason.clone() });
                return (End::Downstream(reason), length);
            }
        }
        if let Err(m) = checksum::verify(stage.kind, packet.data, packet.sums, stage.bpc) {
            let reason = match m {
                Mismatch::Count { have, want } => format!(
                    "{}: {have} checksum bytes for {} data bytes (expected {want})", stage.label, packet.data.len()),
                Mismatch::Chunk(i) => format!(
                    "{}: checksum mismatch in the chunk at byte {} ({} per {} bytes)", stage.label,
                    length + (i * stage.bpc) as u64, stage.kind.label(), stage.bpc),
            };
            acks(Ack::Error { bad: stage.index, reason: reason.clone() });
            return (End::Checksum(reason), length);
        }
        if let Err(e) = data.write_all(packet.data).and_then(|_| meta.write_all(packet.sums)) {
            let reason = format!("{}: cannot write the replica: {e}", stage.label);
            acks(Ack::Error { bad: stage.index, reason: reason.clone() });
            return (End::Disk(reason), length);
        }
        length += packet.data.len() as u64;
        if packet.last {
            return (End::Last { seq: packet.seq }, length);
        }
        acks(Ack::Ok { seq: packet.seq, last: false });
    }
}

/// A downstream acknowledgement: Ok(()) when it acknowledges `seq`, or the frame to pass upstream
/// (its own error ack, or one naming the next node) when it does not.
pub fn check_ack(msg: &[u8], seq: i64, next: u64, label: &str) -> Result<(), Vec<u8>> {
    let h = match split_message(msg) {
        Ok((h, _)) => h,
        Err(e) => return Err(error_ack(next, &format!("{label}: bad ack from the next datanode: {e}"))),
    };
    if h.get("status").and_then(Value::as_str) != Some("ok") {
        let bad = h.get("bad").and_then(Value::as_u64).unwrap_or(next);
        let reason = h.get("reason").and_then(Value::as_str).unwrap_or("error ack").to_string();
        return Err(error_ack(bad, &reason));
    }
    match h.get("seq").and_then(Value::as_i64) {
        Some(s) if s == seq => Ok(()),
        other => Err(error_ack(next, &format!("{label}: ack for packet {other:?} while expecting {seq}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(seq: i64, offset: u64, data: &[u8], last: bool, kind: Kind) -> Vec<u8> {
        let header = serde_json::to_vec(&serde_json::json!(
            {"op": "packet", "seq": seq, "offset": offset, "len": data.len(), "last": last})).unwrap();
        let mut sums = Vec::new();
        checksum::sums_into(kind, data, BYTES_PER_CHECKSUM, &mut sums);
        let mut msg = (header.len() as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&header);
        msg.extend_from_slice(&sums);
        msg.extend_from_slice(data);
        let mut frame = (msg.len() as u32).to_be_bytes().to_vec();
        frame.extend_from_slice(&msg);
        frame
    }

    fn run(stream: &[u8], forward: bool) -> (End, u64, Vec<Ack>, Vec<u8>, Vec<u8>, Vec<u8>) {
        let stage = Stage { kind: Kind::Crc32c, bpc: 512, index: 1, offset: 0, label: "datanode n1 block 7" };
        let (mut down, mut data, mut meta, mut acks) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        let mut up = stream;
        let (end, len) = receive_packets(&stage, &mut up, if forward { Some(&mut down) } else { None },
                                         &mut data, &mut meta, &mut |a| acks.push(a), &mut Vec::new());
        (end, len, acks, down, data, meta)
    }

    #[test]
    fn packets_are_forwarded_verified_and_written() {
        let a: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut stream = packet(0, 0, &a, false, Kind::Crc32c);
        stream.extend(packet(1, 1000, b"tail", true, Kind::Crc32c));
        let (end, len, acks, down, data, meta) = run(&stream, true);
        assert_eq!(end, End::Last { seq: 1 });
        assert_eq!((len, acks), (1004, vec![Ack::Ok { seq: 0, last: false }]));
        assert_eq!(down, stream);
        assert_eq!(data, [&a[..], b"tail"].concat());
        assert_eq!(meta.len(), 12);
    }

    #[test]
    fn a_corrupt_chunk_is_named_in_one_line() {
        let a = vec![5u8; 2048];
        let mut stream = packet(0, 0, &a, true, Kind::Crc32c);
        let at = stream.len() - 700;       // inside the third chunk (bytes 1024..1536)
        stream[at] ^= 0x40;
        let (end, _, acks, _, data, _) = run(&stream, false);
        let msg = "datanode n1 block 7: checksum mismatch in the chunk at byte 1024 (CRC32C per 512 bytes)";
        assert_eq!(end, End::Checksum(msg.into()));
        assert_eq!(acks, vec![Ack::Error { bad: 1, reason: msg.into() }]);
        assert!(data.is_empty());
    }

    #[test]
    fn crc32_sums_do_not_pass_as_crc32c() {
        let (end, ..) = run(&packet(0, 0, b"hello", true, Kind::Crc32), false);
        assert!(matches!(end, End::Checksum(_)));
    }

    #[test]
    fn hostile_frames_stop_the_stream() {
        for bad in [&b"\xff\xff\xff\xff"[..], b"\x00\x00\x00\x02{}", b"\x00\x00\x00\x06\x00\x00\x00\x02[]",
                    b"\x00\x00\x00\x10\x00\x00\x00\x0c{\"op\":\"x\"}"] {
            let (end, len, acks, ..) = run(bad, false);
            assert!(matches!(end, End::Upstream(_)), "{end:?}");
            assert_eq!((len, acks), (0, vec![Ack::Stop]));
        }
        let (end, ..) = run(&packet(0, 512, b"x", true, Kind::Crc32c), false);
        assert!(matches!(end, End::Upstream(ref m) if m.contains("starts at byte 512")), "{end:?}");
    }

    #[test]
    fn acks_are_checked() {
        let ok = ok_ack(3);
        assert_eq!(check_ack(&ok[4..], 3, 2, "x"), Ok(()));
        assert!(check_ack(&ok[4..], 4, 2, "x").is_err());
        let err = error_ack(2, "boom");
        let relayed = check_ack(&err[4..], 3, 1, "x").unwrap_err();
        assert_eq!(relayed, err);
    }
}

/// A packet as one transport frame (what a client or a resending writer sends), built in `frame`
/// (cleared first; a writer hands back the buffer of a packet already acknowledged, so a steady write
/// allocates no new pages for the kernel to zero and fault in): the frame, and where its checksums
/// and data start inside it.
pub fn packet_frame(mut frame: Vec<u8>, kind: Kind, bpc: usize, seq: i64, offset: u64, data: &[u8],
                    last: bool) -> (Vec<u8>, usize, usize) {
    let nsums = 4 * checksum::chunks(data.len(), bpc);
    frame.clear();
    start_frame(&mut frame, &serde_json::json!(
        {"op": "packet", "seq": seq, "offset": offset, "len": data.len(), "last": last}), nsums + data.len());
    let sums_at = frame.len();
    checksum::sums_into(kind, data, bpc, &mut frame);
    let data_at = frame.len();
    frame.extend_from_slice(data);
    (frame, sums_at, data_at)
}

/// What an acknowledgement says to the writer at the head of a pipeline: Ok(seq) or Err((bad, reason)).
pub fn read_ack(msg: &[u8]) -> Result<i64, (u64, String)> {
    let (h, _) = split_message(msg).map_err(|e| (0, format!("bad acknowledgement: {e}")))?;
    if h.get("status").and_then(Value::as_str) != Some("ok") {
        let bad = h.get("bad").and_then(Value::as_u64).unwrap_or(0);
        let reason = h.get("reason").and_then(Value::as_str).unwrap_or("error ack").to_string();
        return Err((bad, reason));
    }
    h.get("seq").and_then(Value::as_i64).ok_or_else(|| (0, "acknowledgement without a seq".to_string()))
}
