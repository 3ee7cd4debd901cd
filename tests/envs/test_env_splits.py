"""No environment's eval split shares a first request with its train split (issue 54 case 4: BFCL multi-turn's
default split put 47 of its 62 non-base eval sessions beside their base session in the train split, which starts
with the same request). Every row of `ENVS`, with its default config, and BFCL multi-turn's split by session."""

import pytest

from jaxcredit.envs import ENVS, bfcl_multi_turn
from jaxcredit.train.config import base_config

TRAIN_CHECKED = 2000
"""Train tasks read per environment (all of BFCL's)."""


def _first_request(spec, task) -> str:
  return next(m["content"] for m in spec.initial_messages(task) if m["role"] == "user")


SERVED = {"mcp_tools", "openenv"}
"""Rows that need a server to build (no default config names one): OpenEnv's split is the server's seeds or the
tasks files one gives (tests/envs/test_openenv.py); mcp_tools splits its task file as math_tools does
(tests/envs/test_mcp_tools.py)."""


@pytest.mark.parametrize("name", sorted(set(ENVS) - SERVED))
def test_no_eval_task_starts_like_a_train_task(name):
  node = base_config().env.get(name)
  spec = ENVS[name].make_spec(node)
  eval_tasks = spec.make_tasks("eval", None if name.startswith("bfcl") else 64, None)
  try:
    train_tasks = spec.make_tasks("train", None if name.startswith("bfcl") else TRAIN_CHECKED, 0)
  except ValueError:  # fewer than TRAIN_CHECKED generated train tasks: all of them
    train_tasks = spec.make_tasks("train", None, 0)
  train_first = {_first_request(spec, t) for t in train_tasks}
  shared = [t for t in eval_tasks if _first_request(spec, t) in train_first]
  assert not shared, f"{name}: {len(shared)} of {len(eval_tasks)} eval tasks start like a train task"


def test_bfcl_multi_turn_keeps_each_session_with_its_variants():
  tasks = bfcl_multi_turn.load_tasks(bfcl_multi_turn.CATEGORIES)
  sides: dict[int, set] = {}
  for t in tasks:
    sides.setdefault(bfcl_multi_turn.session_index(t.task_id), set()).add(bfcl_multi_turn.is_eval(t.task_id))
  assert all(len(s) == 1 for s in sides.values())  # a session and its variants: one side
  held = sum(next(iter(s)) for s in sides.values())
  assert 0.05 * len(sides) < held < 0.15 * len(sides)  # about a tenth of the 200 sessions
