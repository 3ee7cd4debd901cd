"""The paper-scale configs (configs/paper/): each validates, states its pod, and (slow) compiles deviceless for
that pod with `jaxcredit plan`, the whole RL step fitting in HBM."""

import glob
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from jaxcredit.train import config as config_lib
from jaxcredit.train.commands import plan
from tests.fixtures.tiny_run import load_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PAPER_CONFIGS = sorted(glob.glob(os.path.join(ROOT, "configs", "paper", "*.py")))


def _load(path):
  return load_config(os.path.splitext(os.path.basename(path))[0], os.path.dirname(path))


def test_every_method_of_the_papers_has_a_config():
  methods = {_load(p).credit.method for p in PAPER_CONFIGS}
  assert methods == {"trace", "crest", "toolopd", "hsd", "gear"}
  models = {_load(p).model.source for p in PAPER_CONFIGS if _load(p).credit.method == "trace"}
  assert models == {"Qwen/Qwen3-4B", "Qwen/Qwen3-30B-A3B"}


@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=os.path.basename)
def test_a_paper_config_validates_and_states_its_pod(path):
  c = _load(path)
  config_lib.validate(c)
  _, chips = plan.parse_topology(c.plan.topology)
  mesh = plan.parse_mesh(c.plan.mesh)
  assert chips % max(1, mesh.get("fsdp", 1) * mesh.get("expert", 1) * mesh.get("tensor", 1)) == 0
  rollouts = c.rollout.prompts_per_step * c.rollout.group_size
  assert c.plan.batch_size == rollouts and c.plan.seq_len == c.sampling.max_len
  assert rollouts % (chips * c.train.num_micro_batches // mesh.get("tensor", 1)) == 0
  assert c.model.param_dtype == "float32" and c.model.compute_dtype == "bfloat16"
  assert plan.model_config_for(c.model.source, c).num_params() > 4e9  # shapes from the presets, no download


# Each deviceless TPU compile runs mostly on one thread (libtpu's compiler), so the slow tier runs two at a time: the
# six took about 400 s of CI one after another. Two children hold about 3-6 GB of host memory together.
PLANS_AT_ONCE = 2
_PLAN_SECONDS = {"trace_qwen3_30b_a3b.py": 115}  # the longest first (CI's durations), so two workers end together


def _plan(path: str, out: str, memo: str) -> subprocess.CompletedProcess:
  # In a child process: a pod-sized deviceless compile takes GBs of host memory, which the long-lived pytest
  # process must not also hold; the child's memory is returned when it exits.
  cmd = [sys.executable, "-m", "jaxcredit.cli", "plan", "--config", path, "--json", out]
  cmd.append(f"--config.compilation_cache_dir={memo}")
  return subprocess.run(cmd, check=False, cwd=ROOT, capture_output=True, text=True, timeout=1800)


@pytest.fixture(scope="module")
def plan_runs(request, tmp_path_factory):
  """{config path: a future of its `jaxcredit plan` child} for every config this session selected, started at the
  first use, `PLANS_AT_ONCE` at a time, sharing one memo of compiled programs."""
  selected = [
    item.callspec.params["path"]
    for item in request.session.items
    if item.originalname == "test_a_paper_config_fits_its_pod" and hasattr(item, "callspec")
  ]
  folder = tmp_path_factory.mktemp("plans")
  memo = str(folder / "memo")
  order = sorted(selected, key=lambda p: -_PLAN_SECONDS.get(os.path.basename(p), 60))
  outs = {p: str(folder / (os.path.basename(p) + ".json")) for p in order}
  pool = ThreadPoolExecutor(max_workers=PLANS_AT_ONCE)
  yield {p: (pool.submit(_plan, p, outs[p], memo), outs[p]) for p in order}
  pool.shutdown(wait=True, cancel_futures=True)


@pytest.mark.slow
@pytest.mark.skipif(plan.libtpu_library_path() is None, reason="no libtpu: run python tools/install_libtpu.py")
@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=os.path.basename)
def test_a_paper_config_fits_its_pod(path, plan_runs):
  future, out = plan_runs[path]
  proc = future.result()
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  with open(out) as f:
    report = json.load(f)
  c = _load(path)
  assert report["is_tpu"] and report["topology"] == c.plan.topology
  assert report["fits"] and report["rl_step"]["fits"], report["rl_step"]
  assert report["rl_step"]["kv_cache_bytes"] > 0 and report["rl_step"]["reference_bytes"] > 0
