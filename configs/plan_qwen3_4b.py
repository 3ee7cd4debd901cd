"""Plan (no training): Qwen3-4B, 32k-token sequences, remat, on a TPU pod.

  jaxcredit plan --config configs/plan_qwen3_4b.py --topology v5p:2x4x4 --mesh fsdp=32
  jaxcredit plan --config configs/plan_qwen3_4b.py --topology v5p:2x4x4 --mesh fsdp=16,tensor=2 \
      --config.plan.step_time_s=20

v5p-64 is 32 chips (v5p counts TensorCores, two per chip): topology v5p:2x4x4.
"""

from jaxcredit.train.config import base_config


def get_config():
  c = base_config()
  c.model.source = "preset:qwen3-4b"
  c.model.compute_dtype = "bfloat16"  # float32 master weights and moments (model.param_dtype)
  c.model.remat = True
  c.model.attention_impl = "chunked"
  c.model.attention_chunk = 1024
  c.plan.seq_len = 32768
  c.plan.batch_size = 0  # one 32k sequence per data-parallel shard
  return c
