//! `builtin://tiny`: a config that needs no files, deterministic seeded initialisation.

use tch::Device;
use verlc_runtime::model::{Dtype, ModelSource, from_pretrained};

#[test]
fn tiny_is_a_small_qwen2_matching_its_tokenizer() {
    let cfg = ModelSource::parse("builtin://tiny")
        .unwrap()
        .config()
        .unwrap();
    assert_eq!(cfg.model_type, "qwen2");
    assert_eq!(
        cfg.vocab_size as usize,
        verlc_runtime::tokenizer::builtin::vocab_size()
    );
    assert!(cfg.tie_word_embeddings);
    let n = cfg.num_parameters();
    assert!((300_000..2_000_000).contains(&n), "{n} parameters");
    let m = from_pretrained("builtin://tiny", Device::Cpu, Dtype::Fp32, 0).unwrap();
    let counted: i64 = m.vs.variables().values().map(|t| t.numel() as i64).sum();
    assert_eq!(counted, n);
}

#[test]
fn seeded_init_is_deterministic_and_seed_dependent() {
    let a = from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        11,
    )
    .unwrap();
    let b = from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        11,
    )
    .unwrap();
    let c = from_pretrained(
        "builtin://tiny?layers=2&hidden=64",
        Device::Cpu,
        Dtype::Fp32,
        12,
    )
    .unwrap();
    let (va, vb, vc) = (a.vs.variables(), b.vs.variables(), c.vs.variables());
    let w = "model.layers.1.mlp.up_proj.weight";
    assert!(va[w].equal(&vb[w]));
    assert!(!va[w].equal(&vc[w]));
    let std = va[w].std(true).double_value(&[]);
    assert!((std - 0.02).abs() < 0.002, "std {std}");
    assert!(va["model.norm.weight"].equal(&va["model.norm.weight"].ones_like()));
    assert!(
        va["model.layers.0.self_attn.q_proj.bias"]
            .equal(&va["model.layers.0.self_attn.q_proj.bias"].zeros_like())
    );
}

/// Why the built-in model at `uri` cannot be built.
fn config_error(uri: &str) -> String {
    ModelSource::parse(uri)
        .unwrap()
        .config()
        .unwrap_err()
        .to_string()
}

#[test]
fn bad_builtin_addresses_are_explained() {
    let e = config_error("builtin://huge");
    assert!(e.contains("unknown builtin model `huge`"), "{e}");
    let e = config_error("builtin://tiny?layer=3");
    assert!(e.contains("unknown parameter `layer`"), "{e}");
    let e = config_error("builtin://tiny?hidden=abc");
    assert!(e.contains("`hidden` must be a whole number"), "{e}");
    // Qwen3.5's layer mix and rotated share are its family's settings alone.
    let e = config_error("builtin://tiny?full_attention_interval=2");
    assert!(e.contains("families with Gated DeltaNet layers"), "{e}");
    let c = ModelSource::parse(
        "builtin://tiny?arch=qwen3_5&layers=4&full_attention_interval=2&partial_rotary_factor=0.5",
    )
    .unwrap()
    .config()
    .unwrap();
    assert_eq!(
        c.linear.layer_types,
        [
            "linear_attention",
            "full_attention",
            "linear_attention",
            "full_attention"
        ]
    );
    assert_eq!(c.partial_rotary_factor, Some(0.5));
    // DeepStack levels are Qwen3-VL's, one or two (the tiny tower's blocks).
    let e = config_error("builtin://tiny?arch=qwen2_5_vl&deepstack=2");
    assert!(e.contains("families with DeepStack features"), "{e}");
    let e = config_error("builtin://tiny?arch=qwen3_vl&deepstack=3");
    assert!(e.contains("`deepstack` is 1 or 2"), "{e}");
    let c = ModelSource::parse("builtin://tiny?arch=qwen3_vl&layers=3&deepstack=2")
        .unwrap()
        .config()
        .unwrap();
    assert_eq!(
        c.extra["vision_config"]["deepstack_visual_indexes"],
        serde_json::json!([0, 1])
    );
}

#[test]
fn param_shapes_lists_what_the_constructors_register_in_order_of_families() {
    // The listing a pipeline stage sorts and exports by: every variable the decoder registers,
    // with its shape, for each family's flags (Qwen2 q/k/v bias, Llama/Qwen3 attention_bias
    // with o bias, Qwen3 q/k norms, an MLP bias).
    for (model_type, attention_bias, mlp_bias) in [
        ("qwen2", None, false),
        ("llama", Some(true), true),
        ("qwen3", Some(true), false),
        ("qwen3", None, false),
    ] {
        let mut cfg = ModelSource::parse("builtin://tiny?layers=3&hidden=64")
            .unwrap()
            .config()
            .unwrap();
        cfg.model_type = model_type.into();
        cfg.attention_bias = attention_bias;
        cfg.mlp_bias = mlp_bias;
        let vs = tch::nn::VarStore::new(Device::Cpu);
        verlc_runtime::model::decoder::Model::new(&cfg, &vs.root() / "model").unwrap();
        let listed = verlc_runtime::model::decoder::param_shapes(&cfg, 0..3, true, true);
        let vars = vs.variables();
        assert_eq!(listed.len(), vars.len(), "{model_type}");
        for (name, shape) in &listed {
            let t = vars
                .get(name)
                .unwrap_or_else(|| panic!("{model_type}: {name}"));
            assert_eq!(&t.size(), shape, "{model_type}: {name}");
        }
        // Registration order within a layer follows transformers: input norm first, the MLP's
        // down projection last.
        let layer0: Vec<&str> = listed
            .iter()
            .filter_map(|(n, _)| n.strip_prefix("model.layers.0."))
            .collect();
        assert_eq!(layer0.first(), Some(&"input_layernorm.weight"));
        assert!(layer0.last().unwrap().starts_with("mlp.down_proj."));
    }
}

/// Every text family's tiny model holds exactly the parameters its config counts (Gemma 2's
/// four norms a layer, gpt-oss's sinks and expert biases, Qwen3.5's DeltaNet layers).
#[test]
fn each_tiny_text_family_has_the_parameters_its_config_counts() {
    for arch in verlc_spec::families::tiny_archs() {
        let uri = format!("builtin://tiny?layers=2&hidden=32&heads=2&kv_heads=2&arch={arch}");
        let cfg = ModelSource::parse(&uri).unwrap().config().unwrap();
        if cfg.arch().unwrap().has_vision() {
            continue;
        }
        let m = from_pretrained(&uri, Device::Cpu, Dtype::Fp32, 0).unwrap();
        let counted: i64 = m.vs.variables().values().map(|t| t.numel() as i64).sum();
        assert_eq!(counted, cfg.num_parameters(), "{arch}");
    }
}
