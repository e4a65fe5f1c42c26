"""``turnrl check-env ENV [--agent-path DIR]``: the env-author checks, optionally against the
tokenizer, chat template and token limits the env will be trained with."""

from __future__ import annotations

import argparse
import sys

from turnrl.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from turnrl.conf.schema import AgentConfig
from turnrl.envs.check import AgentSettings, UnknownEnvError, check
from turnrl.models.causal_lm import load_tokenizer


def check_env(args: argparse.Namespace) -> int:
    agent = None
    if args.agent_path is not None:
        defaults = AgentConfig()
        try:
            tokenizer = load_tokenizer(args.agent_path)
        except (OSError, ValueError) as e:
            print(f"turnrl check-env: error: --agent-path {args.agent_path!r}: {e}", file=sys.stderr)
            return EXIT_USAGE
        if tokenizer.chat_template is None:
            print(f"turnrl check-env: error: the tokenizer in {args.agent_path!r} has no chat template",
                  file=sys.stderr)
            return EXIT_USAGE
        agent = AgentSettings(tokenizer, args.max_context_tokens or defaults.max_context_tokens,
                              args.max_new_tokens or defaults.max_new_tokens, args.chat_format or defaults.chat_format,
                              dict(args.template_kwarg))
    try:
        report = check(args.env_id, seeds=args.seeds, env_kwargs=dict(args.kwarg), agent=agent)
    except UnknownEnvError as e:
        print(f"turnrl check-env: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    except (KeyError, ValueError) as e:  # an unknown chat format, a template the renderer refuses
        print(f"turnrl check-env: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(report.format())
    return EXIT_OK if report.ok else EXIT_FAILED
