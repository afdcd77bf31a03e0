"""``python -m lookupdec``: the same as the ``lookupdec`` command."""

import sys

from lookupdec.cli import main

sys.exit(main())
