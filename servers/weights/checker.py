"""``/weights_checker``: proof that the server holds given weights, cheaper than shipping them.

SGLang 0.5.23's route and payload (``CheckWeightsReqInput``; ``action="checksum"`` only here):
``{"success", "message", "ranks": [{"checksums": {name: hex}, "per_gpu_checksum",
"parallelism_info"}], "per_engine_checksum"}``. A tensor's checksum is SGLang's CPU
``_hash_tensor``: the first 8 bytes of SHA-256 over the tensor's raw bytes, as 16 hex digits.
A hash of the bytes (not a sum of values) changes with any single changed element in any dtype
(fp32, bf16, ...), including sign flips, swapped elements and changes far below a float sum's
rounding, and costs one pass over memory. Two additions SGLang does not send: ``"dtypes"``
(``{name: torch dtype name}``) per rank and ``"hash": "sha256-64"``, so that a client knows the
checksums are comparable with its own (SGLang on GPUs hashes with its own kernel, and fuses
tensors under other names).
"""

from __future__ import annotations

import hashlib

import torch
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict

router = APIRouter()

HASH_NAME = "sha256-64"


class CheckWeightsReq(BaseModel):
    model_config = ConfigDict(extra="ignore")  # unknown keys ignored, as SGLang's msgspec bridge

    action: str = "checksum"
    allow_quant_error: bool = False
    skip_tensor_list: list[str] | None = None
    selector: str = "all"


def tensor_checksum(t: torch.Tensor) -> str:
    """SHA-256 of the raw bytes, first 8 bytes as hex (SGLang's ``_hash_tensor`` on CPU)."""
    t = t.detach().contiguous().cpu()
    data = t.reshape(-1).view(torch.uint8).numpy() if t.numel() else b""
    return hashlib.sha256(memoryview(data)).digest()[:8].hex()


def overall_checksum(checksums: dict[str, str]) -> str:
    """SGLang's ``overall_checksum``: SHA-256 over sorted (name, checksum) pairs."""
    h = hashlib.sha256()
    for name in sorted(checksums):
        h.update(name.encode())
        h.update(checksums[name].encode())
    return h.hexdigest()


def model_checksums(model: torch.nn.Module, skip: list[str] | None = None
                    ) -> tuple[dict[str, str], dict[str, str]]:
    """``({name: checksum}, {name: dtype})`` over ``named_parameters`` (a tied weight once)."""
    sums, dtypes = {}, {}
    for name, p in model.named_parameters():
        if any(s in name for s in (skip or ())):
            continue
        sums[name] = tensor_checksum(p)
        dtypes[name] = str(p.dtype).removeprefix("torch.")
    return sums, dtypes


@router.api_route("/weights_checker", methods=["GET", "POST"])
async def weights_checker(request: Request, obj: CheckWeightsReq | None = None) -> JSONResponse:
    st = request.app.state.server
    obj = obj or CheckWeightsReq()
    if obj.action != "checksum":
        return JSONResponse({"success": False, "message": f"Unsupported action={obj.action!r} "
                             "(this server implements only 'checksum')"}, status_code=400)
    # in the engine thread: no weight update can write the model while it is hashed
    sums, dtypes = await st.in_engine(lambda: model_checksums(st.runner.model, obj.skip_tensor_list))
    per_gpu = overall_checksum(sums)
    rank = {"checksums": sums, "per_gpu_checksum": per_gpu, "dtypes": dtypes,
            "parallelism_info": {"role": "target", "tp_rank": 0, "tp_size": 1, "dp_rank": 0,
                                 "dp_size": 1, "pp_rank": 0, "pp_size": 1, "rank": 0, "size": 1}}
    return JSONResponse({"success": True, "message": "Success.", "hash": HASH_NAME,
                         "ranks": [rank],
                         "per_engine_checksum": hashlib.sha256(per_gpu.encode()).hexdigest()})
