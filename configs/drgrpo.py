"""Dr.GRPO baseline: no std normalisation, constant-length loss aggregation (Liu et al. 2025)."""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/drgrpo"
  c.credit.method = "drgrpo"
  c.loss.aggregation = "seq-mean-token-sum-norm"
  return c
