"""Issue 50 item 5 on the CPU: the bundled tiny K3.1 Pro's n-gram speculation, prefix-cache hits on a
multi-turn chat, and generate's tokens/s, through the real `hyserve serve` / `hyserve generate`.

  python3 tools/measure_speaks_cpu.py [--binary build/hyserve] [--threads N] [--device cuda]

(--device cuda: the same measurements on the GPU, tools/device_check.sh's "speaks".)

Speculation: `serve --speculative-config '{"method": "ngram", "num_speculative_tokens": K,
"prompt_lookup_max": 3, "prompt_lookup_min": 1}'` for K in 0 (off), 3, 5; 8 greedy completions one
at a time of 128 tokens each, prompts that repeat a documentation sentence three times (the model
continues the pattern); per K: output tokens/s of the whole run, the acceptance length
(1 + accepted / drafts, from /metrics), and every completion's text equal to K = 0's (greedy
speculation is exact). Chat: 16 turns of one conversation (each resends the whole history plus a
new user message) through /v1/chat/completions, 96 tokens a reply; the prefix-cache hit rate is
hits / queries from /metrics (the cache keeps whole 512-token blocks: K3's KDA state is snapshotted
at block boundaries, so a history shorter than a block is never hit). Generate: `hyserve generate --prompt ... --max-tokens 256`, its
reported decode tokens/s. One JSON line per figure.
"""

import argparse
import json
import os
import re
import socket
import subprocess
import time
import urllib.request

TURNS = 16
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = [
    "The interpreter reads the file and executes each statement in order.",
    "A list is a mutable sequence of items that can be indexed and sliced.",
    "The open function returns a file object that supports reading and writing.",
    "A dictionary maps hashable keys to arbitrary values.",
    "The module defines the following functions and classes.",
    "This method returns a new string with the characters in reverse order.",
    "An exception is raised when the argument has the wrong type.",
    "The default value of the parameter is None.",
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def metric(port, name):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as r:
        text = r.read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def serve(binary, extra, env):
    port = free_port()
    proc = subprocess.Popen([binary, "serve", "--port", str(port), *extra], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(600):
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=2)
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise SystemExit("server did not start")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "hyserve"))
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    args = ap.parse_args()
    device = ["--device", args.device]
    env = dict(os.environ, HYSERVE_NUM_THREADS=str(args.threads))
    baseline = None
    for k in (0, 3, 5):
        extra = []
        if k:
            extra = ["--speculative-config", json.dumps({"method": "ngram", "num_speculative_tokens": k,
                                                         "prompt_lookup_max": 3, "prompt_lookup_min": 1})]
        proc, port = serve(args.binary, extra + device, env)
        try:
            texts, tokens = [], 0
            start = time.perf_counter()
            for s in SENTENCES:
                out = post(port, "/v1/completions", {"model": "tiny-k3-speaks", "prompt": " ".join([s] * 3),
                                                      "max_tokens": 128, "temperature": 0})
                texts.append(out["choices"][0]["text"])
                tokens += out["usage"]["completion_tokens"]
            wall = time.perf_counter() - start
            drafts = metric(port, "vllm:spec_decode_num_drafts_total")
            accepted = metric(port, "vllm:spec_decode_num_accepted_tokens_total")
        finally:
            proc.terminate()
            proc.wait()
        row = {"measure": "ngram_speculation", "device": args.device, "num_speculative_tokens": k, "output_tokens": tokens,
               "tokens_per_s": round(tokens / wall, 1),
               "acceptance_length": round(1 + accepted / drafts, 3) if drafts else None}
        if baseline is None:
            baseline = (texts, tokens / wall)
        else:
            row["speedup"] = round((tokens / wall) / baseline[1], 3)
            row["texts_equal_to_no_speculation"] = texts == baseline[0]
        print(json.dumps(row), flush=True)

    proc, port = serve(args.binary, device, env)
    try:
        messages = []
        for turn in range(TURNS):
            messages.append({"role": "user", "content": SENTENCES[turn % len(SENTENCES)] + " Explain this."})
            out = post(port, "/v1/chat/completions", {"model": "tiny-k3-speaks", "messages": messages,
                                                       "max_tokens": 96, "temperature": 0})
            messages.append({"role": "assistant", "content": out["choices"][0]["message"]["content"]})
        queries = metric(port, "vllm:prefix_cache_queries_total")
        hits = metric(port, "vllm:prefix_cache_hits_total")
    finally:
        proc.terminate()
        proc.wait()
    print(json.dumps({"measure": "multi_turn_prefix_cache", "turns": TURNS, "queried_tokens": queries,
                      "hit_tokens": hits, "hit_rate": round(hits / queries, 3) if queries else None}), flush=True)

    out = subprocess.run([args.binary, "generate", *device, "--prompt", "The Python interpreter reads",
                          "--max-tokens", "256"],
                         env=env, capture_output=True, text=True, check=True).stdout
    m = re.search(r"generated (\d+) tokens, decode ([0-9.]+) ms", out)
    print(json.dumps({"measure": "generate_decode", "tokens": int(m.group(1)), "decode_ms": float(m.group(2)),
                      "tokens_per_s": round(int(m.group(1)) / float(m.group(2)) * 1e3, 1)}), flush=True)


if __name__ == "__main__":
    main()
