"""The client side, whole: ``RemoteSGLangEngine`` (``remote_engine``: generation, routing and
failover over the server pool; its trainer half, the version clock, the event loop and the
executor, is ``rollout_control``), the workflow executor and its staleness gate (``executor``,
``staleness``, ``data_cycle``, ``loop_thread``), routing and health (``router``, ``health``).
The /generate wire format is the backend's (``arealite.backends``), the weight transports are
the weights room's (``arealite.weights``). The trainer side is ``arealite.engine``; neither
imports the other."""
