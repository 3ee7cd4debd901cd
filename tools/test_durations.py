"""Where a pytest run's time goes, from its JUnit XML (`pytest --junitxml=FILE`): the total per test directory and
the slowest tests, as the Markdown tables of docs/testing.md.

    python -m pytest -q --junitxml=/tmp/suite.xml
    python tools/test_durations.py /tmp/suite.xml [--top 30] [--compare /tmp/before.xml] [--slow IDS]

IDS: a file of the slow tier's test ids, one a line (`JAXCREDIT_RUN_SLOW=1 pytest -q --collect-only -m slow`);
with it, the totals of the default suite and the slow tier are given apart and the slow tests are marked.

A test's time is its setup, call and teardown together (JUnit's `time`), so a session fixture's cost lands on the
first test that uses it. With --compare, each directory's total in the other run is shown beside it.
"""

import argparse
import collections
import sys
import xml.etree.ElementTree as ET


def read_cases(path: str) -> list[tuple[str, float, str]]:
  """(test id, seconds, outcome) of every test case in a JUnit XML file; outcome is passed / failed / skipped."""
  cases = []
  for case in ET.parse(path).getroot().iter("testcase"):
    module = case.get("classname", "").replace(".", "/")
    test_id = f"{module}.py::{case.get('name')}"
    outcome = "passed"
    for child in case:
      if child.tag in ("failure", "error"):
        outcome = "failed"
      elif child.tag == "skipped":
        outcome = "skipped"
    cases.append((test_id, float(case.get("time", 0.0)), outcome))
  return cases


def directory(test_id: str) -> str:
  parts = test_id.split("::")[0].split("/")
  return "/".join(parts[:2]) + "/" if len(parts) > 2 else parts[0].rsplit("/", 1)[0] + "/"


def per_directory(cases) -> dict[str, tuple[int, float]]:
  totals: dict[str, list] = collections.defaultdict(lambda: [0, 0.0])
  for test_id, seconds, _ in cases:
    totals[directory(test_id)][0] += 1
    totals[directory(test_id)][1] += seconds
  return {k: (n, s) for k, (n, s) in totals.items()}


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("xml", help="JUnit XML of the run")
  parser.add_argument("--top", type=int, default=30, help="how many of the slowest tests to list (30)")
  parser.add_argument("--compare", help="JUnit XML of another run, shown beside per directory")
  parser.add_argument("--slow", help="file of the slow tier's test ids (pytest --collect-only -q -m slow)")
  args = parser.parse_args(argv)
  cases = read_cases(args.xml)
  slow = set()
  if args.slow:
    with open(args.slow) as f:
      slow = {line.strip() for line in f if "::" in line}
  other = per_directory(read_cases(args.compare)) if args.compare else None
  totals = per_directory(cases)
  outcomes = collections.Counter(o for _, _, o in cases)
  print(
    f"{len(cases)} tests ({', '.join(f'{n} {o}' for o, n in sorted(outcomes.items()))}), "
    f"{sum(s for _, s, _ in cases):.0f} s in tests"
  )
  if slow:
    in_slow = [s for t, s, _ in cases if t in slow]
    default_s = sum(s for t, s, _ in cases if t not in slow)
    print(
      f"slow tier: {len(in_slow)} tests, {sum(in_slow):.0f} s; default suite: {len(cases) - len(in_slow)} tests, {default_s:.0f} s"
    )
  print()
  head = "| directory | tests | seconds |" + (" other run: tests | seconds |" if other else "")
  print(head)
  print("|---|---:|---:|" + ("---:|---:|" if other else ""))
  for d, (n, s) in sorted(totals.items(), key=lambda kv: -kv[1][1]):
    row = f"| `{d}` | {n} | {s:.0f} |"
    if other:
      on, os_ = other.get(d, (0, 0.0))
      row += f" {on} | {os_:.0f} |"
    print(row)
  print(f"\n| # | test | seconds |\n|---:|---|---:|")
  for i, (test_id, seconds, _) in enumerate(sorted(cases, key=lambda c: -c[1])[: args.top], 1):
    print(f"| {i} | `{test_id}`{' (slow)' if test_id in slow else ''} | {seconds:.1f} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
