//! Tools in the Python host: verl's own `Gsm8kTool` (the installed verl 0.7.0, loaded without
//! its Ray-importing package root) from a tool config, `@function_tool` functions, and every
//! way a call can fail: an exception, a hang past the timeout, a crash; each gives the call
//! verl's error text and the next round runs on a fresh host.

use std::time::Duration;

use serde_json::json;
use std::time::Instant;
use verlc_runtime::rollout::agent::tools::{PythonTools, ToolSettings};
use verlc_runtime::rollout::agent::{Answer, FunctionCall, ToolOutcome, ToolRunner, UserReply};
use verlc_runtime::tokenizer::Message;

use crate::oracle;

const TOOL_CONFIG: &str = r#"tools:
  - class_name: verl.tools.gsm8k_tool.Gsm8kTool
    config:
      type: native
    tool_schema:
      type: function
      function:
        name: calc_gsm8k_reward
        description: A tool for calculating the reward of gsm8k
        parameters:
          type: object
          properties:
            answer:
              type: string
              description: The model's answer, digits
          required: ["answer"]
"#;

const FUNCTIONS: &str = r#"import os, time
from verl.tools.function_tool import function_tool

@function_tool
def add(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: the first
        b: the second
    """
    return str(a + b)

@function_tool("boom")
def explode(x: str) -> str:
    """Raise.

    Args:
        x: anything
    """
    raise RuntimeError("kaboom " + x)

@function_tool
def sleepy(seconds: float) -> str:
    """Sleep.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"

@function_tool
def crash(code: int) -> str:
    """Exit the process.

    Args:
        code: exit status
    """
    os._exit(code)
"#;

/// The tool outcomes of finished turns.
fn outcomes(done: Vec<(usize, Answer)>) -> Vec<(usize, Vec<ToolOutcome>)> {
    done.into_iter()
        .map(|(s, a)| match a {
            Answer::Tools(o) => (s, o),
            other => panic!("not a tool answer: {other:?}"),
        })
        .collect()
}

fn call(name: &str, args: serde_json::Value) -> FunctionCall {
    FunctionCall {
        name: name.into(),
        arguments: args.to_string(),
    }
}

#[test]
fn tools_run_and_every_failure_is_a_clear_outcome() {
    let dir = oracle::scratch("tool_host");
    std::fs::write(dir.join("tools.yaml"), TOOL_CONFIG).unwrap();
    std::fs::write(dir.join("functions.py"), FUNCTIONS).unwrap();
    let mut tools = PythonTools::start(ToolSettings {
        python: oracle::python().display().to_string(),
        tool_config: Some(dir.join("tools.yaml")),
        function_tools: Some(dir.join("functions.py")),
        interaction_config: None,
        startup_timeout: Duration::from_secs(60),
        call_timeout: Duration::from_secs(5),
    })
    .unwrap();
    assert_eq!(
        tools.names(),
        ["calc_gsm8k_reward", "add", "boom", "sleepy", "crash"]
    );
    let add = &tools.schemas()[1]["function"];
    assert_eq!(
        add["parameters"]["properties"]["a"]["type"],
        json!("integer")
    );
    tools.begin_batch(
        vec![
            serde_json::from_value(
                json!({"calc_gsm8k_reward": {"create_kwargs": {"ground_truth": "72"}}}),
            )
            .unwrap(),
        ],
        vec![None],
    );
    let out = tools.run(&[
        (0, call("calc_gsm8k_reward", json!({"answer": "72"}))),
        (0, call("calc_gsm8k_reward", json!({"answer": "71"}))),
        (0, call("add", json!({"a": 2, "b": 3}))),
        (0, call("boom", json!({"x": "y"}))),
        (0, call("nope", json!({}))),
    ]);
    let texts: Vec<&str> = out.iter().map(|o| o.text.as_str()).collect();
    assert_eq!(
        texts,
        vec![
            "Current parsed answer='72' reward=1.0",
            "Current parsed answer='71' reward=0.0",
            "5",
            "Error executing tool 'boom': kaboom y",
            "Unknown function 'nope'. Available tools: ['calc_gsm8k_reward', 'add', 'boom', 'sleepy', 'crash']",
        ]
    );
    // Gsm8kTool's step reward: 0 when the answer improved on a fresh instance, -0.05 not.
    assert_eq!(out[0].reward, Some(0.0));
    assert_eq!(out[1].reward, Some(-0.05));

    // Turns run concurrently and are collected as they finish: a slow call holds only its
    // own turn.
    let t = Instant::now();
    tools.submit(0, vec![call("sleepy", json!({"seconds": 2}))]);
    tools.submit(1, vec![call("add", json!({"a": 20, "b": 22}))]);
    let first = outcomes(tools.finished(true));
    let first_at = t.elapsed();
    assert_eq!(first.len(), 1, "{first:?}");
    assert_eq!((first[0].0, first[0].1[0].text.as_str()), (1, "42"));
    assert!(first_at < Duration::from_millis(1500), "{first_at:?}");
    assert!(
        tools.finished(false).is_empty(),
        "the slow turn is still running"
    );
    let second = outcomes(tools.finished(true));
    assert_eq!((second[0].0, second[0].1[0].text.as_str()), (0, "awake"));
    assert!(t.elapsed() >= Duration::from_secs(2));
    assert!(!second[0].1[0].failed);

    // A hang past the timeout: the host answers that call with a message that says so, and
    // keeps serving (the stuck function's thread is abandoned).
    let t = Instant::now();
    let out = tools.run(&[(0, call("sleepy", json!({"seconds": 60})))]);
    assert!(t.elapsed() < Duration::from_secs(30));
    assert!(out[0].failed);
    assert!(
        out[0]
            .text
            .starts_with("Error executing tool 'sleepy': timed out after 5 s"),
        "{}",
        out[0].text
    );
    assert_eq!(
        tools.run(&[(0, call("add", json!({"a": 1, "b": 1})))])[0].text,
        "2"
    );

    // A crash: the calls in flight fail saying so, and a fresh host answers the next round.
    let out = tools.run(&[(0, call("crash", json!({"code": 3})))]);
    assert!(
        out[0]
            .text
            .contains("Error executing tool 'crash': the process exited (exit status: 3)"),
        "{}",
        out[0].text
    );
    assert_eq!(
        tools.run(&[(0, call("add", json!({"a": 2, "b": 2})))])[0].text,
        "4"
    );
}

#[test]
fn a_tool_config_that_does_not_load_is_an_error_with_the_traceback() {
    let dir = oracle::scratch("tool_host_bad");
    std::fs::write(
        dir.join("tools.yaml"),
        "tools:\n  - class_name: no_such_module.Tool\n    config: {type: native}\n",
    )
    .unwrap();
    let err = PythonTools::start(ToolSettings {
        python: oracle::python().display().to_string(),
        tool_config: Some(dir.join("tools.yaml")),
        function_tools: None,
        interaction_config: None,
        startup_timeout: Duration::from_secs(60),
        call_timeout: Duration::from_secs(5),
    })
    .unwrap_err()
    .to_string();
    assert!(err.contains("No module named 'no_such_module'"), "{err}");
}

/// verl 0.7's own GSM8K interaction (a scripted user that checks the last assistant answer)
/// from an interaction config: started on first use with the sample's `interaction_kwargs`,
/// it rejects a wrong answer and ends the conversation on the right one; a sample without
/// `interaction_kwargs`, and an interaction that raises, are errors that say so.
#[test]
fn verls_gsm8k_interaction_answers_in_the_host() {
    let dir = oracle::scratch("tool_host_interaction");
    std::fs::write(
        dir.join("interaction.yaml"),
        "interaction:\n  - class_name: verl.interactions.gsm8k_interaction.Gsm8kInteraction\n    config: {}\n  - name: broken\n    class_name: broken_interaction.Broken\n    config: {}\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("broken_interaction.py"),
        "class Broken:\n    def __init__(self, config):\n        pass\n    async def start_interaction(self, instance_id, **kw):\n        return instance_id\n    async def generate_response(self, instance_id, messages, **kw):\n        raise RuntimeError('no reply today')\n",
    )
    .unwrap();
    let mut tools = PythonTools::start(ToolSettings {
        python: oracle::python().display().to_string(),
        tool_config: None,
        function_tools: None,
        interaction_config: Some(dir.join("interaction.yaml")),
        startup_timeout: Duration::from_secs(60),
        call_timeout: Duration::from_secs(5),
    })
    .unwrap();
    assert_eq!(tools.interactions(), ["gsm8k", "broken"]);
    let kwargs = |name: &str| {
        serde_json::from_value(json!({"name": name, "query": "q", "ground_truth": "72"})).ok()
    };
    tools.begin_batch(
        vec![Default::default(); 4],
        vec![kwargs("gsm8k"), kwargs("gsm8k"), None, kwargs("broken")],
    );
    let conversation = |answer: &str| vec![Message::user("q"), Message::assistant(answer)];
    tools.submit_reply(0, &conversation("The answer is #### 71"));
    tools.submit_reply(1, &conversation("The answer is #### 72"));
    tools.submit_reply(2, &conversation("#### 72"));
    tools.submit_reply(3, &conversation("#### 72"));
    let mut got = Vec::new();
    while got.len() < 4 {
        got.extend(tools.finished(true));
    }
    got.sort_by_key(|(s, _)| *s);
    let reply = |i: usize| match &got[i].1 {
        Answer::User(r) => r.clone(),
        other => panic!("{other:?}"),
    };
    assert_eq!(
        reply(0),
        Ok(UserReply {
            text: "Your response is incorrect! You need to reflect on your answer and try again."
                .into(),
            reward: Some(0.0),
            terminate: false,
        })
    );
    assert_eq!(
        reply(1),
        Ok(UserReply {
            text: "Your response is correct!".into(),
            reward: Some(1.0),
            terminate: true,
        })
    );
    let e = reply(2).unwrap_err();
    assert!(e.contains("no `extra_info.interaction_kwargs`"), "{e}");
    let e = reply(3).unwrap_err();
    assert!(e.contains("RuntimeError: no reply today"), "{e}");
}
