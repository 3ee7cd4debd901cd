"""A resumed training run checks what its tokenizer holds (issue 54: results know what produced them): the workdir's
identity.json, written with config.json, names the tokenizer's content, and a resume whose tokenizer differs is
refused before any work."""

import json

import pytest

from jaxcredit.train.loop import checkpoint as ckpt_lib
from jaxcredit.train.commands import trainer
from tests.fixtures.tiny_run import tiny_run_config


def test_identity_is_written_then_checked(tmp_path):
  ckpt_lib.check_or_write_identity(str(tmp_path), {"tokenizer": "a" * 64}, write=False)
  assert not (tmp_path / "identity.json").exists()  # a check alone writes nothing
  ckpt_lib.check_or_write_identity(str(tmp_path), {"tokenizer": "a" * 64})
  ckpt_lib.check_or_write_identity(str(tmp_path), {"tokenizer": "a" * 64}, write=False)
  with pytest.raises(
    ValueError, match=r"another tokenizer behind the same config \(tokenizer aaaaaaaaaaaa\.\.\. now b"
  ):
    ckpt_lib.check_or_write_identity(str(tmp_path), {"tokenizer": "b" * 64}, write=False)


def test_a_resume_with_another_tokenizer_is_refused(tmp_path, tiny):
  c = tiny_run_config("quickstart", tmp_path / "w", tiny, total_steps=1, sft__steps=0, credit__method="grpo")
  trainer.train(c)
  path = tmp_path / "w" / "identity.json"
  identity = json.loads(path.read_text())
  assert len(identity["tokenizer"]) == 64
  path.write_text(json.dumps({"tokenizer": "0" * 64}))
  c.total_steps = 2
  with pytest.raises(ValueError, match="holds a run made with another tokenizer"):
    trainer.train(c)


def test_a_key_added_since_a_run_was_saved_reads_as_its_earlier_behaviour():
  """config.json files written before a key existed resume when the key keeps the earlier behaviour, and are refused
  when it does not (env.session.split_key's default changed the tasks: "session" was the earlier split)."""
  from jaxcredit.train.config import base_config

  now = base_config().to_dict()
  saved = json.loads(json.dumps(now))
  for key in ("b1", "b2"):
    del saved["optim"][key]
  del saved["env"]["chain"]["reward"]
  assert ckpt_lib.training_key_diff(saved, now) == []
  now["env"]["name"] = "session"
  saved["env"]["name"] = "session"
  del saved["env"]["session"]["split_key"]
  assert ckpt_lib.training_key_diff(saved, now) == ["env.session.split_key"]
  now["env"]["session"]["split_key"] = "session"
  assert ckpt_lib.training_key_diff(saved, now) == []
