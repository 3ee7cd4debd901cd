"""The tensor map between a Hugging Face checkpoint (Llama, Qwen3, Qwen3-MoE) and our parameters: one `Slot` per
HF tensor part and the parameter slice it fills, and `plan_conversion`, which checks a checkpoint's tensors against
its config before anything is written. The tensor names are the family's (`FamilySpec.hf_tensors` of
`jaxcredit.models.families.FAMILIES`); the layout below is the decoder's, the same for every family.

Shape letters: N layers, D model width, H query heads, K kv heads, Dh head width, F MLP width, E experts,
Fm expert MLP width, V vocabulary.

Layout (HF nn.Linear weights are [out, in]; ours are input-major, reshaped to heads, stacked over layers):
    model.embed_tokens.weight [V, D]                   -> embedding [V, D]
    model.norm.weight [D]                              -> final_norm [D]
    lm_head.weight [V, D]                              -> lm_head [D, V] (transposed; absent when tied)
    model.layers.{i}.input_layernorm.weight            -> layers/attn_norm[i]
    model.layers.{i}.post_attention_layernorm.weight   -> layers/mlp_norm[i]
    model.layers.{i}.self_attn.{q,k,v}_proj.weight     -> layers/w{q,k,v}[i] [D, H|K, Dh]
    model.layers.{i}.self_attn.o_proj.weight           -> layers/wo[i] [H, Dh, D]
    model.layers.{i}.self_attn.{q,k}_norm.weight       -> layers/{q,k}_norm[i] [Dh] (Qwen3)
    model.layers.{i}.mlp.{gate,up,down}_proj.weight    -> layers/w_{gate,up,down}[i] (dense)
    model.layers.{i}.mlp.gate.weight [E, D]            -> layers/router[i] [D, E] (MoE)
    model.layers.{i}.mlp.experts.{e}.{gate,up,down}_proj.weight -> layers/we_{gate,up,down}[i, e]
    model.layers.{i}.mlp.experts.gate_up_proj [E, 2Fm, D] and .down_proj [E, D, Fm] (the fused layout of
        transformers v5's in-memory module) are accepted on input; export writes the per-expert layout.
RoPE needs no permutation (HF and our decoder both use rotate_half). `rotary_emb.inv_freq` buffers of old
checkpoints are skipped, and so is `lm_head.weight` when the config ties the embeddings and it equals them (a head
that differs is refused: transformers would keep it untied).
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Mapping

import numpy as np

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.families import FAMILIES, family_of_config
from jaxcredit.models.safetensors_io import TensorInfo, read_tensor

# Parameter dtypes a converted checkpoint may hold (ModelConfig.dtype names), by safetensors code.
_PARAM_DTYPES = {"F32": "float32", "BF16": "bfloat16", "F16": "float16"}
_SKIPPED = re.compile(r"model\.layers\.\d+\.self_attn\.rotary_emb\.inv_freq")


@dataclasses.dataclass(frozen=True)
class Slot:
  """One HF tensor's part that fills one slice of one of our parameters.

  ours = hf[rows].T (2-D, or over the last two axes of a 3-D expert block) reshaped to the slice's shape when
  `transpose`, else hf reshaped; `rows` selects along the HF output axis (the fused gate_up_proj's halves).
  """

  hf_name: str
  hf_shape: tuple[int, ...]
  param: str
  index: tuple[int, ...]
  transpose: bool
  rows: tuple[int, int] | None = None

  def to_ours(self, hf: np.ndarray, slice_shape: tuple[int, ...]) -> np.ndarray:
    if self.rows is not None:
      hf = hf[:, self.rows[0] : self.rows[1]]
    if self.transpose:
      hf = np.swapaxes(hf, -1, -2)
    return hf.reshape(slice_shape)

  def to_hf(self, ours: np.ndarray) -> np.ndarray:
    assert self.rows is None, "export writes the per-expert layout"
    if self.transpose:
      return np.ascontiguousarray(ours.reshape(self.hf_shape[::-1]).T)
    return ours.reshape(self.hf_shape)


def param_slots(cfg: ModelConfig, names: Mapping[str, str]) -> list[Slot]:
  """Every tensor of cfg's checkpoint in the Hugging Face layout (per-expert MoE layout) with the parameter slice it
  maps to, named by `names` (parameter path -> tensor name template, `{i}` the layer, `{e}` the expert: a
  `FamilySpec.hf_tensors` or `GGUFSpec.tensors`), in transformers' order: embedding, layer by layer, final norm,
  lm_head (when untied)."""
  d, v, f = cfg.hidden_size, cfg.vocab_size, cfg.intermediate_size
  h, k, dh = cfg.num_heads, cfg.num_kv_heads, cfg.head_dim

  def slot(param, index, hf_shape, transpose):
    i, e = (*index, None, None)[:2]
    return Slot(names[param].format(i=i, e=e), hf_shape, param, index, transpose)

  slots = [slot("embedding", (), (v, d), False)]
  for i in range(cfg.num_layers):
    slots += [
      slot("layers/attn_norm", (i,), (d,), False),
      slot("layers/wq", (i,), (h * dh, d), True),
      slot("layers/wk", (i,), (k * dh, d), True),
      slot("layers/wv", (i,), (k * dh, d), True),
      slot("layers/wo", (i,), (d, h * dh), True),
    ]
    if cfg.qk_norm:
      slots += [slot("layers/q_norm", (i,), (dh,), False), slot("layers/k_norm", (i,), (dh,), False)]
    slots.append(slot("layers/mlp_norm", (i,), (d,), False))
    if cfg.is_moe:
      fm = cfg.moe_intermediate_size
      slots.append(slot("layers/router", (i,), (cfg.num_experts, d), True))
      for e in range(cfg.num_experts):
        slots += [
          slot("layers/we_gate", (i, e), (fm, d), True),
          slot("layers/we_up", (i, e), (fm, d), True),
          slot("layers/we_down", (i, e), (d, fm), True),
        ]
    else:
      slots += [
        slot("layers/w_gate", (i,), (f, d), True),
        slot("layers/w_up", (i,), (f, d), True),
        slot("layers/w_down", (i,), (d, f), True),
      ]
  slots.append(slot("final_norm", (), (d,), False))
  if not cfg.tie_word_embeddings:
    slots.append(slot("lm_head", (), (v, d), True))
  return slots


def hf_slots(cfg: ModelConfig, model_type: str | None = None) -> list[Slot]:
  """Every HF tensor of cfg's checkpoint (per-expert MoE layout) with the parameter slice it maps to, named by the
  `hf_tensors` of the row of `FAMILIES` for cfg (`family_of_config`: model_type's, else the first with cfg's
  features), in transformers' order: embedding, layer by layer, final norm, lm_head (when untied).

  Raises:
    ValueError: as `family_of_config`.
  """
  return param_slots(cfg, FAMILIES[family_of_config(cfg, model_type)].hf_tensors)


def _fused_expert_slots(cfg: ModelConfig, i: int, model_type: str | None = None) -> list[Slot]:
  """Layer i's experts in transformers v5's fused layout (the row's `hf_fused_experts`): gate_up_proj [E, 2Fm, D]
  (gate rows first), down_proj [E, D, Fm]."""
  e, d, fm = cfg.num_experts, cfg.hidden_size, cfg.moe_intermediate_size
  gate_up, down = (name.format(i=i) for name in FAMILIES[family_of_config(cfg, model_type)].hf_fused_experts)
  return [
    Slot(gate_up, (e, 2 * fm, d), "layers/we_gate", (i,), True, (0, fm)),
    Slot(gate_up, (e, 2 * fm, d), "layers/we_up", (i,), True, (fm, 2 * fm)),
    Slot(down, (e, d, fm), "layers/we_down", (i,), True),
  ]


def _first(names: list[str], limit: int = 5) -> str:
  more = f" and {len(names) - limit} more" if len(names) > limit else ""
  return ", ".join(repr(n) for n in names[:limit]) + more


def plan_conversion(
  cfg: ModelConfig, inventory: Mapping[str, TensorInfo], where: str = "checkpoint", model_type: str | None = None
) -> dict[str, list[Slot]]:
  """Checks the checkpoint's tensors against cfg and maps each HF tensor name to the slots it fills, under the
  tensor names of model_type's row of `FAMILIES` (the config.json's; default: the first row with cfg's features).

  Raises:
    ValueError: one line naming `where` and the tensor(s): a missing tensor (with the shape the config
      implies), a tensor of another shape (actual and expected), tensors the config does not describe, a
      dtype other than F32/BF16/F16, or one parameter's tensors stored in different dtypes; as
      `family_of_config`.
  """
  model_type = family_of_config(cfg, model_type)
  family = FAMILIES[model_type]
  slots = hf_slots(cfg, model_type)
  if family.hf_fused_experts is not None:
    gate_up = family.hf_fused_experts[0]
    fused = {i for i in range(cfg.num_layers) if gate_up.format(i=i) in inventory}
    experts = ("layers/we_gate", "layers/we_up", "layers/we_down")
    slots = [s for s in slots if not (s.param in experts and s.index[0] in fused)]
    slots += [s for i in sorted(fused) for s in _fused_expert_slots(cfg, i, model_type)]
  plan: dict[str, list[Slot]] = collections.defaultdict(list)
  for slot in slots:
    plan[slot.hf_name].append(slot)
  missing = [n for n in plan if n not in inventory]
  if missing:
    raise ValueError(
      f"{where} does not match its config.json: tensor {missing[0]!r} is missing (the config "
      f"implies shape {plan[missing[0]][0].hf_shape})"
      + (f"; {len(missing) - 1} more are missing" if len(missing) > 1 else "")
    )
  for name, (slot, *_) in plan.items():
    if inventory[name].shape != slot.hf_shape:
      raise ValueError(
        f"{where} does not match its config.json: tensor {name!r} has shape "
        f"{inventory[name].shape}, the config implies {slot.hf_shape}"
      )
  skipped = set()
  head_name, embed_name = family.hf_tensors["lm_head"], family.hf_tensors["embedding"]
  if cfg.tie_word_embeddings and head_name in inventory:
    head, embed = inventory[head_name], inventory.get(embed_name)
    if (
      embed is None
      or head.shape != embed.shape
      or head.dtype != embed.dtype
      or not np.array_equal(read_tensor(head), read_tensor(embed))
    ):
      raise ValueError(
        f"{where}: config.json ties the embeddings (tie_word_embeddings=true) but tensor "
        f"{head_name!r} differs from {embed_name!r} (transformers keeps such a "
        f"head untied); set tie_word_embeddings to false in config.json"
      )
    skipped.add(head_name)  # a stored copy of the tied embedding
  unexpected = [n for n in inventory if n not in plan and n not in skipped and not _SKIPPED.fullmatch(n)]
  if unexpected:
    raise ValueError(
      f"{where} does not match its config.json: unexpected tensors {_first(unexpected)} "
      f"(not part of a {cfg.num_layers}-layer {'MoE ' if cfg.is_moe else ''}model of this config)"
    )
  dtypes: dict[str, tuple[str, str]] = {}
  for name, param_slots in plan.items():
    code = inventory[name].dtype
    if code not in _PARAM_DTYPES:
      raise ValueError(f"{where}: tensor {name!r} has dtype {code}; supported: {sorted(_PARAM_DTYPES)}")
    for slot in param_slots:
      seen = dtypes.setdefault(slot.param, (code, name))
      if seen[0] != code:
        raise ValueError(
          f"{where}: tensors {seen[1]!r} ({seen[0]}) and {name!r} ({code}) of parameter "
          f"{slot.param} differ in dtype; pass a dtype to convert to one"
        )
  return dict(plan)
