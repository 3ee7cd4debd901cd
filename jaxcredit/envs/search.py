"""Search QA environment in the BrowseComp-Plus layout (TRACE's setting): BM25 `search` and `open` over a fixed corpus.

A corpus is a list of documents {"docid", "title", "text"}; a task is {"query_id", "query", "answer", "aliases"?,
"evidence_docids"?}. The policy answers the question with two tools:

  search(query)  -> the top `top_k` documents by BM25 (docid, title, the first `snippet_chars` characters of text);
  open(docid)    -> the document's text, cut at `max_output_chars` with `tool_calls.TRUNCATION_MARKER` (not an error).

With `open_tool=False` only `search` is offered, and each result shows its document's text (up to `snippet_chars`)
instead of a snippet: every hop is one search (Search-R1's setting), so a policy never copies docids.

Retrieval is `bm25s` with its own tokenizer (English stopwords; stemming through PyStemmer when `stemmer` names a
language). The index is built once per corpus (`SearchIndex`, shared read-only by every rollout of an `EnvSpec`); each
rollout's `SearchEnv` holds only its own counters.

Per assistant message (`SearchEnv.step`), think blocks are dropped (`tool_calls.parse_message`), then:
  * tool calls (several per message allowed): those within the call budget run in order; the observation is their
    `<tool_response>`s joined by newlines (role "tool"); calls past the budget are answered with an error and not run.
    A message with calls and no budget left ends the episode (info["budget_exhausted"]). An `<answer>` in a message
    that also calls tools is ignored.
  * `<answer>...</answer>` and no call: the episode ends; the reward is 1.0 when the answer matches the gold answer or
    one of its aliases after SQuAD-style normalisation (`normalize_answer`), else 0.0.
  * neither: the episode ends unanswered.

Two sources of data:
  * `make_fictional_corpus`: invented people, companies, towns, schools and built works, so no model knows the facts.
    Questions are chains of 1 to 4 look-ups ("the birthplace of the founder of the company that built X"); every hop is
    found by searching the current entity's name, and similar-named entities with similar facts act as distractors.
    Held-out questions come from a separate part of the world (no entity of an eval chain is in a train chain).
  * `load_corpus` / `load_queries`: BrowseComp-Plus as users save it (a JSONL file or a `datasets.save_to_disk`
    folder). The corpus (`Tevatron/browsecomp-plus-corpus`) has "docid", "text" and "url" and no title: the title is
    read from the text (`derive_title`). The queries (`Tevatron/browsecomp-plus`) are obfuscated on the Hub: every
    field but "query_id" is XOR-encrypted and base64-encoded with the BrowseComp canary string. Only decrypted queries
    are accepted (the BrowseComp-Plus repository's `scripts_build_index/decrypt_dataset.py` writes them as JSONL with
    "query_id", "query", "answer", "evidence_docs" and "gold_docs", the last two lists of {"docid", ...}); a query that
    looks encrypted is refused with that advice. BrowseComp-Plus grades with an LLM judge; the reward here is the
    stricter normalised exact match.

The environment knows no model and no tokenizer; everything here is plain Python on text and chat messages.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import random
import re
import string
import unicodedata
from typing import Any, Iterator, Mapping, Protocol, Sequence

from jaxcredit.envs import spec, tool_calls

TOP_K = 5  # documents per search
SNIPPET_CHARS = 200  # characters of text shown per search result
MAX_OUTPUT_CHARS = 2000  # characters of one tool output kept in the observation (the rest is cut)
MAX_TOOL_CALLS = 8  # tool calls per rollout
NUM_GENERATED = 1000  # train questions of the generated corpus
EVAL_SIZE = 128  # held-out questions (generated: a separate world; loaded: chosen by query_id hash)
MAX_HOPS = 4  # the longest generated chain (searches needed)
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


@dataclasses.dataclass(frozen=True)
class Document:
  """One document of a corpus.

  Attributes:
    docid: unique id (what `open` takes).
    title: a short title ("" when unknown).
    text: the full text.
  """

  docid: str
  title: str
  text: str


@dataclasses.dataclass(frozen=True)
class Hop:
  """One look-up of a generated chain.

  Attributes:
    query: a search query that returns the hop's document in the top `TOP_K` (the entity's name).
    docid: the document to read.
    reveals: what the document gives: the next hop's query, or the answer on the last hop.
    fact: the sentence of the document that states it.
  """

  query: str
  docid: str
  reveals: str
  fact: str


@dataclasses.dataclass(frozen=True)
class SearchTask:
  """One question.

  Attributes:
    query_id: unique id.
    query: the question (the user message).
    answer: the gold answer.
    aliases: other accepted answers.
    evidence_docids: the documents that together answer the question (may be empty for loaded data).
    chain: the gold search chain of a generated question (empty for loaded data).
    split: "train" or "eval" for generated questions (their worlds are disjoint); "" for loaded data, which
      `make_tasks` splits by a hash of `query_id`.
  """

  query_id: str
  query: str
  answer: str
  aliases: tuple[str, ...] = ()
  evidence_docids: tuple[str, ...] = ()
  chain: tuple[Hop, ...] = ()
  split: str = ""


# --- answers ---------------------------------------------------------------------------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(text: str) -> str:
  """SQuAD's answer normalisation: lowercase, punctuation removed, articles (a, an, the) removed, whitespace collapsed.

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


# --- index -----------------------------------------------------------------------------------------------------


class SearchIndex:
  """A BM25 index over a corpus (`bm25s`), read-only once built: safe to share between rollouts.

  Each document is indexed as its title followed by its text.
  """

  def __init__(self, docs: Sequence[Document], *, stemmer: str = ""):
    """Args:
      docs: the corpus; docids must be unique and non-empty.
      stemmer: "" for none, or a PyStemmer language such as "english" (needs the `PyStemmer` package).

    Raises:
      ValueError: an empty corpus, an empty or repeated docid, or a stemmer that cannot be loaded.
    """
    import bm25s  # lazy: imports jax and scipy

    if not docs:
      raise ValueError("the corpus has no documents")
    self.docs: tuple[Document, ...] = tuple(docs)
    self._by_id: dict[str, int] = {}
    for i, d in enumerate(self.docs):
      if not d.docid:
        raise ValueError(f"document {i} has an empty docid")
      if d.docid in self._by_id:
        raise ValueError(f"docid {d.docid!r} occurs twice in the corpus (documents {self._by_id[d.docid]} and {i})")
      self._by_id[d.docid] = i
    self._stemmer = _load_stemmer(stemmer)
    self._bm25s = bm25s
    tokens = bm25s.tokenize(
      [f"{d.title}\n{d.text}" for d in self.docs], stopwords="en", stemmer=self._stemmer, show_progress=False
    )
    self._retriever = bm25s.BM25()
    self._retriever.index(tokens, show_progress=False)
    self._vocab = self._retriever.vocab_dict

  def __len__(self) -> int:
    return len(self.docs)

  def get(self, docid: str) -> Document | None:
    """The document with this docid, or None."""
    i = self._by_id.get(docid)
    return None if i is None else self.docs[i]

  def query_terms(self, query: str) -> list[str]:
    """The query's tokens that occur in the corpus (after stopwords and stemming)."""
    toks = self._bm25s.tokenize([query], stopwords="en", stemmer=self._stemmer, return_ids=False, show_progress=False)[
      0
    ]
    return [t for t in toks if t and t in self._vocab]

  def search(self, query: str, k: int = TOP_K) -> list[tuple[Document, float]]:
    """The top `k` documents by BM25 score, best first, leaving out those with score 0 (no query term in common).

    Args:
      query: free text.
      k: how many (>= 1).
    """
    if k < 1:
      raise ValueError(f"k must be >= 1, got {k}")
    terms = self.query_terms(query)
    if not terms:
      return []
    ids, scores = self._retriever.retrieve([terms], k=min(k, len(self.docs)), show_progress=False)
    return [(self.docs[int(i)], float(s)) for i, s in zip(ids[0], scores[0]) if s > 0]


def _load_stemmer(name: str):
  if not name:
    return None
  try:
    import Stemmer  # PyStemmer
  except ImportError:
    raise ValueError(f"stemmer {name!r} needs the PyStemmer package (pip install PyStemmer); use '' for none") from None
  try:
    return Stemmer.Stemmer(name)
  except KeyError:
    raise ValueError(f"stemmer {name!r} is not a PyStemmer language; known: {Stemmer.algorithms()}") from None


# --- the environment -------------------------------------------------------------------------------------------

StepResult = spec.StepResult  # the observation is a tool message's content; None when done


def snippet(text: str, n: int) -> str:
  """The first `n` characters of `text` with whitespace collapsed, "..." appended when cut."""
  flat = " ".join(text.split())
  return flat if len(flat) <= n else flat[:n].rstrip() + "..."


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


class SearchEnv:
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
    self.task = task
    self.index = index
    self.max_tool_calls = int(max_tool_calls)
    self.top_k = int(top_k)
    self.snippet_chars = int(snippet_chars)
    self.max_output_chars = int(max_output_chars)
    self.done = False
    self.info: dict[str, Any] = {
      "tool_calls": 0,
      "tool_errors": 0,
      "answered": False,
      "budget_exhausted": False,
      "turns": 0,
      "finish": None,
      "answer": None,
      "searches": 0,
      "opens": 0,
    }
    self.seen_docids: set[str] = set()  # docids shown in search results or opened
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
    """Consumes one assistant message.

    Args:
      assistant_text: the assistant turn as the model wrote it (`multiturn.action_text`: special tokens kept, the
        stop token that ended the turn left out).

    Returns:
      A `StepResult`; its observation goes into `{"role": "tool", "content": observation}`.

    Raises:
      RuntimeError: if the episode is already done.
    """
    if self.done:
      raise RuntimeError("step() called on a finished episode")
    info = self.info
    info["turns"] += 1
    parsed = tool_calls.parse_message(assistant_text)
    if parsed.error is not None:
      info["tool_errors"] += 1
      return StepResult(
        observation=tool_calls.render_tool_response(f"error: {parsed.error}"), done=False, info=dict(info)
      )
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
      obs = "\n".join(tool_calls.render_tool_response(c) for c in contents)
      return StepResult(observation=obs, done=False, info=dict(info))
    if parsed.answer is not None:
      info["answered"] = True
      info["answer"] = parsed.answer
      return self._finish("answer")
    return self._finish("no_answer")

  def _finish(self, reason: str) -> StepResult:
    self.done = True
    self.info["finish"] = reason
    return StepResult(observation=None, done=True, info=dict(self.info))

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
  *,
  max_tool_calls: int = MAX_TOOL_CALLS,
  top_k: int = TOP_K,
  snippet_chars: int = SNIPPET_CHARS,
  max_output_chars: int = MAX_OUTPUT_CHARS,
  open_tool: bool = True,
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
    max_tool_calls, top_k, snippet_chars, max_output_chars, open_tool: the environment's limits (with
      open_tool=False a demonstration only searches: each hop's search result must show what the hop reveals).

  Returns:
    The messages [system, user, assistant, tool, ..., assistant].

  Raises:
    ValueError: when the evidence cannot be retrieved within the budget (a generated chain longer than
      `max_tool_calls`; a loaded question with no evidence listed or none found by its title or the question;
      without the open tool, a hop whose fact the search result does not show, or a loaded question).
  """
  env = SearchEnv(
    task,
    index,
    max_tool_calls=max_tool_calls,
    top_k=top_k,
    snippet_chars=snippet_chars,
    max_output_chars=max_output_chars,
    open_tool=open_tool,
  )
  messages = initial_messages(task, max_tool_calls, top_k, snippet_chars, max_output_chars, open_tool)

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
            f"{max_output_chars}) to hold the whole document"
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


# --- loading BrowseComp-Plus -----------------------------------------------------------------------------------

_CORPUS_FIELDS = {"docid": ("docid", "doc_id", "_id", "id"), "text": ("text", "contents", "content")}
_QUERY_FIELDS = {
  "query_id": ("query_id", "qid", "id"),
  "query": ("query", "question"),
  "answer": ("answer", "gold_answer", "answers"),
}
_BASE64 = re.compile(r"[A-Za-z0-9+/]+={0,2}")


def _records(path: str, what: str) -> Iterator[dict]:
  """The records of a JSONL file or of a `datasets.save_to_disk` folder (a Dataset, or a DatasetDict of one split)."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"{what} {path!r} does not exist (give a JSONL file or a datasets.save_to_disk folder)")
  if os.path.isdir(path):
    import datasets  # lazy: heavy

    ds = datasets.load_from_disk(path)
    if isinstance(ds, datasets.DatasetDict):
      if len(ds) != 1:
        raise ValueError(
          f"{what} {path!r} is a DatasetDict with splits {sorted(ds)}; save the one split to use "
          f"(e.g. ds[{sorted(ds)[0]!r}].save_to_disk(...))"
        )
      ds = next(iter(ds.values()))
    yield from ds
    return
  with open(path, encoding="utf-8") as f:
    for n, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        obj = json.loads(line)
      except json.JSONDecodeError as e:
        raise ValueError(f"{what} {path!r} line {n} is not JSON ({e.msg})") from None
      if not isinstance(obj, dict):
        raise ValueError(f"{what} {path!r} line {n} is not a JSON object")
      yield obj


def _field(rec: Mapping[str, Any], names: Sequence[str], what: str, path: str, i: int, ours: str):
  for name in names:
    if name in rec and rec[name] is not None:
      return rec[name]
  raise ValueError(
    f"{what} {path!r} record {i} has no {ours!r} field (accepted names: {', '.join(names)}; "
    f"its fields: {', '.join(sorted(map(str, rec))) or 'none'})"
  )


def derive_title(text: str, max_chars: int = 120) -> str:
  """A title read from a document's text: a "title:" line of a leading front-matter block (between "---" lines), else
  the first non-empty line without leading "#"s, cut to `max_chars`."""
  lines = text.lstrip().splitlines()
  if lines and lines[0].strip() == "---":
    for line in lines[1:30]:
      if line.strip() == "---":
        break
      if line.lower().startswith("title:"):
        return snippet(line[6:].strip().strip("\"'"), max_chars)
  first = next((ln.strip().lstrip("#").strip() for ln in lines if ln.strip() and ln.strip() != "---"), "")
  return snippet(first, max_chars)


def load_corpus(path: str) -> list[Document]:
  """Reads a corpus: a JSONL file or a `datasets.save_to_disk` folder of records with a docid ("docid", "doc_id",
  "_id" or "id") and a text ("text", "contents" or "content"); "title" is optional (else `derive_title`). Docids are
  read as strings.

  Raises:
    FileNotFoundError: no such path.
    ValueError: a record without docid or text (the message names the field, the accepted names and the record).
  """
  docs = []
  for i, rec in enumerate(_records(path, "corpus")):
    docid = str(_field(rec, _CORPUS_FIELDS["docid"], "corpus", path, i, "docid")).strip()
    text = str(_field(rec, _CORPUS_FIELDS["text"], "corpus", path, i, "text"))
    title = rec.get("title")
    docs.append(Document(docid=docid, title=str(title).strip() if title else derive_title(text), text=text))
  return docs


def _docids(value: Any) -> list[str]:
  if value is None:
    return []
  if isinstance(value, (str, int)):
    return [str(value)]
  out = []
  for v in value:
    if isinstance(v, Mapping):
      if v.get("docid") is not None:
        out.append(str(v["docid"]))
    elif v is not None:
      out.append(str(v))
  return out


def _looks_encrypted(text: str) -> bool:
  return len(text) >= 16 and not any(c.isspace() for c in text) and bool(_BASE64.fullmatch(text))


def load_queries(path: str) -> list[SearchTask]:
  """Reads questions: a JSONL file or a `datasets.save_to_disk` folder of records with "query_id" (or "qid", "id"),
  "query" (or "question") and "answer" (or "gold_answer", "answers": a list's first item is the answer, the rest
  aliases). Optional: "aliases"; evidence from "evidence_docids", "evidence_docs" and "gold_docs" (lists of docids or
  of {"docid", ...}), merged in that order.

  BrowseComp-Plus queries must be decrypted first (see the module notes).

  Raises:
    FileNotFoundError: no such path.
    ValueError: a missing field (named), an empty question or answer, a repeated query_id, or an encrypted query.
  """
  tasks, seen = [], set()
  for i, rec in enumerate(_records(path, "queries")):
    qid = str(_field(rec, _QUERY_FIELDS["query_id"], "queries", path, i, "query_id")).strip()
    query = str(_field(rec, _QUERY_FIELDS["query"], "queries", path, i, "query")).strip()
    answer = _field(rec, _QUERY_FIELDS["answer"], "queries", path, i, "answer")
    aliases = [str(a) for a in (rec.get("aliases") or rec.get("answer_aliases") or [])]
    if isinstance(answer, (list, tuple)):
      aliases = [str(a) for a in answer[1:]] + aliases
      answer = answer[0] if answer else ""
    answer = str(answer).strip()
    if _looks_encrypted(query):
      raise ValueError(
        f"queries {path!r} record {i} (query_id {qid}) looks encrypted ({query[:24]!r}...): "
        "BrowseComp-Plus queries are obfuscated on the Hub; decrypt them with the BrowseComp-Plus "
        "repository's scripts_build_index/decrypt_dataset.py and pass the decrypted JSONL"
      )
    if not query or not answer:
      empty = "query" if not query else "answer"
      raise ValueError(f"queries {path!r} record {i} (query_id {qid}) has an empty {empty}")
    if qid in seen:
      raise ValueError(f"queries {path!r}: query_id {qid!r} occurs twice")
    seen.add(qid)
    evidence: list[str] = []
    for key in ("evidence_docids", "evidence_docs", "gold_docs"):
      evidence += [d for d in _docids(rec.get(key)) if d not in evidence]
    tasks.append(
      SearchTask(query_id=qid, query=query, answer=answer, aliases=tuple(aliases), evidence_docids=tuple(evidence))
    )
  if not tasks:
    raise ValueError(f"queries {path!r} has no records")
  return tasks


# --- the generated fictional corpus ----------------------------------------------------------------------------

_ONSETS = (
  "b",
  "br",
  "d",
  "dr",
  "f",
  "g",
  "gr",
  "h",
  "k",
  "kr",
  "l",
  "m",
  "n",
  "p",
  "r",
  "s",
  "sk",
  "st",
  "t",
  "th",
  "tr",
  "v",
  "w",
  "z",
)
_VOWELS = ("a", "e", "i", "o", "u", "ae", "ei", "ia", "ou")
_CODAS = ("", "", "", "l", "n", "r", "s", "th", "rn", "nd", "sk", "m", "x", "rd", "lt")
_WORK_KINDS = (
  "Bridge",
  "Lighthouse",
  "Observatory",
  "Canal",
  "Tower",
  "Viaduct",
  "Dam",
  "Clocktower",
  "Library",
  "Aqueduct",
  "Theatre",
  "Mill",
)
_COMPANY_KINDS = (
  "Holdings",
  "Works",
  "Foundry",
  "Industries",
  "Shipping",
  "Instruments",
  "Mills",
  "Brothers",
  "Company",
  "Ironworks",
  "Textiles",
  "Glassworks",
)
_SCHOOL_KINDS = ("Academy", "College", "Institute", "Conservatory", "Seminary")
_SCHOOL_FIELDS = (
  "Surveying",
  "Navigation",
  "Botany",
  "Music",
  "Engineering",
  "Medicine",
  "Law",
  "Astronomy",
  "Mining",
  "Drawing",
)
_PROFESSIONS = (
  "cartographer",
  "glassblower",
  "surveyor",
  "engineer",
  "botanist",
  "clockmaker",
  "shipwright",
  "stonemason",
  "astronomer",
  "printer",
  "architect",
  "composer",
)
_INDUSTRIES = (
  "glassware",
  "rope",
  "clocks",
  "ship engines",
  "lamps",
  "paper",
  "telescopes",
  "copper wire",
  "railway carriages",
  "bells",
  "pianos",
  "barometers",
)
_MATERIALS = ("stone", "brick", "granite", "timber", "iron", "limestone", "sandstone", "slate")
_ADJECTIVES = ("narrow", "painted", "crooked", "vaulted", "weathered", "copper", "gilded", "quiet", "tall", "plain")
_FEATURES = ("arches", "windows", "stairways", "gates", "clock faces", "balconies", "galleries", "courtyards")
_TOWN_KINDS = ("market town", "harbour town", "hill town", "river town", "mining town", "cathedral city")
_WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday")
_TOPICS = ("tides", "mosses", "comets", "river levels", "bird calls", "old maps", "weather", "folk songs")
_MONTHS = (
  "January",
  "February",
  "March",
  "April",
  "May",
  "June",
  "July",
  "August",
  "September",
  "October",
  "November",
  "December",
)

_RELATIONS = {  # kind -> relation -> target kind (every relation is a function: one target)
  "work": {"builder": "company", "location": "city", "designer": "person"},
  "company": {"founder": "person", "hq": "city"},
  "person": {"birthplace": "city", "school": "school"},
  "city": {"mayor": "person"},
  "school": {"city": "city", "founder": "person"},
}
_ATTRIBUTES = {
  "work": ("completed",),
  "company": ("founded", "industry"),
  "person": ("birth_date", "profession"),
  "city": ("river", "founded"),
  "school": ("founded",),
}
_FACT = {  # the sentence in the subject's document; {s} subject, {o} object, {v} attribute value
  ("work", "builder"): "{S} was built by {o}.",
  ("work", "location"): "{S} stands in {o}.",
  ("work", "designer"): "{S} was designed by {o}.",
  ("work", "completed"): "Construction of {s} was completed in {v}.",
  ("company", "founder"): "{S} was founded by {o}.",
  ("company", "hq"): "{S} has its headquarters in {o}.",
  ("company", "founded"): "{S} was established in {v}.",
  ("company", "industry"): "{S} produces {v}.",
  ("person", "birthplace"): "{S} was born in {o}.",
  ("person", "school"): "{S} studied at {o}.",
  ("person", "birth_date"): "{S} was born on {v}.",
  ("person", "profession"): "{S} worked as a {v}.",
  ("city", "mayor"): "The first mayor of {s} was {o}.",
  ("city", "river"): "{S} lies on the river {v}.",
  ("city", "founded"): "{S} was founded in {v}.",
  ("school", "city"): "{S} is located in {o}.",
  ("school", "founder"): "{S} was founded by {o}.",
  ("school", "founded"): "{S} opened its doors in {v}.",
}
_MENTION = {  # the sentence in the object's document
  ("work", "builder"): "{O} built {s}.",
  ("work", "location"): "{O} is home to {s}.",
  ("work", "designer"): "{O} designed {s}.",
  ("company", "founder"): "{O} founded {s}.",
  ("company", "hq"): "{O} hosts the headquarters of {s}.",
  ("person", "birthplace"): "{O} is where {s} was born.",
  ("person", "school"): "Among the students of {o} was {s}.",
  ("city", "mayor"): "{O} served as a mayor of {s}.",
  ("school", "city"): "{O} is home to {s}.",
  ("school", "founder"): "{O} founded {s}.",
}
_NP = {  # the question's noun phrase for following a relation from {x}
  ("work", "builder"): "the company that built {x}",
  ("work", "location"): "the town where {x} stands",
  ("work", "designer"): "the person who designed {x}",
  ("company", "founder"): "the founder of {x}",
  ("company", "hq"): "the town where {x} has its headquarters",
  ("person", "birthplace"): "the birthplace of {x}",
  ("person", "school"): "the school where {x} studied",
  ("city", "mayor"): "the first mayor of {x}",
  ("school", "city"): "the town where {x} is located",
  ("school", "founder"): "the founder of {x}",
}
_ATTR_QUESTION = {
  ("work", "completed"): "In what year was {x} completed?",
  ("company", "founded"): "In what year was {x} founded?",
  ("company", "industry"): "What does {x} produce?",
  ("person", "birth_date"): "On what date was {x} born?",
  ("person", "profession"): "What did {x} work as?",
  ("city", "river"): "Which river flows through {x}?",
  ("city", "founded"): "In what year was {x} founded?",
  ("school", "founded"): "In what year did {x} open?",
}
_FILLERS = {
  "work": (
    "{S} is known for its {adj} {feature}.",
    "{S} was restored in {year}.",
    "Visitors to {s} often remark on its {adj} {feature}.",
  ),
  "company": (
    "{S} employed about {n} workers at its peak.",
    "{S} kept its ledgers in {adj} bound volumes.",
    "{S} opened a second workshop in {year}.",
  ),
  "person": (
    "{S} kept a notebook on {topic}.",
    "{S} travelled to the coast in {year}.",
    "About {n} letters by {s} survive.",
  ),
  "city": (
    "{S} holds a market every {weekday}.",
    "{S} has about {n} inhabitants.",
    "Many houses in {s} have {adj} {feature}.",
  ),
  "school": (
    "{S} enrols about {n} students.",
    "The library of {s} holds {n} volumes.",
    "{S} moved into a {material} building in {year}.",
  ),
}
_TEMPLATE_WORDS = frozenset(
  w.lower()
  for t in (*_FACT.values(), *_MENTION.values(), *_NP.values(), *_ATTR_QUESTION.values(), *sum(_FILLERS.values(), ()))
  for w in re.findall(r"[A-Za-z]+", t)
)


@dataclasses.dataclass
class _Entity:
  kind: str
  name: str  # as searched and answered, e.g. "Veltrana Bridge"
  world: int
  rel: dict[str, "_Entity"] = dataclasses.field(default_factory=dict)
  attr: dict[str, str] = dataclasses.field(default_factory=dict)
  alias: str = ""
  sibling_of: "_Entity | None" = None
  docid: str = ""
  text: str = ""
  facts: dict[str, str] = dataclasses.field(default_factory=dict)

  @property
  def display(self) -> str:
    return ("the " if self.kind in ("work", "school") else "") + self.name


class _Names:
  """Invented words, each used once across the whole corpus (so each name's words find its own documents)."""

  def __init__(self, rng: random.Random):
    self.rng = rng
    self.used: set[str] = set()

  def word(self) -> str:
    from bm25s.tokenization import STOPWORDS_EN

    for _ in range(10_000):
      w = "".join(
        self.rng.choice(_ONSETS) + self.rng.choice(_VOWELS) + self.rng.choice(_CODAS)
        for _ in range(self.rng.choice((2, 2, 3)))
      )
      if 4 <= len(w) <= 10 and w not in self.used and w not in STOPWORDS_EN and w not in _TEMPLATE_WORDS:
        self.used.add(w)
        return w.capitalize()
    raise RuntimeError("ran out of invented names")

  def variant(self, word: str) -> str:
    """A one-letter variant of `word` (a distractor town name), itself unused."""
    low = word.lower()
    for _ in range(1000):
      i = self.rng.randrange(1, len(low))
      w = low[:i] + self.rng.choice("aeioulnrst") + low[i + 1 :]
      if w != low and w not in self.used:
        self.used.add(w)
        return w.capitalize()
    return self.word()


def _new_entity(
  kind: str, world: int, names: _Names, rng: random.Random, first_names: Sequence[str], like: _Entity | None = None
) -> _Entity:
  """A new entity; with `like`, a distractor: a similar name (same stem, other kind word; same surname; a one-letter
  variant of a town)."""
  stem = like.name.split()[0] if like is not None and kind != "person" else names.word()
  if kind == "person":
    last = like.name.split()[-1] if like is not None else names.word()
    first = rng.choice([f for f in first_names if like is None or f != like.name.split()[0]])
    return _Entity(kind, f"{first} {last}", world, sibling_of=like)
  if kind == "city":
    return _Entity(kind, names.variant(like.name) if like is not None else stem, world, sibling_of=like)
  if kind == "work":
    kinds = [k for k in _WORK_KINDS if like is None or not like.name.endswith(k)]
    return _Entity(kind, f"{stem} {rng.choice(kinds)}", world, sibling_of=like)
  if kind == "company":
    kinds = [k for k in _COMPANY_KINDS if like is None or not like.name.endswith(k)]
    return _Entity(kind, f"{stem} {rng.choice(kinds)}", world, sibling_of=like)
  kinds = [k for k in _SCHOOL_KINDS if like is None or f" {k} " not in like.name]
  school_kind = rng.choice(kinds)
  return _Entity(
    kind, f"{stem} {school_kind} of {rng.choice(_SCHOOL_FIELDS)}", world, alias=f"{stem} {school_kind}", sibling_of=like
  )


def _world_sizes(num_questions: int) -> dict[str, int]:
  n = num_questions
  return {
    "work": max(8, n // 4),
    "company": max(6, n // 6),
    "person": max(12, n // 3),
    "city": max(6, n // 10),
    "school": max(4, n // 15),
  }


def _make_world(
  world: int, num_questions: int, names: _Names, rng: random.Random, first_names: Sequence[str], distractor_rate: float
) -> list[_Entity]:
  by_kind: dict[str, list[_Entity]] = {}
  for kind, count in _world_sizes(num_questions).items():
    ents = [_new_entity(kind, world, names, rng, first_names) for _ in range(count)]
    ents += [
      _new_entity(kind, world, names, rng, first_names, like=e) for e in list(ents) if rng.random() < distractor_rate
    ]
    by_kind[kind] = ents
  for kind, ents in by_kind.items():
    for e in ents:
      for rel, target_kind in _RELATIONS[kind].items():
        e.rel[rel] = rng.choice([t for t in by_kind[target_kind] if t is not e])
      e.attr = _attributes(kind, names, rng)
  for ents in by_kind.values():  # distractors share some facts with the entity they resemble, and nearly others
    for e in ents:
      if e.sibling_of is not None:
        rel = rng.choice(sorted(_RELATIONS[e.kind]))
        if e.sibling_of.rel[rel] is not e:
          e.rel[rel] = e.sibling_of.rel[rel]
        for key, value in e.sibling_of.attr.items():
          if key in ("completed", "founded"):
            e.attr[key] = str(int(value) + rng.choice((-3, -2, -1, 1, 2, 3)))
  return [e for ents in by_kind.values() for e in ents]


def _attributes(kind: str, names: _Names, rng: random.Random) -> dict[str, str]:
  if kind == "work":
    return {"completed": str(rng.randint(1780, 1960))}
  if kind == "company":
    return {"founded": str(rng.randint(1750, 1950)), "industry": rng.choice(_INDUSTRIES)}
  if kind == "person":
    month = rng.randrange(12)
    return {
      "birth_date": f"{rng.randint(1, 28)} {_MONTHS[month]} {rng.randint(1740, 1940)}",
      "profession": rng.choice(_PROFESSIONS),
    }
  if kind == "city":
    return {"river": names.word(), "founded": str(rng.randint(900, 1700))}
  return {"founded": str(rng.randint(1700, 1950))}


def _answer_aliases(kind: str, key: str, value: str) -> tuple[str, ...]:
  if key == "birth_date":
    day, month, year = value.split()
    return (f"{month} {day}, {year}", f"{year}-{_MONTHS.index(month) + 1:02d}-{int(day):02d}")
  if key == "river":
    return (f"River {value}", f"{value} River")
  return ()


def _cap(s: str) -> str:
  return s[:1].upper() + s[1:]


_A_BEFORE_VOWEL = re.compile(r"\b([Aa]) (?=[aeiouAEIOU])")


def _an(sentence: str) -> str:
  """Writes the article "a" as "an" before a vowel ("worked as an engineer")."""
  return _A_BEFORE_VOWEL.sub(lambda m: m.group(1) + "n ", sentence)


def _write_document(e: _Entity, mentions: list[tuple[_Entity, str]], rng: random.Random) -> None:
  """Sets `e.text` (an intro sentence, then its facts, up to two mentions by others and fillers, shuffled) and
  `e.facts` (relation or attribute -> its sentence)."""
  fill = {"S": _cap(e.display), "s": e.display}
  for rel, target in e.rel.items():
    e.facts[rel] = _an(_FACT[(e.kind, rel)].format(o=target.display, **fill))
  for key, value in e.attr.items():
    e.facts[key] = _an(_FACT[(e.kind, key)].format(v=value, **fill))
  intro = {
    "work": f"{_cap(e.display)} is a {rng.choice(_MATERIALS)} {e.name.split()[-1].lower()}.",
    "company": f"{e.name} is a trading company.",
    "person": f"{e.name} appears in the parish records.",
    "city": f"{e.name} is a {rng.choice(_TOWN_KINDS)}.",
    "school": f"{_cap(e.display)} is a school.",
  }[e.kind]
  body = list(e.facts.values())
  rng.shuffle(mentions)
  body += [_MENTION[(src.kind, rel)].format(O=_cap(e.display), o=e.display, s=src.display) for src, rel in mentions[:2]]
  for template in rng.sample(_FILLERS[e.kind], 2):
    body.append(
      template.format(
        adj=rng.choice(_ADJECTIVES),
        feature=rng.choice(_FEATURES),
        year=rng.randint(1800, 1990),
        n=rng.randint(12, 900) * 10,
        topic=rng.choice(_TOPICS),
        weekday=rng.choice(_WEEKDAYS),
        material=rng.choice(_MATERIALS),
        **fill,
      )
    )
  rng.shuffle(body)
  e.text = " ".join(_an(x) for x in [intro] + body)


def _sample_question(ents: list[_Entity], hops: int, rng: random.Random) -> tuple | None:
  """A random chain of `hops` documents: (entities read, relations followed, final relation or attribute)."""
  path = [rng.choice(ents)]
  rels: list[str] = []
  while len(path) < hops:
    options = [r for r in sorted(path[-1].rel) if path[-1].rel[r] not in path]
    if not options:
      return None
    rel = rng.choice(options)
    rels.append(rel)
    path.append(path[-1].rel[rel])
  last = path[-1]
  finals = [r for r in sorted(last.rel) if last.rel[r] not in path] + list(_ATTRIBUTES[last.kind])
  return path, rels, rng.choice(finals)


def make_fictional_corpus(
  seed: int,
  num_questions: int,
  *,
  num_eval: int = 0,
  min_hops: int = 1,
  max_hops: int = MAX_HOPS,
  distractor_rate: float = 0.3,
) -> tuple[list[Document], list[SearchTask]]:
  """A corpus of invented facts and multi-hop questions over it; the same arguments give the same result.

  The world has people, companies, towns, schools and built works (bridges, mills, ...), each with one document that
  states its relations (builder, founder, birthplace, ...) and attributes (years, dates, rivers, ...), mentions by a
  couple of others, and filler sentences. About `distractor_rate` of the entities have a look-alike (same stem with
  another kind word, same surname, a one-letter different town) whose facts partly coincide (shared relations, years
  a few apart). A question of h hops names one entity and follows h - 1 relations, e.g. "What is the birthplace of the
  founder of the company that built the Veltrana Bridge?" (3 hops): each hop is read from one document found by
  searching the current entity's name (its `Hop`), and the answer is in the last one. Hop counts cycle through
  min_hops..max_hops. The `num_eval` questions marked split="eval" come from a second, disjoint world in the same
  corpus, so no fact of an eval chain is learnt on the train questions.

  Args:
    seed: the generator's seed.
    num_questions: questions in all (train + eval).
    num_eval: how many of them are held out (split "eval"); the rest are split "train".
    min_hops, max_hops: the range of searches a question needs (1 <= min_hops <= max_hops <= 4).
    distractor_rate: the fraction of entities given a look-alike (0 to 1).

  Returns:
    (documents, tasks): eval tasks first; query_ids "fic-eval-N" and "fic-train-N"; docids "fNNNNN" in a shuffled
    order.

  Raises:
    ValueError: for arguments out of range.
  """
  if not 1 <= min_hops <= max_hops <= 4:
    raise ValueError(f"need 1 <= min_hops <= max_hops <= 4, got {min_hops}, {max_hops}")
  if not 0 <= num_eval <= num_questions or num_questions < 1:
    raise ValueError(f"need 0 <= num_eval <= num_questions and num_questions >= 1, got {num_eval}, {num_questions}")
  if not 0.0 <= distractor_rate <= 1.0:
    raise ValueError(f"distractor_rate must be in [0, 1], got {distractor_rate}")
  rng = random.Random(f"jaxcredit-search-fictional/{seed}")
  names = _Names(rng)
  first_names = [names.word() for _ in range(40)]
  counts = [("eval", num_eval), ("train", num_questions - num_eval)]
  worlds = [_make_world(w, n, names, rng, first_names, distractor_rate) if n else [] for w, (_, n) in enumerate(counts)]
  everyone = [e for ents in worlds for e in ents]
  mentions: dict[int, list[tuple[_Entity, str]]] = {id(e): [] for e in everyone}
  for e in everyone:
    for rel, target in e.rel.items():
      mentions[id(target)].append((e, rel))
  order = list(range(len(everyone)))
  rng.shuffle(order)
  for num, i in enumerate(order):
    everyone[i].docid = f"f{num:05d}"
  for e in everyone:
    _write_document(e, mentions[id(e)], rng)
  tasks: list[SearchTask] = []
  hop_cycle = list(range(min_hops, max_hops + 1))
  for (split, n), ents in zip(counts, worlds):
    seen: set[str] = set()
    made = 0
    for _ in range(200 * n + 1000):
      if made == n:
        break
      sample = _sample_question(ents, hop_cycle[made % len(hop_cycle)], rng)
      if sample is None:
        continue
      task = _question(f"fic-{split}-{made}", split, *sample)
      if task.query in seen:
        continue
      seen.add(task.query)
      tasks.append(task)
      made += 1
    if made < n:
      raise ValueError(f"only {made} distinct {split} questions found; asked for {n}")
  docs = sorted((Document(e.docid, e.name, e.text) for e in everyone), key=lambda d: d.docid)
  return docs, tasks


def _question(query_id: str, split: str, path: list[_Entity], rels: list[str], final: str) -> SearchTask:
  np = path[0].display
  for e, rel in zip(path, rels):
    np = _NP[(e.kind, rel)].format(x=np)
  last = path[-1]
  if final in last.rel:
    target = last.rel[final]
    query = ("Who is " if target.kind == "person" else "What is ") + _NP[(last.kind, final)].format(x=np) + "?"
    answer, aliases = target.name, ((target.alias,) if target.alias else ())
  else:
    query = _ATTR_QUESTION[(last.kind, final)].format(x=np)
    answer, aliases = last.attr[final], _answer_aliases(last.kind, final, last.attr[final])
  chain = []
  for i, e in enumerate(path):
    rel = rels[i] if i < len(rels) else final
    reveals = path[i + 1].name if i < len(rels) else answer
    chain.append(Hop(query=e.name, docid=e.docid, reveals=reveals, fact=e.facts[rel]))
  return SearchTask(
    query_id=query_id,
    query=_cap(query),
    answer=answer,
    aliases=aliases,
    evidence_docids=tuple(e.docid for e in path),
    chain=tuple(chain),
    split=split,
  )


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

  def metrics(envs: Sequence[SearchEnv]) -> dict[str, float]:
    if not envs:
      return {}
    found = [f for f in (e.evidence_found() for e in envs) if f is not None]
    out = {
      "searches": sum(e.info["searches"] for e in envs) / len(envs),
      "opens": sum(e.info["opens"] for e in envs) / len(envs),
    }
    if found:
      out["evidence_found"] = sum(found) / len(found)
    return out

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
