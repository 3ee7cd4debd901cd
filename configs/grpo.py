"""Outcome-only GRPO baseline on the quickstart setup (every token of a rollout gets its group advantage)."""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/grpo"
  c.credit.method = "grpo"
  return c
