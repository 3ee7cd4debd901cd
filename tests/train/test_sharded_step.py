"""On an 8-device CPU mesh the policy-gradient step equals the 1-device one (fsdp=8, fsdp=4 x tensor=2,
data x fsdp, data with micro-batches; a MoE model with expert=4 x fsdp=2 for both MoE implementations).

The check is tests/multidevice/sharded_step.py, in a child process with 8 CPU devices (tests/fixtures/multidevice.py)
so the device count of the rest of the suite is untouched.
"""

from tests.fixtures.multidevice import run_on_devices


def test_eight_device_step_equals_one_device():
  assert "SHARDED-OK" in run_on_devices("sharded_step.py")
