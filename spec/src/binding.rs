//! The vocabulary of a binding (strategy × precision, a [`Dtype`]: what a generated binary fixes at compile
//! time) and of placement (offload: what each role's engine decides at run time), with the one
//! table of which combinations verlc's runtime supports.
//!
//! Three users depend on this one module so the rules cannot drift apart:
//! - `verlc_front::plan` reports an unsupported binding or placement at the YAML line (`verlc check`);
//! - the `verlc-macros` proc-macro (`bind_trainer!`) turns a [`Rejection`] of a binding into
//!   `compile_error!` at the offending token;
//! - `verlc_runtime::binding::main` asserts [`validate`] in a `const` block, so even a hand-written
//!   instantiation of an unsupported binding fails to compile.
//!
//! [`validate`] is therefore a `const fn`. Every strategy × precision is supported today.
//!
//! # Why offload is not part of the binding
//! Where parameters, gradients and optimizer state live is constructor data, as in PyTorch's
//! `CPUOffload` and Megatron's `optimizer_cpu_offload`: the engines take it from each role's
//! engine spec, so one binary runs every placement (and the actor and critic may differ), and
//! `param_offload=true` on the command line needs no rebuild. A type parameter for it would
//! change no compiled code.
//!
//! # The placement rules ([`validate_offload`]; each is what the runtime cannot do, and why)
//! 1. `Fsdp` offloads gradients together with parameters (PyTorch FSDP's
//!    `CPUOffload(offload_params=True)`, FSDP2's `CPUOffloadPolicy`): `grads` and `params` are
//!    either both offloaded or neither.
//! 2. `Fsdp` + `Fp16Mixed` + parameter offload: fp16 loss scaling unscales the gradients and
//!    checks them for inf/nan on the device before the step; with FSDP parameter offload the
//!    sharded gradients live on the host, where the runtime has no fused unscale/check.
//!    Use `Bf16Mixed` (no loss scaling) or keep the parameters on the device.
//! 3. `Megatron` offloads any of its parameters (with the distributed optimizer's param
//!    buffer), its gradient buffers and its optimizer state, with every precision: verl's
//!    `megatron.param_offload`, `grad_offload` and `optimizer_offload` each on their own.
//!    Parameters and gradients live in host memory between phases and come back to the device
//!    for the phase that needs them.

pub use crate::dtype::Dtype;

/// The parallel engine the binary is built around.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StrategyKind {
    /// Fully sharded data parallel (verl's `fsdp` and `fsdp2`).
    Fsdp,
    /// Megatron-core tensor/pipeline/context parallelism with a distributed optimizer.
    Megatron,
}

impl StrategyKind {
    pub const ALL: [StrategyKind; 2] = [StrategyKind::Fsdp, StrategyKind::Megatron];

    /// The marker type's name (`verlc_runtime::binding::Fsdp`).
    pub const fn name(self) -> &'static str {
        match self {
            StrategyKind::Fsdp => "Fsdp",
            StrategyKind::Megatron => "Megatron",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// What can be moved to host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OffloadTarget {
    Params,
    Grads,
    Optimizer,
}

impl OffloadTarget {
    pub const ALL: [OffloadTarget; 3] = [
        OffloadTarget::Params,
        OffloadTarget::Grads,
        OffloadTarget::Optimizer,
    ];

    /// The spelling in build reports and diagnostics (`[params, grads, optimizer]`).
    pub const fn name(self) -> &'static str {
        match self {
            OffloadTarget::Params => "params",
            OffloadTarget::Grads => "grads",
            OffloadTarget::Optimizer => "optimizer",
        }
    }

    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// Which of parameters, gradients and optimizer state live on the host.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OffloadFlags {
    pub params: bool,
    pub grads: bool,
    pub optimizer: bool,
}

impl OffloadFlags {
    pub const NONE: OffloadFlags = OffloadFlags {
        params: false,
        grads: false,
        optimizer: false,
    };

    pub const fn has(self, t: OffloadTarget) -> bool {
        match t {
            OffloadTarget::Params => self.params,
            OffloadTarget::Grads => self.grads,
            OffloadTarget::Optimizer => self.optimizer,
        }
    }

    pub const fn with(self, t: OffloadTarget) -> Self {
        let mut o = self;
        match t {
            OffloadTarget::Params => o.params = true,
            OffloadTarget::Grads => o.grads = true,
            OffloadTarget::Optimizer => o.optimizer = true,
        }
        o
    }

    /// The offloaded targets in `params, grads, optimizer` order.
    pub fn targets(self) -> impl Iterator<Item = OffloadTarget> {
        OffloadTarget::ALL.into_iter().filter(move |t| self.has(*t))
    }

    /// `[params, optimizer]`, `[]` for none.
    pub fn list(self) -> String {
        let names: Vec<&str> = self.targets().map(OffloadTarget::name).collect();
        format!("[{}]", names.join(", "))
    }
}

/// Which part of a binding a [`Rejection`] is about (where the macro points).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Strategy,
    Precision,
    Offload(OffloadTarget),
}

/// Why a combination is not supported, and what would be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    /// The token to blame.
    pub part: Part,
    /// One sentence: what is wrong and why.
    pub message: &'static str,
    /// The valid choices.
    pub help: &'static str,
}

/// Whether the runtime supports this binding: every strategy × precision today (the table is
/// kept so a future gap is one arm here, and the macro and lowering report it).
pub const fn validate(strategy: StrategyKind, precision: Dtype) -> Result<(), Rejection> {
    let _ = (strategy, precision);
    Ok(())
}

/// Whether the runtime supports this placement of one role's engine under a binding (rules
/// in the module docs).
pub const fn validate_offload(
    strategy: StrategyKind,
    precision: Dtype,
    offload: OffloadFlags,
) -> Result<(), Rejection> {
    match strategy {
        StrategyKind::Fsdp => {
            if offload.grads && !offload.params {
                return Err(Rejection {
                    part: Part::Offload(OffloadTarget::Grads),
                    message: "`Fsdp` offloads gradients together with parameters, never on their own",
                    help: "FSDP offloads `[]`, `[optimizer]`, `[params, grads]` (param_offload) or `[params, grads, optimizer]`",
                });
            }
            if offload.params && !offload.grads {
                return Err(Rejection {
                    part: Part::Offload(OffloadTarget::Params),
                    message: "`Fsdp` offloads parameters together with their gradients: `params` needs `grads`",
                    help: "FSDP offloads `[]`, `[optimizer]`, `[params, grads]` (param_offload) or `[params, grads, optimizer]`",
                });
            }
            if offload.params && matches!(precision, Dtype::Fp16) {
                return Err(Rejection {
                    part: Part::Precision,
                    message: "`Fp16Mixed` cannot be combined with parameter offload under `Fsdp`: fp16 loss scaling unscales and checks gradients on the device, but offloaded FSDP gradients live on the host",
                    help: "with FSDP parameter offload use fp32 or bf16; to keep fp16, offload only the optimizer (optimizer_offload)",
                });
            }
            Ok(())
        }
        // Parameters, gradients and optimizer state each move on their own.
        StrategyKind::Megatron => Ok(()),
    }
}

/// Every supported binding, for tests and docs.
pub fn supported() -> impl Iterator<Item = Binding> {
    StrategyKind::ALL.into_iter().flat_map(|strategy| {
        Dtype::ALL
            .into_iter()
            .map(move |precision| Binding {
                strategy,
                precision,
            })
            .filter(|b| b.validate().is_ok())
    })
}

/// Every placement the runtime supports under `binding`, for tests and docs.
pub fn supported_offload(binding: Binding) -> impl Iterator<Item = OffloadFlags> {
    (0u8..8)
        .map(|bits| OffloadFlags {
            params: bits & 1 != 0,
            grads: bits & 2 != 0,
            optimizer: bits & 4 != 0,
        })
        .filter(move |o| validate_offload(binding.strategy, binding.precision, *o).is_ok())
}

/// What a generated binary binds at compile time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Binding {
    pub strategy: StrategyKind,
    pub precision: Dtype,
}

impl Binding {
    /// Whether the runtime (and the binding macro) accept it.
    pub fn validate(&self) -> Result<(), Rejection> {
        validate(self.strategy, self.precision)
    }
}

impl std::fmt::Display for Binding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "strategy = {}, precision = {}",
            self.strategy.name(),
            self.precision.marker()
        )
    }
}

/// Serde by marker name (`"Fsdp"`, `"Bf16Mixed"`, `"optimizer"`), the spelling of
/// `bind_trainer!` and of build reports.
macro_rules! serde_by_name {
    ($($t:ty => $what:literal),+) => {$(
        impl serde::Serialize for $t {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(self.name())
            }
        }
        impl<'de> serde::Deserialize<'de> for $t {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                let name = String::deserialize(d)?;
                <$t>::from_name(&name).ok_or_else(|| serde::de::Error::custom(format!("unknown {} `{name}`", $what)))
            }
        }
    )+};
}
serde_by_name!(StrategyKind => "strategy", OffloadTarget => "offload target");

impl serde::Serialize for OffloadFlags {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let mut seq = s.serialize_seq(None)?;
        for t in self.targets() {
            seq.serialize_element(&t)?;
        }
        seq.end()
    }
}

impl<'de> serde::Deserialize<'de> for OffloadFlags {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let targets = Vec::<OffloadTarget>::deserialize(d)?;
        Ok(targets
            .into_iter()
            .fold(OffloadFlags::NONE, OffloadFlags::with))
    }
}

impl serde::Serialize for Binding {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("Binding", 2)?;
        st.serialize_field("strategy", &self.strategy)?;
        st.serialize_field("precision", self.precision.marker())?;
        st.end()
    }
}

impl<'de> serde::Deserialize<'de> for Binding {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(serde::Deserialize)]
        struct Raw {
            strategy: StrategyKind,
            precision: String,
        }
        let r = Raw::deserialize(d)?;
        let precision = Dtype::from_marker(&r.precision).ok_or_else(|| {
            serde::de::Error::custom(format!("unknown precision `{}`", r.precision))
        })?;
        Ok(Binding {
            strategy: r.strategy,
            precision,
        })
    }
}
