//! `verlc smoke CONFIG [OVERRIDES...]`: the user's own run, end to end, on this machine's CPUs
//! before it gets GPUs.
//!
//! Kept as written: the data files, prompt key, chat template and truncation, the tokenizer of
//! `model.path`, the reward function and manager, tools, the algorithm, losses and optimizer.
//! Substituted, and printed: the model by `builtin://scaled?from=<its dir>` (a random
//! initialisation of its own `config.json` scaled down, vocabulary and special tokens kept;
//! only `config.json` and the tokenizer files are read), the GPUs by 2 CPU ranks, the batch by
//! 4 prompts with at most 2 responses each and micro-batches of 1, responses by 16 tokens, the
//! rollout engine by the built-in one, parallel degrees by at most 2. The run trains `--steps`
//! steps, validates and saves a checkpoint at the last, then resumes from it for one more step.
//! A config of verl's SFT trainer is smoke-run the same way (its `model`, `engine` and `data`
//! keys: 4 conversations a step in micro-batches of 1).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use verlc_front::check::{CheckOptions, check};
use verlc_front::load::node::{Node, split_key};
use verlc_front::render;
use verlc_hub::{HubEnv, locate};

use super::args::{Format, SmokeArgs};
use super::build::{Compile, compile};
use super::output::{exit_status, usage_error};
use super::{EXIT_ERRORS, EXIT_USAGE};

/// One setting the smoke run replaces, and why.
#[derive(Debug, Clone, serde::Serialize)]
struct Substitution {
    key: String,
    /// The value as written (`None`: unset).
    was: Option<String>,
    value: String,
    why: &'static str,
    /// A key the composed tree does not have, added (`+key=value`).
    #[serde(skip)]
    added: bool,
}

/// What the substitutions are built from: the composed config.
struct Plan<'a> {
    root: &'a Node,
    subs: Vec<Substitution>,
}

impl Plan<'_> {
    fn get(&self, key: &str) -> Option<&Node> {
        self.root.get_path(&split_key(key))
    }

    fn text(&self, key: &str) -> Option<String> {
        let n = self.get(key)?;
        if n.is_null() {
            return None;
        }
        n.as_str()
            .map(str::to_owned)
            .or_else(|| n.as_i64().map(|i| i.to_string()))
            .or_else(|| n.as_bool().map(|b| b.to_string()))
            .or_else(|| Some(n.to_json().to_string()))
    }

    /// Sets `key` when the config tree has it (a release without the key keeps its own); a
    /// later setting of the same key replaces the earlier one.
    fn set(&mut self, key: &str, value: impl Into<String>, why: &'static str) {
        if self.get(key).is_none() {
            return;
        }
        let value = value.into();
        let was = self.text(key);
        let same = match &was {
            // `["console"]` as composed is `[console]` as an override.
            Some(w) => w.replace('"', "") == value,
            None => value == "null",
        };
        self.subs.retain(|s| s.key != key);
        if same {
            return;
        }
        self.subs.push(Substitution {
            key: key.to_owned(),
            was,
            value,
            why,
            added: false,
        });
    }

    /// [`Plan::set`], adding `key` where the tree does not have it (a key of a free-form map
    /// such as `override_config`).
    fn add(&mut self, key: &str, value: &str, why: &'static str) {
        if self.get(key).is_some() {
            return self.set(key, value, why);
        }
        self.subs.retain(|s| s.key != key);
        self.subs.push(Substitution {
            key: key.to_owned(),
            was: None,
            value: value.to_owned(),
            why,
            added: true,
        });
    }

    /// `key`'s value once substituted: the substitution's, else the config's.
    fn effective(&self, key: &str) -> Option<String> {
        match self.subs.iter().find(|s| s.key == key) {
            Some(s) => Some(s.value.clone()),
            None => self.text(key),
        }
    }

    /// Lowers an integer setting to at most `max` (where it is set above it).
    fn clip(&mut self, key: &str, max: i64, why: &'static str) {
        if let Some(v) = self.get(key).and_then(Node::as_i64)
            && v > max
        {
            self.set(key, max.to_string(), why);
        }
    }
}

/// The local directory holding `path`'s `config.json` (a directory, or a Hub id in the Hub
/// cache, whose configs and tokenizer files are fetched when missing, not its weights);
/// `Ok(None)` for `builtin://` models.
fn model_dir(path: &str) -> Result<Option<PathBuf>, String> {
    let env = HubEnv::from_env();
    if let Some(id) = verlc_hub::hub_id(path)
        && verlc_hub::find_snapshot(&env, &id, None).is_err()
        && !env.offline
    {
        super::fetch::fetch(&env, &id, None, false, super::fetch::Files::NoWeights)
            .map_err(|e| e.to_string())?;
    }
    let loc = locate(path, None, &env).map_err(|e| e.to_string())?;
    let Some(dir) = loc.dir() else {
        return Ok(None);
    };
    if !dir.join("config.json").is_file() {
        return Err(format!(
            "`{path}`: no config.json in {} (smoke reads a model's config.json and tokenizer files, not its weights; `verlc fetch` downloads them)",
            dir.display()
        ));
    }
    Ok(Some(dir.to_path_buf()))
}

const MODEL: &str = "a random initialisation of its own config.json, scaled down (family, vocabulary and special tokens kept)";
const TOKENIZER: &str = "the model's own tokenizer and chat template, kept";
const DROPOUT: &str = "verlc's trainer has no dropout: the stand-in trains without the model's (verl applies it in its updates)";
const VLLM_WHY: &str = "vLLM kept (--rollout vllm) as one engine on this machine's CPU";

/// The overrides that turn the config into a run this machine can do in a minute.
fn substitutions(
    root: &Node,
    steps: u64,
    work: &Path,
    keep_vllm: bool,
) -> Result<Vec<Substitution>, Vec<String>> {
    let mut p = Plan {
        root,
        subs: Vec::new(),
    };
    let mut problems = Vec::new();
    let mut policy_config: Option<serde_json::Value> = None;
    // Models: the policy, its critic, a reward model and distillation teachers, each by a
    // stand-in of its family.
    let mut models: Vec<(String, Option<&str>)> = [
        (
            "actor_rollout_ref.model.path",
            Some("actor_rollout_ref.model.tokenizer_path"),
        ),
        ("critic.model.path", Some("critic.model.tokenizer_path")),
        // verl's SFT trainer, and 0.7.0's legacy one (which reads its tokenizer from the
        // model's path: a scaled stand-in keeps its source's).
        ("model.path", Some("model.tokenizer_path")),
        ("model.partial_pretrain", None),
        ("reward_model.model.path", None),
        ("reward.reward_model.model_path", None),
    ]
    .map(|(k, t)| (k.to_owned(), t))
    .to_vec();
    let distilling = p.get("distillation.enabled").and_then(Node::as_bool) == Some(true);
    if let Some(teachers) = p.get("distillation.teacher_models").and_then(Node::as_map) {
        models.extend(teachers.keys().map(|name| {
            (
                format!("distillation.teacher_models.{name}.model_path"),
                None,
            )
        }));
    }
    for (path_key, tokenizer_key) in models {
        let path_key = path_key.as_str();
        let Some(path) = p.text(path_key) else {
            continue;
        };
        match model_dir(&path) {
            Ok(Some(dir)) => {
                if path_key == "actor_rollout_ref.model.path" {
                    policy_config = std::fs::read_to_string(dir.join("config.json"))
                        .ok()
                        .and_then(|t| serde_json::from_str(&t).ok());
                }
                let shown = dir.display().to_string();
                if let Some(base) = trained_override_config(path_key) {
                    for (key, _) in verlc_front::plan::models::checkpoint_dropouts(&dir) {
                        p.add(&format!("{base}.{key}"), "0.0", DROPOUT);
                    }
                }
                p.set(path_key, format!("builtin://scaled?from={shown}"), MODEL);
                if let Some(t) = tokenizer_key
                    && p.text(t).is_none()
                {
                    p.set(t, shown, TOKENIZER);
                }
            }
            Ok(None) => {}
            // A critic or reward model that is off may name anything.
            Err(e)
                if matches!(
                    path_key,
                    "actor_rollout_ref.model.path" | "model.path" | "model.partial_pretrain"
                ) || (distilling && path_key.starts_with("distillation.teacher_models.")) =>
            {
                problems.push(e)
            }
            Err(_) => {}
        }
    }
    // A LoRA adapter to start from: read and checked against the model, then a fresh one of
    // its rank, alpha and targets (its weights fit the full model, not the stand-in).
    const ADAPTER: &str = "the adapter fits the full model (its tensors checked against config.json): the stand-in trains a fresh one of its rank, alpha and targets";
    let adapter_key = "actor_rollout_ref.model.lora_adapter_path";
    if let Some(adapter) = p.text(adapter_key) {
        match super::smoke_adapter::read_adapter(Path::new(&adapter), policy_config.as_ref()) {
            Ok(a) => {
                p.set(adapter_key, "null", ADAPTER);
                p.set(
                    "actor_rollout_ref.model.lora_rank",
                    a.rank.to_string(),
                    ADAPTER,
                );
                p.set(
                    "actor_rollout_ref.model.lora_alpha",
                    a.alpha.to_string(),
                    ADAPTER,
                );
                let targets = match &a.targets {
                    serde_json::Value::Array(names) => Some(format!(
                        "[{}]",
                        names
                            .iter()
                            .filter_map(serde_json::Value::as_str)
                            .collect::<Vec<_>>()
                            .join(",")
                    )),
                    serde_json::Value::String(s) => Some(s.clone()),
                    _ => None,
                };
                if let Some(t) = targets {
                    p.set("actor_rollout_ref.model.target_modules", t, ADAPTER);
                }
            }
            Err(e) => problems.push(format!("`{adapter_key}`: {e}")),
        }
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    // The machine: 2 CPU ranks.
    const RANKS: &str = "2 CPU ranks stand in for the GPUs";
    p.set("trainer.device", "cpu", RANKS);
    p.set("trainer.nnodes", "1", RANKS);
    p.set("trainer.n_gpus_per_node", "2", RANKS);
    if p.text("trainer.v1.trainer_mode").as_deref() == Some("separate_async") {
        // separate_async's pool: a rollout replica process beside each rank.
        const POOL: &str = "a rollout replica process beside each of the 2 ranks";
        p.set("actor_rollout_ref.rollout.nnodes", "1", POOL);
        p.set("actor_rollout_ref.rollout.n_gpus_per_node", "2", POOL);
    }
    // The schedule: a few steps, a validation and a checkpoint at the last.
    const SCHEDULE: &str = "a few steps, validated and saved at the last";
    p.set("trainer.total_training_steps", steps.to_string(), SCHEDULE);
    p.set("trainer.total_epochs", "1", SCHEDULE);
    if p.text("data.val_files").is_some() {
        p.set("trainer.test_freq", steps.to_string(), SCHEDULE);
    } else {
        p.set(
            "trainer.test_freq",
            "-1",
            "no validation files to validate on",
        );
    }
    p.set("trainer.save_freq", steps.to_string(), SCHEDULE);
    p.set("trainer.val_before_train", "false", SCHEDULE);
    p.set("trainer.resume_mode", "disable", SCHEDULE);
    p.set(
        "trainer.logger",
        "[console]",
        "console only (no tracker account needed)",
    );
    let ckpt = work.join("ckpt").display().to_string();
    p.set(
        "trainer.default_local_dir",
        ckpt,
        "checkpoints in the smoke run's own directory",
    );
    for k in ["trainer.rollout_data_dir", "trainer.validation_data_dir"] {
        if p.text(k).is_some() {
            p.set(k, "null", "no dumps from a stand-in model");
        }
    }
    // The batch: 4 prompts, at most 2 responses each, micro-batches of 1 response.
    const BATCH: &str = "a batch small enough for CPU ranks, every divisibility rule kept";
    p.set("data.train_batch_size", "4", BATCH);
    // verl's asynchronous modes fetch prompts one at a time whatever gen_batch_size says.
    let mode = p.text("trainer.v1.trainer_mode");
    if !matches!(mode.as_deref(), Some("colocate_async" | "separate_async")) {
        p.set("data.gen_batch_size", "4", BATCH);
    }
    p.set("data.val_batch_size", "null", BATCH);
    p.set("data.val_max_samples", "4", BATCH);
    p.clip("actor_rollout_ref.rollout.n", 2, BATCH);
    for role in ["actor_rollout_ref.actor", "critic"] {
        p.set(&format!("{role}.ppo_mini_batch_size"), "2", BATCH);
        p.set(&format!("{role}.ppo_micro_batch_size_per_gpu"), "1", BATCH);
        p.set(&format!("{role}.ppo_micro_batch_size"), "null", BATCH);
    }
    // verl's separate_async trains a step as parameter_sync_step mini-batches of the batch.
    if mode.as_deref() == Some("separate_async") {
        p.set("trainer.v1.separate_async.parameter_sync_step", "2", BATCH);
    }
    p.set("critic.forward_micro_batch_size_per_gpu", "1", BATCH);
    p.set("critic.forward_micro_batch_size", "null", BATCH);
    for role in ["actor_rollout_ref.rollout", "actor_rollout_ref.ref"] {
        p.set(
            &format!("{role}.log_prob_micro_batch_size_per_gpu"),
            "1",
            BATCH,
        );
        p.set(&format!("{role}.log_prob_micro_batch_size"), "null", BATCH);
    }
    p.set("reward_model.micro_batch_size_per_gpu", "1", BATCH);
    p.set("reward_model.micro_batch_size", "null", BATCH);
    // verl's SFT trainer: 4 conversations a step in micro-batches of 1 (its token budget, its
    // length limit and its truncation kept).
    p.set("data.micro_batch_size_per_gpu", "1", BATCH);
    // Responses: 16 tokens (prompts keep their length, filter and truncation).
    const LENGTH: &str = "short responses (prompts keep their length, filter and truncation)";
    p.clip("data.max_response_length", 16, LENGTH);
    p.clip("actor_rollout_ref.rollout.response_length", 16, LENGTH);
    p.clip(
        "actor_rollout_ref.rollout.val_kwargs.response_length",
        16,
        LENGTH,
    );
    // Generation: the built-in engine, one replica per rank; or, with `--rollout vllm`, the
    // config's vLLM as one CPU engine.
    let vllm = keep_vllm && p.text("actor_rollout_ref.rollout.name").as_deref() == Some("vllm");
    const ENGINE: &str = "the built-in rollout engine (vLLM/SGLang need GPUs)";
    let engine = if vllm { VLLM_WHY } else { ENGINE };
    if !vllm {
        p.set("actor_rollout_ref.rollout.name", "verlc", ENGINE);
    }
    for k in [
        "tensor_model_parallel_size",
        "data_parallel_size",
        "pipeline_model_parallel_size",
        "expert_parallel_size",
    ] {
        p.clip(&format!("actor_rollout_ref.rollout.{k}"), 1, engine);
    }
    p.set("actor_rollout_ref.rollout.max_model_len", "null", engine);
    // Parallel degrees: the first the config uses stays at 2, the others go to 1 (the SFT
    // trainer's engine section is `engine`).
    const PARALLEL: &str = "2 ranks: the first parallel degree the config uses kept at 2";
    let mut kept = false;
    for k in [
        "tensor_model_parallel_size",
        "pipeline_model_parallel_size",
        "context_parallel_size",
        "expert_model_parallel_size",
        "ulysses_sequence_parallel_size",
    ] {
        let key = format!("engine.{k}");
        // The legacy SFT config keeps its Ulysses degree at the top.
        let key = if p.get(&key).is_none() && p.get(k).is_some() {
            k.to_owned()
        } else {
            key
        };
        match p.get(&key).and_then(Node::as_i64) {
            Some(v) if v > 1 && !kept => {
                p.clip(&key, 2, PARALLEL);
                kept = true;
            }
            Some(v) if v > 1 => p.set(&key, "1", PARALLEL),
            _ => {}
        }
    }
    p.set(
        "engine.virtual_pipeline_model_parallel_size",
        "null",
        PARALLEL,
    );
    for role in ["actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"] {
        let mut kept = false;
        for k in [
            "megatron.tensor_model_parallel_size",
            "megatron.pipeline_model_parallel_size",
            "megatron.context_parallel_size",
            "megatron.expert_model_parallel_size",
            "ulysses_sequence_parallel_size",
            "fsdp_config.ulysses_sequence_parallel_size",
        ] {
            let key = format!("{role}.{k}");
            match p.get(&key).and_then(Node::as_i64) {
                Some(v) if v > 1 && !kept => {
                    p.clip(&key, 2, PARALLEL);
                    kept = true;
                }
                Some(v) if v > 1 => p.set(&key, "1", PARALLEL),
                _ => {}
            }
        }
        p.set(
            &format!("{role}.megatron.virtual_pipeline_model_parallel_size"),
            "null",
            PARALLEL,
        );
        p.set(
            &format!("{role}.megatron.expert_tensor_parallel_size"),
            "null",
            PARALLEL,
        );
    }
    // The critic on the actor's model-parallel layout: the 2 ranks split one batch over both
    // (an example's critic may use other degrees on its GPUs).
    const CRITIC_LAYOUT: &str =
        "2 ranks: the critic on the actor's model-parallel layout (one batch split over both)";
    for k in [
        "megatron.tensor_model_parallel_size",
        "megatron.pipeline_model_parallel_size",
        "megatron.context_parallel_size",
        "ulysses_sequence_parallel_size",
    ] {
        let actor = p.effective(&format!("actor_rollout_ref.actor.{k}"));
        let key = format!("critic.{k}");
        if let Some(actor) = actor
            && p.get(&key).is_some()
            && p.effective(&key).as_deref() != Some(actor.as_str())
        {
            p.set(&key, actor, CRITIC_LAYOUT);
        }
    }
    // verlc's tool agent loop on Megatron: each rollout replica is one model-parallel group
    // (its ranks decode in lockstep), so the rollout takes the actor's tensor parallel size.
    let megatron = p.text("actor_rollout_ref.actor.strategy").as_deref() == Some("megatron");
    let multi_turn = p
        .get("actor_rollout_ref.rollout.multi_turn.enable")
        .and_then(Node::as_bool)
        == Some(true);
    if megatron && multi_turn && !vllm {
        let key = "actor_rollout_ref.rollout.tensor_model_parallel_size";
        if let Some(tp) = p.effective("actor_rollout_ref.actor.megatron.tensor_model_parallel_size")
            && tp != "1"
        {
            p.set(
                key,
                tp,
                "the built-in rollout's replica is the actor's Megatron model-parallel group (the tool agent loop decodes in lockstep)",
            );
        }
    }
    // A code sandbox service is not reachable from here: verl itself scores code locally
    // (its prime_code checker) without one.
    for key in [
        "reward_model.sandbox_fusion.url",
        "reward.sandbox_fusion.url",
    ] {
        if p.text(key).is_some() {
            p.set(
                key,
                "null",
                "the sandbox service is not reached from here: verl's local code checker scores code rows instead, as verl does without a sandbox",
            );
        }
    }
    // Where GPU weights come from and how GPUs hold them: the weights are a random stand-in
    // and the ranks are CPU processes, so neither is exercised here.
    const NOT_HERE: [(&str, &str); 2] = [
        (
            "use_dist_checkpointing",
            "the weights are a random stand-in: a Megatron distributed checkpoint is not read here",
        ),
        (
            "use_megatron_fsdp",
            "how GPUs hold the parameters: the CPU ranks shard the optimizer state only (the same update)",
        ),
    ];
    for role in ["actor_rollout_ref.actor", "actor_rollout_ref.ref", "critic"] {
        // A context-parallel size repeated for Megatron-core follows the role's.
        let repeated = format!("{role}.megatron.override_transformer_config.context_parallel_size");
        if p.get(&repeated).is_some()
            && let Some(cp) = p.effective(&format!("{role}.megatron.context_parallel_size"))
        {
            p.set(&repeated, cp, PARALLEL);
        }
        for (setting, why) in NOT_HERE {
            let key = format!("{role}.megatron.{setting}");
            if p.get(&key).and_then(Node::as_bool) == Some(true) {
                p.set(&key, "false", why);
            }
        }
    }
    Ok(p.subs)
}

/// The `override_config` of a trained model's path key (the policy, the critic, an SFT model).
fn trained_override_config(path_key: &str) -> Option<&'static str> {
    match path_key {
        "actor_rollout_ref.model.path" => Some("actor_rollout_ref.model.override_config"),
        "critic.model.path" => Some("critic.model.override_config"),
        "model.path" | "model.partial_pretrain" => Some("model.override_config"),
        _ => None,
    }
}

/// The override that makes `s` (a key the tree has, or one it adds): a value that is more than a word, a
/// number or a list is quoted, as Hydra's grammar needs for `=`, `?` and `&` in a path.
fn override_of(s: &Substitution) -> String {
    let v = &s.value;
    let plain = v.starts_with('[')
        || v.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    let plus = if s.added { "+" } else { "" };
    if plain {
        format!("{plus}{}={v}", s.key)
    } else {
        let escaped = v.replace('\\', "\\\\").replace('\'', "\\'");
        format!("{plus}{}='{escaped}'", s.key)
    }
}

/// Whether `key` belongs to a role the planned run has: `critic.*`, `reward_model.*` and
/// `actor_rollout_ref.ref.*` only when it trains a critic, scores with a reward model or keeps a
/// reference policy.
fn role_in_use(plan: &verlc_front::plan::Planned, key: &str) -> bool {
    let verlc_front::plan::Planned::Rl(plan) = plan else {
        return true;
    };
    let s = &plan.spec;
    let under = |prefix: &str| key.starts_with(prefix);
    if under("critic.") {
        return s.critic.is_some();
    }
    if under("reward_model.") {
        return s.reward_model.is_some();
    }
    if under("actor_rollout_ref.ref.") {
        return s.reference.is_some();
    }
    true
}

/// The code paths the smoke run takes, from the spec it built: what a passing smoke run has
/// exercised of the config.
fn exercised(plan: &verlc_front::plan::BuildPlan) -> Vec<String> {
    let s = &plan.spec;
    let u = &s.actor.update;
    let mut out = vec![
        format!("engine: {}", plan.binding),
        format!(
            "advantage estimator {:?}, policy loss {:?} aggregated {:?}",
            s.algorithm.estimator, u.loss_mode, u.loss_agg_mode
        ),
    ];
    if u.use_kl_loss {
        out.push(format!(
            "KL loss {} x {} against the reference policy",
            u.kl_loss_type, u.kl_loss_coef
        ));
    }
    if s.algorithm.kl_in_reward {
        out.push(format!("KL in the reward ({})", s.algorithm.kl_penalty));
    }
    if u.entropy_coeff != 0.0 {
        out.push(format!("entropy bonus x {}", u.entropy_coeff));
    }
    if let Some(line) = vision_exercised(s) {
        out.push(line);
    }
    if s.critic.is_some() {
        out.push("critic (value model and its update)".into());
    }
    if s.actor.lora.is_some() {
        out.push("LoRA adapters".into());
    }
    if u.ppo_max_token_len.is_some() {
        out.push("dynamic batch size (token budgets)".into());
    }
    if s.actor.engine.remove_padding() {
        out.push("packed sequences (remove padding)".into());
    }
    if s.actor.engine.ulysses() > 1 {
        out.push(format!(
            "Ulysses sequence parallel {}",
            s.actor.engine.ulysses()
        ));
    }
    if s.rollout.vllm.is_some() {
        out.push("rollout: a vLLM server on this machine's CPU (--rollout vllm)".into());
    }
    if let Some(c) = &s.data.custom_dataset {
        out.push(format!(
            "your dataset class `{}` ({}), built as verl builds it",
            c.name, c.path
        ));
    }
    if let Some(c) = &s.data.sampler {
        out.push(format!(
            "your sampler class `{}` ({}), its update given each trained batch if it is a curriculum sampler",
            c.name, c.path
        ));
    }
    if let verlc_spec::trainer::RewardManagerSpec::Python(m) = &s.reward_manager {
        out.push(match &m.class {
            Some(c) => format!("your reward manager class `{}` ({})", c.name, c.path),
            None => format!("verl's `{}` reward manager, run in Python", m.registered),
        });
    }
    if s.algorithm.filter_groups.is_some() {
        out.push("dynamic sampling (filter groups and regenerate)".into());
    }
    if s.algorithm.rollout_correction.is_some() {
        out.push("rollout correction".into());
    }
    if u.distillation.is_some() {
        out.push("distillation from teachers".into());
    }
    if let Some(mt) = &s.rollout.multi_turn {
        out.push(match &mt.agent_loop_config_path {
            Some(p) => format!(
                "your agent loops ({p}), run in Python with the built-in rollout serving their generation"
            ),
            None => "multi-turn rollout with tools (the tool agent loop)".into(),
        });
    }
    if let Some(a) = &s.run.asynchronous {
        let bound = match a.max_off_policy_threshold {
            Some(k) => format!("at most {k} versions old, {:?}", a.strategy).to_lowercase(),
            None => "no version bound".into(),
        };
        let mode = match a.mode {
            verlc_spec::trainer::AsyncMode::ColocateAsync => "colocate_async".to_owned(),
            verlc_spec::trainer::AsyncMode::SeparateAsync => format!(
                "separate_async ({} updates per weight sync)",
                a.parameter_sync_step
            ),
        };
        out.push(format!(
            "{mode}: a rollout thread per rank, the replay buffer ({bound}), {} warm-up prompts",
            a.warmup_prompts
        ));
    }
    out.push(match &s.reward {
        verlc_spec::trainer::RewardSpec::Builtin => {
            "reward: verl's default scorer by data_source".to_owned()
        }
        verlc_spec::trainer::RewardSpec::Python { path, name, .. } => {
            format!("reward: `{name}` of {path} (your Python, in its host)")
        }
    });
    if s.reward_model.is_some() {
        out.push("reward model (a stand-in of its family)".into());
    }
    out.push("validation, checkpoint save and resume".into());
    out
}

/// What a vision-language policy does in the run: its rows' images through its tower, or, where
/// a Qwen3.5 checkpoint trains on text prompts only (B022), that.
fn vision_exercised(s: &verlc_spec::TrainerSpec) -> Option<String> {
    use verlc_front::plan::models::{model_type_of, text_prompts_only};
    let key = "actor_rollout_ref.model.path";
    let model_type = model_type_of(&s.actor.model_path, &verlc_hub::HubEnv::from_env())?;
    let row = verlc_spec::families::of_checkpoint(&model_type).filter(|r| r.vision.is_some())?;
    Some(if text_prompts_only(s, key, &model_type).is_some() {
        format!(
            "{} (image-text): text prompts only in this run (B022), rows with images refused",
            row.name
        )
    } else {
        format!(
            "{} (vision-language): the rows' images (`{}`) prepared by its processor and run through its vision tower",
            row.name, s.data.image_key
        )
    })
}

/// One run of the trainer binary, with its outcome.
/// [`exercised`] of an SFT run.
fn exercised_sft(plan: &verlc_front::plan::SftPlan) -> Vec<String> {
    let s = &plan.spec;
    let mut out = vec![
        format!("engine: {}", plan.binding),
        format!(
            "supervised fine-tuning on `{}` conversations: chat template per message, loss on the assistant's tokens",
            s.data.messages_key
        ),
        match s.batching.token_budget {
            Some(t) => format!("dynamic micro-batches under {t} tokens"),
            None => format!("micro-batches of {} conversations", s.batching.micro_batch),
        },
    ];
    if s.model.lora.is_some() {
        out.push("LoRA adapters".into());
    }
    if !s.data.val_files.is_empty() {
        out.push("validation loss".into());
    }
    out.push("checkpoint with a Hugging Face model, and resume".into());
    out
}

#[derive(Debug, serde::Serialize)]
struct Phase {
    name: &'static str,
    ok: bool,
    seconds: f64,
    status: Option<i32>,
}

fn run_phase(binary: &Path, name: &'static str, args: &[String]) -> Phase {
    eprintln!("smoke: {name}");
    let start = Instant::now();
    // The trainer's console lines go to stderr: stdout holds the report alone.
    let mut cmd = Command::new(binary);
    cmd.args(args).stdout(std::io::stderr());
    if let Some(vllm) = super::run::checkout_vllm() {
        cmd.env("VERLC_VLLM_PYTHON", vllm);
    }
    let status = cmd.status();
    let seconds = start.elapsed().as_secs_f64();
    match status {
        Ok(s) => Phase {
            name,
            ok: s.success(),
            seconds,
            status: s.code(),
        },
        Err(e) => {
            eprintln!("error: cannot run the trainer {}: {e}", binary.display());
            Phase {
                name,
                ok: false,
                seconds,
                status: None,
            }
        }
    }
}

pub fn run(a: SmokeArgs) -> u8 {
    let json = a.format == Format::Json;
    let req = match a.compile.config.request() {
        Ok(r) => r,
        Err(msg) => return usage_error(json, &msg),
    };
    // The run as written first: what `check` finds is found without building anything.
    let opts = CheckOptions {
        model_config: a.compile.model_config.clone(),
        only: Vec::new(),
    };
    let checked = check(&req, &opts);
    let typed = checked.config.is_some() || checked.sft.is_some();
    if checked.has_errors() || !typed {
        let color = super::output::stderr_color();
        if json {
            println!("{}", render::json_checked(&checked));
        } else {
            eprint!("{}", render::human_checked(&checked, color));
            eprintln!("error: smoke needs a config `verlc check` passes; fix the errors above");
        }
        return exit_status(&checked.diagnostics).max(EXIT_ERRORS);
    }
    let (work, temporary) = match &a.work_dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("verlc-smoke-{}", std::process::id())),
            true,
        ),
    };
    if let Err(e) = std::fs::create_dir_all(&work) {
        eprintln!("error: cannot create {}: {e}", work.display());
        return EXIT_USAGE;
    }
    let code = smoke(&a, &checked.composed.root, &work, json);
    if temporary {
        let _ = std::fs::remove_dir_all(&work);
    }
    code
}

/// The substitutions of the roles the run has: a GRPO config's tree still holds a critic
/// section, whose batch sizes were set too, but no critic trains.
fn in_use(plan: &verlc_front::plan::Planned, subs: Vec<Substitution>) -> Vec<Substitution> {
    subs.into_iter()
        .filter(|s| role_in_use(plan, &s.key))
        .collect()
}

/// The code paths a run of `plan` exercises.
fn exercised_by(plan: &verlc_front::plan::Planned) -> Vec<String> {
    match plan {
        verlc_front::plan::Planned::Rl(plan) => exercised(plan),
        verlc_front::plan::Planned::Sft(plan) => exercised_sft(plan),
    }
}

fn print_substitutions(heading: &str, subs: &[Substitution]) {
    eprintln!("{heading}");
    for s in subs {
        eprintln!(
            "  {} = {}  (was {}; {})",
            s.key,
            s.value,
            s.was.as_deref().unwrap_or("unset"),
            s.why
        );
    }
}

/// `--plan`: what the smoke run would substitute and exercise, with nothing built or run.
fn report_plan(plan: &verlc_front::plan::Planned, subs: Vec<Substitution>, json: bool) -> u8 {
    let subs = in_use(plan, subs);
    let paths = exercised_by(plan);
    if json {
        let j = serde_json::json!({
            "ok": true,
            "planned": true,
            "exercised": paths,
            "substituted": subs,
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        print_substitutions("smoke: would substitute for this machine", &subs);
        eprintln!("  would exercise:");
        for p in &paths {
            eprintln!("    {p}");
        }
    }
    0
}

fn smoke(a: &SmokeArgs, root: &Node, work: &Path, json: bool) -> u8 {
    let keep_vllm = a.rollout == super::args::SmokeRollout::Vllm;
    let vllm_python = super::run::checkout_vllm();
    if keep_vllm
        && vllm_python.is_none()
        && std::env::var_os("VERLC_VLLM_PYTHON").is_none_or(|v| v.is_empty())
    {
        return usage_error(
            json,
            "--rollout vllm: no Python with vLLM here (run `scripts/setup --vllm`, or set $VERLC_VLLM_PYTHON)",
        );
    }
    let subs = match substitutions(root, a.steps, work, keep_vllm) {
        Ok(s) => s,
        Err(problems) => {
            for p in &problems {
                eprintln!("error: {p}");
            }
            if json {
                let j = serde_json::json!({"ok": false, "problems": problems});
                println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
            }
            return EXIT_ERRORS;
        }
    };
    let mut compile_args = a.compile.clone();
    compile_args
        .config
        .args
        .extend(subs.iter().map(override_of));
    let print = |subs: &[Substitution]| {
        if !json {
            print_substitutions("smoke: substituted for this machine", subs);
        }
    };
    let compiled = match compile(&compile_args) {
        Ok(Compile::Built(c)) => c,
        Ok(Compile::Planned(plan)) => return report_plan(&plan, subs, json),
        Err(code) => {
            // All of them: they may explain what the config's checks said.
            print(&subs);
            return code;
        }
    };
    let subs = in_use(&compiled.plan, subs);
    print(&subs);
    let paths = exercised_by(&compiled.plan);
    let steps = a.steps;
    let mut phases = vec![run_phase(&compiled.binary, "train, validate and save", &[])];
    if phases[0].ok {
        // Resume from the saved step and train one more.
        phases.push(run_phase(
            &compiled.binary,
            "resume from the checkpoint and train a step",
            &[
                format!("trainer.total_training_steps={}", steps + 1),
                "trainer.resume_mode=auto".to_owned(),
                format!("trainer.save_freq={}", steps + 1),
                format!("trainer.test_freq={}", steps + 1),
            ],
        ));
    }
    let ok = phases.iter().all(|p| p.ok);
    if json {
        let j = serde_json::json!({
            "ok": ok,
            "exercised": paths,
            "substituted": subs,
            "phases": phases,
        });
        println!("{}", serde_json::to_string_pretty(&j).unwrap_or_default());
    } else {
        eprintln!("smoke: report");
        eprintln!("  exercised:");
        for p in &paths {
            eprintln!("    {p}");
        }
        for p in &phases {
            eprintln!(
                "  {}: {} ({:.1} s)",
                p.name,
                if p.ok { "ok" } else { "FAILED" },
                p.seconds
            );
        }
        eprintln!(
            "smoke: {}",
            if ok {
                "the run trained, validated, saved and resumed on CPU with the substitutions above"
            } else {
                "problems found: see the trainer's messages above"
            }
        );
    }
    if ok { 0 } else { EXIT_ERRORS }
}

#[cfg(test)]
mod tests {
    use super::*;
    use verlc_front::load::compose::LoadRequest;

    /// The quickstart's composed tree with `overrides`.
    fn quickstart(overrides: &[&str]) -> Node {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let req = LoadRequest {
            config_file: Some(root.join("examples/quickstart.yaml")),
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
            cwd: root,
            ..LoadRequest::default()
        };
        check(&req, &CheckOptions::default()).composed.root
    }

    /// verl's Megatron PPO tree of `release` with `overrides`.
    fn megatron_tree(
        release: verlc_front::load::version::BuiltinRelease,
        overrides: &[&str],
    ) -> Node {
        let req = LoadRequest {
            config_name: Some("ppo_megatron_trainer".into()),
            overrides: [
                "actor_rollout_ref.model.path=builtin://tiny",
                "critic.model.path=builtin://tiny",
            ]
            .iter()
            .chain(overrides)
            .map(|s| s.to_string())
            .collect(),
            builtin: release,
            ..LoadRequest::default()
        };
        check(&req, &CheckOptions::default()).composed.root
    }

    /// A policy whose config trains with dropout (Seed-OSS's class defaults it to 0.1) gets
    /// both dropouts added at zero to its `override_config`, as `+` overrides; a Gemma gets none.
    #[test]
    fn a_model_with_dropout_trains_its_stand_in_without_it() {
        let dir = std::env::temp_dir().join(format!("verlc-smoke-dropout-{}", std::process::id()));
        let model = |name: &str, model_type: &str| {
            let d = dir.join(name);
            std::fs::create_dir_all(&d).expect("temp dir");
            std::fs::write(
                d.join("config.json"),
                format!(
                    r#"{{"model_type": "{model_type}", "hidden_size": 64, "num_hidden_layers": 2,
                        "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 300,
                        "attention_dropout": 0.0}}"#
                ),
            )
            .expect("config");
            d
        };
        let seed = format!(
            "actor_rollout_ref.model.path={}",
            model("seed", "seed_oss").display()
        );
        let subs = substitutions(&quickstart(&[&seed]), 2, &dir, false).expect("substitutions");
        let added: Vec<String> = subs
            .iter()
            .filter(|s| s.why == DROPOUT)
            .map(override_of)
            .collect();
        // `attention_dropout` is 0 in the file; `residual_dropout` is the class's 0.1.
        assert_eq!(
            added,
            ["+actor_rollout_ref.model.override_config.residual_dropout=0.0"]
        );
        let gemma = format!(
            "actor_rollout_ref.model.path={}",
            model("gemma", "gemma").display()
        );
        let subs = substitutions(&quickstart(&[&gemma]), 2, &dir, false).expect("substitutions");
        assert!(subs.iter().all(|s| s.why != DROPOUT));
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// verl's Megatron PPO examples with a critic on other degrees than the actor and weights
    /// from a Megatron distributed checkpoint: the critic takes the actor's (clipped) layout,
    /// and the checkpoint format is not read (the weights are a stand-in).
    #[test]
    fn the_critic_takes_the_actors_layout_and_dist_checkpoints_are_not_read() {
        let root = megatron_tree(
            verlc_front::load::version::BuiltinRelease::V0_9_1,
            &[
                "actor_rollout_ref.rollout.name=vllm",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                "critic.megatron.tensor_model_parallel_size=1",
                "actor_rollout_ref.actor.megatron.use_dist_checkpointing=true",
                "actor_rollout_ref.ref.megatron.use_megatron_fsdp=true",
            ],
        );
        let subs = substitutions(&root, 2, &std::env::temp_dir(), false).expect("substitutions");
        let of = |key: &str| subs.iter().find(|s| s.key == key).map(|s| s.value.clone());
        assert_eq!(
            of("actor_rollout_ref.actor.megatron.tensor_model_parallel_size").as_deref(),
            Some("2")
        );
        assert_eq!(
            of("critic.megatron.tensor_model_parallel_size").as_deref(),
            Some("2")
        );
        assert_eq!(
            of("actor_rollout_ref.actor.megatron.use_dist_checkpointing").as_deref(),
            Some("false")
        );
        assert_eq!(
            of("actor_rollout_ref.ref.megatron.use_megatron_fsdp").as_deref(),
            Some("false")
        );
        // Untouched where the config does not set them.
        assert_eq!(of("critic.megatron.use_dist_checkpointing"), None);
    }

    /// verl 0.7.0's Megatron multi-turn example: the tool agent loop's rollout replica is the
    /// actor's model-parallel group, so the rollout takes the actor's (clipped) tensor parallel
    /// size, set once; a sandbox URL is not reached.
    #[test]
    fn megatron_tool_rollouts_take_the_actors_tensor_parallel_size() {
        let root = megatron_tree(
            verlc_front::load::version::BuiltinRelease::V0_7_0,
            &[
                "actor_rollout_ref.rollout.name=sglang",
                "actor_rollout_ref.rollout.multi_turn.enable=true",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=4",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=4",
                "reward_model.sandbox_fusion.url=http://sandbox:8080/run_code",
            ],
        );
        let subs = substitutions(&root, 2, &std::env::temp_dir(), false).expect("substitutions");
        let all = |key: &str| {
            subs.iter()
                .filter(|s| s.key == key)
                .map(|s| s.value.clone())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            all("actor_rollout_ref.rollout.tensor_model_parallel_size"),
            vec!["2".to_owned()]
        );
        assert_eq!(
            all("reward_model.sandbox_fusion.url"),
            vec!["null".to_owned()]
        );
    }

    #[test]
    fn vllm_is_kept_only_when_asked_and_runs_as_one_engine() {
        let root = quickstart(&[
            "actor_rollout_ref.rollout.name=vllm",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
        ]);
        let work = std::env::temp_dir();
        let of = |subs: &[Substitution], key: &str| {
            subs.iter()
                .find(|s| s.key == key)
                .map(|s| (s.value.clone(), s.why))
        };
        let tp = "actor_rollout_ref.rollout.tensor_model_parallel_size";
        let kept = substitutions(&root, 2, &work, true).expect("substitutions");
        assert_eq!(of(&kept, "actor_rollout_ref.rollout.name"), None);
        assert_eq!(of(&kept, tp), Some(("1".to_owned(), VLLM_WHY)));
        let replaced = substitutions(&root, 2, &work, false).expect("substitutions");
        assert_eq!(
            of(&replaced, "actor_rollout_ref.rollout.name").map(|v| v.0),
            Some("verlc".to_owned())
        );
        // A config whose rollout is the built-in one keeps it either way.
        let builtin = substitutions(&quickstart(&[]), 2, &work, true).expect("substitutions");
        assert_eq!(of(&builtin, "actor_rollout_ref.rollout.name"), None);
    }
}
