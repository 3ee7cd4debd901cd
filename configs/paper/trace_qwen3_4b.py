"""TRACE on Qwen3-4B, search QA (the paper's BrowseComp-Plus setting), sized for a v5p-64 (32 chips, fsdp=32).

Paper: Tao et al., "TRACE: Turn-level Reward Assignment via Credit Estimation for Long-Horizon Agents", arXiv
2607.13988 (docs/methods/trace.md). TRACE's knobs are the method row's defaults, the paper's (K = 3, γ = 0.8,
λ_term = 2, α_out = 1, α_turn = 0.2, ε = 0.1, population std, mean per-token gold log-probs).
The paper's, as its public descriptions give them: the task (BrowseComp-Plus, closed-web search QA), 8 rollouts
per question, up to 60 tool turns, pure RL from the released checkpoint (no SFT). It trains
Qwen3-4B-Thinking-2507, which has Qwen3-4B's shapes: `--config.model.source=Qwen/Qwen3-4B-Thinking-2507` trains
it (`jaxcredit plan` sizes it by Qwen3-4B's preset only under this config's source).
Ours (the paper's values were not found in its public descriptions): 32 questions per step (the size whose
per-chip memory `jaxcredit plan` measured for this pod, docs/benchmarks.md), 32k-token episodes, 2048 new tokens
per turn, AdamW at 1e-6 (pod_config), 200 RL steps (the paper's number of updates is not given in the sources we
have).

  jaxcredit plan --config configs/paper/trace_qwen3_4b.py            # the step compiled for the pod, deviceless
  tpu_scripts/pod.sh launch --name N --zone Z --bucket B --config configs/paper/trace_qwen3_4b.py -- \\
      --config.env.search.corpus=bcp/corpus.jsonl --config.env.search.queries=bcp/queries.jsonl
"""

from jaxcredit.train.config import pod_config


def get_config():
  c = pod_config(
    method="trace", model="Qwen/Qwen3-4B", topology="v5p:2x4x4", mesh="fsdp=32", max_len=32768, prompts=32, group=8
  )
  c.env.name = "search"
  c.env.search.max_tool_calls = 60  # the paper: up to 60 tool turns (an episode that fills max_len ends there)
  c.env.search.max_output_chars = 4000
  c.env.search.top_k = 5
  c.sampling.max_new_tokens = 2048  # per assistant turn (Qwen3 thinks before each call)
  c.total_steps = 200  # ours: the sources we have do not give the paper's number of updates
  return c
