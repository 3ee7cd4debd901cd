"""TRACE + GRPO on the quickstart task (the quickstart's method, in its own workdir). Knobs: config.credit.trace.*."""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/trace"
  c.credit.method = "trace"
  return c
