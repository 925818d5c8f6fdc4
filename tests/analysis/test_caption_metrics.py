"""Caption metrics through pycocoevalcap: hand-computed values, the COCO evaluation's own numbers, CIDEr-D rewards,
the evaluate module loaded from its local folder, and input errors. METEOR and the PTB tokenizer run Java, which
the CI machine has (.ci/run installs a JRE if `java` is missing)."""

import math
import re

import pytest

from hf_vlalign.metrics import captioning
from hf_vlalign.metrics.captioning import (
    CAPTION_METRIC_PATH,
    CiderD,
    caption_scores,
    cider_d_per_caption,
    load_caption_metric,
    simple_tokenize,
    spice_unavailable_reason,
    tokenize_captions,
)
from tests.shared_samples import real_sample

# A tiny COCO-style example and what pycocoevalcap's unmodified pipeline gives for it: its PTBTokenizer class on
# gts/res dicts, then Bleu(4).compute_score(verbose=0), Meteor(), Rouge(), Cider() (pycocoevalcap 1.2, Java 17).
PREDICTIONS = [
    "A man is riding a horse on the beach.",
    "Two dogs play with a ball in the park.",
    "A woman holds an umbrella.",
]
REFERENCES = [
    ["A man rides a brown horse along the beach.", "Someone is riding a horse by the sea."],
    ["Two dogs are playing with a red ball.", "A pair of dogs chase a ball on the grass.", "Dogs playing in a park."],
    ["A woman with an umbrella walks in the rain.", "A lady holding a black umbrella."],
]
COCO_EVAL = {
    "bleu_1": 0.8695652173156899,
    "bleu_2": 0.6593804733362995,
    "bleu_3": 0.37120835797095164,
    "bleu_4": 0.2458562768797027,
    "meteor": 0.3523405948501151,
    "rouge_l": 0.6015461403653487,
    "cider": 1.7867573654215938,
}


def test_matches_the_coco_caption_evaluation():
    scores = caption_scores(PREDICTIONS, REFERENCES)
    assert list(scores) == ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "meteor", "rouge_l", "cider"]
    assert all(isinstance(value, float) for value in scores.values())
    for name, expected in COCO_EVAL.items():
        assert scores[name] == pytest.approx(expected, abs=1e-9), name
    # BLEU-1 by hand: predictions of 9 + 9 + 5 = 23 words, 20 of them found in a reference (clipped):
    # "is", "on" (image 0) and "the" (image 1: no reference has "the") are not -> 20 / 23; the closest reference
    # lengths are 8, 8 (a tie between 8 and 10 goes to the shorter) and 6 -> 22 <= 23, so no brevity penalty.
    assert scores["bleu_1"] == pytest.approx(20 / 23, abs=1e-9)


def test_identical_captions_score_one():
    caption = "a man is riding a brown horse on the beach"  # 10 words: 7 four-grams
    scores = caption_scores([caption, "two dogs play with a red ball"], [[caption], ["two dogs play with a red ball"]])
    for n in range(1, 5):
        assert scores[f"bleu_{n}"] == pytest.approx(1.0, abs=1e-8)
    assert scores["rouge_l"] == pytest.approx(1.0)
    assert scores["meteor"] == pytest.approx(1.0, abs=1e-3)
    # CIDEr-D of identical captions: every cosine is 1 and there is no length penalty -> 10 x mean over n of 1 = 10
    assert scores["cider"] == pytest.approx(10.0)


def test_hand_computed_bleu_1_and_rouge_l():
    prediction = "a cat on the mat"
    references = ["the cat is on the mat", "there is a cat on the mat"]
    scores = caption_scores([prediction], [references], metrics=["bleu", "rouge_l"], tokenizer="none")
    # BLEU-1: all 5 words appear in a reference -> precision 5/5; the closest reference length is 6 (|6-5| < |7-5|)
    # -> brevity penalty exp(1 - 6/5)
    assert scores["bleu_1"] == pytest.approx(math.exp(1 - 6 / 5), abs=1e-9)
    # ROUGE-L (pycocoevalcap: best precision and best recall over the references, beta = 1.2):
    # LCS with reference 1 = "cat on the mat" (4): P = 4/5, R = 4/6; with reference 2 = "a cat on the mat" (5):
    # P = 5/5, R = 5/7 -> P = 1, R = 5/7, F = (1 + 1.44) P R / (R + 1.44 P)
    precision, recall, beta2 = 1.0, 5 / 7, 1.2**2
    assert scores["rouge_l"] == pytest.approx((1 + beta2) * precision * recall / (recall + beta2 * precision))


def test_hand_computed_cider_d():
    # Two images with one reference each: idf of an n-gram seen in one image's references = log(2) - log(1) = L,
    # of an unseen one log(2) - log(max(1, 0)) = L too. Image B ("c d" for "c d") scores 10 x (1 + 1 + 0 + 0) / 4 = 5.
    references = [["a b"], ["c d"]]
    assert cider_d_per_caption(["a b", "c d"], references, tokenizer="none") == pytest.approx([5.0, 5.0])
    # "a a" vs "a b": unigram vectors (2L) vs (L, L); the clipped dot product is min(2L, L) L = L^2 (unclipped: 2L^2),
    # norms 2L and sqrt(2) L -> cosine 1 / (2 sqrt 2); no bigram in common; same bigram count -> no penalty
    clipped = cider_d_per_caption(["a a", "c d"], references, tokenizer="none")[0]
    assert clipped == pytest.approx(10 * (1 / (2 * math.sqrt(2))) / 4)
    # "a b b" vs "a b": unigrams (L, 2L) vs (L, L): (L^2 + L^2) / (sqrt(5) L sqrt(2) L) = 2 / sqrt(10); bigrams
    # (a b, b b) vs (a b): L^2 / (sqrt(2) L L) = 1 / sqrt(2); bigram counts 2 vs 1 -> penalty exp(-1 / (2 x 6^2))
    longer = cider_d_per_caption(["a b b", "c d"], references, tokenizer="none")[0]
    assert longer == pytest.approx(10 * (2 / math.sqrt(10) + 1 / math.sqrt(2)) * math.exp(-1 / 72) / 4)
    # the corpus score is pycocoevalcap's Cider: the mean of those per-caption values
    corpus = caption_scores(["a b b", "c d"], references, metrics=["cider"], tokenizer="none")["cider"]
    assert corpus == pytest.approx((longer + 5.0) / 2)


def test_cider_d_prefers_the_matching_caption():
    references = [refs for refs in REFERENCES]
    matching = cider_d_per_caption(["a man rides a brown horse along the beach"] + PREDICTIONS[1:], references)
    different = cider_d_per_caption(["a plate of food on a wooden table"] + PREDICTIONS[1:], references)
    assert matching[0] > 5.0
    # the different caption shares only "a" and "on" with the references; "a" is in every image's references
    # (idf log(3) - log(3) = 0) and "on" only in reference 2 of image 1 -> nothing in common with image 0's
    assert different[0] == 0.0
    assert matching[1:] == pytest.approx(different[1:])


def test_cider_d_per_caption_is_pycocoevalcap_cider():
    from pycocoevalcap.cider.cider import Cider

    tokenized_predictions = tokenize_captions(PREDICTIONS, "simple")
    tokenized_references = [tokenize_captions(refs, "simple") for refs in REFERENCES]
    gts = dict(enumerate(tokenized_references))
    res = {i: [p] for i, p in enumerate(tokenized_predictions)}
    mean, per_image = Cider().compute_score(gts, res)
    ours = cider_d_per_caption(PREDICTIONS, REFERENCES, tokenizer="simple")
    assert ours == pytest.approx(list(per_image), abs=1e-12)
    assert caption_scores(PREDICTIONS, REFERENCES, metrics=["cider"], tokenizer="simple")["cider"] == pytest.approx(
        mean
    )


def test_cider_d_rewards_with_a_fixed_corpus():
    # self-critical training: k samples per image, idf from the corpus (one entry per image)
    scorer = CiderD(REFERENCES)
    samples = ["a man rides a horse", "a horse", "two dogs with a ball", "dogs", "a woman with an umbrella", "a dog"]
    sample_references = [REFERENCES[i // 2] for i in range(len(samples))]
    rewards = scorer(samples, sample_references)
    assert len(rewards) == 6 and all(isinstance(r, float) and math.isfinite(r) and r >= 0 for r in rewards)
    assert rewards[0] > rewards[1] and rewards[2] > rewards[3] and rewards[4] > rewards[5]
    assert cider_d_per_caption(samples, sample_references, corpus_references=REFERENCES) == pytest.approx(rewards)
    # without a corpus, the repeated references count as 6 images: the idf of n-grams seen in them is unchanged
    # (log(2N) - log(2 df)), that of unseen ones ("rides", "with a ball" ...) grows from log(3) to log(6)
    repeated = cider_d_per_caption(samples, sample_references)
    assert repeated[1] == pytest.approx(rewards[1]) and repeated[0] != pytest.approx(rewards[0])
    # a caption scored against a corpus that never saw its words gets the largest idf for them
    assert CiderD([["x y z"], ["u v w"]])(["a man rides a horse"], [["a man rides a horse"]]) == pytest.approx([10.0])


def test_single_image_cider_warns_and_is_zero():
    with pytest.warns(UserWarning, match="single image"):
        scores = caption_scores(["a dog"], [["a dog"]], metrics=["cider"], tokenizer="none")
    assert scores == {"cider": 0.0}


def test_metric_selection_and_empty_prediction():
    scores = caption_scores(["", "a cat on a mat"], [["a dog"], ["a cat on the mat"]], metrics=["rouge_l", "bleu"])
    assert list(scores) == ["bleu_1", "bleu_2", "bleu_3", "bleu_4", "rouge_l"]
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in scores.values())
    meteor = caption_scores(["", "a cat on a mat"], [["a dog"], ["a cat on the mat"]], metrics="meteor")
    assert list(meteor) == ["meteor"] and 0.0 < meteor["meteor"] < 1.0


def test_meteor_ranks_captions():
    good = caption_scores(["a man rides a horse on the beach"], [REFERENCES[0]], metrics=["meteor"])["meteor"]
    synonym = caption_scores(["a guy rides a horse at the beach"], [REFERENCES[0]], metrics=["meteor"])["meteor"]
    bad = caption_scores(["a plate of food on a table"], [REFERENCES[0]], metrics=["meteor"])["meteor"]
    assert good > synonym > bad >= 0.0


def test_simple_tokenizer_agrees_with_ptb():
    captions = [
        "A man's riding a horse (near the water).",
        'Two dogs can\'t play with a "red" ball, outdoors; e.g. in a park!',
        "3,000 people at 10:30 -- in the U.S. -- watch fireworks...",
        "Children's toys: a t-shirt and a well-known doll?",
    ]
    assert tokenize_captions(captions, "simple") == tokenize_captions(captions, "ptb")
    assert (
        simple_tokenize("A man's riding a horse (near the water).")
        == "a man 's riding a horse -lrb- near the water -rrb-"
    )
    # the real Flickr30k Entities sentences (markup removed): all but a rare oddity tokenise identically
    sentences = []
    for path in sorted(real_sample("flickr30k_entities", "Sentences").glob("*.txt")):
        for line in path.read_text(encoding="utf-8").splitlines():
            sentences.append(re.sub(r"\[/EN#\d+/\S+ ([^\]]*)\]", r"\1", line.strip()))
    assert len(sentences) > 1000
    ptb, simple = tokenize_captions(sentences, "ptb"), tokenize_captions(sentences, "simple")
    disagreements = [(s, p, q) for s, p, q in zip(sentences, ptb, simple) if p != q]
    assert len(disagreements) <= len(sentences) // 1000, disagreements[:5]


def test_evaluate_module_from_the_local_folder(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import evaluate

    assert (CAPTION_METRIC_PATH / "caption_scores.py").is_file()
    metric = evaluate.load(str(CAPTION_METRIC_PATH))
    from_module = metric.compute(predictions=PREDICTIONS, references=REFERENCES)
    assert from_module == caption_scores(PREDICTIONS, REFERENCES)
    for name, expected in COCO_EVAL.items():
        assert from_module[name] == pytest.approx(expected, abs=1e-9)
    helper = load_caption_metric()
    subset = helper.compute(
        predictions=PREDICTIONS, references=REFERENCES, metrics=["bleu", "cider"], tokenizer="simple"
    )
    assert subset == caption_scores(PREDICTIONS, REFERENCES, metrics=["bleu", "cider"], tokenizer="simple")


@pytest.mark.parametrize(
    ("predictions", "references", "kwargs", "message"),
    [
        (["a cat", "a dog"], [["a cat"]], {}, "same length"),
        (["a cat"], [[]], {}, r"`references\[0\]` must hold at least one"),
        (["a cat"], [["a cat", "..."]], {"tokenizer": "simple"}, r"`references\[0\]\[1\]`.*empty once tokenised"),
        (["a cat"], [["a cat"]], {"metrics": ["bleu", "cider_x"]}, "`metrics` must be"),
        (["a cat"], [["a cat"]], {"tokenizer": "spacy"}, "`tokenizer` must be one of"),
    ],
)
def test_bad_input(predictions, references, kwargs, message):
    with pytest.raises(ValueError, match=message):
        caption_scores(predictions, references, **kwargs)


def test_bad_input_to_cider_d():
    with pytest.raises(ValueError, match=r"`references\[1\]` must hold at least one"):
        CiderD([["a b"], []])
    with pytest.raises(ValueError, match="same length"):
        cider_d_per_caption(["a", "b"], [["a"]])


def test_spice_is_computed_only_when_its_jars_are_there():
    reason = spice_unavailable_reason()
    if reason is None:  # CoreNLP 3.6.0 installed by hand into pycocoevalcap/spice/lib: it must then work
        scores = caption_scores(PREDICTIONS, REFERENCES, metrics=["spice"])
        assert 0.0 <= scores["spice"] <= 1.0
    else:  # the machines of this project: no registry ships the jars, so the message must say what to do
        assert "stanford-corenlp-3.6.0.jar" in reason and "spice" in reason.lower()
        with pytest.raises(RuntimeError, match="SPICE is unavailable.*stanford-corenlp-3.6.0"):
            caption_scores(PREDICTIONS, REFERENCES, metrics=["bleu", "spice"])
    assert "spice" not in caption_scores(PREDICTIONS, REFERENCES, metrics=["bleu"], tokenizer="simple")


def test_missing_java_is_named(monkeypatch):
    monkeypatch.setattr(captioning.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="METEOR needs a Java runtime.*default-jre-headless"):
        caption_scores(PREDICTIONS, REFERENCES, metrics=["meteor"], tokenizer="simple")
    with pytest.raises(RuntimeError, match="PTB tokenizer.*Java runtime"):
        caption_scores(PREDICTIONS, REFERENCES, metrics=["bleu"])
    # the pure-Python path needs no Java
    assert caption_scores(PREDICTIONS, REFERENCES, metrics=["bleu", "rouge_l", "cider"], tokenizer="simple")
    assert "java" in spice_unavailable_reason()


@pytest.mark.slow
def test_a_failing_meteor_process_is_reported_and_dropped(monkeypatch):
    # last in the file: it stops the shared METEOR process (the next METEOR call starts a fresh one)
    import sys

    captioning.close_meteor()
    crash = [sys.executable, "-c", "import sys; sys.stderr.write('no paraphrase table'); sys.exit(3)"]
    monkeypatch.setattr(captioning, "_start_meteor", lambda: captioning._meteor_process_class()(crash))
    with pytest.raises(RuntimeError, match="METEOR .*failed.*no paraphrase table"):
        caption_scores(PREDICTIONS, REFERENCES, metrics=["meteor"], tokenizer="simple")
    assert captioning._METEOR is None
