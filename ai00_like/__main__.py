"""`python -m ai00_like` runs the command line."""

from .cli import main

raise SystemExit(main())
