//! Hadoop IPC v9 wire format (design.md section 8): the preamble, varints, and the few protobuf
//! messages the RPC needs, encoded and decoded by hand. Every decoder works on a borrowed slice and
//! fails with a reason instead of panicking: the bytes come from an untrusted peer.

pub const MAGIC: &[u8; 4] = b"hrpc";
pub const IPC_VERSION: u8 = 9;
pub const AUTH_NONE: u8 = 0;
pub const PREAMBLE: [u8; 7] = *b"hrpc\x09\x00\x00";

pub const CONNECTION_CONTEXT_CALL_ID: i32 = -3;
pub const PING_CALL_ID: i32 = -4;
pub const INVALID_CALL_ID: i32 = -1;
pub const RPC_PROTOCOL_BUFFER: u64 = 2;
pub const RPC_CLOSE_CONNECTION: u64 = 2;
pub const MAX_DATA_LENGTH: usize = 128 * 1024 * 1024;
/// The server's bound on the connection context packet (below ipc.maximum.data.length).
pub const MAX_CONTEXT_LENGTH: usize = 64 * 1024;

pub const SUCCESS: u64 = 0;
pub const ERROR: u64 = 1;
pub const FATAL: u64 = 2;

// RpcErrorCodeProto
pub const ERROR_NO_SUCH_PROTOCOL: u64 = 3;
pub const ERROR_RPC_SERVER: u64 = 4;
pub const FATAL_UNSUPPORTED_SERIALIZATION: u64 = 11;
pub const FATAL_INVALID_RPC_HEADER: u64 = 12;
pub const FATAL_DESERIALIZING_REQUEST: u64 = 13;
pub const FATAL_VERSION_MISMATCH: u64 = 14;
pub const FATAL_UNAUTHORIZED: u64 = 15;

pub type WireResult<T> = Result<T, String>;

pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

pub fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

pub fn zigzag32(n: i32) -> u64 {
    (((n as u32) << 1) ^ ((n >> 31) as u32)) as u64
}

pub fn unzigzag32(z: u64) -> i32 {
    let z = z as u32;
    ((z >> 1) as i32) ^ -((z & 1) as i32)
}

fn put_tag(out: &mut Vec<u8>, field: u32, wire_type: u8) {
    put_varint(out, ((field as u64) << 3) | wire_type as u64);
}

pub fn put_bytes_field(out: &mut Vec<u8>, field: u32, data: &[u8]) {
    put_tag(out, field, 2);
    put_varint(out, data.len() as u64);
    out.extend_from_slice(data);
}

pub fn put_varint_field(out: &mut Vec<u8>, field: u32, v: u64) {
    put_tag(out, field, 0);
    put_varint(out, v);
}

/// Why a connection preamble is refused.
#[derive(Debug, PartialEq)]
pub enum PreambleError {
    /// The first bytes are not "hrpc" (the bytes seen, at most 4).
    Magic(Vec<u8>),
    /// An IPC version other than 9.
    Version(u8),
    /// An auth protocol other than none.
    Auth(u8),
}

/// The connection preamble at the front of `avail`: Ok(true) once its 7 bytes are there and good,
/// Ok(false) while what has arrived is a good prefix of it.
pub fn check_preamble(avail: &[u8]) -> Result<bool, PreambleError> {
    let k = avail.len().min(MAGIC.len());
    if avail[..k] != MAGIC[..k] {
        return Err(PreambleError::Magic(avail[..k].to_vec()));
    }
    if avail.len() < PREAMBLE.len() {
        return Ok(false);
    }
    if avail[4] != IPC_VERSION {
        return Err(PreambleError::Version(avail[4]));
    }
    if avail[6] != AUTH_NONE {
        return Err(PreambleError::Auth(avail[6]));
    }
    Ok(true)
}

/// What the front of a stream holds: a whole packet (its 4-byte length not included; the frame is
/// 4 + packet.len() bytes), or not yet, and how many bytes the frame needs in all.
#[derive(Debug, PartialEq)]
pub enum Frame<'a> {
    Need(usize),
    Packet(&'a [u8]),
}

/// The length-prefixed packet at the front of `avail` (4-byte big-endian length, then the packet).
/// A length over `limit` (ipc.maximum.data.length) is Err(length) as soon as the 4 bytes are there,
/// before anything is allocated for it.
pub fn split_frame(avail: &[u8], limit: usize) -> Result<Frame<'_>, usize> {
    let Some(prefix) = avail.first_chunk::<4>() else { return Ok(Frame::Need(4)) };
    let len = u32::from_be_bytes(*prefix) as usize;
    if len > limit {
        return Err(len);
    }
    match avail[4..].get(..len) {
        Some(packet) => Ok(Frame::Packet(packet)),
        None => Ok(Frame::Need(4 + len)),
    }
}

/// A cursor over an untrusted byte slice.
pub struct Cursor<'a> {
    pub buf: &'a [u8],
    pub pos: usize,
}

pub enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

impl<'a> Cursor<'a> {
    pub fn new(buf: &'a [u8]) -> Self {
        Cursor { buf, pos: 0 }
    }

    pub fn at_end(&self) -> bool {
        self.pos >= self.buf.len()
    }

    pub fn varint(&mut self) -> WireResult<u64> {
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = *self.buf.get(self.pos).ok_or("message ends inside a varint")?;
            self.pos += 1;
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint longer than 10 bytes".into())
    }

    /// A varint-length-delimited message (the length at most 5 bytes, as Hadoop writes it).
    pub fn delimited(&mut self) -> WireResult<&'a [u8]> {
        let mut len: u64 = 0;
        let mut shift = 0;
        loop {
            let b = *self.buf.get(self.pos).ok_or("packet ends inside a varint length")?;
            self.pos += 1;
            len |= ((b & 0x7f) as u64) << shift;
            if b & 0x80 == 0 {
                break;
            }
            shift += 7;
            if shift > 28 {
                return Err("varint length longer than 5 bytes".into());
            }
        }
        let len = len as usize;
        if len > self.buf.len() - self.pos {
            return Err(format!("delimited message of {} bytes overruns the packet", len));
        }
        let out = &self.buf[self.pos..self.pos + len];
        self.pos += len;
        Ok(out)
    }

    /// The next field of a protobuf message: (field number, value); groups are refused.
    pub fn field(&mut self) -> WireResult<(u32, Value<'a>)> {
        let tag = self.varint()?;
        let field = (tag >> 3) as u32;
        if field == 0 || tag >> 3 > 0x1fff_ffff {
            return Err(format!("invalid field number in tag {}", tag));
        }
        match tag & 7 {
            0 => Ok((field, Value::Varint(self.varint()?))),
            1 => self.skip(8).map(|_| (field, Value::Fixed)),
            2 => {
                let len = self.varint()?;
                if len > (self.buf.len() - self.pos) as u64 {
                    return Err(format!("field {} of {} bytes overruns the message", field, len));
                }
                let s = &self.buf[self.pos..self.pos + len as usize];
                self.pos += len as usize;
                Ok((field, Value::Bytes(s)))
            }
            5 => self.skip(4).map(|_| (field, Value::Fixed)),
            t => Err(format!("unsupported wire type {} for field {}", t, field)),
        }
    }

    fn skip(&mut self, n: usize) -> WireResult<()> {
        if n > self.buf.len() - self.pos {
            return Err("message ends inside a fixed-width field".into());
        }
        self.pos += n;
        Ok(())
    }
}

fn want_varint(field: u32, v: Value) -> WireResult<u64> {
    match v {
        Value::Varint(x) => Ok(x),
        _ => Err(format!("field {} has the wrong wire type", field)),
    }
}

fn want_bytes<'a>(field: u32, v: Value<'a>) -> WireResult<&'a [u8]> {
    match v {
        Value::Bytes(x) => Ok(x),
        _ => Err(format!("field {} has the wrong wire type", field)),
    }
}

fn want_str(field: u32, v: Value) -> WireResult<String> {
    want_str_ref(field, v).map(str::to_owned)
}

fn want_str_ref<'a>(field: u32, v: Value<'a>) -> WireResult<&'a str> {
    std::str::from_utf8(want_bytes(field, v)?).map_err(|_| format!("field {} is not UTF-8", field))
}

/// RpcRequestHeaderProto.
pub struct RequestHeader<'a> {
    pub rpc_kind: u64,
    pub rpc_op: u64,
    pub call_id: i32,
    pub client_id: &'a [u8],
    pub retry_count: i32,
}

impl<'a> RequestHeader<'a> {
    pub fn parse(buf: &'a [u8]) -> WireResult<Self> {
        let mut c = Cursor::new(buf);
        let (mut kind, mut op, mut call_id, mut client_id, mut retry) = (0, 0, None, None, -1);
        while !c.at_end() {
            match c.field()? {
                (1, v) => kind = want_varint(1, v)?,
                (2, v) => op = want_varint(2, v)?,
                (3, v) => call_id = Some(unzigzag32(want_varint(3, v)?)),
                (4, v) => client_id = Some(want_bytes(4, v)?),
                (5, v) => retry = unzigzag32(want_varint(5, v)?),
                _ => {}
            }
        }
        Ok(RequestHeader {
            rpc_kind: kind,
            rpc_op: op,
            call_id: call_id.ok_or("missing required field callId")?,
            client_id: client_id.ok_or("missing required field clientId")?,
            retry_count: retry,
        })
    }

    pub fn encode(out: &mut Vec<u8>, call_id: i32, client_id: &[u8], retry_count: i32) {
        out.extend_from_slice(b"\x08\x02\x10\x00");
        put_varint_field(out, 3, zigzag32(call_id));
        put_bytes_field(out, 4, client_id);
        put_varint_field(out, 5, zigzag32(retry_count));
    }
}

/// RequestHeaderProto: (methodName, declaringClassProtocolName, clientProtocolVersion), all required.
/// Borrowed from the packet: every call parses one, and the loop answers most without keeping them.
pub fn parse_method_header(buf: &[u8]) -> WireResult<(&str, &str)> {
    let mut c = Cursor::new(buf);
    let (mut method, mut protocol, mut version) = (None, None, None);
    while !c.at_end() {
        match c.field()? {
            (1, v) => method = Some(want_str_ref(1, v)?),
            (2, v) => protocol = Some(want_str_ref(2, v)?),
            (3, v) => version = Some(want_varint(3, v)?),
            _ => {}
        }
    }
    if version.is_none() {
        return Err("missing required field clientProtocolVersion".into());
    }
    Ok((
        method.ok_or("missing required field methodName")?,
        protocol.ok_or("missing required field declaringClassProtocolName")?,
    ))
}

pub fn encode_method_header(method: &str, protocol: &str, version: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + method.len() + protocol.len());
    put_bytes_field(&mut out, 1, method.as_bytes());
    put_bytes_field(&mut out, 2, protocol.as_bytes());
    put_varint_field(&mut out, 3, version);
    out
}

/// IpcConnectionContextProto: (effective user, protocol).
pub fn parse_context(buf: &[u8]) -> WireResult<(String, String)> {
    let mut c = Cursor::new(buf);
    let (mut user, mut protocol) = (String::new(), String::new());
    while !c.at_end() {
        match c.field()? {
            (2, v) => {
                let mut u = Cursor::new(want_bytes(2, v)?);
                while !u.at_end() {
                    if let (1, v) = u.field()? {
                        user = want_str(1, v)?;
                    }
                }
            }
            (3, v) => protocol = want_str(3, v)?,
            _ => {}
        }
    }
    Ok((user, protocol))
}

pub fn encode_context(user: &str, protocol: &str) -> Vec<u8> {
    let mut info = Vec::new();
    put_bytes_field(&mut info, 1, user.as_bytes());
    let mut out = Vec::new();
    put_bytes_field(&mut out, 2, &info);
    put_bytes_field(&mut out, 3, protocol.as_bytes());
    out
}

/// The bytes field 1 of a message (EchoRequestProto / EchoResponseProto), or empty. Other fields are
/// checked for well-formedness and skipped.
pub fn parse_payload(buf: &[u8]) -> WireResult<&[u8]> {
    let mut c = Cursor::new(buf);
    let mut payload: &[u8] = &[];
    while !c.at_end() {
        if let (1, v) = c.field()? {
            payload = want_bytes(1, v)?;
        }
    }
    Ok(payload)
}

/// Checks that bytes are a well-formed message (EmptyRequestProto and the like).
pub fn check_message(buf: &[u8]) -> WireResult<()> {
    let mut c = Cursor::new(buf);
    while !c.at_end() {
        c.field()?;
    }
    Ok(())
}

/// RpcResponseHeaderProto, decoded.
#[derive(Default)]
pub struct ResponseHeader {
    pub call_id: u32,
    pub status: u64,
    pub exception_class: String,
    pub error_msg: String,
    pub error_detail: Option<u64>,
}

impl ResponseHeader {
    pub fn parse(buf: &[u8]) -> WireResult<Self> {
        let mut c = Cursor::new(buf);
        let mut h = ResponseHeader::default();
        let (mut have_id, mut have_status) = (false, false);
        while !c.at_end() {
            match c.field()? {
                (1, v) => {
                    h.call_id = want_varint(1, v)? as u32;
                    have_id = true;
                }
                (2, v) => {
                    h.status = want_varint(2, v)?;
                    have_status = true;
                }
                (4, v) => h.exception_class = want_str(4, v)?,
                (5, v) => h.error_msg = want_str(5, v)?,
                (6, v) => h.error_detail = Some(want_varint(6, v)?),
                _ => {}
            }
        }
        if !have_id || !have_status {
            return Err("response header misses callId or status".into());
        }
        Ok(h)
    }
}

/// A whole response packet (4-byte length included) with a SUCCESS header and ``body`` (already a
/// serialized message).
pub fn success_packet(out: &mut Vec<u8>, call_id: i32, client_id: &[u8], retry_count: i32, body: &[u8]) {
    let start = out.len();
    out.extend_from_slice(&[0, 0, 0, 0]);
    let hlen = 1 + varint_len(call_id as u32 as u64) + 4 + 1 + varint_len(client_id.len() as u64)
        + client_id.len() + 1 + varint_len(zigzag32(retry_count));
    put_varint(out, hlen as u64);
    put_varint_field(out, 1, call_id as u32 as u64);
    out.extend_from_slice(b"\x10\x00\x18\x09");
    put_bytes_field(out, 7, client_id);
    put_varint_field(out, 8, zigzag32(retry_count));
    put_varint(out, body.len() as u64);
    out.extend_from_slice(body);
    let n = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&n.to_be_bytes());
}

/// An ERROR or FATAL response packet.
#[allow(clippy::too_many_arguments)]
pub fn error_packet(out: &mut Vec<u8>, call_id: i32, status: u64, client_id: &[u8], retry_count: i32,
                    class_name: &str, message: &str, code: u64) {
    let mut h = Vec::with_capacity(64 + class_name.len() + message.len());
    put_varint_field(&mut h, 1, call_id as u32 as u64);
    put_varint_field(&mut h, 2, status);
    put_varint_field(&mut h, 3, IPC_VERSION as u64);
    put_bytes_field(&mut h, 4, class_name.as_bytes());
    put_bytes_field(&mut h, 5, message.as_bytes());
    put_varint_field(&mut h, 6, code);
    put_bytes_field(&mut h, 7, client_id);
    put_varint_field(&mut h, 8, zigzag32(retry_count));
    let n = (varint_len(h.len() as u64) + h.len()) as u32;
    out.extend_from_slice(&n.to_be_bytes());
    put_varint(out, h.len() as u64);
    out.extend_from_slice(&h);
}

// -- the shm transport's control data (shm.rs) --------------------------------------------------
// What an shm peer can put in front of us besides RPC bytes: the handshake text and the ring
// counters, which live in memory the peer can write.

/// The largest ring an shm client maps.
pub const MAX_RING_CAPACITY: usize = 1 << 30;

/// The shm handshake text the server sends with the descriptors, `{"capacity": N}`: the ring
/// capacity N, a power of two of at most MAX_RING_CAPACITY bytes.
pub fn parse_shm_handshake(msg: &[u8]) -> WireResult<usize> {
    let text = String::from_utf8_lossy(msg);
    text.split(|c: char| !c.is_ascii_digit()).find(|s| !s.is_empty())
        .and_then(|s| s.parse().ok())
        .filter(|c: &usize| c.is_power_of_two() && *c <= MAX_RING_CAPACITY)
        .ok_or_else(|| format!("bad shm handshake {text:?}"))
}

/// One copy out of or into a ring of `cap` bytes (a power of two): `pos` in the ring's data, `n`
/// bytes (0 when there is nothing to copy), and the moved counter (the consumer's tail after a
/// read, the producer's head after a write), wrapping as the counters do.
#[derive(Debug, PartialEq)]
pub struct RingSpan {
    pub pos: usize,
    pub n: usize,
    pub moved: u64,
}

/// The consumer's next copy of at most `want` bytes, from the ring's counters.
pub fn ring_read_span(head: u64, tail: u64, cap: usize, want: usize) -> WireResult<RingSpan> {
    if !cap.is_power_of_two() {
        return Err(format!("shm ring capacity {cap} is not a power of two"));
    }
    let avail = head.wrapping_sub(tail);
    if avail > cap as u64 {
        return Err("shm ring counters are corrupt".into());
    }
    let pos = (tail as usize) & (cap - 1);
    let n = (avail as usize).min(want).min(cap - pos);
    Ok(RingSpan { pos, n, moved: tail.wrapping_add(n as u64) })
}

/// The producer's next copy of at most `want` bytes, from the ring's counters.
pub fn ring_write_span(head: u64, tail: u64, cap: usize, want: usize) -> WireResult<RingSpan> {
    if !cap.is_power_of_two() {
        return Err(format!("shm ring capacity {cap} is not a power of two"));
    }
    let used = head.wrapping_sub(tail);
    if used > cap as u64 {
        return Err("shm ring counters are corrupt".into());
    }
    let free = cap - used as usize;
    let pos = (head as usize) & (cap - 1);
    let n = free.min(want).min(cap - pos);
    Ok(RingSpan { pos, n, moved: head.wrapping_add(n as u64) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zigzag_round_trips() {
        for n in [0, 1, -1, -3, -4, 63, -64, i32::MAX, i32::MIN] {
            assert_eq!(unzigzag32(zigzag32(n)), n);
        }
        assert_eq!(zigzag32(-3), 5);
        assert_eq!(zigzag32(-1), 1);
    }

    #[test]
    fn request_header_round_trips() {
        let mut out = Vec::new();
        RequestHeader::encode(&mut out, 300, &[7; 16], -1);
        let h = RequestHeader::parse(&out).unwrap();
        assert_eq!((h.call_id, h.retry_count, h.rpc_kind, h.client_id), (300, -1, 2, &[7u8; 16][..]));
    }

    #[test]
    fn hostile_lengths_fail_cleanly() {
        assert!(Cursor::new(b"\x7f\x01").delimited().is_err());
        assert!(Cursor::new(b"\xff\xff\xff\xff\xff\x01").delimited().is_err());
        assert!(RequestHeader::parse(b"\xff\xff\xff\xff\xff\xff\xff").is_err());
        assert!(parse_payload(b"\x0a\xff\xff\xff\xff\x0f").is_err());
    }

    #[test]
    fn ring_counters_wrap_instead_of_overflowing() {
        // found by the shm fuzz target: a tail at u64::MAX (the counters are in memory the peer
        // can write, and wrap by design) made `tail + n` overflow, a panic in a debug build
        let s = ring_read_span(21, u64::MAX, 1 << 20, 100).unwrap();
        assert_eq!(s, RingSpan { pos: (1 << 20) - 1, n: 1, moved: 0 });
        let s = ring_write_span(u64::MAX, u64::MAX - 3, 1 << 20, 100).unwrap();
        assert_eq!(s, RingSpan { pos: (1 << 20) - 1, n: 1, moved: 0 });
        assert!(ring_read_span(0, 1, 1 << 20, 100).is_err());
        assert!(ring_write_span(1 << 21, 0, 1 << 20, 100).is_err());
        assert!(ring_read_span(1, 0, 3, 1).is_err());
    }

    #[test]
    fn frames_and_preambles() {
        assert_eq!(split_frame(b"\0\0", 10), Ok(Frame::Need(4)));
        assert_eq!(split_frame(b"\0\0\0\x03ab", 10), Ok(Frame::Need(7)));
        assert_eq!(split_frame(b"\0\0\0\x02abc", 10), Ok(Frame::Packet(&b"ab"[..])));
        assert_eq!(split_frame(b"\xff\xff\xff\xff", MAX_DATA_LENGTH), Err(u32::MAX as usize));
        assert_eq!(check_preamble(b"hr"), Ok(false));
        assert_eq!(check_preamble(&PREAMBLE), Ok(true));
        assert_eq!(check_preamble(b"hrpc\x0a\0\0"), Err(PreambleError::Version(10)));
        assert_eq!(check_preamble(b"GET /"), Err(PreambleError::Magic(b"GET ".to_vec())));
        assert_eq!(parse_shm_handshake(b"{\"capacity\": 1048576}"), Ok(1 << 20));
        assert!(parse_shm_handshake(b"{\"capacity\": 3}").is_err());
        assert!(parse_shm_handshake(b"{\"capacity\": 99999999999999999999999}").is_err());
    }

    #[test]
    fn success_packet_matches_the_golden_bytes() {
        let cid: Vec<u8> = (0..16).collect();
        let mut out = Vec::new();
        success_packet(&mut out, 0, &cid, -1, b"\x0a\x02hi");
        let mut hdr = b"\x08\x00\x10\x00\x18\x09\x3a\x10".to_vec();
        hdr.extend_from_slice(&cid);
        hdr.extend_from_slice(b"\x40\x01");
        let mut body = vec![hdr.len() as u8];
        body.extend_from_slice(&hdr);
        body.extend_from_slice(b"\x04\x0a\x02hi");
        let mut golden = (body.len() as u32).to_be_bytes().to_vec();
        golden.extend_from_slice(&body);
        assert_eq!(out, golden);
    }
}
