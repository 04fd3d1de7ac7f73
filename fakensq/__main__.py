"""``python -m fakensq COMMAND``: the same as the ``fakensq`` console script."""

from fakensq.cli import main

raise SystemExit(main())
