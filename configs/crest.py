"""CrEST on the quickstart task: verified per-unit advantages (U = 1 on arithmetic, where only the outcome is
verified, so the unit advantage is GRPO's) times a bounded token factor: the paper's fixed teacher (the policy as RL
starts, shown the gold answer: the one unit has no earlier ground truth) amplifies, by at most lam · clip_eps, the
tokens it agrees with the verifier on (arXiv 2608.13179; docs/methods/crest.md). Knobs: config.credit.crest.*;
teacher: docs/teacher-passes.md.

  jaxcredit train --config configs/crest.py --config.credit.crest.lam=0.5
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/crest"
  c.credit.method = "crest"
  return c
