"""One way to write a file whole (`jaxcredit.atomic_files`) and one way to list a workdir's checkpoints
(`checkpoint.saved_steps`), used by every writer and reader that had its own."""

import json
import os

from jaxcredit.atomic_files import write_json_atomic, write_text_atomic
from jaxcredit.train.loop.checkpoint import saved_steps


def test_a_file_is_replaced_whole_and_no_temporary_is_left(tmp_path):
  path = str(tmp_path / "eval.json")
  write_text_atomic(path, "old")
  write_json_atomic(path, {"b": 1, "a": [1, 2]}, indent=2, sort_keys=True)
  text = open(path).read()
  assert json.loads(text) == {"a": [1, 2], "b": 1} and text.endswith("}\n") and text.index('"a"') < text.index('"b"')
  assert os.listdir(tmp_path) == ["eval.json"]


def test_saved_steps_lists_numbered_checkpoints_only_and_creates_nothing(tmp_path):
  assert saved_steps(str(tmp_path)) == [] and not (tmp_path / "checkpoints").exists()
  for name in ("10", "2", "0", "3.orbax-checkpoint-tmp-1", "notes"):
    (tmp_path / "checkpoints" / name).mkdir(parents=True)
  assert saved_steps(str(tmp_path)) == [0, 2, 10]
