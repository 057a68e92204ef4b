//! The models and tokenizer a trainer spec reads that are named by Hugging Face Hub id, with
//! the config key that names each: `verlc build` makes sure they are in the Hub cache, where
//! the trainer (which never downloads) reads them. Once there, the reward model's config is
//! read to make sure the trainer can score with it ([`reward_model_checkpoint`]).

use std::path::Path;

use serde_json::Value;
use verlc_hub::{HubEnv, ModelLocation, RepoId, hub_id, locate};
use verlc_spec::TrainerSpec;

use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};

/// Whether a checkpoint of `model_type` has mixture-of-experts layers: on the Megatron strategy
/// their experts are placed as [`expert_layout_problem`] says.
fn has_experts(model_type: &str) -> bool {
    verlc_spec::families::of_checkpoint(model_type).is_some_and(|r| r.experts)
}

/// Whether a checkpoint of `model_type` has linear-attention (Gated DeltaNet) layers among
/// gated attention (Qwen3.5's and Qwen3-Next): their recurrent state runs along the whole
/// sequence; under Ulysses they run whole sequences on a share of the heads, under context
/// parallelism each DeltaNet layer gathers whole sequences.
pub(crate) fn has_linear_attention(model_type: &str) -> bool {
    verlc_spec::families::of_checkpoint(model_type).is_some_and(|r| r.linear_attention)
}

/// A Hub model the trainer reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubModel {
    /// The key whose value names it (the first of the roles that read it).
    pub key: &'static str,
    pub id: RepoId,
}

/// Every model and tokenizer path `spec` reads, with the key naming it: actor, tokenizer,
/// reference, critic, reward model, distillation teachers.
fn model_paths(spec: &TrainerSpec) -> Vec<(&'static str, &str)> {
    let mut paths = vec![
        (
            "actor_rollout_ref.model.path",
            spec.actor.model_path.as_str(),
        ),
        (
            "actor_rollout_ref.model.tokenizer_path",
            spec.tokenizer_path.as_str(),
        ),
    ];
    if let Some(r) = &spec.reference {
        paths.push(("actor_rollout_ref.ref.model.path", r.model_path.as_str()));
    }
    if let Some(c) = &spec.critic {
        paths.push(("critic.model.path", c.model_path.as_str()));
    }
    if let Some(rm) = &spec.reward_model {
        paths.push(("reward_model.model.path", rm.model_path.as_str()));
    }
    for t in spec.distillation.iter().flat_map(|d| &d.teachers) {
        paths.push(("distillation.teacher_models", t.model_path.as_str()));
    }
    paths
}

/// The model and tokenizer paths an SFT run reads, with the key naming each (`legacy`: verl
/// 0.7.0's legacy config, whose model and tokenizer are both `model.partial_pretrain`).
pub fn sft_model_paths(spec: &verlc_spec::sft::SftSpec) -> Vec<(&'static str, &str)> {
    if spec.trainer.is_legacy() {
        vec![("model.partial_pretrain", spec.model.path.as_str())]
    } else {
        vec![
            ("model.path", spec.model.path.as_str()),
            ("model.tokenizer_path", spec.model.tokenizer_path.as_str()),
        ]
    }
}

/// Each Hub id of `spec` once, in the order actor, tokenizer, reference, critic, reward model.
pub fn hub_models(spec: &TrainerSpec) -> Vec<HubModel> {
    hub_models_of(&model_paths(spec))
}

/// Each Hub id among `paths` once, in their order.
pub fn hub_models_of(paths: &[(&'static str, &str)]) -> Vec<HubModel> {
    let mut out: Vec<HubModel> = Vec::new();
    for &(key, path) in paths {
        if let Some(id) = hub_id(path).filter(|id| out.iter().all(|m| &m.id != id)) {
            out.push(HubModel { key, id });
        }
    }
    out
}

/// The local paths of `spec` (neither `builtin://` nor a Hub id) that are no directory, with
/// the key naming each: the trainer could not load them. `~` is not expanded, as transformers
/// does not expand it either (verl's example scripts' `~/models/...` are shell-expanded).
fn missing_local_models(
    paths: &[(&'static str, &str)],
    env: &HubEnv,
) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for &(key, path) in paths {
        let Ok(ModelLocation::Local(dir)) = locate(path, None, env) else {
            continue;
        };
        if !dir.is_dir() && out.iter().all(|(_, p)| p != path) {
            out.push((key, path.to_owned()));
        }
    }
    out
}

/// One reason a model of a spec cannot be loaded, as the parts of its diagnostic.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelProblem {
    pub code: crate::diag::Code,
    /// The key that names the model.
    pub key: &'static str,
    pub message: String,
    pub label: &'static str,
    pub help: String,
}

impl ModelProblem {
    /// Whether the model cannot be built as configured: all are errors but what trains with a
    /// limit ([`crate::codes::BUILD_TEXT_PROMPTS_ONLY`], a warning).
    pub fn is_error(&self) -> bool {
        self.code != crate::codes::BUILD_TEXT_PROMPTS_ONLY
    }

    /// The diagnostic at the line of its key in `root` ([`ModelProblem::is_error`]).
    pub fn diagnostic(&self, root: &Node) -> Diagnostic {
        let origin = root
            .get_path(&split_key(self.key))
            .and_then(|n| n.origin.clone());
        let make = if self.is_error() {
            Diagnostic::error
        } else {
            Diagnostic::warning
        };
        make(self.code, self.message.clone())
            .with_key(self.key)
            .with_primary(origin, self.label)
            .with_help(self.help.clone())
    }
}

/// The models among `paths` the trainer could not load: a local path that is no directory, a
/// Hub id not in the cache.
pub fn unavailable_models(paths: &[(&'static str, &str)], env: &HubEnv) -> Vec<ModelProblem> {
    use crate::codes::BUILD_MODEL_UNAVAILABLE;
    let mut out: Vec<ModelProblem> = missing_local_models(paths, env)
        .into_iter()
        .map(|(key, path)| ModelProblem {
            code: BUILD_MODEL_UNAVAILABLE,
            key,
            message: format!("the model `{path}` cannot be had: no such directory"),
            label: "this path",
            help: "name a checkpoint directory (`~` is not expanded, as in transformers), a Hub id, or builtin://tiny".into(),
        })
        .collect();
    for m in hub_models_of(paths) {
        if let Err(e) = locate(m.id.as_str(), None, env) {
            out.push(ModelProblem {
                code: BUILD_MODEL_UNAVAILABLE,
                key: m.key,
                message: format!("the model `{}` is not in the Hub cache: {e}", m.id),
                label: "this Hub id",
                help: "download it first (`verlc fetch ID`, or `verlc build`, which downloads what it needs)".into(),
            });
        }
    }
    out
}

/// What keeps the models of `spec` from loading on this machine as it is: a local path that is
/// no directory, a Hub id not in the Hub cache, then (only when every model is at hand) a
/// family the trainer does not implement, or not under the bound strategy, and a reward model
/// that is no classifier. `verlc build` reports these after downloading; the trainer, which
/// never downloads, before any rank starts when run-time overrides name models.
pub fn model_problems(spec: &TrainerSpec, env: &HubEnv) -> Vec<ModelProblem> {
    use crate::codes::{BUILD_REWARD_MODEL_NOT_CLASSIFIER, BUILD_UNSUPPORTED_SETTING};
    let mut out = unavailable_models(&model_paths(spec), env);
    if !out.is_empty() {
        return out;
    }
    out.extend(
        decoder_problems(spec, env)
            .into_iter()
            .map(|(key, why)| ModelProblem {
                code: BUILD_UNSUPPORTED_SETTING,
                key,
                message: format!("the model cannot be built: {why}"),
                label: "model named here",
                help: format!(
                    "name a checkpoint of a family verlc implements ({}), in a layout the message names as implemented",
                    verlc_spec::families::FAMILIES
                        .iter()
                        .map(|r| r.name)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            }),
    );
    let trained = [(
        "actor_rollout_ref.model.path",
        spec.actor.model_path.as_str(),
        &spec.actor.config_overrides,
        Some("actor_rollout_ref.model.override_config"),
    )];
    let no_overrides = serde_json::Map::new();
    let critic = spec.critic.iter().map(|c| {
        (
            "critic.model.path",
            c.model_path.as_str(),
            &no_overrides,
            None,
        )
    });
    let trained: Vec<_> = trained.into_iter().chain(critic).collect();
    out.extend(dropout_problems(&trained, env));
    if out.is_empty() {
        out.extend(
            text_prompt_limits(spec, env)
                .into_iter()
                .map(|(key, why)| ModelProblem {
                    code: crate::codes::BUILD_TEXT_PROMPTS_ONLY,
                    key,
                    message: why,
                    label: "model named here",
                    help: "train on text rows, or generate with the built-in rollout (`actor_rollout_ref.rollout.name=verlc`) and without a critic to train on images".into(),
                }),
        );
    }
    if !out.iter().any(ModelProblem::is_error)
        && let Some(why) = vllm_cpu_problem(spec, env)
    {
        out.push(ModelProblem {
            code: BUILD_UNSUPPORTED_SETTING,
            key: "actor_rollout_ref.rollout.name",
            message: why,
            label: "vLLM chosen here",
            help: "set `actor_rollout_ref.rollout.name=verlc` (the built-in engine has none of vLLM's CPU limits), or change what the message names".into(),
        });
    }
    if !out.iter().any(ModelProblem::is_error)
        && let Some(why) = topk_problem(spec, env)
    {
        out.push(ModelProblem {
            code: BUILD_UNSUPPORTED_SETTING,
            key: "distillation.distillation_loss.topk",
            message: why,
            label: "top-k set here",
            help: "set topk to at most the vocabulary size (verl's default is 32)".into(),
        });
    }
    if !out.iter().any(ModelProblem::is_error)
        && let Some(why) = reward_model_checkpoint(spec, env)
    {
        out.push(ModelProblem {
            code: BUILD_REWARD_MODEL_NOT_CLASSIFIER,
            key: "reward_model.model.path",
            message: format!("the reward model cannot score: {why}"),
            label: "reward model named here",
            help: "name a `LlamaForSequenceClassification` / `Qwen2ForSequenceClassification` checkpoint with one label (verl's reward models are such checkpoints)".into(),
        });
    }
    out
}

/// Why the reward model of `spec` cannot score, when its `config.json` is at hand (a local
/// directory or a Hub snapshot in the cache; `builtin://` models always can). verl loads it as
/// `AutoModelForTokenClassification` with one label: a checkpoint without a classification
/// head would score with a random one, and one with several labels does not load.
pub fn reward_model_checkpoint(spec: &TrainerSpec, env: &HubEnv) -> Option<String> {
    let rm = spec.reward_model.as_ref()?;
    let dir = match locate(&rm.model_path, None, env).ok()? {
        ModelLocation::Builtin => return None,
        loc => loc.dir()?.to_path_buf(),
    };
    classifier_problem(&dir)
}

/// Why the top-k distillation loss cannot run: a `k` beyond the vocabulary of the student or a
/// teacher (their `config.json`, when at hand; `builtin://` models' own size).
fn topk_problem(spec: &TrainerSpec, env: &HubEnv) -> Option<String> {
    let verlc_spec::trainer::DistillationMode::ForwardKlTopk { topk, .. } =
        spec.actor.update.distillation?.mode
    else {
        return None;
    };
    let teachers = spec.distillation.iter().flat_map(|d| &d.teachers);
    let paths = std::iter::once(spec.actor.model_path.as_str())
        .chain(teachers.map(|t| t.model_path.as_str()));
    paths.into_iter().find_map(|path| {
        let vocab_of = |dir: &Path| -> Option<i64> {
            let cfg = read_config(dir).ok()?;
            let cfg = cfg.get("text_config").unwrap_or(&cfg);
            cfg.get("vocab_size").and_then(Value::as_i64)
        };
        let vocab = match locate(path, None, env).ok()? {
            // Smoke's stand-in keeps its source's vocabulary.
            ModelLocation::Builtin => match scaled_source(path) {
                Some(dir) => vocab_of(dir)?,
                None => verlc_spec::builtin::tiny_vocab(path),
            },
            loc => vocab_of(loc.dir()?)?,
        };
        (topk > vocab).then(|| {
            format!("the top-k loss compares each position's {topk} most likely tokens, but `{path}` has a vocabulary of {vocab}")
        })
    })
}

/// Why the policy cannot generate with `rollout.name: vllm` on a CPU device: vLLM's CPU
/// attention kernel serves heads of 32 or more only (a narrower head fails the first request),
/// its Gated DeltaNet kernel (Qwen3.5, Qwen3-Next) bfloat16 with key heads of 128 only (the
/// released checkpoints'; vLLM 0.32 asserts the one and fails the first request on another
/// head size), and a family whose layers verlc has not run on vLLM (sinks, windows, soft caps,
/// biased experts) is not sent there.
fn vllm_cpu_problem(spec: &TrainerSpec, env: &HubEnv) -> Option<String> {
    if spec.rollout.vllm.is_none() || spec.world.device != verlc_spec::trainer::DeviceKind::Cpu {
        return None;
    }
    let path = spec.actor.model_path.as_str();
    // One read of the checkpoint's config for its family, its windows and its linear
    // attention's key heads.
    let (model_type, windowed, config) = match locate(path, None, env) {
        Ok(ModelLocation::Builtin) => (builtin_model_type(path), false, None),
        Err(_) => (None, false, None),
        Ok(loc) => match loc.dir().and_then(|dir| read_config(dir).ok()) {
            Some(c) => (
                c.get("model_type")
                    .and_then(Value::as_str)
                    .map(str::to_owned),
                config_windows_attention(&c),
                Some(c),
            ),
            None => (None, false, None),
        },
    };
    if let Some(row) = model_type
        .as_deref()
        .and_then(verlc_spec::families::of_checkpoint)
        .filter(|r| r.eager_attention() || r.expert_style.biased() || windowed)
    {
        return Some(format!(
            "verlc has not verified vLLM's serving of {} models (`{path}`: attention sinks, sliding windows, soft-capped scores, biased experts) against its trainer; generate with the built-in rollout (`actor_rollout_ref.rollout.name=verlc`)",
            row.name
        ));
    }
    let text = config.as_ref().map(|c| c.get("text_config").unwrap_or(c));
    let get = |k: &str| text.and_then(|t| t.get(k)).and_then(Value::as_i64);
    // The built-in models' heads (their linear attention's too) are `hidden / heads` wide.
    let builtin_head = || {
        let query = path.split_once('?').map_or("", |(_, q)| q);
        let param = |name: &str, default: i64| {
            query
                .split('&')
                .find_map(|kv| kv.strip_prefix(name)?.strip_prefix('='))
                .and_then(|v| v.parse::<i64>().ok())
                .unwrap_or(default)
        };
        param("hidden", 128) / param("heads", 4).max(1)
    };
    if let Some(row) = model_type
        .as_deref()
        .and_then(verlc_spec::families::of_checkpoint)
        .filter(|r| r.linear_attention)
    {
        let dtype = spec.rollout.dtype.unwrap_or(spec.binding.precision);
        if dtype != verlc_spec::trainer::Dtype::Bf16 {
            return Some(format!(
                "vLLM's CPU Gated DeltaNet kernel ({} layers) runs in bfloat16 only; this rollout runs in {} (set `actor_rollout_ref.rollout.dtype=bfloat16`)",
                row.name,
                dtype.name()
            ));
        }
        let key_head = match &config {
            None => builtin_head(),
            Some(_) => get("linear_key_head_dim")?,
        };
        if key_head != 128 {
            return Some(format!(
                "vLLM's CPU Gated DeltaNet kernel serves key heads of 128 (the released {} checkpoints'); `{path}` has {key_head}",
                row.name
            ));
        }
    }
    let head = match &config {
        None => builtin_head(),
        Some(_) => get("head_dim")
            .or_else(|| Some(get("hidden_size")? / get("num_attention_heads")?.max(1)))?,
    };
    (head < 32).then(|| {
        format!("vLLM's CPU attention needs a head dimension of at least 32; `{path}` has {head}")
    })
}

/// The policy, reference and critic models whose `config.json` (when at hand) is no decoder
/// the trainer implements (a mixture-of-experts or another family), with the key naming each.
fn decoder_problems(spec: &TrainerSpec, env: &HubEnv) -> Vec<(&'static str, String)> {
    let paths = model_paths(spec).into_iter().filter(|(key, _)| {
        !matches!(
            *key,
            "actor_rollout_ref.model.tokenizer_path" | "reward_model.model.path"
        )
    });
    let mut out: Vec<(&'static str, String)> = Vec::new();
    let megatron = spec.binding.strategy == verlc_spec::binding::StrategyKind::Megatron;
    for (key, path) in paths {
        let engine = role_engine(spec, key);
        let ulysses = engine.map_or(1, |e| e.ulysses());
        let world = spec.world.nnodes.max(1) * spec.world.n_gpus_per_node.max(1);
        let experts = match engine {
            Some(verlc_spec::trainer::EngineSpec::Megatron(m)) => ExpertLayout {
                ep: m.expert_parallel,
                etp: m.expert_tensor_parallel,
                tp: m.tensor_parallel,
                cp: m.context_parallel,
                dp: world / (m.tensor_parallel * m.pipeline_parallel * m.context_parallel).max(1),
                rollout_tp: spec.rollout.tensor_parallel,
            },
            _ => ExpertLayout::default(),
        };
        let layout = |name: &str, model_type: &str, linear_heads: Option<(i64, i64)>, windowed| {
            layout_problem(
                name,
                model_type,
                megatron,
                (ulysses, linear_heads),
                experts,
                windowed,
            )
        };
        // A layout the family cannot train in, else what a vision-language model cannot do,
        // else adapters verlc cannot place as PEFT does.
        let vision = |model_type: &str| {
            vision_problem(spec, key, path, model_type, env)
                .or_else(|| lora_problem(spec, key, path, model_type))
        };
        let why = match locate(path, None, env) {
            Ok(ModelLocation::Builtin) => builtin_model_type(path).and_then(|a| {
                layout(path, &a, builtin_linear_heads(path), false).or_else(|| vision(&a))
            }),
            Err(_) => None,
            Ok(loc) => loc.dir().and_then(|dir| {
                decoder_problem(dir).or_else(|| {
                    let cfg = read_config(dir).ok()?;
                    let model_type = cfg.get("model_type").and_then(Value::as_str)?;
                    let windowed = config_windows_attention(&cfg);
                    layout(
                        &dir.display().to_string(),
                        model_type,
                        linear_heads(&cfg),
                        windowed,
                    )
                    .or_else(|| vision(model_type))
                })
            }),
        };
        if let Some(why) = why.filter(|w| out.iter().all(|(_, o)| o != w)) {
            out.push((key, why));
        }
    }
    out
}

/// Whether a checkpoint's config windows its attention where the family's row does not
/// always: a Mistral with a `sliding_window` set (every layer), a Qwen2/Qwen3 with
/// `use_sliding_window` (the layers from `max_window_layers` on).
fn config_windows_attention(cfg: &Value) -> bool {
    let Some(row) = cfg
        .get("model_type")
        .and_then(Value::as_str)
        .and_then(verlc_spec::families::of_checkpoint)
    else {
        return false;
    };
    let set = |key: &str| cfg.get(key).is_some_and(|w| !w.is_null() && *w != false);
    // Under `use_sliding_window` an absent window is the class's 4,096, a null one none.
    (row.sliding_window_unless_null && set("sliding_window"))
        || (row.max_window_layers
            && set("use_sliding_window")
            && cfg.get("sliding_window") != Some(&Value::Null))
}

/// The `model_type` of the model at `path` (a `builtin://` model's family, a checkpoint's
/// `config.json`), when it is at hand.
pub fn model_type_of(path: &str, env: &HubEnv) -> Option<String> {
    match locate(path, None, env) {
        Ok(ModelLocation::Builtin) => builtin_model_type(path),
        Err(_) => None,
        Ok(loc) => loc.dir().and_then(|dir| {
            let cfg = read_config(dir).ok()?;
            cfg.get("model_type")
                .and_then(Value::as_str)
                .map(str::to_owned)
        }),
    }
}

/// The policy and critic models that train on text prompts only in this run
/// ([`text_prompts_only`]), with the key naming each.
fn text_prompt_limits(spec: &TrainerSpec, env: &HubEnv) -> Vec<(&'static str, String)> {
    let mut out: Vec<(&'static str, String)> = Vec::new();
    for (key, path) in model_paths(spec) {
        if !matches!(key, "actor_rollout_ref.model.path" | "critic.model.path") {
            continue;
        }
        if let Some(why) = model_type_of(path, env).and_then(|t| text_prompts_only(spec, key, &t)) {
            out.push((key, why));
        }
    }
    out
}

/// Why a vision-language model (`model_type` of a family with a vision tower) cannot train in
/// this run: verlc trains one on FSDP (one process or several, Ulysses too) or Megatron (the
/// tower whole on the first pipeline stage), with the built-in or the vLLM rollout generating
/// single turns or verl's tool agent loop's (synchronously or not), full weights or LoRA, from
/// data files or a Python dataset class, beside a vision-language critic on either strategy
/// (verl's critic reads the actor's images: TRL's value head over the image-text model). A Qwen3.5
/// checkpoint (an image-text family on a text family's layers) trains on text prompts beside a
/// critic ([`text_prompts_only`]).
fn vision_problem(
    spec: &TrainerSpec,
    key: &str,
    model: &str,
    model_type: &str,
    env: &HubEnv,
) -> Option<String> {
    let row = verlc_spec::families::of_checkpoint(model_type).filter(|r| r.vision.is_some())?;
    if text_prompts_only(spec, key, model_type).is_some() {
        return None;
    }
    let critic_sees = |path: &str| {
        model_type_of(path, env)
            .and_then(|t| verlc_spec::families::of_checkpoint(&t))
            .is_some_and(|r| r.vision.is_some())
    };
    // A vision-language critic reads the actor's pictures (FSDP and Megatron alike).
    if key == "critic.model.path" {
        return None;
    }
    let why = if spec
        .critic
        .as_ref()
        .is_some_and(|c| !critic_sees(&c.model_path))
    {
        // verl's critic reads the actor's images as well; a text critic cannot.
        "beside a text-only critic (verl's critic reads the actor's images too; a text model would run blind to them: give `critic.model.path` a vision-language model)"
    } else if spec
        .rollout
        .multi_turn
        .as_ref()
        .is_some_and(|m| m.agent_loop_config_path.is_some())
    {
        // The user's loops render their prompts in Python, where the pictures are not.
        "with the user's Python agent loops (agent_loop_config_path)"
    } else {
        return None;
    };
    Some(format!(
        "{model} is a {} model (`{model_type}`, a vision tower); verlc trains vision-language models on FSDP or Megatron, with the built-in or the vLLM rollout (single turns or verl's tool agent loop), on full weights or LoRA, from data files or a Python dataset class, beside a vision-language critic: training it {why} is not implemented yet",
        row.name
    ))
}

/// Why a Qwen3.5 checkpoint (`model_type`) trains on text prompts only in this run, in words
/// ([`TrainerSpec::text_prompts_only`]).
pub fn text_prompts_only(spec: &TrainerSpec, key: &str, model_type: &str) -> Option<String> {
    let row = verlc_spec::families::of_checkpoint(model_type)?;
    let why = spec.text_prompts_only(row.family, key == "critic.model.path")?;
    Some(format!(
        "a {} checkpoint (`{model_type}`) trains {why} on text prompts only: verlc does not yet send images there, and rows with images in `data.image_key` are refused when the data is read",
        row.name
    ))
}

/// Why the policy's LoRA adapters cannot be placed as PEFT places them: `all-linear` on a
/// Gated DeltaNet family (Qwen3.5, Qwen3-Next) adapts the DeltaNet's projections too in PEFT
/// (Qwen3-Next's fused `in_proj_qkvz` / `in_proj_ba`), which verlc's adapters do not cover yet.
fn lora_problem(spec: &TrainerSpec, key: &str, model: &str, model_type: &str) -> Option<String> {
    let lora = spec.actor.lora.as_ref()?;
    let all_linear = lora.target_modules == verlc_spec::trainer::ModuleSelector::AllLinear;
    (key == "actor_rollout_ref.model.path" && all_linear && has_linear_attention(model_type))
        .then(|| {
            format!(
                "{model} has Gated DeltaNet layers: LoRA with `actor_rollout_ref.model.target_modules: all-linear` adapts their projections in PEFT, which verlc's adapters do not cover yet (list the modules to adapt, e.g. [q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj])"
            )
        })
}

/// The engine of the role whose model `key` names.
fn role_engine<'a>(
    spec: &'a TrainerSpec,
    key: &str,
) -> Option<&'a verlc_spec::trainer::EngineSpec> {
    match key {
        "actor_rollout_ref.model.path" => Some(&spec.actor.engine),
        "actor_rollout_ref.ref.model.path" => spec.reference.as_ref().map(|r| &r.engine),
        "critic.model.path" => spec.critic.as_ref().map(|c| &c.engine),
        _ => None,
    }
}

/// Why a model of `model_type` cannot train in this layout (the Megatron strategy with its
/// `(expert parallel, expert tensor parallel, tensor parallel)` degrees, Ulysses of degree
/// `ulysses`, which splits a Gated DeltaNet's `(key, value)` heads `linear_heads`; `windowed`:
/// its config windows its attention, [`config_windows_attention`]), if it cannot.
fn layout_problem(
    model: &str,
    model_type: &str,
    megatron: bool,
    (ulysses, linear_heads): (usize, Option<(i64, i64)>),
    x: ExpertLayout,
    windowed: bool,
) -> Option<String> {
    let linear = has_linear_attention(model_type);
    if let Some(row) = verlc_spec::families::of_checkpoint(model_type).filter(|_| megatron) {
        // Sinks and windows take a rank's queries to be the last of its keys (not so under
        // context parallelism); a biased expert's down-projection bias is added whole, so
        // each expert stays whole on a tensor rank.
        let why = if x.cp > 1 && (row.eager_attention() || windowed) {
            Some(format!("context parallel {}", x.cp))
        } else if row.expert_style.biased() && x.tp > 1 && x.etp.unwrap_or(x.tp) > 1 {
            Some(format!(
                "experts split over tensor parallel {} (set `expert_tensor_parallel_size: 1`)",
                x.tp
            ))
        } else {
            None
        };
        if let Some(w) = why {
            return Some(format!(
                "{model} is a {} model (`{model_type}`: attention sinks, sliding-window layers, soft-capped scores, biased experts); verlc's Megatron engine runs it with data, tensor, sequence, pipeline and expert parallelism and whole experts: {w} is not implemented",
                row.name
            ));
        }
    }
    if megatron && x.cp > 1 && x.rollout_tp.is_some_and(|r| r != x.tp) {
        // The rollout's regrouping of ranks at another TP size assumes context parallel 1.
        return Some(format!(
            "context parallel {} with a rollout tensor parallel size other than the actor's ({}) is not implemented",
            x.cp, x.tp
        ));
    }
    if megatron && has_experts(model_type) {
        if let Some(why) = expert_layout_problem(x) {
            return Some(moe_on_megatron(model, model_type, &why));
        }
        if !linear {
            return None;
        }
    }
    if linear && megatron {
        // Data, pipeline, tensor parallelism (a DeltaNet layer split by heads as attention
        // is, for training and for the rollout) and context parallelism (each DeltaNet layer
        // gathers whole sequences).
        let why = if let Some((n, (k, v))) = linear_heads.and_then(|heads| {
            [x.tp, x.rollout_tp.unwrap_or(x.tp)]
                .into_iter()
                .map(|n| (n, heads))
                .find(|(n, (k, v))| k % *n as i64 != 0 || v % *n as i64 != 0)
        }) {
            Some(format!(
                "tensor parallel {n} over its Gated DeltaNet layers' {k} key and {v} value heads (it must divide both)"
            ))
        } else {
            None
        };
        return why.map(|w| format!(
            "{model} is a Qwen3.5 model (`{model_type}`, Gated DeltaNet layers); verlc's Megatron engine runs it with data, pipeline, tensor and context parallelism: {w} is not implemented"
        ));
    }
    // Under Ulysses a Gated DeltaNet layer runs whole sequences on a share of its heads, as
    // attention does: the key and the value heads must split evenly.
    let u = ulysses as i64;
    match linear_heads {
        Some((k, v)) if linear && u > 1 && (k % u != 0 || v % u != 0) => Some(format!(
            "{model} is a Qwen3.5 model (`{model_type}`) whose Gated DeltaNet layers have {k} key and {v} value heads: Ulysses of degree {ulysses} must divide both (each rank runs whole sequences on a share of the heads)"
        )),
        _ => None,
    }
}

/// The Gated DeltaNet `(key, value)` head counts of a `config.json` (or its `text_config`).
fn linear_heads(cfg: &Value) -> Option<(i64, i64)> {
    let text = cfg.get("text_config").unwrap_or(cfg);
    let get = |k: &str| text.get(k).and_then(Value::as_i64);
    Some((get("linear_num_key_heads")?, get("linear_num_value_heads")?))
}

/// The Gated DeltaNet heads of a `builtin://tiny` Qwen3.5 model: key heads = its `kv_heads`
/// (2), value heads = its `heads` (4), as the runtime's built-in config sets them.
fn builtin_linear_heads(uri: &str) -> Option<(i64, i64)> {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    let get = |k: &str, default: i64| {
        query
            .split('&')
            .find_map(|kv| kv.strip_prefix(k)?.strip_prefix('='))
            .map_or(Some(default), |v| v.parse().ok())
    };
    Some((get("kv_heads", 2)?, get("heads", 4)?))
}

/// Whether the `builtin://` model `uri` has mixture-of-experts layers (`None`: not a
/// built-in model).
pub(crate) fn builtin_has_experts(uri: &str) -> Option<bool> {
    uri.starts_with("builtin://")
        .then(|| builtin_model_type(uri).is_some_and(|a| has_experts(&a)))
}

/// The model directory a `builtin://scaled?from=DIR` stand-in (`verlc smoke`'s) is made from.
fn scaled_source(uri: &str) -> Option<&Path> {
    let query = uri.strip_prefix("builtin://scaled?")?;
    query
        .split('&')
        .find_map(|kv| kv.strip_prefix("from="))
        .map(Path::new)
}

/// The `model_type` of a `builtin://` model: that of the family its `arch` names (`qwen2`
/// when it names none); for `builtin://scaled?from=DIR` (smoke's stand-in), the `model_type`
/// of DIR's `config.json`, whose family the stand-in keeps.
fn builtin_model_type(uri: &str) -> Option<String> {
    let query = uri.split_once('?').map_or("", |(_, q)| q);
    if let Some(dir) = scaled_source(uri) {
        let cfg = read_config(dir).ok()?;
        return cfg
            .get("model_type")
            .and_then(Value::as_str)
            .map(str::to_owned);
    }
    let arch = query
        .split('&')
        .find_map(|kv| kv.strip_prefix("arch="))
        .unwrap_or(verlc_spec::builtin::TINY_DEFAULT_ARCH);
    verlc_spec::families::of_tiny_arch(arch).map(|r| r.model_type.to_owned())
}

/// How a Megatron role places a mixture-of-experts model's experts.
#[derive(Debug, Clone, Copy)]
struct ExpertLayout {
    ep: usize,
    etp: Option<usize>,
    tp: usize,
    cp: usize,
    /// Data-parallel ranks (the world over TP x CP x PP).
    dp: usize,
    rollout_tp: Option<usize>,
}

impl Default for ExpertLayout {
    fn default() -> Self {
        ExpertLayout {
            ep: 1,
            etp: None,
            tp: 1,
            cp: 1,
            dp: 1,
            rollout_tp: None,
        }
    }
}

fn moe_on_megatron(model: &str, model_type: &str, setting: &str) -> String {
    format!(
        "{model} is a mixture-of-experts model (`{model_type}`); verlc's Megatron engine splits each expert over tensor parallelism (expert tensor parallel = TP) or keeps it whole (expert tensor parallel 1), and the experts over expert-parallel ranks: {setting} is not implemented"
    )
}

/// Which expert placement of a Megatron role the engine cannot honour, if any:
/// - experts split over TP (`expert_tensor_parallel_size` unset or = TP): expert parallelism
///   over the context x data-parallel ranks of each tensor rank (it must divide them), with
///   the rollout at the actor's TP (which takes every expert's slice from its rank);
/// - whole experts (expert TP 1 under TP > 1, verl's MoE examples' layout): each tensor rank
///   routes its share of the tokens; expert parallelism over consecutive ranks of the
///   tensor x context x data grid (it must divide it); the rollout at any TP (it cuts every
///   whole expert to its own split).
///
/// Either way tokens are exchanged with all-to-alls, either optimizer takes the experts (the
/// distributed one shards their state over the ranks holding the same experts; the norm
/// counts each expert once), and context parallelism folds into the expert grid as
/// Megatron's does.
fn expert_layout_problem(x: ExpertLayout) -> Option<String> {
    let (ep, tp) = (x.ep, x.tp);
    let etp = x.etp.unwrap_or(tp);
    if etp != tp && etp != 1 {
        return Some(format!(
            "expert_tensor_parallel_size = {etp} with tensor parallel {tp} (it must be 1 or {tp})"
        ));
    }
    let whole = etp != tp;
    let room = if whole { tp * x.cp * x.dp } else { x.cp * x.dp };
    if !room.is_multiple_of(ep.max(1)) {
        let ranks = if whole {
            "tensor x context x data-parallel"
        } else {
            "context x data-parallel"
        };
        return Some(format!(
            "expert_model_parallel_size = {ep} over {room} {ranks} ranks (it must divide them)"
        ));
    }
    if ep > 1 && !whole && x.rollout_tp.is_some_and(|r| r != tp) {
        return Some(format!(
            "expert_model_parallel_size = {ep} with a rollout tensor parallel size other than the actor's (expert_tensor_parallel_size = 1 allows one)"
        ));
    }
    None
}

/// The dropouts a model's `config.json` sets to nonzero values, with `overrides` (its
/// `override_config`) over it and the family's config class defaults filling absent keys, which
/// may be nonzero (Seed-OSS's 0.1).
pub fn dropouts_set(
    cfg: &Value,
    overrides: &serde_json::Map<String, Value>,
) -> Vec<(&'static str, f64)> {
    let row = cfg
        .get("model_type")
        .and_then(Value::as_str)
        .and_then(verlc_spec::families::of_checkpoint);
    verlc_spec::families::DROPOUT_KEYS
        .iter()
        .filter_map(|k| {
            let p = match overrides.get(*k).or_else(|| cfg.get(*k)) {
                Some(v) => v.as_f64()?,
                None => match row.and_then(|r| r.config_default(k))? {
                    verlc_spec::families::ConfigValue::Float(p) => p,
                    _ => return None,
                },
            };
            (p != 0.0).then_some((*k, p))
        })
        .collect()
}

/// [`dropouts_set`] of the checkpoint in `dir` (read through the bounded loader), without
/// overrides; none where its `config.json` cannot be read.
pub fn checkpoint_dropouts(dir: &Path) -> Vec<(&'static str, f64)> {
    read_config(dir).map_or_else(
        |_| Vec::new(),
        |cfg| dropouts_set(&cfg, &serde_json::Map::new()),
    )
}

/// A model that trains, with the key naming it, the `config.json` keys the run overrides and
/// the key under which it overrides them (`None`: verlc applies no overrides there).
pub type TrainedModel<'a> = (
    &'static str,
    &'a str,
    &'a serde_json::Map<String, Value>,
    Option<&'static str>,
);

/// Trained models whose config (overrides applied, the family's config class defaults
/// filling absent keys, which may be nonzero) sets a dropout, which transformers would apply in
/// verl's updates and verlc does not: an error at the model's key, whose help names the
/// override that turns it off.
pub fn dropout_problems(models: &[TrainedModel<'_>], env: &HubEnv) -> Vec<ModelProblem> {
    let mut out = Vec::new();
    for &(key, path, overrides, override_key) in models {
        let dir = match locate(path, None, env) {
            Ok(ModelLocation::Builtin) => scaled_source(path).map(Path::to_path_buf),
            Ok(loc) => loc.dir().map(Path::to_path_buf),
            Err(_) => None,
        };
        let Some(cfg) = dir.and_then(|d| read_config(&d).ok()) else {
            continue;
        };
        let set = dropouts_set(&cfg, overrides);
        if set.is_empty() {
            continue;
        }
        let listed = set
            .iter()
            .map(|(k, p)| format!("{k} = {p}"))
            .collect::<Vec<_>>()
            .join(" and ");
        let help = match override_key {
            Some(base) => format!(
                "for a deterministic update (TRL's GRPO and PPO trainers turn dropout off by default), set {}",
                set.iter()
                    .map(|(k, _)| format!("`{base}.{k}=0.0`"))
                    .collect::<Vec<_>>()
                    .join(" and ")
            ),
            None => "for a deterministic update, set them to 0.0 in the model's config.json".into(),
        };
        out.push(ModelProblem {
            code: crate::codes::BUILD_UNSUPPORTED_SETTING,
            key,
            message: format!(
                "`{path}` trains with {listed}: transformers applies dropout in verl's updates (the model in training mode), and verlc's models have no dropout"
            ),
            label: "model named here",
            help,
        });
    }
    out
}

fn read_config(dir: &Path) -> Result<Value, String> {
    let file = dir.join("config.json");
    let text = crate::load::read::read_text(&file, crate::load::read::MAX_SIDE_FILE_BYTES)
        .map_err(|e| e.to_string())?;
    serde_json::from_str(&text).map_err(|e| format!("{} is not JSON: {e}", file.display()))
}

fn decoder_problem(dir: &Path) -> Option<String> {
    let cfg = match read_config(dir) {
        Ok(c) => c,
        Err(e) => return Some(e),
    };
    let file = dir.join("config.json");
    let model_type = cfg.get("model_type").and_then(Value::as_str).unwrap_or("");
    let Some(row) = verlc_spec::families::of_checkpoint(model_type) else {
        return Some(format!(
            "{} has model_type `{model_type}`; verlc's models are {}",
            file.display(),
            verlc_spec::families::checkpoint_model_types().join(", ")
        ));
    };
    if let Some(q) = cfg.get("quantization_config").filter(|q| !q.is_null()) {
        let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("?");
        return Some(format!(
            "{} declares quantization_config (quant_method `{method}`): verlc loads unquantized checkpoints; train from a dequantized (bf16) copy",
            file.display()
        ));
    }
    // The MLP's activation, as the loader reads it (a vision-language model's text keys may
    // sit in `text_config`; absent: the family's config class default, else SiLU).
    let text = cfg.get("text_config").unwrap_or(&cfg);
    if !row.max_window_layers && text.get("use_sliding_window") == Some(&Value::Bool(true)) {
        return Some(format!(
            "{} sets use_sliding_window: verlc windows the attention of Qwen2 and Qwen3 checkpoints that set it, not of {} ones",
            file.display(),
            row.name
        ));
    }
    let key = row.activation_key;
    let act = match text
        .get(key)
        .or_else(|| cfg.get(key))
        .filter(|v| !v.is_null())
    {
        Some(v) => v.as_str().unwrap_or("?").to_owned(),
        None => match row.config_default(key) {
            Some(verlc_spec::families::ConfigValue::Str(a)) => a.to_owned(),
            _ => "silu".to_owned(),
        },
    };
    let allowed = if row.experts {
        verlc_spec::families::EXPERT_ACTIVATIONS
    } else {
        verlc_spec::families::GATE_ACTIVATIONS
    };
    (!allowed.contains(&act.as_str())).then(|| {
        format!(
            "{} has {key} `{act}`; verlc's {} MLPs take {}",
            file.display(),
            row.name,
            allowed.join(", ")
        )
    })
}

fn classifier_problem(dir: &Path) -> Option<String> {
    let file = dir.join("config.json");
    if let Some(why) = decoder_problem(dir) {
        return Some(why);
    }
    let cfg = read_config(dir).ok()?;
    let archs: Vec<&str> = cfg
        .get("architectures")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    if !archs
        .iter()
        .any(|a| a.ends_with("ForSequenceClassification") || a.ends_with("ForTokenClassification"))
    {
        return Some(format!(
            "{} names architectures {archs:?}: not a classifier, so it has no `score` head to score with",
            file.display()
        ));
    }
    let labels = cfg
        .get("id2label")
        .and_then(Value::as_object)
        .map_or(1, serde_json::Map::len);
    if labels != 1 {
        return Some(format!(
            "{} has {labels} labels; a reward model has one (verl loads it with num_labels=1, which this head does not fit)",
            file.display()
        ));
    }
    None
}
