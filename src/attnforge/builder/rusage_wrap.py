"""``python rusage_wrap.py OUT -- CMD...``: run CMD and write the peak RSS (KiB) of its largest process.

A standalone script (no package imports): the builder runs pip through it, because only a parent of the
whole tree can read its children's peak RSS (``RUSAGE_CHILDREN``) once they have exited.
"""

import json
import resource
import subprocess
import sys
from pathlib import Path


def main(argv: "list[str]") -> int:
    out, sep = argv[0], argv.index("--")
    rc = subprocess.call(argv[sep + 1 :])
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    Path(out).write_text(json.dumps({"maxrss_kb": usage.ru_maxrss, "rc": rc}), encoding="utf-8")
    return rc if rc >= 0 else 128 - rc


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
