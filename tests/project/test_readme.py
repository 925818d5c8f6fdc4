"""The README and the docs pages stay true: the README's two set-up commands, and every ```python block of README.md
and of docs/*.md runs, offline, after the main job (```bash blocks launch training runs and are not run here;
tests/project/test_readme_layout.py checks the scripts and verbs they name).

Each block runs as a test of its own (id: its page, its index on the page and the heading above it) in a fresh namespace, in an empty
working directory holding `outputs/vgp`, a link to the `finetuned` fixture's model (a tiny real run of the main job,
examples/finetune_vgp.py), with the Hub switched off and the synthetic scenes' cache a copy of that run's (12 training
and 6 evaluation images). A new block therefore runs as soon as it is written, and a block that needs the network
fails: nothing is skipped.

A block that needs more says so in HTML comments on the lines right above its fence (invisible on the rendered page),
and nothing else about it is changed:

    <!-- docs-test: needs outputs/captioning -->
        the folder is made by the library before the block runs (`NEEDS`: a folder missing there fails), and the
        text above the block must name it, with the command that writes it;
    <!-- docs-test: tiny `OLD` -> `NEW` -->
        the block runs with OLD, which must occur in it exactly once, replaced by NEW: fewer images, batches or steps.
"""

import re
import shutil
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub.constants
import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
README = (ROOT / "README.md").read_text()
MARKER = re.compile(r"<!-- docs-test: (.*?) -->")
TINY = re.compile(r"tiny `(.+?)` -> `(.+?)`")
NEEDS_DIRECTIVE = re.compile(r"needs (\S+)")


@dataclass
class Block:
    page: str  # relative to the repository, e.g. "docs/models.md"
    index: int  # on its page
    line: int  # of the opening fence, 1-based
    heading: str
    prose: str  # the page's text between the previous fence (or heading) and this block
    source: str
    needs: list[str] = field(default_factory=list)
    tiny: list[tuple[str, str]] = field(default_factory=list)

    @property
    def id(self) -> str:
        return f"{Path(self.page).stem}-{self.index:02d}-" + re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")[:40].rstrip("-")

    def runnable_source(self) -> str:
        source = self.source
        for old, new in self.tiny:
            count = source.count(old)
            assert count == 1, f"{self.page} block {self.id}: the tiny marker's `{old}` occurs {count} times, not once"
            source = source.replace(old, new)
        return source


def _directives(block: Block, markers: list[str]) -> None:
    for marker in markers:
        if tiny := TINY.fullmatch(marker):
            block.tiny.append(tiny.groups())
        elif needs := NEEDS_DIRECTIVE.fullmatch(marker):
            block.needs.append(needs.group(1))
        else:
            raise ValueError(f"{block.page} block {block.id}: unknown marker {marker!r} (expected `needs DIR` or `tiny ...`)")


def _markers_above(lines: list[str], fence: int) -> list[str]:
    markers = []
    while fence > 0 and (marker := MARKER.fullmatch(lines[fence - 1])):
        markers.insert(0, marker.group(1))
        fence -= 1
    return markers


def python_blocks(text: str, page: str) -> list[Block]:
    """Every ```python block of `text` (the page `page`), with the heading and text above it and the markers right
    above its fence."""
    lines = text.splitlines()
    blocks, heading, prose_start, fence = [], "", 0, None
    for number, line in enumerate(lines):
        if fence is None and line.startswith("```"):
            fence = number
        elif fence is None and line.startswith("#"):
            heading, prose_start = line.lstrip("#").strip(), number + 1
        elif fence is not None and line.startswith("```"):
            if lines[fence] == "```python":
                prose, source = "\n".join(lines[prose_start:fence]), "\n".join(lines[fence + 1 : number]) + "\n"
                blocks.append(Block(page, len(blocks), fence + 1, heading, prose, source))
                _directives(blocks[-1], _markers_above(lines, fence))
            fence, prose_start = None, number + 1
    return blocks


BLOCKS = [block for path in PAGES for block in python_blocks(path.read_text(), str(path.relative_to(ROOT)))]


def test_readme_opens_with_the_two_setup_commands_and_ci_runs_the_test_command():
    commands = re.findall(r"^pip install .*$", README.split("## ")[0], re.M)
    assert len(commands) == 2
    main_job, tests = commands
    launch = "accelerate launch --config_file examples/accelerate_configs/single_process.yaml examples/finetune_vgp.py"
    assert main_job.startswith("pip install torch==2.13.0 && ") and main_job.endswith(launch)
    assert tests.startswith("pip install torch==2.14.1 torchvision==0.29.1 && ") and "pytest" in tests
    assert tests in (ROOT / ".ci" / "run").read_text()


def make_captioner(folder: Path) -> None:
    """`outputs/captioning` as examples/train_captioning.py writes it, from the example's own `parse_args` and
    `load_model`, untrained and with one layer a side (tests/trainers/test_captioning_training.py trains the example and
    reloads its folder; the docs' block only loads it, generates and scores)."""
    from transformers import AutoTokenizer, set_seed

    from hf_vlalign import default_text_model_path
    from hf_vlalign.synthetic import SyntheticSceneConfig

    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_captioning
    finally:
        sys.path.remove(str(ROOT / "examples"))
    args, training_args = train_captioning.parse_args(["--encoder_layers", "1", "--decoder_layers", "1"])
    assert training_args.output_dir == "outputs/captioning"  # where docs/models.md says the example writes it
    set_seed(training_args.seed)
    train_captioning.load_model(args, SyntheticSceneConfig().feature_dim).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_text_model_path()).save_pretrained(folder)


NEEDS: dict[str, Callable[[Path], None]] = {"outputs/captioning": make_captioner}


@pytest.fixture(scope="module")
def scene_cache(finetuned, tmp_path_factory) -> Path:
    """A copy of the main job fixture's synthetic-scene cache (its 12 + 6 images, generated and converted)."""
    cache = tmp_path_factory.mktemp("readme") / "cache"
    shutil.copytree(finetuned / "cache", cache)
    return cache


@pytest.fixture(scope="module")
def needed_folders(tmp_path_factory) -> Callable[[str], Path]:
    made: dict[str, Path] = {}

    def folder(name: str) -> Path:
        if name not in made:
            made[name] = tmp_path_factory.mktemp("needs") / Path(name).name
            NEEDS[name](made[name])
        return made[name]

    return folder


@pytest.fixture
def run_block(finetuned, scene_cache, needed_folders, tmp_path, monkeypatch) -> Callable[[Block], None]:
    """Runs a block in a fresh namespace, in an empty working directory where `outputs/vgp` is the main job's
    model and the folders the block needs exist; the Hub is off and the scenes come from `scene_cache`."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_VLALIGN_CACHE", str(scene_cache))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "vgp").symlink_to(finetuned / "model", target_is_directory=True)

    def run(block: Block) -> None:
        for name in block.needs:
            assert name in NEEDS, f"{block.page} block {block.id} needs {name}, which tests/project/test_readme.py cannot make"
            assert name in block.prose, f"{block.page} block {block.id}: the text above it must say what writes {name}"
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).symlink_to(needed_folders(name), target_is_directory=True)
        code = compile(block.runnable_source(), f"{block.page}, block {block.id} (line {block.line})", "exec")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(code, {"__name__": f"docs_block_{Path(block.page).stem}_{block.index}"})
        deprecated = [
            f"line {w.lineno}: {w.message}"
            for w in caught
            if issubclass(w.category, (DeprecationWarning, FutureWarning)) and w.filename == code.co_filename
        ]
        assert not deprecated, f"{block.page} block {block.id} uses deprecated API: {deprecated}"

    return run


@pytest.mark.parametrize("page", PAGES, ids=[str(path.relative_to(ROOT)) for path in PAGES])
def test_every_python_block_is_found_and_every_marker_belongs_to_one(page):
    text, name = page.read_text(), str(page.relative_to(ROOT))
    blocks = [block for block in BLOCKS if block.page == name]
    assert len(blocks) == sum(line == "```python" for line in text.splitlines()), name
    markers = sum(len(block.needs) + len(block.tiny) for block in blocks)
    on_own_line = [line for line in text.splitlines() if MARKER.fullmatch(line)]
    assert markers == len(on_own_line), f"{name}: a docs-test marker is not on the lines right above a python block"


def test_the_pages_hold_the_python_blocks():
    assert len(BLOCKS) >= 12 and {block.page for block in BLOCKS} >= {"README.md", "docs/datasets.md", "docs/models.md"}


def test_quick_start_runs(run_block, capsys):
    assert BLOCKS[0].page == "README.md" and BLOCKS[0].heading == "Quick start"
    run_block(BLOCKS[0])
    first, *words = capsys.readouterr().out.splitlines()
    assert first == "10 regions, 6 layers of attention maps"  # the whole photo and a 3 x 3 grid; MiniLM's 6 layers
    # one line per word of the caption, each with its most attended box in pixels and its weight
    assert [line.split(" -> ")[0].strip() for line in words] == "a woman in a dark uniform with a white collar".split()
    assert all(re.search(r" -> box \[\d+, \d+, \d+, \d+\] \(weight [01]\.\d\d\)$", line) for line in words)


@pytest.mark.parametrize("block", BLOCKS, ids=[block.id for block in BLOCKS])
def test_python_block_runs(block, run_block):
    run_block(block)
