#!/usr/bin/env python3
"""A multi-turn chat against OpenAI-compatible servers, turn by turn side by side: the prompt
tokens of each turn (the whole history), how many of them the server took from its prompt cache
(usage.prompt_tokens_details.cached_tokens, where it reports them), and the time to the first
token of the reply (TTFT, the prefill a user waits for). Each server is started from its command,
asked the same conversation (fixed user messages, greedy, a fixed number of tokens per reply:
the replies, and so the histories, are the same where the servers compute the same), and stopped.
Standard library only (and serve_bench.py from the same folder).

  chat_bench.py --port 8080 --turns 8 --tokens 64 \\
      --server "sluice serve -m model.gguf --port 8080 -c 4096" \\
      --server "sluice serve -m model.gguf --port 8080 -c 4096 --no-prompt-cache"
"""

import argparse
import http.client
import json
import shlex
import signal
import statistics
import subprocess
import sys
import time

from serve_bench import sse_events, wait_ready  # same folder

MESSAGES = [
    "Tell me about the history of lighthouses in a few sentences.",
    "Who kept them running, and what was a keeper's day like?",
    "What changed when they were automated?",
    "Name three famous lighthouses and where they are.",
    "Which of those is the oldest?",
    "How does a Fresnel lens work?",
    "Why are lighthouses painted in different patterns?",
    "Summarize our conversation in two sentences.",
]


# A system message of --system-words words is this sentence repeated (a long shared prefix, as
# an application's instructions are).
SYSTEM = "You are a careful assistant who answers questions about the sea, ships and the coast. "


def turn(port, messages, tokens, timeout):
    """One streamed reply: (text, TTFT s, total s, prompt tokens, cached tokens or None)."""
    body = {"messages": messages, "max_tokens": tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.perf_counter()
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        sys.exit(f"chat_bench: HTTP {r.status}: {r.read()[:300]!r}")
    text, first, usage = "", None, {}
    for j in sse_events(r):
        if "error" in j:
            sys.exit(f"chat_bench: error event: {j['error']}")
        usage = j.get("usage") or usage
        for c in j.get("choices", []):
            piece = (c.get("delta") or {}).get("content") or ""
            if piece and first is None:
                first = time.perf_counter() - t0
            text += piece
    conn.close()
    details = usage.get("prompt_tokens_details") or {}
    return text, first or 0.0, time.perf_counter() - t0, usage.get("prompt_tokens", 0), details.get("cached_tokens")


def conversation(args, command):
    proc = subprocess.Popen(shlex.split(command), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    try:
        wait_ready("127.0.0.1", args.port, args.ready_timeout, proc)
        history = []
        if args.system_words > 0:
            words = (SYSTEM * (args.system_words // len(SYSTEM.split()) + 1)).split()[:args.system_words]
            history.append({"role": "system", "content": " ".join(words)})
        for i in range(args.turns):
            history.append({"role": "user", "content": MESSAGES[i % len(MESSAGES)]})
            text, ttft, total, prompt, cached = turn(args.port, history, args.tokens, args.timeout)
            history.append({"role": "assistant", "content": text})
            rows.append({"prompt": prompt, "cached": cached, "ttft": ttft, "total": total, "text": text})
            print(f"  turn {i + 1}: {prompt} prompt tokens, cached {cached}, TTFT {ttft:.3f} s", file=sys.stderr)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", action="append", required=True, help="command starting a server on --port (repeat)")
    ap.add_argument("--port", type=int, default=8080)
    ap.add_argument("--turns", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=64, help="tokens per reply")
    ap.add_argument("--system-words", type=int, default=0, help="a system message of this many words first")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--ready-timeout", type=float, default=900)
    args = ap.parse_args()
    runs = []
    for command in args.server:
        print(f"server: {command}", file=sys.stderr)
        runs.append(conversation(args, command))
    print(f"\n{args.turns} turns, {args.tokens} greedy tokens a reply; per server: cached prompt tokens / TTFT s")
    for i, command in enumerate(args.server):
        print(f"  [{i}] {command}")
    head = f"{'turn':>4} | {'prompt tokens':>13} | " + " | ".join(f"{f'[{i}] cached / TTFT':>20}" for i in range(len(runs)))
    print(head)
    print("-" * len(head))
    for t in range(args.turns):
        cells = []
        for rows in runs:
            r = rows[t]
            cached = "-" if r["cached"] is None else str(r["cached"])
            cells.append(f"{cached + ' / ' + format(r['ttft'], '.3f'):>20}")
        print(f"{t + 1:>4} | {runs[0][t]['prompt']:>13} | " + " | ".join(cells))
    print(f"{'median TTFT':>22} | " + " | ".join(f"{statistics.median(r['ttft'] for r in rows):>20.3f}" for rows in runs))
    same = all(runs[0][t]["text"] == rows[t]["text"] for rows in runs[1:] for t in range(args.turns))
    print(f"\nreplies identical across servers: {'yes' if same else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
