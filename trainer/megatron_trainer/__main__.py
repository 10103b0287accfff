"""`python -m megatron_trainer`: the container command of every MegatronJob pod."""

import sys

from .launcher import main

if __name__ == "__main__":
    sys.exit(main())
