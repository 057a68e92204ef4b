//! ## What it checks
//! That verl 0.7.0's legacy SFT config (`sft_trainer`) leaves `data.chat_template` null.
//!
//! ## Why
//! The legacy trainer (`fsdp_sft_trainer`) raises ValueError ("Apply Chat template from config
//! is not supported yet") when it starts, after the datasets are tokenized.
//!
//! ## Example
//! ```yaml
//! data:
//!   chat_template: "{% for m in messages %}...{% endfor %}"
//! ```
//!
//! ## Fix
//! Remove it, and put the template in the tokenizer's `tokenizer_config.json` (the datasets
//! render with the tokenizer's own template).

use crate::diag::{Code, Diagnostic};
use crate::sft::rules::SftContext;

pub(super) fn check(ctx: &SftContext, out: &mut Vec<Diagnostic>) {
    if !ctx.config.is_legacy() {
        return;
    }
    let Some(node) = ctx
        .root
        .get_path(&["data", "chat_template"])
        .filter(|n| !n.is_null())
    else {
        return;
    };
    out.push(
        Diagnostic::error(
            Code("F015"),
            "the legacy SFT trainer refuses data.chat_template",
        )
        .with_key("data.chat_template")
        .with_primary(node.origin.clone(), "raises ValueError at start-up")
        .with_help("remove it; the tokenizer's own chat template is used"),
    );
}
