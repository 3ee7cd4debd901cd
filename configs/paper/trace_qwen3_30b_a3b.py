"""TRACE on Qwen3-30B-A3B (128 experts, top-8), search QA (BrowseComp-Plus layout), sized for a v5p-256
(128 chips, fsdp=32 x expert=4).

Paper: Tao et al., "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", arXiv
2607.13988 (docs/methods/trace.md). The paper trains Qwen3-30B-A3B-Thinking-2507 (Qwen3-30B-A3B's shapes); what
is the paper's and what is ours is as in configs/paper/trace_qwen3_4b.py.

  jaxcredit plan --config configs/paper/trace_qwen3_30b_a3b.py
"""

from jaxcredit.train.config import pod_config


def get_config():
  c = pod_config(
    method="trace",
    model="Qwen/Qwen3-30B-A3B",
    topology="v5p:4x4x8",
    mesh="fsdp=32,expert=4",
    max_len=32768,
    prompts=32,
    group=8,
  )
  c.model.moe_impl = "ragged"  # local experts as ragged matmuls inside an expert-parallel shard_map
  c.env.name = "search"
  c.env.search.max_tool_calls = 60  # the paper: up to 60 tool turns (an episode that fills max_len ends there)
  c.env.search.max_output_chars = 4000
  c.env.search.top_k = 5
  c.sampling.max_new_tokens = 2048
  c.total_steps = 200  # ours: the sources we have do not give the paper's number of updates
  return c
