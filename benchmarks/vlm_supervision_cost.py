#!/usr/bin/env python
"""What attention supervision costs on transformers' own patch VLMs (ViLT, LLaVA, PaliGemma; `hf_vlalign.vlms`):
the training step time and the memory of direct and semi-direct supervision against no supervision, side by side in
one process, on the same batches.

    python benchmarks/vlm_supervision_cost.py                          # CPU, 1 thread: benchmarks/results/..._cpu.json
    python benchmarks/vlm_supervision_cost.py --device cuda            # a GPU: benchmarks/results/..._cuda.json
    python benchmarks/vlm_supervision_cost.py --steps 5 --warmup 1 --families llava --out /tmp/cost.json
    python benchmarks/vlm_supervision_cost.py --steps 20 --warmup 2 --docs   # the CPU run and docs/vlms.md's block
    python benchmarks/vlm_supervision_cost.py --docs_only benchmarks/results/vlm_supervision_cost_cpu.json

Settings, per family (`hf_vlalign.vlms.tiny.tiny_patch_model`, random weights, built offline; default sizes: 128 x
128 images in 16 x 16 patches = 64 image tokens, hidden 64, 4 language-model / encoder layers, 4 heads, 2 vision
layers, batch 16 grounded captions of the synthetic scenes, supervised layer 2, all heads; `--vocabulary data`: a
word-level tokenizer over the captions the benchmark trains on, as examples/finetune_patch_vlm.py's
`--tiny_vocabulary data`; `default_text_model`: the embedded default's 30,522-word WordPiece):
- `none`: the model's task loss alone (LLaVA's / PaliGemma's caption language-model loss);
- `direct`: + Samaran et al.'s direct supervision of the supervised layer's heads;
- `semi_direct`: + the supervision of attention rollout up to the supervised layer.
ViLT (`ViltModel`) has no task loss: it cannot train without supervision, so its baseline is `direct` and its ratio
is semi_direct / direct; the other families' ratios are to `none`.

Each setting is its own model (same seed, so the same initial weights) in a `PatchSupervisionTrainer`, and a step is
what the trainer's loop runs: `training_step` (its `compute_loss`: the recorder, the forward, the supervision loss;
then backward) followed by an AdamW step (`Trainer.create_optimizer`) and `zero_grad`. The settings are interleaved
round-robin (one step of each per round, the starting setting rotating) so that machine noise hits all alike; round r
uses batch r mod `--batches` for every setting. Warm-up rounds are not timed; the step time is the median over the
timed rounds (CUDA: synchronised before and after each step).

Memory, measured in one more untimed step per setting:
- saved for backward: the bytes of the tensors autograd saves during the step (`torch.autograd.graph.
  saved_tensors_hooks`), each storage counted once (by its data pointer, its whole storage's bytes), parameters
  excluded (they are saved by every setting alike): the activations the backward holds;
- CUDA only: `torch.cuda.max_memory_allocated` over the step, reset before it, and the step's peak above what was
  allocated when it began (gradients and activations; the three settings' weights and optimizer states stay
  resident in the process, so the absolute peak holds all of them).
No timing is asserted anywhere (tests/project/test_vlm_supervision_cost.py checks the structure, the docs block and
the memory claims docs/vlms.md makes of the committed results).

Reading the ratios: with `--vocabulary default_text_model` (MiniLM's WordPiece, 30,522 words + `<image>`) LLaVA's
and PaliGemma's step at hidden 64 is mostly the language-model head and its log-softmax over the vocabulary at every
position (and their logits are most of the bytes saved for backward), so their ratios are near 1; the default `data`
vocabulary (the captions' few dozen words) leaves the transformer layers, where the supervision acts, to dominate.
The extra milliseconds and bytes (`extra_step_seconds`, `extra_saved_for_backward_bytes`) carry over to other sizes
better than the ratios. The direct loss recomputes its logits in the backward (`torch.utils.checkpoint`), so it saves
little; semi-direct (its default `semi_direct_rollout="supervised_rows"`) keeps the caption's rollout rows and
recomputes the maps in the backward; with "full" it keeps every layer's maps up to the supervised one and their
rollout: O(layers x batch x heads x sequence^2) (benchmarks/vlm_supervision_scaling.py measures both).

`--docs` also rewrites the block between `DOCS_BEGIN` and `DOCS_END` on the page holding it (docs/vlms.md, "What
supervision costs") from the new results; `--docs_only RESULTS` rewrites it from a results file without measuring.
tests/project/test_vlm_supervision_cost.py checks that the block is `docs_block` of the committed CPU results.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from docs_blocks import replace_docs_block, write_results  # noqa: E402  (benchmarks/docs_blocks.py)
from machine_info import cpu_model, versions  # noqa: E402  (benchmarks/machine_info.py)

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "benchmarks" / "results"
FAMILIES = ("vilt", "llava", "paligemma")
SUPERVISIONS = ("none", "direct", "semi_direct")
VOCABULARIES = ("data", "default_text_model")
DOCS_BEGIN = "<!-- benchmarks/vlm_supervision_cost.py: begin -->"
DOCS_END = "<!-- benchmarks/vlm_supervision_cost.py: end -->"


@dataclass(frozen=True)
class Sizes:
    image_size: int = 128
    patch_size: int = 16
    hidden_size: int = 64
    num_layers: int = 4
    num_heads: int = 4
    vision_layers: int = 2
    batch: int = 16
    supervised_layer: int = 2


def settings_of(family: str) -> tuple[str, ...]:
    """The supervision settings a family can train with: ViLT (`ViltModel`) has no task loss, so not `none`."""
    return SUPERVISIONS[1:] if family == "vilt" else SUPERVISIONS


def baseline_of(family: str) -> str:
    return settings_of(family)[0]


# ----------------------------------------------------------------------------------------------------------- batches


def grounded_examples(count: int) -> list[dict]:
    """`count` grounded captions of the synthetic scenes (generated once, then cached)."""
    from hf_vlalign.synthetic.scenes import load_or_generate_synthetic_vgp
    from hf_vlalign.vlms import grounded_caption_examples

    paths = load_or_generate_synthetic_vgp()
    examples, _ = grounded_caption_examples(paths.flickr30k_entities, paths.images, "train", max_images=count)
    if len(examples) < count:
        raise ValueError(f"the synthetic scenes' train split holds {len(examples)} captions, fewer than {count}")
    return examples[:count]


def tokenizer_of(vocabulary: str, examples: list[dict]):
    """The tiny models' tokenizer: `data`: a word-level tokenizer over the captions of `examples` (the ones the
    benchmark trains on); `default_text_model`: None, `tiny_patch_model`'s default (MiniLM's WordPiece)."""
    from hf_vlalign.vlms.tiny import word_level_tokenizer

    if vocabulary not in VOCABULARIES:
        raise ValueError(f"`vocabulary` must be one of {VOCABULARIES}, got {vocabulary!r}")
    return word_level_tokenizer(example["caption"] for example in examples) if vocabulary == "data" else None


def to_device(batch: dict, device: torch.device) -> dict:
    return {key: value.to(device) if isinstance(value, torch.Tensor) else value for key, value in batch.items()}


# ------------------------------------------------------------------------------------------------------------- steps


class Trainee:
    """One setting: a tiny model of `family` in a `PatchSupervisionTrainer` with `supervision`, and its optimizer;
    `arguments`: more `PatchSupervisionTrainingArguments` fields (e.g. `semi_direct_rollout`)."""

    def __init__(self, family: str, supervision: str, sizes: Sizes, device: torch.device, seed: int, output_dir: str,
                 tokenizer=None, **arguments):  # fmt: skip
        from hf_vlalign.trainers.patch_supervision import PatchSupervisionTrainer, PatchSupervisionTrainingArguments
        from hf_vlalign.vlms import PatchGroundingCollator
        from hf_vlalign.vlms.tiny import tiny_patch_model

        self.family, self.supervision, self.device = family, supervision, device
        model, processor = tiny_patch_model(
            family, image_size=sizes.image_size, patch_size=sizes.patch_size, hidden_size=sizes.hidden_size,
            num_layers=sizes.num_layers, num_heads=sizes.num_heads, vision_layers=sizes.vision_layers, seed=seed,
            tokenizer=tokenizer,
        )  # fmt: skip
        self.collator = PatchGroundingCollator(processor, model.config)
        args = PatchSupervisionTrainingArguments(
            output_dir=output_dir, per_device_train_batch_size=sizes.batch, learning_rate=1e-4, report_to=[],
            attention_supervision=None if supervision == "none" else supervision,
            supervised_layers=[sizes.supervised_layer], remove_unused_columns=False, save_strategy="no",
            use_cpu=device.type == "cpu", seed=seed, **arguments,
        )  # fmt: skip
        self.trainer = PatchSupervisionTrainer(model=model, args=args, data_collator=self.collator)
        self.model = self.trainer.model.train()
        self.optimizer = self.trainer.create_optimizer()
        self.trainer.current_gradient_accumulation_steps = 1  # what the training loop sets: one micro-batch a step
        self.counts: dict[int, dict] = {}

    def step(self, batch: dict) -> float:
        """One training step on `batch` as the trainer's loop runs it; returns the loss."""
        key = id(batch)
        if key not in self.counts:
            self.counts[key] = self.trainer.global_item_counts([batch])
        self.trainer._step_item_counts = self.counts[key]  # what `get_batch_samples` sets for the step's compute_loss
        loss = self.trainer.training_step(self.model, batch)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return loss

    def attn_implementation(self) -> str:
        config = self.model.config
        text = getattr(config, "text_config", None)
        return (text or config)._attn_implementation if self.family != "vilt" else "eager (ViLT's own attention)"


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed_step(trainee: Trainee, batch: dict) -> tuple[float, float]:
    synchronize(trainee.device)
    start = time.perf_counter()
    loss = trainee.step(batch)
    synchronize(trainee.device)
    return time.perf_counter() - start, float(loss)


def saved_for_backward(trainee: Trainee, batch: dict) -> tuple[int, int]:
    """(bytes, storages) autograd saves for backward during one step, each storage once, parameters excluded."""
    parameters = {parameter.untyped_storage().data_ptr() for parameter in trainee.model.parameters()}
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        pointer = storage.data_ptr()
        if pointer not in parameters and pointer != 0:
            storages[pointer] = max(storages.get(pointer, 0), storage.nbytes())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        trainee.step(batch)
    return sum(storages.values()), len(storages)


def cuda_peak(trainee: Trainee, batch: dict) -> tuple[int, int]:
    """(max_memory_allocated over one step, that peak minus what was allocated when the step began)."""
    synchronize(trainee.device)
    torch.cuda.reset_peak_memory_stats(trainee.device)
    resting = torch.cuda.memory_allocated(trainee.device)
    trainee.step(batch)
    synchronize(trainee.device)
    peak = torch.cuda.max_memory_allocated(trainee.device)
    return peak, peak - resting


def ratio(value: float | None, baseline: float | None) -> float | None:
    return None if value is None or not baseline else value / baseline


def measure_family(family: str, sizes: Sizes, steps: int, warmup: int, batches: int, device: str | torch.device = "cpu",
                   seed: int = 0, examples: list[dict] | None = None, vocabulary: str = "data") -> dict:  # fmt: skip
    """Every supervision setting of `family` on the same batches, interleaved: the per-setting numbers and their
    ratios to the family's baseline (`none`; ViLT: `direct`). `vocabulary`: see `tokenizer_of`."""
    if steps < 1 or warmup < 0 or batches < 1:
        raise ValueError(f"need steps >= 1, warmup >= 0, batches >= 1; got {steps}, {warmup}, {batches}")
    device = torch.device(device)
    examples = examples if examples is not None else grounded_examples(sizes.batch * batches)
    tokenizer = tokenizer_of(vocabulary, examples)
    settings = settings_of(family)
    with tempfile.TemporaryDirectory() as output_dir:
        trainees = {name: Trainee(family, name, sizes, device, seed, output_dir, tokenizer) for name in settings}
        collator = trainees[settings[0]].collator
        batch_list = [
            to_device(collator(examples[index * sizes.batch : (index + 1) * sizes.batch]), device)
            for index in range(batches)
        ]
        times: dict[str, list[float]] = {supervision: [] for supervision in settings}
        losses: dict[str, float] = {}
        for round_index in range(warmup + steps):
            batch = batch_list[round_index % batches]
            shift = round_index % len(settings)
            for supervision in settings[shift:] + settings[:shift]:
                seconds, losses[supervision] = timed_step(trainees[supervision], batch)
                if round_index >= warmup:
                    times[supervision].append(seconds)
        runs = {}
        for supervision in settings:
            trainee = trainees[supervision]
            saved_bytes, saved_storages = saved_for_backward(trainee, batch_list[0])
            peak, step_peak = cuda_peak(trainee, batch_list[0]) if device.type == "cuda" else (None, None)
            runs[supervision] = {
                "step_seconds": statistics.median(times[supervision]),
                "step_seconds_all": times[supervision],
                "saved_for_backward_bytes": saved_bytes,
                "saved_for_backward_storages": saved_storages,
                "cuda_max_memory_allocated_bytes": peak,
                "cuda_step_peak_bytes": step_peak,
                "final_loss": losses[supervision],
            }
        first = trainees[settings[0]]
        described = {
            "parameters": sum(parameter.numel() for parameter in first.model.parameters()),
            "vocabulary": vocabulary,
            "vocabulary_size": first.model.get_input_embeddings().num_embeddings,
            "sequence_length": int(batch_list[0]["input_ids"].shape[1]) + (
                (sizes.image_size // sizes.patch_size) ** 2 + 1 if family == "vilt" else 0  # ViLT appends the image
            ),
            "image_tokens": (sizes.image_size // sizes.patch_size) ** 2,
            "attn_implementation": first.attn_implementation(),
            "optimizer": type(first.optimizer).__name__,
        }
        del trainees
    baseline = baseline_of(family)
    base = runs[baseline]
    for run in runs.values():
        run["time_ratio"] = ratio(run["step_seconds"], base["step_seconds"])
        run["extra_step_seconds"] = run["step_seconds"] - base["step_seconds"]
        run["extra_saved_for_backward_bytes"] = run["saved_for_backward_bytes"] - base["saved_for_backward_bytes"]
        run["saved_for_backward_ratio"] = ratio(run["saved_for_backward_bytes"], base["saved_for_backward_bytes"])
        run["cuda_max_memory_allocated_ratio"] = ratio(
            run["cuda_max_memory_allocated_bytes"], base["cuda_max_memory_allocated_bytes"]
        )
        run["cuda_step_peak_ratio"] = ratio(run["cuda_step_peak_bytes"], base["cuda_step_peak_bytes"])
    return {"family": family, "baseline": baseline, **described, "settings": runs}


# ------------------------------------------------------------------------------------------------------------ report


def machine(device: torch.device) -> dict:
    info = {
        "cpu": cpu_model(),
        "platform": platform.platform(),
        "cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None,
        "device": device.type,
        "gpu": None,
    }
    if device.type == "cuda":
        properties = torch.cuda.get_device_properties(device)
        info["gpu"] = {"name": properties.name, "memory_gib": properties.total_memory / 2**30,
                       "cuda": torch.version.cuda}  # fmt: skip
    return info


def _mib(value: int | None) -> str:
    return "-" if value is None else f"{value / 2**20:.1f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def vocabulary_of(report: dict) -> str:
    """The tiny models' vocabulary in words: `data` or `default_text_model`, and its size (the input embedding's rows,
    specials included)."""
    family = report["families"][0]
    vocabulary = report["settings"].get("vocabulary", family.get("vocabulary"))
    sizes = {entry["family"]: entry.get("vocabulary_size") for entry in report["families"]}
    size = "" if family.get("vocabulary_size") is None else f" ({family['vocabulary_size']:,} tokens"
    if size and sizes.get("paligemma") not in (None, family["vocabulary_size"]):
        size += f"; PaliGemma {sizes['paligemma']:,} with its processor's `<loc>` / `<seg>` tokens"
    size += ")" if size else ""
    if vocabulary == "data":
        return f"a word-level vocabulary of the training captions{size}"
    return f"the default text model's WordPiece{size}"


def caption(report: dict) -> str:
    """One line: the machine, threads, sizes, vocabulary, steps, and what the ratios are to."""
    machine_, settings, sizes = report["machine"], report["settings"], report["settings"]["sizes"]
    where = (
        f"{machine_['gpu']['name']} (CUDA {machine_['gpu']['cuda']})" if machine_["device"] == "cuda"
        else f"CPU ({machine_['cpu']}), {machine_['torch_threads']} thread{'s' if machine_['torch_threads'] != 1 else ''}"
    )  # fmt: skip
    return (
        f"{where}, torch {report['versions']['torch']}; batch {sizes['batch']}, {sizes['image_size']} px images in "
        f"{sizes['patch_size']} px patches ({(sizes['image_size'] // sizes['patch_size']) ** 2} image tokens), hidden "
        f"{sizes['hidden_size']}, {sizes['num_layers']} layers of {sizes['num_heads']} heads, supervised layer "
        f"{sizes['supervised_layer']}; {vocabulary_of(report)}; median step of {settings['steps']} after "
        f"{settings['warmup']} warm-up rounds. Ratios are to the `none` setting measured in the same run (ViLT: to "
        "`direct`, it has no task loss)."
    )


def table(report: dict) -> str:
    """The caption line, then the table of every family's settings (and the CUDA peak columns on a GPU)."""
    cuda = report["machine"]["device"] == "cuda"
    lines = [
        caption(report),
        "",
        "| family | supervision | step (ms) | time ratio | saved for backward (MiB) | extra saved (MiB) | saved ratio |"
        + (" CUDA peak (MiB) | step peak (MiB) | step peak ratio |" if cuda else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|---|" if cuda else ""),
    ]
    for family in report["families"]:
        for supervision, run in family["settings"].items():
            row = (
                f"| {family['family']} | {supervision} | {1000 * run['step_seconds']:.1f} | {_ratio(run['time_ratio'])}"
                f" | {_mib(run['saved_for_backward_bytes'])} | {_mib(run['extra_saved_for_backward_bytes'])}"
                f" | {_ratio(run['saved_for_backward_ratio'])} |"
            )
            if cuda:
                row += (
                    f" {_mib(run['cuda_max_memory_allocated_bytes'])} | {_mib(run['cuda_step_peak_bytes'])} |"
                    f" {_ratio(run['cuda_step_peak_ratio'])} |"
                )
            lines.append(row)
    return "\n".join(lines)


def docs_block(report: dict) -> str:
    """The block of docs/vlms.md ("What supervision costs"), markers included, from a results file of this script."""
    return f"{DOCS_BEGIN}\n{table(report)}\n{DOCS_END}"


def write_docs(report: dict) -> Path:
    """Rewrites the block on the page holding `DOCS_BEGIN`; returns that page."""
    return replace_docs_block(DOCS_BEGIN, DOCS_END, docs_block(report))


def benchmark(args: argparse.Namespace) -> dict:
    device = torch.device(args.device)
    sizes = Sizes(args.image_size, args.patch_size, args.hidden_size, args.num_layers, args.num_heads,
                  args.vision_layers, args.batch, args.supervised_layer)  # fmt: skip
    examples = grounded_examples(sizes.batch * args.batches)
    load_before = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
    families = []
    for family in args.families:
        started = time.perf_counter()
        measured = measure_family(family, sizes, args.steps, args.warmup, args.batches, device, args.seed, examples,
                                  args.vocabulary)  # fmt: skip
        families.append(measured)
        print(f"{family}: measured in {time.perf_counter() - started:.0f} s", flush=True)
    info = machine(device)
    info["load_average_before"], info["load_average_after"] = load_before, info.pop("load_average")
    return {
        "settings": {
            "command": " ".join(["python", "benchmarks/vlm_supervision_cost.py", *args.argv]),
            "sizes": asdict(sizes),
            "steps": args.steps,
            "warmup": args.warmup,
            "batches": args.batches,
            "seed": args.seed,
            "vocabulary": args.vocabulary,
            "precision": "fp32",
            "step": (
                "PatchSupervisionTrainer.training_step (forward, supervision loss, backward) + optimizer step + "
                "zero_grad; settings interleaved round-robin, median step time"
            ),
            "memory": (
                "saved for backward: saved_tensors_hooks, each storage once, parameters excluded; CUDA: "
                "max_memory_allocated over one step (reset before it) and that peak minus the allocation at the "
                "step's start"
            ),
            "baselines": {family: baseline_of(family) for family in args.families},
        },
        "machine": info,
        "versions": versions(),
        "families": families,
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    defaults = Sizes()
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"), help="default cpu")
    parser.add_argument("--out", type=Path, default=None,
                        help="results JSON (default benchmarks/results/vlm_supervision_cost_<device>.json)")
    parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES, metavar="FAMILY")
    parser.add_argument("--steps", type=int, default=10, help="timed rounds (one step of each setting per round)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--batches", type=int, default=2, help="distinct batches, cycled over the rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--vocabulary", default="data", choices=VOCABULARIES,
                        help="the tiny models' tokenizer: 'data' (default: word-level over the training captions, as "
                        "examples/finetune_patch_vlm.py's --tiny_vocabulary data) or 'default_text_model' (the "
                        "embedded default's 30,522-word WordPiece)")  # fmt: skip
    parser.add_argument("--docs", action="store_true", help="also rewrite docs/vlms.md's block from the new results")
    parser.add_argument("--docs_only", type=Path, default=None, metavar="RESULTS",
                        help="only rewrite docs/vlms.md's block from this results JSON (no measuring)")
    parser.add_argument("--image_size", type=int, default=defaults.image_size, help="default 128")
    parser.add_argument("--patch_size", type=int, default=defaults.patch_size, help="default 16")
    parser.add_argument("--hidden_size", type=int, default=defaults.hidden_size, help="default 64")
    parser.add_argument("--num_layers", type=int, default=defaults.num_layers, help="default 4")
    parser.add_argument("--num_heads", type=int, default=defaults.num_heads, help="default 4")
    parser.add_argument("--vision_layers", type=int, default=defaults.vision_layers, help="default 2")
    parser.add_argument("--batch", type=int, default=defaults.batch, help="default 16")
    parser.add_argument("--supervised_layer", type=int, default=defaults.supervised_layer, help="default 2")
    args = parser.parse_args(argv)
    args.argv = sys.argv[1:] if argv is None else list(argv)
    if args.docs_only is not None:
        report = json.loads(args.docs_only.read_text())
        print(f"rewrote {write_docs(report)}")
        return report
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: CUDA is not available")
    if args.steps < 1 or args.warmup < 0 or args.batches < 1:
        parser.error(f"need --steps >= 1, --warmup >= 0, --batches >= 1; got {args.steps} {args.warmup} {args.batches}")
    if not 0 <= args.supervised_layer < args.num_layers:
        parser.error(f"--supervised_layer must be in [0, {args.num_layers - 1}], got {args.supervised_layer}")
    out = args.out or RESULTS_DIR / f"vlm_supervision_cost_{args.device}.json"
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    logging.getLogger("hf_vlalign").setLevel(logging.ERROR)
    report = benchmark(args)
    print(table(report))
    write_results(out, report)
    print(f"wrote {out}")
    if args.docs:
        print(f"rewrote {write_docs(report)}")
    return report


if __name__ == "__main__":
    main()
