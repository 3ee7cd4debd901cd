"""toolopd on the quickstart setup. The trainer refuses this method until its teacher pass exists (it says which);
the credit function itself is available as jaxcredit.credit (see docs/credit.md)."""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/toolopd"
  c.credit.method = "toolopd"
  return c
