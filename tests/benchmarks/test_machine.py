"""`machine.cpu_info`: the CPU model and vector extensions every results file records (XLA's CPU code follows them)."""

import machine


def test_cpu_info_reads_the_first_processor(tmp_path):
  path = tmp_path / "cpuinfo"
  path.write_text(
    "processor\t: 0\nmodel name\t: AMD EPYC 9B45\nflags\t\t: fpu sse4_2 avx avx2 fma avx512f avx512_bf16 sha_ni\n\n"
    "processor\t: 1\nmodel name\t: other\nflags\t\t: fpu\n"
  )
  info = machine.cpu_info(str(path))
  assert info == {"cpu_model": "AMD EPYC 9B45", "cpu_isa": ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16"]}
  assert machine.cpu_info(str(tmp_path / "missing"))["cpu_isa"] == []
  assert set(machine.machine_info()) >= {"cpu_model", "cpu_isa"}
