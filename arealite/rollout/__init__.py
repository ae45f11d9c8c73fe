"""Rollout machinery: the workflow executor, the staleness gate, the server pool's routing and
health, the /generate wire mapping, and weight-update orchestration."""
