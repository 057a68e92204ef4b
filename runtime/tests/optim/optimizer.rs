//! The mixed-precision / fp32 optimizer step: bf16 against an fp32-master PyTorch reference,
//! fp16 overflow skipping, found-inf across ranks, offload placement, skip threshold.
use std::collections::HashMap;

use tch::{Device, Kind, Tensor};
use verlc_runtime::ops;
use verlc_runtime::optim::{
    Dtype, GroupOptions, NamedParam, Optimizer, OptimizerConfig, ParamGroup, ScalerConfig,
    StepOutcome,
};

use crate::oracle::{self, get, max_rel_diff};
use crate::rank_test;

const NAMES: [&str; 3] = ["w1", "b1", "w2"];

fn groups_of(params: &HashMap<String, Tensor>, lr: f64) -> Vec<ParamGroup> {
    let g = |names: &[&str], wd: f64| ParamGroup {
        params: names
            .iter()
            .map(|n| NamedParam::new(*n, params[*n].shallow_clone()))
            .collect(),
        options: GroupOptions::new(lr, wd),
    };
    vec![g(&["w1", "w2"], 0.1), g(&["b1"], 0.0)]
}

/// The oracle's initial params (`init.<name>`), as fresh leaves that require grad.
fn initial_params(o: &HashMap<String, Tensor>) -> HashMap<String, Tensor> {
    NAMES
        .iter()
        .map(|n| {
            (
                n.to_string(),
                get(o, &format!("init.{n}")).copy().set_requires_grad(true),
            )
        })
        .collect()
}

fn grad_norms(case: &str) -> Vec<f64> {
    oracle::json(case)["grad_norms"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect()
}

/// One step with the oracle's grads of step `t`; the grad norm's relative difference from
/// the oracle's.
fn oracle_step(
    opt: &mut Optimizer,
    params: &HashMap<String, Tensor>,
    o: &HashMap<String, Tensor>,
    t: usize,
    want_norm: f64,
) -> f64 {
    for n in NAMES {
        ops::set_grad(&params[n], Some(get(o, &format!("grad.{t}.{n}")))).unwrap();
    }
    let out = opt.step(None).unwrap();
    assert!(out.update_successful);
    (out.grad_norm.unwrap() - want_norm).abs() / want_norm
}

fn bf16_run(offload: f64) -> (f64, f64, f64) {
    let o = oracle::tensors("bf16");
    let norms = grad_norms("bf16");
    let params = initial_params(&o);
    assert_eq!(params["w1"].kind(), Kind::BFloat16);
    let cfg = OptimizerConfig {
        offload_fraction: offload,
        ..OptimizerConfig::megatron(Dtype::Bf16)
    };
    let mut opt = Optimizer::new(groups_of(&params, 1e-3), cfg).unwrap();
    let (mut worst_model, mut worst_main, mut worst_norm) = (0f64, 0f64, 0f64);
    for (t, want_norm) in norms.iter().enumerate() {
        worst_norm = worst_norm.max(oracle_step(&mut opt, &params, &o, t, *want_norm));
        for n in NAMES {
            assert!(
                !params[n].grad().defined(),
                "model grads are released after the copy"
            );
            worst_model =
                worst_model.max(max_rel_diff(&params[n], get(&o, &format!("model.{t}.{n}"))));
            worst_main = worst_main.max(max_rel_diff(
                &opt.main_param(n).unwrap(),
                get(&o, &format!("master.{t}.{n}")),
            ));
        }
    }
    (worst_model, worst_main, worst_norm)
}

/// bf16 model, fp32 main params, clip 1.0, AdamW: the Megatron step against PyTorch doing
/// the same with an fp32 master copy and torch's fused AdamW.
#[test]
fn bf16_matches_fp32_master_reference() {
    let (model, main, norm) = bf16_run(0.0);
    eprintln!("bf16: worst rel diff model {model:e}, main {main:e}, grad norm {norm:e}");
    assert!(norm < 1e-6, "grad norm rel diff {norm:e}");
    assert!(main < 1e-5, "fp32 main params rel diff {main:e}");
    assert!(
        model <= 2f64.powi(-8),
        "bf16 model params within one bf16 ulp: {model:e}"
    );
}

#[test]
fn bf16_with_host_offload_matches_reference() {
    let (model, main, norm) = bf16_run(0.5);
    assert!(
        norm < 1e-6 && main < 1e-5 && model <= 2f64.powi(-8),
        "{model:e} {main:e} {norm:e}"
    );
}

/// bf16 params stepped in place (`keep_param_dtype`: verl's FSDP `model_dtype: bf16`)
/// against torch's default AdamW (what verl builds) over the same bf16 params, 50 steps, with
/// and without the state on the host: the same ops in the same order on the same bf16
/// tensors, so every param and moment is equal bit for bit (the fused kernel, which rounds
/// once per element, is not). The grad norm torch reports is a bf16 number; ours is summed in
/// fp32 (Megatron's clip), so they agree to bf16 precision.
#[test]
fn bf16_params_in_place_match_torch_adamw_on_bf16_params() {
    let o = oracle::tensors("bf16_params");
    let norms = grad_norms("bf16_params");
    for offload in [0.0, 1.0] {
        let params = initial_params(&o);
        let cfg = OptimizerConfig {
            offload_fraction: offload,
            keep_param_dtype: true,
            clip_grad: 0.0,
            ..OptimizerConfig::megatron(Dtype::Bf16)
        };
        let mut opt = Optimizer::new(groups_of(&params, 1e-3), cfg).unwrap();
        // No fp32 copy: the main params are the bf16 params (or, offloaded, bf16 host copies).
        let (main_bytes, state_bytes) = opt.owned_bytes();
        let numel: i64 = params.values().map(|p| p.numel() as i64).sum();
        assert_eq!(main_bytes, if offload > 0.0 { numel * 2 * 2 } else { 0 });
        assert!(
            state_bytes < numel * 2 * 2 + 64,
            "{state_bytes} bytes of state"
        );
        let mut worst_norm = 0f64;
        for (t, want_norm) in norms.iter().enumerate() {
            worst_norm = worst_norm.max(oracle_step(&mut opt, &params, &o, t, *want_norm));
            for n in NAMES {
                assert_eq!(params[n].kind(), Kind::BFloat16);
                let want = get(&o, &format!("model.{t}.{n}"));
                assert!(params[n].detach().equal(want), "step {t}: {n} differs");
                let v = opt.state_tensor(n, "exp_avg_sq").unwrap();
                assert_eq!(v.kind(), Kind::BFloat16, "{n}: state in bf16");
                assert!(
                    v.equal(get(&o, &format!("exp_avg_sq.{t}.{n}"))),
                    "step {t}: exp_avg_sq of {n} differs"
                );
            }
        }
        assert!(
            worst_norm <= 2f64.powi(-7),
            "grad norm rel diff {worst_norm:e} (offload {offload})"
        );
    }
}

fn fp16_model() -> (Tensor, Tensor) {
    tch::manual_seed(3);
    let w = Tensor::randn([8, 4], (Kind::Float, Device::Cpu))
        .to_kind(Kind::Half)
        .set_requires_grad(true);
    let b = Tensor::randn([4], (Kind::Float, Device::Cpu))
        .to_kind(Kind::Half)
        .set_requires_grad(true);
    (w, b)
}

fn fp16_opt(w: &Tensor, b: &Tensor, scaler: ScalerConfig) -> Optimizer {
    let groups = vec![ParamGroup {
        params: vec![
            NamedParam::new("w", w.shallow_clone()),
            NamedParam::new("b", b.shallow_clone()),
        ],
        options: GroupOptions::new(1e-2, 0.01),
    }];
    Optimizer::new(
        groups,
        OptimizerConfig {
            scaler: Some(scaler),
            ..OptimizerConfig::megatron(Dtype::Fp16)
        },
    )
    .unwrap()
}

fn dynamic(initial: f64) -> ScalerConfig {
    ScalerConfig::Dynamic {
        initial_scale: initial,
        min_scale: 1.0,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: 1000,
        hysteresis: 2,
    }
}

/// Sets grads `g * scale` as fp16 (what backward of a scaled loss yields).
fn set_scaled_grads(w: &Tensor, b: &Tensor, scale: f64, poison: Option<f64>) {
    let gw = Tensor::full([8, 4], 0.25, (Kind::Float, Device::Cpu)) * scale;
    let gb = Tensor::full([4], -0.5, (Kind::Float, Device::Cpu)) * scale;
    if let Some(v) = poison {
        let _ = gb.narrow(0, 2, 1).fill_(v);
    }
    ops::set_grad(w, Some(&gw.to_kind(Kind::Half))).unwrap();
    ops::set_grad(b, Some(&gb.to_kind(Kind::Half))).unwrap();
}

fn tensors_of(path: &std::path::Path) -> Vec<(String, Tensor)> {
    let mut v = Tensor::read_safetensors(path).unwrap();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// An fp16 overflow (inf or nan) skips the step: weights, main params, moments and step
/// counters stay bit-identical; only the scaler moves.
#[test]
fn fp16_overflow_is_skipped_and_leaves_state_untouched() {
    let dir = crate::common::temp_dir("fp16_overflow");
    for poison in [
        f64::INFINITY,
        f64::NAN,
        1e6, /* overflows fp16 when scaled */
    ] {
        let (w, b) = fp16_model();
        let mut opt = fp16_opt(&w, &b, dynamic(1024.0));
        set_scaled_grads(&w, &b, opt.loss_scale(), None);
        let first = opt.step(None).unwrap();
        assert!(first.update_successful);
        let (w1, b1) = (w.copy(), b.copy());
        let before = dir.join("before.safetensors");
        opt.save(&before).unwrap();

        set_scaled_grads(&w, &b, opt.loss_scale(), Some(poison));
        let out = opt.step(None).unwrap();
        assert_eq!(
            out,
            StepOutcome {
                update_successful: false,
                grad_norm: None,
                num_zeros: None
            },
            "poison {poison}"
        );
        assert!(w.equal(&w1) && b.equal(&b1), "model params untouched");
        let after = dir.join("after.safetensors");
        opt.save(&after).unwrap();
        let (x, y) = (tensors_of(&before), tensors_of(&after));
        assert_eq!(x.len(), y.len());
        for ((na, ta), (nb, tb)) in x.iter().zip(&y) {
            assert_eq!(na, nb);
            assert!(ta.equal(tb), "{na} changed on a skipped step");
        }
        // Step counters live in the metadata; a reload shows them unchanged (1).
        let s = opt.scaler().unwrap();
        assert_eq!(
            (s.scale(), s.hysteresis_tracker(), s.growth_tracker()),
            (1024.0, 1, 0)
        );

        // The next clean step goes through and the second overflow backs off.
        set_scaled_grads(&w, &b, opt.loss_scale(), None);
        assert!(opt.step(None).unwrap().update_successful);
        assert!(!w.equal(&w1));
        set_scaled_grads(&w, &b, opt.loss_scale(), Some(poison));
        assert!(!opt.step(None).unwrap().update_successful);
        assert_eq!(opt.scaler().unwrap().scale(), 512.0);
    }
}

/// Grads are unscaled before the norm and the update: the same step at scale 1024 and at a
/// constant scale of 1 gives the same weights.
#[test]
fn fp16_grads_are_unscaled() {
    let (w, b) = fp16_model();
    let mut a = fp16_opt(&w, &b, ScalerConfig::Constant { scale: 1024.0 });
    set_scaled_grads(&w, &b, 1024.0, None);
    let ra = a.step(None).unwrap();
    let (w2, b2) = fp16_model();
    let mut c = fp16_opt(&w2, &b2, ScalerConfig::Constant { scale: 1.0 });
    set_scaled_grads(&w2, &b2, 1.0, None);
    let rc = c.step(None).unwrap();
    assert_eq!(ra.grad_norm, rc.grad_norm);
    assert!(w.equal(&w2) && b.equal(&b2));
    // Constant scaler: overflow still skips.
    set_scaled_grads(&w, &b, 1024.0, Some(f64::INFINITY));
    assert!(!a.step(None).unwrap().update_successful);
}

// found-inf is reduced with MAX over the model-parallel group: rank 1 overflows, both skip.
rank_test!(found_inf_is_reduced_over_the_mp_group, 2, |pg| {
    let (w, b) = fp16_model();
    let mut opt = fp16_opt(&w, &b, dynamic(1024.0));
    let poison = (pg.rank() == 1).then_some(f64::INFINITY);
    set_scaled_grads(&w, &b, opt.loss_scale(), poison);
    let w0 = w.copy();
    let out = opt.step(Some(&pg)).unwrap();
    assert!(!out.update_successful, "rank {}", pg.rank());
    assert!(w.equal(&w0));
    // Clean step on both: grad norms are summed over the group (same grads => sqrt(2) x).
    set_scaled_grads(&w, &b, opt.loss_scale(), None);
    let local = {
        let (w2, b2) = fp16_model();
        let mut o2 = fp16_opt(&w2, &b2, dynamic(1024.0));
        set_scaled_grads(&w2, &b2, o2.loss_scale(), None);
        o2.step(None).unwrap().grad_norm.unwrap()
    };
    let out = opt.step(Some(&pg)).unwrap();
    assert!(out.update_successful);
    let n = out.grad_norm.unwrap();
    assert!((n - local * 2f64.sqrt()).abs() < 1e-5 * n, "{n} vs {local}");
});

#[test]
fn grad_norm_skip_threshold_and_zero_count() {
    let (w, b) = fp16_model();
    let groups = vec![ParamGroup {
        params: vec![
            NamedParam::new("w", w.shallow_clone()),
            NamedParam::new("b", b.shallow_clone()),
        ],
        options: GroupOptions::new(1e-2, 0.0),
    }];
    let cfg = OptimizerConfig {
        grad_norm_skip_threshold: 1.0,
        log_num_zeros_in_grad: true,
        scaler: Some(ScalerConfig::Constant { scale: 1.0 }),
        ..OptimizerConfig::megatron(Dtype::Fp16)
    };
    let mut opt = Optimizer::new(groups, cfg).unwrap();
    set_scaled_grads(&w, &b, 1.0, Some(0.0)); // one zero in b
    let w0 = w.copy();
    let out = opt.step(None).unwrap();
    // |g| = sqrt(32 * 0.0625 + 3 * 0.25) = sqrt(2.75) > 1: clipped, then skipped.
    assert!(!out.update_successful);
    assert!((out.grad_norm.unwrap() - 2.75f64.sqrt()).abs() < 1e-6);
    assert_eq!(out.num_zeros, Some(1));
    assert!(w.equal(&w0));
}

#[test]
fn offload_fraction_is_a_greedy_prefix() {
    let mk = |n: i64| Tensor::zeros([n], (Kind::BFloat16, Device::Cpu)).set_requires_grad(true);
    let ps = [mk(100), mk(50), mk(50)];
    for (fraction, want) in [(0.0, 0), (0.5, 100), (0.6, 150), (1.0, 200)] {
        let groups = vec![ParamGroup {
            params: ps
                .iter()
                .enumerate()
                .map(|(i, p)| NamedParam::new(format!("p{i}"), p.shallow_clone()))
                .collect(),
            options: GroupOptions::new(1e-3, 0.0),
        }];
        let cfg = OptimizerConfig {
            offload_fraction: fraction,
            ..OptimizerConfig::megatron(Dtype::Bf16)
        };
        assert_eq!(
            Optimizer::new(groups, cfg).unwrap().offloaded_numel(),
            want,
            "fraction {fraction}"
        );
    }
}

#[test]
fn config_errors() {
    let p = Tensor::zeros([2], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let g = || {
        vec![ParamGroup {
            params: vec![NamedParam::new("p", p.shallow_clone())],
            options: GroupOptions::new(1.0, 0.0),
        }]
    };
    let fp32 = OptimizerConfig::megatron(Dtype::Fp32);
    assert!(
        Optimizer::new(
            g(),
            OptimizerConfig {
                scaler: Some(ScalerConfig::Constant { scale: 2.0 }),
                ..fp32
            }
        )
        .is_err()
    );
    assert!(
        Optimizer::new(
            g(),
            OptimizerConfig {
                scaler: None,
                ..OptimizerConfig::megatron(Dtype::Fp16)
            }
        )
        .is_err()
    );
    assert!(
        Optimizer::new(
            g(),
            OptimizerConfig {
                offload_fraction: 1.5,
                ..fp32
            }
        )
        .is_err()
    );
    let twice = vec![ParamGroup {
        params: vec![
            NamedParam::new("p", p.shallow_clone()),
            NamedParam::new("tied", p.shallow_clone()),
        ],
        options: GroupOptions::new(1.0, 0.0),
    }];
    let e = Optimizer::new(twice, fp32).err().unwrap().to_string();
    assert!(e.contains("share storage"), "{e}");
    let frozen = Tensor::zeros([2], (Kind::Float, Device::Cpu));
    let ok = vec![ParamGroup {
        params: vec![
            NamedParam::new("p", p.shallow_clone()),
            NamedParam::new("frozen", frozen),
        ],
        options: GroupOptions::new(1.0, 0.0),
    }];
    assert_eq!(
        Optimizer::new(ok, fp32).unwrap().main_params().len(),
        1,
        "frozen params are skipped"
    );
    let i = Tensor::zeros([2], (Kind::Double, Device::Cpu)).set_requires_grad(true);
    let bad = vec![ParamGroup {
        params: vec![NamedParam::new("i", i)],
        options: GroupOptions::new(1.0, 0.0),
    }];
    assert!(Optimizer::new(bad, fp32).is_err());
}

/// fp32 params without a grad are skipped like torch does (no step, no state change).
#[test]
fn fp32_params_without_grad_are_skipped() {
    let a = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let b = Tensor::ones([3], (Kind::Float, Device::Cpu)).set_requires_grad(true);
    let groups = vec![ParamGroup {
        params: vec![
            NamedParam::new("a", a.shallow_clone()),
            NamedParam::new("b", b.shallow_clone()),
        ],
        options: GroupOptions::new(0.1, 0.0),
    }];
    let mut opt = Optimizer::new(groups, OptimizerConfig::megatron(Dtype::Fp32)).unwrap();
    ops::set_grad(&a, Some(&Tensor::ones([3], (Kind::Float, Device::Cpu)))).unwrap();
    let out = opt.step(None).unwrap();
    assert!(out.update_successful);
    assert!((out.grad_norm.unwrap() - 3f64.sqrt()).abs() < 1e-6);
    assert!(a.double_value(&[0]) < 1.0);
    assert_eq!(b.double_value(&[0]), 1.0);
}

/// A bf16 model trained with the mixed-precision optimizer tracks the same model trained in
/// fp32 (bf16 tolerance), on a small regression with real autograd.
#[test]
fn bf16_training_tracks_fp32_training() {
    tch::manual_seed(0);
    let x = Tensor::randn([64, 16], (Kind::Float, Device::Cpu));
    let w_true = Tensor::randn([16, 1], (Kind::Float, Device::Cpu));
    let y = x.matmul(&w_true);
    let w0 = Tensor::randn([16, 1], (Kind::Float, Device::Cpu)) * 0.1;
    let mut losses = vec![];
    for precision in [Dtype::Fp32, Dtype::Bf16] {
        let kind = if precision == Dtype::Fp32 {
            Kind::Float
        } else {
            Kind::BFloat16
        };
        let w = w0.copy().to_kind(kind).set_requires_grad(true);
        let groups = vec![ParamGroup {
            params: vec![NamedParam::new("w", w.shallow_clone())],
            options: GroupOptions::new(5e-2, 0.0),
        }];
        let mut opt = Optimizer::new(groups, OptimizerConfig::megatron(precision)).unwrap();
        let mut l = vec![];
        for _ in 0..150 {
            opt.zero_grad().unwrap();
            let loss = (x.to_kind(kind).matmul(&w).to_kind(Kind::Float) - &y)
                .square()
                .mean(Kind::Float);
            loss.backward();
            l.push(loss.double_value(&[]));
            assert!(opt.step(None).unwrap().update_successful);
        }
        losses.push(l);
    }
    let (f, h) = (&losses[0], &losses[1]);
    eprintln!(
        "fp32 loss {:.3e} -> {:.3e}; bf16 {:.3e} -> {:.3e}",
        f[0], f[149], h[0], h[149]
    );
    assert!(
        f[149] < 1e-2 * f[0] && h[149] < 2e-2 * h[0],
        "both converge"
    );
    // Until the loss nears the bf16 resolution of the weights, the curves agree within 5%.
    for t in (0..150).take_while(|&t| f[t] > 1e-2 * f[0]) {
        assert!(
            (f[t] - h[t]).abs() <= 0.05 * f[t],
            "step {t}: fp32 {} bf16 {}",
            f[t],
            h[t]
        );
    }
}
