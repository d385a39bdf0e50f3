"""`python -m budgets`: see budgets/cli.py and budgets/README.md."""

import sys

from .cli import main

sys.exit(main())
