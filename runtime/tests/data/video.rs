//! Videos given as frame lists, against verl's preparation (qwen_vl_utils' `fetch_video` on
//! the frames, then transformers' `Qwen2VLVideoProcessor`; tests/oracle/video_oracle.py): an
//! odd frame count padded with the last frame, frames scaled down and up, to the same patch
//! grid, seconds per temporal patch and pixel values.
use verlc_runtime::data::image::{ImageProcessorConfig, decode_png};
use verlc_runtime::data::video::{VideoOptions, VideoProcessor, VideoSource, process_video};

use crate::oracle;

#[test]
fn frame_list_videos_are_prepared_as_verl_prepares_them() {
    let dir = oracle::cached_with(&oracle::script_named("video_oracle.py"), "videos", &[]);
    let cases = oracle::json(&dir.join("videos.json"));
    let cases = cases.as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    let want = oracle::read(&dir.join("videos.safetensors"));
    let cfg = ImageProcessorConfig::default();
    for case in cases {
        let name = case["case"].as_str().expect("case");
        let frames: Vec<_> = case["frames"]
            .as_array()
            .expect("frames")
            .iter()
            .map(|f| {
                let bytes = std::fs::read(dir.join(f.as_str().expect("file"))).expect("png");
                decode_png(&bytes).expect("frame")
            })
            .collect();
        let got = process_video(
            &VideoSource::Frames(frames),
            &VideoOptions::default(),
            14,
            &cfg,
            VideoProcessor::Qwen2Vl,
        )
        .expect(name);
        let grid: Vec<i64> = serde_json::from_value(case["grid_thw"].clone()).expect("grid");
        assert_eq!(got.video.grid_thw.to_vec(), grid, "{name}");
        assert_eq!(
            got.video.seconds_per_grid,
            case["seconds_per_grid"].as_f64(),
            "{name}"
        );
        let want = Vec::<f32>::try_from(
            oracle::get(&want, &format!("{name}.pixel_values")).flatten(0, -1),
        )
        .expect("pixels");
        let worst = worst_difference(&got.video.pixel_values, &want, name);
        // The same 8-bit frames; the normalisation's float steps are transformers' own.
        assert!(
            worst <= 1e-6,
            "{name}: pixel values differ by up to {worst}"
        );
    }
}

/// Rows with videos as verl's dataset prepares them for Qwen3-VL (the oracle's `qwen3`:
/// qwen_vl_utils' fetch at 16-pixel patches with the video's metadata, then transformers'
/// `Qwen3VLProcessor` without frame sampling): the video processor bounds the whole video (the
/// class's size binds on a long video, the released checkpoints' does not), and the prompt
/// holds each temporal patch apart behind its timestamp (`<0.2 seconds>`); to the same token
/// ids, grids and pixel values.
#[test]
fn qwen3_vl_video_rows_become_prompts_as_in_verl() {
    use serde_json::Map;
    use verlc_runtime::data::vision_prompt::row_prompt;
    let Qwen3Oracle {
        dir,
        tok,
        rows,
        want,
        cfg,
    } = qwen3_oracle("qwen3", 4);
    let mut bound = false;
    for row in &rows {
        let name = row["row"].as_str().expect("row");
        let size: [usize; 2] = serde_json::from_value(row["size"].clone()).expect("size");
        let video = VideoProcessor::Qwen3Vl {
            min_pixels: size[0],
            max_pixels: size[1],
        };
        let mut map = Map::new();
        map.insert("prompt".into(), row["prompt"].clone());
        // Each video as verl's rows hold one: `{"video": [frame paths]}`.
        let videos: Vec<serde_json::Value> = row["videos"]
            .as_array()
            .expect("videos")
            .iter()
            .map(|files| {
                let frames: Vec<String> = files
                    .as_array()
                    .expect("frames")
                    .iter()
                    .map(|f| dir.join(f.as_str().expect("file")).display().to_string())
                    .collect();
                serde_json::json!({ "video": frames })
            })
            .collect();
        map.insert("videos".into(), videos.into());
        let prompt = |video| {
            row_prompt(
                &map,
                ("prompt", "images"),
                &tok,
                (&cfg, video, 16),
                &Map::new(),
            )
        };
        let got = prompt(video).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_row_matches(row, &got, &want);
        assert!(got.images.iter().all(|v| v.seconds_per_grid.is_some()));
        // The long video is scaled down by the budget of all its frames together.
        if name == "long" {
            let unbounded = VideoProcessor::Qwen3Vl {
                min_pixels: size[0],
                max_pixels: usize::MAX / 2,
            };
            let loose = prompt(unbounded).expect("unbounded");
            assert_ne!(
                loose.images[0].grid_thw, got.images[0].grid_thw,
                "the budget binds"
            );
            bound = true;
        }
    }
    assert!(bound, "the long row was checked");
}

/// A Qwen3-VL video oracle's output (video_oracle.py `qwen3` or `files`): its directory, the
/// tokenizer it saved, its rows and tensors, and the image processor both commands use
/// (16-pixel patches, mean and std 0.5).
struct Qwen3Oracle {
    dir: std::path::PathBuf,
    tok: verlc_runtime::tokenizer::Tokenizer,
    rows: Vec<serde_json::Value>,
    want: std::collections::HashMap<String, tch::Tensor>,
    cfg: ImageProcessorConfig,
}

fn qwen3_oracle(command: &str, rows: usize) -> Qwen3Oracle {
    let model_oracle = oracle::script_named("model_oracle.py");
    let dir = oracle::cached_with(
        &oracle::script_named("video_oracle.py"),
        command,
        &[model_oracle.as_path()],
    );
    let tok = verlc_runtime::tokenizer::Tokenizer::from_dir(&dir.join("tok")).expect("tokenizer");
    let listed = oracle::json(&dir.join(format!("{command}.json")));
    let listed = listed.as_array().expect("rows").clone();
    assert_eq!(listed.len(), rows, "{command}");
    let want = oracle::read(&dir.join(format!("{command}.safetensors")));
    let cfg = ImageProcessorConfig {
        patch_size: 16,
        image_mean: [0.5; 3],
        image_std: [0.5; 3],
        ..ImageProcessorConfig::default()
    };
    Qwen3Oracle {
        dir,
        tok,
        rows: listed,
        want,
        cfg,
    }
}

/// `got` (the oracle's `row` built by verlc) has the row's input ids, video grids and pixel
/// values (within 1e-5: the same 8-bit frames, the normalisation's float steps).
fn assert_row_matches(
    row: &serde_json::Value,
    got: &verlc_runtime::data::vision_prompt::RowPrompt,
    want: &std::collections::HashMap<String, tch::Tensor>,
) {
    let name = row["row"].as_str().expect("row");
    let ids: Vec<i64> = serde_json::from_value(row["input_ids"].clone()).expect("ids");
    assert_eq!(got.ids, ids, "{name}");
    let grids: Vec<[i64; 3]> =
        serde_json::from_value(row["video_grid_thw"].clone()).expect("grids");
    assert_eq!(
        got.images.iter().map(|v| v.grid_thw).collect::<Vec<_>>(),
        grids,
        "{name}"
    );
    let want = Vec::<f32>::try_from(
        oracle::get(want, &format!("{name}.pixel_values_videos")).flatten(0, -1),
    )
    .expect("pixels");
    let got: Vec<f32> = got
        .images
        .iter()
        .flat_map(|v| v.pixel_values.iter().copied())
        .collect();
    let worst = worst_difference(&got, &want, name);
    assert!(
        worst <= 1e-5,
        "{name}: pixel values differ by up to {worst}"
    );
}

/// Rows whose videos are files (tests/oracle/video_oracle.py `files`: FFmpeg-made H.264, VP9
/// and Motion JPEG files read by qwen_vl_utils with torchcodec, then `Qwen3VLProcessor` with
/// their metadata): a bare path, a `file://` URL sampled at 4 fps, a fixed frame count, a time
/// range, a whole-video pixel budget, files turned a quarter and a half turn by their display
/// matrix; to the same sampled frames, token ids (the timestamps from
/// the frames' times in the file), grids and pixel values, and the length verl's dataset
/// measures for `filter_overlong_prompts` (its fetch on 14-pixel patches).
#[test]
fn video_files_become_prompts_as_in_verl() {
    use serde_json::{Map, Value};
    use verlc_runtime::data::video_file::read_video_file;
    use verlc_runtime::data::vision_prompt::row_prompt;
    let Qwen3Oracle {
        dir,
        tok,
        rows,
        want,
        cfg,
    } = qwen3_oracle("files", 5);
    let prompt = |prompt: &Value, videos: Value| {
        let mut map = Map::new();
        map.insert("prompt".into(), prompt.clone());
        map.insert("videos".into(), videos);
        // Measured as verl's dataset measures, fetching on `data.image_patch_size` (14).
        row_prompt(
            &map,
            ("prompt", "images"),
            &tok,
            (&cfg, VideoProcessor::QWEN3_VL_DEFAULT, 14),
            &Map::new(),
        )
    };
    let mut measured_apart = false;
    // The oracle's cells name their files within its directory.
    let placed = |name: &str| match name.strip_prefix("file://") {
        Some(rest) => format!("file://{}", dir.join(rest).display()),
        None => dir.join(name).display().to_string(),
    };
    for row in &rows {
        let name = row["row"].as_str().expect("row");
        let cells: Vec<Value> = row["videos"]
            .as_array()
            .expect("videos")
            .iter()
            .map(|cell| match cell {
                Value::String(p) => Value::String(placed(p)),
                Value::Object(f) => {
                    let mut f = f.clone();
                    let file = placed(f["video"].as_str().expect("path"));
                    f.insert("video".into(), file.into());
                    Value::Object(f)
                }
                other => panic!("{name}: a cell {other}"),
            })
            .collect();
        // The frames sampled from each file are qwen_vl_utils', the frame rate torchcodec's
        // (VP9's from its frames' times, not its header's 15).
        let rates = row["fps"].as_array().expect("fps");
        for ((cell, want), fps) in cells
            .iter()
            .zip(row["indices"].as_array().expect("indices"))
            .zip(rates)
        {
            let (path, fields) = match cell {
                Value::String(p) => (p.as_str(), Map::new()),
                Value::Object(f) => (f["video"].as_str().expect("path"), f.clone()),
                other => panic!("{name}: a cell {other}"),
            };
            let path = path.strip_prefix("file://").unwrap_or(path);
            let opts = VideoOptions::of_cell(&fields, true).expect("options");
            let video = read_video_file(path.as_ref(), &opts.sampling).expect(name);
            let want: Vec<i64> = serde_json::from_value(want.clone()).expect("indices");
            assert_eq!(video.indices, want, "{name}: {path}");
            assert_eq!(Some(video.average_fps), fps.as_f64(), "{name}: {path}");
        }
        let got = prompt(&row["prompt"], cells.into()).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_row_matches(row, &got, &want);
        assert_eq!(
            Some(got.measured_len as u64),
            row["measured_len"].as_u64(),
            "{name}: the length verl's dataset measures"
        );
        measured_apart |= got.measured_len != got.ids.len();
    }
    assert!(measured_apart, "a row whose measure differs from its ids");
    // Bad cells are refused, naming what is wrong (and the file where one is named).
    let ntsc = dir.join("ntsc.mp4").display().to_string();
    let missing = dir.join("missing.mp4").display().to_string();
    let text_file = dir.join("files.json").display().to_string();
    let user = &rows[0]["prompt"];
    let cases = [
        (serde_json::json!([missing]), vec![missing.as_str()]),
        (
            serde_json::json!([text_file]),
            vec![text_file.as_str(), "no video stream"],
        ),
        (
            serde_json::json!([{"video": ntsc, "fps": 2, "nframes": 4}]),
            vec!["exclude each other"],
        ),
        (
            serde_json::json!([{"video": ntsc, "resized_height": 64}]),
            vec!["`resized_height`", "`video_start`"],
        ),
        (
            serde_json::json!([{"video": ntsc, "video_start": 1.0, "video_end": 1.02}]),
            vec![ntsc.as_str(), "fewer than two"],
        ),
        (
            serde_json::json!([{"video": ["a.png"], "fps": 2}]),
            vec!["`fps`", "a frame list"],
        ),
        (
            serde_json::json!(["https://example.com/v.mp4"]),
            vec!["local video files"],
        ),
    ];
    for (videos, needles) in cases {
        let err = prompt(user, videos.clone())
            .expect_err(&videos.to_string())
            .to_string();
        for needle in needles {
            assert!(err.contains(needle), "{videos}: {err}");
        }
    }
}

/// The largest difference between `got` and `want`, which must be as long.
fn worst_difference(got: &[f32], want: &[f32], name: &str) -> f32 {
    assert_eq!(got.len(), want.len(), "{name}");
    got.iter()
        .zip(want)
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

/// A Qwen3-style checkpoint's `video_preprocessor_config.json` sets its video processor's size
/// (the class defaults without one, Qwen2-VL's processor for Qwen2.5-VL); a run's export
/// carries the file; a size that is not a number of pixels is refused, naming the file.
#[test]
fn the_video_processor_size_is_read_from_the_checkpoint_and_exported() {
    use verlc_spec::families::VisionTower;
    let (src, out) = (
        oracle::scratch("video-size-src"),
        oracle::scratch("video-size-out"),
    );
    let file = "video_preprocessor_config.json";
    let of = |dir: &std::path::Path, tower| VideoProcessor::of_model(Some(tower), Some(dir));
    assert_eq!(
        of(&src, VisionTower::Qwen3Vl),
        Ok(VideoProcessor::QWEN3_VL_DEFAULT)
    );
    std::fs::write(
        src.join(file),
        r#"{"size": {"shortest_edge": 4096, "longest_edge": 25165824}}"#,
    )
    .expect("write");
    let released = VideoProcessor::Qwen3Vl {
        min_pixels: 4096,
        max_pixels: 25_165_824,
    };
    assert_eq!(of(&src, VisionTower::Qwen3_5), Ok(released));
    assert_eq!(
        of(&src, VisionTower::Qwen2_5Vl),
        Ok(VideoProcessor::Qwen2Vl)
    );
    ImageProcessorConfig::default()
        .save(&out, Some(&src))
        .expect("save");
    assert_eq!(of(&out, VisionTower::Qwen3Vl), Ok(released));
    std::fs::write(src.join(file), r#"{"size": {"longest_edge": "large"}}"#).expect("write");
    let err = of(&src, VisionTower::Qwen3Vl).expect_err("a bad size");
    assert!(
        err.contains(file) && err.contains("size.longest_edge"),
        "{err}"
    );
}
