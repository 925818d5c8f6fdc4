#!/usr/bin/env python
"""Peak memory of the patch-model explorer and grounding probe at LLaVA-1.5's sequence shape, before and after they
read attention layer by layer, and the size of the page they write.

    python benchmarks/explorer_memory.py            # measures, writes benchmarks/results/explorer_memory.json
    python benchmarks/explorer_memory.py --docs     # ... and rewrites docs/vlms.md's block from it
    python benchmarks/explorer_memory.py --docs_only benchmarks/results/explorer_memory.json

The model: `tiny_patch_model("llava")` with LLaVA-1.5's sequence shape and tiny widths (336 x 336 images in 14 x 14
patches = 576 image tokens, 32 language-model layers x 32 heads, hidden 64, one vision layer, random weights, fp32).
Each mode runs in a fresh process (`--measure MODE`) on the same grounded captions, and reports its peak resident set
size (`resource.getrusage(RUSAGE_SELF).ru_maxrss`, the process's peak, imports and model included):
- `forward`: the model's plain forward (its default sdpa attention) over the batches: the floor every mode shares;
- `full_maps`: the reading before (hf_vlalign at commit 1568b68): the probe's and the explorer's forwards with
  `output_attentions=True` under eager attention, every layer's (B, H, N, N) map kept and stacked, and a page of every
  head of every layer;
- `rows`: the reading now: `write_patch_explorer` (the probe, then the explorer examples), each layer's map read by
  `read_attention_rows` and dropped with its layer, the page keeping each layer's mean and `EXPLORER_HEADS` heads.
From the peaks above `forward`, the bytes per attention-map element: `full_maps` over L x B x H x N^2 elements (every
layer's maps) and `rows` over B x H x N^2 (one layer's map, alive while its layer runs); `bound` scales them to a 7 B
LLaVA (32 layers x 32 heads, bf16 weights), with the measured fp32 constants as upper bounds of bf16's.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from machine_info import cpu_model, versions  # noqa: E402  (benchmarks/machine_info.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "explorer_memory.json"
DOCS_BEGIN = "<!-- benchmarks/explorer_memory.py: begin -->"
DOCS_END = "<!-- benchmarks/explorer_memory.py: end -->"
MODES = ("forward", "full_maps", "rows")
# the 7 B models the bound is stated for: LLaVA-1.5-7B's language model (Vicuna-7B: 32 layers x 32 heads) over one
# 336-pixel view (576 image tokens) and over five (2,880: LLaVA-NeXT's 2 x 2 tiles and thumbnail), a 64-token prompt
SEVEN_B = {"layers": 32, "heads": 32, "text_tokens": 64, "parameters": 7.06e9}
IMAGE_TOKENS = (576, 2880)


@dataclass
class Sizes:
    image_size: int = 336
    patch_size: int = 14
    hidden_size: int = 64
    num_layers: int = 32
    num_heads: int = 32
    batch_size: int = 1
    num_examples: int = 2


def grounded_examples(count: int) -> list[dict]:
    """`count` grounded captions of plain images (two phrases each), images of varied sizes."""
    from PIL import Image

    caption = "A red box left of a blue ball on the grass ."
    start = caption.index("a blue")
    return [
        {
            "image": Image.new("RGB", (400 + 16 * index, 360), (200, 30 * index % 255, 30)),
            "caption": caption,
            "phrases": [
                {"char_start": 0, "char_end": 9, "boxes": [[0, 0, 200, 180]], "text": "A red box"},
                {"char_start": start, "char_end": start + 11, "boxes": [[200, 180, 400, 360]], "text": "a blue ball"},
            ],
        }
        for index in range(count)
    ]


def _model(sizes: Sizes):
    from hf_vlalign.vlms.tiny import tiny_patch_model

    model, processor = tiny_patch_model("llava", image_size=sizes.image_size, patch_size=sizes.patch_size,
                                        hidden_size=sizes.hidden_size, num_layers=sizes.num_layers,
                                        num_heads=sizes.num_heads)  # fmt: skip
    return model.eval(), processor


def _full_maps(model, processor, examples, sizes: Sizes, page: Path) -> None:
    """The reading before: every layer's maps from `output_attentions=True`, as the probe and explorer kept them."""
    from hf_vlalign.alignment.patches import cell_boxes, centre_prior
    from hf_vlalign.analysis.explorer import ExplorerExample, write_attention_explorer
    from hf_vlalign.analysis.grounding_probe import GroundingProbe
    from hf_vlalign.supervision.direct import normalise_rows
    from hf_vlalign.vlms import PatchGroundingCollator, eager_attention, forward_with_layout, patch_batches
    from hf_vlalign.vlms.probe import patch_attention_rows

    collator = PatchGroundingCollator(processor, model.config, return_details=True, with_labels=False)
    probe = GroundingProbe(sizes.num_layers, sizes.num_heads, collator.coverage_threshold, 0.2, True, "centre_patch")
    with torch.no_grad(), eager_attention(model):
        for batch in patch_batches(collator, examples, sizes.batch_size):
            outputs, layout = forward_with_layout(model, batch, output_attentions=True)
            rows = patch_attention_rows(outputs.attentions, layout.image_positions)
            centre = layout.to_tokens(centre_prior(layout.grid).expand(rows.shape[1], -1), fill=-1.0)
            coverage = layout.to_tokens(batch["phrase_cell_coverage"])
            probe.update_from_text_to_region(rows, batch["phrase_token_index"], coverage, layout.patch_mask, centre)
        batch = collator(examples[:1])
        outputs, layout = forward_with_layout(model, batch, output_attentions=True)
        to_image = patch_attention_rows(outputs.attentions, layout.image_positions)
    details = batch["details"][0]
    caption = slice(details["caption_start"], details["caption_end"])
    shown = ExplorerExample(
        words=collator.tokenizer.convert_ids_to_tokens(batch["input_ids"][0, caption].tolist()),
        region_boxes=cell_boxes(layout.grid).numpy(),
        attention={"word_to_region": normalise_rows(to_image[:, 0, :, caption]).numpy()},
    )
    write_attention_explorer([shown], page, probe=probe.compute())


def measure(mode: str, sizes: Sizes) -> dict:
    """Runs `mode` in this process; its peak resident set size and what it read."""
    from hf_vlalign.vlms import PatchGroundingCollator, forward_with_layout, patch_batches
    from hf_vlalign.vlms.explore import EXPLORER_HEADS, write_patch_explorer

    torch.manual_seed(0)
    model, processor = _model(sizes)
    examples = grounded_examples(sizes.num_examples)
    collator = PatchGroundingCollator(processor, model.config, with_labels=False)
    first = collator(examples[:1])
    result = {"mode": mode, "sequence_length": first["input_ids"].shape[1],
              "image_tokens": first["image_positions"].shape[1], "page_bytes": None}  # fmt: skip
    with tempfile.TemporaryDirectory() as folder:
        page = Path(folder) / "explorer.html"
        if mode == "forward":
            with torch.no_grad():
                for batch in patch_batches(collator, examples, sizes.batch_size):
                    forward_with_layout(model, batch)
        elif mode == "full_maps":
            _full_maps(model, processor, examples, sizes, page)
        else:
            write_patch_explorer(model, processor, examples, page, num_examples=1,
                                 probe_examples=sizes.num_examples, batch_size=sizes.batch_size)  # fmt: skip
            result["explorer_heads"] = EXPLORER_HEADS
        if page.exists():
            result["page_bytes"] = page.stat().st_size
    result["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def _in_subprocess(mode: str, sizes: Sizes) -> dict:
    command = [sys.executable, __file__, "--measure", mode, *(f"--{k}={v}" for k, v in asdict(sizes).items())]
    done = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def constants(report: dict) -> dict:
    """Bytes per attention-map element above the `forward` floor: `full_maps` per element of every layer's maps,
    `rows` per element of one layer's map."""
    sizes, runs = report["sizes"], {run["mode"]: run for run in report["runs"]}
    n, b, h, layers = runs["rows"]["sequence_length"], sizes["batch_size"], sizes["num_heads"], sizes["num_layers"]
    floor = runs["forward"]["peak_rss_bytes"]
    return {
        "full_maps_bytes_per_element": (runs["full_maps"]["peak_rss_bytes"] - floor) / (layers * b * h * n * n),
        "rows_bytes_per_element": max(runs["rows"]["peak_rss_bytes"] - floor, 0) / (b * h * n * n),
    }


def bound(report: dict, image_tokens: int, batch_size: int) -> dict:
    """GiB above the model's own forward for a 7 B LLaVA over `image_tokens` image tokens: every layer's maps (before)
    and one layer's map (now), from the measured bytes per element."""
    per = constants(report)
    n = image_tokens + SEVEN_B["text_tokens"]
    elements = batch_size * SEVEN_B["heads"] * n * n
    return {
        "image_tokens": image_tokens,
        "sequence_length": n,
        "batch_size": batch_size,
        "full_maps_gib": per["full_maps_bytes_per_element"] * SEVEN_B["layers"] * elements / 2**30,
        "rows_gib": per["rows_bytes_per_element"] * elements / 2**30,
    }


def docs_block(report: dict) -> str:
    """docs/vlms.md's block ("The explorer and the probe at real sizes"), markers included, from a results file."""
    sizes, runs = report["sizes"], {run["mode"]: run for run in report["runs"]}
    per = constants(report)
    gib = lambda value: f"{value / 2**30:.2f}"  # noqa: E731
    lines = [
        DOCS_BEGIN,
        f"Measured ({report['machine']['cpu']}, fp32, `python benchmarks/explorer_memory.py`): a LLaVA-shaped model of "
        f"{runs['rows']['image_tokens']} image tokens, {sizes['num_layers']} layers x {sizes['num_heads']} heads, "
        f"hidden {sizes['hidden_size']} (N = {runs['rows']['sequence_length']} tokens), {sizes['num_examples']} "
        f"captions probed in batches of {sizes['batch_size']}, a page of one example.",
        "",
        "| reading | peak RSS (GiB) | above the plain forward (GiB) | page (MB per example) |",
        "|---|---:|---:|---:|",
    ]
    floor = runs["forward"]["peak_rss_bytes"]
    names = {"forward": "plain forward (sdpa), no maps", "full_maps": "before: every layer's maps",
             "rows": "now: one layer's map at a time"}  # fmt: skip
    for mode in MODES:
        page = runs[mode]["page_bytes"]
        lines.append(f"| {names[mode]} | {gib(runs[mode]['peak_rss_bytes'])} | "
                     f"{gib(runs[mode]['peak_rss_bytes'] - floor)} | {'-' if page is None else f'{page / 1e6:.2f}'} |")  # fmt: skip
    lines += [
        "",
        f"Bytes per attention-map element above the plain forward: before {per['full_maps_bytes_per_element']:.1f} "
        f"(x L x B x H x N^2: every layer's maps), now {per['rows_bytes_per_element']:.1f} (x B x H x N^2: one "
        "layer's map while it runs). For a 7 B LLaVA (32 layers x 32 heads, N = image tokens + 64), on top of its own "
        f"forward ({SEVEN_B['parameters'] * 2 / 2**30:.1f} GiB of bf16 weights and its activations), the measured fp32 "
        "constants as upper bounds:",
        "",
        "| image tokens | batch | before: every layer's maps (GiB) | now: one layer's map (GiB) |",
        "|---:|---:|---:|---:|",
    ]
    for tokens in IMAGE_TOKENS:
        for batch_size in (1, 4):
            row = bound(report, tokens, batch_size)
            lines.append(f"| {tokens:,} | {batch_size} | {row['full_maps_gib']:,.1f} | {row['rows_gib']:,.2f} |")
    lines.append(DOCS_END)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--measure", choices=MODES, help="run one mode in this process and print its JSON")
    parser.add_argument("--docs", action="store_true", help="also rewrite docs/vlms.md's block")
    parser.add_argument("--docs_only", type=Path, metavar="RESULTS", help="only rewrite the block from RESULTS")
    parser.add_argument("--out", type=Path, default=RESULTS)
    for name, value in asdict(Sizes()).items():
        parser.add_argument(f"--{name}", type=int, default=value, help=f"default {value}")
    args = parser.parse_args(argv)
    sizes = Sizes(**{name: getattr(args, name) for name in asdict(Sizes())})
    if args.measure:
        torch.set_num_threads(1)
        result = measure(args.measure, sizes)
        print(json.dumps(result))
        return result
    if args.docs_only:
        report = json.loads(args.docs_only.read_text())
    else:
        report = {
            "sizes": asdict(sizes),
            "machine": {"cpu": cpu_model(), "torch_threads": 1},
            "versions": versions(),
            "runs": [_in_subprocess(mode, sizes) for mode in MODES],
        }
        report["constants"] = constants(report)
        report["bounds"] = [bound(report, tokens, b) for tokens in IMAGE_TOKENS for b in (1, 4)]
        write_results(args.out, report)
        print(f"wrote {args.out}")
    print(docs_block(report))
    if args.docs or args.docs_only:
        print(f"rewrote {replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))}")
    return report


if __name__ == "__main__":
    main()
