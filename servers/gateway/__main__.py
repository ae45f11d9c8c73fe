"""``python -m servers.gateway``: the gateway's entry point (``servers.gateway.app``)."""

from servers.gateway.app import main

raise SystemExit(main())
