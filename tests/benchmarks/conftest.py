"""The benchmarks import their shared helper (`benchmarks/machine.py`) as `machine`, as when run as scripts."""

import os
import sys

sys.path.insert(
  0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "benchmarks")
)
