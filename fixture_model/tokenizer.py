"""A byte-level BPE tokenizer trained on the text shipped with the project."""

from __future__ import annotations

from importlib import resources

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS = "<s>"
EOS = "</s>"
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>", "<|end|>")
SPECIAL_TOKENS = (BOS, EOS, *ROLE_TOKENS)

# A Llama-3-like template: each message is framed by role tokens; the generation prompt opens
# an assistant turn. transformers and vLLM read it from chat_template.jinja.
CHAT_TEMPLATE = (
    "{{- bos_token }}"
    "{%- for message in messages %}"
    "{{- '<|' + message['role'] + '|>\\n' + message['content'] | trim + '<|end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|assistant|>\\n' }}{%- endif %}"
)


def corpus_lines() -> list[str]:
    text = resources.files("fixture_model").joinpath("corpus.txt").read_text("utf-8")
    return [line for line in text.splitlines(keepends=True) if line.strip()]


def train(vocab_size: int) -> Tokenizer:
    """Train the tokenizer; the same corpus and library version give the same vocabulary."""
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    bos_id = tokenizer.token_to_id(BOS)
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    return tokenizer
