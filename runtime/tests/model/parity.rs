//! Logits of our decoder equal transformers' (fp32, max abs diff <= 1e-4) for tiny Llama
//! (llama3 RoPE scaling, attention and MLP bias, sharded checkpoint), Qwen2 (qkv bias, tied
//! embeddings, linear RoPE scaling), Qwen3 (q/k norm, explicit head_dim, GQA 4:1, yarn RoPE)
//! and Llama with dynamic NTK RoPE beyond max_position_embeddings (no GQA).

use runtime::model::{Precision, from_pretrained};
use tch::Device;

use crate::oracle::{self, ARCHS, get};

#[test]
fn logits_match_transformers_fp32() {
    let dir = oracle::models();
    for arch in ARCHS {
        let m = from_pretrained(
            dir.join(arch).to_str().unwrap(),
            Device::Cpu,
            Precision::Fp32,
            0,
        )
        .unwrap();
        let r = oracle::read(&dir.join(format!("{arch}_ref.safetensors")));
        let mask = get(&r, "attention_mask");
        let logits = tch::no_grad(|| {
            m.model.forward(
                get(&r, "input_ids"),
                get(&r, "position_ids"),
                Some(mask),
                None,
            )
        });
        let d = oracle::max_abs_diff_masked(&logits, get(&r, "logits"), mask);
        assert!(d <= 1e-4, "{arch}: padded batch logits differ by {d}");

        let ids = get(&r, "nopad_input_ids");
        let pos = tch::Tensor::arange(ids.size()[1], (tch::Kind::Int64, Device::Cpu))
            .unsqueeze(0)
            .expand_as(ids);
        let logits = tch::no_grad(|| m.model.forward(ids, &pos, None, None));
        let d = oracle::max_abs_diff(&logits, get(&r, "nopad_logits"));
        assert!(d <= 1e-4, "{arch}: unpadded logits differ by {d}");
        eprintln!("{arch}: parity ok (max diff {d:.2e})");
    }
}

#[test]
fn half_precisions_stay_close_to_fp32() {
    let dir = oracle::models();
    let r = oracle::read(&dir.join("qwen3_ref.safetensors"));
    let mask = get(&r, "attention_mask");
    for (p, tol) in [(Precision::Bf16, 0.15), (Precision::Fp16, 0.02)] {
        let m = from_pretrained(dir.join("qwen3").to_str().unwrap(), Device::Cpu, p, 0).unwrap();
        assert_eq!(m.model.kind(), p.kind());
        let logits = tch::no_grad(|| {
            m.model.forward(
                get(&r, "input_ids"),
                get(&r, "position_ids"),
                Some(mask),
                None,
            )
        });
        assert_eq!(logits.kind(), p.kind());
        let d = oracle::max_abs_diff_masked(&logits, get(&r, "logits"), mask);
        assert!(d <= tol, "{p:?}: logits differ from fp32 by {d}");
    }
}
