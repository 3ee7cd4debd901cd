"""The command line rejects what a user can get wrong, naming it, before any work starts.

Most checks call `jaxcredit.cli.main` in this process (`run_cli`): what is tested is the message and the exit code,
not the process. The tests of exit codes and one-line messages as a shell sees them run the real command as a child
process (`run_cli_process`)."""

import os

import pytest

from tests.fixtures.cli import ROOT, run_cli, run_cli_process


def test_unknown_config_key_is_rejected_by_name(tmp_path):
  p = run_cli("train", "--config", "configs/quickstart.py", "--config.nope_key=1", f"--config.workdir={tmp_path}/w")
  assert p.returncode != 0
  assert "nope_key" in p.stderr
  assert not os.path.exists(tmp_path / "w")


@pytest.mark.parametrize(
  "overrides,words",
  [
    (["--config.credit.method=opd"], ["config.teacher.source", "opd"]),  # OPD has no default teacher
    (["--config.credit.method=nope"], ["config.credit.method", "nope"]),
    (["--config.credit.method=hsd", "--config.credit.hsd.fallback=maybe"], ["config.credit.hsd.fallback"]),
    (["--config.credit.method=crest", "--config.credit.crest.tau=nan"], ["config.credit.crest.tau"]),
    (["--config.teacher.context_wrapper=no placeholder"], ["config.teacher.context_wrapper"]),
    (["--config.env.name=bfcl"], ["config.env.name", "arithmetic"]),
    # Values that would otherwise fail late (after the warm start) or silently (a flipped sign):
    (["--config.credit.method=grpo", "--config.teacher.source=policy"], ["config.teacher.source", "no teacher pass"]),
    (
      ["--config.credit.method=toolopd", "--config.credit.toolopd.distill_coef=-0.1"],
      ["config.credit.toolopd.distill_coef", ">= 0"],
    ),
    (
      ["--config.credit.method=toolopd", "--config.credit.toolopd.distill_max_grad_ratio=0"],
      ["config.credit.toolopd.distill_max_grad_ratio", "> 0"],
    ),
    (
      ["--config.credit.method=toolopd", "--config.credit.toolopd.skill_template=Task: {question}"],
      ["config.credit.toolopd.skill_template", "question"],
    ),
    (
      ["--config.credit.method=toolopd", "--config.credit.toolopd.skill_max_tokens=288"],
      ["config.credit.toolopd.skill_max_tokens"],
    ),
    (["--config.train.num_micro_batches=3"], ["config.train.num_micro_batches", "8 rollouts"]),
    (["--config.train.mini_batch_size=3"], ["config.train.mini_batch_size", "8 rollouts"]),
    (
      ["--config.train.mini_batch_size=4", "--config.train.num_micro_batches=3"],
      ["config.train.num_micro_batches", "4 rollouts of a mini-batch"],
    ),
    # Out of a credit function's range: refused by its own check, named under the method's node.
    (
      ["--config.credit.method=crest", "--config.credit.crest.clip_eps=-1"],
      ["config.credit.crest.clip_eps = -1.0: must be >= 0"],
    ),
    (
      ["--config.credit.method=gigpo", "--config.credit.gigpo.gamma=2.0"],
      ["config.credit.gigpo.gamma = 2.0: must be in [0, 1]"],
    ),
    (
      ["--config.credit.method=hsd", "--config.credit.hsd.success_threshold=inf"],
      ["config.credit.hsd", "success_threshold"],
    ),
    (
      ["--config.credit.method=toolopd", "--config.credit.toolopd.skill_template={task.nope}"],
      ["config.credit.toolopd.skill_template"],
    ),
  ],
)
def test_bad_method_teacher_and_env_settings_are_refused_by_name(tmp_path, overrides, words):
  p = run_cli("train", "--config", "configs/quickstart.py", *overrides, f"--config.workdir={tmp_path}/w")
  assert p.returncode == 2, p.stderr[-2000:]  # bad input, refused by the validation before the run starts
  assert all(w in p.stderr for w in words), p.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w")


def test_unknown_command_and_help():
  p = run_cli_process("fly")
  assert p.returncode == 2 and "unknown command 'fly'" in p.stderr
  p = run_cli("--help")
  assert p.returncode == 0 and "train" in p.stdout and "sft" in p.stdout


def test_config_that_fails_to_build_leaves_nothing_behind(tmp_path):
  p = run_cli("train", "--config", "configs/quickstart.py", "--config.mesh.data=3", f"--config.workdir={tmp_path}/w")
  assert p.returncode == 1
  assert "config.mesh" in p.stderr and "needs 3 devices" in p.stderr
  assert not os.path.exists(tmp_path / "w" / "config.json")


@pytest.mark.parametrize(
  "override,key",
  [
    ("--config.loss.aggregation=bogus", "loss.aggregation"),
    ("--config.sampling.temperature=nan", "sampling.temperature"),
    ("--config.optim.learning_rate=-1", "optim.learning_rate"),
    ("--config.credit.trace.gold_reduce=max", "credit.trace.gold_reduce"),
  ],
)
def test_bad_values_are_refused_before_anything_is_written(tmp_path, override, key):
  p = run_cli("train", "--config", "configs/quickstart.py", override, f"--config.workdir={tmp_path}/w")
  assert p.returncode == 2 and key in p.stderr, p.stderr[-2000:]
  assert not os.path.exists(tmp_path / "w")


def test_missing_config_file_and_missing_flag(tmp_path):
  p = run_cli_process("train", "--config", "configs/nope.py")
  assert p.returncode == 2 and "config file not found: configs/nope.py" in p.stderr and "Traceback" not in p.stderr
  p = run_cli("train", f"--config.workdir={tmp_path}/w")
  assert p.returncode == 2 and "--config is required" in p.stderr


def test_a_knob_at_the_edge_the_credit_function_allows_passes_validation():
  from jaxcredit.train.config import base_config, validate

  c = base_config()
  c.credit.method = "crest"
  c.credit.crest.lam = 0.0  # no token modulation: the paper's inter-turn-only ablation (plain per-unit GRPO)
  c.teacher.context_wrapper = ""  # no insertion
  validate(c)
  c = base_config()
  c.credit.method = "hsd_grpo"
  c.credit.hsd_grpo.clip = float("inf")  # an infinite knob the credit function allows: no clip on the log-ratio
  validate(c)


def test_a_misspelt_key_is_named_with_the_closest_existing_key(tmp_path):
  for typo, closest in (
    ("rollout.group_sise", "rollout.group_size"),
    ("rollut.group_size", "rollout.group_size"),
    ("credit.trace.alpha_tur", "credit.trace.alpha_turn"),
  ):
    p = run_cli("train", "--config", "configs/quickstart.py", f"--config.{typo}=1", f"--config.workdir={tmp_path}/w")
    assert p.returncode == 2, p.stderr[-2000:]
    lines = p.stderr.strip().splitlines()
    assert lines[-1] == f"jaxcredit train: unknown config key '{typo}'; the closest key is '{closest}'", lines
    assert "Traceback" not in p.stderr
  p = run_cli("train", "--config", "configs/quickstart.py", "--config.credit.trace.beta=0.5")
  assert p.returncode == 2 and "credit.trace.alpha_turn" in p.stderr.strip().splitlines()[-1], p.stderr[-2000:]
  p = run_cli_process("train", "--config", "configs/quickstart.py", "--config.rollout.group_size=abc")
  assert p.returncode == 2 and "--config.rollout.group_size=abc" in p.stderr and "\n" not in p.stderr.strip()


def test_help_lists_every_config_key_with_its_value_and_description():
  p = run_cli("train", "--config", "configs/quickstart.py", "--config.rollout.group_size=8", "--help")
  assert p.returncode == 0, p.stderr[-2000:]
  lines = p.stdout.splitlines()
  # The override is applied, and the comment that sets the key in the base config is its description.
  assert any(l.startswith("rollout.group_size = 8 ") and l.endswith("# G rollouts per prompt") for l in lines), lines
  # A method knob is described by its credit function's docstring.
  assert any(l.startswith("credit.gear.alpha = 0.2") and "the weight's strength" in l for l in lines)
  from jaxcredit.train import config as config_lib
  from jaxcredit.train.config_help import config_items

  every = [k for k, _ in config_items(config_lib.base_config())]
  listed = {l.split(" = ", 1)[0] for l in lines if " = " in l}
  assert set(every) <= listed, sorted(set(every) - listed)[:5]

  p = run_cli("train", "--help")
  assert p.returncode == 0 and "usage: jaxcredit train --config" in p.stdout and "configs/quickstart.py" in p.stdout
  p = run_cli("plan", "--help")
  assert p.returncode == 0 and "--topology" in p.stdout and "required" not in p.stderr
  for command in ("sft", "credit", "plan"):
    p = run_cli(command, "--config", "configs/quickstart.py", "--help")
    assert p.returncode == 0 and "\nrollout.group_size = 4 " in p.stdout, (command, p.stderr[-2000:])


def test_ctrl_c_stops_with_one_line_naming_the_last_checkpoint(tmp_path, monkeypatch, capsys):
  from jaxcredit import cli
  from jaxcredit.train.commands import trainer

  def interrupted(config, sft_only=False):
    os.makedirs(os.path.join(config.workdir, "checkpoints", "4"))
    os.makedirs(os.path.join(config.workdir, "checkpoints", "2"))
    os.makedirs(os.path.join(config.workdir, "checkpoints", "6.orbax-checkpoint-tmp-1"))  # an unfinished save
    raise KeyboardInterrupt

  monkeypatch.setattr(trainer, "train", interrupted)
  code = cli.main(
    ["jaxcredit", "train", "--config", os.path.join(ROOT, "configs/quickstart.py"), f"--config.workdir={tmp_path}/w"]
  )
  err = capsys.readouterr().err.strip()
  assert code == 130
  assert err == (
    f"jaxcredit train: interrupted; the last checkpoint is RL step 4 in {tmp_path}/w/checkpoints "
    f"(step 0: the warm start); the same command resumes from it"
  ), err


def test_a_key_commented_on_the_lines_above_it_is_described_by_their_first_sentence(tmp_path):
  from jaxcredit.train.config_help import key_descriptions

  path = tmp_path / "exp.py"
  path.write_text(
    "def get_config():\n"
    "  # Rollouts sampled ahead (0: off; see docs. here). More detail\n"
    "  # on the next line.\n"
    "  c.rollout.async_depth = 0\n"
    "  c.rollout.group_size = 4  # G rollouts per prompt\n"
    "  # a comment that a blank line separates from the next key\n"
    "\n"
    "  c.testbed_only_key = 0\n"
    "  # a block above a key with its own comment\n"
    "  c.lr = 1e-3  # the learning rate\n"
  )
  described = key_descriptions(str(path))
  assert described["rollout.async_depth"] == "Rollouts sampled ahead (0: off; see docs. here)"
  assert described["rollout.group_size"] == "G rollouts per prompt"
  assert described["lr"] == "the learning rate"
  assert "testbed_only_key" not in described
