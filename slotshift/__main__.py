"""`python -m slotshift` is the `slotshift` command."""

import sys

from slotshift.cli import main

sys.exit(main())
