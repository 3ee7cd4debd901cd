"""Slow, obvious float32 NumPy references for jaxcredit.credit, written with loops straight from the spec (CrEST's
token factor in float64 Python arithmetic).

Each function mirrors one public function for one rollout or one group and follows specs/credit.md line by
line; the tests compare the jitted library against these on random inputs.
"""

import math

import numpy as np

f32 = np.float32


def _finite(x):
  return bool(np.isfinite(x))


def _mean(values):
  total = f32(0.0)
  for v in values:
    total = f32(total + f32(v))
  return f32(total / f32(len(values)))


def _std_ddof1(values):
  mu = _mean(values)
  total = f32(0.0)
  for v in values:
    total = f32(total + f32(v - mu) ** 2)
  return f32(math.sqrt(total / f32(len(values) - 1)))


def _sub(a, b):
  """a - b in float32; inf - inf is NaN, which the callers treat as invalid."""
  with np.errstate(invalid="ignore", over="ignore"):
    return f32(f32(a) - f32(b))


def _mask(mask, n):
  return [True] * n if mask is None else [bool(m) for m in mask]


# ----------------------------------------------------------------------------------------------- outcome


def grpo(rewards, sample_mask=None, scale="group", eps=1e-6):
  rewards = np.asarray(rewards, f32)
  mask = _mask(sample_mask, len(rewards))
  valid = [mask[g] and _finite(rewards[g]) for g in range(len(rewards))]
  out = np.zeros(len(rewards), f32)
  vals = [rewards[g] for g in range(len(rewards)) if valid[g]]
  if len(vals) < 2 or max(vals) == min(vals):
    return out
  mu = _mean(vals)
  sigma = _std_ddof1(vals)
  for g in range(len(rewards)):
    if valid[g]:
      out[g] = (rewards[g] - mu) / (sigma + f32(eps)) if scale == "group" else rewards[g] - mu
  return out


def rloo(rewards, sample_mask=None):
  rewards = np.asarray(rewards, f32)
  mask = _mask(sample_mask, len(rewards))
  valid = [mask[g] and _finite(rewards[g]) for g in range(len(rewards))]
  out = np.zeros(len(rewards), f32)
  if sum(valid) < 2:
    return out
  for i in range(len(rewards)):
    if valid[i]:
      others = [rewards[j] for j in range(len(rewards)) if valid[j] and j != i]
      out[i] = rewards[i] - _mean(others)
  return out


def turn_to_token(turn_values, turn_ids, action_mask):
  out = np.zeros(len(turn_ids), f32)
  for i, (tid, act) in enumerate(zip(turn_ids, action_mask)):
    if act and 0 <= tid < len(turn_values) and _finite(turn_values[tid]):
      out[i] = turn_values[tid]
  return out


# ------------------------------------------------------------------------------------------------- TRACE


def trace_values(gold_logp, boundary_mask, gap_eps=0.1, value="log_ratio"):
  """V_t = log(d_0/d_t), d_t = −min(ℓ̄_t, 0) + gap_eps; or ℓ̄_t − ℓ̄_0 (raw_delta). Float64 Python arithmetic."""
  num = len(gold_logp)
  valid = [bool(boundary_mask[t]) and _finite(gold_logp[t]) for t in range(num)]
  out = np.zeros(num, np.float64)
  if not valid[0]:
    return out

  def phi(x):
    x = float(x)
    return x if value == "raw_delta" else -math.log(-min(x, 0.0) + gap_eps)

  for t in range(num):
    if valid[t]:
      out[t] = phi(gold_logp[t]) - phi(gold_logp[0])
  return out


def trace_td(gold_logp, boundary_mask, gap_eps=0.1, value="log_ratio"):
  """δ_t = V_{t+1} − V_{p(t)} where boundary t+1 is valid, p(t) the latest valid boundary <= t."""
  v = trace_values(gold_logp, boundary_mask, gap_eps, value)
  num_turns = len(gold_logp) - 1
  valid = [bool(boundary_mask[t]) and _finite(gold_logp[t]) for t in range(num_turns + 1)]
  r = np.zeros(num_turns, np.float64)
  if not valid[0]:
    return r
  latest = 0
  for t in range(num_turns):
    if valid[t]:
      latest = t
    if valid[t + 1]:
      r[t] = v[t + 1] - v[latest]
  return r


def trace_transitions(gold_logp, boundary_mask):
  """n = 1 + the last turn whose next boundary is valid (0 if none, or if boundary 0 is invalid)."""
  valid = [bool(boundary_mask[t]) and _finite(gold_logp[t]) for t in range(len(gold_logp))]
  n = 0
  for t in range(len(gold_logp) - 1):
    if valid[0] and valid[t + 1]:
      n = t + 1
  return n


def trace_turn(gold_logp, boundary_mask, outcome_adv, gap_eps=0.1, value="log_ratio", k=3, gamma=0.8, scale=2.0):
  """r_t = Σ_{j<K'} γ^j δ_{t+j} / Σ_{j<K'} γ^j (+ λ γ^(n−t) A_out where t + K − 1 >= n − 1), t < n; 0 after."""
  delta = trace_td(gold_logp, boundary_mask, gap_eps, value)
  n = trace_transitions(gold_logp, boundary_mask)
  adv = float(outcome_adv) if _finite(outcome_adv) else 0.0
  r = np.zeros(len(delta), np.float64)
  for t in range(n):
    kk = min(k, n - t)
    if kk > 0:
      r[t] = sum(gamma**j * delta[t + j] for j in range(kk)) / sum(gamma**j for j in range(kk))
    if t + max(k, 1) - 1 >= n - 1:
      r[t] += scale * gamma ** (n - t) * adv
  return r


def trace_outcome(rewards, sample_mask=None, std="population", eps=1e-6):
  """A_out: (R − μ) / (σ + eps) over the valid samples, σ with ddof 0 (population) or 1 (sample)."""
  rewards = [float(x) for x in rewards]
  mask = _mask(sample_mask, len(rewards))
  valid = [mask[g] and _finite(rewards[g]) for g in range(len(rewards))]
  vals = [rewards[g] for g in range(len(rewards)) if valid[g]]
  out = np.zeros(len(rewards), np.float64)
  if len(vals) < 2 or max(vals) == min(vals):
    return out
  mu = sum(vals) / len(vals)
  ddof = 0 if std == "population" else 1
  sigma = math.sqrt(sum((x - mu) ** 2 for x in vals) / (len(vals) - ddof))
  for g in range(len(rewards)):
    if valid[g]:
      out[g] = (rewards[g] - mu) / (sigma + eps)
  return out


def trace_adv(
  rewards,
  gold_logp,
  boundary_mask,
  turn_mask,
  sample_mask=None,
  alpha_out=1.0,
  alpha_turn=0.2,
  gap_eps=0.1,
  value="log_ratio",
  k=3,
  gamma=0.8,
  scale=2.0,
  std="population",
  dense_norm="none",
  eps=1e-6,
):
  """A[g, t] = α_out A_out[g] + α_turn r~[g, t] on real turns of valid samples (spec v2.0, TRACE)."""
  num_g, num_turns = np.shape(turn_mask)
  mask = _mask(sample_mask, num_g)
  valid = [mask[g] and _finite(rewards[g]) for g in range(num_g)]
  a_out = trace_outcome(rewards, sample_mask, std, eps)
  r = np.zeros((num_g, num_turns), np.float64)
  for g in range(num_g):
    r[g] = trace_turn(gold_logp[g], boundary_mask[g], a_out[g], gap_eps, value, k, gamma, scale)
  if dense_norm == "group_rms":
    dense = []
    for g in range(num_g):
      ok = [bool(boundary_mask[g][t]) and _finite(gold_logp[g][t]) for t in range(num_turns + 1)]
      for t in range(num_turns):
        if valid[g] and turn_mask[g][t] and ok[0] and ok[t + 1]:
          dense.append(r[g, t])
    r = r / (math.sqrt(sum(x * x for x in dense) / len(dense)) + eps) if dense else np.zeros_like(r)
  out = np.zeros((num_g, num_turns), np.float64)
  for g in range(num_g):
    for t in range(num_turns):
      if valid[g] and turn_mask[g][t]:
        out[g, t] = alpha_out * a_out[g] + alpha_turn * r[g, t]
  return out


def trace_adv_v1(
  rewards,
  gold_logp,
  boundary_mask,
  turn_mask,
  sample_mask=None,
  beta=1.0,
  scale="group",
  dense_norm="group_rms",
  eps=1e-6,
):
  """This library's v1 TRACE (not the paper's raw-delta ablation, which changes only the value): A = GRPO + beta · δ /
  RMS(δ over the dense turns)."""
  rewards = np.asarray(rewards, f32)
  num_g, num_turns = np.shape(turn_mask)
  mask = _mask(sample_mask, num_g)
  valid = [mask[g] and _finite(rewards[g]) for g in range(num_g)]
  a_out = grpo(rewards, sample_mask, scale, eps)
  r = (
    np.stack([trace_td(gold_logp[g], boundary_mask[g], value="raw_delta") for g in range(num_g)]).astype(f32)
    if num_g
    else np.zeros((0, num_turns), f32)
  )
  if dense_norm == "group_rms":
    dense = []
    for g in range(num_g):
      b_ok = [bool(boundary_mask[g][t]) and _finite(gold_logp[g][t]) for t in range(num_turns + 1)]
      for t in range(num_turns):
        if valid[g] and turn_mask[g][t] and b_ok[0] and b_ok[t + 1]:
          dense.append(r[g, t])
    if dense:
      rms = f32(math.sqrt(_mean([f32(x * x) for x in dense])))
      r = (r / (rms + f32(eps))).astype(f32)
    else:
      r = np.zeros_like(r)
  out = np.zeros((num_g, num_turns), f32)
  for g in range(num_g):
    for t in range(num_turns):
      if valid[g] and turn_mask[g][t]:
        out[g, t] = a_out[g] + f32(beta) * r[g, t]
  return out


# ------------------------------------------------------------------------------------------------- CrEST


def crest_turn(turn_rewards, turn_mask, sample_mask=None, scale="group", eps=1e-6):
  turn_rewards = np.asarray(turn_rewards, f32)
  num_g, num_u = turn_rewards.shape
  mask = _mask(sample_mask, num_g)
  out = np.zeros((num_g, num_u), f32)
  for u in range(num_u):
    reached = [bool(turn_mask[g][u]) and mask[g] for g in range(num_g)]
    out[:, u] = grpo(turn_rewards[:, u], reached, scale, eps)
  return out


def crest_weights(turn_adv, turn_ids, action_mask, teacher_logp, policy_logp, lam=0.3, clip_eps=0.28, tau=2.0, rho=0.5):
  """The CrEST token factor (spec "CrEST", paper Eq. 4-10), in float64 Python arithmetic, one token at a time."""
  num_u = len(turn_adv)
  n = len(turn_ids)
  sign, live = [0.0] * n, [False] * n
  for i in range(n):
    u = int(turn_ids[i])
    if action_mask[i] and 0 <= u < num_u:
      a = float(turn_adv[u])
      sign[i] = (1.0 if a > 0 else -1.0 if a < 0 else 0.0) if math.isfinite(a) else 0.0
      live[i] = sign[i] != 0.0 and _finite(teacher_logp[i]) and _finite(policy_logp[i])
  # Student surprisal z-scored over the rollout's action tokens (finite log-prob): mean, population std + 1e-6.
  surprisal = [-float(policy_logp[i]) for i in range(n) if action_mask[i] and _finite(policy_logp[i])]
  mean = sum(surprisal) / len(surprisal) if surprisal else 0.0
  std = math.sqrt(sum((s - mean) ** 2 for s in surprisal) / len(surprisal)) if surprisal else 0.0
  phi = np.zeros(n, np.float64)
  for i in range(n):
    u = int(turn_ids[i])
    if not (action_mask[i] and 0 <= u < num_u):
      continue  # 0 off the action tokens and outside [0, U)
    if not live[i]:
      phi[i] = 1.0
      continue
    delta = (float(teacher_logp[i]) - float(policy_logp[i])) / tau  # Eq. 5
    x = sign[i] * delta
    w = min(max(math.exp(min(x, 700.0)), 1.0 - clip_eps), 1.0 + clip_eps)  # Eq. 6
    gate = 1.0 if x > 0 else 0.0  # Eq. 7
    z = (-float(policy_logp[i]) - mean) / (std + 1e-6)
    e = 1.0 / (1.0 + math.exp(-z))  # Eq. 8
    m = 1.0 + rho * (2.0 * e - 1.0)  # Eq. 9
    lam_i = min(max(lam * gate * m, 0.0), lam)  # Eq. 10
    phi[i] = 1.0 + lam_i * (w - 1.0)  # Eq. 4
  return phi


def crest_adv(
  turn_rewards,
  turn_mask,
  turn_ids,
  action_mask,
  teacher_logp,
  policy_logp,
  sample_mask=None,
  scale="group",
  eps=1e-6,
  lam=0.3,
  clip_eps=0.28,
  tau=2.0,
  rho=0.5,
):
  adv = crest_turn(turn_rewards, turn_mask, sample_mask, scale, eps)
  out = np.zeros(np.shape(turn_ids), np.float64)
  for g in range(len(adv)):
    phi = crest_weights(adv[g], turn_ids[g], action_mask[g], teacher_logp[g], policy_logp[g], lam, clip_eps, tau, rho)
    out[g] = turn_to_token(adv[g], turn_ids[g], action_mask[g]) * phi
  return out


# ------------------------------------------------------------------------------------------------ ToolOPD


def toolopd(logp_skill, logp_base, success, action_mask, max_credit=2.0, normalize=True):
  c = np.zeros(len(logp_skill), f32)
  for i in range(len(logp_skill)):
    delta = _sub(logp_skill[i], logp_base[i])
    if action_mask[i] and _finite(delta):
      c[i] = min(max(delta if success else -delta, 0.0), max_credit)
  n_action = sum(bool(a) for a in action_mask)
  if normalize and n_action:
    mean = _mean(c[np.asarray(action_mask, bool)])
    if mean > 0:
      c = (c / mean).astype(f32)
  return c


# ---------------------------------------------------------------------------------------------------- HSD


def hsd_eligible(rewards, sample_mask, success_threshold=0.5):
  """For each g, the set of peers select_peers may return (empty: it must return -1)."""
  rewards = np.asarray(rewards, f32)
  mask = _mask(sample_mask, len(rewards))
  valid = [mask[j] and _finite(rewards[j]) for j in range(len(rewards))]
  success = [valid[j] and rewards[j] > success_threshold for j in range(len(rewards))]
  return [{j for j in range(len(rewards)) if success[j] and j != g} if valid[g] else set() for g in range(len(rewards))]


def hsd_tokens(teacher_logp, policy_logp, action_mask, clip=1.0):
  a = np.zeros(len(teacher_logp), f32)
  for i in range(len(teacher_logp)):
    gap = _sub(teacher_logp[i], policy_logp[i])
    if action_mask[i] and _finite(gap):
      a[i] = min(max(gap, -clip), clip)
  return a


def opd_tokens(teacher_logp, policy_logp, action_mask):
  a = np.zeros(len(teacher_logp), f32)
  for i in range(len(teacher_logp)):
    gap = _sub(teacher_logp[i], policy_logp[i])
    if action_mask[i] and _finite(gap):
      a[i] = gap
  return a


# --------------------------------------------------------------------------------------------------- GEAR


def gear_threshold(divergence, action_mask, k_sigma=2.0, eps=1e-6):
  """(cleaned d, tau, spikes possible) exactly as the spec defines them; tau is None with < 2 action tokens."""
  d = [f32(x) if _finite(x) and x > 0 else f32(0.0) for x in divergence]
  acts = [d[i] for i in range(len(d)) if action_mask[i]]
  if len(acts) < 2:
    return d, None, False
  tau = f32(_mean(acts) + f32(k_sigma) * _std_ddof1(acts))
  return d, tau, (max(acts) - min(acts)) > eps


def gear_segs(divergence, entropy, action_mask, k_sigma=2.0, tau_low=0.1, entropy_floor=1.0, eps=1e-6):
  d, tau, spread = gear_threshold(divergence, action_mask, k_sigma, eps)
  seg = np.full(len(d), -1, np.int32)
  current = -1
  for i in range(len(d)):
    if not action_mask[i]:
      current = -1  # a segment never crosses a non-action token
    elif tau is not None and spread and d[i] > tau:
      current = i
    elif d[i] >= tau_low or (_finite(entropy[i]) and entropy[i] >= entropy_floor):
      pass  # the open segment (if any) extends
    else:
      current = -1
    seg[i] = current
  return seg


def gear_adv(
  seq_adv,
  divergence,
  entropy,
  action_mask,
  alpha=1.0,
  k_sigma=2.0,
  tau_low=0.1,
  entropy_floor=1.0,
  normalize=True,
  eps=1e-6,
):
  d, tau, _ = gear_threshold(divergence, action_mask, k_sigma, eps)
  seg = gear_segs(divergence, entropy, action_mask, k_sigma, tau_low, entropy_floor, eps)
  out = np.zeros(len(d), f32)
  if not _finite(seq_adv):
    return out
  acts = [i for i in range(len(d)) if action_mask[i]]
  if tau is None:
    for i in acts:
      out[i] = seq_adv
    return out
  u = {}
  for i in acts:
    anchor = d[seg[i]] if seg[i] >= 0 else d[i]
    u[i] = f32(1.0 + alpha * math.tanh(anchor / (tau + f32(eps))))
  mean = _mean(list(u.values())) if normalize else f32(1.0)
  for i in acts:
    out[i] = f32(seq_adv) * f32(u[i] / mean)
  return out


# -------------------------------------------------------------------------------------------------- GiGPO


def gigpo_advantages_ref(
  rewards, state_ids, turn_mask, sample_mask=None, gamma=0.95, omega=1.0, scale="group", eps=1e-6
):
  rewards = np.asarray(rewards, f32)
  num_g, num_turns = np.shape(turn_mask)
  mask = _mask(sample_mask, num_g)
  valid = [mask[g] and _finite(rewards[g]) for g in range(num_g)]
  a_episode = grpo(rewards, sample_mask, scale, eps)
  # n_g - 1 is the index of the last real turn (the count of real turns when they are a prefix)
  step_return = {}
  for g in range(num_g):
    real = [t for t in range(num_turns) if turn_mask[g][t]]
    if valid[g] and real:
      for t in real:
        step_return[g, t] = f32(f32(f32(gamma) ** (real[-1] - t)) * rewards[g])
  members = {}  # state id -> the (g, t) taken in that state
  for g, t in step_return:
    k = int(state_ids[g][t])
    if k >= 0:
      members.setdefault(k, []).append((g, t))
  a_step = {}
  for k, turns in members.items():
    a_group = grpo([step_return[gt] for gt in turns], None, scale, eps)
    for gt, a in zip(turns, a_group):
      a_step[gt] = a
  out = np.zeros((num_g, num_turns), f32)
  for g, t in step_return:
    out[g, t] = a_episode[g] + f32(omega) * a_step.get((g, t), f32(0.0))
  return out


# --------------------------------------------------------------------------------------------------- SGCD


def sgcd_weights(divergence, teacher_entropy, action_mask, alpha=1.0, entropy_coef=1.0, w_min=0.5, w_max=2.0):
  """In float64 Python arithmetic, token by token (docs/methods/sgcd.md)."""
  n = len(divergence)
  live = [bool(action_mask[i]) and _finite(divergence[i]) and _finite(teacher_entropy[i]) for i in range(n)]
  f = {
    i: max(float(divergence[i]), 0.0) / (1.0 + entropy_coef * max(float(teacher_entropy[i]), 0.0))
    for i in range(n)
    if live[i]
  }
  w = np.ones(n, f32)
  mean = sum(f.values()) / len(f) if f else 0.0
  if mean > 0:
    for i, fi in f.items():
      w[i] = min(max(1.0 + alpha * (fi / mean - 1.0), w_min), w_max)
  return w


# ------------------------------------------------------------------------------------------ GEAR (spec v2.1)


def gear_v21_normalised(divergence, action_mask, min_divergence=1e-6):
  """d̂ in float32 as the spec's reading defines it: d / max over the action tokens (one float32 division, which the
  exact power-of-two scaling of the jitted code does not change); all 0 when that max is <= min_divergence."""
  d = [f32(x) if action_mask[i] and _finite(x) and x > 0 else f32(0.0) for i, x in enumerate(divergence)]
  top = max(d) if d else f32(0.0)
  if not top > min_divergence:
    return [f32(0.0)] * len(d)
  return [f32(x / top) for x in d]


def gear_v21_onsets(divergence, action_mask, lambda_kl=0.1, min_divergence=1e-6):
  """d̂ > lambda_kl decided as d > lambda_kl · max d in float32 (the reading's threshold without a division's rounding)."""
  d = [f32(x) if action_mask[i] and _finite(x) and x > 0 else f32(0.0) for i, x in enumerate(divergence)]
  top = max(d) if d else f32(0.0)
  if not top > min_divergence:
    return [False] * len(d)
  return [bool(x > f32(f32(lambda_kl) * top)) for x in d]


def gear_v21_segs(divergence, entropy, action_mask, lambda_kl=0.1, lambda_h=1.5, min_divergence=1e-6):
  """Token by token: an onset (d̂ > lambda_kl) opens a segment; an action token with finite entropy <= lambda_h times
  the onset's extends it; anything else closes it."""
  onsets = gear_v21_onsets(divergence, action_mask, lambda_kl, min_divergence)
  seg = np.full(len(onsets), -1, np.int32)
  start, h0 = -1, f32(0.0)
  for i in range(len(onsets)):
    if action_mask[i] and onsets[i]:
      start, h0 = i, f32(entropy[i])
    elif (
      action_mask[i]
      and start >= 0
      and _finite(entropy[i])
      and (math.isinf(lambda_h) or f32(entropy[i]) <= f32(f32(lambda_h) * h0))
    ):
      pass
    else:
      start = -1
    seg[i] = start
  return seg


def gear_v21_adv(
  seq_adv, divergence, entropy, action_mask, alpha=0.2, lambda_kl=0.1, lambda_h=1.5, min_divergence=1e-6
):
  d_hat = gear_v21_normalised(divergence, action_mask, min_divergence)
  seg = gear_v21_segs(divergence, entropy, action_mask, lambda_kl, lambda_h, min_divergence)
  out = np.zeros(len(d_hat), np.float64)
  if not _finite(seq_adv):
    return out
  for i in range(len(d_hat)):
    if action_mask[i]:
      c = float(d_hat[seg[i]] if seg[i] >= 0 else d_hat[i])
      w = 1.0 - alpha * c if seq_adv > 0 else 1.0 + alpha * c
      out[i] = float(seq_adv) * w
  return out


# ------------------------------------------------------------------------------------------ SGCD (spec v2.1)


def sgcd_v21_weights(divergence, teacher_entropy, action_mask, gamma=1.0, c=2.0, entropy_coef=1.0, salience="max"):
  """In float64 Python arithmetic, token by token (docs/methods/sgcd.md)."""
  n = len(divergence)
  live = [bool(action_mask[i]) and _finite(divergence[i]) and _finite(teacher_entropy[i]) for i in range(n)]
  f = {
    i: max(float(divergence[i]), 0.0) / (1.0 + entropy_coef * max(float(teacher_entropy[i]), 0.0))
    for i in range(n)
    if live[i]
  }
  w = np.ones(n, np.float64)
  top = max(f.values()) if f else 0.0
  if top > 0:
    mean = sum(f.values()) / len(f)
    for i, fi in f.items():
      s = fi / top if salience == "max" else min(max(fi / mean - 1.0, 0.0), 1.0)
      w[i] = min(max(1.0 + gamma * s, 1.0), c)
  return w
