//! Random initialisation as transformers' `_init_weights` does it (normal(0, initializer_range)
//! for linear and embedding weights, zero biases, unit norm weights), from a seed and
//! independent of libtorch's global generator, thread count and device.

use tch::nn::VarStore;
use tch::{Kind, Tensor};

use crate::rng::Rng;

use super::ModelError;

/// True for the weights of RMSNorm layers (initialised to one).
pub fn is_norm_weight(name: &str) -> bool {
    name.ends_with("norm.weight")
}

/// Initialises every variable of `vs` in place; each variable draws from its own stream
/// derived from `seed` and its name, so adding a variable does not change the others.
pub fn init_weights(vs: &VarStore, initializer_range: f64, seed: u64) -> Result<(), ModelError> {
    init_weights_where(vs, initializer_range, seed, |_| true)
}

/// [`init_weights`] restricted to the variables whose name satisfies `select`.
pub fn init_weights_where(
    vs: &VarStore,
    initializer_range: f64,
    seed: u64,
    select: impl Fn(&str) -> bool,
) -> Result<(), ModelError> {
    for (name, var) in vs.variables().into_iter().filter(|(n, _)| select(n)) {
        let value = if is_norm_weight(&name) {
            var.ones_like()
        } else if name.ends_with(".bias") {
            var.zeros_like()
        } else {
            let mut rng = Rng::derive(seed, fnv1a(name.as_bytes()));
            let data: Vec<f32> = (0..var.numel())
                .map(|_| (rng.normal() * initializer_range) as f32)
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
