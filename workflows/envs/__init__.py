"""Environment libraries run as arealite workflows: ``verifiers_env`` (verifiers 0.4 environments)
and, in ``vf_plugins``, the verifiers plugins it ships (``arealite_locked_chat``: verifiers' chat
harness run from the lock, not ``uv``)."""
