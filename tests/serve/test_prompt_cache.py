"""The prompt cache through the openai client: a chat's next turn starts from the KV rows of the
turn before (usage.prompt_tokens_details.cached_tokens, the metrics), and its greedy reply is the
one a server without the cache gives (CPU: the same bits); `cache_prompt: false` opts a request out.

    python3 test_prompt_cache.py SLUICE_BINARY SOURCE_DIR
"""

import sys
import unittest

import serve_util as su

FIRST = "Write two sentences about a lighthouse keeper who lives alone on a rocky island."
SECOND = "Now give him a name and a dog."


def conversation(client, cache=True):
    """Two turns; returns (turn-1 response, turn-2 response)."""
    extra = {} if cache else {"cache_prompt": False}
    msgs = [{"role": "user", "content": FIRST}]
    r1 = client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0, extra_body=extra)
    msgs += [{"role": "assistant", "content": r1.choices[0].message.content}, {"role": "user", "content": SECOND}]
    r2 = client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0, extra_body=extra)
    return r1, r2


def conversation_free(client, msgs):
    """The greedy reply with the prompt cache skipped (cache_prompt: false)."""
    r = client.chat.completions.create(model="x", messages=msgs, max_tokens=8, temperature=0,
                                       extra_body={"cache_prompt": False})
    return r.choices[0].message.content


def cached(r):
    d = r.usage.prompt_tokens_details
    return d.cached_tokens if d is not None else None


class PromptCache(unittest.TestCase):
    def test_next_turn_reuses_the_previous_prompt(self):
        s = su.Server(ctx=1024, parallel=4)
        try:
            client = su.openai_client(s)
            before = s.metrics()
            r1, r2 = conversation(client)
            self.assertEqual(cached(r1), 0)
            # Turn 2's prompt starts with turn 1's whole prompt (the template renders the history
            # the same way), so all of it comes from the cache.
            self.assertEqual(cached(r2), r1.usage.prompt_tokens)
            self.assertGreater(r2.usage.prompt_tokens, r1.usage.prompt_tokens)
            m = s.settled_metrics()
            self.assertEqual(m["sluice_prompt_tokens_cached_total"] - before["sluice_prompt_tokens_cached_total"],
                             r1.usage.prompt_tokens)
            self.assertEqual(m["sluice_prompt_tokens_total"] - before["sluice_prompt_tokens_total"],
                             r2.usage.prompt_tokens)  # turn 1 whole, turn 2 without the cached part
            self.assertGreaterEqual(m["sluice_prompt_cache_prefixes"], 1)
            self.assertGreater(m["sluice_kv_blocks_cached"], 0)
            self.assertEqual(m["sluice_kv_blocks_used"], m["sluice_kv_blocks_cached"])
            self.assertEqual(m["sluice_kv_blocks_reserved"], 0)

            # The request's own opt-out: everything is evaluated again.
            _, r2_off = conversation(client, cache=False)
            self.assertEqual(cached(r2_off), 0)
            self.assertEqual(r2_off.choices[0].message.content, r2.choices[0].message.content)
            # Turn 2 again, streamed: all but its last two prompt tokens come from the cache (the
            # last one is evaluated in a pass of several tokens, as without the cache), and the
            # stream's usage says so.
            msgs = [{"role": "user", "content": FIRST}, {"role": "assistant", "content": r1.choices[0].message.content},
                    {"role": "user", "content": SECOND}]
            text, usage = "", None
            for c in client.chat.completions.create(model="x", messages=msgs, max_tokens=24, temperature=0,
                                                    stream=True, stream_options={"include_usage": True}):
                if c.choices:
                    text += c.choices[0].delta.content or ""
                if c.usage:
                    usage = c.usage
            self.assertEqual(text, r2.choices[0].message.content)
            self.assertEqual(usage.prompt_tokens_details.cached_tokens, r2.usage.prompt_tokens - 2)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_a_running_requests_prompt_rows_are_shared(self):
        # While one chat streams, another with the same long system message starts from its
        # computed prompt rows (whole KV blocks of 16 positions, shared, not copied).
        system = {"role": "system", "content": "You are a patient tutor. " * 12}
        s = su.Server(ctx=1024, parallel=4)
        try:
            client = su.openai_client(s)
            stream = client.chat.completions.create(
                model="x", messages=[system, {"role": "user", "content": "Explain tides."}], max_tokens=64,
                temperature=0, stream=True)
            chunks = iter(stream)
            next(chunks)  # its prefill is done
            r = client.chat.completions.create(model="x", messages=[system, {"role": "user", "content": "Explain rain."}],
                                               max_tokens=8, temperature=0)
            for _ in chunks:
                pass
            self.assertGreaterEqual(cached(r), 64)
            self.assertEqual(cached(r) % 16, 0)
            alone = conversation_free(client, [system, {"role": "user", "content": "Explain rain."}])
            self.assertEqual(r.choices[0].message.content, alone)
        finally:
            self.assertEqual(s.stop(), 0)

    def test_replies_equal_a_server_without_the_cache(self):
        replies = []
        for extra in ([], ["--no-prompt-cache"]):
            s = su.Server(*extra, ctx=1024, parallel=4)
            try:
                client = su.openai_client(s)
                r1, r2 = conversation(client)
                replies.append((r1.choices[0].message.content, r2.choices[0].message.content, cached(r2)))
                m = s.settled_metrics()
                if extra:
                    self.assertEqual(m["sluice_prompt_cache_prefixes"], 0)
                    self.assertEqual(m["sluice_kv_blocks_used"], 0)
            finally:
                self.assertEqual(s.stop(), 0)
        (a1, a2, a_cached), (b1, b2, b_cached) = replies
        self.assertGreater(a_cached, 0)
        self.assertEqual(b_cached, 0)
        self.assertEqual(a1, b1)
        self.assertEqual(a2, b2)


if __name__ == "__main__":
    sys.exit(su.main())
