"""The per-token credit viewer: one self-contained static HTML page per rollout, and an index page.

    view = rollout_view(record, pieces, methods={"trace": credited, "grpo": credited2})
    write_pages(out_dir, [view, ...])          # out_dir/index.html + out_dir/<rollout_id>.html

A page shows the conversation token by token: every action token coloured by its advantage (a diverging scale,
blue below 0, red above, white at 0, with a legend), prompt and tool observations greyed, turn, unit and boundary
markers, one tab per method on the same rollout, and beside the text what each method's passes saw (TRACE's state
values as a chart, GEAR's segments and CrEST's direction gate as marks on the tokens, HSD's peer, ToolOPD's
skill, SGCD's sibling summary, its siblings and its credit weights as marks). On hover: the token, its id, its
log-prob under the sampler, the teacher's log-prob and entropy, and the advantage. No server, no network, no CDN:
the data sit in the page as JSON and a few lines of JavaScript draw them.

Inputs are rollout records (docs/rollouts-jsonl.md) credited by a method, with the pass outputs and details under
metadata["passes"] / metadata["credit_details"] (`jaxcredit.train.commands.offline_credit.credit_records(..., details=True)` and the
trainer's rollout samples write them). Layout and reading guide: docs/viewer.md.
"""

from __future__ import annotations

import html
import json
import math
import os
import re
from typing import Any, Callable, Mapping, Sequence

from jaxcredit.atomic_files import write_text_atomic

# Per-token series shown on hover, by key (pass outputs and method details): label.
HOVER = {
  "logp_BxL": "teacher log-prob",
  "entropy_BxL": "teacher entropy",
  "student_entropy_BxL": "policy entropy",
  "divergence_BxL": "teacher/policy divergence",
  "token_weight_BxL": "CrEST token weight",
  "distill_weight_BxL": "distillation weight",
  "skill_logp_gain_BxL": "skill log-prob gain",
  "dense_advantage_BxL": "dense advantage",
  "teacher_gap_BxL": "HSD's credit: peer-conditioned teacher minus policy log-prob",
  "credit_weight_BxL": "SGCD credit weight",
}

# Per-boundary and per-turn series drawn as small charts: label, unit.
CHARTS = {
  "state_value_BxT1": ("state value V_t = log(d_0 / d_t), d_t = -mean log p(y*|s_t) + eps", "nats"),
  "td_reward_BxT": ("TD reward delta_t = V_t+1 - V_t", "nats"),
  "turn_reward_BxT": ("turn credit r_t: K-step TD mean + terminal fill", "advantage units"),
  "gold_logp_BxT1": ("gold answer log-prob log p(y*|s_t) (mean per token by default)", "nats"),
}

_ROLLOUT_ID = re.compile(r"[^A-Za-z0-9_.-]+")


def token_pieces(decode: Callable[[Sequence[int]], str], token_ids: Sequence[int], max_pending: int = 8) -> list[str]:
  """The text of each token, for display.

  A token that ends inside a multi-byte character (byte-level BPE) gets "" and the token that completes the
  character gets its text, so the pieces concatenate to the decoded text of the whole sequence.

  Args:
    decode: token ids -> text (a tokenizer's decode, special tokens kept).
    token_ids: [L] ints.
    max_pending: the most tokens held back waiting for a character to complete.

  Returns:
    L strings.
  """
  pieces, start = [], 0
  for k in range(len(token_ids)):
    text = decode(list(token_ids[start : k + 1]))
    if text.endswith("\ufffd") and k + 1 - start < max_pending and k + 1 < len(token_ids):
      pieces.append("")
      continue
    pieces.append(text)
    start = k + 1
  return pieces


def _finite(values) -> list[float | None]:
  out = []
  for v in values or []:
    out.append(float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None)
  return out


def rollout_view(
  record: Mapping[str, Any],
  pieces: Sequence[str],
  methods: Mapping[str, Mapping[str, Any]],
  *,
  summaries: Mapping[str, str] | None = None,
  notes: Mapping[str, str] | None = None,
  peer_ids: Mapping[str, Sequence[str]] | None = None,
  step: int | None = None,
) -> dict:
  """What one page shows, as JSON-ready data.

  Args:
    record: the rollout record (token_ids, action_mask, turn_ids, boundaries, behavior_logprobs, reward, ...).
    pieces: the text of each token (`token_pieces`).
    methods: method name -> the same rollout credited by that method ("advantages", optional "turn_advantages",
      metadata["passes"] and metadata["credit_details"]), in tab order.
    summaries: method name -> one line shown under its tab.
    notes: method name -> where its numbers come from (which checkpoint scored the passes).
    peer_ids: method name -> rollout ids of the batch its passes ran on, to name HSD's peer (`peer_B` indexes it).
    step: the RL step that sampled the rollout.

  Returns:
    A dict for `rollout_page`.

  Raises:
    ValueError: pieces or a method's advantages do not have one entry per token, or no methods.
  """
  ids = list(record["token_ids"])
  n = len(ids)
  if len(pieces) != n:
    raise ValueError(f"rollout {record.get('rollout_id')!r}: {len(pieces)} token pieces for {n} tokens")
  if not methods:
    raise ValueError(f"rollout {record.get('rollout_id')!r}: no methods to show")
  action = [int(a) for a in record["action_mask"]]
  tabs = []
  for name, credited in methods.items():
    adv = _finite(credited.get("advantages"))
    if len(adv) != n:
      raise ValueError(f"rollout {record.get('rollout_id')!r}, method {name!r}: {len(adv)} advantages for {n} tokens")
    meta = credited.get("metadata") or {}
    passes = meta.get("passes") or {}
    details = meta.get("credit_details") or {}
    hover, charts, texts, marks = [], [], [], {}
    for source, outputs in [*[(f"{p}", o) for p, o in passes.items()], ("credit", details)]:
      for key, value in outputs.items():
        if key in HOVER and isinstance(value, list) and len(value) == n:
          hover.append({"label": f"{HOVER[key]} ({source})", "values": _finite(value)})
        elif key in CHARTS and isinstance(value, list) and value:
          label, unit = CHARTS[key]
          values = _finite(value)
          mask = outputs.get("boundary_mask_BxT1") if key.endswith("_BxT1") else None
          if isinstance(mask, list) and len(mask) == len(values):  # an invalid boundary has no value, not log p = 0
            values = [v if m else None for v, m in zip(values, mask)]
          charts.append({"label": label, "unit": unit, "values": values})
        elif key == "segment_start_BxL" and len(value) == n:
          marks["segment"] = [int(v) >= 0 for v in value]
          marks["segment_start"] = [int(v) == i for i, v in enumerate(value)]
        elif key == "direction_gate_BxL" and len(value) == n:
          marks["gate"] = [bool(v) for v in value]
        elif key == "skills" and value:
          texts.append({"label": "hindsight skill (the teacher's extra context)", "text": str(value)})
        elif key == "summaries" and value:
          texts.append({"label": "sibling-contrast credit reference (the teacher's extra context)", "text": str(value)})
        elif key == "siblings_Bx2" and isinstance(value, list) and len(value) == 2:
          batch = (peer_ids or {}).get(name)
          if min(value) < 0:
            texts.append({"label": "siblings", "text": "none: the group lacks a successful or a failed rollout"})
          for label, j in zip(("successful sibling", "failed sibling"), value if min(value) >= 0 else ()):
            sib = batch[j] if batch is not None and j < len(batch) else f"row {j} of the batch"
            texts.append({"label": f"{label} (summarised for the teacher)", "text": sib, "link": page_name(sib)})
        elif key == "peer_B" and isinstance(value, int):
          batch = (peer_ids or {}).get(name)
          if value < 0:
            texts.append({"label": "peer", "text": "none: no successful peer in the group (gold-answer fallback)"})
          else:
            peer = batch[value] if batch is not None and value < len(batch) else f"row {value} of the batch"
            texts.append({"label": "peer rollout (the teacher's extra context)", "text": peer, "link": page_name(peer)})
        elif key == "reasons" and value:
          texts.append({"label": f"{source}: pass invalid", "text": str(value)})
        elif key in ("success_B",) and isinstance(value, bool):
          label = "outcome the skill was written from" if "skills" in outputs else "this rollout's outcome"
          texts.append({"label": label, "text": "success" if value else "failure"})
    weights = _finite(details.get("credit_weight_BxL"))
    if len(weights) == n and any(w is not None for w in weights):  # SGCD: where the teacher moved the credit
      marks["raised"] = [w is not None and w > 1 for w in weights]
      marks["lowered"] = [w is not None and w < 1 for w in weights]
      seen = [w for w in weights if w is not None]
      texts.append(
        {
          "label": "credit weights",
          "text": f"{sum(marks['raised'])} of {len(seen)} scored tokens raised, {sum(marks['lowered'])} lowered; "
          f"from {min(seen):.3g} to {max(seen):.3g}",
        }
      )
    turn_adv = _finite(credited.get("turn_advantages"))
    if turn_adv:
      charts.insert(0, {"label": "turn advantage", "unit": "", "values": turn_adv})
    acts = [abs(a) for a, m in zip(adv, action) if m and a is not None]
    tabs.append(
      {
        "name": name,
        "summary": (summaries or {}).get(name, ""),
        "note": (notes or {}).get(name, ""),
        "adv": adv,
        "scale": max(acts) if acts and max(acts) > 0 else 1.0,
        "hover": hover,
        "charts": charts,
        "texts": texts,
        "marks": marks,
      }
    )
  return {
    "rollout_id": str(record["rollout_id"]),
    "group_id": record.get("group_id"),
    "task_id": record.get("task_id"),
    "step": step,
    "reward": float(record["reward"]),
    "finish": record.get("finish") or "",
    "num_turns": int(record.get("num_turns") or (max(record.get("turn_ids") or [-1]) + 1)),
    "pieces": list(pieces),
    "token_ids": ids,
    "action": action,
    "turn": [int(t) for t in record.get("turn_ids") or [-1] * n],
    "unit": [int(u) for u in record.get("unit_ids") or [-1] * n],
    "boundaries": [int(b) for b in record.get("boundaries") or []],
    "prompt_len": int(record.get("prompt_len") or 0),
    "behavior_logp": _finite(record.get("behavior_logprobs") or [0.0] * n),
    "engine_invalid_logp_tokens": int(record.get("engine_invalid_logp_tokens") or 0),
    "tool_calls": _tool_calls(record.get("messages") or []),
    "methods": tabs,
  }


def _tool_calls(messages) -> list[str]:
  out = []
  for m in messages:
    for call in m.get("tool_calls") or []:
      fn = call.get("function") or {}
      out.append(f"{fn.get('name', '?')}({fn.get('arguments', '')})")
  return out


def page_name(rollout_id: str) -> str:
  """The file name of a rollout's page: characters other than letters, digits, '_', '.' and '-' become '_'; a name
  that would be hidden (leading '.'), empty or the index's gets the prefix "rollout_"."""
  name = _ROLLOUT_ID.sub("_", str(rollout_id))
  if not name or name.startswith(".") or name == "index":
    name = "rollout_" + name
  return name + ".html"


_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;background:#f3f3f3;color:#222}
header{background:#fff;padding:10px 16px;border-bottom:1px solid #ddd}
h1{font-size:17px;margin:0 0 4px} .meta{color:#555} .warn{color:#a40000;font-weight:bold}
#tabs{margin:8px 0 0} .tab{border:1px solid #bbb;background:#eee;padding:4px 10px;margin-right:4px;cursor:pointer;
border-radius:4px 4px 0 0;font:inherit} .tab.active{background:#fff;border-bottom-color:#fff;font-weight:600}
main{display:flex;gap:16px;padding:12px 16px;align-items:flex-start}
#transcript{flex:3;background:#f7f7f7;border:1px solid #ddd;padding:12px;white-space:pre-wrap;word-break:break-word;
font:13px/1.7 ui-monospace,monospace}
aside{flex:2;min-width:280px}
.panel{background:#fff;border:1px solid #ddd;padding:10px;margin-bottom:10px}
.tok{border-radius:2px}
.ctx{color:#888} .obs{background:#e8e8e8;color:#444}
.act{color:#111}
.tok.seg{box-shadow:inset 0 -3px 0 #6a3d9a} .tok.segstart{border-left:2px solid #6a3d9a}
.tok.gate{outline:1px dotted #333}
.tok.raised{box-shadow:inset 0 2px 0 #b2182b} .tok.lowered{box-shadow:inset 0 2px 0 #2166ac}
.mark{font:10px system-ui,sans-serif;color:#fff;background:#777;border-radius:3px;padding:0 3px;margin:0 2px;
vertical-align:super}
.mark.turn{background:#1b7837} .mark.unit{background:#8c510a} .mark.bd{background:#2166ac}
#legend{display:flex;align-items:center;gap:6px;margin-top:6px}
#legendbar{width:220px;height:12px;border:1px solid #999;
background:linear-gradient(to right,rgb(33,102,172),rgb(255,255,255),rgb(178,24,43))}
#tip{position:fixed;display:none;background:#222;color:#fff;padding:6px 8px;border-radius:4px;font:12px monospace;
pointer-events:none;z-index:9;white-space:pre}
table{border-collapse:collapse} td,th{border:1px solid #ddd;padding:2px 8px;text-align:left}
svg text{font:10px system-ui,sans-serif}
"""

_JS = r"""
const D = JSON.parse(document.getElementById('data').textContent);
const toks = Array.from(document.querySelectorAll('#transcript .tok'));
function colour(a, s) {
  if (a === null) return 'rgb(255,255,255)';
  const t = Math.max(-1, Math.min(1, a / s));
  const end = t >= 0 ? [178, 24, 43] : [33, 102, 172];
  const u = Math.abs(t);
  return 'rgb(' + end.map(e => Math.round(255 + (e - 255) * u)).join(',') + ')';
}
function fmt(x) { return x === null || x === undefined ? '-' : (Math.abs(x) >= 100 ? x.toFixed(1) : x.toFixed(4)); }
function chart(c) {
  const v = c.values, W = 300, H = 90, P = 22;
  const ok = v.map((y, i) => [i, y]).filter(p => p[1] !== null);
  if (!ok.length) return '<div>' + c.label + ': no values</div>';
  let lo = Math.min(0, ...ok.map(p => p[1])), hi = Math.max(0, ...ok.map(p => p[1]));
  if (hi - lo < 1e-9) { hi += 1; lo -= 1; }
  const x = i => P + (W - 2 * P) * (v.length > 1 ? i / (v.length - 1) : 0.5);
  const y = q => H - P + (2 * P - H) * (q - lo) / (hi - lo);
  const pts = ok.map(p => x(p[0]).toFixed(1) + ',' + y(p[1]).toFixed(1)).join(' ');
  const dots = ok.map(p => '<circle cx="' + x(p[0]).toFixed(1) + '" cy="' + y(p[1]).toFixed(1) + '" r="3"><title>' +
    p[0] + ': ' + fmt(p[1]) + '</title></circle>').join('');
  return '<div>' + c.label + (c.unit ? ' (' + c.unit + ')' : '') + '</div><svg class="chart" width="' + W +
    '" height="' + H + '"><line x1="' + P + '" x2="' + (W - P) + '" y1="' + y(0) + '" y2="' + y(0) +
    '" stroke="#aaa"/><polyline fill="none" stroke="#2166ac" points="' + pts + '"/>' + dots + '<text x="2" y="12">' +
    fmt(hi) + '</text><text x="2" y="' + (H - 4) + '">' + fmt(lo) + '</text></svg>';
}
function esc(s) { const d = document.createElement('div'); d.textContent = s; return d.innerHTML; }
let current = 0;
function show(k) {
  current = k;
  const m = D.methods[k];
  document.querySelectorAll('.tab').forEach((b, j) => b.classList.toggle('active', j === k));
  toks.forEach(el => {
    const i = +el.dataset.i;
    el.classList.toggle('seg', !!(m.marks.segment && m.marks.segment[i]));
    el.classList.toggle('segstart', !!(m.marks.segment_start && m.marks.segment_start[i]));
    el.classList.toggle('gate', !!(m.marks.gate && m.marks.gate[i]));
    el.classList.toggle('raised', !!(m.marks.raised && m.marks.raised[i]));
    el.classList.toggle('lowered', !!(m.marks.lowered && m.marks.lowered[i]));
    if (D.action[i]) el.style.backgroundColor = colour(m.adv[i], m.scale);
  });
  document.getElementById('lo').textContent = fmt(-m.scale);
  document.getElementById('hi').textContent = '+' + fmt(m.scale);
  let h = '<b>' + esc(m.name) + '</b>' + (m.summary ? ': ' + esc(m.summary) : '');
  if (m.note) h += '<div class="meta">' + esc(m.note) + '</div>';
  if (m.marks.segment) h += '<div>GEAR segments: purple underline; a segment starts at a left bar (a divergence spike)</div>';
  if (m.marks.gate) h += '<div>CrEST direction gate open (teacher agrees with the verifier): dotted outline</div>';
  if (m.marks.raised) h += '<div>SGCD credit weight above 1: red bar over the token; below 1: blue bar</div>';
  m.texts.forEach(t => {
    const body = t.link ? '<a href="' + encodeURI(t.link) + '">' + esc(t.text) + '</a>' : esc(t.text);
    h += '<div><b>' + esc(t.label) + '</b>: ' + body + '</div>';
  });
  m.charts.forEach(c => { h += chart(c); });
  document.getElementById('method').innerHTML = h;
}
document.querySelectorAll('.tab').forEach((b, j) => b.addEventListener('click', () => show(j)));
const tip = document.getElementById('tip');
toks.forEach(el => {
  el.addEventListener('mouseover', e => {
    const i = +el.dataset.i, m = D.methods[current];
    let s = JSON.stringify(D.pieces[i]) + '  id ' + D.token_ids[i] + '\n';
    if (D.action[i]) {
      s += 'sampler log-prob ' + fmt(D.behavior_logp[i]) + '\nadvantage (' + m.name + ') ' + fmt(m.adv[i]);
      m.hover.forEach(h => { s += '\n' + h.label + ' ' + fmt(h.values[i]); });
    } else s += i < D.prompt_len ? 'prompt' : 'observation / scaffolding (not trained)';
    tip.textContent = s; tip.style.display = 'block';
    tip.style.left = (e.clientX + 12) + 'px'; tip.style.top = (e.clientY + 12) + 'px';
  });
  el.addEventListener('mouseout', () => { tip.style.display = 'none'; });
});
show(0);
"""


def _json_script(data) -> str:
  # "<" and ">" inside a script element can end it ("</script>") or switch the parser's state ("<!--<script>"), "&"
  # is escaped with them; JSON's \u escapes keep the same strings.
  return json.dumps(data, allow_nan=False).replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")


def rollout_page(view: Mapping[str, Any]) -> str:
  """The HTML page of one rollout (`rollout_view`'s data)."""
  e = html.escape
  n = len(view["pieces"])
  boundaries = {b: j for j, b in enumerate(view["boundaries"])}
  parts, prev_turn, prev_unit = [], None, None
  for i in range(n):
    if i in boundaries and i > 0:
      parts.append(f'<span class="mark bd" title="boundary state s_{boundaries[i]}">s{boundaries[i]}</span>')
    if view["action"][i]:
      t, u = view["turn"][i], view["unit"][i]
      if t != prev_turn:
        parts.append(f'<span class="mark turn">turn {t}</span>')
      if u != prev_unit and u >= 0 and max(view["unit"]) > 0:
        parts.append(f'<span class="mark unit">unit {u}</span>')
      prev_turn, prev_unit = t, u
      cls = "tok act"
    else:
      cls = "tok ctx" if i < view["prompt_len"] else "tok ctx obs"
    parts.append(f'<span class="{cls}" data-i="{i}">{e(view["pieces"][i])}</span>')
  if n in boundaries:
    parts.append(f'<span class="mark bd" title="boundary state s_{boundaries[n]}">s{boundaries[n]}</span>')
  tabs = "".join(f'<button class="tab" data-method="{e(m["name"])}">{e(m["name"])}</button>' for m in view["methods"])
  calls = "".join(f"<li><code>{e(c)}</code></li>" for c in view["tool_calls"]) or "<li>none</li>"
  step = "" if view["step"] is None else f"step {view['step']} · "
  return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(view["rollout_id"])}: credit</title>
<style>{_CSS}</style></head><body>
<header><h1>{e(view["rollout_id"])}</h1>
<div class="meta">{e(step)}group {e(str(view["group_id"]))} · task {e(str(view["task_id"]))} · reward
{view["reward"]:g} · finish {e(view["finish"] or "-")} · {view["num_turns"]} turns · {sum(view["action"])} action
tokens of {n} · <a href="index.html">all rollouts</a></div>{_invalid_logp_warning(view)}
<div id="tabs">{tabs}</div>
<div id="legend"><span>advantage</span><span id="lo"></span><span id="legendbar"></span><span id="hi"></span>
<span class="meta">grey: prompt and observations (not trained) · marks: turn, unit, boundary state s_t</span></div>
</header>
<main><div id="transcript">{"".join(parts)}</div>
<aside><div class="panel" id="method"></div><div class="panel"><b>tool calls</b><ul>{calls}</ul></div></aside></main>
<div id="tip"></div>
<script id="data" type="application/json">{_json_script(view)}</script>
<script>{_JS}</script></body></html>
"""


def _invalid_logp_warning(view: Mapping[str, Any], *, short: bool = False) -> str:
  """A visible mark on a rollout holding tokens the engine returned without a log-prob (docs/engines.md): the
  trainer left them out of the loss, so the rollout trained on fewer tokens than it shows."""
  k = int(view.get("engine_invalid_logp_tokens") or 0)
  if not k:
    return ""
  text = f"{k} token{'s' if k > 1 else ''} without an engine log-prob (left out of the loss)"
  if short:
    return f' <span class="warn" title="{text}">⚠ {k}</span>'
  return f'<div class="warn">⚠ {text}</div>'


def index_page(views: Sequence[Mapping[str, Any]], *, title: str = "jaxcredit: rollouts", extra_html: str = "") -> str:
  """The index: one row per rollout (step, group, reward, finish, turns, methods), each linking to its page."""
  e = html.escape
  rows = "".join(
    f'<tr><td><a href="{e(page_name(v["rollout_id"]))}">{e(v["rollout_id"])}</a></td><td>{e(str(v["step"]))}</td>'
    f"<td>{e(str(v['group_id']))}</td><td>{v['reward']:g}</td><td>{e(v['finish'] or '-')}</td>"
    f"<td>{v['num_turns']}{_invalid_logp_warning(v, short=True)}</td>"
    f"<td>{e(', '.join(m['name'] for m in v['methods']))}</td></tr>"
    for v in views
  )
  return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{e(title)}</title><style>{_CSS}</style></head><body>
<header><h1>{e(title)}</h1><div class="meta">{len(views)} rollouts; each page colours every action token by its
advantage under each method</div></header>
<main><div class="panel"><table><tr><th>rollout</th><th>step</th><th>group</th><th>reward</th><th>finish</th>
<th>turns</th><th>methods</th></tr>{rows}</table>{extra_html}</div></main></body></html>
"""


def write_pages(out_dir: str, views: Sequence[Mapping[str, Any]], **index_kwargs) -> str:
  """Writes one page per view and index.html into `out_dir` (created). Returns the index's path.

  Raises:
    ValueError: two rollout ids that map to one page name (`page_name`); nothing is written.
  """
  names: dict[str, str] = {}
  for v in views:
    other = names.setdefault(page_name(v["rollout_id"]), v["rollout_id"])
    if other != v["rollout_id"]:
      raise ValueError(
        f"rollout ids {other!r} and {v['rollout_id']!r} give the same page name {page_name(other)!r} "
        "(characters other than letters, digits, '_', '.' and '-' become '_'); rename one"
      )
  os.makedirs(out_dir, exist_ok=True)
  for v in views:
    _write(os.path.join(out_dir, page_name(v["rollout_id"])), rollout_page(v))
  path = os.path.join(out_dir, "index.html")
  _write(path, index_page(views, **index_kwargs))
  return path


def _write(path: str, text: str) -> None:
  write_text_atomic(path, text)


def write_rollout_pages(
  out_dir: str,
  credited: Mapping[str, Sequence[Mapping[str, Any]]],
  decode: Callable[[Sequence[int]], str],
  *,
  step: int | None = None,
  summaries: Mapping[str, str] | None = None,
  notes: Mapping[str, str] | None = None,
  peer_ids: Mapping[str, Sequence[str]] | None = None,
  title: str = "jaxcredit: rollouts",
) -> str:
  """Pages for rollouts credited by one or more methods.

  Args:
    out_dir: where index.html and one page per rollout go (created).
    credited: method name -> the rollouts credited by it, every method's list in the same rollout order (the first
      method's records give the tokens).
    decode: token ids -> text (the policy tokenizer's decode, special tokens kept).
    step, summaries, notes, peer_ids: as `rollout_view`.

  Returns:
    The index page's path.

  Raises:
    ValueError: the methods' lists differ in length or rollout ids.
  """
  names = list(credited)
  if not names:
    raise ValueError("no methods to show")
  base = list(credited[names[0]])
  for name in names[1:]:
    ids = [r["rollout_id"] for r in credited[name]]
    if ids != [r["rollout_id"] for r in base]:
      raise ValueError(f"method {name!r} credited other rollouts than {names[0]!r}: {ids[:4]}...")
  views = []
  for i, record in enumerate(base):
    views.append(
      rollout_view(
        record,
        token_pieces(decode, record["token_ids"]),
        {name: credited[name][i] for name in names},
        summaries=summaries,
        notes=notes,
        peer_ids=peer_ids,
        step=step,
      )
    )
  return write_pages(out_dir, views, title=title)
