"""Optional dump of generated text, one folder per weight version (for reading what the policy
writes as it trains): ``<dump_dir>/<version>/<qid>.jsonl``, one JSON line per sample."""

from __future__ import annotations

import asyncio
import json
import os
from typing import Any


def _write(path: str, records: list[dict[str, Any]]) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "a", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


async def dump_samples(dump_dir: str, version: int, qid: str, records: list[dict[str, Any]]) -> str:
    """Append ``records`` for one prompt; file I/O runs off the event loop. Returns the path."""
    safe_qid = "".join(c if c.isalnum() or c in "-_." else "_" for c in str(qid))[:100] or "q"
    path = os.path.join(dump_dir, str(version), f"{safe_qid}.jsonl")
    await asyncio.to_thread(_write, path, records)
    return path
