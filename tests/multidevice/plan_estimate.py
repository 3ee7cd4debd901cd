"""On 8 CPU devices: `plan.plan_step` without libtpu compiles for a simulated mesh of CPU devices and reports an
estimate (here of an update whose policy term carries truncated importance weights). Run by tests/train/test_plan.py through tests/fixtures/multidevice.py."""

import jax
from jaxcredit.models import ModelConfig
from jaxcredit.train.commands import plan

cfg = ModelConfig(
  vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=16
)
r = plan.plan_step(
  cfg,
  topology="v5e:2x4",
  mesh={"fsdp": 4, "tensor": 2},
  batch_size=8,
  seq_len=32,
  devices=jax.devices(),
  behavior_weights=True,
)
assert not r["is_tpu"] and r["chips"] == 8, r
assert r["argument_bytes"] > 0 and r["temp_bytes"] > 0
print(plan.format_report(r))
