"""A model source may be a Hugging Face Hub id: resolved from a local cache in the Hub layout, offline, no network."""

import json
import os
import subprocess
import sys
import textwrap


from tests.models.hf_checkpoints import TINY, write_numpy_hf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
COMMIT = "0123456789abcdef0123456789abcdef01234567"


def hub_cache(root):
  """models--test-org--tiny-qwen3 in the Hub cache layout: refs/main -> a commit, snapshots/<commit>/files."""
  repo = root / "models--test-org--tiny-qwen3"
  snapshot = write_numpy_hf(
    repo / "snapshots" / COMMIT,
    dict(TINY, model_type="qwen3", tie_word_embeddings=False, architectures=["Qwen3ForCausalLM"]),
    shards=1,
  )
  (repo / "refs").mkdir()
  (repo / "refs" / "main").write_text(COMMIT)
  return snapshot


SCRIPT = textwrap.dedent(r"""
    import json, sys
    import numpy as np
    import jax.numpy as jnp
    from jaxcredit.models import load_model, resolve_source
    out = {}
    by_id, _ = load_model(resolve_source("test-org/tiny-qwen3"), cache_dir=sys.argv[2])
    by_path, _ = load_model(sys.argv[1], cache_dir=sys.argv[2])
    tokens = jnp.asarray([[1, 5, 9, 17, 33]], jnp.int32)
    out["max_diff"] = float(jnp.max(jnp.abs(by_id(tokens)[0] - by_path(tokens)[0])))
    out["pinned"] = str(resolve_source("test-org/tiny-qwen3@" + sys.argv[3]))
    out["main"] = str(resolve_source("test-org/tiny-qwen3"))
    try:
        resolve_source("test-org/not-cached")
    except FileNotFoundError as e:
        out["missing"] = str(e)
    print(json.dumps(out))
""")


def test_a_hub_id_loads_from_the_hub_cache_offline(tmp_path):
  snapshot = hub_cache(tmp_path / "hub")
  env = dict(os.environ, HF_HUB_CACHE=str(tmp_path / "hub"), HF_HUB_OFFLINE="1", JAX_PLATFORMS="cpu")
  p = subprocess.run(
    [sys.executable, "-c", SCRIPT, str(snapshot), str(tmp_path / "converted"), COMMIT],
    capture_output=True,
    text=True,
    env=env,
    cwd=ROOT,
    timeout=300,
  )
  assert p.returncode == 0, p.stderr[-3000:]
  out = json.loads(p.stdout.strip().splitlines()[-1])
  assert out["max_diff"] == 0.0
  assert out["main"] == out["pinned"] == str(snapshot)
  assert "test-org/not-cached" in out["missing"] and "HF_HUB_OFFLINE" in out["missing"]


def test_the_cli_refuses_a_path_that_is_neither_a_folder_nor_a_hub_id(tmp_path):
  p = subprocess.run(
    [sys.executable, "-m", "jaxcredit.cli", "convert", "--hf", "no such folder", "--out", str(tmp_path / "out")],
    capture_output=True,
    text=True,
    cwd=ROOT,
    timeout=120,
    env=dict(os.environ, JAX_PLATFORMS="cpu"),
  )
  assert p.returncode == 2 and "not a Hub id" in p.stderr and "Traceback" not in p.stderr, p.stderr[-2000:]
  assert not (tmp_path / "out").exists()
