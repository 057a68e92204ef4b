//! Checkpoints: save, kill, load, continue gives the uninterrupted trajectory bit for bit
//! (main params, moments, step counters, grad scaler and lr scheduler included).
#![allow(clippy::needless_range_loop)]
use std::path::Path;
use std::time::{Duration, Instant};

use tch::{Device, Kind, Tensor};
use verlc_runtime::optim::sched::{
    LrDecayStyle, MegatronSchedulerConfig, OptimizerParamScheduler, VerlLrScheduler, VerlSchedule,
    VerlSchedulerConfig, WdIncrStyle,
};
use verlc_runtime::optim::{
    Dtype, GroupOptions, InnerConfig, LrScheduler, NamedParam, Optimizer, OptimizerConfig,
    ParamGroup, ScalerConfig, SgdConfig,
};

use crate::common;

const STEPS: usize = 24;
const SAVE_AT: usize = 9;
/// Steps whose loss is poisoned with NaN (skipped; they move the scaler).
const POISONED: [usize; 2] = [3, 13];

#[derive(Clone, Copy, PartialEq, Debug)]
enum Setup {
    /// fp16, AdamW, dynamic scaler, Megatron cosine scheduler.
    Fp16Adam,
    /// bf16, SGD with momentum, verl cosine scheduler.
    Bf16Sgd,
}

type SchedulerFactory = Box<dyn Fn(&mut [GroupOptions]) -> LrScheduler>;

struct Run {
    params: Vec<Tensor>,
    /// With its schedule.
    opt: Optimizer,
    x: Tensor,
    y: Tensor,
    kind: Kind,
}

fn new_run(setup: Setup, offload: f64) -> Run {
    tch::set_num_threads(1);
    tch::manual_seed(42);
    let x = Tensor::randn([32, 8], (Kind::Float, Device::Cpu));
    let y = Tensor::randn([32, 4], (Kind::Float, Device::Cpu));
    let kind = if setup == Setup::Fp16Adam {
        Kind::Half
    } else {
        Kind::BFloat16
    };
    let w1 = (Tensor::randn([8, 16], (Kind::Float, Device::Cpu)) * 0.3)
        .to_kind(kind)
        .set_requires_grad(true);
    let b1 = Tensor::zeros([16], (kind, Device::Cpu)).set_requires_grad(true);
    let w2 = (Tensor::randn([16, 4], (Kind::Float, Device::Cpu)) * 0.3)
        .to_kind(kind)
        .set_requires_grad(true);
    let params = vec![w1, b1, w2];
    let names = ["w1", "b1", "w2"];
    let groups = vec![
        ParamGroup {
            params: [0, 2]
                .iter()
                .map(|&i| NamedParam::new(names[i], params[i].shallow_clone()))
                .collect(),
            options: GroupOptions::new(1e-2, 0.1),
        },
        ParamGroup {
            params: vec![NamedParam::new("b1", params[1].shallow_clone())],
            options: GroupOptions::new(1e-2, 0.0),
        },
    ];
    let (cfg, sched_of): (OptimizerConfig, SchedulerFactory) = match setup {
        Setup::Fp16Adam => (
            OptimizerConfig {
                scaler: Some(ScalerConfig::Dynamic {
                    initial_scale: 256.0,
                    min_scale: 1.0,
                    growth_factor: 2.0,
                    backoff_factor: 0.5,
                    growth_interval: 4,
                    hysteresis: 2,
                }),
                offload_fraction: offload,
                ..OptimizerConfig::megatron(Dtype::Fp16)
            },
            Box::new(|g| {
                let c = MegatronSchedulerConfig {
                    init_lr: 0.0,
                    max_lr: 1e-2,
                    min_lr: 1e-4,
                    lr_warmup_steps: 4.0 * 32.0,
                    lr_decay_steps: 30.0 * 32.0,
                    lr_decay_style: LrDecayStyle::Cosine,
                    start_wd: 0.0,
                    end_wd: 0.1,
                    wd_incr_steps: 30.0 * 32.0,
                    wd_incr_style: WdIncrStyle::Linear,
                    wsd_decay_steps: None,
                    lr_wsd_decay_style: None,
                };
                LrScheduler::Megatron(OptimizerParamScheduler::new(c, g).unwrap())
            }),
        ),
        Setup::Bf16Sgd => (
            OptimizerConfig {
                inner: InnerConfig::Sgd(SgdConfig::default()),
                offload_fraction: offload,
                ..OptimizerConfig::megatron(Dtype::Bf16)
            },
            Box::new(|g| {
                let c = VerlSchedulerConfig {
                    schedule: VerlSchedule::Cosine {
                        min_lr_ratio: 0.1,
                        num_cycles: 0.5,
                    },
                    lr_warmup_steps: 3,
                    lr_warmup_steps_ratio: 0.0,
                    total_training_steps: STEPS as i64,
                    zero_indexed_step: true,
                };
                LrScheduler::Verl(VerlLrScheduler::new(&c, g).unwrap())
            }),
        ),
    };
    let mut opt = Optimizer::new(groups, cfg).unwrap();
    let sched = sched_of(opt.options_mut());
    opt.set_scheduler(sched);
    Run {
        params,
        opt,
        x,
        y,
        kind,
    }
}

/// One training step; returns copies of the model params afterwards.
fn train_step(r: &mut Run, t: usize) -> Vec<Tensor> {
    r.opt.zero_grad().unwrap();
    let h = r.x.to_kind(r.kind).matmul(&r.params[0]) + &r.params[1];
    let out = h.tanh().matmul(&r.params[2]).to_kind(Kind::Float);
    let mut loss = (out - &r.y).square().mean(Kind::Float);
    if POISONED.contains(&t) {
        loss *= f64::NAN;
    }
    r.opt.scale_loss(&loss).unwrap().backward();
    let o = r.opt.step(None).unwrap();
    // With a scaler the NaN step is skipped; bf16 without one steps on NaN, so it is not poisoned.
    if o.update_successful {
        r.opt.scheduler_step(32);
    }
    r.params.iter().map(Tensor::copy).collect()
}

fn uninterrupted(setup: Setup) -> (Vec<Vec<Tensor>>, Run) {
    let mut r = new_run(setup, 0.0);
    let traj = (0..STEPS).map(|t| train_step(&mut r, t)).collect();
    (traj, r)
}

fn resume_and_compare(setup: Setup, ckpt: &Path, offload: f64) {
    let (want, reference) = uninterrupted(setup);
    let mut r = new_run(setup, offload);
    // A fresh run is at step 0: different weights until the load.
    assert!(!r.params[0].equal(&want[SAVE_AT - 1][0]));
    r.opt.load(ckpt).unwrap();
    assert!(r.opt.scheduler().is_some());
    for (p, w) in r.params.iter().zip(&want[SAVE_AT - 1]) {
        assert!(p.equal(w), "model params restored from main params");
    }
    for t in SAVE_AT..STEPS {
        let got = train_step(&mut r, t);
        for (i, (g, w)) in got.iter().zip(&want[t]).enumerate() {
            assert!(
                g.equal(w),
                "{setup:?}: step {t} param {i} differs after resume"
            );
        }
    }
    assert_eq!(r.opt.scaler(), reference.opt.scaler());
    assert_eq!(r.opt.scheduler(), reference.opt.scheduler());
    assert_eq!(r.opt.options(), reference.opt.options());
    for ((n, a), (_, b)) in r.opt.main_params().iter().zip(reference.opt.main_params()) {
        assert!(a.equal(&b), "main param {n}");
    }
}

fn is_poison_sensitive(setup: Setup) -> bool {
    setup == Setup::Fp16Adam
}

/// Save at step 9 in a child process, SIGKILL it, load here (into an optimizer with half of
/// its state offloaded), continue: identical to the uninterrupted run.
#[test]
fn save_kill_load_continue_fp16_adamw() {
    let filter = common::test_filter(module_path!(), "save_kill_load_continue_fp16_adamw");
    if common::is_rank(&filter) {
        let ckpt = std::path::PathBuf::from(std::env::var("VERLC_CKPT").unwrap());
        let mut r = new_run(Setup::Fp16Adam, 0.0);
        for t in 0..SAVE_AT {
            train_step(&mut r, t);
        }
        r.opt.save(&ckpt).unwrap();
        std::fs::write(ckpt.with_extension("ready"), b"1").unwrap();
        std::thread::sleep(Duration::from_secs(600));
        return;
    }
    assert!(is_poison_sensitive(Setup::Fp16Adam));
    let dir = common::temp_dir("save_kill_load");
    let ckpt = dir.join("optim.safetensors");
    let _ = std::fs::remove_file(ckpt.with_extension("ready"));
    let mut child = common::spawn_ranks(&filter, 1, &[("VERLC_CKPT", ckpt.display().to_string())]);
    let start = Instant::now();
    while !ckpt.with_extension("ready").exists() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "child never saved"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill(0).unwrap();
    resume_and_compare(Setup::Fp16Adam, &ckpt, 0.5);
}

#[test]
fn save_load_continue_bf16_sgd() {
    let dir = common::temp_dir("save_load_sgd");
    let ckpt = dir.join("optim.safetensors");
    {
        let mut r = new_run(Setup::Bf16Sgd, 0.0);
        // bf16 without a scaler has no overflow check: keep its losses clean.
        for t in 0..SAVE_AT {
            if !POISONED.contains(&t) {
                train_step(&mut r, t);
            } else {
                train_step_clean(&mut r);
            }
        }
        r.opt.save(&ckpt).unwrap();
    }
    // Reference with the same clean/poison pattern.
    let mut reference = new_run(Setup::Bf16Sgd, 0.0);
    let mut want = vec![];
    for t in 0..STEPS {
        if POISONED.contains(&t) {
            want.push(train_step_clean(&mut reference));
        } else {
            want.push(train_step(&mut reference, t));
        }
    }
    let mut r = new_run(Setup::Bf16Sgd, 1.0);
    r.opt.load(&ckpt).unwrap();
    for t in SAVE_AT..STEPS {
        let got = if POISONED.contains(&t) {
            train_step_clean(&mut r)
        } else {
            train_step(&mut r, t)
        };
        for (g, w) in got.iter().zip(&want[t]) {
            assert!(g.equal(w), "step {t}");
        }
    }
    assert_eq!(r.opt.scheduler(), reference.opt.scheduler());
}

fn train_step_clean(r: &mut Run) -> Vec<Tensor> {
    train_step(r, usize::MAX)
}

#[test]
fn load_rejects_other_params_and_rules() {
    let dir = common::temp_dir("load_rejects");
    let ckpt = dir.join("optim.safetensors");
    let r = new_run(Setup::Fp16Adam, 0.0);
    r.opt.save(&ckpt).unwrap();
    let mut other = new_run(Setup::Bf16Sgd, 0.0);
    let e = other.opt.load(&ckpt).unwrap_err().to_string();
    assert!(e.contains("saved with"), "{e}");
    let p = Tensor::zeros([2], (Kind::Half, Device::Cpu)).set_requires_grad(true);
    let groups = || {
        vec![ParamGroup {
            params: vec![NamedParam::new("zz", p.shallow_clone())],
            options: GroupOptions::new(1.0, 0.0),
        }]
    };
    let cfg = OptimizerConfig {
        scaler: Some(ScalerConfig::Constant { scale: 1.0 }),
        ..OptimizerConfig::megatron(Dtype::Fp16)
    };
    let mut o = Optimizer::new(groups(), cfg).unwrap();
    let e = o.load(&ckpt).unwrap_err().to_string();
    assert!(e.contains("param groups"), "{e}");
    assert!(o.load(&dir.join("missing.safetensors")).is_err());
    // An optimizer and its schedule are one value: one with a schedule refuses a state saved
    // without one.
    let bare = dir.join("bare.safetensors");
    o.save(&bare).unwrap();
    let mut scheduled = Optimizer::new(groups(), cfg).unwrap();
    let c = VerlSchedulerConfig {
        schedule: VerlSchedule::Constant,
        lr_warmup_steps: 0,
        lr_warmup_steps_ratio: 0.0,
        total_training_steps: STEPS as i64,
        zero_indexed_step: true,
    };
    let s = VerlLrScheduler::new(&c, scheduled.options_mut()).unwrap();
    scheduled.set_scheduler(LrScheduler::Verl(s));
    let e = scheduled.load(&bare).unwrap_err().to_string();
    assert!(e.contains("no lr scheduler state"), "{e}");
    o.load(&bare).unwrap();
}
