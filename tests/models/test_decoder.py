"""Decoder semantics on small random configs (no torch): cache path, padding, variants, scan, remat."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jaxcredit.models.config import ModelConfig
from jaxcredit.models.decoder import Decoder, KVCache, init_cache, param_shapes, set_params

BASE = dict(
  vocab_size=97,
  hidden_size=32,
  intermediate_size=48,
  num_layers=3,
  num_heads=4,
  num_kv_heads=2,
  head_dim=8,
  rope_theta=10000.0,
  rms_norm_eps=1e-6,
)


def make(**overrides) -> Decoder:
  return Decoder(ModelConfig(**{**BASE, **overrides}), rngs=nnx.Rngs(0))


def randomize_norms(model: Decoder, seed: int = 1):
  """Norm weights start at ones and N(0, 0.02²) q/k give near-uniform attention: make both matter."""
  for name in ("wq", "wk"):
    getattr(model.layers, name)[...] = 8.0 * getattr(model.layers, name)[...]
  rng = np.random.default_rng(seed)
  for owner, name in [
    (model, "final_norm"),
    (model.layers, "attn_norm"),
    (model.layers, "mlp_norm"),
    (model.layers, "q_norm"),
    (model.layers, "k_norm"),
  ]:
    param = getattr(owner, name)
    if param is not None:
      param[...] = jnp.asarray(1.0 + 0.3 * rng.standard_normal(param[...].shape), param[...].dtype)


@jax.jit
def _apply(graphdef, state, tokens, mask=None, positions=None, cache=None):
  return nnx.merge(graphdef, state)(tokens, token_mask_BxL=mask, positions_BxL=positions, cache=cache)


def apply(model, tokens, mask=None, positions=None, cache=None):
  """The model's (logits, cache) under jit: eager scans retrace on every call."""
  return _apply(*nnx.split(model), tokens, mask, positions, cache)


def _forward(graphdef, state, tokens, mask):
  return _apply(graphdef, state, tokens, mask)[0]


def _forward_cached(graphdef, state, tokens, mask, cache):
  return _apply(graphdef, state, tokens, mask, None, cache)


def test_config_validation_and_round_trip():
  cfg = ModelConfig(**BASE, qk_norm=True, tie_word_embeddings=False, dtype="bfloat16")
  assert ModelConfig.from_dict(json.loads(json.dumps(cfg.to_dict()))) == cfg
  with pytest.raises(ValueError, match="num_kv_heads"):
    ModelConfig(**{**BASE, "num_kv_heads": 3})
  with pytest.raises(ValueError, match="hidden_size"):
    ModelConfig(**{**BASE, "hidden_size": 0})
  with pytest.raises(ValueError, match="dtype"):
    ModelConfig(**BASE, dtype="float8")
  with pytest.raises(ValueError, match="bogus"):
    ModelConfig.from_dict({**BASE, "bogus": 1})
  with pytest.raises(ValueError, match="head_dim"):
    ModelConfig.from_dict({k: v for k, v in BASE.items() if k != "head_dim"})


def test_cache_prefill_and_decode_equal_full_forward():
  model = make(qk_norm=True, rope_theta=500.0)
  randomize_norms(model)
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(0)
  prompt_len, steps, pads = 7, 6, (2, 0)
  total = prompt_len + steps
  tokens = rng.integers(1, BASE["vocab_size"], (2, total)).astype(np.int32)
  mask = np.ones((2, total), bool)
  for row, pad in enumerate(pads):
    tokens[row, :pad] = 0
    mask[row, :pad] = False

  full = np.asarray(_forward(graphdef, state, jnp.asarray(tokens), jnp.asarray(mask)))

  cache = init_cache(model.cfg, 2, 16)
  logits, cache = _forward_cached(
    graphdef, state, jnp.asarray(tokens[:, :prompt_len]), jnp.asarray(mask[:, :prompt_len]), cache
  )
  cached = [np.asarray(logits)]
  for t in range(prompt_len, total):
    logits, cache = _forward_cached(graphdef, state, jnp.asarray(tokens[:, t : t + 1]), jnp.ones((2, 1), bool), cache)
    cached.append(np.asarray(logits))
  cached = np.concatenate(cached, axis=1)
  assert isinstance(cache, KVCache) and int(cache.index) == total
  np.testing.assert_array_equal(np.asarray(cache.mask_BxS[:, :total]), mask)
  assert not np.asarray(cache.mask_BxS[:, total:]).any()
  np.testing.assert_allclose(cached[mask], full[mask], atol=1e-4, rtol=0)

  # The padded row alone, unpadded, gives the same logits: padding neither shifts positions nor leaks into
  # attention.
  pad = pads[0]
  alone = _forward(graphdef, state, jnp.asarray(tokens[:1, pad:]), jnp.ones((1, total - pad), bool))
  np.testing.assert_allclose(np.asarray(alone)[0], full[0, pad:], atol=1e-4, rtol=0)


def test_right_padding_and_pad_queries_are_finite():
  model = make()
  tokens = jnp.asarray([[5, 6, 7, 0, 0], [0, 0, 0, 0, 0]], jnp.int32)
  mask = jnp.asarray([[1, 1, 1, 0, 0], [0, 0, 0, 0, 0]], bool)
  logits, _ = apply(model, tokens, mask)
  assert np.isfinite(np.asarray(logits)).all()
  alone, _ = apply(model, tokens[:1, :3])
  np.testing.assert_allclose(np.asarray(logits[0, :3]), np.asarray(alone[0]), atol=1e-5, rtol=0)


def test_explicit_positions_match_default():
  model = make()
  randomize_norms(model)
  tokens = jnp.asarray([[0, 0, 3, 4, 5]], jnp.int32)
  mask = jnp.asarray([[0, 0, 1, 1, 1]], bool)
  default, _ = apply(model, tokens, mask)
  explicit, _ = apply(model, tokens, mask, jnp.asarray([[0, 0, 0, 1, 2]], jnp.int32))
  shifted, _ = apply(model, tokens, mask, jnp.asarray([[0, 0, 10, 11, 12]], jnp.int32))
  spread, _ = apply(model, tokens, mask, jnp.asarray([[0, 0, 0, 3, 9]], jnp.int32))
  np.testing.assert_array_equal(np.asarray(default), np.asarray(explicit))
  # RoPE is relative: a constant shift changes logits only by float rounding.
  np.testing.assert_allclose(np.asarray(default[0, 2:]), np.asarray(shifted[0, 2:]), atol=1e-4)
  assert np.abs(np.asarray(default[0, 3:]) - np.asarray(spread[0, 3:])).max() > 1e-2


def test_qk_norm_and_untied_variants():
  tokens = jnp.asarray([[1, 2, 3, 4, 5, 6]], jnp.int32)
  base = make()
  qk = make(qk_norm=True)
  untied = make(tie_word_embeddings=False)
  for m in (base, qk, untied):
    randomize_norms(m)
  assert "layers/q_norm" in param_shapes(qk.cfg) and "layers/q_norm" not in param_shapes(base.cfg)
  assert param_shapes(untied.cfg)["lm_head"] == (32, 97)
  logits = {name: np.asarray(apply(m, tokens)[0]) for name, m in [("base", base), ("qk", qk), ("untied", untied)]}
  for value in logits.values():
    assert value.shape == (1, 6, 97) and value.dtype == np.float32 and np.isfinite(value).all()
  assert np.abs(logits["base"] - logits["qk"]).max() > 1e-3
  assert np.abs(logits["base"] - logits["untied"]).max() > 1e-3
  # An untied head set to embeddingᵀ reproduces the tied model; qk-norm with the ones it starts from is not a
  # no-op (it rescales q and k per head).
  state = nnx.to_pure_dict(nnx.state(base, nnx.Param))
  set_params(untied, {**state, "lm_head": state["embedding"].T})
  np.testing.assert_allclose(np.asarray(apply(untied, tokens)[0]), logits["base"], atol=1e-5, rtol=0)


def test_gqa_equals_repeated_kv_heads():
  """A GQA model equals the MHA model whose kv heads are the GQA heads repeated G times."""
  gqa = make(num_kv_heads=2)
  randomize_norms(gqa)
  mha = make(num_kv_heads=4)
  state = nnx.to_pure_dict(nnx.state(gqa, nnx.Param))
  for name in ("wk", "wv"):
    state["layers"][name] = jnp.repeat(state["layers"][name], 2, axis=2)
  set_params(mha, state)
  tokens = jnp.asarray([[7, 8, 9, 10, 11]], jnp.int32)
  np.testing.assert_allclose(np.asarray(apply(gqa, tokens)[0]), np.asarray(apply(mha, tokens)[0]), atol=1e-5, rtol=0)


def test_set_params_rejects_bad_shapes():
  model = make()
  state = nnx.to_pure_dict(nnx.state(model, nnx.Param))
  state["layers"]["wq"] = np.zeros((3, 32, 4, 9), np.float32)
  with pytest.raises(ValueError, match=r"layers/wq.*\(3, 32, 4, 9\).*\(3, 32, 4, 8\)"):
    set_params(model, state)
  del state["final_norm"]
  with pytest.raises(ValueError, match="final_norm"):
    set_params(model, state)


def test_scan_keeps_program_size_flat_in_depth():
  """Layers run as one scan: the compiled program does not grow with the number of layers."""
  sizes = {}
  for layers in (2, 8):
    graphdef, state = nnx.split(make(num_layers=layers))
    lowered = _apply.lower(graphdef, state, jnp.zeros((1, 4), jnp.int32), jnp.ones((1, 4), bool))
    text = lowered.as_text()
    assert "while" in text
    sizes[layers] = len(text)
  assert lowered.compile() is not None
  assert abs(sizes[8] - sizes[2]) < 0.02 * sizes[2], sizes


def _remat_loss(remat, remat_policy="nothing"):
  """A 2-layer model's next-token loss as a function of its state, and that state."""
  tokens = jnp.asarray([[3, 1, 4, 1, 5, 9, 2, 6]], jnp.int32)
  model = make(remat=remat, remat_policy=remat_policy, num_layers=2)
  graphdef, state = nnx.split(model)

  def loss(state):
    logits, _ = nnx.merge(graphdef, state)(tokens[:, :-1])
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), tokens[:, 1:, None], -1))

  return loss, state


@pytest.mark.parametrize("policy", ["nothing", "dots", "dots_no_batch"])
def test_remat_gives_same_loss_and_gradients(policy):
  loss0, state0 = _remat_loss(False)
  loss1, state1 = _remat_loss(True, policy)
  (l0, g0), (l1, g1) = jax.jit(jax.value_and_grad(loss0))(state0), jax.jit(jax.value_and_grad(loss1))(state1)
  np.testing.assert_allclose(float(l0), float(l1), rtol=1e-6)
  for a, b in zip(jax.tree.leaves(g0), jax.tree.leaves(g1)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6, rtol=1e-5)


def test_remat_policy_chooses_what_the_backward_pass_keeps():
  """The policies differ in what the forward pass leaves for the backward pass: nothing but the layer's input, the
  projections' outputs, every matmul's output (attention's two products too), or, without remat, every residual."""

  def saved(remat, policy="nothing"):
    loss, state = _remat_loss(remat, policy)
    _, vjp = jax.vjp(loss, state)
    return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(vjp))

  nothing, no_batch, dots, everything = saved(True), saved(True, "dots_no_batch"), saved(True, "dots"), saved(False)
  assert nothing < no_batch < dots < everything, (nothing, no_batch, dots, everything)


def test_unknown_remat_policy_is_refused_naming_the_field():
  with pytest.raises(ValueError, match="ModelConfig.remat_policy must be one of"):
    make(remat=True, remat_policy="everything")


def test_bfloat16_runs_with_float32_logits_and_cache_errors():
  model = make(dtype="bfloat16")
  assert model.embedding[...].dtype == jnp.bfloat16
  logits, cache = apply(model, jnp.asarray([[1, 2, 3]], jnp.int32), cache=init_cache(model.cfg, 1, 4, jnp.bfloat16))
  assert logits.dtype == jnp.float32 and np.isfinite(np.asarray(logits)).all()
  assert cache.k_NxBxSxKxDh.dtype == jnp.bfloat16 and int(cache.index) == 3
  with pytest.raises(ValueError, match="exceeds"):
    model(jnp.asarray([[1, 2]], jnp.int32), cache=cache)
  with pytest.raises(ValueError, match="cache.k_NxBxSxKxDh"):
    model(jnp.asarray([[1], [2]], jnp.int32), cache=cache)
  with pytest.raises(ValueError, match="max_len"):
    init_cache(model.cfg, 1, 0)


@pytest.mark.parametrize("attention_impl, chunk", [("full", 512), ("chunked", 4)])
def test_prefill_into_an_empty_cache_equals_the_two_part_path(attention_impl, chunk):
  """cache_is_empty=True (the sampler's prefill) attends among the new tokens only, with the cache-free attention
  (chunked for long prompts: no [L, capacity] scores); its logits, cache and the decode after it are unchanged."""
  import dataclasses
  import functools

  model = make(qk_norm=True)
  randomize_norms(model)
  model.cfg = dataclasses.replace(model.cfg, attention_impl=attention_impl, attention_chunk=chunk)
  graphdef, state = nnx.split(model)
  rng = np.random.default_rng(1)
  tokens = rng.integers(1, BASE["vocab_size"], (2, 11)).astype(np.int32)
  mask = np.ones((2, 11), bool)
  mask[0, :3] = False

  @functools.partial(jax.jit, static_argnums=2)
  def prefill(state, cache, empty):
    m = nnx.merge(graphdef, state)
    h, cache = m.hidden_states(jnp.asarray(tokens), token_mask_BxL=jnp.asarray(mask), cache=cache, cache_is_empty=empty)
    return m.logits(h), cache

  outs = [prefill(state, init_cache(model.cfg, 2, 32), empty) for empty in (False, True)]
  np.testing.assert_allclose(np.asarray(outs[0][0])[mask], np.asarray(outs[1][0])[mask], atol=1e-5, rtol=0)
  np.testing.assert_allclose(
    np.asarray(outs[0][1].k_NxBxSxKxDh), np.asarray(outs[1][1].k_NxBxSxKxDh), atol=1e-5, rtol=0
  )
  np.testing.assert_array_equal(np.asarray(outs[0][1].mask_BxS), np.asarray(outs[1][1].mask_BxS))


def test_cache_window_and_merge_write_are_checked():
  model = make()
  tokens = jnp.asarray([[1, 2, 3]], jnp.int32)
  with pytest.raises(ValueError, match="cache_window and merge_write need a cache"):
    model.hidden_states(tokens, cache_window=4)
  with pytest.raises(ValueError, match="cache_window and merge_write need a cache"):
    model.hidden_states(tokens, merge_write=True)
  cache = init_cache(model.cfg, 1, 8)
  with pytest.raises(ValueError, match="cache_window must be an int in"):
    model.hidden_states(tokens, cache=cache, cache_window=9)
  with pytest.raises(ValueError, match="cannot be combined with cache_is_empty"):
    model.hidden_states(tokens, cache=cache, cache_is_empty=True, merge_write=True)


def test_merge_write_keeps_the_real_slots_inside_its_block():
  """Row 0's cache holds 5 tokens at slots [0, 5); a 4-slot block at [2, 6) writes one new token at slot 5 and
  keeps slots 2-4. Its logits and the cache equal a plain extension of the same token after index 5."""
  model = make()
  graphdef, state = nnx.split(model)

  @jax.jit
  def run(state, prefix, token):
    m = nnx.merge(graphdef, state)
    _, cache = m(prefix, cache=init_cache(m.cfg, 1, 8))
    plain_logits, plain = m(token, positions_BxL=jnp.asarray([[5]]), cache=cache)
    block = jnp.concatenate([jnp.zeros((1, 3), jnp.int32), token], axis=1)
    mask = jnp.asarray([[False, False, False, True]])
    positions = jnp.asarray([[0, 0, 0, 5]])
    merged_logits, merged = m(
      block, positions_BxL=positions, token_mask_BxL=mask, cache=cache.replace(index=jnp.int32(2)), merge_write=True
    )
    return plain_logits[:, -1], plain, merged_logits[:, -1], merged

  plain_logits, plain, merged_logits, merged = run(
    state, jnp.asarray([[3, 1, 4, 1, 5]], jnp.int32), jnp.asarray([[9]], jnp.int32)
  )
  np.testing.assert_allclose(np.asarray(merged_logits), np.asarray(plain_logits), atol=1e-5, rtol=0)
  np.testing.assert_array_equal(np.asarray(merged.mask_BxS), np.asarray(plain.mask_BxS))
  np.testing.assert_allclose(
    np.asarray(merged.k_NxBxSxKxDh[:, :, :6]), np.asarray(plain.k_NxBxSxKxDh[:, :, :6]), atol=1e-6, rtol=0
  )
  assert int(merged.index) == int(plain.index) == 6
