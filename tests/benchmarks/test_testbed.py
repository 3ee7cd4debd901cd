"""The testbed's own pieces (`benchmarks/testbed_compare.py`): its task vocabulary and its summary of runs."""

import importlib.util
import json
import os
import re
import types

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def testbed():
  spec = importlib.util.spec_from_file_location(
    "testbed_compare", os.path.join(ROOT, "benchmarks", "testbed_compare.py")
  )
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def test_task_vocabulary_round_trips_and_shortens_rollouts(testbed):
  spec = testbed.env_spec()
  texts = testbed.tokenizer_texts(spec, 200)
  tok = testbed.build_tokenizer(texts, vocab_size=1024, max_token_length=24)
  assert tok.vocab_size <= 1024
  assert tok.eos_id == tok.token_id("<|im_end|>") and tok.pad_id == tok.token_id("<|endoftext|>")
  # Held-out questions (a separate part of the generated world) still encode exactly.
  task = spec.make_tasks("eval", 1, None)[0]
  messages = spec.initial_messages(task)
  text = tok.apply_chat_template(messages, add_generation_prompt=True)
  assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
  ids = tok.encode(text)
  assert tok.tokenizer.decode(ids, skip_special_tokens=False) == text
  assert tok.tokenizer.decode(tok.encode("Ünïcode ✓ text"), skip_special_tokens=False) == "Ünïcode ✓ text"
  # Merges across spaces: the fixed system prompt (about 1,500 characters) takes few tokens.
  system = messages[0]["content"]
  assert len(tok.encode(system)) < len(system) / 8


def test_invented_names_split_alike_in_train_and_held_out_questions(testbed):
  """The vocabulary holds syllables, not train-world names: a train name is never one token, and held-out names
  (never in the tokenizer's text) take about as many tokens as train names."""
  spec = testbed.env_spec()
  tok = testbed.build_tokenizer(testbed.tokenizer_texts(spec, 200), vocab_size=1024, max_token_length=24)
  invented = testbed.invented_words()
  assert "College" not in invented and len(invented) > 500

  def name_lengths(tasks):
    words = {w for t in tasks for w in re.findall(r"[A-Za-z]+", t.query) if w in invented}
    return [len(tok.encode(w)) for w in words]

  train = name_lengths(spec.make_tasks("train", 200, 0))
  held_out = name_lengths(spec.make_tasks("eval", 64, None))
  assert len(train) > 50 and len(held_out) > 20
  assert min(train) >= 2
  assert 0.75 < np.mean(train) / np.mean(held_out) < 1.33


def _run(workdir, evals):
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, success in evals:
      f.write(json.dumps({"phase": "eval", "step": step, "stage": f"rl_step_{step}", "success_rate": success}) + "\n")
  return str(workdir)


def test_summary_means_spreads_and_steps_to_target(testbed, tmp_path):
  args = types.SimpleNamespace(
    out=str(tmp_path), target_gain=0.1, seeds=[0, 1], prompts=2, group=4, steps=10, progress=False
  )
  workdirs = {
    "grpo": [_run(tmp_path / "g0", [(5, 0.30), (10, 0.35)]), _run(tmp_path / "g1", [(5, 0.25), (10, 0.29)])],
    "trace_none": [_run(tmp_path / "t0", [(5, 0.40), (10, 0.50)]), _run(tmp_path / "t1", [(5, 0.20), (10, 0.42)])],
  }
  result = testbed.summarize(args, 0.3, workdirs, seconds=12.0)
  assert result["target"] == pytest.approx(0.4)
  g, t = result["methods"]["grpo"], result["methods"]["trace_none"]
  assert g["final_success_mean"] == pytest.approx(0.32) and g["final_success_std"] == pytest.approx(0.03)
  assert g["steps_to_target"] == [None, None] and g["steps_to_target_mean"] is None and g["reached_target"] == "0/2"
  assert t["steps_to_target"] == [5, 10] and t["steps_to_target_mean"] == pytest.approx(7.5)
  assert t["curves"][1] == {"steps": [0, 5, 10], "success": [0.3, 0.2, 0.42]}
  saved = json.load(open(tmp_path / "testbed.json"))
  assert saved["methods"]["trace_none"]["reached_target"] == "2/2"
  assert os.path.getsize(tmp_path / "testbed.png") > 10_000
  table = testbed.table(result)
  assert "| trace_none | 0.460 ± 0.040 | 0.500, 0.420 | 7.5 | 2/2 |" in table
  assert np.isclose(saved["warm_start_success"], 0.3)
