"""A small, safe calculator: + - * / ( ), unary signs, integer and decimal literals.

The expression is parsed with `ast.parse(mode="eval")` and only an allow-list of node types is walked;
nothing is ever passed to `eval`. Arithmetic is exact (`fractions.Fraction`), and every literal and every
intermediate result is bounded in magnitude (`MAX_ABS`) and in denominator (`MAX_DENOMINATOR`), so each
operation works on numbers of at most a few hundred bits: hostile input cannot trigger big-integer
blow-ups. Powers (`**`), `//`, `%`, bit operators, names, calls, attributes, subscripts and strings are
rejected with a `CalculatorError` carrying a short message meant to be shown to a model.

Example:
  >>> calculate("2*(3+4)")
  '14'
  >>> calculate("7/2")
  '3.5'
"""

from __future__ import annotations

import ast
import re
from decimal import ROUND_HALF_EVEN, Decimal, localcontext
from fractions import Fraction

MAX_LENGTH = 200  # characters of the expression
MAX_DEPTH = 100  # nesting depth of the syntax tree (a chain of n terms has depth n)
MAX_NODES = 256  # syntax-tree nodes
MAX_ABS = 10**15  # bound on |literal| and |intermediate result|
MAX_DENOMINATOR = 10**24  # bound on the denominator of any intermediate result
SIGNIFICANT_DIGITS = 10  # digits shown for non-integer results

_LITERAL_RE = re.compile(r"(?:\d+\.?\d*|\.\d+)")
_TRANSLATE = str.maketrans({"\u2212": "-", "\u00d7": "*", "\u00f7": "/"})
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}
_REJECTED_OPS = {
  ast.Pow: "'**' (power) is not supported; write the product with *",
  ast.BitXor: "'^' is not supported; write powers as products with *",
  ast.FloorDiv: "'//' is not supported; use /",
  ast.Mod: "'%' is not supported",
  ast.MatMult: "'@' is not supported",
  ast.LShift: "'<<' is not supported",
  ast.RShift: "'>>' is not supported",
  ast.BitAnd: "'&' is not supported",
  ast.BitOr: "'|' is not supported",
}


class CalculatorError(ValueError):
  """Raised for any expression the calculator refuses or cannot evaluate; `str(e)` is a short message."""


def calculate(expression: str) -> str:
  """Evaluates an arithmetic expression and returns its formatted value.

  Args:
    expression: text such as "2*(3+4)" or "-( 20 + 67 + -59 ) / 4". Surrounding whitespace and one
      trailing "=" are ignored; the characters U+2212, U+00D7, U+00F7 are read as -, *, /.

  Returns:
    The value as text: integers without a decimal point ("14", "-28"); other values in plain decimal
    notation rounded to `SIGNIFICANT_DIGITS` significant digits ("3.5", "0.3333333333").

  Raises:
    CalculatorError: the expression is not a string, is empty or longer than `MAX_LENGTH`, does not parse,
      uses anything but numbers, + - * / and parentheses, nests deeper than `MAX_DEPTH`, has more than
      `MAX_NODES` nodes, divides by zero, or has a literal or intermediate result with |x| > `MAX_ABS` or a
      denominator above `MAX_DENOMINATOR`.
  """
  return format_number(evaluate(expression))


def evaluate(expression: str) -> Fraction:
  """Evaluates `expression` exactly; same rules and errors as `calculate`, but returns a `Fraction`."""
  if not isinstance(expression, str):
    raise CalculatorError(f"expression must be a string, got {type(expression).__name__}")
  if len(expression) > MAX_LENGTH:
    raise CalculatorError(f"expression too long ({len(expression)} characters; max {MAX_LENGTH})")
  src = expression.translate(_TRANSLATE).strip()
  if src.endswith("="):
    src = src[:-1].rstrip()
  if not src:
    raise CalculatorError("empty expression")
  try:
    tree = ast.parse(src, mode="eval")
  except (SyntaxError, ValueError, RecursionError, MemoryError):
    raise CalculatorError("invalid syntax") from None
  _check_shape(tree.body)
  return _Evaluator(src).visit(tree.body)


def format_number(x: Fraction) -> str:
  """Formats a value: integers as-is, others in plain decimal with `SIGNIFICANT_DIGITS` significant digits.

  Args:
    x: the value (a `Fraction` or an `int`).

  Returns:
    e.g. "14", "-3", "3.5", "0.3333333333", "0.00001234567891". Never scientific notation, never "-0".
  """
  x = Fraction(x)
  if x.denominator == 1:
    return str(x.numerator)
  with localcontext() as ctx:
    ctx.prec = 80
    d = Decimal(x.numerator) / Decimal(x.denominator)
    places = max(SIGNIFICANT_DIGITS - (d.adjusted() + 1), 1)
    q = d.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_EVEN)
  s = format(q, "f")
  if "." in s:
    s = s.rstrip("0").rstrip(".")
  return "0" if s in ("-0", "") else s


def _check_shape(root: ast.AST) -> None:
  """Bounds node count and depth without recursion (so no RecursionError on deep trees)."""
  count = 0
  stack = [(root, 1)]
  while stack:
    node, depth = stack.pop()
    count += 1
    if count > MAX_NODES:
      raise CalculatorError(f"expression too large (more than {MAX_NODES} parts)")
    if depth > MAX_DEPTH:
      raise CalculatorError(f"expression nested too deeply (max depth {MAX_DEPTH})")
    stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))


def _check(x: Fraction) -> Fraction:
  if abs(x) > MAX_ABS:
    raise CalculatorError(f"number too large (|x| must be <= 1e{len(str(MAX_ABS)) - 1})")
  if x.denominator > MAX_DENOMINATOR:
    raise CalculatorError("result too small or too precise to represent")
  return x


class _Evaluator:
  """Walks an already shape-checked tree; only the node types below are accepted."""

  def __init__(self, src: str):
    self.src = src

  def visit(self, node: ast.AST) -> Fraction:
    if isinstance(node, ast.BinOp):
      op = type(node.op)
      if op in _REJECTED_OPS:
        raise CalculatorError(_REJECTED_OPS[op])
      if op not in _BINOPS:
        raise CalculatorError(f"unsupported operator {op.__name__}")
      a = self.visit(node.left)
      b = self.visit(node.right)
      if op is ast.Add:
        return _check(a + b)
      if op is ast.Sub:
        return _check(a - b)
      if op is ast.Mult:
        return _check(a * b)  # both factors are bounded, so this product is small
      if b == 0:
        raise CalculatorError("division by zero")
      return _check(a / b)
    if isinstance(node, ast.UnaryOp):
      if isinstance(node.op, ast.USub):
        return -self.visit(node.operand)
      if isinstance(node.op, ast.UAdd):
        return self.visit(node.operand)
      raise CalculatorError(f"unsupported unary operator {type(node.op).__name__}")
    if isinstance(node, ast.Constant):
      return self._literal(node)
    if isinstance(node, ast.Name):
      raise CalculatorError(f"unknown name {_short(node.id)!r}: only numbers and + - * / ( ) are allowed")
    if isinstance(node, ast.Call):
      raise CalculatorError("function calls are not allowed")
    if isinstance(node, ast.Attribute):
      raise CalculatorError("attribute access is not allowed")
    if isinstance(node, ast.Subscript):
      raise CalculatorError("indexing is not allowed")
    raise CalculatorError(f"unsupported syntax ({type(node).__name__})")

  def _literal(self, node: ast.Constant) -> Fraction:
    v = node.value
    if isinstance(v, (str, bytes)):
      raise CalculatorError("strings are not allowed")
    if isinstance(v, bool) or v is None or v is Ellipsis or not isinstance(v, (int, float)):
      raise CalculatorError(f"unsupported constant {_short(repr(v))}")
    text = ast.get_source_segment(self.src, node) or ""
    if not _LITERAL_RE.fullmatch(text):
      raise CalculatorError(f"unsupported number {_short(text)!r}: write plain integers or decimals")
    digits = text.lstrip("0").split(".")[0]
    if len(digits) > len(str(MAX_ABS)):
      raise CalculatorError(f"number too large (|x| must be <= 1e{len(str(MAX_ABS)) - 1})")
    frac_digits = len(text.split(".")[1]) if "." in text else 0
    if frac_digits > 24:
      raise CalculatorError("too many decimal places (max 24)")
    return _check(Fraction(text))


def _short(s: str, n: int = 30) -> str:
  return s if len(s) <= n else s[:n] + "..."
