//! `verlc fetch`, and the step of `verlc build` that gets the models a config names by Hugging
//! Face Hub id into the Hub cache, where the trainer (which never uses the network) reads them
//! as transformers would. Downloads go through `hf-hub`, the Hub's own Rust client, into the
//! layout `huggingface_hub` writes (blobs, snapshot links, refs), resuming partial files.

use std::io::IsTerminal;

use hf_hub::api::sync::ApiBuilder;
use hf_hub::{Cache, Repo, RepoType};
use verlc_front::codes;
use verlc_front::diag::Diagnostic;
use verlc_front::load::node::{Node, split_key};
use verlc_front::plan::BuildPlan;
use verlc_front::plan::models::{
    dropout_problems, hub_models, hub_models_of, model_problems, sft_model_paths,
    unavailable_models,
};
use verlc_hub::{HubEnv, HubError, RepoId, Snapshot, find_snapshot};
use verlc_spec::sft::SftSpec;

use super::EXIT_USAGE;
use super::args::FetchArgs;

/// Why a model could not be downloaded.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("cannot download `{id}` from {endpoint}: {msg}")]
    Download {
        id: String,
        endpoint: String,
        msg: String,
    },
    #[error(
        "`{id}` has no safetensors weights on the Hub (verlc loads safetensors only; files: {files})"
    )]
    NoSafetensors { id: String, files: String },
    #[error(transparent)]
    Hub(#[from] HubError),
}

/// Whether a repository file is one a model load reads: configs, tokenizer files, chat
/// templates and safetensors weights at the top level (no PyTorch pickles, ONNX or GGUF).
fn wanted(file: &str) -> bool {
    !file.contains('/')
        && [".json", ".safetensors", ".jinja", ".txt", ".model"]
            .iter()
            .any(|ext| file.ends_with(ext))
}

/// What of a model repository to download.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Files {
    /// Everything a load reads: configs, tokenizer files, chat templates and the weights.
    All,
    /// Configs, tokenizer files and chat templates (a `verlc smoke` stand-in's needs).
    NoWeights,
}

/// The snapshot of `id` at `revision` (default `main`): from the cache, or downloaded into it
/// (with a progress bar per file when `progress`).
pub fn fetch(
    env: &HubEnv,
    id: &RepoId,
    revision: Option<&str>,
    progress: bool,
    which: Files,
) -> Result<Snapshot, FetchError> {
    match find_snapshot(env, id, revision) {
        Ok(s) => return Ok(s),
        // Offline, `NotCached` says so itself.
        Err(HubError::NotCached { .. } | HubError::Incomplete { .. }) if !env.offline => {}
        Err(e) => return Err(e.into()),
    }
    eprintln!("fetching {id} into {}", env.cache.display());
    let failed = |msg: String| FetchError::Download {
        id: id.to_string(),
        endpoint: env.endpoint.clone(),
        msg,
    };
    let api = ApiBuilder::from_cache(Cache::new(env.cache.clone()))
        .with_endpoint(env.endpoint.clone())
        .with_token(env.token.clone())
        .with_progress(progress)
        .build()
        .map_err(|e| failed(e.to_string()))?;
    let revision_name = revision.unwrap_or("main").to_owned();
    let repo = api.repo(Repo::with_revision(
        id.to_string(),
        RepoType::Model,
        revision_name,
    ));
    let info = repo.info().map_err(|e| failed(e.to_string()))?;
    let files: Vec<&str> = info
        .siblings
        .iter()
        .map(|s| s.rfilename.as_str())
        .filter(|f| wanted(f))
        .filter(|f| which == Files::All || !f.contains(".safetensors"))
        .collect();
    if which == Files::All && !files.iter().any(|f| f.ends_with(".safetensors")) {
        return Err(FetchError::NoSafetensors {
            id: id.to_string(),
            files: info
                .siblings
                .iter()
                .map(|s| s.rfilename.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    for file in files {
        repo.download(file)
            .map_err(|e| failed(format!("{file}: {e}")))?;
    }
    Ok(find_snapshot(env, id, revision)?)
}

/// `verlc fetch MODEL [--revision REV]`: prints the snapshot directory.
pub fn run(a: FetchArgs) -> u8 {
    let id = match RepoId::parse(&a.model) {
        Ok(id) => id,
        Err(e) => {
            eprintln!("error: {e}");
            return EXIT_USAGE;
        }
    };
    let env = HubEnv::from_env();
    match fetch(
        &env,
        &id,
        a.revision.as_deref(),
        std::io::stderr().is_terminal(),
        if a.no_weights {
            Files::NoWeights
        } else {
            Files::All
        },
    ) {
        Ok(s) => {
            println!("{}", s.dir.display());
            0
        }
        Err(e) => {
            eprintln!("error: {e}");
            EXIT_USAGE
        }
    }
}

/// Before a build: every Hub model of `plan` in the cache, downloaded where missing (unless
/// offline). What cannot be had is an error at the key that names it; so is a reward model
/// whose checkpoint is no one-label classifier (B016).
pub(super) fn models_for_build(plan: &BuildPlan, root: &Node) -> Vec<Diagnostic> {
    let env = HubEnv::from_env();
    let (mut out, failed) = download(&env, &hub_models(&plan.spec), root);
    // What is at hand now is checked as the trainer will check it; a failed download is
    // reported once, above.
    out.extend(
        model_problems(&plan.spec, &env)
            .iter()
            .filter(|p| !failed.contains(&p.key))
            .map(|p| p.diagnostic(root)),
    );
    out
}

/// Before an SFT build: its model (and tokenizer) in the Hub cache, downloaded where missing
/// (unless offline); a local path that is no directory, or an id that cannot be had, is an
/// error at its key.
pub(super) fn sft_models_for_build(spec: &SftSpec, root: &Node) -> Vec<Diagnostic> {
    let env = HubEnv::from_env();
    let paths = sft_model_paths(spec);
    let (mut out, failed) = download(&env, &hub_models_of(&paths), root);
    out.extend(
        unavailable_models(&paths, &env)
            .iter()
            .filter(|p| !failed.contains(&p.key))
            .map(|p| p.diagnostic(root)),
    );
    let key = paths.first().map_or("model.path", |(k, _)| *k);
    let trained = [(
        key,
        spec.model.path.as_str(),
        &spec.model.config_overrides,
        (!spec.trainer.is_legacy()).then_some("model.override_config"),
    )];
    out.extend(
        dropout_problems(&trained, &env)
            .iter()
            .map(|p| p.diagnostic(root)),
    );
    out
}

/// Downloads each of `models` missing from the Hub cache: an error at its key for each that
/// cannot be had, and those keys.
fn download(
    env: &HubEnv,
    models: &[verlc_front::plan::models::HubModel],
    root: &Node,
) -> (Vec<Diagnostic>, Vec<&'static str>) {
    let mut out = Vec::new();
    let mut failed = Vec::new();
    for m in models {
        if let Err(e) = fetch(
            env,
            &m.id,
            None,
            std::io::stderr().is_terminal(),
            Files::All,
        ) {
            let help = if env.offline {
                "download it where the network is reachable (`verlc fetch ID`, or `huggingface-cli download ID`) into this Hub cache, or unset HF_HUB_OFFLINE"
            } else {
                "check the id, the network and HF_TOKEN (gated models), or name a local checkpoint directory"
            };
            let origin = root
                .get_path(&split_key(m.key))
                .and_then(|n| n.origin.clone());
            out.push(
                Diagnostic::error(
                    codes::BUILD_MODEL_UNAVAILABLE,
                    format!("the model `{}` cannot be had: {e}", m.id),
                )
                .with_key(m.key)
                .with_primary(origin, "this Hub id")
                .with_help(help),
            );
            failed.push(m.key);
        }
    }
    (out, failed)
}
