"""16 concurrent streaming clients (openai client, greedy) each get exactly the text they get when
alone: batching must not mix sequences up. With a one-sequence model the requests are served one
after another; with the paged multi-sequence KV pool they share passes.

    python3 test_concurrent.py SLUICE_BINARY SOURCE_DIR
"""

import sys
import threading
import unittest

import serve_util as su

CLIENTS = 16
TOKENS = 20
PROMPTS = ["Tell me about the sea.", "What is 2 + 2?", "Name three fruits.", "Write a haiku about snow.",
           "Who wrote Hamlet?", "Describe a cat.", "What is the capital of Italy?", "Give me a tip for sleeping.",
           "Why is the sky blue?", "List some colors.", "How do birds fly?", "What is Python?",
           "Say something kind.", "What is a prime number?", "Describe autumn.", "How are you today?"]


def stream_text(client, prompt):
    text, finish = "", None
    for c in client.chat.completions.create(model="x", messages=[{"role": "user", "content": prompt}],
                                            max_tokens=TOKENS, temperature=0, stream=True):
        if c.choices:
            text += c.choices[0].delta.content or ""
            finish = c.choices[0].finish_reason or finish
    return text, finish


class Concurrent(unittest.TestCase):
    def test_sixteen_streams_match_their_solo_runs(self):
        s = su.Server(ctx=512, parallel=CLIENTS)
        try:
            client = su.openai_client(s)
            alone = [stream_text(client, p) for p in PROMPTS]
            results = [None] * CLIENTS
            errors = []
            barrier = threading.Barrier(CLIENTS)

            def run(i):
                try:
                    c = su.openai_client(s)
                    barrier.wait()
                    results[i] = stream_text(c, PROMPTS[i])
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(f"client {i}: {e!r}")

            threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            self.assertEqual(errors, [])
            for i in range(CLIENTS):
                self.assertEqual(results[i], alone[i], f"client {i} ({PROMPTS[i]!r})")
            m = s.metrics()
            self.assertEqual(m['sluice_requests_total{outcome="failed"}'], 0)
            self.assertEqual(m["sluice_kv_blocks_reserved"], 0)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    sys.exit(su.main())
