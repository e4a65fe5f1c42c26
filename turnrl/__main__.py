"""``python -m turnrl``: the ``turnrl`` command line (see ``turnrl.cli``)."""

from turnrl.cli import main

raise SystemExit(main())
