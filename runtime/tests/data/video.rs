//! Videos given as frame lists, against verl's preparation (qwen_vl_utils' `fetch_video` on
//! the frames, then transformers' `Qwen2VLVideoProcessor`; tests/oracle/video_oracle.py): an
//! odd frame count padded with the last frame, frames scaled down and up, to the same patch
//! grid, seconds per temporal patch and pixel values.
use verlc_runtime::data::image::{ImageProcessorConfig, decode_png};
use verlc_runtime::data::video::process_video_frames;

use crate::oracle;

#[test]
fn frame_list_videos_are_prepared_as_verl_prepares_them() {
    let dir = oracle::cached_with(&oracle::script_named("video_oracle.py"), "videos", &[]);
    let cases = oracle::json(&dir.join("videos.json"));
    let cases = cases.as_array().expect("cases");
    assert_eq!(cases.len(), 3);
    let want = oracle::read(&dir.join("videos.safetensors"));
    let cfg = ImageProcessorConfig::default();
    // Qwen2VLVideoProcessor's `size`: 128 to 768 merged 28-pixel patches a frame.
    let bounds = (128 * 28 * 28, 768 * 28 * 28);
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
        let got = process_video_frames(&frames, 14, &cfg, bounds).expect(name);
        let grid: Vec<i64> = serde_json::from_value(case["grid_thw"].clone()).expect("grid");
        assert_eq!(got.video.grid_thw.to_vec(), grid, "{name}");
        assert_eq!(
            got.seconds_per_grid,
            case["seconds_per_grid"].as_f64().unwrap(),
            "{name}"
        );
        let want = Vec::<f32>::try_from(
            oracle::get(&want, &format!("{name}.pixel_values")).flatten(0, -1),
        )
        .expect("pixels");
        assert_eq!(got.video.pixel_values.len(), want.len(), "{name}");
        let worst = got
            .video
            .pixel_values
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // The same 8-bit frames; the normalisation's float steps are transformers' own.
        assert!(
            worst <= 1e-6,
            "{name}: pixel values differ by up to {worst}"
        );
    }
}
