//! The numbers people get wrong, derived from a checked config: batch arithmetic per role
//! (responses per step, per-rank mini and micro batches, gradient accumulation, optimizer
//! steps) and a per-rank memory estimate for the actor under its strategy, precision and
//! offload settings.
//!
//! Batch semantics follow verl (docs/check.md): `ppo_mini_batch_size` counts
//! prompts globally and is multiplied by `rollout.n`; `*_micro_batch_size_per_gpu` counts
//! responses per rank. Memory is an estimate: mixed-precision FSDP keeps sharded params,
//! grads and two AdamW moments in fp32 (in bf16 with `model_dtype: bf16`); Megatron keeps bf16 params and fp32 main
//! grads per model-parallel shard, and the distributed optimizer shards fp32 main params and
//! moments over data-parallel ranks too. Activations use the per-layer estimate of
//! Korthikanti et al. (34·s·b·h bytes with flash attention), 2·s·b·h per layer under full
//! recompute, plus fp32 logits.

use serde::Serialize;

use crate::config::{MegatronEngineConfig, Strategy, VerlConfig};
use crate::plan::Dtype;
use crate::role::{MiniBatch, Role};
use crate::rules::ModelDims;

#[derive(Debug, Clone, Serialize)]
pub struct Explanation {
    pub world_size: i64,
    pub responses_per_step: i64,
    pub tokens_per_step_max: i64,
    pub actor: RoleBatch,
    pub critic: Option<RoleBatch>,
    pub training_steps: Option<i64>,
    pub optimizer_steps_total: Option<i64>,
    /// The actor's memory per rank.
    pub memory: Option<MemoryEstimate>,
    /// The critic's, when it runs (the actor's model dimensions with a value head).
    pub critic_memory: Option<MemoryEstimate>,
    pub notes: Vec<String>,
}

/// Batch arithmetic of one trained role (actor or critic).
#[derive(Debug, Clone, Serialize)]
pub struct RoleBatch {
    pub role: &'static str,
    pub strategy: String,
    /// Data-parallel ranks the batch is split over.
    pub dp_size: i64,
    /// Global mini-batch in responses (ppo_mini_batch_size × n).
    pub mini_batch_responses: i64,
    pub mini_batch_per_rank: f64,
    /// Responses per micro-batch per rank (None under dynamic batch size).
    pub micro_batch_per_rank: Option<i64>,
    pub grad_accum_steps: Option<f64>,
    /// Token budget of one micro-batch under dynamic batch size.
    pub dynamic_token_budget: Option<i64>,
    pub mini_batches_per_epoch: f64,
    pub ppo_epochs: i64,
    pub optimizer_steps_per_iteration: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct MemoryEstimate {
    pub params: u64,
    /// Parameters one token runs through, when the model has experts (total minus the
    /// experts it is not routed to).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub active_params: Option<u64>,
    pub device: MemoryBreakdown,
    pub host: MemoryBreakdown,
    pub assumptions: Vec<String>,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct MemoryBreakdown {
    pub params_bytes: u64,
    pub grads_bytes: u64,
    pub optimizer_bytes: u64,
    pub activations_bytes: u64,
    pub reference_bytes: u64,
}

impl MemoryBreakdown {
    pub fn total(&self) -> u64 {
        self.params_bytes
            + self.grads_bytes
            + self.optimizer_bytes
            + self.activations_bytes
            + self.reference_bytes
    }
}

pub use crate::rules::Overflow;
use crate::rules::arithmetic_fits;

/// The derived numbers of `cfg` (and, with `model`, its memory estimate); an error when
/// values that passed the schema are too large to compute with.
pub fn explain(cfg: &VerlConfig, model: Option<&ModelDims>) -> Result<Explanation, Overflow> {
    arithmetic_fits(cfg, model)?;
    let world = (cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node).max(1);
    let n = cfg.actor_rollout_ref.rollout.n.max(1);
    let responses = cfg.data.train_batch_size * n;
    let seq = cfg.data.max_prompt_length + cfg.data.max_response_length;
    let [actor_role, reference_role, critic_role] = Role::all(cfg);
    let actor = trained_batch(cfg, &actor_role, &MiniBatch::actor(cfg), world);
    let critic = critic_role
        .runs
        .then(|| trained_batch(cfg, &critic_role, &MiniBatch::critic(cfg), world));
    let training_steps = cfg.trainer.total_training_steps.filter(|s| *s > 0);
    let optimizer_steps_total =
        training_steps.map(|s| (s as f64 * actor.optimizer_steps_per_iteration).round() as i64);
    let mut notes = Vec::new();
    if training_steps.is_none() {
        notes.push(format!(
            "training steps = total_epochs ({}) × ⌊dataset size / train_batch_size ({})⌋; set trainer.total_training_steps to fix it",
            cfg.trainer.total_epochs, cfg.data.train_batch_size
        ));
    }
    let memory = model.map(|m| {
        let role = RoleMemory {
            role: &actor_role,
            batch: &actor,
            outputs: m.vocab_size,
        };
        role_memory(cfg, m, &role, &reference_role, seq)
    });
    let critic_memory = model.zip(critic.as_ref()).map(|(m, batch)| {
        let role = RoleMemory {
            role: &critic_role,
            batch,
            outputs: 1,
        };
        role_memory(cfg, m, &role, &reference_role, seq)
    });
    if model.is_none() {
        notes.push("no model config.json found: pass --model-config PATH (or --hidden-size/--num-layers/…) for a memory estimate".into());
    }
    Ok(Explanation {
        world_size: world,
        responses_per_step: responses,
        tokens_per_step_max: responses * seq,
        actor,
        critic,
        training_steps,
        optimizer_steps_total,
        memory,
        critic_memory,
        notes,
    })
}

/// A trained role whose estimated memory per GPU exceeds the device's.
#[derive(Debug, Clone, Serialize)]
pub struct DeviceShortfall {
    /// `actor` or `critic`.
    pub role: &'static str,
    /// The estimate per rank on the device (bytes) and what the device has.
    pub need: u64,
    pub have: u64,
    /// What the estimate is made of, in words (`params 14.2 GiB, ...`).
    pub parts: String,
    /// Overrides that lower the role's memory per GPU, the likeliest first.
    pub keys: Vec<String>,
}

impl std::fmt::Display for DeviceShortfall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "the {} needs about {:.1} GiB per GPU ({}; `verlc explain` shows the estimate), and the GPU has {:.1} GiB: to fit, {}",
            self.role,
            gib(self.need),
            self.parts,
            gib(self.have),
            self.keys.join(", or ")
        )
    }
}

/// The first trained role (actor, then critic) whose per-rank device estimate in `e` is more
/// than a GPU of `device_bytes` holds, with the keys of `cfg` that would lower it: offloading
/// what the role keeps on the GPU, more ranks to shard over (FSDP) or more model parallelism
/// (Megatron), activation checkpointing and smaller micro-batches where activations weigh,
/// LoRA. `None` when every role fits (or `e` has no memory estimate).
pub fn device_shortfall(
    cfg: &VerlConfig,
    e: &Explanation,
    device_bytes: u64,
) -> Option<DeviceShortfall> {
    let [actor, _, critic] = Role::all(cfg);
    [
        (&actor, e.memory.as_ref()),
        (&critic, e.critic_memory.as_ref()),
    ]
    .into_iter()
    .find_map(|(role, m)| {
        let m = m?;
        let need = m.device.total();
        (need > device_bytes).then(|| DeviceShortfall {
            role: role.name,
            need,
            have: device_bytes,
            parts: breakdown_words(&m.device),
            keys: fitting_keys(cfg, role, &m.device),
        })
    })
}

fn breakdown_words(b: &MemoryBreakdown) -> String {
    [
        ("params", b.params_bytes),
        ("grads", b.grads_bytes),
        ("optimizer", b.optimizer_bytes),
        ("activations", b.activations_bytes),
        ("reference", b.reference_bytes),
    ]
    .iter()
    .filter(|(_, v)| *v > 0)
    .map(|(k, v)| format!("{k} {:.1} GiB", gib(*v)))
    .collect::<Vec<_>>()
    .join(", ")
}

/// Overrides that lower `role`'s device memory `d`, as `key=value`.
fn fitting_keys(cfg: &VerlConfig, role: &Role, d: &MemoryBreakdown) -> Vec<String> {
    let engine = role.engine_key();
    let mut keys = Vec::new();
    let world = cfg.trainer.nnodes * cfg.trainer.n_gpus_per_node;
    if role.is_fsdp() {
        if d.optimizer_bytes > 0 {
            keys.push(format!("{engine}.optimizer_offload=True"));
        }
        if d.params_bytes > 0 {
            keys.push(format!("{engine}.param_offload=True"));
        }
        keys.push(format!(
            "more GPUs to shard over (trainer.n_gpus_per_node / trainer.nnodes; now {world})"
        ));
    } else {
        let tp = role
            .megatron
            .map_or(1, |m| m.tensor_model_parallel_size.max(1));
        keys.push(format!(
            "{engine}.tensor_model_parallel_size={} (or pipeline_model_parallel_size)",
            tp * 2
        ));
        for (bytes, name) in [
            (d.optimizer_bytes, "optimizer_offload"),
            (d.params_bytes, "param_offload"),
            (d.grads_bytes, "grad_offload"),
        ] {
            if bytes > 0 {
                keys.push(format!("{engine}.{name}=True"));
            }
        }
    }
    // Activations that weigh: recompute them, or run smaller micro-batches.
    if d.activations_bytes * 4 > d.total() {
        let (on, key) = role.gradient_checkpointing;
        if !on && !key.is_empty() {
            keys.push(format!("{key}=True"));
        }
        keys.push(format!(
            "a smaller {}.ppo_micro_batch_size_per_gpu (or use_dynamic_bsz with a lower token budget)",
            role.prefix
        ));
    }
    if role.name == "actor" && cfg.actor_rollout_ref.model.lora_rank == 0 {
        keys.push("actor_rollout_ref.model.lora_rank=64 (adapters only)".into());
    }
    keys
}

/// A trained role's batch arithmetic. Data parallel is the world over the role's
/// model-parallel ranks (Ulysses under FSDP, tensor × pipeline × context under Megatron),
/// rounded down where a rule reports an inexact split.
fn trained_batch(cfg: &VerlConfig, role: &Role, batch: &MiniBatch, world: i64) -> RoleBatch {
    let dp = world / role.model_parallel().unwrap_or(1).max(1);
    let sp = if role.is_fsdp() { role.sp.max(1) } else { 1 };
    let micro = batch
        .micro_per_gpu
        .or(batch.micro_global.map(|m| m / dp.max(1)));
    role_batch(
        role.name,
        crate::config::common::spelling(&role.strategy),
        dp,
        sp,
        batch.n.max(1),
        cfg.data.train_batch_size,
        batch.mini,
        micro,
        batch.dynamic,
        batch.max_tokens,
        batch.epochs,
    )
}

#[allow(clippy::too_many_arguments)]
fn role_batch(
    role: &'static str,
    strategy: String,
    dp: i64,
    sp: i64,
    n: i64,
    train_bs: i64,
    mini: i64,
    micro: Option<i64>,
    dynamic: bool,
    max_tokens: i64,
    epochs: i64,
) -> RoleBatch {
    let dp = dp.max(1);
    let mini_responses = mini * n;
    let per_rank = mini_responses as f64 / dp as f64;
    let micro = if dynamic { None } else { micro };
    let grad_accum = micro.filter(|m| *m > 0).map(|m| per_rank / m as f64);
    let mini_batches = if mini > 0 {
        train_bs as f64 / mini as f64
    } else {
        0.0
    };
    RoleBatch {
        role,
        strategy,
        dp_size: dp,
        mini_batch_responses: mini_responses,
        mini_batch_per_rank: per_rank,
        micro_batch_per_rank: micro,
        grad_accum_steps: grad_accum,
        dynamic_token_budget: dynamic.then_some(max_tokens * sp),
        mini_batches_per_epoch: mini_batches,
        ppo_epochs: epochs,
        optimizer_steps_per_iteration: epochs as f64 * mini_batches,
    }
}

const GIB: f64 = (1u64 << 30) as f64;

pub fn gib(bytes: u64) -> f64 {
    bytes as f64 / GIB
}

/// What one trained role's memory depends on: the role (its layout, checkpointing and
/// placement: lowering's reading, FSDP2's `offload_policy` included), its batch, and the
/// width of its output layer (the vocabulary for the actor, 1 for the critic's value head).
struct RoleMemory<'a> {
    role: &'a Role<'a>,
    batch: &'a RoleBatch,
    outputs: u64,
}

/// Whether Megatron recomputes whole layers (`recompute_granularity: full`); verl's default
/// (null) recomputes nothing.
fn megatron_recompute(m: Option<&MegatronEngineConfig>) -> bool {
    m.and_then(|m| m.override_transformer_config.get("recompute_granularity"))
        .and_then(|v| v.as_str())
        == Some("full")
}

fn role_memory(
    cfg: &VerlConfig,
    m: &ModelDims,
    r: &RoleMemory,
    reference: &Role,
    seq: i64,
) -> MemoryEstimate {
    let (offload, _) = r.role.offload();
    let h = m.hidden_size;
    let layers = m.num_hidden_layers;
    // The actor's output layer is the LM head (or, tied, the embedding); the critic's a
    // value head of `hidden` weights.
    let out_params = if r.outputs > 1 { m.head_params() } else { h };
    let p = m
        .all_layers_params()
        .saturating_add(m.embedding_params())
        .saturating_add(out_params)
        .saturating_add(h)
        .saturating_add(m.vision_params());
    let mut dev = MemoryBreakdown::default();
    let mut host = MemoryBreakdown::default();
    let mut assumptions = Vec::new();
    // Tokens in one micro-batch on one rank.
    let micro_tokens = match (r.batch.dynamic_token_budget, r.batch.micro_batch_per_rank) {
        (Some(budget), _) => budget as u64,
        (None, Some(mb)) => (mb.max(1) * seq) as u64,
        (None, None) => seq as u64,
    };
    let checkpointing;
    match r.role.strategy {
        Strategy::Megatron => {
            let meg = r.role.megatron;
            checkpointing = megatron_recompute(meg);
            let tp = meg.map_or(1, |x| x.tensor_model_parallel_size.max(1)) as u64;
            let pp = meg.map_or(1, |x| x.pipeline_model_parallel_size.max(1)) as u64;
            let dp = r.batch.dp_size.max(1) as u64;
            let dist_opt = meg.is_none_or(|x| x.use_distributed_optimizer);
            // The busiest stage: its share of the layers plus the embedding and a
            // vision-language model's tower (first stage) or the output layer and final norm
            // (last stage; tied weights keep a copy there). The tower is whole on every
            // tensor-parallel rank of the first stage.
            let layers_here = layers.div_ceil(pp);
            let tower = m.vision_params();
            let (stage, tower_here) = if pp == 1 {
                (p, tower)
            } else {
                let tied_copy = if r.outputs > 1 {
                    m.embedding_params()
                } else {
                    0
                };
                let last = out_params.max(tied_copy).saturating_add(h);
                let first = m.embedding_params().saturating_add(tower);
                let stage = layers_here
                    .saturating_mul(m.layer_params())
                    .saturating_add(first.max(last));
                (stage, if first >= last { tower } else { 0 })
            };
            let cp = meg.map_or(1, |x| x.context_parallel_size.max(1)) as u64;
            let ep = meg.map_or(1, |x| x.expert_model_parallel_size.max(1)) as u64;
            let ep = if m.sparse_layers() > 0 { ep } else { 1 };
            // The stage's routed experts split over EP, each also over TP (expert TP = TP) or
            // whole (expert TP 1); the distributed optimizer shards their state over the ranks
            // that hold the same experts (DP / EP, or TP x DP / EP with whole experts), the
            // rest over DP x CP.
            let etp = meg
                .and_then(|x| x.expert_tensor_parallel_size)
                .map_or(tp, |e| (e.max(1) as u64).min(tp));
            let experts_here = m.routed_expert_params().saturating_mul(layers_here) / layers.max(1);
            let dense_shard = stage.saturating_sub(experts_here + tower_here) / tp + tower_here;
            let expert_shard = experts_here / (etp * ep);
            let shard = dense_shard + expert_shard;
            let (po, go, oo) = (offload.params, offload.grads, offload.optimizer);
            let expert_dp = (dp * tp / etp / ep).max(1);
            let opt = if dist_opt && ep > 1 {
                dense_shard * 12 / (dp * cp) + expert_shard * 12 / expert_dp
            } else if dist_opt {
                shard * 12 / (dp * cp)
            } else {
                shard * 12
            };
            place(&mut dev, &mut host, po, |b| &mut b.params_bytes, shard * 2);
            place(&mut dev, &mut host, go, |b| &mut b.grads_bytes, shard * 4);
            place(&mut dev, &mut host, oo, |b| &mut b.optimizer_bytes, opt);
            assumptions.push(format!("Megatron: bf16 params and fp32 main grads of the busiest pipeline stage ({layers_here} of {layers} layers plus the embedding or output layer) over tp={tp}; fp32 main params + 2 Adam moments{}", if dist_opt { format!(" sharded over dp={dp}{} (distributed optimizer)", if cp > 1 { format!(" x cp={cp}") } else { String::new() }) } else { String::new() }));
            if experts_here > 0 {
                assumptions.push(format!(
                    "experts: {:.2} GiB of the {:.2} GiB of bf16 params per rank ({} routed experts per layer over ep={ep} x expert tp={etp})",
                    (expert_shard * 2) as f64 / GIB,
                    (shard * 2) as f64 / GIB,
                    m.moe.num_experts
                ));
            }
            if tower_here > 0 && tp > 1 {
                assumptions.push(format!(
                    "vision tower: whole ({:.1}M parameters) on every tensor-parallel rank of the first stage",
                    tower_here as f64 / 1e6
                ));
            }
            if cp > 1 {
                assumptions.push(format!(
                    "context parallel {cp}: each rank's activations cover 1/{cp} of each sequence"
                ));
            }
            let local_tokens = micro_tokens / (tp * cp).max(1);
            dev.activations_bytes = activations(local_tokens, h, layers_here, checkpointing)
                + logits(micro_tokens / cp, r.outputs.div_ceil(tp.max(1)));
        }
        _ => {
            checkpointing = r.role.gradient_checkpointing.0;
            let f = r.role.fsdp;
            let world = r.batch.dp_size.max(1) as u64 * r.role.sp.max(1) as u64;
            let shard_n = match f.map(|x| x.fsdp_size) {
                Some(s) if s > 0 => s as u64,
                _ => world,
            };
            let (po, go, oo) = (offload.params, offload.grads, offload.optimizer);
            let shard = p.div_ceil(shard_n.max(1));
            // The shards, their gradients and AdamW's moments share the main dtype
            // (`model_dtype`: fp32, or bf16 stepped in place under bf16 compute; lowering
            // refuses the other combinations, whose runs would keep fp32).
            let compute = r.role.precision().map(|(d, _)| d);
            let main = match f.map(|x| x.model_dtype.dtype()) {
                Some(Dtype::Bf16) if compute == Some(Dtype::Bf16) => Dtype::Bf16,
                _ => Dtype::Fp32,
            };
            let e = if main == Dtype::Fp32 { 4 } else { 2 };
            place(&mut dev, &mut host, po, |b| &mut b.params_bytes, shard * e);
            place(&mut dev, &mut host, go, |b| &mut b.grads_bytes, shard * e);
            place(
                &mut dev,
                &mut host,
                oo,
                |b| &mut b.optimizer_bytes,
                shard * e * 2,
            );
            // One gathered unit (a decoder layer) in bf16 while it runs, plus the prefetched
            // next one.
            dev.params_bytes += m.layer_params() * 2 * 2;
            let main = main.name();
            assumptions.push(format!("FSDP full shard over {shard_n} ranks: {main} params, {main} grads, 2 {main} AdamW moments per shard (model_dtype); bf16 compute with one layer gathered (plus prefetch)"));
            dev.activations_bytes = activations(micro_tokens, h, layers, checkpointing)
                + logits(micro_tokens, r.outputs);
        }
    }
    // The reference policy, if used, holds a bf16 (or sharded) copy for forward passes.
    let ref_needed = r.outputs > 1 && reference.runs;
    if ref_needed {
        let shards = match r.role.strategy {
            Strategy::Megatron => r.role.model_parallel().unwrap_or(1).max(1) as u64,
            _ => r.batch.dp_size.max(1) as u64,
        };
        let bytes = p * 2 / shards.max(1);
        let off = reference.offload().0.params;
        place(&mut dev, &mut host, off, |b| &mut b.reference_bytes, bytes);
        assumptions.push("reference policy: bf16 weights, sharded like the actor".into());
    }
    assumptions.push(format!(
        "{} activations for one micro-batch of {micro_tokens} tokens/rank, {}",
        r.role.name,
        if checkpointing {
            "layers recomputed in the backward pass"
        } else {
            "no recompute"
        },
    ));
    if r.outputs > 1 {
        assumptions.push(format!(
            "rollout KV cache not included (rollout.gpu_memory_utilization = {})",
            cfg.actor_rollout_ref.rollout.gpu_memory_utilization
        ));
    } else {
        assumptions.push("critic: the actor's model dimensions with a value head".into());
    }
    if let Some(v) = m.vision_config.as_ref().filter(|_| m.vision_params() > 0) {
        // The images' sizes are the data's: the tower's activations are given per patch
        // (a merged image token is `spatial_merge_size²` patches), not summed.
        let per_thousand = activations(1000, v.hidden_size, v.depth, checkpointing);
        assumptions.push(format!(
            "vision tower: {:.1}M parameters, in the totals above; its activations, not in them: {:.1} MiB per 1,000 image patches in a micro-batch ({} patches per image token)",
            m.vision_params() as f64 / 1e6,
            per_thousand as f64 / (1u64 << 20) as f64,
            v.spatial_merge_size * v.spatial_merge_size
        ));
    }
    let active_params = (m.sparse_layers() > 0).then(|| {
        p.saturating_sub(m.all_layers_params())
            .saturating_add(m.active_layers_params())
    });
    if m.sparse_layers() > 0 {
        assumptions.push(format!(
            "mixture of experts: {} of {} layers hold {} experts each; a token runs through {}",
            m.sparse_layers(),
            layers,
            m.moe.num_experts,
            m.moe.num_experts_per_tok
        ));
    }
    MemoryEstimate {
        params: p,
        active_params,
        device: dev,
        host,
        assumptions,
    }
}

pub(crate) fn place(
    dev: &mut MemoryBreakdown,
    host: &mut MemoryBreakdown,
    offload: bool,
    field: fn(&mut MemoryBreakdown) -> &mut u64,
    bytes: u64,
) {
    *field(if offload { host } else { dev }) += bytes;
}

/// Activation bytes of one micro-batch: 34·s·h per layer (bf16, flash attention), or the
/// layer inputs (2·s·h per layer) plus one live layer under full recompute.
pub(crate) fn activations(tokens: u64, hidden: u64, layers: u64, checkpointing: bool) -> u64 {
    let per_layer = 34 * tokens * hidden;
    if checkpointing {
        2 * tokens * hidden * layers + per_layer
    } else {
        per_layer * layers
    }
}

/// fp32 logits and their gradient for the log-prob computation.
pub(crate) fn logits(tokens: u64, vocab: u64) -> u64 {
    tokens * vocab * 4 * 2
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::check::{CheckOptions, check};
    use crate::load::compose::LoadRequest;

    fn cfg(overrides: &[&str]) -> VerlConfig {
        let mut o: Vec<String> = vec!["actor_rollout_ref.rollout.name=vllm".into()];
        o.extend(overrides.iter().map(|s| s.to_string()));
        let c = check(
            &LoadRequest {
                overrides: o,
                builtin: crate::load::version::BuiltinRelease::V0_7_0,
                ..Default::default()
            },
            &CheckOptions::default(),
        );
        c.config
            .unwrap_or_else(|| panic!("config did not check: {:?}", c.diagnostics))
    }

    #[test]
    fn grpo_batch_arithmetic() {
        let c = cfg(&[
            "data.train_batch_size=1024",
            "actor_rollout_ref.rollout.n=5",
            "actor_rollout_ref.actor.ppo_mini_batch_size=256",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40",
            "trainer.n_gpus_per_node=8",
            "trainer.total_training_steps=100",
            "algorithm.adv_estimator=grpo",
        ]);
        let e = explain(&c, None).expect("fits");
        assert_eq!(e.responses_per_step, 5120);
        assert_eq!(e.actor.mini_batch_responses, 1280);
        assert_eq!(e.actor.mini_batch_per_rank, 160.0);
        assert_eq!(e.actor.grad_accum_steps, Some(4.0));
        assert_eq!(e.actor.optimizer_steps_per_iteration, 4.0);
        assert_eq!(e.optimizer_steps_total, Some(400));
        assert!(e.critic.is_none());
    }

    /// FSDP2's `offload_policy` offloads what the trainer offloads (lowering's rule), the same
    /// as FSDP1's two offload keys; explain used to ignore it.
    #[test]
    fn fsdp2_offload_policy_places_like_the_trainer() {
        let m = ModelDims {
            hidden_size: 64,
            num_attention_heads: 4,
            num_key_value_heads: Some(2),
            num_hidden_layers: 2,
            vocab_size: 1000,
            intermediate_size: Some(128),
            tie_word_embeddings: None,
            head_dim: None,
            model_type: None,
            max_position_embeddings: None,
            attention_bias: None,
            moe: Default::default(),
            linear: Default::default(),
            vision_config: None,
        };
        let host = |o: &[&str]| {
            let mut v = vec!["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4"];
            v.extend_from_slice(o);
            let e = explain(&cfg(&v), Some(&m)).expect("fits");
            let mem = e.memory.expect("memory");
            (
                mem.host.params_bytes,
                mem.host.grads_bytes,
                mem.host.optimizer_bytes,
            )
        };
        let policy = host(&[
            "actor_rollout_ref.actor.strategy=fsdp2",
            "actor_rollout_ref.actor.fsdp_config.offload_policy=true",
        ]);
        let keys = host(&[
            "actor_rollout_ref.actor.fsdp_config.param_offload=true",
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true",
        ]);
        assert!(policy.0 > 0 && policy.1 > 0 && policy.2 > 0, "{policy:?}");
        assert_eq!(policy, keys);
        // Under FSDP1 verl ignores `offload_policy`, and so do the trainer and explain.
        assert_eq!(
            host(&["actor_rollout_ref.actor.fsdp_config.offload_policy=true"]),
            (0, 0, 0)
        );
    }

    /// Qwen2.5-0.5B's dimensions (about 494M parameters).
    fn qwen2_5_0_5b() -> ModelDims {
        ModelDims {
            hidden_size: 896,
            num_attention_heads: 14,
            num_key_value_heads: Some(2),
            num_hidden_layers: 24,
            vocab_size: 151936,
            intermediate_size: Some(4864),
            tie_word_embeddings: Some(true),
            head_dim: None,
            model_type: None,
            max_position_embeddings: None,
            attention_bias: None,
            moe: Default::default(),
            linear: Default::default(),
            vision_config: None,
        }
    }

    #[test]
    fn fsdp_memory_halves_with_twice_the_ranks() {
        let m = qwen2_5_0_5b();
        let base = [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "algorithm.adv_estimator=grpo",
        ];
        let one = explain(
            &cfg(&[
                &base[..],
                &[
                    "trainer.n_gpus_per_node=1",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                    "data.train_batch_size=8",
                ],
            ]
            .concat()),
            Some(&m),
        )
        .expect("fits");
        let two = explain(
            &cfg(&[
                &base[..],
                &[
                    "trainer.n_gpus_per_node=2",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                    "data.train_batch_size=8",
                ],
            ]
            .concat()),
            Some(&m),
        )
        .expect("fits");
        let (a, b) = (one.memory.unwrap(), two.memory.unwrap());
        assert_eq!(a.device.optimizer_bytes, 2 * b.device.optimizer_bytes);
        // Qwen2.5-0.5B has ~494M parameters.
        assert!(
            (480_000_000..510_000_000).contains(&a.params),
            "{}",
            a.params
        );
    }

    #[test]
    fn bf16_model_dtype_halves_the_fsdp_shards_grads_and_moments() {
        let m = qwen2_5_0_5b();
        let base = [
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "algorithm.adv_estimator=grpo",
            "trainer.n_gpus_per_node=2",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "data.train_batch_size=8",
        ];
        let memory = |extra: &[&str]| {
            explain(&cfg(&[&base[..], extra].concat()), Some(&m))
                .expect("fits")
                .memory
                .expect("a memory estimate")
        };
        let fp32 = memory(&[]);
        let bf16 = memory(&["actor_rollout_ref.actor.fsdp_config.model_dtype=bf16"]);
        let gathered = m.layer_params() * 2 * 2;
        assert_eq!(
            2 * (bf16.device.params_bytes - gathered),
            fp32.device.params_bytes - gathered
        );
        assert_eq!(2 * bf16.device.grads_bytes, fp32.device.grads_bytes);
        assert_eq!(2 * bf16.device.optimizer_bytes, fp32.device.optimizer_bytes);
        assert!(
            bf16.assumptions
                .iter()
                .any(|a| a.contains("bf16 params, bf16 grads")),
            "{:?}",
            bf16.assumptions
        );
    }

    #[test]
    fn absurd_values_are_an_error_not_wrapped_numbers() {
        let c = cfg(&[
            "data.train_batch_size=9223372036854775807",
            "actor_rollout_ref.rollout.n=4",
        ]);
        let e = explain(&c, None).expect_err("overflows");
        assert!(e.what.contains("data.train_batch_size"), "{e}");
    }

    fn cfg_on(base: &str, overrides: &[&str]) -> VerlConfig {
        let mut o: Vec<String> = vec!["actor_rollout_ref.rollout.name=vllm".into()];
        o.extend(overrides.iter().map(|s| s.to_string()));
        let c = check(
            &LoadRequest {
                base: Some(base.into()),
                overrides: o,
                builtin: crate::load::version::BuiltinRelease::V0_7_0,
                ..Default::default()
            },
            &CheckOptions::default(),
        );
        c.config
            .unwrap_or_else(|| panic!("config did not check: {:?}", c.diagnostics))
    }

    #[test]
    fn qwen3_5_counts_gated_deltanet_and_gated_attention_layers() {
        // A tiny Qwen3.5 text config; 216336 is transformers 5.19's parameter count of
        // Qwen3_5ForCausalLM built from it (tests/oracle/qwen3_5_oracle.py's model).
        let text = r#"{"model_type": "qwen3_5_text", "vocab_size": 128, "hidden_size": 64,
            "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 32, "tie_word_embeddings": false,
            "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16, "linear_value_head_dim": 32,
            "linear_num_key_heads": 2, "linear_num_value_heads": 4,
            "layer_types": ["linear_attention", "full_attention", "linear_attention",
                            "full_attention"]}"#;
        let m: ModelDims = serde_json::from_str(text).expect("config");
        assert_eq!(m.linear_layers(), 2);
        assert_eq!(m.param_count(), 216_336);
        // Without layer_types, every fourth layer is full attention.
        let v: serde_json::Value = serde_json::from_str(text).expect("json");
        let mut v = v.as_object().expect("object").clone();
        v.remove("layer_types");
        v.insert("num_hidden_layers".into(), 8.into());
        let m: ModelDims = serde_json::from_value(v.clone().into()).expect("config");
        assert_eq!(m.linear_layers(), 6);
        // Qwen3.5-MoE: every MLP sparse (8 experts, top-2) plus a shared expert; transformers
        // counts 378384 parameters, 230928 of them active per token.
        let mut v = v;
        v.insert("num_hidden_layers".into(), 4.into());
        v.insert("model_type".into(), "qwen3_5_moe_text".into());
        v.remove("intermediate_size");
        for (k, n) in [
            ("num_experts", 8),
            ("num_experts_per_tok", 2),
            ("moe_intermediate_size", 32),
            ("shared_expert_intermediate_size", 48),
        ] {
            v.insert(k.into(), n.into());
        }
        let types = ["linear_attention", "full_attention"].repeat(2);
        v.insert("layer_types".into(), serde_json::json!(types));
        let m: ModelDims = serde_json::from_value(v.into()).expect("config");
        assert_eq!(m.param_count(), 378_384);
        let active = m
            .active_layers_params()
            .saturating_add(m.embedding_params())
            .saturating_add(m.head_params())
            .saturating_add(m.hidden_size);
        assert_eq!(active, 230_928);
    }

    #[test]
    fn qwen3_moe_counts_every_expert_and_the_active_ones() {
        // Qwen3-30B-A3B's config.json: 30.5B parameters, 3.3B active.
        let text = include_str!("../../tests/fixtures/models/qwen3_30b_a3b.json");
        let m: ModelDims = serde_json::from_str(text).expect("config");
        assert_eq!(m.sparse_layers(), 48);
        let e = explain(&cfg(&[]), Some(&m)).expect("fits");
        let mem = e.memory.expect("memory");
        assert!(
            (30.3e9..30.7e9).contains(&(mem.params as f64)),
            "{}",
            mem.params
        );
        let active = mem.active_params.expect("active") as f64;
        assert!((3.2e9..3.45e9).contains(&active), "{active}");
        // mlp_only_layers and decoder_sparse_step thin the sparse layers out.
        let thin: ModelDims = serde_json::from_str(
            &text
                .replace(r#""decoder_sparse_step": 1"#, r#""decoder_sparse_step": 2"#)
                .replace(
                    r#""mlp_only_layers": []"#,
                    r#""mlp_only_layers": [1, 2, 1, 99]"#,
                ),
        )
        .expect("config");
        assert_eq!(thin.sparse_layers(), 23);
        let dense: ModelDims = serde_json::from_str(include_str!(
            "../../tests/fixtures/rules/models/qwen2_5_7b.json"
        ))
        .expect("config");
        assert_eq!(dense.sparse_layers(), 0);
        assert!(
            explain(&cfg(&[]), Some(&dense))
                .unwrap()
                .memory
                .unwrap()
                .active_params
                .is_none()
        );
    }

    fn qwen2_5(hidden: u64, heads: u64, kv: u64, layers: u64, inter: u64, tied: bool) -> ModelDims {
        ModelDims {
            hidden_size: hidden,
            num_attention_heads: heads,
            num_key_value_heads: Some(kv),
            num_hidden_layers: layers,
            vocab_size: if tied { 151936 } else { 152064 },
            intermediate_size: Some(inter),
            tie_word_embeddings: Some(tied),
            head_dim: None,
            model_type: Some("qwen2".into()),
            max_position_embeddings: None,
            attention_bias: None,
            moe: Default::default(),
            linear: Default::default(),
            vision_config: None,
        }
    }

    #[test]
    fn parameter_counts_match_the_published_qwen2_5_models() {
        // Hugging Face's counts, q/k/v biases included.
        assert_eq!(
            qwen2_5(896, 14, 2, 24, 4864, true).param_count(),
            494_032_768
        );
        assert_eq!(
            qwen2_5(3584, 28, 4, 28, 18944, false).param_count(),
            7_615_616_512
        );
    }

    /// Configs that leave keys to their family's config class: Gemma-2B-shaped (tied
    /// embeddings, 256-wide heads by default) and Seed-OSS-36B-shaped (q/k/v biases by
    /// default) count what transformers 4.57 builds from them, 2,506,172,416 and
    /// 36,151,104,512 parameters.
    #[test]
    fn absent_keys_count_as_the_family_defaults_them() {
        let gemma = r#"{"model_type": "gemma", "hidden_size": 2048, "num_attention_heads": 8,
            "num_key_value_heads": 1, "num_hidden_layers": 18, "vocab_size": 256000,
            "intermediate_size": 16384}"#;
        let m: ModelDims = serde_json::from_str(gemma).expect("dims");
        assert_eq!(m.head_dim(), 256);
        assert_eq!(m.param_count(), 2_506_172_416);
        let seed = r#"{"model_type": "seed_oss", "hidden_size": 5120, "num_attention_heads": 80,
            "num_key_value_heads": 8, "num_hidden_layers": 64, "vocab_size": 155136,
            "intermediate_size": 27648}"#;
        let m: ModelDims = serde_json::from_str(seed).expect("dims");
        assert_eq!(m.param_count(), 36_151_104_512);
    }

    /// gpt-oss-20b and -120b as their config.json describe them (experts counted by
    /// `num_local_experts`, `intermediate_size` wide, biased, with the router's bias, the
    /// attention's biases and sinks): what transformers 4.57 builds, 20,914,757,184 and
    /// 116,829,156,672 parameters.
    #[test]
    fn gpt_oss_counts_its_biased_experts_and_sinks() {
        for (layers, experts, total) in [(24, 32, 20_914_757_184u64), (36, 128, 116_829_156_672)] {
            let text = format!(
                r#"{{"model_type": "gpt_oss", "hidden_size": 2880, "num_attention_heads": 64,
                "num_key_value_heads": 8, "num_hidden_layers": {layers}, "vocab_size": 201088,
                "intermediate_size": 2880, "head_dim": 64, "num_local_experts": {experts},
                "num_experts_per_tok": 4, "attention_bias": true, "tie_word_embeddings": false}}"#
            );
            let m: ModelDims = serde_json::from_str(&text).expect("dims");
            assert_eq!(m.param_count(), total, "{layers} layers");
        }
    }

    /// A 7B model's GRPO update on one 80 GiB GPU does not fit (bf16 weights, fp32 gradients
    /// and Adam's state of 7.6B parameters alone are about 100 GiB): the actor is named with
    /// both numbers and the keys that lower it, offloading first; on 8 GPUs (FSDP shards the
    /// state 8 ways) it fits, and so it does with the optimizer and weights offloaded.
    #[test]
    fn a_run_that_does_not_fit_a_gpu_is_named_with_the_keys_that_fit_it() {
        let dims: ModelDims = serde_json::from_str(
            r#"{"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
            "intermediate_size": 18944, "tie_word_embeddings": false}"#,
        )
        .expect("dims");
        let base = [
            "algorithm.adv_estimator=grpo",
            "data.train_batch_size=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=1",
            "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=1",
            "data.max_prompt_length=512",
            "data.max_response_length=512",
        ];
        let gpu = 80 * (1u64 << 30);
        let on = |extra: &[&str]| {
            let mut o = base.to_vec();
            o.extend_from_slice(extra);
            let c = cfg(&o);
            let e = explain(&c, Some(&dims)).expect("fits u64");
            device_shortfall(&c, &e, gpu)
        };
        let one = on(&["trainer.n_gpus_per_node=1"]).expect("a 7B update does not fit one GPU");
        assert_eq!(one.role, "actor");
        assert!(one.need > one.have && one.have == gpu);
        assert_eq!(
            one.keys[0],
            "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True"
        );
        assert!(one.keys.iter().any(|k| k.contains("param_offload=True")));
        assert!(one.keys.iter().any(|k| k.contains("lora_rank")));
        let text = one.to_string();
        assert!(
            text.contains("GiB per GPU") && text.contains("80.0 GiB"),
            "{text}"
        );
        assert!(on(&["trainer.n_gpus_per_node=8"]).is_none());
        assert!(
            on(&[
                "trainer.n_gpus_per_node=1",
                "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
                "actor_rollout_ref.actor.fsdp_config.param_offload=True",
            ])
            .is_none()
        );
    }

    /// Gemma 2's 2B, 9B and 27B as their config.json describe them (four norms a layer,
    /// embeddings tied by default): what transformers 4.57 builds.
    #[test]
    fn gemma2_counts_its_four_norms_a_layer() {
        for (hidden, inter, layers, heads, kv, head, total) in [
            (2304, 9216, 26, 8, 4, 256, 2_614_341_888u64),
            (3584, 14336, 42, 16, 8, 256, 9_241_705_984),
            (4608, 36864, 46, 32, 16, 128, 27_227_128_320),
        ] {
            let text = format!(
                r#"{{"model_type": "gemma2", "hidden_size": {hidden}, "intermediate_size": {inter},
                "num_hidden_layers": {layers}, "num_attention_heads": {heads},
                "num_key_value_heads": {kv}, "head_dim": {head}, "vocab_size": 256000}}"#
            );
            let m: ModelDims = serde_json::from_str(&text).expect("dims");
            assert_eq!(m.param_count(), total, "{hidden} wide");
        }
    }

    /// Qwen2.5-VL-7B as Qwen's config.json describes it: its text model's 7,615,616,512
    /// parameters plus the vision tower's 676,550,144, Hugging Face's 8,292,166,656.
    #[test]
    fn a_vision_language_model_counts_its_vision_tower() {
        let text = r#"{"model_type": "qwen2_5_vl", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
            "intermediate_size": 18944, "tie_word_embeddings": false,
            "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                "out_hidden_size": 3584, "in_chans": 3, "patch_size": 14,
                "spatial_merge_size": 2, "temporal_patch_size": 2}}"#;
        let m: ModelDims = serde_json::from_str(text).expect("dims");
        assert_eq!(m.vision_params(), 676_550_144);
        assert_eq!(m.param_count(), 8_292_166_656);
        let e = explain(&cfg(&["algorithm.adv_estimator=grpo"]), Some(&m)).expect("fits");
        let mem = e.memory.expect("memory");
        assert_eq!(mem.params, 8_292_166_656);
        assert!(
            mem.assumptions
                .iter()
                .any(|a| a.starts_with("vision tower: 676.6M")
                    && a.contains("MiB per 1,000 image patches"))
        );
        // Qwen3-VL-8B's tower: 576,388,336 parameters in transformers 4.57.
        let qwen3 = r#"{"model_type": "qwen3_vl", "hidden_size": 4096, "num_attention_heads": 32,
            "num_key_value_heads": 8, "num_hidden_layers": 36, "vocab_size": 151936,
            "intermediate_size": 12288, "tie_word_embeddings": false,
            "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                "num_heads": 16, "out_hidden_size": 4096, "patch_size": 16,
                "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]}}"#;
        let m: ModelDims = serde_json::from_str(qwen3).expect("dims");
        assert_eq!(m.vision_params(), 576_388_336);
        // Qwen3-VL-30B-A3B as its checkpoint nests it (text model in `text_config`, transformers
        // 5's `num_local_experts`): 31,070,754,032 parameters in transformers 4.57, its tower's
        // 538,631,408 among them.
        let dir = tempfile::tempdir().expect("tempdir");
        let moe = r#"{"model_type": "qwen3_vl_moe", "tie_word_embeddings": false,
            "text_config": {"model_type": "qwen3_vl_moe_text", "hidden_size": 2048,
                "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
                "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                "num_local_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768},
            "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304,
                "num_heads": 16, "out_hidden_size": 2048, "patch_size": 16,
                "num_position_embeddings": 2304, "deepstack_visual_indexes": [8, 16, 24]}}"#;
        std::fs::write(dir.path().join("config.json"), moe).expect("write");
        let m = crate::check::read_model_dims(dir.path()).expect("dims");
        assert_eq!(m.vision_params(), 538_631_408);
        assert_eq!(m.param_count(), 31_070_754_032);
        // Qwen3.5's checkpoints are image-text models: Qwen3-VL's tower without DeepStack
        // mergers (transformers 5's `Qwen3_5VisionModel` at its default sizes into a width of
        // 2048 has 446,571,248 parameters), whatever `deepstack_visual_indexes` says.
        let qwen3_5 = r#"{"model_type": "qwen3_5", "tie_word_embeddings": false,
            "text_config": {"model_type": "qwen3_5_text", "hidden_size": 2048,
                "intermediate_size": 6144, "num_hidden_layers": 24, "num_attention_heads": 8,
                "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320},
            "vision_config": {"model_type": "qwen3_5_vision", "depth": 27, "hidden_size": 1152,
                "intermediate_size": 4304, "num_heads": 16, "out_hidden_size": 2048,
                "patch_size": 16, "num_position_embeddings": 2304,
                "deepstack_visual_indexes": [8, 16, 24]}}"#;
        std::fs::write(dir.path().join("config.json"), qwen3_5).expect("write");
        let m = crate::check::read_model_dims(dir.path()).expect("dims");
        assert_eq!(m.vision_params(), 446_571_248);
        let mut v: serde_json::Value = serde_json::from_str(text).expect("json");
        v["model_type"] = "qwen2".into();
        let m: ModelDims = serde_json::from_value(v).expect("dims");
        assert_eq!(m.vision_params(), 0, "a text model has no tower");
    }

    /// verl's FSDP workers with Ulysses: data parallel = world / SP. 40 prompts × 8 responses
    /// over 8 GPUs in Ulysses groups of 2: 4 data-parallel ranks of 80 responses, 10
    /// micro-batches of 8 each.
    #[test]
    fn fsdp_with_ulysses_splits_the_batch_over_world_over_sp() {
        let c = cfg(&[
            "trainer.n_gpus_per_node=8",
            "data.train_batch_size=80",
            "actor_rollout_ref.rollout.n=8",
            "actor_rollout_ref.actor.ppo_mini_batch_size=40",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
            "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
            "actor_rollout_ref.model.use_remove_padding=true",
            "algorithm.adv_estimator=grpo",
        ]);
        let e = explain(&c, None).expect("fits");
        assert_eq!(e.actor.dp_size, 4);
        assert_eq!(e.actor.mini_batch_responses, 320);
        assert_eq!(e.actor.mini_batch_per_rank, 80.0);
        assert_eq!(e.actor.grad_accum_steps, Some(10.0));
    }

    /// Megatron TP 2 × PP 4 on 8 GPUs, Qwen2.5-7B: the busiest stage holds 7 of 28 layers and
    /// the output layer plus final norm; no recompute unless asked for.
    #[test]
    fn megatron_memory_follows_the_busiest_pipeline_stage() {
        let c = cfg_on(
            "ppo_megatron_trainer",
            &[
                "trainer.n_gpus_per_node=8",
                "data.max_prompt_length=512",
                "data.max_response_length=512",
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "algorithm.adv_estimator=grpo",
            ],
        );
        let m = qwen2_5(3584, 28, 4, 28, 18944, false);
        let e = explain(&c, Some(&m)).expect("fits");
        assert_eq!(e.actor.dp_size, 1);
        let mem = e.memory.expect("memory");
        // Per layer: q 12_845_056 + kv 3_670_016 + o 12_845_056 + biases 4_608
        // + MLP 203_685_888 + norms 7_168 = 233_057_792. The last stage: 7 layers
        // (1_631_404_544) + output layer 544_997_376 + norm 3_584 = 2_176_405_504, over TP 2.
        let shard: u64 = 2_176_405_504 / 2;
        assert_eq!(mem.device.params_bytes, shard * 2);
        assert_eq!(mem.device.grads_bytes, shard * 4);
        assert_eq!(mem.device.optimizer_bytes, shard * 12);
        // 2 × 1024 tokens, sequence-parallel over TP: 1024 tokens × 3584 × 34 bytes × 7
        // layers without recompute, plus fp32 logits and their gradient for 2048 tokens ×
        // 76_032 vocabulary entries per TP rank.
        assert_eq!(
            mem.device.activations_bytes,
            34 * 1024 * 3584 * 7 + 2048 * 76_032 * 8
        );
        assert!(mem.assumptions.iter().any(|a| a.contains("no recompute")));
    }

    /// Qwen2.5-VL-7B on Megatron TP 2: the tower (676,550,144 parameters) is whole on each
    /// tensor-parallel rank, the text model halved; with two pipeline stages the first holds
    /// the tower beside its 14 layers and the embedding.
    #[test]
    fn megatron_memory_keeps_the_vision_tower_whole_on_the_first_stage() {
        let m: ModelDims = serde_json::from_str(
            r#"{"model_type": "qwen2_5_vl", "hidden_size": 3584, "num_attention_heads": 28,
            "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
            "intermediate_size": 18944, "tie_word_embeddings": false,
            "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420,
                "out_hidden_size": 3584, "in_chans": 3, "patch_size": 14,
                "spatial_merge_size": 2, "temporal_patch_size": 2}}"#,
        )
        .expect("dims");
        let tower = 676_550_144u64;
        let memory = |pp: &str| {
            let c = cfg_on(
                "ppo_megatron_trainer",
                &[
                    "trainer.n_gpus_per_node=4",
                    "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                    pp,
                    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                    "algorithm.adv_estimator=grpo",
                ],
            );
            explain(&c, Some(&m)).expect("fits").memory.expect("memory")
        };
        let one = memory("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=1");
        let text = m.param_count() - tower;
        assert_eq!(one.device.params_bytes, (text / 2 + tower) * 2);
        assert!(
            one.assumptions
                .iter()
                .any(|a| a.starts_with("vision tower: whole (676.6M"))
        );
        let two = memory("actor_rollout_ref.actor.megatron.pipeline_model_parallel_size=2");
        let first = 14 * m.layer_params() + m.embedding_params();
        assert_eq!(two.device.params_bytes, (first / 2 + tower) * 2);
    }

    /// Expert parallelism divides the routed experts' params and grads per rank (the rest
    /// stays), their optimizer state stays 1/DP; context parallelism divides the activations
    /// and shards the distributed optimizer over DP x CP.
    #[test]
    fn megatron_memory_splits_experts_over_ep_and_sequences_over_cp() {
        let m: ModelDims = serde_json::from_str(include_str!(
            "../../tests/fixtures/models/qwen3_30b_a3b.json"
        ))
        .expect("config");
        let memory = |extra: &[&str]| {
            let mut o = vec![
                "trainer.n_gpus_per_node=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
            ];
            o.extend(extra);
            let c = cfg_on("ppo_megatron_trainer", &o);
            explain(&c, Some(&m)).expect("fits").memory.expect("memory")
        };
        let one = memory(&[]);
        let ep8 = memory(&["actor_rollout_ref.actor.megatron.expert_model_parallel_size=8"]);
        let experts = m.routed_expert_params() * 2;
        assert_eq!(
            one.device.params_bytes - ep8.device.params_bytes,
            experts - experts / 8
        );
        assert_eq!(one.device.optimizer_bytes, ep8.device.optimizer_bytes);
        assert!(ep8.assumptions.iter().any(|a| a.contains("over ep=8")));
        let cp2 = memory(&["actor_rollout_ref.actor.megatron.context_parallel_size=2"]);
        assert!(cp2.device.activations_bytes * 2 <= one.device.activations_bytes + 8);
        assert_eq!(cp2.device.params_bytes, one.device.params_bytes);
        // dp 4 x cp 2 shards the state as dp 8 did.
        assert_eq!(cp2.device.optimizer_bytes, one.device.optimizer_bytes);
    }

    /// GAE runs a critic: its batch and its memory (the actor's dimensions, value head).
    #[test]
    fn gae_explains_the_critic_too() {
        let c = cfg(&[
            "algorithm.adv_estimator=gae",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            "critic.ppo_micro_batch_size_per_gpu=4",
        ]);
        let m = qwen2_5(896, 14, 2, 24, 4864, true);
        let e = explain(&c, Some(&m)).expect("fits");
        assert!(e.critic.is_some());
        let critic = e.critic_memory.expect("critic memory");
        // 24 layers × 14_912_384 + embedding 136_134_656 + value head 896 + norm 896.
        assert_eq!(critic.params, 24 * 14_912_384 + 136_134_656 + 896 + 896);
        let actor = e.memory.expect("actor memory");
        assert!(critic.device.activations_bytes < actor.device.activations_bytes);
    }
}
