"""Rows that declare what they need (issue 33): `Pass.writes` / `Pass.reads` and `Method.reads`, checked where a
run is configured (`config.validate`, `method_checks.check_reads`, `method_checks.check_knobs`) and where the trainer stores a
pass's outputs (`passes.check_outputs`); and `report.register_rows` for a run whose rows a config file adds."""

import dataclasses

import numpy as np
import pytest

from jaxcredit.train import config as config_lib
from jaxcredit.train import passes as passes_lib
from jaxcredit.train import report
from jaxcredit.train.method_checks import check_knobs, check_reads
from jaxcredit.train.methods import METHODS, Method, MethodOutput
from jaxcredit.train.passes import PASSES, Pass, check_outputs


def _config(method: str):
  c = config_lib.base_config()  # after the row: it builds config.credit.<method>
  c.credit.method = method
  return c


def _zero(traj, knobs):
  return MethodOutput(np.zeros(traj.tokens_BxL.shape, np.float32))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_shipped_method_declares_what_it_reads(name):
  """Each read is written by one of its passes, and its advantage function reads nothing else (the fake
  trajectory of check_knobs holds the declared outputs and refuses an undeclared read)."""
  check_reads(name)
  check_knobs(name, _config(name).credit[name])
  for r in METHODS[name].reads:
    pass_name, key = r.split("/")
    assert pass_name in METHODS[name].passes and key in PASSES[pass_name].writes


def test_a_method_reading_an_output_no_pass_writes_is_refused_by_validate(monkeypatch):
  monkeypatch.setitem(
    METHODS, "reads_nothing_written", Method(_zero, {}, ("teacher_plain",), reads=("teacher_plain/score_BxL",))
  )
  with pytest.raises(ValueError, match=r"method 'reads_nothing_written' reads teacher_plain/score_BxL.*teacher_plain"):
    config_lib.validate(_config("reads_nothing_written"))


def test_a_read_of_a_pass_the_method_does_not_run_or_an_unknown_pass_is_refused(monkeypatch):
  monkeypatch.setitem(METHODS, "other_pass", Method(_zero, {}, ("teacher_plain",), reads=("gold_answer/valid_B",)))
  with pytest.raises(ValueError, match=r"'other_pass' reads gold_answer/valid_B, but 'gold_answer' is not among"):
    config_lib.validate(_config("other_pass"))
  monkeypatch.setitem(METHODS, "no_such_pass", Method(_zero, {}, ("nope",)))
  with pytest.raises(ValueError, match=r"'no_such_pass' runs pass\(es\) \['nope'\], which are not PASSES rows"):
    config_lib.validate(_config("no_such_pass"))


def test_a_pass_whose_input_pass_runs_later_is_refused(monkeypatch):
  gear = METHODS["gear"]
  monkeypatch.setitem(METHODS, "skill_first", dataclasses.replace(gear, passes=("teacher_skill", "hindsight_skill")))
  with pytest.raises(ValueError, match=r"pass 'teacher_skill' reads hindsight_skill/skills, which no pass before it"):
    check_reads("skill_first")


def test_an_undeclared_read_is_refused_when_the_knobs_are_checked(monkeypatch):
  gear = METHODS["gear"]
  monkeypatch.setitem(METHODS, "gear_quiet", dataclasses.replace(gear, reads=("teacher_divergence/valid_B",)))
  with pytest.raises(ValueError, match=r"'gear_quiet' reads teacher_divergence/divergence_BxL, which its METHODS row"):
    config_lib.validate(_config("gear_quiet"))


def test_pass_outputs_must_be_what_the_row_writes(monkeypatch):
  monkeypatch.setitem(PASSES, "probe", Pass(lambda ctx, traj: {}, ("score_BxL", "valid_B", "reasons")))
  good = {"score_BxL": np.zeros((2, 4)), "valid_B": np.ones(2, bool), "reasons": ["", ""]}
  check_outputs("probe", good)
  with pytest.raises(ValueError, match=r"pass 'probe'.*undeclared \['extra_B'\], missing \[\]"):
    check_outputs("probe", dict(good, extra_B=np.zeros(2)))
  with pytest.raises(ValueError, match=r"pass 'probe'.*undeclared \[\], missing \['score_BxL'\]"):
    check_outputs("probe", {k: v for k, v in good.items() if k != "score_BxL"})
  assert PASSES["probe"](None, None) == {}  # a row is called as its function


def test_a_pass_row_must_declare_valid_B_and_reasons_and_reads_as_pass_slash_key():
  with pytest.raises(ValueError, match=r"must declare \['reasons'\]"):
    Pass(lambda ctx, traj: {}, ("valid_B",))
  with pytest.raises(ValueError, match=r"a read must be 'pass_name/key', got 'skills'"):
    Pass(lambda ctx, traj: {}, ("valid_B", "reasons"), reads=("skills",))


def test_the_teacher_budgets_stay_reachable_from_the_config_module():
  assert config_lib.teacher_budgets is passes_lib.teacher_budgets
  assert config_lib.TEACHER_CONTEXT_SLACK == passes_lib.TEACHER_CONTEXT_SLACK


def test_a_run_of_an_unregistered_method_without_a_config_file_is_said_so():
  with pytest.raises(ValueError, match=r"method 'gone'.*records no config_file"):
    report.register_rows({"credit": {"method": "gone"}, "env": {"name": "arithmetic"}, "config_file": ""})
  with pytest.raises(ValueError, match=r"registered by its config file /nowhere/x.py, which could not be loaded"):
    report.register_rows({"credit": {"method": "gone"}, "config_file": "/nowhere/x.py"})
  report.register_rows({"credit": {"method": "grpo"}, "env": {"name": "arithmetic"}})  # registered: nothing to do


def test_a_loss_term_added_as_a_row_takes_its_weight_from_the_methods_knob(monkeypatch):
  """A `LOSS_TERMS` row with coef=None and knob="anchor_coef": the method's knob sets its weight, with no
  `PolicyLossConfig` field of that name (it travels in `knob_weights`); a negative or missing weight is refused."""
  from jaxcredit.train import update
  from jaxcredit.train.step import LOSS_TERMS, LossTerm, PolicyLossConfig

  term = LossTerm(lambda logp, mb, cfg: (-logp, {}), None, lambda c: "token-mean", ("adv_BxL",), knob="anchor_coef")
  monkeypatch.setitem(LOSS_TERMS, "anchor", term)
  monkeypatch.setitem(METHODS, "anchored", Method(_zero, {"anchor_coef": 0.25}, (), loss_terms=("anchor",)))
  c = _config("anchored")
  c.credit.anchored.anchor_coef = 0.4
  config_lib.validate(c)
  cfg = update.loss_config_of(c)
  assert cfg.terms == ("policy", "anchor") and cfg.knob_weights == (("anchor_coef", 0.4),)
  assert term.weight(cfg) == 0.4 and cfg.weight("distill_coef") == 0.0  # a field is read as itself
  c.credit.anchored.anchor_coef = -0.1
  with pytest.raises(ValueError, match=r"config.credit.anchored.anchor_coef = -0.1: the 'anchor' loss term's weight"):
    config_lib.validate(c)
  del c.credit.anchored["anchor_coef"]
  with pytest.raises(ValueError, match=r"config.credit.anchored.anchor_coef is missing"):
    config_lib.validate(c)
  with pytest.raises(KeyError, match="no loss weight 'anchor_coef'"):
    term.weight(PolicyLossConfig())
  with pytest.raises(ValueError, match="'distill_coef' is a field of its own"):
    PolicyLossConfig(knob_weights=(("distill_coef", 1.0),))
  with pytest.raises(ValueError, match="must be a finite number"):
    PolicyLossConfig(knob_weights=(("anchor_coef", float("nan")),))
  with pytest.raises(ValueError, match="coef=None reads the weight from a knob"):
    LossTerm(lambda logp, mb, cfg: (logp, {}), None, lambda c: "token-mean")


def test_a_methods_loss_arrays_join_the_batch_and_bad_ones_are_refused_by_name():
  adv = np.zeros((2, 5), np.float32)
  weight = np.ones((2, 5), np.float32)
  assert set(MethodOutput(adv, loss_arrays={"anchor_weight_BxL": weight}).batch_arrays()) == {
    "adv_BxL",
    "anchor_weight_BxL",
  }
  with pytest.raises(ValueError, match=r"loss_arrays\['anchor_weight_BxL'\] has shape \(2, 4\), expected"):
    MethodOutput(adv, loss_arrays={"anchor_weight_BxL": weight[:, :4]}).batch_arrays()
  for key in ("adv_BxL", "distill_weight_BxL", "tokens_BxL", "ref_logp_BxL", "anchor_weight"):
    with pytest.raises(ValueError, match=f"{key!r} must be a new per-token key"):
      MethodOutput(adv, loss_arrays={key: weight}).batch_arrays()


def test_a_loss_terms_missing_or_misshapen_array_is_refused_when_the_run_is_configured(monkeypatch):
  """Before any model is loaded: `check_knobs` runs the method on its 2-rollout trajectory and checks its output
  against its loss terms' `batch_keys`."""
  from jaxcredit.train.step import LOSS_TERMS, LossTerm

  term = LossTerm(lambda logp, mb, cfg: (-logp, {}), None, lambda c: "token-mean", ("w_BxL",), knob="w_coef")
  monkeypatch.setitem(LOSS_TERMS, "weighted", term)

  def short(traj, knobs):
    adv = np.zeros(traj.tokens_BxL.shape, np.float32)
    return MethodOutput(adv, loss_arrays={"w_BxL": adv[:, :-1]})

  monkeypatch.setitem(METHODS, "misshapen", Method(short, {"w_coef": 1.0}, (), loss_terms=("weighted",)))
  with pytest.raises(ValueError, match=r"config.credit.misshapen: MethodOutput.loss_arrays\['w_BxL'\] has shape"):
    config_lib.validate(_config("misshapen"))
  monkeypatch.setitem(METHODS, "forgetful", Method(_zero, {"w_coef": 1.0}, (), loss_terms=("weighted",)))
  with pytest.raises(ValueError, match=r"method 'forgetful': loss term 'weighted' reads \['w_BxL'\], which its"):
    config_lib.validate(_config("forgetful"))
