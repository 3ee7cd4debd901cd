"""benchmarks/async_bench.py's summary of a run's RL rows: the compiling first step left out, the learner's wait
(all of the sampling when synchronous) and the overlap."""

import importlib.util
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
spec = importlib.util.spec_from_file_location("async_bench", os.path.join(ROOT, "benchmarks", "async_bench.py"))
async_bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(async_bench)


def _row(step_s, rollout_s, **kw):
  return {"step_s": step_s, "rollout_s": rollout_s, "update_s": 1.0, "score_s": 0.5, **kw}


def test_a_synchronous_run_waits_for_all_its_sampling():
  rows = [_row(60.0, 30.0), _row(10.0, 6.0), _row(12.0, 8.0)]
  s = async_bench.summarize(rows)
  assert s["steps"] == 2 and s["step_s"] == 11.0 and s["rollout_s"] == 7.0
  assert s["learner_wait_s"] == 7.0 and s["overlap"] == 0.0 and s["rl_seconds"] == 22.0


def test_an_async_run_hides_the_sampling_it_did_not_wait_for():
  rows = [
    _row(60.0, 30.0, learner_wait_s=30.0, policy_staleness=0),
    _row(8.0, 6.0, learner_wait_s=1.0, sampler_idle_s=2.0, policy_staleness=1),
    _row(8.0, 10.0, learner_wait_s=3.0, sampler_idle_s=0.0, policy_staleness=1),
  ]
  s = async_bench.summarize(rows)
  assert s["learner_wait_s"] == 2.0 and s["rollout_s"] == 8.0 and s["overlap"] == pytest.approx(0.75)
  assert s["sampler_idle_s"] == 1.0 and s["policy_staleness_max"] == 1


def test_one_step_leaves_nothing_after_the_compile():
  with pytest.raises(ValueError, match="at least 2 RL steps"):
    async_bench.summarize([_row(1.0, 1.0)])
