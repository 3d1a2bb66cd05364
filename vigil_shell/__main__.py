"""``python -m vigil_shell``: the ``vigil`` command."""

import sys

from vigil_shell.cli import main

sys.exit(main())
