//! The trainer's side of `rollout.multi_turn`: each of a batch's `prompt × n` rows runs the
//! agent loop its sample names (`agent_name` column, else `rollout.agent.default_agent_loop`):
//! `tool_agent` offers the tools and runs turns until verl's loop would stop,
//! `single_turn_agent` generates once without tools. The rollout (built-in or vLLM) generates
//! every turn; each row samples its turn `k` from its own stream (the step's seed, `k`, the
//! row), so its turns do not depend on which other rows share a generation, and rows whose
//! tools are slow do not hold the others.

use std::sync::Mutex;

use serde_json::Value;
use verlc_spec::trainer::MultiTurnSpec;

use crate::data::PromptItem;
use crate::data::vision_prompt::VideoSpans;
use crate::engine::batch::RowImages;
use crate::rng::Rng;
use crate::rollout::agent::python_loops::PythonLoops;
use crate::rollout::agent::tools::{PythonTools, ToolSettings};
use crate::rollout::agent::{
    self, Answer, ContextTokens, FunctionCall, GeneratedTurn, ToolCallFormat, ToolRunner,
    TruncateSide, TurnGenerator, TurnLimits,
};
use crate::rollout::{PromptStream, RolloutOutput, SamplingParams, StopTokens};
use crate::tokenizer::Tokenizer;
use crate::tokenizer::chat::Message;
use crate::workers::rollout::RolloutWorker;

use super::{RunOptions, TrainerError};

/// The agent loop of a run and its tools.
pub struct AgentRollout {
    spec: MultiTurnSpec,
    tools: Mutex<Option<PythonTools>>,
    /// The user's agent loops (`agent_loop_config_path`), run in Python.
    loops: Mutex<Option<PythonLoops>>,
    schemas: Vec<Value>,
    format: ToolCallFormat,
    model_type: String,
}

impl std::fmt::Debug for AgentRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentRollout")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

fn config(e: impl std::fmt::Display) -> TrainerError {
    TrainerError::Config(e.to_string())
}

impl AgentRollout {
    /// Loads the tools of `spec` with the interpreter and timeouts of `opts`. When the
    /// rollout's replica spans ranks (Megatron tensor/pipeline parallelism), only its leader
    /// runs the tools and the others learn their schemas from it (collective over the
    /// replica).
    pub fn start(
        spec: &MultiTurnSpec,
        opts: &RunOptions,
        model_type: &str,
        rollout: &RolloutWorker,
        tokenizer: (&str, &Tokenizer),
    ) -> Result<Self, TrainerError> {
        let loops = match &spec.agent_loop_config_path {
            Some(path) => {
                let (dir, _saved) = super::prompts::tokenizer_dir(tokenizer.0, tokenizer.1)?;
                let loops = PythonLoops::start(
                    &opts.python(),
                    path,
                    &dir,
                    &spec.config,
                    model_type,
                    (opts.tool_startup_timeout, opts.tool_call_timeout),
                )
                .map_err(TrainerError::Config)?;
                let default = &spec.default_agent_loop;
                if !loops.registers(default)
                    && !["single_turn_agent", "tool_agent"].contains(&default.as_str())
                {
                    return Err(TrainerError::Config(format!(
                        "rollout.agent.default_agent_loop `{default}` is neither one of verl's loops nor registered in {path} (it registers {})",
                        loops.names.join(", ")
                    )));
                }
                Some(loops)
            }
            None => None,
        };
        let has_tools = spec.tool_config_path.is_some()
            || spec.function_tool_path.is_some()
            || spec.interaction_config_path.is_some();
        let leader = rollout.leads_replica();
        let tools = if has_tools && leader {
            PythonTools::start(ToolSettings {
                python: opts.python(),
                tool_config: spec.tool_config_path.as_ref().map(Into::into),
                function_tools: spec.function_tool_path.as_ref().map(Into::into),
                interaction_config: spec.interaction_config_path.as_ref().map(Into::into),
                startup_timeout: opts.tool_startup_timeout,
                call_timeout: opts.tool_call_timeout,
            })
            .map(Some)
        } else {
            Ok(None)
        };
        // The leader's outcome (its schemas, or why its tools did not load) on every rank of
        // the replica, so that no rank waits for a leader that failed.
        let said = match &tools {
            Ok(t) => {
                serde_json::json!({"schemas": t.as_ref().map(|t| t.schemas().to_vec()).unwrap_or_default()})
            }
            Err(e) => serde_json::json!({"error": e.to_string()}),
        };
        let heard: Value = serde_json::from_str(&rollout.share_with_replica(&said.to_string())?)
            .map_err(config)?;
        if let Some(e) = heard.get("error").and_then(Value::as_str) {
            return Err(TrainerError::Config(e.to_owned()));
        }
        let tools = tools.map_err(config)?;
        let schemas: Vec<Value> = heard
            .get("schemas")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        let format = ToolCallFormat::from_name(&spec.format).ok_or_else(|| {
            config(format!(
                "tool-call format `{}` is not one verlc parses ({})",
                spec.format,
                ToolCallFormat::NAMES.join(", ")
            ))
        })?;
        Ok(AgentRollout {
            spec: spec.clone(),
            tools: Mutex::new(tools),
            loops: Mutex::new(loops),
            schemas,
            format,
            model_type: model_type.to_owned(),
        })
    }

    fn limits(&self, params: &SamplingParams, tool: bool) -> TurnLimits {
        let s = &self.spec;
        TurnLimits {
            prompt_length: s.prompt_length,
            response_length: params.max_new_tokens,
            max_assistant_turns: if tool { s.max_assistant_turns } else { 1 },
            max_user_turns: s.max_user_turns,
            max_parallel_calls: s.max_parallel_calls,
            max_tool_response_length: s.max_tool_response_length,
            truncate_side: TruncateSide::parse(&s.tool_response_truncate_side),
            format: self.format,
            tool_schemas: if tool {
                self.schemas.clone()
            } else {
                Vec::new()
            },
            interaction: tool && s.interaction_config_path.is_some(),
        }
    }

    /// Generates `params.n` trajectories per item.
    pub fn generate(
        &self,
        rollout: &RolloutWorker,
        tokenizer: &Tokenizer,
        items: &[&PromptItem],
        params: &SamplingParams,
        stop: &StopTokens,
    ) -> Result<RolloutOutput, TrainerError> {
        let n = params.n;
        let rows = items.len() * n;
        let name_of = |row: usize| -> &str {
            items[row / n]
                .sample
                .row
                .get("agent_name")
                .and_then(Value::as_str)
                .unwrap_or(&self.spec.default_agent_loop)
        };
        let mut loops = self.loops.lock().unwrap_or_else(|p| p.into_inner());
        let user_loop = |row: usize| loops.as_ref().is_some_and(|l| l.registers(name_of(row)));
        let uses_tools = |row: usize| !user_loop(row) && name_of(row) == "tool_agent";
        let mut prompts = vec![Vec::new(); rows];
        let mut responses = vec![Vec::new(); rows];
        let mut masks = vec![Vec::new(); rows];
        let mut log_probs = vec![Vec::new(); rows];
        let mut num_turns = vec![0; rows];
        let mut tool_calls = vec![0; rows];
        let mut tool_failures = vec![0; rows];
        let mut tool_rewards = vec![Vec::new(); rows];
        let mut turn_scores = vec![Vec::new(); rows];
        let mut loop_scores = Vec::new();
        let python_rows: Vec<usize> = (0..rows).filter(|&r| user_loop(r)).collect();
        // A vision-language policy's prompts carry their images into every turn's prefill.
        let vision = rollout.vision_tokens();
        for tool in [true, false] {
            let group: Vec<usize> = (0..rows)
                .filter(|&r| !user_loop(r) && uses_tools(r) == tool)
                .collect();
            if group.is_empty() {
                continue;
            }
            let schemas: &[Value] = if tool { &self.schemas } else { &[] };
            let mut tokens = ContextTokens::new(
                tokenizer,
                &self.model_type,
                schemas,
                &self.spec.chat_template_kwargs,
            )
            .map_err(config)?;
            if let Some(v) = vision {
                tokens = tokens.with_vision(
                    v.spatial_merge_size.max(1) as usize,
                    VideoSpans::of(v.timestamped_videos),
                );
            }
            let conversations: Vec<_> = group
                .iter()
                .map(|&r| items[r / n].sample.prompt.clone())
                .collect();
            let images = super::fit::prompt_images(group.iter().map(|&r| items[r / n]));
            let mut generator =
                NativeTurns::new(rollout, params, stop, group.clone(), images.clone());
            let mut guard = self.tools.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(tools) = guard.as_mut() {
                // Each sample's `tools_kwargs` and `interaction_kwargs`, indexed as the loop
                // numbers its samples: the item's own (a Python dataset sets them, as verl's
                // RLHFDataset does from `extra_info`), else `extra_info`'s.
                let extra = |r: usize, key: &str| {
                    let s = &items[r / n].sample;
                    [s.row.get(key), s.extra_info.get(key)]
                        .into_iter()
                        .flatten()
                        .filter_map(Value::as_object)
                        .find(|m| !m.is_empty())
                        .cloned()
                };
                tools.begin_batch(
                    group
                        .iter()
                        .map(|&r| extra(r, "tools_kwargs").unwrap_or_default())
                        .collect(),
                    group
                        .iter()
                        .map(|&r| extra(r, "interaction_kwargs"))
                        .collect(),
                );
            }
            let mut runner = Runner {
                tools: guard.as_mut(),
                unanswered: Vec::new(),
                replica: rollout,
                failure: None,
            };
            let done = agent::run(
                &conversations,
                &images,
                &tokens,
                tokenizer,
                &self.limits(params, tool),
                &mut generator,
                &mut runner,
            )
            .map_err(config)?;
            for (&r, t) in group.iter().zip(done) {
                prompts[r] = t.prompt_ids;
                responses[r] = t.response_ids;
                masks[r] = t.response_mask;
                log_probs[r] = t.response_log_probs;
                num_turns[r] = t.num_turns;
                tool_calls[r] = t.tool_calls;
                tool_failures[r] = t.tool_failures;
                tool_rewards[r] = t.tool_rewards;
                turn_scores[r] = t.turn_scores;
            }
        }
        if let (Some(l), false) = (loops.as_mut(), python_rows.is_empty()) {
            let mut generator =
                NativeTurns::new(rollout, params, stop, python_rows.clone(), Vec::new());
            let kwargs: Vec<(String, serde_json::Map<String, Value>)> = python_rows
                .iter()
                .map(|&r| (name_of(r).to_owned(), loop_kwargs(&items[r / n].sample)))
                .collect();
            let sampling = serde_json::json!({
                "temperature": params.temperature,
                "top_p": params.top_p,
                "top_k": params.top_k,
                "repetition_penalty": 1.0,
                "logprobs": true,
            });
            let done = l
                .run(kwargs, sampling, params.max_new_tokens, &mut generator)
                .map_err(config)?;
            let r_max = params.max_new_tokens;
            loop_scores = vec![None; rows];
            for (&r, mut t) in python_rows.iter().zip(done) {
                loop_scores[r] = t.reward_score;
                // verl pads or cuts a loop's response to the response length.
                t.response_ids.truncate(r_max);
                t.response_mask.truncate(r_max);
                t.response_log_probs.truncate(r_max);
                prompts[r] = t.prompt_ids;
                responses[r] = t.response_ids;
                masks[r] = t.response_mask;
                log_probs[r] = t.response_log_probs;
                num_turns[r] = t.num_turns;
            }
        }
        drop(loops);
        let mut out = crate::rollout::from_trajectory_rows(
            &prompts,
            &responses,
            &masks,
            &log_probs,
            params.max_new_tokens,
            stop,
        )
        .map_err(config)?;
        out.prompt_index = (0..rows).map(|r| r / n).collect();
        if let (Some(v), true) = (vision, items.iter().any(|it| !it.images.is_empty())) {
            // Multimodal positions over each whole trajectory (its images in the prompt; the
            // turns after it are text).
            let visuals: Vec<&crate::model::vision::ProcessedImage> =
                (0..rows).flat_map(|r| items[r / n].images.iter()).collect();
            let (positions, _) = v
                .item_positions(&out.input_ids, &out.attention_mask, &visuals)
                .map_err(config)?;
            out.position_ids = positions;
        }
        out.num_turns = num_turns;
        out.tool_calls = tool_calls;
        out.tool_failures = tool_failures;
        out.tool_rewards = tool_rewards;
        out.turn_scores = turn_scores;
        out.loop_scores = loop_scores;
        Ok(out)
    }
}

/// A row's fields as verl hands them to an agent loop's `run(sampling_params, **kwargs)`: the
/// dataset item's columns, `raw_prompt`, and `tools_kwargs`/`interaction_kwargs` from the item
/// or its `extra_info`.
fn loop_kwargs(sample: &crate::data::Sample) -> serde_json::Map<String, Value> {
    let mut k = sample.row.clone();
    k.insert(
        "raw_prompt".into(),
        serde_json::to_value(&sample.prompt).unwrap_or(Value::Null),
    );
    for key in ["tools_kwargs", "interaction_kwargs"] {
        if !k.get(key).is_some_and(Value::is_object) {
            let v = sample
                .extra_info
                .get(key)
                .cloned()
                .unwrap_or_else(|| serde_json::json!({}));
            k.insert(key.into(), v);
        }
    }
    k.insert("index".into(), serde_json::json!(sample.index));
    k
}

/// Turns from the rollout: the ready rows in one batched generation, each row's turn `k`
/// sampled from its own stream (the step's seed and `k`, the row).
struct NativeTurns<'a> {
    rollout: &'a RolloutWorker,
    params: SamplingParams,
    stop: &'a StopTokens,
    /// The batch row of each of the loop's samples.
    rows: Vec<usize>,
    /// Turns generated so far, per sample.
    turns: Vec<u64>,
    /// Each sample's images (empty: no sample has any), prefilled with every turn.
    images: Vec<RowImages>,
}

impl<'a> NativeTurns<'a> {
    /// The turns of batch rows `rows` (one response each) under `params`, each prefilled with
    /// its row's `images` (empty: no row has any).
    fn new(
        rollout: &'a RolloutWorker,
        params: &SamplingParams,
        stop: &'a StopTokens,
        rows: Vec<usize>,
        images: Vec<RowImages>,
    ) -> Self {
        NativeTurns {
            rollout,
            params: SamplingParams {
                n: 1,
                ..params.clone()
            },
            stop,
            turns: vec![0; rows.len()],
            rows,
            images,
        }
    }
}

impl TurnGenerator for NativeTurns<'_> {
    fn next_turns(
        &mut self,
        samples: &[usize],
        streams: &[Vec<i64>],
        max_tokens: &[usize],
    ) -> Result<Vec<GeneratedTurn>, String> {
        let sampling: Vec<PromptStream> = samples
            .iter()
            .map(|&s| {
                let turn = self.turns[s];
                self.turns[s] += 1;
                PromptStream {
                    seed: Rng::derive(self.params.seed, turn).next_u64(),
                    index: self.rows[s] as u64,
                }
            })
            .collect();
        let params = SamplingParams {
            max_new_tokens: max_tokens.iter().copied().max().unwrap_or(1),
            ..self.params.clone()
        };
        let images: Vec<RowImages> = if self.images.is_empty() {
            Vec::new()
        } else {
            samples.iter().map(|&s| self.images[s].clone()).collect()
        };
        let out = self
            .rollout
            .generate_streams_images(streams, &images, &sampling, &params, self.stop)
            .map_err(|e| e.to_string())?;
        let ids = Vec::<Vec<i64>>::try_from(&out.responses).map_err(|e| e.to_string())?;
        let lps = Vec::<Vec<f32>>::try_from(&out.rollout_log_probs).map_err(|e| e.to_string())?;
        Ok(ids
            .into_iter()
            .zip(lps)
            .zip(out.response_lengths.iter().zip(max_tokens))
            .map(|((mut t, mut l), (&len, &max))| {
                let keep = len.min(max);
                t.truncate(keep);
                l.truncate(keep);
                (t, l)
            })
            .collect())
    }
}

/// The run's tools (none configured: every call is an unknown tool, as in verl). When the
/// rollout's replica spans ranks, its leader runs them and hands each collection of answers
/// to the other ranks, which run the same loop in lockstep (same tokens, same answers).
struct Runner<'a> {
    tools: Option<&'a mut PythonTools>,
    unanswered: Vec<(usize, Answer)>,
    replica: &'a RolloutWorker,
    failure: Option<String>,
}

impl ToolRunner for Runner<'_> {
    fn submit(&mut self, sample: usize, calls: Vec<FunctionCall>) {
        match self.tools.as_deref_mut() {
            Some(t) => t.submit(sample, calls),
            None => self.unanswered.push((
                sample,
                Answer::Tools(
                    calls
                        .iter()
                        .map(|c| agent::unknown_tool(&c.name, &[]))
                        .collect(),
                ),
            )),
        }
    }

    fn submit_reply(&mut self, sample: usize, messages: &[Message]) {
        match self.tools.as_deref_mut() {
            Some(t) => t.submit_reply(sample, messages),
            None => self.unanswered.push((
                sample,
                Answer::User(Err("no interaction is configured".into())),
            )),
        }
    }

    fn finished(&mut self, wait: bool) -> Vec<(usize, Answer)> {
        let leader = self.replica.leads_replica();
        let mut out = if leader {
            std::mem::take(&mut self.unanswered)
        } else {
            Vec::new()
        };
        if leader && let Some(t) = self.tools.as_deref_mut() {
            out.extend(t.finished(wait && out.is_empty()));
        }
        if !self.replica.replica_spans_ranks() {
            return out;
        }
        self.unanswered.clear();
        let said = serde_json::to_string(&out).unwrap_or_else(|_| "[]".into());
        match self
            .replica
            .share_with_replica(&said)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(answers) => answers,
            Err(e) => {
                self.failure = Some(format!(
                    "the tools' answers could not be shared across the rollout replica: {e}"
                ));
                Vec::new()
            }
        }
    }

    fn failure(&mut self) -> Option<String> {
        self.failure.take()
    }
}
