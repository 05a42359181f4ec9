"""`.ci/run` runs README.md's test command verbatim, and nothing lets a run that tested nothing pass."""
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CI_RUN = os.path.join(ROOT, ".ci", "run")


def readme_block(marker: str, readme: str = os.path.join(ROOT, "README.md")) -> str:
    """The fenced block that follows ``<!-- marker -->`` in the README."""
    with open(readme, encoding="utf-8") as handle:
        text = handle.read()
    match = re.search(rf"<!-- {marker} -->\s*```[a-z]*\n(.*?)\n```", text, re.S)
    assert match, f"README.md has no fenced block after <!-- {marker} -->"
    return match.group(1)


def test_ci_runs_the_readme_test_command_verbatim():
    printed = subprocess.run(["bash", CI_RUN, "--print-command"], capture_output=True, text=True, check=True)
    assert printed.stdout.rstrip("\n") == readme_block("test-command")


def test_readme_commands_are_one_line_each_with_the_same_setup():
    test, main = readme_block("test-command"), readme_block("main-command")
    assert "\n" not in test and "\n" not in main
    setup = test.rsplit(" && ", 1)[0]
    assert main.startswith(setup + " && ") and main.endswith(
        "zerocomm-bench --nprocs 4 --peers")
    assert test.endswith("python -m pytest tests") and "pip install torch==2.13.0" in setup


@pytest.mark.parametrize("status", [0, 1, 5])
def test_ci_passes_the_command_status_through(tmp_path, status):
    """Exit status 5 (pytest collected nothing) fails CI like any other non-zero status."""
    shutil.copytree(os.path.join(ROOT, ".ci"), tmp_path / ".ci")
    (tmp_path / "README.md").write_text(f"<!-- test-command -->\n```bash\necho ran && exit {status}\n```\n")
    done = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True)
    assert done.returncode == status and "ran" in done.stdout
    assert ("collected no tests" in done.stderr) == (status == 5)


def test_ci_fails_without_a_command(tmp_path):
    shutil.copytree(os.path.join(ROOT, ".ci"), tmp_path / ".ci")
    (tmp_path / "README.md").write_text("no marker here\n")
    done = subprocess.run(["bash", str(tmp_path / ".ci" / "run")], capture_output=True, text=True)
    assert done.returncode == 2 and "test-command" in done.stderr
