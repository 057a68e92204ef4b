//! Per-rank memory of the Megatron engine against one rank: parameters and gradients shrink
//! with tensor × pipeline parallelism, the distributed optimizer's share also with data
//! parallelism, and the rollout holds only the rank's shards while it generates. Bounds are
//! the ideal fraction + 10% of the one-rank figure (replicated norms, vocabulary padding and
//! bucket padding are the slack). The parameters take no more than one copy of the weights: they
//! are views of the distributed optimizer's param buffer.
//!
//! The model has untied embeddings: with tied ones the last pipeline stage holds its own copy of
//! the embedding (Megatron does the same), which no layout can split.
use tch::{Device, Kind, Tensor};
use verlc_runtime::engine::megatron::{MegatronEngine, ModuleMemory};
use verlc_runtime::engine::{
    Batch, Engine, EngineSettings, ForwardOptions, MicroBatching, MicroLoss,
};
use verlc_runtime::model::{CausalLm, Dtype};
use verlc_runtime::parallel::dist::ProcessGroup;
use verlc_runtime::rollout::{SamplingParams, StopTokens};
use verlc_runtime::workers::rollout::RolloutWorker;

use crate::rank_test;

const MODEL: &str = "builtin://tiny?layers=4&hidden=64&heads=4&kv_heads=4&intermediate=128";

fn settings() -> EngineSettings {
    let mut overrides = serde_json::Map::new();
    overrides.insert("tie_word_embeddings".into(), false.into());
    EngineSettings {
        model_path: MODEL.into(),
        config_overrides: overrides,
        ..crate::engine::engine_settings()
    }
}

fn engine(world: Option<&ProcessGroup>, dims: (usize, usize, usize)) -> MegatronEngine<CausalLm> {
    let megatron = crate::engine::megatron_settings(world, dims, false, false);
    MegatronEngine::new(settings(), megatron).unwrap()
}

/// What one rank holds: after a backward (parameters, gradients), after the step (optimizer
/// state), and while the rollout has its weights bound.
#[derive(Debug, Clone, Copy)]
struct Held {
    after_backward: ModuleMemory,
    after_step: ModuleMemory,
    rollout_weights: i64,
}

fn measure(engine: &mut MegatronEngine<CausalLm>) -> Held {
    let (rows, t, r) = (4i64, 12i64, 4i64);
    let vocab = engine.model_config().vocab_size;
    let ids = Tensor::arange(rows * t, (Kind::Int64, Device::Cpu)).remainder(vocab - 4) + 3;
    let ids = ids.view([rows, t]);
    let mut batch = Batch::new();
    batch.insert("responses", ids.narrow(1, t - r, r)).unwrap();
    batch.insert("input_ids", ids).unwrap();
    batch
        .insert(
            "response_mask",
            Tensor::ones([rows, r], (Kind::Float, Device::Cpu)),
        )
        .unwrap();
    batch
        .insert(
            "attention_mask",
            Tensor::ones([rows, t], (Kind::Int64, Device::Cpu)),
        )
        .unwrap();
    batch
        .insert(
            "position_ids",
            Tensor::arange(t, (Kind::Int64, Device::Cpu)).repeat([rows, 1]),
        )
        .unwrap();
    let fwd = ForwardOptions {
        temperature: 1.0,
        with_entropy: false,
        with_sum_pi_squared: false,
        ..ForwardOptions::default()
    };
    let mut loss = |_: &Batch, out: verlc_runtime::logits::LogProbOutput, _: &_| {
        Ok(MicroLoss {
            loss: -out.log_probs.mean(Kind::Float),
            metrics: Default::default(),
        })
    };
    engine.optimizer_zero_grad().unwrap();
    engine
        .forward_backward(&batch, &MicroBatching::Rows(2), &fwd, &mut loss)
        .unwrap();
    let after_backward = engine.megatron_module().memory();
    engine.optimizer_step().unwrap();
    let after_step = engine.megatron_module().memory();

    let mut rollout = RolloutWorker::for_layout(
        &engine.rollout_layout(None).unwrap(),
        Dtype::Fp32,
        Device::Cpu,
    )
    .unwrap();
    rollout
        .update_weights(&engine.rollout_weights().unwrap())
        .unwrap();
    let rollout_weights = rollout.weight_bytes();
    // It generates from those weights alone (every rank of the model takes part).
    let out = rollout
        .generate(
            &[vec![5, 6, 7]],
            &SamplingParams {
                max_new_tokens: 3,
                ..SamplingParams::default()
            },
            &StopTokens {
                eos: vec![],
                pad: 0,
            },
        )
        .unwrap();
    assert_eq!(out.responses.size(), vec![1, 3]);
    rollout.release().unwrap();
    Held {
        after_backward,
        after_step,
        rollout_weights,
    }
}

fn within(what: &str, got: i64, one: i64, fraction: f64) {
    let bound = one as f64 * (fraction + 0.1);
    eprintln!("{what}: {got} bytes of one rank's {one} (bound {bound:.0})");
    assert!(got > 0, "{what}: nothing measured");
    assert!(
        got as f64 <= bound,
        "{what}: {got} bytes, more than {fraction} + 10% of one rank's {one}"
    );
}

fn check(world: &ProcessGroup, dims: (usize, usize, usize)) {
    let (tp, pp, dp) = dims;
    let one = measure(&mut engine(None, (1, 1, 1)));
    let mine = measure(&mut engine(Some(world), dims));
    let model = 1.0 / (tp * pp) as f64;
    let tag = |w: &str| format!("tp={tp} pp={pp} dp={dp} rank {}: {w}", world.rank());
    within(
        &tag("parameters"),
        mine.after_backward.params,
        one.after_backward.params,
        model,
    );
    within(
        &tag("gradients"),
        mine.after_backward.grads,
        one.after_backward.grads,
        model,
    );
    within(
        &tag("optimizer"),
        mine.after_step.optimizer,
        one.after_step.optimizer,
        model / dp as f64,
    );
    within(
        &tag("rollout weights"),
        mine.rollout_weights,
        one.rollout_weights,
        model,
    );
    // The weights are held once: the parameters are views of the distributed optimizer's
    // param buffer (as in Megatron), so with it they take about what the rollout's copy of the
    // same shards takes (bucket padding is the slack), not twice that.
    for (what, held) in [("one rank", one), ("this rank", mine)] {
        let (params, weights) = (held.after_backward.params, held.rollout_weights);
        eprintln!(
            "{}: parameters {params} bytes, their weights {weights}",
            tag(what)
        );
        assert!(
            params as f64 <= 1.1 * weights as f64,
            "{}: parameters hold {params} bytes for {weights} bytes of weights",
            tag(what)
        );
    }
}

rank_test!(tp2_holds_half_per_rank, 2, |world| {
    check(&world, (2, 1, 1));
});

rank_test!(pp2_holds_half_per_rank, 2, |world| {
    check(&world, (1, 2, 1));
});

rank_test!(tp2_pp2_holds_a_quarter_per_rank, 4, |world| {
    check(&world, (2, 2, 1));
});

rank_test!(
    tp2_dp2_shards_the_optimizer_over_data_parallel,
    4,
    |world| {
        check(&world, (2, 1, 2));
    }
);
