"""Task-head fields of a family's config: what a saved `config.json` keeps of them.

One configuration class serves every model class of a family (like `BertConfig`), so it has the fields of every task
head: the VGP classifiers' sizes, the answer vocabulary of the QA head, the pre-training loss weights. A saved config
keeps the fields of the heads it was saved from (`config.architectures`) and drops those only other heads read while
they hold their default, so that a VGP checkpoint's `config.json` says nothing about answers. Nothing is lost: loading
any head from the folder gets the same defaults.
"""

from __future__ import annotations

from transformers import PreTrainedConfig


def drop_other_head_fields(
    config: PreTrainedConfig, config_dict: dict, head_fields: dict[str, tuple[str, ...]]
) -> dict:
    """`config_dict` (what `config.json` gets) without the fields that only model classes other than
    `config.architectures` read, where they hold the class default. `head_fields` maps each model class of the family
    to the fields only it reads; a config of another architecture, or of none (a config saved on its own), keeps every
    field."""
    architectures = config.architectures or []
    if not architectures or any(name not in head_fields for name in architectures):
        return config_dict
    used = {name for architecture in architectures for name in head_fields[architecture]}
    unused = {name for fields in head_fields.values() for name in fields} - used
    return {
        key: value
        for key, value in config_dict.items()
        if key not in unused or value != getattr(type(config), key)
    }
