"""``turnrl build-model`` (a tiny random-init checkpoint of a real architecture: torch,
transformers) and ``turnrl build-docker-image`` (the docker executor's default image; the
docker SDK itself loads inside ``connect`` and ``build_image``)."""

from __future__ import annotations

import argparse
import json
import sys

import gymnasium

from turnrl.chat.families import family_of, load_template
from turnrl.chat.formats import detect
from turnrl.cli.common import EXIT_FAILED, EXIT_OK, EXIT_USAGE, MODEL_ARCHS
from turnrl.env_ids import UnknownEnvError, env_id_of
from turnrl.models.tiny_checkpoints import build_checkpoint, template_tokenizer
from turnrl.rollout.scripted import corpus_texts
from turnrl.tools.executors.docker import image as docker_image
from turnrl.tools.executors.docker.executor import DockerUnavailable, connect


def build_model(args: argparse.Namespace) -> int:
    try:
        env_id = env_id_of(args.env)
    except UnknownEnvError as e:
        print(f"turnrl build-model: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.hidden % args.heads or args.heads % args.kv_heads:
        print(f"turnrl build-model: error: --hidden {args.hidden} must be divisible by --heads {args.heads}, and "
              f"--heads by --kv-heads {args.kv_heads}", file=sys.stderr)
        return EXIT_USAGE
    template = args.template or MODEL_ARCHS[args.arch]
    try:
        family_of(template)
    except KeyError as e:
        print(f"turnrl build-model: error: --template: {e.args[0]}", file=sys.stderr)
        return EXIT_USAGE
    # the corpus holds the family's own tool-call format (the one a run prompts for: tool_parser=auto)
    parser = detect(load_template(template)).tool_parser
    env = gymnasium.make(env_id, disable_env_checker=True, tool_parser=parser)
    corpus = [text for player in ("expert", "weak")
              for text in corpus_texts(env, range(args.corpus_episodes), player=player)]
    env.close()
    tokenizer = template_tokenizer(template, corpus, args.vocab_size)
    out = build_checkpoint(args.arch, args.out, tokenizer, hidden=args.hidden, layers=args.layers, heads=args.heads,
                           kv_heads=args.kv_heads, seed=args.seed)
    meta = json.loads((out / "turnrl_tiny.json").read_text())
    print(f"saved a {args.arch} checkpoint ({meta['params'] / 1e6:.2f}M parameters, vocab {len(tokenizer)}, "
          f"eos {tokenizer.eos_token}) to {out}; train it with agent.path={out}")
    return EXIT_OK


def build_docker_image(args: argparse.Namespace) -> int:
    """Exit 0 when the engine has the image (built now or before), 1 when it cannot be built."""
    try:
        client = connect()  # first: no engine should fail before a minute of debootstrap
        docker_image.build_image(client, args.image or docker_image.DEFAULT_IMAGE, packages=args.include,
                                 suite=args.suite or docker_image.DEFAULT_SUITE, force=args.force,
                                 mirror=args.mirror or docker_image.DEFAULT_MIRROR)
    except (DockerUnavailable, docker_image.ImageBuildError) as e:
        print(f"turnrl build-docker-image: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK
