//! A vision-language model (the tiny Qwen3-VL: a tower whose DeepStack features go into the
//! first decoder layer, interleaved M-RoPE) trained on Megatron layouts of 2 Gloo ranks
//! against the single-process model with the same images, in lockstep (support.rs): TP=2
//! with sequence parallelism, PP=2 (the tower on the first stage only), CP=2. The tower's
//! weights start ten times larger than the tiny model's init, so that its embeddings and
//! DeepStack features weigh in the loss and its gradients are compared as everything else.
use tch::nn::VarStore;
use tch::{Device, Kind, Tensor};
use verlc_runtime::builtin_uri::BuiltinUri;
use verlc_runtime::engine::megatron::{
    HeadKind, MegatronModule, MicroBatch, MicroImages, ParallelSettings,
};
use verlc_runtime::model::vision::{MropeTokens, ProcessedImage, Vision};
use verlc_runtime::model::{CausalLm, ModelConfig};
use verlc_runtime::optim::param_groups::named_params;
use verlc_runtime::optim::{LossScaling, Optimizer};
use verlc_runtime::parallel::dist::ProcessGroup;
use verlc_runtime::parallel::layout::{ProcessGroups, RankLayout};

use crate::parity::Parallel;
use crate::rank_test;
use crate::support::*;

const ROWS: i64 = 4;
const LEN: i64 = 16;

fn vl_config() -> ModelConfig {
    let uri = BuiltinUri::parse(
        "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&intermediate=48&arch=qwen3_vl",
    )
    .unwrap()
    .unwrap();
    let mut cfg = verlc_runtime::model::builtin::config(&uri).unwrap();
    cfg.tie_word_embeddings = false;
    cfg.extra.remove("pad_token_id");
    cfg
}

fn token(cfg: &ModelConfig, key: &str) -> i64 {
    cfg.extra[key].as_i64().unwrap()
}

/// The fixed batch: each row (some left-padded) a vision span of one 4x4-patch image (four
/// placeholders after merging), then text; the images' patches; the M-RoPE positions.
struct VlBatch {
    ids: Tensor,
    mask: Tensor,
    pos: Tensor,
    images: Vec<ProcessedImage>,
}

fn vl_batch(cfg: &ModelConfig, tokens: &MropeTokens) -> VlBatch {
    let mut rng = verlc_runtime::rng::Rng::new(7);
    let v = &cfg.extra["vision_config"];
    let get = |k: &str, default: i64| v.get(k).and_then(|x| x.as_i64()).unwrap_or(default);
    let patch = get("patch_size", 16);
    let patch_width =
        (get("in_channels", 3) * get("temporal_patch_size", 2) * patch * patch) as usize;
    let images: Vec<ProcessedImage> = (0..ROWS)
        .map(|_| ProcessedImage {
            pixel_values: (0..16 * patch_width).map(|_| rng.normal() as f32).collect(),
            grid_thw: [1, 4, 4],
            seconds_per_grid: None,
            timestamps: Vec::new(),
        })
        .collect();
    let (start, image, end) = (
        token(cfg, "vision_start_token_id"),
        token(cfg, "image_token_id"),
        token(cfg, "vision_end_token_id"),
    );
    let text_vocab = start.min(image).min(end) - 1;
    let mut ids = Vec::new();
    let mut mask = Vec::new();
    for r in 0..ROWS {
        let pad = r % 3;
        let mut row = vec![0; pad as usize];
        row.extend([start, image, image, image, image, end]);
        while (row.len() as i64) < LEN {
            row.push(rng.range(1, text_vocab));
        }
        mask.extend((0..LEN).map(|i| i64::from(i >= pad)));
        ids.extend(row);
    }
    let ids = Tensor::from_slice(&ids).view([ROWS, LEN]);
    let mask = Tensor::from_slice(&mask).view([ROWS, LEN]);
    let grids: Vec<[i64; 3]> = images.iter().map(|i| i.grid_thw).collect();
    let (pos, _) = tokens.positions(&ids, &mask, &grids).unwrap();
    VlBatch {
        ids,
        mask,
        pos,
        images,
    }
}

/// The single-process model with seeded weights, its tower's scaled up.
fn vl_reference_model(cfg: &ModelConfig) -> (VarStore, CausalLm) {
    let (vs, model) = reference_model(cfg, Kind::Float);
    tch::no_grad(|| {
        for (name, t) in vs.variables() {
            if name.starts_with("visual.") && t.dim() > 1 {
                let _ = t.shallow_clone().f_mul_scalar_(10.0).unwrap();
            }
        }
    });
    (vs, model)
}

struct VlReference {
    vs: VarStore,
    model: CausalLm,
    opt: Optimizer,
    batch: VlBatch,
    n: f64,
}

impl Stepper for VlReference {
    fn step(&mut self) -> (f64, f64) {
        let b = &self.batch;
        self.opt.zero_grad().unwrap();
        let refs: Vec<&ProcessedImage> = b.images.iter().collect();
        let (pixels, grids) = Vision::pixels(&refs, Device::Cpu).unwrap();
        let logits = self
            .model
            .forward_pixels(&b.ids, &b.mask, &pixels, &grids)
            .unwrap();
        next_token_step(&mut self.opt, &logits, &b.ids, &b.mask, self.n)
    }

    fn weights(&self) -> Vec<(String, Tensor)> {
        full_weights(&self.vs)
    }

    fn gradients(&self) -> Option<Vec<(String, Tensor)>> {
        Some(gradients_of(&self.vs))
    }

    fn load(&mut self, weights: &[(String, Tensor)]) {
        load_into(&self.vs, &mut self.opt, weights);
    }
}

/// Lockstep of the layout `(tp, cp, pp)` on 2 ranks against one process; the tower's
/// parameters must be among the compared ones and their gradients far from rounding.
fn vl_matches(world: &ProcessGroup, (tp, cp, pp): (usize, usize, usize), sp: bool) {
    let cfg = vl_config();
    let setup = Setup::fp32();
    let (vs, model) = vl_reference_model(&cfg);
    let batch = vl_batch(&cfg, &model.vision.as_ref().unwrap().tokens);
    let n = token_count(&batch.mask);
    let weights = full_weights(&vs);
    let opt = Optimizer::new(make_groups(named_params(&vs)), setup.optim).unwrap();

    let layout = RankLayout::megatron(tp, cp, pp, 1).unwrap();
    let groups = ProcessGroups::new(world, &layout).unwrap();
    let mut module = MegatronModule::with_sequence_parallel(
        &cfg,
        HeadKind::CausalLm,
        Some(groups),
        Device::Cpu,
        Kind::Float,
        sp,
    )
    .unwrap();
    module.load_full(&weights).unwrap();
    module
        .build_optimizer(
            setup.optim,
            make_groups,
            ParallelSettings::default(),
            LossScaling::LINKED,
        )
        .unwrap();
    let first = module.model.stage.is_first();
    assert_eq!(
        module
            .model
            .params()
            .iter()
            .any(|p| p.name.starts_with("visual.")),
        first,
        "the tower lives on the first stage"
    );
    let mbs = (0..2)
        .map(|i| {
            let rows = |t: &Tensor| t.narrow(0, i * 2, 2);
            let refs: Vec<&ProcessedImage> = batch.images[(i * 2) as usize..(i * 2 + 2) as usize]
                .iter()
                .collect();
            let (pixels, grids) = Vision::pixels(&refs, Device::Cpu).unwrap();
            MicroBatch {
                input_ids: rows(&batch.ids),
                position_ids: rows(&batch.pos),
                attention_mask: Some(rows(&batch.mask)),
                images: Some(MicroImages {
                    pixels,
                    grids,
                    videos: Vec::new(),
                    prompt_width: LEN,
                }),
            }
        })
        .collect();
    let mut reference = VlReference {
        vs,
        model,
        opt,
        batch,
        n,
    };
    // Every rank holds every row (one data-parallel rank), in two micro-batches.
    let mut parallel = Parallel::on(world, &mut module, mbs, n, tp * cp);
    lockstep(&mut reference, &mut parallel, 4, 1e-5);
    // The tower matters: its gradients are a real share of the whole.
    let grads = reference.gradients().unwrap();
    let norm = |keep: &dyn Fn(&str) -> bool| {
        grads
            .iter()
            .filter(|(n, g)| keep(n) && g.defined())
            .map(|(_, g)| g.pow_tensor_scalar(2).sum(Kind::Double).double_value(&[]))
            .sum::<f64>()
            .sqrt()
    };
    let (tower, all) = (norm(&|n| n.starts_with("visual.")), norm(&|_| true));
    assert!(tower > 0.02 * all, "tower gradient {tower} of {all}");
}

rank_test!(
    vision_language_tp2_sequence_parallel_matches_single_process,
    2,
    |world| {
        vl_matches(&world, (2, 1, 1), true);
    }
);

rank_test!(vision_language_pp2_matches_single_process, 2, |world| {
    vl_matches(&world, (1, 1, 2), false);
});

rank_test!(vision_language_cp2_matches_single_process, 2, |world| {
    vl_matches(&world, (1, 2, 1), false);
});

/// A vision-language critic (verl's value head over the image-text model: the tiny Qwen3-VL's
/// value model, its tower on the first stage) on Megatron at TP=2 with sequence parallelism,
/// against the single engine's critic, whose values and gradients equal a value head over
/// transformers (`model/vision.rs`): the values of a batch with its images, then two clipped
/// value updates (two epochs of two shuffled micro-batches), the weights equal after each. The
/// tower starts ten times larger, so that the pictures move the values (checked).
fn vl_critic_matches_single(world: &ProcessGroup) {
    use crate::engine::{
        critic_settings, critic_updates_match, engine_settings, megatron_settings,
    };
    use verlc_runtime::engine::Engine;
    use verlc_runtime::engine::batch::{Batch, RowImages};
    use verlc_runtime::engine::megatron::MegatronEngine;
    use verlc_runtime::engine::single::SingleEngine;
    use verlc_runtime::model::ValueModel;
    use verlc_runtime::workers::critic::{Critic, CriticSettings};

    let settings = || verlc_runtime::engine::EngineSettings {
        model_path: VL_MODEL.into(),
        ..engine_settings()
    };
    let critic = CriticSettings {
        ppo_mini_batch_size: 4,
        ppo_micro_batch_size: 2,
        forward_micro_batch_size: 2,
        ..critic_settings()
    };
    let mut single = Critic::new(
        SingleEngine::<ValueModel>::new(settings()).unwrap(),
        critic.clone(),
    )
    .unwrap();
    let mega_engine = MegatronEngine::<ValueModel>::new(
        settings(),
        megatron_settings(Some(world), (2, 1, 1), true, false),
    )
    .unwrap();
    let mut mega = Critic::new(mega_engine, critic).unwrap();
    let scaled: Vec<(String, Tensor)> = single
        .engine
        .per_tensor_params()
        .unwrap()
        .into_iter()
        .map(|(n, t)| {
            let t = if n.starts_with("visual.") && t.dim() > 1 {
                t * 10.0
            } else {
                t
            };
            (n, t)
        })
        .collect();
    single.engine.load_params(&scaled).unwrap();
    mega.engine.load_params(&scaled).unwrap();

    let cfg = single.engine.model_config().clone();
    let tokens = Vision::tokens_of(&cfg).unwrap();
    let vl = vl_batch(&cfg, &tokens);
    let r = 6;
    let with_images = |images: &[ProcessedImage]| {
        let mut b = Batch::new();
        b.insert("input_ids", vl.ids.shallow_clone()).unwrap();
        b.insert("attention_mask", vl.mask.shallow_clone()).unwrap();
        b.insert("position_ids", vl.pos.shallow_clone()).unwrap();
        b.insert("responses", vl.ids.narrow(1, LEN - r, r)).unwrap();
        b.insert(
            "response_mask",
            Tensor::ones([ROWS, r], (Kind::Float, Device::Cpu)),
        )
        .unwrap();
        let adv: Vec<f32> = (0..ROWS * r)
            .map(|i| ((i * 37 % 11) as f32 - 5.0) / 5.0)
            .collect();
        b.insert("advantages", Tensor::from_slice(&adv).view([ROWS, r]))
            .unwrap();
        let rows: Vec<RowImages> = images.iter().map(|i| vec![i.clone()].into()).collect();
        b.set_images(rows).unwrap();
        b
    };
    let b = with_images(&vl.images);
    let vs = single.compute_values(&b).unwrap();
    let vm = mega.compute_values(&b).unwrap();
    let d = (&vs - &vm).abs().max().double_value(&[]);
    assert!(d < 1e-5, "values differ by {d}");
    // Other pictures, other values: the critic reads the images.
    let negated: Vec<ProcessedImage> = vl
        .images
        .iter()
        .map(|i| ProcessedImage {
            pixel_values: i.pixel_values.iter().map(|p| -p).collect(),
            ..i.clone()
        })
        .collect();
    let other = mega.compute_values(&with_images(&negated)).unwrap();
    let moved = (&other - &vm).abs().max().double_value(&[]);
    assert!(
        moved > 1e-3,
        "other pictures moved the values by {moved} only"
    );

    critic_updates_match(&mut single, &mut mega, b, vs, "vision-language");
    assert!(
        mega.engine
            .per_tensor_params()
            .unwrap()
            .iter()
            .any(|(n, _)| n.starts_with("visual.")),
        "the critic's tower is among its parameters"
    );
}

rank_test!(
    vision_language_critic_tp2_sequence_parallel_matches_the_single_engine,
    2,
    |world| {
        vl_critic_matches_single(&world);
    }
);

/// The tiny Qwen3-VL of [`vl_config`], as a model path.
const VL_MODEL: &str =
    "builtin://tiny?layers=2&hidden=32&heads=4&kv_heads=2&intermediate=48&arch=qwen3_vl";
