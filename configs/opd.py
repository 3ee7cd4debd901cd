"""On-policy distillation on the quickstart task: token advantage = teacher - policy log-prob of each sampled
token (no outcome term). The shipped teacher is SmolLM2-135M-Instruct as installed (before the warm start), so
the run works on a fresh machine; point it at a larger model that shares the tokenizer with
--config.teacher.source=path/to/SmolLM2-360M-Instruct.gguf (or a Hugging Face / converted folder).
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.workdir = "runs/opd"
  c.credit.method = "opd"
  c.teacher.source = "smollm2"
  c.rollout.group_size = 4
  return c
