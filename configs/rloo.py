"""RLOO baseline: leave-one-out group baseline (Ahmadian et al. 2024)."""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/rloo"
  c.credit.method = "rloo"
  return c
