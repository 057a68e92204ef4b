//! `src/ffi.rs` checked against the shim's C headers (the `csrc/*.h` that say they are bound
//! there, [`ABI_MARK`]): every function a header
//! declares is declared in `ffi.rs` with the same parameter and return types, and `ffi.rs`
//! declares nothing the headers do not. The C++ compiler checks each definition against its
//! header (a C function declared twice with other types does not compile); this closes the
//! other side, which no compiler sees. Run by `build.rs` (a mismatch fails the build) and by
//! the runtime's unit tests.

/// One function of the ABI: its name, and its parameter and return types as Rust spells them
/// (`*const *mut c_void`, `c_int`, `()` for no value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decl {
    pub name: String,
    pub params: Vec<String>,
    pub ret: String,
}

/// The Rust spelling of a C base type.
fn c_base(name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "void" => "c_void",
        "char" => "c_char",
        "int" => "c_int",
        "int64_t" => "i64",
        "uint64_t" => "u64",
        "uint16_t" => "u16",
        "uint8_t" => "u8",
        "size_t" => "usize",
        "double" => "f64",
        "vlc_store" => "vlc_store",
        "vlc_pg" => "vlc_pg",
        other => return Err(format!("C type `{other}` has no mapping in ffi_check.rs")),
    })
}

/// A C type (`void* const*`, `const char*`) as Rust spells it. A pointer's own `const` does not
/// change the ABI; the constness of what it points to picks `*const` or `*mut`.
fn c_type(text: &str) -> Result<String, String> {
    let spaced = text.replace('*', " * ");
    let tokens: Vec<&str> = spaced.split_whitespace().collect();
    let first_star = tokens
        .iter()
        .position(|t| *t == "*")
        .unwrap_or(tokens.len());
    let (base, stars) = tokens.split_at(first_star);
    let mut is_const = base.contains(&"const");
    let names: Vec<&&str> = base.iter().filter(|t| **t != "const").collect();
    let [name] = names.as_slice() else {
        return Err(format!("cannot read the C type `{text}`"));
    };
    let mut rust = c_base(name)?.to_owned();
    let mut i = 0;
    while i < stars.len() {
        if stars[i] != "*" {
            return Err(format!("cannot read the C type `{text}`"));
        }
        let own_const = stars.get(i + 1) == Some(&"const");
        rust = format!("{} {rust}", if is_const { "*const" } else { "*mut" });
        is_const = own_const;
        i += if own_const { 2 } else { 1 };
    }
    Ok(if rust == "c_void" {
        "()".to_owned()
    } else {
        rust
    })
}

/// A C parameter (`const char* host`) without its name.
fn c_param(text: &str) -> Result<String, String> {
    let text = text.trim();
    let cut = text
        .rfind(|c: char| !(c.is_alphanumeric() || c == '_'))
        .map_or(0, |i| i + 1);
    c_type(&text[..cut])
}

/// The `vlc_*` functions a header declares (`ret vlc_name(params);`, possibly over lines).
pub fn c_decls(header: &str) -> Result<Vec<Decl>, String> {
    let mut out = Vec::new();
    let text = header
        .lines()
        .filter(|l| !l.trim_start().starts_with("//") && !l.trim_start().starts_with('#'))
        .collect::<Vec<_>>()
        .join(" ");
    for stmt in text.split(';') {
        let Some(open) = stmt.find("vlc_").filter(|_| stmt.contains('(')) else {
            continue;
        };
        if stmt.contains("typedef") || stmt.contains('{') && !stmt.contains("extern") {
            continue;
        }
        let stmt = stmt.rsplit('{').next().unwrap_or(stmt);
        let Some(paren) = stmt.find('(') else {
            continue;
        };
        let head = stmt[..paren].trim();
        let name_at = head.rfind("vlc_").unwrap_or(open);
        let (ret, name) = (head[..name_at].trim(), head[name_at..].trim());
        let params = stmt[paren + 1..stmt.rfind(')').unwrap_or(stmt.len())].trim();
        let params = if params == "void" || params.is_empty() {
            Vec::new()
        } else {
            params
                .split(',')
                .map(c_param)
                .collect::<Result<Vec<_>, _>>()
                .map_err(|e| format!("{name}: {e}"))?
        };
        out.push(Decl {
            name: name.to_owned(),
            params,
            ret: c_type(ret).map_err(|e| format!("{name}: {e}"))?,
        });
    }
    Ok(out)
}

/// A Rust type of `ffi.rs` in the canonical spelling (`TensorPtr` expanded).
fn rust_type(text: &str) -> String {
    let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
    text.replace("TensorPtr", "*mut c_void")
}

/// The `vlc_*` functions of `ffi.rs`' `extern "C"` block.
pub fn rust_decls(ffi: &str) -> Result<Vec<Decl>, String> {
    let start = ffi
        .find("extern \"C\" {")
        .ok_or("ffi.rs has no extern \"C\" block")?;
    // The block ends at the first line that is a closing brace alone.
    let block = &ffi[start..];
    let block = &block[..block.find("\n}").unwrap_or(block.len())];
    let mut out = Vec::new();
    for item in block.split("pub fn ").skip(1) {
        let Some(paren) = item.find('(') else {
            continue;
        };
        let name = item[..paren].trim().to_owned();
        let close = item
            .find(')')
            .ok_or(format!("{name}: no closing parenthesis"))?;
        let params = item[paren + 1..close]
            .split(',')
            .filter(|p| !p.trim().is_empty())
            .map(|p| {
                p.split_once(':')
                    .map(|(_, t)| rust_type(t))
                    .ok_or(format!("{name}: cannot read the parameter `{}`", p.trim()))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let rest = &item[close + 1..];
        let end = rest.find(';').ok_or(format!("{name}: no `;`"))?;
        let ret = match rest[..end].trim().strip_prefix("->") {
            Some(t) => rust_type(t),
            None => "()".to_owned(),
        };
        out.push(Decl { name, params, ret });
    }
    Ok(out)
}

/// What disagrees between the headers' declarations and `ffi.rs`', one line each.
pub fn compare(headers: &[(String, Vec<Decl>)], rust: &[Decl]) -> Vec<String> {
    let mut problems = Vec::new();
    for (file, decls) in headers {
        for c in decls {
            match rust.iter().find(|r| r.name == c.name) {
                None => problems.push(format!(
                    "{file} declares {} but src/ffi.rs does not",
                    c.name
                )),
                Some(r) if r != c => problems.push(format!(
                    "{}: {file} has ({}) -> {} but src/ffi.rs has ({}) -> {}",
                    c.name,
                    c.params.join(", "),
                    c.ret,
                    r.params.join(", "),
                    r.ret
                )),
                Some(_) => {}
            }
        }
    }
    for r in rust {
        if !headers
            .iter()
            .any(|(_, d)| d.iter().any(|c| c.name == r.name))
        {
            problems.push(format!(
                "src/ffi.rs declares {} but no header of csrc/ does",
                r.name
            ));
        }
    }
    problems
}

/// What the first lines of each header of the ABI say (the others are the shim's own).
pub const ABI_MARK: &str = "bound in src/ffi.rs";

/// The check on a runtime checkout at `root` (its `csrc/*.h` and `src/ffi.rs`).
pub fn check(root: &std::path::Path) -> Result<(), String> {
    let mut headers = Vec::new();
    let mut names: Vec<_> = std::fs::read_dir(root.join("csrc"))
        .map_err(|e| e.to_string())?
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "h"))
        .collect();
    names.sort();
    for path in names {
        let text =
            std::fs::read_to_string(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        // The ABI's headers say so; the shim's internal ones (kernels.h, boundary.h) do not.
        if !text.contains(ABI_MARK) {
            continue;
        }
        let file = format!(
            "csrc/{}",
            path.file_name()
                .map(|n| n.to_string_lossy())
                .unwrap_or_default()
        );
        let decls = c_decls(&text).map_err(|e| format!("{file}: {e}"))?;
        if !decls.is_empty() {
            headers.push((file, decls));
        }
    }
    let ffi = std::fs::read_to_string(root.join("src/ffi.rs")).map_err(|e| e.to_string())?;
    let problems = compare(&headers, &rust_decls(&ffi)?);
    if problems.is_empty() {
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// This checkout's headers and `ffi.rs` agree, and every ABI function is declared in one.
    #[test]
    fn the_shim_headers_and_ffi_rs_agree() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        check(root).unwrap();
        let ffi = std::fs::read_to_string(root.join("src/ffi.rs")).unwrap();
        assert!(rust_decls(&ffi).unwrap().len() >= 40);
    }

    /// A parameter of another type, a missing function and an undeclared one are each named.
    #[test]
    fn mismatches_are_named() {
        let header = "// x\n#pragma once\nchar* vlc_a(const char* s, void* const* ts,\n           size_t n);\nvoid vlc_b(void);\n";
        let c = c_decls(header).unwrap();
        assert_eq!(
            c[0],
            Decl {
                name: "vlc_a".into(),
                params: vec![
                    "*const c_char".into(),
                    "*const *mut c_void".into(),
                    "usize".into()
                ],
                ret: "*mut c_char".into(),
            }
        );
        let good = "unsafe extern \"C\" {\n    pub fn vlc_a(s: *const c_char, ts: *const TensorPtr, n: usize) -> *mut c_char;\n    pub fn vlc_b();\n}";
        assert!(compare(&[("h".into(), c.clone())], &rust_decls(good).unwrap()).is_empty());
        let bad = "unsafe extern \"C\" {\n    pub fn vlc_a(s: *mut c_char, ts: *const TensorPtr, n: usize) -> *mut c_char;\n    pub fn vlc_c();\n}";
        let problems = compare(&[("h".into(), c)], &rust_decls(bad).unwrap());
        assert_eq!(problems.len(), 3, "{problems:?}");
        assert!(problems[0].starts_with("vlc_a: h has (*const c_char"));
        assert!(problems[1].contains("h declares vlc_b but src/ffi.rs does not"));
        assert!(problems[2].contains("src/ffi.rs declares vlc_c but no header"));
    }
}
