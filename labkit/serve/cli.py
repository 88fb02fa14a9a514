"""`labkit serve`: the command line of the inference server.

    labkit serve --preset tiny --policy continuous --port 8000     (or python -m labkit.serve ...)

Binds 127.0.0.1 unless --host says otherwise. Ctrl-C / SIGTERM shut it down gracefully.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from labkit.model.kv_quant import KV_DTYPES
from labkit.serve.blocks import RESERVE
from labkit.serve.engine import POLICIES
from labkit.serve.preprocess import IMPLEMENTATIONS
from labkit.serve.server import CACHES, ServerConfig

_CHOICES = {"policy": POLICIES, "kv_dtype": KV_DTYPES, "kv_reserve": RESERVE, "cache": CACHES,
            "preprocess": IMPLEMENTATIONS}

_HELP = {
    "preset": "model preset: tiny (the trained checkpoint) or a random-weight shape (small, 1b, 7b)",
    "policy": f"batching policy: {' | '.join(POLICIES)}",
    "port": "TCP port (0 = any free port)",
    "host": "address to bind (default 127.0.0.1, loopback only)",
    "max_batch": "sequences running at once",
    "max_queue": "requests waiting for admission before 429",
    "block_size": "tokens per KV block",
    "kv_blocks": "KV blocks in the pool (default: max_batch x max_model_len worth)",
    "kv_dtype": "KV storage: model | int8",
    "kv_reserve": "on_demand (paged growth) | max_len (reserve max_model_len at admission)",
    "max_model_len": "prompt + output tokens one request may reach",
    "threads": "torch intra-op threads (0 = torch's default)",
    "cache": f"result cache: {' | '.join(CACHES)} (default none)",
    "max_wait": "static/dynamic batching: seconds to wait for a full batch",
    "token_budget": "chunked policy: tokens per step",
    "watermark": "share of KV blocks kept free at admission",
    "drain_s": "seconds shutdown lets requests in flight finish",
    "device": "auto | cpu | cuda | mps",
    "seed": "base seed of requests that give none",
    "log_level": "debug | info | warning | error",
    "api_key": "require 'Authorization: Bearer KEY' (401 otherwise) on all but /health, /metrics, /version",
    "served_model_name": "model id clients send and /v1/models lists (default: the preset's name)",
    "max_body_bytes": "request bodies larger than this get 413, unread (bytes)",
    "preprocess": "pre-processing stage for text prompts (retrieve, rerank, template): off | global_lock "
                  "(one shared buffer, one process-wide lock) | per_thread (a buffer per worker thread)",
    "rerank_k": "pre-processing: BM25 candidates the reranker scores with the model",
}


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `serve` sub-command to a `labkit` argument parser."""
    p = subparsers.add_parser("serve", help="run the OpenAI-compatible inference server",
                              description=__doc__, formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    defaults = ServerConfig()
    for f in dataclasses.fields(ServerConfig):
        default = getattr(defaults, f.name)
        kind = {"kv_blocks": int, "cache": str, "api_key": str, "served_model_name": str}.get(f.name, type(default))
        p.add_argument(f"--{f.name.replace('_', '-')}", dest=f.name, type=kind, default=default,
                       choices=_CHOICES.get(f.name), help=_HELP.get(f.name))
    p.add_argument("--port-file", default=None, help="write the bound port to this file once listening")
    p.set_defaults(func=main)
    return p


def main(args: argparse.Namespace) -> int:
    """Serve until SIGTERM/SIGINT, then exit at once with run()'s status."""
    from labkit.serve.server import run

    cfg = ServerConfig(**{f.name: getattr(args, f.name) for f in dataclasses.fields(ServerConfig)})
    rc = run(cfg, port_file=args.port_file)
    # By now every request has ended and the socket is closed. Skipping the interpreter's
    # teardown (seconds for torch's modules on a busy 2-core machine) keeps shutdown fast.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)
