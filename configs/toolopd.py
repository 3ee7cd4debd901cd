"""ToolOPD on the quickstart task: GRPO plus a distillation term toward the reference teacher shown a hindsight
skill (written by the teacher from the rollout and its outcome), weighted by how the skill changed each action
token's probability, made outcome-aware. Knobs: config.credit.toolopd.*; a larger teacher:
--config.teacher.source=path/to/teacher (same tokenizer).
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/toolopd"
  c.credit.method = "toolopd"
  return c
