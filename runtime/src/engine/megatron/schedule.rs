//! Pipeline schedules over micro-batches (Megatron's `pipeline_parallel/schedules.py` and
//! `p2p_communication.py`): one-forward-one-backward (1F1B, non-interleaved) for training,
//! and a forward-only pass for log-probs and values.
//!
//! 1F1B on stage `s` of `p` with `M` micro-batches: `min(p - s - 1, M)` warm-up forwards,
//! then alternate one forward and one backward, then the remaining backwards. At most
//! `p - s` micro-batches are in flight on a stage, each holding its [`Tape`] and its input
//! leaf. Activations go to the next stage and gradients to the previous one with blocking
//! send/recv; a combined exchange orders its operations as Megatron's `_p2p_ops` does
//! (even stages send first, odd stages receive first), so two neighbours never both wait
//! in a send.
//!
//! With one stage both schedules reduce to a loop over the micro-batches.
use std::collections::VecDeque;

use tch::{Device, Kind, Tensor};

use crate::parallel::dist::ProcessGroup;
use crate::parallel::mappings::Tape;

use super::Result;

const TAG: u32 = 7;

/// The pipeline group seen from one stage (`None`: a single stage).
#[derive(Debug, Clone, Copy)]
pub struct Pipeline<'a> {
    group: Option<&'a ProcessGroup>,
}

impl<'a> Pipeline<'a> {
    /// `pp` lists the stages in order (rank `s` of the group is stage `s`).
    pub fn new(pp: Option<&'a ProcessGroup>) -> Self {
        Pipeline {
            group: pp.filter(|g| g.size() > 1),
        }
    }

    pub fn stage(&self) -> usize {
        self.group.map_or(0, ProcessGroup::rank)
    }

    pub fn stages(&self) -> usize {
        self.group.map_or(1, ProcessGroup::size)
    }

    pub fn is_first(&self) -> bool {
        self.stage() == 0
    }

    pub fn is_last(&self) -> bool {
        self.stage() + 1 == self.stages()
    }

    /// One exchange with the neighbours, in Megatron's even/odd order.
    fn p2p(
        &self,
        send_next: Option<&Tensor>,
        recv_prev: Option<&Tensor>,
        send_prev: Option<&Tensor>,
        recv_next: Option<&Tensor>,
    ) -> Result<()> {
        let Some(g) = self.group else { return Ok(()) };
        let (s, n) = (g.rank(), g.size());
        let (next, prev) = ((s + 1) % n, (s + n - 1) % n);
        let send_next = || send_next.map_or(Ok(()), |t| g.send(t, next, TAG));
        let recv_prev = || recv_prev.map_or(Ok(()), |t| g.recv(t, prev, TAG));
        let send_prev = || send_prev.map_or(Ok(()), |t| g.send(t, prev, TAG));
        let recv_next = || recv_next.map_or(Ok(()), |t| g.recv(t, next, TAG));
        if s % 2 == 0 {
            send_next()?;
            recv_prev()?;
            send_prev()?;
            recv_next()?;
        } else {
            recv_prev()?;
            send_next()?;
            recv_next()?;
            send_prev()?;
        }
        Ok(())
    }

    /// The broadcast of `t` from the last stage to every stage (collective).
    pub fn broadcast_from_last(&self, t: &Tensor) -> Result<()> {
        if let Some(g) = self.group {
            g.broadcast(t, g.size() - 1)?;
        }
        Ok(())
    }
}

/// Shape, dtype and device of the activations exchanged for one micro-batch.
#[derive(Debug, Clone, PartialEq)]
pub struct ActivationSpec {
    pub shape: Vec<i64>,
    pub kind: Kind,
    pub device: Device,
}

impl ActivationSpec {
    fn buffer(&self) -> Result<Tensor> {
        Ok(Tensor::f_zeros(
            self.shape.as_slice(),
            (self.kind, self.device),
        )?)
    }
}

/// What a schedule asks of the model on this stage.
pub trait StageStep {
    /// Activations entering this stage for micro-batch `mb` (the previous stage's output).
    fn activation(&self, mb: usize) -> ActivationSpec;
    /// Activations leaving this stage for micro-batch `mb` (the next stage's input, and the
    /// gradient that comes back for it): their width may differ from the input's, where a
    /// stage receives and passes on different numbers of DeepStack levels.
    fn output_activation(&self, mb: usize) -> ActivationSpec;
    /// Forward of micro-batch `mb`: `input` is the received activations as a leaf (`None` on
    /// the first stage). Returns this stage's output, or on the last stage the scalar loss to
    /// back-propagate (training) or anything (forward-only).
    fn forward(&mut self, mb: usize, input: Option<Tensor>, tape: &mut Tape) -> Result<Tensor>;
}

struct InFlight {
    tape: Tape,
    input: Option<Tensor>,
    output: Tensor,
}

fn recv_forward(
    pipe: &Pipeline,
    step: &dyn StageStep,
    mb: usize,
    tape: &mut Tape,
) -> Result<Option<Tensor>> {
    if pipe.is_first() {
        return Ok(None);
    }
    let buf = step.activation(mb).buffer()?;
    pipe.p2p(None, Some(&buf), None, None)?;
    Ok(Some(tape.input(&buf)))
}

fn run_forward(
    step: &mut dyn StageStep,
    mb: usize,
    input: Option<Tensor>,
    mut tape: Tape,
) -> Result<InFlight> {
    let output = step.forward(mb, input.as_ref().map(Tensor::shallow_clone), &mut tape)?;
    Ok(InFlight {
        tape,
        input,
        output,
    })
}

/// Backward of one micro-batch; returns the gradient of its input (zeros if none arrived).
fn run_backward(pipe: &Pipeline, f: InFlight, grad: Option<Tensor>) -> Result<Option<Tensor>> {
    let InFlight {
        mut tape,
        input,
        output,
    } = f;
    match (&grad, pipe.is_last()) {
        (None, true) => tape.backward(&output, None)?,
        (Some(g), false) => tape.backward(&output, Some(g))?,
        _ => {
            return Err(super::MegatronError::Config(
                "pipeline backward without the next stage's gradient".into(),
            ));
        }
    }
    Ok(match input {
        Some(x) => {
            let g = x.grad();
            Some(if g.defined() {
                g.f_contiguous()?
            } else {
                x.f_zeros_like()?
            })
        }
        None => None,
    })
}

/// Megatron's `forward_backward_pipelining_without_interleaving`: trains on `num_mb`
/// micro-batches; parameter gradients accumulate in `.grad`.
pub fn forward_backward_1f1b(
    pipe: &Pipeline,
    step: &mut dyn StageStep,
    num_mb: usize,
) -> Result<()> {
    let warmup = (pipe.stages() - pipe.stage() - 1).min(num_mb);
    let remaining = num_mb - warmup;
    let mut queue: VecDeque<InFlight> = VecDeque::new();
    for mb in 0..warmup {
        let mut tape = Tape::new();
        let x = recv_forward(pipe, step, mb, &mut tape)?;
        let f = run_forward(step, mb, x, tape)?;
        if !pipe.is_last() {
            pipe.p2p(Some(&f.output.detach().f_contiguous()?), None, None, None)?;
        }
        queue.push_back(f);
    }
    let mut tape = Tape::new();
    let mut x = if remaining > 0 {
        recv_forward(pipe, step, warmup, &mut tape)?
    } else {
        None
    };
    for i in 0..remaining {
        let mb = warmup + i;
        let f = run_forward(step, mb, x.take(), std::mem::take(&mut tape))?;
        // send_forward_recv_backward (for the oldest micro-batch in flight, `i`).
        let grad = if pipe.is_last() {
            None
        } else {
            let buf = step.output_activation(i).buffer()?;
            pipe.p2p(
                Some(&f.output.detach().f_contiguous()?),
                None,
                None,
                Some(&buf),
            )?;
            Some(buf)
        };
        queue.push_back(f);
        let oldest = queue
            .pop_front()
            .ok_or_else(|| super::MegatronError::Config("empty pipeline queue".into()))?;
        let dx = run_backward(pipe, oldest, grad)?;
        if i + 1 == remaining {
            if !pipe.is_first() {
                pipe.p2p(None, None, dx.as_ref(), None)?;
            }
        } else if !pipe.is_first() {
            // send_backward_recv_forward
            let buf = step.activation(mb + 1).buffer()?;
            pipe.p2p(None, Some(&buf), dx.as_ref(), None)?;
            x = Some(tape.input(&buf));
        }
    }
    for i in 0..warmup {
        let grad = if pipe.is_last() {
            None
        } else {
            let buf = step.output_activation(remaining + i).buffer()?;
            pipe.p2p(None, None, None, Some(&buf))?;
            Some(buf)
        };
        let oldest = queue
            .pop_front()
            .ok_or_else(|| super::MegatronError::Config("empty pipeline queue".into()))?;
        let dx = run_backward(pipe, oldest, grad)?;
        if !pipe.is_first() {
            pipe.p2p(None, None, dx.as_ref(), None)?;
        }
    }
    Ok(())
}

/// Megatron's forward-only schedule: every micro-batch through every stage, no backward.
/// Run it under `tch::no_grad`. The last stage's outputs are the step's business.
pub fn forward_only(pipe: &Pipeline, step: &mut dyn StageStep, num_mb: usize) -> Result<()> {
    for mb in 0..num_mb {
        let mut tape = Tape::new();
        let x = recv_forward(pipe, step, mb, &mut tape)?;
        let out = step.forward(mb, x, &mut tape)?;
        if !pipe.is_last() {
            pipe.p2p(Some(&out.detach().f_contiguous()?), None, None, None)?;
        }
    }
    Ok(())
}
