//! TensorBoard event files, written without TensorFlow: TFRecord framing (little-endian u64
//! length, masked CRC-32C of the length, the payload, masked CRC-32C of the payload) around
//! hand-encoded `tensorflow.Event` protobufs: a `file_version: "brain.Event:2"` record first,
//! then one event per step whose `Summary` holds a `simple_value` per metric (what
//! `SummaryWriter.add_scalar` records and TensorBoard's scalar dashboard reads).
//!
//! [`read_events`] parses such files back (checking both CRCs), for tests and tools.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use super::{LogError, Logger};
use crate::engine::Metrics;

/// CRC-32C (Castagnoli), reflected, as TFRecord uses.
pub fn crc32c(data: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 {
                    0x82F6_3B78 ^ (c >> 1)
                } else {
                    c >> 1
                };
            }
            *e = c;
        }
        t
    });
    !data.iter().fold(!0u32, |c, &b| {
        table[((c ^ b as u32) & 0xff) as usize] ^ (c >> 8)
    })
}

/// TFRecord's masked CRC: `((crc >> 15) | (crc << 17)) + 0xa282ead8`.
pub fn masked_crc32c(data: &[u8]) -> u32 {
    let c = crc32c(data);
    (c.rotate_right(15)).wrapping_add(0xa282_ead8)
}

/// One TFRecord.
pub fn frame(payload: &[u8]) -> Vec<u8> {
    let len = (payload.len() as u64).to_le_bytes();
    let mut out = Vec::with_capacity(payload.len() + 16);
    out.extend_from_slice(&len);
    out.extend_from_slice(&masked_crc32c(&len).to_le_bytes());
    out.extend_from_slice(payload);
    out.extend_from_slice(&masked_crc32c(payload).to_le_bytes());
    out
}

fn varint(mut v: u64, out: &mut Vec<u8>) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn len_field(field: u32, bytes: &[u8], out: &mut Vec<u8>) {
    varint(((field << 3) | 2) as u64, out);
    varint(bytes.len() as u64, out);
    out.extend_from_slice(bytes);
}

/// `Event { wall_time, step, file_version | summary { value { tag, simple_value } … } }`.
pub fn encode_event(
    wall_time: f64,
    step: i64,
    file_version: Option<&str>,
    scalars: &[(&str, f32)],
) -> Vec<u8> {
    // proto3: fields at their default value are not written.
    let mut ev = Vec::new();
    if wall_time != 0.0 {
        ev.push(0x09); // field 1, 64-bit
        ev.extend_from_slice(&wall_time.to_le_bytes());
    }
    if step != 0 {
        ev.push(0x10); // field 2, varint
        varint(step as u64, &mut ev);
    }
    if let Some(v) = file_version {
        len_field(3, v.as_bytes(), &mut ev);
    }
    if !scalars.is_empty() {
        let mut summary = Vec::new();
        for (tag, value) in scalars {
            let mut val = Vec::new();
            len_field(1, tag.as_bytes(), &mut val);
            val.push(0x15); // field 2, 32-bit
            val.extend_from_slice(&value.to_le_bytes());
            len_field(1, &val, &mut summary);
        }
        len_field(5, &summary, &mut ev);
    }
    ev
}

/// Writes `events.out.tfevents.<time>.<host>.<pid>.0` in a directory.
pub struct TensorboardLogger {
    path: PathBuf,
    out: BufWriter<File>,
}

impl std::fmt::Debug for TensorboardLogger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TensorboardLogger")
            .field("path", &self.path)
            .finish()
    }
}

fn now() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| {
            !s.is_empty()
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        })
        .unwrap_or_else(|| "localhost".to_owned())
}

impl TensorboardLogger {
    /// A new event file in `dir` (created if needed).
    pub fn create(dir: &Path) -> Result<Self, LogError> {
        let io = |e: std::io::Error| LogError::Io {
            path: dir.to_path_buf(),
            source: e,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let t = now();
        let path = dir.join(format!(
            "events.out.tfevents.{}.{}.{}.0",
            t as u64,
            hostname(),
            std::process::id()
        ));
        let file = File::create(&path).map_err(|e| LogError::Io {
            path: path.clone(),
            source: e,
        })?;
        let mut logger = TensorboardLogger {
            path,
            out: BufWriter::new(file),
        };
        logger.write(&encode_event(t, 0, Some("brain.Event:2"), &[]))?;
        Ok(logger)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, payload: &[u8]) -> Result<(), LogError> {
        let io = |e: std::io::Error, p: &Path| LogError::Io {
            path: p.to_path_buf(),
            source: e,
        };
        self.out
            .write_all(&frame(payload))
            .map_err(|e| io(e, &self.path))?;
        self.out.flush().map_err(|e| io(e, &self.path))
    }
}

impl Logger for TensorboardLogger {
    fn log(&mut self, step: u64, metrics: &Metrics) -> Result<(), LogError> {
        let scalars: Vec<(&str, f32)> = metrics
            .iter()
            .map(|(k, v)| (k.as_str(), *v as f32))
            .collect();
        let ev = encode_event(now(), step as i64, None, &scalars);
        self.write(&ev)
    }
}

/// One decoded event: step and `(tag, simple_value)` pairs (the file-version record has none).
#[derive(Debug, Clone, PartialEq)]
pub struct Event {
    pub wall_time: f64,
    pub step: i64,
    pub file_version: Option<String>,
    pub scalars: Vec<(String, f32)>,
}

fn read_varint(b: &[u8], i: &mut usize) -> Option<u64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let byte = *b.get(*i)?;
        *i += 1;
        v |= ((byte & 0x7f) as u64) << shift;
        if byte & 0x80 == 0 {
            return Some(v);
        }
    }
    None
}

/// One protobuf field: (field number, wire type, value bytes, varint value).
type Field<'a> = (u32, u8, &'a [u8], u64);

/// Fields of one protobuf message.
fn fields(b: &[u8]) -> Option<Vec<Field<'_>>> {
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let key = read_varint(b, &mut i)?;
        let (field, wire) = ((key >> 3) as u32, (key & 7) as u8);
        match wire {
            0 => {
                let v = read_varint(b, &mut i)?;
                out.push((field, wire, &b[0..0], v));
            }
            1 => {
                out.push((field, wire, b.get(i..i + 8)?, 0));
                i += 8;
            }
            2 => {
                let n = read_varint(b, &mut i)? as usize;
                out.push((field, wire, b.get(i..i + n)?, 0));
                i += n;
            }
            5 => {
                out.push((field, wire, b.get(i..i + 4)?, 0));
                i += 4;
            }
            _ => return None,
        }
    }
    Some(out)
}

fn decode_event(b: &[u8]) -> Option<Event> {
    let mut ev = Event {
        wall_time: 0.0,
        step: 0,
        file_version: None,
        scalars: Vec::new(),
    };
    for (f, w, bytes, v) in fields(b)? {
        match (f, w) {
            (1, 1) => ev.wall_time = f64::from_le_bytes(bytes.try_into().ok()?),
            (2, 0) => ev.step = v as i64,
            (3, 2) => ev.file_version = Some(String::from_utf8(bytes.to_vec()).ok()?),
            (5, 2) => {
                for (sf, sw, value, _) in fields(bytes)? {
                    if (sf, sw) != (1, 2) {
                        continue;
                    }
                    let (mut tag, mut x) = (String::new(), None);
                    for (vf, vw, vb, _) in fields(value)? {
                        match (vf, vw) {
                            (1, 2) => tag = String::from_utf8(vb.to_vec()).ok()?,
                            (2, 5) => x = Some(f32::from_le_bytes(vb.try_into().ok()?)),
                            _ => {}
                        }
                    }
                    if let Some(x) = x {
                        ev.scalars.push((tag, x));
                    }
                }
            }
            _ => {}
        }
    }
    Some(ev)
}

/// Reads every event of an event file, checking the framing and both CRCs of every record.
pub fn read_events(path: &Path) -> Result<Vec<Event>, LogError> {
    let bad = |msg: String| LogError::Format {
        path: path.to_path_buf(),
        msg,
    };
    let b = std::fs::read(path).map_err(|e| LogError::Io {
        path: path.to_path_buf(),
        source: e,
    })?;
    let mut i = 0;
    let mut out = Vec::new();
    while i < b.len() {
        let head = b
            .get(i..i + 12)
            .ok_or_else(|| bad(format!("truncated record header at byte {i}")))?;
        let len_bytes = &head[..8];
        let len =
            u64::from_le_bytes(len_bytes.try_into().map_err(|_| bad("header".into()))?) as usize;
        let crc = u32::from_le_bytes(head[8..12].try_into().map_err(|_| bad("header".into()))?);
        if crc != masked_crc32c(len_bytes) {
            return Err(bad(format!("length CRC mismatch at byte {i}")));
        }
        let payload = b
            .get(i + 12..i + 12 + len)
            .ok_or_else(|| bad(format!("truncated record at byte {i}")))?;
        let crc_bytes = b
            .get(i + 12 + len..i + 16 + len)
            .ok_or_else(|| bad(format!("truncated record at byte {i}")))?;
        let crc = u32::from_le_bytes(crc_bytes.try_into().map_err(|_| bad("crc".into()))?);
        if crc != masked_crc32c(payload) {
            return Err(bad(format!("payload CRC mismatch at byte {i}")));
        }
        out.push(
            decode_event(payload).ok_or_else(|| bad(format!("undecodable Event at byte {i}")))?,
        );
        i += 16 + len;
    }
    Ok(out)
}
