//! Built-in synthetic tasks: deterministic rows in verl's layout, disjoint splits, correct
//! answers, rule rewards, prompts that fit the quickstart's max_prompt_length.

use std::collections::HashSet;

use verlc_runtime::builtin_uri::BuiltinUri;
use verlc_runtime::data::builtin::{compute_score, rows};
use verlc_runtime::data::{DatasetOptions, RlDataset, Sample};
use verlc_runtime::tokenizer::Tokenizer;

fn samples(addr: &str) -> Vec<Sample> {
    let uri = BuiltinUri::parse(addr).unwrap().unwrap();
    rows(&uri)
        .unwrap()
        .into_iter()
        .enumerate()
        .map(|(i, r)| Sample::from_row(r, "prompt", "data_source", i).unwrap())
        .collect()
}

#[test]
fn digit_reversal_splits() {
    let train = samples("builtin://digit_reversal?split=train");
    let test = samples("builtin://digit_reversal?split=test");
    assert_eq!((train.len(), test.len()), (8192, 256));
    assert_eq!(
        samples("builtin://digit_reversal?split=test"),
        test,
        "deterministic"
    );
    let test_prompts: HashSet<String> = test
        .iter()
        .map(|s| s.prompt[0].content.as_str().unwrap().to_owned())
        .collect();
    assert!(
        train
            .iter()
            .all(|s| !test_prompts.contains(s.prompt[0].content.as_str().unwrap())),
        "disjoint splits"
    );
    for s in train.iter().take(50) {
        let digits = s.prompt[0]
            .content
            .as_str()
            .unwrap()
            .strip_prefix("reverse ")
            .unwrap();
        assert!((2..=5).contains(&digits.len()));
        assert_eq!(
            s.ground_truth_str(),
            digits.chars().rev().collect::<String>()
        );
        assert_eq!(s.data_source, "builtin/digit_reversal");
        assert_eq!(s.reward_model.style.as_deref(), Some("rule"));
    }
    assert_eq!(train[3].extra_info["split"], "train");
    assert_eq!(train[3].index, 3);
    let other = samples("builtin://digit_reversal?split=train&seed=1&size=100");
    assert_eq!(other.len(), 100);
    assert_ne!(other[..10], train[..10]);
}

#[test]
fn arithmetic_answers_are_right() {
    for s in samples("builtin://arithmetic?split=test&ops=+-*&max_operand=20") {
        let expr = s.prompt[0]
            .content
            .as_str()
            .unwrap()
            .strip_prefix("compute ")
            .unwrap()
            .to_owned();
        let op = expr.chars().find(|c| "+-*".contains(*c)).unwrap();
        let (a, b) = expr.split_once(op).unwrap();
        let (a, b): (i64, i64) = (a.parse().unwrap(), b.parse().unwrap());
        let r = match op {
            '+' => a + b,
            '-' => a - b,
            _ => a * b,
        };
        assert!(r >= 0);
        assert_eq!(s.ground_truth_str(), r.to_string(), "{expr}");
    }
}

#[test]
fn rule_rewards() {
    let close = |a: Option<f64>, b: f64| assert!((a.unwrap() - b).abs() < 1e-12, "{a:?} vs {b}");
    close(
        compute_score("builtin/digit_reversal", " 54321\n", "54321"),
        1.0,
    );
    // digits 1, length 1, positions 3/5.
    close(
        compute_score("builtin/digit_reversal", "54300", "54321"),
        0.1 + 0.1 + 0.3 * 0.6,
    );
    // digits 1, length 1 - 5/10, positions 5/10.
    close(
        compute_score("builtin/digit_reversal", "5432100000", "54321"),
        0.1 + 0.05 + 0.15,
    );
    close(compute_score("builtin/arithmetic", "", "46"), 0.0);
    close(compute_score("builtin/arithmetic", "ab", "46"), 0.1);
    assert!(
        compute_score("builtin/arithmetic", "47", "46").unwrap() < 0.5,
        "partial credit stays below exact"
    );
    assert_eq!(compute_score("openai/gsm8k", "72", "72"), None);
}

#[test]
fn quickstart_prompts_fit_with_the_tiny_tokenizer() {
    let tok = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    for task in ["digit_reversal", "arithmetic"] {
        for split in ["train", "test"] {
            let addr = format!("builtin://{task}?split={split}");
            let ds = RlDataset::load(
                &[addr],
                &tok,
                &DatasetOptions {
                    max_prompt_length: 32,
                    ..DatasetOptions::default()
                },
            )
            .unwrap();
            assert!(
                ds.items
                    .iter()
                    .all(|i| i.input_ids.len() <= 32 && !i.input_ids.contains(&3)),
                "{task}/{split}: no <unk>"
            );
        }
    }
}

#[test]
fn bad_addresses() {
    let e = rows(&BuiltinUri::parse("builtin://sorting").unwrap().unwrap()).unwrap_err();
    assert!(e.contains("unknown builtin dataset `sorting`"), "{e}");
    let e = rows(
        &BuiltinUri::parse("builtin://digit_reversal?split=dev")
            .unwrap()
            .unwrap(),
    )
    .unwrap_err();
    assert!(e.contains("split must be train or test"), "{e}");
    let e = rows(
        &BuiltinUri::parse(
            "builtin://digit_reversal?split=train&min_digits=1&max_digits=1&size=50",
        )
        .unwrap()
        .unwrap(),
    )
    .unwrap_err();
    assert!(e.contains("cannot draw 50 distinct"), "{e}");
    assert!(
        BuiltinUri::parse("builtin://digit_reversal?split")
            .unwrap()
            .is_err()
    );
}

/// The tool task: answers only the tool knows, the tool's per-sample arguments in
/// `extra_info.tools_kwargs`, and the tiny model's one-token call that the hermes parser reads.
#[test]
fn code_lookup_rows_rewards_and_the_one_token_call() {
    use verlc_runtime::data::builtin::lookup_code;
    let train = samples("builtin://code_lookup?split=train&size=600");
    let test = samples("builtin://code_lookup?split=test&size=128");
    let prompts = |s: &[Sample]| -> HashSet<String> {
        s.iter()
            .map(|x| x.prompt[0].content.as_str().unwrap().to_owned())
            .collect()
    };
    assert!(prompts(&train).is_disjoint(&prompts(&test)));
    for s in train.iter().take(20) {
        let text = s.prompt[0].content.as_str().unwrap();
        let number: u64 = text.rsplit(' ').next().unwrap().parse().unwrap();
        assert_eq!(s.reward_model.ground_truth, lookup_code(number));
        assert_eq!(
            s.extra_info["tools_kwargs"]["lookup"]["create_kwargs"]["number"],
            serde_json::json!(number.to_string())
        );
    }
    assert_eq!(
        lookup_code(472),
        format!("{:03}", (472 * 7919 + 104_729) % 1000)
    );
    // The answer after the tool round counts; calling earns 0.2 below a right answer.
    let call = "<tool_call>{\"name\": \"lookup\", \"arguments\": {}}</tool_call>";
    let ds = "builtin/code_lookup";
    let after = |answer: &str| format!("{call}\n<unk>\n581\nassistant\n{answer}");
    assert_eq!(compute_score(ds, &after("581"), "581"), Some(1.0));
    let wrong_called = compute_score(ds, &after("123"), "581").unwrap();
    let wrong_plain = compute_score(ds, "123", "581").unwrap();
    assert!((wrong_called - wrong_plain - 0.2).abs() < 1e-9);
    assert_eq!(compute_score(ds, "581", "581"), Some(1.0));

    let tok = Tokenizer::from_pretrained("builtin://tiny?tools=lookup").unwrap();
    let plain = Tokenizer::from_pretrained("builtin://tiny").unwrap();
    assert_eq!(tok.vocab_size(), plain.vocab_size() + 1);
    let ids = tok.encode(call, false).unwrap();
    assert_eq!(ids, vec![plain.vocab_size() as i64]);
    let text = tok.decode(&ids, false).unwrap();
    let parsed = verlc_runtime::rollout::agent::hermes::parse(&text);
    assert_eq!(parsed.calls.len(), 1);
    assert_eq!(
        (
            parsed.calls[0].name.as_str(),
            parsed.calls[0].arguments.as_str()
        ),
        ("lookup", "{}")
    );
    // The call survives the reward's decoding (it is not a special token).
    assert_eq!(tok.decode(&ids, true).unwrap(), call);
}
