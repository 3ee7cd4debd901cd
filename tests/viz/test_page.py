"""The credit viewer's data and HTML (jaxcredit.viz.page), without a browser (tests/viz/test_viewer_browser.py opens
the pages in Chromium)."""

import json
import re

import pytest

from jaxcredit.viz import page
from tests.fixtures.viewer_records import byte_decode, credited, record


def test_token_pieces_give_a_split_character_to_the_token_that_completes_it():
  text = "a é€ b"
  ids = list(text.encode("utf-8"))
  pieces = page.token_pieces(byte_decode, ids)
  assert len(pieces) == len(ids)
  assert "".join(pieces) == text
  # é is 2 bytes, € 3: the first byte(s) show nothing, the last the whole character.
  assert pieces[2:4] == ["", "é"] and pieces[4:7] == ["", "", "€"]
  # A sequence that ends inside a character keeps the replacement character rather than dropping tokens.
  assert page.token_pieces(byte_decode, ids[:3]) == ["a", " ", "\ufffd"]


def test_rollout_view_collects_hover_series_charts_marks_and_texts():
  adv = [0, 0, 0.5, -1.0, 0, 2.0, 0.25, -0.5]
  trace = credited(
    adv,
    passes={
      "gold_answer": {
        "gold_logp_BxT1": [-3.0, -2.0, 0.0],
        "boundary_mask_BxT1": [True, True, False],
        "valid_B": True,
        "reasons": "",
      }
    },
    credit_details={"state_value_BxT1": [0.0, 1.0, None], "td_reward_BxT": [1.0, None]},
  )
  gear = credited(
    [0, 0, 1, 1, 0, 1, 1, 1],
    passes={
      "teacher_divergence": {"logp_BxL": [None] * 2 + [-0.4] * 6, "divergence_BxL": [0.0] * 8, "reasons": "no_context"}
    },
    credit_details={"segment_start_BxL": [-1, -1, 2, 2, -1, -1, 6, 6]},
  )
  hsd = credited([0] * 8, passes={"teacher_peer": {"peer_B": 3, "skills": "", "reasons": ""}})
  pieces = [f"<{i}>" for i in range(8)]
  view = page.rollout_view(
    record(), pieces, {"trace": trace, "gear": gear, "hsd": hsd}, peer_ids={"hsd": ["a", "b", "c", "step4_3"]}, step=4
  )
  tr, ge, hs = view["methods"]
  assert tr["scale"] == 2.0  # the largest |advantage| on an action token
  assert [c["label"].split(" ")[0] for c in tr["charts"]] == ["turn", "gold", "state", "TD"]
  assert tr["charts"][2]["values"] == [0.0, 1.0, None]
  assert tr["charts"][1]["values"] == [-3.0, -2.0, None]  # the invalid boundary's 0.0 is no log-prob
  assert ge["marks"]["segment"] == [False, False, True, True, False, False, True, True]
  assert ge["marks"]["segment_start"] == [False, False, True, False, False, False, True, False]
  assert [h["label"] for h in ge["hover"]] == [
    "teacher log-prob (teacher_divergence)",
    "teacher/policy divergence (teacher_divergence)",
  ]
  assert {"label": "teacher_divergence: pass invalid", "text": "no_context"} in ge["texts"]
  assert hs["texts"] == [
    {"label": "peer rollout (the teacher's extra context)", "text": "step4_3", "link": "step4_3.html"}
  ]
  assert view["tool_calls"] == ['calc({"x": 1})']


def test_rollout_view_shows_sgcd_summary_siblings_and_credit_weights():
  """SGCD's tab: the group's sibling summary, links to the two siblings it compared, its weights on hover and as
  raised / lowered marks; a rollout of a group without both outcomes says so."""
  passes = {
    "sibling_summary": {
      "summaries": "Step 1 decided it: the success called calc(17*3); the failure guessed.",
      "siblings_Bx2": [1, 2],
      "success_B": False,
      "reasons": "",
    },
    "teacher_sibling": {"divergence_BxL": [None, None, 0.5, 0.1, None, 0.9, 0.0, 0.2], "reasons": ""},
  }
  weights = [None, None, 1.5, 0.5, None, 2.0, 1.0, 0.8]
  sgcd = credited(
    [0, 0, -0.75, -0.25, 0, -1.0, -0.5, -0.4], passes=passes, credit_details={"credit_weight_BxL": weights}
  )
  ids = ["step2_0", "step2_1", "step2_2", "step2_3"]
  view = page.rollout_view(record(), [str(i) for i in range(8)], {"sgcd": sgcd}, peer_ids={"sgcd": ids}, step=2)
  (tab,) = view["methods"]
  texts = {t["label"]: t for t in tab["texts"]}
  assert texts["sibling-contrast credit reference (the teacher's extra context)"]["text"].startswith("Step 1")
  assert texts["successful sibling (summarised for the teacher)"]["link"] == "step2_1.html"
  assert texts["failed sibling (summarised for the teacher)"]["text"] == "step2_2"
  assert texts["this rollout's outcome"]["text"] == "failure"
  assert texts["credit weights"]["text"] == "2 of 5 scored tokens raised, 2 lowered; from 0.5 to 2"
  assert {"label": "SGCD credit weight (credit)", "values": weights} in tab["hover"]
  assert tab["marks"]["raised"] == [False, False, True, False, False, True, False, False]
  assert tab["marks"]["lowered"] == [False, False, False, True, False, False, False, True]
  assert '"raised": [false, false, true, false, false, true, false, false]' in page.rollout_page(view)

  passes["sibling_summary"].update(summaries="", siblings_Bx2=[-1, -1], reasons="not_mixed")
  sgcd = credited([0.0] * 8, passes=passes)
  (tab,) = page.rollout_view(record(), [str(i) for i in range(8)], {"sgcd": sgcd})["methods"]
  labels = [t["label"] for t in tab["texts"]]
  assert "siblings" in labels and "sibling_summary: pass invalid" in labels and "raised" not in tab["marks"]


def test_rollout_view_refuses_mismatched_lengths():
  with pytest.raises(ValueError, match="7 token pieces for 8 tokens"):
    page.rollout_view(record(), ["x"] * 7, {"grpo": credited([0.0] * 8)})
  with pytest.raises(ValueError, match="method 'grpo': 6 advantages for 8 tokens"):
    page.rollout_view(record(), ["x"] * 8, {"grpo": credited([0.0] * 6)})
  with pytest.raises(ValueError, match="no methods"):
    page.rollout_view(record(), ["x"] * 8, {})


def test_page_escapes_token_text_and_keeps_the_data_script_closed():
  pieces = ["<b>", "</script><script>alert(1)</script>", "&", "<!--<script>", "y", "z", "w", "v"]
  html = page.rollout_page(page.rollout_view(record(), pieces, {"grpo": credited([0.0, 0, 1, 1, 0, 1, 1, 1])}))
  assert "&lt;b&gt;" in html and "<script>alert" not in html.split('<script id="data"')[0]
  data = re.search(r'<script id="data" type="application/json">(.*?)</script>', html, re.S).group(1)
  assert json.loads(data)["pieces"] == pieces  # the JSON survives, "</" escaped inside it
  # One span per token, action tokens marked, and turn and boundary markers in between.
  assert len(re.findall(r'class="tok[^"]*" data-i="\d+"', html)) == 8
  assert len(re.findall(r'class="tok act"', html)) == 5
  assert html.count('class="mark turn"') == 2 and html.count('class="mark bd"') == 2


def test_write_rollout_pages_writes_an_index_linking_every_page(tmp_path):
  a, b = record("step3_0"), record("step3/1")
  index = page.write_rollout_pages(
    str(tmp_path),
    {
      "grpo": [credited([0.0] * 8) | a, credited([0.0] * 8) | b],
      "rloo": [a | credited([1.0] * 8), b | credited([1.0] * 8)],
    },
    byte_decode,
    step=3,
  )
  files = sorted(p.name for p in tmp_path.iterdir())
  assert files == ["index.html", "step3_0.html", "step3_1.html"]
  text = open(index).read()
  assert 'href="step3_0.html"' in text and 'href="step3_1.html"' in text and "grpo, rloo" in text
  with pytest.raises(ValueError, match="credited other rollouts"):
    page.write_rollout_pages(str(tmp_path), {"grpo": [a], "rloo": [b]}, byte_decode)


def test_rollout_ids_that_share_a_page_name_are_refused_before_anything_is_written(tmp_path):
  a, b = record("x/1"), record("x_1")
  views = [page.rollout_view(r, ["t"] * 8, {"grpo": credited([0.0] * 8)}) for r in (a, b)]
  with pytest.raises(ValueError, match="'x/1' and 'x_1' give the same page name 'x_1.html'"):
    page.write_pages(str(tmp_path / "out"), views)
  assert not (tmp_path / "out").exists()


def test_page_names_are_never_hidden_or_the_index():
  assert page.page_name("step3_0") == "step3_0.html" and page.page_name("a/b") == "a_b.html"
  assert page.page_name("index") == "rollout_index.html"
  assert page.page_name("..") == "rollout_...html" and page.page_name("") == "rollout_.html"


def test_a_rollout_with_tokens_the_engine_gave_no_logprob_is_marked():
  """Issue 35 case 11 (viewer): a rollout flagged `engine_invalid_logp_tokens` shows it on its page and in the
  index; the tokens' sampler log-prob reads as none."""
  flagged = record() | {"engine_invalid_logp_tokens": 1}
  flagged["behavior_logprobs"] = [0, 0, -0.5, None, 0, -0.1, -2.0, -0.3]
  view = page.rollout_view(flagged, ["x"] * 8, {"grpo": credited([0.0] * 8)})
  assert view["engine_invalid_logp_tokens"] == 1 and view["behavior_logp"][3] is None
  html = page.rollout_page(view)
  assert 'class="warn"' in html and "1 token without an engine log-prob (left out of the loss)" in html
  index = page.index_page([view])
  assert 'class="warn"' in index
  plain = page.rollout_view(record(), ["x"] * 8, {"grpo": credited([0.0] * 8)})
  assert plain["engine_invalid_logp_tokens"] == 0
  assert 'class="warn"' not in page.rollout_page(plain) and 'class="warn"' not in page.index_page([plain])
