"""One config file that adds a pass (a `PASSES` row), a loss term (a `LOSS_TERMS` row, weighted by a knob of the
method and reading a per-token array the method returns) and a method that reads the new pass's output and has a
string knob (a `METHODS` row); the pass's own knob is in the method's config node: `jaxcredit train --config that_file.py` trains it a step,
and `jaxcredit viz` on the run, with the rows no longer registered, loads the file again (config.json's
`config_file`) and writes the method's page."""

import json
import os

import pytest

from jaxcredit import cli
from jaxcredit.envs import ENVS
from jaxcredit.train.tables.methods import METHODS
from jaxcredit.train.tables.passes import PASSES
from jaxcredit.train.loop.step import LOSS_TERMS

from tests.fixtures.tiny_run import metrics_rows, tiny_run_overrides

CONFIG_FILE = '''
import dataclasses

import numpy as np

from jaxcredit.trajectory import LossInput
from jaxcredit.train.config import base_config
from jaxcredit.train.tables.methods import METHODS, Method, MethodOutput
from jaxcredit.train.tables.pass_outputs import PassOutput, output_field, read_output
from jaxcredit.train.tables.passes import PASSES, Pass
from jaxcredit.train.loop.step import LOSS_TERMS, LossTerm


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShareOutput(PassOutput):
  share_BxL: np.ndarray = output_field("B", "L")  # each action token's share of its rollout's action tokens


def action_share(ctx, traj):
  """A pass without a model: each action token's share of its rollout's action tokens, to the power of its knob."""
  act = traj.action_mask_BxL.astype(np.float32)
  n = act.sum(axis=1)
  return ShareOutput(
    share_BxL=(act / np.maximum(n, 1.0)[:, None]) ** ctx.knobs["share_power"],
    valid_B=n > 0,
    reasons=["" if k > 0 else "no_action" for k in n],
  )


@dataclasses.dataclass(frozen=True)
class AnchorInput(LossInput):
  anchor_weight_BxL: np.ndarray  # the anchor's weight on each token (the method's)


def anchor(logp_NxK, mb, cfg):
  """A likelihood anchor: pulls up the log-prob of each action token by the method's own per-token weight (its input's
  `anchor_weight_BxL`, in the update batch at the scored slots under the key "anchor_weight")."""
  return -mb.inputs_NxK["anchor_weight"] * logp_NxK, {}


def shared_reward(traj, knobs):
  seq = traj.rewards_B - knobs["baseline"]
  out = read_output(traj, "action_share", ShareOutput)
  spread = out.share_BxL if knobs["spread"] == "share" else traj.action_mask_BxL.astype(np.float32)
  adv = np.where(np.asarray(out.valid_B)[:, None], seq[:, None] * spread, 0.0).astype(np.float32)
  return MethodOutput(
    adv,
    metrics={"share_spread": knobs["spread"] == "share"},
    details={"share_BxL": spread},
    loss_inputs={"anchor": AnchorInput(traj.action_mask_BxL.astype(np.float32))},
  )


def check_spread(knobs, config):
  if knobs["spread"] not in ("even", "share"):
    raise ValueError(f"config.credit.shared_reward.spread = {knobs['spread']!r}: must be 'even' or 'share'")


def check_power(knobs, config, method):
  if not knobs["share_power"] > 0:
    raise ValueError(f"config.credit.{method}.share_power = {knobs['share_power']!r}: must be > 0")


# The pass declares its knob: every method that runs it has it in its config node.
PASSES["action_share"] = Pass(action_share, ShareOutput, knobs={"share_power": 1.0}, validate=check_power)
LOSS_TERMS["anchor"] = LossTerm(anchor, None, lambda c: "token-mean", input=AnchorInput, knob="anchor_coef")
METHODS["shared_reward"] = Method(
  shared_reward,
  knobs={"baseline": 0.5, "spread": "even", "anchor_coef": 0.1},  # anchor_coef: the anchor term's weight
  passes=("action_share",),
  loss_terms=("anchor",),
  teacher=None,
  summary="reward minus a baseline, spread by each token's share",
  validate=check_spread,
)


def get_config():
  c = base_config()
  c.credit.method = "shared_reward"
  return c
'''


@pytest.fixture
def tables():
  """The tables as they were, put back after the test (the config file registers rows in them)."""
  saved = [(t, dict(t)) for t in (METHODS, PASSES, LOSS_TERMS, ENVS)]

  def restore():
    for table, rows in saved:
      table.clear()
      table.update(rows)

  yield restore
  restore()


def test_a_config_file_adds_a_pass_a_loss_term_and_a_method_that_viz_opens(tiny, tmp_path, tables, capsys):
  path = tmp_path / "shared_reward.py"
  path.write_text(CONFIG_FILE)
  w = str(tmp_path / "run")
  overrides = tiny_run_overrides(
    tiny.gguf_path,
    w,
    tiny.cache_dir,
    compilation_cache_dir=tiny.xla_cache_dir,
    total_steps=1,
    log_rollouts_every=1,
    log_rollouts_count=2,
  )
  # The string knob is a config key; a value the row's own check refuses is refused before any work, and so is
  # a value of the pass's knob, which the method's node holds without the method declaring it.
  bad = cli.main(["jaxcredit", "train", "--config", str(path), *overrides, "--config.credit.shared_reward.spread=x"])
  assert bad == 2 and "config.credit.shared_reward.spread = 'x'" in capsys.readouterr().err
  bad = cli.main(
    ["jaxcredit", "train", "--config", str(path), *overrides, "--config.credit.shared_reward.share_power=-1.0"]
  )
  assert bad == 2 and "config.credit.shared_reward.share_power = -1.0: must be > 0" in capsys.readouterr().err
  assert not os.path.exists(os.path.join(w, "config.json"))
  args = ["jaxcredit", "train", "--config", str(path), *overrides, "--config.credit.shared_reward.spread=share"]
  assert cli.main(args) == 0, capsys.readouterr().err
  (row,) = metrics_rows(w, "rl")
  assert row["method"] == "shared_reward" and row["share_spread"] is True
  assert row["pass/action_share/dropped"] == 0 and "loss_anchor" in row
  # the anchor term weighs in with its knob's 0.1 (no PolicyLossConfig field of that name)
  assert row["loss_anchor"] > 0.0
  assert row["loss"] == pytest.approx(row["loss_policy"] + 0.1 * row["loss_anchor"], rel=1e-5, abs=1e-7)
  with open(os.path.join(w, "config.json")) as f:
    assert json.load(f)["config_file"] == str(path)

  tables()  # a fresh process: the rows are not registered until the run's config file is loaded again
  assert "shared_reward" not in METHODS and "action_share" not in PASSES
  out = tmp_path / "page"
  capsys.readouterr()
  assert cli.main(["jaxcredit", "viz", "--workdir", w, "--out", str(out)]) == 0, capsys.readouterr().err
  assert "methods shared_reward, grpo" in capsys.readouterr().out
  assert "shared_reward" in (out / "index.html").read_text()
  pages = [p.read_text() for p in out.glob("*.html") if p.name != "index.html"]
  assert pages and all("shared_reward" in p and "reward minus a baseline" in p for p in pages)
