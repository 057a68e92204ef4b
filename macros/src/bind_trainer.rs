//! `bind_trainer!`: parse `key = value` pairs, check names and the combination against the
//! shared support table, expand to `fn main` calling the runtime's generic entry.

use proc_macro2::{Span, TokenStream};
use quote::{quote, quote_spanned};
use syn::parse::{Parse, ParseStream};
use syn::{Expr, Ident, LitStr, Path, Token};

use crate::binding::{self, Dtype, Part, StrategyKind};

const KEYS: &[&str] = &[
    "strategy",
    "precision",
    "config",
    "spec",
    "bound_keys",
    "verlc_version",
    "config_hash",
    "source",
    "verl_release",
    "verl_tree",
    "runtime",
];

fn names<T: Copy>(all: &[T], name: fn(T) -> &'static str) -> String {
    all.iter()
        .map(|t| format!("`{}`", name(*t)))
        .collect::<Vec<_>>()
        .join(", ")
}

/// "did you mean" for a near-miss: same letters ignoring case, a prefix either way, or at
/// most two edits.
fn suggestion(
    word: &str,
    candidates: impl IntoIterator<Item = &'static str>,
) -> Option<&'static str> {
    let w = word.to_ascii_lowercase();
    candidates.into_iter().find(|c| {
        let c = c.to_ascii_lowercase();
        c == w || c.starts_with(&w) || w.starts_with(&c) || edit_distance(&c, &w) <= 2
    })
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn unknown(what: &str, found: &Ident, choices: String, hint: Option<&'static str>) -> syn::Error {
    let mut msg = format!("unknown {what} `{found}`; expected one of: {choices}");
    if let Some(h) = hint {
        msg.push_str(&format!("\nhelp: did you mean `{h}`?"));
    }
    syn::Error::new(found.span(), msg)
}

#[derive(Default)]
struct Input {
    strategy: Option<(StrategyKind, Ident)>,
    precision: Option<(Dtype, Ident)>,
    config: Option<Expr>,
    spec: Option<Expr>,
    bound_keys: Option<Expr>,
    verlc_version: Option<LitStr>,
    config_hash: Option<LitStr>,
    source: Option<LitStr>,
    verl_release: Option<LitStr>,
    verl_tree: Option<Expr>,
    runtime: Option<Path>,
}

fn set<T>(slot: &mut Option<T>, key: &Ident, value: T) -> syn::Result<()> {
    if slot.is_some() {
        return Err(syn::Error::new(
            key.span(),
            format!("`{key}` is given twice"),
        ));
    }
    *slot = Some(value);
    Ok(())
}

impl Parse for Input {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let mut out = Input::default();
        while !input.is_empty() {
            let key: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            match key.to_string().as_str() {
                "strategy" => {
                    let id: Ident = input.parse()?;
                    let kind = StrategyKind::from_name(&id.to_string()).ok_or_else(|| {
                        let hint = if id.to_string().eq_ignore_ascii_case("fsdp2") {
                            Some("Fsdp")
                        } else {
                            suggestion(&id.to_string(), StrategyKind::ALL.map(StrategyKind::name))
                        };
                        unknown(
                            "strategy",
                            &id,
                            names(&StrategyKind::ALL, StrategyKind::name),
                            hint,
                        )
                    })?;
                    set(&mut out.strategy, &key, (kind, id))?;
                }
                "precision" => {
                    let id: Ident = input.parse()?;
                    let kind = Dtype::from_marker(&id.to_string()).ok_or_else(|| {
                        let hint = suggestion(&id.to_string(), Dtype::ALL.map(Dtype::marker));
                        unknown("precision", &id, names(&Dtype::ALL, Dtype::marker), hint)
                    })?;
                    set(&mut out.precision, &key, (kind, id))?;
                }
                "offload" => {
                    return Err(syn::Error::new(
                        key.span(),
                        "`offload` is not part of a binding: where parameters, gradients and \
                         optimizer state live is each role's engine setting in the config \
                         (param_offload, grad_offload, optimizer_offload), read at run time\n\
                         help: remove `offload = [...]`",
                    ));
                }
                "config" => set(&mut out.config, &key, input.parse()?)?,
                "spec" => set(&mut out.spec, &key, input.parse()?)?,
                "bound_keys" => set(&mut out.bound_keys, &key, input.parse()?)?,
                "verlc_version" => set(&mut out.verlc_version, &key, input.parse()?)?,
                "config_hash" => set(&mut out.config_hash, &key, input.parse()?)?,
                "source" => set(&mut out.source, &key, input.parse()?)?,
                "verl_release" => set(&mut out.verl_release, &key, input.parse()?)?,
                "verl_tree" => set(&mut out.verl_tree, &key, input.parse()?)?,
                "runtime" => set(&mut out.runtime, &key, input.parse()?)?,
                other => {
                    let mut msg = format!(
                        "unknown key `{other}`; expected one of: {}",
                        KEYS.iter()
                            .map(|k| format!("`{k}`"))
                            .collect::<Vec<_>>()
                            .join(", ")
                    );
                    if let Some(h) = suggestion(other, KEYS.iter().copied()) {
                        msg.push_str(&format!("\nhelp: did you mean `{h}`?"));
                    }
                    return Err(syn::Error::new(key.span(), msg));
                }
            }
            if input.is_empty() {
                break;
            }
            input.parse::<Token![,]>()?;
        }
        Ok(out)
    }
}

fn missing(key: &str, what: String) -> syn::Error {
    syn::Error::new(Span::call_site(), format!("missing `{key} = ...` ({what})"))
}

pub(crate) fn expand(input: TokenStream) -> syn::Result<TokenStream> {
    let Input {
        strategy,
        precision,
        config,
        spec,
        bound_keys,
        verlc_version,
        config_hash,
        source,
        verl_release,
        verl_tree,
        runtime,
    } = syn::parse2(input)?;

    let mut errors: Vec<syn::Error> = Vec::new();
    if strategy.is_none() {
        errors.push(missing(
            "strategy",
            format!("one of {}", names(&StrategyKind::ALL, StrategyKind::name)),
        ));
    }
    if precision.is_none() {
        errors.push(missing(
            "precision",
            format!("one of {}", names(&Dtype::ALL, Dtype::marker)),
        ));
    }
    if config.is_none() {
        errors.push(missing(
            "config",
            "the embedded resolved config, e.g. `include_str!(\"../trainer.yaml\")`".into(),
        ));
    }
    let (Some((s, s_id)), Some((p, p_id)), Some(config)) = (strategy, precision, config) else {
        return Err(combine(errors));
    };

    if let Err(rej) = binding::validate(s, p) {
        let span = match rej.part {
            Part::Strategy => s_id.span(),
            // Placement rules are the config's (lowering reports them), never a binding's.
            Part::Precision | Part::Offload(_) => p_id.span(),
        };
        return Err(syn::Error::new(
            span,
            format!("{}\nhelp: {}", rej.message, rej.help),
        ));
    }

    let rt = runtime.map_or_else(|| quote!(::verlc_runtime), |p| quote!(#p));
    let s_ty = quote_spanned!(s_id.span()=> #rt::binding::#s_id);
    let p_ty = quote_spanned!(p_id.span()=> #rt::binding::#p_id);
    let lit = |l: Option<LitStr>| l.map_or_else(|| quote!("unknown"), |l| quote!(#l));
    let (version, hash, source) = (lit(verlc_version), lit(config_hash), lit(source));
    // The lowered trainer spec (JSON); without it the binary lowers its embedded config.
    let spec = spec.map_or_else(|| quote!(""), |e| quote!(#e));
    // The keys that decided the binding (JSON), decided by `verlc build`; without them the
    // binary recovers them by lowering its embedded config.
    let bound_keys = bound_keys.map_or_else(|| quote!(""), |e| quote!(#e));
    // The verl release the config was composed and judged against (run-time overrides are
    // judged against it too); empty: the runtime's default.
    let verl_release = verl_release.map_or_else(|| quote!(""), |l| quote!(#l));
    // The `--config-dir` tree the config was judged against (JSON), carried so run-time
    // overrides are judged against it too; empty for verlc's built-in trees.
    let verl_tree = verl_tree.map_or_else(|| quote!(""), |e| quote!(#e));
    Ok(quote! {
        fn main() -> ::std::process::ExitCode {
            #rt::binding::main::<#s_ty, #p_ty>(
                #config,
                #rt::binding::BuildInfo { verlc_version: #version, config_hash: #hash, source: #source, spec: #spec, bound_keys: #bound_keys, verl_release: #verl_release, verl_tree: #verl_tree },
            )
        }
    })
}

/// The error plus an empty `fn main`, so the compiler reports only the binding problem and
/// not also a missing `main`.
pub(crate) fn error_with_stub_main(e: syn::Error) -> TokenStream {
    let err = e.into_compile_error();
    quote! {
        #err
        fn main() {}
    }
}

fn combine(errors: Vec<syn::Error>) -> syn::Error {
    let mut it = errors.into_iter();
    let Some(mut first) = it.next() else {
        return syn::Error::new(Span::call_site(), "invalid bind_trainer! input");
    };
    for e in it {
        first.combine(e);
    }
    first
}
