"""``turnrl list-envs``, ``baselines`` and ``serve-env``: env code only (no torch)."""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict

from tqdm import tqdm

from turnrl.bench import record
from turnrl.cli.common import EXIT_OK, EXIT_USAGE, serve_until_signalled
from turnrl.envs import registered_env_ids
from turnrl.envs.baselines import format_table, measure_all
from turnrl.env_ids import UnknownEnvError, env_id_of
from turnrl.envs.server import EnvServer
from turnrl.serving import server_token


def list_envs(args: argparse.Namespace) -> int:
    print("\n".join(registered_env_ids()))
    return EXIT_OK


def baselines(args: argparse.Namespace) -> int:
    try:  # registered ids, and envs of your own (module:ClassName, module:env-id) as check-env takes them
        env_ids = [env_id_of(name) for name in args.env_ids] or registered_env_ids()
    except UnknownEnvError as e:
        print(f"turnrl baselines: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    rows = []
    for env_id in tqdm(env_ids, desc="baselines", unit="env"):
        rows += measure_all([env_id], episodes=args.episodes, split=args.split)
    print(format_table(rows))
    if args.json:
        record.write(args.json, {"episodes": args.episodes, "split": args.split, "rows": [asdict(r) for r in rows]})
    return EXIT_OK


def serve_env(args: argparse.Namespace) -> int:
    try:
        server = EnvServer(env_id_of(args.env_id), dict(args.kwarg), host=args.host, port=args.port,
                           session_ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                           token=server_token(args.token_env, args.host), client_kwargs=args.client_kwargs,
                           read_timeout_s=args.read_timeout, close_executors=True)
    except ValueError as e:
        print(f"turnrl serve-env: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return serve_until_signalled(server, "serve-env", args, f"serving {args.env_id} at {{url}}")
