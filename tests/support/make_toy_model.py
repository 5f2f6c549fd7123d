"""Make the engine tests' model in DIR: a byte-level BPE tokenizer trained here and a
random-weight Llama, both from a fixed seed, nothing from a hub.

Runs with the engine environment's Python (it needs `tokenizers`, `transformers` and `torch`,
which the project's own environment does not carry): `python make_toy_model.py DIR`.
"""

from __future__ import annotations

import json
import os
import random
import sys

SEED = 1234
VOCAB_SIZE = 1500
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
# The hermes tool-call parser looks these up in the vocabulary; they stay ordinary text.
TOOL_TOKENS = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"]

# ChatML with hermes-style tool calls: tools listed in the system turn, an assistant's calls as
# <tool_call>{json}</tool_call>, a tool's result as a user turn in <tool_response>.
CHAT_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n"
    "{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n<tools>"
    "{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n\n</tools>\n"
    'Call a tool as <tool_call>\n{"name": <name>, "arguments": <args>}\n</tool_call>'
    "<|im_end|>\n"
    "{%- elif messages[0].role == 'system' %}"
    "<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' and loop.first %}"
    "{%- elif message.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>\n{{ message.content }}\n</tool_response><|im_end|>\n"
    "{%- elif message.role == 'assistant' %}<|im_start|>assistant\n"
    "{% if message.content %}{{ message.content }}{% endif %}"
    "{% for call in message.tool_calls or [] %}<tool_call>\n"
    '{"name": "{{ call.function.name }}", "arguments": '
    "{% if call.function.arguments is string %}{{ call.function.arguments }}"
    "{% else %}{{ call.function.arguments | tojson }}{% endif %}}\n</tool_call>"
    "{% endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ message.role }}\n{{ message.content }}<|im_end|>\n"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

WORD_LINES = (
    "the a an of to in and is it that for on with as was at by be this from or have not are",
    "weather city paris oslo lima tokyo rain sun wind cold warm today tomorrow temperature",
    "search find read write file open close run test agent tool call result answer question",
    "user assistant system please thanks hello yes no number list value name arguments",
    "function return error done step next first last one two three four five",
)
WORDS = [word for line in WORD_LINES for word in line.split()]


def corpus(rng: random.Random) -> list[str]:
    """Sentences, JSON tool calls and chat turns: enough for merges over what the tests send."""
    lines = []
    letters = "etaoinshrdlcumwfgypbvkjxqz"
    words_here = WORDS + [
        "".join(rng.choice(letters[: rng.randint(8, 26)]) for _ in range(rng.randint(2, 9)))
        for _ in range(1500)
    ]
    for _ in range(6000):
        words = [rng.choice(words_here) for _ in range(rng.randint(3, 14))]
        lines.append(" ".join(words).capitalize() + rng.choice([".", "?", "!", ":"]))
    for _ in range(800):
        args = {rng.choice(WORDS): rng.choice([rng.choice(WORDS), rng.randint(0, 999)])}
        call = {"name": rng.choice(WORDS), "arguments": args}
        lines.append(f"<tool_call>\n{json.dumps(call)}\n</tool_call>")
        lines.append(f"<tool_response>\n{json.dumps(args)}\n</tool_response>")
    return lines


def make_tokenizer(out: str, rng: random.Random):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(rng), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|endoftext|>",
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        unk_token=None,
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(TOOL_TOKENS)
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = 2048
    fast.save_pretrained(out)
    return fast


def make_model(out: str, tokenizer) -> None:
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    model = LlamaForCausalLM(config).to(torch.float32)
    model.save_pretrained(out, safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=eos, pad_token_id=config.pad_token_id
    ).save_pretrained(out)


def main(out: str) -> None:
    os.makedirs(out, exist_ok=True)
    rng = random.Random(SEED)
    tokenizer = make_tokenizer(out, rng)
    make_model(out, tokenizer)
    print(json.dumps({"model_dir": out, "vocab_size": len(tokenizer)}))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: make_toy_model.py DIR")
    main(sys.argv[1])
