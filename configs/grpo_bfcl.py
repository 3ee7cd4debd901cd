"""GRPO on BFCL V3 multi-turn: the outcome-only baseline beside configs/crest_bfcl.py. A session's reward is 1 when
every user request passes BFCL's checkers (config.env.bfcl_multi_turn.reward="unit_fraction" gives partial credit),
and every token of a rollout gets its group advantage. Needs bfcl-eval (`pip install --no-deps bfcl-eval mpmath`).

  jaxcredit train --config configs/grpo_bfcl.py
"""

import importlib.util
import os


def get_config():
  # The same setup as CrEST's config, so the two runs compare only the credit.
  path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "crest_bfcl.py")
  spec = importlib.util.spec_from_file_location("crest_bfcl", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  c = module.get_config()
  c.workdir = "runs/grpo_bfcl"
  c.credit.method = "grpo"
  c.teacher.source = ""
  return c
