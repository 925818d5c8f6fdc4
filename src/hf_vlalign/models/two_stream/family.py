"""The two-stream (LXMERT style) family's `FamilySpec` (see `hf_vlalign.models.family`)."""

from ..family_types import SUPERVISION_FIELDS, FamilySpec, ModelCardSpec, ModelSpec

TWO_STREAM = FamilySpec(
    name="two_stream",
    model_type="vlalign_two_stream",
    config_module="hf_vlalign.models.two_stream.configuration_two_stream",
    config_class="TwoStreamConfig",
    modeling_module="hf_vlalign.models.two_stream.modeling_two_stream",
    models={
        "base": ModelSpec("TwoStreamModel", ("AutoModel",)),
        "question_answering": ModelSpec(
            "TwoStreamForQuestionAnswering",
            ("AutoModelForVisualQuestionAnswering",),
            tasks=("vqa", "gqa"),
            head_modules=("answer_head",),
        ),
        "pretraining": ModelSpec(
            "TwoStreamForPreTraining",
            ("AutoModelForPreTraining",),
            tasks=("gqa",),  # with its QA head (`task_qa`): the GQA evaluation of Kervadec et al.
            head_modules=("matching_head", "object_head", "answer_head", "alignment_decoder"),
        ),
        "visual_reasoning": ModelSpec(
            "TwoStreamForVisualReasoning",
            ("AutoModelForVisualReasoning",),
            tasks=("nlvr2",),
            head_modules=("reasoning_head",),
        ),
        "referring_expression": ModelSpec(
            "TwoStreamForReferringExpression",
            ("AutoModelForReferringExpression",),
            tasks=("refcoco",),
            head_modules=("region_head",),
        ),
        "phrase_grounding": ModelSpec(
            "TwoStreamForPhraseGrounding",
            ("AutoModelForPhraseGrounding",),
            tasks=("flickr_grounding",),
            head_modules=("grounding_head",),
        ),
    },
    text_mask_key="attention_mask",
    region_mask_key="visual_attention_mask",
    probe_layers_field="x_layers",  # the cross-modality layers' language -> vision attention
    probe_heads_field="num_attention_heads",
    layer_fields=("l_layers", "r_layers", "x_layers"),
    attention_supervision=True,
    card=ModelCardSpec(
        template="two_stream",
        task_type="visual-question-answering",
        task_name="Visual question answering and word-object alignment",
        tags=("vision-language", "visual-grounding", "word-object-alignment", "visual-question-answering", "lxmert"),
        settings=(
            "l_layers",
            "r_layers",
            "x_layers",
            *SUPERVISION_FIELDS,
            "task_mask_lm",
            "task_obj_predict",
            "task_matched",
            "task_qa",
            "task_alignment",
            "alignment_top_k",
            "alignment_outside_top_k",
            "alignment_weight",
        ),
        default_name="two-stream-pretrained{alignment}",
        task_card_tags=("two-stream", "lxmert"),
    ),
    lora_attention=(
        "query",
        "key",
        "value",
        "attention.output.dense",  # language and vision self-attention layers
        "cross_attention.output.dense",  # cross layers (shared, or language -> vision when separate)
        "vision_cross_attention.output.dense",  # cross layers, vision -> language when `share_cross_attention=False`
        "language_self_attention.output.dense",
        "vision_self_attention.output.dense",
    ),
    lora_ffn=(
        "intermediate.dense",  # language and vision layers
        "output.dense",
        "language_intermediate.dense",  # cross layers
        "language_output.dense",
        "vision_intermediate.dense",
        "vision_output.dense",
    ),
)
