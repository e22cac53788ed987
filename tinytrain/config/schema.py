"""Dataclass schemas for every config group.

Hydra merges each group's YAML into these types, so a misspelled key or a wrong type is
rejected with the key's full name before anything runs. Defaults live here and nowhere else.
Derived values (`model.vocab_size`, `precision.value`) are null here and decided once, by the plan
(tinytrain/plan/run_plan.py); config_resolved.yaml and wandb's config show them filled in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Optional

from hydra.core.config_store import ConfigStore


class Mode(Enum):
    train = "train"
    plan = "plan"
    prepare = "prepare"  # build the data (the pretraining token store) and stop
    sbatch = "sbatch"  # plan, then write <run dir>/job.sbatch that trains this run on Slurm
    export = "export"  # a Hugging Face folder from checkpoint.path (a step checkpoint, final, a DeepSpeed folder)
    generate = "generate"  # text from checkpoint.path (a checkpoint or an export) for generate.prompts
    eval = "eval"  # loss and perplexity of checkpoint.path on a data config's held-out split -> eval.json
    average = "average"  # the mean weights of checkpoint.average (or the run's last checkpoint.average_last) -> a checkpoint and its export
    health = "health"  # the health check alone (cluster.health_check's: matmul, memory, all-reduce on every rank), then stop
    doctor = "doctor"  # one report for a bug report: versions, GPUs, the Slurm allocation, network, NCCL variables -> doctor.txt


class BadNode(Enum):
    """cluster.on_bad_node: what a failed health check does."""

    stop = "stop"
    warn = "warn"
    exclude = "exclude"


# Modes that resolve for the cluster (hardware.gpu, cluster.*) instead of this machine.
PLANNING_MODES = (Mode.plan, Mode.sbatch)


class EvalAt(Enum):
    checkpoints = "checkpoints"  # every step checkpoint and the final weights
    end = "end"  # the final weights only


class EvalWhere(Enum):
    inline = "inline"  # on the training ranks, at the step
    slurm = "slurm"  # a separate one-GPU Slurm job per checkpoint


class Arch(Enum):
    """Model families: each value is transformers' model_type, whose *Config / *ForCausalLM classes build it."""

    llama = "llama"
    qwen2 = "qwen2"
    mistral = "mistral"
    gemma2 = "gemma2"
    phi3 = "phi3"
    qwen3 = "qwen3"
    gemma3_text = "gemma3_text"  # Gemma-3's text model (Gemma-3-1B; the text tower of 4B/12B/27B)


class Attention(Enum):
    auto = "auto"  # torch's varlen kernel, else flash_attention_2, on a GPU of compute capability >= 8.0; else sdpa (plan/attention.py)
    sdpa = "sdpa"
    eager = "eager"
    flash_attention_2 = "flash_attention_2"
    varlen = "varlen"  # torch.nn.attention.varlen (torch >= 2.10, CUDA, compute capability >= 8.0)


class PrecisionRequest(Enum):
    auto = "auto"
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class Strategy(Enum):
    single = "single"
    ddp = "ddp"
    deepspeed = "deepspeed"  # ZeRO stages 1-3 (+ offload) through Lightning's DeepSpeedStrategy
    fsdp_tp = "fsdp_tp"  # FSDP2 x tensor parallel through Lightning's ModelParallelStrategy


class Checkpointing(Enum):
    """trainer.activation_checkpointing (plan/checkpointing.py; the old true/false mean full/none)."""

    none = "none"  # every activation kept for backward
    full = "full"  # a layer keeps only its input and is recomputed in backward
    selective = "selective"  # matmul and attention outputs kept, the cheap ops between them recomputed
    auto = "auto"  # the cheapest of the three that fits the GPU (none where there is no GPU to fit)


class CompileMode(Enum):
    """trainer.compile (old true/false: model/none)."""

    none = "none"
    blocks = "blocks"  # each transformer block compiled on its own: compile time flat in depth
    model = "model"  # the whole model as one graph


class ContextParallelKind(Enum):
    """How parallel.cp > 1 splits each sequence (plan/context.py picks for auto)."""

    auto = "auto"
    ulysses = "ulysses"  # all-to-all of heads: DeepSpeed's UlyssesSPAttentionHF (deepspeed.runtime.sequence_parallel)
    ring = "ring"  # torch's context parallel (flex path: keys/values gathered over cp), under fsdp_tp


class CheckLevel(Enum):
    error = "error"  # stop before training
    warn = "warn"  # report and go on
    off = "off"


class UntrainedPolicy(Enum):
    auto = "auto"  # mean when the run uses the tokens (added/template/EOS), else warn
    mean = "mean"  # rewrite the rows with the mean of the trained rows
    noisy_mean = "noisy_mean"  # the mean plus noise of 1/10 the rows' std
    error = "error"
    warn = "warn"


class TokenizerChange(Enum):
    refuse = "refuse"  # a model.pretrained folder's own tokenizer must be the run's (the plan stops)
    allow = "allow"  # train it with another tokenizer: every embedding row re-initialised, none reused by id


class NonFinitePolicy(Enum):
    skip = "skip"  # skip the step (the GradScaler/DeepSpeed behaviour), up to guard.max_consecutive_skips
    stop = "stop"  # save the last good state and exit with the diagnosis


class DataSource(Enum):
    pydoc = "pydoc"  # the pydoc_data.topics corpus that ships with every CPython
    text = "text"  # a UTF-8 .txt file or a folder of them
    jsonl = "jsonl"  # a JSON Lines file or a folder of .jsonl files
    parquet = "parquet"  # a Parquet file or a folder of .parquet files
    hf = "hf"  # a Hugging Face dataset: a save_to_disk folder, a local dataset folder, or a hub name


class DataFormat(Enum):
    text = "text"  # documents for pretraining: tokenized into a token store, packed into windows
    instruction = "instruction"  # SFT records: instruction / input / output (or Alpaca's nested instances[])
    chat = "chat"  # SFT records: messages = [{role, content}, ...]
    preference = "preference"  # pairs: {prompt, chosen, rejected} strings, or chosen/rejected message lists (TRL's layouts)


class TextSplit(Enum):
    blank_lines = "blank_lines"  # one document per blank-line-separated block
    file = "file"  # one document per file


class BadRecordPolicy(Enum):
    error = "error"  # stop before training, naming the file and line
    skip = "skip"  # drop the record, count it and log the first few


class Exhaustion(Enum):
    repeat = "repeat"  # a mixture source that runs out starts another pass (a new shuffle)
    stop = "stop"  # the run ends at the last step before any source would repeat (checkpoint saved)


class LrSchedule(Enum):
    cosine = "cosine"  # warm-up, cosine decay over the rest of the run
    linear = "linear"  # warm-up, linear decay over the rest of the run
    constant = "constant"  # warm-up, then the peak rate
    wsd = "wsd"  # warm-up, stable, and a decay over the last trainer.decay_steps / decay_fraction


class OptimizerName(Enum):
    adamw = "adamw"  # AdamW for every parameter
    # Muon (momentum orthogonalised by Newton-Schulz) for the 2-D hidden weight matrices, AdamW for
    # embeddings, the head, norms and biases (tinytrain/model/optimizers.py)
    muon = "muon"


class DecayShape(Enum):
    """The shape of the WSD decay from the peak to min_lr_ratio x peak (progress p from 0 to 1)."""

    linear = "linear"  # 1 - p
    cosine = "cosine"  # (1 + cos(pi p)) / 2
    one_minus_sqrt = "1-sqrt"  # 1 - sqrt(p) (Hägele et al. 2024): steep first; given by name, trainer.decay_shape=one_minus_sqrt


class TooLongPolicy(Enum):
    truncate = "truncate"
    skip = "skip"
    error = "error"


class ChatTemplate(Enum):
    chatml = "chatml"  # <|im_start|>role ... <|im_end|>; both markers must be special tokens
    alpaca = "alpaca"  # "### Instruction:" / "### Response:" plain text, EOS after each response
    tokenizer = "tokenizer"  # the tokenizer's own chat_template (Jinja)


class ExportDtype(Enum):
    auto = "auto"  # the training precision's: bf16-mixed -> bf16, 16-mixed -> fp16, 32-true -> fp32
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "fp32"


class FinetuneMethod(Enum):
    full = "full"  # every weight trains
    lora = "lora"  # low-rank adapters (peft) on a frozen base held in the compute dtype
    qlora = "qlora"  # LoRA on a 4-bit (NF4, bitsandbytes) base: CUDA GPUs only


class Objective(Enum):
    sft = "sft"  # next-token cross-entropy on the trained tokens
    dpo = "dpo"  # Direct Preference Optimization: sigmoid loss on beta x the policy/reference log-ratio margin
    ipo = "ipo"  # Identity Preference Optimization: squared loss on the per-token log-ratio margin (TRL's form)
    simpo = "simpo"  # SimPO: reference-free, on the length-normalised log-prob margin minus a target margin
    kto = "kto"  # KTO: unpaired {prompt, completion, label} records, desirable vs undesirable against a reference (TRL's KTOTrainer)
    orpo = "orpo"  # ORPO: reference-free, NLL on the chosen row plus beta x the log odds-ratio loss (TRL's ORPOTrainer)


class TrainableTokens(Enum):
    auto = "auto"  # rows of tokens the base never trained (added tokens, rows preflight fixes) train with the adapters
    none = "none"  # only the adapters train; such rows keep their initialisation


class TrainOn(Enum):
    assistant = "assistant"  # loss on assistant turns only; every prompt token is -100
    all = "all"  # loss on every token


@dataclass
class ModelConfig:
    name: str = "tiny"
    arch: Arch = Arch.llama
    hidden_size: int = 192
    num_layers: int = 4
    num_heads: int = 6
    num_kv_heads: int = 2
    intermediate_size: int = 512
    max_position_embeddings: int = 1024
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    # Width of each attention head; null: hidden_size / num_heads (Gemma-2-2B: 8 heads of 256 on 2304).
    head_dim: Optional[int] = None
    # Tokens a sliding-window layer attends to (mistral, gemma2, phi3, gemma3_text); null: full attention.
    sliding_window: Optional[int] = None
    # gemma3_text: every Nth layer attends globally, the others within sliding_window (Gemma-3: 6,
    # five local layers to one global); null: the family's (6).
    sliding_window_pattern: Optional[int] = None
    # gemma3_text: the RoPE base of the sliding-window layers (config.json's rope_local_base_freq;
    # rope_theta and rope_scaling are the global layers'); null: rope_theta.
    rope_local_theta: Optional[float] = None
    # RoPE scaling, as transformers' rope_parameters take it besides rope_theta (Llama-3.1: rope_type
    # llama3, factor, low_freq_factor, high_freq_factor, original_max_position_embeddings); null: none.
    # Typed Any: OmegaConf cannot merge a command-line mapping into a null Optional[dict] node.
    rope_scaling: Optional[Any] = None
    initializer_range: float = 0.02
    # The published model a preset has the shape of, and its tokenizer's size: trained with another
    # tokenizer the plan notes that it is not that model (tinytrain/plan/published.py). null: none.
    published: Optional[str] = None
    published_vocab: Optional[int] = None
    attention: Attention = Attention.auto
    # Rows of the embedding and lm_head are padded to a multiple of vocab_multiple x parallel.tp.
    vocab_multiple: int = 64
    # null: derived from len(tokenizer); set it by hand only to pin a larger, already-padded size.
    vocab_size: Optional[int] = None
    # A Hugging Face model to fine-tune: a local folder, or a hub id (loaded through the hub cache,
    # downloaded there when the hub is reachable); null trains from scratch.
    pretrained: Optional[str] = None
    # Let transformers import a model folder's own .py files (auto_map in its config.json): passed to
    # every transformers load. false: such a folder is refused in the plan, and nothing ever prompts.
    trust_remote_code: bool = False
    # Special/added/template tokens whose embedding rows look untrained (the Yi-6B case).
    untrained_tokens: UntrainedPolicy = UntrainedPolicy.auto
    # model.pretrained's folder ships a tokenizer other than tokenizer.path's (its token -> id map
    # differs): refuse stops the plan; allow trains anyway with every embedding row re-initialised
    # like an added token's (model.untrained_tokens=noisy_mean adds noise), since row i is another token's.
    tokenizer_change: TokenizerChange = TokenizerChange.refuse


@dataclass
class TokenizerConfig:
    name: str = "bundled"
    # A tokenizer folder (tokenizer.json / tokenizer.model), a tokenizer.model file, or a hub id.
    path: str = "${tt.asset:bundled_tokenizer}"
    add_special_tokens: list[str] = field(default_factory=list)
    # BOS before every document and SFT sample, and in the export's tokenizer and chat template.
    # null: the family's convention (on for Llama-2 SentencePiece models and tokenizers that add BOS
    # themselves); the plan says which and why. data.prepend_bos=true also turns it on.
    add_bos: Optional[bool] = None


@dataclass
class MixtureSource:
    """One source of a weighted mixture (data.sources): its own token store (or SFT samples),
    drawn from with probability weight / (sum of the weights)."""

    path: Optional[str] = None
    weight: Optional[float] = None  # required; relative (normalised by the sum)
    source: Optional[DataSource] = None  # null: data.source
    text_field: Optional[str] = None  # null: data.text_field
    name: Optional[str] = None  # in the plan, logs and checkpoints; null: the file name without suffix


@dataclass
class DataStage:
    """One stage of a mixture's schedule (data.stages): the weights its steps draw by."""

    until_step: Optional[int] = None  # its steps end before this one (the next stage's first); null: the run's end
    weights: dict[str, float] = field(default_factory=dict)  # source name -> weight (relative); a source not named draws nothing in it


@dataclass
class DataConfig:
    name: str = "pydoc"
    source: DataSource = DataSource.pydoc
    format: DataFormat = DataFormat.text
    # A file or folder (text/jsonl/parquet), or a dataset folder or hub name (hf).
    path: Optional[str] = None
    # A weighted mixture instead of data.path: [{path: ..., weight: 0.7}, ...] (see MixtureSource);
    # each source is split by val_fraction. exhaustion: what a source that runs out does.
    sources: list[MixtureSource] = field(default_factory=list)
    # Mixture weights that change at named steps, in order: [{until_step: 800, weights: {web: 1}},
    # {until_step: null, weights: {web: 0.7, code: 0.3}}]; steps after the last stage draw by
    # data.sources' own weights. [] (default): those weights for the whole run.
    stages: list[DataStage] = field(default_factory=list)
    exhaustion: Exhaustion = Exhaustion.repeat
    # Validation from a separate source of the same kind; null splits val_fraction of the documents off.
    val_path: Optional[str] = None
    val_fraction: float = 0.05
    seq_len: int = 256
    # DataLoader worker processes (0: load batches in the training process).
    num_workers: int = 0
    # Reading sources.
    text_split: TextSplit = TextSplit.blank_lines  # text files: documents per file or per blank-line block
    text_field: str = "text"  # jsonl / parquet / hf column holding each document (format=text)
    hf_split: str = "train"  # split of a Hugging Face dataset dictionary
    bad_records: BadRecordPolicy = BadRecordPolicy.error
    # Pretraining token store (format=text).
    cache_dir: str = ".cache/tinytrain"  # relative to the working directory; stores go in <cache_dir>/stores/
    store: Optional[str] = None  # a store folder built by mode=prepare; used instead of building one
    tokenize_workers: Optional[int] = None  # processes tokenizing; null: one per CPU core; 0: this process
    # A large source's shards (sorted by path) split into this many parts, each tokenized on its own
    # (in parallel, or one per Slurm array task) and opened together as one store (data/parts.py).
    prepare_parts: int = 1
    prepare_part: Optional[int] = None  # mode=prepare: build only this part (0-based), e.g. a Slurm array task
    append_eos: bool = True  # after every document
    prepend_bos: bool = False  # before every document, and before every SFT sample
    # Packing: per-document position ids isolate documents (the varlen path on flash-attn).
    cross_document_attention: bool = False
    predict_across_documents: bool = False  # false: no label targets the next document's first token
    # Supervised fine-tuning (format=instruction or chat).
    chat_template: ChatTemplate = ChatTemplate.chatml
    train_on: TrainOn = TrainOn.assistant
    too_long: TooLongPolicy = TooLongPolicy.truncate  # samples longer than seq_len
    pack: bool = False  # pack samples into seq_len rows (documents isolated); pretraining always packs
    group_by_length: bool = True  # batches of similar length (less padding) when not packing
    pad_to_multiple_of: int = 8


@dataclass
class LossScaleConfig:
    initial_scale_power: int = 16
    window: int = 1000
    hysteresis: int = 2
    min_scale: float = 1.0


@dataclass
class PrecisionConfig:
    request: PrecisionRequest = PrecisionRequest.auto
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    # Float8 matmuls in the decoder blocks' linear layers through torchao (tinytrain/plan/fp8.py):
    # false | true | auto (where the GPU has them and the model is wide enough to gain). Any: a
    # boolean or the word auto. fp8_emulate: torchao's emulation on any device (tests only).
    fp8: Any = False
    fp8_emulate: bool = False
    # Derived on the machine that trains (or for hardware.gpu in mode=plan); null here, filled in
    # config_resolved.yaml from the plan.
    value: Optional[str] = None


@dataclass
class ParallelConfig:
    name: str = "single"
    strategy: Strategy = Strategy.single
    tp: int = 1
    # fsdp_tp: data-parallel (FSDP) size; null means world_size / tp.
    dp: Optional[int] = None
    # Context parallelism: every micro batch's sequence split over cp ranks (dp = world / (tp x cp)),
    # and how (plan/context.py: auto picks per strategy and heads). null: the plan picks the
    # smallest cp whose activations fit the GPU (1 without a GPU to size against).
    cp: Optional[int] = 1
    cp_kind: ContextParallelKind = ContextParallelKind.auto
    # deepspeed: ZeRO stage and offload to CPU memory.
    zero_stage: int = 0
    offload_optimizer: bool = False
    offload_params: bool = False
    # deepspeed: keys added to / replacing the generated DeepSpeed config (nested dicts merge).
    deepspeed_overrides: dict[str, Any] = field(default_factory=dict)
    # deepspeed on a machine without CUDA, for tests only: DeepSpeed's CPU accelerator over gloo
    # through the same strategy code a GPU run uses (slow; proves nothing about NCCL or memory).
    deepspeed_on_cpu: bool = False


@dataclass
class FinetuneConfig:
    """finetune=full|lora|qlora. LoRA/QLoRA adapt model.pretrained (or checkpoint.init_from) through peft."""

    name: str = "full"
    method: FinetuneMethod = FinetuneMethod.full
    rank: int = 16
    alpha: float = 32.0  # the adapter's update is scaled by alpha / rank
    dropout: float = 0.05
    # Linear layers (by module name) that get adapters; null: every attention and MLP projection of
    # the model family's block (Phi-3's fused qkv_proj and gate_up_proj; plan/families.py).
    target_modules: Optional[list[str]] = None
    trainable_tokens: TrainableTokens = TrainableTokens.auto
    # What the run optimizes. dpo|ipo|simpo train on preference pairs (data.format=preference); dpo and
    # ipo compare the policy with a reference: the base with adapters disabled under lora/qlora, a
    # frozen copy under full fine-tuning, or log-probs computed once before training (precompute_reference).
    objective: Objective = Objective.sft
    beta: float = 0.1  # dpo/simpo: scale of the reward margin; ipo: the regularisation tau (margin target 1/(2 beta))
    label_smoothing: float = 0.0  # dpo: share of pairs assumed mislabelled (conservative DPO), in [0, 0.5)
    simpo_gamma: float = 0.5  # simpo: the target reward margin (TRL's simpo_gamma)
    desirable_weight: float = 1.0  # kto: weight of a desirable example's loss (TRL's desirable_weight)
    undesirable_weight: float = 1.0  # kto: weight of an undesirable one's
    # Reference log-probs of every pair computed once before training and cached under data.cache_dir
    # (keyed by data and model, so a run with another beta reuses them): no reference model while training.
    precompute_reference: bool = False


@dataclass
class PreflightConfig:
    """Each preflight check's severity: error stops the run, warn reports, off skips."""

    vocab: CheckLevel = CheckLevel.error  # model.vocab_size below len(tokenizer); warn: use the derived size
    special_tokens: CheckLevel = CheckLevel.error  # every special-token id inside the embedding
    pretrained_vocab: CheckLevel = CheckLevel.error  # pretrained config vocab vs its weight shapes
    positions: CheckLevel = CheckLevel.error  # seq_len vs a pretrained model's max positions / RoPE
    data_vocab: CheckLevel = CheckLevel.error  # largest token id in the data vs len(tokenizer)
    untrained_embeddings: CheckLevel = CheckLevel.warn  # see model.untrained_tokens for the fix
    precision_risk: CheckLevel = CheckLevel.error  # fp16 with untrained rows; fp16 on fragile models
    memory: CheckLevel = CheckLevel.error  # the plan's per-GPU memory estimate above the GPU's memory


@dataclass
class GuardConfig:
    """Runtime guards (tinytrain/train/callbacks/*_guard.py)."""

    nonfinite: NonFinitePolicy = NonFinitePolicy.skip
    max_consecutive_skips: int = 3
    # fp16: stop when the loss scale halves this many steps in a row, or falls below
    # precision.loss_scale.min_scale.
    loss_scale_halvings: int = 8
    # grad-norm spike events: norm above factor x running average, after warmup steps.
    grad_spike_factor: float = 5.0
    grad_spike_warmup: int = 20


@dataclass
class CheckpointConfig:
    # A tinytrain .ckpt whose weights start this run; it may have been saved with any tp.
    init_from: Optional[str] = None
    # Accept a checkpoint trained with another tokenizer: rows are kept by id, new rows get the
    # mean of the old ones and are listed in the log.
    allow_tokenizer_change: bool = False
    # Step checkpoints (checkpoints/step<N>.ckpt, every trainer.checkpoint_every_n_steps) kept; older ones are deleted.
    keep_last: int = 3
    # parallel=fsdp_tp: write the step checkpoints' shards in the background while training goes
    # on (torch.distributed.checkpoint's async save); the next save waits for the previous one.
    async_save: bool = False
    # The plan's save-time estimate: write bandwidth to run.root's filesystem (GB/s, all ranks
    # together), and the share of the time between saves a synchronous save may take before the
    # plan warns.
    write_gbps: float = 2.0
    max_save_share: float = 0.1
    # mode=export|generate|eval: a checkpoint (step<N>.ckpt, final.ckpt, a DeepSpeed folder), `final` or
    # `last` (of the run in hydra.run.dir), or an exported Hugging Face folder (generate, eval).
    # `checkpoint=<path>` on the command line is short for checkpoint.path=<path>.
    path: Optional[str] = None
    # mode=average: the checkpoints whose mean weights it writes (`checkpoints=[a,b,...]` is short
    # for checkpoint.average=[...]), or the newest average_last step checkpoints of the run; a
    # training run with average_last also writes that average (and its export) when it ends.
    average: list[str] = field(default_factory=list)
    average_last: Optional[int] = None


@dataclass
class ExportConfig:
    # null: <the checkpoint's run>/hf_export (final) or hf_export-<checkpoint name> (others)
    dir: Optional[str] = None
    dtype: ExportDtype = ExportDtype.auto


@dataclass
class GenerateConfig:
    prompts: list[str] = field(default_factory=list)
    prompts_file: Optional[str] = None  # one prompt per line, or JSON Lines with a "prompt" field
    max_new_tokens: int = 64
    do_sample: bool = False  # false: greedy
    temperature: float = 0.8
    top_p: float = 0.95
    # null: through the run's chat template when it was a fine-tune (data.format instruction|chat)
    chat: Optional[bool] = None
    # Sample generations at every validation step -> samples.jsonl (and a wandb table); [] turns them off.
    sample_prompts: list[str] = field(default_factory=lambda: ["The meaning of", "def main("])
    sample_max_new_tokens: int = 32


@dataclass
class EvalConfig:
    # Held-out batches to average; null: the run's own validation batches (its micro batch and
    # trainer.val_batches, so the checkpoint's val_loss is reproduced), or all of a data config named
    # on the command line.
    batches: Optional[int] = None
    # Downstream tasks (docs/evaluation.md): lm-evaluation-harness task, group or tag names, scored while
    # training and by mode=eval; empty: none.
    tasks: list[str] = field(default_factory=list)
    # Folders of local lm-eval task YAMLs (offline tasks), searched before lm-eval's own.
    include: list[str] = field(default_factory=list)
    # When training scores them: checkpoints (every step checkpoint and the final weights) | end (the final weights).
    at: EvalAt = EvalAt.checkpoints
    # Score every N optimizer steps (and the final weights) instead of at checkpoints; null: eval.at decides.
    every_n_steps: Optional[int] = None
    # inline (on the training ranks, at the step) | slurm (a one-GPU Slurm job per checkpoint, submitted by rank 0).
    where: EvalWhere = EvalWhere.inline
    # Documents per task (lm-eval's limit); null: all of them.
    limit: Optional[int] = None
    # mode=eval on a run folder: score this step's checkpoint only (what each eval.where=slurm job runs); null: every one not yet scored.
    step: Optional[int] = None
    # Renamed (eval.tasks, eval.include, eval.limit): set, they stop the run with the new key's name.
    lm_eval_tasks: list[str] = field(default_factory=list)
    lm_eval_include: Optional[str] = None
    lm_eval_limit: Optional[int] = None


@dataclass
class BatchSizeWarmupConfig:
    # The global batch grows from `start` sequences to the trainer's over `tokens` tokens
    # (tinytrain/data/batch_ramp.py); null start: no warm-up. start must be a multiple of
    # data_parallel x accumulate_grad_batches (the ramp grows each micro batch by one sample).
    start: Optional[int] = None
    tokens: int = 0


@dataclass
class TrainerConfig:
    max_steps: int = 250
    # Sequences per device per forward, or auto: the largest that fits the GPU (plan/micro_batch.py),
    # with the global batch kept by the accumulation (so trainer.global_batch_size must be set).
    micro_batch_size: Any = 8
    # Set one of these or neither (accumulation 1); both set must agree with the world size.
    global_batch_size: Optional[int] = None
    accumulate_grad_batches: Optional[int] = None
    batch_size_warmup: BatchSizeWarmupConfig = field(default_factory=BatchSizeWarmupConfig)
    lr: float = 3e-3
    min_lr_ratio: float = 0.1  # the rate a decay ends at, as a fraction of trainer.lr
    warmup_steps: int = 25
    # The schedule (tinytrain/plan/schedule.py): cosine | linear | constant | wsd. wsd decays over
    # the last decay_steps steps (null: decay_fraction x max_steps) in decay_shape.
    lr_schedule: LrSchedule = LrSchedule.cosine
    decay_fraction: float = 0.2
    decay_steps: Optional[int] = None
    decay_shape: DecayShape = DecayShape.one_minus_sqrt
    # The stage this run trains, in metrics.csv's `stage` column and in its checkpoints. A run
    # continued from a step checkpoint (resume=<it>) under a new name, with a new schedule and
    # data, is a new stage of the same run (an anneal branched off the stable phase); its
    # optimizer state carries on.
    stage: str = "main"
    # adamw | muon (tinytrain/model/optimizers.py). Muon's rate is adjusted per matrix to
    # 0.2 x sqrt(max(rows, cols)) x trainer.lr (Moonshot's "match_rms_adamw"), so AdamW's trainer.lr
    # and weight_decay carry over; muon_momentum is its Nesterov momentum.
    optimizer: OptimizerName = OptimizerName.adamw
    muon_momentum: float = 0.95
    weight_decay: float = 0.1
    betas: list[float] = field(default_factory=lambda: [0.9, 0.95])
    eps: float = 1e-8
    grad_clip: float = 1.0
    log_every_n_steps: int = 10
    val_every_n_steps: int = 100
    val_batches: int = 8
    checkpoint_every_n_steps: int = 100
    progress_bar: bool = True
    # Fast paths (tinytrain/plan/fast_paths.py): torch.compile none|blocks|model (CompileMode) with
    # this backend (inductor; aot_eager traces without generating code); activation checkpointing
    # none|full|selective|auto (Checkpointing). Both take a string or the old boolean, so their type
    # is Any here and plan/levers.py reads them. Then cross-entropy from hidden states in chunks of
    # this many tokens (null: on for vocabularies >= 65536, 0: off); liger-kernel's fused kernels and
    # loss (null: on a CUDA GPU where installed, the `gpu` extra; true: required; false: off).
    compile: Any = "none"
    compile_backend: str = "inductor"
    activation_checkpointing: Any = "none"
    loss_chunk_tokens: Optional[int] = None
    liger: Optional[bool] = None
    # A torch profiler trace of profile_steps optimizer steps from this process's step
    # profile_start, and on a CUDA out-of-memory error the allocator's snapshot beside the plan's
    # estimate, in <run dir>/profile/ (tinytrain/train/callbacks/profiler.py).
    profile: bool = False
    profile_start: int = 3
    profile_steps: int = 3
    export: bool = True
    plot: bool = True


@dataclass
class LoggerConfig:
    # The option chosen (the last one of a list such as logger=[wandb,tensorboard]); metrics.csv in
    # the run directory is always written, and the loss curve reads it.
    name: str = "csv"
    # Weights & Biases (logger=wandb); WANDB_MODE=offline works with no key or network.
    wandb: bool = False
    wandb_project: str = "tinytrain"
    wandb_entity: Optional[str] = None
    wandb_group: Optional[str] = None  # null: none; in a multirun, run.name (the sweep's)
    wandb_tags: list[str] = field(default_factory=list)
    wandb_name: Optional[str] = None  # null: run.name; in a multirun, run.name/<job number>
    # TensorBoard event files in <run dir>/tensorboard/ (logger=tensorboard; combine: logger=[wandb,tensorboard]).
    tensorboard: bool = False


@dataclass
class ClusterConfig:
    name: str = "local"
    nodes: int = 1
    # Processes per node; null means every visible GPU, or 1 on a CPU machine.
    devices: Optional[int] = None
    # Slurm job settings that mode=sbatch writes into job.sbatch (cluster=slurm).
    partition: Optional[str] = None
    account: Optional[str] = None
    time: str = "24:00:00"  # --time, within the partition's limit
    cpus_per_task: Optional[int] = None
    # --signal=USR1@N: tinytrain checkpoints and requeues the job this long before the time limit.
    signal_delay_s: int = 300
    # Hang watchdog (cluster/watchdog.py): a separate process per rank stops the run with hang_report.txt
    # (exit 76) when no rank makes progress for this long during training steps.
    watchdog: bool = True  # false: no heartbeats, no watchdog process, the backend's own timeout only
    hang_timeout_s: int = 300
    # The limit before the first training step: data build, op builds, rendezvous, model build.
    startup_timeout_s: int = 1800
    # The limit while any rank saves a checkpoint, validates, or runs its first step (compile, warm-up).
    slow_phase_timeout_s: int = 1800
    # Stragglers (cluster/stragglers.py): every this many steps the ranks' forward times are compared
    # (one all_gather of a number); a rank slower than the others' median by more than the threshold
    # (0.2: 20%) in 2 checks running is named in the log, the metrics and the summary.
    straggler_every_n_steps: int = 50
    straggler_threshold: float = 0.2
    # Health check before training (cluster/health.py): auto (on for GPU runs of 2+ ranks), true, false;
    # mode=health runs it alone. A matmul, a memory allocation and an all-reduce per rank.
    health_check: str = "auto"
    on_bad_node: BadNode = BadNode.stop  # stop (exit 3 naming the nodes), warn, exclude (Slurm: requeue without them)
    health_budget_s: int = 60  # the whole check's time


@dataclass
class HardwareConfig:
    # Plan for this GPU instead of the local one (e.g. V100, A800); see hardware.py for names.
    gpu: Optional[str] = None


@dataclass
class RunConfig:
    # slurm-<job id> under Slurm (stable across requeues, the same for every task), else the start time.
    name: str = "${tt.run_name:}"
    root: str = "runs"


@dataclass
class Config:
    mode: Mode = Mode.train
    seed: int = 1234
    # auto: continue from the newest complete checkpoint of the run directory (none: start fresh);
    # never: start fresh (refused where checkpoints exist); or a checkpoint file to continue from.
    resume: str = "auto"
    model: ModelConfig = field(default_factory=ModelConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    finetune: FinetuneConfig = field(default_factory=FinetuneConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    hardware: HardwareConfig = field(default_factory=HardwareConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    preflight: PreflightConfig = field(default_factory=PreflightConfig)
    guard: GuardConfig = field(default_factory=GuardConfig)
    export: ExportConfig = field(default_factory=ExportConfig)
    generate: GenerateConfig = field(default_factory=GenerateConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    run: RunConfig = field(default_factory=RunConfig)


def register_schemas() -> None:
    """The top-level schema is the first default of tinytrain/conf/config.yaml: every group merges into it.
    Stored once per process: building the node from the dataclasses takes ~0.05 s, an eighth of an
    in-process `mode=plan`, and Hydra hands every composition a deep copy of it."""
    store = ConfigStore.instance()
    if "config_schema.yaml" not in store.repo:
        store.store(name="config_schema", node=Config)
