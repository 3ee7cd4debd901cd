"""The paper-scale configs (configs/paper/): each validates, states its pod, and (slow) compiles deviceless for
that pod with `jaxcredit plan`, the whole RL step fitting in HBM."""

import glob
import json
import os
import subprocess
import sys

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


@pytest.fixture(scope="module")
def plan_memo(tmp_path_factory):
  return str(tmp_path_factory.mktemp("plan_memo"))


@pytest.mark.slow
@pytest.mark.skipif(plan.libtpu_library_path() is None, reason="no libtpu: run python tools/install_libtpu.py")
@pytest.mark.parametrize("path", PAPER_CONFIGS, ids=os.path.basename)
def test_a_paper_config_fits_its_pod(path, tmp_path, plan_memo):
  # In a child process: a pod-sized deviceless compile takes GBs of host memory, which the long-lived pytest
  # process (at 15+ GB late in the full suite) must not also hold; the child's memory is returned when it exits.
  # The configs share one memo of compiled programs: CrEST's, GEAR's and ToolOPD's 4B steps are one program.
  out = tmp_path / "plan.json"
  cmd = [sys.executable, "-m", "jaxcredit.cli", "plan", "--config", path, "--json", str(out)]
  cmd.append(f"--config.compilation_cache_dir={plan_memo}")
  proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=1800)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  report = json.loads(out.read_text())
  c = _load(path)
  assert report["is_tpu"] and report["topology"] == c.plan.topology
  assert report["fits"] and report["rl_step"]["fits"], report["rl_step"]
  assert report["rl_step"]["kv_cache_bytes"] > 0 and report["rl_step"]["reference_bytes"] > 0
