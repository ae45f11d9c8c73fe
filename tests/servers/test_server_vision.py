"""The embedded server on a vision-language model: ``image_data`` on ``/generate`` as SGLang
takes it (path, file URL, base64), logprobs equal to a transformers forward with the images,
400s that name a bad image without hurting other requests, weight updates of the vision tower."""

from __future__ import annotations

import base64
import concurrent.futures as cf
import json

import pytest
import torch

from tests.support.http_calls import gen, post

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def vl_server(tiny_vl_model_dir):
    from tests.support.procs import embedded_server

    with embedded_server(str(tiny_vl_model_dir), ["--random-seed", "0"]) as addr:
        yield f"http://{addr}"


@pytest.fixture(scope="module")
def processor(tiny_vl_model_dir):
    from arealite.engine.vision_processor import load_processor

    return load_processor(tiny_vl_model_dir)


@pytest.fixture(scope="module")
def rows(toy_vision_dir):
    return [json.loads(x) for x in (toy_vision_dir / "valid.jsonl").read_text().splitlines()]


def _prompt(processor, row, expand: bool):
    """Token ids of the chat prompt: collapsed (one <|image_pad|>) or expanded by the processor."""
    from PIL import Image

    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row["question"]}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    if not expand:
        return processor.tokenizer(text).input_ids, None
    enc = processor(text=[text], images=[Image.open(row["images"][0])], return_tensors="pt")
    return enc["input_ids"][0].tolist(), enc


def _b64(path: str) -> str:
    with open(path, "rb") as f:
        return base64.b64encode(f.read()).decode()


GREEDY = {"max_new_tokens": 6, "temperature": 0.0}


def test_image_forms_and_placeholder_forms_agree(vl_server, processor, rows):
    row = rows[0]
    collapsed, _ = _prompt(processor, row, expand=False)
    expanded, _ = _prompt(processor, row, expand=True)
    path = row["images"][0]
    outs = [
        gen(vl_server, {"input_ids": ids, "image_data": img, "sampling_params": GREEDY,
                        "return_logprob": True, "return_prompt_token_ids": True})
        for ids in (collapsed, expanded)
        for img in (path, f"file://{path}", _b64(path), f"data:image/png;base64,{_b64(path)}")
    ]
    # a text prompt whose chat template wrote one placeholder per image
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": row["question"]}]}]
    text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    outs.append(gen(vl_server, {"text": text, "image_data": path, "sampling_params": GREEDY}))
    assert all(o["output_ids"] == outs[0]["output_ids"] for o in outs)
    # the server expands the collapsed placeholder as the processor does
    assert all(o["meta_info"]["prompt_tokens"] == len(expanded) for o in outs)
    assert len(outs) == 9
    # and the image matters: another image, another greedy answer distribution
    other = gen(vl_server, {"input_ids": expanded, "image_data": rows[1]["images"][0],
                            "sampling_params": GREEDY, "return_logprob": True})
    lp = [x[0] for x in outs[0]["meta_info"]["output_token_logprobs"]]
    lp2 = [x[0] for x in other["meta_info"]["output_token_logprobs"]]
    assert lp != lp2


def test_logprobs_equal_a_transformers_forward_with_the_image(vl_server, processor, rows,
                                                              tiny_vl_model_dir):
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_model_dir)).eval()
    image_id = model.config.image_token_id
    for row in rows[:3]:
        ids, enc = _prompt(processor, row, expand=True)
        out = gen(vl_server, {"input_ids": ids, "image_data": row["images"][0],
                              "sampling_params": {"max_new_tokens": 8, "temperature": 1.0},
                              "return_logprob": True})
        toks = [t for _, t, _ in out["meta_info"]["output_token_logprobs"]]
        got = torch.tensor([x for x, _, _ in out["meta_info"]["output_token_logprobs"]])
        full = torch.tensor([ids + toks])
        with torch.no_grad():
            logits = model(input_ids=full, pixel_values=enc["pixel_values"],
                           image_grid_thw=enc["image_grid_thw"],
                           mm_token_type_ids=(full == image_id).int()).logits[0].float()
        want = torch.log_softmax(logits, -1)[len(ids) - 1:-1].gather(
            1, torch.tensor(toks)[:, None]).view(-1)
        assert (got - want).abs().max().item() < 1e-5


def test_bad_images_get_a_400_naming_them_and_nothing_else_fails(vl_server, processor, rows,
                                                                 tmp_path):
    from PIL import Image

    ids, _ = _prompt(processor, rows[0], expand=False)
    big = tmp_path / "big.png"
    Image.new("RGB", (5000, 4000)).save(big)
    bad = {
        "not base64 !!": "not a file path, file:// URL, data URL or valid base64",
        base64.b64encode(b"definitely not an image").decode(): "cannot decode the image",
        str(tmp_path / "missing.png"): "no image file",
        str(big): "over the",
        "http://example.com/cat.png": "remote URLs are not fetched",
    }
    good_body = {"input_ids": ids, "image_data": rows[0]["images"][0],
                 "sampling_params": {"max_new_tokens": 24, "temperature": 1.0, "ignore_eos": True}}
    with cf.ThreadPoolExecutor(8) as pool:
        good = [pool.submit(post, vl_server, "/generate", good_body) for _ in range(3)]
        bads = {k: pool.submit(post, vl_server, "/generate",
                               {"input_ids": ids, "image_data": k, "sampling_params": GREEDY})
                for k in bad}
        # a batch with one bad image fails as a whole (as SGLang's validation does), by name
        batch = pool.submit(post, vl_server, "/generate", {
            "input_ids": [ids, ids], "image_data": [rows[0]["images"][0], "%%%"],
            "sampling_params": GREEDY})
        for k, fut in bads.items():
            r = fut.result()
            assert r.status_code == 400, (k, r.text)
            msg = r.json()["error"]["message"]
            assert "image_data[0][0]" in msg and bad[k] in msg, msg
        r = batch.result()
        assert r.status_code == 400 and "image_data[1][0]" in r.json()["error"]["message"]
        for fut in good:
            r = fut.result()
            assert r.status_code == 200 and len(r.json()["output_ids"]) == 24
    # placeholders and images must agree in number
    r = post(vl_server, "/generate", {"input_ids": ids, "sampling_params": GREEDY})
    assert r.status_code == 400 and "no image_data" in r.json()["error"]["message"]
    r = post(vl_server, "/generate", {"input_ids": ids, "sampling_params": GREEDY,
                                      "image_data": [rows[0]["images"][0]] * 2})
    assert r.status_code == 400 and "image_data has 2" in r.json()["error"]["message"]


def test_model_info_says_it_understands_images(vl_server):
    import requests

    info = requests.get(f"{vl_server}/model_info", timeout=30).json()
    assert info["has_image_understanding"] is True and info["model_type"] == "qwen2_vl"


def test_batch_mixes_text_and_image_prompts(vl_server, processor, rows):
    ids, _ = _prompt(processor, rows[0], expand=True)
    text_ids = processor.tokenizer("How many shapes?").input_ids
    both = gen(vl_server, {"input_ids": [text_ids, ids], "image_data": [None, rows[0]["images"][0]],
                           "sampling_params": GREEDY})
    alone = gen(vl_server, {"input_ids": ids, "image_data": rows[0]["images"][0],
                            "sampling_params": GREEDY})
    text_alone = gen(vl_server, {"input_ids": text_ids, "sampling_params": GREEDY})
    assert both[1]["output_ids"] == alone["output_ids"]
    assert both[0]["output_ids"] == text_alone["output_ids"]


def test_disk_update_covers_the_vision_tower(vl_server, processor, rows, tiny_vl_model_dir,
                                             tmp_path):
    from transformers import AutoModelForImageTextToText

    name = "model.visual.blocks.0.attn.qkv.weight"
    before = post(vl_server, "/get_weights_by_name", {"name": name, "truncate_size": 2}).json()
    ids, _ = _prompt(processor, rows[0], expand=True)
    body = {"input_ids": ids, "image_data": rows[0]["images"][0], "sampling_params": GREEDY,
            "return_logprob": True}
    lp0 = [x[0] for x in gen(vl_server, body)["meta_info"]["output_token_logprobs"]]
    model = AutoModelForImageTextToText.from_pretrained(str(tiny_vl_model_dir))
    with torch.no_grad():
        for p in model.model.visual.parameters():
            p.add_(0.05 * torch.randn_like(p))
    new_dir = tmp_path / "vl_v1"
    model.save_pretrained(str(new_dir))
    r = post(vl_server, "/update_weights_from_disk", {"model_path": str(new_dir), "weight_version": "1"})
    assert r.status_code == 200 and r.json()["success"], r.text
    after = post(vl_server, "/get_weights_by_name", {"name": name, "truncate_size": 2}).json()
    want = model.model.visual.blocks[0].attn.qkv.weight[:2].tolist()
    assert after != before and torch.allclose(torch.tensor(after), torch.tensor(want))
    out = gen(vl_server, body)
    assert out["meta_info"]["weight_version"] == "1"
    assert [x[0] for x in out["meta_info"]["output_token_logprobs"]] != lp0
