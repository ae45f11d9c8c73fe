"""Rollout workflows and reward functions (depend on arealite.api only).

- ``rlvr.RLVRWorkflow``: n samples per prompt, each scored by a verifiable reward.
- ``math.MathRLVRWorkflow``: RLVR with ``rewards.math.math_reward`` plus an optional format term.
- ``multi_turn.MultiTurnWorkflow``: retries with feedback, stitched on token ids.
- ``reward_pool``: rewards off the event loop in worker processes, with timeouts and counters.
- ``rewards/``: toy, math, format and code rewards; ``sandbox/``: where code rewards run code.

The configured workflow is built by ``arealite.api.workflow_factory`` (it needs only the API).
See ``docs/custom_workflow.md`` for writing your own.
"""
