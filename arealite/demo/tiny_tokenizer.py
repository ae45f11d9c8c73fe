"""The tiny models' byte-level BPE tokenizer, trained locally with ``tokenizers`` on text from
the toy tasks (digits split one per token, so arithmetic is learnable), with Qwen-style special
tokens (and Qwen2-VL's vision tokens for a vision model) and a chat template; it saves as an HF
directory ``AutoTokenizer`` loads. Deterministic for a given seed. Shared by the text models
(``arealite.demo.tiny``) and the vision-language model (``arealite.demo.tiny_vl``).
"""

from __future__ import annotations

from pathlib import Path

from arealite.demo.tiny_spec import TinyModelSpec

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
# Qwen2-VL's vision tokens: an image is <|vision_start|> <|image_pad|> x N <|vision_end|>
VISION_START, VISION_END = "<|vision_start|>", "<|vision_end|>"
IMAGE_PAD, VIDEO_PAD = "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = [VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD]

# Qwen2.5-style template; ``add_generation_prompt`` opens the assistant turn. Plain chats render
# exactly as Qwen2's; with ``tools`` the system turn lists them (name and parameter names only,
# to keep tiny-model prompts short), an assistant's ``tool_calls`` render as Hermes
# ``<tool_call>\n{"name": ..., "arguments": ...}\n</tool_call>`` blocks and ``tool`` results
# come back as a user turn of ``<tool_response>`` blocks, as Qwen2.5's template does.
CHAT_TEMPLATE = (
    "{% if tools %}"
    "{{ '<|im_start|>system\n' }}"
    "{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] + '\n\n' }}{% endif %}"
    "{{ '# Tools\n<tools>' }}"
    "{% for tool in tools %}{% set f = tool['function'] if tool['function'] is defined else tool %}"
    "{{ '\n' + f['name'] + '(' }}"
    "{% if f['parameters'] is defined and f['parameters']['properties'] is defined %}"
    "{{ f['parameters']['properties'] | list | join(', ') }}{% endif %}{{ ')' }}"
    "{% endfor %}"
    "{{ '\n</tools><|im_end|>\n' }}"
    "{% endif %}"
    "{% for message in messages %}"
    "{% if tools and loop.first and message['role'] == 'system' %}"
    "{% elif message['role'] == 'tool' %}"
    "{% if loop.first or messages[loop.index0 - 1]['role'] != 'tool' %}"
    "{{ '<|im_start|>user' }}{% endif %}"
    "{{ '\n<tool_response>\n' + message['content'] + '\n</tool_response>' }}"
    "{% if loop.last or messages[loop.index0 + 1]['role'] != 'tool' %}"
    "{{ '<|im_end|>\n' }}{% endif %}"
    "{% elif message['role'] == 'assistant' and message['tool_calls'] %}"
    "{{ '<|im_start|>assistant' }}"
    "{% if message['content'] %}{{ '\n' + message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    "{{ '\n<tool_call>\n{\"name\": \"' + f['name'] + '\", \"arguments\": ' }}"
    "{{ f['arguments'] | tojson }}{{ '}\n</tool_call>' }}"
    "{% endfor %}"
    "{{ '<|im_end|>\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + (message['content'] or '') + '<|im_end|>' + '\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)



def _tokenizer_corpus(seed: int, corpus: str = "toy_math", vision: bool = False) -> list[str]:
    from arealite.demo.toy_math import generate_toy_math

    if corpus not in ("toy_math", "toy_tools"):
        raise ValueError(f"unknown tokenizer corpus {corpus!r}: toy_math or toy_tools")

    rows = generate_toy_math(n=3000, seed=seed)
    texts = []
    for r in rows:
        texts.append(f"{IM_START}user\n{r['question']}{IM_END}\n{IM_START}assistant\n")
        texts.append(r["answer"])
    texts.append("The capital of France is Paris. Answer again: wrong, try once more.")
    if corpus == "toy_tools":
        from arealite.demo.toy_tools import corpus_texts

        texts += corpus_texts(seed=seed)
    if vision:
        from arealite.demo.toy_vision import corpus_texts as vision_texts

        texts += vision_texts()
    return texts


def build_tokenizer(out_dir: str | Path, spec: TinyModelSpec | None = None):
    """Train and save the tokenizer; returns a ``PreTrainedTokenizerFast``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = spec or TinyModelSpec()
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=SPECIAL_TOKENS + (VISION_TOKENS if spec.vision else []),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_tokenizer_corpus(spec.seed, spec.corpus, spec.vision), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        bos_token=None,
        unk_token=None,
        additional_special_tokens=[IM_START] + (VISION_TOKENS if spec.vision else []),
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out_dir))
    return fast
