"""tools/same_results.py, the refactor check (two checkouts' tiny runs compared row by row): what counts as a
difference."""

import importlib.util
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _tool():
  spec = importlib.util.spec_from_file_location("same_results", os.path.join(ROOT, "tools", "same_results.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_every_key_but_timings_must_match_row_by_row():
  tool = _tool()
  before = [{"step": 1, "loss": 0.5, "step_s": 3.0, "pass/gold_answer/seconds": 1.0, "tokens_per_s_per_chip": 9.0}]
  same = [{"step": 1, "loss": 0.5, "step_s": 4.0, "pass/gold_answer/seconds": 2.0, "tokens_per_s_per_chip": 7.0}]
  assert tool.differences(before, same) == []
  changed = [{"step": 1, "loss": 0.25, "step_s": 3.0, "grad_norm": 1.0}]  # a timing may vanish, a value may not
  assert tool.differences(before, changed) == ["step 1 grad_norm: '<missing>' -> 1.0", "step 1 loss: 0.5 -> 0.25"]
  assert tool.differences(before, before + before)[0] == "1 rows before, 2 after"


def test_exported_rollout_files_must_match_line_by_line():
  tool = _tool()
  before = {"rollouts/step_1.jsonl": ['{"a": 1}', '{"a": 2}'], "rollout_samples/step_1.jsonl": ['{"b": 1}']}
  assert tool.export_differences(before, dict(before)) == []
  changed = {"rollouts/step_1.jsonl": ['{"a": 1}', '{"a": 3}']}
  assert tool.export_differences(before, changed) == [
    "rollout_samples/step_1.jsonl only before",
    "rollouts/step_1.jsonl: 2 -> 2 lines, line(s) [1] differ",
  ]
