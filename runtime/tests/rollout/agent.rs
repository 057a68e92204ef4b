//! The tool agent loop with a scripted policy (fixed token sequences per turn) and scripted
//! tools: token ids, masks and log-probs equal verl 0.9.1's own continuous-token building for
//! the same conversation (tests/oracle/agent_oracle.py), and the loop's limits, truncation and
//! failure texts behave as verl's.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::Value;
use verlc_runtime::rollout::agent::{
    self, Answer, FunctionCall, GeneratedTurn, ToolCallFormat, ToolOutcome, ToolRunner,
    TruncateSide, TurnGenerator, TurnLimits, UserReply,
};
use verlc_runtime::tokenizer::{Message, Tokenizer};

use crate::oracle;

fn agent_oracle() -> PathBuf {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle");
    static OUT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    OUT.get_or_init(|| {
        oracle::cached_with(
            &dir.join("agent_oracle.py"),
            "agent",
            &[&dir.join("qwen2_5_chat_template.jinja")],
        )
    })
    .clone()
}

/// Plays fixed turns per sample, in order.
struct Script {
    turns: HashMap<usize, Vec<Vec<i64>>>,
    next: HashMap<usize, usize>,
    /// The `max_tokens` of every request, per sample.
    budgets: HashMap<usize, Vec<usize>>,
    /// The samples of each generation, in order.
    batches: Vec<Vec<usize>>,
}

impl Script {
    fn new(turns: Vec<Vec<Vec<i64>>>) -> Script {
        Script {
            turns: turns.into_iter().enumerate().collect(),
            next: HashMap::new(),
            budgets: HashMap::new(),
            batches: Vec::new(),
        }
    }
}

impl TurnGenerator for Script {
    fn next_turns(
        &mut self,
        samples: &[usize],
        _streams: &[Vec<i64>],
        max_tokens: &[usize],
    ) -> Result<Vec<GeneratedTurn>, String> {
        self.batches.push(samples.to_vec());
        Ok(samples
            .iter()
            .zip(max_tokens)
            .map(|(s, &max)| {
                self.budgets.entry(*s).or_default().push(max);
                let t = self.next.entry(*s).or_insert(0);
                let mut ids = self.turns[s].get(*t).cloned().unwrap_or_default();
                ids.truncate(max);
                let lps = (0..ids.len())
                    .map(|k| -0.1 * (k as f32 + 1.0) - *t as f32)
                    .collect();
                *t += 1;
                (ids, lps)
            })
            .collect())
    }
}

/// Answers each call with the next scripted text of its sample; records the calls. A
/// sample's turn is answered after `delay[sample]` further `finished` calls (a slow tool).
struct Tools {
    answers: HashMap<usize, Vec<String>>,
    calls: Vec<(usize, FunctionCall)>,
    delay: HashMap<usize, usize>,
    /// Submitted turns: (sample, answer, `finished` calls left before they are answered).
    running: Vec<(usize, Answer, usize)>,
    /// The interaction's replies per sample, in order, and the conversations it was shown.
    replies: HashMap<usize, Vec<UserReply>>,
    shown: Vec<Vec<Message>>,
}

impl Tools {
    fn new(answers: HashMap<usize, Vec<String>>) -> Tools {
        Tools {
            answers,
            calls: Vec::new(),
            delay: HashMap::new(),
            running: Vec::new(),
            replies: HashMap::new(),
            shown: Vec::new(),
        }
    }
}

impl ToolRunner for Tools {
    fn submit(&mut self, sample: usize, calls: Vec<FunctionCall>) {
        self.calls.extend(calls.iter().map(|c| (sample, c.clone())));
        let outcomes = calls
            .iter()
            .map(|c| {
                if c.name != "calc" {
                    return agent::unknown_tool(&c.name, &["calc".to_owned()]);
                }
                let list = self.answers.get_mut(&sample).expect("a scripted sample");
                ToolOutcome {
                    text: list.remove(0),
                    reward: Some(0.5),
                    failed: false,
                }
            })
            .collect();
        let wait = self.delay.get(&sample).copied().unwrap_or(0);
        self.running.push((sample, Answer::Tools(outcomes), wait));
    }

    fn submit_reply(&mut self, sample: usize, messages: &[Message]) {
        self.shown.push(messages.to_vec());
        let reply = match self.replies.get_mut(&sample) {
            Some(list) if !list.is_empty() => Ok(list.remove(0)),
            _ => Err("no scripted reply".to_owned()),
        };
        self.running.push((sample, Answer::User(reply), 0));
    }

    fn finished(&mut self, _wait: bool) -> Vec<(usize, Answer)> {
        let mut out = Vec::new();
        self.running.retain_mut(|(sample, answer, wait)| {
            if *wait == 0 {
                out.push((*sample, answer.clone()));
                false
            } else {
                *wait -= 1;
                true
            }
        });
        out
    }
}

fn limits(response_length: usize) -> TurnLimits {
    TurnLimits {
        prompt_length: 1024,
        response_length,
        max_assistant_turns: 0,
        max_user_turns: 0,
        max_parallel_calls: 2,
        max_tool_response_length: 256,
        truncate_side: TruncateSide::Middle,
        format: ToolCallFormat::Hermes,
        tool_schemas: Vec::new(),
        interaction: false,
    }
}

fn cases() -> (Tokenizer, Vec<Value>) {
    let out = agent_oracle();
    let tok = Tokenizer::from_dir(&out.join("tok")).unwrap();
    let cases = oracle::json(&out.join("agent.json"));
    (tok, cases.as_array().unwrap().clone())
}

fn ids(v: &Value) -> Vec<i64> {
    serde_json::from_value(v.clone()).unwrap()
}

#[test]
fn token_layout_equals_verls_continuous_token_builder() {
    let (tok, cases) = cases();
    let tools_schema: Vec<Value> = serde_json::from_value(cases[0]["tools"].clone()).unwrap();
    let tokens =
        agent::ContextTokens::new(&tok, "qwen2", &tools_schema, &serde_json::Map::new()).unwrap();
    let prompts: Vec<Vec<Message>> = cases
        .iter()
        .map(|c| serde_json::from_value(c["messages"].clone()).unwrap())
        .collect();
    let mut script = Script::new(
        cases
            .iter()
            .map(|c| c["turn_ids"].as_array().unwrap().iter().map(ids).collect())
            .collect(),
    );
    let mut tools = Tools::new(
        cases
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let rounds: Vec<Vec<String>> =
                    serde_json::from_value(c["tool_rounds"].clone()).unwrap();
                (i, rounds.concat())
            })
            .collect(),
    );
    let out = agent::run(
        &prompts,
        &[],
        &tokens,
        &tok,
        &limits(2048),
        &mut script,
        &mut tools,
    )
    .unwrap();
    for (t, c) in out.iter().zip(&cases) {
        let name = c["name"].as_str().unwrap();
        assert_eq!(t.prompt_ids, ids(&c["prompt_ids"]), "{name}: prompt");
        assert_eq!(t.response_ids, ids(&c["response_ids"]), "{name}: response");
        assert_eq!(t.response_mask, ids(&c["response_mask"]), "{name}: mask");
        let want: Vec<f32> = serde_json::from_value(c["response_logprobs"].clone()).unwrap();
        assert_eq!(t.response_log_probs.len(), want.len(), "{name}");
        for (a, b) in t.response_log_probs.iter().zip(&want) {
            assert!((a - b).abs() < 1e-6, "{name}: log-probs {a} vs {b}");
        }
    }
    // The first conversation: one round, then an answer without a call.
    assert_eq!(
        (out[0].assistant_turns, out[0].user_turns, out[0].num_turns),
        (2, 1, 4)
    );
    // The second: two parallel calls, then one, then the answer.
    assert_eq!(
        (out[1].assistant_turns, out[1].user_turns, out[1].num_turns),
        (3, 2, 6)
    );
    assert_eq!(out[1].tool_calls, 3);
    assert_eq!(out[1].tool_rewards, vec![0.5, 0.5, 0.5]);
    let args: Vec<&str> = tools
        .calls
        .iter()
        .filter(|(s, _)| *s == 1)
        .map(|(_, c)| c.arguments.as_str())
        .collect();
    assert_eq!(
        args,
        vec![
            r#"{"expr": "2*3"}"#,
            r#"{"expr": "4-1"}"#,
            r#"{"expr": "6+3"}"#
        ]
    );
}

/// One sample's run with `limits` and scripted turns (as text).
fn run_one(
    tok: &Tokenizer,
    limits: &TurnLimits,
    turns: &[&str],
    answers: &[&str],
) -> (agent::Trajectory, Vec<(usize, FunctionCall)>, Vec<usize>) {
    let schema: Vec<Value> = Vec::new();
    let tokens = agent::ContextTokens::new(tok, "qwen2", &schema, &serde_json::Map::new()).unwrap();
    let mut script = Script::new(vec![
        turns
            .iter()
            .map(|t| tok.encode(t, false).unwrap())
            .collect(),
    ]);
    let mut tools = Tools::new(HashMap::from([(
        0,
        answers.iter().map(|s| s.to_string()).collect(),
    )]));
    let prompt = vec![Message::user("Compute.")];
    let mut out = agent::run(
        &[prompt],
        &[],
        &tokens,
        tok,
        limits,
        &mut script,
        &mut tools,
    )
    .unwrap();
    let budgets = script.budgets.remove(&0).unwrap_or_default();
    (out.remove(0), tools.calls, budgets)
}

const CALL: &str =
    "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1\"}}\n</tool_call><|im_end|>";

#[test]
fn turn_limits_budget_and_truncation_follow_verl() {
    let (tok, _) = cases();
    // max_assistant_turns = 2: the second turn's call is never run.
    let l = TurnLimits {
        max_assistant_turns: 2,
        ..limits(2048)
    };
    let (t, calls, _) = run_one(&tok, &l, &[CALL, CALL, "done<|im_end|>"], &["a", "b"]);
    assert_eq!((t.assistant_turns, t.user_turns, calls.len()), (2, 1, 1));
    // max_user_turns = 1: the same stop after one round.
    let l = TurnLimits {
        max_user_turns: 1,
        ..limits(2048)
    };
    let (t, calls, _) = run_one(&tok, &l, &[CALL, CALL, "done<|im_end|>"], &["a", "b"]);
    assert_eq!((t.assistant_turns, t.user_turns, calls.len()), (2, 1, 1));
    // A turn without a call ends the trajectory; an unknown tool gets verl's text.
    let unknown = "<tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call><|im_end|>";
    let (t, calls, _) = run_one(&tok, &limits(2048), &[unknown, "ok<|im_end|>"], &[]);
    assert_eq!((t.assistant_turns, t.user_turns, calls.len()), (2, 1, 1));
    let text = tok.decode(&t.response_ids, false).unwrap();
    assert!(
        text.contains("Unknown function 'nope'. Available tools: ['calc']"),
        "{text}"
    );
    // Truncation of a long response: the middle goes.
    let l = TurnLimits {
        max_tool_response_length: 10,
        ..limits(2048)
    };
    let long = "0123456789abcdefghij";
    let (t, _, _) = run_one(&tok, &l, &[CALL, "ok<|im_end|>"], &[long]);
    let text = tok.decode(&t.response_ids, false).unwrap();
    assert!(text.contains("01234...(truncated)...fghij"), "{text}");
    // The response budget: a round that would pass it is dropped (the tool ran), and the
    // trajectory ends there.
    let first = tok.encode(CALL, false).unwrap().len();
    let (t, calls, budgets) = run_one(&tok, &limits(first + 3), &[CALL, "ok<|im_end|>"], &["x"]);
    assert_eq!(calls.len(), 1, "the tool ran");
    assert_eq!(t.response_ids.len(), first, "its tokens were dropped");
    assert_eq!((t.user_turns, t.tool_rewards.len()), (0, 1));
    assert_eq!(budgets, vec![first + 3]);
    // A turn cut by the budget: the response is cut to the budget, every token masked 1.
    let (t, calls, _) = run_one(&tok, &limits(5), &[CALL], &[]);
    assert_eq!((t.response_ids.len(), calls.len()), (5, 0));
    assert_eq!(t.response_mask, vec![1; 5]);
}

#[test]
fn a_slow_tool_holds_only_its_own_trajectory() {
    let (tok, _) = cases();
    let schema: Vec<Value> = Vec::new();
    let tokens =
        agent::ContextTokens::new(&tok, "qwen2", &schema, &serde_json::Map::new()).unwrap();
    let turns = |tok: &Tokenizer| -> Vec<Vec<i64>> {
        [CALL, CALL, CALL, "done<|im_end|>"]
            .iter()
            .map(|t| tok.encode(t, false).unwrap())
            .collect()
    };
    let prompts = vec![vec![Message::user("Slow.")], vec![Message::user("Fast.")]];
    let answers = || HashMap::from([(0, vec!["s".to_string(); 3]), (1, vec!["f".to_string(); 3])]);
    let run = |delay: usize| {
        let mut script = Script::new(vec![turns(&tok), turns(&tok)]);
        let mut tools = Tools::new(answers());
        tools.delay.insert(0, delay);
        let out = agent::run(
            &prompts,
            &[],
            &tokens,
            &tok,
            &limits(2048),
            &mut script,
            &mut tools,
        )
        .unwrap();
        (out, script.batches)
    };
    let (together, batches) = run(0);
    assert_eq!(
        batches,
        vec![vec![0, 1]; 4],
        "equal tools: one batch per turn"
    );
    // Sample 0's tool answers only after three more collections: sample 1 runs all its turns
    // meanwhile, and neither trajectory changes.
    let (apart, batches) = run(3);
    assert_eq!(batches[0], vec![0, 1]);
    let fast_alone = batches.iter().filter(|b| b.as_slice() == [1]).count();
    assert_eq!(
        fast_alone, 3,
        "the fast sample's later turns ran alone: {batches:?}"
    );
    assert_eq!(apart, together);
}

#[test]
fn tool_call_formats_parse_as_verls_parsers() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oracle");
    let out = oracle::cached_with(&dir.join("parser_oracle.py"), "parsers", &[]);
    let data = oracle::json(&out.join("parsers.json"));
    let tools: Vec<Value> = serde_json::from_value(data["tools"].clone()).unwrap();
    let cases = data["cases"].as_array().unwrap();
    assert_eq!(cases.len(), 20);
    for c in cases {
        let format = ToolCallFormat::from_name(c["format"].as_str().unwrap()).unwrap();
        let text = c["text"].as_str().unwrap();
        let got = format.parse(text, &tools);
        let want: Vec<FunctionCall> = c["calls"]
            .as_array()
            .unwrap()
            .iter()
            .map(|k| FunctionCall {
                name: k["name"].as_str().unwrap().into(),
                arguments: k["arguments"].as_str().unwrap().into(),
            })
            .collect();
        assert_eq!(got.calls, want, "{format:?} calls of {text:?}");
        assert_eq!(
            got.content,
            c["content"].as_str().unwrap(),
            "{format:?} content of {text:?}"
        );
    }
}

#[test]
fn an_interaction_answers_turns_without_calls_until_it_ends_the_conversation() {
    let (tok, _) = cases();
    let schema: Vec<Value> = Vec::new();
    let tokens =
        agent::ContextTokens::new(&tok, "qwen2", &schema, &serde_json::Map::new()).unwrap();
    let reply = |text: &str, reward: f64, terminate: bool| UserReply {
        text: text.into(),
        reward: Some(reward),
        terminate,
    };
    let run = |limits: &TurnLimits| {
        let mut script = Script::new(vec![
            [
                CALL,
                "It is 4.<|im_end|>",
                "It is 5.<|im_end|>",
                "unused<|im_end|>",
            ]
            .iter()
            .map(|t| tok.encode(t, false).unwrap())
            .collect(),
        ]);
        let mut tools = Tools::new(HashMap::from([(0, vec!["2".to_string()])]));
        tools.replies.insert(
            0,
            vec![
                reply("Wrong, try again.", 0.0, false),
                reply("Right!", 1.0, true),
            ],
        );
        let prompt = vec![Message::user("What is 2+3?")];
        let out = agent::run(
            &[prompt],
            &[],
            &tokens,
            &tok,
            limits,
            &mut script,
            &mut tools,
        )
        .unwrap();
        (out.into_iter().next().unwrap(), tools.shown)
    };
    let with = TurnLimits {
        interaction: true,
        ..limits(2048)
    };
    let (t, shown) = run(&with);
    // A tool round, a wrong answer the interaction rejects, a right one that ends it: the
    // tool round and both replies are user turns.
    assert_eq!((t.assistant_turns, t.user_turns, t.num_turns), (3, 3, 7));
    assert_eq!(t.turn_scores, vec![0.0, 1.0]);
    assert_eq!(t.tool_rewards, vec![0.5]);
    // What the interaction read: the conversation, assistant turns without special tokens.
    let last: Vec<(String, String)> = shown[1]
        .iter()
        .map(|m| {
            (
                m.role.clone(),
                m.content.as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect();
    let pairs: Vec<(&str, &str)> = last.iter().map(|(r, c)| (r.as_str(), c.as_str())).collect();
    assert_eq!(
        pairs,
        vec![
            ("user", "What is 2+3?"),
            (
                "assistant",
                "<tool_call>\n{\"name\": \"calc\", \"arguments\": {\"expr\": \"1\"}}\n</tool_call>"
            ),
            ("tool", "2"),
            ("assistant", "It is 4."),
            ("user", "Wrong, try again."),
            ("assistant", "It is 5."),
        ]
    );
    // The user turn is in the response, out of the loss, as ChatML renders it.
    let text = tok.decode(&t.response_ids, false).unwrap();
    assert!(
        text.contains("It is 4.<|im_end|>\n<|im_start|>user\nWrong, try again.<|im_end|>\n<|im_start|>assistant\nIt is 5.<|im_end|>\n<|im_start|>user\nRight!<|im_end|>\n<|im_start|>assistant\n"),
        "{text}"
    );
    let generated: Vec<i64> = t
        .response_ids
        .iter()
        .zip(&t.response_mask)
        .filter(|(_, m)| **m == 1)
        .map(|(id, _)| *id)
        .collect();
    assert_eq!(
        tok.decode(&generated, false).unwrap(),
        format!("{CALL}It is 4.<|im_end|>It is 5.<|im_end|>")
    );
    // max_user_turns counts the interaction's turns too.
    let (t, _) = run(&TurnLimits {
        max_user_turns: 2,
        ..with
    });
    assert_eq!((t.assistant_turns, t.user_turns), (3, 2));
    // Without an interaction a turn without a call ends the trajectory.
    let (t, shown) = run(&limits(2048));
    assert_eq!((t.assistant_turns, t.user_turns, shown.len()), (2, 1, 0));
}
