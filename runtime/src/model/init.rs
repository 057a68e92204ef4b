//! Random initialisation as transformers' `_init_weights` does it (normal(0, initializer_range)
//! for linear, convolution and embedding weights, zero biases, unit norm weights; Qwen3.5's
//! zero-centred norms at zero, its DeltaNet's `dt_bias` at one and `A_log` = log U(0.01, 16)), from a seed and
//! independent of libtorch's global generator, thread count and device.

use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::rng::Rng;

use super::{ModelConfig, ModelError};

/// True for the weights of RMSNorm layers (a vision tower's `norm1`, `norm2` and its
/// merger's `ln_q` among them).
pub fn is_norm_weight(name: &str) -> bool {
    name.ends_with("norm.weight")
        || name.ends_with("norm1.weight")
        || name.ends_with("norm2.weight")
        || name.ends_with("ln_q.weight")
}

/// Initialises every variable of `vs` (a model of `cfg`) in place; each variable draws from
/// its own stream derived from `seed` and its name, so adding a variable does not change the
/// others.
pub fn init_weights(vs: &VarStore, cfg: &ModelConfig, seed: u64) -> Result<(), ModelError> {
    init_weights_where(vs, cfg, seed, |_| true)
}

/// [`init_weights`] restricted to the variables whose name satisfies `select`.
pub fn init_weights_where(
    vs: &VarStore,
    cfg: &ModelConfig,
    seed: u64,
    select: impl Fn(&str) -> bool,
) -> Result<(), ModelError> {
    // Qwen3.5's norms scale by `1 + weight` and start at zero, except the DeltaNet's gated
    // norm, a plain one.
    let norm_start = if cfg.zero_centered_norm() { 0.0 } else { 1.0 };
    for (name, var) in vs.variables().into_iter().filter(|(n, _)| select(n)) {
        let mut rng = Rng::derive(seed, fnv1a(name.as_bytes()));
        // The DeltaNet's gated norm and a vision tower's norms are plain RMSNorms.
        let plain_norm = name.ends_with("linear_attn.norm.weight")
            || (name.starts_with("visual.") && is_norm_weight(&name));
        let value = if plain_norm || name.ends_with(".dt_bias") {
            var.ones_like()
        } else if is_norm_weight(&name) {
            var.ones_like() * norm_start
        } else if name.ends_with(".A_log") {
            // log(A) for A uniform in [0.01, 16], as transformers draws it.
            let data: Vec<f32> = (0..var.numel())
                .map(|_| (0.01 + 15.99 * rng.next_f64()).ln() as f32)
                .collect();
            Tensor::from_slice(&data).view(var.size().as_slice())
        } else if name.ends_with(".bias") {
            var.zeros_like()
        } else {
            let data: Vec<f32> = (0..var.numel())
                .map(|_| (rng.normal() * cfg.initializer_range) as f32)
                .collect();
            Tensor::from_slice(&data)
                .view(var.size().as_slice())
                .to_kind(Kind::Float)
        };
        tch::no_grad(|| var.shallow_clone().f_copy_(&value))?;
    }
    Ok(())
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}
