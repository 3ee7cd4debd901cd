"""Plan (no training): Qwen3-30B-A3B (128 experts, top-8), remat, on a TPU pod.

  jaxcredit plan --config configs/plan_qwen3_30b_a3b.py --topology v5p:4x4x8 --mesh fsdp=32,expert=4

v5p-256 is 128 chips (v5p counts TensorCores, two per chip): topology v5p:4x4x8.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.model.source = "preset:qwen3-30b-a3b"
  c.model.compute_dtype = "bfloat16"  # float32 master weights and moments (model.param_dtype)
  c.model.remat = True
  c.model.attention_impl = "chunked"
  c.model.attention_chunk = 1024
  c.model.moe_impl = "ragged"
  c.plan.seq_len = 8192
  c.plan.batch_size = 0
  return c
