"""``python -m attnforge.builder --spec SPEC.json`` (or ``python -m builder`` where the folder is mounted)."""

import sys

from .main import main

sys.exit(main())
