"""`python -m megatron_trainer`: the container command of every MegatronJob pod."""

import sys

from .early_signals import catch

catch()  # first: a stop before the launcher's handlers must not be dropped (early_signals.py)

from .launcher import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
