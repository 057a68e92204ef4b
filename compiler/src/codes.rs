//! Every diagnostic id verlc can emit, in one table so none is ever reused.
//!
//! - `Y0xx` YAML text (syntax, unsupported constructs, limits)
//! - `H0xx` Hydra composition: defaults lists, overrides, interpolation
//! - `S0xx` JSON Schema: unknown keys, types, enums, ranges
//! - `V0xx`/`V1xx` semantic rules of verl (see `rules/`), `V2xx` model-aware rules

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
