"""The embedded server's LoRA protocol (SGLang's): adapters from --lora-paths and
/load_lora_adapter serve their own requests in one batch with the base model; each request's
logprobs equal the trainer's peft model for the same tokens (fp32, CPU, 1e-5); bad adapter
names and folders are 400s that name them and hurt no other request."""

from __future__ import annotations

import json
import threading

import pytest
import torch

from arealite.api.config.actor import LoRAConfig
from arealite.api.trajectory import pad_sequences_to_tensors
from arealite.engine.fsdp_engine import FSDPEngine
from tests.support.fsdp_helpers import engine_config
from tests.support.http_calls import gen, post
from tests.support.procs import embedded_server


def requests_get(server: str, path: str) -> dict:
    import requests

    return requests.get(f"{server}{path}", timeout=30).json()

pytestmark = pytest.mark.integration

PROMPTS = [[5, 17, 42, 8, 99], [7, 7, 123, 55], [201, 3, 64, 12, 80, 31]]
NEW = 8


def trainer(model_dir, seed: int | None) -> FSDPEngine:
    """A trainer engine: the base model (seed None) or a random LoRA adapter (B != 0)."""
    cfg = None if seed is None else LoRAConfig(rank=4, alpha=8.0, init_lora_weights=False,
                                               target_modules=["q_proj", "v_proj", "up_proj"])
    e = FSDPEngine(engine_config(model_dir, optimizer=None, lora=cfg), device="cpu",
                   backend="gloo", seed=seed or 1)
    e.initialize()
    return e


@pytest.fixture(scope="module")
def adapters(tiny_model_dir, tmp_path_factory):
    """Two saved adapters (a, b) and the trainer engines they came from (plus the base)."""
    from arealite.api.io_struct import SaveLoadMeta

    root = tmp_path_factory.mktemp("loras")
    engines = {None: trainer(tiny_model_dir, None)}
    for name, seed in (("a", 11), ("b", 22)):
        engines[name] = trainer(tiny_model_dir, seed)
        engines[name].save(SaveLoadMeta(path=str(root / name), weight_format="hf",
                                        with_optim=False))
    yield root, engines
    for e in engines.values():
        e.destroy()


@pytest.fixture(scope="module")
def lora_server(tiny_model_dir, adapters):
    root, _ = adapters
    args = ["--random-seed", "0", "--lora-paths", f"a={root / 'a'}", "--max-loras-per-batch",
            "2", "--weight-load-root", str(root)]
    with embedded_server(str(tiny_model_dir), args) as addr:
        yield f"http://{addr}"


def trainer_logprobs(engine: FSDPEngine, prompt: list[int], out: list[int]) -> list[float]:
    row = {"input_ids": prompt + out, "loss_mask": [0] * len(prompt) + [1] * len(out)}
    lp = engine.forward(pad_sequences_to_tensors([row]))
    return lp[0, len(prompt): len(prompt) + len(out)].tolist()


def test_mixed_batch_each_request_gets_its_own_model(lora_server, adapters):
    root, engines = adapters
    r = post(lora_server, "/load_lora_adapter", {"lora_name": "b", "lora_path": str(root / "b")})
    assert r.status_code == 200 and r.json()["success"], r.text
    assert r.json()["loaded_adapters"] == {"a": str(root / "a"), "b": str(root / "b")}
    # one /generate: three prompts on adapter a, adapter b and the base model, one batch
    names = ["a", "b", None]
    outs = gen(lora_server, {
        "input_ids": PROMPTS, "lora_path": names, "return_logprob": True,
        "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True},
    })
    worst = 0.0
    seen = []
    for prompt, name, out in zip(PROMPTS, names, outs):
        ids = out["output_ids"]
        got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
        want = trainer_logprobs(engines[name], prompt, ids)
        worst = max(worst, max(abs(g - w) for g, w in zip(got, want)))
        # and not the other models' logprobs: the adapters really differ
        others = [trainer_logprobs(engines[o], prompt, ids) for o in names if o != name]
        seen.append(min(max(abs(g - w) for g, w in zip(got, o)) for o in others))
    assert worst < 1e-5, worst
    assert min(seen) > 1e-3, seen
    # the same request alone gives the same tokens' logprobs (batching changed nothing)
    solo = gen(lora_server, {
        "input_ids": PROMPTS[1], "lora_path": "b", "return_logprob": True,
        "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True},
    })
    want = trainer_logprobs(engines["b"], PROMPTS[1], solo["output_ids"])
    got = [x[0] for x in solo["meta_info"]["output_token_logprobs"]]
    assert max(abs(g - w) for g, w in zip(got, want)) < 1e-5


def test_bad_adapters_are_400s_naming_them(lora_server, adapters):
    root, _ = adapters
    results: dict[str, object] = {}

    def good() -> None:  # runs while the bad ones are refused: must not notice them
        results["good"] = gen(lora_server, {
            "input_ids": PROMPTS[0], "lora_path": "a",
            "sampling_params": {"max_new_tokens": 24, "temperature": 0.0, "ignore_eos": True}})

    t = threading.Thread(target=good)
    t.start()
    r = post(lora_server, "/generate", {"input_ids": PROMPTS[0], "lora_path": "nope",
                                         "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "nope" in r.text
    r = post(lora_server, "/generate", {"input_ids": PROMPTS[:2], "lora_path": ["a", "zzz"],
                                         "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 400 and "zzz" in r.text
    r = post(lora_server, "/load_lora_adapter", {"lora_name": "c", "lora_path": str(root)})
    assert r.status_code == 400 and str(root) in r.json()["error_message"]
    r = post(lora_server, "/load_lora_adapter", {"lora_name": "a", "lora_path": str(root / "a")})
    assert r.status_code == 400 and "'a' is already loaded" in r.json()["error_message"]
    r = post(lora_server, "/load_lora_adapter", {"lora_name": "d", "lora_path": "/etc/x"})
    assert r.status_code == 400 and "outside the folders" in r.json()["error_message"]
    r = post(lora_server, "/unload_lora_adapter", {"lora_name": "ghost"})
    assert r.status_code == 400 and "ghost" in r.json()["error_message"]
    t.join(60)
    assert len(results["good"]["output_ids"]) == 24


def test_unload_lets_running_requests_finish(lora_server, adapters):
    """Unloading an adapter while a request runs on it: the request finishes on it (every
    token's logprob is the adapter's), new requests naming it get a 400."""
    import requests

    root, engines = adapters
    post(lora_server, "/load_lora_adapter", {"lora_name": "tmp", "lora_path": str(root / "b")})
    with requests.post(f"{lora_server}/generate", stream=True, timeout=120, json={
            "input_ids": PROMPTS[2], "lora_path": "tmp", "return_logprob": True, "stream": True,
            "sampling_params": {"max_new_tokens": 400, "temperature": 1.0,
                                "ignore_eos": True}}) as r:
        lines = r.iter_lines()
        first = next(ln for ln in lines if ln)  # the request runs
        assert first.startswith(b"data: {")
        # hold it in the batch (in-place pause) so it is surely in flight across the unload
        assert post(lora_server, "/pause_generation", {"mode": "in_place"}).status_code == 200
        running = requests.get(f"{lora_server}/v1/loads", timeout=10).json()["loads"][0]
        u = post(lora_server, "/unload_lora_adapter", {"lora_name": "tmp"})
        bad = post(lora_server, "/generate", {"input_ids": PROMPTS[0], "lora_path": "tmp",
                                              "sampling_params": {"max_new_tokens": 2}})
        assert post(lora_server, "/continue_generation", {}).status_code == 200
        chunks = [ln for ln in lines if ln.startswith(b"data: {")]
    assert running["num_running_reqs"] == 1, running
    assert u.status_code == 200 and "tmp" not in u.json()["loaded_adapters"]
    assert bad.status_code == 400 and "tmp" in bad.text
    out = json.loads(chunks[-1][6:])
    assert out["meta_info"]["finish_reason"]["type"] == "length"
    ids = out["output_ids"]
    assert len(ids) == 400
    got = torch.tensor([x[0] for x in out["meta_info"]["output_token_logprobs"]])
    want = torch.tensor(trainer_logprobs(engines["b"], PROMPTS[2], ids))
    assert float((got - want).abs().max()) < 1e-5  # every token on the adapter it started with


def test_openai_routes_pick_the_adapter_as_sglang_does(lora_server, adapters):
    """``/v1/completions`` and ``/v1/chat/completions``: ``model`` = ``"<base>:<adapter>"`` or
    the body's ``lora_path`` runs the adapter (its logprobs are the peft model's); a bare name
    is the base model (as on SGLang); an unknown adapter is a 400 naming it; ``/v1/models``
    lists the loaded adapters."""
    _, engines = adapters
    sampling = {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True,
                "sampling_seed": 7}  # seeded: the same tokens whatever the batch
    for extra, name in (({"model": "tiny:a"}, "a"), ({"model": "m", "lora_path": "a"}, "a"),
                        ({"model": "a"}, None)):
        r = post(lora_server, "/v1/completions", {
            "prompt": PROMPTS[0], "max_tokens": NEW, "temperature": 1.0, "ignore_eos": True,
            "seed": 7, "logprobs": 0, **extra})
        assert r.status_code == 200, r.text
        choice = r.json()["choices"][0]
        # the token ids behind the text: /generate on the same model with the same seed
        ref = gen(lora_server, {"input_ids": PROMPTS[0], "lora_path": name,
                                "sampling_params": sampling})
        assert choice["text"] == ref["text"], extra
        want = trainer_logprobs(engines[name], PROMPTS[0], ref["output_ids"])
        got = choice["logprobs"]["token_logprobs"]
        assert max(abs(g - w) for g, w in zip(got, want)) < 1e-5, extra
    r = post(lora_server, "/v1/completions", {"model": "tiny:nope", "prompt": PROMPTS[0],
                                               "max_tokens": 2})
    assert r.status_code == 400 and "nope" in r.json()["message"], r.text
    r = post(lora_server, "/v1/chat/completions", {
        "model": "tiny:ghost", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 400 and "ghost" in r.text, r.text
    cards = {c["id"]: c for c in requests_get(lora_server, "/v1/models")["data"]}
    assert cards["a"]["parent"] in cards and cards["a"]["root"].endswith("a")


def test_load_adapter_from_tensors(lora_server, adapters):
    """SGLang's ``/load_lora_adapter_from_tensors`` (the payload by shared-memory reference, as a
    dict or a flattened bucket):
    the adapter serves its requests with the peft model's logprobs, its path reads
    ``__tensor__``; a checksum mismatch, a bad payload or a tensor that fits no layer is a 400."""
    import hashlib
    import json as _json

    from safetensors.torch import load_file

    from arealite.weights.shared_tensors import lora_tensors_body, serialize_tensor_dict

    root, engines = adapters
    cfg = _json.loads((root / "b" / "adapter_config.json").read_text())
    tensors = load_file(str(root / "b" / "adapter_model.safetensors"))
    sums = {n: hashlib.sha256(t.contiguous().flatten().view(torch.uint8).numpy().tobytes())
            .hexdigest() for n, t in tensors.items()}
    bad = dict(sums, **{next(iter(sums)): "0" * 64})
    r = post(lora_server, "/load_lora_adapter_from_tensors",
             {**lora_tensors_body("mem", cfg, tensors), "expected_checksums": bad})
    assert r.status_code == 400 and "expected_checksums" in r.json()["error_message"], r.text
    # SGLang's plain form (load_format null): the pickled {name: tensor} dict itself
    r = post(lora_server, "/load_lora_adapter_from_tensors", {
        "lora_name": "mem", "config_dict": cfg, "expected_checksums": sums,
        "serialized_named_tensors": [serialize_tensor_dict(tensors)]})
    assert r.status_code == 200 and r.json()["loaded_adapters"]["mem"] == "__tensor__", r.text
    out = gen(lora_server, {"input_ids": PROMPTS[1], "lora_path": "mem", "return_logprob": True,
                            "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0,
                                                "ignore_eos": True}})
    got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
    want = trainer_logprobs(engines["b"], PROMPTS[1], out["output_ids"])
    assert max(abs(g - w) for g, w in zip(got, want)) < 1e-5
    r = post(lora_server, "/load_lora_adapter_from_tensors", {
        "lora_name": "x", "config_dict": cfg, "serialized_named_tensors": ["%%%"]})
    assert r.status_code == 400 and "base64" in r.json()["error_message"], r.text
    wrong = {k.replace("q_proj", "nope_proj"): v for k, v in tensors.items()}
    r = post(lora_server, "/load_lora_adapter_from_tensors", lora_tensors_body("x", cfg, wrong))
    assert r.status_code == 400 and "nope_proj" in r.json()["error_message"], r.text
    assert post(lora_server, "/unload_lora_adapter", {"lora_name": "mem"}).status_code == 200


def test_openai_model_parameter_forms():
    from servers.engine.lora import openai_lora_path

    assert openai_lora_path("base:ad", "base", None) == "ad"
    assert openai_lora_path("s3://b/m:ad", "s3://b/m", None) == "ad"  # the served name whole
    assert openai_lora_path("s3://b/m", "s3://b/m", "x") == "x"
    assert openai_lora_path("other:ad", "base", "x") == "ad"  # the model's adapter wins
    assert openai_lora_path("ad", "base", None) is None
    assert openai_lora_path("base:", "base", ["a", None]) == ["a", None]


def test_max_loras_per_batch_queues_the_third_adapter(lora_server, adapters):
    """--max-loras-per-batch 2 and three adapters in one call: the third waits for a slot,
    and all three answer with their own model's logprobs."""
    root, engines = adapters
    r = post(lora_server, "/load_lora_adapter", {"lora_name": "c", "lora_path": str(root / "a")})
    assert r.status_code == 200, r.text
    names = ["a", "b", "c"]
    outs = gen(lora_server, {
        "input_ids": PROMPTS, "lora_path": names, "return_logprob": True,
        "sampling_params": {"max_new_tokens": NEW, "temperature": 1.0, "ignore_eos": True}})
    for prompt, name, out in zip(PROMPTS, names, outs):
        got = [x[0] for x in out["meta_info"]["output_token_logprobs"]]
        want = trainer_logprobs(engines["a" if name == "c" else name], prompt, out["output_ids"])
        assert max(abs(g - w) for g, w in zip(got, want)) < 1e-5, name


def test_lora_path_flag_forms():
    from servers.engine.lora import parse_lora_path_arg
    from servers.server_args import parse_args

    assert parse_lora_path_arg("/p/x") == {"lora_name": "/p/x", "lora_path": "/p/x",
                                           "pinned": False}
    assert parse_lora_path_arg("x=/p/x")["lora_name"] == "x"
    assert parse_lora_path_arg('{"lora_name": "x", "lora_path": "/p", "pinned": true}')["pinned"]
    args = parse_args(["--model-path", "/m", "--lora-paths", "x=/p/x", "y=/p/y"])
    assert args.enable_lora and args.lora_paths == ["x=/p/x", "y=/p/y"]
    assert not parse_args(["--model-path", "/m"]).enable_lora
    with pytest.raises(SystemExit):
        parse_args(["--model-path", "/m", "--max-loras-per-batch", "0"])
