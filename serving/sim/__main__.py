"""``python -m serving.sim``: run a simulated vLLM fleet until SIGTERM/SIGINT."""

import sys

from serving.sim.cli import main

sys.exit(main())
