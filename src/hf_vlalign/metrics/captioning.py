"""Caption metrics through `pycocoevalcap`, the COCO caption evaluation code: BLEU-1..4, METEOR, ROUGE-L, CIDEr-D
(and SPICE where its Stanford CoreNLP jars are present), plus per-caption CIDEr-D rewards for self-critical training.

    >>> caption_scores(["a dog runs on the grass"], [["a dog is running on grass", "a brown dog runs"]])
    {'bleu_1': ..., 'bleu_2': ..., 'bleu_3': ..., 'bleu_4': ..., 'meteor': ..., 'rouge_l': ..., 'cider': ...}

Captions are tokenised as the COCO evaluation does (`tokenizer="ptb"`: the PTBTokenizer jar shipped in pycocoevalcap
with `-preserveLines -lowerCase`, then its `PUNCTUATIONS` dropped), by a pure-Python approximation ("simple") or not
at all ("none"). The PTB tokenizer and METEOR 1.5 (one Java process, started on first use and kept until exit or
`close_meteor()`, since it takes ~6 s to load its paraphrase table) need `java` on PATH. SPICE also needs Stanford
CoreNLP 3.6.0's two jars in pycocoevalcap's `spice/lib/`, which no registry ships and nothing here downloads
(`spice_unavailable_reason()` says what is missing).

CIDEr-D (Vedantam et al. 2015) is pycocoevalcap's `Cider`, the variant the COCO server reports. Its idf comes from the
references being evaluated, so the CIDEr-D of a single image is 0 (every n-gram's idf is log(1) - log(1)).
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import re
import shutil
import subprocess
import tempfile
import threading
import warnings
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path

from ..utils.optional import MissingDependencyError, require
from .local_modules import MODULES_DIR, load_local_metric

ALL_METRICS = ("bleu", "meteor", "rouge_l", "cider", "spice")
DEFAULT_METRICS = ("bleu", "meteor", "rouge_l", "cider")
TOKENIZERS = ("ptb", "simple", "none")

CAPTION_METRIC_PATH = MODULES_DIR / "caption_scores"

_JAVA_HINT = (
    "Install a Java runtime (Debian/Ubuntu: `apt-get install -y default-jre-headless`) and make sure `java` is on PATH"
)


def _check_captions(predictions, references) -> tuple[list[str], list[list[str]]]:
    """One list of references per prediction, none empty (an empty corpus or reference list has no score)."""
    if len(predictions) == 0 or len(predictions) != len(references):
        raise ValueError(
            f"`predictions` and `references` must have the same length (one list of references per prediction, at "
            f"least one caption), got {len(predictions)} predictions and {len(references)} reference lists."
        )
    for i, refs in enumerate(references):
        if len(refs) == 0:
            raise ValueError(f"`references[{i}]` must hold at least one reference caption, got an empty list.")
    return list(predictions), [list(refs) for refs in references]


def _check_metrics(metrics) -> tuple[str, ...]:
    metrics = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    unknown = [m for m in metrics if m not in ALL_METRICS]
    if unknown or not metrics:
        raise ValueError(f"`metrics` must be a non-empty list of names from {ALL_METRICS}, got {metrics!r}.")
    return tuple(m for m in ALL_METRICS if m in metrics)  # fixed order, duplicates dropped


def _check_tokenizer(tokenizer) -> str:
    if tokenizer is None:
        return "none"
    if tokenizer not in TOKENIZERS:
        raise ValueError(f"`tokenizer` must be one of {TOKENIZERS}, got {tokenizer!r}.")
    return tokenizer


def _require_java(what: str) -> str:
    java = shutil.which("java")
    if java is None:
        raise RuntimeError(f"{what} needs a Java runtime, and `java` was not found on PATH. {_JAVA_HINT}.")
    return java


_LINE_BREAKS = re.compile(r"[\r\n\v\f\x1c\x1d\x1e\x85\u2028\u2029]")


def _ptb_tokenize(captions: list[str]) -> list[str]:
    """pycocoevalcap's PTBTokenizer, run the same way (same jar, same flags, same punctuation list) but reading a
    temporary file outside site-packages (pycocoevalcap writes next to its jar, which fails on read-only installs)
    and checking that every caption comes back as exactly one line."""
    require("pycocoevalcap", extra="caption-metrics")
    from pycocoevalcap.tokenizer import ptbtokenizer

    java = _require_java("The PTB tokenizer (tokenizer='ptb')")
    jar = Path(ptbtokenizer.__file__).resolve().parent / ptbtokenizer.STANFORD_CORENLP_3_4_1_JAR
    punctuation = set(ptbtokenizer.PUNCTUATIONS)
    lines_in = [_LINE_BREAKS.sub(" ", caption) for caption in captions]
    with tempfile.TemporaryDirectory(prefix="hf_vlalign_ptb_") as directory:
        path = os.path.join(directory, "captions.txt")
        with open(path, "w", encoding="utf-8") as handle:
            handle.write("\n".join(lines_in) + "\n")
        command = [java, "-cp", str(jar), "edu.stanford.nlp.process.PTBTokenizer", "-preserveLines", "-lowerCase", path]
        completed = subprocess.run(command, capture_output=True, check=False)
    if completed.returncode != 0:
        raise RuntimeError(
            f"The PTB tokenizer (java, {jar.name}) failed with exit code {completed.returncode}: "
            f"{completed.stderr.decode('utf-8', 'replace')[-2000:]}"
        )
    lines = completed.stdout.decode("utf-8").split("\n")
    if len(lines) < len(captions) or any(line.strip() for line in lines[len(captions) :]):
        raise RuntimeError(
            f"The PTB tokenizer returned {len([l for l in lines if l.strip()])} non-empty lines for {len(captions)} "
            "captions; cannot align its output with the input."
        )
    return [
        " ".join(w for w in line.rstrip().split(" ") if w and w not in punctuation) for line in lines[: len(captions)]
    ]


# pycocoevalcap's PUNCTUATIONS as they come out of the lower-casing PTB tokenizer (its "-LRB-" etc. never match the
# lower-cased "-lrb-", so brackets survive in the COCO evaluation; `simple_tokenize` reproduces that)
_SIMPLE_DROP = {"''", "'", "``", "`", ".", "?", "!", ",", ":", "-", "--", "...", ";"}
_ABBREVIATIONS = {"mr.", "mrs.", "ms.", "dr.", "st.", "jr.", "sr.", "vs.", "etc.", "inc.", "co.", "ltd.", "no."}
_BRACKETS = {"(": " -lrb- ", ")": " -rrb- ", "[": " -lsb- ", "]": " -rsb- ", "{": " -lcb- ", "}": " -rcb- "}
_BRACKET_TOKENS = {token.strip() for token in _BRACKETS.values()}


def simple_tokenize(caption: str) -> str:
    """A pure-Python stand-in for the COCO evaluation's PTB tokenisation + punctuation removal, no Java needed: the
    PTB tokenizer's clitic splits ("can't" -> "ca n't"), quotes, dashes, punctuation and final periods dropped except
    in numbers ("3,000") and abbreviations ("e.g.", "mr."), brackets written "-lrb-" ... as the COCO evaluation keeps
    them. On ordinary captions it equals `tokenizer="ptb"` (tested: 2384 of the 2385 Flickr30k Entities sample
    sentences); exotic input (emoticons, "?!", "rock'n'roll", "y'all") may differ.
    """
    text = _LINE_BREAKS.sub(" ", caption.lower())
    text = text.replace("\u2019", "'").replace("\u2018", "`").replace("\u201c", '"').replace("\u201d", '"')
    text = text.replace("\u2026", " ... ").replace("\u2014", " -- ").replace("\u2013", " -- ")
    for bracket, token in _BRACKETS.items():
        text = text.replace(bracket, token)
    text = re.sub(r'["`]', " ", text)
    text = re.sub(r"\.\.\.+", " ... ", text)
    text = re.sub(r"-{2,}", " -- ", text)
    text = re.sub(r"(\w)n't\b", r"\1 n't", text)
    text = re.sub(r"(\w)'(s|re|ve|ll|d|m)\b", r"\1 '\2", text)
    text = re.sub(r"(^|\s)'(?!(s|re|ve|ll|d|m)\b)", r"\1 ", text)  # opening single quote
    text = re.sub(r"(?<![\s])'(?=\s|$)", " ", text)  # closing single quote / plural possessive
    text = re.sub(r"(?<!\d)[,:]|[,:](?!\d)", " ", text)
    text = re.sub(r"[;!?]", " ", text)
    text = re.sub(r"([$%#])", r" \1 ", text)
    tokens = []
    for token in text.split():
        if token not in _BRACKET_TOKENS and token.strip("-"):
            token = token.strip("-")  # "mid-" -> "mid", "-hello" -> "hello"; "re-enter" stays
        if token.endswith(".") and token not in _ABBREVIATIONS and "." not in token.rstrip("."):
            token = token.rstrip(".")
        if token and token not in _SIMPLE_DROP:
            tokens.append(token)
    return " ".join(tokens)


def tokenize_captions(captions: Sequence[str], tokenizer: str = "ptb") -> list[str]:
    """Tokenise captions as the scorers expect them: lower-cased words separated by single spaces, punctuation gone.

    `tokenizer`: "ptb" (the COCO evaluation's Java PTB tokenizer), "simple" (`simple_tokenize`, pure Python) or
    "none" (already tokenised: whitespace is normalised, nothing else changes).
    """
    tokenizer = _check_tokenizer(tokenizer)
    if not captions:
        return []
    if tokenizer == "ptb":
        return _ptb_tokenize(list(captions))
    if tokenizer == "simple":
        return [simple_tokenize(caption) for caption in captions]
    return [" ".join(caption.split()) for caption in captions]


def _tokenize_all(predictions: list[str], references: list[list[str]], tokenizer: str):
    """One tokenizer call for every caption; references that tokenise to nothing are an error (they would score as
    an empty reference), empty predictions are kept (a model may emit an empty caption; it scores 0)."""
    flat = list(predictions) + [ref for refs in references for ref in refs]
    tokens = tokenize_captions(flat, tokenizer)
    tokenized_predictions = tokens[: len(predictions)]
    tokenized_references, position = [], len(predictions)
    for i, refs in enumerate(references):
        row = tokens[position : position + len(refs)]
        position += len(refs)
        for j, ref in enumerate(row):
            if not ref:
                raise ValueError(
                    f"`references[{i}][{j}]` ({refs[j]!r}) is empty once tokenised (tokenizer={tokenizer!r}): "
                    "a reference must hold at least one word."
                )
        tokenized_references.append(row)
    return tokenized_predictions, tokenized_references


# METEOR: one Java process per Python process
_METEOR = None
_METEOR_LOCK = threading.Lock()


@functools.cache
def _meteor_process_class():
    require("pycocoevalcap", extra="caption-metrics")
    from pycocoevalcap.meteor import meteor as meteor_module

    class MeteorProcess(meteor_module.Meteor):
        """pycocoevalcap's Meteor (its `compute_score` / `_stat` protocol, its jar and flags), started with UTF-8 I/O
        and stderr to a file (an unread stderr pipe can fill and block Java), and closed without its lock so that a
        failed call cannot deadlock the interpreter's exit."""

        def __init__(self, command: list[str] | None = None):
            if command is None:
                java = _require_java("METEOR")
                command = [java, "-Dfile.encoding=UTF-8", "-jar", "-Xmx2G", meteor_module.METEOR_JAR,
                           "-", "-", "-stdio", "-l", "en", "-norm"]  # fmt: skip
            self.meteor_cmd = command
            self.stderr_file = tempfile.TemporaryFile()  # noqa: SIM115 - lives as long as the process
            self.meteor_p = subprocess.Popen(
                self.meteor_cmd,
                cwd=Path(meteor_module.__file__).resolve().parent,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr_file,
            )
            self.lock = threading.Lock()

        def stderr_tail(self) -> str:
            try:
                self.stderr_file.seek(0)
                return self.stderr_file.read().decode("utf-8", "replace")[-2000:]
            except (OSError, ValueError):
                return ""

        def close(self):
            process = getattr(self, "meteor_p", None)
            if process is not None:
                for stream in (process.stdin, process.stdout):
                    try:
                        stream.close()
                    except OSError:
                        pass
                if process.poll() is None:
                    process.kill()
                process.wait()
            if getattr(self, "stderr_file", None) is not None:
                self.stderr_file.close()

        def __del__(self):
            self.close()

    return MeteorProcess


def _start_meteor():
    return _meteor_process_class()()


def close_meteor() -> None:
    """Stop the METEOR Java process, if one was started (it is also stopped at exit)."""
    global _METEOR
    with _METEOR_LOCK:
        if _METEOR is not None:
            _METEOR.close()
            _METEOR = None


atexit.register(close_meteor)


def _meteor_scores(gts: dict, res: dict) -> tuple[float, list[float]]:
    global _METEOR
    # METEOR's stdin protocol is line-based: "|||" separates fields and is removed from hypotheses by pycocoevalcap;
    # remove it from references too so a stray "|||" cannot shift the fields
    gts = {key: [ref.replace("|||", " ") for ref in refs] for key, refs in gts.items()}
    with _METEOR_LOCK:
        if _METEOR is None or _METEOR.meteor_p.poll() is not None:
            if _METEOR is not None:
                _METEOR.close()
            _METEOR = _start_meteor()
        try:
            score, scores = _METEOR.compute_score(gts, res)
        except Exception as error:
            details = _METEOR.stderr_tail()
            _METEOR.close()
            _METEOR = None
            raise RuntimeError(
                f"METEOR (java, meteor-1.5.jar) failed: {error!r}. Java said: {details or '(nothing)'}"
            ) from error
    return float(score), [float(s) for s in scores]


_CORENLP_JARS = ("stanford-corenlp-3.6.0.jar", "stanford-corenlp-3.6.0-models.jar")


def spice_unavailable_reason() -> str | None:
    """None when SPICE can run here; otherwise what is missing and how to provide it."""
    try:
        spice_module = require("pycocoevalcap.spice.spice", extra="caption-metrics")
    except MissingDependencyError as error:
        return str(error)
    lib = Path(spice_module.__file__).resolve().parent / "lib"
    missing = [name for name in _CORENLP_JARS if not (lib / name).is_file()]
    problems = []
    if shutil.which("java") is None:
        problems.append(f"`java` is not on PATH ({_JAVA_HINT})")
    if missing:
        problems.append(
            f"Stanford CoreNLP 3.6.0 is missing from {lib} ({', '.join(missing)}): pycocoevalcap downloads it from "
            "Stanford's site (stanford-corenlp-full-2015-12-09.zip) on first use, which needs internet access and is "
            "never attempted here; no package registry ships it. Copy the two jars from that zip into the folder"
        )
    if not problems:
        return None
    return "SPICE is unavailable: " + "; ".join(problems) + ". (SPICE also needs ~8 GB of memory for Java.)"


def caption_scores(
    predictions: Sequence[str],
    references: Sequence[Sequence[str]],
    metrics: Sequence[str] = DEFAULT_METRICS,
    tokenizer: str = "ptb",
) -> dict[str, float]:
    """Corpus-level caption metrics as the COCO caption evaluation computes them.

    Args:
        predictions: one generated caption per image.
        references: for each prediction, a non-empty list of reference captions.
        metrics: any of "bleu" (gives bleu_1 .. bleu_4), "meteor", "rouge_l", "cider" (CIDEr-D), "spice" (only when
            asked; RuntimeError if its jars or Java are missing, see `spice_unavailable_reason`).
        tokenizer: "ptb" (default, the COCO evaluation's own, needs Java), "simple" (pure Python) or "none".

    Returns:
        {"bleu_1", "bleu_2", "bleu_3", "bleu_4", "meteor", "rouge_l", "cider"[, "spice"]} (those asked for) as floats
        on pycocoevalcap's scales (CIDEr-D is x10): BLEU and METEOR are corpus scores, ROUGE-L and CIDEr-D means over
        the images.
    """
    require("pycocoevalcap", extra="caption-metrics")
    from pycocoevalcap.bleu.bleu import Bleu
    from pycocoevalcap.cider.cider import Cider
    from pycocoevalcap.rouge.rouge import Rouge

    predictions, references = _check_captions(predictions, references)
    metrics = _check_metrics(metrics)
    tokenizer = _check_tokenizer(tokenizer)
    if "spice" in metrics and (reason := spice_unavailable_reason()) is not None:
        raise RuntimeError(reason)  # before any work
    if "meteor" in metrics:
        _require_java("METEOR")

    tokenized_predictions, tokenized_references = _tokenize_all(predictions, references, tokenizer)
    res = {i: [prediction] for i, prediction in enumerate(tokenized_predictions)}
    gts = {i: refs for i, refs in enumerate(tokenized_references)}

    scores: dict[str, float] = {}
    if "bleu" in metrics:
        bleu, _ = Bleu(4).compute_score(gts, res, verbose=0)
        scores.update({f"bleu_{n + 1}": float(value) for n, value in enumerate(bleu)})
    if "meteor" in metrics:
        scores["meteor"], _ = _meteor_scores(gts, res)
    if "rouge_l" in metrics:
        rouge, _ = Rouge().compute_score(gts, res)
        scores["rouge_l"] = float(rouge)
    if "cider" in metrics:
        if len(predictions) == 1:
            warnings.warn(
                "CIDEr-D takes its idf from the evaluated references: with a single image every n-gram has idf 0 "
                "and CIDEr-D is 0. Evaluate several images at once.",
                stacklevel=2,
            )
        cider, _ = Cider().compute_score(gts, res)
        scores["cider"] = float(cider)
    if "spice" in metrics:
        from pycocoevalcap.spice.spice import Spice

        scores["spice"] = float(Spice().compute_score(gts, res)[0])
    bad = {name: value for name, value in scores.items() if not math.isfinite(value)}
    if bad:
        raise RuntimeError(f"Caption metrics came out non-finite: {bad}; inputs: {len(predictions)} captions.")
    return scores


class CiderD:
    """Per-caption CIDEr-D with document frequencies fixed by a reference corpus: the reward of self-critical sequence
    training (Rennie et al. 2017), each sampled caption scored against its image's references with the training
    corpus's idf.

    The arithmetic is pycocoevalcap's `CiderScorer.compute_cider`, term for term (clipped tf-idf cosine per n-gram
    order, Gaussian length penalty on the bigram counts, mean over n and references, x10); only the idf differs:
    `log(#corpus images) - log(max(1, df))` with df counted once per image of `corpus_references`. With
    `corpus_references` equal to the references scored, the two agree exactly (tested).

    Args:
        corpus_references: one list of reference captions per corpus image (e.g. the whole training split).
        n: largest n-gram order. sigma: the length penalty's standard deviation.
        tokenizer: how captions (corpus and scored) are tokenised: "simple" (default; fast, no Java, suits per-batch
            rewards), "ptb" (one Java call per batch) or "none" (already tokenised, e.g. decoded vocabulary tokens).
    """

    def __init__(
        self, corpus_references: Sequence[Sequence[str]], n: int = 4, sigma: float = 6.0, tokenizer: str = "simple"
    ):
        self.n, self.sigma, self.tokenizer = n, float(sigma), _check_tokenizer(tokenizer)
        # checked as the references of placeholder predictions
        _, corpus = _check_captions([""] * len(corpus_references), corpus_references)
        _, tokenized = _tokenize_all([], corpus, self.tokenizer)
        self.document_frequency: dict[tuple[str, ...], float] = defaultdict(float)
        for refs in tokenized:
            for ngram in {ngram for ref in refs for ngram in self._counts(ref)}:
                self.document_frequency[ngram] += 1
        self.document_frequency = dict(self.document_frequency)
        self.log_corpus_size = math.log(float(len(tokenized)))

    def _counts(self, caption: str) -> dict:
        require("pycocoevalcap", extra="caption-metrics")
        from pycocoevalcap.cider.cider_scorer import precook

        return precook(caption, self.n)

    def _vector(self, counts: dict):
        vec: list[dict] = [{} for _ in range(self.n)]
        norm = [0.0] * self.n
        length = 0
        for ngram, term_freq in counts.items():
            df = math.log(max(1.0, self.document_frequency.get(ngram, 0.0)))
            k = len(ngram) - 1
            vec[k][ngram] = float(term_freq) * (self.log_corpus_size - df)
            norm[k] += vec[k][ngram] ** 2
            if k == 1:  # pycocoevalcap's length: the bigram count
                length += term_freq
        return vec, [math.sqrt(x) for x in norm], length

    def _similarity(self, hyp, ref) -> float:
        vec_hyp, norm_hyp, length_hyp = hyp
        vec_ref, norm_ref, length_ref = ref
        delta = float(length_hyp - length_ref)
        penalty = math.e ** (-(delta**2) / (2 * self.sigma**2))
        total = 0.0
        for k in range(self.n):
            value = sum(min(weight, vec_ref[k].get(ngram, 0.0)) * vec_ref[k].get(ngram, 0.0)
                        for ngram, weight in vec_hyp[k].items())  # fmt: skip
            if norm_hyp[k] != 0 and norm_ref[k] != 0:
                value /= norm_hyp[k] * norm_ref[k]
            total += value * penalty
        return total / self.n

    def __call__(self, predictions: Sequence[str], references: Sequence[Sequence[str]]) -> list[float]:
        """CIDEr-D of each prediction against its own references -> list of floats (one per prediction)."""
        predictions, references = _check_captions(predictions, references)
        tokenized_predictions, tokenized_references = _tokenize_all(predictions, references, self.tokenizer)
        reference_vectors: dict[tuple[str, ...], list] = {}  # samples of one image share their references
        scores = []
        for prediction, refs in zip(tokenized_predictions, tokenized_references):
            key = tuple(refs)
            if key not in reference_vectors:
                reference_vectors[key] = [self._vector(self._counts(ref)) for ref in refs]
            hyp = self._vector(self._counts(prediction))
            score = sum(self._similarity(hyp, ref) for ref in reference_vectors[key]) / len(refs) * 10.0
            scores.append(score)
        return scores


def cider_d_per_caption(
    predictions: Sequence[str],
    references: Sequence[Sequence[str]],
    corpus_references: Sequence[Sequence[str]] | None = None,
    tokenizer: str = "simple",
    n: int = 4,
    sigma: float = 6.0,
) -> list[float]:
    """CIDEr-D of each prediction (a self-critical training reward per sampled caption).

    The idf comes from `corpus_references` (one list of references per corpus image, e.g. the training split) or, if
    None, from `references` themselves, which is pycocoevalcap's `Cider`: its per-image scores, and their mean is
    `caption_scores(..., metrics=["cider"])["cider"]` for the same tokenizer. When scoring k samples per image, pass the
    images' references once each as `corpus_references`: references repeated k times in `references` would count as
    k times more images, which changes the idf of n-grams absent from every reference (log(kN) instead of log(N)).
    For many batches against one corpus, build `CiderD(corpus_references)` once and call it per batch.
    """
    scorer = CiderD(
        references if corpus_references is None else corpus_references, n=n, sigma=sigma, tokenizer=tokenizer
    )
    return scorer(predictions, references)


def load_caption_metric(**kwargs):
    """`evaluate.load` of this package's caption metric module from its local folder (no Hub access):
    `load_caption_metric().compute(predictions=[...], references=[[...], ...], metrics=..., tokenizer=...)`
    returns `caption_scores`'s dict."""
    return load_local_metric("caption_scores", **kwargs)


__all__ = [
    "ALL_METRICS",
    "CAPTION_METRIC_PATH",
    "DEFAULT_METRICS",
    "CiderD",
    "caption_scores",
    "cider_d_per_caption",
    "close_meteor",
    "load_caption_metric",
    "simple_tokenize",
    "spice_unavailable_reason",
    "tokenize_captions",
]
