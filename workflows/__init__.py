"""Rollout workflows and reward functions (depend on arealite.api only).

- ``rlvr.RLVRWorkflow``: n samples per prompt, each scored by a verifiable reward.
- ``math.MathRLVRWorkflow``: RLVR with ``rewards.math.math_reward`` plus an optional format term.
- ``multi_turn.MultiTurnWorkflow``: retries with feedback, stitched on token ids.
- ``factory.build_workflow``: the configured workflow, classes and rewards named by import path.
- ``reward_pool``: rewards off the event loop in worker processes, with timeouts and counters.
- ``rewards/``: toy, math, format and code rewards; ``sandbox/``: where code rewards run code.

See ``docs/custom_workflow.md`` for writing your own.
"""
