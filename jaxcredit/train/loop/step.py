"""The jitted update steps: policy gradient (PPO-clip on token advantages) and supervised warm start.

The model enters functionally: `graphdef` (static) plus the parameter pytree, so new parameters never
recompile. Micro-batches are scanned inside one jit: each contributes its numerator to the gradient and
the denominator is computed from the masks of the whole batch first, so accumulation is exact
(credit.md, "Losses").

Shape letters: B sequences, L tokens, M micro-batches.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh

from jaxcredit import sharding
from jaxcredit.trajectory import DistillInput, LossInput, UpdateBatch, VocabKLInput, batch_key
from jaxcredit.models.logprobs import (
  chunked_logprobs_and_entropies,
  chunked_reverse_kl,
  packed_slot_logprobs,
  predictor_hidden_states,
  sequence_logprobs,
)
from jaxcredit.train.loop import loss as loss_lib


@dataclasses.dataclass(frozen=True)
class PolicyLossConfig:
  """Knobs of the policy-gradient loss (see `jaxcredit.train.loop.loss`)."""

  eps_low: float = 0.2
  eps_high: float = 0.2
  dual_clip: float | None = None
  max_log_ratio: float = 20.0
  aggregation: str = "token-mean"
  kl_coef: float = 0.0
  kl_estimator: str = "k3"
  temperature: float = 1.0
  terms: tuple[str, ...] = ("policy",)  # LOSS_TERMS names; "kl" joins when kl_coef > 0
  # The weights of the loss terms a method declares (each its `LossTerm.knob`: ToolOPD's distill_coef, HSD's beta, a
  # term a config file adds), as (knob, weight) pairs set from the method's knobs (`update.loss_config_of`).
  knob_weights: tuple[tuple[str, float], ...] = ()
  # Loss terms whose gradient is capped relative to the rest's: (term, ratio) pairs, the term's gradient scaled so
  # that its norm is at most ratio times the norm of the other terms' gradient (`loss_and_grads`); set from a term's
  # `LossTerm.cap_knob` (ToolOPD's distillation: `credit.toolopd.distill_max_grad_ratio`).
  grad_caps: tuple[tuple[str, float], ...] = ()
  # L_max of the seq-mean-token-sum-norm aggregation (Dr.GRPO's constant; the trainer passes sampling.max_len).
  # None: the padded length of an unpacked batch (which varies with the length bucket); packed batches need it.
  max_len: int | None = None

  def __post_init__(self):
    if self.aggregation not in loss_lib.AGGREGATIONS:
      raise ValueError(f"config.loss.aggregation must be one of {loss_lib.AGGREGATIONS}, got {self.aggregation!r}")
    if self.kl_estimator not in loss_lib.KL_ESTIMATORS:
      raise ValueError(f"config.loss.kl_estimator must be one of {loss_lib.KL_ESTIMATORS}, got {self.kl_estimator!r}")
    if self.temperature <= 0:
      raise ValueError(f"config.sampling.temperature must be > 0, got {self.temperature}")
    if self.kl_coef < 0:
      raise ValueError(f"config.loss.kl_coef must be >= 0, got {self.kl_coef}")
    if self.max_len is not None and self.max_len < 1:
      raise ValueError(f"the loss's max_len (config.sampling.max_len) must be >= 1, got {self.max_len}")
    unknown = [t for t in self.terms if t not in LOSS_TERMS]
    if unknown:
      raise ValueError(f"unknown loss terms {unknown}; known: {sorted(LOSS_TERMS)}")
    for pair in self.grad_caps:
      if not (isinstance(pair, tuple) and len(pair) == 2 and pair[0] in LOSS_TERMS):
        raise ValueError(f"PolicyLossConfig.grad_caps holds (loss term, ratio) pairs, got {pair!r}")
      if isinstance(pair[1], bool) or not isinstance(pair[1], (int, float)) or not pair[1] > 0:
        raise ValueError(f"the gradient cap of loss term {pair[0]!r} must be a ratio > 0 (inf: none), got {pair[1]!r}")
    for pair in self.knob_weights:
      if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str)):
        raise ValueError(f"PolicyLossConfig.knob_weights holds (knob name, weight) pairs, got {pair!r}")
      if isinstance(pair[1], bool) or not isinstance(pair[1], (int, float)) or not math.isfinite(pair[1]):
        raise ValueError(
          f"PolicyLossConfig.knob_weights: the weight of {pair[0]!r} must be a finite number, got {pair[1]!r}"
        )

  def weight(self, knob: str) -> float:
    """A loss term's weight by the name of its knob (`LossTerm.knob`), from `knob_weights`.

    Raises:
      KeyError: naming the knob when `knob_weights` lacks it (a method that declares the term must have the knob).
    """
    weights = dict(self.knob_weights)
    if knob not in weights:
      raise KeyError(f"no loss weight {knob!r} in knob_weights {sorted(weights)}")
    return float(weights[knob])


OPTIMIZERS = {
  # name -> (learning rate or schedule, weight_decay, b1, b2) -> the update rule (after the optional clipping).
  "adamw": lambda lr, weight_decay, b1, b2: optax.adamw(lr, b1=b1, b2=b2, weight_decay=weight_decay),
  # Plain SGD (weight decay added to the gradient when > 0): what equality tests of gradients use, since with
  # learning rate 1 the parameter change is the gradient itself.
  "sgd": lambda lr, weight_decay, b1, b2: optax.chain(
    *([optax.add_decayed_weights(weight_decay)] if weight_decay else []), optax.sgd(lr)
  ),
}
"""The optimizers `config.optim.name` chooses from."""


def make_optimizer(
  learning_rate: float,
  *,
  name: str = "adamw",
  warmup_steps: int = 0,
  weight_decay: float = 0.0,
  max_grad_norm: float | None = 1.0,
  b1: float = 0.9,
  b2: float = 0.999,
) -> optax.GradientTransformation:
  """`OPTIMIZERS[name]` (AdamW by default) with linear warmup then a constant rate (the schedule never depends on
  the run length, so a run can be extended on resume), after clipping the global gradient norm to `max_grad_norm`
  (0 or None: no clipping).

  Raises:
    ValueError: a learning rate <= 0, a negative `max_grad_norm` (a negative clip scales the gradient by a negative
      factor: an update up the gradient), or an unknown name.
  """
  if learning_rate <= 0:
    raise ValueError(f"learning rate must be > 0, got {learning_rate}")
  if max_grad_norm is not None and not max_grad_norm >= 0:
    raise ValueError(f"max_grad_norm must be >= 0 (0 or None: no clipping), got {max_grad_norm}")
  if name not in OPTIMIZERS:
    raise ValueError(f"unknown optimizer {name!r}; known: {sorted(OPTIMIZERS)}")
  schedule = (
    optax.join_schedules(
      [optax.linear_schedule(0.0, learning_rate, max(warmup_steps, 1)), optax.constant_schedule(learning_rate)],
      [max(warmup_steps, 1)],
    )
    if warmup_steps > 0
    else learning_rate
  )
  chain = [optax.clip_by_global_norm(max_grad_norm)] if max_grad_norm else []
  chain.append(OPTIMIZERS[name](schedule, weight_decay, b1, b2))
  return optax.chain(*chain)


def split_model(model: nnx.Module):
  """(graphdef, params, rest): params are the trainable nnx.Param leaves."""
  return nnx.split(model, nnx.Param, ...)


def _logp(graphdef, params, rest, tokens, token_mask, temperature):
  model = nnx.merge(graphdef, params, rest)
  return sequence_logprobs(model, tokens, token_mask, temperature)


# Loss terms (optax style: one function each, combined by the config). A term maps the current log-probs and a
# micro-batch to per-token values; `loss_and_grads` aggregates each with its own mode into (numerator,
# denominator) over the whole batch and sums coef * numerator / denominator.


def policy_term(logp_NxK, mb: UpdateBatch, cfg: PolicyLossConfig):
  """PPO-clip on the token advantages `mb.adv_NxK` (`loss.ppo_clip_token_loss`)."""
  tok_loss, clipped = loss_lib.ppo_clip_token_loss(
    logp_NxK,
    mb.behavior_logp_NxK,
    mb.adv_NxK,
    eps_low=cfg.eps_low,
    eps_high=cfg.eps_high,
    dual_clip=cfg.dual_clip,
    max_log_ratio=cfg.max_log_ratio,
  )
  ratio_dev = jnp.abs(jnp.exp(logp_NxK - mb.behavior_logp_NxK) - 1.0)
  if mb.behavior_weight_NxK is not None:
    # Rollouts from another engine: behavior_logp_NxK is the trainer's own log-prob at sampling time (the proximal
    # policy of decoupled PPO) and this truncated weight min(pi_trainer / pi_engine, cap) corrects for the engine
    # (docs/engines.md, "Engine and trainer log-probs").
    tok_loss = tok_loss * mb.behavior_weight_NxK
  return tok_loss, {"clip": clipped, "ratio_dev": ratio_dev}


def kl_term(logp_NxK, mb: UpdateBatch, cfg: PolicyLossConfig):
  """k-estimator KL to the reference log-probs `mb.ref_logp_NxK` (`loss.kl_penalty`)."""
  kl = loss_lib.kl_penalty(logp_NxK, mb.ref_logp_NxK, cfg.kl_estimator)
  return kl, {"kl": kl}


def distill_term(logp_NxK, mb: UpdateBatch, cfg: PolicyLossConfig):
  """Weighted sampled-token reverse KL toward a teacher: w_i · sg(log π_i - log π_teacher,i) · log π_i, whose
  gradient is w_i · (log π_i - log π_teacher,i) ∇log π_i (ToolOPD's distillation term; docs/methods/toolopd.md).
  The weight (`DistillInput.distill_weight_BxL`) is 0 on tokens the method does not credit and on invalid teacher
  passes."""
  gap = jax.lax.stop_gradient(logp_NxK - mb.inputs_NxK["distill_target"])
  return mb.inputs_NxK["distill_weight"] * gap * logp_NxK, {"distill_gap": gap}


def reference_kl_term(logp_NxK, mb: UpdateBatch, cfg: PolicyLossConfig):
  """A method's own KL to the frozen reference (HSD's beta KL(pi_theta || pi_0)): the k-estimator of `kl_term`,
  weighted by the method's knob `beta` rather than `loss.kl_coef`."""
  kl = loss_lib.kl_penalty(logp_NxK, mb.ref_logp_NxK, cfg.kl_estimator)
  return kl, {"reference_kl": kl}


def vocab_kl_term(logp_NxK, mb: UpdateBatch, cfg: PolicyLossConfig, *, student):
  """Full-vocabulary KL(teacher || student) at each scored token, weighted by `vocab_kl_weight_BxL` (HSD's
  objective; docs/methods/hsd.md):

      kl_t = Σ_v q_t(v) (log q_t(v) - log p_t(v)),  q_t = softmax(sg(h_teacher,t) · sg(W) / T),
                                                    p_t = softmax(h_t · W / T)

  with h_teacher = `VocabKLInput.teacher_hidden_BxLxD` (the teacher's final hidden state that predicted the token, from the
  pass), W the current output head (stop-gradient on the teacher's side), h_t the student's hidden state
  (`student` = (h_BxLxD, head_DxV), `predictor_hidden_states`) and T the sampling temperature. Computed chunked over
  the vocabulary (`models.logprobs.chunked_reverse_kl` with the teacher as its first model), so no [B, L, V] array
  exists; the gradient flows into the student only."""
  h_NxKxD, head_DxV = student
  teacher_NxKxD = jax.lax.stop_gradient(mb.inputs_NxK["teacher_hidden"].astype(h_NxKxD.dtype))
  kl = chunked_reverse_kl(teacher_NxKxD, jax.lax.stop_gradient(head_DxV), h_NxKxD, head_DxV, cfg.temperature)
  weight = mb.inputs_NxK["vocab_kl_weight"]
  return jnp.where(weight > 0, weight * kl, 0.0), {"vocab_kl": jnp.where(weight > 0, kl, 0.0)}


def nll_term(logp_NxK, mb: UpdateBatch, cfg: PolicyLossConfig):
  """Cross-entropy on the action tokens (supervised warm start)."""
  return loss_lib.token_cross_entropy(logp_NxK), {"nll": -logp_NxK}


TRAINER_ARRAYS = frozenset({"adv", "ref_logp"})
"""Loss-term arrays the trainer fills whenever an active term reads them (`UpdateBatch.adv_NxK`, the method's
advantages; `UpdateBatch.ref_logp_NxK`, the reference's log-probs of the sampled tokens: `update.loss_batch`); a
term's own input (`LossTerm.input`) is the method's (`UpdateBatch.inputs_NxK`)."""
RESERVED_KEYS = frozenset({"action_mask", "behavior_logp", "behavior_weight"}) | TRAINER_ARRAYS
"""Names of the update batch's own per-slot arrays (`UpdateBatch.scored_arrays`), which no loss input may take."""


@dataclasses.dataclass(frozen=True)
class LossTerm:
  """One row of `LOSS_TERMS`: the per-token function, its coefficient and its aggregation, read from the config.

  The weight has one of two sources: a knob of the method that declares the term (`knob`, `coef` None:
  `PolicyLossConfig.weight(knob)`, set from the method's node by `update.loss_config_of`; ToolOPD's distillation,
  HSD's reference KL, a config file's term alike, docs/extending.md), or `coef` for the trainer's own terms (the
  policy term, the reference KL of `loss.kl_coef`, the warm start's cross-entropy) and for a weight the paper fixes
  (HSD's `vocab_kl`, 1).
  """

  fn: Callable
  coef: Callable[[PolicyLossConfig], float] | None
  aggregation: Callable[[PolicyLossConfig], str]
  trainer_arrays: tuple[str, ...] = ()  # what it reads that the trainer fills (`TRAINER_ARRAYS`)
  # What it reads that the method fills: a `trajectory.LossInput` subclass whose fields are batch keys; a method
  # declaring the term returns one in `MethodOutput.loss_inputs[term]`.
  input: type[LossInput] | None = None
  knob: str | None = None  # a method that declares the term sets its weight with this knob (one of its knobs)
  # A method that declares the term caps its gradient with this knob: the largest ratio of its gradient's norm to
  # the other terms' (PolicyLossConfig.grad_caps; inf: no cap).
  cap_knob: str | None = None
  # The term reads the student's whole predicted distribution: `fn(logp, mb, cfg, student=(h_NxKxD, head_DxV))`
  # with the final hidden states that predict the scored tokens (`pg_token_loss`).
  reads_hidden: bool = False

  def __post_init__(self):
    if self.coef is None and not self.knob:
      raise ValueError("LossTerm: coef=None reads the weight from a knob; name it with knob=")
    unknown = sorted(set(self.trainer_arrays) - TRAINER_ARRAYS)
    if unknown:
      raise ValueError(
        f"LossTerm: trainer_arrays {unknown} are not arrays the trainer fills ({sorted(TRAINER_ARRAYS)}); a "
        "method's arrays are the fields of the term's input class (input=)"
      )
    if self.input is not None:
      if not (
        isinstance(self.input, type) and issubclass(self.input, LossInput) and dataclasses.is_dataclass(self.input)
      ):
        raise ValueError(f"LossTerm: input={self.input!r} must be a dataclass subclassing trajectory.LossInput")
      for field in self.input.keys():
        if not field.endswith(("_BxL", "_BxLxD")) or batch_key(field) in RESERVED_KEYS:
          raise ValueError(
            f"LossTerm: {self.input.__name__}.{field} must be a per-token array named *_BxL or *_BxLxD whose batch "
            f"key (its name without the suffix) is none of the batch's own arrays ({sorted(RESERVED_KEYS)})"
          )

  @property
  def batch_keys(self) -> tuple[str, ...]:
    """Every update-batch array the term reads: the trainer's ("adv": `UpdateBatch.adv_NxK`, "ref_logp"), then its
    input's (`UpdateBatch.inputs_NxK` keys)."""
    return tuple(self.trainer_arrays) + (self.input.batch_keys() if self.input is not None else ())

  def weight(self, cfg: PolicyLossConfig) -> float:
    """The term's coefficient under `cfg`."""
    if self.coef is not None:
      return self.coef(cfg)
    assert self.knob is not None  # __post_init__ refuses coef=None without a knob
    return cfg.weight(self.knob)


LOSS_TERMS: dict[str, LossTerm] = {
  "policy": LossTerm(policy_term, lambda c: 1.0, lambda c: c.aggregation, ("adv",)),
  "kl": LossTerm(kl_term, lambda c: c.kl_coef, lambda c: c.aggregation, ("ref_logp",)),
  "distill": LossTerm(
    distill_term,
    None,
    lambda c: "token-mean",
    input=DistillInput,
    knob="distill_coef",
    cap_knob="distill_max_grad_ratio",
  ),
  "nll": LossTerm(nll_term, lambda c: 1.0, lambda c: "token-mean"),
  # HSD (arXiv 2606.15576, summaries): the full-vocabulary KL to the peer-conditioned self-teacher, averaged over a
  # rollout's tokens and then over the rollouts (1/|o_i|, 1/G), and beta KL to the reference, weighted by its knob.
  "vocab_kl": LossTerm(
    vocab_kl_term,
    lambda c: 1.0,  # HSD's distillation, unweighted (its paper's); the per-token weights are the method's arrays
    lambda c: "seq-mean-token-mean",
    input=VocabKLInput,
    reads_hidden=True,
  ),
  "reference_kl": LossTerm(reference_kl_term, None, lambda c: "seq-mean-token-mean", ("ref_logp",), knob="beta"),
}


def term_inputs(terms) -> dict[str, type[LossInput]]:
  """{term: its input class} for those of `terms` (LOSS_TERMS names) that read an input of the method."""
  return {t: cls for t in terms if (cls := LOSS_TERMS[t].input) is not None}


def loss_terms(cfg: PolicyLossConfig) -> tuple[str, ...]:
  """The active terms: `cfg.terms`, plus "kl" when `cfg.kl_coef > 0` and the policy term is on."""
  terms = tuple(cfg.terms)
  if cfg.kl_coef > 0 and "policy" in terms and "kl" not in terms:
    terms += ("kl",)
  return terms


def _scored_logp(graphdef, params, rest, mb: UpdateBatch, temperature):
  """Log-probs of a micro-batch's scored tokens: every slot of an unpacked batch ([N, L]); the scored slots of a
  packed one ([N, K]: the output head runs on those slots only; `jaxcredit.train.loop.update`)."""
  if mb.packed is None:
    return _logp(graphdef, params, rest, mb.tokens_NxL, mb.token_mask_NxL, temperature)
  model = nnx.merge(graphdef, params, rest)
  return packed_slot_logprobs(
    model,
    mb.tokens_NxL,
    mb.token_mask_NxL,
    mb.packed.slots_NxK,
    temperature,
    positions_BxL=mb.packed.positions_NxL,
    segment_ids_BxL=mb.packed.segment_ids_NxL,
    prefix_limit_BxL=mb.packed.prefix_limit_NxL,
  )


def _scored_hidden(graphdef, params, rest, mb: UpdateBatch, temperature):
  """(logp, (h, head)) of a micro-batch's scored tokens: their log-probs as `_scored_logp` and the final hidden
  states that predict them with the output head, for terms that read the whole distribution (`LossTerm.reads_hidden`)."""
  model = nnx.merge(graphdef, params, rest)
  packing = {}
  if mb.packed is not None:
    packing = {
      "positions_BxL": mb.packed.positions_NxL,
      "segment_ids_BxL": mb.packed.segment_ids_NxL,
      "prefix_limit_BxL": mb.packed.prefix_limit_NxL,
      "slots_BxK": mb.packed.slots_NxK,
    }
  h, targets, valid = predictor_hidden_states(model, mb.tokens_NxL, mb.token_mask_NxL, **packing)
  head = model.output_head_DxV()
  logp, _ = chunked_logprobs_and_entropies(h, head, targets, temperature)
  return jnp.where(valid, logp, 0.0), (h, head)


def pg_token_loss(graphdef, params, rest, mb: UpdateBatch, cfg: PolicyLossConfig):
  """The active loss terms of one micro-batch: ({name: per-slot values [N, K]}, diagnostics). `mb` is unpacked
  (trajectory rows) or packed (`UpdateBatch.packed`: the per-slot arrays at the scored slots).
  A term that reads the whole distribution (`LossTerm.reads_hidden`) also gets the student's hidden states."""
  terms = loss_terms(cfg)
  student = None
  if any(LOSS_TERMS[name].reads_hidden for name in terms):
    logp, student = _scored_hidden(graphdef, params, rest, mb, cfg.temperature)
  else:
    logp = _scored_logp(graphdef, params, rest, mb, cfg.temperature)
  values, diag = {}, {}
  for name in terms:
    term = LOSS_TERMS[name]
    values[name], d = term.fn(logp, mb, cfg, student=student) if term.reads_hidden else term.fn(logp, mb, cfg)
    diag.update(d)
  return values, diag


SFT_LOSS = PolicyLossConfig(terms=("nll",))  # the warm start: cross-entropy at temperature 1


def _split_micro(batch: UpdateBatch, num_micro: int) -> UpdateBatch:
  def f(x):
    if x.shape[0] % num_micro:
      raise ValueError(
        f"batch of {x.shape[0]} is not divisible into {num_micro} micro-batches (config.train.num_micro_batches)"
      )
    return x.reshape(num_micro, x.shape[0] // num_micro, *x.shape[1:])

  return jax.tree_util.tree_map(f, batch)


def loss_and_grads(
  token_loss_fn: Callable, graphdef, params, rest, batch: UpdateBatch, cfg: PolicyLossConfig, num_micro: int = 1
):
  """Exact full-batch loss and gradients, accumulated over `num_micro` micro-batches.

  loss = Σ_terms coef · numerator / denominator, each term aggregated with its own mode (`LOSS_TERMS`); every
  denominator comes from the masks of the whole batch, so micro-batching changes nothing (credit.md, "Losses").

  Returns:
    (loss, grads, metrics): metrics hold "loss", "grad_norm", "loss_<term>" for every term, and masked means of
    the token diagnostics.

  Raises:
    ValueError: (when traced) an active term reads an array the batch lacks (`LossTerm.batch_keys`), naming both.
  """
  present = batch.scored_arrays()
  for name in loss_terms(cfg):
    missing = [k for k in LOSS_TERMS[name].batch_keys if k not in present]
    if missing:
      raise ValueError(
        f"loss term {name!r} reads {missing}, which the update batch lacks (it holds {sorted(present)}): the "
        "trainer fills 'adv' and 'ref_logp' when an active term lists them, the method its terms' inputs"
      )
  mask = batch.action_mask_NxK
  packed = batch.packed is not None
  if packed and cfg.max_len is None and any(LOSS_TERMS[n].aggregation(cfg).endswith("-norm") for n in loss_terms(cfg)):
    raise ValueError("a packed batch with the seq-mean-token-sum-norm aggregation needs PolicyLossConfig.max_len")
  max_len = cfg.max_len or mask.shape[1]
  seqs = {}
  if batch.packed is not None:
    seqs = {"seq_ids_BxL": batch.packed.rollout_ids_NxK, "num_seqs": jnp.sum(batch.packed.rollouts_N)}
  dens = {}
  for name in loss_terms(cfg):
    t = LOSS_TERMS[name]
    _, den = loss_lib.aggregate(jnp.zeros(mask.shape, jnp.float32), mask, t.aggregation(cfg), max_len=max_len, **seqs)
    dens[name] = (t.weight(cfg), t.aggregation(cfg), jnp.maximum(den, 1e-12))
  n_tok = jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)

  caps = {name: float(r) for name, r in cfg.grad_caps if name in dens and math.isfinite(r)}
  capped = tuple(sorted(caps))

  def mb_parts(p, mb):
    """((the uncapped terms' weighted sum, each capped term's weighted value), the metric sums)."""
    values, diag = token_loss_fn(graphdef, p, rest, mb, cfg)
    parts = {}
    ids = {"seq_ids_BxL": mb.packed.rollout_ids_NxK} if mb.packed is not None else {}
    for name, (coef, agg, den) in dens.items():
      num, _ = loss_lib.aggregate(values[name], mb.action_mask_NxK, agg, max_len=max_len, **ids)
      parts[name] = num / den
    m = mb.action_mask_NxK.astype(jnp.float32)
    sums = {k: jnp.sum(jnp.where(m > 0, v, 0.0)) for k, v in diag.items()}
    sums.update({f"loss_{k}": v for k, v in parts.items()})
    main = sum(dens[k][0] * v for k, v in parts.items() if k not in caps)
    return (main,) + tuple(dens[k][0] * parts[k] for k in capped), sums

  if capped:
    # One forward, one backward per part (the forward's residuals shared): each part's gradient on its own.
    def grad_fn(p, mb):
      outs, vjp_fn, sums = jax.vjp(lambda q: mb_parts(q, mb), p, has_aux=True)
      ones = [tuple(jnp.float32(i == j) for j in range(len(outs))) for i in range(len(outs))]
      return (sum(outs), sums), tuple(vjp_fn(c)[0] for c in ones)
  else:
    grad_fn = jax.value_and_grad(lambda p, mb: (lambda o, s: (o[0], s))(*mb_parts(p, mb)), has_aux=True)

  if num_micro == 1:
    (loss, sums), grads = grad_fn(params, batch)
  else:
    micro = _split_micro(batch, num_micro)

    def body(carry, mb):
      loss_acc, grads_acc, sums_acc = carry
      (l, s), g = grad_fn(params, mb)
      return (
        loss_acc + l,
        jax.tree_util.tree_map(jnp.add, grads_acc, g),
        jax.tree_util.tree_map(jnp.add, sums_acc, s),
      ), None

    zero_g = jax.tree_util.tree_map(jnp.zeros_like, params)
    zero_g = tuple(zero_g for _ in range(1 + len(capped))) if capped else zero_g
    _, zero_s = jax.eval_shape(lambda: mb_parts(params, jax.tree_util.tree_map(lambda x: x[0], micro)))
    zero_s = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), zero_s)
    (loss, grads, sums), _ = jax.lax.scan(body, (jnp.zeros((), jnp.float32), zero_g, zero_s), micro)
  metrics = {k: (v if k.startswith("loss_") else v / n_tok) for k, v in sums.items()}
  if capped:
    grads, metrics = _cap_gradients(grads, capped, caps, metrics)
  metrics["loss"] = loss
  metrics["grad_norm"] = optax.tree.norm(grads)
  return loss, grads, metrics


def _cap_gradients(grads: tuple, capped: tuple[str, ...], caps: dict, metrics: dict) -> tuple[Any, dict]:
  """g = g_rest + Σ_term min(1, ratio · |g_rest| / |g_term|) · g_term, with per term `grad_norm_<term>` (before the
  cap), `grad_scale_<term>` and `grad_share_<term>` = |scaled g_term| / (|g_rest| + |scaled g_term|); and
  `grad_norm_rest`. A step whose other terms give no gradient (every group tied) gets none from the capped term."""
  rest_norm = optax.tree.norm(grads[0])
  total = grads[0]
  metrics = dict(metrics, grad_norm_rest=rest_norm)
  for name, g in zip(capped, grads[1:]):
    norm = optax.tree.norm(g)
    scale = jnp.minimum(1.0, caps[name] * rest_norm / jnp.maximum(norm, 1e-30))
    total = jax.tree_util.tree_map(lambda a, b: a + scale * b, total, g)
    metrics[f"grad_norm_{name}"] = norm
    metrics[f"grad_scale_{name}"] = scale
    metrics[f"grad_share_{name}"] = scale * norm / jnp.maximum(rest_norm + scale * norm, 1e-30)
  return total, metrics


def make_update_fn(
  token_loss_fn: Callable,
  graphdef,
  rest,
  optimizer: optax.GradientTransformation,
  cfg: PolicyLossConfig,
  mesh: Mesh,
  params_shardings,
  opt_shardings,
  *,
  num_micro: int = 1,
):
  """A jitted (params, opt_state, batch) -> (params, opt_state, metrics) over `mesh`.

  Parameters and optimizer state keep the shardings given (`jaxcredit.sharding.param_shardings`); the batch
  must already be placed with `sharding.shard_batch`. Parameters and optimizer state are donated.
  """

  def update(params, opt_state, batch):
    _, grads, metrics = loss_and_grads(token_loss_fn, graphdef, params, rest, batch, cfg, num_micro)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
    return params, opt_state, metrics

  return MeshJit(
    jax.jit(
      update,
      in_shardings=(params_shardings, opt_shardings, None),
      out_shardings=(params_shardings, opt_shardings, sharding.replicated(mesh)),
      donate_argnums=(0, 1),
    ),
    mesh,
  )


class MeshJit:
  """A jitted function that is traced, lowered and called under `jax.set_mesh(mesh)`, so the model's logical
  sharding constraints (`jaxcredit.sharding.constrain`) see the mesh."""

  def __init__(self, jitted, mesh: Mesh):
    self.jitted, self.mesh = jitted, mesh

  def __call__(self, *args):
    with jax.set_mesh(self.mesh):
      return self.jitted(*args)

  def lower(self, *args):
    """`jax.jit(...).lower` under the mesh (for ahead-of-time compilation, e.g. `jaxcredit plan`)."""
    with jax.set_mesh(self.mesh):
      return self.jitted.lower(*args)


def make_logp_fn(graphdef, rest, temperature: float):
  """A jitted (params, tokens_BxL, token_mask_BxL) -> logp_BxL (reference / behaviour log-probs)."""
  return jax.jit(lambda p, t, m: _logp(graphdef, p, rest, t, m, temperature))


def make_packed_gold_fn(graphdef, rest):
  """A jitted (params, tokens_NxL, token_mask_NxL, positions_NxL, segment_ids_NxL, prefix_limit_NxL, slots_NxG)
  -> logp_NxG: `packed_slot_logprobs` of the model (graphdef, params, rest) at temperature 1.

  For TRACE's packed gold scoring: `jaxcredit.scoring.gold.score_gold_answers_packed(lambda *a:
  np.asarray(fn(ref_params, *a)), traj, gold_ids, ...)`. Temperature 1 always: the gold score is the
  reference's own quantity, not a policy log-prob tied to the sampling temperature.
  """

  def fn(p, tokens, token_mask, positions, segment_ids, prefix_limit, slots):
    model = nnx.merge(graphdef, p, rest)
    return packed_slot_logprobs(
      model,
      tokens,
      token_mask,
      slots,
      1.0,
      positions_BxL=positions,
      segment_ids_BxL=segment_ids,
      prefix_limit_BxL=prefix_limit,
    )

  return jax.jit(fn)


def opt_state_shardings(optimizer, params, params_shardings, mesh):
  """Shardings for the optimizer state: each moment like its parameter, scalars replicated."""
  abstract = jax.eval_shape(optimizer.init, params)
  flat_param_sh = {tuple(p): s for p, s in jax.tree_util.tree_flatten_with_path(params_shardings)[0]}

  def pick(path, leaf):
    # optax states nest the param pytree; match on the param path suffix.
    for n in range(len(path)):
      s = flat_param_sh.get(tuple(path[n:]))
      if s is not None and s.spec and len(s.spec) <= leaf.ndim:
        return s
    return sharding.replicated(mesh)

  return jax.tree_util.tree_map_with_path(pick, abstract)
