"""Every command validates its config before it does any work, and every numeric key has its range in one table
(`jaxcredit.train.config.RANGES`): a bad value is refused naming the config key and the value (issue 35, cases 6
and 7, and the sweep over every numeric key)."""

import math
import os

import ml_collections
import numpy as np
import pytest

from tests.fixtures.cli import run_cli


def _numeric_leaves(c, prefix=""):
  for k, v in c.items():
    if isinstance(v, ml_collections.ConfigDict):
      yield from _numeric_leaves(v, f"{prefix}{k}.")
    elif isinstance(v, (int, float)) and not isinstance(v, bool):
      yield f"{prefix}{k}", v


def _rollouts_jsonl(path):
  from jaxcredit.rollout import jsonl
  from jaxcredit.trajectory import RolloutBuilder

  records = []
  for g, rewards in {"g1": [1.0, 0.0], "g2": [0.0, 1.0]}.items():
    for k, r in enumerate(rewards):
      b = RolloutBuilder.from_prompt([1, 2, 3])
      b.append_action([4, 5], [-0.5, -0.25])
      records.append(jsonl.rollout_to_record(b, rollout_id=f"{g}-{k}", group_id=g, reward=r))
  jsonl.write_jsonl(path, records)
  return str(path)


# issue 35 case 6: `jaxcredit credit` never validated its config (a KeyError traceback, a ZeroDivisionError, a numpy
# broadcast error); a credit function's knob error named the function, not the config key.
@pytest.mark.parametrize(
  "override,expected",
  [
    ("--config.credit.method=nope", "config.credit.method = 'nope'"),
    ("--config.train.length_bucket=0", "config.train.length_bucket = 0: must be an int >= 1"),
    ("--config.train.length_bucket=-8", "config.train.length_bucket = -8: must be an int >= 1"),
    ("--config.credit.grpo.eps=-1", "config.credit.grpo.eps = -1.0: must be > 0"),
  ],
)
def test_credit_command_validates_its_config_naming_the_key(tmp_path, override, expected):
  src = _rollouts_jsonl(tmp_path / "in.jsonl")
  out = tmp_path / "out.jsonl"
  p = run_cli("credit", "--config", "configs/grpo.py", "--in", src, "--out", str(out), override)
  assert p.returncode == 2, p.stderr[-2000:]
  assert expected in p.stderr, p.stderr[-2000:]
  assert "Traceback" not in p.stderr and not out.exists()


def test_credit_command_still_credits_a_valid_config(tmp_path):
  from jaxcredit.rollout import jsonl

  src = _rollouts_jsonl(tmp_path / "in.jsonl")
  p = run_cli("credit", "--config", "configs/grpo.py", "--in", src, "--out", str(tmp_path / "out.jsonl"))
  assert p.returncode == 0, p.stderr[-2000:]
  adv = {r["rollout_id"]: r["advantages"] for r in jsonl.read_jsonl(tmp_path / "out.jsonl")}
  s = 1 / np.sqrt(2)  # (1 - 0.5) / std([1, 0], ddof=1) on the two action tokens
  np.testing.assert_allclose(adv["g1-0"][-2:], [s, s], atol=1e-6)
  np.testing.assert_allclose(adv["g2-0"][-2:], [-s, -s], atol=1e-6)


# issue 35 case 7: a negative optim.max_grad_norm was accepted; optax then scales the gradient by a negative factor
# (SGD at lr 0.1 on gradient [3, 4] moved the parameters by [+0.06, +0.08], up the gradient). The warm start reads
# the same key.
def test_negative_max_grad_norm_is_refused_by_key_and_value(tmp_path):
  from jaxcredit.train.loop import step
  from jaxcredit.train.config import base_config, validate

  c = base_config()
  c.optim.max_grad_norm = -0.5
  with pytest.raises(ValueError, match=r"config\.optim\.max_grad_norm = -0\.5: must be"):
    validate(c)
  p = run_cli(
    "sft", "--config", "configs/quickstart.py", "--config.optim.max_grad_norm=-0.5", f"--config.workdir={tmp_path}/w"
  )
  assert p.returncode == 2 and "config.optim.max_grad_norm = -0.5" in p.stderr, p.stderr[-2000:]
  with pytest.raises(ValueError, match="max_grad_norm"):
    step.make_optimizer(0.1, name="sgd", max_grad_norm=-0.5)
  # 0 is "no clipping", a positive norm clips: both step down the gradient.
  import jax.numpy as jnp

  for norm, expected in ((0.0, [-0.3, -0.4]), (1.0, [-0.06, -0.08])):
    opt = step.make_optimizer(0.1, name="sgd", max_grad_norm=norm)
    g = jnp.asarray([3.0, 4.0])
    updates, _ = opt.update(g, opt.init(g), g)
    np.testing.assert_allclose(updates, expected, rtol=1e-5)


def test_every_numeric_key_of_the_default_configs_has_a_range():
  """A new numeric key without a row in RANGES fails here. The method knobs (credit.<method>.*) and the
  environments' own keys (env.<name>.*) are checked by their rows' validators, not by the table."""
  from jaxcredit.envs import ENVS
  from jaxcredit.train.config import RANGES, base_config, pod_config
  from jaxcredit.train.tables.methods import METHODS

  delegated = tuple(f"credit.{m}." for m in METHODS) + tuple(f"env.{e}." for e in ENVS)
  pod = pod_config(
    method="grpo", model="Qwen/Qwen3-4B", topology="v5p:2x2x1", mesh="fsdp=4", max_len=256, prompts=2, group=2
  )
  for c in (base_config(), pod):
    keys = {k for k, _ in _numeric_leaves(c) if not k.startswith(delegated)}
    assert keys - set(RANGES) == set(), sorted(keys - set(RANGES))
  assert set(RANGES) - keys == set(), sorted(set(RANGES) - keys)  # no row for a key that is gone


def _out_of_range(r):
  """Values the row refuses: below its low end, above its high end, NaN for a float, a float for an int key."""
  bad = []
  if r.low is not None:
    bad.append(r.low if r.low_open else r.low - (1 if r.kind is int else 0.5))
  if r.high is not None and math.isfinite(r.high):
    bad.append(r.high if r.high_open else r.high + (1 if r.kind is int else 0.5))
  if r.kind is float:
    bad += [float("nan"), float("inf") if r.high is None or math.isfinite(r.high) else float("-inf")]
  else:
    bad.append(1.5)
  return [v for v in bad if v not in r.also]


def _rows():
  from jaxcredit.train.config import RANGES

  return sorted(RANGES.items())


@pytest.mark.parametrize("key,row", _rows(), ids=[k for k, _ in _rows()])
def test_every_numeric_key_out_of_its_range_is_refused_naming_key_and_value(key, row):
  from jaxcredit.train.config import base_config, check_ranges

  values = _out_of_range(row)
  assert values, key
  for v in values:
    c = base_config()
    node, leaf = c, key.split(".")[-1]
    for part in key.split(".")[:-1]:
      node = node[part]
    with node.ignore_type():
      node[leaf] = v
    with pytest.raises(ValueError) as e:
      check_ranges(c)
    assert str(e.value).startswith(f"config.{key} = {v!r}: must be"), (key, v, str(e.value))
  check_ranges(base_config())  # the defaults are in range


def _delegated_numeric_keys():
  """(method or environment, node key, key, value) of every numeric method knob and environment key."""
  from jaxcredit.envs import ENVS
  from jaxcredit.train.tables.method_checks import method_knobs
  from jaxcredit.train.tables.methods import METHODS

  rows = [("credit", m, k, v) for m in METHODS for k, v in method_knobs(m).items()]
  rows += [("env", e, k, v) for e, row in ENVS.items() for k, v in dict(row.defaults).items()]
  return [r for r in rows if isinstance(r[3], (int, float)) and not isinstance(r[3], bool)]


@pytest.mark.parametrize("node,name,key,default", _delegated_numeric_keys(), ids=lambda x: str(x))
def test_every_method_knob_and_environment_key_refuses_a_non_number_by_key(node, name, key, default):
  """The keys outside RANGES: NaN for a float, 1.5 for an int is refused naming config.<node>.<name>.<key>."""
  from jaxcredit.train.config import base_config, validate

  c = base_config()
  if node == "credit":
    c.credit.method = name
    c.teacher.source = "smollm2" if name == "opd" else ""
  else:
    c.env.name = name
  bad = 1.5 if isinstance(default, int) else float("nan")
  with c[node][name].ignore_type():
    c[node][name][key] = bad
  with pytest.raises(ValueError, match=rf"^config\.{node}\.{name}\.{key}"):
    validate(c)


def test_viz_validates_the_workdirs_config_naming_the_key(tmp_path):
  """`jaxcredit viz` reads the run's config.json; a GRPO run's bad length_bucket ended in a ZeroDivisionError."""
  import json

  w = tmp_path / "w"
  (w / "rollout_samples").mkdir(parents=True)
  _rollouts_jsonl(w / "rollout_samples" / "step_1.jsonl")
  (w / "config.json").write_text(json.dumps({"credit": {"method": "grpo"}, "train": {"length_bucket": 0}}))
  p = run_cli("viz", "--workdir", str(w), "--methods", "grpo")
  assert p.returncode == 2, p.stderr[-2000:]
  assert "config.train.length_bucket = 0: must be an int >= 1" in p.stderr and "Traceback" not in p.stderr
  assert not (w / "viewer").exists()


def test_plan_validates_its_config_naming_the_key(monkeypatch):
  # `plan` sets these for its simulated devices; monkeypatch restores them after the test.
  for name in ("XLA_FLAGS", "JAX_PLATFORMS", "TPU_WORKER_HOSTNAMES"):
    monkeypatch.setenv(name, os.environ.get(name, ""))
  p = run_cli(
    "plan", "--config", "configs/plan_qwen3_4b.py", "--topology", "v5p:2x2x1", "--config.optim.max_grad_norm=-1.0"
  )
  assert p.returncode == 2, p.stderr[-2000:]
  assert "config.optim.max_grad_norm = -1.0: must be a finite number >= 0" in p.stderr, p.stderr[-2000:]


def test_viz_computes_a_method_without_a_teacher_for_a_run_that_had_one(tmp_path, tiny):
  """The run's config names a teacher (CrEST's); GRPO, computed now, runs no teacher pass, and the validation of its
  config must not refuse the trained run's teacher.source."""
  import json

  w = tmp_path / "w"
  (w / "rollout_samples").mkdir(parents=True)
  _rollouts_jsonl(w / "rollout_samples" / "step_1.jsonl")
  saved = {"credit": {"method": "crest"}, "teacher": {"source": "policy"}, "model": {"source": tiny.gguf_path}}
  saved["model"]["cache_dir"] = tiny.cache_dir
  (w / "config.json").write_text(json.dumps(saved))
  p = run_cli("viz", "--workdir", str(w), "--methods", "grpo")
  assert p.returncode == 0, p.stderr[-2000:]
  assert (w / "viewer" / "step_1" / "index.html").is_file()
