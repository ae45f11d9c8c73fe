"""Rule-based rewards, each ``reward_fn(prompt, completion, prompt_ids, completion_ids, **row)``.

- ``toy.toy_reward``: the toy arithmetic task (``#### N`` must equal the row's); runs inline.
- ``math.math_reward``: math answers checked with math-verify (GSM8K, ``\\boxed{}``, LaTeX).
- ``format.format_reward``: a configurable format check (answer tag, think/answer, ...).
- ``code.code_reward``: fraction of test cases passed in the sandbox.
- ``combine.WeightedSum``: a weighted sum of rewards (e.g. correctness + a format term).

Import the submodules directly; this package imports nothing heavy.
"""
