"""Search QA environment: BM25 retrieval, the generated fictional corpus (every hop retrievable), answer
normalisation, tool errors, truncation, think blocks, the call budget, BrowseComp-Plus loaders, the EnvSpec."""

import base64
import collections
import hashlib
import json
import random
import re

import pytest

from jaxcredit.envs import search as se
from jaxcredit.envs import tool_calls as tc


def _search(query):
  return tc.render_tool_call("search", {"query": query})


def _open(docid):
  return tc.render_tool_call("open", {"docid": docid})


def _docids(observation):
  return re.findall(r"docid: (\S+)\ntitle:", observation)


def _responses(observation):
  return re.findall(r"<tool_response>(.*?)</tool_response>", observation, flags=re.S)


DOCS = [
  se.Document("d1", "Orvane Holdings", "Orvane Holdings is a shipping company founded by Tamsin Korvel in 1894."),
  se.Document("d2", "Orvane Shipping", "Orvane Shipping is a rival firm. It was founded in 1897 in Kelmarsh."),
  se.Document("d3", "Tamsin Korvel", "Tamsin Korvel was born in Kelmarsh. Korvel worked as a surveyor."),
  se.Document("d4", "Kelmarsh", "Kelmarsh is a river town on the Velsa. Kelmarsh holds a market."),
  se.Document("d5", "Veltrana Bridge", "The Veltrana Bridge was built by Orvane Holdings and completed in 1873."),
  se.Document("long", "Long Chronicle", "chronicle " + "x" * 5000),
]
TASK = se.SearchTask(
  "q1",
  "What river flows through the birthplace of the founder of Orvane Holdings?",
  "Velsa",
  aliases=("River Velsa",),
  evidence_docids=("d1", "d3", "d4"),
)


@pytest.fixture(scope="module")
def index():
  return se.SearchIndex(DOCS)


@pytest.fixture(scope="module")
def spec():
  return se.env_spec({})  # the generated corpus with the defaults (what a plain run gets)


@pytest.fixture(scope="module")
def small():
  return se.make_fictional_corpus(7, 60, num_eval=20)


# --- retrieval ---------------------------------------------------------------------------------------------------


def test_bm25_title_query_returns_its_document_first(index):
  for doc in DOCS:
    hits = index.search(doc.title, k=3)
    assert hits[0][0].docid == doc.docid, doc.title
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
  # "Orvane" alone ties both firms above everything else; "Holdings" breaks the tie
  assert {d.docid for d, _ in index.search("Orvane", k=2)} == {"d1", "d2"}
  assert index.search("founder Korvel Kelmarsh", k=1)[0][0].docid == "d3"


def test_bm25_no_shared_terms_and_large_k(index):
  assert index.search("zzzq qqqz", k=5) == []
  assert index.search("the of and", k=5) == []  # stopwords only
  assert len(index.search("Kelmarsh", k=100)) == 3  # k past the corpus; zero-score documents left out
  assert index.get("d4").title == "Kelmarsh" and index.get("nope") is None


def test_index_refuses_duplicate_docids_and_empty_corpus():
  with pytest.raises(ValueError, match="'a' occurs twice"):
    se.SearchIndex([se.Document("a", "", "x y"), se.Document("a", "", "z w")])
  with pytest.raises(ValueError, match="no documents"):
    se.SearchIndex([])


def test_stemmer_without_pystemmer_is_refused_with_the_fix():
  try:
    import Stemmer  # noqa: F401

    pytest.skip("PyStemmer is installed")
  except ImportError:
    pass
  with pytest.raises(ValueError, match="PyStemmer"):
    se.SearchIndex(DOCS, stemmer="english")


# --- the generated corpus ----------------------------------------------------------------------------------------


def test_every_generated_hop_is_retrievable_and_the_gold_chain_scores_1(spec):
  tasks = spec.make_tasks("eval", 128, None) + spec.make_tasks("train", 1000, 0)
  assert len({t.query_id for t in tasks}) == 1128
  for task in tasks:
    env = spec.make_env(task)
    assert 1 <= len(task.chain) <= 4 and [h.docid for h in task.chain] == list(task.evidence_docids)
    for hop in task.chain:
      obs = env.step(_search(hop.query)).observation
      assert hop.docid in _docids(obs), (task.query_id, hop.query)
      text = env.step(_open(hop.docid)).observation
      assert hop.reveals in text and hop.fact in text, (task.query_id, hop)
    assert hop.reveals == task.answer
    result = env.step(tc.render_answer(task.answer))
    assert result.done and env.reward() == 1.0 and spec.is_success(env.reward())
    assert env.evidence_found() == 1.0


def test_generated_questions_hops_splits_and_distractors(spec):
  eval_tasks, train = spec.make_tasks("eval", 128, None), spec.make_tasks("train", 1000, 0)
  hops = collections.Counter(len(t.chain) for t in train)
  assert hops == {1: 250, 2: 250, 3: 250, 4: 250}
  # each hop's query names the entity of that hop's document, and it is what the previous hop revealed
  for t in train[:200]:
    assert t.chain[0].query in t.query
    for a, b in zip(t.chain, t.chain[1:]):
      assert a.reveals == b.query
  # held-out chains live in a disjoint part of the world
  assert not {d for t in eval_tasks for d in t.evidence_docids} & {d for t in train for d in t.evidence_docids}
  assert all(t.split == "eval" for t in eval_tasks) and all(t.split == "train" for t in train)
  # distractors: about 30% of companies and works have a look-alike (same stem, another kind word)
  docs = spec.make_env(train[0]).index.docs
  kinds = set(se._COMPANY_KINDS) | set(se._WORK_KINDS)
  stems = collections.Counter(d.title.split()[0] for d in docs if d.title.split()[-1] in kinds)
  originals = sum(stems.values()) - sum(n > 1 for n in stems.values())
  assert 0.2 * originals < sum(n > 1 for n in stems.values()) < 0.4 * originals


def test_generated_answers_and_aliases(small):
  docs, tasks = small
  by_id = {d.docid: d for d in docs}
  dates = [t for t in tasks if t.query.startswith("On what date")]
  assert dates, "no birth-date question"
  for t in dates:
    day, month, year = t.answer.split()
    assert t.aliases == (f"{month} {day}, {year}", f"{year}-{se._MONTHS.index(month) + 1:02d}-{int(day):02d}")
  for t in tasks:
    assert t.answer in by_id[t.evidence_docids[-1]].text
    assert t.query.endswith("?") and t.query[0].isupper()


def test_generated_corpus_is_deterministic(small):
  docs, tasks = small
  assert se.make_fictional_corpus(7, 60, num_eval=20) == (docs, tasks)
  other_docs, other_tasks = se.make_fictional_corpus(8, 60, num_eval=20)
  assert [t.query for t in other_tasks] != [t.query for t in tasks]
  assert len(tasks) == 60 and [t.split for t in tasks] == ["eval"] * 20 + ["train"] * 40
  assert len({d.docid for d in docs}) == len(docs) and [d.docid for d in docs] == sorted(d.docid for d in docs)


def test_generated_corpus_argument_checks():
  with pytest.raises(ValueError, match="min_hops"):
    se.make_fictional_corpus(0, 10, min_hops=3, max_hops=2)
  with pytest.raises(ValueError, match="num_eval"):
    se.make_fictional_corpus(0, 10, num_eval=11)
  _, tasks = se.make_fictional_corpus(0, 12, min_hops=2, max_hops=2)
  assert {len(t.chain) for t in tasks} == {2}


# --- answers -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
  "text,norm",
  [
    ("The Veltrana Bridge", "veltrana bridge"),
    ("  a   Cat. ", "cat"),
    ("An apple, the pear!", "apple pear"),
    ("O’Brien", "obrien"),
    ("O'Brien", "obrien"),
    ("Theatre of Anne", "theatre of anne"),  # articles only as whole words
    ("3 May, 1841", "3 may 1841"),
    ("", ""),
  ],
)
def test_normalize_answer(text, norm):
  assert se.normalize_answer(text) == norm


def test_answer_matches_gold_or_alias():
  assert se.answer_matches("the river velsa.", "Velsa", ("River Velsa",))
  assert se.answer_matches("VELSA", "Velsa")
  assert not se.answer_matches("Velsa River", "Velsa", ("River Velsa",))
  assert not se.answer_matches("Velsa river town", "Velsa")
  assert not se.answer_matches("the", "a")  # both normalise to ""


@pytest.mark.parametrize(
  "answer,reward",
  [
    ("<answer>the River Velsa</answer>", 1.0),
    ("<answer>Velsa.</answer>", 1.0),
    ("<answer>Kelmarsh</answer>", 0.0),
    ("I think Velsa.", 0.0),
  ],
)
def test_env_reward_from_the_final_message(index, answer, reward):
  env = se.SearchEnv(TASK, index)
  result = env.step(answer)
  assert result.done and result.observation is None
  assert env.reward() == reward
  assert result.info["finish"] == ("answer" if "<answer>" in answer else "no_answer")


# --- the environment ---------------------------------------------------------------------------------------------


def test_search_and_open_observations(index):
  env = se.SearchEnv(TASK, index, top_k=2, snippet_chars=20)
  result = env.step("Let me look.\n" + _search("Orvane Holdings founder"))
  assert not result.done and result.role == "tool"
  assert result.observation == (
    "<tool_response>docid: d1\ntitle: Orvane Holdings\nsnippet: Orvane Holdings is a...\n\n"
    "docid: d5\ntitle: Veltrana Bridge\nsnippet: The Veltrana Bridge...</tool_response>"
  )  # "Orvane Holdings" in text
  result = env.step(_open("d3") + _search("Kelmarsh"))
  first, second = _responses(result.observation)
  assert first == "docid: d3\ntitle: Tamsin Korvel\n\n" + DOCS[2].text
  assert _docids(second)[0] == "d4"
  assert result.info | {} == {
    "tool_calls": 3,
    "tool_errors": 0,
    "answered": False,
    "budget_exhausted": False,
    "turns": 2,
    "finish": None,
    "answer": None,
    "searches": 2,
    "opens": 1,
  }
  assert env.evidence_found() == 1.0  # d1 and d4 seen in results, d3 opened


def test_malformed_calls_and_unknown_docids_become_error_observations(index):
  env = se.SearchEnv(TASK, index)
  text = "".join(
    [
      "<tool_call>{not json}</tool_call>",
      tc.render_tool_call("browse", {"url": "x"}),
      tc.render_tool_call("search", {}),
      tc.render_tool_call("open", {"docid": 4}),
      _open("d999"),
      _search("   "),
      tc.render_tool_call("search", {"query": "Kelmarsh", "k": 3}),
    ]
  )
  result = env.step(text)
  contents = _responses(result.observation)
  assert len(contents) == 7 and all(c.startswith("error: ") for c in contents)
  assert "not valid JSON" in contents[0]
  assert contents[1] == "error: unknown tool 'browse'; available: open, search"
  assert contents[2] == "error: search: missing required argument(s): 'query'"
  assert contents[3] == "error: open: argument 'docid' must be of type string, got int"
  assert contents[4] == "error: unknown docid 'd999'; use a docid from the search results"
  assert contents[5] == 'error: search needs a non-empty "query"'
  assert "unexpected argument(s): 'k'" in contents[6]
  assert not result.done
  assert (result.info["tool_calls"], result.info["tool_errors"], result.info["searches"], result.info["opens"]) == (
    7,
    7,
    1,
    1,
  )  # dispatched: the blank search and the unknown docid
  assert env.seen_docids == set()


def test_no_results_is_not_an_error(index):
  env = se.SearchEnv(TASK, index)
  result = env.step(_search("qqqz zzzq"))
  assert result.observation == "<tool_response>no results for 'qqqz zzzq'</tool_response>"
  assert result.info["tool_errors"] == 0


def test_long_documents_are_truncated_with_the_marker(index):
  env = se.SearchEnv(TASK, index, max_output_chars=100)
  content = _responses(env.step(_open("long")).observation)[0]
  full = "docid: long\ntitle: Long Chronicle\n\n" + DOCS[5].text
  assert content == full[:100] + tc.TRUNCATION_MARKER.format(n=len(full) - 100)
  assert env.info["tool_errors"] == 0
  # search output is cut the same way
  full = _responses(se.SearchEnv(TASK, index).step(_search("Kelmarsh Orvane Korvel")).observation)[0]
  content = _responses(env.step(_search("Kelmarsh Orvane Korvel")).observation)[0]
  assert len(full) > 100 and content == full[:100] + tc.TRUNCATION_MARKER.format(n=len(full) - 100)


def test_calls_inside_think_blocks_do_not_run(index):
  env = se.SearchEnv(TASK, index)
  result = env.step("<think>maybe " + _search("Kelmarsh") + "</think>" + tc.render_answer("Velsa"))
  assert result.done and result.info["tool_calls"] == 0 and result.info["answered"]
  env = se.SearchEnv(TASK, index)
  result = env.step("<think>" + _search("Kelmarsh") + "</think>I am not sure.")
  assert result.done and result.info["finish"] == "no_answer" and result.info["tool_calls"] == 0
  # an opened think block the template started: the text before </think> is thinking too
  env = se.SearchEnv(TASK, index)
  result = env.step(_open("d1") + "</think>" + _search("Kelmarsh"))
  assert _docids(result.observation)[0] == "d4" and result.info["opens"] == 0
  # an unclosed block: nothing runs, the model is told
  result = env.step("<think>" + _search("Kelmarsh"))
  assert not result.done and result.observation.startswith("<tool_response>error: unclosed <think> block")
  assert result.info["tool_calls"] == 1 and result.info["tool_errors"] == 1


def test_call_budget(index):
  env = se.SearchEnv(TASK, index, max_tool_calls=2)
  result = env.step(_search("Kelmarsh") + _search("Korvel") + _search("Orvane") + tc.render_answer("Velsa"))
  contents = _responses(result.observation)
  assert not result.done and len(contents) == 3
  assert contents[2] == "error: not run: the budget of 2 tool calls is used up; give your answer"
  assert (result.info["tool_calls"], result.info["tool_errors"], result.info["answered"]) == (2, 1, False)
  result = env.step(_open("d4"))
  assert result.done and result.info["budget_exhausted"] and result.info["finish"] == "tool_budget"
  assert env.reward() == 0.0
  with pytest.raises(RuntimeError):
    env.step(tc.render_answer("Velsa"))


# --- loaders -----------------------------------------------------------------------------------------------------

CORPUS_ROWS = [
  {
    "docid": 101,
    "text": "---\ntitle: Orvane Holdings\n---\nOrvane Holdings was founded by Tamsin Korvel.",
    "url": "u1",
  },
  {"docid": "102", "text": "# Tamsin Korvel\n\nTamsin Korvel was born in Kelmarsh.", "url": "u2"},
  {"docid": "103", "text": "Kelmarsh\nKelmarsh lies on the river Velsa.", "url": "u3"},
  {"docid": "104", "title": "Unrelated", "text": "Copper wire and glassware.", "url": "u4"},
]
QUERY_ROWS = [
  {
    "query_id": "1",
    "query": "Which river flows through the birthplace of the founder of Orvane Holdings?",
    "answer": "Velsa",
    "evidence_docs": [{"docid": "101", "text": "...", "url": "u1"}, {"docid": "102"}],
    "gold_docs": [{"docid": "103"}],
    "negative_docs": [{"docid": "104"}],
  },
  {
    "query_id": "2",
    "query": "Where was Tamsin Korvel born?",
    "answer": "Kelmarsh",
    "evidence_docs": [{"docid": "102"}],
    "gold_docs": [],
  },
  {
    "query_id": "3",
    "query": "What does the unrelated document list?",
    "answer": "copper wire",
    "evidence_docs": [{"docid": "104"}],
    "gold_docs": [{"docid": "104"}],
  },
]


def _jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def test_load_jsonl_maps_browsecomp_plus_fields(tmp_path):
  docs = se.load_corpus(_jsonl(tmp_path / "corpus.jsonl", CORPUS_ROWS))
  assert [(d.docid, d.title) for d in docs] == [
    ("101", "Orvane Holdings"),
    ("102", "Tamsin Korvel"),
    ("103", "Kelmarsh"),
    ("104", "Unrelated"),
  ]
  assert docs[2].text == "Kelmarsh\nKelmarsh lies on the river Velsa."
  tasks = se.load_queries(_jsonl(tmp_path / "queries.jsonl", QUERY_ROWS))
  assert tasks[0] == se.SearchTask("1", QUERY_ROWS[0]["query"], "Velsa", evidence_docids=("101", "102", "103"))
  assert tasks[2].evidence_docids == ("104",)


def test_load_datasets_folders(tmp_path):
  import datasets

  datasets.Dataset.from_list(
    [dict(r, docid=str(r["docid"]), title=r.get("title", "")) for r in CORPUS_ROWS]
  ).save_to_disk(str(tmp_path / "corpus"))
  datasets.DatasetDict({"test": datasets.Dataset.from_list(QUERY_ROWS[:2])}).save_to_disk(str(tmp_path / "queries"))
  docs = se.load_corpus(str(tmp_path / "corpus"))
  assert [d.title for d in docs] == ["Orvane Holdings", "Tamsin Korvel", "Kelmarsh", "Unrelated"]  # "" -> derived
  tasks = se.load_queries(str(tmp_path / "queries"))
  assert [(t.query_id, t.answer, t.evidence_docids) for t in tasks] == [
    ("1", "Velsa", ("101", "102", "103")),
    ("2", "Kelmarsh", ("102",)),
  ]
  datasets.DatasetDict(
    {"a": datasets.Dataset.from_list(QUERY_ROWS[:1]), "b": datasets.Dataset.from_list(QUERY_ROWS[1:2])}
  ).save_to_disk(str(tmp_path / "two"))
  with pytest.raises(ValueError, match=r"splits \['a', 'b'\]"):
    se.load_queries(str(tmp_path / "two"))


@pytest.mark.parametrize(
  "loader,rows,field",
  [
    ("load_corpus", [{"docid": "1", "text": "ok"}, {"docid": "2", "body": "no text"}], "'text'"),
    ("load_corpus", [{"text": "no id"}], "'docid'"),
    ("load_queries", [{"query_id": "1", "query": "Who?"}], "'answer'"),
    ("load_queries", [{"query_id": "1", "answer": "x"}], "'query'"),
  ],
)
def test_loader_refuses_a_missing_field_naming_it(tmp_path, loader, rows, field):
  path = _jsonl(tmp_path / "f.jsonl", rows)
  with pytest.raises(ValueError, match=f"record {len(rows) - 1} has no {field} field"):
    getattr(se, loader)(path)


def test_loader_refuses_encrypted_queries_and_bad_json(tmp_path):
  canary = "BENCHMARK DATA SHOULD NEVER APPEAR AS PLAIN TEXT ONLINE. canary GUID browsecomp:0000"

  def encrypt(text):  # the Hub's obfuscation: XOR with the repeated SHA-256 of the canary, base64
    data = text.encode()
    key = hashlib.sha256(canary.encode()).digest()
    return base64.b64encode(bytes(b ^ key[i % len(key)] for i, b in enumerate(data))).decode()

  rows = [{"query_id": "7", "query": encrypt("Who founded Orvane Holdings?"), "answer": encrypt("Tamsin Korvel")}]
  with pytest.raises(ValueError, match="looks encrypted.*decrypt_dataset.py"):
    se.load_queries(_jsonl(tmp_path / "enc.jsonl", rows))
  (tmp_path / "bad.jsonl").write_text('{"docid": "1", "text": "x"}\n{oops\n')
  with pytest.raises(ValueError, match="line 2 is not JSON"):
    se.load_corpus(str(tmp_path / "bad.jsonl"))
  with pytest.raises(FileNotFoundError):
    se.load_corpus(str(tmp_path / "missing.jsonl"))


def test_env_spec_on_loaded_data_with_demonstrations(tmp_path):
  corpus = _jsonl(tmp_path / "corpus.jsonl", CORPUS_ROWS)
  queries = _jsonl(tmp_path / "queries.jsonl", QUERY_ROWS)
  spec = se.env_spec({"corpus": corpus, "queries": queries, "eval_size": 1, "top_k": 2})
  train, held_out = spec.make_tasks("train", 4, 0), spec.make_tasks("eval", 1, None)
  assert len(held_out) == 1 and held_out[0].query_id not in {t.query_id for t in train}
  assert sorted({t.query_id for t in train}) == sorted({"1", "2", "3"} - {held_out[0].query_id})
  for task in train + held_out:
    messages = spec.demonstration(task, random.Random(0))
    env = spec.make_env(task)
    for m in messages:
      if m["role"] == "assistant":
        result = env.step(m["content"])
    assert result.done and env.reward() == 1.0 and env.evidence_found() == 1.0
  task = next(t for t in train + held_out if t.query_id == "1")
  messages = spec.demonstration(task, random.Random(0))
  assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
  assert messages[2]["content"].count("<tool_call>") == 3  # one search per evidence document, in one message
  assert messages[-1]["content"] == "<answer>Velsa</answer>"
  info = spec.privileged_info(task)
  assert "<answer>Velsa</answer>" in info and "[101] Orvane Holdings" in info and "[103] Kelmarsh" in info


def test_loaded_demonstration_refuses_unretrievable_evidence(tmp_path):
  corpus = _jsonl(tmp_path / "corpus.jsonl", CORPUS_ROWS)
  rows = [dict(QUERY_ROWS[1], query_id=str(i), evidence_docs=[{"docid": "missing"}]) for i in range(3)]
  spec = se.env_spec({"corpus": corpus, "queries": _jsonl(tmp_path / "q.jsonl", rows), "eval_size": 1})
  with pytest.raises(ValueError, match="no evidence document is found"):
    spec.demonstration(spec.make_tasks("train", 1, 0)[0], random.Random(0))


# --- the EnvSpec -------------------------------------------------------------------------------------------------


def test_env_spec_fields(spec):
  assert spec.stop_strings == ("</answer>",) and spec.max_turns == se.MAX_TOOL_CALLS + 1
  assert se.env_spec({"stop_at_answer": False}).stop_strings == ()
  assert spec.is_success(1.0) and not spec.is_success(0.0)
  task = spec.make_tasks("eval", 1, None)[0]
  assert [s["function"]["name"] for s in spec.tools(task)] == ["search", "open"]
  system, user = spec.initial_messages(task)
  assert user == {"role": "user", "content": task.query}
  assert "at most 8 tool calls" in system["content"] and '"name": "open"' in system["content"]
  assert spec.gold_answer_text(task) == f"<answer>{task.answer}</answer>"
  info = spec.privileged_info(task)
  assert f"<answer>{task.answer}</answer>" in info and all(h.fact in info for h in task.chain)


def test_make_tasks_splits(spec):
  eval64 = spec.make_tasks("eval", 64, None)
  assert spec.make_tasks("eval", 10, None) == eval64[:10] and spec.make_tasks("eval", 64, None) == eval64
  train = spec.make_tasks("train", 2500, 3)
  assert spec.make_tasks("train", 2500, 3) == train
  assert len({t.query_id for t in train[:1000]}) == 1000  # one pass over the pool before any repeat
  assert train[:1000] != train[1000:2000]  # the second pass is reshuffled
  assert {t.query_id for t in train[:1000]} == {t.query_id for t in train[1000:2000]}
  assert spec.make_tasks("train", 50, 4) != train[:50]
  with pytest.raises(ValueError, match="eval_size"):
    spec.make_tasks("eval", 129, None)
  with pytest.raises(ValueError, match="seed=None"):
    spec.make_tasks("eval", 1, 0)


def test_hash_split_does_not_depend_on_file_order():
  tasks = [se.SearchTask(str(i), f"q{i}", "a") for i in range(50)]
  train, held = se.split_tasks(tasks, 10)
  train2, held2 = se.split_tasks(tasks[::-1], 10)
  assert held == held2 and train == train2 and len(held) == 10 and not set(held) & set(train)


def test_generated_demonstrations_reach_reward_1_within_the_budget(spec):
  rng = random.Random(0)
  tasks = spec.make_tasks("eval", 128, None) + spec.make_tasks("train", 300, 1)
  opened = 0
  for task in tasks:
    messages = spec.demonstration(task, rng)
    env = spec.make_env(task)
    for m in messages[2:]:
      if m["role"] == "assistant":
        result = env.step(m["content"])
      else:
        assert m["content"] == result.observation  # exactly what the environment returns
    assert result.done and env.reward() == 1.0 and result.info["tool_calls"] <= se.MAX_TOOL_CALLS
    opened += result.info["opens"]
  assert opened == sum(len(t.chain) for t in tasks)  # the default budget opens every hop's document
  # a tight budget (one call per hop): searches only, and only where the snippet shows the hop's fact
  tight = se.env_spec({"max_tool_calls": 4})
  made = four_hops = 0
  for task in tasks:
    try:
      messages = tight.demonstration(task, rng)
    except ValueError as e:
      assert "needs an open" in str(e)
      continue
    made += 1
    calls = sum(m["content"].count("<tool_call>") for m in messages if m["role"] == "assistant")
    assert calls <= 4 and (len(task.chain) < 4 or calls == 4)
    four_hops += len(task.chain) == 4
  assert made > 0 and four_hops > 0


def test_env_spec_config_errors(tmp_path):
  with pytest.raises(ValueError, match="max_tool_calls=2 is below"):
    se.env_spec({"max_tool_calls": 2})
  with pytest.raises(ValueError, match="config.env.search.top_k"):
    se.env_spec({"top_k": 0})
  with pytest.raises(ValueError, match="queries is empty"):
    se.env_spec({"corpus": "x.jsonl"})
  corpus = _jsonl(tmp_path / "corpus.jsonl", CORPUS_ROWS)
  with pytest.raises(ValueError, match="leaves none"):
    se.env_spec({"corpus": corpus, "queries": _jsonl(tmp_path / "q.jsonl", QUERY_ROWS), "eval_size": 3})


def test_metrics(spec, index):
  a, b = se.SearchEnv(TASK, index, top_k=1), se.SearchEnv(TASK, index)
  a.step(_search("Orvane Holdings") + _open("d3"))
  b.step(tc.render_answer("x"))
  assert spec.metrics([a, b]) == {
    "searches": 0.5,
    "opens": 0.5,
    "evidence_found": pytest.approx(1 / 3),  # a: d1 searched, d3 opened, of d1, d3, d4
    "evidence_recall": pytest.approx(1 / 6),  # a: d1 searched
  }
  assert spec.metrics([b]) == {"searches": 0.0, "opens": 0.0, "evidence_found": 0.0, "evidence_recall": 0.0}
  assert spec.metrics([]) == {}


def test_evidence_recall_is_browsecomp_plus_retrieval_recall(index):
  """BrowseComp-Plus's recall (its evaluate_run.py): |search results' docids ∩ evidence| / |evidence|, averaged over
  the rollouts whose task lists evidence; an `open` is not a retrieval."""
  env = se.SearchEnv(TASK, index, top_k=1)
  env.step(_search("Orvane Holdings") + _open("d3"))  # retrieves d1; d3 is read without a search returning it
  assert (env.evidence_recall(), env.evidence_found()) == (pytest.approx(1 / 3), pytest.approx(2 / 3))
  env.step(_search("Kelmarsh") + _search("Tamsin Korvel"))  # retrieves d4, then d3
  assert env.searched_docids == {"d1", "d4", "d3"}
  assert env.evidence_recall() == 1.0
  no_evidence = se.SearchEnv(se.SearchTask("q2", "Who?", "Nobody"), index, top_k=1)
  no_evidence.step(_search("Kelmarsh"))
  assert no_evidence.evidence_recall() is None
  assert se.metrics([env, no_evidence])["evidence_recall"] == 1.0  # the task without evidence is left out
  assert se.metrics([env, no_evidence])["searches"] == 2.0  # 3 + 1 searches over 2 rollouts


def _squad_normalize(s):
  """SQuAD v1.1's evaluate-v1.1.py `normalize_answer`: lower, drop string.punctuation, drop articles, fix spaces."""
  import string

  s = "".join(ch for ch in s.lower() if ch not in set(string.punctuation))
  return " ".join(re.sub(r"\b(a|an|the)\b", " ", s).split())


@pytest.mark.parametrize(
  "text", ["The River Velsa.", "  an   Orvane-Holdings!  ", "A.B.C. the theory", "Kelmarsh (1894)", "Théâtre"]
)
def test_normalize_answer_is_squads_on_ascii_punctuation(text):
  assert se.normalize_answer(text) == _squad_normalize(text)


def test_search_only_demonstrations_search_once_per_hop_and_open_is_unknown(index):
  """open_tool=False: one tool, each result carries its document; a demonstration is one search per hop."""
  only = se.env_spec({"open_tool": False, "top_k": 1, "snippet_chars": 700, "max_output_chars": 800, "max_hops": 3})
  system = only.initial_messages(only.make_tasks("eval", 1, None)[0])[0]["content"]
  assert '"name": "search"' in system and '"name": "open"' not in system and "open tool" not in system
  rng = random.Random(0)
  tasks = only.make_tasks("eval", 64, None) + only.make_tasks("train", 200, 1)
  for task in tasks:
    messages = only.demonstration(task, rng)
    env = only.make_env(task)
    for m in messages[2:]:
      if m["role"] == "assistant":
        result = env.step(m["content"])
      else:
        assert m["content"] == result.observation and "\ntext: " in m["content"]
    assert env.reward() == 1.0 and result.info["opens"] == 0
    assert result.info["searches"] == len(task.chain) == result.info["tool_calls"]
    assert env.evidence_found() == 1.0
  # An open call is an unknown tool there; the document text comes whole in the search result.
  env = se.SearchEnv(TASK, index, top_k=1, snippet_chars=2000, open_tool=False)
  obs = env.step(_search("Orvane Holdings") + _open("d3")).observation
  assert "unknown tool" in obs and DOCS[0].text in obs and env.info["opens"] == 0
  # Too short a snippet for the hop's fact: refused with the keys to raise.
  short = se.env_spec({"open_tool": False, "top_k": 1, "snippet_chars": 40, "max_hops": 3})
  with pytest.raises(ValueError, match="raise snippet_chars"):
    for task in tasks[:20]:
      short.demonstration(task, rng)
  with pytest.raises(ValueError, match="open_tool must be True or False"):
    se.env_spec({"open_tool": "no"})
