"""`python -m megatron_operator.cli` is `mjob`."""

import sys

from megatron_operator.cli.main import main

sys.exit(main())
