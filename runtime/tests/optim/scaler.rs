//! Grad scalers (docs/optimizer.md) against sequences recorded from Megatron's own class.
use verlc_runtime::optim::{GradScaler, ScalerConfig};

fn dynamic(initial: f64, min: f64, interval: u64, hysteresis: i64) -> GradScaler {
    GradScaler::new(ScalerConfig::Dynamic {
        initial_scale: initial,
        min_scale: min,
        growth_factor: 2.0,
        backoff_factor: 0.5,
        growth_interval: interval,
        hysteresis,
    })
    .unwrap()
}

#[test]
fn dynamic_scaler_15_step_golden_sequence() {
    let mut s = dynamic(2f64.powi(32), 1.0, 3, 2);
    // (found_inf, log2 scale after, growth_tracker, hysteresis_tracker)
    let golden: [(bool, i32, u64, i64); 15] = [
        (true, 32, 0, 1),
        (true, 31, 0, 0),
        (true, 30, 0, -1),
        (false, 30, 1, -1),
        (true, 29, 0, -2),
        (false, 29, 1, -2),
        (false, 29, 2, -2),
        (false, 30, 0, 2),
        (false, 30, 1, 2),
        (false, 30, 2, 2),
        (false, 31, 0, 2),
        (true, 31, 0, 1),
        (false, 31, 1, 1),
        (false, 31, 2, 1),
        (false, 32, 0, 2),
    ];
    for (i, (inf, log2, growth, hyst)) in golden.into_iter().enumerate() {
        s.update(inf);
        let step = i + 1;
        assert_eq!(s.scale(), 2f32.powi(log2), "step {step}");
        assert_eq!(s.growth_tracker(), growth, "step {step}");
        assert_eq!(s.hysteresis_tracker(), hyst, "step {step}");
    }
}

#[test]
fn dynamic_scaler_clamps_at_min_scale() {
    let mut s = dynamic(4.0, 1.0, 1000, 1);
    let mut seen = vec![];
    for _ in 0..4 {
        s.update(true);
        seen.push((s.scale(), s.hysteresis_tracker()));
    }
    assert_eq!(seen, vec![(2.0, 0), (1.0, -1), (1.0, -2), (1.0, -3)]);
}

#[test]
fn constant_scaler_never_moves() {
    let mut s = GradScaler::new(ScalerConfig::Constant { scale: 1024.0 }).unwrap();
    s.update(true);
    s.update(false);
    assert_eq!(s.scale(), 1024.0);
    assert_eq!(s.inv_scale(), (1.0f64 / 1024.0) as f32);
}

#[test]
fn invalid_configs_are_errors() {
    let base = ScalerConfig::megatron_dynamic();
    let with = |f: &dyn Fn(&mut ScalerConfig)| {
        let mut c = base;
        f(&mut c);
        GradScaler::new(c)
    };
    assert!(GradScaler::new(base).is_ok());
    assert!(
        with(&|c| if let ScalerConfig::Dynamic { min_scale, .. } = c {
            *min_scale = 2f64.powi(40)
        })
        .is_err()
    );
    assert!(
        with(
            &|c| if let ScalerConfig::Dynamic { growth_factor, .. } = c {
                *growth_factor = 1.0
            }
        )
        .is_err()
    );
    assert!(
        with(
            &|c| if let ScalerConfig::Dynamic { backoff_factor, .. } = c {
                *backoff_factor = 1.0
            }
        )
        .is_err()
    );
    assert!(
        with(&|c| if let ScalerConfig::Dynamic {
            growth_interval, ..
        } = c
        {
            *growth_interval = 0
        })
        .is_err()
    );
    assert!(
        with(&|c| if let ScalerConfig::Dynamic { hysteresis, .. } = c {
            *hysteresis = 0
        })
        .is_err()
    );
    assert!(GradScaler::new(ScalerConfig::Constant { scale: 0.0 }).is_err());
}
