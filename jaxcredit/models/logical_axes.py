"""The decoder's logical axes (see jaxcredit.sharding): one table from every parameter path to the logical names of
its axes, the activations' axes, and the lookup that optimizer states (which nest parameter paths) go through.

Modules annotate logical axes only; `jaxcredit.sharding`'s rules map them to mesh axes. Kept apart from the
Decoder module so that the table is read (by sharding rules, checkpoint loading) without building a model.
"""

from __future__ import annotations

# Logical axes (see jaxcredit.sharding) of every parameter, by the '/'-joined path under the Decoder.
_PARAM_LOGICAL_AXES = {
  "embedding": ("vocab", "embed"),
  "lm_head": ("embed", "vocab"),
  "final_norm": ("norm",),
  "layers/attn_norm": ("layers", "norm"),
  "layers/mlp_norm": ("layers", "norm"),
  "layers/q_norm": ("layers", "norm"),
  "layers/k_norm": ("layers", "norm"),
  "layers/wq": ("layers", "embed", "q_heads", "head_dim"),
  "layers/wk": ("layers", "embed", "kv_heads", "head_dim"),
  "layers/wv": ("layers", "embed", "kv_heads", "head_dim"),
  "layers/wo": ("layers", "q_heads", "head_dim", "embed"),
  "layers/w_gate": ("layers", "embed", "mlp"),
  "layers/w_up": ("layers", "embed", "mlp"),
  "layers/w_down": ("layers", "mlp", "embed"),
  "layers/router": ("layers", "embed", "router_experts"),
  "layers/we_gate": ("layers", "expert", "embed", "mlp"),
  "layers/we_up": ("layers", "expert", "embed", "mlp"),
  "layers/we_down": ("layers", "expert", "mlp", "embed"),
}
ACTIVATION_AXES = ("activation_batch", "activation_length", "activation_embed")


def default_logical_axes(path: str, ndim: int) -> tuple[str | None, ...]:
  """The logical axes of the parameter whose path ends `path` (optimizer states nest parameter paths).

  Raises:
    ValueError: a path that names no decoder parameter, or a rank that does not match it.
  """
  for name, logical in _PARAM_LOGICAL_AXES.items():
    if path == name or path.endswith("/" + name):
      if len(logical) != ndim:
        raise ValueError(f"parameter {path!r} has rank {ndim}; its logical axes are {logical}")
      return logical
  if ndim == 0:
    return ()
  raise ValueError(f"no sharding rule for parameter {path!r}; known parameters: {sorted(_PARAM_LOGICAL_AXES)}")
