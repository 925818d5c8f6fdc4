"""`python -m hf_vlalign.cli <verb> ...`, the same as the `hf-vlalign` console script."""

import sys

from . import main

sys.exit(main())
