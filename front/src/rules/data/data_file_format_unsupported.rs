//! ## What it checks
//! Every entry of `data.train_files` and `data.val_files` must end in `.parquet` or `.json`,
//! unless a custom dataset class (`data.custom_cls.path`) reads the files. verlc's built-in
//! synthetic tasks (`builtin://digit_reversal?split=train`, read by verlc's own trainer) are
//! accepted too.
//!
//! ## Why
//! verl's `RLHFDataset` picks the reader by file suffix and raises "Unsupported file format:
//! …" for anything else (a directory, `.jsonl`, `.csv`) when it builds the dataloaders.
//!
//! ## Example
//! ```yaml
//! data:
//!   train_files: ~/data/gsm8k/train.jsonl
//! ```
//!
//! ## Fix
//! Convert the data to Parquet (verl's example preprocessors write `train.parquet` and
//! `test.parquet`), or name the individual `.parquet` files.

use crate::config::OneOrMany;
use crate::diag::{Code, Diagnostic};
use crate::rules::RuleContext;

const CODE: Code = Code("V043");

pub(crate) fn check(ctx: &RuleContext, out: &mut Vec<Diagnostic>) {
    let d = &ctx.config.data;
    if d.custom_cls.path.is_some() {
        return;
    }
    for (key, files) in [
        ("data.train_files", &d.train_files),
        ("data.val_files", &d.val_files),
    ] {
        let listed = matches!(files, OneOrMany::Many(_));
        for (i, file) in files.items().into_iter().enumerate() {
            if file.ends_with(".parquet")
                || file.ends_with(".json")
                || file.starts_with("builtin://")
            {
                continue;
            }
            let at = if listed {
                format!("{key}.{i}")
            } else {
                key.to_owned()
            };
            out.push(
                Diagnostic::error(CODE, format!("verl reads only .parquet and .json data files, not `{file}`"))
                    .with_key(key)
                    .with_primary(ctx.origin(&at), "unsupported file")
                    .with_help("convert the data to Parquet, or set `data.custom_cls` to a dataset class that reads this format"),
            );
        }
    }
}
