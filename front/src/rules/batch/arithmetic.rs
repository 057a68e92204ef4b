//! Whether the batch arithmetic `verlc explain` does (and the rules reason about) fits 64-bit
//! integers: absurd sizes that pass the schema are reported (`SIZE_OVERFLOW`) instead of
//! overflowing.

use crate::config::VerlConfig;
use crate::role::Role;
use crate::rules::ModelDims;

/// The batch arithmetic does not fit 64-bit integers (absurd values that passed the schema).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the derived numbers overflow 64-bit integers: {what} is beyond 2^62")]
pub struct Overflow {
    /// The product that overflows, in words.
    pub what: &'static str,
    /// The config key to point at (the last factor a user would change).
    pub key: &'static str,
}

/// Largest magnitude any derived number may reach (every product below stays under it).
const LIMIT: f64 = (1u64 << 62) as f64;

/// Checks, in floating point, the largest products `crate::explain::explain` forms, so its integer
/// arithmetic cannot overflow (debug builds would panic, release builds wrap to nonsense).
pub(crate) fn arithmetic_fits(cfg: &VerlConfig, model: Option<&ModelDims>) -> Result<(), Overflow> {
    let f = |v: i64| (v as f64).abs().max(1.0);
    let d = &cfg.data;
    let t = &cfg.trainer;
    let a = &cfg.actor_rollout_ref.actor;
    let c = &cfg.critic;
    let n = f(cfg.actor_rollout_ref.rollout.n);
    let seq = f(d.max_prompt_length) + f(d.max_response_length);
    let a_sp = f(Role::actor(cfg).sp);
    let c_sp = f(Role::critic(cfg).sp);
    let micro = |m: Option<i64>| f(m.unwrap_or(1));
    // Tokens of one micro-batch on one rank, the largest of the ways explain counts them.
    let tokens = [
        f(a.ppo_max_token_len_per_gpu) * a_sp,
        micro(a.ppo_micro_batch_size_per_gpu.or(a.ppo_micro_batch_size)) * seq,
        seq,
    ]
    .into_iter()
    .fold(1.0, f64::max);
    let mut products = vec![
        (
            "trainer.nnodes × trainer.n_gpus_per_node",
            "trainer.n_gpus_per_node",
            f(t.nnodes) * f(t.n_gpus_per_node),
        ),
        (
            "data.max_prompt_length + data.max_response_length",
            "data.max_response_length",
            seq,
        ),
        (
            "data.train_batch_size × rollout.n × (max_prompt_length + max_response_length)",
            "data.train_batch_size",
            f(d.train_batch_size) * n * seq,
        ),
        (
            "actor.ppo_mini_batch_size × rollout.n",
            "actor_rollout_ref.actor.ppo_mini_batch_size",
            f(a.ppo_mini_batch_size) * n,
        ),
        (
            "critic.ppo_mini_batch_size × rollout.n",
            "critic.ppo_mini_batch_size",
            f(c.ppo_mini_batch_size) * n,
        ),
        (
            "the tokens of one actor micro-batch",
            "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
            tokens,
        ),
        (
            "actor.megatron tensor × pipeline × context parallel sizes",
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size",
            a.megatron.as_ref().map_or(1.0, |m| {
                f(m.tensor_model_parallel_size)
                    * f(m.pipeline_model_parallel_size)
                    * f(m.context_parallel_size)
            }),
        ),
        (
            "critic.megatron tensor × pipeline × context parallel sizes",
            "critic.megatron.tensor_model_parallel_size",
            c.megatron.as_ref().map_or(1.0, |m| {
                f(m.tensor_model_parallel_size)
                    * f(m.pipeline_model_parallel_size)
                    * f(m.context_parallel_size)
            }),
        ),
        (
            "critic.ppo_max_token_len_per_gpu × ulysses_sequence_parallel_size",
            "critic.ppo_max_token_len_per_gpu",
            f(c.ppo_max_token_len_per_gpu) * c_sp,
        ),
    ];
    if let Some(m) = model {
        let g = |v: u64| (v as f64).max(1.0);
        let (h, layers, vocab) = (g(m.hidden_size), g(m.num_hidden_layers), g(m.vocab_size));
        let path = "actor_rollout_ref.model.path";
        products.extend([
            (
                "the model's parameter bytes",
                path,
                g(m.param_count()) * 16.0,
            ),
            (
                "activation bytes (tokens × hidden × layers)",
                path,
                36.0 * tokens * h * layers,
            ),
            ("logit bytes (tokens × vocab)", path, 8.0 * tokens * vocab),
        ]);
    }
    match products
        .into_iter()
        .find(|(_, _, v)| !v.is_finite() || *v >= LIMIT)
    {
        Some((what, key, _)) => Err(Overflow { what, key }),
        None => Ok(()),
    }
}
