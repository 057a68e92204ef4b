//! `verlc` on configs written to hurt it: special files, unbounded reads, composition and
//! interpolation bombs, huge inputs, secrets in the environment, nonsense that used to pass.
//! Each case runs the real binary in a child process with its own limits (10 s of CPU time,
//! 1 GiB of address space), so a runaway case fails alone, and asserts the exit status
//! (1 config problem, 2 usage or I/O problem), that the message names the file or key, and
//! that no secret is printed. The inputs are generated here, not committed.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const CPU_SECONDS: u64 = 10;
const ADDRESS_SPACE: u64 = 1 << 30;
/// Wall-clock guard against a hang (a blocked read uses no CPU time).
const HANG: Duration = Duration::from_secs(60);

struct Run {
    status: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn out(&self) -> String {
        format!("{}{}", self.stdout, self.stderr)
    }

    fn expect(&self, status: i32, needles: &[&str]) -> &Self {
        let out = self.out();
        assert_eq!(
            self.status,
            Some(status),
            "exit status (None: killed by a signal, e.g. the CPU or memory limit)\n{out}"
        );
        assert!(!out.contains("panicked"), "{out}");
        for n in needles {
            assert!(out.contains(n), "expected `{n}` in:\n{out}");
        }
        self
    }
}

fn verlc(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Run {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_verlc"));
    cmd.args(args)
        .current_dir(dir)
        .env("NO_COLOR", "1")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    // SAFETY: only async-signal-safe calls (setrlimit) between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let cpu = libc::rlimit {
                rlim_cur: CPU_SECONDS,
                rlim_max: CPU_SECONDS,
            };
            let mem = libc::rlimit {
                rlim_cur: ADDRESS_SPACE,
                rlim_max: ADDRESS_SPACE,
            };
            if libc::setrlimit(libc::RLIMIT_CPU, &cpu) != 0
                || libc::setrlimit(libc::RLIMIT_AS, &mem) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().expect("spawn verlc");
    let start = Instant::now();
    let (stdout, stderr) = {
        let mut out = child.stdout.take().expect("stdout");
        let mut err = child.stderr.take().expect("stderr");
        let t_out = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut out, &mut s);
            s
        });
        let t_err = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = std::io::Read::read_to_string(&mut err, &mut s);
            s
        });
        loop {
            if child.try_wait().expect("wait").is_some() {
                break;
            }
            if start.elapsed() > HANG {
                let _ = child.kill();
                panic!("verlc {args:?} hung for {HANG:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        (
            t_out.join().unwrap_or_default(),
            t_err.join().unwrap_or_default(),
        )
    };
    let status = child.wait().expect("wait").code();
    Run {
        status,
        stdout,
        stderr,
    }
}

fn scratch() -> tempfile::TempDir {
    tempfile::tempdir().expect("tempdir")
}

fn quickstart() -> String {
    let p = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/..")).join("examples/quickstart.yaml");
    std::fs::read_to_string(p).expect("quickstart")
}

fn write(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).expect("write");
    p
}

fn mkfifo(p: &Path) {
    let c = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
}

#[test]
fn special_files_are_refused_without_reading() {
    let d = scratch();
    let dir = d.path();
    verlc(dir, &["check", "/dev/zero"], &[]).expect(2, &["/dev/zero", "not a regular file"]);
    std::os::unix::fs::symlink("/dev/zero", dir.join("z.yaml")).expect("symlink");
    write(dir, "d.yaml", "defaults:\n  - z\n  - _self_\n");
    verlc(dir, &["check", "d.yaml"], &[]).expect(2, &["z.yaml", "character device", "d.yaml:2"]);
    write(dir, "q.yaml", &quickstart());
    verlc(
        dir,
        &["check", "q.yaml", "--model-config", "/dev/zero"],
        &[],
    )
    .expect(2, &["/dev/zero", "not a regular file"]);
    mkfifo(&dir.join("p.yaml"));
    verlc(dir, &["check", "p.yaml"], &[]).expect(2, &["p.yaml", "FIFO"]);
    write(dir, "dp.yaml", "defaults:\n  - p\n  - _self_\n");
    verlc(dir, &["check", "dp.yaml"], &[]).expect(2, &["p.yaml", "FIFO", "dp.yaml:2"]);
    verlc(dir, &["check", "q.yaml", "--model-config", "p.yaml"], &[]).expect(2, &["FIFO"]);
    // The same for `explain` and in JSON.
    let r = verlc(dir, &["explain", "p.yaml", "--format", "json"], &[]);
    r.expect(2, &["Y005"]);
    let json: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON on stdout");
    assert_eq!(json[0]["file"], "p.yaml");
}

#[test]
fn oversized_files_are_refused_and_node_counts_bounded() {
    let d = scratch();
    let dir = d.path();
    let ones = |n: usize| format!("x: [{}]\n", vec!["1"; n].join(","));
    write(dir, "ten_mb.yaml", &ones(5_000_000));
    verlc(dir, &["check", "ten_mb.yaml"], &[]).expect(1, &["Y004", "ten_mb.yaml", "8388608"]);
    // Under the size limit, over the node limit: refused before it costs memory.
    write(dir, "five_mb.yaml", &ones(2_500_000));
    verlc(dir, &["check", "five_mb.yaml"], &[]).expect(1, &["Y004", "five_mb.yaml"]);
    // Several files under each limit, over the total.
    let mut defaults = String::from("defaults:\n");
    for j in 0..4 {
        write(
            dir,
            &format!("m{j}.yaml"),
            &format!("x{j}: [{}]\n", vec!["1"; 900_000].join(",")),
        );
        defaults.push_str(&format!("  - m{j}\n"));
    }
    write(dir, "multi.yaml", &format!("{defaults}  - _self_\n"));
    verlc(dir, &["check", "multi.yaml"], &[]).expect(1, &["Y004", "in all"]);
    // 450k unknown keys: a bounded report, not 450k messages.
    let keys: String = (0..450_000).map(|i| format!("k{i}: {i}\n")).collect();
    write(dir, "keys.yaml", &keys);
    let r = verlc(dir, &["check", "keys.yaml"], &[]);
    r.expect(1, &["more findings not shown"]);
    assert!(
        r.stderr.len() < 2 << 20,
        "{} bytes of output",
        r.stderr.len()
    );
}

#[test]
fn defaults_chains_are_bounded() {
    let d = scratch();
    let dir = d.path();
    // A linear chain of 4000 files (used to overflow the stack).
    for i in 0..4000 {
        write(
            dir,
            &format!("c{i}.yaml"),
            &format!("defaults:\n  - c{}\n  - _self_\n", i + 1),
        );
    }
    write(dir, "c4000.yaml", "trainer:\n  total_epochs: 1\n");
    verlc(dir, &["check", "c0.yaml"], &[]).expect(1, &["Y004", "nest deeper than 64"]);
    // Each file naming the next ten times: 10^8 expansions.
    for i in 0..8 {
        let entries: String = (0..10).map(|_| format!("  - r{}\n", i + 1)).collect();
        write(
            dir,
            &format!("r{i}.yaml"),
            &format!("defaults:\n{entries}  - _self_\n"),
        );
    }
    write(dir, "r8.yaml", "trainer:\n  total_epochs: 1\n");
    verlc(dir, &["check", "r0.yaml"], &[]).expect(1, &["Y004", "more than 5000 configs"]);
    // A diamond chain of 30 levels: 2^30 paths.
    for i in 0..30 {
        write(
            dir,
            &format!("f{i}.yaml"),
            &format!("defaults:\n  - f{0}\n  - g{0}\n  - _self_\n", i + 1),
        );
        write(
            dir,
            &format!("g{i}.yaml"),
            &format!("defaults:\n  - f{}\n  - _self_\n", i + 1),
        );
    }
    write(dir, "f30.yaml", "trainer:\n  total_epochs: 1\n");
    write(dir, "g30.yaml", "trainer:\n  total_epochs: 2\n");
    verlc(dir, &["check", "f0.yaml"], &[])
        .expect(1, &["Y004", "more than 5000 configs", ".yaml:1"]);
    // A package nested past the tree's depth.
    let pkg = vec!["a"; 100].join(".");
    write(
        dir,
        "pk.yaml",
        &format!("defaults:\n  - f30@{pkg}\n  - _self_\n"),
    );
    verlc(dir, &["check", "pk.yaml"], &[]).expect(1, &["Y004", "nests deeper"]);
}

#[test]
fn interpolation_output_is_bounded_in_total() {
    let d = scratch();
    let dir = d.path();
    let mut text = String::from("s0: abcdefgh\n");
    for i in 1..18 {
        text.push_str(&format!("s{i}: ${{s{0}}}${{s{0}}}\n", i - 1));
    }
    for j in 0..2000 {
        text.push_str(&format!("r{j}: ${{s17}}\n"));
    }
    write(dir, "interp.yaml", &text);
    verlc(dir, &["check", "interp.yaml"], &[]).expect(1, &["Y004", "bytes of text", "interp.yaml"]);
}

#[test]
fn environment_values_are_never_printed() {
    let d = scratch();
    let dir = d.path();
    write(dir, "q.yaml", &quickstart());
    let token = "hf_ThisIsNotARealToken0123456789";
    let env = [("MY_TOKEN", token)];
    let o = "trainer.nnodes=${oc.env:MY_TOKEN}";
    for args in [
        vec!["check", "q.yaml", o],
        vec!["check", "q.yaml", o, "--format", "json"],
        vec!["check", "q.yaml", o, "--print-config"],
        vec!["explain", "q.yaml", o, "--format", "json"],
        vec![
            "check",
            "q.yaml",
            "trainer.project_name=x${oc.env:MY_TOKEN}y",
            "--print-config",
        ],
        vec![
            "check",
            "q.yaml",
            "~trainer.project_name=${oc.env:MY_TOKEN}",
        ],
    ] {
        let r = verlc(dir, &args, &env);
        let out = r.out();
        assert!(!out.contains(token), "{args:?} printed the token:\n{out}");
        assert!(!out.contains("panicked"), "{out}");
    }
    // The S002 message names the interpolation instead.
    verlc(dir, &["check", "q.yaml", o], &env).expect(1, &["S002", "${oc.env:MY_TOKEN}"]);
    // From a file too.
    write(
        dir,
        "env.yaml",
        "trainer:\n  project_name: ${oc.env:MY_TOKEN}\n  nnodes: ${oc.env:MY_TOKEN}\n",
    );
    for format in ["json", "human"] {
        let r = verlc(
            dir,
            &["check", "env.yaml", "--print-config", "--format", format],
            &env,
        );
        r.expect(1, &["S002"]);
        assert!(!r.out().contains(token), "{}", r.out());
    }
}

#[test]
fn nonsense_is_not_silently_accepted() {
    let d = scratch();
    let dir = d.path();
    write(dir, "q.yaml", &quickstart());
    verlc(dir, &["check", "q.yaml", "--only", "V12"], &[]).expect(2, &["U001", "V12", "V012"]);
    // A model config.json that exists but cannot be used, named by the config.
    let model = dir.join("model");
    std::fs::create_dir(&model).expect("mkdir");
    let good = r#"{"model_type": "qwen2", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 2, "vocab_size": 1000}"#;
    for (bad, why) in [
        (
            good.replace("\"hidden_size\": 64", "\"hidden_size\": -1"),
            "-1",
        ),
        (
            good.replace("\"num_attention_heads\": 4", "\"num_attention_heads\": 0"),
            "is 0",
        ),
        (
            good.replace("\"vocab_size\": 1000", "\"vocab_size\": 99999999999"),
            "beyond",
        ),
        (
            good.replace("\"num_key_value_heads\": 2", "\"num_key_value_heads\": 3"),
            "multiple",
        ),
        ("{not json".to_string(), "not JSON"),
    ] {
        std::fs::write(model.join("config.json"), &bad).expect("write");
        let path = format!("actor_rollout_ref.model.path={}", model.display());
        verlc(dir, &["check", "q.yaml", &path], &[]).expect(
            1,
            &["S008", "config.json", why, "actor_rollout_ref.model.path"],
        );
        verlc(dir, &["explain", "q.yaml", &path], &[]).expect(1, &["S008"]);
    }
    std::fs::write(model.join("config.json"), good).expect("write");
    let path = format!("actor_rollout_ref.model.path={}", model.display());
    let r = verlc(dir, &["check", "q.yaml", &path, "--format", "json"], &[]);
    assert!(!r.stdout.contains("S008"), "{}", r.out());
    // Unknown search path schemes.
    write(
        dir,
        "sp.yaml",
        "hydra:\n  searchpath:\n    - http://example.invalid/conf\ndefaults:\n  - ppo_trainer\n  - _self_\n",
    );
    verlc(dir, &["check", "sp.yaml"], &[]).expect(1, &["unknown search path scheme", "sp.yaml:3"]);
    // Sizes whose products overflow.
    verlc(
        dir,
        &[
            "check",
            "q.yaml",
            "trainer.nnodes=4294967296",
            "trainer.n_gpus_per_node=4294967296",
        ],
        &[],
    )
    .expect(1, &["V053", "trainer.nnodes × trainer.n_gpus_per_node"]);
    let max = i64::MAX.to_string();
    verlc(
        dir,
        &[
            "check",
            "q.yaml",
            &format!("data.max_prompt_length={max}"),
            &format!("data.max_response_length={max}"),
        ],
        &[],
    )
    .expect(1, &["V053", "max_prompt_length + data.max_response_length"]);
}

#[test]
fn the_cli_contract_holds() {
    let d = scratch();
    let dir = d.path();
    write(dir, "q.yaml", &quickstart());
    verlc(dir, &["check", "q.yaml", "--base", "../../etc/passwd"], &[])
        .expect(2, &["U001", "--base"]);
    verlc(dir, &["check", "q.yaml", "q.yaml"], &[]).expect(2, &["U001", "one config file"]);
    let r = verlc(dir, &["check", "q.yaml", "q.yaml", "--format", "json"], &[]);
    r.expect(2, &[]);
    serde_json::from_str::<serde_json::Value>(&r.stdout).expect("usage errors are JSON too");
    verlc(dir, &["check", "q.yaml", "data.train_batch_size=64.0"], &[])
        .expect(1, &["S002", "data.train_batch_size", "override #1:1:23"]);
    // A missing defaults entry's file is I/O wherever it is named: exit 2 at both levels.
    verlc(dir, &["check", "missing.yaml"], &[]).expect(2, &["Y005", "missing.yaml"]);
    // `explain --format json` is JSON when the config has errors.
    let r = verlc(
        dir,
        &[
            "explain",
            "q.yaml",
            "data.train_batch_size=abc",
            "--format",
            "json",
        ],
        &[],
    );
    r.expect(1, &[]);
    let json: serde_json::Value = serde_json::from_str(&r.stdout).expect("JSON");
    assert_eq!(json[0]["code"], "S002");
    // `schema -o` replaces a symlinked output file instead of writing through it.
    let out = dir.join("schemas");
    std::fs::create_dir(&out).expect("mkdir");
    let victim = write(dir, "victim.txt", "keep");
    std::os::unix::fs::symlink(&victim, out.join("verl.schema.json")).expect("symlink");
    verlc(dir, &["schema", "-o", "schemas"], &[]).expect(0, &[]);
    assert_eq!(std::fs::read_to_string(&victim).expect("read"), "keep");
    assert!(
        !std::fs::symlink_metadata(out.join("verl.schema.json"))
            .expect("stat")
            .is_symlink()
    );
}

#[test]
fn yaml_text_follows_omegaconf() {
    let d = scratch();
    let dir = d.path();
    write(dir, "bom.yaml", &format!("\u{feff}{}", quickstart()));
    verlc(dir, &["check", "bom.yaml"], &[]).expect(0, &[]);
    write(dir, "nul.yaml", "trainer:\n  project_name: a\u{0}b\n");
    verlc(dir, &["check", "nul.yaml"], &[]).expect(1, &["Y001", "#x0000", "nul.yaml:2"]);
    write(dir, "ls.yaml", "trainer:\n  project_name: a\u{2028}b\n");
    verlc(dir, &["check", "ls.yaml"], &[]).expect(1, &["Y001", "U+2028", "ls.yaml:2"]);
    // Quoted, it is a character of the string (as in PyYAML).
    write(dir, "lsq.yaml", "trainer:\n  project_name: 'a\u{2028}b'\n");
    let r = verlc(dir, &["check", "lsq.yaml"], &[]);
    assert!(!r.out().contains("U+2028"), "{}", r.out());
}

#[test]
fn many_overrides_are_applied_in_near_linear_time() {
    let d = scratch();
    let dir = d.path();
    write(dir, "q.yaml", &quickstart());
    // 16k overrides within the CPU limit of a debug build: about 5 s on a 2-core AVX2 EPYC,
    // where a cost quadratic in their number (1 µs a pair) would take minutes.
    let overrides: Vec<String> = (0..16_000).map(|i| format!("++x.k{i}={i}")).collect();
    let mut args = vec!["check", "q.yaml"];
    args.extend(overrides.iter().map(String::as_str));
    verlc(dir, &args, &[]).expect(1, &["S001", "x"]);
}

/// `verlc migrate` reads its file as `check` does: special files and oversized files are
/// refused without reading them whole, text that is not YAML is a config error, and
/// `--write` through a symlink rewrites the file it points to (the link stays).
#[test]
fn migrate_reads_and_writes_through_the_bounded_paths() {
    let d = scratch();
    let dir = d.path();
    verlc(dir, &["migrate", "/dev/zero"], &[]).expect(2, &["/dev/zero", "not a regular file"]);
    let fifo = dir.join("fifo.yaml");
    mkfifo(&fifo);
    verlc(dir, &["migrate", "fifo.yaml"], &[]).expect(2, &["fifo.yaml", "FIFO"]);
    let big = format!("x: '{}'\n", "a".repeat(9 << 20));
    write(dir, "big.yaml", &big);
    verlc(dir, &["migrate", "big.yaml"], &[]).expect(1, &["big.yaml", "larger than"]);
    write(dir, "broken.yaml", "a: [\n");
    verlc(dir, &["migrate", "broken.yaml"], &[]).expect(1, &["broken.yaml"]);
    verlc(dir, &["migrate", "broken.yaml", "--format", "json"], &[]).expect(1, &["\"code\""]);

    let real = write(
        dir,
        "real.yaml",
        "actor_rollout_ref:\n  rollout:\n    skip_rollout: false\n",
    );
    std::os::unix::fs::symlink(&real, dir.join("link.yaml")).expect("symlink");
    verlc(dir, &["migrate", "link.yaml", "--write"], &[]).expect(0, &["rewritten"]);
    assert!(
        std::fs::symlink_metadata(dir.join("link.yaml"))
            .expect("link")
            .is_symlink(),
        "the link stays a link"
    );
    let text = std::fs::read_to_string(&real).expect("target");
    assert!(
        text.contains("skip:") && !text.contains("skip_rollout"),
        "the target is migrated:\n{text}"
    );
}

/// The overrides `verlc migrate` prints are shell words, one per line, joined by ` \`: a
/// list value stays one argument when pasted.
#[test]
fn migrated_overrides_paste_into_a_shell_as_the_same_arguments() {
    let d = scratch();
    let dir = d.path();
    let args = [
        "migrate",
        "data.train_files=['/a/x.parquet', '/b/y.parquet']",
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes=512",
        "trainer.experiment_name=it's mine",
    ];
    let r = verlc(dir, &args, &[]);
    r.expect(0, &["overrides:"]);
    let block: Vec<&str> = r
        .stdout
        .lines()
        .skip_while(|l| *l != "overrides:")
        .skip(1)
        .take_while(|l| l.starts_with("  "))
        .collect();
    assert_eq!(block.len(), 3, "{}", r.stdout);
    let script = format!("printf '%s\\n' \\\n{}", block.join("\n"));
    let out = Command::new("bash")
        .arg("-c")
        .arg(&script)
        .output()
        .expect("bash");
    let words: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(
        words,
        [
            "data.train_files=['/a/x.parquet', '/b/y.parquet']",
            "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=512",
            "trainer.experiment_name=it's mine",
        ],
        "{script}"
    );
    let json = verlc(dir, &[&args[..], &["--format", "json"]].concat(), &[]);
    json.expect(0, &[]);
    let v: serde_json::Value = serde_json::from_str(json.stdout.trim()).expect("one JSON object");
    assert_eq!(v["overrides"].as_array().map(Vec::len), Some(3), "{v}");
    assert_eq!(
        v["changes"][0]["from"],
        "actor_rollout_ref.rollout.update_weights_bucket_megabytes"
    );
}

/// `verlc explain --gpu-memory` says whether each trained role's per-rank estimate fits a GPU
/// of that size: a 7B model's GRPO update on one 80 GiB GPU does not, and the answer names the
/// keys that would fit it (in the JSON report too); offloaded it fits; a size that is no
/// number of GiB is a usage error.
#[test]
fn explain_says_whether_a_run_fits_a_gpu() {
    let dir = scratch();
    let model = dir.path().join("qwen2-7b");
    std::fs::create_dir_all(&model).unwrap();
    write(
        &model,
        "config.json",
        r#"{"model_type": "qwen2", "hidden_size": 3584, "num_attention_heads": 28,
        "num_key_value_heads": 4, "num_hidden_layers": 28, "vocab_size": 152064,
        "intermediate_size": 18944, "tie_word_embeddings": false}"#,
    );
    let path = format!("actor_rollout_ref.model.path={}", model.display());
    let qs = write(dir.path(), "quickstart.yaml", &quickstart())
        .display()
        .to_string();
    let base = [
        "explain",
        qs.as_str(),
        path.as_str(),
        "trainer.device=cuda",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=8",
        "--gpu-memory",
        "80",
    ];
    let r = verlc(dir.path(), &base, &[]);
    assert_eq!(r.status, Some(0), "{}", r.stderr);
    assert!(
        r.stdout
            .contains("GPU of 80 GiB: does not fit: the actor needs about")
            && r.stdout.contains("optimizer_offload=True"),
        "{}",
        r.stdout
    );
    let mut json = base.to_vec();
    json.extend(["--format", "json"]);
    let r = verlc(dir.path(), &json, &[]);
    let v: serde_json::Value = serde_json::from_str(&r.stdout).expect("json");
    assert_eq!(v["gpu_shortfall"]["role"], "actor");
    assert!(v["gpu_shortfall"]["need"].as_u64() > v["gpu_shortfall"]["have"].as_u64());
    let mut offloaded = base.to_vec();
    offloaded.extend([
        "actor_rollout_ref.actor.fsdp_config.optimizer_offload=True",
        "actor_rollout_ref.actor.fsdp_config.param_offload=True",
    ]);
    let r = verlc(dir.path(), &offloaded, &[]);
    assert!(r.stdout.contains("GPU of 80 GiB: fits"), "{}", r.stdout);
    let mut bad = base.to_vec();
    bad.pop();
    bad.push("0");
    let r = verlc(dir.path(), &bad, &[]);
    assert_eq!(r.status, Some(2), "{}{}", r.stdout, r.stderr);
    assert!(r.stderr.contains("--gpu-memory"), "{}", r.stderr);
}
