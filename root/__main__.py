"""`python -m lynxtop` and the `lynxtop` console script: the commands live in `lynxtop.cli`."""

import sys

from lynxtop.cli.__main__ import main

if __name__ == "__main__":
    sys.exit(main())
