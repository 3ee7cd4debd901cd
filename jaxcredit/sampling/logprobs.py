"""Log-probabilities of tokens under a temperature-scaled policy, shared by the sampler and the trainer.

Both record log softmax(logits / temperature) of the *untruncated* distribution: top-p changes which token
is drawn, never the recorded log-prob, so the on-policy ratio is exactly 1 up to floating point.

Letters: B batch, L tokens, V vocabulary.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def temperature_log_softmax(logits_xV: jax.Array, temperature: float | jax.Array) -> jax.Array:
    """log softmax(logits / temperature) over the last axis, in float32 nats.

    Args:
        logits_xV: float logits, any leading shape, vocabulary last.
        temperature: positive scalar (Python float or traced array).

    Returns:
        float32 array with the shape of `logits_xV`.
    """
    return jax.nn.log_softmax(logits_xV.astype(jnp.float32) / jnp.asarray(temperature, jnp.float32), axis=-1)


def logprobs_from_logits(logits_BxLxV: jax.Array, tokens_BxL: jax.Array, token_mask_BxL: jax.Array,
                         temperature: float | jax.Array) -> jax.Array:
    """Per-token log-probs of a sequence from the logits of a full forward pass over it.

        logp[b, t] = log softmax(logits[b, t-1] / temperature)[tokens[b, t]]   if mask[b, t] and mask[b, t-1]
        logp[b, t] = 0                                                          otherwise (incl. t = 0)

    So the first real token of every row (which has no real prefix; left or right padding alike) and every
    padding token get 0.

    Args:
        logits_BxLxV: logits, position t predicting token t+1.
        tokens_BxL: int token ids.
        token_mask_BxL: bool, True where the slot holds a real token.
        temperature: positive scalar.

    Returns:
        logp_BxL: float32 nats.

    Raises:
        ValueError: for mismatched ranks or shapes (at trace time).
    """
    if logits_BxLxV.ndim != 3:
        raise ValueError(f"logits_BxLxV must have rank 3, got shape {logits_BxLxV.shape}")
    if tokens_BxL.shape != logits_BxLxV.shape[:2] or token_mask_BxL.shape != tokens_BxL.shape:
        raise ValueError(f"tokens_BxL {tokens_BxL.shape} and token_mask_BxL {token_mask_BxL.shape} must equal the "
                         f"first two dims of logits_BxLxV {logits_BxLxV.shape}")
    logp_BxLm1xV = temperature_log_softmax(logits_BxLxV[:, :-1], temperature)
    next_BxLm1 = tokens_BxL[:, 1:].astype(jnp.int32)
    logp_BxLm1 = jnp.take_along_axis(logp_BxLm1xV, next_BxLm1[..., None], axis=-1)[..., 0]
    mask_BxL = token_mask_BxL.astype(bool)
    valid_BxLm1 = mask_BxL[:, 1:] & mask_BxL[:, :-1]
    logp_BxLm1 = jnp.where(valid_BxLm1, logp_BxLm1, 0.0)
    return jnp.pad(logp_BxLm1, ((0, 0), (1, 0)))


def sequence_logprobs(model, tokens_BxL: jax.Array, token_mask_BxL: jax.Array,
                      temperature: float | jax.Array) -> jax.Array:
    """Per-token log-probs of `tokens_BxL` under `model`, one full forward pass without a cache.

    logp[b, t] is the log-prob (nats) of token t given the tokens before it, under log softmax(logits /
    temperature), untruncated: the prediction made at position t-1 is stored at position t, aligned with the
    token it scores. It is 0 at t = 0, at each row's first real token and at padding (see `logprobs_from_logits`).
    Positions are cumsum(mask) - 1, so left-padded rows score as if unpadded.

    Works eagerly or inside a transform (nnx.jit, or jax.jit over nnx.merge(graphdef, state)).

    Args:
        model: a `jaxcredit.models.Decoder` (called as model(tokens, positions_BxL=..., token_mask_BxL=...)).
        tokens_BxL: int token ids.
        token_mask_BxL: bool, True where the slot holds a real token.
        temperature: positive scalar, the sampler's temperature.

    Returns:
        logp_BxL: float32 nats.
    """
    mask_BxL = jnp.asarray(token_mask_BxL).astype(bool)
    tokens_BxL = jnp.asarray(tokens_BxL).astype(jnp.int32)
    positions_BxL = jnp.maximum(jnp.cumsum(mask_BxL.astype(jnp.int32), axis=-1) - 1, 0)
    logits_BxLxV, _ = model(tokens_BxL, positions_BxL=positions_BxL, token_mask_BxL=mask_BxL)
    return logprobs_from_logits(logits_BxLxV, tokens_BxL, mask_BxL, temperature)
