"""`python -m hf_vlalign.cli <verb> ...`, the same as the `hf-vlalign` console script."""

import sys

from . import main

if __name__ == "__main__":
    sys.exit(main())
