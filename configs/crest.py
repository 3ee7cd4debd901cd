"""CrEST on the quickstart task: verified per-unit advantages (U = 1 on arithmetic, where only the outcome is
verified, so the unit advantage is GRPO's) whose token magnitudes a privileged self-teacher (the policy shown the
verified answer) modulates where it is confident. Knobs: config.credit.crest.*; teacher: docs/teacher-passes.md.

  jaxcredit train --config configs/crest.py --config.credit.crest.tau=0.8
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/crest"
  c.credit.method = "crest"
  return c
