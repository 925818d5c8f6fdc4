"""Pushing a finished output folder to the Hub once everything local is written (public as
`hf_vlalign.hub.push_folder_to_hub`; here, below the models, for `save_pretrained(push_to_hub=True)`).
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import HfApi


class HubPushError(RuntimeError):
    """The upload to the Hub failed; the local folder it names is complete."""

    def __init__(self, message: str, folder: Path, repo_id: str):
        super().__init__(message)
        self.folder = folder
        self.repo_id = repo_id


def push_folder_to_hub(
    folder: str | os.PathLike,
    *,
    repo_id: str | None = None,
    token: str | bool | None = None,
    private: bool | None = None,
    commit_message: str = "Upload with hf_vlalign",
    create_pr: bool = False,
) -> str:
    """Creates the repository if needed and uploads the whole of `folder`; returns the commit URL.

    Call it only once every local file is written. Any failure of the Hub side is raised as [`HubPushError`] with
    the local folder's path (complete, nothing local depends on the push) and the command to upload it again.

    Args:
        folder: the complete local output folder.
        repo_id: `namespace/name` or `name` (default: the folder's name, in the token owner's namespace).
        token, private, commit_message, create_pr: as in `HfApi.create_repo` / `HfApi.upload_folder`.
    """
    folder = Path(folder).resolve()
    if not folder.is_dir():
        raise FileNotFoundError(f"Nothing to push: {folder} is not a folder.")
    repo_id = repo_id or folder.name
    try:
        api = HfApi(token=token)
        repo_id = api.create_repo(repo_id, exist_ok=True, private=private).repo_id
        commit = api.upload_folder(
            repo_id=repo_id, folder_path=folder, commit_message=commit_message, create_pr=create_pr
        )
    except Exception as error:  # the Hub side only: every local file was written before
        raise HubPushError(
            f"Pushing to the Hub repository {repo_id!r} failed ({type(error).__name__}: {error}). The local output "
            f"folder {folder} is complete; upload it again with `hf upload {repo_id} {folder} .`.",
            folder=folder,
            repo_id=repo_id,
        ) from error
    return commit.commit_url
