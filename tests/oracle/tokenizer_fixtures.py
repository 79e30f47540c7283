#!/usr/bin/env python3
"""Builds the expected token ids for tests/unit/tokenizer_bpe_test.cpp.

Reads the vocabulary, token types and merges of a GGUF file with the `gguf` package, builds a
Hugging Face `tokenizers` BPE tokenizer from them with the pre-tokenizer the model family
publishes in its tokenizer.json (for SmolLM2: individual digits, then GPT-2 byte-level split),
encodes the corpus below and writes JSON: corpus + expected ids, with special-token parsing on
(HF default) and off (encode_special_tokens = True).

Usage: python3 tests/oracle/tokenizer_fixtures.py MODEL.gguf OUT.json
"""
import json
import sys

import gguf
import tokenizers
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

CONTROL, USER_DEFINED = 3, 4

CORPUS = [
    "",
    " ",
    "Hello world",
    "Hello, world! How are you today?",
    " leading space and trailing space ",
    "I'm sure you're right; they'll see we've done what she'd said. It's DON'T and I'LL.",
    "rock'n'roll 'quoted' ''double'' '",
    "The year 2024 has 365 days; pi = 3.14159265; 1,000,000 and 0x1F; 12345678901234567890.",
    "   multiple   spaces    between\twords\t\ttabs",
    "line one\nline two\n\nline four\r\nwindows\r\n\r\n",
    "\n\n\n\n",
    "\t\t\t",
    "trailing newline\n",
    "    indented code\n        more indented\n",
    "def fib(n: int) -> int:\n    if n < 2:\n        return n\n    return fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // dot product",
    "#include <vector>\nint main() { std::vector<int> v{1, 2, 3}; return v.size() != 3; }\n",
    "{\"key\": [1, 2.5, null, true], \"nested\": {\"a\": \"b\"}}",
    "SELECT name, COUNT(*) FROM users WHERE age >= 18 GROUP BY name;",
    "https://example.com/path?query=value&x=1#frag user@example.org",
    "Café, naïve, résumé, über, São Paulo, Ångström, façade, coöperate, Zürich",
    "e\u0301 (decomposed e + combining acute) vs \u00e9",
    "你好，世界！今天天气很好。我们去公园散步吧。",
    "日本語のテキスト：東京は日本の首都です。カタカナとひらがな。",
    "مرحبا بالعالم! كيف حالك اليوم؟",
    "Привет, мир! Как дела? Ёжик в тумане.",
    "안녕하세요 세계! 한국어 텍스트입니다.",
    "שלום עולם",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Ελληνικά: Γειά σου Κόσμε",
    "emoji: 😀 😃 🎉 👍🏽 ❤️ 🇯🇵 🇺🇸",
    "family ZWJ: 👨‍👩‍👧‍👦 and 👩🏽‍💻 and 🏳️‍🌈",
    "mixed😀text🎉without✨spaces",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|>",
    "text before<|endoftext|>text after",
    "<|im_start|><|im_end|><|im_start|>",
    "<|im_start partial <|im_end| not special |>",
    "<repo_name>sluice<file_sep>main.cpp",
    "   <|im_start|>   spaced   <|im_end|>   ",
    "unicode spaces:\u00a0nbsp\u3000ideographic\u2009thin\u2028line\u0085nel\u000bvt\u000cff end",
    "zero\u200bwidth\u200djoiner\ufeffbom",
    "math: ∑ᵢ xᵢ² ≤ ∞, α+β=γ, ½ ¾ ⅓, ①②③, Ⅻ",
    "fullwidth：ＡＢＣ１２３",
    "a" * 300,
    "ab " * 100,
    " " * 37 + "x",
    "!!!???...,,,;;;:::---___***",
    "$100 + €50 = £120? ¥1000 ₹500",
    "CamelCaseIdentifier snake_case_identifier kebab-case-identifier SCREAMING_CASE",
    "MiXeD cAsE wOrDs AND ALL CAPS",
    "The quick brown fox jumps over the lazy dog. " * 5,
]


def build(path):
    reader = gguf.GGUFReader(path)

    def field(key):
        return reader.fields[key]

    def strings(key):
        f = field(key)
        return [bytes(f.parts[i]).decode("utf-8") for i in f.data]

    tokens = strings("tokenizer.ggml.tokens")
    merges = strings("tokenizer.ggml.merges")
    types_field = field("tokenizer.ggml.token_type")
    types = [int(types_field.parts[i][0]) for i in types_field.data]
    pre = bytes(field("tokenizer.ggml.pre").parts[-1]).decode()
    assert pre == "smollm", f"this oracle encodes the smollm pre-tokenizer, file says {pre!r}"

    vocab = {t: i for i, t in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=pairs, ignore_merges=False))
    # SmolLM2's tokenizer.json: Sequence[Digits(individual), ByteLevel(regex, no prefix space)].
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    added = [AddedToken(t, special=(ty == CONTROL), normalized=False)
             for t, ty in zip(tokens, types) if ty in (CONTROL, USER_DEFINED)]
    tok.add_tokens(added)
    return tok


def main():
    model, out = sys.argv[1], sys.argv[2]
    tok = build(model)
    cases = []
    for text in CORPUS:
        tok.encode_special_tokens = False
        ids = tok.encode(text, add_special_tokens=False).ids
        tok.encode_special_tokens = True
        ids_plain = tok.encode(text, add_special_tokens=False).ids
        cases.append({"text": text, "ids": ids, "ids_no_special": ids_plain})
    doc = {
        "model": model.split("/")[-1],
        "generator": "tests/oracle/tokenizer_fixtures.py (Hugging Face tokenizers "
                     + tokenizers.__version__ + ")",
        "cases": cases,
    }
    with open(out, "w", encoding="utf-8") as f:
        json.dump(doc, f, ensure_ascii=False, indent=1)
        f.write("\n")
    print(f"wrote {len(cases)} cases to {out}")


if __name__ == "__main__":
    main()
