"""Model families: `FAMILIES`, one `FamilySpec` row per Hugging Face `model_type`, the one place a family is added.

A row declares what the checkpoint code reads of a family: its transformers architecture, whether its layers have
q/k norms and MoE MLPs (the features of `ModelConfig` that `Decoder` computes with), the Hugging Face tensor name of
every parameter, the llama.cpp GGUF architecture and tensor names (when a GGUF file of it is read), the logical axes
of its parameters, and the config.json fields it refuses. `hf_config` (config.json <-> ModelConfig), `tensor_map`
(HF tensor names <-> parameter slices) and `gguf_loader` read the rows; none of them names a family.

A family whose computation is the decoder's (a Llama-style block: RMSNorm, rotate-half RoPE, GQA, SwiGLU or
Qwen3-MoE experts) is one row:

    FAMILIES["mistral"] = FamilySpec("MistralForCausalLM", qk_norm=False, moe=False, hf_tensors=HF_TENSORS)

A `ModelConfig` holds no model_type: a conversion from Hugging Face, and the export of its converted checkpoint, use
the source config.json's row; a checkpoint without one (GGUF) and a vLLM weight sync use the first row with the
config's features (`family_of_config`: qk_norm and moe).

Parameter names are the '/'-joined paths of `Decoder`'s parameters; tensor names are templates with `{i}` for the
layer and `{e}` for the expert.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.logical_axes import _PARAM_LOGICAL_AXES

# transformers' tensor names of the Llama-style models (Llama, Qwen3, Qwen3-MoE), by our parameter path.
HF_TENSORS = {
  "embedding": "model.embed_tokens.weight",
  "layers/attn_norm": "model.layers.{i}.input_layernorm.weight",
  "layers/wq": "model.layers.{i}.self_attn.q_proj.weight",
  "layers/wk": "model.layers.{i}.self_attn.k_proj.weight",
  "layers/wv": "model.layers.{i}.self_attn.v_proj.weight",
  "layers/wo": "model.layers.{i}.self_attn.o_proj.weight",
  "layers/q_norm": "model.layers.{i}.self_attn.q_norm.weight",
  "layers/k_norm": "model.layers.{i}.self_attn.k_norm.weight",
  "layers/mlp_norm": "model.layers.{i}.post_attention_layernorm.weight",
  "layers/w_gate": "model.layers.{i}.mlp.gate_proj.weight",
  "layers/w_up": "model.layers.{i}.mlp.up_proj.weight",
  "layers/w_down": "model.layers.{i}.mlp.down_proj.weight",
  "layers/router": "model.layers.{i}.mlp.gate.weight",
  "layers/we_gate": "model.layers.{i}.mlp.experts.{e}.gate_proj.weight",
  "layers/we_up": "model.layers.{i}.mlp.experts.{e}.up_proj.weight",
  "layers/we_down": "model.layers.{i}.mlp.experts.{e}.down_proj.weight",
  "final_norm": "model.norm.weight",
  "lm_head": "lm_head.weight",
}

# transformers v5's in-memory MoE layout, accepted on input: (gate_up_proj [E, 2Fm, D], down_proj [E, D, Fm]).
HF_FUSED_EXPERTS = ("model.layers.{i}.mlp.experts.gate_up_proj", "model.layers.{i}.mlp.experts.down_proj")

# llama.cpp's tensor names of a dense Llama-style model, by our parameter path.
GGUF_TENSORS = {
  "embedding": "token_embd.weight",
  "layers/attn_norm": "blk.{i}.attn_norm.weight",
  "layers/wq": "blk.{i}.attn_q.weight",
  "layers/wk": "blk.{i}.attn_k.weight",
  "layers/wv": "blk.{i}.attn_v.weight",
  "layers/wo": "blk.{i}.attn_output.weight",
  "layers/q_norm": "blk.{i}.attn_q_norm.weight",
  "layers/k_norm": "blk.{i}.attn_k_norm.weight",
  "layers/mlp_norm": "blk.{i}.ffn_norm.weight",
  "layers/w_gate": "blk.{i}.ffn_gate.weight",
  "layers/w_up": "blk.{i}.ffn_up.weight",
  "layers/w_down": "blk.{i}.ffn_down.weight",
  "final_norm": "output_norm.weight",
  "lm_head": "output.weight",
}

# Why a model_type that is no row is not one, added to config_from_hf's refusal.
NOT_SUPPORTED_WHY = {"qwen2": "qwen2 has q/k/v biases, which this decoder has not"}


def family_params(*, qk_norm: bool, moe: bool) -> tuple[str, ...]:
  """The parameter paths of a decoder with these features (those of `decoder.param_shapes`, lm_head included):
  what a row's tensor names and logical axes must cover."""
  attention = ("layers/attn_norm", "layers/wq", "layers/wk", "layers/wv", "layers/wo")
  norms = ("layers/q_norm", "layers/k_norm") if qk_norm else ()
  mlp = ("layers/router", "layers/we_gate", "layers/we_up", "layers/we_down") if moe else ()
  mlp = mlp or ("layers/w_gate", "layers/w_up", "layers/w_down")
  return ("embedding", *attention, *norms, "layers/mlp_norm", *mlp, "final_norm", "lm_head")


@dataclasses.dataclass(frozen=True)
class Refusal:
  """A config.json field of one family that the decoder cannot honour: `hf.get(field, default)` must satisfy `ok`,
  else `config_from_hf` raises "<where>: <what, formatted with value> is not supported by the decoder"."""

  field: str
  default: Any
  ok: Callable[[Any], bool]
  what: str


@dataclasses.dataclass(frozen=True)
class GGUFSpec:
  """How llama.cpp stores a family.

  Attributes:
    arch: `general.architecture`, also the prefix of the `<arch>.*` metadata keys.
    tensors: the GGUF tensor name of every parameter (`{i}`: the layer), in the Hugging Face [out, in] layout.
    permuted_qk: llama.cpp's converter interleaved the RoPE halves of the q/k rows (llama); the loader undoes it.
    rope_freqs: a `rope_freqs.weight` tensor (llama3 scaling as frequency divisors) is read; else it is refused.
  """

  arch: str
  tensors: Mapping[str, str]
  permuted_qk: bool
  rope_freqs: bool


@dataclasses.dataclass(frozen=True)
class FamilySpec:
  """One model family: a row of `FAMILIES`, keyed by the config.json `model_type`.

  Attributes:
    hf_architecture: config.json `architectures[0]` written on export (`LlamaForCausalLM`).
    qk_norm: RMSNorm on q and k (ModelConfig.qk_norm).
    moe: every layer's MLP is routed experts (config.json must give their sizes; ModelConfig.num_experts > 0).
    hf_tensors: the Hugging Face tensor name of every parameter of `family_params(qk_norm, moe)` (more is fine).
    hf_fused_experts: (gate_up_proj, down_proj) names of transformers v5's fused expert layout, accepted on
      input (MoE only); None when the family has none.
    gguf: how llama.cpp stores the family; None when GGUF files of it are not read (the loader reads dense
      models only).
    refusals: config.json fields of this family the decoder cannot honour (the ones all families share, such
      as biases or sliding windows, are `config_from_hf`'s own).
    logical_axes: the logical sharding axes of every parameter (`jaxcredit.sharding`); the decoder's table.

  Raises:
    ValueError: at construction, naming the missing parameters, when hf_tensors, gguf.tensors or logical_axes
      lack one of the family's parameters, or when a dense row has fused expert names or an MoE row a GGUF spec.
  """

  hf_architecture: str
  qk_norm: bool
  moe: bool
  hf_tensors: Mapping[str, str]
  hf_fused_experts: tuple[str, str] | None = None
  gguf: GGUFSpec | None = None
  refusals: tuple[Refusal, ...] = ()
  logical_axes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=lambda: _PARAM_LOGICAL_AXES)

  def __post_init__(self):
    if self.hf_fused_experts is not None and not self.moe:
      raise ValueError(f"FamilySpec({self.hf_architecture}).hf_fused_experts is for MoE families (moe=True)")
    if self.gguf is not None and self.moe:
      raise ValueError(f"FamilySpec({self.hf_architecture}).gguf: the GGUF loader reads dense models only")
    params = family_params(qk_norm=self.qk_norm, moe=self.moe)
    tables = {"hf_tensors": self.hf_tensors, "logical_axes": self.logical_axes}
    if self.gguf is not None:
      tables["gguf.tensors"] = self.gguf.tensors
    for what, table in tables.items():
      missing = [p for p in params if p not in table]
      if missing:
        raise ValueError(f"FamilySpec({self.hf_architecture}).{what} lacks parameters {missing}")

  def params(self) -> tuple[str, ...]:
    """The parameter paths of the family's decoder (`family_params`)."""
    return family_params(qk_norm=self.qk_norm, moe=self.moe)


# Qwen3-MoE config.json fields that put dense layers among the MoE ones: the layers are scanned over one stacked
# parameter set, so every layer must be MoE.
_DENSE_AMONG_MOE = "(dense layers among MoE layers: the layers are scanned over one stacked parameter set)"

FAMILIES: dict[str, FamilySpec] = {
  "llama": FamilySpec(
    "LlamaForCausalLM",
    qk_norm=False,
    moe=False,
    hf_tensors=HF_TENSORS,
    gguf=GGUFSpec("llama", GGUF_TENSORS, permuted_qk=True, rope_freqs=True),
  ),
  "qwen3": FamilySpec(
    "Qwen3ForCausalLM",
    qk_norm=True,
    moe=False,
    hf_tensors=HF_TENSORS,
    gguf=GGUFSpec("qwen3", GGUF_TENSORS, permuted_qk=False, rope_freqs=False),
  ),
  "qwen3_moe": FamilySpec(
    "Qwen3MoeForCausalLM",
    qk_norm=True,
    moe=True,
    hf_tensors=HF_TENSORS,
    hf_fused_experts=HF_FUSED_EXPERTS,
    refusals=(
      Refusal("mlp_only_layers", None, lambda v: not v, "mlp_only_layers {value} " + _DENSE_AMONG_MOE),
      Refusal("decoder_sparse_step", 1, lambda v: v in (None, 1), "decoder_sparse_step {value} " + _DENSE_AMONG_MOE),
    ),
  ),
}


def family_of_config(cfg: ModelConfig, model_type: str | None = None) -> str:
  """The model_type of cfg's row: `model_type` when given (the source config.json's), else the first row of
  `FAMILIES` whose qk_norm and moe are cfg's.

  Raises:
    ValueError: a model_type that is no row, or whose row's features are not cfg's; or, without one, no row
      with cfg's features (naming them and the rows).
  """
  features = f"qk_norm={cfg.qk_norm}, moe={cfg.is_moe}"
  if model_type is not None:
    spec = FAMILIES.get(model_type)
    if spec is None:
      raise ValueError(f"model_type {model_type!r} is not supported; supported: {', '.join(FAMILIES)}")
    if (spec.qk_norm, spec.moe) != (cfg.qk_norm, cfg.is_moe):
      raise ValueError(
        f"model family {model_type!r} has qk_norm={spec.qk_norm}, moe={spec.moe}; the ModelConfig has {features}"
      )
    return model_type
  for name, spec in FAMILIES.items():
    if spec.qk_norm == cfg.qk_norm and spec.moe == cfg.is_moe:
      return name
  rows = ", ".join(f"{t} (qk_norm={s.qk_norm}, moe={s.moe})" for t, s in FAMILIES.items())
  raise ValueError(
    f"no model family has ModelConfig's features {features} (num_experts={cfg.num_experts}); "
    f"jaxcredit.models.families.FAMILIES: {rows}"
  )


def gguf_families() -> dict[str, FamilySpec]:
  """The rows GGUF files are read for, by `general.architecture`."""
  return {spec.gguf.arch: spec for spec in FAMILIES.values() if spec.gguf is not None}
