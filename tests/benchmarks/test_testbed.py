"""The testbed's own pieces (`benchmarks/testbed_compare.py`): its task vocabulary and its summary of runs."""

import importlib.util
import json
import os
import random
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


def test_arithmetic_vocabulary_spells_numbers_digit_by_digit(testbed):
  """The arithmetic task's vocabulary never merges digits (so copying a number is copying digits), round-trips its
  demonstrations (with and without the calculator) and compresses the fixed text around them."""
  spec = testbed.env_spec("arithmetic")
  texts = testbed.task_texts(spec, 200)
  assert any("<tool_call>" in t for t in texts) and any("<tool_call>" not in t and "<answer>" in t for t in texts)
  tok = testbed.build_tokenizer(texts, vocab_size=512, max_token_length=24, individual_digits=True)
  ids = tok.encode("<answer>-3710</answer>")
  pieces = [tok.tokenizer.decode([i]) for i in ids]
  assert [p for p in pieces if any(ch.isdigit() for ch in p)] == ["3", "7", "1", "0"], pieces
  task = spec.make_tasks("eval", 1, None)[0]
  text = tok.apply_chat_template(spec.initial_messages(task), add_generation_prompt=True)
  assert tok.tokenizer.decode(tok.encode(text), skip_special_tokens=False) == text
  system = spec.initial_messages(task)[0]["content"]
  assert len(tok.encode(system)) < len(system) / 6
  # The copying curriculum draws from the characters expressions are spelt with, letters only for search.
  assert testbed.copy_piece("7", "arithmetic") and testbed.copy_piece("*", "arithmetic")
  assert not testbed.copy_piece("37", "arithmetic") and not testbed.copy_piece("a", "arithmetic")
  assert testbed.copy_piece("ab", "search") and not testbed.copy_piece("7", "search")


def test_arithmetic_runs_sample_their_evals_and_take_the_tasks_settings(testbed, tmp_path):
  """base() for --task arithmetic: the arithmetic environment with the testbed's direct-answer share, sampled
  evals, the task's sampling lengths; --set still overrides."""
  args = types.SimpleNamespace(
    out=str(tmp_path),
    task="arithmetic",
    train_questions=500,
    prompts=4,
    group=8,
    lr=1e-4,
    eval_tasks=64,
    eval_every=4,
    progress=False,
  )
  c = testbed.base(args, str(tmp_path / "w"), "policy", seed=1)
  assert c.env.name == "arithmetic" and c.env.arithmetic.direct_answer_prob == testbed.ARITHMETIC["direct_answer_prob"]
  assert c.eval.greedy is False and c.env.num_train_tasks == 500 and c.sampling.max_len == 256
  assert testbed.base(dict_to_ns(args, task="search"), str(tmp_path / "s"), "policy", seed=1).eval.greedy is True


@pytest.mark.parametrize("task", ["chain", "session", "chain_long", "session_long", "chain_longer"])
def test_long_horizon_tasks_take_their_habits_and_fit_their_lengths(testbed, tmp_path, task):
  """base() for --task chain / session and their starved forms: the environment with the testbed's skip and slip
  rates and the task's sizes, sampled evals; a demonstration in the task's own vocabulary (digits one by one) fits
  its max_len with room for the rollout."""
  args = types.SimpleNamespace(
    out=str(tmp_path),
    task=task,
    train_questions=500,
    prompts=4,
    group=8,
    lr=1e-4,
    eval_tasks=64,
    eval_every=5,
    progress=False,
  )
  c = testbed.base(args, str(tmp_path / "w"), "policy", seed=0)
  rates, env = testbed.TASKS[task]["env_config"], testbed.TASKS[task]["env"]
  assert c.env.name == env and c.env[env].skip_prob == rates["skip_prob"] > 0 and c.eval.greedy is False
  for key, value in rates.items():
    assert c.env[env][key] == value, key
  spec = testbed.env_spec(task)
  texts = testbed.task_texts(spec, 100)
  tok = testbed.build_tokenizer(texts, vocab_size=512, max_token_length=24, individual_digits=True)
  from jaxcredit.rollout.chat_format import ChatFormat
  from jaxcredit.rollout.multiturn import build_demonstration

  fmt = ChatFormat.from_tokenizer(tok)
  rng = random.Random(0)
  lengths = [
    len(build_demonstration(tok, fmt, spec.demonstration(t, rng)).tokens) for t in spec.make_tasks("train", 50, 0)
  ]
  assert max(lengths) < 0.8 * c.sampling.max_len, (max(lengths), c.sampling.max_len)


@pytest.mark.parametrize(
  "flags, words",
  [
    (["--seeds", "abc"], "--seeds 'abc': expected comma-separated integers"),
    (["--seeds", ""], "--seeds '': expected comma-separated integers"),
    (["--seeds", "1,1"], "expected distinct integers >= 0"),
    (["--set", "optim.learning_rate=-1"], "config.optim.learning_rate = -1"),
    (["--merge", "LIST"], "not a testbed.json"),
  ],
)
def test_bad_flags_are_one_line_and_exit_2_before_any_stage(testbed, tmp_path, capsys, flags, words):
  """Issue 54 case 9: these ran a stage or ended in a traceback."""
  listed = tmp_path / "list.json"
  listed.write_text("[1, 2]")
  flags = [str(listed) if f == "LIST" else f for f in flags]
  with pytest.raises(SystemExit) as e:
    testbed.main(["--out", str(tmp_path / "out"), *flags])
  assert e.value.code == 2
  assert words in capsys.readouterr().err
  assert not (tmp_path / "out").exists()


def dict_to_ns(ns, **changes):
  return types.SimpleNamespace(**{**vars(ns), **changes})


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


def _run(workdir, evals, train=()):
  os.makedirs(workdir)
  with open(os.path.join(workdir, "metrics.jsonl"), "w") as f:
    for step, success in enumerate(train, 1):
      f.write(json.dumps({"phase": "rl", "step": step, "success_rate": success, "step_s": 2.0}) + "\n")
    for step, success in evals:
      f.write(json.dumps({"phase": "eval", "step": step, "stage": f"rl_step_{step}", "success_rate": success}) + "\n")
  return str(workdir)


def test_summary_means_spreads_and_steps_to_target(testbed, tmp_path):
  args = types.SimpleNamespace(
    out=str(tmp_path), target_gain=0.1, seeds=[0, 1], prompts=2, group=4, steps=10, progress=False, task="search"
  )
  workdirs = {
    "grpo": [_run(tmp_path / "g0", [(5, 0.30), (10, 0.35)]), _run(tmp_path / "g1", [(5, 0.25), (10, 0.29)])],
    "trace": [
      _run(tmp_path / "t0", [(5, 0.40), (10, 0.50)], train=[0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]),
      _run(tmp_path / "t1", [(5, 0.20), (10, 0.42)], train=[0.0] * 8 + [0.5, 0.5]),
    ],
  }
  result = testbed.summarize(args, 0.3, workdirs, seconds=12.0)
  assert result["target"] == pytest.approx(0.4)
  g, t = result["methods"]["grpo"], result["methods"]["trace"]
  assert g["final_success_mean"] == pytest.approx(0.32) and g["final_success_std"] == pytest.approx(0.03)
  assert g["steps_to_target"] == [None, None] and g["steps_to_target_mean"] is None and g["reached_target"] == "0/2"
  assert t["steps_to_target"] == [5, 10] and t["steps_to_target_mean"] == pytest.approx(7.5)
  assert t["curves"][1] == {"steps": [0, 5, 10], "success": [0.3, 0.2, 0.42]}
  saved = json.load(open(tmp_path / "testbed.json"))
  assert saved["methods"]["trace"]["reached_target"] == "2/2"
  assert os.path.getsize(tmp_path / "testbed.png") > 10_000
  table = testbed.table(result)
  # training success over the first and last quarter (10 // 4 = 2 steps): seed 0 0.15 -> 0.95, seed 1 0.0 -> 0.5
  assert t["train_success_first"] == pytest.approx(0.075) and t["train_success_last"] == pytest.approx(0.725)
  assert t["rl_seconds_mean"] == pytest.approx(20.0) and t["train_curves"][1]["success"][-1] == 0.5
  assert g["train_success_first"] is None and g["rl_seconds_mean"] == 0.0
  # GRPO's final 0.32: trace seed 0 reaches it at step 5, seed 1 at step 10; grpo's own seed 0 at 10, seed 1 never
  assert t["steps_to_grpo_final"] == [5, 10] and g["steps_to_grpo_final"] == [10, None]
  assert "| trace | 0.460 ± 0.040 | 0.500, 0.420 | 7.5 | 2/2 | 7.5 (2/2) | 0.075 -> 0.725 | 20 |" in table
  assert "| grpo | 0.320 ± 0.030 | 0.350, 0.290 | - | 0/2 | 10.0 (1/2) | - -> - | 0 |" in table
  assert result["rollouts_per_step"] == 8 and g["final_env"] == {}
  assert np.isclose(saved["warm_start_success"], 0.3)
  # Rows logged before the diagnostics existed: the steps, with None for each diagnostic.
  assert t["diagnostics"]["steps"] == list(range(1, 11)) and t["diagnostics"]["contrast_group_frac"] == [None] * 10


def test_each_method_is_also_compared_with_the_tasks_control(testbed, tmp_path):
  # H2: TRACE minus the shaped-reward control, paired by seed like its difference from GRPO
  args = types.SimpleNamespace(
    out=str(tmp_path), target_gain=0.1, seeds=[0, 1], prompts=2, group=4, steps=10, progress=False, task="chain"
  )
  finals = {"grpo": (0.30, 0.40), "grpo_progress": (0.50, 0.40), "trace": (0.45, 0.50)}
  workdirs = {
    label: [_run(tmp_path / f"{label}_seed{seed}", [(10, v)]) for seed, v in enumerate(values)]
    for label, values in finals.items()
  }
  result = testbed.summarize(args, 0.1, workdirs, seconds=1.0)
  methods = result["methods"]
  assert result["control"] == "grpo_progress"
  assert methods["grpo"]["vs_control"] is None and methods["grpo_progress"]["vs_control"] is None
  # per seed: trace - progress = -0.05, +0.10 (mean +0.025); trace - grpo = +0.15, +0.10 (mean +0.125)
  assert methods["trace"]["vs_control"]["diff"] == pytest.approx(0.025)
  assert methods["trace"]["vs_control"]["paired_seeds"] == 2
  assert methods["trace"]["vs_grpo"]["diff"] == pytest.approx(0.125)
  assert methods["grpo_progress"]["vs_grpo"]["diff"] == pytest.approx(0.1)
  d = methods["trace"]["vs_control"]
  table = testbed.table(result)
  assert "minus grpo_progress [95% CI]" in table
  assert f"| +0.125 [{methods['trace']['vs_grpo']['ci95'][0]:+.3f}, " in table
  assert f"| +0.025 [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}] |" in table
  # no control ran: every vs_control is None and the column says so
  only = testbed.summarize(args, 0.1, {k: workdirs[k] for k in ("grpo", "trace")}, seconds=1.0)
  assert only["control"] is None and only["methods"]["trace"]["vs_control"] is None
  assert "minus the control [95% CI]" in testbed.table(only)
  assert result["hypothesis"] is None  # the chain task pre-registered none (chain_longer did)


def test_the_pre_registered_verdict_waits_for_its_seeds_and_reads_only_them(testbed):
  def method(finals, seeds=None):
    seeds = list(range(len(finals))) if seeds is None else seeds
    return {"seeds_run": seeds, "final_success": list(finals)}

  # TRACE 0.10 above GRPO on seeds 0-4 (+-0.01), level with the control; seed 5, where it is 0.9 below both, is not
  # pre-registered and must not enter
  grpo = method([0.50, 0.60, 0.55, 0.40, 0.45, 0.90])
  control = method([0.70, 0.62, 0.66, 0.58, 0.61, 0.90])
  trace = method([0.61, 0.69, 0.66, 0.49, 0.56, 0.0])
  seeds = (0, 1, 2, 3, 4)
  early = {"grpo": method([0.5, 0.6, 0.55]), "grpo_progress": control, "trace": method([0.6, 0.7, 0.66])}
  waiting = testbed.hypothesis_verdict(early, "grpo_progress", "trace", seeds)
  assert waiting["decided"] is False
  assert waiting["missing_seeds"] == {"trace": [3, 4], "grpo": [3, 4]}
  assert "not decided" in testbed.hypothesis_line(waiting, "grpo_progress")
  no_control = testbed.hypothesis_verdict({"grpo": grpo, "trace": trace}, None, "trace", seeds)
  assert no_control["missing_seeds"] == {"the control": list(seeds)}

  methods = {"grpo": grpo, "grpo_progress": control, "trace": trace}
  v = testbed.hypothesis_verdict(methods, "grpo_progress", "trace", seeds)
  assert v["decided"] is True and v["vs_grpo"]["paired_seeds"] == 5
  assert v["vs_grpo"]["diff"] == pytest.approx(0.102)  # seeds 0-4 only (with seed 5: -0.065)
  assert testbed.difference_from(grpo, trace)["diff"] == pytest.approx(-0.065)  # what seed 5 would have done
  assert v["vs_grpo_side"] == "above 0" and v["vs_control_side"] == "contains 0"
  assert v["reading"].startswith("beats GRPO but not grpo_progress")
  line = testbed.hypothesis_line(v, "grpo_progress")
  assert f"minus GRPO +0.102 [{v['vs_grpo']['ci95'][0]:+.3f}" in line and "minus grpo_progress" in line
  # the same runs with TRACE 0.10 below GRPO: neither, its GRPO interval below 0
  below = dict(methods, trace=method([v - 0.2 for v in trace["final_success"][:5]]))
  b = testbed.hypothesis_verdict(below, "grpo_progress", "trace", seeds)
  assert b["vs_grpo_side"] == "below 0" and b["vs_control_side"] == "below 0"
  assert b["reading"].startswith("beats neither GRPO (its interval below 0)")
  both = dict(methods, trace=method([v + 0.3 for v in trace["final_success"][:5]]))
  assert testbed.hypothesis_verdict(both, "grpo_progress", "trace", seeds)["reading"].startswith(
    "beats GRPO and grpo_progress"
  )


def test_diagnostics_are_averaged_over_seeds_step_by_step(testbed, tmp_path):
  def run(name, contrast, outcome=None):
    w = tmp_path / name
    w.mkdir()
    rows = [
      {
        "phase": "rl",
        "step": s,
        "contrast_group_frac": c,
        "nonzero_adv_token_frac": c,
        "dense_adv_share": 0.0,
        "grad_norm": 1.0 + s,
        **({} if outcome is None else {"outcome_contrast_group_frac": outcome[s - 1]}),
      }
      for s, c in enumerate(contrast, 1)
    ]
    (w / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(w)

  curves = [testbed.diagnostics_curves(run("a", [0.25, 0.5, 1.0])), testbed.diagnostics_curves(run("b", [0.75, 0.5]))]
  mean = testbed.mean_diagnostics(curves)
  assert mean["steps"] == [1, 2]  # the steps every seed logged
  assert mean["contrast_group_frac"] == [0.5, 0.5] and mean["grad_norm"] == [2.0, 3.0]
  assert mean["outcome_contrast_group_frac"] == [None, None]  # logged before the RL step wrote it
  # Rows without the outcome contrast: equal to the reward contrast for a run paid the outcome, unknown for a control
  assert testbed.fill_outcome_contrast("grpo", curves[1])["outcome_contrast_group_frac"] == [0.75, 0.5]
  assert testbed.fill_outcome_contrast("grpo_progress", curves[1])["outcome_contrast_group_frac"] == [None, None]
  # A control's seeds with and without it: the mean over the seeds that logged it
  control = [
    testbed.fill_outcome_contrast("grpo_progress", testbed.diagnostics_curves(run("c0", [1.0, 1.0]))),
    testbed.fill_outcome_contrast("grpo_progress", testbed.diagnostics_curves(run("c1", [1.0, 1.0], [0.25, 0.5]))),
    testbed.fill_outcome_contrast("grpo_progress", testbed.diagnostics_curves(run("c2", [1.0, 1.0], [0.75, 0.0]))),
  ]
  mean = testbed.mean_diagnostics(control)
  assert mean["outcome_contrast_group_frac"] == [0.5, 0.25] and mean["contrast_group_frac"] == [1.0, 1.0]


def test_merge_joins_an_earlier_results_file_only_when_the_runs_repeat(testbed, tmp_path):
  def args(out, seeds, lr=1e-4):
    return types.SimpleNamespace(
      out=str(out), target_gain=0.1, seeds=seeds, prompts=2, group=4, steps=10, progress=False, task="search", lr=lr
    )

  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  g0 = _run(tmp_path / "a" / "g0", [(5, 0.30), (10, 0.40)])
  earlier = testbed.summarize(
    args(tmp_path / "a", [0, 1]),
    0.3,
    {
      "grpo": [g0, _run(tmp_path / "a" / "g1", [(5, 0.20), (10, 0.30)])],
      "trace": [
        _run(tmp_path / "a" / "t0", [(5, 0.50), (10, 0.60)]),
        _run(tmp_path / "a" / "t1", [(5, 0.3), (10, 0.3)]),
      ],
    },
    seconds=1.0,
  )
  with open(os.path.join(g0, testbed.RUN_SECONDS_FILE), "w") as f:
    json.dump({"seconds": 123.0}, f)
  # This invocation: GRPO seed 0 again (the same curve: the runs repeat) and a method the earlier file lacks.
  here = {"grpo": [g0], "gear": [_run(tmp_path / "b" / "e0", [(5, 0.36), (10, 0.36)])]}
  result = testbed.summarize(args(tmp_path / "b", [0]), 0.3, here, seconds=2.0, earlier=("old.json", earlier))
  assert list(result["methods"]) == ["grpo", "trace", "gear"]
  assert result["merged_from"] == {"grpo": "old.json", "trace": "old.json"}
  # GRPO comes whole from the earlier file (it ran more seeds there): its final 0.35 is the bar for every method
  assert result["methods"]["grpo"]["final_success"] == [0.4, 0.3]
  assert result["methods"]["gear"]["steps_to_grpo_final"] == [5]
  assert result["methods"]["trace"]["steps_to_grpo_final"] == [5, None]
  with open(tmp_path / "b" / "testbed.json") as f:
    assert json.load(f)["merged_from"]["trace"] == "old.json"
  # A committed file's notes (no run computes them) lead the joined summary, so copying it over the file keeps them.
  noted = {"what": "the comparison", "commands": ["python x.py"], **earlier}
  result = testbed.summarize(args(tmp_path / "b", [0]), 0.3, here, seconds=2.0, earlier=("old.json", noted))
  assert list(result)[:2] == ["what", "commands"] and result["commands"] == ["python x.py"]
  assert "what" not in testbed.summarize(args(tmp_path / "b", [0]), 0.3, here, seconds=2.0)
  mine = testbed.summarize(args(tmp_path / "b", [0]), 0.3, {"grpo": [g0]}, seconds=2.0)
  assert mine["methods"]["grpo"]["run_seconds"] == [123.0] and earlier["methods"]["trace"]["run_seconds"] == [None] * 2

  other = {"grpo": [_run(tmp_path / "b" / "g0", [(5, 0.30), (10, 0.45)])]}
  with pytest.raises(ValueError, match=r"grpo seed 0 ended another way here \(\[0.3, 0.3, 0.45\]\)"):
    testbed.summarize(args(tmp_path / "b", [0]), 0.3, other, seconds=2.0, earlier=("old.json", earlier))
  with pytest.raises(ValueError, match="setting 'lr' is 0.0001 there and 0.001 here"):
    testbed.summarize(args(tmp_path / "b", [0], lr=1e-3), 0.3, here, seconds=2.0, earlier=("old.json", earlier))
  with pytest.raises(ValueError, match="warm start's held-out success 0.3 differs from this one's 0.25"):
    testbed.summarize(args(tmp_path / "b", [0]), 0.25, here, seconds=2.0, earlier=("old.json", earlier))


def test_merge_grows_a_method_seed_by_seed_from_the_earlier_files_run_records(testbed, tmp_path):
  """A comparison too long for one session grows across sessions: the results file keeps every run's record, and a
  later invocation's seeds join the file's (the shared ones must repeat), the summary recomputed over the union."""

  def args(out, seeds):
    return types.SimpleNamespace(
      out=str(out), target_gain=0.1, seeds=seeds, prompts=2, group=4, steps=4, progress=False, task="search", lr=1e-4
    )

  def run(name, final, contrast):
    w = tmp_path / name
    w.mkdir(parents=True)
    rows = [
      {"phase": "rl", "step": s, "success_rate": 0.25, "step_s": 1.0, "contrast_group_frac": contrast}
      for s in (1, 2, 3, 4)
    ]
    rows.append({"phase": "eval", "step": 4, "success_rate": final, "env/chain_progress": final})
    (w / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (w / testbed.RUN_SECONDS_FILE).write_text(json.dumps({"seconds": 9.0, "machine": {"cpu_model": name}}))
    return str(w)

  (tmp_path / "a").mkdir()
  (tmp_path / "b").mkdir()
  first = testbed.summarize(
    args(tmp_path / "a", [0, 1]), 0.1, {"grpo": [run("a/grpo_seed0", 0.5, 0.25), run("a/grpo_seed1", 0.3, 0.5)]}, 1.0
  )
  saved = json.loads(json.dumps(first))  # as the committed file reads back
  assert [r["machine"]["cpu_model"] for r in saved["methods"]["grpo"]["runs"]] == ["a/grpo_seed0", "a/grpo_seed1"]
  # A later session: seed 0 again (it repeats) and seed 2, on another machine.
  later = {"grpo": [run("b/grpo_seed0", 0.5, 0.25), run("b/grpo_seed2", 0.7, 1.0)]}
  result = testbed.summarize(args(tmp_path / "b", [0, 2]), 0.1, later, 2.0, earlier=("file.json", saved))
  g = result["methods"]["grpo"]
  assert g["seeds_run"] == [0, 1, 2] and g["final_success"] == [0.5, 0.3, 0.7]
  assert g["final_success_mean"] == pytest.approx(0.5)
  assert g["diagnostics"]["contrast_group_frac"] == pytest.approx([0.5833333] * 4)
  assert result["contrast_group_frac_first_step"]["grpo"] == pytest.approx(0.5833333)
  assert g["final_env"]["env/chain_progress"] == pytest.approx(0.5)
  assert [r["machine"]["cpu_model"] for r in g["runs"]] == ["b/grpo_seed0", "a/grpo_seed1", "b/grpo_seed2"]
  assert result["merged_from"] == {"grpo": "file.json"}
  # A seed that does not repeat is refused, naming it.
  with pytest.raises(ValueError, match="grpo seed 0 ended another way here"):
    testbed.summarize(
      args(tmp_path / "b", [0]), 0.1, {"grpo": [run("c/grpo_seed0", 0.6, 0.25)]}, 2.0, earlier=("file.json", saved)
    )
  # A file written before runs kept their records joins as before: the method whole unless every seed ran again.
  old = json.loads(json.dumps(first))
  del old["methods"]["grpo"]["runs"]
  result = testbed.summarize(args(tmp_path / "b", [0, 2]), 0.1, later, 2.0, earlier=("old.json", old))
  assert result["methods"]["grpo"]["final_success"] == [0.5, 0.3]


def test_warm_summary_reads_losses_and_every_warm_start_eval(testbed, tmp_path):
  rows = [{"phase": "sft", "step": i + 1, "loss": 5.0 - 0.1 * i, "step_s": 0.5 + (i == 3)} for i in range(40)]
  rows.append(
    {
      "phase": "eval",
      "step": 0,
      "stage": "sft_step_20",
      "sft_step": 20,
      "success_rate": 0.1,
      "env/evidence_found": 0.25,
      "seconds": 3.0,
    }
  )
  rows.append({"phase": "eval", "step": 0, "stage": "after_warm_start", "success_rate": 0.3, "answered_frac": 0.9})
  rows.append({"phase": "eval", "step": 5, "stage": "rl_step_5", "success_rate": 0.9})
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  config = {
    "sft": {"steps": 40, "loss_tokens": "all"},
    "model": {"source": "p"},
    "env": {"name": "search", "search": {"top_k": 1}},
  }
  (tmp_path / "config.json").write_text(json.dumps(config))
  w = testbed.warm_summary(str(tmp_path))
  assert w["sft"] == {"steps": 40, "loss_tokens": "all"} and w["model_source"] == "p" and w["env"] == {"top_k": 1}
  assert w["steps"] == 40 and w["step_s_median"] == pytest.approx(0.5)
  assert w["loss_first_20"] == pytest.approx(4.05) and w["loss_last_20"] == pytest.approx(2.05)
  assert w["evals"] == [
    {"sft_step": 20, "success_rate": 0.1, "env/evidence_found": 0.25, "seconds": 3.0},
    {"sft_step": 40, "success_rate": 0.3, "answered_frac": 0.9},
  ]


def test_warm_step_starts_rl_from_an_earlier_point_of_the_same_warm_start(testbed, tmp_path):
  """--warm-step S: the warm start's step-S model folder and its eval at S, never the final ones; a missing folder
  or eval, or an S outside the warm start, is refused naming the flag."""
  warm = tmp_path / "warm"
  for name in ("warm_start_model", "warm_start_model_step_200"):
    (warm / name).mkdir(parents=True)
    (warm / name / "model_config.json").write_text("{}")
  rows = [
    {"phase": "eval", "step": 0, "stage": "sft_step_100", "sft_step": 100, "success_rate": 0.01, "num_tasks": 64},
    {"phase": "eval", "step": 0, "stage": "sft_step_200", "sft_step": 200, "success_rate": 0.05, "num_tasks": 64},
    {"phase": "eval", "step": 0, "stage": "after_warm_start", "success_rate": 0.25, "num_tasks": 64},
  ]
  (warm / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  args = types.SimpleNamespace(out=str(tmp_path), eval_tasks=64, sft_steps=300, warm_step=200)
  assert testbed.warm_start(args, "unused") == (str(warm / "warm_start_model_step_200"), 0.05)
  args.warm_step = 300  # the last step: the final folder and eval
  assert testbed.warm_start(args, "unused") == (str(warm / "warm_start_model"), 0.25)
  args.warm_step = 100  # an eval but no folder
  with pytest.raises(ValueError, match="--warm-step=100: .* holds no warm_start_model_step_100"):
    testbed.warm_start(args, "unused")
  (warm / "warm_start_model_step_150").mkdir()
  (warm / "warm_start_model_step_150" / "model_config.json").write_text("{}")
  args.warm_step = 150  # a folder but no eval
  with pytest.raises(ValueError, match="--warm-step=150: .* no held-out eval at warm-start step 150"):
    testbed.warm_start(args, "unused")
  args.warm_step = 400
  with pytest.raises(ValueError, match="--warm-step=400: must lie in 1..--sft-steps=300"):
    testbed.warm_start(args, "unused")
  args.warm_step, args.eval_tasks = 200, 128
  with pytest.raises(ValueError, match="--eval-tasks=128.*64 held-out tasks"):
    testbed.warm_start(args, "unused")


def test_warm_start_baseline_must_use_the_runs_eval_tasks(testbed, tmp_path):
  warm = tmp_path / "warm"
  (warm / "warm_start_model").mkdir(parents=True)
  (warm / "warm_start_model" / "model_config.json").write_text("{}")
  rows = [
    {"phase": "eval", "step": 0, "stage": "after_warm_start", "success_rate": 0.25, "num_tasks": 32},
    {"phase": "eval", "step": 0, "stage": "after_warm_start", "success_rate": 0.375, "num_tasks": 64},
  ]
  (warm / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  args = types.SimpleNamespace(out=str(tmp_path), eval_tasks=64)
  model, success = testbed.warm_start(args, "unused")
  assert model == str(warm / "warm_start_model") and success == 0.375
  args.eval_tasks = 128
  with pytest.raises(ValueError, match="--eval-tasks=128.*64 held-out tasks"):
    testbed.warm_start(args, "unused")


def test_copy_batch_repeats_each_string_and_targets_only_the_copy(testbed):
  tokens, targets = testbed.copy_batch(np.random.default_rng(0), np.arange(100, 200), batch=2, length=600)
  assert tokens.shape == targets.shape == (2, 600) and tokens.dtype == np.int32
  for row, tgt in zip(tokens, targets):
    assert ((row >= 100) & (row < 200)).all()
    p, segments = 0, 0
    while p < 600 and tgt[p:].any():
      n = int(np.argmax(tgt[p:])) - 1  # the first target is the repeat's second token
      end = min(p + 2 * n, 600)
      assert 4 <= n <= 40
      assert (row[p + n : end] == row[p : end - n]).all()
      assert not tgt[p : p + n + 1].any() and tgt[p + n + 1 : end].all()
      p, segments = end, segments + 1
    assert segments > 10


@pytest.mark.slow
def test_copy_curriculum_writes_a_loadable_policy(testbed, tmp_path):
  """In the slow tier (a benchmark's curriculum trains and is reloaded, about 10 s): its batches are checked in the
  default suite (test_copy_batch_repeats_each_string_and_targets_only_the_copy)."""
  from jaxcredit import models

  args = types.SimpleNamespace(
    tokenizer_tasks=50, vocab_size=512, max_token_length=24, hidden=64, layers=1, init_seed=0, task="search"
  )
  policy = testbed.build_policy(str(tmp_path / "init"), args)
  out = testbed.copy_curriculum(policy, str(tmp_path / "copy"), steps=3, lr=1e-3)
  record = json.load(open(os.path.join(out, "copy_losses.json")))
  losses = record["losses"]
  assert len(losses) == 3 and all(np.isfinite(losses))
  # The first step draws from the small piece set; the untrained policy predicts about uniformly over its vocabulary.
  assert record["grow_at"] == 1 and 0 < record["small_pieces"] <= testbed.COPY_SMALL_PIECES < record["pieces"]
  assert abs(losses[0] - np.log(models.load_model(policy)[1].vocab_size)) < 0.5, losses
  model, cfg = models.load_model(out)
  before, _ = models.load_model(policy)
  assert cfg.hidden_size == 64 and models.load_tokenizer(out).vocab_size == models.load_tokenizer(policy).vocab_size
  import jax
  from flax import nnx

  after_leaves, before_leaves = (jax.tree.leaves(nnx.state(m, nnx.Param)) for m in (model, before))
  assert len(after_leaves) == len(before_leaves)
  assert not all(np.allclose(a, b) for a, b in zip(after_leaves, before_leaves))  # trained, not copied
  assert testbed.copy_curriculum(policy, out, steps=3, lr=1e-3) == out  # done once


def test_reading_batch_targets_only_each_answer(testbed):
  import random

  spec, tasks = testbed.read_world(0)
  assert len(tasks) == testbed.READ_BATCH * testbed.READ_WORLD_STEPS
  assert all(len(t.chain) == 1 for t in tasks[:50])  # one hop: the answer is in the one document searched
  _, other = testbed.read_world(1)
  assert not {t.answer for t in tasks[:50] if " " in t.answer} & {t.answer for t in other}  # a fresh world
  tok = testbed.build_tokenizer(testbed.tokenizer_texts(testbed.env_spec(), 100), vocab_size=1024, max_token_length=24)
  tokens, targets = testbed.reading_batch(tok, spec, tasks[:4], random.Random(0))
  assert tokens.shape == targets.shape and tokens.shape[1] % 64 == 0 and tokens.dtype == np.int32
  for row, tgt, task in zip(tokens, targets, tasks[:4]):
    assert tok.tokenizer.decode(row[tgt], skip_special_tokens=False) == f"<answer>{task.answer}</answer><|im_end|>"
    # the searched document, which states the answer, comes before it
    assert task.answer in tok.tokenizer.decode(row[: int(np.argmax(tgt))], skip_special_tokens=False)


@pytest.mark.slow
def test_reading_curriculum_writes_a_loadable_policy(testbed, tmp_path, monkeypatch):
  """In the slow tier (a benchmark's curriculum trains and is reloaded, about 12 s): its batches are checked in the
  default suite (test_reading_batch_targets_only_each_answer)."""
  from jaxcredit import models

  monkeypatch.setattr(testbed, "READ_BATCH", 2)
  monkeypatch.setattr(testbed, "READ_WORLD_STEPS", 2)
  args = types.SimpleNamespace(
    tokenizer_tasks=50, vocab_size=512, max_token_length=24, hidden=64, layers=1, init_seed=0, task="search"
  )
  policy = testbed.build_policy(str(tmp_path / "init"), args)
  out = testbed.reading_curriculum(policy, str(tmp_path / "read"), steps=3, lr=1e-3)
  record = json.load(open(os.path.join(out, "read_losses.json")))
  assert len(record["losses"]) == 3 and all(np.isfinite(record["losses"])) and record["world_steps"] == 2
  # The untrained policy predicts the answer tokens about uniformly over its vocabulary.
  assert abs(record["losses"][0] - np.log(models.load_model(policy)[1].vocab_size)) < 0.5, record
  assert models.load_tokenizer(out).vocab_size == models.load_tokenizer(policy).vocab_size
  assert testbed.reading_curriculum(policy, out, steps=3, lr=1e-3) == out  # done once


def test_set_overrides_parse_as_the_keys_type_and_refuse_bad_items(testbed):
  from jaxcredit.train.config import base_config

  c = testbed.apply_overrides(
    base_config(),
    ["loss.aggregation=seq-mean-token-mean", "optim.learning_rate=3e-4", "train.ppo_epochs=2", "tensorboard=false"],
  )
  assert c.loss.aggregation == "seq-mean-token-mean" and c.optim.learning_rate == 3e-4
  assert c.train.ppo_epochs == 2 and c.tensorboard is False
  for item, message in [
    ("loss.aggregation", "KEY=VALUE"),
    ("loss.nope=1", "no key 'loss.nope'"),
    ("train.ppo_epochs=two", "takes int values"),
    ("tensorboard=maybe", "takes bool values"),
  ]:
    with pytest.raises(ValueError, match=message):
      testbed.apply_overrides(base_config(), [item])


def test_difference_from_grpo_is_paired_by_seed_with_a_t_interval(testbed):
  grpo = {"final_success": [0.50, 0.60, 0.40], "seeds_run": [0, 1, 2]}
  trace = {"final_success": [0.55, 0.70, 0.45], "seeds_run": [0, 1, 2]}
  d = testbed.difference_from(grpo, trace)
  # differences 0.05, 0.10, 0.05: mean 0.0667, sample std 0.02887, t(0.975, 2) = 4.3027: half width 0.0717
  assert d["paired_seeds"] == 3 and d["diff"] == pytest.approx(0.2 / 3)
  assert d["ci95"] == pytest.approx([0.2 / 3 - 0.0717, 0.2 / 3 + 0.0717], abs=1e-3)
  other = {"final_success": [0.55, 0.65], "seeds_run": [7, 8]}  # no shared seed: Welch's interval
  w = testbed.difference_from(grpo, other)
  assert w["paired_seeds"] == 0 and w["diff"] == pytest.approx(0.1) and w["ci95"][0] < 0.1 < w["ci95"][1]
  assert testbed.difference_from(grpo, {"final_success": [0.5], "seeds_run": [0]}) is None
  assert testbed.seed_of("runs/x/runs/trace_k0_seed12") == 12


def test_the_testbed_pins_xlas_cpu_vector_extensions_unless_told(testbed, monkeypatch):
  """Runs repeat across x86 CPUs only where XLA's CPU code uses the same vector extensions: --xla-cpu-isa (AVX2 by
  default) becomes --xla_cpu_max_isa in XLA_FLAGS, beside the flags there; one already there, or '', is kept."""
  monkeypatch.setenv("XLA_FLAGS", "--xla_force_host_platform_device_count=2")
  testbed.pin_cpu_isa("AVX2")
  assert os.environ["XLA_FLAGS"] == "--xla_force_host_platform_device_count=2 --xla_cpu_max_isa=AVX2"
  testbed.pin_cpu_isa("AVX512")
  assert os.environ["XLA_FLAGS"].count("--xla_cpu_max_isa") == 1
  monkeypatch.delenv("XLA_FLAGS")
  testbed.pin_cpu_isa("")
  assert "XLA_FLAGS" not in os.environ
