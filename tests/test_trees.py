"""jaxcredit.trees: the one flatten/unflatten of nested dicts (issue 33: six copies of it lived in models/, train/ and
viz/), with separator-joined paths; a path two ways of nesting would share is an error, never a value lost."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from jaxcredit import trees

# A config as train/loop/checkpoint.py compares it ('.'-joined) and a parameter tree as models/ and train/tables/engines.py write
# it ('/'-joined); the flat forms are what the copies produced.
CONFIG = {"seed": 0, "credit": {"method": "trace", "trace": {"gamma": 1.0}}, "env": {"name": "search", "tags": []}}
CONFIG_FLAT = {
  "seed": 0,
  "credit.method": "trace",
  "credit.trace.gamma": 1.0,
  "env.name": "search",
  "env.tags": [],
}
PARAMS = {"embedding": 1, "layers": {"wq": 2, "mlp": {"up": 3}}, 7: 4}
PARAMS_FLAT = {"embedding": 1, "layers/wq": 2, "layers/mlp/up": 3, "7": 4}


def test_flatten_joins_paths_in_insertion_order():
  assert list(trees.flatten(CONFIG, sep=".").items()) == list(CONFIG_FLAT.items())
  assert list(trees.flatten(PARAMS).items()) == list(PARAMS_FLAT.items())
  assert trees.flatten({"a": {}, "b": {"c": {}}}) == {}  # an empty mapping holds no leaf


def test_unflatten_inverts_flatten():
  assert trees.unflatten(PARAMS_FLAT) == {"embedding": 1, "layers": {"wq": 2, "mlp": {"up": 3}}, "7": 4}
  assert trees.unflatten(CONFIG_FLAT, sep=".") == CONFIG


@pytest.mark.parametrize(
  "tree, match",
  [
    ({"a/b": 1, "a": {"b": 2}}, "'a/b'"),  # a key holding the separator meets a nested path
    ({"a": {"b": 1}, "a/b": 2}, "'a/b'"),
    ({1: 1, "1": 2}, "'1'"),  # keys equal once written as text
  ],
)
def test_flatten_refuses_two_leaves_on_one_path(tree, match):
  with pytest.raises(ValueError, match=match):
    trees.flatten(tree)


@pytest.mark.parametrize(
  "flat, match",
  [
    ({"a": 1, "a/b": 2}, "'a/b'.*'a' is a leaf"),  # a leaf, then a path through it
    ({"a/b": 1, "a": 2}, "'a'.*holds 'a/b'"),  # a path, then a leaf where its parent is
    ({"a//b": 1}, "'a//b'.*empty"),
    ({"": 1}, "''.*empty"),
    ({3: 1}, "path 3 is a int"),
  ],
)
def test_unflatten_refuses_paths_that_do_not_nest(flat, match):
  with pytest.raises(ValueError, match=match):
    trees.unflatten(flat)


def test_separator_must_be_a_non_empty_string():
  with pytest.raises(ValueError, match="sep"):
    trees.flatten({"a": 1}, sep="")
  with pytest.raises(ValueError, match="sep"):
    trees.unflatten({"a": 1}, sep="")


_KEYS = st.text(alphabet="abcxyz_", min_size=1, max_size=4)
_TREES = st.recursive(
  st.integers(), lambda inner: st.dictionaries(_KEYS, inner, min_size=1, max_size=4), max_leaves=20
).filter(lambda t: isinstance(t, dict))


@given(_TREES, st.sampled_from(["/", ".", "::"]))
def test_round_trip_sweep(tree, sep):
  flat = trees.flatten(tree, sep=sep)
  assert trees.unflatten(flat, sep=sep) == tree
  # every leaf is reached by its path, and the paths are all the leaves
  for path, leaf in flat.items():
    node = tree
    for part in path.split(sep):
      node = node[part]
    assert node == leaf
  assert len(flat) == len(list(_leaves(tree)))


def _leaves(tree):
  for v in tree.values():
    if isinstance(v, dict):
      yield from _leaves(v)
    else:
      yield v
