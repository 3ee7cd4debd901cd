"""The records of the search environment, shared by the index, the loader, the generator and the environment:
`Document` (one document of a corpus), `Hop` (one look-up of a generated chain), `SearchTask` (one question), and
`snippet` (the whitespace-collapsed text cut that search results and derived titles use).
"""

from __future__ import annotations

import dataclasses


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


def snippet(text: str, n: int) -> str:
  """The first `n` characters of `text` with whitespace collapsed, "..." appended when cut."""
  flat = " ".join(text.split())
  return flat if len(flat) <= n else flat[:n].rstrip() + "..."
