//! verl's cross-field rules, decided before anything runs. One rule per file, grouped by
//! the section it is about; every rule has a stable id (`V0xx`, `V2xx` for rules that need
//! the model's `config.json`) listed in [`RULES`], the single registry (an id is never
//! reused).
//!
//! A rule is a function of a [`RuleContext`]: the typed config (for the logic) plus the
//! composed tree (for where each value was written) and, when reachable, the model's
//! `config.json` dimensions (for model-aware checks). Its file starts with the user
//! documentation (`verlc rule V012` prints it) under fixed headings: What it checks, Why,
//! Example, Fix.

use crate::diag::{Code, Diagnostic};

pub mod context;
pub use context::{ModelDims, RuleContext};

pub(crate) mod facts;

mod algorithm;
mod batch;
pub use batch::arithmetic::Overflow;
pub(crate) use batch::arithmetic::arithmetic_fits;
mod data;
mod deprecated;
mod model;
mod optim;
mod parallel;
mod required;
mod reward;
mod rollout;
mod trainer;

/// A registered rule. `F` is what it checks: a PPO config ([`RuleContext`]) by default; verl's
/// SFT trainer's rules check an SFT config (`crate::sft::rules`).
pub struct Rule<F = fn(&RuleContext, &mut Vec<Diagnostic>)> {
    pub code: Code,
    /// The mistake it catches, in ruff's style (`MicroBatchExceedsMiniBatch`).
    pub name: &'static str,
    /// One line for `verlc rule --list`.
    pub summary: &'static str,
    /// The rule's documentation: the `//!` block at the top of its file, markers included
    /// (see [`Rule::doc_text`]).
    pub doc: &'static str,
    pub check: F,
}

impl<F> Rule<F> {
    /// The documentation as Markdown, without the `//!` markers.
    pub fn doc_text(&self) -> String {
        let mut out = String::new();
        for line in self.doc.lines() {
            let text = line.strip_prefix("//!").unwrap_or(line);
            out.push_str(text.strip_prefix(' ').unwrap_or(text));
            out.push('\n');
        }
        out
    }
}

/// The leading `//!` block of a source file, at compile time.
pub(crate) const fn leading_doc(src: &'static str) -> &'static str {
    let bytes = src.as_bytes();
    let mut end = 0;
    let mut line_start = 0;
    while line_start + 3 <= bytes.len()
        && bytes[line_start] == b'/'
        && bytes[line_start + 1] == b'/'
        && bytes[line_start + 2] == b'!'
    {
        let mut i = line_start;
        while i < bytes.len() && bytes[i] != b'\n' {
            i += 1;
        }
        end = i;
        line_start = i + 1;
    }
    let (head, _) = bytes.split_at(end);
    match std::str::from_utf8(head) {
        Ok(s) => s,
        Err(_) => "",
    }
}

/// Builds a [`Rule`] whose documentation is taken from its own file.
macro_rules! rule {
    ($code:literal, $name:literal, $section:ident :: $file:ident, $summary:literal) => {
        Rule {
            code: Code($code),
            name: $name,
            summary: $summary,
            doc: leading_doc(include_str!(concat!(
                stringify!($section),
                "/",
                stringify!($file),
                ".rs"
            ))),
            check: $section::$file::check,
        }
    };
}

/// Every rule, in id order.
pub static RULES: &[Rule] = &[
    rule!(
        "V001",
        "TrainBatchNotDivisibleByMinimalBatch",
        batch::train_batch_not_divisible_by_minimal_batch,
        "train_batch_size × rollout.n must divide by the smallest batch the ranks can split"
    ),
    rule!(
        "V002",
        "MiniBatchExceedsTrainBatch",
        batch::mini_batch_exceeds_train_batch,
        "ppo_mini_batch_size may not exceed data.train_batch_size"
    ),
    rule!(
        "V003",
        "MiniBatchNotDivisibleByGlobalMicroBatch",
        batch::mini_batch_not_divisible_by_global_micro_batch,
        "ppo_mini_batch_size must be a multiple of the deprecated global ppo_micro_batch_size"
    ),
    rule!(
        "V004",
        "GlobalMicroBatchBelowWorldSize",
        batch::global_micro_batch_below_world_size,
        "the deprecated global ppo_micro_batch_size × sequence parallel must cover every rank"
    ),
    rule!(
        "V005",
        "NormalizedMiniBatchIsZero",
        batch::normalized_mini_batch_is_zero,
        "the per-rank mini-batch of the legacy FSDP worker rounds down to zero"
    ),
    rule!(
        "V006",
        "NormalizedMiniBatchNotDivisibleByMicroBatch",
        batch::normalized_mini_batch_not_divisible_by_micro_batch,
        "the per-rank mini-batch must be a multiple of the per-rank micro-batch"
    ),
    rule!(
        "V007",
        "MiniBatchNotDivisibleByDataParallel",
        batch::mini_batch_not_divisible_by_data_parallel,
        "ppo_mini_batch_size × rollout.n should split evenly over the data-parallel ranks"
    ),
    rule!(
        "V008",
        "MicroBatchSetTwice",
        batch::micro_batch_set_twice,
        "a micro-batch size is given both globally (deprecated) and per GPU"
    ),
    rule!(
        "V009",
        "MicroBatchUnset",
        batch::micro_batch_unset,
        "no micro-batch size is given while dynamic batching is off"
    ),
    rule!(
        "V010",
        "DynamicBatchingMismatch",
        batch::dynamic_batching_mismatch,
        "engine workers need the same use_dynamic_bsz for the actor and the old-log-prob pass"
    ),
    rule!(
        "V011",
        "EngineWorkerNeedsPerGpuMicroBatch",
        batch::engine_worker_needs_per_gpu_micro_batch,
        "engine workers read only the *_per_gpu micro-batch sizes"
    ),
    rule!(
        "V012",
        "TokenBudgetBelowSequenceLength",
        batch::token_budget_below_sequence_length,
        "a dynamic-batching token budget is smaller than prompt + response length"
    ),
    rule!(
        "V013",
        "MegatronShuffleWithoutSeed",
        batch::megatron_shuffle_without_seed,
        "Megatron shuffles mini-batches only with a data_loader_seed"
    ),
    rule!(
        "V014",
        "WorldNotDivisibleByModelParallel",
        parallel::world_not_divisible_by_model_parallel,
        "the GPU count must divide by Megatron's tensor × pipeline × context parallel size"
    ),
    rule!(
        "V015",
        "WorldNotDivisibleBySequenceParallel",
        parallel::world_not_divisible_by_sequence_parallel,
        "the GPU count must divide by the Ulysses sequence-parallel size"
    ),
    rule!(
        "V016",
        "WorldNotDivisibleByRolloutReplica",
        parallel::world_not_divisible_by_rollout_replica,
        "the GPU count must divide by the rollout replica size (tensor × data × pipeline)"
    ),
    rule!(
        "V017",
        "RolloutReplicaNotNodeAligned",
        parallel::rollout_replica_not_node_aligned,
        "a rollout replica larger than a node must span whole nodes"
    ),
    rule!(
        "V018",
        "RolloutExpertParallelMismatch",
        parallel::rollout_expert_parallel_mismatch,
        "rollout expert parallelism above 1 must equal tensor × data parallel"
    ),
    rule!(
        "V019",
        "RolloutPipelineParallelUnsupported",
        parallel::rollout_pipeline_parallel_unsupported,
        "vLLM, SGLang and TensorRT-LLM rollouts do not support pipeline parallelism in verl"
    ),
    rule!(
        "V020",
        "SequenceParallelWithoutRemovePadding",
        parallel::sequence_parallel_without_remove_padding,
        "Ulysses sequence parallelism needs use_remove_padding"
    ),
    rule!(
        "V021",
        "MandatoryValueUnset",
        required::mandatory_value_unset,
        "a `???` value that verl reads was never given"
    ),
    rule!(
        "V022",
        "RolloutSyncModeRemoved",
        rollout::rollout_sync_mode_removed,
        "rollout.mode `sync` was removed from verl"
    ),
    rule!(
        "V023",
        "RolloutEngineNotRegistered",
        rollout::rollout_engine_not_registered,
        "the rollout engine name has no implementation in verl"
    ),
    rule!(
        "V024",
        "ValidationSamplingWithoutTemperature",
        rollout::validation_sampling_without_temperature,
        "val_kwargs.do_sample needs a positive rollout.temperature"
    ),
    rule!(
        "V025",
        "LoraRankAboveVllmLimit",
        rollout::lora_rank_above_vllm_limit,
        "vLLM serves LoRA adapters up to rank 512"
    ),
    rule!(
        "V026",
        "TiledMlpWithoutFsdp2",
        model::tiled_mlp_without_fsdp2,
        "tiled MLP needs the fsdp2 strategy"
    ),
    rule!(
        "V027",
        "AdaptiveKlHorizonNotPositive",
        algorithm::adaptive_kl_horizon_not_positive,
        "the adaptive KL controller needs a positive horizon"
    ),
    rule!(
        "V028",
        "PassAtKWithSingleResponse",
        algorithm::pass_at_k_with_single_response,
        "grpo_passk needs at least two responses per prompt"
    ),
    rule!(
        "V029",
        "RejectionSamplingOptionUnknown",
        algorithm::rejection_sampling_option_unknown,
        "rollout_correction.rollout_rs names an unknown option"
    ),
    rule!(
        "V030",
        "RejectionSamplingThresholdInvalid",
        algorithm::rejection_sampling_threshold_invalid,
        "rollout_correction.rollout_rs_threshold is missing or malformed"
    ),
    rule!(
        "V031",
        "OptimizerNameUnknown",
        optim::optimizer_name_unknown,
        "the optimizer name does not exist in the chosen optimizer module"
    ),
    rule!(
        "V032",
        "RewardManagerNotRegistered",
        reward::reward_manager_not_registered,
        "the reward manager is not in verl's registry (or has no module path)"
    ),
    rule!(
        "V033",
        "RewardPoolSizeNotPositive",
        reward::reward_pool_size_not_positive,
        "a separate reward-model pool needs positive node and GPU counts"
    ),
    rule!(
        "V034",
        "HybridEngineDisabled",
        trainer::hybrid_engine_disabled,
        "verl supports only the hybrid engine"
    ),
    rule!(
        "V035",
        "ResumePathWithoutGlobalStep",
        trainer::resume_path_without_global_step,
        "resume_mode resume_path needs a …/global_step_N folder"
    ),
    rule!(
        "V036",
        "ResumeFromHdfsUnsupported",
        trainer::resume_from_hdfs_unsupported,
        "verl cannot resume while default_hdfs_dir is set"
    ),
    rule!(
        "V037",
        "LoggerBackendUnsupported",
        trainer::logger_backend_unsupported,
        "a logger backend is deprecated or not available in verlc's trainer"
    ),
    rule!(
        "V038",
        "DeprecatedKeySet",
        deprecated::deprecated_key_set,
        "a deprecated or renamed key is set"
    ),
    rule!(
        "V039",
        "MbridgeRequired",
        model::mbridge_required,
        "verl builds these Megatron models only through mbridge"
    ),
    rule!(
        "V040",
        "RefLoadWeightMismatch",
        model::ref_load_weight_mismatch,
        "the Megatron reference policy and actor must agree on load_weight"
    ),
    rule!(
        "V041",
        "RolloutExpertParallelNeedsNodeAlignedTensorParallel",
        parallel::rollout_expert_parallel_needs_node_aligned_tensor_parallel,
        "an expert-parallel vLLM rollout needs a tensor size that divides the GPUs per node"
    ),
    rule!(
        "V042",
        "PrometheusNeedsLogStats",
        rollout::prometheus_needs_log_stats,
        "the rollout's Prometheus export needs disable_log_stats off"
    ),
    rule!(
        "V043",
        "DataFileFormatUnsupported",
        data::data_file_format_unsupported,
        "verl reads only .parquet and .json data files"
    ),
    rule!(
        "V044",
        "GaeWithoutCritic",
        algorithm::gae_without_critic,
        "GAE needs the critic: critic.enable must not be false"
    ),
    rule!(
        "V045",
        "MegatronStrategyWithoutEngineSection",
        parallel::megatron_strategy_without_engine_section,
        "a megatron strategy needs the Megatron base config (its megatron sections)"
    ),
    rule!(
        "V046",
        "FsdpSizeDoesNotDivideWorld",
        parallel::fsdp_size_does_not_divide_world,
        "fsdp_size must divide the GPU count (or be -1)"
    ),
    rule!(
        "V047",
        "MegatronWithUlysses",
        parallel::megatron_with_ulysses,
        "the Megatron actor does not run Ulysses sequence parallelism"
    ),
    rule!(
        "V048",
        "CurriculumSamplerWithWorkers",
        data::curriculum_sampler_with_workers,
        "a custom (curriculum) sampler needs dataloader_num_workers 0"
    ),
    rule!(
        "V049",
        "GroupBaselineWithSingleResponse",
        algorithm::group_baseline_with_single_response,
        "group-baseline estimators need more than one response per prompt (warning)"
    ),
    rule!(
        "V050",
        "MegatronFloat32Extension",
        model::megatron_float32_extension,
        "megatron.dtype float32 is a verlc extension verl refuses (warning)"
    ),
    rule!(
        "V051",
        "VectorizedGrpoIgnoresStdFlag",
        algorithm::vectorized_grpo_ignores_std_flag,
        "verl ignores norm_adv_by_std_in_grpo=false for grpo_vectorized and gdpo; verlc honours it (warning)"
    ),
    rule!(
        "V052",
        "StraightThroughKlRaisesInVerl",
        algorithm::straight_through_kl_raises_in_verl,
        "straight-through KL names (k3+, ...) raise in verl 0.7.0; verlc runs them (warning)"
    ),
    rule!(
        "V053",
        "DerivedSizeOverflows",
        batch::derived_size_overflows,
        "a size derived from the config (world size, tokens per step, ...) overflows 64-bit arithmetic"
    ),
    rule!(
        "V054",
        "DroWithoutBeta",
        algorithm::dro_without_beta,
        "the DRO policy loss needs a positive policy_loss.dro_beta"
    ),
    rule!(
        "V055",
        "OptimalBaselineWithoutSumPiSquared",
        algorithm::optimal_baseline_without_sum_pi_squared,
        "the optimal token baseline estimators need actor.calculate_sum_pi_squared and the old-log-prob pass"
    ),
    rule!(
        "V056",
        "GdpoRewardKeysInvalid",
        algorithm::gdpo_reward_keys_invalid,
        "gdpo needs reward keys the reward function returns, and one weight per key"
    ),
    rule!(
        "V057",
        "FilterGroupsMetricUnavailable",
        algorithm::filter_groups_metric_unavailable,
        "group filtering needs a metric that is known when groups are scored"
    ),
    rule!(
        "V058",
        "ValueFromLaterRelease",
        algorithm::value_from_later_release,
        "a value verl added after the config tree's release (estimators, losses, aggregation): that release raises at start-up"
    ),
    rule!(
        "V059",
        "KeyMovedInNewerRelease",
        deprecated::key_moved_in_newer_release,
        "a key verl moved or dropped after 0.7.0 is set on a newer release's tree"
    ),
    rule!(
        "V060",
        "ImportanceThresholdInvalid",
        algorithm::importance_threshold_invalid,
        "rollout_correction.rollout_is_threshold is not a positive bound (or IcePop's lower_upper)"
    ),
    rule!(
        "V061",
        "EngineNeedsEngineWorkers",
        trainer::engine_needs_engine_workers,
        "verl 0.7.1 runs VeOmni and torchtitan only in its engine workers"
    ),
    rule!(
        "V062",
        "NameNotInReleaseRegistry",
        rollout::name_not_in_release_registry,
        "a checkpoint-engine backend or tool-call parser the judged release has not registered"
    ),
    rule!(
        "V063",
        "BuiltinModelInvalid",
        model::builtin_model_invalid,
        "a builtin:// model address the trainer cannot build (name, parameters, family)"
    ),
    rule!(
        "V064",
        "GenBatchSizeOverridden",
        trainer::gen_batch_size_overridden,
        "verl 0.9 sets data.gen_batch_size to 1 where its replay buffer refills single prompts"
    ),
    rule!(
        "V065",
        "SeparateAsyncLayoutInvalid",
        trainer::separate_async_layout_invalid,
        "what verl's separate_async trainer asserts: batch sizes, a rollout pool, its weight sync"
    ),
    rule!(
        "V066",
        "RemaxWithoutBaselineInV1",
        algorithm::remax_without_baseline_in_v1,
        "verl 0.9's v1 trainer does not generate ReMax's greedy baseline"
    ),
    rule!(
        "V201",
        "TensorParallelDoesNotDivideHeads",
        model::tensor_parallel_does_not_divide_heads,
        "tensor/sequence parallel size must divide the attention heads"
    ),
    rule!(
        "V202",
        "TensorParallelIncompatibleWithKvHeads",
        model::tensor_parallel_incompatible_with_kv_heads,
        "tensor/sequence parallel size does not fit the key/value heads"
    ),
    rule!(
        "V203",
        "RolloutMaxModelLenExceedsModel",
        model::rollout_max_model_len_exceeds_model,
        "rollout.max_model_len is longer than the model's max_position_embeddings"
    ),
    rule!(
        "V204",
        "SequenceExceedsModelContext",
        model::sequence_exceeds_model_context,
        "prompt + response length does not fit the rollout context"
    ),
    rule!(
        "V205",
        "PipelineDoesNotDivideLayers",
        model::pipeline_does_not_divide_layers,
        "Megatron's pipeline size must divide the decoder layers"
    ),
    rule!(
        "V206",
        "ExpertParallelDoesNotDivideExperts",
        model::expert_parallel_does_not_divide_experts,
        "expert-parallel degrees must divide the experts (expert tensor parallel: their width)"
    ),
];

/// Run every rule for which `enabled` holds.
pub fn run(ctx: &RuleContext, enabled: &dyn Fn(Code) -> bool) -> Vec<Diagnostic> {
    let mut out = Vec::new();
    // Sizes that overflow would reach the other rules saturated: report only that.
    if enabled(crate::codes::SIZE_OVERFLOW) {
        batch::derived_size_overflows::check(ctx, &mut out);
        if !out.is_empty() {
            return out;
        }
    }
    for r in RULES
        .iter()
        .filter(|r| r.code != crate::codes::SIZE_OVERFLOW)
    {
        if enabled(r.code) {
            (r.check)(ctx, &mut out);
        }
    }
    out
}

/// The id `code` names (any case), among every code verlc can emit: the load and build
/// codes ([`crate::codes`]) and the rules' (`verlc check --only` refuses any other).
pub fn known_code(code: &str) -> Option<Code> {
    all_codes().find(|c| c.0.eq_ignore_ascii_case(code))
}

/// Every id, for "did you mean".
pub fn all_codes() -> impl Iterator<Item = Code> {
    crate::codes::LOAD_CODES
        .iter()
        .chain(crate::codes::BUILD_CODES)
        .map(|(c, _)| *c)
        .chain(RULES.iter().map(|r| r.code))
}

/// A rule by id (`V012`) or by name (`TokenBudgetBelowSequenceLength`), ignoring case.
pub fn find(code_or_name: &str) -> Option<&'static Rule> {
    RULES.iter().find(|r| {
        r.code.0.eq_ignore_ascii_case(code_or_name) || r.name.eq_ignore_ascii_case(code_or_name)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codes;

    #[test]
    fn codes_are_unique_and_in_order() {
        let mut seen: Vec<&str> = codes::LOAD_CODES.iter().map(|(c, _)| c.0).collect();
        for r in RULES {
            assert!(
                !seen.contains(&r.code.0),
                "duplicate diagnostic code {}",
                r.code
            );
            seen.push(r.code.0);
        }
        for pair in RULES.windows(2) {
            assert!(
                pair[0].code.0 < pair[1].code.0,
                "{} listed before {}",
                pair[0].code,
                pair[1].code
            );
        }
    }

    #[test]
    fn every_rule_has_documentation_with_fixed_headings() {
        for r in RULES {
            let doc = r.doc_text();
            for heading in ["## What it checks", "## Why", "## Example", "## Fix"] {
                assert!(
                    doc.contains(heading),
                    "{} ({}) lacks `{heading}`",
                    r.code,
                    r.name
                );
            }
        }
    }

    #[test]
    fn rule_codes_have_the_rule_prefix() {
        for r in RULES {
            assert!(
                r.code.0.starts_with('V') && r.code.0.len() == 4,
                "bad rule code {}",
                r.code
            );
        }
    }
}
