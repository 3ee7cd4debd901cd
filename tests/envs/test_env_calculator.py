"""The safe calculator: exact values, formatting, and quick errors on hostile input."""

import time
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit.envs import calculator
from jaxcredit.envs.calculator import CalculatorError, calculate, evaluate, format_number


@pytest.mark.parametrize(
  "expr, expected",
  [
    ("2*(3+4)", "14"),
    ("7/2", "3.5"),
    ("1/3", "0.3333333333"),
    ("2/3", "0.6666666667"),
    ("-2/3", "-0.6666666667"),
    ("0.1+0.2", "0.3"),  # exact arithmetic, not 0.30000000000000004
    ("0.1*3", "0.3"),
    ("10/4*2", "5"),
    ("1/3*3", "1"),
    ("0.5*2", "1"),
    ("1.0", "1"),
    ("12.", "12"),
    (".5", "0.5"),
    ("-0.0", "0"),
    ("-( 20 + 67 + -59 )", "-28"),  # reasoning-gym basic_arithmetic style
    ("2 - -1", "3"),
    ("2--1", "3"),
    ("+5", "5"),
    ("-(-(-4))", "-4"),
    ("((((((((((7))))))))))", "7"),
    ("97 * 81 * -93", "-730701"),
    ("58 - 59", "-1"),
    ("4 - 1 =", "3"),  # one trailing "=" (chain_sum questions end with it) is ignored
    ("  2 + 2  ", "4"),
    ("6 \u00d7 7 \u2212 2 \u00f7 2", "41"),  # x, unicode minus, division sign
    ("123456789012.5", "123456789012.5"),
    ("2/3*0.00001", "0.000006666666667"),
    ("3.14159265358979", "3.141592654"),
    ("1000000000000000", "1000000000000000"),  # exactly MAX_ABS
    ("999999*999999", "999998000001"),
    ("1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1+1", "40"),
  ],
)
def test_values(expr, expected):
  assert calculate(expr) == expected


def test_evaluate_is_exact():
  assert evaluate("7/2") == Fraction(7, 2)
  assert evaluate("0.1 + 0.2") == Fraction(3, 10)
  assert evaluate("-( -91 / 7 )") == 13


@pytest.mark.parametrize(
  "x, expected",
  [
    (Fraction(14), "14"),
    (Fraction(-3), "-3"),
    (Fraction(0), "0"),
    (Fraction(7, 2), "3.5"),
    (Fraction(1, 3), "0.3333333333"),
    (Fraction(-1, 8), "-0.125"),
    (Fraction(1, 100000), "0.00001"),
    (Fraction(2, 3) * 10**6, "666666.6667"),
    (Fraction(1, 10**12) * -1, "-0.000000000001"),
    (5, "5"),
  ],
)
def test_format_number(x, expected):
  assert format_number(x) == expected


HOSTILE = [
  ("9**9**9", "'**'"),
  ("9**9**9**9**9", "'**'"),
  ("2**10", "'**'"),
  ("10^10^10", "'^'"),
  ("(" * 1000 + "1" + ")" * 1000, "too long"),
  ("-" * 150 + "1", "nested too deeply"),
  ("+" * 199 + "1", "nested too deeply"),
  ("__import__('os')", "function calls"),
  ("__import__('os').system('ls')", "not allowed"),
  ("().__class__.__bases__[0].__subclasses__()", "not allowed"),
  ("(1).real", "attribute access"),
  ("x", "unknown name 'x'"),
  ("os", "unknown name 'os'"),
  ("abs(-1)", "function calls"),
  ("[1, 2][0]", "indexing"),
  ("'a' * 10", "strings"),
  ("'a' * 1000000000000000", "strings"),
  ("1/0", "division by zero"),
  ("1/(2-2)", "division by zero"),
  ("5/(0.5-0.5)", "division by zero"),
  ("1" + "0" * 400, "too long"),
  ("1" + "0" * 150, "number too large"),
  ("1000000000000001", "number too large"),
  ("99999999*99999999*99999999*99999999", "number too large"),
  ("999999999999999+999999999999999", "number too large"),
  (
    "1/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3/3",
    "too small or too precise",
  ),
  ("1e400", "unsupported number"),
  ("1e5", "unsupported number"),
  ("0x10", "unsupported number"),
  ("1_000", "unsupported number"),
  ("1j", "unsupported constant"),
  ("True", "unsupported constant"),
  ("None", "unsupported constant"),
  ("0." + "1" * 100, "too many decimal places"),
  ("7 // 2", "'//'"),
  ("7 % 2", "'%'"),
  ("1 << 100000", "'<<'"),
  ("lambda: 1", "unsupported syntax"),
  ("[x for x in range(10**9)]", "unsupported syntax"),
  ("1 if 1 else 2", "unsupported syntax"),
  ("1 < 2", "unsupported syntax"),
  ("not 1", "unsupported unary"),
  ("~1", "unsupported unary"),
  ("1, 2", "unsupported syntax"),
  ("1; 2", "invalid syntax"),
  ("import os", "invalid syntax"),
  ("1\n+2", "invalid syntax"),
  ("\x00", "invalid syntax"),
  ("2 +", "invalid syntax"),
  ("", "empty"),
  ("   ", "empty"),
  ("a" * 5000, "too long"),
]


@pytest.mark.parametrize("expr, message", HOSTILE)
def test_hostile_expressions_error(expr, message):
  with pytest.raises(CalculatorError) as e:
    calculate(expr)
  assert message in str(e.value)
  assert len(str(e.value)) < 120


def test_hostile_batch_is_fast():
  start = time.perf_counter()
  for expr, _ in HOSTILE * 5:
    with pytest.raises(CalculatorError):
      calculate(expr)
  assert time.perf_counter() - start < 1.0  # generous: the batch takes a few milliseconds


def test_non_string_is_rejected():
  with pytest.raises(CalculatorError, match="must be a string"):
    calculate(14)
  with pytest.raises(CalculatorError, match="must be a string"):
    calculate(None)


def test_error_is_a_value_error():
  assert issubclass(CalculatorError, ValueError)


def test_no_eval_call_in_envs():
  import pathlib
  import re

  src_dir = pathlib.Path(calculator.__file__).parent
  files = sorted(src_dir.glob("*.py"))
  assert len(files) >= 4
  for path in files:
    assert not re.search(r"(?<![\w.])eval\s*\(", path.read_text()), path


# --- property: agrees with an exact reference on random expression trees ---------------------------------


def _trees():
  leaf = st.integers(min_value=-99, max_value=99).map(lambda n: (str(n), Fraction(n)))

  def extend(children):
    def binop(a, op, b):
      sa, va = a
      sb, vb = b
      if op == "/" and (vb is None or vb == 0):
        return (f"({sa}) {op} ({sb})", None)
      if va is None or vb is None:
        return (f"({sa}) {op} ({sb})", None)
      v = {"+": va + vb, "-": va - vb, "*": va * vb, "/": va / vb if vb else None}[op]
      return (f"({sa}) {op} ({sb})", v)

    neg = children.map(lambda c: (f"-({c[0]})", None if c[1] is None else -c[1]))
    return st.one_of(neg, st.builds(binop, children, st.sampled_from("+-*/"), children))

  return st.recursive(leaf, extend, max_leaves=8)


@given(_trees())
def test_matches_exact_reference(tree):
  text, value = tree
  if len(text) > calculator.MAX_LENGTH:
    return
  if value is None:  # a division by zero somewhere
    with pytest.raises(CalculatorError):
      calculate(text)
    return
  try:
    got = evaluate(text)
  except CalculatorError as e:
    # only bounds may refuse a well-formed expression
    assert "too large" in str(e) or "too small" in str(e) or "division by zero" in str(e)
    return
  assert got == value
  assert calculate(text) == format_number(value)


@given(st.text(max_size=300))
def test_arbitrary_text_only_raises_calculator_error(text):
  try:
    out = calculate(text)
  except CalculatorError:
    return
  assert isinstance(out, str) and out
