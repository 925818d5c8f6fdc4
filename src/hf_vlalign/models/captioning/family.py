"""The captioner's (geometry-aware encoder-decoder over regions, A2 alignment) `FamilySpec` (see
`hf_vlalign.models.family`)."""

from ..family_types import FamilySpec, ModelCardSpec, ModelSpec

CAPTIONER = FamilySpec(
    name="captioner",
    model_type="vlalign_captioner",
    config_module="hf_vlalign.models.captioning.configuration_captioning",
    config_class="RegionCaptionerConfig",
    modeling_module="hf_vlalign.models.captioning.modeling_captioning",
    models={
        "base": ModelSpec("RegionCaptionerModel", ("AutoModel",)),
        # as its remote code: an encoder-decoder generating text, like BART (`AutoModelForSeq2SeqLM` + `generate`)
        "captioning": ModelSpec(
            "RegionCaptionerForConditionalGeneration",
            ("AutoModelForRegionCaptioning", "AutoModelForSeq2SeqLM"),
            tasks=("captioning",),
        ),
    },
    text_mask_key="decoder_attention_mask",  # the caption's tokens (teacher-forced)
    region_mask_key="visual_attention_mask",
    probe_layers_field="decoder_layers",  # the decoder's cross-attention over the regions
    probe_heads_field="decoder_attention_heads",
    layer_fields=("encoder_layers", "decoder_layers"),
    attention_supervision=False,
    card=ModelCardSpec(
        template="captioner",
        task_type="image-to-text",
        task_name="Image captioning",
        tags=("vision-language", "image-captioning", "visual-grounding"),
        settings=(
            "encoder_layers",
            "decoder_layers",
            "use_geometry",
            "attention_alignment",
            "aligned_layers",
            "alignment_eta",
            "alignment_temperature",
            "alignment_moving_average",
            "alignment_mask_input",
            "alignment_mask_regions",
            "mask_weight",
            "normalize_before",
        ),
        default_name="region-captioner-{fusion}",
    ),
    lora_attention=("q_proj", "k_proj", "v_proj", "out_proj"),
    lora_ffn=("fc1", "fc2"),
)
