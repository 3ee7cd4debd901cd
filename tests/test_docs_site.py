"""The documentation site builds with warnings as errors (`mkdocs build --strict`: a broken link, a page outside the
navigation or a docstring the API reference cannot read fails), and its API reference shows every public credit
function with its docstring."""

import os
import re
import subprocess
import sys

import pytest

import jaxcredit.credit

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_the_site_builds_strict_and_documents_every_credit_function(tmp_path):
  pytest.importorskip("mkdocs")
  site = tmp_path / "site"
  env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
  proc = subprocess.run(
    [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
    cwd=ROOT,
    capture_output=True,
    text=True,
    timeout=600,
    env=env,
  )
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  page = (site / "reference" / "credit" / "index.html").read_text()
  for name in jaxcredit.credit.__all__:
    assert f'id="jaxcredit.credit.{name}"' in page, name  # the function's own heading, with its docstring below
  methods = sorted(p.name for p in site.glob("methods/*/"))
  assert methods == ["crest", "gear", "gigpo", "hsd", "opd", "outcome", "sgcd", "toolopd", "trace"]
  for slug in methods:  # each method's page carries its equations for MathJax (pymdownx.arithmatex)
    html = (site / "methods" / slug / "index.html").read_text()
    assert html.count('class="arithmatex"') >= 1, slug
    assert "arXiv" in html or slug == "toolopd", slug  # ToolOPD has no paper
  first_line = jaxcredit.credit.trace_advantages.__doc__.strip().splitlines()[0]
  assert re.sub(r"`", "", first_line.split("(")[0])[:40] in re.sub(r"<[^>]+>", "", page)
