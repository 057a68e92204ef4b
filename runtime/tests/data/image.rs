//! Images as verl prepares them for Qwen-VL models, against verl's own code (its
//! `process_image` with qwen_vl_utils' `fetch_image`, then transformers'
//! `Qwen2VLImageProcessor`; tests/oracle/vision_oracle.py): PNG files of several sizes and
//! modes (RGB, RGBA over white, grayscale, palette) under default and narrowed pixel bounds
//! (upscaled, downscaled once and twice), the same patch grid and the same pixel values; and
//! as Qwen3-VL's processor prepares them (16-pixel patches, its `preprocessor_config.json`
//! giving the pixel bounds as `size`).
use serde_json::Value;
use verlc_runtime::data::image::{ImageProcessorConfig, decode_png, process_image};
use verlc_runtime::data::video::VideoProcessor;

use crate::oracle;

#[test]
fn images_are_prepared_as_verl_prepares_them() {
    let dir = oracle::vision();
    let cases: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("images.json")).expect("json"))
            .expect("json");
    let cases = cases.as_array().expect("cases");
    assert_eq!(cases.len(), 24);
    let mut wrong = Vec::new();
    for case in cases {
        let file = case["file"].as_str().expect("file");
        let label = format!("{file} {}", case["case"].as_str().unwrap_or("?"));
        let bytes = std::fs::read(dir.join(file)).expect("png");
        let img = decode_png(&bytes).unwrap_or_else(|e| panic!("{label}: {e}"));
        let bounds = |k: &str| -> Option<(usize, usize)> {
            case[k].as_array().map(|b| {
                (
                    b[0].as_u64().unwrap_or(0) as usize,
                    b[1].as_u64().unwrap_or(0) as usize,
                )
            })
        };
        let mut cfg = match case.get("preprocessor") {
            Some(p) => ImageProcessorConfig::from_json(&p.to_string()).expect("preprocessor"),
            None => ImageProcessorConfig::default(),
        };
        if let Some((min, max)) = bounds("processor") {
            (cfg.min_pixels, cfg.max_pixels) = (min, max);
        }
        let fetch = bounds("fetch").map_or((None, None), |(min, max)| (Some(min), Some(max)));
        let got = process_image(&img, fetch, &cfg).unwrap_or_else(|e| panic!("{label}: {e}"));
        let grid: Vec<i64> = serde_json::from_value(case["grid_thw"].clone()).expect("grid");
        if got.grid_thw.to_vec() != grid {
            wrong.push(format!("{label}: grid {:?}, verl's {grid:?}", got.grid_thw));
            continue;
        }
        let want: Vec<f32> =
            serde_json::from_value(case["pixel_values"].clone()).expect("pixel values");
        assert_eq!(got.pixel_values.len(), want.len(), "{label}");
        let worst = got
            .pixel_values
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        // Same bytes after the resize; the float steps differ at most in their last bit.
        if worst > 1e-6 {
            wrong.push(format!("{label}: pixel values differ by up to {worst}"));
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// Vision prompts as verl 0.9.1 builds them (its dataset's `_build_messages`, qwen_vl_utils'
/// `fetch_image`, a Qwen2.5-VL processor with the test's tokenizer and chat template; the
/// oracle's `prompts`): one and two images in a turn, an image in a later turn of a
/// conversation, and a row without images, to the same token ids.
#[test]
fn vision_prompts_tokenize_as_verl_builds_them() {
    use verlc_runtime::data::vision_prompt::encode_vision_prompt;
    use verlc_runtime::tokenizer::{Message, Tokenizer};
    let dir = oracle::vision();
    let tok = Tokenizer::from_dir(&dir.join("tok")).expect("tokenizer");
    let rows: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("prompts.json")).expect("json"))
            .expect("json");
    let rows = rows.as_array().expect("rows");
    assert_eq!(rows.len(), 4);
    for (i, row) in rows.iter().enumerate() {
        let messages: Vec<Message> =
            serde_json::from_value(row["prompt"].clone()).expect("messages");
        let images: Vec<_> = row["images"]
            .as_array()
            .expect("images")
            .iter()
            .map(|f| {
                let bytes = std::fs::read(dir.join(f.as_str().expect("file"))).expect("png");
                let img = decode_png(&bytes).expect("decode");
                process_image(&img, (None, None), &ImageProcessorConfig::default())
                    .expect("process")
            })
            .collect();
        let ids = encode_vision_prompt(&tok, &messages, &images, 2, &Default::default())
            .unwrap_or_else(|e| panic!("row {i}: {e}"));
        let want: Vec<i64> = serde_json::from_value(row["input_ids"].clone()).expect("ids");
        assert_eq!(ids, want, "row {i}");
    }
}

/// Rows of a parquet file in verl's geo3k layout (a chat prompt with `<image>` placeholders,
/// `images` as `{bytes, path}` cells, one with its own pixel bound): the prompt ids and the
/// images' grids as verl 0.9.1 builds them.
#[test]
fn geo3k_rows_become_prompts_as_in_verl() {
    use verlc_runtime::data::vision_prompt::row_prompt;
    use verlc_runtime::tokenizer::Tokenizer;
    let dir = oracle::vision();
    let tok = Tokenizer::from_dir(&dir.join("tok")).expect("tokenizer");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("geo3k.json")).expect("json"))
            .expect("json");
    let rows =
        verlc_runtime::data::files::read_rows(&dir.join("geo3k.parquet").display().to_string())
            .expect("parquet");
    assert_eq!(rows.len(), 2);
    for (i, (row, want)) in rows.iter().zip(want.as_array().expect("rows")).enumerate() {
        let cfg = ImageProcessorConfig::default();
        let prompt = |measure_patch| {
            row_prompt(
                row,
                ("prompt", "images"),
                &tok,
                (&cfg, VideoProcessor::Qwen2Vl, measure_patch),
                &Default::default(),
            )
        };
        let p = prompt(14).unwrap_or_else(|e| panic!("row {i}: {e}"));
        let (ids, images) = (&p.ids, &p.images);
        assert_eq!(p.measured_len, ids.len(), "row {i}");
        // verl's dataset measures prompts for filter_overlong_prompts with images fetched at
        // data.image_patch_size; the rollout's prompt fetches at the processor's. A cell's own
        // max_pixels below fetch_image's minimum at that size is an error in both.
        match (prompt(16), want["measured_len_patch16"].as_u64()) {
            (Ok(q), Some(len)) => {
                assert_eq!(q.ids, p.ids, "row {i}");
                assert_eq!(q.measured_len as u64, len, "row {i}");
            }
            (Err(e), None) => assert!(e.to_string().contains("max_pixels"), "row {i}: {e}"),
            (q, len) => panic!(
                "row {i}: {:?} against verl's {len:?}",
                q.map(|q| q.measured_len)
            ),
        }
        let want_ids: Vec<i64> = serde_json::from_value(want["input_ids"].clone()).expect("ids");
        let want_grids: Vec<[i64; 3]> =
            serde_json::from_value(want["image_grid_thw"].clone()).expect("grids");
        assert_eq!(ids, &want_ids, "row {i}");
        let grids: Vec<[i64; 3]> = images.iter().map(|im| im.grid_thw).collect();
        assert_eq!(grids, want_grids, "row {i}");
    }
}

/// A geo3k row in a dataset: `filter_overlong_prompts` measures its prompt with its images
/// fetched at `data.image_patch_size` (verl's dataset), so a bound between the two measures
/// keeps a row under one patch size and drops it under the other; a run that trains on text
/// prompts only (a Qwen3.5 checkpoint beside a critic or under vLLM) refuses the rows with
/// images, naming why; and any run refuses a row with a video.
#[test]
fn geo3k_rows_are_measured_at_the_datasets_patch_size_and_refused_where_text_only() {
    use verlc_runtime::data::dataset::VisionData;
    use verlc_runtime::data::{DataError, DatasetOptions, RlDataset};
    use verlc_runtime::tokenizer::Tokenizer;
    let dir = oracle::vision();
    let tok = Tokenizer::from_dir(&dir.join("tok")).expect("tokenizer");
    let want: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("geo3k.json")).expect("json"))
            .expect("json");
    let row0 = &want[0];
    let (len14, len16) = (
        row0["input_ids"].as_array().expect("ids").len(),
        row0["measured_len_patch16"].as_u64().expect("measured") as usize,
    );
    assert_ne!(
        len14, len16,
        "the two patch sizes measure the first row differently"
    );
    let file = dir.join("geo3k.parquet").display().to_string();
    // Its first row, scored as `geo3k`.
    let rows = || {
        let mut row = verlc_runtime::data::files::read_rows(&file)
            .expect("parquet")
            .remove(0);
        row.insert("data_source".into(), "geo3k".into());
        vec![(file.clone(), 0, row)]
    };
    let opts = |measure_patch_size, text_only: Option<&str>| DatasetOptions {
        max_prompt_length: len14.max(len16) - 1,
        filter_overlong_prompts: true,
        truncation: verlc_runtime::data::Truncation::Left,
        shuffle: false,
        vision: Some(VisionData {
            image_key: "images".into(),
            processor: ImageProcessorConfig::default(),
            video: VideoProcessor::Qwen2Vl,
            measure_patch_size,
            model_dir: None,
            text_only: text_only.map(str::to_owned),
        }),
        ..DatasetOptions::default()
    };
    let kept = |patch| {
        RlDataset::from_rows(rows(), &tok, &opts(patch, None))
            .map(|d| d.items.iter().map(|i| i.row).collect::<Vec<_>>())
    };
    // The longer measure of row 0 is over the bound, the shorter one is not.
    let (long, short) = if len14 > len16 { (14, 16) } else { (16, 14) };
    let over = kept(long);
    assert!(matches!(over, Err(DataError::Empty(_))), "{over:?}");
    assert_eq!(kept(short).expect("rows"), vec![0]);
    let e = RlDataset::from_rows(
        rows(),
        &tok,
        &opts(14, Some("beside a critic it trains on text prompts only")),
    )
    .expect_err("rows with images refused");
    let msg = e.to_string();
    assert!(
        matches!(e, DataError::Row { .. } | DataError::Rows(_))
            && msg.contains("column `images` holds images")
            && msg.contains("text prompts only"),
        "{msg}"
    );
    // A row with a video (verl's `videos` column: frame lists) whose frame is not there is an
    // error naming the column, the video and the file.
    let mut with_video = rows();
    with_video[0]
        .2
        .insert("videos".into(), serde_json::json!([["frame.png"]]));
    let e = RlDataset::from_rows(with_video.clone(), &tok, &opts(14, None))
        .expect_err("a missing frame");
    assert!(
        e.to_string().contains("column `videos`, video 0") && e.to_string().contains("frame.png"),
        "{e}"
    );
    // Where the run takes text prompts only, the video column is named.
    let e = RlDataset::from_rows(
        with_video,
        &tok,
        &opts(14, Some("beside a critic it trains on text prompts only")),
    )
    .expect_err("videos refused");
    assert!(
        e.to_string().contains("column `videos` holds videos")
            && e.to_string().contains("text prompts only"),
        "{e}"
    );
}
