"""BM25 retrieval over a corpus: `SearchIndex`.

Retrieval is `bm25s` with its own tokenizer (English stopwords; stemming through PyStemmer when `stemmer` names a
language). The index is built once per corpus and shared read-only by every rollout of an `EnvSpec`.
"""

from __future__ import annotations

from typing import Sequence

from jaxcredit.envs.search.data import Document

TOP_K = 5  # documents per search


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
