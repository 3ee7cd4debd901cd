"""The OpenEnv environment (jaxcredit/envs/openenv.py) against a real OpenEnv server: examples/openenv_echo served by
openenv-core's `create_app` under uvicorn, started the way a run starts it (`openenv.start_server`)."""

import os
import sys

import pytest

from jaxcredit.envs import make_env_spec, openenv, spec
from tests.fixtures.tiny_run import ROOT

pytest.importorskip("openenv.core.env_server.http_server", reason="openenv-core serves the test environment")

COMMAND = "{python} -m uvicorn server:app --app-dir examples/openenv_echo --host 127.0.0.1 --port {port}"
WORDS = ("apple", "river", "stone", "cloud", "green", "light", "music", "table", "paper", "house", "tiger", "bread")


@pytest.fixture(scope="module")
def server():
  saved = os.getcwd()
  os.chdir(ROOT)
  try:
    process = openenv.start_server(COMMAND, startup_timeout_s=120)
  finally:
    os.chdir(saved)
  yield process
  process.stop()


def _node(**settings):
  node = dict(openenv.CONFIG_DEFAULTS)
  node.update(prompt_field="prompt", gold_field="answer", observation_field="feedback", max_turns=2)
  node.update(settings)
  return openenv_node(node)


def openenv_node(values: dict):
  import ml_collections

  return ml_collections.ConfigDict({"name": "openenv", "openenv": values})


def test_tasks_read_their_prompt_and_gold_answer_from_a_reset(server):
  env = make_env_spec(_node(url=server.url))
  train = env.make_tasks("train", 5, 2)
  held_out = env.make_tasks("eval", 3, None)
  seeds = [t.reset_kwargs["seed"] for t in train]
  assert seeds == [2 * openenv.TRAIN_SEED_STRIDE + k for k in range(5)]
  assert [t.reset_kwargs["seed"] for t in held_out] == [1_000_000_000 + k for k in range(3)]
  for t in train + held_out:
    word = WORDS[t.reset_kwargs["seed"] % len(WORDS)]
    assert t.prompt == f"Reply with exactly one word: {word}" and t.gold == word
    assert env.initial_messages(t) == [{"role": "user", "content": t.prompt}]
    assert env.gold_answer_text(t) == word and word in env.privileged_info(t)
  assert [t.task_id for t in held_out] == ["eval/0", "eval/1", "eval/2"]
  assert env.make_tasks("train", 5, 2) == train  # the same tasks for the same seed


def test_tasks_files_give_reset_arguments(server, tmp_path):
  (tmp_path / "train.jsonl").write_text('{"seed": 7}\n\n{"seed": 8}\n')
  (tmp_path / "eval.jsonl").write_text('{"seed": 1}\n')
  env = make_env_spec(
    _node(url=server.url, tasks=str(tmp_path / "train.jsonl"), eval_tasks=str(tmp_path / "eval.jsonl"))
  )
  assert [t.gold for t in env.make_tasks("train", 2, 0)] == ["table", "paper"]
  assert [t.gold for t in env.make_tasks("eval", 1, None)] == ["river"]
  with pytest.raises(ValueError, match=r"config.env.openenv.eval_tasks=.*has 1 tasks; 2 eval tasks were asked"):
    env.make_tasks("eval", 2, None)
  (tmp_path / "bad.jsonl").write_text('{"seed": 1}\n[1, 2]\n')
  bad = make_env_spec(_node(url=server.url, tasks=str(tmp_path / "bad.jsonl"), eval_tasks=str(tmp_path / "eval.jsonl")))
  with pytest.raises(ValueError, match="bad.jsonl, line 2: a task is a JSON object"):
    bad.make_tasks("train", 1, 0)


def test_an_episode_runs_on_the_server_and_pays_its_reward(server):
  env = make_env_spec(_node(url=server.url))
  task = env.make_tasks("train", 1, 0)[0]  # seed 0: "apple"
  right = env.make_env(task)
  result = right.step("Apple.")
  assert result.done and right.reward() == 1.0 and env.is_success(right.reward())
  assert result.info["finish"] == "done" and result.info["answered"] and result.info["env_steps"] == 1
  assert right.session._ws is None  # closed at done: the server frees the session

  wrong = env.make_env(task)
  first = wrong.step("pear")
  assert not first.done and first.observation == "Not quite. Reply with exactly one word: apple"
  assert first.role == "tool"
  second = wrong.step("plum")
  assert second.done and wrong.reward() == 0.0 and second.info["turns"] == 2 and second.info["tool_calls"] == 2
  metrics = env.metrics([right, wrong])
  assert metrics == {"openenv_errors": 0.0, "openenv_env_steps": 1.5}


def test_a_server_failure_ends_the_episode_with_its_reason(server):
  env = make_env_spec(_node(url=server.url, action_field="text"))  # the server's action has no field "text"
  episode = env.make_env(env.make_tasks("train", 1, 0)[0])
  result = episode.step("apple")
  assert result.done and result.info["finish"] == openenv.ENV_ERROR and episode.reward() == 0.0
  assert "step: the server answered an error" in result.info["env_error"]
  assert result.info["tool_errors"] == 1
  with pytest.raises(spec.EnvironmentUnavailable, match="all 1 episodes of this step failed on the OpenEnv server"):
    env.metrics([episode])


def test_a_reset_that_does_not_reproduce_the_task_stops_the_run(server):
  env = make_env_spec(_node(url=server.url))
  task = env.make_tasks("train", 1, 0)[0]
  moved = openenv.OpenEnvTask(task.task_id, task.reset_kwargs, "Reply with exactly one word: pear", "pear")
  with pytest.raises(spec.EnvironmentUnavailable, match="reset is not reproducible"):
    env.make_env(moved).step("pear")


def test_killing_the_server_ends_open_episodes_and_refuses_new_tasks(tmp_path):
  saved = os.getcwd()
  os.chdir(ROOT)
  try:
    own = openenv.start_server(COMMAND + " --log-level warning", log=str(tmp_path / "server.log"))
  finally:
    os.chdir(saved)
  try:
    env = make_env_spec(_node(url=own.url))
    tasks = env.make_tasks("train", 2, 0)
    alive, other = env.make_env(tasks[0]), env.make_env(tasks[1])
    assert not alive.step("pear").done and not other.step("pear").done
    own.stop()
    ended = alive.step("apple")
    assert ended.done and ended.info["finish"] == openenv.ENV_ERROR and alive.reward() == 0.0
    assert "step failed" in ended.info["env_error"] or "no answer" in ended.info["env_error"]
    with pytest.raises(spec.EnvironmentUnavailable, match="reading the train tasks' prompts from the OpenEnv server"):
      env.make_tasks("train", 1, 0)
  finally:
    own.stop()


@pytest.mark.parametrize(
  ("settings", "match"),
  [
    (dict(url="", command=""), "set exactly one of url"),
    (dict(url="http://127.0.0.1:1", command="x"), "set exactly one of url"),
    (dict(url="ftp://host"), "expected http://host:port or ws://host:port"),
    (dict(url="http://127.0.0.1:1", reward="max"), r"config.env.openenv.reward='max'"),
    (dict(url="http://127.0.0.1:1", observation_role="system"), "observation_role"),
    (dict(url="http://127.0.0.1:1", max_turns=0), "config.env.openenv.max_turns must be >= 1"),
    (dict(url="http://127.0.0.1:1", timeout_s=0.0), "config.env.openenv.timeout_s must be > 0"),
    (dict(url="http://127.0.0.1:1", tasks="a.jsonl"), "tasks .train. and eval_tasks .held-out. are given together"),
  ],
)
def test_bad_settings_are_refused_by_name(settings, match):
  with pytest.raises(ValueError, match=match):
    make_env_spec(_node(**settings))


def test_a_command_that_does_not_serve_is_refused_with_its_log(tmp_path):
  with pytest.raises(spec.EnvironmentUnavailable, match=r"(?s)exited with code 3 while starting.*going away"):
    openenv.start_server(
      f"{sys.executable} -c \"print('going away'); raise SystemExit(3)\"",
      log=str(tmp_path / "log"),
      startup_timeout_s=30,
    )


def test_methods_that_need_a_gold_answer_are_refused_without_one():
  from jaxcredit.train.loop import run as run_lib
  from jaxcredit.train.config import base_config

  c = base_config()
  c.env.name = "openenv"
  without = spec.EnvSpec(
    make_tasks=None, make_env=None, initial_messages=None, stop_strings=(), max_turns=1, is_success=bool,
    demonstration=None, gold_answer_text=None, privileged_info=None,
  )  # fmt: skip
  for method in ("grpo", "rloo", "gigpo", "drgrpo"):
    c.credit.method = method
    run_lib.check_env_fields(c, without)
  for method, needed in (("trace", "gold_answer_text"), ("crest", "gold_answer_text"), ("gear", "privileged_info")):
    c.credit.method = method
    with pytest.raises(ValueError, match=rf"config.credit.method='{method}' runs the pass '\w+', which needs the "
                       rf"environment's {needed}.*methods that need none: .*grpo"):  # fmt: skip
      run_lib.check_env_fields(c, without)
