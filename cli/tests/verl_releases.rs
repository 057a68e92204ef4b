//! `verlc check` on the config tree of a verl release it does not model (verl 0.9.1, unpacked
//! by `scripts/setup` into `.venv/verl-releases/`): verl's own keys that differ from the
//! modelled release pass through with one `S007` warning, and what the user writes is still
//! checked (typos, values, verl's cross-field rules). The modelled release's tree (0.7.0,
//! installed in the venv) gets no such warning.

use std::path::{Path, PathBuf};

use verlc_front::check::{CheckOptions, check};
use verlc_front::codes;
use verlc_front::diag::Diagnostic;
use verlc_front::load::compose::LoadRequest;
use verlc_front::load::version::BuiltinRelease;
use verlc_spec::trainer::DistillationMode;

mod support;
use support::{copy_tree, release_tree, verl_main_tree};

const NEWER: &str = "0.9.1";

fn root() -> PathBuf {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).to_path_buf()
}

fn newer_tree() -> Option<PathBuf> {
    release_tree(NEWER)
}

/// The overrides any verl launch script sets (micro-batches have no default).
const BASICS: &[&str] = &[
    "actor_rollout_ref.rollout.name=vllm",
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
    "critic.ppo_micro_batch_size_per_gpu=4",
];

fn run(dir: &Path, name: &str, extra: &[&str]) -> Vec<Diagnostic> {
    let req = LoadRequest {
        config_dir: Some(dir.to_path_buf()),
        config_name: Some(name.into()),
        overrides: BASICS.iter().chain(extra).map(|s| s.to_string()).collect(),
        cwd: root(),
        ..LoadRequest::default()
    };
    check(&req, &CheckOptions::default()).diagnostics
}

/// No error and exactly one S007 (keys passed through): its message.
fn one_pass_through(d: &[Diagnostic]) -> String {
    assert!(errors(d).is_empty(), "{:#?}", errors(d));
    let notes: Vec<_> = d
        .iter()
        .filter(|x| x.code == codes::SCHEMA_UNMODELLED_RELEASE)
        .collect();
    assert_eq!(notes.len(), 1, "one S007");
    notes[0].message.clone()
}

fn errors(d: &[Diagnostic]) -> Vec<String> {
    d.iter()
        .filter(|x| x.is_error())
        .map(|x| format!("{}: {}", x.code, x.message))
        .collect()
}

/// A release verlc holds a leaf table for (verl 0.7.1, 0.8.0, 0.9.1) checks clean on its own
/// tree: the keys its 0.7.0 model does not know are typed from verl's own files, none passes
/// through unchecked (no S007); a later release without a table still passes through, said
/// once. 0.7.1 is not judged by the 0.7.0 model: it rewrote the reward section (verlc's 0.7.0
/// schema found 63 errors in its own tree).
#[test]
fn a_tabled_release_checks_clean_and_an_untabled_one_passes_through_once() {
    for release in ["0.7.1", "0.8.0", NEWER] {
        let Some(dir) = release_tree(release) else {
            continue;
        };
        for base in ["ppo_trainer", "ppo_megatron_trainer"] {
            let d = run(&dir, base, &[]);
            assert!(errors(&d).is_empty(), "{release} {base}: {:#?}", errors(&d));
            let notes: Vec<_> = d
                .iter()
                .filter(|x| x.code == codes::SCHEMA_UNMODELLED_RELEASE)
                .map(|x| (&x.message, &x.notes))
                .collect();
            assert!(notes.is_empty(), "{release} {base}: {notes:#?}");
        }
    }
    let Some(dir) = newer_tree() else {
        return;
    };
    // The same files as a release verlc has no table for.
    let scratch = tempfile::tempdir().expect("tempdir");
    let verl = scratch.path().join("verl");
    std::fs::create_dir_all(verl.join("trainer")).unwrap();
    std::fs::create_dir_all(verl.join("version")).unwrap();
    std::fs::write(verl.join("version/version"), "0.10.0\n").unwrap();
    let copy = verl.join("trainer/config");
    copy_tree(&dir, &copy);
    let note = one_pass_through(&run(&copy, "ppo_trainer", &[]));
    assert!(note.contains("0.10.0"), "{note}");
}

/// Values of keys only the release's table types are checked, the user's and verl's alike:
/// a type the release's dataclass (or default) refuses is an error at the value.
#[test]
fn keys_of_the_release_table_are_typed() {
    let Some(dir) = newer_tree() else {
        return;
    };
    for (o, want) in [
        (
            "actor_rollout_ref.rollout.seed=abc",
            Some("must be an integer"),
        ),
        (
            "critic.loss_scale_factor=[1]",
            Some("must be null or an integer"),
        ),
        (
            "actor_rollout_ref.actor.fsdp_config.qat.enable=maybe",
            Some("must be a boolean"),
        ),
        ("actor_rollout_ref.rollout.seed=7", None),
        ("actor_rollout_ref.actor.fsdp_config.qat.enable=yes", None),
        ("actor_rollout_ref.rollout.scheduling_policy=123", None),
    ] {
        let d = run(&dir, "ppo_trainer", &[o]);
        let type_errors: Vec<&Diagnostic> = d
            .iter()
            .filter(|x| x.is_error() && x.code == codes::SCHEMA_TYPE)
            .collect();
        match want {
            Some(text) => {
                assert_eq!(type_errors.len(), 1, "{o}: {:#?}", errors(&d));
                assert!(
                    type_errors[0].message.contains(text),
                    "{o}: {}",
                    type_errors[0].message
                );
                assert!(type_errors[0].primary.is_some(), "{o}: at the value");
            }
            None => assert!(errors(&d).is_empty(), "{o}: {:#?}", errors(&d)),
        }
    }
}

/// A newer tree copied without its `verl/version/version` file is still recognised as
/// newer (by its `model_engine/` group): one S007, not thousands of unknown keys.
#[test]
fn a_newer_tree_without_its_version_file_is_recognised_by_its_layout() {
    let Some(dir) = newer_tree() else {
        return;
    };
    let scratch = tempfile::tempdir().expect("tempdir");
    let copy = scratch.path().join("config");
    copy_tree(&dir, &copy);
    assert!(!copy.join("../../version/version").exists());
    let note = one_pass_through(&run(&copy, "ppo_trainer", &[]));
    assert!(note.contains("model_engine/"), "{note}");
}

#[test]
fn what_the_user_writes_is_still_checked_on_a_newer_release() {
    let Some(dir) = newer_tree() else {
        return;
    };
    let cases: &[(&str, &str)] = &[
        // A typo of a key: Hydra's own error, with its did-you-mean.
        ("actor_rollout_ref.actor.ppo_mini_batch_sise=4", "H011"),
        // A value verl refuses.
        ("algorithm.adv_estimator=grpoo", "S003"),
        // A cross-field rule: a mini-batch larger than the step.
        ("actor_rollout_ref.actor.ppo_mini_batch_size=100000", "V002"),
    ];
    for (o, code) in cases {
        let d = run(&dir, "ppo_trainer", &[o]);
        assert!(
            d.iter().any(|x| x.is_error() && x.code.0 == *code),
            "{o}: want {code}, got {:#?}",
            errors(&d)
        );
    }
}

/// verl 0.9's v1 trainer, checkpoint-engine and `skip` keys are typed: a wrong value is an
/// error at its key, `separate_async` and rollout replay are refused by the build, the sync
/// mode (verl's default) builds the synchronous loop and `colocate_async` the replay-buffer
/// loop with the sampler's bound.
#[test]
fn the_v1_trainer_and_checkpoint_engine_keys_are_checked() {
    use verlc_front::compile::{SpecOutcome, lower_request};
    let Some(dir) = newer_tree() else {
        return;
    };
    for (o, code) in [
        ("trainer.v1.trainer_mode=bogus", "S003"),
        ("trainer.use_v1=maybe", "S002"),
        (
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=0",
            "S004",
        ),
        ("trainer.v1.separate_async.parameter_sync_step=0", "S004"),
        ("skip.rollout.action=bogus", "S003"),
    ] {
        let d = run(&dir, "ppo_trainer", &[o]);
        let key = o.split('=').next().unwrap_or_default();
        assert!(
            d.iter()
                .any(|x| x.is_error() && x.code.0 == code && x.key_path.as_deref() == Some(key)),
            "{o}: want {code} at its key, got {:#?}",
            errors(&d)
        );
    }
    // What the binary cannot honour is refused at build: replaying dumped rollouts (0.9's
    // `skip`, which replaced `rollout.skip_rollout`).
    let key = "skip.rollout.enable";
    assert_build_refuses(&dir, &[&format!("{key}=true")], key);
    let key = "trainer.v1.trainer_mode";
    match lower_request(&build_request(&dir, &[&format!("{key}=sync")])) {
        SpecOutcome::Ok { spec, .. } => assert_eq!(spec.run.asynchronous, None),
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    // colocate_async builds into the replay-buffer loop with verl's defaults (one warm-up batch
    // of 8 prompts here, threshold 8, drop) and the sampler's settings.
    use verlc_spec::trainer::{AsyncMode, AsyncSpec, OffPolicyStrategy};
    for (extra, want) in [
        (
            vec![],
            AsyncSpec {
                mode: AsyncMode::ColocateAsync,
                parameter_sync_step: 1,
                warmup_prompts: 8,
                max_off_policy_threshold: Some(8),
                strategy: OffPolicyStrategy::Drop,
                rollout_processes: 0,
            },
        ),
        (
            vec![
                "trainer.v1.colocate_async.num_warmup_batches=1.5",
                "trainer.v1.sampler.max_off_policy_threshold=null",
                "trainer.v1.sampler.max_off_policy_strategy=wait",
                "data.gen_batch_size=4",
            ],
            AsyncSpec {
                mode: AsyncMode::ColocateAsync,
                parameter_sync_step: 1,
                warmup_prompts: 12,
                max_off_policy_threshold: None,
                strategy: OffPolicyStrategy::Wait,
                rollout_processes: 0,
            },
        ),
        // separate_async: the step's 8 prompts as 2 mini-batch updates; the rollout pool (one
        // node of the trainer's width) is a replica process beside the one rank; its weight
        // sync needs a backend verl accepts.
        (
            SEPARATE.to_vec(),
            AsyncSpec {
                mode: AsyncMode::SeparateAsync,
                parameter_sync_step: 2,
                warmup_prompts: 8,
                max_off_policy_threshold: Some(8),
                strategy: OffPolicyStrategy::Drop,
                rollout_processes: 1,
            },
        ),
    ] {
        let mut o = ONE_RANK_ASYNC.to_vec();
        o.extend(extra);
        match lower_request(&build_request(&dir, &o)) {
            SpecOutcome::Ok { spec, .. } => assert_eq!(spec.run.asynchronous, Some(want)),
            SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
        }
    }
    // What the asynchronous loop does not run yet, and a threshold verl asserts on, are errors
    // at their keys.
    for (extra, key) in [
        (
            "trainer.v1.sampler.max_off_policy_threshold=0",
            "trainer.v1.sampler.max_off_policy_threshold",
        ),
        ("algorithm.adv_estimator=remax", "algorithm.adv_estimator"),
    ] {
        let mut o = ONE_RANK_ASYNC.to_vec();
        o.push(extra);
        assert_build_refuses(&dir, &o, key);
    }
    // A Megatron actor runs both modes with the built-in rollout (the whole model beside each
    // rank) and with vLLM.
    for mode in [&[][..], SEPARATE] {
        let mut o = ONE_RANK_ASYNC.to_vec();
        o.extend(mode);
        o.extend(MEGATRON_FP32);
        let megatron = |o: &[&str]| LoadRequest {
            config_name: Some("ppo_megatron_trainer".into()),
            ..build_request(&dir, o)
        };
        match lower_request(&megatron(&o)) {
            SpecOutcome::Ok { spec, .. } => {
                assert!(spec.strategy == verlc_spec::trainer::StrategyName::Megatron);
                assert!(spec.run.asynchronous.is_some() && spec.rollout.vllm.is_none());
            }
            SpecOutcome::Errors(c) => panic!("{o:?}: {:#?}", errors(&c.diagnostics)),
        }
        // At TP=2 the rollout's tensor-parallel size applies to validation only: a warning.
        let mut tp2 = o.clone();
        tp2.extend([
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.ref.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        ]);
        match lower_request(&megatron(&tp2)) {
            SpecOutcome::Ok { checked, .. } => {
                let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
                assert!(
                    checked.diagnostics.iter().any(|d| !d.is_error()
                        && d.code.0 == "B006"
                        && d.key_path.as_deref() == Some(key)),
                    "{:#?}",
                    checked.diagnostics
                );
            }
            SpecOutcome::Errors(c) => panic!("{tp2:?}: {:#?}", errors(&c.diagnostics)),
        }
        o.push("actor_rollout_ref.rollout.name=vllm");
        match lower_request(&megatron(&o)) {
            SpecOutcome::Ok { spec, .. } => assert!(spec.rollout.vllm.is_some()),
            SpecOutcome::Errors(c) => panic!("{o:?}: {:#?}", errors(&c.diagnostics)),
        }
    }
    // separate_async's built-in pool gives every trainer rank replica processes of its own:
    // two for one rank build, one for two ranks is refused at the pool's width.
    let mut o = ONE_RANK_ASYNC.to_vec();
    o.extend(SEPARATE);
    o.push("actor_rollout_ref.rollout.n_gpus_per_node=2");
    match lower_request(&build_request(&dir, &o)) {
        SpecOutcome::Ok { spec, .. } => {
            assert_eq!(spec.run.asynchronous.map(|a| a.rollout_processes), Some(2));
        }
        SpecOutcome::Errors(c) => panic!("{o:?}: {:#?}", errors(&c.diagnostics)),
    }
    o.extend([
        "trainer.n_gpus_per_node=2",
        "actor_rollout_ref.rollout.n_gpus_per_node=1",
    ]);
    assert_build_refuses(&dir, &o, "actor_rollout_ref.rollout.n_gpus_per_node");
    // The vLLM rollout generates in both asynchronous modes (a server of its own).
    for mode in [&[][..], SEPARATE] {
        let mut o = ONE_RANK_ASYNC.to_vec();
        o.extend(mode);
        o.push("actor_rollout_ref.rollout.name=vllm");
        match lower_request(&build_request(&dir, &o)) {
            SpecOutcome::Ok { spec, .. } => {
                assert!(spec.rollout.vllm.is_some() && spec.run.asynchronous.is_some());
            }
            SpecOutcome::Errors(c) => panic!("{o:?}: {:#?}", errors(&c.diagnostics)),
        }
    }
    // separate_async's actor runs each mini-batch's epochs before the next, as verl's
    // one-mini-batch updates do.
    let mut o = ONE_RANK_ASYNC.to_vec();
    o.extend(SEPARATE);
    o.push("actor_rollout_ref.actor.ppo_epochs=2");
    match lower_request(&build_request(&dir, &o)) {
        SpecOutcome::Ok { spec, .. } => {
            let u = &spec.actor.update;
            assert!(u.epochs_per_mini_batch && u.ppo_epochs == 2, "{u:?}");
        }
        SpecOutcome::Errors(c) => panic!("{o:?}: {:#?}", errors(&c.diagnostics)),
    }
    // separate_async's mini-batch updates run as one batch in verlc's step: what would differ
    // from verl's one-after-the-other is refused at its key.
    for (extra, key) in [
        (
            "actor_rollout_ref.actor.optim.lr_warmup_steps=3",
            "actor_rollout_ref.actor.optim",
        ),
        ("algorithm.adv_estimator=gae", "algorithm.adv_estimator"),
    ] {
        let mut o = ONE_RANK_ASYNC.to_vec();
        o.extend(SEPARATE);
        o.push(extra);
        assert_build_refuses(&dir, &o, key);
    }
}

/// `data.gen_batch_size` as each of verl 0.9's trainers reads it: the v1 trainer trains
/// `train_batch_size` prompts a step (gen_batch_size is its dataloader's fetch size); the legacy
/// trainer (`use_v1: false`) generates its dataloader batch of gen_batch_size prompts. DAPO's
/// target is train_batch_size under both.
#[test]
fn a_step_takes_as_many_prompts_as_the_trainer_that_runs() {
    use verlc_front::compile::{SpecOutcome, lower_request};
    let Some(dir) = newer_tree() else {
        return;
    };
    for (extra, want) in [(None, 8), (Some("trainer.use_v1=false"), 4)] {
        let mut o = vec![
            "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
            "data.train_batch_size=8",
            "data.gen_batch_size=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=4",
        ];
        o.extend(extra);
        match lower_request(&build_request(&dir, &o)) {
            SpecOutcome::Ok { spec, .. } => {
                assert_eq!(spec.data.batch_size, want, "{extra:?}");
                assert_eq!(spec.data.train_batch_size, 8);
            }
            SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
        }
    }
}

/// `actor_rollout_ref.hybrid_engine: false` as each release's trainer takes it: the legacy
/// trainer (`use_v1: false`) asserts (V034 error); verl 0.9's v1 trainer does not: 0.9.1's
/// `separate_async` reads it (nothing reported), its other modes and 0.9.0 ignore it (a V034
/// warning).
#[test]
fn hybrid_engine_off_is_judged_by_the_trainer_that_runs() {
    let off = "actor_rollout_ref.hybrid_engine=false";
    for (release, extra, want) in [
        ("0.9.1", "trainer.v1.trainer_mode=separate_async", None),
        ("0.9.1", "trainer.v1.trainer_mode=sync", Some(false)),
        (
            "0.9.0",
            "trainer.v1.trainer_mode=separate_async",
            Some(false),
        ),
        ("0.9.1", "trainer.use_v1=false", Some(true)),
    ] {
        let Some(dir) = release_tree(release) else {
            return;
        };
        let d = run(&dir, "ppo_trainer", &[off, extra]);
        let got: Vec<bool> = d
            .iter()
            .filter(|x| x.code.0 == "V034")
            .map(|x| x.is_error())
            .collect();
        assert_eq!(
            got,
            want.into_iter().collect::<Vec<_>>(),
            "{release} {extra}: {d:#?}"
        );
    }
}

/// `verlc build` of the 0.9.1 tree with `overrides` refuses them with B018 at `key`.
fn assert_build_refuses(dir: &Path, overrides: &[&str], key: &str) {
    use verlc_front::compile::{SpecOutcome, lower_request};
    match lower_request(&build_request(dir, overrides)) {
        SpecOutcome::Ok { .. } => panic!("{overrides:?} must be refused at {key}"),
        SpecOutcome::Errors(c) => assert!(
            c.diagnostics
                .iter()
                .any(|d| d.is_error() && d.code.0 == "B018" && d.key_path.as_deref() == Some(key)),
            "{overrides:?}: {:#?}",
            errors(&c.diagnostics)
        ),
    }
}

/// `separate_async` (after ONE_RANK_ASYNC): 2 mini-batch updates per weight sync, a rollout
/// pool and a weight-sync backend verl accepts for it.
const SEPARATE: &[&str] = &[
    "trainer.v1.trainer_mode=separate_async",
    "trainer.v1.separate_async.parameter_sync_step=2",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
];

/// A Megatron actor (and its reference) computing in fp32 on CPU.
const MEGATRON_FP32: &[&str] = &[
    "actor_rollout_ref.actor.megatron.dtype=float32",
    "actor_rollout_ref.ref.megatron.dtype=float32",
    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=1",
    "actor_rollout_ref.rollout.dtype=float32",
];

/// `colocate_async` on one rank with a small batch.
const ONE_RANK_ASYNC: &[&str] = &[
    "trainer.v1.trainer_mode=colocate_async",
    "trainer.n_gpus_per_node=1",
    "data.train_batch_size=8",
    "actor_rollout_ref.actor.ppo_mini_batch_size=4",
    "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
];

/// verl 0.9's optimal token baseline on its own tree: with `calculate_sum_pi_squared` (as
/// `examples/otb_trainer` sets it) the config checks clean; without it, V055 at the tree's line
/// of the key (verl asserts at the first advantage computation).
#[test]
fn the_optimal_token_baseline_needs_the_squared_probabilities() {
    let Some(dir) = newer_tree() else {
        return;
    };
    let est = "algorithm.adv_estimator=optimal_token_baseline";
    let d = run(
        &dir,
        "ppo_trainer",
        &[est, "actor_rollout_ref.actor.calculate_sum_pi_squared=True"],
    );
    assert!(errors(&d).is_empty(), "{:#?}", errors(&d));
    let d = run(&dir, "ppo_trainer", &[est]);
    let v055: Vec<_> = d.iter().filter(|x| x.code.0 == "V055").collect();
    assert_eq!(v055.len(), 1, "{:#?}", errors(&d));
    assert_eq!(
        v055[0].key_path.as_deref(),
        Some("actor_rollout_ref.actor.calculate_sum_pi_squared")
    );
    assert!(v055[0].primary.is_some(), "placed at the tree's line");
}

#[test]
fn the_modelled_release_gets_no_pass_through() {
    let venv_lib = root().join(".venv/lib");
    let Some(dir) = std::fs::read_dir(&venv_lib).ok().and_then(|r| {
        r.flatten()
            .map(|e| e.path().join("site-packages/verl/trainer/config"))
            .find(|p| p.is_dir())
    }) else {
        verlc_testkit::missing_data("no verl in the venv (scripts/setup installs verl 0.7.0)");
        return;
    };
    let d = run(&dir, "ppo_trainer", &[]);
    assert!(
        !d.iter().any(|x| x.code == codes::SCHEMA_UNMODELLED_RELEASE),
        "{:#?}",
        d
    );
    assert!(errors(&d).is_empty(), "{:#?}", errors(&d));
}

/// A request a user would build on the newer tree: verl's launch-script basics, the built-in
/// rollout on CPU, GRPO with 4 responses, and `extra`.
fn build_request(dir: &Path, extra: &[&str]) -> LoadRequest {
    LoadRequest {
        config_dir: Some(dir.to_path_buf()),
        config_name: Some("ppo_trainer".into()),
        overrides: BASICS
            .iter()
            .chain(&[
                "actor_rollout_ref.rollout.name=verlc",
                "trainer.device=cpu",
                "trainer.logger=[console]",
                "algorithm.adv_estimator=grpo",
                "actor_rollout_ref.rollout.n=4",
            ])
            .chain(extra)
            .map(|s| s.to_string())
            .collect(),
        cwd: root(),
        ..LoadRequest::default()
    }
}

/// `verlc build` lowers a newer release's tree to a spec: verl's own defaults there are not
/// the user's settings (no verdict fires on them); a key the user sets still gets its verdict.
#[test]
fn a_newer_release_lowers_for_a_build() {
    use verlc_front::compile::{SpecOutcome, lower_request};
    let Some(dir) = newer_tree() else {
        return;
    };
    let req = |extra: &[&str]| build_request(&dir, extra);
    match lower_request(&req(&[])) {
        SpecOutcome::Ok { spec, .. } => {
            assert_eq!(spec.actor.update.ppo_epochs, 1, "verl's default epochs");
        }
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    // Ulysses set by the user lowers as on the modelled release (8 GPUs: 4 groups of 2) ...
    let key = "actor_rollout_ref.actor.ulysses_sequence_parallel_size";
    match lower_request(&req(&[&format!("{key}=2")])) {
        SpecOutcome::Ok { spec, .. } => assert_eq!(spec.actor.engine.ulysses(), 2),
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    // ... and a degree the world cannot be split by is refused at its override.
    match lower_request(&req(&[&format!("{key}=3")])) {
        SpecOutcome::Ok { .. } => panic!("a Ulysses degree of 3 on 8 ranks must be refused"),
        SpecOutcome::Errors(c) => assert!(
            c.diagnostics
                .iter()
                .any(|d| d.is_error() && d.key_path.as_deref() == Some(key)),
            "{:#?}",
            errors(&c.diagnostics)
        ),
    }
    // LoRA lowers there too.
    match lower_request(&req(&["actor_rollout_ref.model.lora_rank=8"])) {
        SpecOutcome::Ok { spec, .. } => {
            assert_eq!(spec.actor.lora.map(|l| l.rank), Some(8));
        }
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    // On-policy distillation (0.9's `distillation` section) lowers to its teachers and the
    // actor's loss term; what verl raises at start-up, or verlc does not run, is refused at
    // its key.
    let teacher = "distillation.teacher_models.teacher_model.model_path=Qwen/Qwen3-32B";
    match lower_request(&req(&[
        "distillation.enabled=True",
        teacher,
        "distillation.distillation_loss.loss_max_clamp=10.0",
    ])) {
        SpecOutcome::Ok { spec, .. } => {
            let d = spec.distillation.expect("teachers");
            assert_eq!(d.teachers.len(), 1);
            assert_eq!(d.teachers[0].key, None, "one teacher scores every row");
            assert_eq!(d.teachers[0].model_path, "Qwen/Qwen3-32B");
            let loss = spec.actor.update.distillation.expect("loss term");
            assert_eq!(
                loss.mode,
                DistillationMode::Estimator(verlc_spec::algo::KlKind::K3),
                "verl's default mode"
            );
            assert!(loss.use_task_rewards && !loss.use_policy_gradient);
            assert_eq!(loss.loss_max_clamp, Some(10.0));
        }
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    let refused = |extra: &[&str]| -> Vec<Option<String>> {
        let mut all = vec!["distillation.enabled=True", teacher];
        all.extend(extra);
        match lower_request(&req(&all)) {
            SpecOutcome::Ok { .. } => panic!("{extra:?} must not build"),
            SpecOutcome::Errors(c) => c
                .diagnostics
                .iter()
                .filter(|d| d.is_error() && d.code.0 == "B018")
                .map(|d| d.key_path.clone())
                .collect(),
        }
    };
    // The top-k forward KL with verl's default k (32) and the example's clamp.
    match lower_request(&req(&[
        "distillation.enabled=True",
        teacher,
        "distillation.distillation_loss.loss_mode=forward_kl_topk",
        "distillation.distillation_loss.log_prob_min_clamp=-10.0",
    ])) {
        SpecOutcome::Ok { spec, .. } => assert_eq!(
            spec.actor.update.distillation.expect("loss term").mode,
            DistillationMode::ForwardKlTopk {
                topk: 32,
                log_prob_min_clamp: Some(-10.0)
            }
        ),
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    // What `verlc build` checks once the models are at hand: a k beyond the vocabulary of the
    // student or a teacher (here the built-in tiny model's 38 tokens) is refused at `topk`.
    let tiny = "'builtin://tiny?layers=2&hidden=32'";
    for (k, refused) in [(38, false), (39, true)] {
        let request = req(&[
            "distillation.enabled=True",
            &format!("actor_rollout_ref.model.path={tiny}"),
            &format!("distillation.teacher_models.teacher_model.model_path={tiny}"),
            "distillation.distillation_loss.loss_mode=forward_kl_topk",
            &format!("distillation.distillation_loss.topk={k}"),
        ]);
        let SpecOutcome::Ok { spec, .. } = lower_request(&request) else {
            panic!("topk={k} must lower");
        };
        let problems =
            verlc_front::plan::models::model_problems(&spec, &verlc_hub::HubEnv::from_env());
        let keys: Vec<&str> = problems.iter().map(|p| p.key).collect();
        if refused {
            assert_eq!(keys, ["distillation.distillation_loss.topk"], "topk={k}");
            assert!(
                problems[0].message.contains("vocabulary of 38"),
                "{}",
                problems[0].message
            );
        } else {
            assert!(keys.is_empty(), "topk={k}: {keys:?}");
        }
    }
    // k1 as a supervised loss and a top-k loss without k (verl raises for both) or below 1.
    assert_eq!(
        refused(&["distillation.distillation_loss.loss_mode=k1"]),
        vec![Some("distillation.distillation_loss.loss_mode".to_owned())]
    );
    let topk = Some("distillation.distillation_loss.topk".to_owned());
    for k in ["null", "0"] {
        assert_eq!(
            refused(&[
                "distillation.distillation_loss.loss_mode=forward_kl_topk",
                &format!("distillation.distillation_loss.topk={k}"),
            ]),
            vec![topk.clone()]
        );
    }
    // A misspelt field (verl's dataclass conversion raises) is refused at its line, with the
    // field it resembles.
    assert_eq!(
        refused(&["+distillation.distillation_loss.loss_mod=k3"]),
        vec![Some("distillation.distillation_loss.loss_mod".to_owned())]
    );
    let SpecOutcome::Errors(c) = lower_request(&req(&[
        "distillation.enabled=True",
        teacher,
        "+distillation.distillation_loss.loss_mod=k3",
    ])) else {
        panic!("a misspelt field must not build");
    };
    let help: Vec<_> = c
        .diagnostics
        .iter()
        .filter_map(|d| d.help.as_deref())
        .collect();
    assert!(help.contains(&"did you mean `loss_mode`?"), "{help:?}");
    // Several teachers: the default entry is dropped, each other needs its key.
    assert_eq!(
        refused(&["+distillation.teacher_models.math.model_path=Qwen/Qwen3-8B"]),
        vec![Some("distillation.teacher_models.math.key".to_owned())]
    );
    // Rollout correction runs as the release computes it: on 0.9's tree with 0.8's metrics,
    // IcePop's `"lower_upper"` giving both bounds; on verlc's built-in (0.7) tree a number keeps
    // 0.7's form, a string (a 0.8 value, V060's warning) runs as 0.8 does.
    use verlc_spec::trainer::CorrectionForm;
    let correction = |spec: &verlc_spec::TrainerSpec| {
        let c = spec
            .algorithm
            .rollout_correction
            .clone()
            .expect("correction");
        (c.is_threshold, c.is_threshold_lower, c.form)
    };
    let is = [
        "algorithm.rollout_correction.rollout_is=token",
        "actor_rollout_ref.rollout.calculate_log_probs=true",
    ];
    for (threshold, want) in [
        ("0.5_4.0", (4.0, Some(0.5), CorrectionForm::Verl08)),
        ("3.0", (3.0, None, CorrectionForm::Verl08)),
    ] {
        let t = format!("algorithm.rollout_correction.rollout_is_threshold={threshold}");
        match lower_request(&req(&[is[0], is[1], &t])) {
            SpecOutcome::Ok { spec, .. } => assert_eq!(correction(&spec), want, "{threshold}"),
            SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
        }
    }
    // On the built-in trees: 0.7.0's keeps 0.7's form for a number; 0.9.1's (the default)
    // takes 0.8's.
    for (builtin, threshold, want) in [
        (
            BuiltinRelease::V0_7_0,
            "2.5",
            (2.5, None, CorrectionForm::Verl07),
        ),
        (
            BuiltinRelease::V0_7_0,
            "'0.5_4.0'",
            (4.0, Some(0.5), CorrectionForm::Verl08),
        ),
        (
            BuiltinRelease::V0_9_1,
            "2.5",
            (2.5, None, CorrectionForm::Verl08),
        ),
    ] {
        let request = LoadRequest {
            config_file: Some(root().join("examples/quickstart.yaml")),
            overrides: vec![
                is[0].into(),
                is[1].into(),
                format!("algorithm.rollout_correction.rollout_is_threshold={threshold}"),
            ],
            cwd: root(),
            builtin,
            ..LoadRequest::default()
        };
        match lower_request(&request) {
            SpecOutcome::Ok { spec, .. } => assert_eq!(correction(&spec), want, "{threshold}"),
            SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
        }
    }
}

/// What `verlc check` still reports on verl main's examples, each a problem verl itself hits
/// or an artifact of how the command lines were captured (tests/fixtures/verl_examples_main).
const MAIN_KNOWN: &[(&str, &[&str], &str)] = &[
    (
        "examples/remax_trainer/run_qwen3_8b_fsdp.sh",
        &["V066"],
        "adv_estimator=remax under the v1 trainer (verl 0.9's default): it never generates ReMax's greedy baseline rollout and calls the estimator without reward_baselines, a TypeError at the first advantage step",
    ),
    (
        "examples/grpo_trainer/run_hy_v3_megatron.sh",
        &["V059", "V059", "V059", "V059", "V059", "V059"],
        REWARD_KEYS_OF_0_7,
    ),
    (
        "examples/grpo_trainer/run_nemotron_nano_v3_30b_a3b_megatron.sh",
        &["V059", "V059", "V059", "V059", "V059", "V059"],
        REWARD_KEYS_OF_0_7,
    ),
    (
        "examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh",
        &[
            "S001", "V018", "V059", "V059", "V059", "V059", "V059", "V059",
        ],
        "rollout expert parallel 2 with tensor parallel 4 x data 1: main's RolloutConfig asserts they are equal (V018); `+rollout.moe_tensor_parallel_size` is a field of main's RolloutConfig its YAML lacks, which verlc (no leaf table for main) reports as unknown (S001); and the 0.7 reward keys",
    ),
    (
        "examples/grpo_trainer/run_qwen3_vl_30b_a3b_fsdp.sh",
        &["S003"],
        "`rollout.name=dummy_infer_backend`: no rollout of verl main registers that name",
    ),
    (
        "examples/sapo_trainer/run_qwen3_30b_a3b_fsdp.sh",
        &["S001", "S001"],
        "`+actor.policy_loss.tau_pos/tau_neg`: SAPO's taus are fields of the actor, not of PolicyLossConfig, whose conversion raises on them",
    ),
    (
        "examples/sapo_trainer/run_qwen3_8b_fsdp.sh",
        &["S001", "S001"],
        "as run_qwen3_30b_a3b_fsdp.sh",
    ),
];

const REWARD_KEYS_OF_0_7: &str = "verl main's own script sets the 0.7 reward keys (`reward_model.reward_manager`, `reward_model.reward_kwargs.*`), which main_ppo no longer moves into `reward`: verl would run the default manager";

/// A user on verl main: `verlc check --config-dir <verl main's tree>` on the command lines of
/// verl main's example scripts. Every one that composes (83 of 88; cli/tests/
/// hydra_parity.rs shows Hydra rejects the same 5) checks without errors, apart from
/// [`MAIN_KNOWN`].
#[test]
fn verl_mains_examples_check_clean() {
    let dir = verl_main_tree();
    let composed = examples_check_clean("verl_examples_main", &dir, MAIN_KNOWN);
    assert_eq!(composed, 83, "verl main's examples that compose");
}

/// verl 0.7.1+'s `reward` section lowers as verl runs it: the scoring function, manager and
/// reward model from `reward.*`, and the top-level keys of the 0.7.0 layout, when set, moved
/// over them as 0.7.1 and 0.8's `migrate_legacy_reward_impl` does (an error on 0.9, which no
/// longer calls it). A misspelt key under `reward` is an error.
#[test]
fn a_newer_releases_reward_section_lowers() {
    use verlc_front::compile::{SpecOutcome, lower_request};
    use verlc_spec::trainer::{RewardManagerSpec, RewardModelInput, RewardSpec};
    let Some(dir) = newer_tree() else {
        return;
    };
    let req = |extra: &[&str]| build_request(&dir, extra);
    let spec = |extra: &[&str]| match lower_request(&req(extra)) {
        SpecOutcome::Ok { spec, .. } => spec,
        SpecOutcome::Errors(c) => panic!("{extra:?}: {:#?}", errors(&c.diagnostics)),
    };
    let python = |s: &verlc_spec::TrainerSpec| match &s.reward {
        RewardSpec::Python { path, name, .. } => (path.clone(), name.clone()),
        other => panic!("{other:?}"),
    };
    assert!(matches!(spec(&[]).reward, RewardSpec::Builtin));
    let s = spec(&["reward.custom_reward_function.path=my_reward.py"]);
    assert_eq!(python(&s), ("my_reward.py".into(), "compute_score".into()));
    // The 0.7.0 keys, set, move over the section's where verl moves them (0.7.1 and 0.8's
    // main_ppo), and are errors on 0.9, whose main_ppo never reads them.
    if let Some(eight) = release_tree("0.8.0") {
        let on_eight = |extra: &[&str]| match lower_request(&build_request(&eight, extra)) {
            SpecOutcome::Ok { spec, .. } => spec,
            SpecOutcome::Errors(c) => panic!("{extra:?}: {:#?}", errors(&c.diagnostics)),
        };
        let s = on_eight(&[
            "custom_reward_function.path=old.py",
            "custom_reward_function.name=score",
            "reward.custom_reward_function.path=new.py",
        ]);
        assert_eq!(python(&s), ("old.py".into(), "score".into()));
        let s = on_eight(&["reward_model.reward_manager=dapo"]);
        assert!(matches!(s.reward_manager, RewardManagerSpec::Dapo { .. }));
    }
    for legacy in [
        "custom_reward_function.path=old.py",
        "reward_model.reward_manager=dapo",
    ] {
        match lower_request(&req(&[legacy])) {
            SpecOutcome::Ok { .. } => panic!("{legacy}: verl 0.9 ignores it"),
            SpecOutcome::Errors(c) => assert!(
                c.diagnostics
                    .iter()
                    .any(|d| d.is_error() && d.code.0 == "V059"),
                "{legacy}: {:#?}",
                errors(&c.diagnostics)
            ),
        }
    }
    let s = spec(&[
        "reward.reward_manager.name=dapo",
        "+reward.reward_kwargs.max_resp_len=64",
        "+reward.reward_kwargs.overlong_buffer_cfg={enable: true, len: 16, penalty_factor: 1.0, log: false}",
    ]);
    match s.reward_manager {
        RewardManagerSpec::Dapo {
            overlong_buffer: Some(b),
        } => assert_eq!((b.max_resp_len, b.len), (64.0, 16.0)),
        other => panic!("{other:?}"),
    }
    // A manager class of the user's: run in Python with the reward kwargs and the config.
    let s = spec(&[
        "reward.reward_manager.source=importlib",
        "reward.reward_manager.module.path=my_rm.py",
        "reward.reward_manager.name=MyManager",
        "+reward.reward_kwargs.offset=1.5",
    ]);
    match s.reward_manager {
        RewardManagerSpec::Python(m) => {
            let class = m.class.expect("the user's class");
            assert_eq!(
                (class.path.as_str(), class.name.as_str()),
                ("my_rm.py", "MyManager")
            );
            assert_eq!(m.kwargs.get("offset"), Some(&serde_json::json!(1.5)));
            assert!(m.config.get("reward").is_some(), "the composed config");
        }
        other => panic!("{other:?}"),
    }
    // The reward model of the reward loop.
    let s = spec(&[
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=my/rm",
        "reward.reward_model.rollout.name=vllm",
        "reward.reward_model.rollout.dtype=float32",
    ]);
    let rm = s.reward_model.expect("reward model");
    assert_eq!(rm.model_path, "my/rm");
    assert_eq!(rm.dtype, Some(verlc_spec::Dtype::Fp32));
    assert!(matches!(rm.input, RewardModelInput::Chat { .. }));
    // With a custom function verl serves the model to it (a generative reward model), which
    // verlc cannot: refused at the switch.
    match lower_request(&req(&[
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=my/rm",
        "reward.reward_model.rollout.name=vllm",
        "reward.custom_reward_function.path=genrm.py",
    ])) {
        SpecOutcome::Ok { .. } => panic!("a generative reward model must not build"),
        SpecOutcome::Errors(c) => assert!(
            c.diagnostics.iter().any(
                |d| d.is_error() && d.key_path.as_deref() == Some("reward.reward_model.enable")
            ),
            "{:#?}",
            errors(&c.diagnostics)
        ),
    }
    assert_eq!(
        python(&spec(&["reward.custom_reward_function.path=genrm.py"])).0,
        "genrm.py"
    );
    // verl needs the reward model's server engine (`???` in its tree).
    match lower_request(&req(&[
        "reward.reward_model.enable=true",
        "reward.reward_model.model_path=my/rm",
    ])) {
        SpecOutcome::Ok { .. } => panic!("the reward model's rollout.name is mandatory"),
        SpecOutcome::Errors(c) => assert!(
            c.diagnostics.iter().any(|d| d.is_error()
                && d.key_path.as_deref() == Some("reward.reward_model.rollout.name")),
            "{:#?}",
            errors(&c.diagnostics)
        ),
    }
    // A misspelt key of the section, and a manager verlc does not implement, are refused.
    for (o, key) in [
        (
            "reward.reward_manager.nmae=dapo",
            "reward.reward_manager.nmae",
        ),
        (
            "reward.reward_manager.name=prime",
            "reward.reward_manager.name",
        ),
    ] {
        match lower_request(&req(&[o])) {
            SpecOutcome::Ok { .. } => panic!("{o} must be refused"),
            SpecOutcome::Errors(c) => assert!(
                c.diagnostics
                    .iter()
                    .any(|d| d.is_error() && d.key_path.as_deref() == Some(key)),
                "{o}: {:#?}",
                errors(&c.diagnostics)
            ),
        }
    }
}

/// What `verlc check` still reports on verl 0.9.0's example calls composed on verl 0.9.1's
/// tree (tests/fixtures/verl_examples_0_9_0), each with the reason.
const RELEASE_0_9_KNOWN: &[(&str, &[&str], &str)] = &[
    (
        "examples/remax_trainer/run_qwen3_8b_fsdp.sh",
        &["V066"],
        "adv_estimator=remax under the v1 trainer (verl 0.9's default): it never generates ReMax's greedy baseline rollout and calls the estimator without reward_baselines, a TypeError at the first advantage step",
    ),
    (
        "examples/sapo_trainer/run_qwen3_30b_a3b_fsdp.sh",
        &["S001", "S001"],
        "appends policy_loss.tau_pos/tau_neg, which verl 0.9's PolicyLossConfig does not have (SAPO reads actor.tau_pos/tau_neg): its dataclass conversion rejects them at start-up",
    ),
    (
        "examples/sapo_trainer/run_qwen3_8b_fsdp.sh",
        &["S001", "S001"],
        "as run_qwen3_30b_a3b_fsdp.sh",
    ),
    (
        "examples/grpo_trainer/run_qwen3_vl_30b_a3b_fsdp.sh",
        &["S003"],
        "rollout.name=dummy_infer_backend is not in verl 0.9.1's rollout registry (get_rollout_class asserts)",
    ),
];

/// What `verlc check` reports besides [`RELEASE_0_9_KNOWN`] on verl 0.9.0's example calls on
/// 0.9.0's own tree, where the scripts that set keys 0.9.1 dropped compose too.
const RELEASE_0_9_0_KNOWN: &[(&str, &[&str], &str)] = &[
    (
        "examples/grpo_trainer/run_hy_v3_megatron.sh",
        &["V059"; 6],
        "sets reward_model.reward_manager and reward_model.reward_kwargs.*: verl 0.9.0's main_ppo no longer moves the 0.7 reward keys over `reward` (migrate_legacy_reward_impl is called by the fully-async entry point only), so the run would use the naive manager without the overlong buffer",
    ),
    (
        "examples/grpo_trainer/run_nemotron_nano_v3_30b_a3b_megatron.sh",
        &["V059"; 6],
        "as run_hy_v3_megatron.sh",
    ),
    (
        "examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh",
        &[
            "S001", "V018", "V059", "V059", "V059", "V059", "V059", "V059",
        ],
        "as run_hy_v3_megatron.sh, and appends rollout.moe_tensor_parallel_size, which verl 0.9's RolloutConfig does not have, with expert parallel 2 against tensor parallel 4 × data parallel 1 (RolloutConfig.__post_init__ asserts)",
    ),
];

/// What `verlc check` still reports on verl 0.8.0's example calls on its own tree
/// (tests/fixtures/verl_examples_0_8_0), each with the reason.
const RELEASE_0_8_KNOWN: &[(&str, &[&str], &str)] = &[
    (
        "examples/grpo_trainer/run_qwen3_30b_a3b_megatron.sh",
        &["S001", "V018"],
        "appends rollout.moe_tensor_parallel_size, which verl 0.8's RolloutConfig does not have (its dataclass conversion rejects it), and sets expert parallel 2 with tensor parallel 4 × data parallel 1 (RolloutConfig.__post_init__ asserts expert_parallel_size == TP × DP)",
    ),
    (
        "examples/grpo_trainer/run_qwen3_vl_30b_a3b_fsdp.sh",
        &["S003"],
        "rollout.name=dummy_infer_backend is not in verl 0.8's rollout registry (get_rollout_class asserts)",
    ),
    (
        "examples/sapo_trainer/run_qwen3_30b_a3b_fsdp.sh",
        &["S001", "S001"],
        "appends policy_loss.tau_pos/tau_neg, which verl 0.8's PolicyLossConfig does not have (SAPO reads actor.tau_pos/tau_neg): its dataclass conversion rejects them at start-up",
    ),
    (
        "examples/sapo_trainer/run_qwen3_8b_fsdp.sh",
        &["S001", "S001"],
        "as run_qwen3_30b_a3b_fsdp.sh",
    ),
];

/// `verlc check --config-dir <release tree>` on a release's captured example calls: every call
/// that composes (tests/hydra_parity.rs holds composition to Hydra's) checks without errors,
/// apart from `known`. Returns how many composed.
/// One launch call of a release's example scripts (a captured fixture).
struct ExampleCall {
    script: String,
    /// The request Hydra was given, on the config tree `tree`.
    config_name: String,
    overrides: Vec<String>,
}

impl ExampleCall {
    fn request(&self, tree: &Path) -> LoadRequest {
        LoadRequest {
            config_dir: Some(tree.to_path_buf()),
            config_name: Some(self.config_name.clone()),
            overrides: self.overrides.clone(),
            cwd: root(),
            ..LoadRequest::default()
        }
    }
}

/// The calls of `tests/fixtures/<fixture>/overrides.json`.
fn example_calls(fixture: &str) -> Vec<ExampleCall> {
    let path = root()
        .join("tests/fixtures")
        .join(fixture)
        .join("overrides.json");
    let cases: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json");
    cases
        .iter()
        .map(|case| ExampleCall {
            script: case["script"].as_str().expect("script").to_owned(),
            config_name: case["config_name"]
                .as_str()
                .unwrap_or("ppo_trainer")
                .to_owned(),
            overrides: case["overrides"]
                .as_array()
                .expect("overrides")
                .iter()
                .filter_map(|o| o.as_str().map(str::to_owned))
                .collect(),
        })
        .collect()
}

/// Checks every call of `fixture` on `tree`: those that compose are clean apart from `known`,
/// and no key of verl's files passes unchecked (S007), except on an unreleased tree (verl's
/// main branch), whose keys no release table holds: there the S007 must name the tree's
/// version and list the keys. Returns how many calls composed.
fn examples_check_clean(fixture: &str, tree: &Path, known: &[(&str, &[&str], &str)]) -> usize {
    let version = std::fs::read_to_string(tree.join("../../version/version")).unwrap_or_default();
    let unreleased = version.trim().ends_with(".dev");
    let (mut composed, mut clean) = (0, 0);
    let (mut unexpected, mut passed_through) = (Vec::new(), Vec::new());
    for call in example_calls(fixture) {
        let script = call.script.as_str();
        let req = call.request(tree);
        let d = check(&req, &CheckOptions::default()).diagnostics;
        let codes: Vec<&str> = d
            .iter()
            .filter(|x| x.is_error())
            .map(|x| x.code.0)
            .collect();
        if codes
            .iter()
            .any(|c| c.starts_with('H') || c.starts_with('Y'))
        {
            continue; // does not compose (as with Hydra)
        }
        composed += 1;
        // The release's leaf table types every key of verl's files the 0.7 model lacks.
        if let Some(note) = d
            .iter()
            .find(|x| x.code == codes::SCHEMA_UNMODELLED_RELEASE)
        {
            let named = note.message.contains(version.trim())
                && note.notes.iter().any(|n| n.starts_with("unchecked: "));
            if !unreleased || !named {
                passed_through.push(format!("{script}: {} {:?}", note.message, note.notes));
            }
        }
        match known.iter().find(|(s, _, _)| *s == script) {
            Some((_, want, _)) if codes == *want => {}
            None if codes.is_empty() => clean += 1,
            _ => unexpected.push(format!("{script}: {:?}", errors(&d))),
        }
    }
    assert!(
        unexpected.is_empty(),
        "{fixture}:\n{}",
        unexpected.join("\n")
    );
    assert!(
        passed_through.is_empty(),
        "{fixture}: keys passed through unchecked:\n{}",
        passed_through.join("\n")
    );
    assert_eq!(clean, composed - known.len(), "{fixture}");
    composed
}

/// A user on verl 0.9: `verlc check --config-dir <0.9.1's tree>` on verl 0.9.0's example calls.
/// Every call that composes (Hydra rejects the same 27, which set keys 0.9.1 dropped) checks
/// without errors, apart from [`RELEASE_0_9_KNOWN`].
#[test]
fn verl_0_9_examples_check_clean() {
    let Some(dir) = newer_tree() else {
        return;
    };
    let composed = examples_check_clean("verl_examples_0_9_0", &dir, RELEASE_0_9_KNOWN);
    assert_eq!(composed, 61, "calls that compose on 0.9.1's tree");
}

/// A user on verl 0.9.0: `verlc check --config-dir <0.9.0's own tree>` on its example calls,
/// judged as 0.9.0 (its own leaf table: `megatron.grad_offload`, which 0.9.1 dropped, is a key
/// of this release). Every call that composes checks without errors, apart from
/// [`RELEASE_0_9_KNOWN`].
#[test]
fn verl_0_9_0_examples_check_clean_on_their_own_tree() {
    let Some(dir) = release_tree("0.9.0") else {
        return;
    };
    let known = [RELEASE_0_9_KNOWN, RELEASE_0_9_0_KNOWN].concat();
    let composed = examples_check_clean("verl_examples_0_9_0", &dir, &known);
    assert_eq!(
        composed, 82,
        "calls that compose on 0.9.0's tree (as with Hydra)"
    );
}

/// What `verlc check` still reports on verl 0.7.1's example calls on its own tree, besides the
/// [`JANUARY_MAIN_KNOWN`] its scripts share with verl main's of that time: problems verl 0.7.1 itself
/// hits at start-up.
const RELEASE_0_7_1_KNOWN: &[(&str, &[&str], &str)] = &[
    (
        "examples/ppo_trainer/run_deepseek7b_llm_sandbox_fusion.sh",
        &["V032"],
        "reward_model.reward_manager=prime: verl 0.7.1 loads reward managers from the reward loop's registry (naive, dapo, gdpo, remote), whose get_reward_manager_cls raises \"Unknown reward manager: prime\"",
    ),
    (
        "examples/grpo_trainer/run_qwen3-30b_dapo_megatron_fp8_trtllm.sh",
        &["S001", "V018"],
        "appends rollout.moe_tensor_parallel_size, which verl 0.7.1's RolloutConfig does not have (its dataclass conversion rejects it), and sets expert parallel 2 with tensor parallel 4 × data parallel 1 (RolloutConfig.__post_init__ asserts expert_parallel_size == TP × DP)",
    ),
];

/// What `verlc check` reports on the scripts verl 0.7.1 shares with January's main branch
/// (the main fixture before it followed verl-project's main), each a problem verl itself hits
/// or an artifact of how the command lines were captured.
const JANUARY_MAIN_KNOWN: &[(&str, &[&str], &str)] = &[
    (
        "examples/rollout_correction/run_with_rollout_corr.sh",
        &["V006"],
        "mini-batch 32 x n 1 / 8 ranks = 4 per rank, micro-batch 8: verl's fsdp_workers asserts the same",
    ),
    (
        "examples/rollout_correction/run_with_rollout_corr_multi_rs.sh",
        &["V006"],
        "as run_with_rollout_corr.sh",
    ),
    (
        "examples/grpo_trainer/run_qwen3moe-30b_megatron_96gb.sh",
        &["V043"],
        "a data path the script reads from the environment, captured as a dummy",
    ),
    (
        "examples/router_replay/run_qwen30_a3b_megatron_sglang.sh",
        &["V043", "V043"],
        "data paths from the environment, captured empty",
    ),
    (
        "examples/router_replay/run_qwen30_a3b_megatron_vllm.sh",
        &["V043", "V043"],
        "data paths from the environment, captured empty",
    ),
    (
        "examples/tuning/70b/qwen2-70b_grpo_32_h20_fsdp_vllm.sh",
        &["V043"],
        "a data path the script reads from the environment, captured as a dummy",
    ),
];

/// The same for verl 0.7.1's example calls on its own tree (the release that rewrote the
/// reward section and added `model_engine`), apart from [`JANUARY_MAIN_KNOWN`] and
/// [`RELEASE_0_7_1_KNOWN`].
#[test]
fn verl_0_7_1_examples_check_clean() {
    let Some(dir) = release_tree("0.7.1") else {
        return;
    };
    let known: Vec<_> = [JANUARY_MAIN_KNOWN, RELEASE_0_7_1_KNOWN].concat();
    let composed = examples_check_clean("verl_examples_0_7_1", &dir, &known);
    assert_eq!(
        composed, 122,
        "calls that compose on 0.7.1's tree (Hydra rejects the other 5: hydra_parity)"
    );
}

/// The same for verl 0.8.0's example calls on its own tree, apart from [`RELEASE_0_8_KNOWN`].
#[test]
fn verl_0_8_examples_check_clean() {
    let Some(dir) = release_tree("0.8.0") else {
        return;
    };
    let composed = examples_check_clean("verl_examples_0_8_0", &dir, RELEASE_0_8_KNOWN);
    assert_eq!(
        composed, 72,
        "calls that compose on 0.8.0's tree (Hydra rejects the other 4: hydra_parity)"
    );
}

/// verl's VeOmni engine (`model_engine=veomni`) builds as the FSDP role it equals: its
/// offload, Ulysses degree, shard groups (counted in data-parallel ranks) and precision
/// (`mixed_precision: false` trains bf16 shards with bf16 reductions) land in the FSDP engine
/// spec, its cosine schedule with `lr_min` in FSDP's cosine; what FSDP cannot express is refused
/// at the key that asked for it. An engine verlc does not lower (`torchtitan`) is refused by name
/// at the line that chose it, not as a missing FSDP section.
#[test]
fn veomni_builds_as_fsdp_and_other_engines_are_refused_by_name() {
    use verlc_front::compile::{SpecOutcome, lower_request};
    use verlc_front::plan::Dtype;
    use verlc_spec::optim::VerlSchedule;
    use verlc_spec::trainer::{EngineSpec, ScheduleSpec};
    let Some(dir) = newer_tree() else {
        return;
    };
    let veomni = [
        "model_engine=veomni",
        "trainer.n_gpus_per_node=8",
        "actor_rollout_ref.actor.veomni.param_offload=True",
        "actor_rollout_ref.actor.veomni.ulysses_parallel_size=2",
        "actor_rollout_ref.actor.veomni.fsdp_size=2",
        "actor_rollout_ref.actor.veomni.mixed_precision=False",
        "actor_rollout_ref.actor.optim.lr=1e-5",
        "actor_rollout_ref.actor.optim.lr_min=1e-6",
        "actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1",
        "actor_rollout_ref.model.use_remove_padding=True",
    ];
    match lower_request(&build_request(&dir, &veomni)) {
        SpecOutcome::Ok { spec, .. } => {
            let EngineSpec::Fsdp(f) = &spec.actor.engine else {
                panic!("VeOmni runs as FSDP: {:?}", spec.actor.engine);
            };
            assert!(f.param_offload && !f.optimizer_offload);
            assert_eq!(f.ulysses, 2);
            assert_eq!(f.fsdp_size, 4, "2 data-parallel ranks x 2 Ulysses ranks");
            assert_eq!((f.main_dtype, f.reduce_dtype), (Dtype::Bf16, Dtype::Bf16));
            assert_eq!(spec.binding.precision, Dtype::Bf16);
            let o = &spec.actor.optim;
            assert_eq!(o.lr, 1e-5);
            match o.schedule {
                ScheduleSpec::Verl {
                    schedule:
                        VerlSchedule::Cosine {
                            min_lr_ratio,
                            num_cycles,
                        },
                    lr_warmup_steps,
                    lr_warmup_steps_ratio,
                    zero_indexed_step,
                } => {
                    assert!((min_lr_ratio - 0.1).abs() < 1e-12, "{min_lr_ratio}");
                    assert_eq!(num_cycles, 0.5);
                    assert_eq!((lr_warmup_steps, lr_warmup_steps_ratio), (-1, 0.1));
                    assert!(zero_indexed_step);
                }
                other => panic!("VeOmni's default schedule is cosine: {other:?}"),
            }
        }
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    }
    // verl 0.7.1 added the engine: the same lowering on its tree, on the engine workers it
    // needs there (V061; fp32 shards: its VeOmni engine did not pass `mixed_precision` on).
    if let Some(v071) = release_tree("0.7.1") {
        let mut on_071 = veomni[..8].to_vec();
        on_071.push("trainer.use_legacy_worker_impl=disable");
        match lower_request(&build_request(&v071, &on_071)) {
            SpecOutcome::Ok { spec, .. } => {
                let EngineSpec::Fsdp(f) = &spec.actor.engine else {
                    panic!("0.7.1: VeOmni runs as FSDP: {:?}", spec.actor.engine);
                };
                assert_eq!((f.ulysses, f.fsdp_size), (2, 4));
                assert_eq!(f.main_dtype, Dtype::Fp32);
                assert!(matches!(
                    spec.actor.optim.schedule,
                    ScheduleSpec::Verl {
                        schedule: VerlSchedule::Cosine { .. },
                        ..
                    }
                ));
            }
            SpecOutcome::Errors(c) => panic!("0.7.1: {:#?}", errors(&c.diagnostics)),
        }
    }
    // What FSDP cannot express: refused at the key, on the user's line.
    for (set, key) in [
        (
            "actor_rollout_ref.actor.veomni.expert_parallel_size=2",
            "actor_rollout_ref.actor.veomni.expert_parallel_size",
        ),
        (
            "actor_rollout_ref.actor.optim.optimizer=muon",
            "actor_rollout_ref.actor.optim.optimizer",
        ),
        (
            "actor_rollout_ref.actor.optim.lr_scheduler_type=linear",
            "actor_rollout_ref.actor.optim.lr_scheduler_type",
        ),
        (
            "actor_rollout_ref.actor.optim.lr_decay_ratio=0.5",
            "actor_rollout_ref.actor.optim.lr_decay_ratio",
        ),
        // verl's VeOmni engine applies no adapters.
        (
            "actor_rollout_ref.model.lora_rank=8",
            "actor_rollout_ref.model.lora_rank",
        ),
    ] {
        match lower_request(&build_request(&dir, &["model_engine=veomni", set])) {
            SpecOutcome::Ok { .. } => panic!("{set}: FSDP cannot run it"),
            SpecOutcome::Errors(c) => {
                let d: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
                assert!(
                    d.iter().any(|d| d.code.0 == "B018"
                        && d.key_path.as_deref() == Some(key)
                        && d.primary.is_some()),
                    "{set}: {:#?}",
                    errors(&c.diagnostics)
                );
                assert_eq!(d.len(), 1, "{set}: {:#?}", errors(&c.diagnostics));
            }
        }
    }
    // Chosen through the engine group, or (as a verl example does) a role's strategy by hand:
    // valid for verl 0.9 (`verlc check` passes it), refused by the build at its line.
    // (`strategy: veomni` by hand on a role without a `veomni` section is no VeOmni config
    // verl can start either: refused by name too.)
    for (choice, engine) in [
        (&["model_engine=torchtitan"][..], "torchtitan"),
        (
            &[
                "actor_rollout_ref.ref.strategy=torchtitan",
                "actor_rollout_ref.actor.use_kl_loss=True",
            ],
            "torchtitan",
        ),
        (
            &[
                "actor_rollout_ref.ref.strategy=veomni",
                "actor_rollout_ref.actor.use_kl_loss=True",
            ],
            "veomni",
        ),
    ] {
        match lower_request(&build_request(&dir, choice)) {
            SpecOutcome::Ok { .. } => panic!("{choice:?}: {engine}'s engine is not verlc's"),
            SpecOutcome::Errors(c) => {
                let d: Vec<_> = c.diagnostics.iter().filter(|d| d.is_error()).collect();
                assert!(
                    d.iter().any(|d| d.code.0 == "B018"
                        && d.message.contains(&format!("`{engine}` engine"))
                        && d.primary.is_some()),
                    "{choice:?}: {:#?}",
                    errors(&c.diagnostics)
                );
                assert!(
                    !d.iter()
                        .any(|d| d.code.0 == "B015" || d.code.0.starts_with('S')),
                    "{choice:?}: {:#?}",
                    errors(&c.diagnostics)
                );
            }
        }
    }
}

/// `verlc migrate --write` on a config file written for verl 0.7.0 (reward keys at the top
/// level, the rollout's weight-sync bucket and skip switch, a dropped trainer key): on 0.9.1's
/// tree the original is refused at the moved keys' lines (V059, and H011 for an override,
/// naming the new key), the rewritten file checks clean, and composes to the same values at
/// their new keys.
#[test]
fn verlc_migrate_rewrites_a_0_7_config_that_then_checks_clean_on_0_9() {
    let Some(tree) = newer_tree() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("grpo.yaml");
    let original = "\
# my run
actor_rollout_ref:
  rollout:
    update_weights_bucket_megabytes: 256   # bucket
    skip_rollout: false
custom_reward_function:
  path: my_reward.py
  name: score
trainer:
  use_legacy_worker_impl: auto
  total_epochs: 2
";
    std::fs::write(&file, original).unwrap();
    let check_file = || {
        let req = LoadRequest {
            config_file: Some(file.clone()),
            config_dir: Some(tree.clone()),
            overrides: BASICS.iter().map(|s| s.to_string()).collect(),
            cwd: dir.path().to_path_buf(),
            ..LoadRequest::default()
        };
        check(&req, &CheckOptions::default())
    };
    let before = check_file();
    let v059: Vec<(String, usize)> = before
        .diagnostics
        .iter()
        .filter(|d| d.code.0 == "V059")
        .map(|d| {
            let line = d.primary.as_ref().map(|l| &l.origin).map_or(0, |o| {
                before
                    .composed
                    .sources
                    .get(o.source)
                    .line_col(o.span.start)
                    .0
            });
            (d.key_path.clone().unwrap_or_default(), line)
        })
        .collect();
    assert_eq!(
        v059,
        vec![
            ("custom_reward_function.path".into(), 7),
            ("custom_reward_function.name".into(), 8),
            (
                "actor_rollout_ref.rollout.update_weights_bucket_megabytes".into(),
                4
            ),
            ("actor_rollout_ref.rollout.skip_rollout".into(), 5),
            ("trainer.use_legacy_worker_impl".into(), 10),
        ]
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_verlc"))
        .arg("migrate")
        .arg(&file)
        .arg("--write")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("dropped grpo.yaml:10")
            || stdout.contains("grpo.yaml:10: trainer.use_legacy_worker_impl"),
        "{stdout}"
    );
    let after = check_file();
    assert!(
        after.diagnostics.iter().all(|d| d.code.0 != "V059"),
        "{:?}",
        after.diagnostics
    );
    assert!(
        errors(&after.diagnostics).is_empty(),
        "{:?}",
        errors(&after.diagnostics)
    );
    let root = &after.composed.root;
    let get = |k: &str| {
        root.get_path(&k.split('.').collect::<Vec<_>>())
            .map(|n| n.to_json())
            .unwrap_or_default()
    };
    assert_eq!(
        get("actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes"),
        serde_json::json!(256)
    );
    assert_eq!(get("skip.rollout.enable"), serde_json::json!(false));
    assert_eq!(
        get("reward.custom_reward_function.path"),
        serde_json::json!("my_reward.py")
    );
    assert_eq!(
        get("reward.custom_reward_function.name"),
        serde_json::json!("score")
    );
    assert_eq!(get("trainer.total_epochs"), serde_json::json!(2));
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(text.starts_with("# my run\n"), "{text}");
    assert!(
        text.contains("update_weights_bucket_megabytes: 256   # bucket"),
        "{text}"
    );
    // An override of a moved key names its new place.
    let req = LoadRequest {
        config_dir: Some(tree.clone()),
        overrides: BASICS
            .iter()
            .map(|s| s.to_string())
            .chain(["actor_rollout_ref.rollout.skip_rollout=true".to_owned()])
            .collect(),
        cwd: dir.path().to_path_buf(),
        ..LoadRequest::default()
    };
    let d = check(&req, &CheckOptions::default()).diagnostics;
    let h011 = d.iter().find(|d| d.code.0 == "H011").expect("H011");
    assert!(
        h011.help
            .as_deref()
            .is_some_and(|h| h.contains("skip.rollout.enable")),
        "{h011:?}"
    );
}

/// verlc's built-in 0.9.1 tree (the default without `--config-dir`, derived from verl's files by
/// scripts/builtin_tree.py) composes every example call of verl 0.9.0 into the tree verl 0.9.1's
/// own files give, with the same findings: the built-in default judges as verl's tree does.
#[test]
fn the_builtin_newest_tree_is_verls_own() {
    let Some(dir) = newer_tree() else {
        return;
    };
    assert_eq!(BuiltinRelease::default().version(), NEWER);
    let compared = judged_alike(
        "verl_examples_0_9_0",
        &dir,
        BuiltinRelease::default(),
        NEWER,
    );
    assert!(compared >= 80, "{compared} calls compared");
}

/// `--verl-version X` (verlc's built-in tree of X) judges each of release X's own example calls
/// as `--config-dir <X's tree>` does: the same composed tree, the same findings, the same
/// release named.
#[test]
fn each_release_judges_its_examples_on_its_built_in_tree_as_on_its_own() {
    for (fixture, release) in [
        ("verl_examples_0_7_1", BuiltinRelease::V0_7_1),
        ("verl_examples_0_8_0", BuiltinRelease::V0_8_0),
        ("verl_examples_0_9_0", BuiltinRelease::V0_9_0),
    ] {
        let version = release.version();
        let Some(dir) = release_tree(version) else {
            continue;
        };
        let compared = judged_alike(fixture, &dir, release, version);
        assert!(compared >= 70, "{version}: {compared} calls compared");
    }
}

/// Checks each call of `fixture` on the tree `dir` (of release `version`) and on verlc's
/// built-in tree of `release`: the same composed tree and findings, each naming its release.
/// Returns how many calls were compared.
fn judged_alike(fixture: &str, dir: &Path, release: BuiltinRelease, version: &str) -> usize {
    let summary = |req: &LoadRequest| {
        let c = check(req, &CheckOptions::default());
        let mut codes: Vec<(String, Option<String>)> = c
            .diagnostics
            .iter()
            .map(|d| (d.code.0.to_owned(), d.key_path.clone()))
            .collect();
        codes.sort();
        (c.composed.root.to_json(), codes, c.release)
    };
    let mut compared = 0;
    for call in example_calls(fixture) {
        let script = &call.script;
        let on_dir = call.request(dir);
        let builtin = LoadRequest {
            config_dir: None,
            builtin: release,
            ..on_dir.clone()
        };
        let (tree_a, codes_a, release_a) = summary(&on_dir);
        let (tree_b, codes_b, release_b) = summary(&builtin);
        assert_eq!(release_a, version, "{script}");
        assert_eq!(
            release_b,
            format!("{version}, verlc's built-in tree"),
            "{script}"
        );
        assert!(
            tree_a == tree_b,
            "{version} {script}: the built-in tree composes differently"
        );
        assert_eq!(codes_a, codes_b, "{version} {script}: different findings");
        compared += 1;
    }
    compared
}

/// A plain config file on the built-in 0.9.1 tree: what the user wrote is judged against
/// verl's defaults, not against itself (a vLLM-only key set in the file is reported).
#[test]
fn a_plain_file_on_the_builtin_newest_tree_is_judged_against_the_base() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("run.yaml");
    let text = std::fs::read_to_string(root().join("examples/quickstart.yaml"))
        .expect("quickstart")
        .replace(
            "  rollout:\n    name: verlc\n",
            "  rollout:\n    name: verlc\n    free_cache_engine: false\n",
        );
    std::fs::write(&file, text).expect("write");
    let req = LoadRequest {
        config_file: Some(file),
        cwd: root(),
        ..LoadRequest::default()
    };
    let c = check(&req, &CheckOptions::default());
    assert_eq!(c.release, format!("{NEWER}, verlc's built-in tree"));
    assert!(
        c.diagnostics.iter().any(|d| d.code.0 == "B001"
            && d.key_path.as_deref() == Some("actor_rollout_ref.rollout.free_cache_engine")),
        "{:#?}",
        errors(&c.diagnostics)
    );
    // The quickstart itself lowers on it as on 0.7.0's tree (0.9's defaults aside).
    use verlc_front::compile::{SpecOutcome, lower_request};
    let plan = |builtin| match lower_request(&LoadRequest {
        config_file: Some(root().join("examples/quickstart.yaml")),
        cwd: root(),
        builtin,
        ..LoadRequest::default()
    }) {
        SpecOutcome::Ok { spec, .. } => *spec,
        SpecOutcome::Errors(c) => panic!("{:#?}", errors(&c.diagnostics)),
    };
    let (new, mut old) = (plan(BuiltinRelease::V0_9_1), plan(BuiltinRelease::V0_7_0));
    // Each follows its release's algorithm functions; the rest is the same plan.
    assert_eq!(old.actor.update.policy_loss.release.to_string(), "0.7.0");
    assert_eq!(new.actor.update.policy_loss.release.to_string(), NEWER);
    old.actor.update.policy_loss.release = new.actor.update.policy_loss.release;
    old.algorithm.advantage.release = new.algorithm.advantage.release;
    assert_eq!(new.actor, old.actor);
    assert_eq!(new.algorithm, old.algorithm);
    assert_eq!(new.data, old.data);
}

/// The baseline a newer release's tree is judged against (verl's tree with the user's group
/// choices, before any value override) is derived from the full composition's interpolations
/// where they read nothing an override changed (`compose::load_with_baseline`): on every example
/// call of verl 0.8.0 and 0.9.0 it equals the tree composed afresh with the group overrides alone.
#[test]
fn the_derived_baseline_equals_a_fresh_composition() {
    use verlc_front::load::compose;
    let mut compared = 0;
    for (fixture, release) in [
        ("verl_examples_0_9_0", NEWER),
        ("verl_examples_0_8_0", "0.8.0"),
    ] {
        let Some(dir) = release_tree(release) else {
            continue;
        };
        for call in example_calls(fixture) {
            let req = call.request(&dir);
            let (composed, derived) = compose::load_with_baseline(&req);
            if composed.has_errors() {
                continue;
            }
            let groups: Vec<String> = call
                .overrides
                .iter()
                .filter(|o| {
                    let key = o.split('=').next().unwrap_or_default();
                    let group = key
                        .trim_start_matches(['+', '~'])
                        .split('@')
                        .next()
                        .unwrap_or("");
                    !group.is_empty() && !group.contains('.') && dir.join(group).is_dir()
                })
                .cloned()
                .collect();
            let fresh = compose::load(&LoadRequest {
                overrides: groups,
                ..req.clone()
            })
            .root;
            assert!(
                derived.to_json() == fresh.to_json(),
                "{}: the derived baseline differs",
                call.script
            );
            compared += 1;
        }
    }
    assert!(compared == 0 || compared > 100, "{compared} calls compared");
}
