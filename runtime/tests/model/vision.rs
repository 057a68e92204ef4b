//! Qwen2.5-VL's vision tower against transformers' (`Qwen2_5_VisionTransformerPretrainedModel`,
//! run by tests/oracle/vision_oracle.py on a seeded tiny tower): the merged-patch embeddings of
//! two images of different grids (one with a partial attention window) and a two-frame video,
//! through windowed and full-attention blocks, and the gradient with respect to the pixels.
use std::collections::HashMap;
use std::path::PathBuf;

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::vision::qwen2_5_vl::{VisionConfig, VisionTower};

use crate::oracle;

fn oracle_dir() -> PathBuf {
    oracle::vision()
}

fn max_diff(a: &Tensor, b: &Tensor) -> f64 {
    (a.to_kind(Kind::Double) - b.to_kind(Kind::Double))
        .abs()
        .max()
        .double_value(&[])
}

#[test]
fn qwen2_5_vl_vision_tower_matches_transformers() {
    tch::set_num_threads(1);
    let dir = oracle_dir();
    let cfg: VisionConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("vision_config");
    let tensors: HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("qwen2_5_vl.safetensors"))
            .expect("oracle tensors")
            .into_iter()
            .collect();
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let tower = VisionTower::new(&(vs.root() / "visual"), &cfg).expect("tower");
    // Every weight of the checkpoint is a parameter of the tower, and the other way round.
    let vars = vs.variables();
    let weights: Vec<&String> = tensors
        .keys()
        .filter(|k| k.starts_with("visual."))
        .collect();
    assert_eq!(
        vars.len(),
        weights.len(),
        "{:?}",
        vars.keys().collect::<Vec<_>>()
    );
    tch::no_grad(|| {
        for (name, mut var) in vars {
            let w = tensors
                .get(&name)
                .unwrap_or_else(|| panic!("no {name} in the checkpoint"));
            assert_eq!(var.size(), w.size(), "{name}");
            var.copy_(w);
        }
    });
    let grid: Vec<Vec<i64>> = Vec::try_from(&tensors["input.grid_thw"]).expect("grid");
    let grid: Vec<[i64; 3]> = grid.iter().map(|g| [g[0], g[1], g[2]]).collect();
    let pixels = tensors["input.pixel_values"].copy().set_requires_grad(true);
    let embeds = tower.forward(&pixels, &grid).expect("forward");
    let want = &tensors["output.embeds"];
    assert_eq!(embeds.size(), want.size());
    let d = max_diff(&embeds, want);
    assert!(d < 1e-4, "embeddings differ from transformers' by {d}");
    embeds.square().sum(Kind::Float).backward();
    let g = max_diff(&pixels.grad(), &tensors["output.grad_pixel_values"]);
    let scale = tensors["output.grad_pixel_values"]
        .abs()
        .max()
        .double_value(&[]);
    assert!(
        g < 1e-4 * scale.max(1.0),
        "pixel gradients differ by {g} (scale {scale})"
    );
}

/// A grid that does not split into merge blocks, and pixels of the wrong shape, are errors.
#[test]
fn vision_inputs_of_the_wrong_shape_are_refused() {
    let dir = oracle_dir();
    let cfg: VisionConfig =
        serde_json::from_str(&std::fs::read_to_string(dir.join("config.json")).expect("config"))
            .expect("vision_config");
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let tower = VisionTower::new(&(vs.root() / "visual"), &cfg).expect("tower");
    let width = cfg.patch_width();
    let odd = tower.forward(
        &Tensor::zeros([15, width], (Kind::Float, Device::Cpu)),
        &[[1, 3, 5]],
    );
    assert!(matches!(
        odd,
        Err(verlc_runtime::model::vision::qwen2_5_vl::VisionError::Grid { .. })
    ));
    let short = tower.forward(
        &Tensor::zeros([8, width], (Kind::Float, Device::Cpu)),
        &[[1, 4, 4]],
    );
    assert!(matches!(
        short,
        Err(verlc_runtime::model::vision::qwen2_5_vl::VisionError::Shape { .. })
    ));
}

/// M-RoPE position ids against verl 0.9.1's own `get_rope_index` (run by the oracle on rows of
/// text only, one and two images, an image among videos with fractional seconds per temporal
/// patch, a video without them; each unpadded and left-padded).
#[test]
fn mrope_position_ids_match_verls_get_rope_index() {
    use verlc_runtime::model::vision::mrope::{MropeTokens, VideoGrid, batch_position_ids};
    let dir = oracle_dir();
    let j: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("mrope.json")).expect("json"))
            .expect("json");
    let id = |k: &str| j["tokens"][k].as_i64().expect("token id");
    let tokens = MropeTokens {
        image_token_id: id("image"),
        video_token_id: id("video"),
        vision_start_token_id: id("vision_start"),
        spatial_merge_size: 2,
        tokens_per_second: 2.0,
        timestamped_videos: false,
    };
    let cases = j["cases"].as_array().expect("cases");
    assert_eq!(cases.len(), 10);
    for case in cases {
        let name = case["name"].as_str().unwrap_or("?");
        let v = |k: &str| -> Vec<i64> { serde_json::from_value(case[k].clone()).expect(k) };
        let grids =
            |k: &str| -> Vec<[i64; 3]> { serde_json::from_value(case[k].clone()).expect(k) };
        let seconds: Vec<f64> = case["seconds"]
            .as_array()
            .map(|s| s.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_default();
        let videos: Vec<VideoGrid> = grids("videos")
            .into_iter()
            .enumerate()
            .map(|(i, thw)| VideoGrid {
                thw,
                seconds_per_grid: seconds.get(i).copied().unwrap_or(1.0),
            })
            .collect();
        let (ids, _) = batch_position_ids(
            &[v("tokens")],
            &[v("mask")],
            &grids("images"),
            &videos,
            &tokens,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want: Vec<Vec<i64>> =
            serde_json::from_value(case["position_ids"].clone()).expect("ids");
        for axis in 0..3 {
            assert_eq!(ids[axis], want[axis], "{name}: axis {axis}");
        }
    }
}

/// Qwen2.5-VL as a whole against transformers' `Qwen2_5_VLForConditionalGeneration` (a seeded
/// tiny model from tests/oracle/vision_oracle.py): two rows, one left-padded, each with an
/// image in its placeholders; the logits at every real position, positions from the rows'
/// M-RoPE ids; greedy generation with the KV cache gives transformers' tokens; the checkpoint
/// transformers saves loads to the same model; every parameter's
/// gradient of the real tokens' log-likelihood equals transformers'.
/// The oracle's Qwen2.5-VL as its checkpoint's config.json describes it (transformers' nested
/// `text_config`), with the oracle's weights, and the oracle's tensors.
fn oracle_model() -> (
    tch::nn::VarStore,
    verlc_runtime::model::CausalLm,
    HashMap<String, Tensor>,
) {
    oracle_model_in(&oracle_dir(), "qwen2_5_vl_model.safetensors")
}

/// [`oracle_model`] of the oracle run that wrote `dir` (its checkpoint) and `tensors` in it.
fn oracle_model_in(
    dir: &std::path::Path,
    tensors: &str,
) -> (
    tch::nn::VarStore,
    verlc_runtime::model::CausalLm,
    HashMap<String, Tensor>,
) {
    let (vs, model, tensors) = oracle_in(dir, tensors, verlc_runtime::model::CausalLm::new);
    assert!(model.vision.is_some(), "a vision tower");
    (vs, model, tensors)
}

/// A model `build` makes of the oracle checkpoint's config in `dir`, every variable set from
/// the oracle's `tensors` file (which holds the checkpoint's weights under their names), and
/// those tensors.
fn oracle_in<M>(
    dir: &std::path::Path,
    tensors: &str,
    build: impl FnOnce(&verlc_runtime::model::ModelConfig, tch::nn::Path) -> Result<M, String>,
) -> (tch::nn::VarStore, M, HashMap<String, Tensor>) {
    use verlc_runtime::model::ModelConfig;
    let cfg = ModelConfig::from_file(&dir.join("checkpoint").join("config.json")).expect("config");
    let tensors: HashMap<String, Tensor> = Tensor::read_safetensors(dir.join(tensors))
        .expect("oracle tensors")
        .into_iter()
        .collect();
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let model = build(&cfg, vs.root()).expect("model");
    tch::no_grad(|| {
        for (name, mut var) in vs.variables() {
            let w = tensors
                .get(&name)
                .unwrap_or_else(|| panic!("no {name} in the oracle"));
            var.copy_(w);
        }
    });
    (vs, model, tensors)
}

/// The oracle's rows as the RL pipeline holds them: each row's real prompt tokens and its
/// image (one per row, in order).
pub(crate) fn oracle_rows(
    tensors: &HashMap<String, Tensor>,
) -> (Vec<Vec<i64>>, Vec<verlc_runtime::engine::batch::RowImages>) {
    use verlc_runtime::model::vision::ProcessedImage;
    let ids: Vec<Vec<i64>> = Vec::try_from(&tensors["input.input_ids"]).expect("ids");
    let mask: Vec<Vec<i64>> = Vec::try_from(&tensors["input.attention_mask"]).expect("mask");
    let prompts = ids
        .iter()
        .zip(&mask)
        .map(|(r, m)| {
            r.iter()
                .zip(m)
                .filter(|(_, m)| **m == 1)
                .map(|(t, _)| *t)
                .collect()
        })
        .collect();
    let grids: Vec<Vec<i64>> = Vec::try_from(&tensors["input.image_grid_thw"]).expect("grid");
    let pixels = &tensors["input.pixel_values"];
    let mut start = 0;
    let images = grids
        .iter()
        .map(|g| {
            let n = g[0] * g[1] * g[2];
            let rows = pixels.narrow(0, start, n).contiguous().view([-1]);
            start += n;
            let image = ProcessedImage {
                pixel_values: Vec::try_from(&rows).expect("pixels"),
                grid_thw: [g[0], g[1], g[2]],
                seconds_per_grid: None,
                timestamps: Vec::new(),
            };
            std::sync::Arc::from(vec![image])
        })
        .collect();
    (prompts, images)
}

/// The oracle runs of each vision-language family: the directory and the tensors file.
fn oracle_models() -> [(PathBuf, &'static str); 3] {
    [
        (oracle_dir(), "qwen2_5_vl_model.safetensors"),
        (oracle_dir().join("qwen3_vl"), "model.safetensors"),
        (oracle_dir().join("qwen3_vl_moe"), "model.safetensors"),
    ]
}

/// The rollout engine on Qwen2.5-VL and Qwen3-VL (prompts with images, prefilled with the
/// tower's embeddings (and Qwen3-VL's DeepStack features) at M-RoPE positions, decoded with
/// the KV cache at text positions) generates transformers' greedy tokens; the batch's
/// positions are `(N, P + R, 3)`, responses one past the prompt on every axis.
#[test]
fn vision_language_rollout_generates_transformers_tokens() {
    use verlc_runtime::rollout::{PromptStream, SamplingParams, StopTokens, generate_images};
    tch::set_num_threads(1);
    for (dir, file) in oracle_models() {
        rollout_generates_transformers_tokens(&dir, file);
    }
    // A text-only model refuses prompts with images.
    let (_vs, _model, tensors) = oracle_model();
    let (_, images) = oracle_rows(&tensors);
    let params = SamplingParams {
        do_sample: false,
        n: 1,
        max_new_tokens: 2,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: Vec::new(),
        pad: 0,
    };
    let streams = PromptStream::consecutive(0, 0, 2);
    let text_cfg = verlc_runtime::model::builtin::config(
        &verlc_runtime::builtin_uri::BuiltinUri::parse("builtin://tiny")
            .expect("uri")
            .expect("builtin"),
    )
    .expect("tiny");
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let text = verlc_runtime::model::CausalLm::new(&text_cfg, vs.root()).expect("text model");
    let short: Vec<Vec<i64>> = vec![vec![5, 6], vec![7]];
    let err = generate_images(&text, &short, &images, &streams, &params, &stop, None)
        .expect_err("text model with images");
    assert!(err.to_string().contains("vision-language"), "{err}");
}

fn rollout_generates_transformers_tokens(dir: &std::path::Path, file: &str) {
    use verlc_runtime::rollout::{
        GenerateInput, PromptStream, SamplingParams, StopTokens, generate_images,
        generate_interruptible,
    };
    let (vs, model, tensors) = oracle_model_in(dir, file);
    let (prompts, images) = oracle_rows(&tensors);
    let want: Vec<Vec<i64>> = Vec::try_from(&tensors["output.generated"]).expect("generated");
    let params = SamplingParams {
        do_sample: false,
        n: 1,
        max_new_tokens: want[0].len(),
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: Vec::new(),
        pad: 0,
    };
    let streams = PromptStream::consecutive(0, 0, prompts.len());
    let out = generate_images(&model, &prompts, &images, &streams, &params, &stop, None)
        .expect("generate");
    let got: Vec<Vec<i64>> = Vec::try_from(&out.responses).expect("responses");
    assert_eq!(got, want, "greedy tokens");
    // A weight sync in the middle of the batch (partial rollout) with the same weights: the
    // rows are prefilled again with their images, prompt and response so far, and go on to
    // the same tokens.
    let mut polls = 0;
    let mut swap = || {
        polls += 1;
        if polls != 2 {
            return Ok(None);
        }
        tch::no_grad(|| {
            for (_, var) in vs.variables() {
                let copy = var.detach_copy();
                var.shallow_clone().set_data(&copy);
            }
        });
        Ok(Some(1))
    };
    let input = GenerateInput {
        prompts: &prompts,
        images: &images,
        streams: &streams,
        prompt_width: None,
    };
    let resumed =
        generate_interruptible(&model, input, &params, &stop, &mut swap).expect("generate");
    let again: Vec<Vec<i64>> = Vec::try_from(&resumed.responses).expect("responses");
    assert_eq!(again, want, "greedy tokens after a weight sync at token 1");
    assert!(resumed.versions.iter().all(|v| v.last == Some(1)));
    assert!(max_diff(&resumed.rollout_log_probs, &out.rollout_log_probs) < 1e-4);
    let pos = &out.position_ids;
    assert_eq!(pos.size(), [2, out.input_ids.size()[1], 3]);
    let p = out.prompts.size()[1];
    let last = pos.narrow(1, p - 1, 1);
    let first = pos.narrow(1, p, 1);
    assert_eq!(
        max_diff(&(first - 1), &last),
        0.0,
        "responses continue the prompt"
    );
}

/// The engines' forward of a Qwen2.5-VL and a Qwen3-VL batch (its rows' images carried by the
/// batch, M-RoPE positions `(B, T, 3)`) gives transformers' log-probs of the last tokens,
/// padded and packed (`use_remove_padding`), and the gradient reaches the vision tower.
#[test]
fn vision_language_engine_log_probs_match_transformers() {
    tch::set_num_threads(1);
    for (dir, file) in oracle_models() {
        engine_log_probs_match_transformers(&dir, file);
    }
}

/// The oracle's batch as the engines take it: its rows with their images at their multimodal
/// positions, the last `r` tokens of each as the response.
fn oracle_batch(
    tensors: &HashMap<String, Tensor>,
    tokens: &verlc_runtime::model::vision::MropeTokens,
    r: i64,
) -> verlc_runtime::engine::Batch {
    let (_, images) = oracle_rows(tensors);
    let ids = &tensors["input.input_ids"];
    let mask = &tensors["input.attention_mask"];
    let grids: Vec<[i64; 3]> = images
        .iter()
        .flat_map(|i| i.iter())
        .map(|i| i.grid_thw)
        .collect();
    let (pos, _) = tokens.positions(ids, mask, &grids).expect("positions");
    let t = ids.size()[1];
    let mut batch = verlc_runtime::engine::Batch::new()
        .with("input_ids", ids.shallow_clone())
        .and_then(|b| b.with("attention_mask", mask.shallow_clone()))
        .and_then(|b| b.with("position_ids", pos))
        .and_then(|b| b.with("responses", ids.narrow(1, t - r, r)))
        .expect("batch");
    batch.set_images(images).expect("images");
    batch
}

fn engine_log_probs_match_transformers(dir: &std::path::Path, file: &str) {
    use verlc_runtime::engine::{ForwardOptions, Head};
    let (vs, model, tensors) = oracle_model_in(dir, file);
    let ids = &tensors["input.input_ids"];
    let t = ids.size()[1];
    let r = 3;
    let batch = oracle_batch(&tensors, &model.vision.as_ref().expect("vision").tokens, r);
    let want = tensors["output.logits"]
        .narrow(1, t - r - 1, r)
        .log_softmax(-1, Kind::Float)
        .gather(-1, &ids.narrow(1, t - r, r).unsqueeze(-1), false)
        .squeeze_dim(-1);
    let opts = ForwardOptions::default();
    let padded = Head::forward(&model, &batch, &opts).expect("padded forward");
    let d = max_diff(&padded.log_probs, &want);
    assert!(
        d < 1e-4,
        "padded log-probs differ from transformers' by {d}"
    );
    let packed = model.forward_packed(&batch, &opts).expect("packed forward");
    let d = max_diff(&packed.log_probs, &want);
    assert!(
        d < 1e-4,
        "packed log-probs differ from transformers' by {d}"
    );
    // Rows narrowed or selected keep their own images.
    let second = batch.select(&[1]).expect("select");
    let one = Head::forward(&model, &second, &opts).expect("row 1");
    let d = max_diff(&one.log_probs, &want.narrow(0, 1, 1));
    assert!(d < 1e-4, "a selected row's log-probs differ by {d}");
    packed.log_probs.sum(Kind::Float).backward();
    let tower_grad: f64 = vs
        .variables()
        .iter()
        .filter(|(n, _)| n.starts_with("visual."))
        .map(|(_, v)| v.grad().abs().sum(Kind::Double).double_value(&[]))
        .sum();
    assert!(tower_grad > 0.0, "no gradient reached the vision tower");
}

#[test]
fn qwen2_5_vl_logits_match_transformers() {
    tch::set_num_threads(1);
    matches_the_oracle_model(&oracle_dir(), "qwen2_5_vl_model.safetensors");
}

/// The same against transformers 5's Qwen2.5-VL, whose saved checkpoint keeps its rotary
/// settings in `rope_parameters`.
#[test]
fn qwen2_5_vl_logits_match_transformers_5() {
    tch::set_num_threads(1);
    let dir = oracle::vision_transformers5();
    let saved = std::fs::read_to_string(dir.join("checkpoint/config.json")).expect("config");
    assert!(
        saved.contains("rope_parameters"),
        "a transformers 5 checkpoint"
    );
    matches_the_oracle_model(&dir, "qwen2_5_vl_model.safetensors");
}

/// Logits, greedy tokens, the saved checkpoint and every gradient against the oracle run in
/// `dir`.
fn matches_the_oracle_model(dir: &std::path::Path, file: &str) {
    use verlc_runtime::model::{Dtype, from_pretrained};
    let (vs, model, tensors) = oracle_model_in(dir, file);
    let grid: Vec<Vec<i64>> = Vec::try_from(&tensors["input.image_grid_thw"]).expect("grid");
    let grid: Vec<[i64; 3]> = grid.iter().map(|g| [g[0], g[1], g[2]]).collect();
    let mask = &tensors["input.attention_mask"];
    let logits = tch::no_grad(|| {
        model.forward_pixels(
            &tensors["input.input_ids"],
            mask,
            &tensors["input.pixel_values"],
            &grid,
        )
    })
    .expect("forward");
    let real = mask.unsqueeze(-1).to_kind(Kind::Float);
    let d = max_diff(&(&logits * &real), &(&tensors["output.logits"] * &real));
    assert!(d < 1e-4, "logits differ from transformers' by {d}");
    // The same model read from the checkpoint transformers saved (config.json, weights).
    let saved = from_pretrained(
        dir.join("checkpoint").to_str().expect("utf-8 path"),
        Device::Cpu,
        Dtype::Fp32,
        0,
    )
    .expect("checkpoint");
    assert!(
        saved.report.missing.is_empty(),
        "{:?}",
        saved.report.missing
    );
    let again = tch::no_grad(|| {
        saved.model.forward_pixels(
            &tensors["input.input_ids"],
            mask,
            &tensors["input.pixel_values"],
            &grid,
        )
    })
    .expect("forward");
    assert_eq!(max_diff(&(again * &real), &(logits * &real)), 0.0);
    // Greedy generation with the KV cache: the same tokens as transformers' generate.
    let generated = tch::no_grad(|| {
        model.generate_greedy_pixels(
            &tensors["input.input_ids"],
            mask,
            &tensors["input.pixel_values"],
            &grid,
            6,
        )
    })
    .expect("generate");
    let want: Vec<Vec<i64>> = Vec::try_from(&tensors["output.generated"]).expect("generated");
    let got: Vec<Vec<i64>> = Vec::try_from(&generated).expect("generated");
    assert_eq!(got, want, "greedy tokens");
    // Training: the gradient of the real tokens' next-token log-likelihood reaches every
    // parameter, vision tower included, as in transformers.
    let logits = model
        .forward_pixels(
            &tensors["input.input_ids"],
            mask,
            &tensors["input.pixel_values"],
            &grid,
        )
        .expect("forward");
    let ids = &tensors["input.input_ids"];
    let t = ids.size()[1];
    let logp = logits
        .narrow(1, 0, t - 1)
        .log_softmax(-1, Kind::Float)
        .gather(-1, &ids.narrow(1, 1, t - 1).unsqueeze(-1), false)
        .squeeze_dim(-1);
    let weight = (mask.narrow(1, 0, t - 1) * mask.narrow(1, 1, t - 1)).to_kind(Kind::Float);
    let loglik = (logp * weight).sum(Kind::Float);
    let want = tensors["output.loglik"].double_value(&[0]);
    assert!(
        (loglik.double_value(&[]) - want).abs() < 1e-3,
        "log-likelihood {} vs {want}",
        loglik.double_value(&[])
    );
    loglik.backward();
    let checked = assert_gradients(&vs, &tensors, "grad.");
    assert!(checked.len() > 40, "{} parameters", checked.len());
}

/// Every variable's gradient in `vs` equals the oracle's `{prefix}{name}` (within 1e-4 of its
/// scale); the names checked.
fn assert_gradients(
    vs: &tch::nn::VarStore,
    tensors: &HashMap<String, Tensor>,
    prefix: &str,
) -> Vec<String> {
    let mut checked = Vec::new();
    for (name, var) in vs.variables() {
        let want = &tensors[&format!("{prefix}{name}")];
        let scale = want.abs().max().double_value(&[]).max(1e-3);
        let d = max_diff(&var.grad(), want);
        assert!(
            d < 1e-4 * scale.max(1.0),
            "{name}: gradient differs by {d} (scale {scale})"
        );
        checked.push(name);
    }
    checked
}

/// verl's critic on Qwen2.5-VL (TRL's value head over transformers 4.57's
/// `Qwen2_5_VLForConditionalGeneration`, dropout off as verl sets it): the values of the
/// image batch at every real token, and the gradient of their sum for every parameter, vision
/// tower and value head included.
#[test]
fn qwen2_5_vl_critic_values_and_gradients_match_a_value_head_over_transformers() {
    tch::set_num_threads(1);
    let (vs, critic, tensors) = oracle_in(
        &oracle_dir(),
        "qwen2_5_vl_model.safetensors",
        verlc_runtime::model::ValueModel::new,
    );
    let grids: Vec<Vec<i64>> = Vec::try_from(&tensors["input.image_grid_thw"]).expect("grids");
    let grids: Vec<[i64; 3]> = grids.iter().map(|g| [g[0], g[1], g[2]]).collect();
    let mask = &tensors["input.attention_mask"];
    let values = critic
        .forward_pixels(
            &tensors["input.input_ids"],
            mask,
            &tensors["input.pixel_values"],
            &grids,
        )
        .expect("values");
    let real = mask.to_kind(Kind::Float);
    let d = max_diff(&(&values * &real), &(&tensors["output.values"] * &real));
    assert!(
        d < 1e-4,
        "values differ from the value head's over transformers by {d}"
    );
    // The critic's engines see the same values at the response window (the last `r` tokens
    // as responses), padded and packed, the images in the prompt's placeholders.
    {
        use verlc_runtime::engine::{ForwardOptions, Head};
        let (t, r) = (tensors["input.input_ids"].size()[1], 4);
        let tokens = &critic.vision.as_ref().expect("a vision tower").tokens;
        let batch = oracle_batch(&tensors, tokens, r);
        let want = values.narrow(1, t - r - 1, r);
        let opts = ForwardOptions::default();
        let padded = tch::no_grad(|| Head::forward(&critic, &batch, &opts)).expect("padded");
        let packed = tch::no_grad(|| critic.forward_packed(&batch, &opts)).expect("packed");
        for (what, got) in [("padded", padded), ("packed", packed)] {
            let d = max_diff(&got, &want);
            assert!(d < 1e-4, "{what} engine values differ by {d}");
        }
    }
    (values * real).sum(Kind::Float).backward();
    let checked = assert_gradients(&vs, &tensors, "vgrad.");
    let tower_and_head = checked
        .iter()
        .filter(|n| n.starts_with("visual.") || n.starts_with("score."))
        .count();
    assert!(tower_and_head > 10, "{checked:?}");
}

/// Qwen3-VL against transformers 4.57's `Qwen3VLForConditionalGeneration` (a seeded tiny
/// model: a three-block tower with DeepStack features after blocks 0 and 1, a three-layer
/// Qwen3 text model under interleaved M-RoPE): the tower's embeddings and DeepStack features of
/// two images of different grids (the learned position grid interpolated to each), and as for
/// Qwen2.5-VL the logits, the saved checkpoint, greedy tokens and every gradient.
#[test]
fn qwen3_vl_matches_transformers() {
    tch::set_num_threads(1);
    let dir = oracle_dir().join("qwen3_vl");
    let (_vs, model, tensors) = oracle_model_in(&dir, "model.safetensors");
    let grid: Vec<Vec<i64>> = Vec::try_from(&tensors["input.image_grid_thw"]).expect("grid");
    let grid: Vec<[i64; 3]> = grid.iter().map(|g| [g[0], g[1], g[2]]).collect();
    let vision = model.vision.as_ref().expect("a vision tower");
    let out = tch::no_grad(|| vision.tower.forward(&tensors["input.pixel_values"], &grid))
        .expect("tower");
    let d = max_diff(&out.embeds, &tensors["output.tower"]);
    assert!(d < 1e-5, "tower embeddings differ by {d}");
    assert_eq!(out.deepstack.len(), 2);
    for (i, f) in out.deepstack.iter().enumerate() {
        let d = max_diff(f, &tensors[&format!("output.deepstack.{i}")]);
        assert!(d < 1e-5, "DeepStack level {i} differs by {d}");
    }
    matches_the_oracle_model(&dir, "model.safetensors");
    timestamped_videos_match(&dir);
}

/// Qwen3-style logits of the oracle's batch with videos laid out as Qwen3-VL's processor lays
/// them out (each temporal patch behind its timestamp, a one-frame video to the positions).
fn timestamped_videos_match(dir: &std::path::Path) {
    let (_vs, model, tensors) = oracle_model_in(dir, "model.safetensors");
    // The seconds per temporal patch are written in the prompt's text: the positions ignore them.
    logits_with_videos_match(&model, &tensors, &[1.0, 1.0]);
}

/// The same against transformers 5's Qwen3-VL (its checkpoint: `rope_parameters`, the tower's
/// config typed `qwen3_vl_vision`).
#[test]
fn qwen3_vl_matches_transformers_5() {
    tch::set_num_threads(1);
    let dir = oracle::qwen3_vl_transformers5();
    let saved = std::fs::read_to_string(dir.join("checkpoint/config.json")).expect("config");
    assert!(
        saved.contains("rope_parameters"),
        "a transformers 5 checkpoint"
    );
    matches_the_oracle_model(&dir, "model.safetensors");
    timestamped_videos_match(&dir);
}

/// Qwen3-VL-MoE against transformers 4.57's `Qwen3VLMoeForConditionalGeneration` (Qwen3-VL's
/// tiny tower, a three-layer text model whose first and last layers route each token to two
/// of four experts, the middle one dense): the checkpoint transformers saves (experts fused as
/// `gate_up_proj` (E, H, 2I) and `down_proj` (E, I, H)) loads split per expert, and as for
/// Qwen3-VL the logits, greedy tokens and every gradient (each expert's, and the router's)
/// equal transformers'. Saved again, the experts are fused as the checkpoint had them.
#[test]
fn qwen3_vl_moe_matches_transformers() {
    tch::set_num_threads(1);
    let dir = oracle_dir().join("qwen3_vl_moe");
    matches_the_oracle_model(&dir, "model.safetensors");
    timestamped_videos_match(&dir);
    saves_experts_fused_as_read(&dir);
}

/// The same against transformers 5's Qwen3-VL-MoE, whose checkpoint holds the experts
/// transposed (each a linear layer's weight) and names their count `num_local_experts`.
#[test]
fn qwen3_vl_moe_matches_transformers_5() {
    tch::set_num_threads(1);
    let dir = oracle::qwen3_vl_moe_transformers5();
    let saved = std::fs::read_to_string(dir.join("checkpoint/config.json")).expect("config");
    assert!(
        saved.contains("num_local_experts"),
        "a transformers 5 checkpoint"
    );
    matches_the_oracle_model(&dir, "model.safetensors");
    timestamped_videos_match(&dir);
}

/// Qwen3.5's image-text checkpoints against transformers 5's `Qwen3_5ForConditionalGeneration`
/// (a seeded tiny model: a two-block tower without DeepStack, four layers of Gated DeltaNet
/// and gated attention in turn under interleaved M-RoPE over a quarter of each head): the
/// tower's embeddings, then as for Qwen3-VL the logits of a left-padded batch with images, the
/// saved checkpoint, greedy tokens and every gradient; and verlc's save reloads in transformers
/// 5 with the same logits.
#[test]
fn qwen3_5_image_text_matches_transformers_5() {
    tch::set_num_threads(1);
    let dir = oracle::qwen3_5_vl_transformers5();
    qwen3_5_tower_matches(&dir);
    matches_the_oracle_model(&dir, "model.safetensors");
    timestamped_videos_match(&dir);
}

/// The same for Qwen3.5-MoE's (four experts, top two, and a gated shared expert in every
/// layer); saved again, its experts are fused as the checkpoint had them.
#[test]
fn qwen3_5_moe_image_text_matches_transformers_5() {
    tch::set_num_threads(1);
    let dir = oracle::qwen3_5_moe_vl_transformers5();
    qwen3_5_tower_matches(&dir);
    matches_the_oracle_model(&dir, "model.safetensors");
    timestamped_videos_match(&dir);
}

/// The tower of the oracle's Qwen3.5 model: no DeepStack features, embeddings as transformers'.
fn qwen3_5_tower_matches(dir: &std::path::Path) {
    let (_vs, model, tensors) = oracle_model_in(dir, "model.safetensors");
    assert_eq!(
        model.config.arch().expect("family").tower(),
        Some(verlc_spec::families::VisionTower::Qwen3_5)
    );
    let grid: Vec<Vec<i64>> = Vec::try_from(&tensors["input.image_grid_thw"]).expect("grid");
    let grid: Vec<[i64; 3]> = grid.iter().map(|g| [g[0], g[1], g[2]]).collect();
    let vision = model.vision.as_ref().expect("a vision tower");
    let out = tch::no_grad(|| vision.tower.forward(&tensors["input.pixel_values"], &grid))
        .expect("tower");
    assert!(out.deepstack.is_empty(), "Qwen3.5's tower has no DeepStack");
    let d = max_diff(&out.embeds, &tensors["output.tower"]);
    assert!(d < 1e-5, "tower embeddings differ by {d}");
}

/// The model read from the oracle's checkpoint, saved by verlc: its fused expert tensors are
/// the checkpoint's (4.57's orientation, which both transformers releases and vLLM read), and
/// it reads back bit for bit.
fn saves_experts_fused_as_read(dir: &std::path::Path) {
    use verlc_runtime::model::save::{SaveOptions, save_pretrained};
    use verlc_runtime::model::{Dtype, from_pretrained};
    let m = from_pretrained(
        dir.join("checkpoint").to_str().expect("utf-8 path"),
        Device::Cpu,
        Dtype::Fp32,
        0,
    )
    .expect("checkpoint");
    let out = oracle::scratch("save-qwen3-vl-moe");
    let class = m.config.arch().expect("family").causal_lm_class();
    save_pretrained(&m.vs, &m.config, class, &out, &SaveOptions::default()).expect("save");
    let ours: HashMap<String, Tensor> = Tensor::read_safetensors(out.join("model.safetensors"))
        .expect("saved")
        .into_iter()
        .collect();
    let theirs: HashMap<String, Tensor> =
        Tensor::read_safetensors(dir.join("checkpoint/model.safetensors"))
            .expect("transformers' checkpoint")
            .into_iter()
            .collect();
    // Under transformers' names (Qwen3-VL's checkpoints are read only so).
    for layer in [0, 2] {
        for leaf in ["gate_up_proj", "down_proj"] {
            let name = format!("model.language_model.layers.{layer}.mlp.experts.{leaf}");
            assert!(ours[&name].equal(&theirs[&name]), "{name}");
        }
    }
    let mut names: Vec<&String> = ours.keys().collect();
    let mut want: Vec<&String> = theirs.keys().collect();
    names.sort();
    want.sort();
    assert_eq!(names, want, "the checkpoint's tensor names");
    assert!(
        !ours.keys().any(|k| k.contains("experts.0.")),
        "no expert saved alone"
    );
    let back = from_pretrained(
        out.to_str().expect("utf-8 path"),
        Device::Cpu,
        Dtype::Fp32,
        0,
    )
    .expect("reload");
    for (name, t) in m.vs.variables() {
        let u = &back.vs.variables()[&name];
        assert!(t.equal(u), "{name} changed in the round trip");
    }
}

/// `verlc smoke`'s stand-in of a Qwen2.5-VL-7B checkpoint (`builtin://scaled?from=DIR` on its
/// config.json) keeps the family, the vision token ids and the tower's patch sizes (the
/// source's image processor feeds it), scales the tower down to the stand-in's width and
/// re-cuts the M-RoPE sections for its heads, and runs a prompt with an image.
#[test]
fn a_scaled_stand_in_of_qwen2_5_vl_runs_an_image() {
    use verlc_runtime::builtin_uri::BuiltinUri;
    use verlc_runtime::data::image::{ImageProcessorConfig, decode_png, process_image};
    use verlc_runtime::model::CausalLm;
    use verlc_runtime::model::vision::Vision;
    tch::set_num_threads(1);
    let dir = oracle::scratch("scaled-qwen2_5_vl");
    std::fs::write(
        dir.join("config.json"),
        r#"{"model_type": "qwen2_5_vl", "architectures": ["Qwen2_5_VLForConditionalGeneration"],
            "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
            "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
            "rms_norm_eps": 1e-06, "rope_theta": 1000000.0, "max_position_embeddings": 128000,
            "tie_word_embeddings": false, "hidden_act": "silu",
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "image_token_id": 151655, "video_token_id": 151656,
            "vision_start_token_id": 151652, "vision_end_token_id": 151653,
            "vision_config": {"depth": 32, "hidden_size": 1280, "hidden_act": "silu",
                "intermediate_size": 3420, "num_heads": 16, "in_chans": 3,
                "out_hidden_size": 3584, "patch_size": 14, "spatial_merge_size": 2,
                "temporal_patch_size": 2, "window_size": 112,
                "fullatt_block_indexes": [7, 15, 23, 31], "tokens_per_second": 2}}"#,
    )
    .expect("config.json");
    let uri = format!("builtin://scaled?from={}", dir.display());
    let cfg = verlc_runtime::model::builtin::config(
        &BuiltinUri::parse(&uri).expect("uri").expect("builtin"),
    )
    .expect("scaled config");
    let sections = &cfg.rope_scaling.as_ref().expect("rope")["mrope_section"];
    assert_eq!(sections, &serde_json::json!([2, 3, 3]));
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let model = CausalLm::new(&cfg, vs.root()).expect("stand-in");
    verlc_runtime::model::init::init_weights(&vs, &cfg, 1).expect("init");
    let vision = model.vision.as_ref().expect("a vision tower");
    assert_eq!(vision.tokens.image_token_id, 151655);
    let tower_params: i64 = vs
        .variables()
        .iter()
        .filter(|(n, _)| n.starts_with("visual."))
        .map(|(_, t)| t.numel() as i64)
        .sum();
    assert!(tower_params < 2_000_000, "{tower_params} tower parameters");
    let png = verlc_runtime::data::builtin::stripe_png("42", 0).expect("png");
    let image = process_image(
        &decode_png(&png).expect("png"),
        (None, None),
        &ImageProcessorConfig::default(),
    )
    .expect("image");
    let mut ids = vec![151652];
    ids.extend(std::iter::repeat_n(151655, image.tokens(2)));
    ids.extend([151653, 100, 200, 300]);
    let ids = Tensor::from_slice(&ids).unsqueeze(0);
    let (pixels, grids) = Vision::pixels(&[&image], Device::Cpu).expect("pixels");
    let logits = tch::no_grad(|| model.forward_pixels(&ids, &ids.ones_like(), &pixels, &grids))
        .expect("forward");
    assert_eq!(logits.size(), [1, ids.size()[1], 152064]);
    assert!(
        logits.isfinite().all().int64_value(&[]) == 1,
        "finite logits"
    );
}

/// Qwen2.5-VL with videos (transformers 4.57's `Qwen2_5_VLForConditionalGeneration`, as verl
/// runs it): a left-padded row with a video of two temporal patches, and a row with an image
/// and then a video of three at two seconds each. The tower embeds them in order, the image
/// placeholders take the image's embeddings and the video placeholders the videos', and the
/// time ids step by seconds per patch x `tokens_per_second`: transformers' logits.
#[test]
fn qwen2_5_vl_logits_with_videos_match_transformers() {
    tch::set_num_threads(1);
    let (_vs, model, tensors) = oracle_model();
    let seconds: Vec<f64> = Vec::try_from(&tensors["video.second_per_grid_ts"]).expect("seconds");
    logits_with_videos_match(&model, &tensors, &seconds);
}

/// The oracle's batch with videos (`video.*`: row 0 a video, row 1 an image then a video) has
/// transformers' logits; the videos take `seconds` per temporal patch. A video given where the
/// tokens hold an image is refused, naming the counts.
fn logits_with_videos_match(
    model: &verlc_runtime::model::CausalLm,
    tensors: &std::collections::HashMap<String, Tensor>,
    seconds: &[f64],
) {
    use verlc_runtime::model::vision::ProcessedImage;
    let grids = |key: &str| -> Vec<[i64; 3]> {
        let g: Vec<Vec<i64>> = Vec::try_from(&tensors[key]).expect("grids");
        g.iter().map(|g| [g[0], g[1], g[2]]).collect()
    };
    let items_of = |pixels: &Tensor, grids: &[[i64; 3]], seconds: Option<&[f64]>| {
        let mut start = 0;
        grids
            .iter()
            .enumerate()
            .map(|(k, g)| {
                let n = g[0] * g[1] * g[2];
                let rows = pixels.narrow(0, start, n).contiguous().view([-1]);
                start += n;
                ProcessedImage {
                    pixel_values: Vec::try_from(&rows).expect("pixels"),
                    grid_thw: *g,
                    seconds_per_grid: seconds.map(|s| s[k]),
                    timestamps: Vec::new(),
                }
            })
            .collect::<Vec<_>>()
    };
    let images = items_of(
        &tensors["video.pixel_values"],
        &grids("video.image_grid_thw"),
        None,
    );
    let videos = items_of(
        &tensors["video.pixel_values_videos"],
        &grids("video.video_grid_thw"),
        Some(seconds),
    );
    // In order of appearance: row 0 its video, row 1 the image, then its video.
    let items = [&videos[0], &images[0], &videos[1]];
    let (ids, mask) = (
        &tensors["video.input_ids"],
        &tensors["video.attention_mask"],
    );
    let logits = tch::no_grad(|| model.forward_items(ids, mask, &items)).expect("forward");
    let real = mask.unsqueeze(-1).to_kind(Kind::Float);
    let d = max_diff(&(&logits * &real), &(&tensors["video.logits"] * &real));
    assert!(
        d < 1e-4,
        "logits with videos differ from transformers' by {d}"
    );
    let wrong = [&videos[0], &videos[0], &videos[1]];
    let err = tch::no_grad(|| model.forward_items(ids, mask, &wrong)).expect_err("misplaced");
    assert!(
        err.to_string()
            .contains("the tokens announce 1 image(s) but 0 image grid(s) were given"),
        "{err}"
    );
}
