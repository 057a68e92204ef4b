//! verl 0.9's asynchronous trainers: the replay-buffer loop with a rollout thread beside the
//! trainer (`colocate_async`) or a rollout replica process per rank (`separate_async`). On
//! policy (threshold 1, `wait`, no warm-up) each is the synchronous trainer's run step for
//! step; with a bound and warm-up, no trained group is older than the bound allows, and the
//! staleness metrics say how old they were.

use verlc_front::load::version::BuiltinRelease;
use verlc_runtime::engine::Metrics;

use crate::support::{quiet, scratch, series, small_grpo_on};

const ASYNC: &str = "trainer.v1.trainer_mode=colocate_async";

/// colocate_async on policy.
const COLOCATE_ON_POLICY: &[&str] = &[
    ASYNC,
    "trainer.v1.colocate_async.num_warmup_batches=0",
    "trainer.v1.sampler.max_off_policy_threshold=1",
    "trainer.v1.sampler.max_off_policy_strategy=wait",
];

/// separate_async on policy: one mini-batch update per weight sync (the step's whole batch,
/// as the synchronous run below updates), the pool one replica process beside the rank.
const SEPARATE_ON_POLICY: &[&str] = &[
    "trainer.v1.trainer_mode=separate_async",
    "trainer.v1.separate_async.parameter_sync_step=1",
    "trainer.v1.separate_async.num_warmup_batches=0",
    "trainer.v1.sampler.max_off_policy_threshold=1",
    "trainer.v1.sampler.max_off_policy_strategy=wait",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
];

/// The tiny Qwen2.5-VL reading `color_digits` pictures.
const PICTURES: &[&str] = &[
    "actor_rollout_ref.model.path='builtin://tiny?layers=2&hidden=64&heads=4&kv_heads=2&arch=qwen2_5_vl'",
    "data.train_files='builtin://color_digits?split=train&size=32&stripes=1'",
    "data.val_files='builtin://color_digits?split=test&size=8&stripes=1'",
];

fn run(tag: &str, steps: u64, extra: &[&str]) -> Vec<(u64, Metrics)> {
    let dir = scratch(tag);
    let mut o = vec!["actor_rollout_ref.rollout.n=4"];
    o.extend_from_slice(extra);
    let cfg = small_grpo_on(&dir, steps, &o, BuiltinRelease::V0_9_1);
    verlc_runtime::trainer::run(&cfg, &quiet())
        .expect("training runs")
        .history
}

#[test]
fn colocate_async_on_policy_is_the_synchronous_run() {
    on_policy_is_the_synchronous_run("async", COLOCATE_ON_POLICY, &[]);
}

/// A vision-language model: the rollout thread generates each queued batch with its prompts'
/// images, whose rows carry them into the update; on policy the run is the synchronous one
/// step for step.
#[test]
fn colocate_async_on_policy_with_images_is_the_synchronous_run() {
    on_policy_is_the_synchronous_run("async_vl", COLOCATE_ON_POLICY, PICTURES);
}

/// separate_async's built-in pool: the rank's replica process generates each batch (its
/// prompts' images sent along) with the weights the rank pushed; on policy the run is the
/// synchronous one step for step, for a text model and a vision-language one, and with two
/// replicas splitting each batch.
#[test]
fn separate_async_with_replica_processes_on_policy_is_the_synchronous_run() {
    let whole_batch = ["actor_rollout_ref.actor.ppo_mini_batch_size=8"];
    on_policy_is_the_synchronous_run("separate", SEPARATE_ON_POLICY, &whole_batch);
    let mut two = SEPARATE_ON_POLICY.to_vec();
    two.push("actor_rollout_ref.rollout.n_gpus_per_node=2");
    on_policy_is_the_synchronous_run("separate_two", &two, &whole_batch);
    let mut vl = whole_batch.to_vec();
    vl.extend_from_slice(PICTURES);
    on_policy_is_the_synchronous_run("separate_vl", SEPARATE_ON_POLICY, &vl);
}

/// With threshold 1, `wait` and no warm-up, the asynchronous `mode` with `extra` runs what the
/// synchronous trainer does, step for step.
fn on_policy_is_the_synchronous_run(tag: &str, mode: &[&str], extra: &[&str]) {
    let mut on_policy = mode.to_vec();
    on_policy.extend_from_slice(extra);
    let steps = 4;
    let sync = run(&format!("{tag}_sync"), steps, extra);
    let asynchronous = run(&format!("{tag}_on_policy"), steps, &on_policy);
    for key in [
        "critic/score/mean",
        "actor/pg_loss",
        "actor/grad_norm",
        "response_length/mean",
    ] {
        let (a, b) = (series(&sync, key), series(&asynchronous, key));
        assert_eq!(a.len(), steps as usize, "{key}");
        assert_eq!(a, b, "{key}: sync vs {mode:?} on policy");
    }
    let staleness = series(
        &asynchronous,
        "training/off_policy/trajectory_staleness/max",
    );
    assert_eq!(staleness, vec![0.0; steps as usize]);
}

#[test]
fn colocate_async_trains_nothing_older_than_the_bound() {
    let k = 2;
    let threshold = format!("trainer.v1.sampler.max_off_policy_threshold={k}");
    let steps = 6;
    let h = run(
        "async_bound",
        steps,
        &[
            ASYNC,
            "trainer.v1.colocate_async.num_warmup_batches=2",
            &threshold,
            "trainer.v1.sampler.max_off_policy_strategy=drop",
        ],
    );
    let staleness = series(&h, "training/off_policy/trajectory_staleness/max");
    assert_eq!(staleness.len(), steps as usize);
    assert!(
        staleness.iter().all(|&s| s <= (k - 1) as f64),
        "{staleness:?}"
    );
    assert!(
        staleness.iter().any(|&s| s > 0.0),
        "warm-up makes some groups older: {staleness:?}"
    );
    // Partial rollout: a trajectory whose batch was being decoded when the trainer sampled
    // continues with the next step's weights, so it spans versions; even its oldest token is
    // within the bound (queued at step s, it began with weights no older than s - 1).
    let worst = series(&h, "training/off_policy/trajectory_staleness_worst/max");
    let spans = series(&h, "training/off_policy/trajectory_spans/min");
    assert!(
        worst
            .iter()
            .zip(&staleness)
            .all(|(&w, &s)| w >= s && w <= (k - 1) as f64),
        "{worst:?} {staleness:?}"
    );
    assert!(spans.iter().all(|&s| s >= 1.0), "{spans:?}");
    let waited = series(&h, "timing_s/async_rollout_wait_weights");
    assert_eq!(waited.len(), steps as usize);
    assert!(waited.iter().all(|&w| w >= 0.0), "{waited:?}");
    // Two warm-up batches against a threshold of 2: groups queued at step 1 and still
    // untrained at step 3 are evicted (and refilled).
    let evicted = series(&h, "training/off_policy/evicted_samples");
    assert!(!evicted.is_empty(), "nothing was evicted");
}

/// A checkpoint of the asynchronous loop resumes: the run continues from the saved step with
/// an empty buffer (the groups queued before the checkpoint are not restored) and refills it
/// with its warm-up.
#[test]
fn colocate_async_resumes_from_a_checkpoint() {
    let dir = scratch("async_resume");
    let cfg = |steps: u64| {
        small_grpo_on(
            &dir,
            steps,
            &[
                "actor_rollout_ref.rollout.n=4",
                ASYNC,
                "trainer.save_freq=2",
                "trainer.resume_mode=auto",
            ],
            BuiltinRelease::V0_9_1,
        )
    };
    let first = verlc_runtime::trainer::run(&cfg(4), &quiet()).expect("first run");
    assert_eq!(first.history.len(), 4);
    let resumed = verlc_runtime::trainer::run(&cfg(6), &quiet()).expect("resumed run");
    assert_eq!(resumed.resumed_from, 4);
    let steps: Vec<u64> = resumed.history.iter().map(|(s, _)| *s).collect();
    assert_eq!(steps, vec![5, 6]);
    let staleness = series(
        &resumed.history,
        "training/off_policy/trajectory_staleness/max",
    );
    assert_eq!(staleness.len(), 2);
    // The warm-up batch was generated by the resumed weights (version 4) and trains at step 5.
    assert_eq!(staleness[0], 0.0);
}

/// DAPO's group filter in the asynchronous loop: groups whose reward is the same for every
/// response are evicted and replaced; when no group ever varies, `max_num_gen_batches` ends the
/// step with an error instead of refilling forever.
#[test]
fn colocate_async_filters_flat_groups_and_stops_when_none_varies() {
    let dir = scratch("async_dapo");
    let reward = crate::support::repo().join("runtime/tests/trainer/fixtures/reward_dapo.py");
    let path = format!("reward.custom_reward_function.path={}", reward.display());
    let filter = [
        "algorithm.filter_groups.enable=true",
        "algorithm.filter_groups.metric=reward",
        "algorithm.filter_groups.max_num_gen_batches=3",
    ];
    let mut o = vec![ASYNC, path.as_str()];
    o.extend(filter);
    let h = run("async_dapo_learns", 3, &o);
    let filtered = series(&h, "training/filter_groups/evicted_samples");
    assert!(
        filtered.iter().sum::<f64>() >= 4.0,
        "half the prompts score flat: {filtered:?}"
    );
    o.push("+reward.custom_reward_function.reward_kwargs={constant: true}");
    let cfg = small_grpo_on(
        &dir,
        1,
        &[&["actor_rollout_ref.rollout.n=4"], o.as_slice()].concat(),
        BuiltinRelease::V0_9_1,
    );
    let err = verlc_runtime::trainer::run(&cfg, &quiet())
        .expect_err("no group ever varies")
        .to_string();
    assert!(err.contains("max_num_gen_batches=3"), "{err}");
}

/// The tool agent loop runs in the rollout thread: multi-turn rollouts with tool calls are
/// generated beside the trainer and trained on, with verl's turn and tool metrics.
#[test]
fn colocate_async_runs_the_tool_agent_loop_in_its_rollout_thread() {
    let tools = crate::support::repo().join("tests/fixtures/tools/local_code.py");
    let tools = format!(
        "++actor_rollout_ref.rollout.multi_turn.function_tool_path={}",
        tools.display()
    );
    let h = run(
        "async_agent",
        2,
        &[
            ASYNC,
            "trainer.v1.colocate_async.num_warmup_batches=1",
            "actor_rollout_ref.rollout.multi_turn.enable=true",
            "actor_rollout_ref.rollout.agent.default_agent_loop=tool_agent",
            &tools,
            "actor_rollout_ref.rollout.n=2",
            "data.train_batch_size=4",
        ],
    );
    let turns = series(&h, "num_turns/mean");
    assert_eq!(turns.len(), 2, "num_turns is logged every step");
    assert!(turns.iter().all(|&t| t >= 2.0), "{turns:?}");
    assert_eq!(series(&h, "tool_calls/mean").len(), 2);
    assert_eq!(series(&h, "actor/pg_loss").len(), 2);
}

/// separate_async's replica process failing: one that cannot start, and one killed while the
/// run uses it, each end the run with an error naming the replica, never a hang.
#[test]
fn separate_async_ends_with_an_error_when_its_replica_process_dies() {
    use std::time::{Duration, Instant};
    use verlc_runtime::workers::rollout_pool::ReplicaCommand;
    let spec = |tag: &str, steps: u64| {
        let mut o = vec![
            "actor_rollout_ref.rollout.n=4",
            "actor_rollout_ref.actor.ppo_mini_batch_size=8",
        ];
        o.extend_from_slice(SEPARATE_ON_POLICY);
        small_grpo_on(&scratch(tag), steps, &o, BuiltinRelease::V0_9_1)
    };
    let opts = verlc_runtime::trainer::RunOptions {
        rollout_replica: Some(ReplicaCommand::new("/bin/false".into(), Vec::new())),
        ..quiet()
    };
    let err = verlc_runtime::trainer::run(&spec("separate_no_replica", 2), &opts)
        .expect_err("a replica that exits at once")
        .to_string();
    eprintln!("a replica that exits at once: {err}");
    assert!(
        err.contains("rollout replica process") && err.contains("exited"),
        "{err}"
    );
    // One that connects and never answers: the wait ends at the timeout.
    let hung = "import os, socket, time\ns = socket.socket(socket.AF_UNIX)\ns.connect(os.environ['VERLC_ROLLOUT_REPLICA'])\ntime.sleep(120)\n";
    let opts = verlc_runtime::trainer::RunOptions {
        rollout_replica: Some(ReplicaCommand {
            answer_timeout: Duration::from_secs(2),
            ..ReplicaCommand::new("python3".into(), vec!["-c".into(), hung.into()])
        }),
        ..quiet()
    };
    let start = Instant::now();
    let err = verlc_runtime::trainer::run(&spec("separate_hung_replica", 2), &opts)
        .expect_err("a replica that never answers")
        .to_string();
    eprintln!("a replica that never answers: {err}");
    assert!(err.contains("did not answer within 2 s"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(60));
    // Killed once it has run for a moment (starting, syncing or generating: each must end
    // the run with an error). Its command line carries a mark of its own (an extra libtest
    // filter, which matches nothing): other tests of this binary run replicas of the same
    // parent meanwhile, and killing one of theirs left this run to go on.
    const MARK: &str = "separate_killed_replica_mark";
    let mut marked = crate::support::replica_command();
    marked.args.push(MARK.into());
    let me = std::process::id();
    let killer = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(120);
        while Instant::now() < deadline {
            if let Some(pid) = replica_child_of(me, MARK) {
                std::thread::sleep(Duration::from_millis(300));
                // SAFETY: kill sends a signal to the replica process this test's run started.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    });
    let start = Instant::now();
    let opts = verlc_runtime::trainer::RunOptions {
        rollout_replica: Some(marked),
        ..quiet()
    };
    let err = verlc_runtime::trainer::run(&spec("separate_killed_replica", 500), &opts)
        .expect_err("the replica was killed")
        .to_string();
    eprintln!("a replica killed during the run: {err}");
    assert!(
        killer.join().expect("killer thread"),
        "the replica was found"
    );
    assert!(err.contains("rollout replica process"), "{err}");
    assert!(start.elapsed() < Duration::from_secs(120));
}

/// The pid of a rollout replica process (this test binary serving) whose parent is `parent` and
/// whose command line holds `mark`.
fn replica_child_of(parent: u32, mark: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
        // The parent pid is the second field after the command's closing parenthesis.
        let ppid: u32 = stat
            .rsplit_once(')')?
            .1
            .split_whitespace()
            .nth(1)?
            .parse()
            .ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let cmdline = String::from_utf8_lossy(&cmdline);
        (ppid == parent && cmdline.contains("rollout_replica_child") && cmdline.contains(mark))
            .then_some(pid)
    })
}

/// separate_async's partial rollout on the replica processes: weights the rank publishes while
/// its replicas generate are sent on to them, each takes them between two tokens (the rows it
/// is decoding prefilled again with them) and acknowledges them; a replica that had already
/// answered binds them after. Two replicas here, every row running to the length limit.
#[test]
fn replicas_take_weights_published_while_they_generate() {
    use tch::{Device, Tensor};
    use verlc_runtime::model::{Dtype, from_pretrained};
    use verlc_runtime::rollout::{PromptStream, RowVersions, SamplingParams, StopTokens};
    use verlc_runtime::workers::rollout_pool::{RankPool, ReplicaPlace};

    let load = |seed| {
        from_pretrained(
            "builtin://tiny?layers=2&hidden=64",
            Device::Cpu,
            Dtype::Fp32,
            seed,
        )
        .expect("tiny model")
    };
    let (old, new) = (load(3), load(4));
    let weights = |vs: &tch::nn::VarStore| -> Vec<(String, Tensor)> {
        let mut all: Vec<_> = vs.variables().into_iter().collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    };
    let place = ReplicaPlace {
        device: Device::Cpu,
        threads: 1,
    };
    let pool = RankPool::start(
        &crate::support::replica_command(),
        &old.config,
        Dtype::Fp32,
        &[place, place],
    )
    .expect("two replicas");
    let prompts: Vec<Vec<i64>> = (0..4).map(|i| vec![4 + i, 5, 6]).collect();
    let streams = PromptStream::consecutive(11, 0, prompts.len());
    let params = SamplingParams {
        max_new_tokens: 128,
        n: 2,
        temperature: 1.2,
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let stop = StopTokens {
        eos: vec![2],
        pad: 0,
    };
    let generate = |pool: &RankPool| {
        pool.generate(&prompts, &[], &streams, &params, &stop)
            .expect("generate")
    };
    let rows = |t: &Tensor| Vec::<Vec<i64>>::try_from(t).expect("rows");
    pool.update_weights(&weights(&old.vs)).expect("sync");
    let with_old = generate(&pool);
    pool.update_weights(&weights(&new.vs)).expect("sync");
    let with_new = generate(&pool);
    pool.update_weights(&weights(&old.vs)).expect("sync");

    // The old weights published again mid-call: the same tokens, every row continued by the
    // replica with version 7 (the sync reaches it long before its 128th token).
    let mut once = Some((7, weights(&old.vs)));
    let same = pool
        .generate_swapping(&prompts, &[], &streams, &params, &stop, &mut || {
            Ok(once.take())
        })
        .expect("generate while weights change");
    assert_eq!(rows(&same.responses), rows(&with_old.responses));
    let continued = RowVersions {
        first: None,
        last: Some(7),
    };
    assert_eq!(same.versions, vec![continued; 8]);
    // Every acknowledgement was read: the next call is answered as usual.
    assert_eq!(rows(&generate(&pool).responses), rows(&with_old.responses));

    // New weights mid-call: the rows continue with them, and afterwards every replica has them.
    let mut once = Some((8, weights(&new.vs)));
    let swapped = pool
        .generate_swapping(&prompts, &[], &streams, &params, &stop, &mut || {
            Ok(once.take())
        })
        .expect("generate while weights change");
    assert!(swapped.versions.iter().all(|v| v.last == Some(8)));
    assert_ne!(rows(&swapped.responses), rows(&with_old.responses));
    assert_eq!(rows(&generate(&pool).responses), rows(&with_new.responses));
}
