"""The VGP builder and collator on the real Flickr30k Entities and VGP files, with the real MiniLM tokenizer."""

from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoTokenizer
from transformers.testing_utils import CaptureLogger

from hf_vlalign import default_text_model_path
from hf_vlalign.alignment import box_iou, normalize_boxes
from hf_vlalign.data.builders import build_dataset, build_vgp_dataset, count_vgp_types
from hf_vlalign.data.builders import vgp as vgp_builder
from hf_vlalign.data.builders._neighbours import nearest_neighbours, tfidf_rows
from hf_vlalign.data.collators import PROBE_KEYS, VGPCollator
from hf_vlalign.data.feature_store import RegionFeatureStore
from hf_vlalign.data.formats.flickr30k_entities import Flickr30kEntities

SHARED = Path(__file__).resolve().parents[2].parent / "shared" / "data"
if not SHARED.is_dir():
    raise RuntimeError(f"The real data samples are expected in {SHARED} (the `shared` folder beside the repository).")
FLICKR = SHARED / "flickr30k_entities"
TYPOLOGY_VAL = SHARED / "vgp" / "VGP-Typology" / "val_data.csv"
IDENTIFICATION_TRAIN = SHARED / "vgp" / "RA_Files" / "full_data_type_phrase_pair_train.csv"


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(default_text_model_path())


def test_builder_locates_the_published_phrases_in_their_captions():
    dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.0, max_examples=200)
    assert len(dataset) == 200
    for row in dataset:
        (s1, e1), (s2, e2) = row["phrase1_span"], row["phrase2_span"]
        assert row["caption1"] != row["caption2"] or s1 != s2
        assert row["id_label"] == 2 and row["vgp_label"] == 1 and 0 <= row["type_label"] <= 4
        assert row["caption1"][s1:e1] and row["caption2"][s2:e2]
    first = dataset[0]  # 12252043,four young asian boys,group asian boys,Four young Asian boys,Group of Asian boys
    assert first["image_id"] == "12252043"
    assert first["caption1"][slice(*first["phrase1_span"])] == "Four young Asian boys"
    assert first["caption2"][slice(*first["phrase2_span"])].lower() == "group of asian boys"
    annotation = Flickr30kEntities(FLICKR).annotation("12252043")
    assert first["image_size"] == [annotation.height, annotation.width]
    assert len(first["caption1_phrase_spans"]) == len(first["caption1_phrase_boxes"]) >= 1


def test_builder_reads_the_identification_layout():
    dataset = build_vgp_dataset(FLICKR, IDENTIFICATION_TRAIN, replace_caption_prob=0.0)
    assert len(dataset) == 305
    assert set(dataset["vgp_label"]) == {1}  # that file holds positives only (ytrue all True)


def test_builder_counts_and_reports_rows_it_cannot_locate():
    # 7 cells hold annotation-interface markup, 12 pairs meet only within one caption (tests/data/test_vgp_matching.py
    # checks each reason); 4 rows the first-caption rule lost are placed through another caption of their image
    with CaptureLogger(vgp_builder.logger) as captured:
        dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.0)
    assert "skipped 19 of 939 rows" in captured.out
    assert "7 with markup in a phrase cell" in captured.out and "12 same-caption pairs" in captured.out
    assert len(dataset) == 939 - 19


def test_caption_replacement_makes_identification_negatives():
    dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.5, seed=3, max_examples=300)
    labels = np.array(dataset["id_label"])
    assert {0, 1, 2} == set(labels.tolist())
    replaced = dataset.filter(lambda row: row["id_label"] != 2)
    assert set(replaced["vgp_label"]) == {0}
    for row in replaced:  # the replaced caption carries no grounding in this image
        foreign = 2 if row["id_label"] == 0 else 1
        assert row[f"caption{foreign}_phrase_spans"] == []
    again = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.5, seed=3, max_examples=300)
    assert again["caption1"] == dataset["caption1"]  # seeded


def _features_for(dataset, tmp_path) -> RegionFeatureStore:
    """A region-feature store whose regions are each image's gold boxes (shifted a little) plus one distractor."""
    corpus = Flickr30kEntities(FLICKR)
    records = []
    for image_id in sorted(set(dataset["image_id"])):
        annotation = corpus.annotation(image_id)
        gold = [box for boxes in annotation.boxes.values() for box in boxes]
        boxes = np.array([[x1, y1, min(x2 + 3, annotation.width), y2] for x1, y1, x2, y2 in gold] + [[0, 0, 5, 5]], dtype=np.float32)
        count = len(boxes)
        records.append({
            "image_id": image_id, "image_size": (annotation.height, annotation.width),
            "object_ids": np.arange(count), "object_conf": np.linspace(0.9, 0.1, count).astype(np.float32),
            "attr_ids": np.zeros(count, dtype=np.int64), "attr_conf": np.ones(count, dtype=np.float32),
            "boxes": boxes, "features": np.random.default_rng(0).random((count, 8), dtype=np.float32),
        })
    return RegionFeatureStore.write(records, tmp_path / "store")


def test_collator_builds_the_design_tensors_from_real_annotations(tokenizer, tmp_path):
    dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.0, max_examples=6)
    features = _features_for(dataset, tmp_path)
    collator = VGPCollator(tokenizer, features, return_probe_targets=True)
    batch = collator([dataset[i] for i in range(6)])
    B, T = batch["input_ids"].shape
    R = batch["visual_feats"].shape[1]
    assert batch["visual_boxes"].shape == (B, R, 4) and batch["word_region_alignment"].shape == (B, T, R)
    assert float(batch["visual_boxes"].min()) >= 0 and float(batch["visual_boxes"].max()) <= 1
    # phrase1 is exactly the phrase's word pieces, in the first sentence
    first = dataset[0]
    pieces = tokenizer.convert_ids_to_tokens(batch["input_ids"][0, batch["phrase1_mask"][0]].tolist())
    assert tokenizer.convert_tokens_to_string(pieces) == first["caption1"][slice(*first["phrase1_span"])].lower()
    assert (batch["token_type_ids"][0, batch["phrase1_mask"][0]] == 0).all()
    assert (batch["token_type_ids"][0, batch["phrase2_mask"][0]] == 1).all()
    # every grounded token's row is a distribution over real regions; gold boxes shifted by 3px keep IoU >= 0.5
    sums = batch["word_region_alignment"].sum(-1)
    assert torch.allclose(sums[sums > 0], torch.ones_like(sums[sums > 0]))
    assert (batch["word_region_alignment"] * (1 - batch["visual_attention_mask"][:, None, :])).sum() == 0
    grounded = batch["phrase_token_index"] >= 0
    assert grounded.any()
    hits = batch["phrase_region_iou"].amax(-1)[grounded]
    assert (hits >= 0.5).all()
    # probe keys are dropped by default
    plain = VGPCollator(tokenizer, features)([dataset[0]])
    assert not set(PROBE_KEYS) & set(plain)


def test_type_task_labels_are_the_csv_types_and_minus_100_for_pairs_without_one(tokenizer, tmp_path):
    # a replaced caption makes a pair that is not a VGP: no type, left out of the type loss and counted
    dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.5, seed=3, max_examples=40)
    counts = count_vgp_types(dataset)
    replaced = sum(label != 2 for label in dataset["id_label"])
    assert counts["untyped"] == replaced > 0 and counts["typed"] == len(dataset) - replaced
    assert sum(counts[name] for name in ("Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence")) == counts["typed"]
    assert f"rows with a semantic type: {counts['typed']}, without (not VGPs" in dataset.info.description
    rows = [dataset[i] for i in range(len(dataset))]
    features = _features_for(dataset, tmp_path)
    typed = VGPCollator(tokenizer, features)(rows)["vgp_labels"]  # vgp_task="type" is the default
    expected = [label if label >= 0 else -100 for label in dataset["type_label"]]
    assert typed.tolist() == expected
    binary = VGPCollator(tokenizer, features, vgp_task="binary")(rows)["vgp_labels"]
    assert binary.tolist() == dataset["vgp_label"]
    with pytest.raises(ValueError, match="`vgp_task` must be 'type' or 'binary'"):
        VGPCollator(tokenizer, features, vgp_task="types")
    with pytest.raises(ValueError, match=r"`type_label` must be a label in \[-1, 4\], got int -3"):
        VGPCollator(tokenizer, features)([{**rows[0], "type_label": -3}])


def test_real_typology_and_identification_csvs_give_every_row_a_type():
    for csv_path, size in ((TYPOLOGY_VAL, 920), (IDENTIFICATION_TRAIN, 305)):
        counts = count_vgp_types(build_vgp_dataset(FLICKR, csv_path, replace_caption_prob=0.0))
        assert counts["typed"] == size and counts["untyped"] == 0
        assert all(counts[name] > 0 for name in ("Alternation", "Entailment1", "Entailment2", "Equivalence", "Independence"))


def test_collator_alignment_follows_the_iou_rule(tokenizer, tmp_path):
    dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.0, max_examples=1)
    features = _features_for(dataset, tmp_path)
    batch = VGPCollator(tokenizer, features)([dataset[0]])
    row = dataset[0]
    height, width = row["image_size"]
    gold = normalize_boxes(torch.tensor(row["caption1_phrase_boxes"][0]), width, height)
    iou = box_iou(gold, batch["visual_boxes"][0]).amax(0)
    token = batch["phrase_masks"][0, 0].nonzero()[0, 0]
    expected = (iou >= 0.5).float() / (iou >= 0.5).sum()
    torch.testing.assert_close(batch["word_region_alignment"][0, token], expected)


def test_collator_truncates_a_long_row_and_refuses_a_span_outside_the_text(tokenizer, tmp_path):
    dataset = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, replace_caption_prob=0.0, max_examples=1)
    features = _features_for(dataset, tmp_path)
    with pytest.raises(ValueError, match=r"`max_text_length` must be an int >= 5 .*got 4"):
        VGPCollator(tokenizer, features, max_text_length=4)
    collator = VGPCollator(tokenizer, features, max_text_length=5)  # one word piece left of each caption
    batch = collator([dataset[0]])  # truncated and counted, never refused (tests/data/test_truncation.py)
    assert batch["input_ids"].shape == (1, 5) and bool(batch["phrase1_mask"].any() and batch["phrase2_mask"].any())
    assert collator.truncation_stats.rows_truncated == 1
    with pytest.raises(ValueError, match="has no token after tokenisation"):
        VGPCollator(tokenizer, features)([{**dataset[0], "phrase1_span": [0, 0]}])
    with pytest.raises(ValueError, match="`image_id` 'missing' is not in the region-feature store"):
        VGPCollator(tokenizer, features)([{**dataset[0], "image_id": "missing"}])


def _overlap(caption: str, image_captions: list[str]) -> float:
    words = set(caption.lower().split())
    return max(len(words & set(other.lower().split())) / len(words) for other in image_captions)


def test_hard_negatives_come_from_the_nearest_images_and_are_closer_than_random():
    corpus = Flickr30kEntities(FLICKR)
    kwargs = dict(replace_caption_prob=1.0, max_examples=120, seed=5)
    hard = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, negatives="hard", num_neighbours=3, **kwargs)
    random_ = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, negatives="random", **kwargs)
    image_ids = sorted(set(hard["image_id"]) | set(random_["image_id"]))
    caption_image = {s.text: i for i in image_ids for s in corpus.sentences(i)}
    neighbours = vgp_builder._caption_neighbours(corpus, sorted({p.image_id for p in vgp_builder.read_vgp_csv(TYPOLOGY_VAL)}), 3)

    def foreign(row):
        return row["caption2"] if row["id_label"] == 0 else row["caption1"]

    for row in hard:
        source = caption_image.get(foreign(row))
        assert source is None or source in neighbours[row["image_id"]]  # a caption of one of the 3 nearest images
    own = {i: [s.text for s in corpus.sentences(i)] for i in image_ids}
    hard_overlap = np.mean([_overlap(foreign(row), own[row["image_id"]]) for row in hard])
    random_overlap = np.mean([_overlap(foreign(row), own[row["image_id"]]) for row in random_])
    assert hard_overlap > random_overlap + 0.05
    again = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, negatives="hard", num_neighbours=3, **kwargs)
    assert again["caption1"] == hard["caption1"] and again["caption2"] == hard["caption2"]  # seeded
    with pytest.raises(ValueError, match=r"`negatives` must be 'hard' or 'random', got 'easy'"):
        build_vgp_dataset(FLICKR, TYPOLOGY_VAL, negatives="easy")


def _dense_caption_neighbours(corpus, image_ids: list[str], num_neighbours: int) -> dict[str, list[str]]:
    """The hard-negative search before the blocked one: the whole N x N TF-IDF cosine matrix, a stable sort."""
    documents = [" ".join(s.text.lower() for s in corpus.sentences(image_id)).split() for image_id in image_ids]
    vocabulary = {word: i for i, word in enumerate(sorted({w for doc in documents for w in doc}))}
    counts = np.zeros((len(image_ids), len(vocabulary)), dtype=np.float32)
    for row, doc in enumerate(documents):
        np.add.at(counts[row], [vocabulary[w] for w in doc], 1.0)
    idf = np.log((1 + len(documents)) / (1 + (counts > 0).sum(0))) + 1.0
    tfidf = counts * idf
    tfidf /= np.linalg.norm(tfidf, axis=1, keepdims=True).clip(min=1e-12)
    similarity = tfidf @ tfidf.T
    np.fill_diagonal(similarity, -np.inf)
    order = np.argsort(-similarity, axis=1, kind="stable")[:, : min(num_neighbours, len(image_ids) - 1)]
    return {image_id: [image_ids[j] for j in order[i]] for i, image_id in enumerate(image_ids)}


def test_blocked_hard_negatives_are_the_dense_search_s_on_the_real_captions(monkeypatch):
    corpus = Flickr30kEntities(FLICKR)
    image_ids = sorted({pair.image_id for pair in vgp_builder.read_vgp_csv(TYPOLOGY_VAL)})
    assert vgp_builder._caption_neighbours(corpus, image_ids, 100) == _dense_caption_neighbours(corpus, image_ids, 100)
    # and so the same rows, drawn from the same seed
    kwargs = dict(negatives="hard", num_neighbours=5, replace_caption_prob=0.5, seed=3)
    blocked = build_vgp_dataset(FLICKR, TYPOLOGY_VAL, **kwargs)
    monkeypatch.setattr(vgp_builder, "_caption_neighbours", _dense_caption_neighbours)
    assert build_vgp_dataset(FLICKR, TYPOLOGY_VAL, **kwargs).to_list() == blocked.to_list()


def _dense_order(documents: list[str], num_neighbours: int) -> np.ndarray:
    rows = tfidf_rows(documents).to_dense()
    similarity = rows @ rows.T
    np.fill_diagonal(similarity, -np.inf)
    return np.argsort(-similarity, axis=1, kind="stable")[:, : min(num_neighbours, len(documents) - 1)]


def test_blocked_nearest_neighbours_equal_the_dense_sort_with_ties_at_any_block_size():
    rng = np.random.default_rng(0)
    words = [f"w{i}" for i in range(40)]
    frequencies = 1 / np.arange(1, 41)  # a few words in most documents (the dense part), the rest rare
    documents = [" ".join(rng.choice(words, size=8, p=frequencies / frequencies.sum())) for _ in range(17)]
    documents[4] = documents[9] = documents[15]  # three equal documents: ties, broken by the lower index
    documents[11] = ""  # a document without words: zero similarity with every other
    for dense_word_fraction in (0.0, 0.3, 1.0):  # all words dense, the frequent ones, none
        for block_size in (1, 3, 16, 17, 100):
            order = nearest_neighbours(tfidf_rows(documents), 6, block_size, dense_word_fraction)
            assert order.shape == (17, 6)
            np.testing.assert_array_equal(order, _dense_order(documents, 6))
            assert list(order[4][:2]) == [9, 15] and list(order[15][:2]) == [4, 9]
            assert list(order[11]) == [0, 1, 2, 3, 4, 5]  # all tied at 0: the lowest indices


def test_nearest_neighbours_with_fewer_images_than_neighbours_and_with_one_image():
    documents = ["a dog runs", "a dog sleeps", "a cat sleeps"]
    order = nearest_neighbours(tfidf_rows(documents), 100, block_size=2)
    np.testing.assert_array_equal(order, _dense_order(documents, 100))
    assert order.shape == (3, 2) and list(order[0]) == [1, 2]
    assert nearest_neighbours(tfidf_rows(["a dog"]), 5).shape == (1, 0)


def test_tfidf_rows_weigh_rare_words_up_and_have_unit_length():
    rows = tfidf_rows(["a dog a", "a cat"])
    dense = rows.to_dense()  # columns: a, cat, dog
    np.testing.assert_allclose(np.linalg.norm(dense, axis=1), 1.0)
    idf_a, idf_rare = 1.0, np.log(3 / 2) + 1.0
    np.testing.assert_allclose(dense[0], np.array([2 * idf_a, 0.0, idf_rare]) / np.hypot(2 * idf_a, idf_rare))


def test_build_dataset_vgp_finds_the_split_csv(tmp_path):
    data_dir = tmp_path / "vgp"
    data_dir.mkdir()
    (data_dir / "val_data.csv").symlink_to(TYPOLOGY_VAL)
    (data_dir / "flickr30k_entities").symlink_to(FLICKR)
    rows = build_dataset("vgp", data_dir, "val", max_examples=10, negatives="random")
    assert len(rows) == 10 and rows[0]["image_id"] == "12252043"
    assert build_dataset("vgp", data_dir, "validation", max_examples=10, negatives="random")["caption1"] == rows["caption1"]
    with pytest.raises(ValueError, match=r"holds no VGP csv for split 'test'; expected one of \['test_data.csv'"):
        build_dataset("vgp", data_dir, "test")
    with pytest.raises(ValueError, match=r"`name` must be one of .* got 'vgp2'"):
        build_dataset("vgp2", data_dir, "val")
