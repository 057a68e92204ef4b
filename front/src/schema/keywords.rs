// The JSON Schema keywords that constrain a value, each one evaluated by `validator.rs`.
// Included by the build script too, which refuses a validation schema using any other.

/// Keywords that constrain a value.
pub const ASSERTIONS: &[&str] = &[
    "type",
    "enum",
    "const",
    "minimum",
    "exclusiveMinimum",
    "maximum",
    "exclusiveMaximum",
    "properties",
    "additionalProperties",
    "required",
    "items",
    "minItems",
    "maxItems",
    "anyOf",
    "not",
];
