"""config.model's numerics keys (remat and its policy, attention, MoE implementation): checked by name, and carried
into the loaded model's ModelConfig."""

import pytest

from jaxcredit.models.config import ModelConfig
from jaxcredit.train import config as config_lib
from jaxcredit.train.loop.run import model_overrides


def test_model_keys_reach_the_model_config():
  c = config_lib.base_config()
  c.model.remat, c.model.remat_policy, c.model.attention_chunk = True, "dots", 64
  cfg = ModelConfig(
    vocab_size=8, hidden_size=4, intermediate_size=8, num_layers=1, num_heads=1, num_kv_heads=1, head_dim=4
  )
  got = model_overrides(cfg, c)
  assert (got.remat, got.remat_policy, got.attention_chunk) == (True, "dots", 64)


@pytest.mark.parametrize(
  "key, value, message",
  [
    ("remat_policy", "all", "config.model.remat_policy = 'all': must be one of ('nothing', 'dots', 'dots_no_batch')"),
    ("moe_impl", "sparse", "config.model.moe_impl = 'sparse': must be one of ('ragged', 'dense')"),
  ],
)
def test_a_bad_model_key_is_refused_naming_it(key, value, message):
  c = config_lib.base_config()
  c.model[key] = value
  with pytest.raises(ValueError) as info:
    config_lib.validate(c)
  assert message in str(info.value)


def test_a_remat_policy_without_remat_is_refused():
  """Without remat every residual is kept, so a policy there would silently do nothing."""
  c = config_lib.base_config()
  c.model.remat_policy = "dots"
  with pytest.raises(ValueError, match="config.model.remat_policy = 'dots' needs config.model.remat=True"):
    config_lib.validate(c)
  c.model.remat = True
  config_lib.validate(c)
