//! The trainer over several ranks (FSDP over 2 data-parallel ranks, Megatron with tensor
//! parallelism 2): rank processes of this test binary run `verlc_runtime::trainer::run_with` and
//! write their metric history; with greedy rollouts the run must match the same config in
//! one process step by step, every rank must report the same metrics, and a 2-rank
//! checkpoint must resume into exactly the step the uninterrupted run took.

use std::path::{Path, PathBuf};
use std::time::Duration;

use verlc_runtime::engine::Metrics;
use verlc_runtime::parallel::dist::{InitOptions, ProcessGroup};
use verlc_runtime::trainer::checkpoint::{list_steps, read_tracker, step_dir};
use verlc_runtime::trainer::parallel::{FsdpRoles, MegatronRoles};
use verlc_spec::TrainerSpec;

use crate::support::{is_timing, quiet, scratch};

const CHILD: &str = "distributed::rank_child";
const DIR_ENV: &str = "VERLC_DIST_TRAINER_DIR";

/// Greedy rollouts make the generated data independent of how prompts are split; one
/// mini-batch per step makes each optimizer step see the same rows however they are split
/// (with smaller mini-batches every data-parallel rank takes its first rows, as in verl).
const COMMON: &[&str] = &[
    "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2'",
    "data.train_batch_size=8",
    "data.max_response_length=6",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.rollout.do_sample=false",
    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
    "actor_rollout_ref.actor.optim.lr=1e-3",
    "trainer.logger=[]",
    "trainer.val_before_train=false",
    "trainer.test_freq=-1",
    "trainer.total_training_steps=3",
];

/// FSDP: PPO with a GAE critic, the in-reward KL penalty (reference model) and PF-PPO's
/// resampling (the same draw on every rank); the actor is a tiny Qwen3-Next (Qwen3.5-MoE's
/// Gated DeltaNet and gated attention layers, routed experts and a shared expert), sharded
/// like any model, its checkpoints written with the fused DeltaNet projections of its
/// family and resumed from them.
/// Every token takes all 4 experts: the sharded reductions round in another order than one
/// process, and with top-2 of 4 a near-tie flips some token's experts by step 2 (metrics
/// then move by about 1%, beyond what this comparison allows; Qwen3-MoE at top-2 happens to
/// stay within it).
const FSDP: &[&str] = &[
    "actor_rollout_ref.model.path='builtin://tiny?layers=4&hidden=64&heads=4&kv_heads=2&arch=qwen3_next&experts=4&experts_per_tok=4&moe_intermediate=32'",
    "algorithm.adv_estimator=gae",
    "algorithm.use_pf_ppo=true",
    "algorithm.pf_ppo.reweight_method=pow",
    "algorithm.use_kl_in_reward=true",
    "actor_rollout_ref.actor.use_kl_loss=false",
    "critic.ppo_mini_batch_size=8",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "critic.optim.lr=1e-3",
    "critic.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2'",
    "+critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
];

/// FSDP with LoRA: GRPO with the KL loss, whose reference is the actor with its adapters off.
const LORA: &[&str] = &[
    "actor_rollout_ref.model.lora_rank=4",
    "actor_rollout_ref.model.lora_alpha=8",
    "actor_rollout_ref.model.target_modules=all-linear",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.actor.kl_loss_coef=0.1",
    "actor_rollout_ref.actor.optim.lr=2e-2",
];

/// Megatron: PPO with a GAE critic (both tensor-parallel) and the KL loss.
const MEGATRON: &[&str] = &[
    "algorithm.adv_estimator=gae",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "critic.ppo_mini_batch_size=8",
    "critic.ppo_micro_batch_size_per_gpu=2",
    "critic.optim.lr=1e-3",
    "critic.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2'",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
];

/// The spec of the job, in fp32 (both quickstarts train in fp32): these tests compare rank
/// layouts with one process, in the precision where 2e-3 agreement is meaningful.
/// Overrides of verl 0.9's v1 trainer compose with that release's tree.
fn config(example: &str, overrides: &[String]) -> TrainerSpec {
    let release = if overrides.iter().any(|o| o.starts_with("trainer.v1.")) {
        verlc_front::load::version::BuiltinRelease::V0_9_1
    } else {
        verlc_front::load::version::BuiltinRelease::V0_7_0
    };
    let spec = crate::support::spec_on(example, overrides, release);
    assert_eq!(
        spec.binding.precision,
        verlc_spec::Dtype::Fp32,
        "{example} binds fp32"
    );
    spec
}

/// What a run is: the example, its overrides, and where it writes.
struct Job {
    example: &'static str,
    overrides: Vec<String>,
}

impl Job {
    fn new(example: &'static str, extra: &[&str], dir: &Path, world: usize) -> Job {
        let mut overrides: Vec<String> =
            COMMON.iter().chain(extra).map(|s| s.to_string()).collect();
        overrides.push(format!(
            "trainer.default_local_dir={}",
            dir.join("ckpt").display()
        ));
        overrides.push(format!("trainer.n_gpus_per_node={world}"));
        Job { example, overrides }
    }

    fn with(mut self, extra: &[String]) -> Job {
        self.overrides.extend(extra.iter().cloned());
        self
    }
}

/// The child: one rank of the job described by the files in `$VERLC_DIST_TRAINER_DIR`.
#[test]
fn rank_child() {
    let Ok(dir) = std::env::var(DIR_ENV) else {
        return;
    };
    let dir = PathBuf::from(dir);
    tch::set_num_threads(1);
    let read = |f: &str| std::fs::read_to_string(dir.join(f)).expect("job file");
    let example = read("example");
    let overrides: Vec<String> = read("overrides").lines().map(str::to_owned).collect();
    let cfg = config(&example, &overrides);
    let world = ProcessGroup::init_from_env(&InitOptions {
        timeout: Duration::from_secs(120),
        ..InitOptions::default()
    })
    .expect("init process group");
    let rank = world.rank();
    let summary = if example.contains("megatron") {
        verlc_runtime::trainer::run_with(&cfg, &quiet(), MegatronRoles { world: Some(world) })
    } else {
        verlc_runtime::trainer::run_with(&cfg, &quiet(), FsdpRoles { world })
    }
    .expect("distributed run");
    let json = serde_json::to_string(&summary.history).expect("json");
    std::fs::write(dir.join(format!("history.rank{rank}.json")), json).expect("write history");
    crate::common::rank_passed();
}

/// Runs `job` on `world` rank processes; returns each rank's history.
fn run_ranks(job: &Job, dir: &Path, world: usize) -> Vec<Vec<(u64, Metrics)>> {
    run_ranks_with(job, dir, world, &[])
}

/// [`run_ranks`] with more environment for the rank processes.
fn run_ranks_with(
    job: &Job,
    dir: &Path,
    world: usize,
    env: &[(&str, String)],
) -> Vec<Vec<(u64, Metrics)>> {
    let jobdir = dir.join("job");
    let _ = std::fs::remove_dir_all(&jobdir);
    std::fs::create_dir_all(&jobdir).expect("job dir");
    std::fs::write(jobdir.join("example"), job.example).expect("write");
    std::fs::write(jobdir.join("overrides"), job.overrides.join("\n")).expect("write");
    let mut env = env.to_vec();
    env.push((DIR_ENV, jobdir.display().to_string()));
    crate::common::launch_ranks(rank_child, CHILD, world, &env, Duration::from_secs(300));
    (0..world)
        .map(|r| {
            let text = std::fs::read_to_string(jobdir.join(format!("history.rank{r}.json")))
                .expect("history");
            serde_json::from_str(&text).expect("history json")
        })
        .collect()
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a.is_nan() && b.is_nan()) || (a - b).abs() <= rel * a.abs().max(b.abs()).max(1e-3)
}

/// Every non-timing metric of `one` (one process) within `rel` in `many`, step by step.
fn assert_matches(one: &[(u64, Metrics)], many: &[(u64, Metrics)], rel: f64, what: &str) {
    assert_eq!(one.len(), many.len(), "{what}: steps");
    let mut wrong = Vec::new();
    for ((s1, m1), (s2, m2)) in one.iter().zip(many) {
        assert_eq!(s1, s2);
        for (k, v) in m1.iter().filter(|(k, _)| !is_timing(k)) {
            match m2.get(k) {
                Some(w) if close(*v, *w, rel) => {}
                Some(w) => wrong.push(format!("step {s1} {k}: one process {v}, ranks {w}")),
                None => wrong.push(format!("step {s1}: no {k}")),
            }
        }
    }
    assert!(wrong.is_empty(), "{what}:\n{}", wrong.join("\n"));
}

fn without_timing(h: &[(u64, Metrics)]) -> Vec<(u64, Metrics)> {
    h.iter()
        .map(|(s, m)| {
            (
                *s,
                m.iter()
                    .filter(|(k, _)| !is_timing(k))
                    .map(|(k, v)| (k.clone(), *v))
                    .collect(),
            )
        })
        .collect()
}

#[test]
fn fsdp_two_ranks_match_one_process_and_resume_exactly() {
    let dir = scratch("dist_fsdp");
    let (job, ranks) = fsdp_on_two_ranks_as_on_one(FSDP, &dir, "FSDP 2 ranks");
    assert!(
        ranks[0]
            .iter()
            .all(|(_, m)| m.contains_key("critic/vf_loss") && m.contains_key("actor/pg_loss"))
    );

    // The checkpoints of steps 2 and 3: verl's layout, one optimizer shard per rank.
    let root = dir.join("two").join("ckpt");
    assert_eq!(list_steps(&root), vec![2, 3]);
    assert_eq!(read_tracker(&root).expect("tracker"), Some(3));
    let s2 = step_dir(&root, 2);
    for f in [
        "data.json",
        "actor/huggingface/model.safetensors",
        "actor/huggingface/tokenizer.json",
        "critic/huggingface/model.safetensors",
    ] {
        assert!(s2.join(f).is_file(), "missing {f}");
    }
    let shards = std::fs::read_dir(s2.join("actor"))
        .expect("actor dir")
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("optim"))
        .count();
    assert!(shards >= 2, "one optimizer shard per rank, found {shards}");

    assert_resumes_step_3(&job, &ranks[0], &s2, &dir, 2);
}

#[test]
fn fsdp_lora_two_ranks_match_one_process_and_resume_exactly() {
    let dir = scratch("dist_lora");
    let (job, ranks) = fsdp_on_two_ranks_as_on_one(LORA, &dir, "FSDP LoRA 2 ranks");
    // The adapters move the policy away from the reference, the base model: a reference
    // that kept its adapters on would be the policy itself (KL 0 throughout).
    let kl = crate::support::series(&ranks[0], "actor/kl_loss");
    assert!(kl.len() == 3 && kl.iter().all(|k| *k > 1e-4), "{kl:?}");
    // verl's layout for a LoRA actor: the base model, and the adapters in PEFT's format.
    let s2 = step_dir(&dir.join("two").join("ckpt"), 2);
    for f in [
        "actor/huggingface/model.safetensors",
        "actor/lora_adapter/adapter_config.json",
        "actor/lora_adapter/adapter_model.safetensors",
    ] {
        assert!(s2.join(f).is_file(), "missing {f}");
    }
    assert_resumes_step_3(&job, &ranks[0], &s2, &dir, 2);
}

/// A vision-language model (the tiny Qwen2.5-VL reading `color_digits` pictures, its tower a
/// unit of its own) with a KL loss to its reference and a vision-language critic (GAE: verl's
/// critic on such a model reads the images too, a value head over the image-text model) on
/// two FSDP ranks: every step matches one process (each rank's rows find their images again
/// after the batch's gathers, for the actor and the critic), and a run resumed from its step-2
/// checkpoint repeats step 3 exactly.
#[test]
fn fsdp_vision_language_two_ranks_match_one_process_and_resume_exactly() {
    let dir = scratch("dist_vision");
    let extra = [
        "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen2_5_vl'",
        "data.train_files='builtin://color_digits?split=train&size=64&stripes=2'",
        "data.val_files='builtin://color_digits?split=test&size=8&stripes=2'",
        "actor_rollout_ref.actor.use_kl_loss=true",
        "algorithm.adv_estimator=gae",
        "critic.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen2_5_vl'",
        "critic.ppo_mini_batch_size=8",
        "critic.ppo_micro_batch_size_per_gpu=2",
        "critic.optim.lr=1e-3",
        "+critic.model.fsdp_config.mixed_precision.param_dtype=fp32",
    ];
    let (job, ranks) = fsdp_on_two_ranks_as_on_one(&extra, &dir, "FSDP vision-language 2 ranks");
    let values = crate::support::series(&ranks[0], "critic/values/mean");
    assert!(values.len() == 3, "{values:?}");
    let s2 = step_dir(&dir.join("two").join("ckpt"), 2);
    assert!(
        s2.join("actor/huggingface/preprocessor_config.json")
            .is_file()
    );
    assert_resumes_step_3(&job, &ranks[0], &s2, &dir, 2);
}

/// Runs the FSDP quickstart with `extra` in one process and on two ranks (checkpoints every 2
/// steps): both ranks report the same metrics and match the one-process run step by step.
fn fsdp_on_two_ranks_as_on_one(
    extra: &[&str],
    dir: &Path,
    what: &str,
) -> (Job, Vec<Vec<(u64, Metrics)>>) {
    let one = verlc_runtime::trainer::run(
        &config(
            "quickstart.yaml",
            &Job::new("quickstart.yaml", extra, &dir.join("one"), 1).overrides,
        ),
        &quiet(),
    )
    .expect("one-process run");
    let job = Job::new("quickstart.yaml", extra, &dir.join("two"), 2)
        .with(&["trainer.save_freq=2".into()]);
    let ranks = run_ranks(&job, &dir.join("two"), 2);
    assert_eq!(
        without_timing(&ranks[0]),
        without_timing(&ranks[1]),
        "ranks report different metrics"
    );
    assert_matches(&one.history, &ranks[0], 2e-3, what);
    (job, ranks)
}

/// Resumes `job` from its step-2 checkpoint `s2` on two ranks: step 3 is the uninterrupted
/// run's step 3.
fn assert_resumes_step_3(
    job: &Job,
    uninterrupted: &[(u64, Metrics)],
    s2: &Path,
    dir: &Path,
    world: usize,
) {
    let resume = Job {
        example: job.example,
        overrides: job.overrides.clone(),
    }
    .with(&[
        "trainer.resume_mode=resume_path".into(),
        format!("trainer.resume_from_path={}", s2.display()),
    ]);
    let resumed = run_ranks(&resume, &dir.join("resume"), world);
    assert_eq!(resumed[0].len(), 1, "only step 3 is left");
    assert_matches(&uninterrupted[2..], &resumed[0], 1e-9, "resumed step 3");
}

/// Megatron at TP=2 with a Qwen3-MoE actor (its experts split over the tensor-parallel ranks,
/// Megatron's default expert layout) and a dense critic: every step matches one process, and a
/// run resumed from its step-2 checkpoint repeats step 3 exactly.
#[test]
fn megatron_tensor_parallel_matches_one_process_and_resumes_exactly() {
    let dir = scratch("dist_megatron");
    let moe = "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen3_moe&experts=4&experts_per_tok=2&moe_intermediate=32'".to_owned();
    let tp2 = [
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2".to_owned(),
        "critic.megatron.tensor_model_parallel_size=2".to_owned(),
        moe.clone(),
    ];
    let one_cfg = config(
        "quickstart_megatron.yaml",
        &Job::new("quickstart_megatron.yaml", MEGATRON, &dir.join("one"), 1)
            .with(std::slice::from_ref(&moe))
            .overrides,
    );
    assert!(one_cfg.actor.model_path.contains("qwen3_moe"));
    // The reference is the Megatron engine in one process (its parameter groups differ from
    // the single engine's: no weight decay on biases and norms).
    let one = verlc_runtime::trainer::run_with(&one_cfg, &quiet(), MegatronRoles { world: None })
        .expect("one-process run");
    let job = Job::new("quickstart_megatron.yaml", MEGATRON, &dir.join("tp2"), 2)
        .with(&tp2)
        .with(&["trainer.save_freq=2".into()]);
    let ranks = run_ranks(&job, &dir.join("tp2"), 2);
    assert_eq!(
        without_timing(&ranks[0]),
        without_timing(&ranks[1]),
        "ranks report different metrics"
    );
    assert_matches(&one.history, &ranks[0], 2e-3, "Megatron TP=2");
    assert!(
        ranks[0]
            .iter()
            .all(|(_, m)| m.contains_key("actor/kl_loss") && m.contains_key("critic/vf_loss"))
    );
    let root = dir.join("tp2").join("ckpt");
    assert_eq!(read_tracker(&root).expect("tracker"), Some(3));
    let s2 = step_dir(&root, 2);
    for f in [
        "data.json",
        "actor/huggingface/model.safetensors",
        "critic/huggingface/model.safetensors",
    ] {
        assert!(s2.join(f).is_file(), "missing {f}");
    }
    assert_resumes_step_3(&job, &ranks[0], &s2, &dir, 2);
}

/// A tiny Qwen3-MoE actor whose every token takes all 4 experts (a top-k near-tie would flip
/// under another reduction order); the tokens still travel to every rank's experts.
const MOE_ACTOR: &str = "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen3_moe&experts=4&experts_per_tok=4&moe_intermediate=32'";

/// The Megatron quickstart with `shared` overrides in one process, then on `world` ranks with
/// `layout` overrides too (a checkpoint every 2 steps): every step must match the one-process
/// run, and a run resumed from the step-2 checkpoint repeat step 3 exactly. `spec_ok` checks
/// the layout reached the spec. Returns the one-process history.
fn megatron_layout_matches_one_process(
    name: &str,
    (shared, layout): (&[String], &[String]),
    world: usize,
    spec_ok: impl Fn(&verlc_spec::trainer::MegatronEngineSpec) -> bool,
) -> Vec<(u64, Metrics)> {
    megatron_run_matches_one_process(MEGATRON, name, (shared, layout), world, spec_ok)
}

/// [`megatron_layout_matches_one_process`] from `base` overrides instead of [`MEGATRON`]'s.
fn megatron_run_matches_one_process(
    base: &[&str],
    name: &str,
    (shared, layout): (&[String], &[String]),
    world: usize,
    spec_ok: impl Fn(&verlc_spec::trainer::MegatronEngineSpec) -> bool,
) -> Vec<(u64, Metrics)> {
    let dir = scratch(&format!("dist_megatron_{name}"));
    let example = "quickstart_megatron.yaml";
    let one = one_process_history(
        example,
        &Job::new(example, base, &dir.join("one"), 1)
            .with(shared)
            .overrides,
    );
    let job = Job::new(example, base, &dir.join(name), world)
        .with(shared)
        .with(layout)
        .with(&["trainer.save_freq=2".into()]);
    let spec = config(job.example, &job.overrides);
    assert!(
        matches!(&spec.actor.engine, verlc_spec::trainer::EngineSpec::Megatron(m) if spec_ok(m)),
        "{name}: {:?}",
        spec.actor.engine
    );
    let ranks = run_ranks(&job, &dir.join(name), world);
    assert_matches(&one, &ranks[0], 2e-3, name);
    let s2 = step_dir(&dir.join(name).join("ckpt"), 2);
    assert_resumes_step_3(&job, &ranks[0], &s2, &dir, world);
    one
}

/// `actor_rollout_ref.{actor,ref}.megatron.<setting>` for each setting: a Megatron layout the
/// policy and its reference share.
fn actor_and_ref(settings: &[&str]) -> Vec<String> {
    ["actor_rollout_ref.actor", "actor_rollout_ref.ref"]
        .iter()
        .flat_map(|role| settings.iter().map(move |s| format!("{role}.megatron.{s}")))
        .collect()
}

type History = Vec<(u64, Metrics)>;

/// The metric history of `example` with `overrides` in one Megatron process. Several layouts
/// compare with the same one-process run (the MoE actor's, under EP, TP with whole experts and
/// CP x EP): it trains once per test process, the first test to need it training it while the
/// others wait. Keyed by the overrides less the checkpoint directory (the one-process runs save
/// nothing).
fn one_process_history(example: &str, overrides: &[String]) -> History {
    one_process_history_with(example, overrides, true)
}

/// [`one_process_history`] with or without the asynchronous modes' partial rollout.
fn one_process_history_with(example: &str, overrides: &[String], partial: bool) -> History {
    use std::sync::{Arc, Mutex, OnceLock};
    static RUNS: Mutex<Vec<(String, Arc<OnceLock<History>>)>> = Mutex::new(Vec::new());
    let key: Vec<&str> = overrides
        .iter()
        .map(String::as_str)
        .filter(|o| !o.starts_with("trainer.default_local_dir="))
        .collect();
    let key = format!("{example} {partial} {}", key.join(" "));
    let slot = {
        let mut runs = RUNS.lock().unwrap_or_else(|e| e.into_inner());
        match runs.iter().find(|(k, _)| *k == key) {
            Some((_, slot)) => slot.clone(),
            None => {
                let slot = Arc::new(OnceLock::new());
                runs.push((key, slot.clone()));
                slot
            }
        }
    };
    slot.get_or_init(|| {
        verlc_runtime::trainer::run_with(
            &config(example, overrides),
            &verlc_runtime::trainer::RunOptions {
                partial_rollout: partial,
                ..quiet()
            },
            MegatronRoles { world: None },
        )
        .expect("one-process run")
        .history
    })
    .clone()
}

/// Megatron with expert parallelism 2 (TP 1, 2 data-parallel ranks, each holding half of a
/// Qwen3-MoE actor's experts; the distributed optimizer, verl's default, its experts' state in
/// a buffer of their own and its grad norm counting each expert once; the rollout model gets
/// every expert from its rank).
#[test]
fn megatron_expert_parallel_matches_one_process_and_resumes_exactly() {
    let ep2 = actor_and_ref(&["expert_model_parallel_size=2"]);
    megatron_layout_matches_one_process("ep2", (&[MOE_ACTOR.into()], &ep2), 2, |m| {
        m.expert_parallel == 2
    });
}

/// Megatron with tensor parallel 2 x expert parallel 2 on 4 ranks (2 data-parallel ranks):
/// each expert split over TP, the experts over the EP group of each tensor rank; the rollout
/// (TP 2) gets every expert's tensor slice from its rank. The replicated optimizer.
#[test]
fn megatron_tensor_and_expert_parallel_matches_one_process_and_resumes_exactly() {
    let shared = [
        MOE_ACTOR.to_owned(),
        "actor_rollout_ref.actor.megatron.use_distributed_optimizer=false".to_owned(),
        "actor_rollout_ref.ref.megatron.use_distributed_optimizer=false".to_owned(),
    ];
    let mut layout = actor_and_ref(&[
        "tensor_model_parallel_size=2",
        "expert_model_parallel_size=2",
    ]);
    layout.extend([
        "critic.megatron.tensor_model_parallel_size=2".into(),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2".into(),
    ]);
    megatron_layout_matches_one_process("tp2ep2", (&shared, &layout), 4, |m| {
        m.expert_parallel == 2 && m.tensor_parallel == 2
    });
}

/// Megatron with tensor parallel 2 and whole experts (`expert_tensor_parallel_size: 1`, the
/// layout of verl's MoE examples) split over expert parallel 2, which is the tensor group, on
/// 2 ranks: each tensor rank routes its half of the tokens (sequence parallelism) to the
/// experts' ranks; the distributed optimizer; the rollout at TP 1 holds every expert whole
/// (the other rank's from it), the rollout at TP 2 its slice of each (cut from the whole).
#[test]
fn megatron_whole_experts_under_tensor_parallel_match_one_process_and_resume_exactly() {
    let mut layout = actor_and_ref(&[
        "tensor_model_parallel_size=2",
        "expert_model_parallel_size=2",
        "expert_tensor_parallel_size=1",
    ]);
    layout.push("critic.megatron.tensor_model_parallel_size=2".into());
    layout.push("actor_rollout_ref.rollout.tensor_model_parallel_size=1".into());
    let whole = |m: &verlc_spec::trainer::MegatronEngineSpec| {
        m.expert_parallel == 2 && m.tensor_parallel == 2 && m.expert_tensor_parallel == Some(1)
    };
    megatron_layout_matches_one_process("tp2etp1", (&[MOE_ACTOR.into()], &layout), 2, whole);
    layout.pop();
    layout.push("actor_rollout_ref.rollout.tensor_model_parallel_size=2".into());
    megatron_layout_matches_one_process("tp2etp1r2", (&[MOE_ACTOR.into()], &layout), 2, whole);
}

/// verl 0.9's `colocate_async` with a Megatron actor at TP=2: each rank's rollout thread decodes
/// the whole model from whole tensors published by name (gathered on the trainer's thread),
/// with its data-parallel rank's seeds, so both tensor ranks generate the same groups, which
/// training then splits over them. Off policy (a warm-up batch, threshold 2, `drop`) with
/// sampled rollouts, every step matches one Megatron process's `colocate_async` run, and no
/// trained group is older than the bound. Without partial rollout (`VERLC_PARTIAL_ROLLOUT=0`):
/// where a weight sync falls in a batch depends on timing, so runs with it do not repeat.
#[test]
fn megatron_colocate_async_at_tensor_parallel_2_matches_one_process() {
    let dir = scratch("dist_megatron_async");
    let example = "quickstart_megatron.yaml";
    let base: &[&str] = &[
        "trainer.v1.trainer_mode=colocate_async",
        "trainer.v1.colocate_async.num_warmup_batches=1",
        "trainer.v1.sampler.max_off_policy_threshold=2",
        "actor_rollout_ref.rollout.n=4",
        "actor_rollout_ref.rollout.do_sample=true",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    ];
    let one = one_process_history_with(
        example,
        &Job::new(example, base, &dir.join("one"), 1).overrides,
        false,
    );
    let job = Job::new(example, base, &dir.join("tp2"), 2)
        .with(&actor_and_ref(&["tensor_model_parallel_size=2"]));
    let spec = config(job.example, &job.overrides);
    assert!(
        matches!(&spec.actor.engine, verlc_spec::trainer::EngineSpec::Megatron(m) if m.tensor_parallel == 2)
            && spec.run.asynchronous.is_some(),
        "{:?}",
        spec.actor.engine
    );
    let whole_batches = [("VERLC_PARTIAL_ROLLOUT", "0".to_owned())];
    let ranks = run_ranks_with(&job, &dir.join("tp2"), 2, &whole_batches);
    assert_eq!(one.len(), 3);
    for ((s, a), (_, b)) in one.iter().zip(&ranks[0]) {
        for key in [
            "critic/score/mean",
            "response_length/mean",
            "actor/pg_loss",
            "actor/grad_norm",
            "training/off_policy/trajectory_staleness/max",
        ] {
            assert!(
                close(a[key], b[key], 2e-3),
                "step {s} {key}: one process {}, TP 2 {}",
                a[key],
                b[key]
            );
        }
        assert!(
            b["training/off_policy/trajectory_staleness/max"] <= 2.0,
            "step {s}"
        );
    }
}

/// GRPO on `color_digits` pictures with a KL loss to the reference, for the vision-language
/// models on Megatron (the model path comes with each test).
const MEGATRON_VL: &[&str] = &[
    "data.train_files='builtin://color_digits?split=train&size=64&stripes=2'",
    "data.val_files='builtin://color_digits?split=test&size=8&stripes=2'",
    "actor_rollout_ref.actor.use_kl_loss=true",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
];

/// A vision-language model on Megatron at TP=2 with sequence parallelism (the tiny
/// Qwen2.5-VL), beside a vision-language critic (GAE) at TP=2: each tensor-parallel rank runs
/// the whole tower, puts its embeddings into the reduced token embeddings and only then takes
/// its share of the sequence, for the actor and the critic; the rollout prefills its sharded
/// model with the images. Every step matches one process, and a run resumed from its step-2
/// checkpoint (the critic's tower in it) repeats step 3 exactly.
#[test]
fn megatron_vision_language_tensor_parallel_matches_one_process_and_resumes_exactly() {
    let model = "builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen2_5_vl";
    let shared = [
        format!("actor_rollout_ref.model.path='{model}'"),
        "algorithm.adv_estimator=gae".to_owned(),
        format!("critic.model.path='{model}'"),
        "critic.ppo_mini_batch_size=8".to_owned(),
        "critic.ppo_micro_batch_size_per_gpu=2".to_owned(),
        "critic.optim.lr=1e-3".to_owned(),
    ];
    let mut tp2 = actor_and_ref(&["tensor_model_parallel_size=2", "sequence_parallel=true"]);
    tp2.extend([
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2".to_owned(),
        "critic.megatron.tensor_model_parallel_size=2".to_owned(),
        "critic.megatron.sequence_parallel=true".to_owned(),
    ]);
    let one = megatron_run_matches_one_process(MEGATRON_VL, "vl_tp2", (&shared, &tp2), 2, |m| {
        m.tensor_parallel == 2 && m.sequence_parallel
    });
    let values = crate::support::series(&one, "critic/values/mean");
    assert_eq!(values.len(), 3, "{values:?}");
}

/// The tiny Qwen2.5-VL on Megatron with rollout replicas laid out apart from training, the
/// pictures travelling with their prompts: at TP=2 with the rollout at TP=1 (two replicas of
/// one training group each generating half of its prompts), and on two data-parallel ranks
/// with the rollout at TP=2 (one replica generating both ranks' prompts). Both match one
/// process.
#[test]
fn megatron_vision_language_rollout_replicas_share_the_pictures() {
    let shared = ["actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen2_5_vl'".to_owned()];
    let mut split = actor_and_ref(&["tensor_model_parallel_size=2"]);
    split.push("actor_rollout_ref.rollout.tensor_model_parallel_size=1".to_owned());
    megatron_run_matches_one_process(MEGATRON_VL, "vl_split", (&shared, &split), 2, |m| {
        m.tensor_parallel == 2
    });
    let join = ["actor_rollout_ref.rollout.tensor_model_parallel_size=2".to_owned()];
    megatron_run_matches_one_process(MEGATRON_VL, "vl_join", (&shared, &join), 2, |m| {
        m.tensor_parallel == 1
    });
}

/// The tiny Qwen3-VL-MoE (every token takes all four experts, so no routing near-tie decides)
/// on Megatron with context parallelism 2 and expert parallelism 2, as verl's Qwen3-VL-30B-A3B
/// example lays it out: each rank embeds the pictures and takes its positions, and routes its
/// tokens to the other rank's experts. Matches one process and resumes exactly.
#[test]
fn megatron_vision_language_moe_with_context_and_expert_parallelism_matches_one_process() {
    let shared = ["actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen3_vl_moe&experts=4&experts_per_tok=4&moe_intermediate=32'".to_owned()];
    let layout = actor_and_ref(&["context_parallel_size=2", "expert_model_parallel_size=2"]);
    megatron_run_matches_one_process(MEGATRON_VL, "vl_moe_cp2ep2", (&shared, &layout), 2, |m| {
        m.context_parallel == 2 && m.expert_parallel == 2
    });
}

/// The tiny Qwen3-VL (DeepStack features into its first two of three layers) on Megatron with
/// three pipeline stages, then with context parallelism 2: the first stage holds the tower
/// (the others receive its parameters' shapes from the model's listing, for the rollout's
/// weights and the export) and sends the second layer's DeepStack features on beside its
/// hidden states to the second stage, which adds them and sends the hidden states alone (the
/// features' gradients come back the same way), in training and in the rollout, whose first
/// stage embeds the images and broadcasts the prompts' M-RoPE positions; under CP each rank
/// takes its positions of the embeddings and DeepStack features. Both match one process and
/// resume exactly.
#[test]
fn megatron_vision_language_pipeline_and_context_parallel_match_one_process() {
    let shared = ["actor_rollout_ref.model.path='builtin://tiny?layers=3&hidden=64&heads=4&kv_heads=2&arch=qwen3_vl&deepstack=2'".to_owned()];
    let pp3 = actor_and_ref(&["pipeline_model_parallel_size=3"]);
    megatron_run_matches_one_process(MEGATRON_VL, "vl_pp3", (&shared, &pp3), 3, |m| {
        m.pipeline_parallel == 3
    });
    let cp2 = actor_and_ref(&["context_parallel_size=2"]);
    megatron_run_matches_one_process(MEGATRON_VL, "vl_cp2", (&shared, &cp2), 2, |m| {
        m.context_parallel == 2
    });
}

/// Megatron with context parallelism 2 on 2 ranks (one data-parallel rank): the actor (a
/// Qwen3-MoE with Megatron's router load-balancing loss and z-loss), the reference and the
/// critic split every sequence in load-balanced chunks and gather keys and values in each
/// layer; each CP rank decodes the same prompts with the same seed. The router losses'
/// metrics match too.
#[test]
fn megatron_context_parallel_matches_one_process_and_resumes_exactly() {
    let otc = "actor_rollout_ref.actor.megatron.override_transformer_config";
    let shared = [
        "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen3_moe&experts=4&experts_per_tok=2&moe_intermediate=32'".to_owned(),
        format!("+{otc}.moe_router_load_balancing_type=aux_loss"),
        format!("+{otc}.moe_aux_loss_coeff=0.01"),
        format!("+{otc}.moe_z_loss_coeff=0.001"),
    ];
    let cp2 = ["actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"]
        .map(|role| format!("{role}.megatron.context_parallel_size=2"));
    let one =
        megatron_layout_matches_one_process("cp2", (&shared, &cp2), 2, |m| m.context_parallel == 2);
    for key in ["actor/moe_load_balancing_loss", "actor/moe_z_loss"] {
        let v = one[0].1.get(key).copied();
        assert!(v.is_some_and(|v| v > 0.0), "{key}: {v:?}");
    }
}

/// Megatron with context parallelism 2 and expert parallelism 2 on 2 ranks: the expert-parallel
/// group is the context group (each rank routes its positions' tokens to the other's experts).
#[test]
fn megatron_context_and_expert_parallel_match_one_process_and_resume_exactly() {
    let mut layout = actor_and_ref(&["context_parallel_size=2", "expert_model_parallel_size=2"]);
    layout.push("critic.megatron.context_parallel_size=2".to_owned());
    megatron_layout_matches_one_process("cp2ep2", (&[MOE_ACTOR.into()], &layout), 2, |m| {
        m.context_parallel == 2 && m.expert_parallel == 2
    });
}

/// Megatron with context parallelism 2 on a tiny Qwen3.5 (three Gated DeltaNet layers, each
/// gathering whole sequences and keeping its rank's positions, and a gated attention layer
/// gathering keys and values): matches one process and resumes exactly.
#[test]
fn megatron_context_parallel_qwen3_5_matches_one_process_and_resumes_exactly() {
    let shared = ["actor_rollout_ref.model.path='builtin://tiny?layers=4&hidden=64&heads=4&kv_heads=2&arch=qwen3_5'".to_owned()];
    let cp2 = ["actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"]
        .map(|role| format!("{role}.megatron.context_parallel_size=2"));
    megatron_layout_matches_one_process("cp2_qwen3_5", (&shared, &cp2), 2, |m| {
        m.context_parallel == 2
    });
}

/// Megatron with tensor parallel 2 on a tiny Qwen3-Next (its DeltaNet heads and experts split
/// over TP): checkpoints are written with its fused DeltaNet projections, and the resumed run
/// loads each rank's shards from them.
#[test]
fn megatron_tensor_parallel_qwen3_next_matches_one_process_and_resumes_exactly() {
    let shared = ["actor_rollout_ref.model.path='builtin://tiny?layers=4&hidden=64&heads=4&kv_heads=2&arch=qwen3_next&experts=4&experts_per_tok=4&moe_intermediate=32'".to_owned()];
    let tp2: Vec<String> = ["actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"]
        .iter()
        .map(|role| format!("{role}.megatron.tensor_model_parallel_size=2"))
        .chain(["actor_rollout_ref.rollout.tensor_model_parallel_size=2".to_owned()])
        .collect();
    megatron_layout_matches_one_process("tp2_qwen3_next", (&shared, &tp2), 2, |m| {
        m.tensor_parallel == 2
    });
}

/// The tool agent loop on Megatron at TP=2: the rollout replica is both ranks, which decode
/// in lockstep; the leader (tensor rank 0) runs the tools and hands every answer to the other,
/// so both ranks run the same trajectories and report the same metrics.
#[test]
fn megatron_tensor_parallel_tool_rollouts_agree_on_both_ranks() {
    let dir = scratch("dist_megatron_tools");
    let root = crate::support::repo();
    // The built-in tool task: the lookup call is one token, which a fresh model samples now
    // and then, so tools run from the first step.
    let model = "'builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&tools=lookup'";
    let job = Job::new("quickstart_megatron.yaml", MEGATRON, &dir.join("tp2"), 2).with(&[
        format!("actor_rollout_ref.model.path={model}"),
        format!("critic.model.path={model}"),
        "data.train_files='builtin://code_lookup?split=train&size=64'".into(),
        "data.val_files='builtin://code_lookup?split=test&size=8'".into(),
        "data.max_response_length=24".into(),
        "actor_rollout_ref.rollout.do_sample=true".into(),
        "actor_rollout_ref.rollout.n=4".into(),
        "actor_rollout_ref.actor.ppo_mini_batch_size=8".into(),
        "critic.ppo_mini_batch_size=8".into(),
        "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2".into(),
        "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2".into(),
        "critic.megatron.tensor_model_parallel_size=2".into(),
        "actor_rollout_ref.rollout.tensor_model_parallel_size=2".into(),
        "actor_rollout_ref.rollout.multi_turn.enable=true".into(),
        "actor_rollout_ref.rollout.multi_turn.max_assistant_turns=2".into(),
        "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent".into(),
        format!(
            "actor_rollout_ref.rollout.multi_turn.tool_config_path={}",
            root.join("examples/tools/code_lookup.yaml").display()
        ),
    ]);
    let ranks = run_ranks(&job, &dir.join("tp2"), 2);
    assert_eq!(
        without_timing(&ranks[0]),
        without_timing(&ranks[1]),
        "ranks report different metrics"
    );
    let calls: f64 = ranks[0].iter().map(|(_, m)| m["tool_calls/mean"]).sum();
    assert!(calls > 0.0, "no tool call ran: {:?}", ranks[0]);
}

/// Tensor-parallel size, pipeline-parallel size, sequence parallelism, distributed optimizer.
type Layout = (usize, usize, bool, bool);

/// Megatron on 4 ranks with two parallel dimensions at once (TP=2 x DP=2, TP=2 x PP=2 with
/// sequence parallelism, PP=2 x DP=2 with the distributed optimizer), actor and critic: each
/// matches the one-process Megatron run step by step, and resumes exactly from its checkpoint.
#[test]
fn megatron_two_dimensional_layouts_on_four_ranks_match_one_process() {
    let dir = scratch("dist_megatron_4");
    let one_cfg = config(
        "quickstart_megatron.yaml",
        &Job::new("quickstart_megatron.yaml", MEGATRON, &dir.join("one"), 1).overrides,
    );
    let one = verlc_runtime::trainer::run_with(&one_cfg, &quiet(), MegatronRoles { world: None })
        .expect("one-process run");
    let both = |k: &str, v: &str| {
        [
            format!("actor_rollout_ref.actor.megatron.{k}={v}"),
            format!("actor_rollout_ref.ref.megatron.{k}={v}"),
            format!("critic.megatron.{k}={v}"),
        ]
    };
    let layouts: [(&str, Vec<String>, Layout); 3] = [
        (
            // verl turns sequence parallelism on by default with TP > 1.
            "TP=2 x DP=2",
            both("tensor_model_parallel_size", "2").to_vec(),
            (2, 1, true, false),
        ),
        (
            "TP=2 x PP=2, sequence parallel",
            [
                both("tensor_model_parallel_size", "2").to_vec(),
                both("pipeline_model_parallel_size", "2").to_vec(),
                both("sequence_parallel", "true").to_vec(),
            ]
            .concat(),
            (2, 2, true, false),
        ),
        (
            "PP=2 x DP=2, distributed optimizer",
            [
                both("pipeline_model_parallel_size", "2").to_vec(),
                both("use_distributed_optimizer", "true").to_vec(),
            ]
            .concat(),
            (1, 2, false, true),
        ),
    ];
    for (i, (what, extra, (tp, pp, sp, dist_opt))) in layouts.iter().enumerate() {
        let run_dir = dir.join(format!("layout{i}"));
        let job = Job::new("quickstart_megatron.yaml", MEGATRON, &run_dir, 4)
            .with(extra)
            .with(&["trainer.save_freq=2".into()]);
        // The layout is what the spec binds, for the actor and the critic.
        let spec = config(job.example, &job.overrides);
        for engine in [
            &spec.actor.engine,
            &spec.critic.as_ref().expect("critic").engine,
        ] {
            let verlc_spec::trainer::EngineSpec::Megatron(m) = engine else {
                panic!("{what}: not a Megatron engine");
            };
            assert_eq!(
                (m.tensor_parallel, m.pipeline_parallel, m.sequence_parallel),
                (*tp, *pp, *sp),
                "{what}"
            );
            assert!(m.use_distributed_optimizer || !dist_opt, "{what}");
        }
        let ranks = run_ranks(&job, &run_dir, 4);
        for r in &ranks[1..] {
            assert_eq!(
                without_timing(&ranks[0]),
                without_timing(r),
                "{what}: ranks differ"
            );
        }
        assert_matches(&one.history, &ranks[0], 2e-3, what);
        // A checkpoint of the 4-rank layout resumes into exactly the step it took.
        let s2 = step_dir(&run_dir.join("ckpt"), 2);
        assert_resumes_step_3(&job, &ranks[0], &s2, &run_dir, 4);
    }
}

/// DAPO's dynamic sampling on 2 data-parallel ranks: the ranks keep different numbers of groups
/// per round (half the prompts score flat, at random places), agree on the refills, and train
/// on the first `train_batch_size` groups of all ranks, split evenly again: every rank reports
/// the same metrics, and each step needed a refill.
#[test]
fn dynamic_sampling_on_two_ranks_agrees() {
    let dir = scratch("dist_dapo");
    let reward = crate::support::repo().join("runtime/tests/trainer/fixtures/reward_dapo.py");
    let extra = [
        format!("custom_reward_function.path={}", reward.display()),
        "actor_rollout_ref.rollout.n=4".into(),
        "actor_rollout_ref.rollout.do_sample=true".into(),
        "actor_rollout_ref.actor.ppo_mini_batch_size=4".into(),
        "+algorithm.filter_groups.enable=true".into(),
        "+algorithm.filter_groups.metric=reward".into(),
    ];
    let job = Job::new("quickstart.yaml", &[], &dir, 2).with(&extra);
    let ranks = run_ranks(&job, &dir, 2);
    assert_eq!(without_timing(&ranks[0]), without_timing(&ranks[1]));
    assert_eq!(ranks[0].len(), 3);
    for (step, m) in &ranks[0] {
        assert!(
            m["training/filter_groups/num_gen_batches"] >= 2.0,
            "step {step}: {m:?}"
        );
        assert!(
            m["training/filter_groups/evicted_samples"] >= 1.0,
            "step {step}"
        );
        assert!(m.contains_key("actor/pg_loss"), "step {step}");
    }
}

/// verl 0.9's `colocate_async` on 2 data-parallel ranks: each rank's rollout thread generates
/// its share of every queued batch, the ranks' replay buffers agree without a collective, and
/// the sampled groups are gathered and split evenly again. On policy (threshold 1, `wait`, no
/// warm-up, sampled rollouts) the run is the synchronous 2-rank run, step for step; every rank
/// reports the same metrics.
#[test]
fn colocate_async_on_two_ranks_is_the_synchronous_run_on_policy() {
    let dir = scratch("dist_async");
    let sampled = [
        "actor_rollout_ref.rollout.n=4".to_string(),
        "actor_rollout_ref.rollout.do_sample=true".into(),
        "actor_rollout_ref.actor.ppo_mini_batch_size=4".into(),
    ];
    let on_policy = [
        "trainer.v1.trainer_mode=colocate_async".to_string(),
        "trainer.v1.colocate_async.num_warmup_batches=0".into(),
        "trainer.v1.sampler.max_off_policy_threshold=1".into(),
        "trainer.v1.sampler.max_off_policy_strategy=wait".into(),
    ];
    let sync = Job::new("quickstart.yaml", &[], &dir.join("sync"), 2).with(&sampled);
    let sync = run_ranks(&sync, &dir.join("sync"), 2);
    let colocated = Job::new("quickstart.yaml", &[], &dir.join("async"), 2)
        .with(&sampled)
        .with(&on_policy);
    let colocated = run_ranks(&colocated, &dir.join("async"), 2);
    assert_eq!(without_timing(&colocated[0]), without_timing(&colocated[1]));
    for (s, a) in sync[0].iter().zip(&colocated[0]) {
        for key in ["critic/score/mean", "actor/pg_loss", "actor/grad_norm"] {
            assert_eq!(s.1[key], a.1[key], "step {}: {key}", s.0);
        }
        assert_eq!(a.1["training/off_policy/trajectory_staleness/max"], 0.0);
    }
    assert_eq!(colocated[0].len(), 3);

    // Off policy (a warm-up batch of 12 prompts: 6 per rank, threshold 2, drop) with DAPO's
    // group filter (half the prompts score flat, at random places): the ranks agree on the
    // groups to evict and refill, and no trained group is older than the bound allows.
    let reward = crate::support::repo().join("runtime/tests/trainer/fixtures/reward_dapo.py");
    let off_policy = [
        "trainer.v1.trainer_mode=colocate_async".to_string(),
        "trainer.v1.colocate_async.num_warmup_batches=1.5".into(),
        "data.gen_batch_size=4".into(),
        "trainer.v1.sampler.max_off_policy_threshold=2".into(),
        format!("reward.custom_reward_function.path={}", reward.display()),
        "algorithm.filter_groups.enable=true".into(),
        "algorithm.filter_groups.metric=reward".into(),
    ];
    let stale = Job::new("quickstart.yaml", &[], &dir.join("stale"), 2)
        .with(&sampled)
        .with(&off_policy);
    let stale = run_ranks(&stale, &dir.join("stale"), 2);
    assert_eq!(without_timing(&stale[0]), without_timing(&stale[1]));
    let worst: Vec<f64> = stale[0]
        .iter()
        .map(|(_, m)| m["training/off_policy/trajectory_staleness/max"])
        .collect();
    assert!(worst.iter().all(|&s| s <= 1.0), "{worst:?}");
    assert!(worst.contains(&1.0), "{worst:?}");
    let filtered: f64 = stale[0]
        .iter()
        .filter_map(|(_, m)| m.get("training/filter_groups/evicted_samples"))
        .sum();
    assert!(filtered >= 2.0, "DAPO evicted {filtered} groups");
}

/// The user's dataset class and a curriculum sampler on two FSDP ranks: the helper runs on
/// the main rank and both ranks train the prompts it draws, easiest first; the sampler's
/// `update` gets every step's whole batch (the scores the ranks log); a run resumed from the
/// step-2 checkpoint draws step 3's prompts where the sampler stood, with its state restored.
#[test]
fn python_classes_on_two_ranks_draw_once_and_resume_where_the_sampler_stood() {
    use crate::python_data::{fixture, write_data};
    let dir = scratch("dist_python_data");
    let (raw, _) = write_data(&dir, 32);
    let classes = [
        format!("data.train_files={}", raw.display()),
        format!("data.val_files={}", raw.display()),
        format!("data.custom_cls.path={}", fixture("reversal_dataset.py")),
        "data.custom_cls.name=ReversalDataset".to_owned(),
        format!(
            "data.sampler.class_path={}",
            fixture("curriculum_sampler.py")
        ),
        "data.sampler.class_name=EasyFirst".to_owned(),
        "data.dataloader_num_workers=0".to_owned(),
        "trainer.save_freq=2".to_owned(),
    ];
    let job = Job::new("quickstart.yaml", &[], &dir.join("two"), 2).with(&classes);
    let ranks = run_ranks(&job, &dir.join("two"), 2);
    assert_eq!(
        without_timing(&ranks[0]),
        without_timing(&ranks[1]),
        "ranks report different metrics"
    );
    let log_path = dir.join("curriculum.jsonl");
    let read_log = || -> Vec<serde_json::Value> {
        std::fs::read_to_string(&log_path)
            .expect("curriculum log")
            .lines()
            .map(|l| serde_json::from_str(l).expect("json line"))
            .collect()
    };
    let log = read_log();
    assert_eq!(
        log.len(),
        3,
        "one update a step, on the main rank only: {log:?}"
    );

    // The sampler's order: smallest digit sum first, ties by position.
    let text = std::fs::read_to_string(&raw).expect("raw");
    let mut order: Vec<(u64, u64)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            let v: serde_json::Value = serde_json::from_str(l).expect("row");
            (v["difficulty"].as_u64().expect("difficulty"), i as u64)
        })
        .collect();
    order.sort();
    let numbers = |v: &serde_json::Value| -> Vec<f64> {
        v.as_array()
            .expect("array")
            .iter()
            .map(|x| x.as_f64().expect("number"))
            .collect()
    };
    for (k, entry) in log.iter().enumerate() {
        assert_eq!(entry["step"], serde_json::json!(k + 1));
        let mut got: Vec<u64> = numbers(&entry["index"]).iter().map(|&i| i as u64).collect();
        got.sort();
        let mut want: Vec<u64> = order[k * 8..(k + 1) * 8].iter().map(|p| p.1).collect();
        want.sort();
        assert_eq!(got, want, "step {}: the sampler's prompts", k + 1);
        let scores = numbers(&entry["scores"]);
        let mean = scores.iter().sum::<f64>() / scores.len() as f64;
        let logged = ranks[0][k].1["critic/score/mean"];
        assert!(
            (mean - logged).abs() < 1e-9,
            "step {}: update saw {mean}, the ranks logged {logged}",
            k + 1
        );
    }

    let s2 = step_dir(&dir.join("two").join("ckpt"), 2);
    assert_resumes_step_3(&job, &ranks[0], &s2, &dir, 2);
    let log = read_log();
    assert_eq!(log.len(), 4);
    assert_eq!(
        log[3]["update"],
        serde_json::json!(3),
        "the sampler's state came back"
    );
    assert_eq!(log[3]["index"], log[2]["index"]);
    assert_eq!(log[3]["scores"], log[2]["scores"]);
}
