#!/usr/bin/env python3
"""Load generator for OpenAI-compatible servers (sluice serve, llama.cpp's llama-server, ...).

For each concurrency N it sends N streaming /v1/completions requests at once (fixed prompts,
greedy, M generated tokens each, end-of-generation ignored where the server supports it) and
prints one table row: aggregate decode tok/s (all generated tokens / the round's wall time from the
first token to the last), per-request decode tok/s (median), time to first token (median, max),
errors. The single-request rate (N=1 is always run first) gives the ratio "aggregate at max N /
single". Standard library only: copy it to any machine with python3.

  # a running server
  serve_bench.py --url http://127.0.0.1:8080 --concurrency 1,8,32 --tokens 128
  # start the server, wait for /health, run, stop it (SIGTERM)
  serve_bench.py --server "sluice serve -m model.gguf --port 8080 --parallel 32" --concurrency 1,32
  serve_bench.py --server "llama-server -m model.gguf --port 8080 -np 32 -c 65536" --concurrency 1,32
"""

import argparse
import http.client
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import threading
import time
import urllib.parse

PROMPTS = [
    "The history of the printing press begins",
    "In a small village at the edge of the forest, there lived",
    "The most important thing to understand about compilers is",
    "Once upon a time, in a kingdom by the sea,",
    "A good recipe for bread starts with",
    "The theory of relativity explains",
    "When the spacecraft finally reached orbit,",
    "Here is a list of interesting facts about octopuses:",
]


def sse_events(response):
    """The JSON objects of a server-sent-event response's `data:` lines, as they arrive ([DONE] left out)."""
    buf = b""
    while True:
        chunk = response.read1(65536) if hasattr(response, "read1") else response.read(1)
        if not chunk:
            return
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            for line in event.split(b"\n"):
                if line.startswith(b"data: ") and line[6:].strip() != b"[DONE]":
                    yield json.loads(line[6:])


def request_stream(host, port, path, body, headers, timeout):
    """Sends one streaming request; returns (t_sent, [token arrival times], completion_tokens, error)."""
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    t_sent = time.perf_counter()
    arrivals, usage_tokens = [], None
    try:
        conn.request("POST", path, body=json.dumps(body), headers=headers)
        r = conn.getresponse()
        if r.status != 200:
            return t_sent, arrivals, 0, f"HTTP {r.status}: {r.read()[:200]!r}"
        for j in sse_events(r):
            if "error" in j:
                return t_sent, arrivals, len(arrivals), f"error event: {j['error']}"
            if j.get("usage"):
                usage_tokens = j["usage"].get("completion_tokens")
            for c in j.get("choices", []):
                if c.get("text") or (c.get("delta") or {}).get("content"):
                    arrivals.append(time.perf_counter())
        n = usage_tokens if usage_tokens else len(arrivals)
        return t_sent, arrivals, n, None
    except Exception as e:  # noqa: BLE001 - counted as an error of the round
        return t_sent, arrivals, len(arrivals), repr(e)
    finally:
        conn.close()


def run_round(args, host, port, n):
    results = [None] * n
    headers = {"Content-Type": "application/json"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    barrier = threading.Barrier(n)

    def worker(i):
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": args.tokens, "temperature": args.temperature,
                "stream": True, "stream_options": {"include_usage": True}}
        if args.temperature > 0:
            body["seed"] = i
        if args.top_k is not None:
            body["top_k"] = args.top_k
        if args.logprobs is not None:
            body["logprobs"] = args.logprobs  # /v1/completions: this many top log-probabilities a token
        if args.model:
            body["model"] = args.model
        if args.ignore_eos:
            body["ignore_eos"] = True
        barrier.wait()
        results[i] = request_stream(host, port, "/v1/completions", body, headers, args.timeout)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [r[3] for r in results if r[3]]
    ok = [r for r in results if not r[3] and r[1]]
    if not ok:
        return {"n": n, "errors": len(errors), "error_sample": errors[:3]}
    first = min(r[1][0] for r in ok)
    last = max(r[1][-1] for r in ok)
    total = sum(r[2] for r in ok)
    ttft = [r[1][0] - r[0] for r in ok]
    per_req = [(len(r[1]) - 1) / (r[1][-1] - r[1][0]) for r in ok if len(r[1]) > 1 and r[1][-1] > r[1][0]]
    # Decode throughput: tokens after each request's first, over the span in which tokens flowed.
    decode_tokens = sum(max(0, r[2] - 1) for r in ok)
    return {
        "n": n,
        "requests": len(ok),
        "tokens": total,
        "aggregate": decode_tokens / (last - first) if last > first else 0.0,
        "per_request": statistics.median(per_req) if per_req else 0.0,
        "ttft_median": statistics.median(ttft),
        "ttft_max": max(ttft),
        "wall": last - results[0][0] if results[0] else 0.0,
        "errors": len(errors),
        "error_sample": errors[:3],
    }


def wait_ready(host, port, timeout, proc=None):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc is not None and proc.poll() is not None:
            sys.exit(f"serve_bench: the server exited with {proc.returncode} before it was ready")
        try:
            conn = http.client.HTTPConnection(host, port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    sys.exit(f"serve_bench: no healthy server on {host}:{port} after {timeout} s")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8080", help="server base URL (default %(default)s)")
    ap.add_argument("--server", help="command that starts the server (listening on --url's port); stopped at the end")
    ap.add_argument("--concurrency", default="1,8,32", help="comma-separated concurrent requests per round")
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per request (default %(default)s)")
    ap.add_argument("--repeat", type=int, default=1, help="rounds per concurrency; the best aggregate is kept")
    ap.add_argument("--temperature", type=float, default=0.0,
                    help="sampling temperature of every request (default 0: greedy; each request then gets seed i)")
    ap.add_argument("--top-k", type=int, default=None, help="top_k to send (llama-server and sluice take it)")
    ap.add_argument("--logprobs", type=int, default=None,
                    help="ask for each token's log-probability and this many most likely alternatives (0-5)")
    ap.add_argument("--model", default="", help="'model' field to send (llama-server ignores it)")
    ap.add_argument("--api-key", default=os.environ.get("OPENAI_API_KEY", ""), help="Bearer key, if the server needs one")
    ap.add_argument("--no-ignore-eos", dest="ignore_eos", action="store_false",
                    help="do not send ignore_eos (requests may then end before --tokens)")
    ap.add_argument("--timeout", type=float, default=600, help="per-request timeout in seconds")
    ap.add_argument("--ready-timeout", type=float, default=900, help="seconds to wait for the server's /health")
    ap.add_argument("--json", help="also write the rows to this JSON file")
    args = ap.parse_args()

    u = urllib.parse.urlparse(args.url)
    host, port = u.hostname or "127.0.0.1", u.port or 80
    levels = sorted({int(x) for x in args.concurrency.split(",") if x.strip()})
    if 1 not in levels:
        levels = [1] + levels
    proc = None
    if args.server:
        proc = subprocess.Popen(shlex.split(args.server), stdout=subprocess.DEVNULL, stderr=sys.stderr)
    try:
        wait_ready(host, port, args.ready_timeout, proc)
        run_round(args, host, port, 1)  # warm-up
        rows = []
        for n in levels:
            best = None
            for _ in range(args.repeat):
                r = run_round(args, host, port, n)
                if best is None or r.get("aggregate", 0) > best.get("aggregate", 0):
                    best = r
            rows.append(best)
            print(f"  N={n}: {best.get('aggregate', 0):.1f} tok/s aggregate, {best['errors']} errors", file=sys.stderr)
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                proc.kill()

    print(f"\nserver: {args.server or args.url}   tokens/request: {args.tokens}   greedy, fixed prompts\n")
    print(f"{'N':>4} | {'aggregate tok/s':>15} | {'per-request tok/s':>17} | {'TTFT median s':>13} | "
          f"{'TTFT max s':>10} | {'tokens':>7} | {'errors':>6}")
    print("-" * 92)
    for r in rows:
        if "aggregate" not in r:
            print(f"{r['n']:>4} | {'-':>15} | {'-':>17} | {'-':>13} | {'-':>10} | {'-':>7} | {r['errors']:>6}")
            continue
        print(f"{r['n']:>4} | {r['aggregate']:>15.1f} | {r['per_request']:>17.1f} | {r['ttft_median']:>13.3f} | "
              f"{r['ttft_max']:>10.3f} | {r['tokens']:>7} | {r['errors']:>6}")
    single = next((r for r in rows if r["n"] == 1 and r.get("aggregate")), None)
    top = rows[-1]
    if single and top.get("aggregate") and top["n"] > 1:
        print(f"\naggregate at {top['n']} / single: {top['aggregate'] / single['aggregate']:.2f}x")
    for r in rows:
        for e in r.get("error_sample", []):
            print(f"error (N={r['n']}): {e}", file=sys.stderr)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"server": args.server or args.url, "tokens": args.tokens, "rows": rows}, f, indent=2)
    return 1 if any(r["errors"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
