//! Hydra-style composition: the primary config's `defaults:` list expanded depth-first
//! (`group@package: option`, `../group@pkg`, sibling configs, `_self_` ordering, `optional`,
//! `override`, interpolated options), command-line group and value overrides applied in
//! struct mode, then interpolations resolved.
//!
//! Entry point: [`load`]. Problems never abort the whole load: they are collected as
//! diagnostics and the rest of the config still composes, so `verlc check` reports all of
//! them in one run.

use std::path::PathBuf;
use std::sync::OnceLock;

use indexmap::IndexMap;

use super::interp;
use super::node::{Entry, Node, Scalar, Value, split_key};
use super::overrides::{Override, OverrideKind, parse_override};
use super::read::{ReadBudget, ReadError};
use super::repo::{Repo, SearchDir, normalize_group};
use super::version::BuiltinRelease;
use super::yaml;
use crate::codes;
use crate::diag::{Diagnostic, did_you_mean};
use crate::source::{Origin, Source, SourceKind, SourceMap};

/// The top-level settings of Hydra's own config (`hydra.run`, `hydra.job` ...).
const HYDRA_KEYS: &[&str] = &[
    "run",
    "sweep",
    "launcher",
    "sweeper",
    "help",
    "hydra_help",
    "hydra_logging",
    "job_logging",
    "env",
    "mode",
    "searchpath",
    "callbacks",
    "output_subdir",
    "overrides",
    "job",
    "runtime",
    "verbose",
];

/// Deepest nesting of defaults lists (a config whose defaults name a config whose defaults
/// ...). verl's tree nests 3 deep; the bound keeps the recursion far from the stack's end.
pub const MAX_DEFAULTS_DEPTH: usize = 64;
/// Most configs one composition merges, counting a config each time a defaults list names
/// it. verl's tree merges about 40; lists that name the same configs several times
/// (`c1: [c2, c2]`, `c2: [c3, c3]`, ...) grow exponentially, in Hydra too.
pub const MAX_DEFAULTS_CONFIGS: usize = 5_000;
/// Most segments of a package or override key (`a.b.c`): the tree's nesting limit.
pub const MAX_KEY_SEGMENTS: usize = super::yaml::MAX_DEPTH;

/// verl's two trainer configs; the built-in tree provides both.
pub const FSDP_BASE: &str = "ppo_trainer";
pub const MEGATRON_BASE: &str = "ppo_megatron_trainer";

/// verlc's built-in 0.7.0 tree (the release its typed model and schema are of) of one
/// flavour (no overrides), once per process, without origins:
/// only its values are for use. Release builds copy it from the committed snapshot
/// ([`super::snapshot`]); debug builds compose it.
pub fn builtin_tree(flavour: crate::config::Flavour) -> &'static Node {
    static FSDP: OnceLock<Node> = OnceLock::new();
    static MEGATRON: OnceLock<Node> = OnceLock::new();
    let (cell, snapshot) = match flavour {
        crate::config::Flavour::Fsdp => (&FSDP, &super::snapshot::BUILTIN_FSDP),
        crate::config::Flavour::Megatron => (&MEGATRON, &super::snapshot::BUILTIN_MEGATRON),
    };
    cell.get_or_init(|| {
        if cfg!(debug_assertions) {
            composed_builtin_tree(flavour)
        } else {
            super::snapshot::to_node(snapshot)
        }
    })
}

/// The built-in tree of one flavour composed from the YAML files (origins dropped).
pub(crate) fn composed_builtin_tree(flavour: crate::config::Flavour) -> Node {
    let base = match flavour {
        crate::config::Flavour::Fsdp => FSDP_BASE,
        crate::config::Flavour::Megatron => MEGATRON_BASE,
    };
    let mut root = load(&LoadRequest {
        base: Some(base.into()),
        builtin: BuiltinRelease::V0_7_0,
        ..LoadRequest::default()
    })
    .root;
    root.clear_origins();
    root
}

/// The text of `front/defaults/composed.json`: both built-in trees, composed.
pub fn builtin_trees_text() -> String {
    let trees = serde_json::json!({
        FSDP_BASE: composed_builtin_tree(crate::config::Flavour::Fsdp).to_json(),
        MEGATRON_BASE: composed_builtin_tree(crate::config::Flavour::Megatron).to_json(),
    });
    let mut text = serde_json::to_string_pretty(&trees).unwrap_or_default();
    text.push('\n');
    text
}

/// What to compose. Mirrors Hydra's `--config-dir/--config-name` plus verlc's
/// "a single file merged over the built-in defaults" mode.
#[derive(Clone, Debug, Default)]
pub struct LoadRequest {
    /// A user config file. Without a `defaults:` list it is merged over the built-in base
    /// config; with one it is a Hydra primary config whose groups also resolve against the
    /// built-in tree.
    pub config_file: Option<PathBuf>,
    /// A user config given as text instead of a file (a trainer's embedded config): composed
    /// like `config_file`, with nothing searched beside it. Wins over `config_file`.
    pub config_text: Option<ConfigText>,
    /// Hydra's `--config-dir` (also `--config-path`).
    pub config_dir: Option<PathBuf>,
    /// Hydra's `--config-name` (default `ppo_trainer`).
    pub config_name: Option<String>,
    /// Base config for a file without `defaults:` (default: `ppo_trainer`, or
    /// `ppo_megatron_trainer` when the actor strategy is `megatron`).
    pub base: Option<String>,
    pub overrides: Vec<String>,
    /// Directory relative `file://` search paths are taken from (Hydra uses the CWD).
    pub cwd: PathBuf,
    /// Whose tree verl's own configs come from when `config_dir` does not hold them (the
    /// base of a plain file, `pkg://verl.trainer.config`); the newest release by default.
    pub builtin: BuiltinRelease,
}

/// A config in memory: the name diagnostics show for it, and its text.
#[derive(Clone, Debug, Default)]
pub struct ConfigText {
    pub name: String,
    pub text: String,
}

#[derive(Debug)]
pub struct Composed {
    pub sources: SourceMap,
    /// The composed, overridden and resolved tree.
    pub root: Node,
    pub diagnostics: Vec<Diagnostic>,
    /// Chosen option per defaults-list key (`actor@actor_rollout_ref.actor` -> `dp_actor`).
    pub choices: IndexMap<String, String>,
    /// The base config a plain config file (one without `defaults:`) was merged over
    /// (`ppo_trainer`, `ppo_megatron_trainer`); `None` for a primary config.
    pub base: Option<String>,
    /// Environment variables the config reads with `${oc.env:...}`: their values never
    /// appear in verlc's output ([`crate::redact`]).
    pub env_vars: Vec<String>,
}

impl Composed {
    /// The values of the environment variables the config reads, to be kept out of output.
    pub fn secrets(&self) -> crate::redact::Secrets {
        crate::redact::Secrets::from_env(&self.env_vars)
    }
}

/// Every variable named by `oc.env:` in any source (files, overrides, defaults lists; also
/// those read by `+key`/`~key` overrides on a copy of the tree), plus those `resolved` read
/// under a name built by another interpolation.
fn env_vars_named(sources: &SourceMap, resolved: Vec<String>) -> Vec<String> {
    let mut names = resolved;
    for (_, src) in sources.iter() {
        for (i, _) in src.text.match_indices("oc.env:") {
            let name: String = src.text[i + "oc.env:".len()..]
                .trim_start()
                .chars()
                .take_while(|c| !matches!(c, ',' | '}' | ' ' | '\n' | '\'' | '"'))
                .collect();
            if !name.is_empty() && !name.contains("${") && !names.contains(&name) {
                names.push(name);
            }
        }
    }
    names
}

impl Composed {
    pub fn has_errors(&self) -> bool {
        self.diagnostics.iter().any(Diagnostic::is_error)
    }
}

pub fn load(req: &LoadRequest) -> Composed {
    load_from(req, FileCache::default(), Serves::Composed).0
}

/// [`load`], and the tree the same composition gives without the value overrides (`key=v`,
/// `+key=v`, `~key`): the configs as the defaults lists and the group overrides select them,
/// resolved. For a request without a config file of the user's, that is verl's tree as
/// shipped with the user's group choices, what "changed" is judged against on a newer
/// release's tree (see `check`).
pub fn load_with_baseline(req: &LoadRequest) -> (Composed, Node) {
    let (composed, _, baseline) = load_from(req, FileCache::default(), Serves::ComposedAndBaseline);
    (composed, baseline.unwrap_or_else(|| Node::empty_map(None)))
}

/// The files one composition read and parsed (with the sources their origins point into),
/// for another composition of the same search path to start from instead of reading and
/// parsing them again.
#[derive(Default)]
pub struct FileCache {
    sources: SourceMap,
    fetched: std::collections::HashMap<String, Fetched>,
}

/// [`load`], also keeping the files it read for [`load_tree_with_files`].
pub fn load_keeping_files(req: &LoadRequest) -> (Composed, FileCache) {
    let (composed, files, _) = load_from(req, FileCache::default(), Serves::ComposedAndFiles);
    (composed, files.unwrap_or_default())
}

/// The tree [`load`] composes, starting from the files another composition read (`files`):
/// what it parsed is not read again (a second view of the same search path, e.g. verl's tree
/// as shipped beside the user's; its diagnostics and sources are not kept).
pub fn load_tree_with_files(req: &LoadRequest, files: FileCache) -> Node {
    load_from(req, files, Serves::TreeOnly).0.root
}

/// What a composition's caller takes from it.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Serves {
    /// The whole [`Composed`].
    Composed,
    /// It and the files read ([`FileCache`]).
    ComposedAndFiles,
    /// The tree alone: nothing only diagnostics need (the environment variables) is collected.
    TreeOnly,
    /// The whole [`Composed`] and the tree before the value overrides ([`load_with_baseline`]).
    ComposedAndBaseline,
}

fn load_from(
    req: &LoadRequest,
    files: FileCache,
    serves: Serves,
) -> (Composed, Option<FileCache>, Option<Node>) {
    let mut c = Composer {
        repo: Repo::default(),
        builtin: req.builtin,
        base: None,
        sources: files.sources,
        diags: Vec::new(),
        group_overrides: IndexMap::new(),
        group_deletions: IndexMap::new(),
        appended: Vec::new(),
        choices: IndexMap::new(),
        list_choices: std::collections::HashSet::new(),
        stack: Vec::new(),
        budget: ReadBudget::default(),
        keep_parsed: serves == Serves::ComposedAndFiles,
        fetched: files.fetched,
        merged: 0,
        parsed_nodes: 0,
        limit_reported: false,
    };
    let mut root = Node::empty_map(None);

    // Overrides first: they pick the base flavour and group options.
    let mut value_overrides = Vec::new();
    let mut parsed = Vec::new();
    for (i, text) in req.overrides.iter().enumerate() {
        let id = c.sources.add(Source::new(
            format!("override #{}", i + 1),
            text.as_str(),
            SourceKind::Override,
        ));
        match parse_override(text, id) {
            Ok(o) => parsed.push(o),
            Err(d) => c.diags.push(d),
        }
    }

    // The primary config and the search path.
    let primary = match c.primary(req, &parsed) {
        Some(p) => p,
        None => {
            let env_vars = env_vars_named(&c.sources, Vec::new());
            let composed = Composed {
                sources: c.sources,
                root,
                diagnostics: c.diags,
                choices: c.choices,
                base: c.base,
                env_vars,
            };
            return (composed, None, None);
        }
    };

    for o in parsed {
        if let Some(o) = c.classify(o) {
            value_overrides.push(o);
        }
    }

    c.compose(primary, &mut root);

    c.report_unused_deletions();
    for (key, (o, used)) in &c.group_overrides {
        if !used {
            c.diags.push(
                Diagnostic::error(
                    codes::OVERRIDE_KEY_ABSENT,
                    format!("could not override `{key}`: no match in the defaults list"),
                )
                .with_primary(
                    Some(o.key_origin.clone()),
                    "no defaults-list entry has this group and package",
                )
                .with_help(
                    match did_you_mean(key, c.choices.keys().map(String::as_str)) {
                        Some(s) => {
                            format!("did you mean `{s}`? To add a new group use `+{}`", o.text)
                        }
                        None => format!("to add the group to the defaults list use `+{}`", o.text),
                    },
                ),
            );
        }
    }

    let before = (serves == Serves::ComposedAndBaseline).then(|| root.clone());
    for o in &value_overrides {
        apply_override(&mut root, o, &mut c.diags);
    }

    let mut parsed = interp::ParsedInterpolations::default();
    let resolution = interp::resolve_parsing(&mut root, &mut parsed);
    c.diags.extend(resolution.diagnostics);
    let baseline = before.map(|mut b| {
        // Its findings are the composition's own, already reported.
        let _ = interp::resolve_parsing(&mut b, &mut parsed);
        b
    });
    let env_vars = if serves == Serves::TreeOnly {
        Vec::new()
    } else {
        env_vars_named(&c.sources, resolution.env_vars)
    };
    let files = (serves == Serves::ComposedAndFiles).then(|| FileCache {
        sources: c.sources.clone(),
        fetched: std::mem::take(&mut c.fetched),
    });
    let composed = Composed {
        sources: c.sources,
        root,
        diagnostics: c.diags,
        choices: c.choices,
        base: c.base,
        env_vars,
    };
    (composed, files, baseline)
}

/// A parsed defaults-list entry.
#[derive(Clone, Debug)]
enum DefaultEntry {
    SelfEntry,
    Config {
        path: String,
        package: Option<String>,
        optional: bool,
    },
    Group {
        group: String,
        package: Option<String>,
        option: Option<Node>,
        optional: bool,
        is_override: bool,
    },
}

/// A config to expand: its node, where it lives, and where it mounts.
struct Pending {
    node: Node,
    /// Config path without `.yaml` (`actor/dp_actor`); for messages and cycles.
    config_path: String,
    /// Group directory of this config (`actor`), base for relative entries.
    base_dir: String,
    /// The same as Hydra spells it, `..` left in (`actor/../optim`): override keys and
    /// choices use this spelling, so `optim@actor_rollout_ref.actor.optim=..` matches no
    /// entry, as in Hydra.
    raw_base_dir: String,
    /// Final package (dotted) its content mounts at.
    package: String,
    /// The defaults entry named a package (`group@pkg`): it wins over the file's
    /// `# @package` header, as in Hydra.
    explicit_package: bool,
    is_primary: bool,
}

struct Composer {
    repo: Repo,
    /// The release whose built-in tree the search path holds (verl's `pkg://` tree).
    builtin: BuiltinRelease,
    /// The base a plain config file (no `defaults:`) was merged over.
    base: Option<String>,
    sources: SourceMap,
    diags: Vec<Diagnostic>,
    group_overrides: IndexMap<String, (Override, bool)>,
    /// `~group[=option]` overrides by override key; `true` once an entry was deleted.
    group_deletions: IndexMap<String, (Override, bool)>,
    appended: Vec<Override>,
    choices: IndexMap<String, String>,
    /// Choice keys that selected a list of options; they skip the single-choice check.
    list_choices: std::collections::HashSet<String>,
    stack: Vec<String>,
    /// What the composition may still read from disk.
    budget: ReadBudget,
    /// Each config path is read and parsed once, however often defaults lists name it.
    fetched: std::collections::HashMap<String, Fetched>,
    /// Whether `fetched` keeps every parsed node (for a later composition of the same files),
    /// else the first use takes it.
    keep_parsed: bool,
    /// Configs merged so far (bounded by [`MAX_DEFAULTS_CONFIGS`]).
    merged: usize,
    /// Values parsed from all files so far (bounded by [`yaml::MAX_NODES`] in all, as
    /// each file is).
    parsed_nodes: usize,
    /// A composition limit was reported (once; the rest of the tree is left out).
    limit_reported: bool,
}

/// The outcome of looking a config path up in the search path, kept for later requests.
#[derive(Clone)]
enum Fetched {
    Missing,
    /// Could not be read: reported at each place that asks for it.
    Unreadable(crate::diag::Code, String),
    /// Read, but not valid YAML: reported once, where it was parsed.
    Invalid,
    Parsed(Node, crate::source::SourceId),
    /// Parsed, and the node moved into the tree (see [`Composer::load_config`]).
    Merged(crate::source::SourceId),
}

/// The diagnostic code of a file that cannot be read: a size limit is a config problem
/// (`Y004`), text that is not UTF-8 a syntax error, the rest I/O (`Y005`, exit status 2).
pub fn read_error_code(e: &ReadError) -> crate::diag::Code {
    match e {
        ReadError::TooLarge { .. } => codes::YAML_LIMIT,
        ReadError::NotUtf8 { .. } => codes::YAML_SYNTAX,
        _ => codes::IO_ERROR,
    }
}

impl Composer {
    /// Sort a command-line override the way Hydra's `Overrides` does: a non-dict value for
    /// a key that names a config group changes the defaults list; everything else is a
    /// value override, returned to be applied after composition.
    fn classify(&mut self, o: Override) -> Option<Override> {
        if o.key == "hydra" || o.key.starts_with("hydra.") || o.key.starts_with("hydra/") {
            self.check_hydra_override(&o);
            return None;
        }
        let is_dict = matches!(o.value.as_ref().map(|v| &v.value), Some(Value::Map(_)));
        if is_dict || !self.repo.group_exists(&o.key) {
            if o.package.is_some() {
                self.diags.push(
                    Diagnostic::error(codes::OVERRIDE_KEY_ABSENT, format!("`{}` looks like a config group override, but there is no config group `{}`", o.text, o.key))
                        .with_key(o.key.clone())
                        .with_primary(Some(o.key_origin.clone()), "not a config group")
                        .with_help("`group@package=option` selects a group file; to set a value write `key=value`"),
                );
                return None;
            }
            return Some(o);
        }
        let option_ok = matches!(
            o.value.as_ref().map(|v| &v.value),
            None | Some(Value::Seq(_)) | Some(Value::Scalar(Scalar::Str(_)))
        );
        match o.kind {
            OverrideKind::ForceAdd => self.diags.push(
                Diagnostic::error(
                    codes::OVERRIDE_SYNTAX,
                    format!("force-add of config groups is not supported: `{}`", o.text),
                )
                .with_primary(Some(o.origin()), "here")
                .with_help(format!(
                    "use `+{}` to add the group or `{}` to change it",
                    o.text.trim_start_matches('+'),
                    o.text.trim_start_matches('+')
                )),
            ),
            _ if !option_ok => self.diags.push(
                Diagnostic::error(
                    codes::GROUP_OPTION_UNKNOWN,
                    format!(
                        "config group `{}` needs an option name (or a list of names), not {}",
                        o.key,
                        o.value
                            .as_ref()
                            .map_or("nothing".into(), |v| v.to_json().to_string())
                    ),
                )
                .with_primary(Some(o.value_origin()), "not an option name")
                .with_help(format!(
                    "available options: {}",
                    self.repo.options(&o.key).join(", ")
                )),
            ),
            OverrideKind::Delete => {
                self.group_deletions
                    .insert(o.key_with_package(), (o, false));
            }
            OverrideKind::Add => self.appended.push(o),
            OverrideKind::Set => {
                self.group_overrides
                    .insert(o.key_with_package(), (o, false));
            }
        }
        None
    }

    /// `hydra.*` overrides configure Hydra itself, which verlc does not run: they are
    /// accepted (and ignored) where Hydra would accept them. `hydra.searchpath` was already
    /// applied with the primary config.
    fn check_hydra_override(&mut self, o: &Override) {
        let top = o
            .key
            .strip_prefix("hydra.")
            .map(|r| r.split('.').next().unwrap_or(""));
        let known = top.is_none_or(|t| HYDRA_KEYS.contains(&t));
        if o.kind == OverrideKind::Set && !known {
            let t = top.unwrap_or("");
            let mut d = Diagnostic::error(
                codes::OVERRIDE_KEY_ABSENT,
                format!(
                    "could not override `{}`: Hydra has no setting `hydra.{t}`",
                    o.key
                ),
            )
            .with_key(o.key.clone())
            .with_primary(Some(o.key_origin.clone()), "not a Hydra setting");
            if let Some(s) = did_you_mean(t, HYDRA_KEYS.iter().copied()) {
                d = d.with_help(format!("did you mean `hydra.{s}`?"));
            }
            self.diags.push(d);
        }
    }

    /// Deletions that matched no defaults-list entry are errors, as in Hydra.
    fn report_unused_deletions(&mut self) {
        for (key, (o, used)) in &self.group_deletions {
            if !used {
                self.diags.push(
                    Diagnostic::error(
                        codes::DELETE_KEY_ABSENT,
                        format!("could not delete `{key}`: no match in the defaults list"),
                    )
                    .with_primary(
                        Some(o.key_origin.clone()),
                        "no defaults-list entry has this group and package",
                    ),
                );
            }
        }
    }

    /// Whether a `~group[=option]` override removes this defaults entry.
    fn is_deleted(&mut self, key: &str, option: Option<&Node>) -> bool {
        let Some((o, used)) = self.group_deletions.get_mut(key) else {
            return false;
        };
        let matches = match (&o.value, option.and_then(Node::as_str)) {
            (None, _) => true,
            (Some(v), Some(name)) => v.as_str() == Some(name),
            (Some(_), None) => false,
        };
        *used |= matches;
        matches
    }

    /// Set up the search path and load the primary config.
    fn primary(&mut self, req: &LoadRequest, overrides: &[Override]) -> Option<Pending> {
        // A usage error (no location): nothing can be composed from a directory that is not
        // there, and nothing else is reported.
        if let Some(d) = req.config_dir.as_ref().filter(|d| !d.is_dir()) {
            self.diags.push(
                Diagnostic::error(
                    codes::IO_ERROR,
                    format!("--config-dir {}: no such directory", d.display()),
                )
                .with_file(d.display().to_string()),
            );
            return None;
        }
        // The user's config: a file (its directory is searched first), or text in memory.
        let given = match (&req.config_text, &req.config_file) {
            (Some(t), _) => Some((PathBuf::from(&t.name), t.text.clone(), None)),
            (None, Some(file)) => {
                let text = match self.budget.read(file) {
                    Ok(t) => t,
                    Err(e) => {
                        self.diags.push(
                            Diagnostic::error(read_error_code(&e), e.to_string())
                                .with_file(file.display().to_string()),
                        );
                        return None;
                    }
                };
                let dir = file.parent().map(|p| {
                    if p.as_os_str().is_empty() {
                        PathBuf::from(".")
                    } else {
                        p.to_path_buf()
                    }
                });
                Some((file.clone(), text, dir))
            }
            (None, None) => None,
        };
        if let Some((file, text, dir)) = given {
            if let Some(d) = req.config_dir.clone().or(dir) {
                self.repo.push(SearchDir::Dir(d));
            }
            let id = self.sources.add(Source::new(
                file.display().to_string(),
                text,
                SourceKind::File,
            ));
            let mut node = self.parse(id)?;
            self.take_searchpath(&mut node, &req.cwd, overrides);
            self.repo.push(SearchDir::Builtin(self.builtin));
            let has_defaults = node.as_map().is_some_and(|m| m.contains_key("defaults"));
            if !has_defaults {
                // A plain file: merged over the built-in base (its own `_self_` last).
                let base = req
                    .base
                    .clone()
                    .unwrap_or_else(|| pick_base(&node, overrides).to_string());
                self.base = Some(base.clone());
                let base_origin = Origin::new(id, 0..0);
                let defaults = Node::new(
                    Value::Seq(vec![
                        Node::scalar(Scalar::Str(base), Some(base_origin.clone())),
                        Node::scalar(Scalar::Str("_self_".into()), Some(base_origin)),
                    ]),
                    None,
                );
                if let Some(m) = node.as_map_mut() {
                    m.insert(
                        "defaults".into(),
                        Entry {
                            key_origin: None,
                            node: defaults,
                        },
                    );
                }
            }
            let stem = file
                .file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .unwrap_or_default();
            return Some(Pending {
                node,
                config_path: stem,
                base_dir: String::new(),
                raw_base_dir: String::new(),
                package: String::new(),
                explicit_package: false,
                is_primary: true,
            });
        }
        let name = req
            .config_name
            .clone()
            .or(req.base.clone())
            .unwrap_or_else(|| FSDP_BASE.to_string());
        let name = name.trim_end_matches(".yaml").to_string();
        match &req.config_dir {
            Some(d) => self.repo.push(SearchDir::Dir(d.clone())),
            None => self.repo.push(SearchDir::Builtin(self.builtin)),
        }
        let mut node = self.load_config(&name, None)?;
        self.take_searchpath(&mut node, &req.cwd, overrides);
        let base_dir = name
            .rsplit_once('/')
            .map(|(d, _)| d.to_string())
            .unwrap_or_default();
        Some(Pending {
            node,
            config_path: name,
            raw_base_dir: base_dir.clone(),
            base_dir,
            package: String::new(),
            explicit_package: false,
            is_primary: true,
        })
    }

    /// Remove the primary's `hydra:` node; its `searchpath` extends the repo, unless a
    /// `hydra.searchpath=[...]` override replaces the list (as it does in Hydra).
    fn take_searchpath(&mut self, node: &mut Node, cwd: &std::path::Path, overrides: &[Override]) {
        let from_file = node
            .as_map_mut()
            .and_then(|m| m.shift_remove("hydra"))
            .and_then(|h| h.node.child("searchpath").cloned());
        let from_cli = overrides
            .iter()
            .rev()
            .find(|o| o.key == "hydra.searchpath" && o.kind != OverrideKind::Delete)
            .and_then(|o| o.value.clone());
        let Some(list) = from_cli.or(from_file) else {
            return;
        };
        let Value::Seq(items) = &list.value else {
            self.diags.push(
                Diagnostic::error(
                    codes::OVERRIDE_TYPE,
                    "`hydra.searchpath` must be a list of search path URLs",
                )
                .with_key("hydra.searchpath")
                .with_primary(list.origin.clone(), "not a list")
                .with_help("write `hydra.searchpath=[file:///abs/dir,pkg://verl.trainer.config]`"),
            );
            return;
        };
        for item in items {
            let Some(url) = item.as_str() else { continue };
            match Repo::search_dir_from_url(url, cwd, self.builtin) {
                Ok(dir) => self.repo.push(dir),
                Err(msg) => self.diags.push(
                    Diagnostic::error(codes::CONFIG_NOT_FOUND, msg)
                        .with_key("hydra.searchpath")
                        .with_primary(item.origin.clone(), "search path entry"),
                ),
            }
        }
    }

    /// Parse a source, within the node budget of the whole composition.
    fn parse(&mut self, id: crate::source::SourceId) -> Option<Node> {
        let src = self.sources.get(id);
        match yaml::parse(src, id) {
            Ok(n) => {
                self.parsed_nodes += n.count();
                if self.parsed_nodes > yaml::MAX_NODES {
                    if std::mem::replace(&mut self.limit_reported, true) {
                        return None;
                    }
                    self.diags.push(
                        Diagnostic::error(
                            codes::YAML_LIMIT,
                            format!(
                                "the config's files hold more than {} values in all (reading {})",
                                yaml::MAX_NODES,
                                src.name
                            ),
                        )
                        .with_file(src.name.clone()),
                    );
                    return None;
                }
                Some(n)
            }
            Err(d) => {
                self.diags.push(d);
                None
            }
        }
    }

    /// Look `config_path` up once; later requests get the same outcome.
    fn fetch(&mut self, config_path: &str) -> &Fetched {
        if !self.fetched.contains_key(config_path) {
            let fetched = match self.repo.load(config_path, &mut self.budget) {
                None => Fetched::Missing,
                Some(Err(e)) => Fetched::Unreadable(read_error_code(&e), e.to_string()),
                Some(Ok(src)) => {
                    let id = self.sources.add(src);
                    match self.parse(id) {
                        Some(n) => Fetched::Parsed(n, id),
                        None => Fetched::Invalid,
                    }
                }
            };
            self.fetched.insert(config_path.to_owned(), fetched);
        }
        &self.fetched[config_path]
    }

    /// Whether an `optional` entry's config is there (an unreadable file is, and fails).
    fn exists(&mut self, config_path: &str) -> bool {
        !matches!(self.fetch(config_path), Fetched::Missing)
    }

    fn load_config(&mut self, config_path: &str, requested_at: Option<&Origin>) -> Option<Node> {
        self.fetch(config_path);
        // Most configs are merged once: the parsed node moves into the tree instead of being
        // copied, and the few a defaults list names again (verl's `engine/fsdp` serves actor,
        // ref and critic) are parsed again from their kept text. A composition whose files
        // another one reuses keeps every node.
        let slot = self.fetched.get_mut(config_path)?;
        match slot {
            Fetched::Parsed(n, _) if self.keep_parsed => Some(n.clone()),
            Fetched::Parsed(_, id) => {
                let merged = Fetched::Merged(*id);
                match std::mem::replace(slot, merged) {
                    Fetched::Parsed(n, _) => Some(n),
                    _ => None,
                }
            }
            // It parsed before, so it parses again (its values were counted then).
            Fetched::Merged(id) => yaml::parse(self.sources.get(*id), *id).ok(),
            Fetched::Invalid => None,
            Fetched::Unreadable(code, msg) => {
                let d = Diagnostic::error(*code, msg.clone())
                    .with_primary(requested_at.cloned(), "requested here");
                self.diags.push(d);
                None
            }
            Fetched::Missing => {
                let (group, name) = config_path.rsplit_once('/').unwrap_or(("", config_path));
                let options = self.repo.options(group);
                let mut d = Diagnostic::error(
                    codes::CONFIG_NOT_FOUND,
                    format!("cannot find config `{config_path}` in the search path"),
                )
                .with_primary(requested_at.cloned(), "requested here");
                if let Some(s) = did_you_mean(name, options.iter().map(String::as_str)) {
                    d = d.with_help(format!("did you mean `{s}`?"));
                } else if !options.is_empty() {
                    d = d.with_help(format!(
                        "available options in `{}`: {}",
                        if group.is_empty() { "<root>" } else { group },
                        options.join(", ")
                    ));
                }
                self.diags.push(d);
                None
            }
        }
    }

    /// Whether one more config may be merged at the current depth; the first refusal is
    /// reported (Y004) and everything the defaults lists name after it is left out.
    fn within_limits(&mut self, p: &Pending) -> bool {
        self.merged += 1;
        let problem = if self.stack.len() >= MAX_DEFAULTS_DEPTH {
            Some(format!(
                "defaults lists nest deeper than {MAX_DEFAULTS_DEPTH} levels ({} -> ... -> {})",
                self.stack.first().map_or("", String::as_str),
                p.config_path
            ))
        } else if split_key(&p.package).len() > MAX_KEY_SEGMENTS {
            Some(format!(
                "package `{}` of {} nests deeper than {MAX_KEY_SEGMENTS} levels",
                p.package, p.config_path
            ))
        } else if self.merged > MAX_DEFAULTS_CONFIGS {
            Some(format!(
                "defaults lists name more than {MAX_DEFAULTS_CONFIGS} configs in all (a config named several times counts each time)"
            ))
        } else {
            None
        };
        let Some(msg) = problem else { return true };
        if !self.limit_reported {
            self.limit_reported = true;
            self.diags.push(
                Diagnostic::error(codes::YAML_LIMIT, msg)
                    .with_primary(p.node.origin.clone(), "the limit is reached including this config")
                    .with_help("defaults lists that include each other repeatedly grow without bound; name each config once"),
            );
        }
        false
    }

    fn compose(&mut self, p: Pending, out: &mut Node) {
        if self.limit_reported || !self.within_limits(&p) {
            return;
        }
        if self.stack.contains(&p.config_path) {
            self.diags.push(
                Diagnostic::error(
                    codes::DEFAULTS_CYCLE,
                    format!(
                        "defaults cycle: {} -> {}",
                        self.stack.join(" -> "),
                        p.config_path
                    ),
                )
                .with_primary(p.node.origin.clone(), "included again here"),
            );
            return;
        }
        self.stack.push(p.config_path.clone());
        let mut node = p.node;
        let package = match package_header(&node, &self.sources) {
            Some(h) if !p.explicit_package => h,
            _ => p.package.clone(),
        };
        let defaults = node.as_map_mut().and_then(|m| m.shift_remove("defaults"));
        let mut entries = match defaults {
            Some(e) => self.parse_defaults(&e.node),
            None => Vec::new(),
        };
        let self_count = entries
            .iter()
            .filter(|(e, _)| matches!(e, DefaultEntry::SelfEntry))
            .count();
        if self_count > 1 {
            self.diags.push(Diagnostic::error(
                codes::DUPLICATE_SELF,
                format!(
                    "duplicate `_self_` in the defaults list of {}",
                    p.config_path
                ),
            ));
        }
        let has_non_override = entries.iter().any(|(e, _)| {
            !matches!(
                e,
                DefaultEntry::Group {
                    is_override: true,
                    ..
                }
            )
        });
        if self_count == 0 && (has_non_override || entries.is_empty()) {
            entries.push((DefaultEntry::SelfEntry, None));
        }
        if p.is_primary {
            for o in std::mem::take(&mut self.appended) {
                let option = o.value.clone();
                entries.push((
                    DefaultEntry::Group {
                        group: o.key.clone(),
                        package: o.package.clone(),
                        option,
                        optional: false,
                        is_override: false,
                    },
                    Some(o.key_origin.clone()),
                ));
            }
        }
        // `override group: opt` entries change the choice of an entry elsewhere in the tree.
        for (e, origin) in &entries {
            if let DefaultEntry::Group {
                group,
                package: pkg,
                option,
                is_override: true,
                ..
            } = e
            {
                let group_path = resolve_group(&p.base_dir, group);
                let key = override_key(
                    &raw_group(&p.raw_base_dir, group),
                    &final_package(&package, pkg.as_deref(), &rel_group(group)),
                );
                let Some(origin) = origin.clone() else {
                    continue;
                };
                let o = Override {
                    kind: OverrideKind::Set,
                    key: group_path,
                    package: None,
                    value: option.clone(),
                    text: key.clone(),
                    source: origin.source,
                    key_origin: origin,
                };
                // Command-line overrides win over `override` entries in files.
                self.group_overrides.entry(key).or_insert((o, false));
            }
        }

        for (entry, origin) in entries {
            match entry {
                DefaultEntry::SelfEntry => {
                    let content = Node {
                        value: node.value.clone(),
                        origin: node.origin.clone(),
                        via: None,
                    };
                    merge_at(out, &package, content);
                }
                DefaultEntry::Config {
                    path,
                    package: pkg,
                    optional,
                } => {
                    let config_path = if let Some(abs) = path.strip_prefix('/') {
                        abs.to_string()
                    } else if p.base_dir.is_empty() {
                        path.clone()
                    } else {
                        format!("{}/{}", p.base_dir, path)
                    };
                    let config_path = normalize_group(&config_path);
                    let base_dir = config_path
                        .rsplit_once('/')
                        .map(|(d, _)| d.to_string())
                        .unwrap_or_default();
                    let rel = path
                        .trim_start_matches('/')
                        .rsplit_once('/')
                        .map(|(d, _)| d.to_string())
                        .unwrap_or_default();
                    let child_pkg = final_package(&package, pkg.as_deref(), &rel);
                    if optional && !self.exists(&config_path) {
                        continue;
                    }
                    if let Some(n) = self.load_config(&config_path, origin.as_ref()) {
                        self.compose(
                            Pending {
                                node: n,
                                config_path,
                                base_dir,
                                raw_base_dir: if path.starts_with('/') {
                                    rel.clone()
                                } else {
                                    raw_group(&p.raw_base_dir, &rel)
                                },
                                package: child_pkg,
                                explicit_package: pkg.is_some(),
                                is_primary: false,
                            },
                            out,
                        );
                    }
                }
                DefaultEntry::Group {
                    group,
                    package: pkg,
                    option,
                    optional,
                    is_override,
                } => {
                    if is_override {
                        continue;
                    }
                    let group_path = resolve_group(&p.base_dir, &group);
                    let raw_path = raw_group(&p.raw_base_dir, &group);
                    let child_pkg = final_package(&package, pkg.as_deref(), &rel_group(&group));
                    let key = override_key(&raw_path, &child_pkg);
                    if self.is_deleted(&key, option.as_ref()) {
                        continue;
                    }
                    let mut option = option;
                    let mut option_origin = origin.clone();
                    if let Some((o, used)) = self.group_overrides.get_mut(&key) {
                        *used = true;
                        option = o.value.clone();
                        option_origin = Some(o.value_origin());
                    }
                    let names = match self.option_names(
                        &group_path,
                        option.as_ref(),
                        option_origin.as_ref(),
                        optional,
                    ) {
                        Some(n) => n,
                        None => continue,
                    };
                    let is_list = matches!(option.as_ref().map(|o| &o.value), Some(Value::Seq(_)));
                    if !self.check_single_choice(&key, &names, is_list, option_origin.as_ref()) {
                        continue;
                    }
                    for name in names {
                        let config_path = format!("{group_path}/{name}");
                        if optional && !self.exists(&config_path) {
                            continue;
                        }
                        self.choices.insert(key.clone(), name.clone());
                        if let Some(n) = self.load_config(&config_path, option_origin.as_ref()) {
                            self.compose(
                                Pending {
                                    node: n,
                                    config_path,
                                    base_dir: group_path.clone(),
                                    raw_base_dir: raw_path.clone(),
                                    package: child_pkg.clone(),
                                    explicit_package: pkg.is_some(),
                                    is_primary: false,
                                },
                                out,
                            );
                        }
                    }
                }
            }
        }
        self.stack.pop();
    }

    /// Two entries for the same group and package must agree on the option (Hydra's
    /// "Multiple values for ..."); the same option twice is one entry, as Hydra dedupes it
    /// (`tests/fixtures/hydra_composition`: `dup_same`, `+db=mysql`). `override group:
    /// option` is how a config changes one.
    fn check_single_choice(
        &mut self,
        key: &str,
        names: &[String],
        is_list: bool,
        origin: Option<&Origin>,
    ) -> bool {
        if is_list {
            self.list_choices.insert(key.to_string());
            return true;
        }
        let prev = match (self.choices.get(key), names) {
            (Some(prev), [name]) if prev != name && !self.list_choices.contains(key) => {
                prev.clone()
            }
            _ => return true,
        };
        self.diags.push(
            Diagnostic::error(
                codes::DEFAULTS_SYNTAX,
                format!(
                    "multiple values for `{key}`: `{prev}` and `{}`",
                    names.join(",")
                ),
            )
            .with_primary(origin.cloned(), "a second entry for this group and package")
            .with_help(format!(
                "to change the option chosen elsewhere, write `override {key}: {}`",
                names.join(",")
            )),
        );
        false
    }

    /// The option names a group entry selects (none for `null`).
    fn option_names(
        &mut self,
        group_path: &str,
        option: Option<&Node>,
        origin: Option<&Origin>,
        optional: bool,
    ) -> Option<Vec<String>> {
        let option = option?;
        let names: Vec<String> = match &option.value {
            Value::Scalar(Scalar::Null) => return None,
            Value::Scalar(Scalar::Str(s)) if s == "???" => {
                if !optional {
                    let opts = self.repo.options(group_path);
                    self.diags.push(
                        Diagnostic::error(
                            codes::GROUP_OPTION_UNKNOWN,
                            format!("you must choose an option for config group `{group_path}`"),
                        )
                        .with_primary(origin.cloned(), "left as `???` here")
                        .with_help(format!(
                            "add `{group_path}=<option>`; available: {}",
                            opts.join(", ")
                        )),
                    );
                }
                return None;
            }
            Value::Scalar(s) => vec![s.to_string()],
            Value::Seq(items) => items
                .iter()
                .filter_map(|i| match &i.value {
                    Value::Scalar(s) => Some(s.to_string()),
                    _ => None,
                })
                .collect(),
            Value::Map(_) => {
                self.diags.push(
                    Diagnostic::error(
                        codes::DEFAULTS_SYNTAX,
                        "a group option must be a name or a list of names",
                    )
                    .with_primary(origin.cloned(), "here"),
                );
                return None;
            }
        };
        let mut out = Vec::new();
        for n in names {
            // `${model_engine}_actor`: an option named after an earlier group choice.
            if n.contains("${") {
                match self.interpolate_choice(&n) {
                    Ok(v) => out.push(v),
                    Err(msg) => self.diags.push(
                        Diagnostic::error(codes::INTERP_KEY_MISSING, msg)
                            .with_primary(origin.cloned(), "in this defaults entry"),
                    ),
                }
            } else {
                out.push(n);
            }
        }
        if out.iter().any(|o| o.is_empty()) {
            return None;
        }
        Some(out)
    }

    fn interpolate_choice(&self, s: &str) -> Result<String, String> {
        let mut out = String::new();
        let mut rest = s;
        while let Some(i) = rest.find("${") {
            out.push_str(&rest[..i]);
            let end = rest[i..]
                .find('}')
                .ok_or_else(|| format!("unclosed `${{` in `{s}`"))?
                + i;
            let key = rest[i + 2..end].trim();
            let v = self.choices.get(key).ok_or_else(|| {
                format!("defaults entry `{s}` refers to group `{key}`, which has no choice yet")
            })?;
            out.push_str(v);
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        Ok(out)
    }

    fn parse_defaults(&mut self, list: &Node) -> Vec<(DefaultEntry, Option<Origin>)> {
        let Value::Seq(items) = &list.value else {
            self.diags.push(
                Diagnostic::error(codes::DEFAULTS_SYNTAX, "`defaults` must be a list")
                    .with_primary(list.origin.clone(), "here"),
            );
            return Vec::new();
        };
        let mut out = Vec::new();
        for item in items {
            match &item.value {
                Value::Scalar(Scalar::Str(s)) => {
                    let (optional, s) = match s.strip_prefix("optional ") {
                        Some(r) => (true, r.trim()),
                        None => (false, s.as_str()),
                    };
                    if s == "_self_" {
                        out.push((DefaultEntry::SelfEntry, item.origin.clone()));
                    } else {
                        let (path, package) = split_package(s);
                        out.push((
                            DefaultEntry::Config {
                                path,
                                package,
                                optional,
                            },
                            item.origin.clone(),
                        ));
                    }
                }
                Value::Map(m) if m.len() == 1 => {
                    let Some((k, e)) = m.iter().next() else {
                        continue;
                    };
                    let mut key = k.trim();
                    let mut optional = false;
                    let mut is_override = false;
                    loop {
                        if let Some(r) = key.strip_prefix("optional ") {
                            optional = true;
                            key = r.trim();
                        } else if let Some(r) = key.strip_prefix("override ") {
                            is_override = true;
                            key = r.trim();
                        } else {
                            break;
                        }
                    }
                    let (group, package) = split_package(key);
                    let option = Some(e.node.clone());
                    out.push((
                        DefaultEntry::Group {
                            group,
                            package,
                            option,
                            optional,
                            is_override,
                        },
                        e.key_origin.clone().or(item.origin.clone()),
                    ));
                }
                _ => self.diags.push(
                    Diagnostic::error(
                        codes::DEFAULTS_SYNTAX,
                        "a defaults entry must be `name`, `_self_` or `group@package: option`",
                    )
                    .with_primary(item.origin.clone(), "here"),
                ),
            }
        }
        out
    }
}

fn split_package(s: &str) -> (String, Option<String>) {
    match s.split_once('@') {
        Some((g, p)) => (g.trim().to_string(), Some(p.trim().to_string())),
        None => (s.trim().to_string(), None),
    }
}

/// `# @package x` at the top of a file sets its package (absolute).
fn package_header(node: &Node, sources: &SourceMap) -> Option<String> {
    let origin = node.origin.as_ref()?;
    let text = &sources.get(origin.source).text;
    for line in text.lines() {
        let t = line.trim();
        if t.is_empty() {
            continue;
        }
        let Some(c) = t.strip_prefix('#') else { break };
        if let Some(pkg) = c.trim().strip_prefix("@package") {
            let pkg = pkg.trim();
            let pkg = pkg
                .strip_prefix("_global_")
                .map(|r| r.trim_start_matches('.'))
                .unwrap_or(pkg);
            return Some(pkg.to_string());
        }
    }
    None
}

fn resolve_group(base_dir: &str, group: &str) -> String {
    match group.strip_prefix('/') {
        Some(abs) => normalize_group(abs),
        None if base_dir.is_empty() => normalize_group(group),
        None => normalize_group(&format!("{base_dir}/{group}")),
    }
}

/// Hydra's group path of an entry: joined to the parent's, not normalized.
fn raw_group(raw_base_dir: &str, group: &str) -> String {
    match group.strip_prefix('/') {
        Some(abs) => abs.to_string(),
        None if raw_base_dir.is_empty() => group.to_string(),
        None if group.is_empty() => raw_base_dir.to_string(),
        None => format!("{raw_base_dir}/{group}"),
    }
}

fn rel_group(group: &str) -> String {
    group.trim_start_matches('/').to_string()
}

/// Hydra's final package: parent package + own package (default: the relative group path
/// with `/` as `.`), cut at the last `_global_`.
fn final_package(parent: &str, package: Option<&str>, rel_group: &str) -> String {
    let own = match package {
        Some("_here_") => String::new(),
        Some(p) => p.to_string(),
        None => rel_group.replace('/', "."),
    };
    let joined = match (parent.is_empty(), own.is_empty()) {
        (true, _) => own,
        (false, true) => parent.to_string(),
        (false, false) => format!("{parent}.{own}"),
    };
    match joined.rfind("_global_") {
        Some(i) => joined[(i + "_global_".len()).min(joined.len())..]
            .trim_start_matches('.')
            .to_string(),
        None => joined,
    }
}

/// The key a command-line group override must use for a defaults entry.
fn override_key(group_path: &str, final_pkg: &str) -> String {
    let default_pkg = group_path.replace('/', ".");
    if default_pkg == final_pkg {
        group_path.to_string()
    } else if final_pkg.is_empty() {
        format!("{group_path}@_global_")
    } else {
        format!("{group_path}@{final_pkg}")
    }
}

/// Pick the built-in base for a plain file: Megatron when the actor says so.
fn pick_base(node: &Node, overrides: &[Override]) -> &'static str {
    let key = "actor_rollout_ref.actor.strategy";
    let from_override = overrides
        .iter()
        .rev()
        .find(|o| o.key == key)
        .and_then(|o| o.value.as_ref())
        .and_then(|v| v.as_str().map(str::to_string));
    let from_file = node
        .get_path(&split_key(key))
        .and_then(|n| n.as_str().map(str::to_string));
    match from_override.or(from_file).as_deref() {
        Some("megatron") => MEGATRON_BASE,
        _ => FSDP_BASE,
    }
}

/// Merge `src` into `out` at a dotted package path, creating maps on the way.
fn merge_at(out: &mut Node, package: &str, src: Node) {
    let mut cur = out;
    for seg in split_key(package) {
        if cur.as_map().is_none() {
            *cur = Node::empty_map(None);
        }
        let Some(m) = cur.as_map_mut() else { return };
        cur = &mut m
            .entry(seg.to_string())
            .or_insert_with(|| Entry {
                key_origin: None,
                node: Node::empty_map(None),
            })
            .node;
    }
    merge(cur, src);
}

/// OmegaConf merge: maps merge key by key, everything else replaces; `???` never replaces
/// a value that is already there.
pub fn merge(dest: &mut Node, src: Node) {
    if src.is_missing()
        && !dest.is_missing()
        && !(dest.as_map().is_some_and(|m| m.is_empty()) && dest.origin.is_none())
    {
        return;
    }
    match (dest.as_map_mut(), src.value) {
        (Some(dm), Value::Map(sm)) => {
            for (k, e) in *sm {
                match dm.get_mut(&k) {
                    Some(existing) => {
                        if e.key_origin.is_some() {
                            existing.key_origin = e.key_origin.clone();
                        }
                        merge(&mut existing.node, e.node);
                    }
                    None => {
                        dm.insert(k, e);
                    }
                }
            }
            if dest.origin.is_none() {
                dest.origin = src.origin;
            }
        }
        (_, value) => {
            *dest = Node {
                value,
                origin: src.origin,
                via: src.via,
            };
        }
    }
}

/// Apply one value override to the composed tree as Hydra's `_apply_overrides_to_config`
/// does: `k=v` in struct mode (the key must exist; a dict merges and may not add keys),
/// `+k=v` where nothing, null or `???` is (or with a dict/list value, which merges),
/// `++k=v` anywhere, `~k[=v]` where a value other than null is.
fn apply_override(root: &mut Node, o: &Override, diags: &mut Vec<Diagnostic>) {
    let path = split_key(&o.key);
    if path.is_empty() {
        return;
    }
    let result = match o.kind {
        OverrideKind::Set => update(root, o, &path, false),
        OverrideKind::ForceAdd => update(root, o, &path, true),
        OverrideKind::Add => add(root, o, &path),
        OverrideKind::Delete => delete(root, o, &path),
    };
    if let Err(d) = result {
        diags.push(*d);
    }
}

type Applied = Result<(), Box<Diagnostic>>;

fn is_container(n: &Node) -> bool {
    matches!(n.value, Value::Map(_) | Value::Seq(_))
}

/// What Hydra's `OmegaConf.select(..) is None` means: absent, null or `???`.
fn is_unset(n: Option<&Node>) -> bool {
    n.is_none_or(|n| n.is_null() || n.is_missing())
}

/// `+key=value`: Hydra reads the current value (interpolations resolved) first.
fn add(root: &mut Node, o: &Override, path: &[&str]) -> Applied {
    let existing = interp::select(root, path).map_err(|d| select_failed(o, d))?;
    if is_unset(existing.as_ref()) || o.value.as_ref().is_some_and(is_container) {
        return update(root, o, path, true);
    }
    let set_at = root.get_path(path).and_then(|n| n.origin.clone());
    Err(Box::new(
        Diagnostic::error(
            codes::OVERRIDE_KEY_EXISTS,
            format!("could not append `{}`: the key already exists", o.key),
        )
        .with_key(o.key.clone())
        .with_primary(Some(o.key_origin.clone()), "already in the config")
        .with_secondary(set_at, "set here")
        .with_help(format!(
            "drop the `+` to override it: `{}`, or use `++` to add or override",
            o.text.trim_start_matches('+')
        )),
    ))
}

/// `~key` / `~key=value`: the key must hold something other than null (and equal `value`).
fn delete(root: &mut Node, o: &Override, path: &[&str]) -> Applied {
    let existing = interp::select(root, path).map_err(|d| select_failed(o, d))?;
    let Some(current) = existing.filter(|n| !is_unset(Some(n))) else {
        return Err(Box::new(
            Diagnostic::error(
                codes::DELETE_KEY_ABSENT,
                format!(
                    "could not delete `{}`: the key does not exist (or is null)",
                    o.key
                ),
            )
            .with_key(o.key.clone())
            .with_primary(Some(o.key_origin.clone()), "nothing to delete"),
        ));
    };
    // `~key=null` deletes whatever is there: Hydra only compares a value that is not None.
    if let Some(v) = o.value.as_ref().filter(|v| !v.is_null())
        && !py_eq(v, &current)
    {
        return Err(Box::new(
            Diagnostic::error(
                codes::DELETE_KEY_ABSENT,
                format!(
                    "could not delete `{}`: its value is {}, not {}",
                    o.key,
                    current.to_json(),
                    v.to_json()
                ),
            )
            .with_key(o.key.clone())
            .with_primary(Some(o.value_origin()), "expected value"),
        ));
    }
    let (parent_path, last) = path.split_at(path.len() - 1);
    let Some(parent) = root.get_path_mut(parent_path) else {
        return Ok(());
    };
    match &mut parent.value {
        Value::Map(m) => {
            m.shift_remove(last[0]);
        }
        // Hydra deletes with a string key, which a list refuses (a TypeError in Hydra).
        Value::Seq(_) => {
            return Err(Box::new(
                Diagnostic::error(
                    codes::DELETE_KEY_ABSENT,
                    format!(
                        "could not delete `{}`: Hydra cannot delete a list item",
                        o.key
                    ),
                )
                .with_key(o.key.clone())
                .with_primary(Some(o.key_origin.clone()), "a list item")
                .with_help(format!(
                    "give the whole list without it: `{}=[...]`",
                    parent_path.join(".")
                )),
            ));
        }
        Value::Scalar(_) => {}
    }
    Ok(())
}

/// OmegaConf's `update(cfg, key, value, merge=True, force_add=..)`.
fn update(root: &mut Node, o: &Override, path: &[&str], force_add: bool) -> Applied {
    let Some(value) = o.value.clone() else {
        return Ok(());
    };
    let (parent_path, last) = path.split_at(path.len() - 1);
    let last = last[0];
    let mut cur: &mut Node = root;
    for (i, seg) in parent_path.iter().enumerate() {
        if !cur.child(seg).is_some_and(is_container) {
            // Hydra puts `{}` in place of a missing or scalar parent; in struct mode the
            // next key is then new, which only force-add may create.
            if !force_add {
                return Err(Box::new(absent_key(o, cur, &path[..=i])));
            }
            set_child(cur, seg, Node::empty_map(Some(o.key_origin.clone())), o)?;
        }
        cur = match cur.child_mut(seg) {
            Some(n) => n,
            None => return Err(Box::new(absent_key(o, &Node::empty_map(None), &path[..=i]))),
        };
    }
    let strict = !force_add;
    if cur.child(last).is_none() {
        if strict {
            return Err(Box::new(absent_key(o, cur, path)));
        }
        return set_child(cur, last, value, o);
    }
    let Some(existing) = cur.child_mut(last) else {
        return Ok(());
    };
    if is_container(existing) && is_container(&value) {
        merge_with(
            existing,
            value,
            strict,
            o,
            &path.iter().map(|s| s.to_string()).collect::<Vec<_>>(),
        )
    } else {
        *existing = value;
        Ok(())
    }
}

/// Put `node` at `seg` of a map (inserting) or of a list (an existing index only).
fn set_child(parent: &mut Node, seg: &str, node: Node, o: &Override) -> Applied {
    match &mut parent.value {
        Value::Map(m) => {
            match m.get_mut(seg) {
                Some(e) => e.node = node,
                None => {
                    m.insert(
                        seg.to_string(),
                        Entry {
                            key_origin: Some(o.key_origin.clone()),
                            node,
                        },
                    );
                }
            }
            Ok(())
        }
        Value::Seq(items) => match seg.parse::<usize>().ok().and_then(|i| items.get_mut(i)) {
            Some(slot) => {
                *slot = node;
                Ok(())
            }
            None => Err(Box::new(
                Diagnostic::error(
                    codes::OVERRIDE_KEY_ABSENT,
                    format!(
                        "could not override `{}`: `{seg}` is not an index of the list ({} items)",
                        o.key,
                        items.len()
                    ),
                )
                .with_key(o.key.clone())
                .with_primary(Some(o.key_origin.clone()), "no such list item"),
            )),
        },
        Value::Scalar(_) => Err(Box::new(absent_key(o, parent, &[seg]))),
    }
}

/// OmegaConf's `merge_with` of an override value into an existing container: dicts merge
/// key by key (in struct mode no new keys), lists are replaced, `???` never replaces a
/// value, and a dict never merges into a list or back.
fn merge_with(dest: &mut Node, src: Node, strict: bool, o: &Override, path: &[String]) -> Applied {
    let src_origin = src.origin.clone();
    match (&mut dest.value, src.value) {
        (Value::Map(dm), Value::Map(sm)) => {
            for (k, e) in *sm {
                let mut child_path = path.to_vec();
                child_path.push(k.clone());
                match dm.get_mut(&k) {
                    Some(_) if e.node.is_missing() => {}
                    Some(ex) if is_container(&ex.node) && is_container(&e.node) => {
                        merge_with(&mut ex.node, e.node, strict, o, &child_path)?
                    }
                    Some(ex) => ex.node = e.node,
                    None if strict => {
                        let siblings: Vec<&str> = dm.keys().map(String::as_str).collect();
                        let p: Vec<&str> = child_path.iter().map(String::as_str).collect();
                        return Err(Box::new(absent_key_among(o, &siblings, &p)));
                    }
                    None => {
                        dm.insert(k, e);
                    }
                }
            }
            Ok(())
        }
        (Value::Seq(_), Value::Seq(items)) => {
            dest.value = Value::Seq(items);
            dest.origin = src_origin;
            Ok(())
        }
        (dv, sv) => {
            let kind = |v: &Value| {
                if matches!(v, Value::Map(_)) {
                    "dict"
                } else {
                    "list"
                }
            };
            Err(Box::new(
                Diagnostic::error(codes::OVERRIDE_TYPE, format!("could not override `{}`: cannot merge a {} into the {} at `{}`", o.key, kind(&sv), kind(dv), path.join(".")))
                    .with_key(o.key.clone())
                    .with_primary(src_origin.or(Some(o.value_origin())), "this value")
                    .with_help("give a value of the same shape, or delete the key first (`~key`) and add it back (`+key=...`)"),
            ))
        }
    }
}

/// A `+`/`~` override reads the current value; an interpolation there that fails to
/// resolve makes the override fail, as in Hydra.
fn select_failed(o: &Override, d: Diagnostic) -> Box<Diagnostic> {
    Box::new(
        Diagnostic::error(
            d.code,
            format!("could not apply `{}`: {}", o.text, d.message),
        )
        .with_key(o.key.clone())
        .with_primary(
            Some(o.key_origin.clone()),
            "reads the current value of this key",
        )
        .with_help(
            d.help
                .unwrap_or_else(|| "fix the interpolation in the current value first".into()),
        ),
    )
}

/// Python's `==` between an override value and a config value (`1 == 1.0 == True`).
fn py_eq(a: &Node, b: &Node) -> bool {
    fn num(s: &Scalar) -> Option<f64> {
        match s {
            Scalar::Int(i) => Some(*i as f64),
            Scalar::Float(f) => Some(*f),
            Scalar::Bool(b) => Some(f64::from(u8::from(*b))),
            _ => None,
        }
    }
    match (&a.value, &b.value) {
        (Value::Scalar(Scalar::Str(x)), Value::Scalar(Scalar::Str(y))) => x == y,
        (Value::Scalar(Scalar::Null), Value::Scalar(Scalar::Null)) => true,
        (Value::Scalar(x), Value::Scalar(y)) => {
            matches!((num(x), num(y)), (Some(p), Some(q)) if p == q)
        }
        (Value::Seq(x), Value::Seq(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(p, q)| py_eq(p, q))
        }
        (Value::Map(x), Value::Map(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, e)| y.get(k).is_some_and(|f| py_eq(&e.node, &f.node)))
        }
        _ => false,
    }
}

fn absent_key(o: &Override, parent: &Node, path: &[&str]) -> Diagnostic {
    let siblings: Vec<&str> = parent
        .as_map()
        .map(|m| m.keys().map(String::as_str).collect())
        .unwrap_or_default();
    absent_key_among(o, &siblings, path)
}

fn absent_key_among(o: &Override, siblings: &[&str], path: &[&str]) -> Diagnostic {
    let missing = path.join(".");
    let last = path.last().copied().unwrap_or("");
    let d = Diagnostic::error(
        codes::OVERRIDE_KEY_ABSENT,
        format!(
            "could not override `{}`: key `{missing}` is not in the config",
            o.key
        ),
    )
    .with_key(o.key.clone())
    .with_primary(Some(o.key_origin.clone()), "not in the config");
    // A key of verl 0.7.0 on a newer release's tree: where it went.
    if let Some((m, to)) = super::moves::destination(&o.key) {
        return d.with_help(match to {
            Some(to) => format!(
                "verl {} moved it to `{to}`; `verlc migrate` rewrites the config",
                m.release
            ),
            None => format!("verl {} dropped it: {}", m.release, m.note),
        });
    }
    match did_you_mean(last, siblings.iter().copied()) {
        Some(s) => {
            let mut fixed: Vec<&str> = path[..path.len().saturating_sub(1)].to_vec();
            fixed.push(s);
            d.with_help(format!(
                "did you mean `{}`? To add a new key use `+{}`",
                fixed.join("."),
                o.text.trim_start_matches('+')
            ))
        }
        None => d.with_help(format!(
            "to append to the config use `+{}`",
            o.text.trim_start_matches('+')
        )),
    }
}

#[cfg(test)]
#[path = "compose_tests.rs"]
mod tests;
