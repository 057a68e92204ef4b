//! Messages between a trainer rank and its rollout replica process: a JSON header and binary
//! blobs (tensor data, kept out of JSON), each length-prefixed, on a Unix socket.
//!
//! A frame is `u64` header length, the header, `u32` blob count, then per blob `u64` length
//! and its bytes (little-endian lengths). A tensor travels as a blob of its contiguous CPU
//! data and `{"kind", "shape"}` in the header.

use std::io::{BufReader, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::time::Duration;

use serde_json::{Value, json};
use tch::{Device, Kind, Tensor};

use super::PoolError;

/// Largest header a peer may announce (a corrupt length must not allocate gigabytes).
const MAX_HEADER: u64 = 256 << 20;

/// Writes one frame.
pub fn write(out: &mut impl Write, header: &Value, blobs: &[Vec<u8>]) -> std::io::Result<()> {
    let head = serde_json::to_vec(header)?;
    out.write_all(&(head.len() as u64).to_le_bytes())?;
    out.write_all(&head)?;
    out.write_all(&(blobs.len() as u32).to_le_bytes())?;
    for b in blobs {
        out.write_all(&(b.len() as u64).to_le_bytes())?;
        out.write_all(b)?;
    }
    out.flush()
}

/// Reads one frame; `Ok(None)` when the peer closed the socket before a frame began.
/// Whether a frame (or the end of the stream) can be read from `reader` within `wait`:
/// bytes already buffered, or the socket readable.
pub fn readable(reader: &BufReader<UnixStream>, wait: Duration) -> std::io::Result<bool> {
    if !reader.buffer().is_empty() {
        return Ok(true);
    }
    let mut fd = libc::pollfd {
        fd: reader.get_ref().as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    let ready = unsafe { libc::poll(&mut fd, 1, ms) };
    match ready {
        r if r < 0 => {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

pub fn read(input: &mut impl Read) -> std::io::Result<Option<(Value, Vec<Vec<u8>>)>> {
    let mut len = [0u8; 8];
    match input.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u64::from_le_bytes(len);
    if len > MAX_HEADER {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("a frame header of {len} bytes"),
        ));
    }
    let mut head = vec![0u8; len as usize];
    input.read_exact(&mut head)?;
    let header: Value = serde_json::from_slice(&head)?;
    let mut count = [0u8; 4];
    input.read_exact(&mut count)?;
    let mut blobs = Vec::new();
    for _ in 0..u32::from_le_bytes(count) {
        let mut len = [0u8; 8];
        input.read_exact(&mut len)?;
        let mut blob = vec![0u8; u64::from_le_bytes(len) as usize];
        input.read_exact(&mut blob)?;
        blobs.push(blob);
    }
    Ok(Some((header, blobs)))
}

fn kind_name(kind: Kind) -> Result<&'static str, PoolError> {
    Ok(match kind {
        Kind::Float => "f32",
        Kind::Double => "f64",
        Kind::Half => "f16",
        Kind::BFloat16 => "bf16",
        Kind::Int64 => "i64",
        Kind::Int => "i32",
        Kind::Bool => "bool",
        Kind::Uint8 => "u8",
        other => return Err(PoolError::Protocol(format!("no wire form for {other:?}"))),
    })
}

fn kind_of(name: &str) -> Result<Kind, PoolError> {
    Ok(match name {
        "f32" => Kind::Float,
        "f64" => Kind::Double,
        "f16" => Kind::Half,
        "bf16" => Kind::BFloat16,
        "i64" => Kind::Int64,
        "i32" => Kind::Int,
        "bool" => Kind::Bool,
        "u8" => Kind::Uint8,
        other => {
            return Err(PoolError::Protocol(format!(
                "unknown tensor kind `{other}`"
            )));
        }
    })
}

/// `t` as a header entry and a blob.
pub fn tensor(t: &Tensor) -> Result<(Value, Vec<u8>), PoolError> {
    let t = t.f_detach()?.f_to_device(Device::Cpu)?.f_contiguous()?;
    let numel = t.numel();
    let mut data = vec![0u8; numel * t.kind().elt_size_in_bytes()];
    t.f_copy_data_u8(&mut data, numel)?;
    Ok((
        json!({"kind": kind_name(t.kind())?, "shape": t.size()}),
        data,
    ))
}

/// The tensor of a header entry and its blob.
pub fn to_tensor(desc: &Value, blob: &[u8]) -> Result<Tensor, PoolError> {
    let kind = kind_of(desc["kind"].as_str().unwrap_or_default())?;
    let shape: Vec<i64> = serde_json::from_value(desc["shape"].clone())
        .map_err(|e| PoolError::Protocol(format!("a tensor's shape: {e}")))?;
    let numel: i64 = shape.iter().product();
    if numel < 0 || blob.len() != numel as usize * kind.elt_size_in_bytes() {
        return Err(PoolError::Protocol(format!(
            "a {shape:?} tensor of {kind:?} in {} bytes",
            blob.len()
        )));
    }
    Ok(Tensor::f_from_data_size(blob, &shape, kind)?)
}

/// `f32`s as a blob (images' pixels).
pub fn f32_blob(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// A blob of `f32`s.
pub fn blob_f32(blob: &[u8]) -> Result<Vec<f32>, PoolError> {
    if !blob.len().is_multiple_of(4) {
        return Err(PoolError::Protocol(format!(
            "{} bytes are not f32s",
            blob.len()
        )));
    }
    Ok(blob
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_and_tensors_round_trip() {
        let t = Tensor::from_slice(&[1.5f32, -2.0, 3.25, 0.0, 7.0, 8.0]).view([2, 3]);
        let ids = Tensor::from_slice(&[4i64, 5, 6]);
        let (dt, bt) = tensor(&t).unwrap();
        let (di, bi) = tensor(&ids).unwrap();
        let mut buf = Vec::new();
        write(&mut buf, &json!({"op": "x", "t": [dt, di]}), &[bt, bi]).unwrap();
        let (h, blobs) = read(&mut buf.as_slice()).unwrap().unwrap();
        assert_eq!(h["op"], "x");
        let back = to_tensor(&h["t"][0], &blobs[0]).unwrap();
        assert!(back.equal(&t));
        assert!(to_tensor(&h["t"][1], &blobs[1]).unwrap().equal(&ids));
        // A closed socket before a frame is the end, not an error; a cut frame is an error.
        assert!(read(&mut [].as_slice()).unwrap().is_none());
        assert!(read(&mut &buf[..buf.len() - 3]).is_err());
        assert!(to_tensor(&h["t"][0], &blobs[1][..16]).is_err());
    }
}
