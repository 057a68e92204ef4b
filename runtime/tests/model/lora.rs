//! LoRA against PEFT 0.17 (`model_oracle.py lora`) on tiny Qwen2 and Llama checkpoints: the
//! adapter directory verlc writes loads with `PeftModel.from_pretrained`; the response
//! log-probs, the loss gradient of every adapter tensor and one AdamW step of the adapters
//! equal PEFT's and torch's; the base weights get no gradient and do not move; with the
//! adapters disabled the model is the base model; merged weights give PEFT's
//! `merge_and_unload()` model, and load in verlc as a plain checkpoint. The same on a tiny
//! Qwen2.5-VL with a batch of images (PEFT on `Qwen2_5_VLForConditionalGeneration`), with
//! `all-linear` reaching the vision tower's layers and with the tower excluded.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use tch::{Device, Kind, Tensor};
use verlc_runtime::engine::{
    Batch, Engine, EngineSettings, ForwardOptions, Metrics, MicroLoss, OptimSettings,
    SchedulerSettings, SingleEngine,
};
use verlc_runtime::model::lora::{LoraConfig, LoraTargets, is_adapter, merged, save_adapter};
use verlc_runtime::model::save::{SaveOptions, save_named};
use verlc_runtime::model::{CausalLm, Dtype, from_pretrained};
use verlc_runtime::optim::sched::{VerlSchedule, VerlSchedulerConfig};
use verlc_runtime::optim::{AdamWConfig, InnerConfig};

use crate::oracle::{self, get, max_abs_diff};

/// Response tokens: the last 3, so that each is predicted from a real token of every row
/// (the shortest has 4). What a padding position predicts is nobody's business, and models
/// differ there: a padded query of verlc's attends to itself, one of transformers' to nothing
/// (with gpt-oss's sinks, its output is then zero).
const R: i64 = 3;

fn lora_config() -> LoraConfig {
    LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets::AllLinear,
        exclude: LoraTargets::Names(vec!["o_proj".into()]),
        adapter_dir: None,
    }
}

fn engine(base: &Path) -> SingleEngine<CausalLm> {
    engine_with(base, lora_config())
}

fn engine_with(base: &Path, lora: LoraConfig) -> SingleEngine<CausalLm> {
    SingleEngine::new(EngineSettings {
        model_path: base.display().to_string(),
        device: Device::Cpu,
        param_dtype: Dtype::Fp32,
        main_dtype: Dtype::Fp32,
        seed: 5,
        optim: Some(OptimSettings {
            freeze_vision_tower: false,
            inner: InnerConfig::AdamW(AdamWConfig::default()),
            lr: 1e-2,
            weight_decay: 1.0,
            clip_grad: 1e9,
            offload: false,
            offload_fraction: 0.0,
            schedule: SchedulerSettings::Verl(VerlSchedulerConfig {
                schedule: VerlSchedule::Constant,
                lr_warmup_steps: 0,
                lr_warmup_steps_ratio: 0.0,
                total_training_steps: 10,
                zero_indexed_step: true,
            }),
        }),
        loss_scale_factor: None,
        loss_scaling: verlc_runtime::optim::LossScaling::LINKED,
        lora: Some(lora),
        config_overrides: Default::default(),
        remove_padding: false,
    })
    .expect("LoRA engine")
}

/// PEFT's results for each (base model, adapter, inputs, output file), in one Python process.
fn peft(jobs: &[[&Path; 4]]) -> Vec<HashMap<String, Tensor>> {
    let mut args = vec![Path::new("lora")];
    args.extend(jobs.iter().flatten().copied());
    let status = oracle::run_script(
        &oracle::python(),
        &oracle::script(),
        &args,
        &[("OMP_NUM_THREADS", "1")],
    );
    assert!(status.success(), "PEFT oracle failed: {status}");
    jobs.iter().map(|[.., out]| oracle::read(out)).collect()
}

fn adapters(e: &SingleEngine<CausalLm>) -> Vec<(String, Tensor)> {
    let mut v: Vec<(String, Tensor)> = e
        .var_store()
        .variables()
        .into_iter()
        .filter(|(n, _)| is_adapter(n))
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// One model's side of the PEFT comparison, prepared before PEFT runs.
struct Case {
    arch: &'static str,
    base: PathBuf,
    adapter: PathBuf,
    inputs: PathBuf,
    /// Where PEFT writes its results.
    out: PathBuf,
    engine: SingleEngine<CausalLm>,
    batch: Batch,
    /// `model.layers.0.self_attn.q_proj.weight` before training (it must not move).
    base_weight: Tensor,
    scratch: PathBuf,
}

#[test]
fn lora_matches_peft_forward_gradients_and_an_adamw_step() {
    let dir = oracle::models();
    // Both models' engines and inputs first, then PEFT on both in one process.
    let mut cases = Vec::new();
    for arch in ["qwen2", "llama", "qwen3_moe", "gpt_oss", "gemma2"] {
        let base = dir.join(arch);
        let scratch = oracle::scratch(&format!("lora-{arch}"));
        let e = engine(&base);

        // PEFT's init leaves B at zero; give it values so the adapters change the output.
        let names: Vec<String> = adapters(&e).into_iter().map(|(n, _)| n).collect();
        assert!(
            names
                .iter()
                .any(|n| n.ends_with("self_attn.q_proj.lora_A.weight"))
        );
        // An MLP's projection (a dense one, or a per-expert one of experts stored apart);
        // gpt-oss has neither (its experts are fused parameters).
        assert_eq!(
            names.iter().any(|n| n.ends_with("down_proj.lora_B.weight")),
            arch != "gpt_oss"
        );
        assert!(
            !names.iter().any(|n| n.contains("o_proj")),
            "o_proj is excluded"
        );
        tch::manual_seed(11);
        for (n, v) in adapters(&e) {
            if n.contains(".lora_B.") {
                tch::no_grad(|| v.shallow_clone().copy_(&(v.randn_like() * 0.05)));
            }
        }
        let adapter_dir = scratch.join("adapter");
        let params = e.per_tensor_params().expect("params");
        save_adapter(
            &adapter_dir,
            &params,
            &lora_config(),
            &base.display().to_string(),
            false,
        )
        .expect("save adapter");
        let base_weight = params
            .iter()
            .find(|(n, _)| n == "model.layers.0.self_attn.q_proj.weight")
            .map(|(_, t)| t.copy())
            .expect("q_proj");

        let r = oracle::read(&dir.join(format!("{arch}_ref.safetensors")));
        let ids = get(&r, "input_ids");
        let t = ids.size()[1];
        let mut b = Batch::new();
        b.insert("input_ids", ids.shallow_clone()).expect("insert");
        b.insert("attention_mask", get(&r, "attention_mask").shallow_clone())
            .expect("insert");
        b.insert("position_ids", get(&r, "position_ids").shallow_clone())
            .expect("insert");
        b.insert("responses", ids.narrow(1, t - R, R))
            .expect("insert");
        b.insert(
            "response_mask",
            Tensor::ones([3, R], (Kind::Float, Device::Cpu)),
        )
        .expect("insert");
        let inputs = scratch.join("inputs.safetensors");
        Tensor::write_safetensors(
            &[
                ("input_ids", ids.shallow_clone()),
                ("attention_mask", get(&r, "attention_mask").shallow_clone()),
                ("position_ids", get(&r, "position_ids").shallow_clone()),
                ("responses", ids.narrow(1, t - R, R).contiguous()),
            ],
            &inputs,
        )
        .expect("write inputs");
        cases.push(Case {
            arch,
            out: scratch.join("peft.safetensors"),
            base,
            adapter: adapter_dir,
            inputs,
            engine: e,
            batch: b,
            base_weight,
            scratch,
        });
    }
    let jobs: Vec<[&Path; 4]> = cases
        .iter()
        .map(|c| [&*c.base, &*c.adapter, &*c.inputs, &*c.out])
        .collect();
    let wants = peft(&jobs);
    for (case, want) in cases.into_iter().zip(wants) {
        let Case {
            arch,
            engine: mut e,
            batch: b,
            base_weight,
            scratch,
            ..
        } = case;
        let fwd = ForwardOptions {
            temperature: 1.0,
            with_entropy: false,
            with_sum_pi_squared: false,
            ..ForwardOptions::default()
        };
        let mut lp = None;
        e.forward_backward(&b, &3.into(), &fwd, &mut |_, out, _| {
            lp = Some(out.log_probs.detach());
            Ok(MicroLoss {
                loss: -out.log_probs.mean(Kind::Float),
                metrics: Metrics::new(),
            })
        })
        .expect("forward/backward");
        let d = max_abs_diff(&lp.expect("log-probs"), get(&want, "lp"));
        assert!(d < 1e-4, "{arch}: log-probs differ from PEFT's by {d}");
        for (n, v) in e.var_store().variables() {
            if is_adapter(&n) {
                // An expert no token chose has no gradient (PEFT's oracle writes zeros).
                let grad = v.grad();
                let grad = if grad.defined() { grad } else { v.zeros_like() };
                let d = max_abs_diff(&grad, get(&want, &format!("grad.{n}")));
                assert!(d < 1e-5, "{arch}: gradient of {n} differs by {d}");
            } else {
                assert!(!v.grad().defined(), "{arch}: frozen {n} got a gradient");
            }
        }
        if arch == "gpt_oss" {
            // Its router is no linear module in transformers and its experts are fused
            // parameters: PEFT's all-linear adapts neither, nor does verlc.
            assert!(
                e.var_store()
                    .variables()
                    .keys()
                    .all(|n| !n.contains("lora_") || n.contains("self_attn.")),
                "only attention adapted"
            );
        }
        if arch == "qwen3_moe" {
            // PEFT's all-linear adapts the router, a linear module in transformers too.
            assert!(
                e.var_store()
                    .variables()
                    .keys()
                    .any(|n| n.ends_with("mlp.gate.lora_A.weight")),
                "the router's adapter"
            );
        }
        e.optimizer_step().expect("step");
        assert_first_adam_step(&adapters(&e), &want, arch);
        let params = e.per_tensor_params().expect("params");
        let q = params
            .iter()
            .find(|(n, _)| n == "model.layers.0.self_attn.q_proj.weight")
            .map(|(_, t)| t.shallow_clone())
            .expect("q_proj");
        assert_eq!(
            max_abs_diff(&q, &base_weight),
            0.0,
            "{arch}: a base weight moved"
        );

        // The reference policy: the same engine with its adapters off.
        e.module().model.set_adapters_enabled(false);
        let base_lp = e.infer_batch(&b, &3.into(), &fwd).expect("infer");
        e.module().model.set_adapters_enabled(true);
        let d = max_abs_diff(&base_lp[0].log_probs, get(&want, "base_lp"));
        assert!(
            d < 1e-4,
            "{arch}: adapters off differs from the base model by {d}"
        );

        // Merged weights, saved as a plain checkpoint, are PEFT's merge_and_unload() model.
        let merged_dir = scratch.join("merged");
        let config = e.model_config().clone();
        let plain = verlc_runtime::model::ModelConfig {
            lora: None,
            ..config
        };
        let arch_name = plain.arch().expect("arch").causal_lm_class();
        save_named(
            &merged(params, &lora_config()).expect("merge"),
            &plain,
            arch_name,
            &merged_dir,
            &SaveOptions::default(),
        )
        .expect("save merged");
        let m = from_pretrained(
            merged_dir.to_str().expect("utf-8"),
            Device::Cpu,
            Dtype::Fp32,
            0,
        )
        .expect("merged checkpoint loads as a plain model");
        let mut mb = Batch::new();
        for k in ["input_ids", "attention_mask", "position_ids", "responses"] {
            mb.insert(k, b.get(k).expect("key").shallow_clone())
                .expect("insert");
        }
        let out = tch::no_grad(|| verlc_runtime::engine::Head::forward(&m.model, &mb, &fwd))
            .expect("forward");
        let d = max_abs_diff(&out.log_probs, get(&want, "merged_lp"));
        assert!(
            d < 1e-4,
            "{arch}: merged model differs from PEFT's merge by {d}"
        );
    }
}

/// Gives every `lora_B` of `e` small random values (PEFT starts them at zero, which would
/// leave the adapters without effect on the output).
fn perturb_b(e: &SingleEngine<CausalLm>, seed: i64) {
    tch::manual_seed(seed);
    for (n, v) in adapters(e) {
        if n.contains(".lora_B.") {
            tch::no_grad(|| v.shallow_clone().copy_(&(v.randn_like() * 0.05)));
        }
    }
}

/// LoRA on Qwen2.5-VL against PEFT on transformers 4.57's `Qwen2_5_VLForConditionalGeneration`
/// (the vision oracle's seeded tiny model, two rows with an image each, one left-padded):
/// with `all-linear` the tower's seven kinds of linear layer get adapters too (PEFT's
/// selection), with verl's examples' `exclude_modules: .*visual.*` none of them do. For both,
/// the adapter verlc writes (PEFT's names in transformers' module tree) loads in PEFT, the
/// log-probs, every adapter gradient and one AdamW step equal PEFT's, the base weights (the
/// tower's included) get no gradient, the adapters off give the base model, the merged
/// weights PEFT's `merge_and_unload()`, and the adapter read back gives the same model.
#[test]
fn lora_on_qwen2_5_vl_matches_peft_with_images() {
    tch::set_num_threads(1);
    let dir = oracle::vision();
    lora_on_a_vision_language_model_matches_peft(&dir, "qwen2_5_vl_model.safetensors", 5, 2);
}

/// The same on Qwen3-VL (its tower's blocks have four linear layers, and each DeepStack
/// level a merger of two besides the main one's).
#[test]
fn lora_on_qwen3_vl_matches_peft_with_images() {
    tch::set_num_threads(1);
    let dir = oracle::vision().join("qwen3_vl");
    lora_on_a_vision_language_model_matches_peft(&dir, "model.safetensors", 4, 2 * 3);
}

/// The same on Qwen3-VL-MoE: PEFT's all-linear adapts each sparse layer's router (a linear
/// module) but not its experts (fused parameters in transformers), and verlc's adapters are
/// the same.
#[test]
fn lora_on_qwen3_vl_moe_matches_peft_with_images() {
    tch::set_num_threads(1);
    let dir = oracle::vision().join("qwen3_vl_moe");
    lora_on_a_vision_language_model_matches_peft(&dir, "model.safetensors", 4, 2 * 3);
}

/// [`lora_on_qwen2_5_vl_matches_peft_with_images`] of the oracle model in `dir` (its
/// checkpoint and `file`), whose tower has `per_block` linear layers in each block and
/// `mergers` in its mergers.
fn lora_on_a_vision_language_model_matches_peft(
    dir: &Path,
    file: &str,
    per_block: usize,
    mergers: usize,
) {
    use verlc_runtime::engine::Head;
    let base = dir.join("checkpoint");
    let tensors = oracle::read(&dir.join(file));
    let (_, images) = crate::vision::oracle_rows(&tensors);
    let ids = get(&tensors, "input.input_ids");
    let mask = get(&tensors, "input.attention_mask");
    let t = ids.size()[1];
    let r = 3;
    let variants = [
        ("all-linear", LoraTargets::Names(Vec::new())),
        (
            "tower excluded",
            LoraTargets::regex(".*visual.*").expect("regex"),
        ),
    ];
    let config = |exclude: &LoraTargets| LoraConfig {
        rank: 4,
        alpha: 8.0,
        targets: LoraTargets::AllLinear,
        exclude: exclude.clone(),
        adapter_dir: None,
    };
    let mut cases = Vec::new();
    for (i, (what, exclude)) in variants.iter().enumerate() {
        // The oracle runs share file names: the family's folder tells their scratch apart.
        let family = dir.file_name().and_then(|n| n.to_str()).unwrap_or("vl");
        let scratch = oracle::scratch(&format!("lora-vl-{family}-{file}-{i}"));
        let e = engine_with(&base, config(exclude));
        let names: Vec<String> = adapters(&e).into_iter().map(|(n, _)| n).collect();
        let tower: Vec<&String> = names.iter().filter(|n| n.starts_with("visual.")).collect();
        let cfg = e.model_config();
        let depth = cfg.extra["vision_config"]["depth"].as_i64().unwrap_or(0) as usize;
        let layers = cfg.num_hidden_layers as usize;
        if *what == "all-linear" {
            // Every block's linear layers and the mergers': PEFT's all-linear on the tower.
            assert_eq!(tower.len(), 2 * (depth * per_block + mergers), "{tower:?}");
        } else {
            assert!(tower.is_empty(), "{what}: {tower:?}");
        }
        // Seven projections a layer; a sparse layer's experts are fused parameters in
        // transformers (Qwen3-VL-MoE), leaving its attention's four and the router.
        let sparse = cfg.moe.num_experts > 0;
        let text: usize = (0..layers)
            .map(|l| if sparse && cfg.sparse_layer(l) { 5 } else { 7 })
            .sum();
        assert_eq!(names.len() - tower.len(), 2 * text, "{what}: text adapters");
        perturb_b(&e, 11 + i as i64);
        let vision = e.module().vision.as_ref().expect("a vision tower");
        let flat: Vec<_> = images.iter().flat_map(|i| i.iter()).collect();
        let grids: Vec<[i64; 3]> = flat.iter().map(|i| i.grid_thw).collect();
        let (pos, _) = vision.positions(ids, mask, &grids).expect("positions");
        let mut b = Batch::new()
            .with("input_ids", ids.shallow_clone())
            .and_then(|b| b.with("attention_mask", mask.shallow_clone()))
            .and_then(|b| b.with("position_ids", pos))
            .and_then(|b| b.with("responses", ids.narrow(1, t - r, r)))
            .and_then(|b| {
                b.with(
                    "response_mask",
                    Tensor::ones([2, r], (Kind::Float, Device::Cpu)),
                )
            })
            .expect("batch");
        b.set_images(images.clone()).expect("images");
        let adapter = scratch.join("adapter");
        let params = e.per_tensor_params().expect("params");
        save_adapter(&adapter, &params, &config(exclude), "qwen2_5_vl", true).expect("save");
        let inputs = scratch.join("inputs.safetensors");
        Tensor::write_safetensors(
            &[
                ("input_ids", ids.shallow_clone()),
                ("attention_mask", mask.shallow_clone()),
                (
                    "pixel_values",
                    get(&tensors, "input.pixel_values").shallow_clone(),
                ),
                (
                    "image_grid_thw",
                    get(&tensors, "input.image_grid_thw").shallow_clone(),
                ),
                ("responses", ids.narrow(1, t - r, r).contiguous()),
            ],
            &inputs,
        )
        .expect("write inputs");
        cases.push((
            *what,
            e,
            b,
            adapter,
            inputs,
            scratch.join("peft.safetensors"),
        ));
    }
    let jobs: Vec<[&Path; 4]> = cases
        .iter()
        .map(|(_, _, _, adapter, inputs, out)| [&*base, &**adapter, &**inputs, &**out])
        .collect();
    let wants = peft(&jobs);
    let fwd = ForwardOptions::default();
    for ((what, mut e, b, adapter, ..), want) in cases.into_iter().zip(wants) {
        let mut lp = None;
        e.forward_backward(&b, &2.into(), &fwd, &mut |_, out, _| {
            lp = Some(out.log_probs.detach());
            Ok(MicroLoss {
                loss: -out.log_probs.mean(Kind::Float),
                metrics: Metrics::new(),
            })
        })
        .expect("forward/backward");
        let d = max_abs_diff(&lp.expect("log-probs"), get(&want, "lp"));
        assert!(d < 1e-4, "{what}: log-probs differ from PEFT's by {d}");
        for (n, v) in e.var_store().variables() {
            if is_adapter(&n) {
                let d = max_abs_diff(&v.grad(), get(&want, &format!("grad.{n}")));
                assert!(d < 1e-5, "{what}: gradient of {n} differs by {d}");
            } else {
                assert!(!v.grad().defined(), "{what}: frozen {n} got a gradient");
            }
        }
        let before = e.per_tensor_params().expect("params");
        e.optimizer_step().expect("step");
        assert_first_adam_step(&adapters(&e), &want, what);
        let params = e.per_tensor_params().expect("params");
        for ((n, old), (_, new)) in before.iter().zip(&params) {
            if !is_adapter(n) {
                assert_eq!(max_abs_diff(old, new), 0.0, "{what}: base weight {n} moved");
            }
        }

        e.module().model.set_adapters_enabled(false);
        let base_lp = e.infer_batch(&b, &2.into(), &fwd).expect("infer");
        e.module().model.set_adapters_enabled(true);
        let d = max_abs_diff(&base_lp[0].log_probs, get(&want, "base_lp"));
        assert!(
            d < 1e-4,
            "{what}: adapters off differ from the base model by {d}"
        );

        // The merged weights in a plain model of the same config.
        let plain = verlc_runtime::model::ModelConfig {
            lora: None,
            ..e.model_config().clone()
        };
        let vs = tch::nn::VarStore::new(Device::Cpu);
        let m = CausalLm::new(&plain, vs.root()).expect("plain model");
        let merged: HashMap<String, Tensor> = merged(params, &config(&LoraTargets::Names(vec![])))
            .expect("merge")
            .into_iter()
            .collect();
        tch::no_grad(|| {
            for (n, mut v) in vs.variables() {
                v.copy_(&merged[&n]);
            }
        });
        let out = tch::no_grad(|| Head::forward(&m, &b, &fwd)).expect("merged forward");
        let d = max_abs_diff(&out.log_probs, get(&want, "merged_lp"));
        assert!(
            d < 1e-4,
            "{what}: merged model differs from PEFT's merge by {d}"
        );

        // The adapter directory read back (PEFT's names mapped to verlc's) gives the
        // adapted model PEFT loaded from it.
        let cfg = LoraConfig::from_adapter_dir(&adapter).expect("adapter config");
        let mut back = engine_with(&base, cfg);
        let lp = back.infer_batch(&b, &2.into(), &fwd).expect("infer");
        let d = max_abs_diff(&lp[0].log_probs, get(&want, "lp"));
        assert!(
            d < 1e-4,
            "{what}: the adapter read back differs from PEFT's by {d}"
        );
    }
}

/// The adapters after one AdamW step equal PEFT's. Adam's first step moves each entry by about
/// lr * g / (|g| + eps): where a gradient is within a few orders of eps, fp32 round-off of g
/// shows in the update (a kernel path or thread count apart), so the bound is 2% of the
/// learning rate, not round-off, and entries whose gradient is below 1e-6 (a router's adapter
/// has some: experts barely in the running; so does a DeepStack merger's) are left out.
fn assert_first_adam_step(
    adapters: &[(String, Tensor)],
    want: &std::collections::HashMap<String, Tensor>,
    what: &str,
) {
    for (n, v) in adapters {
        let g = get(want, &format!("grad.{n}"));
        let settled = g.abs().gt(1e-6);
        let diff = (v - get(want, &format!("after.{n}")))
            .abs()
            .masked_select(&settled);
        let d = if diff.numel() == 0 {
            0.0
        } else {
            diff.max().double_value(&[])
        };
        assert!(d < 2e-4, "{what}: {n} after one AdamW step differs by {d}");
    }
}
