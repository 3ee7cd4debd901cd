"""Resume safety: training keys must match, run-length keys may change, nothing is overwritten on refusal."""

import json
import os

import pytest

from jaxcredit.train.loop import checkpoint as ckpt_lib
from jaxcredit.train.config import base_config, validate
from tests.fixtures.cli import run_cli


def test_training_key_diff_ignores_run_length_keys():
  a = base_config().to_dict()
  b = base_config().to_dict()
  b["total_steps"] = 99
  b["workdir"] = "elsewhere"
  b["eval"]["num_tasks"] = 8
  b["checkpoint_every"] = 1
  assert ckpt_lib.training_key_diff(a, b) == []
  b["optim"]["learning_rate"] = 3e-4
  b["credit"]["method"] = "grpo"
  assert ckpt_lib.training_key_diff(a, b) == ["credit.method", "optim.learning_rate"]


def test_refusal_names_keys_and_writes_nothing(tmp_path):
  workdir = str(tmp_path)
  cfg = base_config().to_dict()
  assert ckpt_lib.check_or_write_config(workdir, cfg) is False
  path = os.path.join(workdir, "config.json")
  before = open(path).read()
  changed = base_config().to_dict()
  changed["rollout"]["group_size"] = 8
  with pytest.raises(ValueError, match=r"rollout.group_size: checkpoint has 4, config has 8"):
    ckpt_lib.check_or_write_config(workdir, changed)
  assert open(path).read() == before
  longer = base_config().to_dict()
  longer["total_steps"] = 100
  assert ckpt_lib.check_or_write_config(workdir, longer) is True
  assert json.load(open(path))["total_steps"] == 100


@pytest.mark.parametrize(
  "key,value,match",
  [
    ("credit.method", "ppo", "credit.method"),
    ("sampling.temperature", 0.0, "sampling.temperature"),
    ("rollout.group_size", 0, "rollout.group_size"),
    ("sampling.top_p", 1.5, "sampling.top_p"),
    ("eval.every", -1, "eval.every"),
    ("sft.loss_tokens", "prompt", "sft.loss_tokens"),
  ],
)
def test_validate_names_bad_key(key, value, match):
  c = base_config()
  section, name = key.split(".")
  c[section][name] = value
  with pytest.raises(ValueError, match=match):
    validate(c)


def _load_config(name):
  import importlib.util

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  spec = importlib.util.spec_from_file_location(f"cfg_{name}", os.path.join(root, "configs", f"{name}.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod.get_config()


@pytest.mark.parametrize(
  "name",
  [
    "quickstart",
    "grpo",
    "drgrpo",
    "rloo",
    "gigpo",
    "trace",
    "crest",
    "toolopd",
    "hsd",
    "gear",
    "gear_v0",
    "sgcd",
    "sgcd_v0",
    "opd",
  ],
)
def test_every_method_has_a_config_that_validates(name):
  from jaxcredit.train.tables.methods import METHODS

  c = _load_config(name)
  validate(c)
  assert c.credit.method == ("trace" if name == "quickstart" else name)
  assert c.credit.method in METHODS


def test_every_method_has_a_config():
  from jaxcredit.train.tables.methods import METHODS

  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  assert sorted(m for m in METHODS if not os.path.exists(os.path.join(root, "configs", f"{m}.py"))) == []


def test_knobs_of_another_method_do_not_block_a_resume(tmp_path):
  a = base_config()
  a.credit.method = "grpo"
  ckpt_lib.check_or_write_config(str(tmp_path), a.to_dict())
  b = base_config()
  b.credit.method = "grpo"
  b.credit.crest.tau = 0.3
  assert ckpt_lib.check_or_write_config(str(tmp_path), b.to_dict()) is True
  b.credit.grpo.eps = 1e-3
  with pytest.raises(ValueError, match=r"credit.grpo.eps"):
    ckpt_lib.check_or_write_config(str(tmp_path), b.to_dict())


def test_an_unreadable_or_missing_config_json_is_refused_naming_the_file(tmp_path):
  """Issue 54 case 10: a truncated config.json gave an error without the file's name, and a workdir with checkpoints
  but no config.json resumed with a changed method silently. Both are refused (exit 2 at the CLI)."""
  from jaxcredit.train.loop.checkpoint import WorkdirRefused

  c = base_config().to_dict()
  w = tmp_path / "w"
  w.mkdir()
  (w / "config.json").write_text('{"seed": 0, "cred')
  with pytest.raises(WorkdirRefused, match=rf"{w / 'config.json'} is not a readable config"):
    ckpt_lib.check_or_write_config(str(w), c)
  (w / "config.json").write_text("[1]")
  with pytest.raises(WorkdirRefused, match="a JSON list, not an object"):
    ckpt_lib.check_or_write_config(str(w), c)
  (w / "config.json").unlink()
  (w / "checkpoints" / "3").mkdir(parents=True)
  with pytest.raises(WorkdirRefused, match="holds checkpoints but no config.json"):
    ckpt_lib.check_or_write_config(str(w), c, write=False)
  assert not (w / "config.json").exists()
  p = run_cli("train", "--config", "configs/quickstart.py", f"--config.workdir={w}")
  assert p.returncode == 2 and "holds checkpoints but no config.json" in p.stderr.strip().splitlines()[-1]
