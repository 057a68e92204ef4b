//! 100-step AdamW / SGD trajectories against torch.optim (fused and the default for-loop
//! implementation), with and without host offload of part of the optimizer.
use std::collections::HashMap;

use tch::Tensor;
use verlc_runtime::ops;
use verlc_runtime::optim::{
    AdamWConfig, Dtype, GroupOptions, InnerConfig, NamedParam, Optimizer, OptimizerConfig,
    ParamGroup, SgdConfig,
};

use crate::oracle::{self, get, max_abs_diff, max_rel_diff};

const NAMES: [&str; 3] = ["w1", "b1", "w2"];
const STEPS: usize = 100;

fn lr_at(t: usize) -> f64 {
    1e-3 * (1.0 + 0.01 * t as f64)
}

fn build(
    o: &HashMap<String, Tensor>,
    inner: InnerConfig,
    wd: [f64; 2],
    offload: f64,
) -> (Optimizer, HashMap<String, Tensor>) {
    let params: HashMap<String, Tensor> = NAMES
        .iter()
        .map(|n| {
            (
                n.to_string(),
                get(o, &format!("init.{n}")).copy().set_requires_grad(true),
            )
        })
        .collect();
    let group = |names: &[&str], wd: f64| ParamGroup {
        params: names
            .iter()
            .map(|n| NamedParam::new(*n, params[*n].shallow_clone()))
            .collect(),
        options: GroupOptions::new(lr_at(0), wd),
    };
    let cfg = OptimizerConfig {
        inner,
        clip_grad: 0.0,
        offload_fraction: offload,
        ..OptimizerConfig::megatron(Dtype::Fp32)
    };
    let opt = Optimizer::new(
        vec![group(&["w1", "w2"], wd[0]), group(&["b1"], wd[1])],
        cfg,
    )
    .unwrap();
    (opt, params)
}

/// Runs the trajectory; returns the worst (abs diff vs fused, rel diff vs default) over all
/// steps and params.
fn run(case: &str, inner: InnerConfig, wd: [f64; 2], offload: f64) -> (f64, f64) {
    let o = oracle::tensors(case);
    let (mut opt, params) = build(&o, inner, wd, offload);
    if offload > 0.0 {
        assert!(opt.offloaded_numel() > 0);
    }
    let (mut worst_fused, mut worst_default) = (0f64, 0f64);
    for t in 0..STEPS {
        for g in opt.options_mut() {
            g.lr = lr_at(t);
        }
        for n in NAMES {
            ops::set_grad(&params[n], Some(get(&o, &format!("grad.{t}.{n}")))).unwrap();
        }
        let out = opt.step(None).unwrap();
        assert!(out.update_successful);
        for n in NAMES {
            let p = params[n].detach();
            worst_fused = worst_fused.max(max_abs_diff(&p, get(&o, &format!("fused.{t}.{n}"))));
            worst_default =
                worst_default.max(max_rel_diff(&p, get(&o, &format!("default.{t}.{n}"))));
        }
    }
    (worst_fused, worst_default)
}

#[test]
fn adamw_matches_torch_100_steps() {
    let inner = InnerConfig::AdamW(AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
    });
    let (fused, default) = run("adamw", inner, [0.1, 0.0], 0.0);
    eprintln!(
        "adamw: max |ours - torch fused| = {fused:e}, max rel vs torch default = {default:e}"
    );
    assert_eq!(fused, 0.0, "same kernel, same inputs: bit-identical");
    assert!(default < 1e-5, "fp32 rounding only: {default:e}");
}

#[test]
fn adamw_offloaded_matches_torch() {
    let inner = InnerConfig::AdamW(AdamWConfig {
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
    });
    let (fused, _) = run("adamw", inner, [0.1, 0.0], 0.5);
    assert_eq!(fused, 0.0);
}

#[test]
fn sgd_matches_torch_100_steps() {
    let inner = InnerConfig::Sgd(SgdConfig {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
    });
    let (fused, default) = run("sgd", inner, [0.01, 0.0], 0.0);
    eprintln!("sgd: max |ours - torch fused| = {fused:e}, max rel vs torch default = {default:e}");
    assert_eq!(fused, 0.0);
    assert!(default < 1e-5, "{default:e}");
}

#[test]
fn sgd_offloaded_matches_torch() {
    let inner = InnerConfig::Sgd(SgdConfig {
        momentum: 0.9,
        dampening: 0.0,
        nesterov: false,
    });
    let (fused, _) = run("sgd", inner, [0.01, 0.0], 1.0);
    assert_eq!(fused, 0.0);
}
