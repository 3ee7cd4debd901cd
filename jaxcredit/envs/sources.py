"""Task sources read from files: JSONL, Hugging Face `datasets` folders, TensorFlow Datasets folders.

Each source is a grain random-access data source (`grain.sources.RandomAccessDataSource`: `__len__`,
`__getitem__`, a stable `__repr__`, picklable) whose records are `TaskRecord`s, so a grain pipeline over a source
or over its indices (the trainer's `MapDataset.range(len(tasks)).shuffle(seed).repeat().batch(...)`) keeps a
checkpointable position: the iterator's state is its index, never the records it has read.

  * `JsonlSource`: one JSON object per line. Opening indexes the byte offset of every non-blank line (8 bytes per
    record, plus 8 for its line number); a record is parsed when it is read, never kept.
  * `HFSource`: a folder written by `datasets.Dataset.save_to_disk` or `DatasetDict.save_to_disk`, read with
    `datasets.load_from_disk` (memory-mapped Arrow files).
  * `TfdsSource`: a prepared TensorFlow Datasets folder (`tfds.builder_from_directory(path).as_data_source(split)`,
    ArrayRecord files). tensorflow-datasets is the optional extra `tfds` (`pip install "jaxcredit[tfds]"`), imported
    only when such a source is opened.

`open_source("jsonl:/data/train.jsonl", "train", prompt_field="question")` picks the class from the prefix. The
field names are configurable: `prompt_field` (the user message), `answer_field` (the gold answer), `info_field`
(privileged information such as a reference solution; optional), `id_field` (a task id; optional, else
"<split>/<index>"), `metadata_fields` (fields copied into `TaskRecord.metadata` as they are).

Errors are raised when the source is opened where possible: a missing file or folder (`FileNotFoundError`), a
missing field (naming it and listing the fields present), an empty source, a line that is not a JSON object (naming
the file and line number) are `SourceError`s (a `ValueError`).
"""

from __future__ import annotations

import dataclasses
import json
import operator
import os
from typing import Any, Iterator, Mapping, Sequence

import numpy as np

PREFIXES = ("jsonl:", "hf:", "tfds:")
TFDS_INSTALL_HINT = 'pip install "jaxcredit[tfds]"'


class SourceError(ValueError):
  """A source that cannot give tasks: empty, a missing field, a record that is not a JSON object, a bad value."""


@dataclasses.dataclass(frozen=True)
class TaskRecord:
  """One task read from a source.

  Attributes:
    task_id: the record's `id_field` value, or "<split>/<index>" when there is no id field.
    prompt: the user message (the `prompt_field` value, as text).
    answer: the gold answer (the `answer_field` value, as text: numbers are written with `str`).
    privileged_info: the `info_field` value (text; a list or object is written as JSON), or None without one.
    metadata: "source" (the source's spec, e.g. "jsonl:/data/train.jsonl"), "split", "index" (position in the
      source), "line" (JSONL only: 1-based line number), and each of `metadata_fields` with its value. Not compared.
  """

  task_id: str
  prompt: str
  answer: str
  privileged_info: str | None = None
  metadata: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, hash=False)


@dataclasses.dataclass(frozen=True)
class Fields:
  """Which fields of a record make a `TaskRecord` ("" or None: not read).

  Attributes:
    prompt_field: the user message; required in every record.
    answer_field: the gold answer; required in every record.
    info_field: privileged information (reference solution); when set, required in every record.
    id_field: the task id; when set, required in every record.
    metadata_fields: copied into `TaskRecord.metadata`; each, when set, required in every record.
  """

  prompt_field: str = "prompt"
  answer_field: str = "answer"
  info_field: str | None = None
  id_field: str | None = None
  metadata_fields: tuple[str, ...] = ()

  def __post_init__(self):
    for name in ("prompt_field", "answer_field"):
      if not getattr(self, name):
        raise ValueError(f"{name} must be a non-empty field name")
    object.__setattr__(self, "info_field", self.info_field or None)
    object.__setattr__(self, "id_field", self.id_field or None)
    object.__setattr__(self, "metadata_fields", tuple(f for f in self.metadata_fields if f))

  def required(self) -> tuple[str, ...]:
    """Every field a record must have, in order, without repeats."""
    names = [self.prompt_field, self.answer_field, self.info_field, self.id_field, *self.metadata_fields]
    return tuple(dict.fromkeys(n for n in names if n))


class _Source:
  """The shared part of the sources: index checks, field checks, record -> `TaskRecord`."""

  spec: str
  split: str
  fields: Fields

  def __len__(self) -> int:
    raise NotImplementedError

  def _raw(self, index: int) -> Mapping[str, Any]:
    raise NotImplementedError

  def _where(self, index: int) -> str:
    return f"{self.spec} (split {self.split!r}) record {index}"

  def _extra(self, index: int) -> dict[str, Any]:
    return {}

  def __getitem__(self, index) -> TaskRecord:
    """The record at `index` (an int or numpy integer; negative counts from the end).

    Raises:
      IndexError: outside [-len, len).
      SourceError: the record lacks a field or holds a value that is not text (see `TaskRecord`).
    """
    i = operator.index(index)
    n = len(self)
    if i < 0:
      i += n
    if not 0 <= i < n:
      raise IndexError(f"index {index} out of range for {self.spec} with {n} records")
    return self._record(self._raw(i), i, self._extra(i), self._where(i))

  def __iter__(self) -> Iterator[TaskRecord]:
    for i in range(len(self)):
      yield self[i]

  def __repr__(self) -> str:  # grain's DataLoader checkpoints name the source by its repr
    try:
      n = len(self)
    except AttributeError:  # not opened (an error while opening)
      n = None
    return f"{type(self).__name__}(spec={self.spec!r}, split={self.split!r}, records={n})"

  def _check_fields(self, present: Sequence[str], where: str) -> None:
    for name in self.fields.required():
      if name not in present:
        listed = ", ".join(repr(p) for p in present) or "none"
        raise SourceError(f"{where}: no field {name!r} (fields present: {listed})")

  def _record(self, raw: Mapping[str, Any], index: int, extra: Mapping[str, Any], where: str) -> TaskRecord:
    self._check_fields(list(raw.keys()), where)
    f = self.fields
    prompt = _text(raw[f.prompt_field], f.prompt_field, where)
    answer = _text(raw[f.answer_field], f.answer_field, where)
    info = _text(raw[f.info_field], f.info_field, where, structured=True) if f.info_field else None
    task_id = _text(raw[f.id_field], f.id_field, where) if f.id_field else f"{self.split}/{index}"
    meta: dict[str, Any] = {"source": self.spec, "split": self.split, "index": index, **extra}
    for name in f.metadata_fields:
      meta[name] = _plain(raw[name])
    return TaskRecord(task_id=task_id, prompt=prompt, answer=answer, privileged_info=info, metadata=meta)


def _plain(value: Any) -> Any:
  """A stored value as plain Python: bytes decoded as UTF-8, numpy scalars and arrays as Python values/lists."""
  if isinstance(value, (bytes, np.bytes_)):
    return bytes(value).decode("utf-8")
  if isinstance(value, np.ndarray):
    return _plain(value.item()) if value.ndim == 0 else [_plain(v) for v in value.tolist()]
  if isinstance(value, np.generic):
    return value.item()
  return value


def _text(value: Any, field: str, where: str, structured: bool = False) -> str:
  """A field's value as text: strings as they are, numbers through `str`; lists/objects as JSON when `structured`.

  Raises:
    SourceError: null, a boolean, bytes that are not UTF-8, or a list/object where `structured` is False.
  """
  try:
    value = _plain(value)
  except UnicodeDecodeError:
    raise SourceError(f"{where}: field {field!r} holds bytes that are not UTF-8 text") from None
  if isinstance(value, str):
    return value
  if value is None:
    raise SourceError(f"{where}: field {field!r} is null")
  if isinstance(value, bool):
    raise SourceError(f"{where}: field {field!r} is a boolean, expected text or a number")
  if isinstance(value, (int, float)):
    return str(value)
  if structured and isinstance(value, (list, dict)):
    return json.dumps(value, ensure_ascii=False)
  raise SourceError(f"{where}: field {field!r} is a {type(value).__name__}, expected text or a number")


class JsonlSource(_Source):
  """Tasks from a JSONL file (one JSON object per line; blank lines are skipped).

  Opening reads the file once to index the byte offset and line number of each record (two int64 arrays of shape
  [num_records]); with `validate` it also parses each line once (nothing is kept) so that a bad line or a missing
  field fails here rather than mid-training. Reading a record opens the file, seeks and parses one line, so the
  source is thread-safe and picklable (it holds no open file).
  """

  def __init__(
    self, path: str | os.PathLike, fields: Fields | None = None, *, split: str = "train", validate: bool = True
  ):
    """Args:
      path: the JSONL file.
      fields: which fields to read (`Fields()`: "prompt" and "answer").
      split: a label for task ids ("<split>/<index>") and metadata; a JSONL file has no splits.
      validate: parse every line when opening (else only the first; later lines are checked when read).

    Raises:
      FileNotFoundError: `path` is not a file.
      SourceError: the file has no records; with `validate`, a line that is not a JSON object or lacks a field
        (naming the file and line number).
    """
    self.path = os.fspath(path)
    self.spec = f"jsonl:{self.path}"
    self.split = split
    self.fields = fields or Fields()
    if not os.path.isfile(self.path):
      raise FileNotFoundError(f"JSONL source {self.path!r} is not a file")
    offsets, lines = [], []
    with open(self.path, "rb") as f:
      pos = 0
      for lineno, line in enumerate(f, start=1):
        if line.strip():
          offsets.append(pos)
          lines.append(lineno)
          if validate or len(offsets) == 1:
            self._record(self._parse(line, lineno), len(offsets) - 1, {}, f"{self.path}:{lineno}")
        pos += len(line)
    if not offsets:
      raise SourceError(f"JSONL source {self.path!r} has no records")
    self._offsets = np.asarray(offsets, np.int64)
    self._lines = np.asarray(lines, np.int64)

  def __len__(self) -> int:
    return len(self._offsets)

  def _where(self, index: int) -> str:
    return f"{self.path}:{int(self._lines[index])}"

  def _extra(self, index: int) -> dict[str, Any]:
    return {"line": int(self._lines[index])}

  def _parse(self, line: bytes, lineno: int) -> dict:
    try:
      obj = json.loads(line)
    except (ValueError, RecursionError) as e:
      msg = f"{e.msg} at column {e.colno}" if isinstance(e, json.JSONDecodeError) else type(e).__name__
      raise SourceError(f"{self.path}:{lineno}: not valid JSON ({msg})") from None
    if not isinstance(obj, dict):
      raise SourceError(f"{self.path}:{lineno}: a record must be a JSON object, got {type(obj).__name__}")
    return obj

  def _raw(self, index: int) -> Mapping[str, Any]:
    with open(self.path, "rb") as f:
      f.seek(int(self._offsets[index]))
      line = f.readline()
    return self._parse(line, int(self._lines[index]))


class HFSource(_Source):
  """Tasks from a Hugging Face `datasets` folder (`save_to_disk` output), memory-mapped.

  A `DatasetDict` folder is read at the `split` key; a single `Dataset` folder is read whole (`split` is then only
  a label). Only the needed columns are decoded.
  """

  def __init__(self, path: str | os.PathLike, split: str = "train", fields: Fields | None = None):
    """Args:
      path: the folder.
      split: the `DatasetDict` key to read (a label for a single `Dataset`).
      fields: which fields to read (`Fields()`: "prompt" and "answer").

    Raises:
      ImportError: the `datasets` package is not installed.
      FileNotFoundError: `path` is not a folder, or not one `save_to_disk` wrote.
      SourceError: `split` is not a key of the `DatasetDict` (the keys are listed), a missing column (the columns
        are listed), no rows, or `load_from_disk` failing otherwise.
    """
    self.path = os.fspath(path)
    self.spec = f"hf:{self.path}"
    self.split = split
    self.fields = fields or Fields()
    if not os.path.isdir(self.path):
      raise FileNotFoundError(f"Hugging Face datasets source {self.path!r} is not a folder")
    try:
      import datasets
    except ImportError as e:
      raise ImportError(f"reading {self.spec!r} needs the `datasets` package: pip install datasets") from e
    try:
      ds = datasets.load_from_disk(self.path)
    except FileNotFoundError as e:
      raise FileNotFoundError(f"{self.spec}: not a folder written by save_to_disk ({e})") from None
    except Exception as e:  # noqa: BLE001 - datasets fails on some folders (e.g. 0 rows) with IndexError
      raise SourceError(
        f"{self.spec}: datasets.load_from_disk failed ({type(e).__name__}: {e}); a saved dataset "
        f"with no rows cannot be loaded"
      ) from None
    if isinstance(ds, datasets.DatasetDict):
      if split not in ds:
        raise SourceError(f"{self.spec}: no split {split!r} (splits: {', '.join(sorted(ds))})")
      ds = ds[split]
    self._check_fields(list(ds.column_names), f"{self.spec} (split {split!r})")
    ds = ds.select_columns(list(self.fields.required()))
    if len(ds) == 0:
      raise SourceError(f"{self.spec} (split {split!r}) has no records")
    self._ds = ds

  def __len__(self) -> int:
    return len(self._ds)

  def _raw(self, index: int) -> Mapping[str, Any]:
    return self._ds[int(index)]


class TfdsSource(_Source):
  """Tasks from a prepared TensorFlow Datasets folder (`tfds.builder_from_directory(path).as_data_source(split)`).

  Text features come back as bytes and are decoded as UTF-8; numeric features as numpy scalars, read with `str`.
  """

  def __init__(self, path: str | os.PathLike, split: str = "train", fields: Fields | None = None):
    """Args:
      path: the prepared folder (the one holding dataset_info.json).
      split: the split to read, e.g. "train" or "test".
      fields: which fields to read (`Fields()`: "prompt" and "answer").

    Raises:
      ImportError: tensorflow-datasets is not installed (`pip install "jaxcredit[tfds]"`).
      FileNotFoundError: `path` is not a folder.
      SourceError: `split` is not one of the folder's splits (listed), a missing feature (listed), or no records.
    """
    self.path = os.fspath(path)
    self.spec = f"tfds:{self.path}"
    self.split = split
    self.fields = fields or Fields()
    if not os.path.isdir(self.path):
      raise FileNotFoundError(f"TensorFlow Datasets source {self.path!r} is not a folder")
    tfds = import_tfds()
    builder = tfds.builder_from_directory(self.path)
    splits = sorted(builder.info.splits.keys())
    if split not in splits:
      raise SourceError(f"{self.spec}: no split {split!r} (splits: {', '.join(splits)})")
    self._check_fields(list(builder.info.features.keys()), f"{self.spec} (split {split!r})")
    self._ds = builder.as_data_source(split=split)
    if len(self._ds) == 0:
      raise SourceError(f"{self.spec} (split {split!r}) has no records")

  def __len__(self) -> int:
    return len(self._ds)

  def _raw(self, index: int) -> Mapping[str, Any]:
    return self._ds[int(index)]


def import_tfds():
  """`import tensorflow_datasets`, or an ImportError naming the extra that installs it."""
  try:
    import tensorflow_datasets as tfds
  except ImportError as e:
    raise ImportError(f'"tfds:" sources need tensorflow-datasets, an optional extra: {TFDS_INSTALL_HINT}') from e
  return tfds


def open_source(
  spec: str,
  split: str = "train",
  *,
  prompt_field: str = "prompt",
  answer_field: str = "answer",
  info_field: str | None = None,
  id_field: str | None = None,
  metadata_fields: Sequence[str] = (),
  validate: bool = True,
) -> JsonlSource | HFSource | TfdsSource:
  """Opens a source from its spec.

  Args:
    spec: "jsonl:/path/file.jsonl", "hf:/path/folder" or "tfds:/path/folder".
    split: the split to read (a `DatasetDict` key or TFDS split; a label for JSONL and single-`Dataset` folders).
    prompt_field, answer_field, info_field, id_field, metadata_fields: see `Fields` ("" or None: not read).
    validate: JSONL only: parse every line when opening (see `JsonlSource`).

  Returns:
    The source: `len(src)` records, `src[i]` a `TaskRecord`.

  Raises:
    ValueError: `spec` has none of the prefixes `PREFIXES`, or an empty path.
    FileNotFoundError, SourceError, ImportError: see the source classes.
  """
  fields = Fields(
    prompt_field=prompt_field,
    answer_field=answer_field,
    info_field=info_field,
    id_field=id_field,
    metadata_fields=tuple(metadata_fields),
  )
  kind, sep, path = spec.partition(":")
  if not sep or f"{kind}:" not in PREFIXES:
    raise ValueError(f"source {spec!r} must start with one of {', '.join(PREFIXES)} (e.g. 'jsonl:/data/train.jsonl')")
  if not path:
    raise ValueError(f"source {spec!r} has no path after {kind + ':'!r}")
  path = os.path.expanduser(path)
  if kind == "jsonl":
    return JsonlSource(path, fields, split=split, validate=validate)
  if kind == "hf":
    return HFSource(path, split, fields)
  return TfdsSource(path, split, fields)
