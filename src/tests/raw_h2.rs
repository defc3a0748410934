//! A hand-made HTTP/2 client for one gRPC call over a unix socket, whose
//! request carries exactly the header fields the test gives, in its order.
//! No gRPC library sends an empty `:authority`, leaves it out, or leaves out
//! a pseudo-header; tonic and h2 only send an authority that parses as one.
//!
//! The header block holds HPACK literals without indexing and without
//! Huffman coding (RFC 7541, 6.2.2), so the client keeps no HPACK state. The
//! answer is what the DATA frames of stream 1 carry; the response's header
//! blocks, which would need an HPACK decoder, are skipped.
use std::{
    io::{Read, Write},
    os::unix::net::UnixStream,
    path::Path,
    time::Duration,
};

/// How the server ended the request's stream.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The stream ended normally; the bytes of its DATA frames.
    Answer(Vec<u8>),
    /// RST_STREAM with this error code.
    Reset(u32),
}

/// The RST_STREAM error code PROTOCOL_ERROR (RFC 9113, 7).
pub const PROTOCOL_ERROR: u32 = 0x1;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
/// The one stream a call uses.
const STREAM: u32 = 1;

/// Opens a connection to `socket` and sends one request on stream 1:
/// `fields` as its header block, then `body` as one DATA frame that ends the
/// stream. Reads until the server ends the stream or resets it.
pub fn call(socket: &Path, fields: &[(&str, &[u8])], body: &[u8]) -> Result<Outcome, String> {
    let io = |e: std::io::Error| format!("{}: {e}", socket.display());
    let mut conn = UnixStream::connect(socket).map_err(io)?;
    conn.set_read_timeout(Some(Duration::from_secs(20)))
        .map_err(io)?;
    let mut out = PREFACE.to_vec();
    out.extend(frame(SETTINGS, 0, 0, &[]));
    out.extend(frame(HEADERS, END_HEADERS, STREAM, &header_block(fields)));
    out.extend(frame(DATA, END_STREAM, STREAM, body));
    conn.write_all(&out).map_err(io)?;
    let mut data = Vec::new();
    loop {
        let (kind, flags, stream, payload) = read_frame(&mut conn).map_err(io)?;
        match (kind, stream) {
            (SETTINGS, 0) if flags & ACK == 0 => {
                conn.write_all(&frame(SETTINGS, ACK, 0, &[])).map_err(io)?
            }
            (PING, 0) if flags & ACK == 0 => {
                conn.write_all(&frame(PING, ACK, 0, &payload)).map_err(io)?
            }
            (GOAWAY, 0) => {
                return Err(format!(
                    "GOAWAY with error code {}",
                    be_u32(payload.get(4..8))
                ))
            }
            (RST_STREAM, STREAM) => return Ok(Outcome::Reset(be_u32(payload.get(..4)))),
            (DATA, STREAM) => {
                data.extend_from_slice(unpadded(flags, &payload)?);
                if flags & END_STREAM != 0 {
                    return Ok(Outcome::Answer(data));
                }
            }
            // The trailers.
            (HEADERS, STREAM) if flags & END_STREAM != 0 => return Ok(Outcome::Answer(data)),
            // Response headers, WINDOW_UPDATE, acknowledgements.
            _ => {}
        }
    }
}

/// A frame: 24-bit length, type, flags, stream ID, payload (RFC 9113, 4.1).
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = u32::try_from(payload.len()).unwrap_or(u32::MAX);
    let mut f = len.to_be_bytes()[1..].to_vec();
    f.extend([kind, flags]);
    f.extend(stream.to_be_bytes());
    f.extend(payload);
    f
}

/// Reads one frame: type, flags, stream ID, payload.
fn read_frame(conn: &mut UnixStream) -> std::io::Result<(u8, u8, u32, Vec<u8>)> {
    let mut head = [0u8; 9];
    conn.read_exact(&mut head)?;
    let len = u32::from_be_bytes([0, head[0], head[1], head[2]]) as usize;
    let stream = u32::from_be_bytes([head[5], head[6], head[7], head[8]]) & 0x7fff_ffff;
    let mut payload = vec![0u8; len];
    conn.read_exact(&mut payload)?;
    Ok((head[3], head[4], stream, payload))
}

/// A DATA payload without its padding.
fn unpadded(flags: u8, payload: &[u8]) -> Result<&[u8], String> {
    if flags & PADDED == 0 {
        return Ok(payload);
    }
    let pad = usize::from(*payload.first().ok_or("empty padded DATA")?);
    payload
        .get(1..payload.len().saturating_sub(pad))
        .ok_or_else(|| "DATA padding longer than the frame".into())
}

fn be_u32(bytes: Option<&[u8]>) -> u32 {
    bytes
        .and_then(|b| b.try_into().ok())
        .map(u32::from_be_bytes)
        .unwrap_or(u32::MAX)
}

/// Each field as a literal without indexing with a literal name (first
/// byte 0x00), name and value as plain strings.
fn header_block(fields: &[(&str, &[u8])]) -> Vec<u8> {
    let mut block = Vec::new();
    for (name, value) in fields {
        block.push(0x00);
        string(&mut block, name.as_bytes());
        string(&mut block, value);
    }
    block
}

/// A string literal without Huffman coding: its length as an integer with a
/// 7-bit prefix (RFC 7541, 5.1), then its bytes.
fn string(out: &mut Vec<u8>, s: &[u8]) {
    const MAX: usize = 0x7f;
    if s.len() < MAX {
        out.push(s.len() as u8);
    } else {
        out.push(MAX as u8);
        let mut rest = s.len() - MAX;
        while rest >= 0x80 {
            out.push((rest % 0x80) as u8 | 0x80);
            rest /= 0x80;
        }
        out.push(rest as u8);
    }
    out.extend_from_slice(s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lengths_from_127_take_continuation_bytes() {
        let mut out = Vec::new();
        string(&mut out, &[b'a'; 126]);
        assert_eq!(out[0], 126);
        for (len, prefix) in [(127, vec![0x7f, 0x00]), (1337, vec![0x7f, 0xba, 0x09])] {
            let mut out = Vec::new();
            string(&mut out, &vec![b'a'; len]);
            assert_eq!(out[..prefix.len()], prefix[..], "{len}");
            assert_eq!(out.len(), prefix.len() + len);
        }
    }
}
