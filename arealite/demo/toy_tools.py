"""A tool-use task a tiny model can learn on a CPU, where the tool matters: multiplication.

Problems are ``What is 47 * 8?`` (a two-digit times a one-digit number, answers up to 891): a
2-layer model cannot multiply in its head, but it can learn to call the calculator with the
operands copied from the question and then copy the tool's result into its answer. Rows are
``{"id", "question", "answer"}`` (the answer is the bare number). ``sft_rows`` renders
tool-call traces with the tokenizer's chat template (question -> ``calc`` call -> result ->
answer), one row per assistant turn, for an SFT warm start; ``calculate`` is the tool itself.
A problem's split is fixed by a hash of the problem, so train and held-out never share one.
"""

from __future__ import annotations

import ast
import hashlib
import json
import operator
import random
from pathlib import Path
from typing import Any

TOOLS = [{"type": "function", "function": {
    "name": "calc", "description": "Evaluate an arithmetic expression such as 47*8.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}},
                   "required": ["expr"]}}}]
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}


def calculate(expr: Any) -> str:
    """The calculator: integer ``+ - *`` over small numbers, or an ``error: ...`` text."""
    def ev(node: ast.AST) -> int:
        if isinstance(node, ast.Constant) and type(node.value) is int and abs(node.value) < 10**6:
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](ev(node.left), ev(node.right))
        raise ValueError("only integers and + - * are allowed")

    if not isinstance(expr, str) or len(expr) > 64:
        return "error: expr must be a short string"
    try:
        return str(ev(ast.parse(expr, mode="eval").body))
    except (SyntaxError, ValueError, RecursionError) as e:
        return f"error: {e}"


def problems() -> list[tuple[int, int]]:
    return [(a, b) for a in range(10, 100) for b in range(2, 10)]


def _heldout(p: tuple[int, int], seed: int, fraction: float) -> bool:
    h = hashlib.sha256(f"tools:{seed}:{p[0]}*{p[1]}".encode()).digest()
    return int.from_bytes(h[:4], "big") / 2**32 < fraction


def generate_toy_tools(n: int, seed: int = 0, split: str = "train",
                       valid_fraction: float = 0.2) -> list[dict[str, Any]]:
    if split not in ("train", "valid"):
        raise ValueError(f"split must be train or valid, not {split!r}")
    pool = [p for p in problems() if _heldout(p, seed, valid_fraction) == (split == "valid")]
    rng = random.Random(f"{seed}:{split}")
    rng.shuffle(pool)
    picked = pool[:n] if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return [{"id": i, "question": f"What is {a} * {b}?", "answer": str(a * b)}
            for i, (a, b) in enumerate(picked)]


def trace(row: dict[str, Any]) -> list[dict[str, Any]]:
    """The conversation a good agent has for ``row``."""
    a, b = row["question"].removeprefix("What is ").removesuffix("?").split(" * ")
    expr = f"{a}*{b}"
    return [
        {"role": "user", "content": row["question"]},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "call_0", "type": "function",
         "function": {"name": "calc", "arguments": {"expr": expr}}}]},
        {"role": "tool", "tool_call_id": "call_0", "content": calculate(expr)},
        {"role": "assistant", "content": row["answer"]},
    ]


def corpus_texts(n: int = 500, seed: int = 0) -> list[str]:
    """Text in the shape of the traces, for training a tokenizer that compresses them."""
    texts = ["<|im_start|>system\n# Tools\n<tools>\ncalc(expr)\n</tools><|im_end|>\n"]
    for row in generate_toy_tools(n, seed=seed):
        expr = row["question"].removeprefix("What is ").removesuffix("?").replace(" * ", "*")
        call = json.dumps({"name": "calc", "arguments": {"expr": expr}})
        texts += [f"<|im_start|>user\n{row['question']}<|im_end|>\n<|im_start|>assistant\n",
                  f"<tool_call>\n{call}\n</tool_call><|im_end|>\n",
                  f"<|im_start|>user\n<tool_response>\n{row['answer']}\n</tool_response><|im_end|>\n",
                  f"<|im_start|>assistant\n{row['answer']}<|im_end|>\n"]
    return texts


def sft_rows(tokenizer: Any, rows: list[dict[str, Any]]) -> list[dict[str, str]]:
    """``{"prompt", "completion"}`` per assistant turn of each row's trace: the prompt is the
    template's rendering up to the assistant header, the completion what the model writes
    (the SFT loader adds EOS)."""
    out = []
    for row in rows:
        conv = trace(row)
        for k, m in enumerate(conv):
            if m["role"] != "assistant":
                continue
            head = tokenizer.apply_chat_template(conv[:k], tools=TOOLS, tokenize=False,
                                                 add_generation_prompt=True)
            full = tokenizer.apply_chat_template(conv[:k + 1], tools=TOOLS, tokenize=False)
            body = full[len(head):]
            end = body.rindex(tokenizer.eos_token)
            out.append({"prompt": head, "completion": body[:end]})
    return out


def write_toy_tools(out_dir: str | Path, tokenizer: Any, n_train: int = 2000,
                    n_valid: int = 100, seed: int = 0) -> dict[str, Path]:
    """``train.jsonl`` / ``valid.jsonl`` (problems for the agent) and ``sft_train.jsonl`` /
    ``sft_valid.jsonl`` (rendered traces for the warm start) in ``out_dir``."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {}
    for split, n in (("train", n_train), ("valid", n_valid)):
        rows = generate_toy_tools(n, seed=seed, split=split)
        for name, data in ((split, rows), (f"sft_{split}", sft_rows(tokenizer, rows))):
            p = out / f"{name}.jsonl"
            p.write_text("".join(json.dumps(r) + "\n" for r in data))
            paths[name] = p
    return paths
