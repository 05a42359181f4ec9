"""docs/capabilities.md is generated from the code; it must say what the code says."""
import json
import pathlib
import subprocess
import sys

import torch

from zerocomm.comm import capabilities

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "capabilities.md"


def test_committed_doc_matches_the_code():
    expected = capabilities.render_markdown()
    assert DOC.read_text() == expected, (
        "docs/capabilities.md is stale: regenerate it with "
        "`python -m zerocomm.comm.capabilities > docs/capabilities.md`")


def test_cli_prints_markdown_and_json(capsys):
    # One real command line proves ``python -m`` runs main(); the --json flags go through the same main()
    # in this process (a second interpreter importing torch cost ~3 s of the suite).
    markdown = subprocess.run([sys.executable, "-m", "zerocomm.comm.capabilities"], capture_output=True,
                              text=True, check=True).stdout
    assert markdown.startswith("# Backend capability matrix")
    assert capabilities.main(["--json", "--backend", "gloo"]) == 0
    cells = json.loads(capsys.readouterr().out)
    assert cells and {c["backend"] for c in cells} == {"gloo"}
    assert all(c["supported"] or (c["reason"] and c["instead"]) for c in cells)


def test_every_cell_is_answered_and_refusals_say_what_instead():
    for cell in capabilities.capability_matrix():
        assert cell.supported or (cell.reason and cell.instead), cell


def test_lookup_examples():
    assert capabilities.lookup("gloo", "cpu", "all_reduce", "ring", torch.bfloat16, "sum").supported
    refused = capabilities.lookup("nccl", "cuda", "all_reduce", "native", torch.int32, "band")
    assert not refused.supported and "ring" in refused.instead
    assert not capabilities.lookup("gloo", "cuda", "broadcast", "native", torch.float32).supported
    assert not capabilities.lookup("mpi", "cpu", "all_reduce", "native", torch.float32, "band").supported


def test_native_operations_table_names_every_collective():
    table = capabilities.native_operations()
    for backend in capabilities.BACKENDS:
        assert set(capabilities.COLLECTIVES) <= set(table[backend]), backend
