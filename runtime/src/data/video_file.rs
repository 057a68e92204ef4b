//! Video files, read as verl's dataset reads them: qwen_vl_utils' `fetch_video` opens the file
//! with torchcodec (its first choice of reader), scans it for its frame count and mean frame
//! rate, keeps the frames of the cell's time range (`video_start`, `video_end`), samples an
//! even number of them evenly (`fps`, else `nframes`, within `min_frames`/`max_frames`) and
//! decodes those to 8-bit RGB.
//!
//! verlc runs FFmpeg's own tools for the same steps, the libraries torchcodec wraps: `ffprobe`
//! lists the stream's packets (torchcodec's scan: the frame count is the packet count, the frame
//! rate that count over the span from the first packet's start to the last one's end) and
//! `ffmpeg` decodes the chosen frames (its default YUV-to-RGB conversion is torchcodec's, byte
//! for byte). A stream whose display matrix rotates it (a phone's portrait video) is decoded
//! as stored and its RGB frames turned by quarter turns, as torchcodec turns them (FFmpeg's
//! own autorotation turns the YUV planes before the conversion, which rounds otherwise). Both
//! tools must be on `PATH` (FFmpeg 5.1 or newer), or named by `VERLC_FFPROBE` and
//! `VERLC_FFMPEG`.

use std::ffi::OsString;
use std::path::Path;
use std::process::Command;

use serde_json::Value;
use tch::{Device, Kind, Tensor};

use super::image::ImageError;

/// qwen_vl_utils' defaults: frames sampled per second and the bounds on the sampled count.
const DEFAULT_FPS: f64 = 2.0;
const MIN_FRAMES: f64 = 4.0;
const MAX_FRAMES: f64 = 768.0;

/// A cell's sampling keys (qwen_vl_utils' names): `fps` and `nframes` exclude each other.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct VideoSampling {
    pub fps: Option<f64>,
    pub nframes: Option<f64>,
    pub min_frames: Option<f64>,
    pub max_frames: Option<f64>,
    /// The time range in seconds.
    pub start: Option<f64>,
    pub end: Option<f64>,
}

impl VideoSampling {
    /// The keys this reads from a video cell.
    pub const KEYS: [&'static str; 6] = [
        "fps",
        "nframes",
        "min_frames",
        "max_frames",
        "video_start",
        "video_end",
    ];

    /// The sampling keys of a `{"video": ..., ...}` cell (numbers; other keys are not read here).
    pub fn of_cell(fields: &serde_json::Map<String, Value>) -> Result<Self, String> {
        let number = |k: &str| match fields.get(k) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| format!("`{k}` must be a number, got {v}")),
        };
        let sampling = VideoSampling {
            fps: number("fps")?,
            nframes: number("nframes")?,
            min_frames: number("min_frames")?,
            max_frames: number("max_frames")?,
            start: number("video_start")?,
            end: number("video_end")?,
        };
        if sampling.fps.is_some() && sampling.nframes.is_some() {
            return Err("`fps` and `nframes` exclude each other".into());
        }
        Ok(sampling)
    }
}

/// What the scan of a file's video stream finds.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamInfo {
    /// The stored frames' size (before the rotation).
    pub width: usize,
    pub height: usize,
    pub frames: usize,
    /// Frames per second over the stream's span.
    pub average_fps: f64,
    /// Counter-clockwise quarter turns the display matrix asks for (0 to 3).
    pub quarter_turns: i64,
}

/// The sampled frames of a video file: `data` holds `indices.len()` frames of
/// `height × width` RGB pixels (upright), row-major; `indices` are the frames' positions in
/// the stream.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedVideo {
    pub width: usize,
    pub height: usize,
    pub data: Vec<u8>,
    pub indices: Vec<i64>,
    pub average_fps: f64,
}

/// Reads the frames of the file at `path` that `sampling` picks.
pub fn read_video_file(path: &Path, sampling: &VideoSampling) -> Result<DecodedVideo, ImageError> {
    let info = probe(path)?;
    let (first, last, count) =
        frame_range(sampling, info.frames, info.average_fps).map_err(|e| at(path, &e))?;
    let n = sampled_frames(sampling, count, info.average_fps).map_err(|e| at(path, &e))?;
    // torch.linspace in float32, rounded half to even, as qwen_vl_utils computes the indices.
    let indices = Vec::<i64>::try_from(
        Tensor::f_linspace(
            first as f64,
            last as f64,
            n as i64,
            (Kind::Float, Device::Cpu),
        )?
        .f_round()?
        .f_to_kind(Kind::Int64)?,
    )?;
    let data = decode(path, &indices, (info.width, info.height))?;
    let (width, height, data) = match info.quarter_turns {
        0 => (info.width, info.height, data),
        k => {
            let n = indices.len() as i64;
            let turned = Tensor::f_from_slice(&data)?
                .f_view([n, info.height as i64, info.width as i64, 3])?
                .f_rot90(k, [1, 2])?
                .f_contiguous()?;
            let (w, h) = if k % 2 == 1 {
                (info.height, info.width)
            } else {
                (info.width, info.height)
            };
            (w, h, Vec::<u8>::try_from(turned.f_view([-1])?)?)
        }
    };
    Ok(DecodedVideo {
        width,
        height,
        data,
        indices,
        average_fps: info.average_fps,
    })
}

fn os_args(args: &[&str]) -> Vec<OsString> {
    args.iter().map(OsString::from).collect()
}

fn at(path: &Path, why: &str) -> ImageError {
    ImageError::Video(format!("{}: {why}", path.display()))
}

/// The program `var` names, else `default` on `PATH`, run with `args`; its standard output.
fn run_tool(
    var: &str,
    default: &str,
    args: &[OsString],
    path: &Path,
) -> Result<Vec<u8>, ImageError> {
    let program = std::env::var_os(var).unwrap_or_else(|| default.into());
    let out = Command::new(&program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .output()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                at(
                    path,
                    &format!(
                        "reading a video file needs FFmpeg's `{default}` (5.1 or newer) on PATH, or {var} naming it (Debian: apt install ffmpeg)"
                    ),
                )
            } else {
                at(path, &format!("{}: {e}", program.to_string_lossy()))
            }
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let why = stderr
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(at(
            path,
            &format!("{default} failed ({}): {}", out.status, why.trim()),
        ));
    }
    Ok(out.stdout)
}

/// torchcodec's scan of the file's first video stream: its packets (one frame each), the span
/// from the earliest start to the latest end, in seconds from the stream's time base.
pub fn probe(path: &Path) -> Result<StreamInfo, ImageError> {
    let mut args = os_args(&[
        "-v",
        "error",
        "-select_streams",
        "v:0",
        "-show_entries",
        "stream=width,height,time_base:stream_side_data=rotation:packet=pts,duration",
        "-of",
        "json",
    ]);
    args.push(path.into());
    let out = run_tool("VERLC_FFPROBE", "ffprobe", &args, path)?;
    let v: Value = serde_json::from_slice(&out)
        .map_err(|e| at(path, &format!("ffprobe's report is not JSON: {e}")))?;
    let stream = v["streams"]
        .get(0)
        .ok_or_else(|| at(path, "no video stream"))?;
    let size = |k: &str| {
        stream[k]
            .as_u64()
            .filter(|&x| x > 0)
            .map(|x| x as usize)
            .ok_or_else(|| at(path, &format!("the video stream has no {k}")))
    };
    let (width, height) = (size("width")?, size("height")?);
    let time_base = stream["time_base"]
        .as_str()
        .and_then(|tb| tb.split_once('/'))
        .and_then(|(n, d)| Some((n.parse::<i64>().ok()?, d.parse::<i64>().ok()?)))
        .filter(|&(_, d)| d > 0)
        .ok_or_else(|| at(path, "the video stream has no time base"))?;
    let packets = v["packets"].as_array().map(Vec::as_slice).unwrap_or(&[]);
    if packets.is_empty() {
        return Err(at(path, "the video stream has no frames"));
    }
    // Numbers in ffprobe's JSON (strings in some versions' output).
    let int = |p: &Value, k: &str| {
        p[k].as_i64()
            .or_else(|| p[k].as_str().and_then(|s| s.parse::<i64>().ok()))
    };
    let (mut begin, mut end) = (i64::MAX, i64::MIN);
    for p in packets {
        let pts = int(p, "pts").ok_or_else(|| at(path, "a frame without a presentation time"))?;
        begin = begin.min(pts);
        end = end.max(pts + int(p, "duration").unwrap_or(0));
    }
    // torchcodec's seconds: pts × num / den in double.
    let seconds = |pts: i64| pts as f64 * time_base.0 as f64 / time_base.1 as f64;
    let span = seconds(end) - seconds(begin);
    if span <= 0.0 {
        return Err(at(path, "the video stream spans no time"));
    }
    // The display matrix's rotation in degrees, counter-clockwise, to the nearest quarter
    // turn (torchcodec's rounding).
    let rotation = stream["side_data_list"]
        .as_array()
        .and_then(|l| l.iter().find_map(|d| d["rotation"].as_f64()))
        .unwrap_or(0.0);
    Ok(StreamInfo {
        width,
        height,
        frames: packets.len(),
        average_fps: packets.len() as f64 / span,
        quarter_turns: ((rotation / 90.0).round() as i64).rem_euclid(4),
    })
}

/// qwen_vl_utils' `calculate_video_frame_range`: the first and last frame of the cell's time
/// range and their count.
fn frame_range(
    sampling: &VideoSampling,
    total: usize,
    fps: f64,
) -> Result<(usize, usize, usize), String> {
    if sampling.start.is_none() && sampling.end.is_none() {
        return Ok((0, total - 1, total));
    }
    let duration = total as f64 / fps;
    let clamp = |t: f64| t.min(duration).max(0.0);
    let first = sampling
        .start
        .map_or(0, |t| (clamp(t) * fps).ceil() as usize);
    let last = sampling.end.map_or(total - 1, |t| {
        ((clamp(t) * fps).floor() as usize).min(total - 1)
    });
    if first >= last {
        return Err(format!(
            "the time range ({}s to {}s) holds frames {first} to {last} of {total} at {fps} fps: fewer than two",
            sampling.start.unwrap_or(0.0),
            sampling.end.unwrap_or(duration)
        ));
    }
    Ok((first, last, last - first + 1))
}

/// qwen_vl_utils' `smart_nframes`: how many of `total` frames (at `fps`) to sample.
fn sampled_frames(sampling: &VideoSampling, total: usize, fps: f64) -> Result<usize, String> {
    let by = super::video::FRAME_FACTOR as f64;
    let n = if let Some(n) = sampling.nframes {
        (n / by).round_ties_even() * by
    } else {
        let total_f = total as f64;
        let min = (sampling.min_frames.unwrap_or(MIN_FRAMES) / by).ceil() * by;
        let max = (sampling.max_frames.unwrap_or(MAX_FRAMES.min(total_f)) / by).floor() * by;
        let wanted = total_f / fps * sampling.fps.unwrap_or(DEFAULT_FPS);
        (wanted.max(min).min(max).min(total_f) / by).floor() * by
    };
    if !(by <= n && n <= total as f64) {
        return Err(format!(
            "samples {n} frames of {total}: the count must lie between {by} and the frame count"
        ));
    }
    Ok(n as usize)
}

/// The frames at `indices` (stream order), decoded to RGB with FFmpeg's default conversion.
fn decode(
    path: &Path,
    indices: &[i64],
    (width, height): (usize, usize),
) -> Result<Vec<u8>, ImageError> {
    let mut unique = indices.to_vec();
    unique.dedup();
    let select = unique
        .iter()
        .map(|i| format!("eq(n\\,{i})"))
        .collect::<Vec<_>>()
        .join("+");
    let filter = format!("select={select}");
    let mut args = os_args(&["-v", "error", "-nostdin", "-noautorotate", "-i"]);
    args.push(path.into());
    args.extend(os_args(&[
        "-map",
        "0:v:0",
        "-vf",
        &filter,
        "-fps_mode",
        "passthrough",
        "-f",
        "rawvideo",
        "-pix_fmt",
        "rgb24",
        "-",
    ]));
    let out = run_tool("VERLC_FFMPEG", "ffmpeg", &args, path)?;
    let frame = width * height * 3;
    if out.len() != unique.len() * frame {
        return Err(at(
            path,
            &format!(
                "ffmpeg decoded {} of the {} sampled frames of {width} x {height} pixels",
                out.len() / frame,
                unique.len()
            ),
        ));
    }
    // Back to one frame per index (repeated indices share a decoded frame).
    let mut data = Vec::with_capacity(indices.len() * frame);
    let mut at_unique = 0;
    for (k, i) in indices.iter().enumerate() {
        if k > 0 && indices[k - 1] != *i {
            at_unique += 1;
        }
        data.extend_from_slice(&out[at_unique * frame..(at_unique + 1) * frame]);
    }
    Ok(data)
}
