//! A rollout that runs beside the trainer (verl 0.9's `colocate_async`): a thread of this rank
//! with its own rollout model and its own copy of the policy's weights, generating queued
//! prompt batches in order while the trainer thread updates.
//!
//! Weights are published by version (the number of updates they hold) into a one-slot
//! mailbox. With partial rollout ([`crate::trainer::RunOptions::partial_rollout`]) the rollout
//! takes the newest while it generates (verl's partial rollout: a whole model between two
//! tokens, its rows prefilled again; replica processes likewise, the weights sent on to them;
//! a vLLM server paused, reloaded and resumed, its aborted requests continued), and each row
//! says which versions made it; without it, before each batch, which is then generated wholly
//! with one version. The trainer can pause the thread until its next publish
//! (`colocate_async` between sampling and the sync).
//! The published tensors are copies: the trainer updates its own in place while the thread
//! still decodes.
//!
//! The thread stops when the handle drops (after the batch it is on) and a panic in it comes
//! back as an error, never a hang: the trainer's wait ends when the channel closes.
//!
//! With the vLLM rollout the ranks' threads share the main rank's server, so they run each
//! batch in lockstep over a process group of their own ([`serve_lockstep`]): the main rank's
//! thread decides whether to go on and which published version generates the batch, the
//! server's weights change only between batches, and a failure on any rank ends every
//! thread's loop with an error.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use tch::Tensor;

use crate::data::PromptItem;
use crate::parallel::dist::{ProcessGroup, ReduceOp};
use crate::rollout::vllm::VERSION_TOLD_LATER;
use crate::rollout::{RolloutOutput, SamplingParams, StopTokens};
use crate::tokenizer::Tokenizer;
use crate::workers::rollout::{RolloutWorker, VersionedWeights, WeightSource};

use super::TrainerError;
use super::agent::AgentRollout;

/// One batch to generate: its prompts and the sampling settings (its seed included).
#[derive(Debug)]
pub struct Job {
    pub id: u64,
    pub prompts: Vec<PromptItem>,
    pub params: SamplingParams,
}

/// The tool agent loop the thread runs its batches through (`rollout.multi_turn`), with the
/// tokenizer it renders turns with; shared with the trainer, which validates through it.
pub type AgentLoop = (Arc<AgentRollout>, Arc<Tokenizer>);

/// A generated batch, with the weights versions it was generated with: `version` began it,
/// `last_version` was bound when it ended (later when the weights changed while it decoded;
/// the output's `versions` then say which rows took them).
#[derive(Debug)]
pub struct Generated {
    pub id: u64,
    pub version: u64,
    pub last_version: u64,
    pub output: RolloutOutput,
    /// Seconds the thread spent generating it.
    pub seconds: f64,
}

struct Published {
    version: u64,
    params: Vec<(String, Tensor)>,
}

/// The weights mailbox between the trainer and the rollout thread: the newest published
/// weights (one slot), whether the trainer has paused the rollout (`colocate_async` between
/// sampling and the next sync) and whether the handle is gone.
#[derive(Default)]
struct Gate {
    state: Mutex<GateState>,
    wake: Condvar,
}

#[derive(Default)]
struct GateState {
    newest: Option<Published>,
    paused: bool,
    closed: bool,
    /// The version the thread took last.
    taken: Option<u64>,
    /// Seconds the thread waited while paused, since the trainer last asked.
    waited: f64,
}

impl GateState {
    /// The newest weights not yet taken, remembering their version.
    fn take_newest(&mut self) -> Option<Published> {
        let newest = self.newest.take();
        if let Some(p) = &newest {
            self.taken = Some(p.version);
        }
        newest
    }
}

// Tensors moved between the threads are owned by one side at a time (the mailbox hands a
// copy over); libtorch's tensors are safe to use from any one thread.
type Mailbox = Arc<Gate>;

impl Gate {
    fn lock(&self) -> std::sync::MutexGuard<'_, GateState> {
        self.state
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The newest weights not yet taken, after waiting while the rollout is paused.
    fn take(&self) -> Result<Option<Published>, String> {
        let mut state = self.lock();
        let start = Instant::now();
        let waits = state.paused;
        while state.paused && !state.closed {
            state = self
                .wake
                .wait(state)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
        if waits {
            state.waited += start.elapsed().as_secs_f64();
        }
        if state.closed {
            return Err("the run ended while the rollout was paused".into());
        }
        Ok(state.take_newest())
    }

    /// The newest weights without waiting (the lockstep threads decide together).
    fn take_now(&self) -> Option<Published> {
        self.lock().take_newest()
    }

    fn taken(&self) -> Option<u64> {
        self.lock().taken
    }
}

impl WeightSource for Gate {
    fn poll(&self) -> Result<Option<VersionedWeights>, String> {
        Ok(self.take()?.map(|p| (p.version, p.params)))
    }

    fn paused(&self) -> bool {
        self.lock().paused
    }
}

/// The handle the trainer holds.
pub struct BackgroundRollout {
    jobs: Option<Sender<Job>>,
    done: Receiver<Result<Generated, String>>,
    mailbox: Mailbox,
    /// Set when the handle drops: the thread skips the batches still queued.
    cancel: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    /// Jobs sent and not yet received back.
    in_flight: usize,
}

impl std::fmt::Debug for BackgroundRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BackgroundRollout")
            .field("in_flight", &self.in_flight)
            .finish_non_exhaustive()
    }
}

impl BackgroundRollout {
    /// Starts the thread with `worker` (a rollout model without weights); publish weights
    /// before the first job. `lockstep`: the group the ranks' threads run their batches
    /// together over (a vLLM server they share), `None` for a rollout of this rank's own.
    pub fn start(
        worker: RolloutWorker,
        stop: StopTokens,
        agent: Option<AgentLoop>,
        (lockstep, partial): (Option<ProcessGroup>, bool),
    ) -> Result<Self, TrainerError> {
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel();
        let mailbox: Mailbox = Arc::new(Gate::default());
        let slot = Arc::clone(&mailbox);
        let cancel = Arc::new(AtomicBool::new(false));
        let cancelled = Arc::clone(&cancel);
        let thread = std::thread::Builder::new()
            .name("verlc-rollout".into())
            .spawn(move || {
                let mut worker = worker;
                if partial {
                    // The rollout takes published weights between tokens (partial rollout).
                    let source: Arc<dyn WeightSource> = slot.clone();
                    worker.swap_weights_from(source);
                }
                let ends = (job_rx, done_tx, slot, cancelled);
                match lockstep {
                    Some(group) => serve_lockstep(worker, stop, agent, ends, &group),
                    None => serve(worker, stop, agent, ends),
                }
            })
            .map_err(|e| TrainerError::Config(format!("starting the rollout thread: {e}")))?;
        Ok(BackgroundRollout {
            jobs: Some(jobs),
            done,
            mailbox,
            cancel,
            thread: Some(thread),
            in_flight: 0,
        })
    }

    /// Makes `params` (the policy after `version` updates; copied here) the weights of the
    /// next batch the thread starts.
    pub fn publish(&self, version: u64, params: &[(String, Tensor)]) -> Result<(), TrainerError> {
        let params = tch::no_grad(|| {
            params
                .iter()
                .map(|(n, t)| Ok((n.clone(), t.f_detach_copy()?)))
                .collect::<Result<Vec<_>, tch::TchError>>()
        })?;
        let mut state = self.mailbox.lock();
        state.newest = Some(Published { version, params });
        state.paused = false;
        self.mailbox.wake.notify_all();
        Ok(())
    }

    /// Seconds the rollout waited for weights while paused since the last call.
    pub fn take_waited(&self) -> f64 {
        std::mem::take(&mut self.mailbox.lock().waited)
    }

    /// Pauses the rollout until the next [`BackgroundRollout::publish`] (verl's
    /// `colocate_async` aborts its requests when the trainer has sampled and resumes them
    /// with the weights of the step's sync): the thread stops before its next token, and the
    /// rows it was decoding continue with the new weights.
    pub fn pause(&self) {
        self.mailbox.lock().paused = true;
    }

    /// Queues a batch.
    pub fn submit(&mut self, job: Job) -> Result<(), TrainerError> {
        let sent = self.jobs.as_ref().is_some_and(|j| j.send(job).is_ok());
        if !sent {
            return Err(self.failure());
        }
        self.in_flight += 1;
        Ok(())
    }

    /// Batches queued or generating.
    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Blocks until the next batch is generated (they come back in queue order).
    pub fn take_generated(&mut self) -> Result<Generated, TrainerError> {
        if self.in_flight == 0 {
            return Err(TrainerError::Config(
                "waiting for a generated batch with none queued".into(),
            ));
        }
        match self.done.recv() {
            Ok(Ok(g)) => {
                self.in_flight -= 1;
                Ok(g)
            }
            Ok(Err(msg)) => {
                // The thread stops after a failed batch: nothing more can be queued.
                self.jobs = None;
                if let Some(t) = self.thread.take() {
                    let _ = t.join();
                }
                Err(TrainerError::Config(format!("background rollout: {msg}")))
            }
            Err(_) => Err(self.failure()),
        }
    }

    /// Why the thread is gone: the error it sent last, else how it ended.
    fn failure(&mut self) -> TrainerError {
        self.jobs = None;
        let joined = self.thread.take().map(JoinHandle::join);
        if let Some(msg) = self.done.try_iter().find_map(Result::err) {
            return TrainerError::Config(format!("background rollout: {msg}"));
        }
        let why = match joined {
            Some(Err(panic)) => panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "it panicked".into()),
            _ => "it stopped".into(),
        };
        TrainerError::Config(format!("the background rollout thread ended: {why}"))
    }
}

impl Drop for BackgroundRollout {
    fn drop(&mut self) {
        // Closing the queue ends the thread after its current batch (a paused one at once).
        self.cancel.store(true, Ordering::Relaxed);
        self.mailbox.lock().closed = true;
        self.mailbox.wake.notify_all();
        self.jobs = None;
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The thread's ends of the handle: the job queue, the results, the weights mailbox and the
/// stop flag.
type Ends = (
    Receiver<Job>,
    Sender<Result<Generated, String>>,
    Mailbox,
    Arc<AtomicBool>,
);

/// A rollout of this rank's own: each batch with the newest weights published before it.
fn serve(worker: RolloutWorker, stop: StopTokens, agent: Option<AgentLoop>, ends: Ends) {
    let (jobs, done, mailbox, cancel) = ends;
    let mut worker = worker;
    while let Ok(job) = jobs.recv() {
        if cancel.load(Ordering::Relaxed) {
            return;
        }
        let result = (|| -> Result<Generated, String> {
            if let Some(p) = mailbox.take()? {
                worker
                    .update_weights(&p.params)
                    .map_err(|e| e.to_string())?;
            }
            let first = mailbox
                .taken()
                .ok_or("no weights were published before the first batch")?;
            let mut generated = generate(&worker, &stop, agent.as_ref(), &job, first)?;
            generated.last_version = mailbox.taken().unwrap_or(first);
            Ok(generated)
        })();
        let failed = result.is_err();
        if done.send(result).is_err() || failed {
            return;
        }
    }
}

/// The ranks' threads over `group`, one batch at a time together (see the module docs).
/// Every rank queues the same batches in the same order, so the threads meet at each; a rank
/// whose queue has closed takes part with nothing to generate until the main rank's thread
/// says stop (its handle dropped: the run is over).
fn serve_lockstep(
    worker: RolloutWorker,
    stop: StopTokens,
    agent: Option<AgentLoop>,
    ends: Ends,
    group: &ProcessGroup,
) {
    let (jobs, done, mailbox, cancel) = ends;
    let mut worker = worker;
    let main = group.rank() == 0;
    // With partial rollout the main rank's server takes weights published while a batch
    // generates; the others learn the version at the batch's end.
    let mut version = None;
    loop {
        let job = jobs.recv().ok();
        let newest = mailbox.take_now();
        let go = job.is_some() && !(main && cancel.load(Ordering::Relaxed));
        // The main rank's plan: go on, sync the server's weights, and to which version.
        let plan = Tensor::from_slice(&[
            i64::from(go),
            i64::from(newest.is_some()),
            newest.as_ref().map_or(-1, |p| p.version as i64),
        ]);
        if let Err(e) = group.broadcast(&plan, 0) {
            let _ = done.send(Err(format!("the rollout threads' plan: {e}")));
            return;
        }
        if plan.int64_value(&[0]) == 0 {
            return;
        }
        let result = (|| -> Result<Option<Generated>, String> {
            if plan.int64_value(&[1]) == 1 {
                // The server reads the main rank's weights; the others take part in the sync.
                let params = match newest {
                    Some(p) if main => p.params,
                    _ => Vec::new(),
                };
                worker.update_weights(&params).map_err(|e| e.to_string())?;
                version = u64::try_from(plan.int64_value(&[2])).ok();
            }
            let version = version.ok_or("no weights were published before the first batch")?;
            job.as_ref()
                .map(|job| generate(&worker, &stop, agent.as_ref(), job, version))
                .transpose()
        })();
        // No rank syncs the next weights before every rank is done with these, and a failure
        // anywhere ends every thread. The main rank also says which weights the server holds
        // after a sync in the middle of the batch.
        let synced = match (main, version) {
            (true, Some(v)) => mailbox.taken().filter(|&t| t > v).map_or(-1, |t| t as i64),
            _ => -1,
        };
        let failed = Tensor::from_slice(&[i64::from(result.is_err()), synced]);
        if let Err(e) = group.all_reduce(&failed, ReduceOp::Max) {
            let _ = done.send(Err(format!("the rollout threads' batch end: {e}")));
            return;
        }
        let result = match (result, u64::try_from(failed.int64_value(&[1]))) {
            (Ok(Some(mut g)), Ok(later)) => {
                g.last_version = later;
                for v in &mut g.output.versions {
                    if v.last == Some(VERSION_TOLD_LATER) {
                        v.last = Some(later);
                    }
                }
                version = Some(later);
                Ok(Some(g))
            }
            (result, Ok(later)) => {
                version = Some(later);
                result
            }
            (result, Err(_)) => result,
        };
        // A handle that is gone takes no results; the thread still meets the others until
        // the main rank's says stop.
        let error = match result {
            Ok(_) if failed.int64_value(&[0]) != 0 => {
                // Only the ranks sharing a vLLM server run in lockstep.
                "another rank's rollout thread failed on the vLLM server the ranks share (that rank's error says why)".to_owned()
            }
            Ok(generated) => {
                if let Some(g) = generated {
                    let _ = done.send(Ok(g));
                }
                continue;
            }
            Err(e) => e,
        };
        let _ = done.send(Err(error));
        return;
    }
}

/// One batch generated with the bound weights (`version`), through the tool agent loop when
/// there is one.
fn generate(
    worker: &RolloutWorker,
    stop: &StopTokens,
    agent: Option<&AgentLoop>,
    job: &Job,
    version: u64,
) -> Result<Generated, String> {
    let start = Instant::now();
    let items: Vec<&PromptItem> = job.prompts.iter().collect();
    let output = tch::no_grad(|| match agent {
        Some((agent, tokenizer)) => agent
            .generate(worker, tokenizer, &items, &job.params, stop)
            .map_err(|e| e.to_string()),
        None => super::fit::generate_prompt_items(worker, &items, &job.params, stop)
            .map_err(|e| e.to_string()),
    })?;
    Ok(Generated {
        id: job.id,
        version,
        last_version: version,
        output,
        seconds: start.elapsed().as_secs_f64(),
    })
}
