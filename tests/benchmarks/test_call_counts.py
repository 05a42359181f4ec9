"""``zerocomm-bench call-counts`` runs end to end at 2 forked gloo ranks and prints a row per call kind, with
torch's own count beside the native ones."""
import subprocess
import sys


def test_call_counts_prints_every_kind_beside_torch():
    done = subprocess.run([sys.executable, "-m", "zerocomm.benchmarks", "call-counts", "--calls", "3", "--warmup", "1"],
                          capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {line.split("  ")[0]: line.split() for line in done.stdout.splitlines()
            if line.startswith(("all_", "reduce_", "broadcast", "default"))}
    assert len(rows) == 8, done.stdout
    for name, cells in rows.items():
        numbers = [c for c in cells if c.replace(".", "").isdigit()]
        if not name.startswith("default"):
            assert len(numbers) >= 3, (name, cells)  # zerocomm, torch, the ratio
            assert float(numbers[0]) > 0 and float(numbers[1]) > 0, (name, cells)
