"""`python -m vlgrpo.cli ...` (the launchers' form: torchrun --module vlgrpo.cli)."""

import sys

from vlgrpo.cli.main import main

sys.exit(main())
