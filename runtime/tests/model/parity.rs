//! Logits of our decoder equal transformers' (fp32, max abs diff <= 1e-4) for tiny Llama
//! (llama3 RoPE scaling, attention and MLP bias, sharded checkpoint), Qwen2 (qkv bias, tied
//! embeddings, linear RoPE scaling), Qwen3 (q/k norm, explicit head_dim, GQA 4:1, yarn RoPE)
//! and Llama with dynamic NTK RoPE beyond max_position_embeddings (no GQA), the other
//! families of the shared oracle (gpt-oss's sinks, sliding windows and biased experts among
//! them), padded and packed.

use tch::Device;
use verlc_runtime::model::packed::Packing;
use verlc_runtime::model::{Dtype, TorchKind, from_pretrained};

use crate::oracle::{self, ARCHS, get};

#[test]
fn logits_match_transformers_fp32() {
    let dir = oracle::models();
    for arch in ARCHS {
        let m = from_pretrained(
            dir.join(arch).to_str().unwrap(),
            Device::Cpu,
            Dtype::Fp32,
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
        // The same batch packed (each row's tokens end to end, attending within its span).
        let packing = Packing::new(mask).unwrap();
        let window = packing.window(0, mask.size()[1]);
        let logits = tch::no_grad(|| {
            let ids = get(&r, "input_ids");
            let hidden = m.model.model.forward_packed_window(
                ids,
                get(&r, "position_ids"),
                &packing,
                &window,
            );
            m.model.logits(&window.unpack(&hidden))
        });
        let d = oracle::max_abs_diff_masked(&logits, get(&r, "logits"), mask);
        assert!(d <= 1e-4, "{arch}: packed batch logits differ by {d}");

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
    for (p, tol) in [(Dtype::Bf16, 0.15), (Dtype::Fp16, 0.02)] {
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

/// The log-prob and value heads read only the positions that predict the response; the model's
/// windowed forward computes the last layer for those alone. Its logits equal transformers'
/// at those positions, and its gradients equal those of the full forward narrowed there.
#[test]
fn windowed_forward_matches_transformers_and_the_full_backward() {
    let dir = oracle::models();
    for arch in ARCHS {
        let m = from_pretrained(
            dir.join(arch).to_str().unwrap(),
            Device::Cpu,
            Dtype::Fp32,
            0,
        )
        .unwrap();
        let r = oracle::read(&dir.join(format!("{arch}_ref.safetensors")));
        let (ids, pos, mask) = (
            get(&r, "input_ids"),
            get(&r, "position_ids"),
            get(&r, "attention_mask"),
        );
        let t = ids.size()[1];
        for (start, len) in [(t - 4, 3), (1, t - 1), (t / 2, t - t / 2)] {
            let logits = tch::no_grad(|| {
                m.model
                    .logits(&m.model.model.forward_window(ids, pos, mask, start, len))
            });
            let want = get(&r, "logits").narrow(1, start, len);
            let d = oracle::max_abs_diff_masked(&logits, &want, &mask.narrow(1, start, len));
            assert!(
                d <= 1e-4,
                "{arch} window ({start}, {len}): logits differ by {d}"
            );
        }
        // Gradients: a loss on the window's logits, by both paths.
        let grads = |windowed: bool| {
            for mut v in m.vs.trainable_variables() {
                v.zero_grad();
            }
            let (start, len) = (t - 4, 3);
            let hidden = if windowed {
                m.model.model.forward_window(ids, pos, mask, start, len)
            } else {
                m.model
                    .model
                    .forward(ids, pos, Some(mask), None)
                    .narrow(1, start, len)
            };
            let loss = m
                .model
                .logits(&hidden)
                .log_softmax(-1, tch::Kind::Float)
                .select(-1, 1)
                .sum(tch::Kind::Float);
            loss.backward();
            let mut out: Vec<(String, tch::Tensor)> =
                m.vs.variables()
                    .into_iter()
                    .map(|(k, v)| {
                        // An expert no token chose has no gradient (as in torch).
                        let g = v.grad();
                        (
                            k,
                            if g.defined() {
                                g.copy()
                            } else {
                                v.zeros_like()
                            },
                        )
                    })
                    .collect();
            out.sort_by(|a, b| a.0.cmp(&b.0));
            out
        };
        let (full, window) = (grads(false), grads(true));
        for ((name, a), (_, b)) in full.iter().zip(&window) {
            let d = (a - b).abs().max().double_value(&[]);
            let scale = a.abs().max().double_value(&[]).max(1e-3);
            assert!(
                d <= 1e-5 * scale.max(1.0),
                "{arch}: grad of {name} differs by {d}"
            );
        }
    }
}
