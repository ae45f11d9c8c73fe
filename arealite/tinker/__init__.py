"""A Tinker-compatible service (the official ``tinker`` SDK's HTTP API) over arealite's trainer
engine and server pool: ``arealite tinker-server CONFIG`` (docs/tinker.md). A room of its own on
top of the core; nothing in the core imports it."""
