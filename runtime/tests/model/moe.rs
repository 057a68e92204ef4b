//! Gradients of every parameter equal transformers' (fp32, <= 1e-4) for each family, Qwen3-MoE
//! with sparse and dense layers included (its logits, windowed forward and greedy generation are
//! covered with the other families in parity.rs, cache.rs and the rollout tests); the grouped
//! expert computation equals the per-token definition; the built-in tiny MoE.
use std::path::PathBuf;

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::decoder::param_shapes;
use verlc_runtime::model::{Dtype, ModelSource, from_pretrained};

use crate::oracle::{self, get};

fn log_prob_loss(logits: &Tensor, ids: &Tensor, mask: &Tensor) -> Tensor {
    let t = ids.size()[1];
    let lp = logits
        .narrow(1, 0, t - 1)
        .to_kind(Kind::Float)
        .log_softmax(-1, Kind::Float)
        .gather(-1, &ids.narrow(1, 1, t - 1).unsqueeze(-1), false)
        .squeeze_dim(-1);
    let m = (mask.narrow(1, 1, t - 1) * mask.narrow(1, 0, t - 1)).to_kind(Kind::Float);
    -(lp * &m).sum(Kind::Float) / m.sum(Kind::Float)
}

/// Every parameter's gradient equals transformers' for every family (the embedding's
/// `padding_idx` row included); for Qwen3-MoE, experts no token chose have none, as in torch.
#[test]
fn every_parameter_gradient_matches_transformers() {
    let archs = [
        "qwen3_moe",
        "qwen2",
        "qwen2_window",
        "qwen3",
        "llama",
        "mistral",
        "mistral_window",
        "gemma",
        "gemma2",
        "seed_oss",
        "gpt_oss",
    ];
    let weights: Vec<PathBuf> = archs
        .iter()
        .map(|arch| {
            let dir = oracle::models().join(arch);
            ["model.safetensors", "model.safetensors.index.json"]
                .map(|f| dir.join(f))
                .into_iter()
                .find(|p| p.is_file())
                .expect("weights")
        })
        .collect();
    let out = oracle::cached(
        "grads",
        &weights.iter().map(PathBuf::as_path).collect::<Vec<_>>(),
    );
    for (i, arch) in archs.into_iter().enumerate() {
        let dir = oracle::models().join(arch);
        let r = oracle::read(&out.join(format!("grads-{i}.safetensors")));
        let m = from_pretrained(dir.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
        let (ids, mask) = (get(&r, "input_ids"), get(&r, "attention_mask"));
        let logits = m
            .model
            .forward(ids, get(&r, "position_ids"), Some(mask), None);
        let loss = log_prob_loss(&logits, ids, mask);
        let d = (loss.double_value(&[]) - get(&r, "loss").double_value(&[])).abs();
        assert!(d <= 1e-5, "{arch}: loss differs by {d}");
        loss.backward();
        let vars = m.vs.variables();
        // transformers' gradients by our names: a family that stores its experts fused (one
        // parameter for a layer's experts) has them split per expert, zero for experts no
        // token chose.
        let layout = verlc_runtime::model::stored::StoredLayout::of(&m.config);
        let mut theirs_by_name = std::collections::HashMap::new();
        for (key, g) in r
            .iter()
            .filter_map(|(k, g)| Some((k.strip_prefix("grad.")?, g)))
        {
            match layout.filter(|l| l.is_fused(key)) {
                Some(l) => theirs_by_name.extend(l.split(key, g).unwrap()),
                None => {
                    theirs_by_name.insert(key.to_owned(), g.shallow_clone());
                }
            }
        }
        let (mut compared, mut unused) = (0, 0);
        for (name, t) in &vars {
            match theirs_by_name.get(name) {
                Some(theirs) => {
                    let ours = if t.grad().defined() {
                        t.grad()
                    } else {
                        t.zeros_like()
                    };
                    let d = oracle::max_abs_diff(&ours, theirs);
                    assert!(d <= 1e-4, "{arch} {name}: gradient differs by {d}");
                    compared += 1;
                }
                None => {
                    assert!(
                        name.contains(".mlp.experts."),
                        "{arch} {name}: no gradient in transformers"
                    );
                    assert!(
                        !t.grad().defined(),
                        "{arch} {name}: gradient for an unused expert"
                    );
                    unused += 1;
                }
            }
        }
        assert_eq!(compared, theirs_by_name.len());
        assert!(
            compared > vars.len() / 2,
            "{arch}: {compared} of {} compared",
            vars.len()
        );
        if arch == "qwen3_moe" {
            assert!(m.model.config.sparse_layer(0) && !m.model.config.sparse_layer(1));
        }
        eprintln!("{arch}: {compared} parameter gradients match ({unused} unused experts)");
    }
}

/// The grouped computation (tokens sorted by expert, one block per expert) equals routing
/// each token through its chosen experts one by one.
#[test]
fn grouped_experts_equal_the_per_token_definition() {
    let cfg = ModelSource::parse(
        "builtin://tiny?arch=qwen3_moe&layers=1&hidden=64&experts=6&experts_per_tok=3",
    )
    .unwrap()
    .config()
    .unwrap();
    let m = from_pretrained(
        "builtin://tiny?arch=qwen3_moe&layers=1&hidden=64&experts=6&experts_per_tok=3",
        Device::Cpu,
        Dtype::Fp32,
        5,
    )
    .unwrap();
    let vars = m.vs.variables();
    let w = |n: &str| {
        vars.get(&format!("model.layers.0.mlp.{n}"))
            .unwrap()
            .shallow_clone()
    };
    let _guard = tch::no_grad_guard();
    let x = Tensor::randn([2, 5, 64], (Kind::Float, Device::Cpu));
    let layer = &m.model.model.layers()[0];
    let got = layer.feed_forward().forward(&x);
    let flat = x.reshape([-1, 64]);
    let mut want = Vec::new();
    for row in 0..flat.size()[0] {
        let xr = flat.get(row);
        let probs = xr
            .linear::<Tensor>(&w("gate.weight"), None)
            .softmax(-1, Kind::Float);
        let (p, e) = probs.topk(cfg.moe.num_experts_per_tok, -1, true, true);
        let p = &p / p.sum(Kind::Float);
        let mut acc = xr.zeros_like();
        for j in 0..cfg.moe.num_experts_per_tok {
            let ex = e.int64_value(&[j]);
            let f = |n: &str| w(&format!("experts.{ex}.{n}.weight"));
            let hidden = xr.linear::<Tensor>(&f("gate_proj"), None).silu()
                * xr.linear::<Tensor>(&f("up_proj"), None);
            acc += hidden.linear::<Tensor>(&f("down_proj"), None) * p.double_value(&[j]);
        }
        want.push(acc);
    }
    let want = Tensor::stack(&want, 0).reshape([2, 5, 64]);
    let d = oracle::max_abs_diff(&got, &want);
    assert!(
        d <= 1e-5,
        "grouped experts differ from per-token routing by {d}"
    );
}

/// The tiny Qwen3-MoE and gpt-oss (sinks, biased router and experts) count and list every
/// variable their models register.
#[test]
fn builtin_tiny_moe_lists_and_counts_its_experts() {
    let cfg = ModelSource::parse("builtin://tiny?arch=qwen3_moe")
        .unwrap()
        .config()
        .unwrap();
    assert_eq!(cfg.model_type, "qwen3_moe");
    assert!(cfg.qk_norm());
    assert_eq!(cfg.head_dim(), 32);
    for arch in ["qwen3_moe", "gpt_oss"] {
        let uri = format!("builtin://tiny?arch={arch}");
        let cfg = ModelSource::parse(&uri).unwrap().config().unwrap();
        let m = from_pretrained(&uri, Device::Cpu, Dtype::Fp32, 0).unwrap();
        let vars = m.vs.variables();
        let counted: i64 = vars.values().map(|t| t.numel() as i64).sum();
        assert_eq!(counted, cfg.num_parameters(), "{arch}");
        let listed = param_shapes(&cfg, 0..cfg.num_hidden_layers as usize, true, true);
        assert_eq!(listed.len(), vars.len(), "{arch}");
        for (name, shape) in &listed {
            assert_eq!(&vars[name].size(), shape, "{arch} {name}");
        }
    }
}

/// A saved dense config gains no expert keys; a MoE config keeps them through a round trip.
#[test]
fn expert_keys_are_written_only_for_moe_models() {
    let dense = ModelSource::parse("builtin://tiny")
        .unwrap()
        .config()
        .unwrap();
    let json = serde_json::to_value(&dense).unwrap();
    for key in [
        "num_experts",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
    ] {
        assert!(json.get(key).is_none(), "{key} in a dense config: {json}");
    }
    let mut moe = ModelSource::parse("builtin://tiny?arch=qwen3_moe")
        .unwrap()
        .config()
        .unwrap();
    moe.moe.mlp_only_layers = vec![1];
    let back: verlc_runtime::model::ModelConfig =
        serde_json::from_value(serde_json::to_value(&moe).unwrap()).unwrap();
    assert_eq!(back.moe, moe.moe);
    assert!(!back.extra.contains_key("num_experts"));
}

/// The router's load-balancing loss and z-loss (what Megatron adds when configured) against
/// transformers' Qwen3-MoE on the same router logits and padding: transformers' auxiliary loss
/// for one MoE layer is top-k times Megatron's (`E Σ f_e P_e` with `f_e` summing to k there,
/// to 1 in Megatron); the z-loss is the mean squared logsumexp over real tokens. A gate of the
/// identity on hidden = experts makes the block's input its logits.
#[test]
fn router_losses_match_transformers() {
    use verlc_runtime::builtin_uri::BuiltinUri;
    use verlc_runtime::model::moe::SparseMoe;

    let out = oracle::cached("router_losses", &[]);
    let r = oracle::read(&out.join("router.safetensors"));
    let (logits, mask) = (get(&r, "logits"), get(&r, "attention_mask"));
    let uri = BuiltinUri::parse(
        "builtin://tiny?layers=1&hidden=8&heads=2&kv_heads=2&arch=qwen3_moe&experts=8&experts_per_tok=2&moe_intermediate=4",
    )
    .unwrap()
    .unwrap();
    let cfg = verlc_runtime::model::builtin::config(&uri).unwrap();
    let vs = tch::nn::VarStore::new(Device::Cpu);
    let block = SparseMoe::standalone(&cfg, vs.root(), 0, 0..8).unwrap();
    tch::no_grad(|| {
        vs.variables()["gate.weight"]
            .shallow_clone()
            .copy_(&Tensor::eye(8, (Kind::Float, Device::Cpu)))
    });
    let x = logits.shallow_clone().set_requires_grad(true);
    let (balance, z) = block.router_losses(&x, Some(mask), None).unwrap();
    let top_k = 2.0;
    let theirs = get(&r, "balance").double_value(&[0]);
    let d = (balance.double_value(&[]) * top_k - theirs).abs();
    assert!(
        d <= 1e-6 * theirs.abs().max(1.0),
        "load balancing: {} x {top_k} vs {theirs}",
        balance.double_value(&[])
    );
    let dz = (z.double_value(&[]) - get(&r, "z").double_value(&[0])).abs();
    assert!(dz <= 1e-5, "z-loss differs by {dz}");
    // Both reach the router's scores; padding tokens get no gradient.
    (&balance + &z).backward();
    let g = x.grad();
    assert!(g.abs().sum(Kind::Float).double_value(&[]) > 0.0);
    assert_eq!(
        g.narrow(1, 0, 2)
            .get(0)
            .abs()
            .sum(Kind::Float)
            .double_value(&[]),
        0.0
    );
}

/// A gpt-oss-20b-shaped `config.json` (as transformers writes its config class, no weights)
/// scales down to a stand-in of its family for `verlc smoke`: windowed and full layers still
/// alternating, experts kept at least top-k, biased and `intermediate_size` wide; its
/// MXFP4-quantized original is refused with the way out.
#[test]
fn a_gpt_oss_shaped_config_scales_down_and_a_quantized_one_is_refused() {
    let dir = oracle::scratch("gpt_oss_scaled");
    let mut cfg = serde_json::json!({
        "model_type": "gpt_oss", "architectures": ["GptOssForCausalLM"], "vocab_size": 201088,
        "hidden_size": 2880, "intermediate_size": 2880, "num_hidden_layers": 24,
        "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
        "num_local_experts": 32, "num_experts_per_tok": 4, "sliding_window": 128,
        "layer_types": (0..24).map(|i| if i % 2 == 0 { "sliding_attention" } else { "full_attention" }).collect::<Vec<_>>(),
        "rope_scaling": {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
            "truncate": false, "original_max_position_embeddings": 4096},
        "rope_theta": 150000, "max_position_embeddings": 131072, "attention_bias": true,
        "swiglu_limit": 7.0, "tie_word_embeddings": false
    });
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let uri = format!("builtin://scaled?from={}&layers=3", dir.display());
    let uri = verlc_runtime::builtin_uri::BuiltinUri::parse(&uri)
        .expect("uri")
        .expect("builtin");
    let scaled = verlc_runtime::model::builtin::config(&uri).expect("a stand-in");
    assert_eq!(scaled.model_type, "gpt_oss");
    let windows: Vec<Option<i64>> = (0..3).map(|l| scaled.attention_window(l)).collect();
    assert_eq!(windows, [Some(128), None, Some(128)]);
    assert_eq!(scaled.moe.num_experts, 4);
    assert_eq!(scaled.intermediate_size, scaled.moe.moe_intermediate_size);
    let m =
        verlc_runtime::model::CausalLm::new(&scaled, tch::nn::VarStore::new(Device::Cpu).root())
            .expect("a model");
    drop(m);
    let names: Vec<String> = param_shapes(&scaled, 0..1, false, false)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for want in [
        "model.layers.0.self_attn.sinks",
        "model.layers.0.mlp.router.bias",
        "model.layers.0.mlp.experts.3.down_proj.bias",
    ] {
        assert!(names.iter().any(|n| n == want), "{want} in {names:?}");
    }
    cfg["quantization_config"] = serde_json::json!({"quant_method": "mxfp4"});
    std::fs::write(dir.join("config.json"), cfg.to_string()).unwrap();
    let err = verlc_runtime::model::builtin::config(&uri).expect_err("quantized");
    assert!(
        err.contains("quant_method `mxfp4`") && err.contains("dequantized (bf16) copy"),
        "{err}"
    );
}
