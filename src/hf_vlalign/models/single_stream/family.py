"""The single-stream (VL-BERT / VisualBERT style) family's `FamilySpec` (see `hf_vlalign.models.family`)."""

from ..family_types import SUPERVISION_FIELDS, FamilySpec, ModelCardSpec, ModelSpec

_ATTENTION = ("query", "key", "value", "attention.output.dense")

SINGLE_STREAM = FamilySpec(
    name="single_stream",
    model_type="vlalign_single_stream",
    config_module="hf_vlalign.models.single_stream.configuration_single_stream",
    config_class="SingleStreamConfig",
    modeling_module="hf_vlalign.models.single_stream.modeling_single_stream",
    models={
        "base": ModelSpec("SingleStreamModel", ("AutoModel",)),
        "visual_paraphrase": ModelSpec(
            "SingleStreamForVisualParaphrase",
            ("AutoModelForVisualParaphrase",),
            tasks=("vgp",),
            head_modules=("id_classifier", "vgp_dense", "vgp_classifier"),
        ),
        "pretraining": ModelSpec(
            "SingleStreamForPreTraining",
            ("AutoModelForPreTraining",),
            head_modules=("cls.seq_relationship", "region_head"),
        ),
        "question_answering": ModelSpec(
            "SingleStreamForQuestionAnswering",
            ("AutoModelForVisualQuestionAnswering",),
            tasks=("vqa", "gqa"),
            head_modules=("answer_head",),
        ),
        "visual_reasoning": ModelSpec(
            "SingleStreamForVisualReasoning",
            ("AutoModelForVisualReasoning",),
            tasks=("nlvr2",),
            head_modules=("reasoning_head",),
        ),
        "referring_expression": ModelSpec(
            "SingleStreamForReferringExpression",
            ("AutoModelForReferringExpression",),
            tasks=("refcoco",),
            head_modules=("region_head",),
        ),
        "phrase_grounding": ModelSpec(
            "SingleStreamForPhraseGrounding",
            ("AutoModelForPhraseGrounding",),
            tasks=("flickr_grounding",),
            head_modules=("grounding_head",),
        ),
    },
    text_mask_key="attention_mask",
    region_mask_key="visual_attention_mask",
    probe_layers_field="num_hidden_layers",  # one joint self-attention stack: its text->region rows
    probe_heads_field="num_attention_heads",
    layer_fields=("num_hidden_layers",),
    attention_supervision=True,
    card=ModelCardSpec(
        template="single_stream",
        task_type="text-classification",
        task_name="Visually grounded paraphrase identification",
        tags=("vision-language", "attention-supervision", "visual-grounding", "visually-grounded-paraphrases"),
        settings=SUPERVISION_FIELDS,
        default_name="single-stream-vgp-{supervision}",
        task_card_tags=("single-stream",),
    ),
    lora_attention=_ATTENTION,
    lora_ffn=("intermediate.dense", "output.dense"),
)
