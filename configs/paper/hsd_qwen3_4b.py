"""HSD on Qwen3-4B, math with a calculator tool, sized for a v5p-32 (16 chips, fsdp=16): the policy distils, over the
whole vocabulary, from itself shown a successful peer rollout of the same group and the gold answer.

Paper: Li et al., "Localizing Credit at the Divergence: Path-Conditioned Self-Distillation for LLM Reasoning" (arXiv
2606.15576; docs/methods/hsd.md), known from machine-written summaries of its PDF. **HSD is a math and code paper**
(Qwen3-8B and Qwen3-32B on MATH, GSM8K, NuminaMath, APPS, LiveCodeBench; no tools): its use on tool-calling
rollouts, here the calculator, is this library's extension. From the summaries: G = 8 rollouts a prompt, temperature
1.0, top-p 0.95, batch 128, AdamW 1e-6 with (0.9, 0.95), 1,500 steps, max length 4096 for math, beta = 0.001 (the
method's default). Our choices: Qwen3-4B (the paper's smallest is 8B) and reasoning-gym arithmetic with the
calculator.

  jaxcredit plan --config configs/paper/hsd_qwen3_4b.py
"""

from jaxcredit.train.config import pod_config


def get_config():
  c = pod_config(
    method="hsd", model="Qwen/Qwen3-4B", topology="v5p:2x2x4", mesh="fsdp=16", max_len=4096, prompts=16, group=8
  )
  c.env.name = "math_tools"
  c.sampling.max_new_tokens = 2048
  c.sampling.top_p = 0.95
  c.optim.b2 = 0.95
  c.total_steps = 1500
  return c
