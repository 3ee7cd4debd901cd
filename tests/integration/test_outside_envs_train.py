"""Environments someone else wrote, in the trainer, with the tiny policy: `jaxcredit train --config
configs/openenv_echo.py` starts the OpenEnv server (examples/openenv_echo, openenv-core), trains an RL step on it and
stops it, and a run whose server is gone stops with one line and keeps what it wrote; `configs/mcp_calculator.py`
trains with the tools of an MCP server (examples/mcp_calculator). TRACE and CrEST credit both runs' exported
rollouts."""

import itertools
import os

import numpy as np
import pytest

from jaxcredit.envs import openenv
from jaxcredit.rollout import jsonl
from jaxcredit.train.commands import offline_credit
from jaxcredit.train.commands import trainer
from tests.fixtures.cli import run_cli
from tests.fixtures.tiny_run import ROOT, metrics_rows, tiny_run_config, tiny_run_overrides

pytest.importorskip("openenv.core.env_server.http_server", reason="openenv-core serves the test environment")
pytest.importorskip("mcp.server.mcpserver", reason="the mcp SDK serves the test tools")


@pytest.fixture
def alternating_rewards(monkeypatch):
  """The random tiny policy never says the word: episodes pay 1, 0, 1, 0, ... in creation order instead (the server
  still runs every step), so groups have a contrast to credit."""
  counter = itertools.count()
  init = openenv.OpenEnvEpisode.__init__

  def init_with_reward(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.test_reward = float(next(counter) % 2)

  monkeypatch.setattr(openenv.OpenEnvEpisode, "__init__", init_with_reward)
  monkeypatch.setattr(openenv.OpenEnvEpisode, "reward", lambda self: self.test_reward)


def test_train_on_a_server_the_run_starts_then_credit_its_rollouts(tiny, tmp_path, alternating_rewards):
  c = tiny_run_config("openenv_echo", tmp_path / "run", tiny, total_steps=1)
  c.env.openenv.cwd = ROOT
  c.env.openenv.log = str(tmp_path / "server.log")
  c.env.num_train_tasks = 4
  c.rollout.export_jsonl = True
  trainer.train(c)
  (row,) = metrics_rows(c.workdir, "rl")
  assert row["action_tokens"] > 0 and np.isfinite(row["loss"])
  assert row["env/openenv_errors"] == 0.0 and row["env/openenv_env_steps"] >= 1.0
  server = openenv._LAUNCHED[(c.env.openenv.command, ROOT)]
  assert not server.running()  # stopped when the run ended
  assert "Uvicorn running" in (tmp_path / "server.log").read_text()

  exported = jsonl.read_jsonl(os.path.join(c.workdir, "rollouts", "step_1.jsonl"))
  assert len(exported) == 4 and {r["reward"] for r in exported} == {0.0, 1.0}
  assert all(r["messages"][0]["content"].startswith("Reply with exactly one word: ") for r in exported)
  _credit_matches(c, exported, tmp_path)


def _credit_matches(c, exported, tmp_path):
  """TRACE and CrEST credit the exported rollouts from the file: finite, nonzero, and TRACE's the trainer's."""
  src = tmp_path / "in.jsonl"
  jsonl.write_jsonl(src, [{k: v for k, v in r.items() if k not in ("advantages", "turn_advantages")} for r in exported])
  for method in ("trace", "crest"):
    c.credit.method = method
    out = tmp_path / f"{method}.jsonl"
    offline_credit.credit_file(c, str(src), str(out))
    credited = {r["rollout_id"]: r for r in jsonl.read_jsonl(out)}
    for r in exported:
      adv = np.asarray(credited[r["rollout_id"]]["advantages"], float)
      assert np.isfinite(adv).all() and np.any(adv != 0)
      if method == "trace":  # the trainer's own advantages, recomputed from the file
        np.testing.assert_allclose(adv, r["advantages"], atol=2e-5, rtol=0)


def _serve(tmp_path, name: str):
  saved = os.getcwd()
  os.chdir(ROOT)
  try:
    return openenv.start_server(
      "{python} -m uvicorn server:app --app-dir examples/openenv_echo --host 127.0.0.1 --port {port} --log-level "
      + ("warning" if name == "first" else "info"),  # two commands: start_server keeps one server per command
      log=str(tmp_path / f"{name}.log"),
    )
  finally:
    os.chdir(saved)


def test_killing_the_server_mid_run_stops_it_with_one_line_and_a_new_server_resumes_it(tiny, tmp_path, monkeypatch):
  server = _serve(tmp_path, "first")
  step = openenv.OpenEnvEpisode.step
  made = itertools.count()
  init = openenv.OpenEnvEpisode.__init__

  def numbered(self, *args, **kwargs):
    init(self, *args, **kwargs)
    self.number = next(made)

  def kill_in_step_2(self, text):
    if self.number == 4 and self.info["turns"] == 0:  # step 1 made episodes 0-3: the first of step 2 kills it
      server.stop()
    return step(self, text)

  monkeypatch.setattr(openenv.OpenEnvEpisode, "__init__", numbered)
  monkeypatch.setattr(openenv.OpenEnvEpisode, "step", kill_in_step_2)
  work = tmp_path / "run"

  def train(url: str, steps: int):
    overrides = tiny_run_overrides(tiny.gguf_path, str(work), tiny.cache_dir, total_steps=steps, env__num_train_tasks=4)
    server_args = ["--config.env.openenv.command=", f"--config.env.openenv.url={url}"]
    return run_cli("train", "--config", "configs/openenv_echo.py", *server_args, *overrides)

  try:
    stopped = train(server.url, 2)
  finally:
    server.stop()
  assert stopped.returncode == 1, stopped.stderr
  lines = [line for line in stopped.stderr.splitlines() if line.strip()]
  assert lines[-1].startswith("jaxcredit train: error: all 4 episodes of this step failed on the OpenEnv server")
  assert "Traceback" not in stopped.stderr
  assert [r["step"] for r in metrics_rows(work, "rl")] == [1]  # step 1's row kept, step 2 not written
  assert any(name.isdigit() for name in os.listdir(work / "checkpoints"))

  monkeypatch.setattr(openenv.OpenEnvEpisode, "step", step)
  again = _serve(tmp_path, "second")  # another port: where the server runs may change on resume
  try:
    resumed = train(again.url, 2)
  finally:
    again.stop()
  assert resumed.returncode == 0, resumed.stderr
  assert "resum" in resumed.stdout, resumed.stdout
  assert [r["step"] for r in metrics_rows(work, "rl")] == [1, 2]


def test_train_with_the_tools_of_an_mcp_server_then_credit_its_rollouts(tiny, tmp_path, monkeypatch):
  from jaxcredit.envs import mcp_tools

  counter = itertools.count()
  monkeypatch.setattr(mcp_tools.McpToolsEpisode, "reward", lambda self: float(next(counter) % 2))
  step = mcp_tools.McpToolsEpisode.step

  def first_turn_calls_add(self, text):
    """The random policy writes no call: its first message is replaced by one, which the live server answers."""
    if self.info["turns"] == 0:
      text = '<tool_call>\n{"name": "add", "arguments": {"a": 20, "b": 22}}\n</tool_call>'
    return step(self, text)

  monkeypatch.setattr(mcp_tools.McpToolsEpisode, "step", first_turn_calls_add)
  monkeypatch.chdir(ROOT)
  c = tiny_run_config("mcp_calculator", tmp_path / "run", tiny, total_steps=1)
  c.env.num_train_tasks = 4
  c.sampling.max_len = 1536  # the tiny byte-level vocabulary: the tool list alone is about 1,200 tokens
  c.rollout.export_jsonl = True
  trainer.train(c)
  (row,) = metrics_rows(c.workdir, "rl")
  assert row["action_tokens"] > 0 and np.isfinite(row["loss"]) and row["tool_calls"] == 1.0
  exported = jsonl.read_jsonl(os.path.join(c.workdir, "rollouts", "step_1.jsonl"))
  assert len(exported) == 4 and {r["reward"] for r in exported} == {0.0, 1.0}
  assert all(r["messages"][3] == {"role": "tool", "content": "<tool_response>42</tool_response>"} for r in exported)
  system = exported[0]["messages"][0]["content"]
  assert '"name": "add"' in system and '"name": "divide"' in system
  assert exported[0]["tools"] and {t["function"]["name"] for t in exported[0]["tools"]} == {"add", "multiply", "divide"}
  _credit_matches(c, exported, tmp_path)
