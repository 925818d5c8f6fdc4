"""The README stays true: its two set-up commands, and its quick start runs against a real fine-tuned checkpoint."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_test_command():
    commands = re.findall(r"^pip install .*$", README.split("## ")[0], re.M)
    assert len(commands) == 2
    main_job, tests = commands
    assert main_job.startswith("pip install torch==2.13.0 && ") and "accelerate launch examples/finetune_vgp.py" in main_job
    assert tests.startswith("pip install torch==2.13.0 && ") and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def test_quick_start_runs(finetuned, capsys):
    snippet = re.findall(r"```python\n(.*?)```", README, re.S)[0]
    exec(snippet.replace('"outputs/vgp"', repr(str(finetuned / "model"))), {})
    printed = capsys.readouterr().out
    assert "torch.Size([1, " in printed and ", 384])" in printed
