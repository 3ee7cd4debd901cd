"""Rows that declare what they need (issues 33, 55): each pass's output class (`Pass.output`, fields with their
axes) and the passes it reads (`Pass.after`); a method reads its passes' outputs as their classes. Checked where a
run is configured (`config.validate`: `method_checks.check_passes`, `method_checks.check_knobs` on stand-in outputs)
and where the trainer stores a pass's output (`Pass.__call__`, `PassOutput.check_axes`); and `report.register_rows`
for a run whose rows a config file adds."""

import dataclasses

import numpy as np
import pytest

from jaxcredit.trajectory import LossInput
from jaxcredit.train import config as config_lib
from jaxcredit.train.tables import passes as passes_lib
from jaxcredit.train.commands import report
from jaxcredit.train.tables.method_checks import check_knobs, check_passes
from jaxcredit.train.tables.methods import METHODS, Method, MethodOutput
from jaxcredit.train.tables.pass_outputs import PassOutput, TeacherOutput, output_field, read_output
from jaxcredit.train.tables.passes import PASSES, Pass


def _config(method: str):
  c = config_lib.base_config()  # after the row: it builds config.credit.<method>
  c.credit.method = method
  return c


def _zero(traj, knobs):
  return MethodOutput(np.zeros(traj.tokens_BxL.shape, np.float32))


@pytest.mark.parametrize("name", sorted(METHODS))
def test_every_shipped_method_runs_on_stand_ins_of_its_passes_outputs(name):
  """Each method's passes exist and are ordered, and its advantage function runs on stand-ins of exactly its passes'
  output classes (a read of a pass it does not run, or of a field the class lacks, would be refused)."""
  check_passes(name)
  check_knobs(name, _config(name).credit[name])


def _reads_score(traj, knobs):
  teacher = read_output(traj, "teacher_plain", TeacherOutput)
  return MethodOutput(np.asarray(teacher.score_BxL, np.float32))


def test_a_method_reading_a_field_its_pass_does_not_declare_is_refused_by_validate(monkeypatch):
  monkeypatch.setitem(METHODS, "reads_score", Method(_reads_score, {}, ("teacher_plain",), teacher="reference"))
  with pytest.raises(ValueError, match=r"method 'reads_score' reads a field .*'TeacherOutput' object has no attribute"):
    config_lib.validate(_config("reads_score"))


def _reads_gold(traj, knobs):
  read_output(traj, "gold_answer", PassOutput)
  return _zero(traj, knobs)


def test_a_read_of_a_pass_the_method_does_not_run_or_an_unknown_pass_is_refused(monkeypatch):
  monkeypatch.setitem(METHODS, "other_pass", Method(_reads_gold, {}, ("teacher_plain",), teacher="reference"))
  with pytest.raises(ValueError, match=r"method 'other_pass' reads the output of pass 'gold_answer', which is not"):
    config_lib.validate(_config("other_pass"))
  monkeypatch.setitem(METHODS, "no_such_pass", Method(_zero, {}, ("nope",)))
  with pytest.raises(ValueError, match=r"'no_such_pass' runs pass\(es\) \['nope'\], which are not PASSES rows"):
    config_lib.validate(_config("no_such_pass"))


def test_reading_a_pass_as_another_class_is_refused(monkeypatch):
  def reads_as_gold(traj, knobs):
    from jaxcredit.train.tables.pass_outputs import GoldAnswerOutput

    read_output(traj, "teacher_plain", GoldAnswerOutput)
    return _zero(traj, knobs)

  monkeypatch.setitem(METHODS, "as_gold", Method(reads_as_gold, {}, ("teacher_plain",), teacher="reference"))
  with pytest.raises(ValueError, match=r"reads pass 'teacher_plain' as GoldAnswerOutput, but that pass outputs Teach"):
    config_lib.validate(_config("as_gold"))


def test_a_pass_whose_input_pass_runs_later_is_refused(monkeypatch):
  gear = METHODS["gear"]
  monkeypatch.setitem(METHODS, "skill_first", dataclasses.replace(gear, passes=("teacher_skill", "hindsight_skill")))
  with pytest.raises(ValueError, match=r"its pass 'teacher_skill' reads the output of 'hindsight_skill', which it"):
    check_passes("skill_first")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScoreOutput(PassOutput):
  score_BxL: np.ndarray = output_field("B", "L")


def test_a_pass_returns_its_rows_class_with_its_declared_axes(monkeypatch):
  good = ScoreOutput(score_BxL=np.zeros((2, 4)), valid_B=np.ones(2, bool), reasons=["", ""])
  monkeypatch.setitem(PASSES, "probe", Pass(lambda ctx, traj: good, ScoreOutput))
  assert PASSES["probe"](None, None) is good  # a row is called as its function
  good.check_axes({"B": 2, "L": 4, "T1": 3}, "probe")
  with pytest.raises(ValueError, match=r"pass 'probe': its output's score_BxL has shape \(2, 5\), but its declared "):
    dataclasses.replace(good, score_BxL=np.zeros((2, 5))).check_axes({"B": 2, "L": 4}, "probe")
  with pytest.raises(ValueError, match=r"pass 'probe': its output's reasons has shape \(3,\)"):
    dataclasses.replace(good, reasons=["", "", ""]).check_axes({"B": 2, "L": 4}, "probe")
  teacher = TeacherOutput.stand_in({"B": 2, "L": 4})
  monkeypatch.setitem(PASSES, "wrong", Pass(lambda ctx, traj: teacher, ScoreOutput))
  with pytest.raises(ValueError, match=r"returned TeacherOutput, not its row's output ScoreOutput"):
    PASSES["wrong"](None, None)


def test_a_pass_row_declares_an_output_class_and_its_knobs_choices():
  with pytest.raises(ValueError, match=r"output must be a PassOutput subclass"):
    Pass(lambda ctx, traj: {}, ("valid_B", "reasons"))
  with pytest.raises(ValueError, match=r"choices for 'mode' need the knob in `knobs` with a default among"):
    Pass(lambda ctx, traj: None, ScoreOutput, knobs={"mode": "x"}, choices={"mode": ("a", "b")})
  with pytest.raises(ValueError, match=r"axes start with 'B'"):
    output_field("L")


def test_stand_ins_follow_the_declared_axes_and_values():
  from jaxcredit.train.tables.pass_outputs import PeerStatesOutput, SiblingSummaryOutput

  peer = PeerStatesOutput.stand_in({"B": 2, "L": 5})
  assert peer.hidden_BxLxD.shape == (2, 5, 4) and peer.peer_B.tolist() == [-1, -1] and peer.valid_B.all()
  summary = SiblingSummaryOutput.stand_in({"B": 4, "L": 5})
  assert summary.success_B.tolist() == [True, False, True, False] and summary.siblings_Bx2.shape == (4, 2)
  assert summary.summaries == ["s"] * 4 and summary.reasons == [""] * 4


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
  `PolicyLossConfig` field (it travels in `knob_weights`, as ToolOPD's distill_coef does); a negative or missing weight is refused."""
  from jaxcredit.train.loop import update
  from jaxcredit.train.loop.step import LOSS_TERMS, LossTerm, PolicyLossConfig

  term = LossTerm(lambda logp, mb, cfg: (-logp, {}), None, lambda c: "token-mean", ("adv",), knob="anchor_coef")
  with pytest.raises(ValueError, match=r"trainer_arrays \['w'\] are not arrays the trainer fills"):
    LossTerm(lambda logp, mb, cfg: (-logp, {}), None, lambda c: "token-mean", ("w",), knob="anchor_coef")
  monkeypatch.setitem(LOSS_TERMS, "anchor", term)
  monkeypatch.setitem(METHODS, "anchored", Method(_zero, {"anchor_coef": 0.25}, (), loss_terms=("anchor",)))
  c = _config("anchored")
  c.credit.anchored.anchor_coef = 0.4
  config_lib.validate(c)
  cfg = update.loss_config_of(c)
  assert cfg.terms == ("policy", "anchor") and cfg.knob_weights == (("anchor_coef", 0.4),)
  assert term.weight(cfg) == 0.4
  with pytest.raises(KeyError, match="no loss weight 'distill_coef'"):  # one source of weights: the method's knobs
    cfg.weight("distill_coef")
  c.credit.anchored.anchor_coef = -0.1
  with pytest.raises(ValueError, match=r"config.credit.anchored.anchor_coef = -0.1: the 'anchor' loss term's weight"):
    config_lib.validate(c)
  del c.credit.anchored["anchor_coef"]
  with pytest.raises(ValueError, match=r"config.credit.anchored.anchor_coef is missing"):
    config_lib.validate(c)
  with pytest.raises(KeyError, match="no loss weight 'anchor_coef'"):
    term.weight(PolicyLossConfig())
  assert PolicyLossConfig(knob_weights=(("distill_coef", 1.0),)).weight("distill_coef") == 1.0  # shipped alike
  with pytest.raises(ValueError, match="must be a finite number"):
    PolicyLossConfig(knob_weights=(("anchor_coef", float("nan")),))
  with pytest.raises(ValueError, match="coef=None reads the weight from a knob"):
    LossTerm(lambda logp, mb, cfg: (logp, {}), None, lambda c: "token-mean")


@dataclasses.dataclass(frozen=True)
class _AnchorInput(LossInput):
  anchor_weight_BxL: np.ndarray


def test_a_methods_loss_inputs_join_the_batch_and_bad_ones_are_refused_by_name():
  adv = np.zeros((2, 5), np.float32)
  weight = np.ones((2, 5), np.float32)
  declared = {"anchor": _AnchorInput}
  arrays = MethodOutput(adv, loss_inputs={"anchor": _AnchorInput(weight)}).input_arrays(declared)
  assert set(arrays) == {"anchor_weight"} and arrays["anchor_weight"].dtype == np.float32
  with pytest.raises(ValueError, match=r"_AnchorInput.anchor_weight_BxL has shape \(2, 4\), expected"):
    MethodOutput(adv, loss_inputs={"anchor": _AnchorInput(weight[:, :4])}).input_arrays(declared)
  with pytest.raises(ValueError, match=r"loss term 'anchor' reads a _AnchorInput .* is missing"):
    MethodOutput(adv).input_arrays(declared)
  with pytest.raises(ValueError, match=r"loss_inputs holds \['anchor'\]: loss terms the method does not declare"):
    MethodOutput(adv, loss_inputs={"anchor": _AnchorInput(weight)}).input_arrays({})


def test_a_loss_terms_input_is_declared_with_new_per_token_keys():
  """A term's input class is checked when the row is made: its fields are `*_BxL` / `*_BxLxD` arrays whose batch keys
  (the names without the suffix) are none of the update batch's own arrays."""
  from jaxcredit.train.loop.step import LossTerm

  def term(input_cls):
    return LossTerm(lambda logp, mb, cfg: (-logp, {}), None, lambda c: "token-mean", input=input_cls, knob="w")

  assert term(_AnchorInput).batch_keys == ("anchor_weight",)

  @dataclasses.dataclass(frozen=True)
  class Clash(LossInput):
    adv_BxL: np.ndarray

  @dataclasses.dataclass(frozen=True)
  class NoAxes(LossInput):
    weight: np.ndarray

  for bad, field in ((Clash, "adv_BxL"), (NoAxes, "weight")):
    with pytest.raises(ValueError, match=f"{bad.__name__}.{field} must be a per-token array named"):
      term(bad)
  with pytest.raises(ValueError, match="must be a dataclass subclassing trajectory.LossInput"):
    term(dict)


def test_a_loss_terms_missing_or_misshapen_input_is_refused_when_the_run_is_configured(monkeypatch):
  """Before any model is loaded: `check_knobs` runs the method on its 2-rollout trajectory and checks its output
  against its loss terms' input classes."""
  from jaxcredit.train.loop.step import LOSS_TERMS, LossTerm

  @dataclasses.dataclass(frozen=True)
  class WeightInput(LossInput):
    w_BxL: np.ndarray

  term = LossTerm(lambda logp, mb, cfg: (-logp, {}), None, lambda c: "token-mean", input=WeightInput, knob="w_coef")
  monkeypatch.setitem(LOSS_TERMS, "weighted", term)

  def short(traj, knobs):
    adv = np.zeros(traj.tokens_BxL.shape, np.float32)
    return MethodOutput(adv, loss_inputs={"weighted": WeightInput(adv[:, :-1])})

  monkeypatch.setitem(METHODS, "misshapen", Method(short, {"w_coef": 1.0}, (), loss_terms=("weighted",)))
  with pytest.raises(ValueError, match=r"method 'misshapen': loss term 'weighted': WeightInput.w_BxL has shape"):
    config_lib.validate(_config("misshapen"))
  monkeypatch.setitem(METHODS, "forgetful", Method(_zero, {"w_coef": 1.0}, (), loss_terms=("weighted",)))
  with pytest.raises(ValueError, match=r"method 'forgetful': loss term 'weighted' reads a WeightInput"):
    config_lib.validate(_config("forgetful"))
