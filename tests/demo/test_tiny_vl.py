import torch
from PIL import Image
from transformers import AutoConfig, AutoModelForImageTextToText

from arealite.demo.tiny_tokenizer import IMAGE_PAD
from arealite.engine.vision_processor import load_processor


def test_tiny_vl_model_is_qwen2_vl_with_local_processor(tiny_vl_model_dir):
    cfg = AutoConfig.from_pretrained(tiny_vl_model_dir)
    assert cfg.model_type == "qwen2_vl"
    text = cfg.get_text_config()
    assert text.hidden_size // text.num_attention_heads >= 32
    assert not cfg.tie_word_embeddings
    proc = load_processor(tiny_vl_model_dir)
    tok = proc.tokenizer
    assert tok.convert_tokens_to_ids(IMAGE_PAD) == cfg.image_token_id
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "How many?"}]}]
    prompt = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert prompt.endswith("<|im_start|>assistant\n") and IMAGE_PAD in prompt
    img = Image.new("RGB", (64, 64), (255, 0, 0))
    enc = proc(text=[prompt], images=[img], return_tensors="pt")
    # 64x64 pixels -> 8x8 patches of 8 -> 16 image tokens after the 2x2 merge
    assert enc["image_grid_thw"].tolist() == [[1, 8, 8]]
    assert int((enc["input_ids"] == cfg.image_token_id).sum()) == 16
    model = AutoModelForImageTextToText.from_pretrained(tiny_vl_model_dir)
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape == (1, enc["input_ids"].shape[1], len(tok))
    # the image reaches the logits: another image changes the last position's distribution
    enc2 = proc(text=[prompt], images=[Image.new("RGB", (64, 64), (0, 0, 255))], return_tensors="pt")
    with torch.no_grad():
        other = model(**enc2).logits
    assert not torch.allclose(logits[0, -1], other[0, -1])
