"""``python -m tests.support.run_launcher CONFIG ...``: the local launcher, with the server
module (of both backends) swapped for ``FAKE_SERVER_MODULE`` when that variable is set."""

from __future__ import annotations

import os
import sys

from arealite.launcher import plan
from arealite.launcher.local import main

if __name__ == "__main__":
    if os.environ.get("FAKE_SERVER_MODULE"):
        for backend in plan.SERVER_MODULES:
            plan.SERVER_MODULES[backend] = os.environ["FAKE_SERVER_MODULE"]
    sys.exit(main(sys.argv[1:]))
