//! Saving in Hugging Face layout: transformers loads what we save (single file and sharded,
//! causal LM and value model) with identical outputs, and we load our own shards back.

use tch::{Device, Kind};
use verlc_runtime::model::save::{SaveOptions, save_pretrained};
use verlc_runtime::model::{Checkpoint, Dtype, from_pretrained, value_from_pretrained};

use crate::oracle::{self, get};

#[test]
fn saved_checkpoint_loads_in_transformers_with_identical_logits() {
    let dir = oracle::models();
    // gpt-oss: its experts fused again (gate and up interleaved, biases beside them) and
    // counted by `num_local_experts`, as its config class reads them; Gemma 2: its caps,
    // query scale and `hidden_activation` written back.
    let archs = [
        ("llama", u64::MAX),
        ("qwen3", 20_000),
        ("gpt_oss", u64::MAX),
        ("gemma2", u64::MAX),
    ];
    let mut saved = Vec::new();
    for (arch, shard_bytes) in archs {
        let m = from_pretrained(
            dir.join(arch).to_str().unwrap(),
            Device::Cpu,
            Dtype::Fp32,
            0,
        )
        .unwrap();
        let out = oracle::scratch(&format!("save-{arch}"));
        let class = m.config.arch().unwrap().causal_lm_class();
        save_pretrained(
            &m.vs,
            &m.config,
            class,
            &out,
            &SaveOptions {
                max_shard_bytes: shard_bytes,
                dtype: None,
            },
        )
        .unwrap();
        let ckpt = Checkpoint::open(&out).unwrap();
        assert_eq!(
            ckpt.index.is_some(),
            shard_bytes != u64::MAX,
            "{arch}: sharding as requested"
        );
        saved.push((arch, m, out, dir.join(format!("{arch}_ref.safetensors"))));
    }
    // transformers loads both checkpoints, and the vision-language ones, in one process.
    let vision = saved_vision_model();
    let qwen3 = ["qwen3_vl", "qwen3_vl_moe"].map(saved_pixels_model);
    let mut jobs: Vec<_> = saved
        .iter()
        .map(|(_, _, out, refs)| (out.as_path(), "causal", refs.as_path()))
        .collect();
    jobs.push((vision.dir.as_path(), "vision", vision.inputs.as_path()));
    for m in &qwen3 {
        jobs.push((m.dir.as_path(), "pixels", m.inputs.as_path()));
    }
    let mut verified = oracle::verify_many(&jobs);
    for (arch, m) in ["qwen3_vl_moe", "qwen3_vl"].iter().zip(qwen3.iter().rev()) {
        let hf = verified.pop().expect("pixels output");
        let d = oracle::max_abs_diff(get(&hf, "logits"), &m.logits);
        assert!(d <= 1e-5, "transformers on the saved {arch} differs by {d}");
    }
    vision.check(&verified.pop().expect("vision output"));
    for ((arch, m, out, refs), hf) in saved.iter().zip(&verified) {
        let r = oracle::read(refs);
        let d = oracle::max_abs_diff_masked(
            get(hf, "logits"),
            get(&r, "logits"),
            get(&r, "attention_mask"),
        );
        // The references may come from another kernel path (cached oracles; MKL held to
        // AVX2 or not): gpt-oss's larger activations round to 3e-6 apart there, while a
        // checkpoint laid out wrongly differs by whole units.
        assert!(
            d <= 1e-5,
            "{arch}: transformers on our checkpoint differs by {d}"
        );

        // And our own loader reads the result back bit for bit.
        let back = from_pretrained(out.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
        for (name, t) in m.vs.variables() {
            let u = back
                .vs
                .variables()
                .remove(&name)
                .unwrap_or_else(|| panic!("{arch}: {name} missing after reload"));
            assert!(t.equal(&u), "{arch}: {name} changed in the round trip");
        }
    }
}

#[test]
fn value_model_round_trips_through_transformers() {
    let dir = oracle::models();
    let v = value_from_pretrained(
        dir.join("qwen2").to_str().unwrap(),
        Device::Cpu,
        Dtype::Fp32,
        5,
    )
    .unwrap();
    assert_eq!(
        v.report.missing,
        vec!["score.bias".to_owned(), "score.weight".to_owned()]
    );
    assert!(
        v.report.unexpected.is_empty(),
        "tied qwen2 has no lm_head: {:?}",
        v.report.unexpected
    );
    let score_std = v.vs.variables()["score.weight"].std(true).double_value(&[]);
    assert!(
        (score_std - 0.15).abs() < 0.06,
        "fresh score head drawn with initializer_range, std {score_std}"
    );
    let out = oracle::scratch("save-value");
    let class = v.config.arch().unwrap().value_class();
    save_pretrained(&v.vs, &v.config, class, &out, &SaveOptions::default()).unwrap();
    let refs = dir.join("qwen2_ref.safetensors");
    let r = oracle::read(&refs);
    let ours = tch::no_grad(|| {
        v.model.forward(
            get(&r, "input_ids"),
            get(&r, "position_ids"),
            Some(get(&r, "attention_mask")),
        )
    });
    let hf = oracle::verify(&out, "value", &refs);
    let d = oracle::max_abs_diff_masked(&ours, get(&hf, "values"), get(&r, "attention_mask"));
    assert!(
        d <= 1e-5,
        "values differ from transformers' token classification by {d}"
    );
    let tail = tch::no_grad(|| {
        let (ids, pos, mask) = (
            get(&r, "input_ids"),
            get(&r, "position_ids"),
            get(&r, "attention_mask"),
        );
        v.model.response_values(ids, pos, mask, 3)
    });
    // The last layer computes only those positions: the same values up to GEMM rounding.
    let last = ours.narrow(1, ours.size()[1] - 4, 3);
    let d = (&tail - &last).abs().max().double_value(&[]);
    assert!(
        d <= 1e-6,
        "response values are values[:, -R-1:-1] (off by {d})"
    );
}

#[test]
fn bf16_save_keeps_dtype_and_declares_it() {
    let m = from_pretrained(
        "builtin://tiny?layers=1&hidden=32&heads=2&kv_heads=1",
        Device::Cpu,
        Dtype::Fp32,
        1,
    )
    .unwrap();
    let out = oracle::scratch("save-bf16");
    let opts = SaveOptions {
        dtype: Some(Kind::BFloat16),
        ..SaveOptions::default()
    };
    save_pretrained(&m.vs, &m.config, "Qwen2ForCausalLM", &out, &opts).unwrap();
    let cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["torch_dtype"], "bfloat16");
    assert_eq!(cfg["architectures"][0], "Qwen2ForCausalLM");
    let back = from_pretrained(out.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
    for (name, t) in m.vs.variables() {
        let u = &back.vs.variables()[&name];
        let expected = t.to_kind(Kind::BFloat16).to_kind(Kind::Float);
        assert!(expected.equal(u), "{name}: bf16 round trip");
    }
}

#[test]
fn tensor_parallel_shard_hints_load_slices() {
    use verlc_runtime::model::load::{LoadOptions, Shard, load_weights};
    let dir = oracle::models().join("qwen2");
    let full = oracle::read(&dir.join("model.safetensors"));
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let attn = vs.root() / "model" / "layers" / 0 / "self_attn";
    let q = (&attn / "q_proj").zeros("weight", &[32, 64]);
    let o = (&attn / "o_proj").zeros("weight", &[64, 32]);
    let hint = |name: &str| {
        if name.ends_with("q_proj.weight") {
            Some(Shard {
                dim: 0,
                rank: 1,
                world_size: 2,
            })
        } else if name.ends_with("o_proj.weight") {
            Some(Shard {
                dim: 1,
                rank: 1,
                world_size: 2,
            })
        } else {
            None
        }
    };
    let ckpt = Checkpoint::open(&dir).unwrap();
    let report = load_weights(
        &vs,
        &ckpt,
        &LoadOptions {
            shard: Some(&hint),
            ..LoadOptions::default()
        },
    )
    .unwrap();
    assert_eq!(report.loaded, 2);
    assert!(
        report.unexpected.len() > 10,
        "the rest of the checkpoint is reported, not loaded"
    );
    assert!(
        q.equal(&oracle::get(&full, "model.layers.0.self_attn.q_proj.weight").narrow(0, 32, 32))
    );
    assert!(
        o.equal(&oracle::get(&full, "model.layers.0.self_attn.o_proj.weight").narrow(1, 32, 32))
    );

    let bad = |_: &str| {
        Some(Shard {
            dim: 0,
            rank: 0,
            world_size: 3,
        })
    };
    let e = load_weights(
        &vs,
        &ckpt,
        &LoadOptions {
            shard: Some(&bad),
            ..LoadOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("cannot shard tensor") && e.contains("model.safetensors"),
        "{e}"
    );
}

/// A model named by Hub id loads from the Hub cache's snapshot (blobs linked from
/// `snapshots/<commit>`, `refs/main`), the layout transformers reads with
/// `local_files_only=True`: the same weights as the directory it was cached from.
#[test]
fn hub_id_loads_the_cached_snapshot() {
    use verlc_hub::HubEnv;
    use verlc_runtime::model::ModelSource;

    let dir = oracle::models();
    let src = dir.join("qwen2");
    let cache = oracle::scratch("hub-cache");
    let commit = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";
    let repo = cache.join("models--tiny-org--qwen2-tiny");
    let snap = repo.join("snapshots").join(commit);
    std::fs::create_dir_all(repo.join("blobs")).unwrap();
    std::fs::create_dir_all(&snap).unwrap();
    for (i, entry) in std::fs::read_dir(&src).unwrap().enumerate() {
        let entry = entry.unwrap();
        let blob = repo.join("blobs").join(format!("blob{i:04}"));
        std::fs::copy(entry.path(), &blob).unwrap();
        std::os::unix::fs::symlink(
            std::path::Path::new("../../blobs").join(blob.file_name().unwrap()),
            snap.join(entry.file_name()),
        )
        .unwrap();
    }
    std::fs::create_dir_all(repo.join("refs")).unwrap();
    std::fs::write(repo.join("refs/main"), commit).unwrap();

    let env = HubEnv::offline_at(&cache);
    let source = ModelSource::parse_in("tiny-org/qwen2-tiny", &env).unwrap();
    assert_eq!(source, ModelSource::Dir(snap.clone()));
    let via_hub = from_pretrained(snap.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
    let direct = from_pretrained(src.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
    for (name, t) in direct.vs.variables() {
        assert!(t.equal(&via_hub.vs.variables()[&name]), "{name}");
    }
    // Not cached: the error names the id and the cache.
    let err = ModelSource::parse_in("tiny-org/absent", &env)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("tiny-org/absent") && err.contains("Hugging Face Hub cache"),
        "{err}"
    );
    // A local directory of the same spelling as an id wins (transformers' order).
    assert_eq!(
        ModelSource::parse_in(src.to_str().unwrap(), &env).unwrap(),
        ModelSource::Dir(src.clone())
    );
}

/// The built-in tiny Qwen2.5-VL saved as a training run exports it (weights, config with its
/// `vision_config`, `preprocessor_config.json`), with a `color_digits` prompt and image and
/// verlc's logits of them.
struct SavedVision {
    dir: std::path::PathBuf,
    inputs: std::path::PathBuf,
    pixels: tch::Tensor,
    grid: [i64; 3],
    logits: tch::Tensor,
}

fn saved_vision_model() -> SavedVision {
    use verlc_runtime::data::image::{ImageProcessorConfig, decode_png, process_image};
    use verlc_runtime::data::vision_prompt::encode_vision_prompt;
    use verlc_runtime::model::vision::Vision;
    let uri = "builtin://tiny?arch=qwen2_5_vl&layers=2&hidden=64";
    let m = from_pretrained(uri, Device::Cpu, Dtype::Fp32, 3).expect("tiny VL");
    let dir = oracle::scratch("save-qwen2_5_vl");
    let class = m.config.arch().expect("arch").causal_lm_class();
    save_pretrained(&m.vs, &m.config, class, &dir, &SaveOptions::default()).expect("save");
    let processor = ImageProcessorConfig::default();
    processor
        .save(&dir, None)
        .expect("preprocessor_config.json");
    let png = verlc_runtime::data::builtin::stripe_png("307", 5).expect("png");
    let image =
        process_image(&decode_png(&png).expect("decode"), (None, None), &processor).expect("image");
    let tok = verlc_runtime::tokenizer::Tokenizer::from_pretrained(uri).expect("tokenizer");
    let messages: Vec<verlc_runtime::tokenizer::Message> =
        serde_json::from_value(serde_json::json!(
            [{"role": "user", "content": "<image>what is the answer?"}]
        ))
        .expect("messages");
    let ids = encode_vision_prompt(
        &tok,
        &messages,
        std::slice::from_ref(&image),
        2,
        &Default::default(),
    )
    .expect("prompt");
    let ids = tch::Tensor::from_slice(&ids).unsqueeze(0);
    let mask = ids.ones_like();
    let (pixels, grids) = Vision::pixels(&[&image], Device::Cpu).expect("pixels");
    let logits =
        tch::no_grad(|| m.model.forward_pixels(&ids, &mask, &pixels, &grids)).expect("forward");
    let inputs = dir.join("vision-inputs.safetensors");
    tch::Tensor::write_safetensors(
        &[
            ("input_ids", ids),
            ("attention_mask", mask),
            ("png", tch::Tensor::from_slice(&png)),
        ],
        &inputs,
    )
    .expect("inputs");
    SavedVision {
        dir,
        inputs,
        pixels,
        grid: image.grid_thw,
        logits,
    }
}

/// The built-in tiny Qwen3-VL or Qwen3-VL-MoE (`arch`) saved as a training run exports it
/// (transformers' module-tree names, config.json with `text_config` and `vision_config`, the
/// MoE's experts fused as its published checkpoints store them), two images' pixels in a
/// prompt, and verlc's logits of them.
fn saved_pixels_model(arch: &str) -> SavedVision {
    use verlc_runtime::model::vision::ProcessedImage;
    // Qwen3.5's four layers: three Gated DeltaNet layers, then gated attention.
    let layers = if arch.starts_with("qwen3_5") { 4 } else { 2 };
    let uri = format!("builtin://tiny?arch={arch}&layers={layers}&hidden=64");
    let m = from_pretrained(&uri, Device::Cpu, Dtype::Fp32, 5).expect("tiny VL");
    let dir = oracle::scratch(&format!("save-{arch}"));
    let class = m.config.arch().expect("arch").causal_lm_class();
    save_pretrained(&m.vs, &m.config, class, &dir, &SaveOptions::default()).expect("save");
    let shapes = Checkpoint::open(&dir)
        .and_then(|c| c.tensor_shapes())
        .expect("saved shapes");
    let fused = shapes.iter().any(|(n, s)| {
        n == "model.language_model.layers.1.mlp.experts.gate_up_proj" && s == &[8, 64, 64]
    });
    if arch.starts_with("qwen3_vl") {
        assert_eq!(
            fused,
            arch == "qwen3_vl_moe",
            "experts fused (E, H, 2I): {shapes:?}"
        );
    }
    let vision = m.model.vision.as_ref().expect("a tower");
    let (image, start) = (
        vision.tokens.image_token_id,
        vision.tokens.vision_start_token_id,
    );
    // Two 28x56 pictures: 2x4 patches, 2 tokens after the 2x2 merge.
    let patch = 3 * 2 * 14 * 14;
    let images: Vec<ProcessedImage> = (0..2)
        .map(|i| ProcessedImage {
            pixel_values: (0..8 * patch)
                .map(|j| ((j * 7 + i * 13) % 17) as f32 / 8.0 - 1.0)
                .collect(),
            grid_thw: [1, 2, 4],
            seconds_per_grid: None,
            timestamps: Vec::new(),
        })
        .collect();
    let row = [
        [3, 4, start, image, image, start + 1, 5].as_slice(),
        &[start, image, image, start + 1, 6, 7],
    ]
    .concat();
    let ids = tch::Tensor::from_slice(&row).unsqueeze(0);
    let mask = ids.ones_like();
    let refs: Vec<&ProcessedImage> = images.iter().collect();
    let (pixels, grids) =
        verlc_runtime::model::vision::Vision::pixels(&refs, Device::Cpu).expect("pixels");
    let logits =
        tch::no_grad(|| m.model.forward_pixels(&ids, &mask, &pixels, &grids)).expect("forward");
    let inputs = dir.join("pixels-inputs.safetensors");
    let grid = tch::Tensor::from_slice(&[1i64, 2, 4, 1, 2, 4]).view([2, 3]);
    tch::Tensor::write_safetensors(
        &[
            ("input_ids", ids),
            ("attention_mask", mask),
            ("pixel_values", pixels.shallow_clone()),
            ("image_grid_thw", grid),
        ],
        &inputs,
    )
    .expect("inputs");
    SavedVision {
        dir,
        inputs,
        pixels,
        grid: [1, 2, 4],
        logits,
    }
}

/// Qwen3.5's image-text models as a training run exports them (transformers' module-tree
/// names, `text_config` and `vision_config`, the tower without DeepStack mergers) load in
/// transformers 5 (`AutoModelForImageTextToText`) with verlc's logits of a prompt with two
/// images.
#[test]
fn qwen3_5_image_text_saves_load_in_transformers_5() {
    let saved = ["qwen3_5_vl", "qwen3_5_moe_vl"].map(saved_pixels_model);
    for m in &saved {
        let cfg: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(m.dir.join("config.json")).expect("config"),
        )
        .expect("json");
        assert_eq!(cfg["text_config"]["layer_types"][3], "full_attention");
        assert!(cfg["vision_config"].is_object());
    }
    let mut jobs: Vec<_> = saved
        .iter()
        .map(|m| (m.dir.as_path(), "pixels", m.inputs.as_path()))
        .collect();
    // The text model alone, as the vLLM rollout's server gets it (a run on text prompts):
    // transformers 5 reads it as Qwen3.5's causal LM, with the image-text model's logits of text.
    let text = saved_text_model_of("qwen3_5_vl");
    jobs.push((text.dir.as_path(), "causal", text.inputs.as_path()));
    let mut verified = oracle::verify_many_transformers5(&jobs);
    let hf = verified.pop().expect("causal output");
    let d = oracle::max_abs_diff(get(&hf, "logits"), &text.logits);
    assert!(
        d <= 1e-5,
        "transformers 5 on the saved text model differs by {d}"
    );
    for ((arch, m), hf) in ["qwen3_5_vl", "qwen3_5_moe_vl"]
        .iter()
        .zip(&saved)
        .zip(&verified)
    {
        let d = oracle::max_abs_diff(get(hf, "logits"), &m.logits);
        assert!(
            d <= 1e-5,
            "transformers 5 on the saved {arch} differs by {d}"
        );
    }
}

/// A saved text model, its inputs for the `causal` check and verlc's logits of them.
struct SavedText {
    dir: std::path::PathBuf,
    inputs: std::path::PathBuf,
    logits: tch::Tensor,
}

/// The tiny image-text model `arch`'s text model saved as the vLLM rollout saves it for its
/// server (`save::text_model_of`), and the image-text model's logits of a text batch.
fn saved_text_model_of(arch: &str) -> SavedText {
    let uri = format!("builtin://tiny?arch={arch}&layers=4&hidden=64");
    let m = from_pretrained(&uri, Device::Cpu, Dtype::Fp32, 7).expect("tiny VL");
    let named: Vec<(String, tch::Tensor)> = m.vs.variables().into_iter().collect();
    let (text, params) =
        verlc_runtime::model::save::text_model_of(&m.config, &named).expect("a text model");
    assert_eq!(text.model_type, "qwen3_5_text");
    assert!(params.iter().all(|(n, _)| !n.starts_with("visual.")));
    let dir = oracle::scratch(&format!("save-text-of-{arch}"));
    let class = text.arch().expect("arch").causal_lm_class();
    verlc_runtime::model::save::save_named(&params, &text, class, &dir, &SaveOptions::default())
        .expect("save");
    let ids = tch::Tensor::from_slice(&[3i64, 9, 4, 12, 5, 7, 8, 6]).view([2, 4]);
    let mask = ids.ones_like();
    let pos = tch::Tensor::arange(4, (Kind::Int64, Device::Cpu))
        .unsqueeze(0)
        .repeat([2, 1]);
    let logits = tch::no_grad(|| m.model.forward(&ids, &pos, Some(&mask), None));
    let inputs = dir.join("causal-inputs.safetensors");
    tch::Tensor::write_safetensors(
        &[
            ("input_ids", ids),
            ("attention_mask", mask),
            ("position_ids", pos),
        ],
        &inputs,
    )
    .expect("inputs");
    SavedText {
        dir,
        inputs,
        logits,
    }
}

impl SavedVision {
    /// transformers' image processor prepares the image as verlc does, and its model on the
    /// saved directory gives verlc's logits.
    fn check(&self, hf: &std::collections::HashMap<String, tch::Tensor>) {
        let d = oracle::max_abs_diff(get(hf, "pixel_values"), &self.pixels);
        assert!(d <= 1e-6, "pixel values differ from transformers' by {d}");
        let grid: Vec<i64> = Vec::try_from(get(hf, "image_grid_thw").view([-1])).expect("grid");
        assert_eq!(grid, self.grid.to_vec(), "image grid");
        let d = oracle::max_abs_diff(get(hf, "logits"), &self.logits);
        assert!(
            d <= 1e-5,
            "transformers on the saved VL model differs by {d}"
        );
    }
}
