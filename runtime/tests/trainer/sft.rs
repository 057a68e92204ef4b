//! The SFT trainer (verl's `sft_trainer`) end to end: a config of verl's `sft_trainer_engine`
//! tree lowered as `verlc build` lowers it, trained on the built-in tiny model from the
//! built-in digit-reversal conversations (`messages` column), on one process and on two Gloo
//! ranks; its loss against verl's `sft_loss` (itself checked against verl's function in
//! `tests/algo/sft_loss.rs`), its validation, checkpoints and resume.

use std::path::{Path, PathBuf};
use std::time::Duration;

use tch::{Kind, Tensor};
use verlc_front::check::CheckOptions;
use verlc_front::compile::{Compiled, Mode, compile};
use verlc_front::load::compose::LoadRequest;
use verlc_front::load::version::BuiltinRelease;
use verlc_front::plan::Planned;
use verlc_runtime::data::sft::SftDataset;
use verlc_runtime::engine::{
    Engine, EngineSettings, ForwardOptions, Metrics, MicroBatching, SingleEngine,
};
use verlc_runtime::model::CausalLm;
use verlc_runtime::parallel::dist::{InitOptions, ProcessGroup};
use verlc_runtime::tokenizer::Tokenizer;
use verlc_runtime::trainer::parallel::{FsdpRoles, MegatronRoles};
use verlc_spec::binding::StrategyKind;
use verlc_spec::sft::SftSpec;

use crate::common::spawn_ranks;
use crate::support::{quiet, scratch};

const TINY: &str = "builtin://tiny?layers=2&hidden=64";

/// A small run: 3-digit reversal conversations, 32 per step in micro-batches of 8.
fn overrides(dir: &Path, steps: u64, extra: &[&str]) -> Vec<String> {
    let mut o: Vec<String> = [
        format!("model.path='{TINY}'"),
        "data.train_files='builtin://digit_reversal?split=train&min_digits=3&max_digits=3&size=512'".into(),
        "data.val_files='builtin://digit_reversal?split=test&min_digits=3&max_digits=3&size=64'".into(),
        "data.train_batch_size=32".into(),
        "data.micro_batch_size_per_gpu=8".into(),
        "data.use_dynamic_bsz=false".into(),
        "data.max_length=32".into(),
        "engine.dtype=float32".into(),
        "optim.lr=3e-3".into(),
        "optim.weight_decay=0.0".into(),
        "trainer.device=cpu".into(),
        "trainer.n_gpus_per_node=1".into(),
        "trainer.logger=[]".into(),
        format!("trainer.total_training_steps={steps}"),
        "trainer.test_freq=-1".into(),
        "trainer.save_freq=-1".into(),
        format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
    ]
    .into();
    o.extend(extra.iter().map(|s| s.to_string()));
    o
}

/// The spec `verlc build` lowers from verl 0.9.1's SFT tree with `overrides`; no lowering error.
fn spec(overrides: &[String]) -> SftSpec {
    let compiled = compile_sft(BuiltinRelease::V0_9_1, overrides.to_vec());
    match compiled.planned {
        Some(Planned::Sft(p)) => p.spec,
        _ => panic!("errors: {:#?}", errors(&compiled.checked.diagnostics)),
    }
}

/// verl's SFT config of `release`'s tree with `overrides`, compiled as `verlc build` does.
fn compile_sft(release: BuiltinRelease, overrides: Vec<String>) -> Compiled {
    compile(
        &LoadRequest {
            config_name: Some("sft_trainer_engine".into()),
            overrides,
            builtin: release,
            ..Default::default()
        },
        &CheckOptions::default(),
        Mode::Build {
            deny_warnings: false,
        },
    )
}

fn errors(diagnostics: &[verlc_front::diag::Diagnostic]) -> Vec<String> {
    diagnostics
        .iter()
        .filter(|d| d.is_error())
        .map(|d| format!("{} {}", d.code, d.message))
        .collect()
}

fn metric(h: &[(u64, Metrics)], step: u64, key: &str) -> f64 {
    h.iter()
        .find(|(s, _)| *s == step)
        .and_then(|(_, m)| m.get(key).copied())
        .unwrap_or_else(|| panic!("no {key} at step {step}"))
}

/// What the trainer of `s` starts from: its tokenizer, its training data, the rows of its
/// first step (the first batch of the sampler it builds) and its initial model (by its seed).
fn first_step(s: &SftSpec) -> (Tokenizer, SftDataset, Vec<usize>, SingleEngine<CausalLm>) {
    let tok = Tokenizer::from_pretrained(&s.model.tokenizer_path).expect("tokenizer");
    let data = SftDataset::load(
        &s.data.train_files,
        &tok,
        &verlc_runtime::sft::dataset_options(s, s.data.train_max_samples),
    )
    .expect("dataset");
    let mut sampler = verlc_runtime::data::BatchSampler::new(
        data.len(),
        s.batching.global_batch,
        true,
        s.run.seed,
        true,
    )
    .expect("sampler");
    let rows = sampler.next_batch();
    let engine: SingleEngine<CausalLm> = SingleEngine::new(EngineSettings {
        model_path: s.model.path.clone(),
        device: tch::Device::Cpu,
        param_dtype: s.binding.precision,
        main_dtype: verlc_spec::Dtype::Fp32,
        seed: s.model.seed,
        optim: None,
        loss_scale_factor: None,
        loss_scaling: verlc_runtime::optim::LossScaling::NONE,
        lora: None,
        config_overrides: Default::default(),
        remove_padding: false,
    })
    .expect("engine");
    (tok, data, rows, engine)
}

/// The first step's loss is verl's `sft_loss` of the model's log-probabilities over the step's
/// conversations packed end to end, with the step's loss tokens; micro-batches, packing and
/// the trainer's shifted mask change nothing.
#[test]
fn sft_step_loss_is_verls_sft_loss_of_the_packed_batch() {
    tch::set_num_threads(1);
    let dir = scratch("sft_loss");
    let s = spec(&overrides(&dir, 1, &[]));
    let (tok, data, rows, mut engine) = first_step(&s);
    // Packed as verl's no_padding batch: log_probs[t] predicts the token after t.
    let mut log_probs = Vec::new();
    let mut masks = Vec::new();
    for &i in &rows {
        let ex = &data.examples[i];
        let batch = verlc_runtime::sft::collate(&[ex], tok.pad_token_id).expect("collate");
        let out = engine
            .infer_batch(&batch, &MicroBatching::Rows(1), &ForwardOptions::default())
            .expect("forward");
        // Row grid: log p(token t | < t) for t >= 1; verl's packed tensor puts it at t - 1
        // and the sample's last position predicts the next sample's first token.
        let lp = out[0].log_probs.reshape([-1]);
        log_probs.push(Tensor::cat(
            &[lp, Tensor::zeros([1], (Kind::Float, tch::Device::Cpu))],
            0,
        ));
        let m: Vec<f32> = ex
            .loss_mask
            .iter()
            .map(|b| f32::from(u8::from(*b)))
            .collect();
        masks.push(Tensor::from_slice(&m));
    }
    let log_probs = Tensor::cat(&log_probs, 0);
    let mask = Tensor::cat(&masks, 0);
    let tokens = verlc_runtime::algo::sft_loss::loss_tokens(&mask);
    let want =
        verlc_runtime::algo::sft_loss::sft_loss(&log_probs, &mask, tokens, 1).double_value(&[]);
    let got = verlc_runtime::sft::run(&s, &quiet()).expect("one SFT step");
    let loss = metric(&got.history, 1, "train/loss");
    assert!(
        (loss - want).abs() <= 1e-5 * want.abs(),
        "train/loss {loss}, verl's sft_loss {want}"
    );
    assert!(metric(&got.history, 1, "train/global_tokens") > 0.0);
    // Dynamic batch size and fixed micro-batches without packing give the same step.
    for extra in [
        &["data.use_dynamic_bsz=true", "data.max_token_len_per_gpu=64"][..],
        &["model.use_remove_padding=false"][..],
    ] {
        let other = verlc_runtime::sft::run(
            &spec(&overrides(&scratch("sft_loss_b"), 1, extra)),
            &quiet(),
        )
        .expect("one SFT step");
        let l = metric(&other.history, 1, "train/loss");
        let g = metric(&other.history, 1, "train/grad_norm");
        let g0 = metric(&got.history, 1, "train/grad_norm");
        assert!(
            (l - loss).abs() <= 1e-5 * loss,
            "{extra:?}: loss {l} vs {loss}"
        );
        assert!(
            (g - g0).abs() <= 1e-4 * g0,
            "{extra:?}: grad norm {g} vs {g0}"
        );
    }
}

/// The tiny model learns to reverse digits from conversations: validation loss below half its
/// first value; the last checkpoint is a Hugging Face model directory with the tokenizer.
#[test]
fn sft_learns_digit_reversal_and_saves_a_hugging_face_model() {
    tch::set_num_threads(1);
    let dir = scratch("sft_learns");
    let s = spec(&overrides(&dir, 80, &["trainer.test_freq=5"]));
    let run = verlc_runtime::sft::run(&s, &quiet()).expect("SFT run");
    assert_eq!(run.last_step, 80);
    let val: Vec<(u64, f64)> = run
        .history
        .iter()
        .filter_map(|(s, m)| m.get("val/loss").map(|v| (*s, *v)))
        .collect();
    eprintln!("validation loss by step: {val:?}");
    let (first, last) = (val[0].1, val[val.len() - 1].1);
    assert!(last < 0.5 * first, "validation loss by step: {val:?}");
    let hf = dir.join("ckpt/global_step_80/huggingface");
    for f in ["config.json", "model.safetensors", "tokenizer.json"] {
        assert!(hf.join(f).is_file(), "no {f} in {}", hf.display());
    }
    let tracker = std::fs::read_to_string(dir.join("ckpt/latest_checkpointed_iteration.txt"))
        .expect("tracker");
    assert_eq!(tracker.trim(), "80");
    // The quickstart's GRPO starting from that model scores above the same run from scratch
    // (its validation before training, on the held-out numbers).
    let score = |model: &str| {
        let path = format!("actor_rollout_ref.model.path='{model}'");
        let spec = crate::support::small_grpo(
            &dir.join("grpo"),
            1,
            &[
                &path,
                "trainer.val_only=true",
                "trainer.val_before_train=true",
                "data.val_max_samples=64",
            ],
        );
        let run = verlc_runtime::trainer::run(&spec, &quiet()).expect("GRPO validation");
        metric(
            &run.history,
            0,
            "val-core/builtin/digit_reversal/reward/mean@1",
        )
    };
    let (tuned, scratch_score) = (score(&hf.display().to_string()), score(TINY));
    assert!(
        tuned > scratch_score + 0.2,
        "GRPO validation score from the SFT model {tuned}, from scratch {scratch_score}"
    );
}

/// A run stopped after its step-3 checkpoint and resumed (`resume_mode: auto`) trains steps 4
/// to 6 exactly as the uninterrupted run.
#[test]
fn sft_resume_continues_exactly() {
    tch::set_num_threads(1);
    let dir = scratch("sft_resume");
    let whole = verlc_runtime::sft::run(
        &spec(&overrides(&dir.join("whole"), 6, &["trainer.save_freq=3"])),
        &quiet(),
    )
    .expect("whole run");
    let part = dir.join("part");
    verlc_runtime::sft::run(&spec(&overrides(&part, 3, &[])), &quiet()).expect("first part");
    let resumed =
        verlc_runtime::sft::run(&spec(&overrides(&part, 6, &[])), &quiet()).expect("resume");
    assert_eq!(resumed.resumed_from, 3);
    for step in 4..=6 {
        for key in ["train/loss", "train/grad_norm"] {
            assert_eq!(
                metric(&whole.history, step, key),
                metric(&resumed.history, step, key),
                "step {step} {key}"
            );
        }
    }
}

/// A run of verl 0.7.0's legacy SFT config (`sft_trainer`): gsm8k's single-turn layout over
/// the built-in rows (`extra_info.question` -> `extra_info.answer`), answers of 2 to 5 digits so
/// that micro-batches hold different numbers of loss tokens.
fn legacy_spec(dir: &Path, steps: u64, extra: &[&str]) -> SftSpec {
    let mut o: Vec<String> = vec![
        format!("model.partial_pretrain='{TINY}'"),
        "data.train_files='builtin://digit_reversal?split=train&min_digits=2&max_digits=5&size=512'".into(),
        "data.val_files='builtin://digit_reversal?split=test&min_digits=2&max_digits=5&size=64'".into(),
        "data.prompt_key=extra_info".into(),
        "data.response_key=extra_info".into(),
        "data.prompt_dict_keys=[question]".into(),
        "data.response_dict_keys=[answer]".into(),
        "data.train_batch_size=32".into(),
        "data.micro_batch_size_per_gpu=8".into(),
        "data.max_length=48".into(),
        "optim.lr=3e-3".into(),
        "optim.weight_decay=0.0".into(),
        "trainer.device=cpu".into(),
        "trainer.n_gpus_per_node=1".into(),
        "trainer.logger=[]".into(),
        "trainer.total_epochs=2".into(),
        format!("trainer.total_training_steps={steps}"),
        "trainer.test_freq=-1".into(),
        "trainer.save_freq=-1".into(),
        format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
    ];
    o.extend(extra.iter().map(|s| s.to_string()));
    let compiled = compile(
        &LoadRequest {
            config_name: Some("sft_trainer".into()),
            overrides: o,
            builtin: BuiltinRelease::V0_7_0,
            ..Default::default()
        },
        &CheckOptions::default(),
        Mode::Build {
            deny_warnings: false,
        },
    );
    match compiled.planned {
        Some(Planned::Sft(p)) => p.spec,
        _ => panic!("errors: {:#?}", errors(&compiled.checked.diagnostics)),
    }
}

/// The legacy trainer's step: its loss is the mean over the rank's micro-batches of each one's
/// token mean (verl's `_compute_loss_and_backward` with `n_micro_batches`, checked against
/// verl in `tests/algo/sft_loss.rs`), not the step's token mean; its lr follows verl's cosine
/// schedule over the epochs (`train/lr(1e-3)` after the step); and a resumed run continues it
/// exactly.
#[test]
fn legacy_sft_trainer_averages_micro_batch_means_and_resumes_exactly() {
    tch::set_num_threads(1);
    let dir = scratch("sft_legacy");
    let s = legacy_spec(&dir.join("one"), 1, &[]);
    assert!(s.trainer.is_legacy());
    let (tok, data, rows, mut engine) = first_step(&s);
    let (mut means, mut nll, mut tokens) = (Vec::new(), 0.0, 0.0);
    for chunk in rows.chunks(8) {
        let examples: Vec<_> = chunk.iter().map(|&i| &data.examples[i]).collect();
        let batch = verlc_runtime::sft::collate(&examples, tok.pad_token_id).expect("collate");
        let out = engine
            .infer_batch(&batch, &MicroBatching::Rows(8), &ForwardOptions::default())
            .expect("forward");
        let mask = batch
            .get("response_mask")
            .expect("mask")
            .to_kind(Kind::Double);
        let sum = -(out[0].log_probs.to_kind(Kind::Double) * &mask)
            .sum(Kind::Double)
            .double_value(&[]);
        let n = mask.sum(Kind::Double).double_value(&[]);
        means.push(sum / n);
        (nll, tokens) = (nll + sum, tokens + n);
    }
    let want = means.iter().sum::<f64>() / means.len() as f64;
    let step_mean = nll / tokens;
    assert!(
        (want - step_mean).abs() > 1e-4,
        "the micro-batches' token counts differ: {want} vs {step_mean}"
    );
    let got = verlc_runtime::sft::run(&s, &quiet()).expect("one legacy step");
    let loss = metric(&got.history, 1, "train/loss");
    assert!(
        (loss - want).abs() <= 1e-5 * want,
        "train/loss {loss}: the micro-batches' mean {want} (the step's token mean: {step_mean})"
    );
    // 512 rows / 32 = 16 steps an epoch, 2 epochs: 3 warm-up steps (int(32 x 0.1)); after
    // step 1 the lr is 1/3 of its peak.
    let lr = metric(&got.history, 1, "train/lr(1e-3)");
    assert!((lr - 1.0).abs() < 1e-9, "lr(1e-3) {lr}");

    let whole = verlc_runtime::sft::run(
        &legacy_spec(&dir.join("whole"), 4, &["trainer.save_freq=2"]),
        &quiet(),
    )
    .expect("whole run");
    let part = dir.join("part");
    verlc_runtime::sft::run(&legacy_spec(&part, 2, &[]), &quiet()).expect("first part");
    let resumed =
        verlc_runtime::sft::run(&legacy_spec(&part, 4, &[]), &quiet()).expect("resumed run");
    assert_eq!(resumed.resumed_from, 2);
    for step in 3..=4 {
        for key in ["train/loss", "train/lr(1e-3)", "val/loss"] {
            if step < 4 && key == "val/loss" {
                continue;
            }
            assert_eq!(
                metric(&whole.history, step, key),
                metric(&resumed.history, step, key),
                "step {step} {key}"
            );
        }
    }
}

/// An SFT run whose model cannot fit in this host's memory stops before loading it, naming
/// the key (`model.path`; the legacy config's `model.partial_pretrain`) and both numbers; with
/// LoRA only the frozen weights count.
#[test]
fn sft_runs_too_large_for_the_host_stop_before_loading() {
    use crate::preflight::{GIB, seven_b_checkpoint};
    use verlc_runtime::trainer::preflight::{PreflightError, check_sft};
    let dir = scratch("sft_preflight");
    let big = seven_b_checkpoint(&dir);
    let mut s = spec(&overrides(&dir, 1, &[]));
    check_sft(&s, Some(GIB)).expect("the built-in model fits");
    s.model.path = big.display().to_string();
    let e = check_sft(&s, Some(24 * GIB)).unwrap_err();
    let text = e.to_string();
    assert!(matches!(e, PreflightError::Memory { .. }), "{text}");
    assert!(
        text.contains("24.0 GiB available") && text.contains("`model.path`"),
        "{text}"
    );
    let mut legacy = legacy_spec(&dir.join("legacy"), 1, &[]);
    legacy.model.path = big.display().to_string();
    let text = check_sft(&legacy, Some(24 * GIB)).unwrap_err().to_string();
    assert!(text.contains("`model.partial_pretrain`"), "{text}");
    // Adapters only: the base weights count once (fp32 here: 26 GiB), not 16 bytes a parameter.
    assert!(check_sft(&s, Some(32 * GIB)).is_err());
    s.model.lora = Some(verlc_spec::trainer::LoraSpec {
        rank: 8,
        alpha: 16.0,
        target_modules: verlc_spec::trainer::ModuleSelector::AllLinear,
        exclude_modules: verlc_spec::trainer::ModuleSelector::Names(Vec::new()),
        adapter_path: None,
    });
    check_sft(&s, Some(32 * GIB)).expect("LoRA fits");
}

const CHILD: &str = "sft::sft_rank_child";
const SPEC_ENV: &str = "VERLC_SFT_SPEC";

/// One rank of the two-rank runs whose specs are the JSON files listed (one per line) in
/// `$VERLC_SFT_SPEC`: trains them one after another on one process group and writes each
/// history next to its spec.
#[test]
fn sft_rank_child() {
    let Ok(list) = std::env::var(SPEC_ENV) else {
        return;
    };
    tch::set_num_threads(1);
    let world = ProcessGroup::init_from_env(&InitOptions {
        timeout: Duration::from_secs(120),
        ..InitOptions::default()
    })
    .expect("init process group");
    let rank = world.rank();
    for file in std::fs::read_to_string(&list).expect("spec list").lines() {
        let spec: SftSpec =
            serde_json::from_str(&std::fs::read_to_string(file).expect("spec")).expect("spec json");
        let run = match spec.binding.strategy {
            StrategyKind::Megatron => verlc_runtime::sft::run_with(
                &spec,
                &quiet(),
                MegatronRoles {
                    world: Some(world.clone()),
                },
            ),
            _ => verlc_runtime::sft::run_with(
                &spec,
                &quiet(),
                FsdpRoles {
                    world: world.clone(),
                },
            ),
        }
        .unwrap_or_else(|e| panic!("{file}: {e}"));
        let json = serde_json::to_string(&run.history).expect("json");
        std::fs::write(
            PathBuf::from(file).with_extension(format!("rank{rank}")),
            json,
        )
        .expect("write history");
    }
    drop(world);
    crate::common::rank_passed();
}

/// Runs `specs` one after another on two rank processes; each spec's history on each rank.
fn two_ranks_all(specs: &[SftSpec], dir: &Path) -> Vec<Vec<Vec<(u64, Metrics)>>> {
    std::fs::create_dir_all(dir).expect("dir");
    let files: Vec<PathBuf> = specs
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let f = dir.join(format!("spec{i}.json"));
            std::fs::write(&f, serde_json::to_string(s).expect("json")).expect("write");
            f
        })
        .collect();
    let list = dir.join("specs.txt");
    let text: String = files.iter().map(|f| format!("{}\n", f.display())).collect();
    std::fs::write(&list, text).expect("write list");
    spawn_ranks(CHILD, 2, &[(SPEC_ENV, list.display().to_string())])
        .wait(Some(Duration::from_secs(120 * specs.len() as u64)))
        .expect("both ranks train");
    files
        .iter()
        .map(|f| {
            (0..2)
                .map(|rank| {
                    let text = std::fs::read_to_string(f.with_extension(format!("rank{rank}")))
                        .expect("rank history");
                    serde_json::from_str(&text).expect("history json")
                })
                .collect()
        })
        .collect()
}

/// Runs `spec` on two rank processes; each rank's history.
fn two_ranks(spec: &SftSpec, dir: &Path) -> Vec<Vec<(u64, Metrics)>> {
    two_ranks_all(std::slice::from_ref(spec), dir).remove(0)
}

/// Two ranks train the step one process trains: the same loss and grad norm at the first step
/// (same weights), close at the second, and the checkpoint of the last. FSDP splits the batch
/// over data-parallel ranks; Megatron with tensor parallelism 2 splits the model.
#[test]
fn sft_on_two_ranks_matches_one_process() {
    tch::set_num_threads(1);
    let dir = scratch("sft_two_ranks");
    let one = verlc_runtime::sft::run(&spec(&overrides(&dir.join("one"), 2, &[])), &quiet())
        .expect("one process");
    let fsdp = spec(&overrides(
        &dir.join("fsdp"),
        2,
        &[
            "trainer.n_gpus_per_node=2",
            "data.micro_batch_size_per_gpu=4",
        ],
    ));
    assert_eq!(fsdp.data_parallel(), 2);
    let megatron = spec(&overrides(
        &dir.join("megatron"),
        2,
        &[
            "engine=megatron",
            "optim=megatron",
            "engine.dtype=float32",
            "engine.tensor_model_parallel_size=2",
            "optim.lr=3e-3",
            "optim.weight_decay=0.0",
            "optim.clip_grad=1.0",
            "trainer.n_gpus_per_node=2",
        ],
    ));
    assert_eq!(megatron.binding.strategy, StrategyKind::Megatron);
    assert_eq!(megatron.data_parallel(), 1);
    for (name, s) in [("fsdp", &fsdp), ("megatron", &megatron)] {
        for (rank, two) in two_ranks(s, &dir.join(format!("{name}-job")))
            .iter()
            .enumerate()
        {
            for key in ["train/loss", "train/grad_norm", "train/global_tokens"] {
                let (a, b) = (metric(&one.history, 1, key), metric(two, 1, key));
                assert!(
                    (a - b).abs() <= 1e-5 * a.abs().max(1.0),
                    "{name} rank {rank} step 1 {key}: one process {a}, two ranks {b}"
                );
            }
            let (a, b) = (
                metric(&one.history, 2, "train/loss"),
                metric(two, 2, "train/loss"),
            );
            assert!((a - b).abs() <= 1e-3 * a, "{name} step 2 loss: {a} vs {b}");
        }
        assert!(
            dir.join(name)
                .join("ckpt/global_step_2/huggingface/model.safetensors")
                .is_file(),
            "{name}: no checkpoint"
        );
    }
}

/// Whether verlc implements the model a verl example names (by its Hub id): Llama-style
/// (DeepSeek-Coder), Qwen2/2.5 and Qwen3 dense, Gemma (the first generation: `gemma-2b-it`,
/// `gemma-1.1-7b-it`) and Seed-OSS; not Gemma 2 or 3, Nemotron or vision models.
fn implemented(model: &str) -> bool {
    let m = model.to_ascii_lowercase();
    !["gemma-2-", "gemma-3", "nemotron", "-vl-"]
        .iter()
        .any(|f| m.contains(f))
}

/// The tiny model an example of `model` (its Hub id) trains: its family's where verlc has
/// one apart from the dense default (Gemma, Seed-OSS).
fn tiny_for(model: &str) -> String {
    let m = model.to_ascii_lowercase();
    let arch = if m.contains("gemma") {
        "&arch=gemma"
    } else if m.contains("seed-oss") {
        "&arch=seed_oss"
    } else {
        ""
    };
    format!("'builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2{arch}'")
}

/// verl 0.7.0's legacy SFT example calls (`tests/fixtures/verl_sft_examples_0_7_0`, config
/// `sft_trainer`) of the families verlc implements, retargeted as [`retarget`] does (the
/// model under `model.partial_pretrain`; the single-turn calls read the built-in rows'
/// `extra_info.question`/`answer`, as gsm8k's): their specs, named, appended.
fn legacy_example_specs(
    dir: &Path,
    names: &mut Vec<String>,
    specs: &mut Vec<SftSpec>,
    skipped: &mut Vec<String>,
) {
    let fixture =
        crate::support::repo().join("tests/fixtures/verl_sft_examples_0_7_0/overrides.json");
    let calls: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture).expect("fixture")).expect("json");
    for (i, call) in calls.iter().enumerate() {
        let script = format!("0.7.0 {}", call["script"].as_str().unwrap_or("?"));
        if call["config_name"] != "sft_trainer" {
            continue;
        }
        let overrides = call_overrides(call);
        let model = overrides
            .iter()
            .find_map(|o| o.strip_prefix("model.partial_pretrain="))
            .unwrap_or_default();
        if !implemented(model) {
            skipped.push(format!("{script}: {model} is not implemented"));
            continue;
        }
        let mut retargeted: Vec<String> = retarget(&overrides, &dir.join(format!("legacy{i}")))
            .into_iter()
            // Keys of the engine trainer's config that the legacy one does not have.
            .filter(|o| {
                ![
                    "model.path=",
                    "model.partial_pretrain=",
                    "data.max_token_len_per_gpu=",
                ]
                .iter()
                .any(|k| o.starts_with(k))
            })
            .collect();
        retargeted.push(format!("model.partial_pretrain={}", tiny_for(model)));
        let compiled = compile(
            &LoadRequest {
                config_name: Some("sft_trainer".into()),
                overrides: retargeted,
                builtin: BuiltinRelease::V0_7_0,
                ..Default::default()
            },
            &CheckOptions::default(),
            Mode::Build {
                deny_warnings: false,
            },
        );
        let Some(Planned::Sft(plan)) = compiled.planned else {
            panic!("{script}: {:#?}", errors(&compiled.checked.diagnostics));
        };
        names.push(script);
        specs.push(plan.spec);
    }
}

/// Keys of verl's example calls that the retargeting replaces.
const RETARGETED: &[&str] = &[
    "data.train_files",
    "data.val_files",
    "model.path",
    "model.partial_pretrain",
    "trainer.default_local_dir",
    "trainer.logger",
    "trainer.total_epochs",
    "trainer.total_training_steps",
    "trainer.n_gpus_per_node",
    "trainer.nnodes",
    "data.train_batch_size",
    "data.micro_batch_size_per_gpu",
    "data.max_token_len_per_gpu",
    "data.max_length",
    "data.train_max_samples",
    "data.val_max_samples",
];

/// Parallel degrees clipped to the 2 ranks.
const CLIPPED: &[&str] = &[
    "engine.ulysses_sequence_parallel_size",
    // verl 0.7.0's legacy config keeps it at the top.
    "ulysses_sequence_parallel_size",
    "engine.tensor_model_parallel_size",
    "engine.pipeline_model_parallel_size",
    "engine.context_parallel_size",
    "engine.expert_model_parallel_size",
];

/// An example call retargeted to the tiny model, the built-in conversations and 2 CPU ranks
/// training 2 steps in `work`.
fn retarget(overrides: &[String], work: &Path) -> Vec<String> {
    let mut o: Vec<String> = overrides
        .iter()
        .filter(|o| {
            let key = o
                .split('=')
                .next()
                .unwrap_or_default()
                .trim_start_matches('+');
            !RETARGETED.contains(&key)
        })
        .map(|o| {
            let (k, v) = o.split_once('=').unwrap_or((o, ""));
            match v.parse::<u64>() {
                Ok(n) if CLIPPED.contains(&k) && n > 2 => format!("{k}=2"),
                _ => o.clone(),
            }
        })
        .collect();
    let model = overrides
        .iter()
        .find_map(|o| {
            o.strip_prefix("model.path=")
                .or_else(|| o.strip_prefix("model.partial_pretrain="))
        })
        .unwrap_or_default();
    o.extend([
        format!("model.path={}", tiny_for(model)),
        "data.train_files='builtin://digit_reversal?split=train&size=16'".to_owned(),
        "data.val_files='builtin://digit_reversal?split=test&size=8'".to_owned(),
        "data.train_batch_size=4".to_owned(),
        "data.micro_batch_size_per_gpu=2".to_owned(),
        "data.max_token_len_per_gpu=256".to_owned(),
        "data.max_length=64".to_owned(),
        "trainer.device=cpu".to_owned(),
        "trainer.nnodes=1".to_owned(),
        "trainer.n_gpus_per_node=2".to_owned(),
        "trainer.total_training_steps=2".to_owned(),
        "trainer.logger=[]".to_owned(),
        format!("trainer.default_local_dir={}", work.join("ckpt").display()),
    ]);
    o
}

/// verl 0.9.0's SFT example calls (`tests/fixtures/verl_sft_examples_0_9_0`) whose model and
/// engine verlc implements, retargeted (see [`retarget`]), lower to SFT specs without an error
/// and train their two steps on two ranks; the calls verl itself fails on (a check error) and
/// those of families verlc lacks are listed.
#[test]
fn verls_sft_examples_train_two_steps_on_two_ranks() {
    tch::set_num_threads(1);
    let dir = scratch("sft_examples");
    let fixture =
        crate::support::repo().join("tests/fixtures/verl_sft_examples_0_9_0/overrides.json");
    let calls: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(fixture).expect("fixture")).expect("json");
    let mut specs = Vec::new();
    let mut names = Vec::new();
    let mut skipped = Vec::new();
    let mut implemented_calls = 0;
    for (i, call) in calls.iter().enumerate() {
        let script = call["script"].as_str().unwrap_or("?").to_owned();
        let overrides = call_overrides(call);
        let model = overrides
            .iter()
            .find_map(|o| o.strip_prefix("model.path="))
            .unwrap_or_default();
        if !implemented(model) {
            skipped.push(format!(
                "{script}: {model} is not a family verlc implements"
            ));
            continue;
        }
        let compiled = compile_sft(
            BuiltinRelease::V0_9_0,
            retarget(&overrides, &dir.join(format!("run{i}"))),
        );
        // What verl fails on too is skipped; what only verlc cannot honour (B018) fails.
        let (refused, failing): (Vec<_>, Vec<_>) = compiled
            .checked
            .diagnostics
            .iter()
            .filter(|d| d.is_error())
            .partition(|d| d.code == verlc_front::codes::BUILD_UNSUPPORTED_SETTING);
        if !failing.is_empty() {
            skipped.push(format!(
                "{script}: verl fails on it too: {:?}",
                errors(&compiled.checked.diagnostics)
            ));
            continue;
        }
        // A call verl runs, of a family verlc implements.
        implemented_calls += 1;
        if !refused.is_empty() {
            // What verlc refuses at a key (B018): listed, and bounded below.
            skipped.push(format!(
                "{script}: verlc refuses {:?}",
                errors(&compiled.checked.diagnostics)
            ));
            continue;
        }
        let Some(Planned::Sft(plan)) = compiled.planned else {
            panic!("{script}: no SFT plan");
        };
        let spec = plan.spec;
        names.push(script);
        specs.push(spec);
    }
    let engine_calls = specs.len();
    // The bar: at least 80% of the calls of families verlc implements run.
    assert!(
        engine_calls * 5 >= implemented_calls * 4,
        "{engine_calls} of {implemented_calls}: {skipped:#?}"
    );
    // verl 0.7.0's legacy trainer's calls, run in the same rank processes.
    legacy_example_specs(&dir, &mut names, &mut specs, &mut skipped);
    eprintln!(
        "{} example calls run: {names:#?}\nnot run: {skipped:#?}",
        specs.len()
    );
    // DeepSeek-Coder, Gemma 2B and 7B, Qwen2.5 (single- and multi-turn), Qwen3 with LoRA and
    // Ulysses, Qwen2.5 on Megatron with tensor parallelism, Qwen2.5 on AutoModel (its
    // Qwen3-MoE call uses expert parallelism, refused), Seed-OSS.
    assert!(engine_calls >= 9, "{names:?}");
    // 0.7.0's legacy calls, all of whose families verlc has (DeepSeek-Coder; Gemma 2B and 7B;
    // Qwen2.5 single-turn with LoRA, with Ulysses, and multi-turn; Qwen3 with LoRA and
    // Ulysses; Seed-OSS): 9 of 9.
    assert_eq!(specs.len() - engine_calls, 9, "{names:?}");
    assert!(specs[engine_calls..].iter().all(|s| s.trainer.is_legacy()));
    assert!(specs.iter().any(|s| s.model.lora.is_some()));
    assert!(
        specs
            .iter()
            .any(|s| s.binding.strategy == StrategyKind::Megatron)
    );
    for ((name, spec), ranks) in names
        .iter()
        .zip(&specs)
        .zip(two_ranks_all(&specs, &dir.join("job")))
    {
        // The last step's checkpoint: the model, and with LoRA its PEFT adapter.
        let last = Path::new(&spec.run.checkpoint_dir).join("global_step_2");
        assert!(
            last.join("huggingface/model.safetensors").is_file(),
            "{name}"
        );
        if spec.model.lora.is_some() {
            assert!(
                last.join("lora_adapter/adapter_config.json").is_file(),
                "{name}: no adapter"
            );
        }
        for history in ranks {
            assert_eq!(history.last().map(|(s, _)| *s), Some(2), "{name}");
            let loss = metric(&history, 2, "train/loss");
            assert!(loss.is_finite() && loss > 0.0, "{name}: loss {loss}");
            assert!(metric(&history, 2, "val/loss").is_finite(), "{name}");
        }
    }
}

/// The Hydra overrides of a recorded example call (`overrides.json`).
fn call_overrides(call: &serde_json::Value) -> Vec<String> {
    call["overrides"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|o| o.as_str().map(str::to_owned))
        .collect()
}
