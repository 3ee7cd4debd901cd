"""`PASSES`: the extra forward passes dense methods need, as one table.

    traj.passes[name] = PASSES[name](ctx, traj)      for name in METHODS[config.credit.method].passes
    traj.passes[name].check_axes(...)              # its arrays have its output class's declared axes

Each pass returns its row's output class (`jaxcredit.train.tables.pass_outputs`: a dataclass whose fields carry their
axes), numpy arrays aligned to the trajectory, always with `valid_B` (bool) and `reasons` (one string per rollout:
"" when valid, else why the pass could not be made: "no_context", "over_budget", "non_finite", "no_boundary",
"empty_skill", "no_peer", "not_mixed", "empty_summary"); the methods also drop
rollouts whose `sample_mask_B` is False. A rollout whose pass is invalid loses only its dense term
(the method falls back to its outcome term); it never reads log p = 0 as a score. Gradients never flow through a
pass. Who the teacher is, what context it sees and how the context is inserted: docs/teacher-passes.md.

| pass | teacher | context | output |
|---|---|---|---|
| gold_answer | reference | none: scores the gold answer at every boundary (packed) | GoldAnswerOutput: gold_logp_BxT1, boundary_mask_BxT1 |
| teacher_plain | config.teacher.source | none (the rollout's own prompt) | TeacherOutput: logp_BxL, entropy_BxL |
| teacher_privileged | config.teacher.source | per unit, the ground truth of the units before it (CrEST) | TeacherOutput |
| teacher_peer | config.teacher.source | a successful peer's transcript + gold answer | PeerTeacherOutput: + peer_B |
| teacher_peer_states | config.teacher.source | as teacher_peer | PeerStatesOutput: + hidden_BxLxD (its final hidden states) |
| hindsight_skill | config.teacher.source | writes a skill from task, transcript and outcome | SkillOutput: skills, skill_tokens_B, success_B |
| teacher_skill | config.teacher.source | the rollout's hindsight skill | TeacherOutput |
| teacher_divergence | config.teacher.source | the environment's verified ground truth | DivergenceOutput: + divergence_BxL (vs the policy) |
| sibling_summary | config.teacher.source | writes a step-wise credit reference from a successful and a failed sibling | SiblingSummaryOutput: summaries, summary_tokens_B, siblings_Bx2, mixed_B, success_B |
| teacher_sibling | config.teacher.source | its group's sibling summary (SGCD) | DivergenceOutput |

Teacher passes also return `context_cut_tokens_B` (int32, the tokens cut from each rollout's context to fit
`config.teacher.max_context_tokens`, `config.teacher_budgets`): `pass_metrics` logs `pass/<name>/context_cut` (the
fraction of rollouts cut) and `pass/<name>/context_cut_tokens`, and the first cut of a run is warned about.

Adding a pass is one function `(PassContext, Trajectory) -> output` and one row, `Pass(fn, OutputClass)`, that
declares the class it returns (a `PassOutput` subclass), the passes whose outputs it reads (`after`) and the knobs it
reads with their defaults and checks (`knobs`, `choices`, `validate`: knobs of every method that runs it); a method
reads an output as its class (`pass_outputs.read_output`), and `config.validate` runs the method on stand-in outputs
of its passes' classes, refusing a read of a pass it does not run (docs/extending.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
from typing import Any, Callable, Mapping, Sequence

import jax
import numpy as np

from jaxcredit import credit, multihost, sharding
from jaxcredit.plain_text import encode_chat, encode_plain, encode_with_plain_spans
from jaxcredit.rollout.chat_format import ChatFormat
from jaxcredit.rollout.multiturn import action_text, transcript
from jaxcredit.sampling import SamplingParams
from jaxcredit.scoring import teacher as teacher_lib
from jaxcredit.scoring.gold import score_gold_answers_packed
from jaxcredit.train.loop import step as step_lib
from jaxcredit.train.tables.pass_outputs import (
  DivergenceOutput,
  GoldAnswerOutput,
  PassOutput,
  PeerStatesOutput,
  PeerTeacherOutput,
  SiblingSummaryOutput,
  SkillOutput,
  TeacherOutput,
  read_output,
)
from jaxcredit.trajectory import Trajectory, group_index

log = logging.getLogger(__name__)

DEFAULT_SKILL_TEMPLATE = (
  "Here is a task, an attempt at it and its outcome.\n\nTask: {task}\n\nAttempt:\n{transcript}\n\n"
  "Outcome: {outcome}\n\nIn one or two sentences, write advice that would help on similar tasks."
)


# Derived teacher budgets (`teacher_budgets`): tokens beside a whole rollout and a one-turn gold answer (the labels of
# a peer transcript, "The correct final answer: ", request numbers), and beside each wrapper's own bytes.
TEACHER_CONTEXT_SLACK = 256


def teacher_budgets(c) -> tuple[int, int]:
  """(max_context_tokens, max_len): the teacher passes' budgets in tokens, `config.teacher.*` of config `c` or, where 0,
  derived (also `jaxcredit.train.config.teacher_budgets`).

  Derived (docs/teacher-passes.md, "Budgets"; spec teacher-passes.md v2): the context budget is the longest context
  a method makes, a whole rollout of `sampling.max_len` tokens (HSD's peer transcript; ground truth, which a
  successful rollout writes out, is no longer) plus a gold answer of one turn (`sampling.max_new_tokens`) plus
  `TEACHER_CONTEXT_SLACK` tokens of labels; the sequence budget is the prompt and rollout (`sampling.max_len`) plus
  the context budget plus the wrapper's bytes (a bound on its tokens) once per insertion: once, or, for CrEST's
  per-unit contexts, once per assistant turn of the environment (`env.<name>.max_turns`, a bound on the units).
  An explicit value is used as given.

  Returns:
    Two positive ints.

  Raises:
    ValueError: for a negative or non-int `teacher.max_context_tokens` / `teacher.max_len` (naming the key).
  """
  for key in ("max_context_tokens", "max_len"):
    v = c.teacher[key]
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
      raise ValueError(f"config.teacher.{key} must be an int >= 1, or 0 (derived from the config), got {v!r}")
  rollout = int(c.sampling.max_len)
  context = c.teacher.max_context_tokens or rollout + int(c.sampling.max_new_tokens) + TEACHER_CONTEXT_SLACK
  wrapper = len(str(c.teacher.context_wrapper).replace("{context}", "").encode("utf-8")) + 16
  insertions = 1
  if (c.credit.get(c.credit.method) or {}).get("teacher_context") == "per_unit":
    insertions = max(1, int((c.env.get(c.env.name) or {}).get("max_turns", 1)))
  return int(context), int(c.teacher.max_len or rollout + context + insertions * wrapper)


@dataclasses.dataclass
class Model:
  """A model the passes can run: its graph, non-trainable state and parameters."""

  graphdef: Any
  rest: Any
  params: Any
  rules: Any = None  # its sharding table (`jaxcredit.sharding.use_rules`); None: the table in force


@dataclasses.dataclass
class PassContext:
  """What a pass may use. Built by the trainer once per RL step.

  Attributes:
    config: the training config.
    knobs: the method's knobs (`config.credit.<method>`).
    tok: the tokenizer (shared by policy and every teacher).
    env: the `EnvSpec`.
    tasks: one task per rollout.
    messages: one chat per rollout, its whole conversation (the transcripts a teacher is shown).
    rewards: one outcome reward per rollout, as the environment gave it (`env.is_success` reads it).
    key: PRNG key of this step's passes.
    models: "policy", "reference" and, when `config.teacher.source` names a checkpoint, "checkpoint"; when
      `config.credit.<method>.summarizer` names one, "summarizer".
    teacher: the key in `models` of this method's teacher.
    fns: the jitted pass functions (`PassFns`), compiled once per run.
    sampler_for: `Model` -> a sampler bound to that model's parameters (the hindsight skill is generated with it).
  """

  config: Any
  knobs: Mapping[str, Any]
  tok: Any
  env: Any
  tasks: Sequence[Any]
  messages: Sequence[Sequence[Mapping[str, Any]]]
  rewards: Sequence[float]
  key: jax.Array
  models: dict
  teacher: str
  fns: "PassFns"
  sampler_for: Callable[[Model], Any]


class PassFns:
  """Jitted pass functions, built lazily and cached per (teacher model, student model) graph."""

  def __init__(self, mesh, temperature: float):
    self.mesh, self.temperature = mesh, float(temperature)
    self._cache: dict = {}
    self.warned_context_cut = False  # one warning per run (the trainer builds one PassFns per run)

  def _get(self, key, build):
    if key not in self._cache:
      self._cache[key] = build()
    return self._cache[key]

  def teacher(self, teacher: Model, student: Model | None, *, hidden: bool = False):
    """(teacher_params, TeacherBatch, traj, student_params) -> TeacherPassResult, run under the mesh (with `hidden`,
    the teacher's hidden states too: `teacher_lib.teacher_pass`)."""
    key = ("teacher", id(teacher.graphdef), None if student is None else id(student.graphdef), hidden)
    fn = self._get(
      key,
      lambda: teacher_lib.make_teacher_pass_fn(
        teacher.graphdef,
        teacher.rest,
        self.temperature,
        student_graphdef=None if student is None else student.graphdef,
        student_rest=None if student is None else student.rest,
        hidden=hidden,
      ),
    )
    return self._under_mesh(fn, teacher.rules)

  def gold(self, model: Model):
    """(params, packed arrays...) -> gold log-probs at temperature 1 (step.make_packed_gold_fn), under the mesh."""
    return self._under_mesh(
      self._get(("gold", id(model.graphdef)), lambda: step_lib.make_packed_gold_fn(model.graphdef, model.rest)),
      model.rules,
    )

  def _under_mesh(self, fn, rules=None):
    """`fn` called under the mesh and, when given, the model's own sharding table (its trace constrains the
    activations by it; inside a teacher pass the student's forward follows the teacher's table too)."""

    def call(*args):
      with jax.set_mesh(self.mesh), contextlib.nullcontext() if rules is None else sharding.use_rules(rules):
        return fn(*args)

    return call


def _reasons_count(reasons: Sequence[str]) -> dict[str, int]:
  out: dict[str, int] = {}
  for r in reasons:
    if r:
      out[r] = out.get(r, 0) + 1
  return out


def pass_metrics(name: str, output: PassOutput, seconds: float) -> dict:
  """`pass/<name>/seconds`, `pass/<name>/dropped` and `pass/<name>/dropped_<reason>` for metrics.jsonl."""
  row = {f"pass/{name}/seconds": seconds, f"pass/{name}/dropped": int(np.sum(~np.asarray(output.valid_B)))}
  for reason, n in _reasons_count(output.reasons).items():
    row[f"pass/{name}/dropped_{reason}"] = n
  if isinstance(output, TeacherOutput):  # teacher passes: contexts cut to fit teacher.max_context_tokens
    cut = np.asarray(output.context_cut_tokens_B)
    row[f"pass/{name}/context_cut"] = float(np.mean(cut > 0)) if cut.size else 0.0
    row[f"pass/{name}/context_cut_tokens"] = int(cut.sum())
  return row


@dataclasses.dataclass(frozen=True)
class Pass:
  """One row of `PASSES`: the pass function, the output class it returns, and the passes and knobs it reads.

  Calling the row calls the function: `PASSES[name](ctx, traj)` -> its output, refused unless it is an `output`.

  Attributes:
    fn: (PassContext, Trajectory) -> an `output` instance, stored as `traj.passes[name]`.
    output: its `pass_outputs.PassOutput` subclass, whose fields carry their axes: what methods read
      (`pass_outputs.read_output`), what the trainer checks the arrays' shapes against (`PassOutput.check_axes`)
      and what `jaxcredit credit` exports per rollout.
    after: passes whose outputs it reads (`traj.passes[...]`); `config.validate` refuses a method that does not run
      them before it (teacher_skill reads hindsight_skill's skills).
    summary: one line for docs and errors.
    env_fields: the `EnvSpec` fields the pass calls that an environment may lack (`gold_answer_text`,
      `privileged_info`); a method running the pass on an environment without them is refused at start-up
      (`jaxcredit.train.loop.run.check_env_fields`).
    knobs: the knobs the pass reads (`ctx.knobs[...]`) with their defaults. They are knobs of every method that runs
      the pass: its config node `config.credit.<method>` holds them (`method_checks.method_knobs`; a method's own
      row may give another default), and `config.validate` refuses a node without one, naming the pass.
    choices: {knob: the values it may take} for the string knobs among `knobs`.
    validate: (knobs, config, method name) -> None, raising ValueError that names `config.credit.<method>.<knob>`,
      for checks `choices` cannot say (ranges, templates); run by `config.validate`.

  Raises:
    ValueError: at construction, an `output` that is not a PassOutput subclass, or a `choices` entry for a knob the
      pass does not declare or whose default is not among its choices.
  """

  fn: Callable[[PassContext, Trajectory], PassOutput]
  output: type[PassOutput]
  after: tuple[str, ...] = ()
  summary: str = ""
  env_fields: tuple[str, ...] = ()
  knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  choices: Mapping[str, tuple] = dataclasses.field(default_factory=dict)
  validate: Callable[[Mapping[str, Any], Any, str], None] | None = None

  def __post_init__(self):
    who = getattr(self.fn, "__name__", self.fn)
    if not (isinstance(self.output, type) and issubclass(self.output, PassOutput)):
      raise ValueError(f"a Pass of {who!r}: output must be a PassOutput subclass, got {self.output!r}")
    object.__setattr__(self, "after", tuple(self.after))
    object.__setattr__(self, "knobs", dict(self.knobs))
    object.__setattr__(self, "choices", {k: tuple(v) for k, v in dict(self.choices).items()})
    for knob, allowed in self.choices.items():
      if knob not in self.knobs or self.knobs[knob] not in allowed:
        raise ValueError(
          f"a Pass of {who!r}: choices for {knob!r} need the knob in `knobs` with a default among {allowed}"
        )

  def __call__(self, ctx: PassContext, traj: Trajectory) -> PassOutput:
    out = self.fn(ctx, traj)
    if not isinstance(out, self.output):
      raise ValueError(
        f"pass {getattr(self.fn, '__name__', self.fn)!r} returned {type(out).__name__}, not its row's output "
        f"{self.output.__name__}"
      )
    return out


# ---------------------------------------------------------------------------------------------------------------
# The passes.


def gold_answer(ctx: PassContext, traj: Trajectory) -> GoldAnswerOutput:
  """TRACE: log p_ref(y* | s_t) at every boundary, all boundaries of a rollout in one packed forward."""
  ref = ctx.models["reference"]
  gold_ids = [encode_plain(ctx.tok, ctx.env.gold_answer_text(t)) + [ctx.tok.eos_id] for t in ctx.tasks]
  fn = ctx.fns.gold(ref)
  gold, mask = score_gold_answers_packed(
    lambda *a: multihost.to_host(fn(ref.params, *a)),
    traj,
    gold_ids,
    pad_id=ctx.tok.pad_id,
    reduce=ctx.knobs["gold_reduce"],
    length_bucket=ctx.config.train.length_bucket,
  )
  valid = mask[:, 0].copy()  # without s_0 TRACE has no dense term for the rollout
  return GoldAnswerOutput(
    gold_logp_BxT1=gold, boundary_mask_BxT1=mask, valid_B=valid, reasons=["" if v else "no_boundary" for v in valid]
  )


def _cut(ctx: PassContext, text: str, budget: int) -> tuple[str, int]:
  """(the text cut from its start to `budget` tokens, the tokens cut)."""
  n = len(encode_plain(ctx.tok, text))
  if n <= budget:
    return text, 0
  kept = teacher_lib.cut_context(ctx.tok, text, budget)
  return kept, n - len(encode_plain(ctx.tok, kept))


def _warn_cut(ctx: PassContext, cut_B: np.ndarray, budget: int) -> None:
  if cut_B.any() and not ctx.fns.warned_context_cut:
    ctx.fns.warned_context_cut = True
    log.warning(
      "teacher contexts cut from their start to config.teacher.max_context_tokens = %d tokens (%d of %d rollouts, "
      "%d tokens); the step metrics count it as pass/<name>/context_cut. Raise the budget (0: derived) to keep them "
      "whole. Warned once per run.",
      budget,
      int(np.sum(cut_B > 0)),
      cut_B.size,
      int(cut_B.sum()),
    )


def _prompt_messages(ctx: PassContext, i: int) -> list[Mapping[str, Any]]:
  """Rollout `i`'s prompt as the rollout holds it: its messages before the first assistant message. A rollout
  without messages (a JSONL record that does not keep them, `jaxcredit credit`) gets its environment's initial
  messages for its task, which is what the sampler was given."""
  messages = list(ctx.messages[i])
  if not messages:
    return ctx.env.initial_messages(ctx.tasks[i])
  first_reply = next((j for j, m in enumerate(messages) if m["role"] == "assistant"), len(messages))
  return messages[:first_reply]


def _teacher_prompts(ctx: PassContext, contexts: Sequence[str | None]) -> tuple[list[list[int] | None], np.ndarray]:
  """Each rollout's teacher prompt (its prompt messages, `_prompt_messages`, with `contexts[b]` in the wrapper; None
  stays None) and the tokens cut from each context to fit the context budget."""
  t = ctx.config.teacher
  budget, _ = teacher_budgets(ctx.config)
  prompts: list[list[int] | None] = []
  cut_B = np.zeros(len(contexts), np.int32)
  for i, c in enumerate(contexts):
    if c is None:
      prompts.append(None)
      continue
    kept, cut_B[i] = _cut(ctx, c, budget)
    prompts.append(
      teacher_lib.teacher_prompt_ids(
        ctx.tok, _prompt_messages(ctx, i), kept, wrapper=t.context_wrapper, max_context_tokens=budget
      )
    )
  _warn_cut(ctx, cut_B, budget)
  return prompts, cut_B


def run_teacher(
  ctx: PassContext,
  traj: Trajectory,
  prompts: Sequence[list[int] | None],
  *,
  divergence: bool = False,
  context_cut_B: np.ndarray | None = None,
  insertions: Sequence | None = None,
  hidden: bool = False,
) -> dict[str, Any]:
  """The fields of a teacher pass's output (`TeacherOutput`'s; with `divergence`, `DivergenceOutput`'s; with `hidden`,
  also hidden_BxLxD): the teacher's log-probs and entropies (and divergence from the policy) on the rollouts' own action tokens,
  with each rollout's prompt replaced by `prompts[b]` (None: no context, the pass is invalid for it) and
  `insertions[b]` put into its continuation (`teacher_lib.build_teacher_batch`); `context_cut_B` (tokens cut from
  each context, default 0) is returned as `context_cut_tokens_B`; with `hidden`, also the teacher's final hidden
  states at the action tokens, `hidden_BxLxD` (its whole distribution there, with its head)."""
  teacher = ctx.models[ctx.teacher]
  student = ctx.models["policy"] if divergence else None
  batch = teacher_lib.build_teacher_batch(
    traj,
    prompts,
    max_len=teacher_budgets(ctx.config)[1],
    pad_id=ctx.tok.pad_id,
    length_bucket=ctx.config.train.length_bucket,
    insertions=insertions,
  )
  fn = ctx.fns.teacher(teacher, student, hidden=True) if hidden else ctx.fns.teacher(teacher, student)
  result = fn(teacher.params, batch, traj, None if student is None else student.params)
  cut = np.zeros(traj.batch_size, np.int32) if context_cut_B is None else np.asarray(context_cut_B, np.int32)
  return dict(result.arrays(), reasons=result.reasons, context_cut_tokens_B=cut)


def teacher_plain(ctx: PassContext, traj: Trajectory) -> TeacherOutput:
  """The teacher on the rollout as it is (OPD; ToolOPD's base pass)."""
  return TeacherOutput(**run_teacher(ctx, traj, teacher_lib.rollout_prompt_ids(traj)))


def unit_contexts(ctx: PassContext, traj: Trajectory) -> tuple[list, list, np.ndarray, list[str]]:
  """CrEST's per-unit teacher contexts (`crest.teacher_context="per_unit"`): unit u's tokens see the ground truth of
  the units before u only. Source: Wang et al., "Teach the Magnitude, Not the Direction: Verifier-Bounded Credit
  Assignment for Multi-Turn Multi-step LLM Agents", arXiv 2608.13179, App. C.1; docs/teacher-passes.md v2.

  With `env.unit_privileged_info`, the user message that opens unit u >= 1 gets unit u-1's ground truth in the
  config's wrapper (`teacher_lib.unit_context_insertions`), so unit u reads every earlier unit's and no later one;
  unit 0 gets nothing and the teacher prompt is the rollout's own. Their total is cut from its start (the earliest
  units' ground truth first) to `teacher.max_context_tokens`. Without it (an outcome-only verifier, U = 1) the one
  unit's context is the gold answer, in the initial prompt.

  Returns:
    (teacher prompts [B] (lists of int ids, None for an invalid rollout), insertions [B] ([(rollout position,
    ids)], or None: none), tokens cut [B] int32 numpy, reasons [B]: "" or "no_anchor" when the template left no
    token boundary at the end of a unit's user message: that rollout's pass is invalid).

  Raises:
    ValueError: a negative or non-int `teacher.max_context_tokens` / `teacher.max_len` (naming the key).
  """
  budget, _ = teacher_budgets(ctx.config)
  wrapper = ctx.config.teacher.context_wrapper
  if ctx.env.unit_privileged_info is None:
    gold_prompts, gold_cut_B = _teacher_prompts(ctx, [ctx.env.gold_answer_text(t) for t in ctx.tasks])
    return gold_prompts, [None] * traj.batch_size, gold_cut_B, [""] * traj.batch_size
  fmt = ChatFormat.from_tokenizer(ctx.tok)
  anchor = encode_with_plain_spans(ctx.tok, fmt.after_user, [])
  prompts: list[list[int] | None] = list(teacher_lib.rollout_prompt_ids(traj))
  insertions, reasons, cut_B = [], [], np.zeros(traj.batch_size, np.int32)
  for i, task in enumerate(ctx.tasks):
    n = int(np.asarray(traj.token_mask_BxL[i]).sum())
    units = np.asarray(traj.unit_ids_BxL[i, :n])
    acted = [u for u in range(1, int(units.max(initial=0)) + 1) if np.any(units == u)]
    texts = list(ctx.env.unit_privileged_info(task))
    room, contexts = budget, {}
    for u in reversed(acted):  # the latest ground truth is kept first
      text = texts[u - 1] if u - 1 < len(texts) else ""
      kept, cut = _cut(ctx, text, room)
      cut_B[i] += cut
      room -= len(encode_plain(ctx.tok, kept))
      if wrapper and kept:
        contexts[u] = encode_plain(ctx.tok, wrapper.replace("{context}", kept))
    ins = teacher_lib.unit_context_insertions(
      traj.tokens_BxL[i, :n], traj.action_mask_BxL[i, :n], units, contexts, anchor
    )
    insertions.append(ins)
    reasons.append("" if ins is not None else "no_anchor")
    if ins is None:
      prompts[i] = None
  _warn_cut(ctx, cut_B, budget)
  return prompts, insertions, cut_B, reasons


def teacher_privileged(ctx: PassContext, traj: Trajectory) -> TeacherOutput:
  """The teacher shown the environment's verified ground truth (CrEST; arXiv 2608.13179, App. C.1): per unit, the
  ground truth of the units before it (`unit_contexts`, the default `crest.teacher_context="per_unit"`), or every
  unit the whole session's (`"all"`: `env.privileged_info` in the initial prompt).

  `teacher_context` is one of the pass's choices (checked by `config.validate`).
  """
  if ctx.knobs["teacher_context"] == "all":
    prompts, cut_B = _teacher_prompts(ctx, [ctx.env.privileged_info(t) for t in ctx.tasks])
    return TeacherOutput(**run_teacher(ctx, traj, prompts, context_cut_B=cut_B))
  prompts, insertions, cut_B, why = unit_contexts(ctx, traj)
  out = run_teacher(ctx, traj, prompts, context_cut_B=cut_B, insertions=insertions)
  out["reasons"] = [w if (w and r == "no_context") else r for w, r in zip(why, out["reasons"])]
  return TeacherOutput(**out)


def teacher_divergence(ctx: PassContext, traj: Trajectory) -> DivergenceOutput:
  """The ground-truth-conditioned teacher, with the full-vocabulary reverse KL from the policy (GEAR)."""
  prompts, cut_B = _teacher_prompts(ctx, [ctx.env.privileged_info(t) for t in ctx.tasks])
  return DivergenceOutput(**run_teacher(ctx, traj, prompts, divergence=True, context_cut_B=cut_B))


def teacher_peer(ctx: PassContext, traj: Trajectory, *, hidden: bool = False) -> PeerTeacherOutput:
  """The teacher shown a successful peer rollout of the same group, whole (its transcript is cut only when it exceeds
  `teacher.max_context_tokens`, derived by default to hold a whole rollout), then the gold answer (HSD).

  Peers come from `credit.hsd_select_peers` per group. Without a peer the context is the gold answer alone
  (`fallback="gold"`) or the pass is invalid for that rollout (`fallback="skip"`, reason "no_peer"). With `hidden`
  (the `teacher_peer_states` row, HSD's full-vocabulary distillation), the teacher's hidden states too.
  """
  k = ctx.knobs
  idx_PxG = group_index(traj.group_ids_B)
  keys = jax.random.split(ctx.key, idx_PxG.shape[0])
  select = jax.jit(
    jax.vmap(lambda r, m, key: credit.hsd_select_peers(r, m, key, success_threshold=float(k["success_threshold"])))
  )
  local_PxG = np.asarray(select(traj.rewards_B[idx_PxG], traj.sample_mask_B[idx_PxG], keys))
  peer_B = np.full(traj.batch_size, -1, np.int32)
  for p in range(idx_PxG.shape[0]):
    for g in range(idx_PxG.shape[1]):
      if local_PxG[p, g] >= 0:
        peer_B[idx_PxG[p, g]] = idx_PxG[p, local_PxG[p, g]]
  contexts: list[str | None] = []
  for i, task in enumerate(ctx.tasks):
    gold = ctx.env.gold_answer_text(task)
    if peer_B[i] >= 0:
      contexts.append(
        f"A successful attempt at this task:\n{transcript(ctx.messages[peer_B[i]])}\nThe correct final answer: {gold}"
      )
    else:
      contexts.append(f"The correct final answer: {gold}" if k["fallback"] == "gold" else None)
  prompts, cut_B = _teacher_prompts(ctx, contexts)
  out = run_teacher(ctx, traj, prompts, context_cut_B=cut_B, hidden=hidden)
  out["reasons"] = ["no_peer" if (c is None and r == "no_context") else r for c, r in zip(contexts, out["reasons"])]
  return (PeerStatesOutput if hidden else PeerTeacherOutput)(**out, peer_B=peer_B)


def teacher_notes(
  ctx: PassContext, prompts: Sequence[list[int]], max_new: int, model: str = ""
) -> tuple[list[str], list[int]]:
  """The greedy texts of `ctx.models[model]` (default: the teacher) for chat prompts (ToolOPD's hindsight skills,
  SGCD's sibling summaries): at most `max_new` tokens each, batched through the sampler bound to that model
  (`ctx.sampler_for`).

  Returns:
    (each text without its stop token, stripped; the tokens each generated).
  """
  tok = ctx.tok
  sampler = ctx.sampler_for(ctx.models[model or ctx.teacher])
  params = SamplingParams(temperature=1.0, top_p=1e-6, max_new_tokens=max_new, stop_token_ids=tok.stop_ids)
  out = sampler.generate(list(prompts), params, ctx.key)
  return [action_text(tok, ids, params.stop_token_ids).strip() for ids in out.tokens], [len(ids) for ids in out.tokens]


def hindsight_skill(ctx: PassContext, traj: Trajectory) -> SkillOutput:
  """ToolOPD's hindsight skills: the teacher writes one or two sentences of advice from the task, the rollout's
  transcript and its outcome; greedy, at most `skill_max_tokens` tokens, batched over the rollouts.

  The transcript is cut from its start so that the prompt and the skill fit the sampler's `sampling.max_len`.
  An empty skill, or a prompt that cannot fit, makes the rollout's skill passes invalid.
  """
  k, tok = ctx.knobs, ctx.tok
  template = k["skill_template"] or DEFAULT_SKILL_TEMPLATE
  max_new = int(k["skill_max_tokens"])
  budget = int(ctx.config.sampling.max_len) - max_new
  success = np.asarray([bool(ctx.env.is_success(r)) for r in ctx.rewards])
  prompts, fits = [], []
  for task, messages, ok in zip(ctx.tasks, ctx.messages, success):
    question = next(m["content"] for m in reversed(ctx.env.initial_messages(task)) if m["role"] == "user")
    fill = dict(task=question, outcome="success" if ok else "failure")
    empty = encode_chat(tok, [{"role": "user", "content": template.format(transcript="", **fill)}])
    room = budget - len(empty)
    ids = encode_plain(tok, transcript(messages))
    text = tok.decode(ids[-room:]) if room > 0 else ""
    prompt = encode_chat(tok, [{"role": "user", "content": template.format(transcript=text, **fill)}])
    fits.append(room > 0 and len(prompt) <= budget)
    prompts.append(prompt[-budget:] if budget > 0 else prompt[:1])
  skills, lengths, reasons = [], [], []
  for text, n, fit in zip(*teacher_notes(ctx, prompts, max_new), fits):
    text = text if fit else ""
    skills.append(text)
    lengths.append(n if fit else 0)
    reasons.append("" if text else ("over_budget" if not fit else "empty_skill"))
  valid = np.asarray([not r for r in reasons], bool)
  return SkillOutput(
    skills=skills, skill_tokens_B=np.asarray(lengths, np.int32), success_B=success, valid_B=valid, reasons=reasons
  )


def teacher_skill(ctx: PassContext, traj: Trajectory) -> TeacherOutput:
  """The teacher shown the rollout's own hindsight skill (ToolOPD); needs `hindsight_skill` first."""
  skills = read_output(traj, "hindsight_skill", SkillOutput)
  contexts = [s if v else None for s, v in zip(skills.skills, skills.valid_B)]
  prompts, cut_B = _teacher_prompts(ctx, contexts)
  out = run_teacher(ctx, traj, prompts, context_cut_B=cut_B)
  # A rollout without a skill is dropped for the skill's reason (empty_skill, over_budget), not "no_context".
  out["reasons"] = [
    sr if (c is None and r == "no_context") else r for c, r, sr in zip(contexts, out["reasons"], skills.reasons)
  ]
  return TeacherOutput(**out)


def sibling_pairs(success_B: np.ndarray, valid_B: np.ndarray, group_ids_B: np.ndarray, key: jax.Array) -> np.ndarray:
  """SGCD's siblings: for each group holding both a successful and a failed valid rollout, one of each, drawn
  uniformly among them (one pair per group, given to each of its rollouts).

  Args:
    success_B: bool, the environment's `is_success` of each rollout's reward.
    valid_B: bool, the rollouts that may be chosen (the trajectory's `sample_mask_B`).
    group_ids_B: the prompt group of each rollout (any batch order).
    key: a jax.random key (typed or raw); the same key gives the same pairs.

  Returns:
    siblings_Bx2: int32, the batch indices of the group's (successful, failed) sibling; (-1, -1) for the rollouts
    of a group without both outcomes.
  """
  success, valid = np.asarray(success_B, bool), np.asarray(valid_B, bool)
  seed = np.asarray(jax.random.randint(key, (2,), 0, np.iinfo(np.int32).max)).tolist()
  rng = np.random.default_rng(seed)
  out = np.full((len(success), 2), -1, np.int32)
  for row in group_index(group_ids_B):
    good = [int(i) for i in row if valid[i] and success[i]]
    bad = [int(i) for i in row if valid[i] and not success[i]]
    if good and bad:
      out[row] = (good[rng.integers(len(good))], bad[rng.integers(len(bad))])
  return out


SUMMARIZER_NAMED = ("", "policy", "reference")
"""`credit.sgcd.summarizer` values that name no checkpoint: "" (the method's teacher, `config.teacher.source`), or
the policy / the frozen reference. Any other value is a checkpoint, loaded as `models["summarizer"]`."""


def summarizer_model(ctx: PassContext) -> str:
  """The key in `ctx.models` of the model that writes SGCD's credit reference (`credit.<method>.summarizer`)."""
  source = ctx.knobs["summarizer"]
  if source == "":
    return ctx.teacher
  return source if source in ("policy", "reference") else "summarizer"


DEFAULT_SIBLING_TEMPLATE = (
  "Task: {task}\n\nSuccessful attempt:\n{success}\n\nFailed attempt:\n{failure}\n\n"
  "Step by step, say which steps decided the outcome: what the successful attempt did right and where the failed "
  "one went wrong. Be brief."
)


def sibling_summary(ctx: PassContext, traj: Trajectory) -> SiblingSummaryOutput:
  """SGCD's step-wise credit reference: for each group with both outcomes, the summariser (`summarizer_model`: the
  teacher by default, as a stand-in for the paper's external LLM, or the checkpoint `credit.<method>.summarizer`
  names) compares a successful and a failed sibling (`sibling_pairs`) and writes which steps decided the outcome
  (`credit.sgcd.summary_template`, default `DEFAULT_SIBLING_TEMPLATE`), greedy, at most `summary_max_tokens` tokens, one generation per group;
  every rollout of the group gets the group's summary as its teacher context (`teacher_sibling`).

  Each transcript is cut from its start to half of what the template leaves of `sampling.max_len` minus the summary
  (and by a few tokens more where the joined prompt encodes longer than its parts).
  A rollout has no summary (its teacher pass is then invalid) when its group lacks an outcome ("not_mixed"), when
  the prompt cannot fit ("over_budget") or when the summary came out empty ("empty_summary"). Training only: the
  policy never sees a summary when it samples.

  Source: arXiv 2606.12634's abstract (an LLM summarises the contrast of mixed siblings into a training-only,
  step-wise credit reference); the prompt, the uniform pair and one summary per group are our reading
  (docs/methods/sgcd.md).

  Returns:
    summaries (str per rollout, "" when none), summary_tokens_B (int32), siblings_Bx2 (int32, `sibling_pairs`),
    mixed_B (bool: the rollout's group has both outcomes), success_B (bool), valid_B, reasons.
  """
  k, tok = ctx.knobs, ctx.tok
  template = k["summary_template"] or DEFAULT_SIBLING_TEMPLATE
  max_new = int(k["summary_max_tokens"])
  budget = int(ctx.config.sampling.max_len) - max_new
  success = np.asarray([bool(ctx.env.is_success(r)) for r in ctx.rewards])
  pairs = sibling_pairs(success, traj.sample_mask_B, traj.group_ids_B, jax.random.fold_in(ctx.key, 1))
  mixed = pairs[:, 0] >= 0
  members: dict[tuple[int, int], list[int]] = {}
  for i in np.flatnonzero(mixed):
    members.setdefault((int(pairs[i, 0]), int(pairs[i, 1])), []).append(int(i))
  prompts, fits = [], []
  for good, bad in members:
    task = ctx.tasks[good]
    question = next(m["content"] for m in reversed(ctx.env.initial_messages(task)) if m["role"] == "user")
    empty = encode_chat(tok, [{"role": "user", "content": template.format(task=question, success="", failure="")}])
    room = (budget - len(empty)) // 2
    rows_of = {"success": good, "failure": bad}
    ids = {field: encode_plain(tok, transcript(ctx.messages[i])) for field, i in rows_of.items()}
    for _ in range(4):  # the texts join the template in fewer or more tokens than apart: cut again by the excess
      texts = {field: tok.decode(x[-room:]) if room > 0 else "" for field, x in ids.items()}
      prompt = encode_chat(tok, [{"role": "user", "content": template.format(task=question, **texts)}])
      excess = len(prompt) - budget
      if excess <= 0 or room <= 0:
        break
      room -= (excess + 1) // 2
    fits.append(room > 0 and len(prompt) <= budget)
    prompts.append(prompt[-budget:] if budget > 0 else prompt[:1])
  summaries = [""] * traj.batch_size
  lengths = [0] * traj.batch_size
  reasons = ["not_mixed"] * traj.batch_size
  written, generated = teacher_notes(ctx, prompts, max_new, summarizer_model(ctx)) if prompts else ([], [])
  for rows, text, n, fit in zip(members.values(), written, generated, fits):
    text = text if fit else ""
    for row in rows:
      summaries[row], lengths[row] = text, (n if fit else 0)
      reasons[row] = "" if text else ("over_budget" if not fit else "empty_summary")
  return SiblingSummaryOutput(
    summaries=summaries,
    summary_tokens_B=np.asarray(lengths, np.int32),
    siblings_Bx2=pairs,
    mixed_B=mixed,
    success_B=success,
    valid_B=np.asarray([not r for r in reasons], bool),
    reasons=reasons,
  )


def teacher_sibling(ctx: PassContext, traj: Trajectory) -> DivergenceOutput:
  """The teacher shown its group's sibling-contrast summary (SGCD; needs `sibling_summary` first), with the
  full-vocabulary reverse KL from the policy, which sees no summary: the dense divergence and the teacher's entropy
  that `credit.sgcd_token_weights` reads."""
  summary = read_output(traj, "sibling_summary", SiblingSummaryOutput)
  contexts = [s if v else None for s, v in zip(summary.summaries, summary.valid_B)]
  prompts, cut_B = _teacher_prompts(ctx, contexts)
  out = run_teacher(ctx, traj, prompts, divergence=True, context_cut_B=cut_B)
  # A rollout without a summary is dropped for the summary's reason (not_mixed, empty_summary), not "no_context".
  out["reasons"] = [
    sr if (c is None and r == "no_context") else r for c, r, sr in zip(contexts, out["reasons"], summary.reasons)
  ]
  return DivergenceOutput(**out)


def _check_skill_knobs(k: Mapping[str, Any], c, method: str) -> None:
  """hindsight_skill's knobs: `skill_max_tokens` in [1, sampling.max_len) (the skill is generated within the
  sampler's budget) and a `skill_template` that uses only {task}, {transcript} and {outcome}."""
  n, max_len = k["skill_max_tokens"], c.sampling.max_len
  if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < max_len:
    raise ValueError(f"config.credit.{method}.skill_max_tokens = {n!r}: must be in [1, sampling.max_len = {max_len})")
  _check_template(k, "skill_template", SKILL_TEMPLATE_FIELDS, method)


def _check_summary_knobs(k: Mapping[str, Any], c, method: str) -> None:
  """sibling_summary's knobs: `summarizer` a string, `summary_max_tokens` in [1, sampling.max_len), a
  `summary_template` that uses only {task}, {success} and {failure}."""
  if not isinstance(k["summarizer"], str):
    raise ValueError(
      f"config.credit.{method}.summarizer = {k['summarizer']!r}: must be '' (the teacher), 'policy', 'reference' "
      f"or a checkpoint (a .gguf file, a Hugging Face or converted folder, 'smollm2')"
    )
  n, max_len = k["summary_max_tokens"], c.sampling.max_len
  if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n < max_len:
    raise ValueError(f"config.credit.{method}.summary_max_tokens = {n!r}: must be in [1, sampling.max_len = {max_len})")
  _check_template(k, "summary_template", SIBLING_TEMPLATE_FIELDS, method)


def _check_template(k: Mapping[str, Any], knob: str, fields: tuple[str, ...], method: str) -> None:
  template = k[knob]
  if not isinstance(template, str):
    raise ValueError(f"config.credit.{method}.{knob} = {template!r}: must be a string ('' for the default)")
  if template:
    try:
      template.format(**{f: "" for f in fields})
    except Exception as e:  # KeyError, IndexError, AttributeError, ValueError: any template str.format refuses
      named = ", ".join("{" + f + "}" for f in fields)
      raise ValueError(f"config.credit.{method}.{knob} = {template!r}: may use only {named} ({e!r})") from None


def _check_peer_knobs(k: Mapping[str, Any], c, method: str) -> None:
  """teacher_peer's `success_threshold` through the peer selection's own range check (credit.hsd_select_peers)."""
  try:
    credit.hsd_select_peers(
      np.asarray([1.0, 0.0]), np.ones(2, bool), jax.random.key(0), success_threshold=k["success_threshold"]
    )
  except (ValueError, TypeError) as e:
    raise ValueError(f"config.credit.{method}.success_threshold = {k['success_threshold']!r}: {e}") from None


SKILL_TEMPLATE_FIELDS = ("task", "transcript", "outcome")
SIBLING_TEMPLATE_FIELDS = ("task", "success", "failure")
_PEER_KNOBS = {"success_threshold": 0.5, "fallback": "gold"}  # a peer succeeded at reward >= the threshold

PASSES: dict[str, Pass] = {
  "gold_answer": Pass(
    gold_answer,
    GoldAnswerOutput,
    env_fields=("gold_answer_text",),
    # "mean": TRACE's l-bar, the mean per-token log-prob of the gold answer (arXiv 2607.13988); "sum": v1's
    knobs={"gold_reduce": "mean"},
    choices={"gold_reduce": ("sum", "mean")},
  ),
  "teacher_plain": Pass(teacher_plain, TeacherOutput),
  "teacher_privileged": Pass(
    teacher_privileged,
    TeacherOutput,
    env_fields=("gold_answer_text", "privileged_info"),
    # "per_unit": each unit sees the ground truth of the units before it (CrEST, App. C.1); "all": the whole session's
    knobs={"teacher_context": "per_unit"},
    choices={"teacher_context": ("per_unit", "all")},
  ),
  "teacher_peer": Pass(
    teacher_peer,
    PeerTeacherOutput,
    env_fields=("gold_answer_text",),
    knobs=_PEER_KNOBS,
    choices={"fallback": ("gold", "skip")},
    validate=_check_peer_knobs,
  ),
  "teacher_peer_states": Pass(
    functools.partial(teacher_peer, hidden=True),
    PeerStatesOutput,
    summary="teacher_peer with the teacher's hidden states (its whole distribution at each action token)",
    env_fields=("gold_answer_text",),
    knobs=_PEER_KNOBS,
    choices={"fallback": ("gold", "skip")},
    validate=_check_peer_knobs,
  ),
  "hindsight_skill": Pass(
    hindsight_skill,
    SkillOutput,
    knobs={"skill_max_tokens": 48, "skill_template": ""},  # "": DEFAULT_SKILL_TEMPLATE
    validate=_check_skill_knobs,
  ),
  "teacher_skill": Pass(teacher_skill, TeacherOutput, after=("hindsight_skill",)),
  "teacher_divergence": Pass(teacher_divergence, DivergenceOutput, env_fields=("privileged_info",)),
  "sibling_summary": Pass(
    sibling_summary,
    SiblingSummaryOutput,
    # summarizer "": the teacher writes the summary (a stand-in for SGCD's external LLM); or "policy", "reference",
    # a checkpoint. summary_template "": DEFAULT_SIBLING_TEMPLATE.
    knobs={"summary_max_tokens": 64, "summary_template": "", "summarizer": ""},
    validate=_check_summary_knobs,
  ),
  "teacher_sibling": Pass(teacher_sibling, DivergenceOutput, after=("sibling_summary",)),
}
