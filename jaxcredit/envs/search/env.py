"""The search QA environment and its `EnvSpec`: BM25 `search` and `open` tools over a fixed corpus (TRACE's setting).

A corpus is a list of documents {"docid", "title", "text"}; a task is {"query_id", "query", "answer", "aliases"?,
"evidence_docids"?}. The policy answers the question with two tools:

  search(query)  -> the top `top_k` documents by BM25 (docid, title, the first `snippet_chars` characters of text);
  open(docid)    -> the document's text, cut at `max_output_chars` with `tool_calls.TRUNCATION_MARKER` (not an error).

With `open_tool=False` only `search` is offered, and each result shows its document's text (up to `snippet_chars`)
instead of a snippet: every hop is one search (Search-R1's setting), so a policy never copies docids.

The index (`index.SearchIndex`) is built once per corpus and shared read-only by every rollout of an `EnvSpec`; each
rollout's `SearchEnv` holds only its own counters.

Per assistant message (`SearchEnv.step`), think blocks are dropped (`tool_calls.parse_message`), then:
  * tool calls (several per message allowed): those within the call budget run in order; the observation is their
    `<tool_response>`s joined by newlines (role "tool"); calls past the budget are answered with an error and not run.
    A message with calls and no budget left ends the episode (info["budget_exhausted"]). An `<answer>` in a message
    that also calls tools is ignored.
  * `<answer>...</answer>` and no call: the episode ends; the reward is 1.0 when the answer matches the gold answer or
    one of its aliases after SQuAD-style normalisation (`normalize_answer`), else 0.0.
  * neither: the episode ends unanswered.

Two sources of data, chosen by `env_spec` from the config: the generated fictional corpus (`world.py`) and
BrowseComp-Plus files (`browsecomp.py`).

This module also holds the prompts, the demonstrations for the supervised warm start, the teacher's privileged text,
the train/eval task lists, and `env_spec` with `CONFIG_DEFAULTS` (what the `ENVS["search"]` row calls).

The environment knows no model and no tokenizer; everything here is plain Python on text and chat messages.
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
import string
import unicodedata
from typing import Any, Mapping, Protocol, Sequence

from jaxcredit.envs import episode, spec, tool_calls
from jaxcredit.envs.search.browsecomp import load_corpus, load_queries
from jaxcredit.envs.search.data import Hop, SearchTask, snippet
from jaxcredit.envs.search.index import TOP_K, SearchIndex
from jaxcredit.envs.search.world import MAX_HOPS, make_fictional_corpus

SNIPPET_CHARS = 200  # characters of text shown per search result
MAX_OUTPUT_CHARS = 2000  # characters of one tool output kept in the observation (the rest is cut)
MAX_TOOL_CALLS = 8  # tool calls per rollout
NUM_GENERATED = 1000  # train questions of the generated corpus
EVAL_SIZE = 128  # held-out questions (generated: a separate world; loaded: chosen by query_id hash)
MAX_QUERY_CHARS = 1000  # a longer search query is an error
PRIVILEGED_CHARS = 300  # characters of an evidence document shown to a teacher when no key sentence is known

SEARCH_DESCRIPTION = (
  "Search the document collection (BM25 keyword match). Returns the top {k} documents, each with "
  "its docid, title and the first {n} characters of its text."
)
OPEN_DESCRIPTION = "Read a document by its docid (as given in search results). Text past {m} characters is cut."
SEARCH_ONLY_DESCRIPTION = (
  "Search the document collection (BM25 keyword match). Returns the top {k} documents, each with its docid, title "
  "and text (cut at {n} characters)."
)

SYSTEM_PROMPT = (
  "Answer the question using the document collection. Search it with the search tool and read documents with the "
  "open tool; you may call several tools in one message, and each result comes back in <tool_response>. You have "
  "at most {budget} tool calls. The documents may state facts you have never seen: trust them. When you know the "
  "answer, reply without tool calls and with only the short answer (a name, place, date or number) inside "
  "<answer></answer>, e.g. <answer>Kelmarsh</answer>.\n\n{tools}"
)
SEARCH_ONLY_PROMPT = (  # open_tool=False: every search result shows its document
  "Answer the question using the document collection. Search it with the search tool: each result shows its "
  "document. You may call several tools in one message, and each result comes back in <tool_response>. You have "
  "at most {budget} tool calls. The documents may state facts you have never seen: trust them. When you know the "
  "answer, reply without tool calls and with only the short answer (a name, place, date or number) inside "
  "<answer></answer>, e.g. <answer>Kelmarsh</answer>.\n\n{tools}"
)


# --- answers ---------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
  """SQuAD's answer normalisation: lowercase, punctuation removed, articles (a, an, the) removed, whitespace collapsed.

  Source: `normalize_answer` of SQuAD v1.1's official evaluation script (evaluate-v1.1.py; Rajpurkar et al., "SQuAD:
  100,000+ Questions for Machine Comprehension of Text", EMNLP 2016), the exact match that TRACE's outcome reward on
  BrowseComp-Plus names (docs/environments.md).

  Punctuation is ASCII `string.punctuation` plus every Unicode punctuation character (so "O’Brien" == "O'Brien"); the
  text is NFKC-normalised first.
  """
  text = unicodedata.normalize("NFKC", text).lower()
  text = "".join(ch for ch in text if ch not in string.punctuation and not unicodedata.category(ch).startswith("P"))
  text = _ARTICLES.sub(" ", text)
  return " ".join(text.split())


def answer_matches(answer: str, gold: str, aliases: Sequence[str] = ()) -> bool:
  """Whether `answer` equals `gold` or one of `aliases` after `normalize_answer`; an answer that normalises to ""
  never matches."""
  norm = normalize_answer(answer)
  return bool(norm) and any(norm == normalize_answer(g) for g in (gold, *aliases))


# --- the environment -------------------------------------------------------------------------------------------

StepResult = spec.StepResult  # the observation is a tool message's content; None when done


def tool_schemas(
  top_k: int = TOP_K,
  snippet_chars: int = SNIPPET_CHARS,
  max_output_chars: int = MAX_OUTPUT_CHARS,
  open_tool: bool = True,
) -> list[dict]:
  """The OpenAI/Qwen3 function schemas of `search` and `open` (only `search` with open_tool=False)."""
  return [t.schema() for t in _tools(None, top_k, snippet_chars, max_output_chars, open_tool)]


def _tools(
  env: SearchEnv | None, top_k: int, snippet_chars: int, max_output_chars: int, open_tool: bool = True
) -> list[tool_calls.Tool]:
  fn_search = env._search if env is not None else (lambda query: "")
  fn_open = env._open if env is not None else (lambda docid: "")
  search_tool = tool_calls.Tool(
    "search",
    (SEARCH_DESCRIPTION if open_tool else SEARCH_ONLY_DESCRIPTION).format(k=top_k, n=snippet_chars),
    {"type": "object", "properties": {"query": {"type": "string", "description": "keywords"}}, "required": ["query"]},
    fn_search,
  )
  if not open_tool:
    return [search_tool]
  return [
    search_tool,
    tool_calls.Tool(
      "open",
      OPEN_DESCRIPTION.format(m=max_output_chars),
      {
        "type": "object",
        "properties": {"docid": {"type": "string", "description": "a docid from search results"}},
        "required": ["docid"],
      },
      fn_open,
    ),
  ]


class SearchEnv(episode.ToolEpisode):
  """One rollout's environment: runs `search` and `open` calls until an answer or the end (see the module notes).

  `info` keys: "tool_calls" (calls run, malformed ones included), "tool_errors" (calls that gave an error, calls past
  the budget, an unclosed think block), "answered", "budget_exhausted", "turns" (assistant messages seen), "finish"
  (None while running, then "answer", "no_answer" or "tool_budget"), "answer" (the extracted answer or None),
  "searches" and "opens" (calls dispatched to each tool).
  """

  def __init__(
    self,
    task: SearchTask,
    index: SearchIndex,
    *,
    max_tool_calls: int = MAX_TOOL_CALLS,
    top_k: int = TOP_K,
    snippet_chars: int = SNIPPET_CHARS,
    max_output_chars: int = MAX_OUTPUT_CHARS,
    open_tool: bool = True,
  ):
    """Args:
      task: the question.
      index: the corpus index (shared, read-only).
      max_tool_calls: how many tool calls the episode may run (>= 0).
      top_k: documents per search (>= 1).
      snippet_chars: characters of text per search result (>= 1).
      max_output_chars: characters kept of each tool output (>= 1).
      open_tool: offer `open`; False: `search` only, its results carrying the documents (up to snippet_chars),
        and an `open` call answered as an unknown tool.

    Raises:
      ValueError: for a limit out of range.
    """
    if max_tool_calls < 0 or top_k < 1 or snippet_chars < 1 or max_output_chars < 1:
      raise ValueError(
        f"need max_tool_calls >= 0 and top_k, snippet_chars, max_output_chars >= 1; got "
        f"{max_tool_calls}, {top_k}, {snippet_chars}, {max_output_chars}"
      )
    super().__init__(task, answer=None, searches=0, opens=0)
    self.index = index
    self.max_tool_calls = int(max_tool_calls)
    self.top_k = int(top_k)
    self.snippet_chars = int(snippet_chars)
    self.max_output_chars = int(max_output_chars)
    self.seen_docids: set[str] = set()  # docids shown in search results or opened
    self.searched_docids: set[str] = set()  # docids shown in search results (BrowseComp-Plus's retrieved docids)
    self.open_tool = bool(open_tool)
    self._tools = {
      t.name: t for t in _tools(self, self.top_k, self.snippet_chars, self.max_output_chars, self.open_tool)
    }
    self._reward: float | None = None

  def _search(self, query: str) -> str:
    if not query.strip():
      raise tool_calls.ToolError('search needs a non-empty "query"')
    if len(query) > MAX_QUERY_CHARS:
      raise tool_calls.ToolError(f"search query too long ({len(query)} characters; max {MAX_QUERY_CHARS})")
    hits = self.index.search(query, self.top_k)
    if not hits:
      return f"no results for {query!r}"
    self.seen_docids.update(d.docid for d, _ in hits)
    self.searched_docids.update(d.docid for d, _ in hits)
    label = "snippet" if self.open_tool else "text"
    return "\n\n".join(
      f"docid: {d.docid}\ntitle: {d.title}\n{label}: {snippet(d.text, self.snippet_chars)}" for d, _ in hits
    )

  def _open(self, docid: str) -> str:
    doc = self.index.get(docid.strip())
    if doc is None:
      raise tool_calls.ToolError(f"unknown docid {docid[:60]!r}; use a docid from the search results")
    self.seen_docids.add(doc.docid)
    return f"docid: {doc.docid}\ntitle: {doc.title}\n\n{doc.text}"

  def step(self, assistant_text: str) -> StepResult:
    """Consumes one assistant message: runs its `search` / `open` calls within the budget, or ends the episode on an
    answer, calls with no budget left or neither (see the module notes; arguments, result and errors as
    `episode.ToolEpisode.step`)."""
    info = self.begin_step()
    parsed = tool_calls.parse_message(assistant_text)
    if parsed.error is not None:
      return self._think_error(parsed.error)
    if parsed.calls:
      left = self.max_tool_calls - info["tool_calls"]
      if left <= 0:
        info["budget_exhausted"] = True
        return self._finish("tool_budget")
      run, skipped = parsed.calls[:left], parsed.calls[left:]
      outcomes = tool_calls.run_calls(run, self._tools, max_output_chars=self.max_output_chars)
      info["tool_calls"] += len(run)
      info["tool_errors"] += sum(not o.ok for o in outcomes) + len(skipped)
      info["searches"] += sum(o.dispatched and o.call.name == "search" for o in outcomes)
      info["opens"] += sum(o.dispatched and o.call.name == "open" for o in outcomes)
      contents = [o.content for o in outcomes] + [
        f"error: not run: the budget of {self.max_tool_calls} tool calls is used up; give your answer"
      ] * len(skipped)
      return self._observe("\n".join(tool_calls.render_tool_response(c) for c in contents))
    if parsed.answer is not None:
      info["answered"] = True
      info["answer"] = parsed.answer
      return self._finish("answer")
    return self._finish("no_answer")

  def reward(self) -> float:
    """1.0 when the given answer matches the gold answer or an alias (`answer_matches`), else 0.0 (also before the
    end)."""
    if not self.done:
      return 0.0  # never cached: a reward asked for mid-episode must not freeze the episode's reward at 0
    if self._reward is None:
      answer = self.info["answer"]
      self._reward = float(answer is not None and answer_matches(answer, self.task.answer, self.task.aliases))
    return self._reward

  def evidence_found(self) -> float | None:
    """The fraction of the task's evidence documents that a search returned or `open` read; None without evidence."""
    ev = self.task.evidence_docids
    return None if not ev else sum(d in self.seen_docids for d in ev) / len(ev)

  def evidence_recall(self) -> float | None:
    """BrowseComp-Plus's retrieval recall of this rollout: the fraction of the task's evidence documents among the
    documents its `search` calls returned (`open` does not count); None without evidence.

    Source: BrowseComp-Plus (Chen et al., arXiv 2508.06600), `scripts_evaluation/evaluate_run.py`:
    |retrieved_docids ∩ qrel_evidence| / |qrel_evidence|, with retrieved_docids the search results' docids.
    """
    ev = set(self.task.evidence_docids)
    return None if not ev else len(ev & self.searched_docids) / len(ev)


# --- prompts, demonstrations, teacher text ---------------------------------------------------------------------


def initial_messages(
  task: SearchTask,
  max_tool_calls: int = MAX_TOOL_CALLS,
  top_k: int = TOP_K,
  snippet_chars: int = SNIPPET_CHARS,
  max_output_chars: int = MAX_OUTPUT_CHARS,
  open_tool: bool = True,
) -> list[dict]:
  """The prompt of a rollout: a system message (instructions, the call budget, the tool schemas) and the question."""
  tools = tool_calls.render_tools_prompt(tool_schemas(top_k, snippet_chars, max_output_chars, open_tool))
  prompt = SYSTEM_PROMPT if open_tool else SEARCH_ONLY_PROMPT
  return [
    {"role": "system", "content": prompt.format(budget=max_tool_calls, tools=tools)},
    {"role": "user", "content": task.query},
  ]


def gold_answer_text(task: SearchTask) -> str:
  """`<answer>{gold}</answer>`: the text TRACE scores as the next assistant message."""
  return tool_calls.render_answer(task.answer)


def privileged_info(task: SearchTask, index: SearchIndex) -> str:
  """The verified ground truth a teacher may see: the gold answer (and aliases) and the evidence documents' docids,
  titles and key sentences (the chain's facts; for loaded data the first `PRIVILEGED_CHARS` characters of text)."""
  lines = [
    f"The answer is {tool_calls.render_answer(task.answer)}"
    + (f" (also accepted: {'; '.join(task.aliases)})" if task.aliases else "")
    + "."
  ]
  facts = {h.docid: h.fact for h in task.chain}
  ev = [d for d in (task.evidence_docids or tuple(facts)) if index.get(d) is not None]
  if ev:
    lines.append("Evidence documents:")
    for docid in ev:
      doc = index.get(docid)
      lines.append(f"- [{docid}] {doc.title}: {facts.get(docid) or snippet(doc.text, PRIVILEGED_CHARS)}")
  return "\n".join(lines)


class _RandomLike(Protocol):
  def random(self) -> float: ...


def demonstration(
  task: SearchTask,
  rng: _RandomLike,
  index: SearchIndex,
  **limits: Any,
) -> list[dict]:
  """A full chat that finds the evidence and answers, played through `SearchEnv` (observations exactly as rollouts
  see them), for the supervised warm start.

  Generated questions (with a chain): one message per call: search the hop's entity (its name, or for the first hop
  sometimes the question itself when that finds the document too; `rng` chooses), then open the document when the
  budget allows (opens are dropped, last hop first, only where the search snippet already shows what the hop
  reveals), and at the end `<answer>gold</answer>`.
  Loaded questions: one message searching each evidence document's title (or the question, when the title does not
  find it) as parallel calls, one message opening the found ones, then the answer; evidence that no query finds in
  the top `top_k` is left out.

  Args:
    task: the question.
    rng: anything with `.random() -> float` in [0, 1) (`random.Random`, `numpy.random.Generator`).
    index: the corpus index.
    limits: `SearchEnv`'s keyword arguments (max_tool_calls, top_k, snippet_chars, max_output_chars, open_tool; the
      same defaults), the environment the chat is played through (with open_tool=False a demonstration only
      searches: each hop's search result must show what the hop reveals).

  Returns:
    The messages [system, user, assistant, tool, ..., assistant].

  Raises:
    ValueError: when the evidence cannot be retrieved within the budget (a generated chain longer than
      `max_tool_calls`; a loaded question with no evidence listed or none found by its title or the question;
      without the open tool, a hop whose fact the search result does not show, or a loaded question).
  """
  env = SearchEnv(task, index, **limits)
  max_tool_calls, top_k, snippet_chars, open_tool = env.max_tool_calls, env.top_k, env.snippet_chars, env.open_tool
  messages = initial_messages(task, **limits)

  def play(calls: list[tuple[str, dict]]) -> str:
    text = "\n".join(tool_calls.render_tool_call(name, args) for name, args in calls)
    result = env.step(text)
    if result.done:
      raise ValueError(f"task {task.query_id}: the demonstration ran out of tool calls")
    messages.extend([{"role": "assistant", "content": text}, {"role": "tool", "content": result.observation}])
    return result.observation

  def found(query: str, docid: str) -> bool:
    return any(d.docid == docid for d, _ in index.search(query, top_k))

  if task.chain:
    hops = len(task.chain)
    if hops > max_tool_calls:
      raise ValueError(f"task {task.query_id} needs {hops} searches; max_tool_calls is {max_tool_calls}")
    opens_left = max_tool_calls - hops
    for i, hop in enumerate(task.chain):
      queries = [hop.query] + ([task.query] if i == 0 and found(task.query, hop.docid) else [])
      query = queries[int(rng.random() * len(queries)) % len(queries)]
      if not found(query, hop.docid):
        raise ValueError(f"task {task.query_id}: search {query!r} does not return {hop.docid} in the top {top_k}")
      obs = play([("search", {"query": query})])
      doc = index.get(hop.docid)
      shown = _snippet_shows(index, hop, snippet_chars) and snippet(doc.text, snippet_chars) in obs
      if not open_tool:
        if not shown:
          raise ValueError(
            f"task {task.query_id}: hop {i}'s search result does not show {hop.reveals!r} and there is no open "
            f"tool (open_tool=False): raise snippet_chars (now {snippet_chars}) and max_output_chars (now "
            f"{env.max_output_chars}) to hold the whole document"
          )
        continue
      # an open is needed where the snippet hides the fact; otherwise it is spent while later needs still fit
      needed_later = sum(not _snippet_shows(index, h, snippet_chars) for h in task.chain[i + 1 :])
      if not shown or opens_left > needed_later:
        if opens_left <= 0:
          raise ValueError(f"task {task.query_id}: hop {i} needs an open; max_tool_calls {max_tool_calls} is too low")
        obs = play([("open", {"docid": hop.docid})])
        opens_left -= 1
        if hop.reveals.lower() not in obs.lower():
          raise ValueError(f"task {task.query_id}: {hop.docid} as shown does not contain {hop.reveals!r}")
  else:
    if not open_tool:
      raise ValueError(f"task {task.query_id}: demonstrations of loaded questions open documents (open_tool=False)")
    if max_tool_calls < 2:
      raise ValueError(f"task {task.query_id}: a search and an open need max_tool_calls >= 2, got {max_tool_calls}")
    searches: list[str] = []
    opens: list[str] = []
    for docid in task.evidence_docids:
      doc = index.get(docid)
      if doc is None or docid in opens:
        continue
      query = next((q for q in (doc.title, task.query[:MAX_QUERY_CHARS]) if q.strip() and found(q, docid)), None)
      if query is None:
        continue
      cost = 1 if query in searches else 2
      if len(searches) + len(opens) + cost > max_tool_calls:
        break
      if query not in searches:
        searches.append(query)
      opens.append(docid)
    if not opens:
      raise ValueError(
        f"task {task.query_id}: no evidence document is found by searching its title or the question "
        f"(evidence: {list(task.evidence_docids)[:5]}); no demonstration; set config.sft.steps=0"
      )
    play([("search", {"query": q}) for q in searches])
    play([("open", {"docid": d}) for d in opens])
  messages.append({"role": "assistant", "content": tool_calls.render_answer(task.answer)})
  return messages


def _snippet_shows(index: SearchIndex, hop: Hop, snippet_chars: int) -> bool:
  doc = index.get(hop.docid)
  return doc is not None and hop.reveals.lower() in snippet(doc.text, snippet_chars).lower()


# --- tasks and the EnvSpec -------------------------------------------------------------------------------------


def _hash_key(query_id: str) -> str:
  return hashlib.sha256(query_id.encode("utf-8")).hexdigest()


def split_tasks(tasks: Sequence[SearchTask], eval_size: int) -> tuple[list[SearchTask], list[SearchTask]]:
  """(train pool, eval pool). Tasks marked "train"/"eval" (generated) keep their split; the others are ordered by a
  hash of their query_id and the first `eval_size` held out, so the split does not depend on the file's order."""
  marked = [t for t in tasks if t.split]
  if marked:
    return [t for t in tasks if t.split == "train"], [t for t in tasks if t.split == "eval"]
  ordered = sorted(tasks, key=lambda t: _hash_key(t.query_id))
  return ordered[eval_size:], ordered[:eval_size]


def make_tasks(
  train_pool: Sequence[SearchTask], eval_pool: Sequence[SearchTask], split: str, num: int | None, seed: int | None
) -> list[SearchTask]:
  """Deterministic task lists.

  Args:
    train_pool, eval_pool: from `split_tasks`.
    split: "eval": the first `num` of the eval pool (default all; seed must be None). "train": `num` tasks from the
      train pool, shuffled by `seed` (default 0), passing over the pool again (reshuffled) when `num` exceeds it.
    num: how many.
    seed: the train shuffle's seed.

  Raises:
    ValueError: unknown split, a seed for eval, `num` < 0 or larger than the eval pool, an empty train pool.
  """
  if split == "eval":
    if seed is not None:
      raise ValueError("the eval split is fixed; pass seed=None")
    num = len(eval_pool) if num is None else int(num)
    if not 0 <= num <= len(eval_pool):
      raise ValueError(
        f"eval num must be in [0, {len(eval_pool)}] (the held-out questions, config.env.search.eval_size); got {num}"
      )
    return list(eval_pool[:num])
  if split != "train":
    raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
  if num is None or int(num) < 0:
    raise ValueError(f"train num must be a non-negative int, got {num!r}")
  num = int(num)
  if num and not train_pool:
    raise ValueError("no train questions (all are held out: lower config.env.search.eval_size)")
  rng = random.Random(f"jaxcredit-search-train/{0 if seed is None else int(seed)}")
  out: list[SearchTask] = []
  while len(out) < num:
    epoch = list(train_pool)
    rng.shuffle(epoch)
    out += epoch[: num - len(out)]
  return out


@functools.lru_cache(maxsize=4)
def _generated(seed: int, num_train: int, num_eval: int, min_hops: int, max_hops: int, stemmer: str):
  docs, tasks = make_fictional_corpus(
    seed, num_train + num_eval, num_eval=num_eval, min_hops=min_hops, max_hops=max_hops
  )
  return SearchIndex(docs, stemmer=stemmer), tuple(tasks)


def _cfg(env_config: Any, key: str, default: Any) -> Any:
  if isinstance(env_config, Mapping):
    return env_config.get(key, default)
  try:
    return getattr(env_config, key)
  except (AttributeError, KeyError):
    return default


CONFIG_DEFAULTS = {
  "corpus": "",  # "" = the generated fictional corpus; else a JSONL file or datasets folder
  "queries": "",  # questions for `corpus` (JSONL or datasets folder); "" with the generated corpus
  "top_k": TOP_K,
  "snippet_chars": SNIPPET_CHARS,
  "max_tool_calls": MAX_TOOL_CALLS,
  "max_output_chars": MAX_OUTPUT_CHARS,
  "num_generated": NUM_GENERATED,  # train questions of the generated corpus
  "eval_size": EVAL_SIZE,  # held-out questions
  "corpus_seed": 0,  # seed of the generated corpus
  "min_hops": 1,
  "max_hops": MAX_HOPS,
  "stemmer": "",  # "" or a PyStemmer language ("english")
  "stop_at_answer": True,  # end a turn at "</answer>"
  "open_tool": True,  # False: `search` only, each result showing its document (cut at snippet_chars)
}
"""The keys of the environment's config node (`config.env.search`) that `env_spec` reads, with their defaults (a key
absent from the node takes its default)."""


def env_spec(env_config: Any) -> spec.EnvSpec:
  """The search environment as an `EnvSpec` (the `ENVS["search"]` row).

  Args:
    env_config: the environment's config node, `config.env.search` (a ConfigDict, a dict, or anything with the keys
      as attributes); keys and defaults in `CONFIG_DEFAULTS`.

  Returns:
    An `EnvSpec` sharing one `SearchIndex` between all its environments. stop_strings is ("</answer>",) (several calls
    per message are allowed, so a turn never stops at "</tool_call>"), or () with stop_at_answer=False (for thinking
    models that may write the tag inside a think block); max_turns = max_tool_calls + 1; success is reward >= 1.

  Raises:
    ValueError: a key out of range (named), corpus without queries or queries without corpus, a generated chain
      longer than the call budget, or load errors (`load_corpus`, `load_queries`).
  """
  c = {k: _cfg(env_config, k, d) for k, d in CONFIG_DEFAULTS.items()}
  for key in ("top_k", "snippet_chars", "max_output_chars", "num_generated", "min_hops", "max_hops"):
    if isinstance(c[key], bool) or not isinstance(c[key], int) or c[key] < 1:
      raise ValueError(f"config.env.search.{key} must be an int >= 1, got {c[key]!r}")
  for key in ("max_tool_calls", "eval_size", "corpus_seed"):
    if isinstance(c[key], bool) or not isinstance(c[key], int) or c[key] < 0:
      raise ValueError(f"config.env.search.{key} must be an int >= 0, got {c[key]!r}")
  max_tool_calls, top_k, snippet_chars, max_output_chars = (
    c["max_tool_calls"],
    c["top_k"],
    c["snippet_chars"],
    c["max_output_chars"],
  )
  if c["corpus"]:
    if not c["queries"]:
      raise ValueError(
        "config.env.search.corpus is set but config.env.search.queries is empty: give the questions' file too"
      )
    index = SearchIndex(load_corpus(str(c["corpus"])), stemmer=str(c["stemmer"]))
    tasks: Sequence[SearchTask] = load_queries(str(c["queries"]))
    if c["eval_size"] >= len(tasks):
      raise ValueError(
        f"config.env.search.eval_size={c['eval_size']} leaves none of the {len(tasks)} questions for training"
      )
  else:
    if c["queries"]:
      raise ValueError(
        "config.env.search.queries is set but config.env.search.corpus is empty (the generated corpus "
        "has its own questions)"
      )
    if not c["min_hops"] <= c["max_hops"] <= 4:
      raise ValueError(
        f"need 1 <= config.env.search.min_hops <= config.env.search.max_hops <= 4, got {c['min_hops']}, {c['max_hops']}"
      )
    if max_tool_calls < c["max_hops"]:
      raise ValueError(
        f"config.env.search.max_tool_calls={max_tool_calls} is below the generated questions' longest "
        f"chain (config.env.search.max_hops={c['max_hops']} searches); raise it (default "
        f"{MAX_TOOL_CALLS}: a search and an open per hop)"
      )
    index, tasks = _generated(
      c["corpus_seed"], c["num_generated"], c["eval_size"], c["min_hops"], c["max_hops"], str(c["stemmer"])
    )
  train_pool, eval_pool = split_tasks(tasks, c["eval_size"])
  if not isinstance(c["open_tool"], bool):
    raise ValueError(f"config.env.search.open_tool must be True or False, got {c['open_tool']!r}")
  limits = dict(
    max_tool_calls=max_tool_calls,
    top_k=top_k,
    snippet_chars=snippet_chars,
    max_output_chars=max_output_chars,
    open_tool=c["open_tool"],
  )
  schemas = tool_schemas(top_k, snippet_chars, max_output_chars, c["open_tool"])

  return spec.EnvSpec(
    make_tasks=lambda split, num, seed: make_tasks(train_pool, eval_pool, split, num, seed),
    make_env=lambda task: SearchEnv(task, index, **limits),
    initial_messages=lambda task: initial_messages(task, **limits),
    stop_strings=(tool_calls.ANSWER_CLOSE,) if c["stop_at_answer"] else (),
    max_turns=max_tool_calls + 1,
    is_success=lambda reward: reward >= 1.0,
    demonstration=lambda task, rng: demonstration(task, rng, index, **limits),
    gold_answer_text=gold_answer_text,
    privileged_info=lambda task: privileged_info(task, index),
    tools=lambda task: schemas,
    metrics=metrics,
  )


def metrics(envs: Sequence[SearchEnv]) -> dict[str, float]:
  """The search environment's own metrics over finished or unfinished rollouts ({} for none).

  - "searches": `search` calls per rollout (calls that reached the tool; BrowseComp-Plus's "Search Calls").
  - "opens": `open` calls per rollout.
  - "evidence_found": the mean over rollouts whose task lists evidence of the fraction of its evidence documents that
    a search returned or `open` read (`SearchEnv.evidence_found`).
  - "evidence_recall": the same mean of the fraction that a search returned (`SearchEnv.evidence_recall`):
    BrowseComp-Plus's "Recall" (arXiv 2508.06600; its `evaluate_run.py` averages it over the queries with evidence).
    It differs from evidence_found only when a rollout opens an evidence docid no search showed it.

  The two evidence keys are absent when no task lists evidence. Answer accuracy is the trainer's `success_rate`:
  the reward is normalised exact match (`normalize_answer`, `answer_matches`), TRACE's outcome on BrowseComp-Plus.
  """
  if not envs:
    return {}
  out = {
    "searches": sum(e.info["searches"] for e in envs) / len(envs),
    "opens": sum(e.info["opens"] for e in envs) / len(envs),
  }
  for key in ("evidence_found", "evidence_recall"):
    values = [v for v in (getattr(e, key)() for e in envs) if v is not None]
    if values:
      out[key] = sum(values) / len(values)
  return out
