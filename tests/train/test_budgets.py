"""Budgets checked against each other (issue 54 case 2): `sampling.max_new_tokens=2000` with `max_len=1024` trained
on nothing and exited 0. Now the keys are refused by name at validation, the real prompts are measured against them
when the run starts, and a step that sampled no action token stops."""

import pytest

from jaxcredit.envs import make_env_spec
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop.run import check_generation_room
from tests.fixtures.cli import run_cli
from tests.fixtures.tiny_chat import tiny_tokenizer


@pytest.mark.parametrize(
  "settings, keys",
  [
    ({"sampling.max_new_tokens": 2000, "sampling.max_len": 1024}, ("sampling.max_new_tokens", "sampling.max_len")),
    ({"sampling.max_new_tokens": 64, "sampling.max_len": 64}, ("sampling.max_new_tokens", "sampling.max_len")),
    ({"sampling.max_new_tokens": 0, "sampling.max_len": 64}, ("sampling.max_new_tokens",)),
  ],
)
def test_every_pair_of_budget_keys_is_checked_by_name(settings, keys):
  c = config_lib.base_config()
  for key, value in settings.items():
    node, leaf = key.rsplit(".", 1)
    c[node][leaf] = value
  with pytest.raises(ValueError) as e:
    config_lib.validate(c)
  for key in keys:
    assert f"config.{key}" in str(e.value)
  # An explicit teacher budget below a rollout's is allowed: a pass that does not fit is dropped and counted
  # (pass/<name>/dropped_over_budget; tests/integration/test_every_method_trains.py).
  c = config_lib.base_config()
  c.credit.method, c.teacher.max_len = "crest", 100
  config_lib.validate(c)


def test_the_real_prompts_are_measured_against_the_budget():
  c = config_lib.base_config()
  env = make_env_spec(c.env)
  tok = tiny_tokenizer()
  tasks = env.make_tasks("eval", 8, None)
  c.sampling.max_len = 1024  # the tiny byte-level tokenizer's prompts run to a few hundred tokens
  longest = check_generation_room(c, env, tok, tasks)
  assert 0 < longest <= c.sampling.max_len - c.sampling.max_new_tokens
  c.sampling.max_len = longest + c.sampling.max_new_tokens  # exactly room for the longest prompt's first turn
  assert check_generation_room(c, env, tok, tasks) == longest
  c.sampling.max_len -= 1
  with pytest.raises(
    ValueError, match=f"prompt is {longest} tokens.*config.sampling.max_new_tokens.*config.sampling.max_len"
  ) as e:
    check_generation_room(c, env, tok, tasks)
  assert str(e.value).endswith(
    f"raise max_len to at least {longest + c.sampling.max_new_tokens} or lower max_new_tokens to at most "
    f"{c.sampling.max_len - longest}"
  )


def test_train_refuses_a_budget_without_room_in_one_line(tmp_path):
  r = run_cli(
    "train",
    "--config",
    "configs/quickstart.py",
    "--config.sampling.max_new_tokens=2000",
    "--config.sampling.max_len=1024",
    f"--config.workdir={tmp_path}/w",
  )
  assert r.returncode == 2
  assert "config.sampling.max_new_tokens = 2000 leaves no room" in r.stderr.strip().splitlines()[-1]
  assert not (tmp_path / "w").exists()
