"""`sluice serve` functional tests with the official openai client on SmolLM2-135M: chat and
completions, streaming and not, greedy output identical to `sluice run`; logprobs, stop strings,
seeds; /v1/models, /health, /metrics; the API key; malformed input (400 naming the field), prompt
longer than the context, queue full (503 + Retry-After); client disconnect mid-stream and while
waiting for a non-streaming answer (request cancelled, KV blocks freed); SIGTERM (in-flight request finishes, or is cancelled at the deadline;
exit 0). Short enough for the sanitizer build.

    python3 test_api.py SLUICE_BINARY SOURCE_DIR
"""

import http.client
import json
import select
import socket
import sys
import threading
import time
import unittest

import serve_util as su

N = 16  # tokens per greedy comparison


class Api(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.server = su.Server()
        cls.client = su.openai_client(cls.server)

    @classmethod
    def tearDownClass(cls):
        rc = cls.server.stop()
        assert rc == 0, f"server exited {rc}"

    def test_models_health_metrics(self):
        models = self.client.models.list()
        self.assertEqual([m.id for m in models.data], ["smollm2-135m-instruct-q4_1"])
        status, _, body = self.server.request("GET", "/health")
        self.assertEqual((status, json.loads(body)), (200, {"status": "ok"}))
        m = self.server.metrics()
        for name in ["sluice_generated_tokens_total", "sluice_prompt_tokens_total", "sluice_requests_queued",
                     "sluice_requests_active", "sluice_batch_size_tokens", "sluice_kv_blocks_total",
                     "sluice_kv_blocks_used", "sluice_tokens_per_second", 'sluice_requests_total{outcome="finished"}']:
            self.assertIn(name, m)
        self.assertGreater(m["sluice_kv_blocks_total"], 0)
        status, _, page = self.server.request("GET", "/")
        self.assertEqual(status, 200)
        self.assertIn(b"/v1/chat/completions", page)

    def test_a_burst_of_connections_is_accepted_at_once(self):
        # 200 clients connect at the same moment. The kernel completes each handshake only while
        # the listen queue has room; a short queue (cpp-httplib's own is 5) drops the rest, which
        # retry a second later or are reset. Every connect must complete well inside that second,
        # and every connection then gets its answer.
        socks = []
        try:
            t0 = time.monotonic()
            for _ in range(200):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                s.setblocking(False)
                s.connect_ex(("127.0.0.1", self.server.port))
                socks.append(s)
            pending = set(socks)
            while pending and time.monotonic() - t0 < 5:
                _, writable, _ = select.select([], list(pending), [], 0.05)
                for s in writable:
                    self.assertEqual(s.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR), 0)
                    pending.discard(s)
            elapsed = time.monotonic() - t0
            self.assertFalse(pending, f"{len(pending)} of 200 connects not done after {elapsed:.2f} s")
            self.assertLess(elapsed, 0.8, "handshakes waited for a retry: the listen queue is too short")
            for s in socks:
                s.setblocking(True)
                s.settimeout(60)
                s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            for s in socks:
                data = b""
                while True:
                    chunk = s.recv(4096)
                    if not chunk:
                        break
                    data += chunk
                self.assertTrue(data.startswith(b"HTTP/1.1 200"), data[:80])
        finally:
            for s in socks:
                s.close()

    def test_chat_greedy_matches_sluice_run(self):
        prompt = "What is the capital of France? Answer in one sentence."
        want = su.sluice_run(prompt, N, chat=True)
        r = self.client.chat.completions.create(model="x", messages=[{"role": "user", "content": prompt}],
                                                max_tokens=N, temperature=0)
        self.assertEqual(r.choices[0].message.content, want)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 10)
        self.assertLessEqual(r.usage.completion_tokens, N)
        # Streaming gives the same text, piece by piece.
        stream = self.client.chat.completions.create(model="x", messages=[{"role": "user", "content": prompt}],
                                                     max_tokens=N, temperature=0, stream=True,
                                                     stream_options={"include_usage": True})
        text, finish, usage, chunks = "", None, None, 0
        for chunk in stream:
            if chunk.usage:
                usage = chunk.usage
            if not chunk.choices:
                continue
            chunks += 1
            text += chunk.choices[0].delta.content or ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual(text, want)
        self.assertEqual(finish, r.choices[0].finish_reason)
        self.assertGreater(chunks, 3)
        self.assertEqual(usage.completion_tokens, r.usage.completion_tokens)

    def test_completion_greedy_matches_sluice_run(self):
        prompt = "The three primary colors are"
        want = su.sluice_run(prompt, N, chat=False)
        r = self.client.completions.create(model="x", prompt=prompt, max_tokens=N, temperature=0)
        self.assertEqual(r.choices[0].text, want)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, N)
        text = "".join(c.choices[0].text for c in self.client.completions.create(
            model="x", prompt=prompt, max_tokens=N, temperature=0, stream=True))
        self.assertEqual(text, want)

    def test_logprobs(self):
        r = self.client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}],
                                                max_tokens=6, temperature=0, logprobs=True, top_logprobs=3)
        content = r.choices[0].logprobs.content
        self.assertEqual(len(content), r.usage.completion_tokens)
        for t in content:
            self.assertLessEqual(t.logprob, 0.0)
            self.assertEqual(len(t.top_logprobs), 3)
            # Greedy: the chosen token is the most likely one.
            self.assertAlmostEqual(t.top_logprobs[0].logprob, t.logprob, places=4)
        c = self.client.completions.create(model="x", prompt="One, two,", max_tokens=4, temperature=0, logprobs=2)
        lp = c.choices[0].logprobs
        self.assertEqual(len(lp.tokens), 4)
        self.assertEqual(len(lp.top_logprobs[0]), 2)
        self.assertEqual("".join(lp.tokens), c.choices[0].text)

    def test_stop_and_seed(self):
        prompt = "Count: 1, 2, 3, 4, 5,"
        full = self.client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0).choices[0].text
        self.assertIn("7", full)
        r = self.client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0, stop=["7"])
        self.assertEqual(r.choices[0].text, full[:full.index("7")])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        a = self.client.completions.create(model="x", prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                           seed=1234).choices[0].text
        b = self.client.completions.create(model="x", prompt="Once upon a time", max_tokens=12, temperature=1.0,
                                           seed=1234).choices[0].text
        self.assertEqual(a, b)

    def test_malformed_requests_name_the_field(self):
        ok_messages = [{"role": "user", "content": "hi"}]
        cases = [
            ("/v1/chat/completions", b"{", None, "malformed JSON"),
            ("/v1/chat/completions", b"\xff\xfe", None, "malformed JSON"),
            ("/v1/chat/completions", b"[1, 2]", None, "JSON object"),
            ("/v1/chat/completions", {"messages": "hi"}, "messages", "'messages'"),
            ("/v1/chat/completions", {}, "messages", "'messages' is required"),
            ("/v1/chat/completions", {"messages": ok_messages, "max_tokens": "a"}, "max_tokens", "'max_tokens'"),
            ("/v1/chat/completions", {"messages": ok_messages, "max_tokens": 0}, "max_tokens", "'max_tokens'"),
            ("/v1/chat/completions", {"messages": ok_messages, "temperature": "hot"}, "temperature", "'temperature'"),
            ("/v1/chat/completions", {"messages": ok_messages, "temperature": 5}, "temperature", "'temperature'"),
            ("/v1/chat/completions", {"messages": ok_messages, "top_p": 1.5}, "top_p", "'top_p'"),
            ("/v1/chat/completions", {"messages": ok_messages, "top_k": -1}, "top_k", "'top_k'"),
            ("/v1/chat/completions", {"messages": ok_messages, "min_p": 2}, "min_p", "'min_p'"),
            ("/v1/chat/completions", {"messages": ok_messages, "seed": "x"}, "seed", "'seed'"),
            ("/v1/chat/completions", {"messages": ok_messages, "bogus": 1}, "bogus", "unknown field 'bogus'"),
            ("/v1/chat/completions", {"messages": ok_messages, "n": 2}, "n", "'n'"),
            ("/v1/chat/completions", {"messages": ok_messages, "stream": "yes"}, "stream", "'stream'"),
            ("/v1/chat/completions", {"messages": ok_messages, "stop": 5}, "stop", "'stop'"),
            ("/v1/chat/completions", {"messages": ok_messages, "logprobs": True, "top_logprobs": 50}, "top_logprobs",
             "'top_logprobs'"),
            ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role",
             "'messages[0].role'"),
            ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "messages[0].content", "'messages[0].content'"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": 3}]}, "messages[0].content",
             "'messages[0].content'"),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x", "extra": 1}]},
             "messages[0].extra", "unknown field 'messages[0].extra'"),
            ("/v1/completions", {}, "prompt", "'prompt' is required"),
            ("/v1/completions", {"prompt": {}}, "prompt", "'prompt'"),
            ("/v1/completions", {"prompt": [1, 99999999]}, "prompt", "'prompt[1]'"),
            ("/v1/completions", {"prompt": "x", "logprobs": "x"}, "logprobs", "'logprobs'"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 1.5}, "max_tokens", "'max_tokens'"),
            ("/v1/completions", {"prompt": "x", "stream_options": {"foo": True}}, "stream_options.foo",
             "unknown field 'stream_options.foo'"),
            ("/v1/completions", {"prompt": "x", "max_tokens": 2 ** 70}, "max_tokens", "'max_tokens'"),
        ]
        for path, body, param, message in cases:
            with self.subTest(path=path, body=body):
                status, _, data = self.server.request("POST", path, body)
                self.assertEqual(status, 400, data)
                err = json.loads(data)["error"]
                self.assertIn(message, err["message"])
                if param:
                    self.assertEqual(err["param"], param)
        # Prompt longer than the context (1024 tokens).
        status, _, data = self.server.request("POST", "/v1/completions", {"prompt": "hello " * 3000})
        self.assertEqual(status, 400, data)
        self.assertIn("longer than the context", json.loads(data)["error"]["message"])
        status, _, data = self.server.request("GET", "/v1/nothing")
        self.assertEqual(status, 404)
        self.assertIn("no such endpoint", json.loads(data)["error"]["message"])
        # Still serving.
        self.assertEqual(self.server.request("GET", "/health")[0], 200)

    def test_disconnect_mid_stream_cancels_and_frees_kv(self):
        before = self.server.metrics()
        sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=60)
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 900, "stream": True, "temperature": 0})
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        got = b""
        while got.count(b"data: ") < 3:
            more = sock.recv(4096)
            self.assertTrue(more, got)
            got += more
        sock.close()
        self.expect_cancelled(before, 900)

    def test_disconnect_while_waiting_for_a_whole_answer_cancels_and_frees_kv(self):
        # Non-streaming: nothing is written before the answer is complete, so the server must
        # notice the closed connection itself.
        before = self.server.metrics()
        sock = socket.create_connection(("127.0.0.1", self.server.port), timeout=60)
        body = json.dumps({"prompt": "Once upon a time", "max_tokens": 900, "temperature": 0})
        sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
        deadline = time.time() + 60
        while self.server.metrics()["sluice_generated_tokens_total"] < before["sluice_generated_tokens_total"] + 3:
            self.assertLess(time.time(), deadline, "generation did not start")
            time.sleep(0.05)
        sock.close()
        self.expect_cancelled(before, 900)

    def expect_cancelled(self, before, max_tokens):
        key = 'sluice_requests_total{outcome="cancelled"}'
        deadline = time.time() + 30
        while time.time() < deadline:
            m = self.server.metrics()
            if m[key] > before[key] and m["sluice_requests_active"] == 0:
                break
            time.sleep(0.1)
        self.assertGreater(m[key], before[key], "the request was not cancelled")
        self.assertEqual(m["sluice_requests_active"], 0)
        self.assertEqual(m["sluice_kv_blocks_reserved"], 0)
        # What stays is the prompt cache's: the cancelled request's prompt rows, kept for reuse (a
        # block two cached prefixes share counts once in use, twice in the cached total).
        self.assertLessEqual(m["sluice_kv_blocks_used"], m["sluice_kv_blocks_cached"])
        self.assertLess(m["sluice_generated_tokens_total"] - before["sluice_generated_tokens_total"], max_tokens)
        self.assertEqual(self.server.request("GET", "/health")[0], 200)


class Limits(unittest.TestCase):
    def test_api_key(self):
        s = su.Server("--api-key", "sesame")
        try:
            self.assertEqual(s.request("GET", "/health")[0], 200)
            status, _, body = s.request("GET", "/v1/models")
            self.assertEqual(status, 401)
            self.assertIn("API key", json.loads(body)["error"]["message"])
            self.assertEqual(s.request("GET", "/metrics")[0], 401)
            self.assertEqual(s.request("POST", "/v1/completions", {"prompt": "x"},
                                       headers={"Authorization": "Bearer wrong"})[0], 401)
            self.assertEqual(s.request("GET", "/metrics", headers={"Authorization": "Bearer sesame"})[0], 200)
            r = su.openai_client(s, api_key="sesame").completions.create(model="x", prompt="Hi", max_tokens=2)
            self.assertEqual(r.usage.completion_tokens, 2)
            import openai
            with self.assertRaises(openai.AuthenticationError):
                su.openai_client(s, api_key="wrong").models.list()
        finally:
            self.assertEqual(s.stop(), 0)

    def test_queue_full_is_503_with_retry_after(self):
        s = su.Server("--queue", "0", parallel=1)
        try:
            sock = socket.create_connection(("127.0.0.1", s.port), timeout=60)
            body = json.dumps({"prompt": "Once upon a time", "max_tokens": 400, "stream": True})
            sock.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                          f"Content-Length: {len(body)}\r\n\r\n{body}").encode())
            got = b""
            while got.count(b"data: ") < 2:
                more = sock.recv(4096)
                self.assertTrue(more, got)
                got += more
            status, headers, data = s.request("POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 2})
            self.assertEqual(status, 503, data)
            self.assertIn("retry-after", headers)
            self.assertIn("queue full", json.loads(data)["error"]["message"])
            sock.close()
        finally:
            self.assertEqual(s.stop(), 0)

    def _stream_in_thread(self, s, max_tokens, out):
        def run():
            try:
                text, finish = "", None
                for c in su.openai_client(s).completions.create(model="x", prompt="Once upon a time",
                                                                 max_tokens=max_tokens, temperature=0, stream=True):
                    text += c.choices[0].text
                    finish = c.choices[0].finish_reason or finish
                    out["chunks"] = out.get("chunks", 0) + 1
                out["text"], out["finish"] = text, finish
            except Exception as e:  # noqa: BLE001 - recorded for the assertion
                out["error"] = repr(e)
        t = threading.Thread(target=run)
        t.start()
        deadline = time.time() + 60
        while out.get("chunks", 0) < 2 and time.time() < deadline and t.is_alive():
            time.sleep(0.02)
        return t

    def test_sigterm_lets_the_running_request_finish_and_exits_0(self):
        s = su.Server("--shutdown-timeout", "60")
        out = {}
        t = self._stream_in_thread(s, 24, out)
        t0 = time.time()
        s.proc.send_signal(15)
        rc = s.proc.wait(timeout=90)
        t.join(timeout=30)
        self.assertEqual(rc, 0, s.text())
        self.assertEqual(out.get("finish"), "length", out)
        self.assertNotIn("error", out)
        self.assertLess(time.time() - t0, 60)
        with self.assertRaises(OSError):
            socket.create_connection(("127.0.0.1", s.port), timeout=2)
        s.stop()

    def test_sigterm_does_not_wait_for_idle_keep_alive_connections(self):
        # A client keeps its connection open between requests (HTTP keep-alive, up to 15 s idle):
        # the server ends it at shutdown instead of waiting out the idle timeout.
        s = su.Server("--shutdown-timeout", "10")
        conn = http.client.HTTPConnection("127.0.0.1", s.port, timeout=30)
        conn.request("POST", "/v1/completions", body=json.dumps({"prompt": "Hi", "max_tokens": 2}),
                     headers={"Content-Type": "application/json"})
        self.assertEqual(conn.getresponse().status, 200)
        t0 = time.time()
        s.proc.send_signal(15)
        rc = s.proc.wait(timeout=60)
        elapsed = time.time() - t0
        conn.close()
        self.assertEqual(rc, 0, s.text())
        self.assertLess(elapsed, 3, "shutdown waited for an idle connection")
        s.stop()

    def test_sigterm_cancels_at_the_deadline(self):
        s = su.Server("--shutdown-timeout", "0.5")
        out = {}
        t = self._stream_in_thread(s, 900, out)
        t0 = time.time()
        s.proc.send_signal(15)
        rc = s.proc.wait(timeout=60)
        elapsed = time.time() - t0
        t.join(timeout=30)
        self.assertEqual(rc, 0, s.text())
        self.assertLess(elapsed, 15, "shutdown took too long")
        self.assertNotEqual(out.get("finish"), "length", out)  # cut short
        s.stop()


if __name__ == "__main__":
    sys.exit(su.main())
