"""`jaxcredit eval` on one tiny training run (the module's only one): the final checkpoint evaluated gives exactly the
trainer's final held-out eval; an interrupted eval resumes without sampling its finished tasks again; a model of
another vocabulary is refused naming both sizes; K samples per task give pass@K and a file `jaxcredit credit` and
`jaxcredit viz` read.
"""

import json
import os

import pytest

from jaxcredit.rollout import jsonl as jsonl_lib
from jaxcredit.train.loop import heldout
from jaxcredit.train.commands import trainer
from jaxcredit.train.loop import run as run_lib
from tests.fixtures.cli import run_cli
from tests.fixtures.tiny_model import random_params, tiny_decoder_config, write_gguf
from tests.fixtures.tiny_run import metrics_rows, tiny_run_config, tiny_run_overrides

EVAL = {"eval__num_tasks": 4, "eval__batch_size": 2}
"""Held-out tasks and batch size of the training run's evals and of `jaxcredit eval` (two batches of two)."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory, tiny):
  """One warm-start step (so that the checkpoint's parameters differ from the GGUF's) and one RL step of grpo on the
  quickstart's arithmetic tasks with the tiny policy, its eval at the end; then `jaxcredit eval` of its final
  checkpoint. Returns (workdir, the trainer's last eval row, the eval's folder, the eval's config arguments, what
  the eval printed, the trainer's final eval rollouts)."""
  root = tmp_path_factory.mktemp("eval_command")
  workdir = root / "run"
  c = tiny_run_config(
    "quickstart",
    workdir,
    tiny,
    total_steps=1,
    sft__steps=1,
    sft__batch_size=2,
    sft__warmup_steps=0,  # the first step at the full learning rate: the parameters change
    credit__method="grpo",
    eval__at_end=True,
    **EVAL,
  )
  captured = []
  real_batch = heldout.sample_eval_batch

  def capture(run, tasks, offset, *, greedy):
    captured.extend(real_batch(run, tasks, offset, greedy=greedy))
    return captured[-len(tasks) :]

  with pytest.MonkeyPatch.context() as m:
    m.setattr(heldout, "sample_eval_batch", capture)
    trainer.train(c)
  final = metrics_rows(workdir, "eval")[-1]
  args = [
    "--config",
    "configs/quickstart.py",
    *tiny_run_overrides(tiny.gguf_path, root / "unused", tiny.cache_dir, **EVAL),
  ]
  out = root / "eval"
  p = run_cli("eval", *args, "--model", str(workdir), "--out", str(out))
  assert p.returncode == 0, p.stderr
  return workdir, final, out, args, p.stdout, captured


def test_the_final_checkpoint_evaluated_equals_the_trainers_final_eval(trained):
  workdir, final, out, _, stdout, captured = trained
  assert final["stage"] == "rl_step_1" and final["num_tasks"] == 4
  info = json.loads((out / "eval.json").read_text())
  heldout = info["heldout"]
  assert set(heldout) == set(final) - {"phase", "step", "stage", "seconds"}
  assert heldout == {k: final[k] for k in heldout}  # exactly: same tasks, same greedy decoding, same parameters
  assert info["status"] == "done" and info["model"] == str(workdir)
  identity = info["model_info"].pop("identity")  # what the files held: the tokenizer, the weights, the checkpoint
  assert identity == info["model_identity"] and set(identity) == {"tokenizer", "weights", "checkpoint"}
  assert info["model_info"] == {
    "source": str(workdir),
    "kind": "workdir",
    "base": final_source(workdir),
    "vocab_size": 300,
    "step": 1,
  }
  assert info["split"] == {"env": "arithmetic", "name": "eval", "num_tasks": 4}
  assert info["decoding"]["greedy"] is True and info["samples"] == 1
  assert info["config"]["eval"]["num_tasks"] == 4 and info["config"]["env"]["name"] == "arithmetic"
  assert (info["num_rollouts"], info["resumed"], info["sampled"]) == (4, 0, 4)
  for name in ("success_rate", "tool_calls", "mean_turns", "answered_frac"):
    m = info["metrics"][name]
    assert m["value"] == heldout[name] and m["count"] == 4 and len(m["ci95"]) == 2
  success = info["metrics"]["success_rate"]
  assert success["interval"] == "wilson"
  from jaxcredit.train.commands.evaluate import wilson_interval

  assert success["ci95"] == list(wilson_interval(round(heldout["success_rate"] * 4), 4))
  records = jsonl_lib.read_jsonl(out / "rollouts.jsonl", vocab_size=300)
  assert [r["rollout_id"] for r in records] == [f"eval{t}_0" for t in range(4)]
  assert [r["group_id"] for r in records] == [0, 1, 2, 3]
  assert "success_rate" in stdout and "95% interval" in stdout
  # Token for token the trainer's final eval rollouts: the same parameters decoded the same (greedy, so every
  # behavior log-prob is 0; the K-samples test below shows the checkpoint's parameters are the ones loaded).
  assert len(captured) == 4
  assert [r["token_ids"] for r in records] == [res.builder.tokens for res in captured]
  assert [r["behavior_logprobs"] for r in records] == [
    [float(x) for x in res.builder.behavior_logp] for res in captured
  ]


def final_source(workdir) -> str:
  return json.loads((workdir / "config.json").read_text())["model"]["source"]


def test_an_interrupted_eval_resumes_without_sampling_its_finished_tasks(trained, tmp_path, monkeypatch):
  _, _, out, args, _, _ = trained
  full = json.loads((out / "eval.json").read_text())
  resumed = tmp_path / "eval"
  resumed.mkdir()
  header = {k: full[k] for k in ("model", "split", "samples", "decoding", "config", "model_identity")}
  (resumed / "eval.json").write_text(json.dumps({"status": "running", **header}))
  lines = (out / "rollouts.jsonl").read_text().splitlines(keepends=True)
  # The first batch written, the second cut off in the middle of its first line (a kill during the write).
  (resumed / "rollouts.jsonl").write_text("".join(lines[:2]) + lines[2][:40])
  sampled = []
  real_sample = run_lib.sample_rollouts

  def counting_sample(run, tasks, key, *, greedy=False, held_out=False):
    sampled.extend(tasks)
    return real_sample(run, tasks, key, greedy=greedy, held_out=held_out)

  monkeypatch.setattr(heldout, "sample_rollouts", counting_sample)
  p = run_cli("eval", *args, "--model", full["model"], "--out", str(resumed))
  assert p.returncode == 0, p.stderr
  assert len(sampled) == 2, "finished tasks were sampled again"
  info = json.loads((resumed / "eval.json").read_text())
  assert (info["resumed"], info["sampled"]) == (2, 2)
  assert info["heldout"] == full["heldout"] and info["metrics"] == full["metrics"]
  assert (resumed / "rollouts.jsonl").read_text() == "".join(lines)
  assert "resuming" in p.stdout


def test_a_model_of_another_vocabulary_is_refused_naming_both_sizes(trained, tmp_path):
  workdir, _, _, args, _, _ = trained
  cfg = tiny_decoder_config(vocab_size=320, rms_norm_eps=1e-5)
  other = write_gguf(tmp_path / "other.gguf", "llama", cfg, random_params(cfg))
  p = run_cli("eval", *args, "--model", str(other), "--out", str(tmp_path / "eval"))
  assert p.returncode == 2
  assert "320 tokens" in p.stderr and "has 300" in p.stderr, p.stderr
  assert not os.path.exists(tmp_path / "eval"), "a refused eval left its folder"
  p = run_cli("eval", *args, "--model", f"{workdir}@7", "--out", str(tmp_path / "eval7"))
  assert p.returncode == 2 and "no checkpoint of RL step 7" in p.stderr and "[0, 1]" in p.stderr, p.stderr


def test_a_resumed_eval_refuses_other_weights_behind_the_same_model(trained, tmp_path):
  """Issue 54 case 1: an eval cut short, its model file replaced by other weights, the same command again: the rollouts
  mixed two models and eval.json named only the second. The folder now records what the model's files held
  (`evaluate.weights_identity`, the tokenizer's content) and refuses the resume naming what changed."""
  _, _, _, args, _, _ = trained
  cfg = tiny_decoder_config(vocab_size=300, rms_norm_eps=1e-5)
  model = tmp_path / "model.gguf"
  write_gguf(model, "llama", cfg, random_params(cfg, seed=1))
  out = tmp_path / "eval"
  p = run_cli("eval", *args, "--model", str(model), "--out", str(out))
  assert p.returncode == 0, p.stderr
  identity = json.loads((out / "eval.json").read_text())["model_identity"]
  assert set(identity) == {"tokenizer", "weights"}
  p = run_cli("eval", *args, "--model", str(model), "--out", str(out))  # the same files: resumed, nothing sampled
  assert p.returncode == 0 and "0 rollouts sampled" in p.stdout, p.stdout + p.stderr
  write_gguf(model, "llama", cfg, random_params(cfg, seed=2))  # other weights, the same path
  p = run_cli("eval", *args, "--model", str(model), "--out", str(out))
  assert p.returncode == 2, p.stderr
  assert "holds another eval (model_identity.weights: the folder's eval has" in p.stderr, p.stderr


def test_a_model_with_other_tokens_of_the_same_count_is_refused(trained, tmp_path, monkeypatch):
  """Issue 54 case 3: tokenizers were compared by size (Llama-2's and Mistral-v0.1's both 32,000)."""
  from tests.fixtures import tiny_model

  _, _, _, args, _, _ = trained
  tokens = list(tiny_model.TOKENS)
  i = tokens.index("hello")
  tokens[i], tokens[i + 1] = tokens[i + 1], tokens[i]
  monkeypatch.setattr(tiny_model, "TOKENS", tokens)
  cfg = tiny_decoder_config(vocab_size=300, rms_norm_eps=1e-5)
  other = write_gguf(tmp_path / "other.gguf", "llama", cfg, random_params(cfg))
  p = run_cli("eval", *args, "--model", str(other), "--out", str(tmp_path / "eval"))
  assert p.returncode == 2
  assert f"the same size (300) but other tokens: id {i} is 'Ġw' against 'hello'" in p.stderr, p.stderr


def test_k_samples_give_pass_at_k_and_rollouts_that_jaxcredit_credit_reads(trained, tmp_path):
  workdir, _, _, args, _, _ = trained
  out = tmp_path / "eval"
  p = run_cli(
    "eval", *args, "--config.eval.num_tasks=2", "--model", f"{workdir}@0", "--out", str(out), "--samples", "2"
  )
  assert p.returncode == 0, p.stderr
  info = json.loads((out / "eval.json").read_text())
  assert info["decoding"]["greedy"] is False and info["decoding"]["temperature"] == 0.8
  assert info["model_info"]["step"] == 0 and info["num_rollouts"] == 4
  assert {"pass@2", "mean@2"} <= set(info["metrics"]) and info["metrics"]["pass@2"]["count"] == 2
  assert info["metrics"]["pass@2"]["value"] >= info["metrics"]["mean@2"]["value"]
  # The same draws (one fixed key per batch) from the GGUF's parameters (no --model): other log-probs, so the
  # checkpoint's parameters (warm-started) were the ones sampled above.
  p = run_cli("eval", *args, "--config.eval.num_tasks=2", "--out", str(tmp_path / "base"), "--samples", "2")
  assert p.returncode == 0, p.stderr
  logp = [r["behavior_logprobs"] for r in jsonl_lib.read_jsonl(out / "rollouts.jsonl")]
  assert any(x != 0.0 for row in logp for x in row)
  assert [r["behavior_logprobs"] for r in jsonl_lib.read_jsonl(tmp_path / "base" / "rollouts.jsonl")] != logp
  p = run_cli(
    "credit",
    *args,
    "--config.credit.method=grpo",
    "--in",
    str(out / "rollouts.jsonl"),
    "--out",
    str(tmp_path / "c.jsonl"),
  )
  assert p.returncode == 0, p.stderr
  assert "4 rollouts (2 groups)" in p.stdout
  viewer = tmp_path / "viewer"
  p = run_cli("viz", "--workdir", str(workdir), "--rollouts", str(out / "rollouts.jsonl"), "--out", str(viewer))
  assert p.returncode == 0, p.stderr
  assert "4 rollouts of" in p.stdout and (viewer / "index.html").is_file()
