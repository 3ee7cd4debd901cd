"""The multi-process helpers' arithmetic (jaxcredit/multihost.py), with the process count and index patched: the
share each process takes, the mesh it samples on, and the refusals naming the bad numbers."""

import jax
import pytest

from jaxcredit import multihost


def _as_process(monkeypatch, index, count):
  monkeypatch.setattr(jax, "process_count", lambda: count)
  monkeypatch.setattr(jax, "process_index", lambda: index)


def test_each_process_takes_its_own_contiguous_share(monkeypatch):
  shares = []
  for i in range(4):
    _as_process(monkeypatch, i, 4)
    shares.append(list(range(8))[multihost.share(8, what="config.rollout.prompts_per_step=8")])
  assert shares == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_a_count_that_does_not_split_is_refused_with_its_numbers(monkeypatch):
  _as_process(monkeypatch, 0, 4)
  with pytest.raises(
    ValueError, match=r"config.rollout.prompts_per_step=6: 6 prompt groups can't be split evenly over 4"
  ):
    multihost.share(6, what="config.rollout.prompts_per_step=6", unit="prompt groups")


def test_uneven_shares_cover_every_item_once(monkeypatch):
  covered = []
  for i in range(3):
    _as_process(monkeypatch, i, 3)
    covered += list(range(7))[multihost.uneven_share(7)]
  assert covered == list(range(7))
  _as_process(monkeypatch, 2, 3)
  assert list(range(2))[multihost.uneven_share(2)] == []  # more processes than items: the last has none


@pytest.mark.parametrize(
  "mesh, processes, local",
  [
    ({"data": 1, "fsdp": 8, "expert": 1, "tensor": 1}, 2, {"data": 1, "fsdp": 4, "expert": 1, "tensor": 1}),
    ({"data": 2, "fsdp": 4, "expert": 1, "tensor": 1}, 2, {"data": 1, "fsdp": 4, "expert": 1, "tensor": 1}),
    ({"data": 2, "fsdp": 16, "expert": 1, "tensor": 4}, 8, {"data": 1, "fsdp": 4, "expert": 1, "tensor": 4}),
  ],
)
def test_the_sampling_mesh_divides_the_outer_axes_first(mesh, processes, local):
  assert multihost.local_mesh_shape(mesh, processes) == local


def test_a_mesh_that_does_not_split_over_the_processes_is_refused():
  with pytest.raises(ValueError, match=r"config.mesh \{'fsdp': 3\} can't be split over 2 processes"):
    multihost.local_mesh_shape({"fsdp": 3}, 2)


def test_one_process_is_the_identity():
  tree = {"a": jax.numpy.arange(3)}
  assert multihost.local_copy(tree, None) is tree
  assert multihost.allgather_objects({"x": 1}) == [{"x": 1}]
  assert multihost.mean_of([{"a": 1.0, "b": 2.0}, {"a": 3.0}]) == {"a": 2.0, "b": 2.0}
