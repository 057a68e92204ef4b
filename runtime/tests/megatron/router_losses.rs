//! The router's load-balancing and z-losses (Megatron's `aux_loss` load balancing and
//! `moe_z_loss_coeff`, added to the gradient only) on a Qwen3-MoE: under context parallelism 2
//! and under tensor parallelism 2 with sequence parallelism, training follows the one-process
//! module with the same losses step by step (reported losses, grad norms, final weights), and
//! the losses move the weights (the run without them ends elsewhere).
use runtime::dist::{ProcessGroup, ProcessGroups, RankLayout};
use runtime::megatron::{HeadKind, MegatronModule, ParallelSettings};
use runtime::model::moe::RouterLossCoeffs;
use runtime::optim::LossScaling;
use tch::{Device, Kind, Tensor};

use crate::parity::train_steps;
use crate::rank_test;
use crate::support::{
    Setup, full_weights, make_groups, max_diff, reference_model, tiny_moe_config,
};

const COEFFS: RouterLossCoeffs = RouterLossCoeffs {
    load_balancing: 0.5,
    z: 0.05,
};

/// Losses, grad norms and final weights of `layout` (`None`: one process) over `world`.
fn run(
    world: &ProcessGroup,
    layout: Option<RankLayout>,
    sequence_parallel: bool,
    coeffs: RouterLossCoeffs,
) -> (Vec<f64>, Vec<f64>, Vec<(String, Tensor)>) {
    let cfg = tiny_moe_config();
    let setup = Setup::fp32();
    let copies = layout
        .as_ref()
        .map_or(world.size(), |l| l.size("tp") * l.size("cp"));
    let groups = layout.map(|l| ProcessGroups::new(world, &l).unwrap());
    let mut m = MegatronModule::with_sequence_parallel(
        &cfg,
        HeadKind::CausalLm,
        groups,
        Device::Cpu,
        Kind::Float,
        sequence_parallel,
    )
    .unwrap();
    m.model.set_router(coeffs, false);
    let (vs, _) = reference_model(&cfg, Kind::Float);
    m.load_full(&full_weights(&vs)).unwrap();
    m.build_optimizer(
        setup.optim,
        make_groups,
        ParallelSettings::default(),
        LossScaling::LINKED,
    )
    .unwrap();
    let (losses, norms) = train_steps(world, &mut m, &cfg, copies, 2);
    if coeffs.any() {
        assert_eq!(
            m.router_values().len(),
            2 * 2,
            "one value per MoE layer (2) and micro-batch (2)"
        );
    }
    (losses, norms, m.full_params().unwrap())
}

fn assert_follows(
    what: &str,
    (losses, norms, weights): &(Vec<f64>, Vec<f64>, Vec<(String, Tensor)>),
    (ref_losses, ref_norms, ref_weights): &(Vec<f64>, Vec<f64>, Vec<(String, Tensor)>),
) {
    for (i, ((a, b), (na, nb))) in losses
        .iter()
        .zip(ref_losses)
        .zip(norms.iter().zip(ref_norms))
        .enumerate()
    {
        assert!(
            (a - b).abs() <= 5e-5 * b.abs().max(1.0),
            "{what} step {i}: loss {a} vs {b}"
        );
        assert!(
            (na - nb).abs() <= 1e-4 * nb.abs().max(1.0),
            "{what} step {i}: norm {na} vs {nb}"
        );
    }
    for (name, w) in ref_weights {
        let (_, got) = weights.iter().find(|(n, _)| n == name).unwrap();
        let d = max_diff(got, w);
        assert!(d < 1e-4, "{what} {name}: {d}");
    }
}

rank_test!(
    router_losses_follow_one_process_under_cp_and_tp,
    2,
    |world| {
        let one = run(&world, None, false, COEFFS);
        let without = run(&world, None, false, RouterLossCoeffs::default());
        let moved = one
            .2
            .iter()
            .filter(|(n, _)| n.ends_with("mlp.gate.weight"))
            .map(|(n, w)| max_diff(w, &without.2.iter().find(|(m, _)| m == n).unwrap().1))
            .fold(0.0, f64::max);
        assert!(
            moved > 1e-3,
            "the router losses do not move the router ({moved})"
        );
        for (what, (tp, cp), sp) in [
            ("CP=2", (1, 2), false),
            ("TP=2 with sequence parallelism", (2, 1), true),
        ] {
            let layout = RankLayout::megatron(tp, cp, 1, 1).unwrap();
            assert_follows(what, &run(&world, Some(layout), sp, COEFFS), &one);
        }
    }
);
