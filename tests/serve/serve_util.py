"""Shared pieces of the `sluice serve` tests: starting a server on a free loopback port, raw HTTP
requests, `sluice run` for reference output, and the runner that maps "requirement missing" to
CTest's skip code 77 (only when SLUICE_REQUIRE_MODELS is unset; in CI a missing model or Python
package is a failure).

Every test file is run as: python3 test_X.py SLUICE_BINARY SOURCE_DIR
"""

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

SKIP = 77
SLUICE = None  # set by main()
SOURCE = None
MODEL = None


def require(condition, what):
    """Skips (exit 77) or fails (SLUICE_REQUIRE_MODELS set) when a requirement is missing."""
    if condition:
        return
    if os.environ.get("SLUICE_REQUIRE_MODELS"):
        print(f"FAIL: {what}", file=sys.stderr)
        sys.exit(1)
    print(f"SKIP: {what}")
    sys.exit(SKIP)


class Server:
    """`sluice serve` on 127.0.0.1 and a free port; stop() sends SIGTERM and waits."""

    def __init__(self, *extra, ctx=1024, parallel=None):
        self.log = tempfile.NamedTemporaryFile(prefix="serve-test-", suffix=".log", delete=False)
        args = [SLUICE, "serve", "-m", MODEL, "--port", "0", "-c", str(ctx), "--seed", "7"]
        if parallel:
            args += ["--parallel", str(parallel)]
        args += list(extra)
        self.proc = subprocess.Popen(args, stdout=self.log, stderr=self.log, stdin=subprocess.DEVNULL)
        self.port = None
        deadline = time.time() + 120
        while time.time() < deadline:
            text = self.text()
            m = re.search(r"listening on http://[^:]+:(\d+)", text)
            if m:
                self.port = int(m.group(1))
                break
            if self.proc.poll() is not None:
                raise RuntimeError(f"sluice serve exited {self.proc.returncode}:\n{text}")
            time.sleep(0.05)
        if self.port is None:
            self.proc.kill()
            raise RuntimeError("sluice serve did not start within 120 s:\n" + self.text())
        self.url = f"http://127.0.0.1:{self.port}"

    def text(self):
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def request(self, method, path, body=None, headers=None, timeout=120):
        """(status, headers dict, body bytes). `body`: bytes, str or a JSON-able object."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        h = {"Content-Type": "application/json"}
        h.update(headers or {})
        if body is not None and not isinstance(body, (bytes, str)):
            body = json.dumps(body)
        conn.request(method, path, body=body, headers=h)
        r = conn.getresponse()
        data = r.read()
        hdrs = {k.lower(): v for k, v in r.getheaders()}
        conn.close()
        return r.status, hdrs, data

    def metrics(self, headers=None):
        status, _, body = self.request("GET", "/metrics", headers=headers)
        assert status == 200, body
        out = {}
        for line in body.decode().splitlines():
            if line.startswith("#") or not line.strip():
                continue
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
        return out

    def settled_metrics(self, timeout=30):
        """/metrics once no request is active (or at the deadline): a finished request's outcome
        and KV blocks are counted before its last event is sent, but the active gauge changes at
        the end of its step, so a client can hold its whole reply a moment before the request
        leaves the active count."""
        deadline = time.time() + timeout
        m = self.metrics()
        while m["sluice_requests_active"] != 0 and time.time() < deadline:
            time.sleep(0.05)
            m = self.metrics()
        return m

    def rss_kib(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        return 0

    def stop(self, timeout=60):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("sluice serve did not exit within %d s of SIGTERM:\n%s" % (timeout, self.text()))
        rc = self.proc.returncode
        os.unlink(self.log.name)
        return rc


def openai_client(server, api_key="none"):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=300)


def sluice_run(prompt, n, chat, ctx=1024):
    """What `sluice run` prints for a greedy run (its trailing newline removed)."""
    args = [SLUICE, "run", "-m", MODEL, "-p", prompt, "-n", str(n), "--temp", "0", "-c", str(ctx)]
    if chat:
        args.append("--chat")
    r = subprocess.run(args, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    out = r.stdout.decode()
    return out[:-1] if out.endswith("\n") else out


def main(need_openai=True, need_selenium=False):
    global SLUICE, SOURCE, MODEL
    if len(sys.argv) < 3:
        print("usage: test_X.py SLUICE_BINARY SOURCE_DIR [unittest args]", file=sys.stderr)
        return 2
    SLUICE, SOURCE = sys.argv[1], sys.argv[2]
    MODEL = os.path.join(SOURCE, "models", "smollm2-135m-instruct-q4_1.gguf")
    require(os.path.exists(MODEL), f"model not installed: {MODEL} (run scripts/fetch-models.sh)")
    if need_openai:
        try:
            import openai  # noqa: F401
        except ImportError:
            require(False, "python package openai is not installed (scripts/setup.sh installs it)")
    if need_selenium:
        try:
            import selenium  # noqa: F401
        except ImportError:
            require(False, "python package selenium is not installed (scripts/setup.sh installs it)")
    argv = [sys.argv[0]] + sys.argv[3:]
    prog = unittest.main(module="__main__", argv=argv, exit=False, verbosity=2)
    return 0 if prog.result.wasSuccessful() else 1
