#!/usr/bin/env python3
"""A small language-model server that really answers on CPU, for trying Shoal's serving path.

The "model" is a word-level Markov chain trained at start-up on the text below: small, but
it generates text token by token, so requests cost real work and streaming is real. It
speaks the part of vLLM's OpenAI-compatible API that load tests use:

    GET  /health                 200 once the model is loaded (readiness), 503 before
                                 (and after --healthy-for seconds, when given: a liveness demo)
    POST /admin/unhealthy        {"unhealthy": true|false}: make /health fail (or pass) from now on
    GET  /v1/models              the served model
    POST /v1/completions         {"prompt": "...", "max_tokens": 16, "stream": false}
                                 "stream": true answers as server-sent events, one token each

It listens on $POD_IP:$PORT (as a Shoal pod gets them; --host/--port override), prints one
log line per request, and says its version (``--version-tag`` or $MODEL_VERSION) in every
answer so rolling updates and canaries can be watched. Stdlib only.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CORPUS = """
the cluster runs training and serving on one pool of gpus . the scheduler places each job on the
nodes that fit it best . a training job asks for eight gpus on each of four nodes and starts when
all of them are free . a serving pod asks for one gpu and answers requests until it is scaled down .
when the pool is full the serving pod of high priority preempts a training job that may be preempted .
the training job saves a checkpoint when it is told to stop and resumes later from that checkpoint .
the gateway sends each request to the ready pod with the fewest requests in flight . a pod that fails
its readiness probe gets no new requests . a rolling update starts new pods before it stops old ones .
"""


class MarkovModel:
    def __init__(self, text: str, seed: int = 0) -> None:
        words = text.split()
        self.next: dict[str, list[str]] = {}
        for a, b in zip(words, words[1:]):
            self.next.setdefault(a, []).append(b)
        self.words = words
        self.rng = random.Random(seed)
        self.lock = threading.Lock()

    def tokens(self, prompt: str, max_tokens: int):
        last = (prompt.split() or ["the"])[-1].lower()
        for _ in range(max_tokens):
            with self.lock:
                choices = self.next.get(last) or self.words
                last = self.rng.choice(choices)
            yield last


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "ModelServer"

    def log_message(self, fmt, *args):
        print(f"{time.strftime('%H:%M:%S')} {self.address_string()} {fmt % args}", flush=True)

    def _json(self, status: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        srv = self.server
        if self.path in ("/health", "/healthz", "/ready"):
            if srv.ready.is_set() and not srv.unhealthy and not srv.expired():
                return self._json(200, {"status": "ok", "version": srv.version})
            return self._json(503, {"status": "loading" if not srv.ready.is_set() else "unhealthy"})
        if self.path == "/v1/models":
            return self._json(200, {"object": "list", "data": [{"id": srv.model_name, "object": "model"}]})
        if self.path == "/version":
            return self._json(200, {"version": srv.version, "pod": os.environ.get("POD_NAME", "")})
        return self._json(404, {"error": f"no route {self.path}"})

    def do_POST(self):
        srv = self.server
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            return self._json(400, {"error": "the body is not JSON"})
        if self.path == "/admin/unhealthy":  # for probe demos: make /health fail from now on
            srv.unhealthy = bool(req.get("unhealthy", True))
            return self._json(200, {"unhealthy": srv.unhealthy})
        if self.path != "/v1/completions":
            return self._json(404, {"error": f"no route {self.path}"})
        with srv.count_lock:
            srv.inflight += 1
        try:
            self._complete(srv, req)
        finally:
            with srv.count_lock:
                srv.inflight -= 1

    def _complete(self, srv, req: dict) -> None:
        if not srv.ready.is_set():
            return self._json(503, {"error": "the model is still loading"})
        prompt = str(req.get("prompt", ""))
        max_tokens = max(1, min(int(req.get("max_tokens", 16)), 512))
        delay = srv.token_delay_s
        meta = {"model": srv.model_name, "version": srv.version, "pod": os.environ.get("POD_NAME", "")}
        if req.get("stream"):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for tok in srv.model.tokens(prompt, max_tokens):
                time.sleep(delay)
                self._chunk(f"data: {json.dumps({'choices': [{'text': ' ' + tok}], **meta})}\n\n")
            self._chunk("data: [DONE]\n\n")
            self.wfile.write(b"0\r\n\r\n")
            return
        text = []
        for tok in srv.model.tokens(prompt, max_tokens):
            time.sleep(delay)
            text.append(tok)
        return self._json(200, {"object": "text_completion", "choices": [{"text": " " + " ".join(text)}],
                                "usage": {"completion_tokens": len(text)}, **meta})

    def _chunk(self, text: str) -> None:
        data = text.encode()
        self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
        self.wfile.flush()


class ModelServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--host", default=os.environ.get("POD_IP", "127.0.0.1"))
    p.add_argument("--port", type=int, default=int(os.environ.get("PORT", "8000")))
    p.add_argument("--model", default="shoal/markov-tiny", help="the model name to report")
    p.add_argument("--version-tag", default=os.environ.get("MODEL_VERSION", "v1"))
    p.add_argument("--load-seconds", type=float, default=float(os.environ.get("LOAD_SECONDS", "0.5")),
                   help="pretend loading the weights takes this long (readiness waits for it)")
    p.add_argument("--healthy-for", type=float, default=float(os.environ.get("HEALTHY_SECONDS", "0")),
                   help="make /health fail this many seconds after start (0: never), to show liveness restarts")
    p.add_argument("--token-delay", type=float, default=float(os.environ.get("TOKEN_DELAY", "0.002")),
                   help="seconds per generated token")
    # vLLM's own flags, accepted so a vLLM manifest's args run unchanged here.
    p.add_argument("--tensor-parallel-size", type=int, default=1)
    p.add_argument("--max-model-len", type=int)
    p.add_argument("--gpu-memory-utilization", type=float)
    args, unknown = p.parse_known_args(argv)
    if unknown:
        print(f"model_server: ignoring options {' '.join(unknown)}", flush=True)
    srv = ModelServer((args.host, args.port), Handler)
    srv.model_name = args.model
    srv.version = args.version_tag
    srv.token_delay_s = args.token_delay
    srv.ready = threading.Event()
    srv.unhealthy = False
    started = time.monotonic()
    srv.expired = lambda: 0 < args.healthy_for <= time.monotonic() - started
    srv.model = MarkovModel(CORPUS, seed=args.port)
    srv.inflight = 0
    srv.count_lock = threading.Lock()

    def load():
        time.sleep(args.load_seconds)
        srv.ready.set()
        print(f"model {args.model} ({args.version_tag}) loaded; serving on {args.host}:{args.port}, "
              f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', '')!r}, "
              f"tensor parallel {args.tensor_parallel_size}", flush=True)

    threading.Thread(target=load, daemon=True).start()

    def term(signum, frame):
        print(f"SIGTERM: finishing {srv.inflight} in-flight request(s), then exiting", flush=True)

        def drain():
            deadline = time.time() + 25
            while srv.inflight and time.time() < deadline:
                time.sleep(0.02)
            srv.shutdown()

        threading.Thread(target=drain, daemon=True).start()

    signal.signal(signal.SIGTERM, term)
    srv.serve_forever()
    srv.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
