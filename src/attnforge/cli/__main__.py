"""`python -m attnforge.cli`: the same as the `attnforge` command."""

from attnforge.cli import main

raise SystemExit(main())
