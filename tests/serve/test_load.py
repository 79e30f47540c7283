"""Bounded load: 64 concurrent clients (openai client, streaming and not, chat and completions)
send requests back to back for 60 s (SLUICE_SERVE_LOAD_SECONDS). Passes with zero errors, every
request answered in full, and a flat resident set: after the warm-up the server's RSS may not grow
by more than 32 MiB (a leak of one KV sequence or a per-request buffer would). Labelled slow: the
release build runs it, the sanitizer build does not.

    python3 test_load.py SLUICE_BINARY SOURCE_DIR
"""

import os
import sys
import threading
import time
import unittest

import serve_util as su

CLIENTS = 64
SECONDS = float(os.environ.get("SLUICE_SERVE_LOAD_SECONDS", "60"))
GROWTH_KIB = 32 * 1024


class Load(unittest.TestCase):
    def test_sixty_four_clients(self):
        s = su.Server("--queue", "128", ctx=512, parallel=8)
        stop = threading.Event()
        errors, counts = [], [0] * CLIENTS
        try:
            def run(i):
                client = su.openai_client(s)
                k = 0
                while not stop.is_set():
                    k += 1
                    try:
                        if (i + k) % 2:
                            text, finish = "", None
                            for c in client.chat.completions.create(
                                    model="x", messages=[{"role": "user", "content": f"Client {i} says hello #{k}."}],
                                    max_tokens=12, temperature=0.7, seed=i * 1000 + k, stream=True):
                                if c.choices:
                                    text += c.choices[0].delta.content or ""
                                    finish = c.choices[0].finish_reason or finish
                            if finish not in ("stop", "length"):
                                errors.append(f"client {i}: finish_reason {finish!r}")
                        else:
                            r = client.completions.create(model="x", prompt=f"Item {k}:", max_tokens=8, temperature=0)
                            if r.choices[0].finish_reason not in ("stop", "length"):
                                errors.append(f"client {i}: finish_reason {r.choices[0].finish_reason!r}")
                        counts[i] += 1
                    except Exception as e:  # noqa: BLE001 - every error fails the test
                        errors.append(f"client {i}: {e!r}")

            threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
            t0 = time.time()
            for t in threads:
                t.start()
            samples = []
            while time.time() - t0 < SECONDS:
                time.sleep(2)
                samples.append((time.time() - t0, s.rss_kib()))
            stop.set()
            for t in threads:
                t.join(timeout=300)
            self.assertEqual(errors, [], f"{len(errors)} errors")
            self.assertTrue(all(c > 0 for c in counts), f"some clients never finished a request: {counts}")
            # Flat RSS: the largest sample of the last two thirds against the first sample after a
            # sixth of the run (pools, buffers and the allocator's arenas have grown by then).
            warm = [kib for t, kib in samples if t >= SECONDS / 6]
            base = warm[0]
            peak = max(warm)
            print(f"requests: {sum(counts)}, RSS after warm-up {base} KiB, peak {peak} KiB", file=sys.stderr)
            self.assertLess(peak - base, GROWTH_KIB, f"RSS grew from {base} to {peak} KiB: {samples}")
            m = s.settled_metrics()
            self.assertEqual(m['sluice_requests_total{outcome="failed"}'], 0)
            self.assertEqual(m["sluice_requests_active"], 0)
            self.assertEqual(m["sluice_kv_blocks_reserved"], 0)
        finally:
            stop.set()
            self.assertEqual(s.stop(), 0)


if __name__ == "__main__":
    sys.exit(su.main())
