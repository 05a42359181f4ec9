"""zerocomm-bench compression: the side-by-side summary, the load line and the kernel microbenchmark."""
import re

from zerocomm.benchmarks.compression import Row, load_line, summary_rows
from zerocomm.benchmarks.compression_kernels import run_kernels


def _row(algorithm, fp32_us, onebit_us):
    return Row(backend="gloo", world_size=2, size=16 << 20, algorithm=algorithm, fp32_us=fp32_us,
               onebit_us=onebit_us, fp32_bytes=16 << 20, onebit_bytes=1 << 19, counted=algorithm == "ring")


def test_summary_puts_fp32_native_ring_and_onebit_side_by_side():
    text = summary_rows([_row("native", 10_000, 30_000), _row("ring", 20_000, 8_000)])
    line = [l for l in text.splitlines() if "gloo" in l][0].split()
    # backend, n, size (2 fields), fp32 native, fp32 ring, 1-bit/native, 1-bit/ring, ring / best 1-bit
    assert line[:2] == ["gloo", "2"] and line[4:] == ["10.00", "20.00", "30.00", "8.00", "2.50"], line


def test_load_line_quotes_the_load():
    assert re.match(r"# (uptime: .*load average|load average: )", load_line())


def test_kernel_table_has_every_kernel_and_variant():
    text = run_kernels([64 << 10], iters=1, threads=1)
    for kernel, variant in (("copy_", "memory"), ("encode", "unfused (before)"), ("encode", "fused"),
                            ("server", "fused"), ("decode", "unfused (before)"), ("decode", "fused")):
        assert re.search(rf"64 KiB\s+{re.escape(kernel)}\s+{re.escape(variant)}\s+\d", text), (kernel, variant, text)
