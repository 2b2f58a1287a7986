"""``python -m attngen``: the ``attngen`` command (attngen.cli)."""
import sys

from attngen.cli import main

sys.exit(main())
