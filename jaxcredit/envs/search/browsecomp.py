"""Loading a corpus and its questions: BrowseComp-Plus as users save it (a JSONL file or a `datasets.save_to_disk`
folder), or any corpus and questions in the same layout.

The corpus (`Tevatron/browsecomp-plus-corpus`) has "docid", "text" and "url" and no title: the title is read from the
text (`derive_title`). The queries (`Tevatron/browsecomp-plus`) are obfuscated on the Hub: every field but "query_id"
is XOR-encrypted and base64-encoded with the BrowseComp canary string. Only decrypted queries are accepted (the
BrowseComp-Plus repository's `scripts_build_index/decrypt_dataset.py` writes them as JSONL with "query_id", "query",
"answer", "evidence_docs" and "gold_docs", the last two lists of {"docid", ...}); a query that looks encrypted is
refused with that advice. BrowseComp-Plus grades with an LLM judge; the environment's reward is the stricter
normalised exact match.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Iterator, Mapping, Sequence

from jaxcredit.envs.search.data import Document, SearchTask, snippet

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
