"""The credit viewer on a trained run: a tiny TRACE run writes rollout samples (whole groups, with pass outputs and
TRACE's state values) and the viewer's pages at its end; `jaxcredit viz` adds five other methods on the same
rollouts, and the pages open in headless Chromium with every action token coloured."""

import os

import pytest

from jaxcredit import cli
from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.train.commands import trainer

from tests.fixtures.tiny_run import tiny_run_config
from tests.viz.browser import check_viewer_page


@pytest.mark.slow
def test_trained_samples_open_in_the_viewer_with_six_methods(tiny, tmp_path, browser, capsys):
  """In the slow tier (about 30 s on two cores): the default suite checks the viewer's pages in Chromium on
  generated samples (tests/viz) and every method's run writing its viewer (test_every_method_trains); this is the
  whole path, a trained run's samples with five more methods added by `jaxcredit viz`."""
  c = tiny_run_config("trace", tmp_path / "run", tiny)
  c.log_rollouts_every, c.log_rollouts_count = 1, 1
  trainer.train(c)
  w = c.workdir
  # Whole groups: one rollout asked for, its group of 2 written, with TRACE's values per boundary.
  samples = jsonl_lib.read_jsonl(os.path.join(w, "rollout_samples", "step_1.jsonl"))
  assert [r["rollout_id"] for r in samples] == ["step1_0", "step1_1"]
  assert {r["group_id"] for r in samples} == {0}
  for r in samples:
    details = r["metadata"]["credit_details"]
    assert len(details["state_value_BxT1"]) == len(r["metadata"]["passes"]["gold_answer"]["gold_logp_BxT1"])
    assert details["state_value_BxT1"][0] in (0.0, None)  # V_0 = 0 by definition
  # The trainer wrote the viewer for its last sample.
  assert os.path.isfile(os.path.join(w, "viewer", "step_2", "index.html"))
  capsys.readouterr()

  methods = "trace,grpo,gear,crest,hsd,gigpo"
  assert cli.main(["jaxcredit", "viz", "--workdir", w, "--step", "1", "--methods", methods]) == 0
  assert "2 rollouts of step 1, methods trace, grpo, gear, crest, hsd, gigpo" in capsys.readouterr().out
  folder = tmp_path / "run" / "viewer" / "step_1"
  assert sorted(os.listdir(folder)) == ["index.html", "step1_0.html", "step1_1.html"]
  p = browser.new_page(viewport={"width": 1200, "height": 800})
  found = check_viewer_page(p, folder / "step1_0.html", tmp_path / "step1_0.png")
  assert [m["name"] for m in found["data"]["methods"]] == methods.split(",")
  notes = {m["name"]: m["note"] for m in found["data"]["methods"]}
  assert notes["trace"] == "as trained at step 1"
  assert notes["gear"] == "computed now; passes teacher_divergence scored with the checkpoint of step 2"
  # GEAR's and CrEST's per-token values reached the hover card; TRACE's V_t is a chart.
  labels = {m["name"]: [h["label"] for h in m["hover"]] for m in found["data"]["methods"]}
  assert "teacher/policy divergence (teacher_divergence)" in labels["gear"]
  assert "CrEST token weight (credit)" in labels["crest"]
  charts = [ch["label"] for ch in found["data"]["methods"][0]["charts"]]
  assert any(label.startswith("state value V_t") for label in charts)

  # Refusals name what is wrong; nothing is written.
  assert cli.main(["jaxcredit", "viz", "--workdir", w, "--step", "9"]) == 2
  err = capsys.readouterr().err
  assert "no rollout samples for step 9" in err and "steps with samples: [1, 2]" in err
  assert cli.main(["jaxcredit", "viz", "--workdir", w, "--methods", "trace,nope"]) == 2
  assert "unknown method(s) ['nope']" in capsys.readouterr().err
  empty = tmp_path / "empty"
  empty.mkdir()
  assert cli.main(["jaxcredit", "viz", "--workdir", str(empty)]) == 2
  assert "log_rollouts_every" in capsys.readouterr().err
  assert os.listdir(empty) == []
