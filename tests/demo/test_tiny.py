import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from arealite.demo.tiny import TinyModelSpec, build_tiny_model


def test_tiny_model_loads_and_generates(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    assert model.config.model_type == "qwen2"
    assert not model.config.tie_word_embeddings
    assert model.config.hidden_size // model.config.num_attention_heads >= 32
    n_params = sum(p.numel() for p in model.parameters())
    assert 1e5 < n_params < 5e6
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 2 + 3?"}], tokenize=False, add_generation_prompt=True
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    ids = tok(prompt, return_tensors="pt").input_ids
    out = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert out.shape[1] > ids.shape[1]
    assert tok.eos_token == "<|im_end|>" and tok.pad_token_id is not None


def test_digits_are_single_tokens(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    ids = tok("#### 1234", add_special_tokens=False).input_ids
    assert [tok.decode([i]) for i in ids][-4:] == ["1", "2", "3", "4"]
    assert tok.decode(ids) == "#### 1234"


def test_build_is_deterministic(tmp_path):
    a = build_tiny_model(tmp_path / "a", TinyModelSpec(seed=3))
    b = build_tiny_model(tmp_path / "b", TinyModelSpec(seed=3))
    ma = AutoModelForCausalLM.from_pretrained(a)
    mb = AutoModelForCausalLM.from_pretrained(b)
    for (na, pa), (nb, pb) in zip(ma.named_parameters(), mb.named_parameters()):
        assert na == nb and torch.equal(pa, pb)
    assert (a / "tokenizer.json").read_text() == (b / "tokenizer.json").read_text()


def test_building_writes_no_progress_bar_and_leaves_bars_as_they_were(tmp_path, capfd):
    from transformers.utils import logging as hf_logging

    before = hf_logging.is_progress_bar_enabled()  # (an FSDP engine in this process turns them off)
    hf_logging.enable_progress_bar()
    try:
        build_tiny_model(tmp_path / "m")
        assert "Writing model shards" not in capfd.readouterr().err
        assert hf_logging.is_progress_bar_enabled()  # a caller's own downloads still show theirs
    finally:
        (hf_logging.enable_progress_bar if before else hf_logging.disable_progress_bar)()
