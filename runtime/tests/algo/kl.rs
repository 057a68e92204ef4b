//! KL estimators: every name's value and gradient against the oracle, the straight-through
//! variants through autograd, hand-derived values and the full-vocabulary KL.
use tch::{Kind, Tensor};
use verlc_runtime::algo::kl::{KL_NAMES, kl_loss, kl_value};
use verlc_runtime::algo::{AggOptions, AlgoError, KlEstimator, KlKind, LossAggMode, kl_penalty};

use crate::oracle;
use crate::support::{assert_close, assert_near, leaf, scalar, t2, to_vec};

/// Value and gradient of `sum(cot · kl(lp, ref))` w.r.t. `lp`.
fn value_and_grad(
    est: KlEstimator,
    lp: &Tensor,
    reference: &Tensor,
    cot: &Tensor,
) -> (Tensor, Tensor) {
    let x = leaf(lp);
    let v = kl_penalty(&x, reference, est).unwrap();
    (&v * cot).sum(Kind::Double).backward();
    (v.detach(), x.grad())
}

#[test]
fn every_kl_name_matches_oracle() {
    let o = oracle::load("kl");
    for name in KL_NAMES.iter().filter(|n| !n.starts_with("full")) {
        let est: KlEstimator = name.parse().unwrap();
        let (v, g) = value_and_grad(est, o.get("lp"), o.get("ref"), o.get("cot"));
        assert_close(
            &v,
            o.get(&format!("{name}/value")),
            1e-12,
            &format!("{name} value"),
        );
        assert_close(
            &g,
            o.get(&format!("{name}/grad")),
            1e-12,
            &format!("{name} grad"),
        );
    }
}

#[test]
fn straight_through_forward_is_one_estimator_gradient_another() {
    // "+" names: the value of the named estimator, the gradient of k2 (dk2/dlogπ = Δ).
    let o = oracle::load("kl");
    let (lp, reference, cot) = (o.get("lp"), o.get("ref"), o.get("cot"));
    let delta = lp - reference;
    for (plus, base) in [
        ("k1+", KlKind::K1),
        ("abs+", KlKind::Abs),
        ("k3+", KlKind::K3),
        ("low_var_kl+", KlKind::K3),
    ] {
        let est: KlEstimator = plus.parse().unwrap();
        assert_eq!(est, KlEstimator::straight_through(base, KlKind::K2));
        let (v, g) = value_and_grad(est, lp, reference, cot);
        assert_close(
            &v,
            &kl_value(base, lp, reference).unwrap(),
            0.0,
            &format!("{plus} forward"),
        );
        assert_close(&g, &(cot * &delta), 1e-12, &format!("{plus} gradient"));
    }
    // Any pair works: value of k3, gradient of k1 (dk1/dlogπ = 1).
    let est = KlEstimator::straight_through(KlKind::K3, KlKind::K1);
    let (v, g) = value_and_grad(est, lp, reference, cot);
    assert_close(
        &v,
        &kl_value(KlKind::K3, lp, reference).unwrap(),
        0.0,
        "k3 value",
    );
    assert_close(&g, cot, 1e-12, "k1 gradient");
    // Gradient descent on a straight-through loss moves like k2: one step with lr 0.1 from
    // Δ = 1 gives Δ = 0.9 for every forward estimator.
    for name in ["k1+", "abs+", "k3+"] {
        let x = leaf(&t2(&[&[0.0]]));
        kl_penalty(&x, &t2(&[&[-1.0]]), name.parse().unwrap())
            .unwrap()
            .sum(Kind::Double)
            .backward();
        assert_near(scalar(&(x.detach() - x.grad() * 0.1)), -0.1, 1e-12, name);
    }
}

#[test]
fn kl_hand_derived() {
    // Δ = ln 2 (π = 2·π_ref): k1 = abs = 0.6931472, k2 = ½(ln 2)² = 0.2402265,
    // k3 = e^{−ln 2} + ln 2 − 1 = 0.5 + 0.6931472 − 1 = 0.1931472.
    // Δ = −ln 2: k1 = −0.6931472, abs = 0.6931472, k2 = 0.2402265, k3 = 2 − ln 2 − 1 = 0.3068528.
    let lp = t2(&[&[2f64.ln() - 3.0, -(2f64.ln()) - 3.0]]);
    let reference = t2(&[&[-3.0, -3.0]]);
    let l2 = 2f64.ln();
    let cases = [
        ("kl", [l2, -l2]),
        ("abs", [l2, l2]),
        ("mse", [0.5 * l2 * l2, 0.5 * l2 * l2]),
        ("low_var_kl", [0.5 + l2 - 1.0, 2.0 - l2 - 1.0]),
    ];
    for (name, want) in cases {
        let v = kl_penalty(&lp, &reference, name.parse().unwrap()).unwrap();
        assert_close(&v, &t2(&[&want]), 1e-12, name);
    }
    // k3 clamps: Δ = −30 → δ = clamp(30, −20, 20) = 20, e^20 − 21 ≫ 10 → 10; Δ = 30 → δ = −20,
    // e^−20 + 19 = 19.000000002 → 10.
    let v = kl_penalty(
        &t2(&[&[-30.0, 30.0]]),
        &t2(&[&[0.0, 0.0]]),
        "k3".parse().unwrap(),
    )
    .unwrap();
    assert_eq!(to_vec(&v), vec![10.0, 10.0]);
}

#[test]
fn full_kl_over_the_vocabulary() {
    let o = oracle::load("kl");
    let est: KlEstimator = "full".parse().unwrap();
    let (v, g) = value_and_grad(est, o.get("full/lp"), o.get("full/ref"), o.get("full/cot"));
    assert_close(&v, o.get("full/value"), 1e-12, "full value");
    assert_close(&g, o.get("full/grad"), 1e-12, "full grad");
    // KL(p‖p) = 0, KL ≥ 0.
    let p = o.get("full/lp");
    assert!(
        to_vec(&kl_penalty(p, p, est).unwrap())
            .iter()
            .all(|&x| x.abs() < 1e-15)
    );
    assert!(to_vec(&v).iter().all(|&x| x >= 0.0));
    // Token log-probs are not enough for the full KL.
    let err = kl_penalty(&t2(&[&[-1.0]]), &t2(&[&[-1.0]]), est).unwrap_err();
    assert!(matches!(err, AlgoError::Shape { .. }), "{err}");
}

#[test]
fn kl_loss_aggregates_the_penalty() {
    // k1 over mask [[1, 1], [1, 0]] with Δ = [[0.1, 0.2], [0.3, 9]]: token-mean = 0.6/3 = 0.2.
    let lp = t2(&[&[0.1, 0.2], &[0.3, 9.0]]);
    let reference = Tensor::zeros([2, 2], (Kind::Double, tch::Device::Cpu));
    let mask = t2(&[&[1.0, 1.0], &[1.0, 0.0]]);
    let l = kl_loss(
        &lp,
        &reference,
        &mask,
        "k1".parse().unwrap(),
        LossAggMode::TokenMean,
        &AggOptions::default(),
    )
    .unwrap();
    assert_near(scalar(&l), 0.2, 1e-8, "kl loss");
}

#[test]
fn kl_names_parse_and_print() {
    for name in KL_NAMES {
        let est: KlEstimator = name.parse().unwrap();
        assert_eq!(
            name.ends_with('+') && !matches!(*name, "mse+" | "k2+"),
            est.is_straight_through(),
            "{name}"
        );
        // The printed name parses back to the same estimator.
        assert_eq!(
            est.to_string().parse::<KlEstimator>().unwrap(),
            est,
            "{name}"
        );
    }
    for bad in ["k4", "full+", "KL", ""] {
        let err: AlgoError = bad.parse::<KlEstimator>().unwrap_err().into();
        assert!(matches!(err, AlgoError::UnknownName(_)), "{bad}: {err}");
    }
    let err = kl_penalty(
        &t2(&[&[1.0]]),
        &t2(&[&[1.0, 2.0]]),
        KlEstimator::plain(KlKind::K1),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            AlgoError::Shape {
                name: "ref_log_prob",
                ..
            }
        ),
        "{err}"
    );
}
