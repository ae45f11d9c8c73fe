"""Write the task's data: ``python make_data.py`` -> data/train.jsonl, data/valid.jsonl.

The task: "Which is larger, 3 or 8?" -> "8". Each row has the prompt, the answer your reward
needs, and an integer ``id`` (the trainer logs which rows it trained on).
"""

import json
import random
from pathlib import Path


def rows(n: int, seed: int, start_id: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.sample(range(10), 2)
        out.append({"id": start_id + i, "question": f"Which is larger, {a} or {b}?",
                    "answer": str(max(a, b))})
    return out


if __name__ == "__main__":
    folder = Path(__file__).parent / "data"
    folder.mkdir(exist_ok=True)
    for name, n, seed, start in (("train", 256, 0, 0), ("valid", 32, 1, 10_000)):
        with open(folder / f"{name}.jsonl", "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in rows(n, seed, start))
        print(folder / f"{name}.jsonl")
