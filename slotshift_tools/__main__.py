"""`python -m slotshift_tools` is the `slotshift` command."""

import sys

from slotshift_tools.cli import main

sys.exit(main())
