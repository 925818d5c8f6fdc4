"""Soft word-object alignment targets A* of Kervadec et al. (ECAI 2020), eqs. 15-18.

For one grounded phrase and the R detected objects of its image, two criteria score each object:
- positional (eq. 15): IoU of the detected box with the phrase's gold box;
- semantic (eq. 16): 3/4 cos(word, class name) + 1/4 cos(word, attribute name) of the detected object.
Each criterion is normalised over the objects and A* is their mean (eqs. 17-18), a distribution over the objects.
The rows built here fill the `word_region_alignment` tensor that `alignment_kl_loss` reads.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from .boxes import gold_region_iou

WordVectors = Callable[[Sequence[str]], torch.Tensor]


def _looks_normalised(boxes: torch.Tensor) -> bool:
    return float(boxes.max()) <= 1.0 + 1e-6


def positional_criterion(gold_boxes: torch.Tensor, region_boxes: torch.Tensor) -> torch.Tensor:
    """IoU of each detected box with the phrase's gold box, the best over its gold boxes (eq. 15).

    gold_boxes: (G, 4); region_boxes: (R, 4); returns (R,).

    Both sides must use the same convention (both in pixels or both normalised to [0, 1]); a mix is an error.
    """
    if _looks_normalised(gold_boxes) != _looks_normalised(region_boxes):
        raise ValueError(
            "`gold_boxes` and `region_boxes` must use the same coordinates (both pixels or both normalised to "
            f"[0, 1]), got maxima {float(gold_boxes.max()):.4g} and {float(region_boxes.max()):.4g}."
        )
    return gold_region_iou(gold_boxes.float(), region_boxes.float())


def semantic_criterion(
    word_vector: torch.Tensor,
    class_vectors: torch.Tensor,
    attribute_vectors: torch.Tensor | None = None,
    class_weight: float = 0.75,
) -> torch.Tensor:
    """class_weight cos(word, class name) + (1 - class_weight) cos(word, attribute name) per object (eq. 16).

    word_vector: (D,); class_vectors / attribute_vectors: (R, D), the names of each detected object's class and
    attribute. With no attributes the class term alone is used (weight 1). Negative cosines are clamped at 0: a
    criterion is a non-negative score to be normalised over the objects (eq. 17). Zero vectors give a zero cosine.
    """
    class_term = _clamped_cosine(word_vector, class_vectors)
    if attribute_vectors is None:
        return class_term
    return class_weight * class_term + (1.0 - class_weight) * _clamped_cosine(word_vector, attribute_vectors)


def _clamped_cosine(vector: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    cosine = torch.nn.functional.cosine_similarity(vector.float().unsqueeze(0), matrix.float(), dim=-1)
    return cosine.clamp(min=0.0)


def normalise_over_objects(scores: torch.Tensor, region_mask: torch.Tensor | None = None) -> torch.Tensor:
    """A criterion divided by its sum over the real regions (eq. 17): (R,) -> (R,); padded regions and an all-zero
    row stay zero."""
    if region_mask is not None:
        scores = scores * region_mask.to(scores.dtype)
    total = scores.sum()
    if float(total) <= 0:
        return torch.zeros_like(scores)
    return scores / total


def combine_criteria(
    positional: torch.Tensor, semantic: torch.Tensor, region_mask: torch.Tensor | None = None
) -> torch.Tensor:
    """A* = the mean of the two normalised criteria, renormalised to sum to one (eqs. 17-18): (R,), (R,) -> (R,).

    When one criterion is zero on every real region (no overlapping box, or no known word), the other alone is used;
    when both are, the row is all zeros and the phrase counts as ungrounded.
    """
    positional = normalise_over_objects(positional, region_mask)
    semantic = normalise_over_objects(semantic.to(positional.dtype), region_mask)
    present = [criterion for criterion in (positional, semantic) if float(criterion.sum()) > 0]
    if not present:
        return torch.zeros_like(positional)
    combined = torch.stack(present).mean(dim=0)
    return combined / combined.sum()


class SoftAlignmentTargets:
    """Builds the soft target row A* of one grounded phrase over the detected objects (eqs. 15-18).

    Args:
        word_vectors: any callable mapping a list of strings to a (N, D) tensor (`GloveWordVectors`,
            `SentenceEmbeddingWordVectors`).
        class_names: the detector's object vocabulary (e.g. `read_vocabulary("objects_vocab.txt")`).
        attribute_names: its attribute vocabulary, or None to use the class term alone.
        class_weight: weight of the class cosine in eq. (16); the attribute cosine gets 1 - class_weight.
    """

    def __init__(
        self,
        word_vectors: WordVectors,
        class_names: Sequence[str],
        attribute_names: Sequence[str] | None = None,
        class_weight: float = 0.75,
    ):
        if not callable(word_vectors):
            raise ValueError(  # noqa: TRY004 (DESIGN.md: ValueError)
                f"`word_vectors` must map a list of strings to a (N, D) tensor, got {type(word_vectors).__name__}."
            )
        if not 0.0 <= class_weight <= 1.0:
            raise ValueError(f"`class_weight` must be in [0, 1], got {class_weight!r}.")
        self.word_vectors = word_vectors
        self.class_weight = class_weight
        self.class_vectors = self._embed_names("class_names", class_names)
        self.attribute_vectors = (
            None if attribute_names is None else self._embed_names("attribute_names", attribute_names)
        )

    def _embed_names(self, name: str, names: Sequence[str]) -> torch.Tensor:
        if isinstance(names, str) or not isinstance(names, Sequence) or len(names) == 0:
            raise ValueError(f"`{name}` must be a non-empty sequence of strings, got {names!r:.80}.")
        vectors = self.word_vectors(list(names))
        if not isinstance(vectors, torch.Tensor) or vectors.dim() != 2 or vectors.shape[0] != len(names):
            got = tuple(vectors.shape) if isinstance(vectors, torch.Tensor) else type(vectors).__name__
            raise ValueError(f"`word_vectors` must return a ({len(names)}, D) tensor for `{name}`, got {got}.")
        return vectors.float()

    def __call__(
        self,
        phrase: str,
        gold_boxes: torch.Tensor,
        region_boxes: torch.Tensor,
        object_ids: torch.Tensor,
        attribute_ids: torch.Tensor | None = None,
        region_mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The (R,) target row of `phrase` over the detected objects: a distribution, or zeros when neither
        criterion scores any real region.

        Args:
            phrase: the grounded word or phrase.
            gold_boxes: (G, 4) its gold boxes; region_boxes: (R, 4) the detected boxes (same coordinates).
            object_ids / attribute_ids: (R,) the detected class / attribute of each object, indices into the
                vocabularies given at construction.
            region_mask: (R,) 1 for real regions, 0 for padding.
        """
        positional = positional_criterion(gold_boxes, region_boxes)
        class_vectors = self.class_vectors[object_ids.cpu()]
        attribute_vectors = self._attribute_vectors(attribute_ids)
        word_vector = self.word_vectors([phrase])[0].float()
        semantic = semantic_criterion(word_vector, class_vectors, attribute_vectors, self.class_weight)
        return combine_criteria(positional, semantic.to(positional.device), region_mask)

    def _attribute_vectors(self, attribute_ids: torch.Tensor | None) -> torch.Tensor | None:
        if attribute_ids is None:
            return None
        if self.attribute_vectors is None:
            raise ValueError("`attribute_ids` were given but no `attribute_names` vocabulary was set at construction.")
        return self.attribute_vectors[attribute_ids.cpu()]
