"""The worked example in docs/credit.md is the output of the code printed next to it."""

import contextlib
import io
import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "credit.md"


def _block(text: str, marker: str) -> str:
  match = re.search(rf"<!-- worked-example:{marker} -->\n```\w+\n(.*?)\n```", text, re.S)
  assert match, f"no worked-example:{marker} block in {DOC}"
  return match.group(1)


def test_worked_example_table_is_generated_by_its_code():
  if not DOC.is_file():
    pytest.skip(f"{DOC} not found")
  text = DOC.read_text()
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    exec(compile(_block(text, "code"), str(DOC), "exec"), {"__name__": "worked_example"})
  assert out.getvalue().strip() == _block(text, "output").strip()
