"""The device check (issue 36): every CUDA path of arealite in one time-boxed run on a lent GPU,
written to one results file and one log. ``prepare`` fetches the wheels the device lacks,
``run`` runs the parts (``device_info``, the CUDA tests, ``colocated``, ``decode``, the
long-context table), each in its own process under its own time limit. docs/gpu_check.md."""
