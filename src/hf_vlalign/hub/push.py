"""Pushing a finished output folder to the Hub, after everything local is written (`push_folder_to_hub`,
`HubPushError`).

Defined in `hf_vlalign.utils.hub_push`, so that the models' `save_pretrained(push_to_hub=True)` pushes without
importing `hf_vlalign.hub`; this module is its public path, with the same objects.
"""

from ..utils.hub_push import HubPushError, push_folder_to_hub

__all__ = ["HubPushError", "push_folder_to_hub"]
