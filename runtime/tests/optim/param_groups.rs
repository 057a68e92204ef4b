//! Megatron's standard param groups and verl's single group.
use tch::{Kind, Tensor};
use verlc_runtime::optim::NamedParam;
use verlc_runtime::optim::param_groups::{
    MegatronGroupsConfig, megatron_param_groups, single_group,
};

fn param(name: &str, shape: &[i64], emb: bool) -> NamedParam {
    let mut p = NamedParam::new(
        name,
        Tensor::zeros(shape, (Kind::Float, tch::Device::Cpu)).set_requires_grad(true),
    );
    p.is_embedding_or_output = emb;
    p
}

fn model() -> Vec<NamedParam> {
    let mut frozen = param("frozen.weight", &[2, 2], false);
    frozen.tensor = frozen.tensor.set_requires_grad(false);
    vec![
        param("embedding.word_embeddings.weight", &[10, 4], true),
        param(
            "decoder.layers.0.self_attention.linear_qkv.weight",
            &[12, 4],
            false,
        ),
        param(
            "decoder.layers.0.self_attention.linear_qkv.bias",
            &[12],
            false,
        ),
        param(
            "decoder.layers.0.self_attention.q_layernorm.weight",
            &[4],
            false,
        ),
        param("decoder.layers.0.input_layernorm.weight", &[4], false),
        param("output_layer.weight", &[10, 4], true),
        frozen,
    ]
}

fn cfg() -> MegatronGroupsConfig {
    MegatronGroupsConfig {
        lr: 1e-3,
        min_lr: 1e-5,
        weight_decay: 0.1,
        decoupled_lr: Some(5e-4),
        decoupled_min_lr: Some(5e-6),
        apply_wd_to_qk_layernorm: false,
    }
}

fn names(g: &verlc_runtime::optim::ParamGroup) -> Vec<&str> {
    g.params.iter().map(|p| p.name.as_str()).collect()
}

#[test]
fn standard_overrides_and_order() {
    let groups = megatron_param_groups(model(), &cfg());
    assert_eq!(groups.len(), 3);
    // No-override group first, then ("max_lr", "min_lr") < ("wd_mult").
    assert_eq!(
        names(&groups[0]),
        vec!["decoder.layers.0.self_attention.linear_qkv.weight"]
    );
    assert_eq!(
        names(&groups[1]),
        vec!["embedding.word_embeddings.weight", "output_layer.weight"]
    );
    assert_eq!(
        names(&groups[2]),
        vec![
            "decoder.layers.0.self_attention.linear_qkv.bias",
            "decoder.layers.0.self_attention.q_layernorm.weight",
            "decoder.layers.0.input_layernorm.weight"
        ]
    );
    let o = &groups[0].options;
    assert_eq!(
        (
            o.max_lr,
            o.min_lr,
            o.wd_mult,
            o.weight_decay,
            o.default_config
        ),
        (Some(1e-3), Some(1e-5), 1.0, 0.1, true)
    );
    let o = &groups[1].options;
    assert_eq!(
        (o.max_lr, o.min_lr, o.wd_mult, o.lr, o.default_config),
        (Some(5e-4), Some(5e-6), 1.0, 5e-4, false)
    );
    let o = &groups[2].options;
    assert_eq!(
        (o.wd_mult, o.weight_decay, o.default_config),
        (0.0, 0.0, true)
    );
}

#[test]
fn qk_layernorm_rule_and_no_decoupled_lr() {
    let c = MegatronGroupsConfig {
        decoupled_lr: None,
        apply_wd_to_qk_layernorm: true,
        ..cfg()
    };
    let groups = megatron_param_groups(model(), &c);
    assert_eq!(groups.len(), 2);
    assert!(names(&groups[0]).contains(&"decoder.layers.0.self_attention.q_layernorm.weight"));
    assert!(names(&groups[0]).contains(&"output_layer.weight"));
    assert_eq!(
        names(&groups[1]),
        vec![
            "decoder.layers.0.self_attention.linear_qkv.bias",
            "decoder.layers.0.input_layernorm.weight"
        ]
    );
}

#[test]
fn verl_single_group() {
    let groups = single_group(model(), 1e-6, 0.01);
    assert_eq!(groups.len(), 1);
    assert_eq!(groups[0].params.len(), 6, "frozen params dropped");
    assert_eq!(
        (groups[0].options.lr, groups[0].options.weight_decay),
        (1e-6, 0.01)
    );
}
