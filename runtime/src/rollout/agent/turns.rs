//! verl's tool agent loop (`tool_agent`), one trajectory per sample: generate a turn; stop on
//! the response budget, `max_assistant_turns` or `max_user_turns` (checked in that order,
//! before the turn's calls are parsed, so the last permitted turn's calls never run), or on a
//! turn without a parsable call; otherwise run the turn's first `max_parallel_calls` calls,
//! append their responses (truncated) as tool messages, and go on unless they would exceed the
//! budget (then the round's tokens are dropped; the tools ran and their rewards count).
//!
//! With an interaction (verl 0.7's `interaction_config_path`), a turn without a call is
//! answered by the interaction as a user message instead of ending the trajectory (it ends
//! when the interaction says so, or at a limit); the loop then keeps the conversation as
//! messages too (the assistant turns decoded without special tokens), which is what the
//! interaction reads. Its rewards are the trajectory's `turn_scores`.
//!
//! Trajectories interleave: every trajectory that is ready (its prompt, or its tool results
//! appended) generates its next turn in one batched generation, its calls start in the tool
//! runner, and the loop goes on with whichever trajectories' calls have finished, so a slow
//! tool holds only its own trajectory. The generator must make a trajectory's turn
//! independent of which others share its batch (the built-in rollout seeds each by sample
//! and turn).

use serde_json::json;

use crate::engine::batch::RowImages;
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::Message;

use super::context::{ContextError, ContextTokens};
use super::format::ToolCallFormat;
use super::hermes::FunctionCall;
use super::truncate::{TruncateSide, truncate};

/// The `rollout.multi_turn` settings (and offered tools) the loop reads.
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
    /// `multi_turn.format`.
    pub format: ToolCallFormat,
    /// The offered tools' OpenAI function schemas (the XML call format types arguments by
    /// them).
    pub tool_schemas: Vec<serde_json::Value>,
    /// An interaction answers turns without calls.
    pub interaction: bool,
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
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolOutcome {
    pub text: String,
    pub reward: Option<f64>,
    /// The call did not run to an answer (unknown tool, bad arguments, an exception, a
    /// timeout, a crash); `text` says why.
    pub failed: bool,
}

/// An interaction's answer to a turn without calls.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct UserReply {
    /// The user message.
    pub text: String,
    pub reward: Option<f64>,
    /// The conversation ends here.
    pub terminate: bool,
}

/// What the environment answered a trajectory's turn.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Answer {
    /// The outcome of each call of the turn, in order. A failing call is an outcome with the
    /// error's text, not an error (verl shows the model what went wrong).
    Tools(Vec<ToolOutcome>),
    /// The interaction's reply; an error when the interaction failed (which ends the run, as
    /// in verl).
    User(Result<UserReply, String>),
}

/// Runs tool calls and interactions, each trajectory's while other trajectories go on.
pub trait ToolRunner {
    /// Starts the calls of one turn of trajectory `sample`.
    fn submit(&mut self, sample: usize, calls: Vec<FunctionCall>);
    /// Asks the interaction of trajectory `sample` to answer the conversation `messages`.
    fn submit_reply(&mut self, sample: usize, messages: &[Message]);
    /// Turns that have been answered. With `wait`, blocks until at least one has (when any
    /// is running).
    fn finished(&mut self, wait: bool) -> Vec<(usize, Answer)>;
    /// Why the runner cannot go on (its answers cannot be delivered), if so: the loop stops
    /// with it.
    fn failure(&mut self) -> Option<String> {
        None
    }
}

/// A runner that answers each call as it is submitted, with `answer(sample, call)`; it has no
/// interaction.
pub struct Immediate<F> {
    answer: F,
    done: Vec<(usize, Answer)>,
}

impl<F: FnMut(usize, &FunctionCall) -> ToolOutcome> Immediate<F> {
    pub fn new(answer: F) -> Self {
        Immediate {
            answer,
            done: Vec::new(),
        }
    }
}

impl<F: FnMut(usize, &FunctionCall) -> ToolOutcome> ToolRunner for Immediate<F> {
    fn submit(&mut self, sample: usize, calls: Vec<FunctionCall>) {
        let out = calls.iter().map(|c| (self.answer)(sample, c)).collect();
        self.done.push((sample, Answer::Tools(out)));
    }

    fn submit_reply(&mut self, sample: usize, _messages: &[Message]) {
        self.done.push((
            sample,
            Answer::User(Err("no interaction is configured".into())),
        ));
    }

    fn finished(&mut self, _wait: bool) -> Vec<(usize, Answer)> {
        std::mem::take(&mut self.done)
    }
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
    /// Calls whose outcome was a failure.
    pub tool_failures: usize,
    pub tool_rewards: Vec<f64>,
    /// The interaction's rewards, one per reply that had one.
    pub turn_scores: Vec<f64>,
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
    #[error("sample {sample}: {msg}")]
    Interaction { sample: usize, msg: String },
    #[error("tools: {0}")]
    Tools(String),
}

struct Live {
    stream: Vec<i64>,
    prompt_len: usize,
    mask: Vec<i64>,
    log_probs: Vec<f32>,
    assistant_turns: usize,
    user_turns: usize,
    tool_calls: usize,
    tool_failures: usize,
    tool_rewards: Vec<f64>,
    turn_scores: Vec<f64>,
    /// The conversation as messages (kept with an interaction, which reads it).
    messages: Vec<Message>,
}

/// Runs the loop for each conversation in `prompts`, `images[i]` filling the `<image>`
/// placeholders of `prompts[i]` (`images` empty: no conversation has any).
pub fn run(
    prompts: &[Vec<Message>],
    images: &[RowImages],
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
            let stream = match images.get(sample) {
                Some(pictures) => tokens.initial_with_images(messages, pictures),
                None => tokens.initial(messages),
            }
            .map_err(|source| AgentError::Context { sample, source })?;
            Ok(Live {
                prompt_len: stream.len(),
                stream,
                mask: Vec::new(),
                log_probs: Vec::new(),
                assistant_turns: 0,
                user_turns: 0,
                tool_calls: 0,
                tool_failures: 0,
                tool_rewards: Vec::new(),
                turn_scores: Vec::new(),
                messages: if limits.interaction {
                    messages.clone()
                } else {
                    Vec::new()
                },
            })
        })
        .collect::<Result<_, AgentError>>()?;
    // Trajectories that generate next; those whose calls are running are in the runner.
    let mut ready: Vec<usize> = (0..live.len()).collect();
    let mut running = 0usize;
    while !ready.is_empty() || running > 0 {
        if !ready.is_empty() {
            let active = std::mem::take(&mut ready);
            running += generate_turns(&active, &mut live, tokenizer, limits, generator, tools)?;
        }
        if running == 0 {
            continue;
        }
        // Block only when nothing can generate meanwhile.
        let answers = tools.finished(ready.is_empty());
        if let Some(why) = tools.failure() {
            return Err(AgentError::Tools(why));
        }
        for (i, answer) in answers {
            running = running.saturating_sub(1);
            let Some(t) = live.get_mut(i) else { continue };
            let go_on = match answer {
                Answer::Tools(outcomes) => append_tool_round(t, i, outcomes, tokens, limits)?,
                Answer::User(Ok(reply)) => append_user_turn(t, i, reply, tokens)?,
                Answer::User(Err(msg)) => return Err(AgentError::Interaction { sample: i, msg }),
            };
            if go_on {
                ready.push(i);
            }
        }
        ready.sort_unstable();
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
                tool_failures: t.tool_failures,
                tool_rewards: t.tool_rewards,
                turn_scores: t.turn_scores,
            }
        })
        .collect())
}

/// Generates the next turn of each trajectory of `active`; ends those that stop and submits
/// the calls of the rest. Returns how many turns' calls started.
fn generate_turns(
    active: &[usize],
    live: &mut [Live],
    tokenizer: &Tokenizer,
    limits: &TurnLimits,
    generator: &mut dyn TurnGenerator,
    tools: &mut dyn ToolRunner,
) -> Result<usize, AgentError> {
    let r = limits.response_length;
    let streams: Vec<Vec<i64>> = active.iter().map(|&i| live[i].stream.clone()).collect();
    let budgets: Vec<usize> = active
        .iter()
        .map(|&i| {
            let room = (limits.prompt_length + r).saturating_sub(live[i].stream.len());
            r.min(room).max(1)
        })
        .collect();
    let turns = generator
        .next_turns(active, &streams, &budgets)
        .map_err(AgentError::Generate)?;
    let mut started = 0;
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
            continue;
        }
        let text = tokenizer
            .decode(&ids, false)
            .map_err(|e| AgentError::Decode {
                sample: i,
                msg: e.to_string(),
            })?;
        let calls: Vec<FunctionCall> = limits
            .format
            .parse(&text, &limits.tool_schemas)
            .calls
            .into_iter()
            .take(limits.max_parallel_calls.max(1))
            .collect();
        if limits.interaction {
            let said = tokenizer
                .decode(&ids, true)
                .map_err(|e| AgentError::Decode {
                    sample: i,
                    msg: e.to_string(),
                })?;
            t.messages.push(Message::assistant(&said));
        }
        if !calls.is_empty() {
            tools.submit(i, calls);
        } else if limits.interaction {
            tools.submit_reply(i, &t.messages);
        } else {
            continue;
        }
        started += 1;
    }
    Ok(started)
}

/// Appends one turn's tool responses to trajectory `t` (sample `i`); false when it ends
/// instead (they would not fit in the response; the tools ran and their rewards count).
fn append_tool_round(
    t: &mut Live,
    i: usize,
    outcomes: Vec<ToolOutcome>,
    tokens: &ContextTokens<'_>,
    limits: &TurnLimits,
) -> Result<bool, AgentError> {
    let mut messages = Vec::with_capacity(outcomes.len());
    for outcome in outcomes {
        t.tool_calls += 1;
        t.tool_failures += usize::from(outcome.failed);
        if let Some(reward) = outcome.reward {
            t.tool_rewards.push(reward);
        }
        let text = truncate(
            &outcome.text,
            limits.max_tool_response_length,
            limits.truncate_side,
        );
        messages.push(Message {
            role: "tool".into(),
            content: json!(text),
            extra: serde_json::Map::new(),
        });
    }
    if limits.interaction {
        t.messages.extend(messages.iter().cloned());
    }
    let delta = tokens
        .tool_round(t.stream.last().copied(), &messages)
        .map_err(|source| AgentError::Context { sample: i, source })?;
    let added = delta.inserted.len() + delta.tools.len();
    if t.mask.len() + added >= limits.response_length {
        return Ok(false);
    }
    t.stream.extend(delta.inserted.iter().chain(&delta.tools));
    t.mask.extend(std::iter::repeat_n(0, added));
    t.log_probs.extend(std::iter::repeat_n(0.0, added));
    t.user_turns += 1;
    Ok(true)
}

/// Appends an interaction's reply to trajectory `t` (sample `i`) as a user turn (verl 0.7
/// appends it whatever its length: the response is cut to the budget at the end); false when
/// the interaction ended the conversation.
fn append_user_turn(
    t: &mut Live,
    i: usize,
    reply: UserReply,
    tokens: &ContextTokens<'_>,
) -> Result<bool, AgentError> {
    let message = Message::user(&reply.text);
    let delta = tokens
        .user_turn(t.stream.last().copied(), &message)
        .map_err(|source| AgentError::Context { sample: i, source })?;
    let added = delta.inserted.len() + delta.tools.len();
    t.stream.extend(delta.inserted.iter().chain(&delta.tools));
    t.mask.extend(std::iter::repeat_n(0, added));
    t.log_probs.extend(std::iter::repeat_n(0.0, added));
    t.user_turns += 1;
    t.messages.push(message);
    if let Some(r) = reply.reward {
        t.turn_scores.push(r);
    }
    Ok(!reply.terminate)
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
        failed: true,
    }
}

/// verl's text for a tool that raised (or crashed, or timed out).
pub fn tool_failed(name: &str, error: &str) -> ToolOutcome {
    ToolOutcome {
        text: format!("Error executing tool '{name}': {error}"),
        reward: Some(0.0),
        failed: true,
    }
}
