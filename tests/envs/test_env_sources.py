"""Task sources from files (JSONL, Hugging Face `datasets` folders, TFDS folders) as grain random-access sources."""

import json
import pickle
import sys

import grain
import numpy as np
import pytest

from jaxcredit.envs import sources as S

ROWS = [
  {
    "id": f"q{i}",
    "question": f"What is {i} + {i}?",
    "answer": str(2 * i),
    "solution": f"{i} + {i} = {2 * i}",
    "level": i % 3,
  }
  for i in range(7)
]
FIELDS = dict(prompt_field="question", answer_field="answer", info_field="solution", id_field="id")


def _write_jsonl(path, rows, blank_lines=False):
  with open(path, "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
      if blank_lines:
        f.write("\n   \n")
  return path


def _write_hf(path, rows, split="train", as_dict=True):
  datasets = pytest.importorskip("datasets")
  ds = datasets.Dataset.from_list(rows)
  (datasets.DatasetDict({split: ds, "other": ds.select(range(2))}) if as_dict else ds).save_to_disk(str(path))
  return path


def _view(records):
  return [(r.task_id, r.prompt, r.answer, r.privileged_info) for r in records]


EXPECTED = [(r["id"], r["question"], r["answer"], r["solution"]) for r in ROWS]


@pytest.fixture
def jsonl_src(tmp_path):
  return S.open_source(f"jsonl:{_write_jsonl(tmp_path / 'tasks.jsonl', ROWS, blank_lines=True)}", "train", **FIELDS)


@pytest.fixture
def hf_src(tmp_path):
  return S.open_source(f"hf:{_write_hf(tmp_path / 'hf', ROWS)}", "train", **FIELDS)


# --- the same records from each source ------------------------------------------------------------------------------


def test_jsonl_and_hf_give_the_same_records(tmp_path, jsonl_src, hf_src):
  plain = S.open_source(f"hf:{_write_hf(tmp_path / 'hf_plain', ROWS, as_dict=False)}", "train", **FIELDS)
  for src in (jsonl_src, hf_src, plain):
    assert len(src) == len(ROWS)
    assert _view(src) == EXPECTED, src
    assert _view([src[-1]]) == EXPECTED[-1:]
    assert src[np.int64(3)] == src[3]
    assert isinstance(src, grain.sources.RandomAccessDataSource)
    assert repr(src).startswith(type(src).__name__)
    assert _view(pickle.loads(pickle.dumps(src))) == EXPECTED  # grain worker processes get pickled sources
    with pytest.raises(IndexError):
      src[len(ROWS)]
  other = S.open_source(f"hf:{tmp_path / 'hf'}", "other", **FIELDS)
  assert _view(other) == EXPECTED[:2]


_TFDS_BUILDER = """
import json
import tensorflow_datasets as tfds

ROWS = json.loads({rows!r})


class TinyTasks(tfds.core.GeneratorBasedBuilder):
  VERSION = tfds.core.Version("1.0.0")

  def _info(self):
    text = {{k: tfds.features.Text() for k in ("id", "question", "answer", "solution")}}
    return self.dataset_info_from_configs(features=tfds.features.FeaturesDict(text), disable_shuffling=True)

  def _split_generators(self, dl_manager):
    return {{"train": self._generate_examples()}}

  def _generate_examples(self):
    for i, r in enumerate(ROWS):
      yield i, {{k: r[k] for k in ("id", "question", "answer", "solution")}}
"""


def test_tfds_gives_the_same_records(tmp_path, monkeypatch):
  """A TFDS folder in ArrayRecord files, prepared by a GeneratorBasedBuilder (TFDS writes and reads these without
  TensorFlow; its ad-hoc `store_as_tfds_dataset` needs TensorFlow, which the test install does not bring)."""
  tfds = pytest.importorskip("tensorflow_datasets")  # in the `test` extra; the `tfds` extra for users
  package = tmp_path / "tiny_tasks"
  package.mkdir()
  (package / "__init__.py").write_text("")
  (package / "tiny_tasks_dataset_builder.py").write_text(_TFDS_BUILDER.format(rows=json.dumps(ROWS)))
  monkeypatch.syspath_prepend(str(tmp_path))
  from tiny_tasks.tiny_tasks_dataset_builder import TinyTasks

  builder = TinyTasks(data_dir=str(tmp_path / "data"), file_format="array_record")
  builder.download_and_prepare()
  src = S.open_source(f"tfds:{builder.data_dir}", "train", **FIELDS)
  assert len(src) == len(ROWS)
  assert sorted(_view(src)) == sorted(EXPECTED)
  with pytest.raises(S.SourceError, match="no split 'test'"):
    S.open_source(f"tfds:{builder.data_dir}", "test", **FIELDS)


def test_record_fields_metadata_and_defaults(tmp_path):
  path = _write_jsonl(
    tmp_path / "t.jsonl",
    [{"prompt": "p0", "answer": 7, "x": [1, 2]}, {"prompt": "p1", "answer": 0.5, "x": None, "info": {"a": 1}}],
  )
  src = S.open_source(f"jsonl:{path}", "dev", metadata_fields=("x",))
  r0, r1 = src[0], src[1]
  assert (r0.task_id, r0.prompt, r0.answer, r0.privileged_info) == ("dev/0", "p0", "7", None)
  assert r0.metadata == {"source": f"jsonl:{path}", "split": "dev", "index": 0, "line": 1, "x": [1, 2]}
  assert r1.answer == "0.5" and r1.metadata["x"] is None
  with pytest.raises(S.SourceError, match=r"t.jsonl:1: no field 'info'"):  # a field asked for is required everywhere
    S.open_source(f"jsonl:{path}", info_field="info")
  path = _write_jsonl(tmp_path / "u.jsonl", [{"prompt": "p", "answer": "1", "info": {"calls": [1, 2]}}])
  assert S.open_source(f"jsonl:{path}", info_field="info")[0].privileged_info == '{"calls": [1, 2]}'


def test_jsonl_keeps_offsets_not_records(tmp_path):
  path = _write_jsonl(tmp_path / "t.jsonl", ROWS)
  src = S.open_source(f"jsonl:{path}", **FIELDS)
  assert src._offsets.dtype == np.int64 and src._offsets.shape == (len(ROWS),)
  text = path.read_text()
  path.write_text(text.replace("What is 3 + 3?", "WHAT IS 3 + 3?"))  # same length: offsets still hold
  assert src[3].prompt == "WHAT IS 3 + 3?"  # read from the file when indexed


# --- grain: a checkpointable position -------------------------------------------------------------------------------


def _ids(batch):
  return [r.task_id for r in list(batch)]


@pytest.mark.parametrize("kind", ["jsonl", "hf"])
def test_grain_iterator_state_resumes_at_the_same_position(kind, jsonl_src, hf_src):
  src = jsonl_src if kind == "jsonl" else hf_src
  ds = grain.MapDataset.source(src).shuffle(seed=0).batch(2)
  it = iter(ds)
  first = _ids(next(it))
  state = it.get_state()
  expected = [_ids(next(it)) for _ in range(2)]
  resumed = iter(grain.MapDataset.source(pickle.loads(pickle.dumps(src))).shuffle(seed=0).batch(2))
  resumed.set_state(state)
  assert [_ids(next(resumed)) for _ in range(2)] == expected
  assert first not in expected and len({i for b in [first, *expected] for i in b}) == 6  # a permutation
  # the trainer's pipeline: indices through shuffle/repeat/batch, as an IterDataset
  idx = grain.MapDataset.range(len(src)).shuffle(seed=3).repeat().batch(3, drop_remainder=True)
  it = iter(idx.to_iter_dataset())
  for _ in range(4):
    next(it)
  state = it.get_state()
  expected = [[src[int(i)].task_id for i in next(it)] for _ in range(3)]
  again = iter(idx.to_iter_dataset())
  again.set_state(state)
  assert [[src[int(i)].task_id for i in next(again)] for _ in range(3)] == expected


# --- errors ---------------------------------------------------------------------------------------------------------


def test_missing_file_or_folder(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.jsonl"):
    S.open_source(f"jsonl:{tmp_path / 'nope.jsonl'}")
  with pytest.raises(FileNotFoundError, match="no_folder"):
    S.open_source(f"hf:{tmp_path / 'no_folder'}")
  with pytest.raises(FileNotFoundError, match="no_tfds"):
    S.open_source(f"tfds:{tmp_path / 'no_tfds'}")


def test_missing_field_is_named_with_the_fields_present(tmp_path):
  path = _write_jsonl(tmp_path / "t.jsonl", ROWS)
  with pytest.raises(S.SourceError, match=r"t.jsonl:1: no field 'prompt' \(fields present: 'id', 'question'"):
    S.open_source(f"jsonl:{path}")
  with pytest.raises(S.SourceError, match=r"no field 'ref' \(fields present: 'id', 'question', 'answer'"):
    S.open_source(f"hf:{_write_hf(tmp_path / 'hf', ROWS)}", "train", prompt_field="question", info_field="ref")
  rows = ROWS[:3] + [{"question": "q", "solution": "s", "id": "z"}]
  with pytest.raises(S.SourceError, match=r"t2.jsonl:4: no field 'answer'"):
    S.open_source(f"jsonl:{_write_jsonl(tmp_path / 't2.jsonl', rows)}", **FIELDS)


def test_bad_lines_name_file_and_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text('{"prompt": "a", "answer": "1"}\n\n{"prompt": "b", answer: 2}\n')
  with pytest.raises(S.SourceError, match=r"bad.jsonl:3: not valid JSON"):
    S.open_source(f"jsonl:{path}")
  lazy = S.open_source(f"jsonl:{path}", validate=False)  # indexed, the bad line fails when read
  assert len(lazy) == 2 and lazy[0].prompt == "a"
  with pytest.raises(S.SourceError, match=r"bad.jsonl:3: not valid JSON"):
    lazy[1]
  path.write_text('{"prompt": "a", "answer": "1"}\n["not", "an", "object"]\n')
  with pytest.raises(S.SourceError, match=r"bad.jsonl:2: a record must be a JSON object, got list"):
    S.open_source(f"jsonl:{path}")
  path.write_text('{"prompt": "a", "answer": null}\n')
  with pytest.raises(S.SourceError, match=r"bad.jsonl:1: field 'answer' is null"):
    S.open_source(f"jsonl:{path}")


def test_empty_sources(tmp_path):
  (tmp_path / "empty.jsonl").write_text("")
  (tmp_path / "blank.jsonl").write_text("\n  \n\n")
  for name in ("empty.jsonl", "blank.jsonl"):
    with pytest.raises(S.SourceError, match="has no records"):
      S.open_source(f"jsonl:{tmp_path / name}")
  datasets = pytest.importorskip("datasets")
  datasets.Dataset.from_dict({"prompt": [], "answer": []}).save_to_disk(str(tmp_path / "hf_empty"))
  with pytest.raises(S.SourceError, match="has no records|no rows"):
    S.open_source(f"hf:{tmp_path / 'hf_empty'}")


def test_bad_specs_and_splits(tmp_path):
  with pytest.raises(ValueError, match="must start with one of jsonl:, hf:, tfds:"):
    S.open_source("csv:/data/x.csv")
  with pytest.raises(ValueError, match="must start with one of"):
    S.open_source("/data/x.jsonl")
  with pytest.raises(ValueError, match="has no path"):
    S.open_source("jsonl:")
  with pytest.raises(S.SourceError, match=r"no split 'test' \(splits: other, train\)"):
    S.open_source(f"hf:{_write_hf(tmp_path / 'hf', ROWS)}", "test", **FIELDS)


def test_tfds_is_an_optional_extra(tmp_path, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # `import tensorflow_datasets` now fails
  with pytest.raises(ImportError, match=r'pip install "jaxcredit\[tfds\]"'):
    S.open_source(f"tfds:{tmp_path}", "train")
