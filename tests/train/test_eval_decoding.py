"""Held-out evals decode greedily by default; `eval.greedy=False` samples at the rollouts' settings, one fixed key per
batch."""

import threading
import types

import jax
import numpy as np

from jaxcredit.train.loop import heldout
from jaxcredit.train.loop import run as run_lib
from jaxcredit.train.config import base_config


def _fake_run(greedy: bool, num_tasks: int, batch_size: int):
  c = base_config()
  c.progress = False
  c.eval.greedy = greedy
  c.eval.batch_size = batch_size
  c.sampling.temperature = 0.7
  c.sampling.top_p = 0.9
  rows = []
  run = types.SimpleNamespace(
    config=c,
    eval_tasks=np.arange(num_tasks),
    sampler=types.SimpleNamespace(update_model=lambda model, version: None),
    state=types.SimpleNamespace(policy_version=0, sampler_lock=threading.RLock()),
    tok=types.SimpleNamespace(eos_id=2, stop_ids=(2,)),
    env=types.SimpleNamespace(is_success=lambda reward: reward > 0.5, metrics=None, stop_strings=("</answer>",)),
    writer=types.SimpleNamespace(write=lambda phase, step, m: rows.append((phase, step, m))),
  )
  return run, rows


def _evaluate(monkeypatch, greedy: bool):
  calls = []

  def fake_sample(run, tasks, key, *, greedy=False, held_out=False):
    assert held_out  # held-out rollouts take the environment's evaluation turn cap
    params = run_lib.rollout_sampling_params(run, greedy=greedy)
    calls.append((list(tasks), np.asarray(jax.random.key_data(key)), params.temperature, params.top_p))
    return [
      types.SimpleNamespace(
        reward=float(t % 2), tool_calls=1, builder=types.SimpleNamespace(num_turns=2), finish="answer"
      )
      for t in tasks
    ]

  monkeypatch.setattr(heldout, "sample_rollouts", fake_sample)
  monkeypatch.setattr(heldout, "sampling_model", lambda run, params: None)
  run, rows = _fake_run(greedy, num_tasks=5, batch_size=2)
  m = heldout.eval_heldout(run, params=None, stage="rl_step_1", step=1)
  return calls, rows, m


def test_greedy_eval_is_the_default_and_decodes_greedily(monkeypatch):
  assert base_config().eval.greedy is True
  calls, rows, m = _evaluate(monkeypatch, greedy=True)
  assert [c[0] for c in calls] == [[0, 1], [2, 3], [4]]
  assert all(c[2] == 1.0 and c[3] <= 1e-6 for c in calls)
  assert m["success_rate"] == 2 / 5 and rows[0][:2] == ("eval", 1)


def test_sampled_eval_uses_the_rollout_temperature_and_a_fixed_distinct_key_per_batch(monkeypatch):
  calls, _, m = _evaluate(monkeypatch, greedy=False)
  assert all(np.isclose(c[2], 0.7) and np.isclose(c[3], 0.9) for c in calls)
  keys = [c[1].tobytes() for c in calls]
  assert len(set(keys)) == 3  # each batch its own draws
  again, _, _ = _evaluate(monkeypatch, greedy=False)
  assert [c[1].tobytes() for c in again] == keys  # the same draws at every eval
  assert m["success_rate"] == 2 / 5


def test_held_out_rollouts_take_the_environments_eval_turn_cap(monkeypatch):
  """BFCL multi-turn's held-out sessions follow bfcl-eval's protocol, which has no session cap: `eval_max_turns`
  replaces `max_turns` for held-out rollouts only; an environment without one keeps `max_turns` for both."""
  caps = []
  monkeypatch.setattr(run_lib, "run_rollouts", lambda *a, max_turns, max_len, **k: caps.append(max_turns) or [])
  run, _ = _fake_run(True, num_tasks=1, batch_size=1)
  run.fmt = None
  key = jax.random.key(0)
  for eval_cap in (168, None):
    run.env = types.SimpleNamespace(
      make_env=lambda t: None,
      initial_messages=lambda t: [],
      stop_strings=(),
      max_turns=16,
      eval_max_turns=eval_cap,
      step_workers=1,
    )
    run_lib.sample_rollouts(run, [0], key, held_out=True)
    run_lib.sample_rollouts(run, [0], key)
  assert caps == [168, 16, 16, 16]
