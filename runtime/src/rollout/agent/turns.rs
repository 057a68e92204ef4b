//! verl's tool agent loop (`tool_agent`), one trajectory per sample: generate a turn; stop on
//! the response budget, `max_assistant_turns` or `max_user_turns` (checked in that order,
//! before the turn's calls are parsed, so the last permitted turn's calls never run), or on a
//! turn without a parsable call; otherwise run the turn's first `max_parallel_calls` calls,
//! append their responses (truncated) as tool messages, and go on unless they would exceed the
//! budget (then the round's tokens are dropped; the tools ran and their rewards count).
//!
//! All live trajectories generate their next turn together (one batched generation), and a
//! round's tool calls of every trajectory run together, so a batch of trajectories advances
//! turn by turn.

use serde_json::json;

use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::Message;

use super::context::{ContextError, ContextTokens};
use super::hermes::{self, FunctionCall};
use super::truncate::{TruncateSide, truncate};

/// `rollout.multi_turn` settings the loop reads.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnLimits {
    /// `rollout.prompt_length` (P) and `response_length` (R): a turn may generate up to
    /// `min(R, P + R - stream length)` tokens; the response is cut to R.
    pub prompt_length: usize,
    pub response_length: usize,
    /// 0: no limit.
    pub max_assistant_turns: usize,
    /// Tool rounds; 0: no limit.
    pub max_user_turns: usize,
    pub max_parallel_calls: usize,
    pub max_tool_response_length: usize,
    pub truncate_side: TruncateSide,
}

/// A generated turn: its token ids and their log-probs.
pub type GeneratedTurn = (Vec<i64>, Vec<f32>);

/// Generates the next turn of each token stream.
pub trait TurnGenerator {
    /// For each `streams[i]` (the trajectory of sample `samples[i]`), at most `max_tokens[i]`
    /// new tokens (ending at a stop token or at the limit) and their log-probs.
    fn next_turns(
        &mut self,
        samples: &[usize],
        streams: &[Vec<i64>],
        max_tokens: &[usize],
    ) -> Result<Vec<GeneratedTurn>, String>;
}

/// What a tool call gave.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutcome {
    pub text: String,
    pub reward: Option<f64>,
}

/// Runs tool calls.
pub trait ToolRunner {
    /// The outcome of each `(trajectory, call)`, in order. A failing call is an outcome with
    /// the error's text, not an error (verl shows the model what went wrong).
    fn run(&mut self, calls: &[(usize, FunctionCall)]) -> Vec<ToolOutcome>;
}

/// One finished trajectory.
#[derive(Debug, Clone, PartialEq)]
pub struct Trajectory {
    pub prompt_ids: Vec<i64>,
    /// Every turn after the prompt, cut to the response length.
    pub response_ids: Vec<i64>,
    /// 1 on generated tokens, 0 on tool and junction tokens.
    pub response_mask: Vec<i64>,
    /// The generator's log-probs on generated tokens, 0 elsewhere.
    pub response_log_probs: Vec<f32>,
    pub assistant_turns: usize,
    pub user_turns: usize,
    /// verl's `num_turns`: user + assistant turns + 1 (the prompt).
    pub num_turns: usize,
    pub tool_calls: usize,
    pub tool_rewards: Vec<f64>,
}

/// Errors of the loop.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("generation: {0}")]
    Generate(String),
    #[error("sample {sample}: {source}")]
    Context { sample: usize, source: ContextError },
    #[error("sample {sample}: {msg}")]
    Decode { sample: usize, msg: String },
}

struct Live {
    stream: Vec<i64>,
    prompt_len: usize,
    mask: Vec<i64>,
    log_probs: Vec<f32>,
    assistant_turns: usize,
    user_turns: usize,
    tool_calls: usize,
    tool_rewards: Vec<f64>,
    done: bool,
}

/// Runs the loop for each conversation in `prompts`.
pub fn run(
    prompts: &[Vec<Message>],
    tokens: &ContextTokens<'_>,
    tokenizer: &Tokenizer,
    limits: &TurnLimits,
    generator: &mut dyn TurnGenerator,
    tools: &mut dyn ToolRunner,
) -> Result<Vec<Trajectory>, AgentError> {
    let r = limits.response_length;
    let mut live: Vec<Live> = prompts
        .iter()
        .enumerate()
        .map(|(sample, messages)| {
            let stream = tokens
                .initial(messages)
                .map_err(|source| AgentError::Context { sample, source })?;
            Ok(Live {
                prompt_len: stream.len(),
                stream,
                mask: Vec::new(),
                log_probs: Vec::new(),
                assistant_turns: 0,
                user_turns: 0,
                tool_calls: 0,
                tool_rewards: Vec::new(),
                done: false,
            })
        })
        .collect::<Result<_, AgentError>>()?;
    loop {
        let active: Vec<usize> = (0..live.len()).filter(|&i| !live[i].done).collect();
        if active.is_empty() {
            break;
        }
        let streams: Vec<Vec<i64>> = active.iter().map(|&i| live[i].stream.clone()).collect();
        let budgets: Vec<usize> = active
            .iter()
            .map(|&i| {
                let room = (limits.prompt_length + r).saturating_sub(live[i].stream.len());
                r.min(room).max(1)
            })
            .collect();
        let turns = generator
            .next_turns(&active, &streams, &budgets)
            .map_err(AgentError::Generate)?;
        // The calls of this round, by trajectory.
        let mut round: Vec<(usize, FunctionCall)> = Vec::new();
        for (&i, (ids, lps)) in active.iter().zip(turns) {
            let t = &mut live[i];
            t.assistant_turns += 1;
            t.stream.extend_from_slice(&ids);
            t.mask.extend(std::iter::repeat_n(1, ids.len()));
            t.log_probs.extend(
                lps.iter()
                    .copied()
                    .chain(std::iter::repeat(0.0))
                    .take(ids.len()),
            );
            let over_turns =
                limits.max_assistant_turns > 0 && t.assistant_turns >= limits.max_assistant_turns;
            let over_rounds = limits.max_user_turns > 0 && t.user_turns >= limits.max_user_turns;
            if t.mask.len() >= r || over_turns || over_rounds {
                t.done = true;
                continue;
            }
            let text = tokenizer
                .decode(&ids, false)
                .map_err(|e| AgentError::Decode {
                    sample: i,
                    msg: e.to_string(),
                })?;
            let calls = hermes::parse(&text).calls;
            if calls.is_empty() {
                t.done = true;
                continue;
            }
            round.extend(
                calls
                    .into_iter()
                    .take(limits.max_parallel_calls.max(1))
                    .map(|c| (i, c)),
            );
        }
        if round.is_empty() {
            continue;
        }
        let outcomes = tools.run(&round);
        let mut by_trajectory: Vec<(usize, Vec<Message>)> = Vec::new();
        for ((i, _), outcome) in round.iter().zip(outcomes) {
            let t = &mut live[*i];
            t.tool_calls += 1;
            if let Some(reward) = outcome.reward {
                t.tool_rewards.push(reward);
            }
            let text = truncate(
                &outcome.text,
                limits.max_tool_response_length,
                limits.truncate_side,
            );
            let message = Message {
                role: "tool".into(),
                content: json!(text),
                extra: serde_json::Map::new(),
            };
            match by_trajectory.last_mut() {
                Some((j, msgs)) if j == i => msgs.push(message),
                _ => by_trajectory.push((*i, vec![message])),
            }
        }
        for (i, messages) in by_trajectory {
            let t = &mut live[i];
            let delta = tokens
                .tool_round(t.stream.last().copied(), &messages)
                .map_err(|source| AgentError::Context { sample: i, source })?;
            let added = delta.inserted.len() + delta.tools.len();
            if t.mask.len() + added >= r {
                t.done = true;
                continue;
            }
            t.stream.extend(delta.inserted.iter().chain(&delta.tools));
            t.mask.extend(std::iter::repeat_n(0, added));
            t.log_probs.extend(std::iter::repeat_n(0.0, added));
            t.user_turns += 1;
        }
    }
    Ok(live
        .into_iter()
        .map(|t| {
            let keep = t.mask.len().min(r);
            Trajectory {
                prompt_ids: t.stream[..t.prompt_len].to_vec(),
                response_ids: t.stream[t.prompt_len..t.prompt_len + keep].to_vec(),
                response_mask: t.mask[..keep].to_vec(),
                response_log_probs: t.log_probs[..keep].to_vec(),
                assistant_turns: t.assistant_turns,
                user_turns: t.user_turns,
                num_turns: t.assistant_turns + t.user_turns + 1,
                tool_calls: t.tool_calls,
                tool_rewards: t.tool_rewards,
            }
        })
        .collect())
}

/// verl's error texts for calls a runner cannot make: an unknown tool name.
pub fn unknown_tool(name: &str, available: &[String]) -> ToolOutcome {
    let list: Vec<String> = available.iter().map(|n| format!("'{n}'")).collect();
    ToolOutcome {
        text: format!(
            "Unknown function '{name}'. Available tools: [{}]",
            list.join(", ")
        ),
        reward: Some(0.0),
    }
}

/// verl's text for a tool that raised (or crashed, or timed out).
pub fn tool_failed(name: &str, error: &str) -> ToolOutcome {
    ToolOutcome {
        text: format!("Error executing tool '{name}': {error}"),
        reward: Some(0.0),
    }
}
