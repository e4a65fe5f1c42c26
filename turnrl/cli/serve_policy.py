"""``turnrl serve-policy``: a checkpoint over an OpenAI-compatible HTTP API (torch, transformers)."""

from __future__ import annotations

import argparse
import os
import sys

import torch

from turnrl.cli.common import EXIT_USAGE, serve_until_signalled
from turnrl.models.causal_lm import load_pretrained
from turnrl.policies.server import PolicyServer
from turnrl.serving import server_token


def serve_policy(args: argparse.Namespace) -> int:
    if os.path.isdir(args.path) and not os.path.isfile(os.path.join(args.path, "config.json")):
        print(f"turnrl serve-policy: error: {args.path!r} holds no config.json: not a checkpoint saved with "
              "save_pretrained (a model and its tokenizer)", file=sys.stderr)
        return EXIT_USAGE
    try:  # before loading the model: a refused start is quick
        api_key = server_token(args.token_env, args.host)
    except ValueError as e:
        print(f"turnrl serve-policy: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_pretrained(args.path, dtype=args.dtype)
        server = PolicyServer(model.to(args.device).eval(), tokenizer, host=args.host, port=args.port,
                              model_name=args.served_model_name or args.path, max_batch=args.max_batch,
                              batch_window_s=args.batch_window_ms / 1000, seed=args.seed, api_key=api_key,
                              max_tokens_limit=args.max_tokens_limit, max_n=args.max_n,
                              max_request_rows=args.max_request_rows, max_request_tokens=args.max_request_tokens,
                              tool_parser=args.tool_parser)
    except (OSError, ValueError) as e:
        print(f"turnrl serve-policy: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return serve_until_signalled(server, "serve-policy", args, "serving policy at {url}")
