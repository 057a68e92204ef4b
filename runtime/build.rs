//! Builds the C++ shim (`csrc/`: one C header per concern, each implemented by the `.cpp` of
//! its name) against the libtorch that torch-sys found, checks `src/ffi.rs` against those
//! headers (`build_support/ffi_check.rs`), and gives this package's tests, examples and
//! benches an rpath to libtorch.
//!
//! libtorch comes from torch-sys (`DEP_TCH_LIBTORCH_LIB`, set by `LIBTORCH_USE_PYTORCH=1` or
//! `LIBTORCH`); see `scripts/cargo-env`. Gloo headers come from `/usr/include/gloo`
//! (Debian `libgloo-dev`) or `GLOO_INCLUDE`. The `cuda` feature adds ProcessGroupNCCL, which
//! needs the CUDA/NCCL headers of the nvidia wheels (found next to torch, or listed in
//! `VERLC_CUDA_INCLUDE`, colon-separated).
use std::env;
use std::path::{Path, PathBuf};

#[path = "build_support/ffi_check.rs"]
mod ffi_check;

/// The shim's C ABI files, compiled as one translation unit (each includes ATen, whose headers
/// are most of a file's compile time); `gloo_pacing.cpp` (no ATen) compiles beside it.
const SHIM_SOURCES: [&str; 8] = [
    "errors.cpp",
    "store.cpp",
    "process_group.cpp",
    "collectives.cpp",
    "storage.cpp",
    "optimizer.cpp",
    "autograd.cpp",
    "kernel_calls.cpp",
];

fn main() {
    println!("cargo:rerun-if-changed=csrc");
    println!("cargo:rerun-if-changed=src/ffi.rs");
    println!("cargo:rerun-if-changed=build_support/ffi_check.rs");
    let manifest = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    if let Err(problems) = ffi_check::check(&manifest) {
        panic!("src/ffi.rs does not match the shim's C headers (csrc/*.h):\n{problems}");
    }
    println!("cargo:rerun-if-env-changed=GLOO_INCLUDE");
    println!("cargo:rerun-if-env-changed=VERLC_CUDA_INCLUDE");
    println!("cargo:rerun-if-env-changed=LIBTORCH_CXX11_ABI");

    let Some(lib) = env::var_os("DEP_TCH_LIBTORCH_LIB").map(PathBuf::from) else {
        panic!(
            "DEP_TCH_LIBTORCH_LIB is not set: torch-sys did not find libtorch. \
             Run `source scripts/cargo-env` (after scripts/setup) before cargo."
        );
    };
    let torch_root = lib
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_else(|| lib.clone());
    let include = torch_root.join("include");
    let cuda = env::var_os("CARGO_FEATURE_CUDA").is_some();
    let abi = env::var("LIBTORCH_CXX11_ABI").unwrap_or_else(|_| "1".to_owned());

    let mut build = cc::Build::new();
    build
        .cpp(true)
        .include(&include)
        .include(include.join("torch/csrc/api/include"))
        .flag("-std=c++17")
        .flag(format!("-D_GLIBCXX_USE_CXX11_ABI={abi}"))
        .define("USE_C10D_GLOO", None)
        .flag_if_supported("-Wno-unused-parameter")
        .flag_if_supported("-Wno-deprecated-declarations")
        // No debug info, whatever the profile: the same archives then serve the workspace
        // (line tables) and generated trainers (none), see `ShimCache`.
        .debug(false)
        .warnings(false);
    if let Some(gloo) = env::var_os("GLOO_INCLUDE") {
        build.include(gloo);
    } else if !Path::new("/usr/include/gloo").is_dir() {
        println!(
            "cargo:warning=/usr/include/gloo not found: install libgloo-dev (scripts/setup) or set GLOO_INCLUDE"
        );
    }
    if cuda {
        build
            .define("VERLC_CUDA", None)
            .define("USE_C10D_NCCL", None)
            .define("USE_CUDA", None);
        for dir in cuda_include_dirs(&torch_root) {
            build.include(dir);
        }
    }
    // The numeric kernels are optimised whatever the profile: at -O0 (the dev profile) their
    // loops would be several times slower, and every test's model would pay it.
    // Linked after the shim, which calls them (cc's own link line would come first). OpenMP:
    // their parallel loops run on libtorch's team (see csrc/kernels.h).
    // One translation unit for the three kernel files: each includes ATen and autograd, whose
    // headers take most of a file's compile time (three files alone: 71 s of CPU on a 2-core
    // EPYC, as one: 32 s). It compiles beside the shim, on the other core.
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("OUT_DIR is set by cargo"));
    let unity = out.join("verlc_kernels.cpp");
    let sources = ["gated_delta_rule.cpp", "causal_conv.cpp", "gated_norm.cpp"];
    let text: String = sources
        .iter()
        .map(|f| format!("#include \"{}\"\n", manifest.join("csrc").join(f).display()))
        .collect();
    std::fs::write(&unity, text).expect("write the kernels' translation unit");
    let mut kernels = build.clone();
    kernels
        .file(&unity)
        .include(manifest.join("csrc"))
        .opt_level(3)
        .flag("-fopenmp")
        .cargo_metadata(false);
    let cache = ShimCache::new(&out, &manifest, &include, &lib, cuda, &abi);
    if !cache.as_ref().is_some_and(|c| c.restore(&out)) {
        let kernels = std::thread::spawn(move || kernels.compile("verlc_kernels"));
        let shim = out.join("verlc_shim.cpp");
        let text: String = SHIM_SOURCES
            .iter()
            .map(|f| format!("#include \"{}\"\n", manifest.join("csrc").join(f).display()))
            .collect();
        std::fs::write(&shim, text).expect("write the shim's translation unit");
        build.file(&shim).include(manifest.join("csrc"));
        build.file("csrc/gloo_pacing.cpp");
        build.cargo_metadata(false).compile("verlc_shim");
        if kernels.join().is_err() {
            panic!("compiling the C++ kernels failed (see the compiler's output above)");
        }
        if let Some(c) = &cache {
            c.store(&out);
        }
    }
    println!("cargo:rustc-link-lib=static=verlc_shim");
    println!("cargo:rustc-link-search=native={}", out.display());
    println!("cargo:rustc-link-lib=stdc++");
    println!("cargo:rustc-link-lib=static=verlc_kernels");

    println!("cargo:rustc-link-search=native={}", lib.display());
    if cuda {
        println!("cargo:rustc-link-lib=dylib=torch_cuda");
        println!("cargo:rustc-link-lib=dylib=c10_cuda");
    }
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-lib=dylib=c10");

    // Tests, examples and benches of this package run without LD_LIBRARY_PATH.
    println!("cargo:rustc-link-arg=-Wl,-rpath={}", lib.display());
    // A CUDA build: `-ltorch` after `--no-as-needed` keeps libtorch_cuda loaded (nothing
    // references it by symbol), so libtorch finds the GPUs. A CPU build leaves it out: with a
    // CUDA wheel of torch, loading libtorch_cuda and the CUDA libraries behind it is most of a
    // process's start (0.75 s of CPU on a 2-core EPYC, for every rank and trainer process).
    if cuda {
        println!("cargo:rustc-link-arg=-Wl,--no-as-needed");
        println!("cargo:rustc-link-arg=-ltorch");
    }
    // Re-exported to dependents as DEP_VERLC_SHIM_LIBTORCH_LIB (generated trainers' build.rs).
    println!("cargo:libtorch_lib={}", lib.display());
}

/// Header directories of the nvidia wheels that ProcessGroupNCCL.hpp reaches.
fn cuda_include_dirs(torch_root: &Path) -> Vec<PathBuf> {
    if let Ok(list) = env::var("VERLC_CUDA_INCLUDE") {
        return env::split_paths(&list).collect();
    }
    let Some(site) = torch_root.parent() else {
        return Vec::new();
    };
    let nvidia = site.join("nvidia");
    [
        "cu13/include",
        "cu13/include/cccl",
        "nccl/include",
        "cuda_runtime/include",
        "cuda_nvcc/include",
    ]
    .iter()
    .map(|d| nvidia.join(d))
    .filter(|d| d.is_dir())
    .collect()
}

/// The C++ archives of earlier builds in the same target directory, by what they were built
/// from. Cargo compiles this package once per place it is built from (the workspace, and once
/// more for generated trainers, whose path to it differs), and each time this script would
/// recompile the same C++ (over a minute of CPU): the archives are kept in
/// `<target>/<profile>/.verlc-shim-cache/<key>/` and copied when every input is the same (the
/// sources, libtorch, the flags, the compiler and cc's environment). `VERLC_SHIM_CACHE=0`
/// turns it off.
struct ShimCache {
    dir: PathBuf,
    /// Everything the archives depend on, as text: compared in full on a hit.
    inputs: String,
}

const ARCHIVES: [&str; 2] = ["libverlc_shim.a", "libverlc_kernels.a"];

impl ShimCache {
    fn new(
        out: &Path,
        manifest: &Path,
        include: &Path,
        lib: &Path,
        cuda: bool,
        abi: &str,
    ) -> Option<ShimCache> {
        // cc says these itself when it prints cargo metadata, which it does not here.
        for var in [
            "VERLC_SHIM_CACHE",
            "CXX",
            "CXXFLAGS",
            "AR",
            "CRATE_CC_NO_DEFAULTS",
        ] {
            println!("cargo:rerun-if-env-changed={var}");
        }
        if env::var("VERLC_SHIM_CACHE").is_ok_and(|v| v == "0") {
            return None;
        }
        // OUT_DIR is <target>/<profile>/build/<package>-<hash>/out.
        let build_dir = out.ancestors().nth(2)?;
        if build_dir.file_name()? != "build" {
            return None;
        }
        let profile_dir = build_dir.parent()?;
        use std::hash::{Hash, Hasher};
        let mut inputs = String::new();
        let digest = |bytes: &[u8]| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            bytes.hash(&mut h);
            format!("{:016x}:{}", h.finish(), bytes.len())
        };
        let mut sources: Vec<PathBuf> = std::fs::read_dir(manifest.join("csrc"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .collect();
        sources.sort();
        for f in sources {
            let bytes = std::fs::read(&f).ok()?;
            inputs.push_str(&format!("{} {}\n", f.display(), digest(&bytes)));
        }
        let torch_lib = std::fs::metadata(lib.join("libtorch_cpu.so")).ok()?;
        inputs.push_str(&format!(
            "libtorch {} {} {:?}\ninclude {}\ncuda {cuda} abi {abi}\n",
            lib.display(),
            torch_lib.len(),
            torch_lib.modified().ok()?,
            include.display()
        ));
        for var in [
            "TARGET",
            "HOST",
            "OPT_LEVEL",
            "CXX",
            "CXXFLAGS",
            "AR",
            "CRATE_CC_NO_DEFAULTS",
            "GLOO_INCLUDE",
            "VERLC_CUDA_INCLUDE",
        ] {
            inputs.push_str(&format!("{var}={:?}\n", env::var(var).ok()));
        }
        let compiler = env::var("CXX").unwrap_or_else(|_| "c++".to_owned());
        let version = std::process::Command::new(&compiler)
            .arg("--version")
            .output()
            .ok()?;
        inputs.push_str(&String::from_utf8_lossy(&version.stdout));
        let key = digest(inputs.as_bytes()).replace(':', "-");
        Some(ShimCache {
            dir: profile_dir.join(".verlc-shim-cache").join(key),
            inputs,
        })
    }

    /// Copies the cached archives into `out`; false when there are none for these inputs.
    fn restore(&self, out: &Path) -> bool {
        let same =
            std::fs::read_to_string(self.dir.join("inputs.txt")).is_ok_and(|t| t == self.inputs);
        same && ARCHIVES
            .iter()
            .all(|a| std::fs::copy(self.dir.join(a), out.join(a)).is_ok())
    }

    /// Keeps the archives just built (best effort: a failure only costs the next build time).
    fn store(&self, out: &Path) {
        let Some(parent) = self.dir.parent() else {
            return;
        };
        let staging = parent.join(format!(".staging-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&staging);
        let staged = std::fs::create_dir_all(&staging).is_ok()
            && ARCHIVES
                .iter()
                .all(|a| std::fs::copy(out.join(a), staging.join(a)).is_ok())
            && std::fs::write(staging.join("inputs.txt"), &self.inputs).is_ok();
        if !staged || std::fs::rename(&staging, &self.dir).is_err() {
            let _ = std::fs::remove_dir_all(&staging);
        }
    }
}
