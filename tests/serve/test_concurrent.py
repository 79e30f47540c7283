"""16 concurrent streaming clients (openai client, greedy) each get exactly the text they get when
alone: batching must not mix sequences up. With a one-sequence model the requests are served one
after another; with the paged multi-sequence KV pool they share passes. And a prompt longer than
one step's 512 tokens, prefilled in chunks beside decoding requests, continues as `sluice run`.

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

    def test_long_prompt_prefilled_in_chunks_beside_decoding_requests(self):
        # ~700 tokens: more than one 512-token step, so the prompt is prefilled in chunks while two
        # short requests decode in the same passes; its greedy continuation equals `sluice run`'s.
        words = "the cat sat on a mat while dogs ran around the big red house near the river".split()
        prompt = " ".join(words[(i * 7) % len(words)] for i in range(680)) + ". In summary,"
        want = su.sluice_run(prompt, 12, chat=False, ctx=1024)
        s = su.Server(ctx=1024, parallel=4)
        try:
            out, errors = {}, []

            def go(key, p, n):
                try:
                    out[key] = su.openai_client(s).completions.create(model="x", prompt=p, max_tokens=n,
                                                                      temperature=0).choices[0].text
                except Exception as e:  # noqa: BLE001 - reported below
                    errors.append(repr(e))

            threads = [threading.Thread(target=go, args=(f"short{i}", "Once upon a time", 40)) for i in range(2)]
            threads.append(threading.Thread(target=go, args=("long", prompt, 12)))
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=600)
            self.assertEqual(errors, [])
            self.assertEqual(out["long"], want)
            self.assertEqual(out["short0"], out["short1"])
            m = s.metrics()
            self.assertGreater(m["sluice_prompt_tokens_total"], 680)
        finally:
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    sys.exit(su.main())
