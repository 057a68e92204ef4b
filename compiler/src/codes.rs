//! Every diagnostic id verlc can emit, in one table so none is ever reused.
//!
//! - `Y0xx` YAML text (syntax, unsupported constructs, limits)
//! - `H0xx` Hydra composition: defaults lists, overrides, interpolation
//! - `S0xx` JSON Schema: unknown keys, types, enums, ranges
//! - `V0xx`/`V1xx` semantic rules of verl (see `rules/`), `V2xx` model-aware rules
//! - `B0xx` what `verlc build` binds (see `plan`): `B00x` warnings for keys the generated
//!   binary does not use, `B01x` errors for combinations it cannot bind

use crate::diag::Code;

pub const YAML_SYNTAX: Code = Code("Y001");
pub const YAML_DUPLICATE_KEY: Code = Code("Y002");
pub const YAML_UNSUPPORTED: Code = Code("Y003");
pub const YAML_LIMIT: Code = Code("Y004");
pub const IO_ERROR: Code = Code("Y005");

pub const DEFAULTS_SYNTAX: Code = Code("H001");
pub const CONFIG_NOT_FOUND: Code = Code("H002");
pub const DEFAULTS_CYCLE: Code = Code("H003");
pub const DUPLICATE_SELF: Code = Code("H004");
pub const OVERRIDE_SYNTAX: Code = Code("H010");
pub const OVERRIDE_KEY_ABSENT: Code = Code("H011");
pub const OVERRIDE_KEY_EXISTS: Code = Code("H012");
pub const DELETE_KEY_ABSENT: Code = Code("H013");
pub const OVERRIDE_SWEEP: Code = Code("H014");
pub const OVERRIDE_TYPE: Code = Code("H015");
pub const GROUP_OPTION_UNKNOWN: Code = Code("H016");
pub const INTERP_KEY_MISSING: Code = Code("H020");
pub const INTERP_CYCLE: Code = Code("H021");
pub const INTERP_SYNTAX: Code = Code("H022");
pub const INTERP_RESOLVER: Code = Code("H023");
pub const MANDATORY_MISSING: Code = Code("H024");

pub const SCHEMA_UNKNOWN_KEY: Code = Code("S001");
pub const SCHEMA_TYPE: Code = Code("S002");
pub const SCHEMA_ENUM: Code = Code("S003");
pub const SCHEMA_RANGE: Code = Code("S004");
pub const SCHEMA_REQUIRED: Code = Code("S005");
pub const SCHEMA_OTHER: Code = Code("S006");

pub const BUILD_ROLLOUT_KNOB_UNUSED: Code = Code("B001");
pub const BUILD_ROLLOUT_ENGINE_REPLACED: Code = Code("B002");
pub const BUILD_PROFILER_UNUSED: Code = Code("B003");
pub const BUILD_PYTHON_ONLY_KEY: Code = Code("B004");
pub const BUILD_CLUSTER_KEY_UNUSED: Code = Code("B005");
pub const BUILD_ROLE_STRATEGY_MISMATCH: Code = Code("B010");
pub const BUILD_ROLE_PRECISION_MISMATCH: Code = Code("B011");
pub const BUILD_UNSUPPORTED_BINDING: Code = Code("B012");
pub const BUILD_OFFLOAD_KEY_IGNORED: Code = Code("B013");
pub const BUILD_CRITIC_OFFLOAD_MISMATCH: Code = Code("B014");
pub const BUILD_ENGINE_SECTION_MISSING: Code = Code("B015");
pub const BUILD_REWARD_MODEL_UNSUPPORTED: Code = Code("B016");
pub const BUILD_DEVICE_UNSUPPORTED: Code = Code("B017");
pub const BUILD_UNSUPPORTED_SETTING: Code = Code("B018");
pub const BUILD_NO_EFFECT: Code = Code("B006");

/// The `B` codes of `plan` with a one-line summary each (`verlc rule --list`).
pub const BUILD_CODES: &[(Code, &str)] = &[
    (
        BUILD_ROLLOUT_KNOB_UNUSED,
        "a vLLM/SGLang rollout setting the built-in rollout engine does not use",
    ),
    (
        BUILD_ROLLOUT_ENGINE_REPLACED,
        "the binary generates with its built-in engine, not the one named in rollout.name",
    ),
    (
        BUILD_PROFILER_UNUSED,
        "profiler settings; the binary has no profiler integration",
    ),
    (
        BUILD_PYTHON_ONLY_KEY,
        "a Python-only option (torch.compile, Liger, Triton kernels, remote code)",
    ),
    (
        BUILD_CLUSTER_KEY_UNUSED,
        "Ray, HDFS and other cluster settings the binary does not use",
    ),
    (
        BUILD_ROLE_STRATEGY_MISMATCH,
        "critic or reference policy use another strategy than the actor",
    ),
    (
        BUILD_ROLE_PRECISION_MISMATCH,
        "critic or reference policy use another precision than the actor",
    ),
    (
        BUILD_UNSUPPORTED_BINDING,
        "a strategy/precision/offload combination the runtime does not support",
    ),
    (
        BUILD_OFFLOAD_KEY_IGNORED,
        "offload set in the engine section of the other strategy",
    ),
    (
        BUILD_CRITIC_OFFLOAD_MISMATCH,
        "the critic's offload policy differs from the actor's",
    ),
    (
        BUILD_ENGINE_SECTION_MISSING,
        "no engine section (fsdp_config / megatron) for a role's strategy",
    ),
    (
        BUILD_REWARD_MODEL_UNSUPPORTED,
        "reward models are not supported by the generated trainer",
    ),
    (
        BUILD_DEVICE_UNSUPPORTED,
        "trainer.device is not cpu or cuda",
    ),
    (
        BUILD_UNSUPPORTED_SETTING,
        "a setting the generated trainer cannot honour (its verdict is `unsupported`)",
    ),
    (
        BUILD_NO_EFFECT,
        "a setting that has no effect in the generated trainer (its verdict is `no effect`)",
    ),
];

/// Every code above, for the uniqueness test and `verlc rule --list`.
pub const ALL_LOAD_CODES: &[Code] = &[
    YAML_SYNTAX,
    YAML_DUPLICATE_KEY,
    YAML_UNSUPPORTED,
    YAML_LIMIT,
    IO_ERROR,
    DEFAULTS_SYNTAX,
    CONFIG_NOT_FOUND,
    DEFAULTS_CYCLE,
    DUPLICATE_SELF,
    OVERRIDE_SYNTAX,
    OVERRIDE_KEY_ABSENT,
    OVERRIDE_KEY_EXISTS,
    DELETE_KEY_ABSENT,
    OVERRIDE_SWEEP,
    OVERRIDE_TYPE,
    GROUP_OPTION_UNKNOWN,
    INTERP_KEY_MISSING,
    INTERP_CYCLE,
    INTERP_SYNTAX,
    INTERP_RESOLVER,
    MANDATORY_MISSING,
    SCHEMA_UNKNOWN_KEY,
    SCHEMA_TYPE,
    SCHEMA_ENUM,
    SCHEMA_RANGE,
    SCHEMA_REQUIRED,
    SCHEMA_OTHER,
];
