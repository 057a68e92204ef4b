//! What the machine running `verlc` can do, for CPU trainers (which run where they are
//! built): whether bf16 is native or emulated.

use std::sync::OnceLock;

use crate::codes;
use crate::config::Device;
use crate::diag::Diagnostic;
use crate::load::node::{Node, split_key};

use super::{Binding, Dtype};
use crate::role::Role;

/// This CPU's model name and whether it computes bf16 natively (AVX-512 BF16 or AMX), read
/// once from `/proc/cpuinfo`; `None` where that cannot be told (another OS).
fn cpu() -> Option<&'static (String, bool)> {
    static CPU: OnceLock<Option<(String, bool)>> = OnceLock::new();
    CPU.get_or_init(|| {
        let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
        let field = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split(':').nth(1))
                .map(str::trim)
        };
        let native = field("flags")?
            .split_whitespace()
            .any(|f| matches!(f, "avx512_bf16" | "amx_bf16"));
        let model = field("model name").unwrap_or("this CPU").to_owned();
        Some((model, native))
    })
    .as_ref()
}

/// Whether this CPU computes bf16 natively: `None` where that cannot be told (the tests'
/// expectation of B007 on this host).
#[cfg(test)]
pub(super) fn native_bf16() -> Option<bool> {
    cpu().map(|(_, native)| *native)
}

/// `B007` when a CPU trainer binds bf16 mixed precision on a host without native bf16: every
/// bf16 matmul is emulated (measured on a 2-core AVX2 EPYC: a quickstart step 25 s in bf16
/// against 2.8 s in fp32). A warning at the key that chose the precision.
pub(super) fn bf16_emulated_warning(
    actor: &Role,
    binding: Binding,
    device: Device,
    root: &Node,
) -> Option<Diagnostic> {
    if device != Device::Cpu || binding.precision != Dtype::Bf16 {
        return None;
    }
    let (cpu, native) = cpu()?;
    if *native {
        return None;
    }
    let (_, key) = actor.precision()?;
    let origin = root
        .get_path(&split_key(&key))
        .and_then(|n| n.origin.clone());
    let fix = if key.ends_with("megatron.dtype") {
        format!(
            "set `{key}: float32` (a verlc extension; verl's Megatron engine accepts bfloat16 and float16 only)"
        )
    } else if key.ends_with("mixed_precision.param_dtype") {
        format!("set `{key}: fp32`")
    } else {
        let section = key.trim_end_matches(".dtype");
        format!("set `{section}.mixed_precision.param_dtype: fp32`")
    };
    Some(
        Diagnostic::warning(
            codes::BUILD_BF16_EMULATED,
            format!("bf16 mixed precision on trainer.device=cpu, but {cpu} has no native bf16 (AVX-512 BF16 or AMX): every bf16 matmul is emulated, several times slower than fp32"),
        )
        .with_key(key)
        .with_primary(origin, "bf16 chosen here")
        .with_help(fix),
    )
}
