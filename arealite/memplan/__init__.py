"""The memory planner: every GPU's peak memory predicted from a run's config, on a CPU.

The trainer's per-rank peak comes from the engine's own code (model built from its HF config,
FSDP2 over a fake process group of the configured ranks, the update's forward, backward and
optimizer step) run under ``FakeTensorMode`` (shapes and dtypes, no storage) with torch's
``MemTracker``/``FSDPMemTracker`` counting live bytes by category; the servers' peak (weights +
KV cache) is a stated formula. ``arealite plan CONFIG`` prints both; the launcher asks
``launch_check.check_memory`` before it starts anything. See docs/memory_planner.md.

This room imports the engine and the config; nothing in the core imports it (the launcher, a
higher layer, asks it first).
"""
