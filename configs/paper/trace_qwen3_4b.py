"""TRACE on Qwen3-4B, search QA (the paper's BrowseComp-Plus setting), sized for a v5p-64 (32 chips, fsdp=32).

Paper: "Of Errors and Echoes: Responsibility-Aware Credit Assignment for Tool-Use Agents" (docs/credit.md). The
model and the task follow it; the batch, lengths and learning rate are our choices (the paper's exact values are
not in this repository): 32 questions x 8 rollouts, 32k-token episodes, up to 16 search/open calls, AdamW 1e-6.

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
  c.env.search.max_tool_calls = 16
  c.env.search.max_output_chars = 4000
  c.env.search.top_k = 5
  c.sampling.max_new_tokens = 2048  # per assistant turn (Qwen3 thinks before each call)
  return c
