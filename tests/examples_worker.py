"""Runs several examples' `main` one after the other in one process (or in each process of one launch), for the
tests that compare launches of several recipes (`tests/trainers/test_multiprocess.py`): one interpreter start-up
per process instead of one per recipe.

    accelerate launch ... tests/examples_worker.py RUNS_JSON

RUNS_JSON is a file holding a list of [example file, [its arguments]]; each example runs as it does under
`accelerate launch examples/<example>.py <its arguments>`, in the order given.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from script_modules import load_script


def main(runs_file: str) -> None:
    for example, argv in json.loads(Path(runs_file).read_text()):
        load_script(Path(example).stem, Path(example)).main(argv)


if __name__ == "__main__":
    main(sys.argv[1])
