//! The verdict of every config leaf: what a verlc trainer does with it.
//!
//! Each leaf of verl's composed FSDP and Megatron trees matches an entry of [`TABLE`] (first
//! match wins; a test walks both trees and fails on a leaf without one):
//! - [`Verdict::Implemented`]: the trainer honours it; the text names the spec field.
//! - [`Verdict::Checked`]: honoured for the values the runtime implements; lowering
//!   ([`super::spec`]) reports any other value as `B018` at its line.
//! - [`Verdict::NoEffect`]: nothing in a verlc trainer reads it (a vLLM knob, a profiler, Ray);
//!   a warning with the reason when the user changed it.
//! - [`Verdict::Unsupported`]: only verlc's default behaviour exists; a `B018` error when the
//!   user set another value (a warning in `verlc check`, which judges verl validity).
//!
//! "Changed" means: written in a user file or override (not a built-in default, nor a value a
//! built-in `${...}` copied from elsewhere) and different from verlc's built-in default of the
//! same flavour. A config copied from verl therefore stays quiet until someone tunes a key.
//!
//! Patterns are dotted keys; `*` matches one segment (`moe_*` one segment with that prefix),
//! `**` any number (also none), and `{a,b}` one segment out of a list.

use crate::codes;
use crate::diag::Code;

/// What the trainer does with a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Honoured; the spec field (or the binding) that carries it.
    Implemented(&'static str),
    /// Honoured within the subset the runtime implements; lowering reports other values.
    Checked(&'static str),
    /// Not read by a verlc trainer; completes "`key` ...".
    NoEffect(Code, &'static str),
    /// Only the default works; completes "`key` ...".
    Unsupported(&'static str),
}

pub struct Entry {
    pub pattern: &'static str,
    pub verdict: Verdict,
}

use Verdict::{Checked, Implemented, NoEffect, Unsupported};

const ROLLOUT_KNOB: Code = codes::BUILD_ROLLOUT_KNOB_UNUSED;
const PROFILER: Code = codes::BUILD_PROFILER_UNUSED;
const PYTHON: Code = codes::BUILD_PYTHON_ONLY_KEY;
const CLUSTER: Code = codes::BUILD_CLUSTER_KEY_UNUSED;
const NONE: Code = codes::BUILD_NO_EFFECT;

const VLLM: &str =
    "is a setting of vLLM/SGLang; the binary's built-in rollout engine does not use it";
const PROFILING: &str = "configures a profiler; the binary has no profiler integration";
const PY: &str = "is a Python-side feature (torch.compile, Liger/Triton kernels, remote code); the binary does not use it";
const RAY: &str =
    "configures verl's Ray/cluster machinery; the binary runs its ranks itself and does not use it";
const RM: &str = "is a setting of verl's reward-model workers (engine, sharding, servers); verlc's trainer runs the reward model forward-only on every rank and does not read it";
const CRITIC_LORA_OPT: &str = "is a LoRA option of the critic; verlc's critic trains full weights (a critic LoRA rank above 0 is refused)";
const LORA_OPT: &str =
    "is a Megatron LoRA option; verlc's LoRA runs with the FSDP keys (model.lora.rank is refused)";
/// Where `enable_gradient_checkpointing` goes. A one-process run (the single engine) keeps
/// activations either way: the same numbers, and nothing sharded to save memory for.
const CHECKPOINTING: &str = "engine.gradient_checkpointing (FSDP over several ranks; Megatron lowering warns that its engine keeps activations)";
const MEMORY: &str = "only trades memory for compute in verl; the binary's engines compute the same numbers without it";

macro_rules! table {
    ($($pattern:literal => $verdict:expr,)+) => {
        /// The verdicts, first match wins.
        pub static TABLE: &[Entry] = &[$(Entry { pattern: $pattern, verdict: $verdict },)+];
    };
}

table! {
    // Hydra's instantiate targets and the profilers, wherever they are.
    "**._target_" => NoEffect(NONE, "names a Python class for Hydra's instantiate; the binary does not instantiate Python classes"),
    "global_profiler.**" => NoEffect(PROFILER, PROFILING),
    "**.profiler.**" => NoEffect(PROFILER, PROFILING),
    "**.profile.**" => NoEffect(PROFILER, PROFILING),

    // The reward model and its engines.
    "reward_model.enable" => Implemented("reward_model (scores replace the reward function's in training)"),
    "reward_model.model.path" => Implemented("reward_model.model_path"),
    "reward_model.model.input_tokenizer" => Checked("reward_model.input (null: the policy's tokens; otherwise the policy's tokenizer decodes, and another tokenizer is refused)"),
    "reward_model.{micro_batch_size,micro_batch_size_per_gpu,use_dynamic_bsz,forward_max_token_len_per_gpu}" => Implemented("reward_model.micro_batch"),
    "reward_model.max_length" => Implemented("reward_model.input.max_length (legacy worker)"),
    "reward_model.{use_reward_loop,enable_resource_pool}" => Implemented("reward_model.input and reward_model.scores_validation"),
    "reward_model.rollout.dtype" => Implemented("reward_model.dtype (reward loop)"),
    "reward_model.model.override_config.**" => Unsupported("overrides fields of the reward model's config.json, which verlc's model loader does not apply"),
    "reward_model.model.{external_lib,trust_remote_code,use_fused_kernels,use_shm}" => NoEffect(PYTHON, PY),
    "reward_model.model.use_remove_padding" => NoEffect(NONE, "packs sequences without padding for speed in verl; the binary scores the same values on padded micro-batches"),
    "reward_model.reward_loop_source" => Unsupported("loads a custom reward-loop class; verlc scores with the reward model or the reward function itself"),
    "reward_model.launch_reward_fn_async" => NoEffect(NONE, "overlaps the reward function with other work in verl; the scores are the same"),
    "reward_model.rollout.**" => NoEffect(ROLLOUT_KNOB, "is a setting of the vLLM/SGLang server verl's reward loop scores with; verlc runs the reward model itself"),
    "reward_model.{n_gpus_per_node,nnodes,num_workers}" => NoEffect(CLUSTER, RAY),
    "reward_model.reward_manager" => Checked("reward_manager (naive, dapo; batch and prime run verl's own class in Python; others are refused)"),
    "reward_model.reward_kwargs.**" => Checked("reward_manager (DAPO's max_resp_len and overlong_buffer_cfg; a Python manager's constructor takes them all; other arguments are refused)"),
    "reward_model.sandbox_fusion.url" => Unsupported("points to a code sandbox; verlc's trainer has no sandbox reward"),
    "reward_model.**" => NoEffect(NONE, RM),
    "reward_manager.name" => Checked("reward_manager (naive, dapo; batch, prime and importlib classes run in Python; others are refused)"),
    "reward_manager.source" => Implemented("reward_manager (source importlib: the user's class, run in Python as verl runs it)"),
    "reward_manager.module.path" => Implemented("reward_manager (source importlib: the user's class, run in Python as verl runs it)"),
    "reward_manager.**" => NoEffect(NONE, "not read by verl's reward manager loading"),
    "custom_reward_function.*" => Implemented("reward (Python function in a side process)"),
    "custom_reward_function.reward_kwargs.**" => Implemented("reward.reward_kwargs"),

    // verl 0.7.1+'s reward section (the top-level keys above migrate into it when set)
    "reward.custom_reward_function.*" => Implemented("reward (Python function in a side process)"),
    "reward.custom_reward_function.reward_kwargs.**" => Implemented("reward.reward_kwargs"),
    "reward.reward_manager.name" => Checked("reward_manager (naive, dapo, gdpo; importlib classes run in Python; others are refused)"),
    "reward.reward_manager.source" => Implemented("reward_manager (source importlib: the user's class, run in Python as verl runs it)"),
    "reward.reward_manager.module.path" => Implemented("reward_manager (source importlib: the user's class, run in Python as verl runs it)"),
    "reward.reward_manager.**" => NoEffect(NONE, "not read by verl's reward manager loading"),
    "reward.reward_kwargs.**" => Checked("reward_manager (DAPO's max_resp_len and overlong_buffer_cfg; a Python manager's constructor takes them all; other arguments are refused)"),
    "reward.reward_model.enable" => Implemented("reward_model (the reward loop's scores replace the reward function's in training)"),
    "reward.reward_model.model_path" => Implemented("reward_model.model_path"),
    "reward.reward_model.enable_resource_pool" => Implemented("reward_model.scores_validation"),
    "reward.reward_model.rollout.dtype" => Implemented("reward_model.dtype"),
    "reward.reward_model.rollout.**" => NoEffect(ROLLOUT_KNOB, "is a setting of the vLLM/SGLang server verl's reward loop scores with; verlc runs the reward model itself"),
    "reward.reward_model.{n_gpus_per_node,nnodes}" => NoEffect(CLUSTER, RAY),
    "reward.num_workers" => NoEffect(CLUSTER, RAY),
    "reward.sandbox_fusion.url" => Unsupported("points to a code sandbox; verlc's trainer has no sandbox reward"),
    "reward.sandbox_fusion.**" => NoEffect(NONE, "configures verl's code sandbox, which verlc's trainer does not use"),

    // algorithm
    "algorithm.adv_estimator" => Implemented("algorithm.estimator"),
    "algorithm.{gamma,lam,norm_adv_by_std_in_grpo}" => Implemented("algorithm.advantage"),
    "algorithm.use_kl_in_reward" => Implemented("algorithm.kl_in_reward"),
    "algorithm.kl_penalty" => Implemented("algorithm.kl_penalty"),
    "algorithm.kl_ctrl.*" => Implemented("algorithm.kl_ctrl"),
    "algorithm.use_pf_ppo" => Implemented("algorithm.pf_ppo (with GAE, as verl; a warning otherwise)"),
    "algorithm.pf_ppo.**" => Implemented("algorithm.pf_ppo"),
    "algorithm.{gdpo_reward_keys,gdpo_reward_weights}" => Implemented("algorithm.gdpo (with adv_estimator=gdpo; a warning otherwise)"),
    "algorithm.filter_groups.{enable,metric,max_num_gen_batches}" => Implemented("algorithm.filter_groups (DAPO dynamic sampling)"),
    "algorithm.filter_groups.max_inflight_gen_batches" => Checked("algorithm.filter_groups (one refill round at a time; above 1 a warning)"),
    "algorithm.rollout_correction.{bypass_mode,loss_type}" => Checked("actor.update.bypass (needs rollout.calculate_log_probs)"),
    "algorithm.rollout_correction.**" => Checked("algorithm.rollout_correction (decoupled mode: importance weights, rejection, veto)"),

    // data
    "data.{train_files,val_files,prompt_key,reward_fn_key,max_prompt_length,truncation,filter_overlong_prompts,train_max_samples,val_max_samples,shuffle,validation_shuffle,seed}" => Implemented("data"),
    "data.max_response_length" => Implemented("rollout.train.max_new_tokens (through rollout.response_length)"),
    "data.{train_batch_size,gen_batch_size}" => Implemented("data.batch_size"),
    "data.val_batch_size" => Implemented("data.val_batch_size"),
    "data.apply_chat_template_kwargs.**" => Implemented("data.chat_template_kwargs"),
    "data.{dataloader_num_workers,filter_overlong_prompts_workers}" => NoEffect(NONE, "sets Python worker counts; the binary loads and tokenizes data in-process"),
    "data.{return_raw_input_ids,return_raw_chat,return_full_prompt}" => NoEffect(NONE, "adds fields to verl's batches for reward models and agents; the binary does not need them"),
    "data.{use_shm,trust_remote_code}" => NoEffect(PYTHON, PY),
    "data.image_key" => Implemented("data.image_key (the column of a vision-language model's images)"),
    "data.image_patch_size" => Implemented("data.image_patch_size (the patch size images are fetched with when filter_overlong_prompts measures a prompt)"),
    "data.video_key" => Unsupported("names another column for videos; verlc reads a vision-language model's videos (as frame lists) from `videos`, verl's default"),
    "data.{audio_key,return_multi_modal_inputs}" => Unsupported("configures audio or processor inputs; verlc's vision-language models take images and videos"),
    "data.mm_processor_kwargs.**" => Unsupported("passes arguments to a multi-modal processor; verlc prepares images with the model's preprocessor_config.json"),
    "data.continuous_token.enable" => Unsupported("feeds multi-modal inputs as continuous tokens; verlc's vision-language models take images"),
    "data.continuous_token.**" => NoEffect(NONE, "belongs to continuous-token inputs (continuous_token.enable is refused)"),
    "data.tokenizer" => Unsupported("names a separate tokenizer; verlc tokenizes with actor_rollout_ref.model.tokenizer_path (or the model's)"),
    "data.{tool_config_path,function_tool_path}" => Unsupported("configures tools for multi-turn rollouts, which verlc does not implement"),
    "data.custom_cls.**" => Implemented("data.custom_dataset (the class is built in a Python helper as verl builds it; its items' `raw_prompt` are the prompts)"),
    "data.sampler.**" => Implemented("data.sampler (drawn in a Python helper on the main rank; a curriculum sampler's update gets each trained batch)"),
    "data.datagen.**" => Unsupported("loads a Python data generator; verlc reads parquet/JSON prompt files or a data.custom_cls dataset"),

    // trainer
    "trainer.{total_epochs,total_training_steps,test_freq,save_freq,critic_warmup,val_before_train,val_only,default_local_dir,resume_mode,resume_from_path,max_actor_ckpt_to_keep,max_critic_ckpt_to_keep,del_local_ckpt_after_load,rollout_data_dir,project_name,experiment_name}" => Implemented("run"),
    "trainer.logger" => Checked("run.loggers (console, file, tensorboard, wandb, mlflow)"),
    "trainer.{nnodes,n_gpus_per_node}" => Implemented("world"),
    "trainer.device" => Checked("world.device (cpu, cuda; other devices are refused, B017)"),
    "trainer.balance_batch" => NoEffect(NONE, "reorders verl's batch over data-parallel ranks for speed; the update is the same"),
    "trainer.log_val_generations" => NoEffect(NONE, "logs validation generations as tables to wandb-like trackers, which verlc's loggers are not"),
    "trainer.validation_data_dir" => Unsupported("dumps validation generations, which verlc's trainer does not write (rollout_data_dir is supported)"),
    "trainer.{default_hdfs_dir,esi_redundant_time,ray_wait_register_center_timeout,use_legacy_worker_impl,wandb_proxy}" => NoEffect(CLUSTER, RAY),
    "trainer.use_v1" => NoEffect(NONE, "selects verl's Python trainer class (v1 or legacy); verlc's trainer runs its synchronous loop either way"),
    "trainer.v1.trainer_mode" => Checked("run.asynchronous: sync (the synchronous loop); colocate_async and separate_async (the replay-buffer loop with a rollout thread beside each trainer rank, plan::asynchronous)"),
    "trainer.checkpoint_callback_class" => Unsupported("runs a Python class after each checkpoint save; verlc's trainer runs no Python hooks"),
    "trainer.v1.sampler.custom_sampler.{name,path}" => Unsupported("plugs a Python replay buffer into verl's v1 trainer; verlc's trainer draws its own batches"),
    "trainer.v1.sampler.sync_refill_failed_groups" => Unsupported("replaces groups that produced no trajectory with fresh prompts; verlc's trainer does not refill them"),
    "trainer.v1.sampler.{max_off_policy_threshold,max_off_policy_strategy}" => Checked("run.asynchronous (colocate_async: the replay buffer's bound; verl's sync mode does not read them either)"),
    "trainer.v1.sampler.**" => NoEffect(NONE, "feeds a custom sampler's constructor; verlc's replay buffer takes no extra arguments"),
    "trainer.v1.sync" => NoEffect(NONE, "holds the synchronous trainer's settings (none so far)"),
    "trainer.v1.colocate_async.num_warmup_batches" => Implemented("run.asynchronous.warmup_prompts"),
    "trainer.v1.separate_async.{num_warmup_batches,parameter_sync_step}" => Implemented("run.asynchronous (warmup_prompts, parameter_sync_step)"),
    "trainer.v1.separate_async.**" => NoEffect(NONE, "lends idle trainer devices to verl's separate rollout pool; verlc's rollout runs as a thread beside each trainer rank"),
    "ray_kwargs.**" => NoEffect(CLUSTER, RAY),
    "transfer_queue.**" => NoEffect(CLUSTER, RAY),
    "skip.{rollout,rollout_tq,async_rollout}.enable" => Unsupported("replays dumped rollouts; verlc's trainer generates every step"),
    "skip.**" => NoEffect(NONE, "configures verl's rollout replay, which verlc's trainer does not do"),
    "distillation.enabled" => Implemented("spec.distillation (teachers) and actor.update.distillation (the loss term); the section's values are checked by the lowering (plan::distillation)"),
    "distillation.{n_gpus_per_node,nnodes}" => NoEffect(CLUSTER, RAY),
    "distillation.teacher_models.*.inference.**" => NoEffect(ROLLOUT_KNOB, "is a setting of the inference server a verl teacher scores with; verlc runs each teacher forward-only on the trainer's ranks"),
    "distillation.**" => Checked("spec.distillation (plan::distillation checks every field of verl's dataclasses and refuses what the trainer does not run)"),
    "sandbox_fusion.url" => Unsupported("points to a code sandbox; verlc's trainer has no sandbox reward"),
    "sandbox_fusion.**" => NoEffect(NONE, "configures verl's code sandbox, which verlc's trainer does not use"),
    "model_engine" => Implemented("the engine group chosen at composition (its files set the role's strategy)"),

    // actor_rollout_ref.model
    "actor_rollout_ref.model.{path,tokenizer_path}" => Implemented("actor.model_path, tokenizer_path"),
    "actor_rollout_ref.model.{lora_rank,lora_adapter_path,lora_alpha,target_modules,exclude_modules}" => Checked("actor.lora (FSDP strategy; module lists, not regular expressions)"),
    "actor_rollout_ref.model.lora.{rank,adapter_path}" => Unsupported("turns on Megatron LoRA; verlc's LoRA runs with the FSDP keys (lora_rank, lora_alpha, target_modules)"),
    "actor_rollout_ref.model.lora.**" => NoEffect(NONE, LORA_OPT),
    "actor_rollout_ref.model.{external_lib,trust_remote_code,use_fused_kernels,use_liger,use_shm}" => NoEffect(PYTHON, PY),
    "actor_rollout_ref.model.fused_kernel_options.**" => NoEffect(PYTHON, PY),
    "actor_rollout_ref.model.enable_gradient_checkpointing" => Checked(CHECKPOINTING),
    "actor_rollout_ref.model.enable_activation_offload" => NoEffect(NONE, MEMORY),
    "actor_rollout_ref.model.tiled_mlp.**" => NoEffect(NONE, MEMORY),
    "actor_rollout_ref.model.use_remove_padding" => Implemented("engine.remove_padding of actor and reference (FSDP strategy; the Megatron engine warns and computes padded)"),
    "actor_rollout_ref.model.{custom_chat_template,hf_config_path}" => Unsupported("overrides the chat template or model config file; verlc reads both from the model directory"),
    "actor_rollout_ref.model.override_config.moe_config.**" => NoEffect(NONE, "configures mixture-of-experts routers; verlc's models are dense"),
    "actor_rollout_ref.model.override_config.**" => Checked("actor.config_overrides (max_position_embeddings, rope_theta, zero dropouts; other keys are refused)"),

    // Engine sections of actor, reference and critic: FSDP.
    "**.fsdp_config.{param_offload,optimizer_offload,offload_policy}" => Implemented("the role's engine spec (placement, read at run time)"),
    "**.fsdp_config.dtype" => Implemented("binding.precision"),
    "**.fsdp_config.mixed_precision.param_dtype" => Implemented("binding.precision"),
    "**.fsdp_config.mixed_precision.reduce_dtype" => Implemented("engine.reduce_dtype"),
    "**.fsdp_config.mixed_precision.**" => NoEffect(NONE, "sets a dtype the binary derives from the bound precision (buffers stay fp32)"),
    "**.fsdp_config.{reshard_after_forward,fsdp_size}" => Implemented("engine (FSDP)"),
    "actor_rollout_ref.ref.fsdp_config.{seed,model_dtype}" => NoEffect(NONE, "has no effect: the reference policy holds the actor's initial weights in the bound precision"),
    "**.fsdp_config.seed" => Implemented("model_seed / critic.seed"),
    "**.fsdp_config.model_dtype" => Checked("engine.main_dtype (FSDP): fp32 main shards, or bf16 shards and bf16 optimizer state (torch's default AdamW, op by op) under bf16 compute; fp16, bf16 under another compute dtype, or bf16 with LoRA, is refused (B018)"),
    "**.fsdp_config.strategy" => Implemented("the role's strategy"),
    "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size" => NoEffect(NONE, "has no effect: the reference policy reads the actor's rows with the actor's Ulysses degree"),
    "**.fsdp_config.ulysses_sequence_parallel_size" => Implemented("engine.ulysses (FSDP)"),
    "**.fsdp_config.use_remove_padding" => NoEffect(NONE, "is filled in by verl's workers from the model's use_remove_padding, which verlc reads instead"),
    "**.fsdp_config.use_torch_compile" => NoEffect(PYTHON, PY),
    "**.fsdp_config.{use_orig_params,forward_prefetch,forward_only,full_determinism}" => NoEffect(NONE, "is an FSDP wrapping detail; the binary's engine shards per decoder layer and is deterministic"),
    "**.fsdp_config.wrap_policy.**" => NoEffect(NONE, "is an FSDP wrapping detail; the binary's engine shards per decoder layer"),
    "**.fsdp_config.{entropy_checkpointing,entropy_from_logits_with_chunking}" => NoEffect(NONE, MEMORY),

    // Engine sections: VeOmni (`model_engine=veomni`), run as the FSDP role it equals
    // (`crate::veomni`; refusals in `plan::veomni`).
    "**.veomni.{param_offload,optimizer_offload,enable_fsdp_offload,fsdp_size,ulysses_parallel_size,mixed_precision,seed,full_determinism,forward_only,entropy_from_logits_with_chunking,entropy_checkpointing,strategy}" => Implemented("the role's FSDP engine spec (crate::veomni: fsdp_size counts data-parallel ranks and shards over their Ulysses ranks too; mixed_precision false trains bf16 shards, bf16 optimizer state and bf16 reductions)"),
    "**.veomni.{expert_parallel_size,attn_implementation,qat_implementation}" => Checked("expert_parallel_size 1, an exact attention, qat_implementation none (plan::veomni refuses the others, B018)"),
    "**.veomni.{moe_implementation,cross_entropy_loss_implementation,rms_norm_implementation,swiglu_mlp_implementation,rotary_pos_emb_implementation,rms_norm_gated_implementation,causal_conv1d_implementation,chunk_gated_delta_rule_implementation,load_balancing_loss_implementation,dsa_indexer_implementation,dsa_attention_implementation,mhc_implementation}" => NoEffect(NONE, "selects a VeOmni kernel; verlc's models compute the same numbers"),
    "**.veomni.use_torch_compile" => NoEffect(PYTHON, PY),
    "**.veomni.{init_device,forward_prefetch,basic_modules,activation_gpu_limit,enable_reentrant,enable_full_shard,enable_async_activation_offload,activation_offload_modules,activation_offload_host_cache_limit_gb}" => NoEffect(NONE, "is a VeOmni memory or wrapping detail (enable_full_shard is not read by its FSDP2 path: it always shards fully); the numbers are the same"),
    "**.veomni.{ckpt_manager,load_checkpoint_path,force_use_huggingface}" => NoEffect(NONE, "is not read by verl's VeOmni engine"),
    "**.optim.lr_min" => Implemented("optim's min_lr_ratio = lr_min / lr (VeOmni's cosine schedule, crate::veomni)"),
    "**.optim.{lr_start,lr_decay_ratio}" => Checked("VeOmni's defaults only, 0 and 1.0 (plan::veomni refuses others, B018)"),

    // Engine sections: Megatron.
    "**.megatron.{tensor_model_parallel_size,pipeline_model_parallel_size,sequence_parallel,use_distributed_optimizer}" => Implemented("engine (Megatron)"),
    "**.megatron.context_parallel_size" => Implemented("engine.context_parallel (Megatron): sequences split in load-balanced chunks, keys and values all-gathered, a Gated DeltaNet layer's input gathered into whole sequences, experts exchanged over expert-parallel groups that span context ranks; refused with another rollout TP (B018)"),
    "**.megatron.virtual_pipeline_model_parallel_size" => Checked("engine (Megatron): 1 or null only"),
    "**.megatron.{expert_model_parallel_size,expert_tensor_parallel_size}" => Checked("a dense model: nothing (a B006 warning); a mixture-of-experts model: each expert split over tensor parallelism (expert TP = TP) or whole (expert TP 1: each tensor rank routes its share of the tokens), the experts over expert-parallel ranks (engine.expert_parallel; with whole experts over the tensor x data-parallel ranks); context parallelism folded into the expert grid as Megatron does; another expert TP, expert parallelism that does not divide its ranks, or split experts under expert parallelism with another rollout TP, are refused at build (B018); V206 against the model's experts"),
    "**.megatron.{param_offload,grad_offload,optimizer_offload}" => Implemented("the role's engine spec (placement, read at run time)"),
    "**.megatron.dtype" => Implemented("binding.precision"),
    "actor_rollout_ref.ref.megatron.seed" => NoEffect(NONE, "has no effect: the reference policy holds the actor's initial weights"),
    "**.megatron.seed" => Implemented("model_seed / critic.seed"),
    "**.megatron.use_dist_checkpointing" => Unsupported("loads a Megatron distributed checkpoint; verlc loads Hugging Face weights"),
    "**.megatron.{dist_checkpointing_path,dist_checkpointing_prefix}" => NoEffect(NONE, "belongs to Megatron dist checkpointing (use_dist_checkpointing is refused)"),
    "**.megatron.{use_mbridge,vanilla_mbridge}" => NoEffect(NONE, "selects verl's weight converter; the binary reads Hugging Face weights directly"),
    "**.megatron.{use_remove_padding,forward_only}" => NoEffect(NONE, "changes how verl feeds Megatron; the binary computes the same numbers"),
    "**.megatron.override_transformer_config.{recompute_granularity,recompute_method,recompute_modules,recompute_num_layers}" => NoEffect(NONE, MEMORY),
    "**.megatron.override_transformer_config.{attention_backend,use_flash_attn}" => NoEffect(NONE, "selects a fused attention kernel; the binary's attention computes the same numbers"),
    "**.megatron.override_transformer_config.use_naive_l2norm" => NoEffect(NONE, "selects the Gated DeltaNet's L2-norm kernel; the binary's computes the same numbers"),
    "**.megatron.override_transformer_config.{sequence_parallel,context_parallel_algo,use_distributed_optimizer}" => NoEffect(NONE, "chooses how Megatron-core spreads activations and optimizer state over the ranks (sequence parallelism within tensor parallelism, the context-parallel exchange, the distributed optimizer); the binary computes the same numbers"),
    "**.megatron.override_transformer_config.{gradient_accumulation_fusion,apply_rope_fusion,bias_activation_fusion,masked_softmax_fusion,bias_dropout_fusion,persist_layer_norm,deallocate_pipeline_outputs,cross_entropy_loss_fusion,use_fused_rmsnorm,use_fused_swiglu}" => NoEffect(NONE, "selects a fused Megatron-core kernel or buffer policy; the binary computes the same numbers without it"),
    "**.megatron.override_transformer_config.{num_layers_in_first_pipeline_stage,num_layers_in_last_pipeline_stage,account_for_embedding_in_pipeline_split,account_for_loss_in_pipeline_split}" => NoEffect(NONE, "places layers on pipeline stages; verlc's Megatron engine splits decoder layers evenly (same numbers, other memory per stage)"),
    "**.megatron.override_transformer_config.{moe_permute_fusion,moe_token_dispatcher_type,moe_enable_deepep,moe_grouped_gemm,moe_shared_expert_overlap,moe_router_fusion}" => NoEffect(NONE, "selects a mixture-of-experts kernel or token dispatcher; the binary's grouped experts and all-to-all exchange compute the same numbers"),
    "**.megatron.override_transformer_config.{moe_router_load_balancing_type,moe_aux_loss_coeff,moe_z_loss_coeff,moe_router_dtype,moe_router_enable_expert_bias,moe_router_bias_update_rate}" => Checked("the engine's router spec: load-balancing loss (aux_loss), z-loss, fp32 router; other types and an updated expert bias are refused (B018)"),
    "**.optim.override_optimizer_config.overlap_cpu_optimizer_d2h_h2d" => NoEffect(NONE, "overlaps host copies of an offloaded optimizer; the binary computes the same update"),
    "**.megatron.{override_transformer_config,override_ddp_config,override_mcore_model_config}.**" => Unsupported("overrides Megatron-core's configs, which verlc's Megatron engine does not read"),

    // Engine settings verl 0.7.1 to 0.9.1 added.
    "**.{torchtitan,mindspeed}.**" => NoEffect(NONE, "configures verl's TorchTitan or MindSpeed engine, which only that engine's strategy reads; verlc refuses those strategies by name"),
    "**.optim.{name,eps,decay_type,min_lr_factor}" => NoEffect(NONE, "belongs to the TorchTitan engine's optimizer (its strategy is refused); verlc's AdamW keeps torch's eps of 1e-8"),
    "**.veomni.moe_load_balance_monitor_interval" => NoEffect(NONE, "logs VeOmni's expert load balance; the numbers are the same"),
    "**.qat.enable" => Unsupported("turns on quantization-aware training (fake-quantized weights in the forward pass); verlc's engines train in the bound precision"),
    "**.qat.**" => NoEffect(NONE, "belongs to quantization-aware training (qat.enable is refused)"),
    "**.mtp.enable" => Unsupported("adds multi-token-prediction layers (trained with their own loss, drafting for speculative decoding); verlc's models have none"),
    "**.mtp.**" => NoEffect(NONE, "belongs to multi-token prediction (mtp.enable is refused)"),
    "**.{pad_to_length,pad_to_length_bucket,pad_bshd_to_minibatch_max}" => NoEffect(NONE, "pads micro-batches to fixed shapes for verl's kernels; masked padding does not change the numbers"),
    "**.entropy_from_logits_chunk_size" => NoEffect(NONE, MEMORY),
    "**.fsdp_config.use_no_sync_for_gradient_accumulation" => NoEffect(NONE, "defers FSDP's gradient reduction to the last micro-batch; the accumulated gradient is the same"),
    "**.fsdp_config.turbo_config.**" => NoEffect(NONE, "configures verl's fsdp_turbo engine, which only `strategy: fsdp_turbo` reads; verlc does not run that engine"),
    "**.megatron.dynamic_context_parallel" => Unsupported("picks a context-parallel degree per micro-batch; verlc's Megatron engine keeps context_parallel_size"),
    "**.megatron.max_seqlen_per_dp_cp_rank" => NoEffect(NONE, "belongs to dynamic context parallelism (dynamic_context_parallel is refused)"),
    "**.megatron.use_megatron_fsdp" => Unsupported("shards parameters with Megatron-FSDP; verlc's Megatron engine shards only the optimizer state"),
    "**.megatron.{dist_ckpt_optim_fully_reshardable,distrib_optim_fully_reshardable_mem_efficient}" => NoEffect(NONE, "shapes Megatron's distributed optimizer checkpoints; verlc writes its own checkpoint format"),
    "**.checkpoint.mbridge_config.**" => NoEffect(NONE, "configures verl's mbridge weight converter; verlc saves Hugging Face weights itself"),
    "**.checkpoint.strict" => NoEffect(NONE, "validates verl's weight export; verlc exports every tensor by name and shape"),
    "**.optim.{exp_avg_dtype,exp_avg_sq_dtype,main_grads_dtype}" => Unsupported("keeps optimizer moments or main gradients in a lower precision; verlc keeps them in fp32"),
    "**.optim.use_precision_aware_optimizer" => NoEffect(NONE, "selects Megatron's precision-aware optimizer, which with fp32 state computes what verlc's fp32 optimizer state computes"),
    "**.optim.muon_*" => NoEffect(NONE, "configures the Muon optimizer (optimizer muon is refused)"),
    "**.optim.use_layer_wise_distributed_optimizer" => NoEffect(NONE, "shards the optimizer state layer by layer; the update is the same"),

    // Optimizers.
    "**.optim.{lr,betas,weight_decay,clip_grad,grad_clip,lr_warmup_steps,lr_warmup_steps_ratio,lr_scheduler_type,warmup_style,min_lr_ratio,num_cycles,zero_indexed_step,lr_warmup_init,min_lr,lr_decay_steps}" => Implemented("optim"),
    "**.optim.{optimizer,optimizer_impl,lr_decay_style}" => Checked("optim (AdamW, SGD; constant, linear, cosine, inverse-square-root)"),
    "**.optim.{lr_wsd_decay_steps,lr_wsd_decay_style}" => NoEffect(NONE, "belongs to the WSD schedule (lr_decay_style WSD is refused)"),
    "**.optim.total_training_steps" => NoEffect(NONE, "is overwritten with the run's step count, by verl and by verlc"),
    "**.optim.use_checkpoint_opt_param_scheduler" => NoEffect(NONE, "has no effect: verlc always restores the scheduler from the checkpoint"),
    "**.optim.weight_decay_incr_style" => Implemented("optim schedule (Megatron's weight-decay increment; verl starts and ends it at weight_decay, so the decay is the same for every style)"),
    "**.optim.override_optimizer_config.{optimizer_cpu_offload,optimizer_offload_fraction}" => Implemented("optim.offload_fraction (Megatron's hybrid CPU optimizer)"),
    "**.optim.override_optimizer_config.{use_precision_aware_optimizer,main_grads_dtype,main_params_dtype,exp_avg_dtype,exp_avg_sq_dtype}" => Checked("the precision-aware optimizer with fp32 state: the numbers verlc's fp32 optimizer state gives"),
    "**.optim.override_optimizer_config.**" => Checked("refused except Megatron's hybrid CPU offload and fp32 precision-aware options"),

    // Roles: what they share.
    "**.checkpoint.{save_contents,load_contents,async_save}" => NoEffect(NONE, "has no effect: verlc always saves and loads model, optimizer and trainer state, synchronously"),
    "**.{use_torch_compile,use_fused_kernels}" => NoEffect(PYTHON, PY),
    "**.{entropy_checkpointing,entropy_from_logits_with_chunking}" => NoEffect(NONE, MEMORY),
    "actor_rollout_ref.ref.ulysses_sequence_parallel_size" => NoEffect(NONE, "has no effect: the reference policy reads the actor's rows with the actor's Ulysses degree"),
    "reward_model.ulysses_sequence_parallel_size" => NoEffect(NONE, RM),
    "**.ulysses_sequence_parallel_size" => Implemented("engine.ulysses (FSDP; the legacy workers' role-level key)"),
    "**.load_weight" => Unsupported("skips loading the model's weights; verlc always loads them"),
    "**.router_replay.mode" => Unsupported("replays the rollout's expert choices in training; verlc's trainer routes every forward pass itself"),
    "**.router_replay.**" => NoEffect(NONE, "belongs to MoE router replay (router_replay.mode is refused)"),
    "**.use_remove_padding" => Implemented("engine.remove_padding (FSDP strategy)"),
    "**.{strategy,rollout_n}" => Implemented("binding.strategy / per-rank batch arithmetic"),

    // actor
    "actor_rollout_ref.actor.{ppo_mini_batch_size,ppo_micro_batch_size,ppo_micro_batch_size_per_gpu,use_dynamic_bsz,ppo_max_token_len_per_gpu,ppo_epochs,shuffle,data_loader_seed}" => Implemented("actor.update (per-rank batch arithmetic)"),
    "actor_rollout_ref.actor.{clip_ratio,clip_ratio_low,clip_ratio_high,clip_ratio_c,tau_pos,tau_neg,loss_agg_mode,entropy_coeff,calculate_entropy,calculate_sum_pi_squared,use_kl_loss,kl_loss_coef,kl_loss_type}" => Implemented("actor.update"),
    "actor_rollout_ref.actor.policy_loss.loss_mode" => Checked("actor.update.loss_mode (bypass_mode is refused)"),
    "actor_rollout_ref.actor.policy_loss.*" => Implemented("actor.update.policy_loss"),
    "actor_rollout_ref.actor.loss_scale_factor" => Implemented("actor.loss_scale_factor"),
    "actor_rollout_ref.actor.grad_clip" => Implemented("actor.optim.clip_grad"),
    "actor_rollout_ref.actor.sum_pi_squared_checkpointing" => NoEffect(NONE, MEMORY),
    "actor_rollout_ref.actor.use_prefix_grouper" => NoEffect(NONE, "computes a group's shared prompt once in verl's forward pass; the numbers are the same"),
    "actor_rollout_ref.actor.freeze_vision_tower" => Implemented("actor.optim.freeze_vision_tower (a vision-language model's tower keeps its loaded weights)"),

    // reference
    "actor_rollout_ref.ref.{log_prob_micro_batch_size,log_prob_micro_batch_size_per_gpu,log_prob_use_dynamic_bsz,log_prob_max_token_len_per_gpu}" => Implemented("reference.micro_batch"),
    "actor_rollout_ref.ref.model.path" => Implemented("reference.model_path"),
    "actor_rollout_ref.ref.model.override_config.**" => NoEffect(NONE, "has no effect: verl's reference worker reads only `ref.model.path` and builds with actor_rollout_ref.model's override_config, as verlc does"),

    // rollout
    "actor_rollout_ref.rollout.{n,temperature,top_k,top_p,do_sample,response_length,ignore_eos}" => Implemented("rollout.train"),
    "actor_rollout_ref.rollout.val_kwargs.*" => Implemented("rollout.val"),
    "actor_rollout_ref.rollout.{log_prob_micro_batch_size,log_prob_micro_batch_size_per_gpu,log_prob_use_dynamic_bsz,log_prob_max_token_len_per_gpu}" => Implemented("actor.update.log_prob_micro_batch_size"),
    "actor_rollout_ref.rollout.{dtype,calculate_log_probs}" => Implemented("rollout"),
    "actor_rollout_ref.rollout.name" => Checked("rollout.vllm (`vllm` runs vLLM's server, `verlc` the built-in engine; `sglang`/`trtllm`/`hf` get the built-in engine, B002)"),
    "actor_rollout_ref.rollout.multi_turn.{enable,max_assistant_turns,max_user_turns,max_parallel_calls,max_tool_response_length,tool_response_truncate_side,tool_config_path,function_tool_path}" => Implemented("rollout.multi_turn (the tool agent loop)"),
    "actor_rollout_ref.rollout.multi_turn.format" => Implemented("rollout.multi_turn (hermes, qwen3_coder)"),
    "actor_rollout_ref.rollout.multi_turn.interaction_config_path" => Implemented("rollout.multi_turn (verl 0.7 interactions, in the tool host)"),
    "actor_rollout_ref.rollout.multi_turn.{use_inference_chat_template,tokenization_sanity_check_mode,num_repeat_rollouts}" => NoEffect(NONE, "is read by no code path of verl 0.7 or 0.9 either (only by `AsyncRolloutRequest` in verl/workers/rollout/schemas.py, which nothing constructs): turns are appended as tokens and never re-tokenised"),
    "actor_rollout_ref.rollout.agent.default_agent_loop" => Checked("rollout.multi_turn.default_agent_loop (single_turn_agent, tool_agent)"),
    "actor_rollout_ref.rollout.agent.agent_loop_config_path" => Implemented("rollout.multi_turn.agent_loop_config_path (the file's agent loops run in Python, verlc's rollout serving their generation)"),
    "actor_rollout_ref.rollout.agent.num_workers" => NoEffect(NONE, "sizes verl's agent-loop worker pool; verlc's loop advances every trajectory of a rank's batch together and runs each round's tool calls concurrently"),
    "actor_rollout_ref.rollout.quantization" => Unsupported("quantizes the rollout's weights (FP8); verlc's rollout generates with the trainer's weights in the rollout dtype"),
    "actor_rollout_ref.rollout.over_sample_rate" => NoEffect(NONE, "is a field of verl's rollout config that no code of verl 0.7.0 to 0.9.1 reads (its SGLang engine's early stop went with the synchronous rollout); verl finishes every response, as verlc does"),
    "actor_rollout_ref.rollout.{nnodes,n_gpus_per_node}" => Checked("run.asynchronous.rollout_processes (separate_async's built-in rollout pool: one replica process per trainer rank; with vLLM, B006: its server is the pool; the other modes have no separate pool, in verl either)"),
    "actor_rollout_ref.rollout.**" => NoEffect(ROLLOUT_KNOB, VLLM),

    // critic
    "critic.enable" => Implemented("critic (present or not)"),
    "critic.{ppo_mini_batch_size,ppo_micro_batch_size,ppo_micro_batch_size_per_gpu,use_dynamic_bsz,ppo_max_token_len_per_gpu,forward_micro_batch_size,forward_micro_batch_size_per_gpu,forward_max_token_len_per_gpu,ppo_epochs,shuffle,data_loader_seed,cliprange_value,loss_agg_mode}" => Implemented("critic.update"),
    "critic.grad_clip" => Implemented("critic.optim.clip_grad"),
    "critic.loss_scale_factor" => Implemented("critic.update.loss_scale_factor"),
    "critic.model.path" => Implemented("critic.model_path"),
    "critic.model.tokenizer_path" => Checked("the actor's tokenizer (another one is refused)"),
    "critic.model.{lora_rank,lora_adapter_path}" => Unsupported("turns on LoRA; verlc's trainer trains full weights"),
    "critic.model.lora.{rank,adapter_path}" => Unsupported("turns on LoRA; verlc's trainer trains full weights"),
    "critic.model.{lora_alpha,target_modules,exclude_modules}" => NoEffect(NONE, CRITIC_LORA_OPT),
    "critic.model.lora.**" => NoEffect(NONE, CRITIC_LORA_OPT),
    "critic.model.{external_lib,trust_remote_code,use_shm,use_liger,use_fused_kernels}" => NoEffect(PYTHON, PY),
    "critic.model.fused_kernel_options.**" => NoEffect(PYTHON, PY),
    "critic.model.{custom_chat_template,hf_config_path}" => Unsupported("overrides the chat template or model config file; verlc reads both from the model directory"),
    "critic.model.enable_gradient_checkpointing" => Checked(CHECKPOINTING),
    "critic.model.enable_activation_offload" => NoEffect(NONE, MEMORY),
    "critic.model.tiled_mlp.**" => NoEffect(NONE, MEMORY),
    "critic.model.override_config.**" => Unsupported("overrides fields of the model's config.json, which verlc's model loader does not apply"),
    "{critic,actor_rollout_ref}.nccl_timeout" => NoEffect(CLUSTER, RAY),
    "actor_rollout_ref.hybrid_engine" => Implemented("the rollout binds the actor's weights while it generates (hybrid engine)"),
}

/// Keys whose value states what a verlc trainer does anyway: no report for that value even
/// when it differs from verl's default (one rollout rank per training rank).
pub const ALREADY_SO: &[(&str, &str)] = &[
    ("actor_rollout_ref.rollout.tensor_model_parallel_size", "1"),
    (
        "actor_rollout_ref.rollout.pipeline_model_parallel_size",
        "1",
    ),
    ("actor_rollout_ref.rollout.data_parallel_size", "1"),
    ("actor_rollout_ref.rollout.expert_parallel_size", "1"),
    // No worker processes: data loads in the main process, as the binary loads it (and as
    // V048 asks of a config with a sampler class).
    ("data.dataloader_num_workers", "0"),
];

/// Sections verl moved between releases, as (newer prefix, prefix of the entries that serve it):
/// 0.8+ keeps the critic's FSDP engine at `critic.fsdp`, 0.7.0 at `critic.model.fsdp_config`.
const MOVED: &[(&str, &str)] = &[("critic.fsdp.", "critic.model.fsdp_config.")];

/// The first entry matching the dotted `key`.
pub fn verdict(key: &str) -> Option<&'static Entry> {
    let moved = MOVED
        .iter()
        .find_map(|(new, old)| key.strip_prefix(new).map(|rest| format!("{old}{rest}")));
    let key = moved.as_deref().unwrap_or(key);
    let segs: Vec<&str> = key.split('.').collect();
    TABLE
        .iter()
        .find(|e| matches(&e.pattern.split('.').collect::<Vec<_>>(), &segs))
}

fn matches(pattern: &[&str], key: &[&str]) -> bool {
    match pattern.split_first() {
        None => key.is_empty(),
        Some((&"**", rest)) => (0..=key.len()).any(|i| matches(rest, &key[i..])),
        Some((p, rest)) => match key.split_first() {
            Some((k, krest)) => segment(p, k) && matches(rest, krest),
            None => false,
        },
    }
}

fn segment(pattern: &str, key: &str) -> bool {
    if let Some(prefix) = pattern.strip_suffix('*') {
        return key.starts_with(prefix);
    }
    match pattern.strip_prefix('{').and_then(|p| p.strip_suffix('}')) {
        Some(alts) => alts.split(',').any(|a| a == key),
        None => pattern == key,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_moved_section_has_the_verdicts_of_its_old_place() {
        for leaf in [
            "param_offload",
            "model_dtype",
            "mixed_precision.param_dtype",
            "wrap_policy.x",
        ] {
            let new = verdict(&format!("critic.fsdp.{leaf}")).map(|e| e.pattern);
            let old = verdict(&format!("critic.model.fsdp_config.{leaf}")).map(|e| e.pattern);
            assert!(new.is_some() && new == old, "{leaf}: {new:?} vs {old:?}");
        }
    }

    #[test]
    fn patterns() {
        let m = |p: &str, k: &str| {
            matches(
                &p.split('.').collect::<Vec<_>>(),
                &k.split('.').collect::<Vec<_>>(),
            )
        };
        assert!(m("**._target_", "_target_"));
        assert!(m("**._target_", "a.b._target_"));
        assert!(!m("**._target_", "a.b"));
        assert!(m("a.{b,c}.d", "a.c.d"));
        assert!(!m("a.{b,c}.d", "a.e.d"));
        assert!(m("a.**", "a"));
        assert!(m("a.**", "a.b.c"));
        assert!(m("a.*", "a.b"));
        assert!(m("a.moe_*", "a.moe_router_dtype"));
        assert!(!m("a.moe_*", "a.dropout"));
        assert!(!m("a.*", "a.b.c"));
    }
}
