"""ToolOPD on Qwen3-4B, search QA, sized for a v5p-32 (16 chips, fsdp=16): GRPO plus a distillation term
reweighted by how a hindsight skill changes the frozen reference's probability of each action token.

Paper: ToolOPD (docs/methods/toolopd.md); no paper was found. Our choices: the search task,
16 questions x 8 rollouts, 16k-token episodes, 48-token skills summarised by the reference, AdamW 1e-6.

  jaxcredit plan --config configs/paper/toolopd_qwen3_4b.py
"""

from jaxcredit.train.config import pod_config


def get_config():
  c = pod_config(
    method="toolopd", model="Qwen/Qwen3-4B", topology="v5p:2x2x4", mesh="fsdp=16", max_len=16384, prompts=16, group=8
  )
  c.env.name = "search"
  c.env.search.max_tool_calls = 12
  c.env.search.max_output_chars = 3000
  c.sampling.max_new_tokens = 1024
  return c
