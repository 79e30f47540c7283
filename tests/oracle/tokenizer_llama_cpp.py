#!/usr/bin/env python3
"""Tokenizes the corpus of a tokenizer fixture with llama.cpp's llama-tokenize and reports where
llama.cpp disagrees with the fixture's Hugging Face ids.

Writes JSON next to the fixture: per case the llama.cpp ids (special parsing on and off), and a
list of disagreements. Exit status 0 even when they disagree: this is a report, the C++ tests
check sluice against Hugging Face.

Usage: python3 tests/oracle/tokenizer_llama_cpp.py LLAMA_TOKENIZE MODEL.gguf FIXTURE.json OUT.json [--corpus-only]
  --corpus-only: FIXTURE.json provides only the texts (another model's fixture, e.g. SmolLM2's
  corpus for Gemma 3): no comparison with its ids.
"""
import json
import os
import subprocess
import sys
import tempfile


def llama_ids(binary, model, text, parse_special):
    with tempfile.NamedTemporaryFile("wb", suffix=".txt", delete=False) as f:
        f.write(text.encode("utf-8"))
        path = f.name
    try:
        cmd = [binary, "-m", model, "-f", path, "--ids", "--log-disable", "--no-escape", "--no-bos"]
        if not parse_special:  # llama-tokenize parses special tokens by default
            cmd.append("--no-parse-special")
        out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode()
    finally:
        os.unlink(path)
    line = [l for l in out.splitlines() if l.startswith("[")][-1]
    return json.loads(line)


def main():
    binary, model, fixture, out = sys.argv[1:5]
    corpus_only = "--corpus-only" in sys.argv[5:]
    doc = json.load(open(fixture, encoding="utf-8"))
    cases, diffs = [], []
    for i, c in enumerate(doc["cases"]):
        text = c["text"]
        if text == "":  # llama-tokenize refuses an empty prompt; nothing to compare
            continue
        ids = llama_ids(binary, model, text, True)
        plain = llama_ids(binary, model, text, False)
        cases.append({"text": text, "ids": ids, "ids_no_special": plain})
        for key, got in (() if corpus_only else (("ids", ids), ("ids_no_special", plain))):
            if got != c[key]:
                diffs.append({"case": i, "text": text, "mode": key, "hf": c[key], "llama_cpp": got})
    json.dump({"model": os.path.basename(model), "generator": "tests/oracle/tokenizer_llama_cpp.py",
               "cases": cases, **({"corpus_of": os.path.basename(fixture)} if corpus_only else {"disagreements_with_hf": diffs})},
              open(out, "w", encoding="utf-8"), ensure_ascii=False, indent=1)
    print(f"{len(cases)} cases" + ("" if corpus_only else f", {len(diffs)} disagreements with Hugging Face"))
    for d in diffs:
        print(f"  case {d['case']} ({d['mode']}): {d['text'][:60]!r}\n    hf:    {d['hf']}\n    llama: {d['llama_cpp']}")


if __name__ == "__main__":
    main()
