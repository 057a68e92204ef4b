//! The trainer learns: GRPO on digit reversal (the quickstart's recipe, shortened) and PPO
//! with a GAE critic raise the mean score clearly from a fresh tiny model.

use crate::support::{mean, quiet, scratch, series, small_grpo, small_grpo_on};

/// The quickstart's task and recipe at test size (fewer samples, higher lr): 3-digit reversal,
/// 2-layer model, entropy bonus.
const RECIPE: &[&str] = &[
    "data.train_files='builtin://digit_reversal?split=train&min_digits=3&max_digits=3&size=700'",
    "data.val_files='builtin://digit_reversal?split=test&min_digits=3&max_digits=3&size=64'",
    "data.max_response_length=4",
    "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=128'",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "actor_rollout_ref.actor.optim.lr=2e-3",
    "actor_rollout_ref.actor.entropy_coeff=0.03",
    "actor_rollout_ref.rollout.dtype=float32",
];

fn with(extra: &[&'static str]) -> Vec<&'static str> {
    RECIPE.iter().chain(extra).copied().collect()
}

#[test]
fn grpo_quickstart_short_run_raises_the_score() {
    let dir = scratch("grpo_learns");
    let steps = 30;
    let cfg = small_grpo(
        &dir,
        steps,
        &with(&[
            "actor_rollout_ref.rollout.n=8",
            "data.train_batch_size=16",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32",
            "actor_rollout_ref.actor.ppo_epochs=2",
        ]),
    );
    let t = std::time::Instant::now();
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("training runs");
    let scores = series(&summary.history, "critic/score/mean");
    eprintln!(
        "grpo scores ({:.1}s): {scores:.3?}",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(scores.len(), steps as usize);
    let (first, last) = (mean(&scores[..4]), mean(&scores[scores.len() - 4..]));
    assert!(
        last > 1.8 * first && last > first + 0.08,
        "no clear rise: first 4 steps {first:.3}, last 4 {last:.3}"
    );
}

#[test]
fn ppo_with_a_gae_critic_learns() {
    let dir = scratch("ppo_learns");
    let steps = 30;
    let cfg = small_grpo(
        &dir,
        steps,
        &with(&[
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.rollout.n=1",
            "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=16",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16",
            "critic.ppo_mini_batch_size=16",
            "critic.ppo_micro_batch_size_per_gpu=16",
            "critic.optim.lr=2e-3",
            "critic.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2'",
            "+critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
        ]),
    );
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("training runs");
    let scores = series(&summary.history, "critic/score/mean");
    let vf = series(&summary.history, "critic/vf_loss");
    eprintln!("ppo scores: {scores:.3?}\nvf_loss: {vf:.4?}");
    assert_eq!(vf.len(), steps as usize, "the critic is updated every step");
    assert!(
        summary
            .history
            .iter()
            .all(|(_, m)| m.contains_key("critic/vf_explained_var"))
    );
    let (first, last) = (mean(&scores[..4]), mean(&scores[scores.len() - 4..]));
    assert!(
        last > 1.8 * first && last > first + 0.08,
        "no clear rise: first 4 steps {first:.3}, last 4 {last:.3}"
    );
}

/// verl 0.9's optimal token baseline runs in the loop: the old-log-prob pass computes Σπ²
/// (`calculate_sum_pi_squared`, a key the 0.7.0 default tree lacks, hence `+`), the estimator
/// reads it, and the `variance_proxy/*` metrics are logged each step with the update's
/// gradient norm as the signal strength.
#[test]
fn optimal_token_baseline_runs_with_its_variance_metrics() {
    let dir = scratch("otb_runs");
    let steps = 3;
    // A 0.7.1 estimator: on the newest release's tree.
    let cfg = small_grpo_on(
        &dir,
        steps,
        &with(&[
            "actor_rollout_ref.rollout.n=4",
            "algorithm.adv_estimator=optimal_token_baseline",
            "actor_rollout_ref.actor.calculate_sum_pi_squared=true",
        ]),
        verlc_front::load::version::BuiltinRelease::V0_9_1,
    );
    let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("training runs");
    assert_eq!(summary.history.len(), steps as usize);
    for (step, m) in &summary.history {
        let signal = m["variance_proxy/proxy1_signal_strength"];
        let grad = m["actor/grad_norm"];
        assert!(
            (signal - grad * grad).abs() <= 1e-9 * (1.0 + signal),
            "step {step}"
        );
        for k in ["proxy2_total_power", "expected_a_squared", "expected_w"] {
            let v = m[&format!("variance_proxy/{k}")];
            assert!(v.is_finite() && v >= 0.0, "step {step}: {k} = {v}");
        }
        assert!(
            m["critic/advantages/max"] > m["critic/advantages/min"],
            "step {step}"
        );
    }
}

/// On-policy distillation alone (verl 0.9's `use_task_rewards: false`): a fresh tiny student
/// learns from a wider teacher of the same vocabulary, in verl's forms. Supervised (`k3`
/// reverse KL on the student's own samples, back-propagated through its log-probs; the top-k
/// forward KL against the teacher's 8 most likely tokens at each position) and as a policy
/// gradient (`k1` as a negative reward, the examples' default): the distillation loss falls
/// clearly over the run. The Megatron engine's teachers score as well.
#[test]
fn on_policy_distillation_pulls_the_student_to_its_teacher() {
    use verlc_spec::algo::KlKind;
    use verlc_spec::trainer::{DistillationLossSpec, DistillationMode};

    let top_k = DistillationMode::ForwardKlTopk {
        topk: 8,
        log_prob_min_clamp: Some(-10.0),
    };
    for (name, mode, use_policy_gradient) in [
        ("k3", DistillationMode::Estimator(KlKind::K3), false),
        ("k1_pg", DistillationMode::Estimator(KlKind::K1), true),
        ("topk", top_k, false),
    ] {
        let dir = scratch(&format!("distillation_{name}"));
        let steps = 20;
        let mut cfg = small_grpo(
            &dir,
            steps,
            &with(&[
                "actor_rollout_ref.rollout.n=4",
                "data.train_batch_size=16",
                "actor_rollout_ref.actor.ppo_mini_batch_size=16",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=64",
                "actor_rollout_ref.actor.entropy_coeff=0",
                "actor_rollout_ref.actor.optim.lr=5e-3",
            ]),
        );
        with_teacher(
            &mut cfg,
            DistillationLossSpec {
                mode,
                use_task_rewards: false,
                coef: 1.0,
                loss_max_clamp: Some(10.0),
                use_policy_gradient,
                clip_ratio_low: 0.2,
                clip_ratio_high: 0.2,
            },
        );
        let summary = verlc_runtime::trainer::run(&cfg, &quiet()).expect("training runs");
        // The estimators' mean |d| per token (comparable across forms: k1's d has either
        // sign); the top-k KL is never negative.
        let metric = match mode {
            DistillationMode::Estimator(_) => "actor/distillation/abs_loss",
            DistillationMode::ForwardKlTopk { .. } => "actor/distillation/loss",
        };
        let loss = series(&summary.history, metric);
        eprintln!("{mode:?} pg={use_policy_gradient}: {loss:.3?}");
        assert_eq!(loss.len(), steps as usize);
        let (first, last) = (mean(&loss[..3]), mean(&loss[loss.len() - 3..]));
        assert!(
            last < 0.7 * first,
            "{mode:?}: no clear fall: first 3 steps {first:.3}, last 3 {last:.3}"
        );
        let keys = summary.history[0]
            .1
            .keys()
            .filter(|k| k.starts_with("actor/distillation/"));
        // abs_loss or the masses and overlap, loss_min/max, loss; the PG form's clip metrics.
        let expected = match (mode, use_policy_gradient) {
            (DistillationMode::ForwardKlTopk { .. }, _) => 11,
            (_, true) => 7,
            (_, false) => 4,
        };
        assert_eq!(keys.count(), expected, "{:?}", summary.history[0].1.keys());
        if let DistillationMode::ForwardKlTopk { .. } = mode {
            // The student's top-k comes to hold more of the teacher's.
            let overlap = series(&summary.history, "actor/distillation/overlap_ratio");
            assert!(
                mean(&overlap[overlap.len() - 3..]) > mean(&overlap[..3]),
                "{overlap:.3?}"
            );
        }
    }
    // The Megatron engine scores with its teacher too (one process, a few steps).
    let dir = scratch("distillation_megatron");
    let mut cfg = crate::support::spec_of(
        "quickstart_megatron.yaml",
        &[
            format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
            "trainer.total_training_steps=3".into(),
            "trainer.val_before_train=false".into(),
            "trainer.test_freq=-1".into(),
            "trainer.logger=[]".into(),
            "data.train_batch_size=8".into(),
            "actor_rollout_ref.actor.ppo_mini_batch_size=8".into(),
        ],
    );
    with_teacher(
        &mut cfg,
        DistillationLossSpec {
            mode: top_k,
            use_task_rewards: true,
            coef: 0.5,
            loss_max_clamp: None,
            use_policy_gradient: false,
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.2,
        },
    );
    let roles = verlc_runtime::trainer::parallel::MegatronRoles { world: None };
    let summary = verlc_runtime::trainer::run_with(&cfg, &quiet(), roles).expect("Megatron run");
    let loss = series(&summary.history, "actor/distillation/loss");
    assert_eq!(loss.len(), 3);
    assert!(loss.iter().all(|v| v.is_finite() && *v > 0.0), "{loss:?}");
    let mass = series(&summary.history, "actor/distillation/teacher_mass");
    assert!(
        mass.iter().all(|m| *m > 0.0 && *m <= 1.0 + 1e-6),
        "{mass:?}"
    );
}

/// A vision-language student (the tiny Qwen3-VL reading pictures) with verl's multi-teacher
/// routing by `data_source`: its picture rows go to a vision-language teacher, and a text
/// teacher of another source scores none of them (it runs over the batch as text, the
/// pictures' rows as padding, its values dropped there). Routing the pictures to the text
/// teacher is an error that names it, not a panic or a silent blind score.
#[test]
fn a_vision_language_student_distils_from_teachers_routed_by_data_source() {
    use verlc_spec::algo::KlKind;
    use verlc_spec::trainer::{
        DistillationLossSpec, DistillationMode, DistillationSpec, TeacherSpec,
    };
    let vl = "builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2&arch=qwen3_vl";
    let text = "builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2&arch=qwen3";
    let run = |tag: &str, text_key: &str, vl_key: &str| {
        let dir = scratch(tag);
        let model = format!("actor_rollout_ref.model.path='{vl}'");
        let mut cfg = small_grpo(
            &dir,
            2,
            &[
                model.as_str(),
                "data.train_files='builtin://color_digits?split=train&size=32&stripes=1'",
                "data.val_files='builtin://color_digits?split=test&size=8&stripes=1'",
            ],
        );
        cfg.distillation = Some(DistillationSpec {
            teachers: vec![
                TeacherSpec {
                    key: Some(text_key.into()),
                    model_path: text.into(),
                },
                TeacherSpec {
                    key: Some(vl_key.into()),
                    model_path: vl.into(),
                },
            ],
            engine: cfg.actor.engine,
            micro_batch: 64,
            max_token_len: None,
        });
        cfg.actor.update.distillation = Some(DistillationLossSpec {
            mode: DistillationMode::Estimator(KlKind::K1),
            use_task_rewards: true,
            coef: 1.0,
            loss_max_clamp: Some(10.0),
            use_policy_gradient: true,
            clip_ratio_low: 0.2,
            clip_ratio_high: 0.2,
        });
        verlc_runtime::trainer::run(&cfg, &quiet())
    };
    let summary = run(
        "distillation_vl",
        "builtin/digit_reversal",
        "builtin/color_digits",
    )
    .expect("trains with its teachers");
    let loss = series(&summary.history, "actor/distillation/abs_loss");
    assert_eq!(loss.len(), 2);
    assert!(loss.iter().all(|v| v.is_finite() && *v > 0.0), "{loss:?}");
    let err = run(
        "distillation_vl_misrouted",
        "builtin/color_digits",
        "builtin/digit_reversal",
    )
    .expect_err("pictures routed to a text teacher");
    assert!(err.to_string().contains("is a text model"), "{err}");
}

/// On-policy distillation from a wider tiny teacher of the same vocabulary, on the actor's
/// engine settings, with the loss term `loss`.
fn with_teacher(
    cfg: &mut verlc_spec::TrainerSpec,
    loss: verlc_spec::trainer::DistillationLossSpec,
) {
    use verlc_spec::trainer::{DistillationSpec, TeacherSpec};
    cfg.distillation = Some(DistillationSpec {
        teachers: vec![TeacherSpec {
            key: None,
            model_path: "builtin://tiny?layers=2&hidden=64".into(),
        }],
        engine: cfg.actor.engine,
        micro_batch: 64,
        max_token_len: None,
    });
    cfg.actor.update.distillation = Some(loss);
}

/// Every family of the model table trains the quickstart on its tiny model (two steps on one
/// process): a new family's row is enough for `builtin://tiny?arch=` and the whole trainer.
#[test]
fn every_family_trains_the_quickstart_on_its_tiny_model() {
    for row in verlc_spec::families::FAMILIES {
        let dir = scratch(&format!("family_{}", row.tiny_arch));
        let model = format!(
            "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2&arch={}'",
            row.tiny_arch
        );
        let cfg = small_grpo(&dir, 2, &[model.as_str()]);
        let summary = verlc_runtime::trainer::run(&cfg, &quiet())
            .unwrap_or_else(|e| panic!("{}: {e}", row.name));
        let losses = series(&summary.history, "actor/pg_loss");
        assert_eq!(losses.len(), 2, "{}: {:?}", row.name, summary.history);
        assert!(
            losses.iter().all(|l| l.is_finite()),
            "{}: pg_loss {losses:?}",
            row.name
        );
        let norms = series(&summary.history, "actor/grad_norm");
        assert!(
            norms.iter().all(|n| n.is_finite() && *n > 0.0),
            "{}: grad_norm {norms:?}",
            row.name
        );
    }
}

/// The vision-language example (`examples/color_digits_vl.yaml`: a tiny Qwen2.5-VL reading
/// coloured stripes) trains on its images, and `freeze_vision_tower` keeps the tower as
/// initialised while the text model moves; the checkpoint carries the image processor's file.
#[test]
fn a_vision_language_model_trains_on_its_images_with_its_tower_frozen() {
    use verlc_runtime::model::{Dtype, from_pretrained};
    let dir = scratch("vision_language");
    let overrides: Vec<String> = [
        "trainer.total_training_steps=2",
        "data.train_batch_size=8",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "actor_rollout_ref.actor.freeze_vision_tower=true",
        "trainer.logger=[]",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        "trainer.save_freq=2",
    ]
    .iter()
    .map(|s| s.to_string())
    .chain([format!(
        "trainer.default_local_dir={}",
        dir.join("ckpt").display()
    )])
    .collect();
    let spec = crate::support::spec_of("color_digits_vl.yaml", &overrides);
    assert!(spec.actor.optim.freeze_vision_tower);
    let summary = verlc_runtime::trainer::run(&spec, &quiet()).expect("vision-language run");
    let norms = series(&summary.history, "actor/grad_norm");
    assert_eq!(norms.len(), 2);
    assert!(norms.iter().all(|n| n.is_finite() && *n > 0.0), "{norms:?}");
    let saved = dir.join("ckpt/global_step_2/actor/huggingface");
    assert!(saved.join("preprocessor_config.json").is_file());
    let trained = from_pretrained(
        saved.to_str().expect("path"),
        tch::Device::Cpu,
        Dtype::Fp32,
        0,
    )
    .expect("saved model");
    let fresh = from_pretrained(
        &spec.actor.model_path,
        tch::Device::Cpu,
        Dtype::Fp32,
        spec.model_seed,
    )
    .expect("initial model");
    let (mut tower, mut text) = (0, 0);
    for (name, t) in fresh.vs.variables() {
        let same = t.equal(&trained.vs.variables()[&name]);
        if name.starts_with("visual.") {
            assert!(same, "{name} moved although the tower is frozen");
            tower += 1;
        } else if !same {
            text += 1;
        }
    }
    assert!(tower > 10 && text > 0, "tower {tower}, text moved {text}");
}

/// Videos through a run (verl's multimodal layout: a `<video>` placeholder in the prompt and
/// a `videos` column whose cells are frame lists of PNG bytes): the tiny Qwen2.5-VL's prompts
/// carry each video's placeholders (a token per merged patch), the rollout prefills the
/// tower's embeddings of the frames at their M-RoPE positions, and the actor's recomputed
/// log-probs of the sampled tokens, with the same videos, equal the rollout's; so through the
/// tool agent loop with the tiny Qwen3-VL on video files (H.264, sampled and timestamped from
/// the file), and on Megatron. A row whose video file is missing is refused when the data is
/// read, naming the column and the file.
#[test]
fn a_vision_language_model_trains_on_videos_as_frames_and_files() {
    let dir = scratch("video_language");
    let script = r#"
import io, subprocess, sys, pyarrow as pa, pyarrow.parquet as pq
from PIL import Image
out = sys.argv[1]
colors = [(230, 30, 30), (30, 200, 30), (30, 30, 230), (220, 220, 30)]
def frame(c, shade):
    b = io.BytesIO()
    Image.new("RGB", (40, 28), tuple(min(255, x + shade) for x in c)).save(b, format="PNG")
    return {"bytes": b.getvalue(), "path": None}
def row(i, video):
    return {"data_source": "builtin/color_digits",
            "prompt": [{"role": "user", "content": "<video>what is the answer?"}],
            "videos": [video], "ability": "vision",
            "reward_model": {"style": "rule", "ground_truth": str(i % 4)},
            "extra_info": {"split": "train", "index": i}}
rows = [row(i, [frame(colors[i % 4], s) for s in (0, 20, 40)]) for i in range(8)]
pq.write_table(pa.Table.from_pylist(rows), f"{out}/videos.parquet")
# The same colours as two-second H.264 clips, cells holding their paths as verl's rows do.
for k, c in enumerate(colors):
    subprocess.run(["ffmpeg", "-v", "error", "-y", "-f", "lavfi", "-i",
                    "color=c=0x%02x%02x%02x:size=40x28:rate=4:duration=2" % c,
                    "-c:v", "libx264", "-pix_fmt", "yuv420p", f"{out}/clip{k}.mp4"], check=True)
rows = [row(i, f"{out}/clip{i % 4}.mp4") for i in range(8)]
pq.write_table(pa.Table.from_pylist(rows), f"{out}/video_files.parquet")
pq.write_table(pa.Table.from_pylist([row(0, f"{out}/missing.mp4")]), f"{out}/missing_video.parquet")
"#;
    let status = std::process::Command::new(crate::common::python())
        .arg("-c")
        .arg(script)
        .arg(&dir)
        .status()
        .expect("python");
    assert!(status.success(), "writing the video rows failed");
    let overrides = |file: &str| -> Vec<String> {
        [
            "trainer.total_training_steps=2",
            "data.train_batch_size=4",
            "data.max_prompt_length=400",
            "actor_rollout_ref.rollout.n=2",
            "actor_rollout_ref.rollout.calculate_log_probs=true",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "trainer.logger=[]",
            "trainer.val_before_train=false",
            "trainer.test_freq=-1",
            "trainer.save_freq=-1",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([
            format!("data.train_files={}", dir.join(file).display()),
            format!("data.val_files={}", dir.join(file).display()),
            format!("trainer.default_local_dir={}", dir.join("ckpt").display()),
        ])
        .collect()
    };
    // Single turns, verl's tool agent loop (its prompt rendered again from the row's
    // conversation, the video's tokens in it), and the Megatron engine (its first stage embeds
    // the videos; its rollout decodes the model's shards).
    for (agent, megatron) in [(false, false), (true, false), (false, true)] {
        let mut o = overrides(if agent {
            "video_files.parquet"
        } else {
            "videos.parquet"
        });
        if agent {
            // On the tiny Qwen3-VL: its prompts hold each temporal patch apart, behind its
            // timestamp, and its positions take each as a one-frame video.
            o.extend([
                "actor_rollout_ref.rollout.multi_turn.enable=true".to_owned(),
                "actor_rollout_ref.model.path='builtin://tiny?arch=qwen3_vl&layers=2&hidden=64'"
                    .to_owned(),
            ]);
        }
        let summary = if megatron {
            o.extend([
                "actor_rollout_ref.model.path='builtin://tiny?arch=qwen2_5_vl&layers=2&hidden=64'"
                    .to_owned(),
                "data.max_response_length=3".to_owned(),
            ]);
            let spec = crate::support::spec_of("quickstart_megatron.yaml", &o);
            let roles = verlc_runtime::trainer::parallel::MegatronRoles { world: None };
            verlc_runtime::trainer::run_with(&spec, &quiet(), roles).expect("videos on Megatron")
        } else {
            let spec = crate::support::spec_of("color_digits_vl.yaml", &o);
            verlc_runtime::trainer::run(&spec, &quiet()).expect("a run on videos")
        };
        let lengths = series(&summary.history, "prompt_length/max");
        // Four frames (three padded, or four of a clip's eight at two a second): two temporal
        // patches of at least 128 merged patches.
        assert!(
            lengths.iter().all(|&l| l > 256.0),
            "agent {agent}: {lengths:?}"
        );
        // The rollout's probabilities are the actor's over one minus the masked image and
        // video placeholders' mass (a few thousandths here: the tiny model's logits are
        // random, and its vocabulary small).
        let gap = series(&summary.history, "training/rollout_probs_diff_max");
        assert_eq!(gap.len(), 2);
        assert!(
            gap.iter().all(|&d| d < 2e-2),
            "agent {agent}, megatron {megatron}: rollout vs actor log-probs: {gap:?}"
        );
        if agent {
            let turns = series(&summary.history, "num_turns/mean");
            assert!(
                !turns.is_empty() && turns.iter().all(|&t| t >= 2.0),
                "{turns:?}"
            );
        }
    }

    let spec = crate::support::spec_of("color_digits_vl.yaml", &overrides("missing_video.parquet"));
    let err = verlc_runtime::trainer::run(&spec, &quiet())
        .expect_err("a missing video file")
        .to_string();
    assert!(
        err.contains("column `videos`") && err.contains("missing.mp4"),
        "{err}"
    );
}
