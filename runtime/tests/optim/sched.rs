//! Schedulers: Megatron's OptimizerParamScheduler against its formulas (docs/optimizer.md) and
//! values recorded from Megatron's class at every step; verl's LambdaLR schedules against
//! verl's code.
use verlc_runtime::optim::GroupOptions;
use verlc_runtime::optim::sched::{
    LrDecayStyle, MegatronSchedulerConfig, OptimizerParamScheduler, VerlLrScheduler, VerlSchedule,
    VerlSchedulerConfig, WdIncrStyle, WsdDecayStyle,
};

use crate::oracle;

const PI: f64 = std::f64::consts::PI;

/// Group 0: no override, wd_mult 1. Group 1: wd_mult 0, max_lr 2e-3, min_lr 0.
fn groups() -> Vec<GroupOptions> {
    let g0 = GroupOptions::new(0.0, 0.0);
    let mut g1 = GroupOptions::new(0.0, 0.0);
    g1.wd_mult = 0.0;
    g1.max_lr = Some(2e-3);
    g1.min_lr = Some(0.0);
    vec![g0, g1]
}

fn config(
    style: LrDecayStyle,
    wsd: Option<WsdDecayStyle>,
    wd: WdIncrStyle,
) -> MegatronSchedulerConfig {
    MegatronSchedulerConfig {
        init_lr: 0.0,
        max_lr: 1e-3,
        min_lr: 1e-5,
        lr_warmup_steps: 100.0,
        lr_decay_steps: 1000.0,
        lr_decay_style: style,
        start_wd: 0.0,
        end_wd: 0.1,
        wd_incr_steps: 1000.0,
        wd_incr_style: wd,
        wsd_decay_steps: wsd.map(|_| 200.0),
        lr_wsd_decay_style: wsd,
    }
}

/// The formula table, written out independently of the implementation.
fn table_lr(style: LrDecayStyle, wsd: Option<WsdDecayStyle>, t: f64, big_m: f64, m: f64) -> f64 {
    let (init, w, d) = (0.0, 100.0, 1000.0);
    if t <= w {
        return init + (big_m - init) * t / w;
    }
    if style == LrDecayStyle::Constant {
        return big_m;
    }
    if t > d {
        return m;
    }
    if style == LrDecayStyle::InverseSquareRoot {
        return f64::max(m, big_m * f64::sqrt(w) / f64::sqrt(t));
    }
    let r = (t - w) / (d - w);
    let coeff = match style {
        LrDecayStyle::Linear => 1.0 - r,
        LrDecayStyle::Cosine => 0.5 * (f64::cos(PI * r) + 1.0),
        _ => {
            let a = d - 200.0;
            if t <= a {
                1.0
            } else {
                let q = (t - a) / 200.0;
                match wsd.unwrap() {
                    WsdDecayStyle::Linear => 1.0 - q,
                    WsdDecayStyle::Cosine => 0.5 * (f64::cos(PI * q) + 1.0),
                    WsdDecayStyle::Exponential => 2.0 * 0.5f64.powf(q) - 1.0,
                    WsdDecayStyle::MinusSqrt => 1.0 - f64::sqrt(q),
                }
            }
        }
    };
    m + coeff * (big_m - m)
}

fn table_wd(style: WdIncrStyle, t: f64) -> f64 {
    if t > 1000.0 {
        return 0.1;
    }
    let q = t / 1000.0;
    let coeff = match style {
        WdIncrStyle::Constant => return 0.1,
        WdIncrStyle::Linear => q,
        WdIncrStyle::Cosine => 0.5 * (f64::cos(PI * (1.0 - q)) + 1.0),
    };
    coeff * 0.1
}

fn close(a: f64, b: f64, rel: f64) -> bool {
    (a - b).abs() <= rel * b.abs().max(1e-300) || a == b
}

/// Steps 0..=1100 one sample at a time; checks the table at every step and the golden values.
fn run(
    style: LrDecayStyle,
    wsd: Option<WsdDecayStyle>,
    wd: WdIncrStyle,
    golden_g0: &[(u32, f64)],
    golden_g1: &[(u32, f64)],
) {
    let mut gs = groups();
    let mut s = OptimizerParamScheduler::new(config(style, wsd, wd), &mut gs).unwrap();
    for t in 0..=1100u32 {
        if t > 0 {
            s.step(1.0, &mut gs);
        }
        let tf = t as f64;
        let want0 = table_lr(style, wsd, tf, 1e-3, 1e-5);
        let want1 = table_lr(style, wsd, tf, 2e-3, 0.0);
        assert!(
            close(gs[0].lr, want0, 1e-14),
            "{style:?} t={t}: g0 lr {} vs table {want0}",
            gs[0].lr
        );
        assert!(
            close(gs[1].lr, want1, 1e-14),
            "{style:?} t={t}: g1 lr {} vs table {want1}",
            gs[1].lr
        );
        assert!(
            close(gs[0].weight_decay, table_wd(wd, tf), 1e-14),
            "t={t}: wd {}",
            gs[0].weight_decay
        );
        assert_eq!(gs[1].weight_decay, 0.0, "wd_mult 0");
        for &(gt, v) in golden_g0.iter().filter(|(gt, _)| *gt == t) {
            assert!(
                close(gs[0].lr, v, 1e-8),
                "{style:?} {wsd:?} golden g0 t={gt}: {} vs {v}",
                gs[0].lr
            );
        }
        for &(gt, v) in golden_g1.iter().filter(|(gt, _)| *gt == t) {
            assert!(
                close(gs[1].lr, v, 1e-8),
                "{style:?} golden g1 t={gt}: {} vs {v}",
                gs[1].lr
            );
        }
    }
}

#[test]
fn megatron_linear() {
    run(
        LrDecayStyle::Linear,
        None,
        WdIncrStyle::Linear,
        &[
            (0, 0.0),
            (1, 1.0e-5),
            (50, 5.0e-4),
            (100, 1.0e-3),
            (101, 9.989e-4),
            (500, 5.6e-4),
            (550, 5.05e-4),
            (900, 1.2e-4),
            (999, 1.11e-5),
            (1001, 1.0e-5),
        ],
        &[
            (0, 0.0),
            (1, 2.0e-5),
            (50, 1.0e-3),
            (100, 2.0e-3),
            (101, 1.99777778e-3),
            (500, 1.11111111e-3),
            (550, 1.0e-3),
            (900, 2.22222222e-4),
            (999, 2.22222222e-6),
            (1001, 0.0),
        ],
    );
}

#[test]
fn megatron_cosine() {
    run(
        LrDecayStyle::Cosine,
        None,
        WdIncrStyle::Cosine,
        &[
            (0, 0.0),
            (1, 1.0e-5),
            (50, 5.0e-4),
            (100, 1.0e-3),
            (101, 9.9999698429e-4),
            (500, 5.9095584795e-4),
            (550, 5.05e-4),
            (900, 3.9852152711e-5),
            (999, 1.0003015709e-5),
            (1001, 1.0e-5),
        ],
        &[],
    );
}

#[test]
fn megatron_constant() {
    run(
        LrDecayStyle::Constant,
        None,
        WdIncrStyle::Linear,
        &[
            (0, 0.0),
            (1, 1.0e-5),
            (50, 5.0e-4),
            (100, 1.0e-3),
            (101, 1.0e-3),
            (500, 1.0e-3),
            (999, 1.0e-3),
            (1001, 1.0e-3),
        ],
        &[],
    );
}

#[test]
fn megatron_inverse_square_root() {
    run(
        LrDecayStyle::InverseSquareRoot,
        None,
        WdIncrStyle::Linear,
        &[
            (0, 0.0),
            (1, 1.0e-5),
            (50, 5.0e-4),
            (100, 1.0e-3),
            (101, 9.9503719021e-4),
            (500, 4.4721359550e-4),
            (550, 4.2640143271e-4),
            (900, 3.3333333333e-4),
            (999, 3.1638599858e-4),
            (1000, 3.1622776602e-4),
            (1001, 1.0e-5),
        ],
        &[],
    );
}

#[test]
fn megatron_wsd() {
    let cases: [(WsdDecayStyle, &[(u32, f64)]); 4] = [
        (
            WsdDecayStyle::Linear,
            &[
                (100, 1.0e-3),
                (101, 1.0e-3),
                (500, 1.0e-3),
                (550, 1.0e-3),
                (900, 5.05e-4),
                (999, 1.495e-5),
                (1001, 1.0e-5),
            ],
        ),
        (
            WsdDecayStyle::Cosine,
            &[
                (500, 1.0e-3),
                (900, 5.05e-4),
                (999, 1.0061066922e-5),
                (1001, 1.0e-5),
            ],
        ),
        (
            WsdDecayStyle::Exponential,
            &[
                (500, 1.0e-3),
                (900, 4.2007142675e-4),
                (999, 1.3437031024e-5),
                (1001, 1.0e-5),
            ],
        ),
        (
            WsdDecayStyle::MinusSqrt,
            &[
                (500, 1.0e-3),
                (900, 2.9996428663e-4),
                (999, 1.2478101509e-5),
                (1001, 1.0e-5),
            ],
        ),
    ];
    for (wsd, golden) in cases {
        run(
            LrDecayStyle::Wsd,
            Some(wsd),
            WdIncrStyle::Linear,
            golden,
            &[],
        );
    }
}

#[test]
fn megatron_weight_decay_golden() {
    let mut gs = groups();
    let mut lin = OptimizerParamScheduler::new(
        config(LrDecayStyle::Linear, None, WdIncrStyle::Linear),
        &mut gs,
    )
    .unwrap();
    let mut gc = groups();
    let mut cos = OptimizerParamScheduler::new(
        config(LrDecayStyle::Cosine, None, WdIncrStyle::Cosine),
        &mut gc,
    )
    .unwrap();
    let lin_golden = [
        (1u32, 1e-4),
        (100, 1e-2),
        (500, 5e-2),
        (999, 9.99e-2),
        (1000, 0.1),
    ];
    let cos_golden = [
        (1u32, 2.4673990709e-7),
        (50, 6.1558297024e-4),
        (100, 2.4471741852e-3),
        (500, 0.05),
        (900, 9.7552825815e-2),
    ];
    for t in 1..=1000u32 {
        lin.step(1.0, &mut gs);
        cos.step(1.0, &mut gc);
        for (gt, v) in lin_golden.iter().filter(|(gt, _)| *gt == t) {
            assert!(
                close(gs[0].weight_decay, *v, 1e-9),
                "linear wd t={gt}: {}",
                gs[0].weight_decay
            );
        }
        for (gt, v) in cos_golden.iter().filter(|(gt, _)| *gt == t) {
            assert!(
                close(gc[0].weight_decay, *v, 1e-9),
                "cosine wd t={gt}: {}",
                gc[0].weight_decay
            );
        }
    }
}

#[test]
fn megatron_lr_warmup_init_and_sample_increments() {
    let mut c = config(LrDecayStyle::Linear, None, WdIncrStyle::Constant);
    c.init_lr = 1e-4;
    c.start_wd = 0.1;
    let mut gs = groups();
    let mut s = OptimizerParamScheduler::new(c, &mut gs).unwrap();
    assert_eq!(gs[0].lr, 1e-4);
    assert_eq!(gs[0].weight_decay, 0.1);
    s.step(32.0, &mut gs); // one global batch of 32 samples
    assert!(close(gs[0].lr, 1e-4 + (1e-3 - 1e-4) * 32.0 / 100.0, 1e-15));
    assert_eq!(s.num_steps(), 32.0);
}

#[test]
fn megatron_config_errors() {
    let mut gs = groups();
    let bad = |f: &dyn Fn(&mut MegatronSchedulerConfig)| {
        let mut c = config(LrDecayStyle::Linear, None, WdIncrStyle::Linear);
        f(&mut c);
        c
    };
    for c in [
        bad(&|c| c.min_lr = -1.0),
        bad(&|c| c.max_lr = 1e-6),
        bad(&|c| c.init_lr = 1.0),
        bad(&|c| c.lr_decay_steps = 0.0),
        bad(&|c| c.lr_warmup_steps = 1000.0),
        bad(&|c| c.lr_decay_style = LrDecayStyle::Wsd),
        bad(&|c| c.start_wd = 0.2),
    ] {
        assert!(OptimizerParamScheduler::new(c, &mut gs).is_err(), "{c:?}");
    }
}

/// `get_wsd_schedule_with_warmup`'s defaults (verl 0.7.0's legacy SFT trainer).
const WSD: VerlSchedule = VerlSchedule::Wsd {
    min_lr_ratio: 0.0,
    num_cycles: 0.5,
    stable_ratio: 0.9,
};

/// verl's own constant / cosine / WSD LambdaLR functions (run by the oracle), every step.
#[test]
fn verl_schedules_match_verl() {
    let j = oracle::json("verl");
    let cases = [
        ("constant_w10", VerlSchedule::Constant, 10, 100),
        ("constant_w0", VerlSchedule::Constant, 0, 100),
        (
            "cosine_w10",
            VerlSchedule::Cosine {
                min_lr_ratio: 0.0,
                num_cycles: 0.5,
            },
            10,
            100,
        ),
        (
            "cosine_min",
            VerlSchedule::Cosine {
                min_lr_ratio: 0.1,
                num_cycles: 0.5,
            },
            5,
            100,
        ),
        (
            "cosine_cycles",
            VerlSchedule::Cosine {
                min_lr_ratio: 0.05,
                num_cycles: 1.5,
            },
            0,
            100,
        ),
        ("wsd_w10", WSD, 10, 100),
        ("wsd_w0_short", WSD, 0, 7),
    ];
    // verl 0.9.1's `zero_indexed_step: false` (its cosine counts steps from 1).
    let one_indexed = (
        "cosine_one_indexed_0_9",
        VerlSchedule::Cosine {
            min_lr_ratio: 0.1,
            num_cycles: 0.5,
        },
        5,
        100,
    );
    for (name, schedule, warmup, total) in cases.into_iter().chain([one_indexed]) {
        let want = j[name]
            .as_array()
            .unwrap_or_else(|| panic!("oracle lacks {name} (scripts/setup unpacks verl 0.9.1)"));
        let mut gs = vec![GroupOptions::new(1e-3, 0.0), GroupOptions::new(5e-4, 0.0)];
        let cfg = VerlSchedulerConfig {
            schedule,
            lr_warmup_steps: warmup,
            lr_warmup_steps_ratio: 0.0,
            total_training_steps: total,
            zero_indexed_step: name != "cosine_one_indexed_0_9",
        };
        let mut s = VerlLrScheduler::new(&cfg, &mut gs).unwrap();
        for (t, row) in want.iter().enumerate() {
            for (g, v) in gs.iter().zip(row.as_array().unwrap()) {
                let v = v.as_f64().unwrap();
                assert!(
                    close(g.lr, v, 1e-15),
                    "{name} step {t}: {} vs verl {v}",
                    g.lr
                );
            }
            s.step(&mut gs);
        }
    }
}

#[test]
fn verl_warmup_from_ratio_and_errors() {
    let cfg = VerlSchedulerConfig {
        schedule: VerlSchedule::Constant,
        lr_warmup_steps: -1,
        lr_warmup_steps_ratio: 0.1,
        total_training_steps: 95,
        zero_indexed_step: true,
    };
    assert_eq!(cfg.warmup_steps(), 9);
    let cfg = VerlSchedulerConfig {
        lr_warmup_steps: 0,
        ..cfg
    };
    assert_eq!(cfg.warmup_steps(), 9, "the engine treats 0 like -1");
    let cfg = VerlSchedulerConfig {
        lr_warmup_steps: 3,
        ..cfg
    };
    assert_eq!(cfg.warmup_steps(), 3);
    let bad = VerlSchedulerConfig {
        schedule: VerlSchedule::Cosine {
            min_lr_ratio: 1.5,
            num_cycles: 0.5,
        },
        ..cfg
    };
    assert!(VerlLrScheduler::new(&bad, &mut [GroupOptions::new(1.0, 0.0)]).is_err());
}
