"""The trainer as parts (issue 33): `train/commands/trainer.py` holds the loop only (at most 500 lines), each phase is
a module of its own under 900 lines, and `jaxcredit credit` / `jaxcredit eval` do not import the training loop;
`train/` is grouped (issue 55): the tables, one run's parts (`loop/`) and the commands, which nothing below imports."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
TRAIN = ROOT / "jaxcredit" / "train"
PHASES = ("run", "heldout", "warm_start", "update", "rl_step", "export", "offline_credit")


GROUPS = {
  "tables": {"methods", "passes", "pass_outputs", "method_checks", "engines"},
  "loop": {"run", "warm_start", "rl_step", "async_rollouts", "update", "step", "loss", "heldout", "export"}
  | {"checkpoint", "metrics"},
  "commands": {"trainer", "evaluate", "offline_credit", "plan", "report"},
}


def _lines(path: pathlib.Path) -> int:
  return len(path.read_text().splitlines())


def _path(module: str) -> pathlib.Path:
  (path,) = TRAIN.rglob(f"{module}.py")
  return path


def test_train_is_grouped_and_no_table_or_phase_imports_a_command():
  """Every module of train/ is in its group (config.py and config_help.py stay on top: every config imports them),
  and `tables/` and `loop/` never import `commands/` (the commands sit on top of the loop)."""
  found = {p.parent.name: set() for p in TRAIN.rglob("*.py")}
  for p in TRAIN.rglob("*.py"):
    if p.stem != "__init__":
      found[p.parent.name].add(p.stem)
  assert found == {"train": {"config", "config_help"}, **GROUPS}
  for group in ("tables", "loop"):
    for module in GROUPS[group]:
      assert not any(name.startswith("jaxcredit.train.commands") for name in _imports(module)), module


def test_the_trainer_is_the_loop_and_no_module_is_over_900_lines():
  assert _lines(_path("trainer")) <= 500
  over = {str(p.relative_to(ROOT)): _lines(p) for p in (ROOT / "jaxcredit").rglob("*.py") if _lines(p) > 900}
  assert over == {}


def _imports(module: str) -> set[str]:
  tree = ast.parse(_path(module).read_text())
  out = set()
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.module:
      out |= {f"{node.module}.{a.name}" for a in node.names} | {node.module}
    elif isinstance(node, ast.Import):
      out |= {a.name for a in node.names}
  return out


@pytest.mark.parametrize("module", PHASES + ("evaluate", "report"))
def test_phases_and_commands_do_not_import_the_loop(module):
  assert not any(name.startswith("jaxcredit.train.commands.trainer") for name in _imports(module))


def test_each_function_of_the_loop_fits_on_a_screen():
  """No function of trainer.py or rl_step.py is longer than 80 lines (learn_step was 132)."""
  long = {}
  for module in ("trainer", "rl_step"):
    for node in ast.parse(_path(module).read_text()).body:
      if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno + 1 > 80:
        long[f"{module}.{node.name}"] = node.end_lineno - node.lineno + 1
  assert long == {}


def test_the_run_reports_how_many_groups_had_an_outcome_contrast():
  from jaxcredit.train.commands.trainer import contrast_summary

  rows = [
    {"phase": "eval", "step": 0, "success_rate": 0.03},
    *({"phase": "rl", "step": k + 1, "contrast_group_frac": f} for k, f in enumerate([0.0, 0.5, 0.5, 0.5, 0.0, 1.0])),
  ]
  assert contrast_summary(rows, 2) == (
    "RL: 5 of 12 groups had an outcome contrast (a success and a failure) over 6 steps (by step: 0, 1, 1, 1, 0, 2)"
  )
  assert contrast_summary(rows[:1], 2) == ""
  many = [{"phase": "rl", "step": k, "contrast_group_frac": 0.25} for k in range(20)]
  assert contrast_summary(many, 4).endswith("over 20 steps (the last 12 by step: " + ", ".join(["1"] * 12) + ")")
