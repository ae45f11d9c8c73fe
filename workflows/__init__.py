"""Rollout workflows and reward functions (depend on arealite.api only)."""
