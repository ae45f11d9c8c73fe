"""The client side, whole: ``RemoteSGLangEngine`` (``remote_engine``), the workflow executor and
its staleness gate, routing and health over the server pool (``router``, ``health``), the
/generate wire format behind one seam (``backend.GenerateProtocol``; SGLang's is
``sglang_protocol``), and weight-update
orchestration (``weight_sync``). The trainer side is ``arealite.engine``; neither imports the
other."""
