//! Every diagnostic id verlc can emit, in one table so none is ever reused.
//!
//! - `U0xx` the command line itself (usage errors, exit status 2)
//! - `Y0xx` YAML text (syntax, unsupported constructs, limits)
//! - `H0xx` Hydra composition: defaults lists, overrides, interpolation
//! - `S0xx` JSON Schema: unknown keys, types, enums, ranges
//! - `V0xx`/`V1xx` semantic rules of verl (see `rules/`), `V2xx` model-aware rules
//! - `F0xx` rules of verl's SFT trainer (see `sft/rules/`, registered there)
//! - `B0xx` what `verlc build` binds (see `plan`): `B00x` warnings for keys the generated
//!   binary does not use, `B01x` errors for combinations it cannot bind

use crate::diag::Code;

pub const USAGE: Code = Code("U001");

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
pub const SCHEMA_UNMODELLED_RELEASE: Code = Code("S007");
pub const MODEL_CONFIG_UNUSABLE: Code = Code("S008");

/// The rule that checks the derived sizes fit 64-bit arithmetic (`rules`' V053).
pub const SIZE_OVERFLOW: Code = Code("V053");

pub const BUILD_ROLLOUT_KNOB_UNUSED: Code = Code("B001");
pub const BUILD_ROLLOUT_ENGINE_REPLACED: Code = Code("B002");
pub const BUILD_PROFILER_UNUSED: Code = Code("B003");
pub const BUILD_PYTHON_ONLY_KEY: Code = Code("B004");
pub const BUILD_CLUSTER_KEY_UNUSED: Code = Code("B005");
pub const BUILD_ROLE_STRATEGY_MISMATCH: Code = Code("B010");
pub const BUILD_ROLE_PRECISION_MISMATCH: Code = Code("B011");
pub const BUILD_UNSUPPORTED_BINDING: Code = Code("B012");
pub const BUILD_OFFLOAD_KEY_IGNORED: Code = Code("B013");
// B014 (`CriticOffloadMismatch`) is retired, not to be reused: offload left the binding, so
// the critic may place its state differently from the actor.
pub const BUILD_ENGINE_SECTION_MISSING: Code = Code("B015");
pub const BUILD_REWARD_MODEL_NOT_CLASSIFIER: Code = Code("B016");
pub const BUILD_DEVICE_UNSUPPORTED: Code = Code("B017");
pub const BUILD_UNSUPPORTED_SETTING: Code = Code("B018");
pub const BUILD_NO_EFFECT: Code = Code("B006");
pub const BUILD_BF16_EMULATED: Code = Code("B007");
pub const BUILD_MODEL_UNAVAILABLE: Code = Code("B019");
pub const BUILD_VLLM_ON_CPU: Code = Code("B020");
pub const BUILD_TEXT_PROMPTS_ONLY: Code = Code("B022");
// B021 (`SftNotBuilt`) is retired, not to be reused: `verlc build` builds SFT trainers.

/// The `B` codes of `plan` with a one-line summary each (`verlc rule --list`).
pub const BUILD_CODES: &[(Code, &str)] = &[
    (
        BUILD_ROLLOUT_KNOB_UNUSED,
        "a vLLM/SGLang rollout setting the built-in rollout engine does not use",
    ),
    (
        BUILD_ROLLOUT_ENGINE_REPLACED,
        "the binary generates with its built-in engine, not the SGLang/TensorRT-LLM/HF engine named in rollout.name",
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
        "a strategy/precision binding, or a role's offload under it, the runtime does not support",
    ),
    (
        BUILD_OFFLOAD_KEY_IGNORED,
        "offload set in the engine section of the other strategy",
    ),
    (
        BUILD_ENGINE_SECTION_MISSING,
        "no engine section (fsdp_config / megatron) for a role's strategy",
    ),
    (
        BUILD_REWARD_MODEL_NOT_CLASSIFIER,
        "the reward model's checkpoint is not a one-label classifier (`*ForSequenceClassification`) of a supported architecture",
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
        BUILD_TEXT_PROMPTS_ONLY,
        "an image-text model that trains on text prompts only in this run (beside a critic, or as one): rows with images are refused when the data is read",
    ),
    (
        BUILD_NO_EFFECT,
        "a setting that has no effect in the generated trainer (its verdict is `no effect`)",
    ),
    (
        BUILD_BF16_EMULATED,
        "bf16 training on a CPU without native bf16 (AVX-512 BF16 / AMX): emulated, several times slower than fp32",
    ),
    (
        BUILD_MODEL_UNAVAILABLE,
        "a model named by Hugging Face Hub id is neither in the Hub cache nor downloadable",
    ),
    (
        BUILD_VLLM_ON_CPU,
        "rollout.name=vllm on trainer.device=cpu: vLLM runs, but the built-in engine generates faster there",
    ),
];

/// The `Y`/`H`/`S` codes with a one-line explanation each (`verlc rule --list`,
/// `verlc rule S001`).
pub const LOAD_CODES: &[(Code, &str)] = &[
    (
        USAGE,
        "the command line cannot mean a run: a second config file, an unknown `--only` code, a `--base` that is not a trainer config (exit status 2)",
    ),
    (
        YAML_SYNTAX,
        "the file is not valid YAML; nothing after the error is read",
    ),
    (
        YAML_DUPLICATE_KEY,
        "a key appears twice in one mapping; YAML keeps one of them silently, verlc refuses",
    ),
    (
        YAML_UNSUPPORTED,
        "a YAML feature OmegaConf does not load (tags, complex keys, multiple documents)",
    ),
    (
        YAML_LIMIT,
        "the input is too large or grows too much (alias bombs, deep nesting, interpolations that copy exponentially)",
    ),
    (
        IO_ERROR,
        "a file or directory cannot be read: missing, unreadable, or not a regular file (a FIFO, a device) (exit status 2)",
    ),
    (
        DEFAULTS_SYNTAX,
        "a `defaults:` list entry Hydra cannot parse",
    ),
    (
        CONFIG_NOT_FOUND,
        "a config named in `defaults:` or `--config-name` is not in the search path",
    ),
    (
        DEFAULTS_CYCLE,
        "`defaults:` lists include each other in a cycle",
    ),
    (
        DUPLICATE_SELF,
        "`_self_` appears twice in one defaults list",
    ),
    (
        OVERRIDE_SYNTAX,
        "a command-line override Hydra cannot parse (`key=value`, `+key=value`, `~key`)",
    ),
    (
        OVERRIDE_KEY_ABSENT,
        "an override sets a key the config does not have; add it with `+key=value` if it is meant to be new",
    ),
    (
        OVERRIDE_KEY_EXISTS,
        "`+key=value` adds a key that already exists; use `key=value` (or `++key=value`)",
    ),
    (
        DELETE_KEY_ABSENT,
        "`~key` deletes a key the config does not have",
    ),
    (
        OVERRIDE_SWEEP,
        "a sweep (`a=1,2`, `range(...)`) in a single run; Hydra needs `--multirun` for it",
    ),
    (
        OVERRIDE_TYPE,
        "an override's value has the wrong shape for its key (a list where a mapping is needed, ...)",
    ),
    (
        GROUP_OPTION_UNKNOWN,
        "a config group option (`group=option`) that does not exist in that group",
    ),
    (
        INTERP_KEY_MISSING,
        "an interpolation `${a.b}` refers to a key that does not exist",
    ),
    (
        INTERP_CYCLE,
        "interpolations refer to each other in a cycle (or a chain longer than 100)",
    ),
    (
        INTERP_SYNTAX,
        "an interpolation `${...}` that does not parse",
    ),
    (
        INTERP_RESOLVER,
        "an unknown or failing resolver (`${oc.env:...}`, `${oc.select:...}`)",
    ),
    (
        MANDATORY_MISSING,
        "a mandatory value (`???`) that verl reads was never set",
    ),
    (
        SCHEMA_UNKNOWN_KEY,
        "a key verl's config does not define (typos get a did-you-mean)",
    ),
    (
        SCHEMA_TYPE,
        "a value of the wrong type (a string where verl expects a number, ...)",
    ),
    (
        SCHEMA_ENUM,
        "a value outside the choices verl accepts (an estimator, loss mode or engine name)",
    ),
    (
        SCHEMA_RANGE,
        "a number outside its valid range (a batch size below 1, ...)",
    ),
    (
        SCHEMA_REQUIRED,
        "a key verl reads is missing (deleted or replaced by a value without it)",
    ),
    (
        SCHEMA_OTHER,
        "the config does not match verl's typed model in another way",
    ),
    (
        SCHEMA_UNMODELLED_RELEASE,
        "the config tree is of a verl release verlc does not model; verl's own keys pass through unchecked",
    ),
    (
        MODEL_CONFIG_UNUSABLE,
        "the model's config.json (actor_rollout_ref.model.path or --model-config) is not JSON or gives sizes no model has (zero, absurd, heads that do not divide)",
    ),
];
