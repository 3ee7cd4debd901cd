"""Kind sweep of issue 35 (model I/O): every transformers config.json field that changes the computation of a
supported family (llama, qwen3, qwen3_moe) is either applied, giving transformers' logits at near and far
positions, or refused in one line naming the field. Weights go straight from the torch model through the HF tensor
map (`hf_slots`), without a conversion, so each case is a unit test."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from hf_checkpoints import torch_model
from jaxcredit.models import Decoder
from jaxcredit.models.decoder import param_shapes, set_params
from jaxcredit.models.hf import _fused_expert_slots, config_from_hf, hf_slots

SMALL = dict(
  vocab_size=32,
  hidden_size=16,
  intermediate_size=32,
  num_hidden_layers=1,
  num_attention_heads=2,
  num_key_value_heads=1,
  head_dim=8,
  max_position_embeddings=4096,
  tie_word_embeddings=False,
)
FAMILIES = {
  "llama": {},
  "qwen3": {},
  "qwen3_moe": dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16),
}
# Fields with a non-default value that the decoder applies.
APPLIED = {
  "rope_theta": {"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}},
  "rope_linear": {"rope_parameters": {"rope_theta": 1e4, "rope_type": "linear", "factor": 4.0}},
  "rope_llama3": {
    "rope_parameters": {
      "rope_theta": 1e4,
      "rope_type": "llama3",
      "factor": 8.0,
      "low_freq_factor": 1.0,
      "high_freq_factor": 4.0,
      "original_max_position_embeddings": 1024,
    }
  },
  "rope_yarn": {
    "rope_parameters": {
      "rope_theta": 1e4,
      "rope_type": "yarn",
      "factor": 4.0,
      "original_max_position_embeddings": 1024,
    }
  },
  "head_dim": {"head_dim": 16},
  "tie_word_embeddings": {"tie_word_embeddings": True},
  "rms_norm_eps": {"rms_norm_eps": 0.05},
  "num_key_value_heads": {"num_key_value_heads": 2},
}
# Fields with a value the decoder cannot compute: (overrides, what the error names).
REFUSED = {
  "attention_bias": ({"attention_bias": True}, "attention_bias"),
  "mlp_bias": ({"mlp_bias": True}, "mlp_bias"),
  "hidden_act": ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
  "use_sliding_window": ({"use_sliding_window": True, "sliding_window": 4}, "use_sliding_window"),
  "layer_types": ({"layer_types": ["sliding_attention"]}, "layer_types"),
  "partial_rotary_factor": ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
  "rope_dynamic": ({"rope_parameters": {"rope_theta": 1e4, "rope_type": "dynamic", "factor": 2.0}}, "'dynamic'"),
  "rope_longrope": (
    {"rope_parameters": {"rope_theta": 1e4, "rope_type": "longrope", "short_factor": [1.0] * 4}},
    "'longrope'",
  ),
  "llama3_without_low_freq_factor": (
    {"rope_parameters": {"rope_theta": 1e4, "rope_type": "llama3", "factor": 8.0, "high_freq_factor": 4.0}},
    "low_freq_factor",
  ),
}


def _params_from_torch(cfg, model):
  """Our parameter tree from a transformers model's state dict, through the converter's tensor map."""
  state = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
  slots = hf_slots(cfg)
  if cfg.is_moe and "model.layers.0.mlp.experts.gate_up_proj" in state:  # transformers v5's fused experts
    slots = [s for s in slots if ".mlp.experts." not in s.hf_name]
    slots += [s for i in range(cfg.num_layers) for s in _fused_expert_slots(cfg, i)]
  shapes = param_shapes(cfg)
  params = {name: np.zeros(shape, np.float32) for name, shape in shapes.items()}
  for slot in slots:
    params[slot.param][slot.index] = slot.to_ours(state[slot.hf_name], shapes[slot.param][len(slot.index) :])
  return params


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("field", sorted(APPLIED))
def test_applied_fields_give_transformers_logits(family, field):
  reference = torch_model(family, **{**SMALL, **FAMILIES[family], **APPLIED[field]})
  with torch.no_grad():  # sharper attention, so that the rotation at far positions shows in the logits
    for name, p in reference.named_parameters():
      if name.endswith(("q_proj.weight", "k_proj.weight")):
        p.mul_(6.0)
  cfg = config_from_hf(reference.config.to_dict())
  model = Decoder(cfg, rngs=nnx.Rngs(0))
  set_params(model, _params_from_torch(cfg, reference))
  tokens = np.asarray([[3, 9, 27, 5, 17, 30]], np.int64)
  for start in (0, 3000):
    positions = np.arange(start, start + tokens.shape[1])[None]
    with torch.no_grad():
      want = reference(torch.tensor(tokens), position_ids=torch.tensor(positions)).logits[0].float().numpy()
    got = np.asarray(model(jnp.asarray(tokens, jnp.int32), positions_BxL=jnp.asarray(positions, jnp.int32))[0][0])
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0, err_msg=f"{family} {field} at {start}")


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("field", sorted(REFUSED))
def test_fields_the_decoder_cannot_compute_are_refused_by_name(family, field):
  overrides, named = REFUSED[field]
  config = {**torch_model(family, **{**SMALL, **FAMILIES[family]}).config.to_dict(), **overrides}
  with pytest.raises(ValueError) as info:
    config_from_hf(config)
  message = str(info.value)
  assert named in message and "config.json" in message and "\n" not in message, message


SIZES = ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"]
SIZES += ["num_key_value_heads", "head_dim"]


@pytest.mark.parametrize("family", sorted(FAMILIES))
@pytest.mark.parametrize("value", [0, -2, 2.5, "8", True])
def test_sizes_that_are_not_positive_ints_are_refused_by_name(family, value):
  """head_dim 0 or num_key_value_heads 0 became D/H or H without a word (`x or default`); "8" or 2.5 failed in
  int() without the field's name."""
  base = torch_model(family, **{**SMALL, **FAMILIES[family]}).config.to_dict()
  sizes = SIZES + (["moe_intermediate_size", "num_experts", "num_experts_per_tok"] if family == "qwen3_moe" else [])
  for key in sizes + ["rms_norm_eps", "rope_theta"]:
    config = {**base, key: value}
    if key == "rope_theta":  # v5 spelling keeps it in rope_parameters; the v4 one at the top level
      config["rope_parameters"] = None
    if key in ("rms_norm_eps", "rope_theta") and value == 2.5:
      continue  # a valid value for these
    with pytest.raises(ValueError) as info:
      config_from_hf(config)
    assert f"config.json: {key} must be a positive" in str(info.value) and repr(value) in str(info.value), key
