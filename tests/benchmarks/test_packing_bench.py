"""benchmarks/packing_bench.py on a tiny workload: the JSON it writes and the batches it times."""

import importlib.util
import json
import os

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def bench():
  spec = importlib.util.spec_from_file_location("packing_bench", os.path.join(ROOT, "benchmarks", "packing_bench.py"))
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_rollout_batch_shares_each_groups_prompt(bench):
  b = bench.rollout_batch(64, 2, 3, 10, (5, 9))
  tokens, mask, action = b.tokens_NxL, b.token_mask_NxL, b.action_mask_NxK
  assert tokens.shape == (6, 128) and b.group_ids_N.tolist() == [0, 0, 0, 1, 1, 1]
  assert b.packed is None and b.adv_NxK.shape == (6, 128) and b.behavior_logp_NxK.shape == (6, 128)
  np.testing.assert_array_equal(tokens[0, :10], tokens[2, :10])
  assert not (tokens[0, :10] == tokens[3, :10]).all()
  assert not action[:, :10].any() and (action <= mask).all() and action.any()


def test_main_writes_every_layout_with_its_speedup(bench, tmp_path, monkeypatch):
  tiny = (
    dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=2, num_heads=2, num_kv_heads=1),
    2,
    4,
    20,
    (5, 30),
  )
  monkeypatch.setitem(bench.WORKLOADS, "tiny", tiny)
  out = tmp_path / "r.json"
  bench.main(["--workloads", "tiny", "--row-lens", "0,256", "--repeats", "1", "--out", str(out)])
  got = json.loads(out.read_text())["workloads"]["tiny"]
  layouts = [r["layout"] for r in got["rows"]]
  assert layouts == ["unpacked", "packed, max_row_len=0", "packed, max_row_len=256"]
  assert got["rows"][0]["speedup"] == 1.0 and all(r["seconds"] > 0 for r in got["rows"])
  # 8 rollouts of at most 50 tokens: one 128-token row each unpacked; packed, each group's prompt once.
  assert got["rows"][0]["shape"] == [8, 128]
  assert got["rows"][1]["shape"][0] == 2 and got["rows"][2]["shape"][0] == 2
  with pytest.raises(SystemExit, match="unknown workloads"):
    bench.main(["--workloads", "nope", "--out", str(out)])
