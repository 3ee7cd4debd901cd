"""The credit viewer's pages in headless Chromium: every action token coloured by its advantage, legend, one tab per
method, tab switches recolour, GEAR's segments and CrEST's direction gate drawn on the tokens, TRACE's values as a
chart, the hover card. A trained run's pages are opened by tests/integration/test_viewer.py."""

from jaxcredit.viz import page

from tests.viz.browser import check_viewer_page
from tests.fixtures.viewer_records import byte_decode, credited, record


def test_a_page_with_three_methods(browser, tmp_path):
  trace = credited(
    [0, 0, 0.5, -1.0, 0, 2.0, 0.25, -0.5],
    passes={"gold_answer": {"gold_logp_BxT1": [-3.0, -2.0, -2.5], "reasons": ""}},
    credit_details={"state_value_BxT1": [0.0, 1.0, 0.5], "td_reward_BxT": [1.0, -0.5]},
  )
  gear = credited(
    [0, 0, 1.0, 1.0, 0, 0.3, 0.3, 0.3],
    passes={"teacher_divergence": {"logp_BxL": [None, None, -0.4, -0.2, None, -1.0, -1.5, -0.1]}},
    credit_details={"segment_start_BxL": [-1, -1, 2, 2, -1, -1, -1, -1]},
  )
  crest = credited(
    [0, 0, -0.2, -0.1, 0, 0, 0, 0],
    passes={"teacher_privileged": {"entropy_BxL": [None, None, 0.1, 2.0, None, 0.5, 0.5, 0.5]}},
    credit_details={"direction_gate_BxL": [False, False, True, False, False, True, True, True]},
  )
  r = record("step5_2")
  r["token_ids"] = list(b"Q:hi<x>A!")[:8]
  r["task_id"] = "<!--<script>"  # would leave the data script unclosed unless "<" is escaped in it
  index = page.write_rollout_pages(
    str(tmp_path), {"trace": [r | trace], "gear": [r | gear], "crest": [r | crest]}, byte_decode, step=5
  )
  p = browser.new_page(viewport={"width": 1200, "height": 700})
  found = check_viewer_page(p, tmp_path / "step5_2.html", tmp_path / "step5_2.png")
  colours = found["colours"]
  assert colours["trace"] != colours["gear"] != colours["crest"]  # switching tabs changed the colours
  # GEAR: tokens 2-3 underlined as one segment starting at 2; CrEST: the direction gate's outline on the open tokens.
  p.locator(".tab", has_text="gear").click()
  assert p.eval_on_selector_all(".tok.seg", "els => els.map(e => +e.dataset.i)") == [2, 3]
  assert p.eval_on_selector_all(".tok.segstart", "els => els.map(e => +e.dataset.i)") == [2]
  p.locator(".tab", has_text="crest").click()
  assert p.eval_on_selector_all(".tok.gate", "els => els.map(e => +e.dataset.i)") == [2, 5, 6, 7]
  assert p.locator(".tok.seg").count() == 0
  # TRACE: the turn advantages, gold log-probs, V_t and TD rewards as charts, one point per value.
  p.locator(".tab", has_text="trace").click()
  assert p.locator("#method svg.chart").count() == 4
  assert p.locator("#method svg.chart").nth(2).locator("circle").count() == 3
  # Hover: the token, its sampler log-prob and the active method's advantage.
  p.locator('.tok[data-i="3"]').hover()
  tip = p.locator("#tip").inner_text()
  assert "id 105" in tip and "sampler log-prob -1.0000" in tip and "advantage (trace) -1.0000" in tip
  p.locator(".tab", has_text="gear").click()
  p.locator('.tok[data-i="6"]').hover()
  assert "teacher log-prob (teacher_divergence) -1.5000" in p.locator("#tip").inner_text()
  # The index links the page.
  p.goto((tmp_path / "index.html").as_uri())
  p.locator("a", has_text="step5_2").click()
  assert p.url.endswith("step5_2.html")
  assert index.endswith("index.html")
