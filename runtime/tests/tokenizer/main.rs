//! Tests of `verlc_runtime::tokenizer` (mirrors runtime/src/tokenizer/). Chat templates are checked
//! against transformers' `apply_chat_template` (tests/oracle/model_oracle.py, cached).
#[path = "../oracle/run.rs"]
mod oracle;

mod builtin;
mod chat;
mod generation;
