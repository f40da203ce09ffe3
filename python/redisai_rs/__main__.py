"""`python -m redisai_rs ...`: the same as the `redisai-rs` command."""
import sys

from ._cli import main

sys.exit(main())
