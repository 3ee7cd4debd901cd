"""On an 8-device CPU mesh (fsdp=8, and fsdp=4 x tensor=2) the teacher pass (log-probs, entropies, reverse KL) and
TRACE's packed gold scoring equal the 1-device results: the passes run on the training mesh with the parameters
sharded by the same rules. The check is tests/multidevice/sharded_passes.py, on 8
CPU devices in a child process."""

from tests.fixtures.multidevice import run_on_devices


def test_passes_on_an_eight_device_mesh_equal_one_device():
  assert "PASSES-SHARDED-OK" in run_on_devices("sharded_passes.py")
