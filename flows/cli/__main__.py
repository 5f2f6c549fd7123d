"""`python -m tokcap.flows.cli`: the `tokcap` command."""

import sys

from tokcap.flows.cli.main import main

sys.exit(main())
