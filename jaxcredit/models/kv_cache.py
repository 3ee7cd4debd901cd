"""The decoder's key/value cache for incremental decoding: the `KVCache` pytree and `init_cache`.

Shape letters: N layers, B batch, S cache slots, K key/value heads, Dh head width.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np

from jaxcredit.models.config import ModelConfig


class KVCache(flax.struct.PyTreeNode):
  """Per-layer keys and values of the tokens seen so far, for incremental decoding.

  Batch rows share slot indices: slot s of every row was written by the same call, so a sampler left-pads its
  prompts and marks the pads False in `mask_BxS`.

  Attributes:
    k_NxBxSxKxDh: keys after RoPE (and qk-norm), one [B, S, K, Dh] block per layer.
    v_NxBxSxKxDh: values, same layout.
    mask_BxS: bool, True where the slot holds a real (non-pad) token; pads and unwritten slots are never keys.
    index: int32 scalar, the next slot to write (slots [0, index) are written).
  """

  k_NxBxSxKxDh: jax.Array
  v_NxBxSxKxDh: jax.Array
  mask_BxS: jax.Array
  index: jax.Array

  @property
  def capacity(self) -> int:
    """S, the number of slots."""
    return self.mask_BxS.shape[1]


def init_cache(cfg: ModelConfig, batch: int, max_len: int, dtype=jnp.float32) -> KVCache:
  """Returns an empty cache with `max_len` slots for `batch` rows.

  Args:
    cfg: the model's config (N, K, Dh come from it).
    batch: B.
    max_len: S, the capacity: prompt plus generated tokens must fit.
    dtype: storage dtype of keys and values.

  Returns:
    A KVCache with zero keys/values of shape [N, B, S, K, Dh], an all-False mask_BxS and index 0.

  Raises:
    ValueError: when batch or max_len is not a positive int.
  """
  for name, value in (("batch", batch), ("max_len", max_len)):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value <= 0:
      raise ValueError(f"init_cache: {name} must be a positive int, got {value!r}")
  shape = (cfg.num_layers, batch, max_len, cfg.num_kv_heads, cfg.head_dim)
  return KVCache(
    k_NxBxSxKxDh=jnp.zeros(shape, dtype),
    v_NxBxSxKxDh=jnp.zeros(shape, dtype),
    mask_BxS=jnp.zeros((batch, max_len), jnp.bool_),
    index=jnp.zeros((), jnp.int32),
  )
