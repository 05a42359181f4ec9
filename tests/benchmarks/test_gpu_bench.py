"""``zerocomm-bench gpu`` where there is no GPU: its arguments, its refusal, and its test summary.

The measurements themselves need a CUDA device; they run in ``benchmarks/gpu_device_check.sh`` on one.
"""
import pytest
import torch

from zerocomm.benchmarks import cli, gpu


def test_parses_sections_and_defaults():
    args = cli.build_parser().parse_args(["gpu", "--sections", "calls,codec", "--tests", "skip", "--steps", "4"])
    assert args.command == "gpu" and args.sections == ["calls", "codec"] and args.tests == "skip"
    assert args.steps == 4 and args.warmup == 3 and args.codec_mib == 256
    assert cli.build_parser().parse_args(["gpu"]).sections == list(gpu.SECTIONS)


def test_an_unknown_section_is_refused(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["gpu", "--sections", "calls,speed"])
    assert exit_info.value.code == 2
    assert "unknown section 'speed'; expected one of calls, training, codec, tests" in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [(["--steps", "0"], "--steps must be at least 1, got 0"),
                                         (["--tests", "nowhere.xml"], "an existing pytest --junitxml file")])
def test_bad_values_are_refused_before_anything_runs(argv, words, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["gpu", *argv])
    assert exit_info.value.code == 2 and words in capsys.readouterr().err


def test_without_cuda_it_says_so_and_measures_nothing(monkeypatch, capsys):
    monkeypatch.setattr(gpu, "cuda_missing", lambda: "no CUDA device is visible (CUDA_VISIBLE_DEVICES=None)")
    monkeypatch.setattr(gpu, "_in_child", lambda *a: pytest.fail("a measuring process was started"))
    assert cli.main(["gpu"]) == 1
    err = capsys.readouterr().err
    assert "zerocomm-bench gpu needs a CUDA device: no CUDA device is visible" in err
    assert "Nothing was measured." in err


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="this torch is built with CUDA")
def test_a_cpu_torch_is_named_as_the_reason():
    assert gpu.cuda_missing() == f"this torch ({torch.__version__}) is built without CUDA"


def test_junit_summary_counts_per_module(tmp_path):
    report = tmp_path / "r.xml"
    report.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.zero.test_zero_cuda" name="test_a[offload]">'
        '<failure message="AssertionError: offload stage 1 bf16: 1 bytes">trace</failure></testcase>'
        '<testcase classname="tests.zero.test_zero_cuda" name="test_a[training]"/>'
        '<testcase classname="tests.comm.test_nccl" name="test_every_gpu">'
        '<skipped message="needs 2 CUDA devices (1 on this machine)"/></testcase>'
        '<testcase classname="tests.comm.test_nccl" name="test_one"/>'
        '</testsuite></testsuites>')
    summary = gpu.summarize_junit(str(report))
    assert (summary["passed"], summary["failed"], summary["skipped"]) == (2, 1, 1)
    assert summary["files"] == {"tests.zero.test_zero_cuda": {"passed": 1, "failed": 1, "skipped": 0},
                                "tests.comm.test_nccl": {"passed": 1, "failed": 0, "skipped": 1}}
    assert summary["failures"] == ["tests.zero.test_zero_cuda::test_a[offload]: AssertionError: offload stage 1 bf16: "
                                   "1 bytes"]
    assert summary["skips"] == {"needs 2 CUDA devices (1 on this machine)": 1}
    text = gpu.format_summary(summary)
    assert "FAILED tests.zero.test_zero_cuda::test_a[offload]" in text and "| all" in text


def test_a_test_summary_alone_needs_no_gpu(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gpu, "cuda_missing", lambda: "no CUDA device is visible")
    report = tmp_path / "r.xml"
    report.write_text('<testsuites><testsuite><testcase classname="tests.ops.test_onebit" name="test_cuda"/>'
                      '</testsuite></testsuites>')
    assert cli.main(["gpu", "--sections", "tests", "--tests", str(report)]) == 0
    out = capsys.readouterr().out
    assert "| tests.ops.test_onebit |        1 |        0 |         0 |" in out
