"""``python -m jaxinfer ...``: the ``jaxinfer`` command."""

import sys

from jaxinfer.entrypoints.cli import main

sys.exit(main())
