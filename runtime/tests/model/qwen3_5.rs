//! Qwen3.5's text model (Gated DeltaNet + gated attention), dense and MoE (routed experts
//! plus a gated shared expert), against transformers 5.x's
//! plain-torch path (tests/oracle/qwen3_5_oracle.py): logits of a left-padded batch longer
//! than one 64-token chunk and of an unpadded one, every parameter's gradient, greedy
//! generation token for token through the rollout (KV cache and recurrent state), and the
//! gated delta rule's chunked and recurrent forms against transformers' and each other.
//! Plus: the packed layout (`use_remove_padding`) equals the padded one, cached decoding
//! equals a full recomputation, the built-in tiny Qwen3.5, and Qwen3-Next (the same layers,
//! its DeltaNet projections stored fused) loaded and saved back as transformers wrote it.
use std::path::PathBuf;

use tch::{Device, Kind, Tensor};
use verlc_runtime::model::gated_deltanet::{
    causal_conv, causal_conv_tensor_ops, chunk_gated_delta_rule, chunk_gated_delta_rule_tensor_ops,
    gated_rms_norm, gated_rms_norm_tensor_ops, recurrent_gated_delta_rule,
};
use verlc_runtime::model::layers::RmsNorm;
use verlc_runtime::model::packed::Packing;
use verlc_runtime::model::{Dtype, KvCache, ModelSource, from_pretrained, position_ids_from_mask};
use verlc_runtime::rollout::{SamplingParams, StopTokens, generate};

use crate::oracle::{self, get};

fn oracle_dir() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        oracle::cached_transformers5(&oracle::script_named("qwen3_5_oracle.py"), "models")
    })
    .clone()
}

/// The oracle's models: dense Qwen3.5, Qwen3.5-MoE and Qwen3-Next (Qwen3.5-MoE's layers with
/// fused DeltaNet projections in its checkpoint, a dense layer, no top-k renormalisation).
const KINDS: [&str; 3] = ["qwen3_5", "qwen3_5_moe", "qwen3_next"];

fn model_of(kind: &str) -> verlc_runtime::model::LoadedModel<verlc_runtime::model::CausalLm> {
    let dir = oracle_dir().join(kind);
    from_pretrained(dir.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap()
}

fn reference_of(kind: &str) -> std::collections::HashMap<String, Tensor> {
    oracle::read(&oracle_dir().join(format!("{kind}_ref.safetensors")))
}

#[test]
fn logits_match_transformers() {
    for kind in KINDS {
        let (loaded, r) = (model_of(kind), reference_of(kind));
        let m = &loaded.model;
        let types = ["linear_attention", "full_attention"].repeat(2);
        assert_eq!(m.config.linear.layer_types, types);
        assert_eq!(m.config.rotary_dim(), 8);
        assert_eq!(m.config.sparse_layer(0), kind != "qwen3_5");
        if kind == "qwen3_next" {
            assert!(!m.config.sparse_layer(1), "mlp_only_layers");
            assert!(!m.config.moe.norm_topk_prob);
        }
        let (ids, mask) = (get(&r, "input_ids"), get(&r, "attention_mask"));
        let logits = tch::no_grad(|| m.forward(ids, get(&r, "position_ids"), Some(mask), None));
        let d = oracle::max_abs_diff_masked(&logits, get(&r, "logits"), mask);
        assert!(d <= 1e-4, "{kind}: padded logits differ by {d}");
        let nopad = get(&r, "nopad_input_ids");
        let pos = Tensor::arange(nopad.size()[1], (Kind::Int64, Device::Cpu))
            .unsqueeze(0)
            .expand_as(nopad);
        let logits = tch::no_grad(|| m.forward(nopad, &pos, None, None));
        let d = oracle::max_abs_diff(&logits, get(&r, "nopad_logits"));
        assert!(d <= 1e-4, "{kind}: unpadded logits differ by {d}");
    }
}

#[test]
fn every_parameter_gradient_matches_transformers() {
    for kind in KINDS {
        gradients_match(kind);
    }
}

/// Every parameter's gradient equals transformers' (an expert no token chose has none here
/// and zeros in transformers' fused expert tensors).
fn gradients_match(kind: &str) {
    let (loaded, r) = (model_of(kind), reference_of(kind));
    let m = &loaded.model;
    let (ids, mask) = (get(&r, "input_ids"), get(&r, "attention_mask"));
    let logits = m.forward(ids, get(&r, "position_ids"), Some(mask), None);
    let t = ids.size()[1];
    let lp = logits
        .narrow(1, 0, t - 1)
        .log_softmax(-1, Kind::Float)
        .gather(-1, &ids.narrow(1, 1, t - 1).unsqueeze(-1), false)
        .squeeze_dim(-1);
    let w = (mask.narrow(1, 1, t - 1) * mask.narrow(1, 0, t - 1)).to_kind(Kind::Float);
    let loss = -(lp * &w).sum(Kind::Float) / w.sum(Kind::Float);
    let d = (loss.double_value(&[]) - get(&r, "loss").double_value(&[])).abs();
    assert!(d <= 1e-5, "{kind}: loss differs by {d}");
    loss.backward();
    let vars = loaded.vs.variables();
    let mut unused = 0;
    for (name, t) in &vars {
        let theirs = r
            .get(&format!("grad.{name}"))
            .unwrap_or_else(|| panic!("{kind} {name}: no gradient in transformers"));
        let ours = if t.grad().defined() {
            t.grad()
        } else {
            assert!(name.contains(".mlp.experts."), "{kind} {name}: no gradient");
            unused += 1;
            t.zeros_like()
        };
        let scale = 1.0 + theirs.abs().max().double_value(&[]);
        let d = oracle::max_abs_diff(&ours, theirs);
        assert!(d <= 1e-4 * scale, "{kind} {name}: gradient differs by {d}");
    }
    let listed = r.keys().filter(|k| k.starts_with("grad.")).count();
    assert_eq!(vars.len(), listed, "{kind}: every parameter compared");
    eprintln!(
        "{kind}: {} parameter gradients match ({unused} unused experts)",
        vars.len()
    );
}

/// A Qwen3-Next checkpoint loads into split projections and saves back fused: the same
/// tensors, by name and value, as transformers wrote.
#[test]
fn qwen3_next_checkpoint_saves_back_as_transformers_wrote_it() {
    use verlc_runtime::model::save::{SaveOptions, save_pretrained};
    let loaded = model_of("qwen3_next");
    let names: Vec<String> = loaded.vs.variables().into_keys().collect();
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("linear_attn.in_proj_qkv.weight"))
    );
    assert!(!names.iter().any(|n| n.contains("in_proj_qkvz")));
    let out = oracle::scratch("save-qwen3-next");
    let class = verlc_runtime::model::Arch::Qwen3Next.causal_lm_class();
    save_pretrained(
        &loaded.vs,
        &loaded.model.config,
        class,
        &out,
        &SaveOptions::default(),
    )
    .unwrap();
    let theirs = oracle::read(&oracle_dir().join("qwen3_next").join("model.safetensors"));
    let ours = oracle::read(&out.join("model.safetensors"));
    let mut names: Vec<&String> = ours.keys().collect();
    names.sort();
    let mut expected: Vec<&String> = theirs.keys().collect();
    expected.sort();
    assert_eq!(names, expected);
    assert!(
        names
            .iter()
            .any(|n| n.ends_with("linear_attn.in_proj_qkvz.weight"))
    );
    for (name, t) in &ours {
        let d = oracle::max_abs_diff(t, &theirs[name]);
        assert!(d == 0.0, "{name}: differs by {d}");
    }
    // And reloads to the same model.
    let again = from_pretrained(out.to_str().unwrap(), Device::Cpu, Dtype::Fp32, 0).unwrap();
    for (name, t) in loaded.vs.variables() {
        let d = oracle::max_abs_diff(&t, &again.vs.variables()[&name]);
        assert!(d == 0.0, "{name}: reloads differently by {d}");
    }
}

#[test]
fn gated_delta_rule_forms_match_transformers_and_each_other() {
    let r = reference_of("qwen3_5");
    let g = |k: &str| get(&r, &format!("rule.{k}"));
    let (q, k, v, decay, beta, s0) = (g("q"), g("k"), g("v"), g("g"), g("beta"), g("s0"));
    let (chunk, chunk_state) = chunk_gated_delta_rule(q, k, v, decay, beta, Some(s0));
    let (rec, rec_state) = recurrent_gated_delta_rule(q, k, v, decay, beta, Some(s0));
    for (name, ours, theirs) in [
        ("chunked", &chunk, g("chunk")),
        ("chunked state", &chunk_state, g("chunk_state")),
        ("recurrent", &rec, g("recurrent")),
        ("recurrent state", &rec_state, g("recurrent_state")),
        ("chunked vs recurrent", &chunk, &rec),
        ("chunked vs recurrent state", &chunk_state, &rec_state),
    ] {
        let d = oracle::max_abs_diff(ours, theirs);
        assert!(d <= 1e-4, "{name}: differs by {d}");
    }
    // A chunked prefix handing its state to the rest equals one pass.
    let cut = 37;
    let part = |x: &Tensor, from: i64, len: i64| x.narrow(1, from, len);
    let rest = 100 - cut;
    let (a, sa) = chunk_gated_delta_rule(
        &part(q, 0, cut),
        &part(k, 0, cut),
        &part(v, 0, cut),
        &part(decay, 0, cut),
        &part(beta, 0, cut),
        Some(s0),
    );
    let (b, sb) = chunk_gated_delta_rule(
        &part(q, cut, rest),
        &part(k, cut, rest),
        &part(v, cut, rest),
        &part(decay, cut, rest),
        &part(beta, cut, rest),
        Some(&sa),
    );
    let d = oracle::max_abs_diff(&Tensor::cat(&[a, b], 1), &chunk);
    assert!(d <= 1e-4, "split chunked pass differs by {d}");
    assert!(oracle::max_abs_diff(&sb, &chunk_state) <= 1e-4);
}

/// The CPU kernel of the chunked form against its tensor-op form: outputs, final states and
/// the gradients of every input (a loss reading both outputs), over lengths that fill whole
/// chunks, leave a padded tail, or fit in one short chunk; key heads shared by two value
/// heads; queries, keys and values read as strided views of one projection, as the layer
/// passes them; with and without a starting state.
#[test]
fn gated_delta_rule_cpu_kernel_equals_the_tensor_ops_with_gradients() {
    assert!(
        verlc_runtime::ops::have_cpu_kernels(),
        "libtorch's BLAS was not found"
    );
    tch::manual_seed(11);
    let f = (Kind::Float, Device::Cpu);
    type Rule =
        fn(&Tensor, &Tensor, &Tensor, &Tensor, &Tensor, Option<&Tensor>) -> (Tensor, Tensor);
    for (b, t, hk, h, dk, dv, with_state) in [
        (2i64, 128i64, 3i64, 3i64, 16i64, 24i64, true),
        (1, 100, 1, 2, 32, 32, true),
        (3, 5, 2, 4, 8, 16, false),
        (2, 70, 2, 2, 16, 16, false),
    ] {
        let leaf = |x: Tensor| x.set_requires_grad(true);
        let mixed = leaf(Tensor::randn([b, t, 2 * hk * dk + h * dv], f));
        let parts = mixed.split_with_sizes([hk * dk, hk * dk, h * dv], -1);
        let q = parts[0].reshape([b, t, hk, dk]);
        let k = parts[1].reshape([b, t, hk, dk]);
        let v = parts[2].reshape([b, t, h, dv]);
        let g = leaf(-Tensor::rand([b, t, h], f) * 0.5);
        let beta = leaf(Tensor::rand([b, t, h], f));
        let s0 = leaf(Tensor::randn([b, h, dk, dv], f) * 0.1);
        let (w_out, w_state) = (
            Tensor::randn([b, t, h, dv], f),
            Tensor::randn([b, h, dk, dv], f),
        );
        let run = |rule: Rule| {
            let (out, state) = rule(&q, &k, &v, &g, &beta, with_state.then_some(&s0));
            let loss = (&out * &w_out).sum(Kind::Float) + (&state * &w_state).sum(Kind::Float);
            let inputs: Vec<&Tensor> = if with_state {
                vec![&mixed, &g, &beta, &s0]
            } else {
                vec![&mixed, &g, &beta]
            };
            let grads = Tensor::run_backward(&[loss], &inputs, false, false);
            (out.detach(), state.detach(), grads)
        };
        let (out, state, grads) = run(chunk_gated_delta_rule);
        let (want_out, want_state, want_grads) = run(chunk_gated_delta_rule_tensor_ops);
        let at = format!("(B, T, H_k, H, d_k, d_v) = {:?}", (b, t, hk, h, dk, dv));
        let d = oracle::max_abs_diff(&out, &want_out);
        assert!(d <= 1e-4, "{at}: outputs differ by {d}");
        let d = oracle::max_abs_diff(&state, &want_state);
        assert!(d <= 1e-4, "{at}: final states differ by {d}");
        let names = ["q, k, v", "g", "beta", "s0"];
        assert_gradients_close(&at, &names[..grads.len()], &grads, &want_grads, 1e-4);
    }
}

/// The CPU kernel of the causal convolution against its shifted products: output and the
/// gradients of input and taps, for f32 and bf16 inputs (bf16 weights too), sequences
/// shorter and longer than the kernel.
#[test]
fn causal_conv_cpu_kernel_equals_the_tensor_ops_with_gradients() {
    tch::manual_seed(12);
    for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 2e-2)] {
        for (b, t, c, kernel) in [(2i64, 9i64, 40i64, 4i64), (1, 2, 24, 4), (3, 17, 8, 2)] {
            let x = Tensor::randn([b, t, c], (kind, Device::Cpu)).set_requires_grad(true);
            let w = Tensor::randn([c, 1, kernel], (kind, Device::Cpu)).set_requires_grad(true);
            let dy = Tensor::randn([b, t, c], (Kind::Float, Device::Cpu));
            let run = |conv: fn(&Tensor, &Tensor) -> Tensor| {
                let y = conv(&x, &w);
                assert_eq!(y.kind(), Kind::Float);
                let grads =
                    Tensor::run_backward(&[(&y * &dy).sum(Kind::Float)], &[&x, &w], false, false);
                (y.detach(), grads)
            };
            let (y, grads) = run(causal_conv);
            let (want, want_grads) = run(causal_conv_tensor_ops);
            let at = format!("{kind:?} (B, T, C, kernel) = {:?}", (b, t, c, kernel));
            let d = oracle::max_abs_diff(&y, &want);
            assert!(d <= tol, "{at}: outputs differ by {d}");
            assert_gradients_close(&at, &["x", "w"], &grads, &want_grads, tol);
        }
    }
}

/// The CPU kernel of the gated output norm against transformers' order of operations: output
/// and the gradients of input, gate and weights, with an f32 output and a bf16 one (bf16
/// weights; the kernel rounds once where the tensor ops round twice, hence the tolerance).
#[test]
fn gated_norm_cpu_kernel_equals_the_tensor_ops_with_gradients() {
    tch::manual_seed(13);
    for (kind, tol) in [(Kind::Float, 1e-5), (Kind::BFloat16, 2e-2)] {
        let mut vs = tch::nn::VarStore::new(Device::Cpu);
        let norm = RmsNorm::new(vs.root() / "norm", 16, 1e-6);
        tch::no_grad(|| {
            norm.weight
                .shallow_clone()
                .copy_(&(Tensor::rand([16], (Kind::Float, Device::Cpu)) + 0.5));
        });
        if kind == Kind::BFloat16 {
            vs.bfloat16();
        }
        let x = Tensor::randn([3, 5, 2, 16], (Kind::Float, Device::Cpu)).set_requires_grad(true);
        let z = Tensor::randn([3, 5, 2, 16], (kind, Device::Cpu)).set_requires_grad(true);
        let dy = Tensor::randn([3, 5, 2, 16], (Kind::Float, Device::Cpu));
        let run = |f: fn(&Tensor, &Tensor, &RmsNorm, Kind) -> Tensor| {
            let y = f(&x, &z, &norm, kind);
            assert_eq!(y.kind(), kind);
            let loss = (y.to_kind(Kind::Float) * &dy).sum(Kind::Float);
            let grads = Tensor::run_backward(&[loss], &[&x, &z, &norm.weight], false, false);
            (y.detach(), grads)
        };
        let (y, grads) = run(gated_rms_norm);
        let (want, want_grads) = run(gated_rms_norm_tensor_ops);
        let d = oracle::max_abs_diff(&y, &want);
        assert!(d <= tol * 4.0, "{kind:?}: outputs differ by {d}");
        let at = format!("{kind:?}");
        assert_gradients_close(&at, &["x", "gate", "weight"], &grads, &want_grads, tol);
    }
}

/// Each gradient in `ours` equals its twin in `want` (same dtype) within `tol` of the
/// larger of 1 and the reference's largest magnitude.
fn assert_gradients_close(at: &str, names: &[&str], ours: &[Tensor], want: &[Tensor], tol: f64) {
    assert_eq!(ours.len(), want.len(), "{at}: gradient counts");
    for ((name, ours), want) in names.iter().zip(ours).zip(want) {
        assert_eq!(ours.kind(), want.kind(), "{at}: gradient of {name} dtype");
        let scale = want
            .abs()
            .max()
            .to_kind(Kind::Float)
            .double_value(&[])
            .max(1.0);
        let d = oracle::max_abs_diff(ours, want) / scale;
        assert!(
            d <= tol,
            "{at}: gradient of {name} differs by {d} (relative)"
        );
    }
}

#[test]
fn greedy_generation_matches_transformers() {
    for kind in KINDS {
        let m = model_of(kind).model;
        let spec = oracle::json(&oracle_dir().join(format!("{kind}_greedy.json")));
        let prompts: Vec<Vec<i64>> = serde_json::from_value(spec["prompts"].clone()).unwrap();
        let expected: Vec<Vec<i64>> = serde_json::from_value(spec["outputs"].clone()).unwrap();
        let params = SamplingParams::greedy(spec["max_new_tokens"].as_u64().unwrap() as usize);
        let stop = StopTokens {
            eos: vec![],
            pad: 0,
        };
        let out = generate(&m, &prompts, &params, &stop).unwrap();
        let got = Vec::<Vec<i64>>::try_from(&out.responses).unwrap();
        for (i, want) in expected.iter().enumerate() {
            assert_eq!(&got[i][..want.len()], want.as_slice(), "{kind}: prompt {i}");
        }
    }
}

#[test]
fn cached_decoding_and_packing_equal_the_padded_forward() {
    let m = model_of("qwen3_5").model;
    tch::manual_seed(5);
    let (b, p, steps) = (3i64, 9i64, 5i64);
    let ids = Tensor::randint_low(3, 128, [b, p + steps], (Kind::Int64, Device::Cpu));
    let mask = Tensor::ones([b, p + steps], (Kind::Int64, Device::Cpu));
    let _ = mask.get(1).narrow(0, 0, 3).fill_(0);
    let _ = mask.get(2).narrow(0, 0, 6).fill_(0);
    let pos = position_ids_from_mask(&mask);
    let full = tch::no_grad(|| m.forward(&ids, &pos, Some(&mask), None));

    let mut cache = KvCache::new(&m.config, b, p + steps, Kind::Float, Device::Cpu);
    let mut pieces = vec![tch::no_grad(|| {
        m.forward(
            &ids.narrow(1, 0, p),
            &pos.narrow(1, 0, p),
            Some(&mask.narrow(1, 0, p)),
            Some(&mut cache),
        )
    })];
    for t in p..p + steps {
        pieces.push(tch::no_grad(|| {
            m.forward(
                &ids.narrow(1, t, 1),
                &pos.narrow(1, t, 1),
                Some(&mask.narrow(1, 0, t + 1)),
                Some(&mut cache),
            )
        }));
    }
    let d = oracle::max_abs_diff_masked(&Tensor::cat(&pieces, 1), &full, &mask);
    assert!(d <= 1e-4, "cached vs full logits differ by {d}");

    // Packed: each row's valid tokens end to end, its own state per sequence.
    let packing = Packing::new(&mask).unwrap();
    let window = packing.window(0, p + steps);
    let hidden = tch::no_grad(|| m.model.forward_packed_window(&ids, &pos, &packing, &window));
    let padded = tch::no_grad(|| m.model.forward(&ids, &pos, Some(&mask), None));
    let unpacked = window.unpack(&hidden);
    let d = oracle::max_abs_diff_masked(&unpacked, &padded, &mask);
    assert!(d <= 1e-4, "packed vs padded hidden states differ by {d}");
}

#[test]
fn builtin_tiny_qwen3_5_builds_and_counts_its_parameters() {
    for (arch, model_type) in [
        ("qwen3_5", "qwen3_5_text"),
        ("qwen3_5_moe", "qwen3_5_moe_text"),
    ] {
        let uri = format!("builtin://tiny?arch={arch}");
        let cfg = ModelSource::parse(&uri).unwrap().config().unwrap();
        assert_eq!(cfg.model_type, model_type);
        let mut types = vec!["linear_attention"; 3];
        types.push("full_attention");
        assert_eq!(cfg.linear.layer_types, types);
        let m = from_pretrained(&uri, Device::Cpu, Dtype::Fp32, 1).unwrap();
        let n: i64 =
            m.vs.trainable_variables()
                .iter()
                .map(|t| t.numel() as i64)
                .sum();
        assert_eq!(n, cfg.num_parameters(), "{arch}");
        let listed = verlc_runtime::model::decoder::param_shapes(&cfg, 0..4, true, true);
        let vars = m.vs.variables();
        for (name, shape) in &listed {
            assert_eq!(&vars[name].size(), shape, "{arch} {name}");
        }
        assert_eq!(
            listed.len() + usize::from(!cfg.tie_word_embeddings),
            vars.len()
        );
    }
}

/// Qwen3.5's checkpoints as transformers 5 writes their `config.json` (the composite config: the
/// text model's keys only in `text_config`, no top-level `vocab_size`) load as image-text
/// models of the family built on the text model's layers, whose text model is the text
/// family's; `verlc smoke`'s stand-in of one scales both halves.
#[test]
fn multimodal_checkpoint_configs_load_as_image_text_models() {
    use verlc_spec::families::Family;
    let dir =
        oracle::cached_transformers5(&oracle::script_named("qwen3_5_config_oracle.py"), "configs");
    for (kind, family, text_type, experts) in [
        ("qwen3_5", Family::Qwen3_5Vl, "qwen3_5_text", 0),
        ("qwen3_5_moe", Family::Qwen3_5MoeVl, "qwen3_5_moe_text", 4),
    ] {
        let file = dir.join(kind).join("config.json");
        let raw: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
        assert!(raw.get("vocab_size").is_none(), "{kind}: {raw}");
        let c = verlc_runtime::model::ModelConfig::from_file(&file)
            .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert_eq!(c.model_type, kind);
        assert_eq!(c.arch(), Ok(family));
        assert_eq!(
            (c.vocab_size, c.hidden_size, c.num_hidden_layers),
            (300, 64, 4)
        );
        assert_eq!(c.moe.num_experts, experts);
        assert_eq!(c.rotary_dim(), 4, "a quarter of each head rotates");
        let text = c.text_model().expect("a text model");
        assert_eq!(text.model_type, text_type);
        assert!(text.extra.get("vision_config").is_none());
        let m = verlc_runtime::model::CausalLm::new(
            &c,
            tch::nn::VarStore::new(tch::Device::Cpu).root(),
        )
        .unwrap_or_else(|e| panic!("{kind}: {e}"));
        assert!(m.vision.is_some(), "{kind}: its tower");
        let uri = format!("builtin://scaled?from={}", dir.join(kind).display());
        let uri = verlc_runtime::builtin_uri::BuiltinUri::parse(&uri)
            .expect("uri")
            .expect("builtin");
        let scaled = verlc_runtime::model::builtin::config(&uri)
            .unwrap_or_else(|e| panic!("{kind} scaled: {e}"));
        assert_eq!(scaled.model_type, kind);
        assert_eq!(scaled.vocab_size, 300);
        assert!(scaled.extra["vision_config"].is_object());
    }
}
