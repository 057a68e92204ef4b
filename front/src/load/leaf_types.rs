// The types a release table's leaf may list; a type's bit in the generated tables
// (build.rs) is its index here, read back by `release_table.rs`. Shared by both through
// `include!`, so the order is written once.
const LEAF_TYPES: [&str; 8] = [
    "any", "null", "boolean", "integer", "number", "string", "array", "object",
];
