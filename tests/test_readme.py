"""The README's front page: its library example runs and prints what it says, it stays a front page (at most about
200 lines), and every docs page it links exists."""

import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme() -> str:
  with open(os.path.join(ROOT, "README.md")) as f:
    return f.read()


def test_the_library_example_runs_and_prints_its_shape(capsys):
  text = _readme()
  block = re.search(r"```python\n(.*?)```", text[text.index("## Use a credit function as a library") :], re.S).group(1)
  exec(compile(block, "README.md", "exec"), {})
  assert capsys.readouterr().out.strip() == "(2, 4, 3)"


def test_the_readme_is_a_front_page_and_its_links_exist():
  text = _readme()
  assert len(text.splitlines()) <= 200
  links = re.findall(r"\]\(([^)#]+)\)", text)
  assert links and all(os.path.exists(os.path.join(ROOT, link)) for link in links), links
