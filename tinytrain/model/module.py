"""The LightningModule: a Hugging Face causal LM, a loss over the true vocab, AdamW + schedule."""

from __future__ import annotations

import lightning.pytorch as pl
import torch
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from tinytrain.checkpoint.format import MODULE_PREFIX as checkpoint_prefix
from tinytrain.checkpoint.format import name_optimizer_state, repad_optimizer_state, repad_vocab, unpad_vocab, vocab_param_names
from tinytrain.checkpoint.sharded import holds_shards
from tinytrain.model import optimizers
from tinytrain.model.chunked_loss import chunked_lm_loss
from tinytrain.model.grad_norm import clip_grad_norm
from tinytrain.model.guard_report import deepspeed_engine, grad_scaler
from tinytrain.model.lora import quantized_prefixes
from tinytrain.model.module_spec import ModuleSpec
from tinytrain.model.optimizers import adamw_groups, optimizer_groups
from tinytrain.model.packed_attention import flatten_for_flash, takes_boundaries
from tinytrain.model.preference_loss import KTO_METRICS, data_parallel_sum, full_sequence_nll, kto_loss, preference_loss, sequence_logps
from tinytrain.model.step_means import StepMeans
from tinytrain.model.tensor_parallel import in_root_forward, parallelize
from tinytrain.model.token_sums import token_sum

# Batch keys handed to the model; data/collate.py and data/packing.py produce them.
MODEL_INPUTS = ("input_ids", "attention_mask", "position_ids", "cu_seq_lens", "max_length")


def causal_lm_loss(logits: torch.Tensor, labels: torch.Tensor, true_vocab: int) -> torch.Tensor:
    """Mean cross-entropy over labelled tokens (labels pre-shifted, -100 ignored). Padded vocab
    rows (ids >= true_vocab) are sliced off, so they can never take probability mass."""
    logits = logits[..., :true_vocab]
    return F.cross_entropy(logits.reshape(-1, true_vocab).float(), labels.reshape(-1), ignore_index=-100)


def param_groups(model: torch.nn.Module, weight_decay: float, vocab_tables_decay: bool = True) -> list[dict]:
    """AdamW's groups (model/optimizers.py): no weight decay on norms, biases and embeddings."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return [g for g in adamw_groups(model, trainable, weight_decay, vocab_tables_decay) if g["params"]]


def labelled_tokens(batch: dict) -> torch.Tensor:
    """The tokens a batch's loss averages over (labels not -100), at least 1 for a weight. Kept on
    the device: Lightning accumulates a logged mean's weights there, and reading the count back
    would make the host wait for each validation batch before queueing the next."""
    return (batch["labels"] != -100).sum().clamp(min=1)


def writes_metrics_row(trainer) -> bool:
    """Whether Lightning hands this step's logged values to the loggers (every log_every_n_steps-th
    step): a value only the loggers read is logged on those steps alone. Each `self.log` costs
    0.3-1 ms of Lightning's bookkeeping (it deep-copies the value's metadata), most of a small
    model's fixed per-step cost (benchmarks/step_overhead.py --seq-len 32). Lightning's own test,
    asked at the same point of the step."""
    # The last step's row is written too (its validation, callbacks/final_validation.py), on the
    # interval or not: its values must be its own, not the last logged step's.
    if trainer._logger_connector.should_update_logs:
        return True
    # Lightning's count of the steps taken, constant within a step (global_step moves at its optimizer step).
    return trainer.fit_loop.epoch_loop._batches_that_stepped + 1 >= trainer.max_steps > 0


def shows_step_loss(trainer) -> bool:
    """Whether this step's loss is read after it: its metrics row, a progress bar (on a terminal it
    shows the loss every step) or the last step's progress line. Otherwise it is only kept
    (`step_values`), as a guard that stops the run off the logging interval writes it."""
    return writes_metrics_row(trainer) or trainer.progress_bar_callback is not None or trainer.global_step + 1 >= trainer.max_steps


def rank_token_mean(loss, module):
    """A loss summed over the step's token share (fine-tuning, train/callbacks/step_tokens.py) as
    this rank's token mean, what the loggers and the end-of-run summary show; other losses as they are."""
    share = getattr(module, "loss_share", None)
    return loss if share is None else loss * (share / module.own_loss_share)


def rows(batch: dict) -> int:
    """The sequences in a batch (what `self.log` weighs a mean by)."""
    return int(batch["input_ids"].shape[0])


class CausalLMModule(pl.LightningModule):
    """A run builds it with `for_plan`: what it needs of the plan is a ModuleSpec (module_spec.py);
    tests and benchmarks give a ModuleSpec of the pieces they need. Under ModelParallelStrategy
    `parallelize(model, device_mesh)` shards the model (tinytrain/model/tensor_parallel.py).

    `objective` (finetune.objective=dpo|ipo|simpo) trains on preference batches; `reference` is the
    frozen copy full fine-tuning compares with (tinytrain/model/reference.py), placed at fit start
    (`deepspeed_config`: in an engine of its own). Without one, DPO/IPO read the reference's
    log-probs from the batch (precomputed) or disable the adapters (LoRA)."""

    def __init__(self, model: torch.nn.Module, spec: ModuleSpec, reference=None):
        super().__init__()
        self.model = model
        self.spec = spec
        self.true_vocab = spec.true_vocab
        self.checkpoint_metadata = spec.checkpoint_metadata
        self.parallelize = parallelize if spec.tensor_parallel else None
        self.clip_in_module = spec.clip_in_module
        self.cpu_adam = spec.cpu_adam
        self.fused_adamw = spec.fused_adamw
        self.loss_chunk_tokens = spec.loss_chunk_tokens
        self.liger_loss = spec.liger_loss
        self.schedule = spec.schedule
        self.adapters = spec.adapters  # finetune=lora|qlora: a frozen base (tinytrain/model/lora.py)
        self.quantized_prefixes = quantized_prefixes(model) if spec.adapters else []
        self.strict_loading = not self.quantized_prefixes  # a QLoRA checkpoint holds all but the 4-bit base
        self.vocab_names = [checkpoint_prefix + n for n in vocab_param_names(model)]
        # The pre-clip norm the non-finite guard measured this step (remember_grad_norm), so
        # clipping needs no second pass over the gradients; used once.
        self.measured_grad_norm: torch.Tensor | None = None
        self.engine_steps_read: int | None = None  # DeepSpeed's step count when its norm was last read
        self.step_skipped = False  # GradScaler skipped this step (fp16 overflow): the schedule waits
        # Fine-tuning rows: the step's trained tokens per micro batch, over every rank (StepTokens).
        self.loss_share: float | None = None
        self.own_loss_share = 1.0  # this rank's trained tokens per micro batch of the step (StepTokens)
        # This step's loss and pre-clip gradient norm, logged only on the steps that read them
        # (shows_step_loss, writes_metrics_row); the spike monitor and a guard's row read them here.
        self.step_values: dict[str, torch.Tensor | float] = {}
        # The step's loss and preference metrics: means over its micro batches (model/step_means.py).
        # KTO's metrics are named from the start: a step without one side logs NaN for it, in a fresh
        # process and in a resumed one alike (a name first seen later left the cell empty before).
        kto = spec.objective is not None and spec.objective.name == "kto"
        self.step_losses, self.step_metrics = StepMeans(), StepMeans(KTO_METRICS if kto else ())
        self.objective = spec.objective
        self.reference = reference
        self.deepspeed_config = spec.deepspeed_config
        # parallel.cp > 1: this rank's place in its cp group (Ulysses' or ring's), set at setup
        # (train/callbacks/context_parallel.py); batches are split by it.
        self.context = None

    @classmethod
    def for_plan(cls, model: torch.nn.Module, trainer_cfg, plan, reference=None) -> CausalLMModule:
        return cls(model, ModuleSpec.for_plan(plan, trainer_cfg), reference)

    def remember_grad_norm(self, total: torch.Tensor) -> None:
        self.measured_grad_norm = total

    def configure_model(self):
        if self.parallelize is not None and not getattr(self, "_parallelized", False):
            self.parallelize(self.model, self.device_mesh)
            if self.reference is not None:
                self.reference.shard(self.parallelize, self.device_mesh, self.trainer.strategy.root_device)
            self._parallelized = True

    def on_fit_start(self) -> None:
        if self.reference is not None and self.parallelize is None:
            self.reference.place(self.trainer, self.deepspeed_config)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None, position_ids: torch.Tensor | None = None, cu_seq_lens: torch.Tensor | None = None, max_length: int | None = None) -> torch.Tensor:
        logits = self.model(**self.model_kwargs(input_ids, attention_mask, position_ids, cu_seq_lens, max_length)).logits
        return logits.view(*input_ids.shape, -1) if logits.shape[0] != input_ids.shape[0] else logits

    def model_kwargs(self, input_ids, attention_mask=None, position_ids=None, cu_seq_lens=None, max_length=None) -> dict:
        if self.context is not None:
            # The cp group's kind says what a shard's forward takes (Ulysses: the position ids and
            # the whole rows' document boundaries; ring: its block mask as well).
            return self.context.model_kwargs(input_ids, attention_mask, position_ids, cu_seq_lens=cu_seq_lens, max_length=max_length)
        # position_ids restarting per document isolate packed documents; with use_cache on (or an
        # attention_mask alongside), transformers would let them attend to each other. On
        # a varlen kernel (torch's or flash-attn's) the rows go in as one flattened row with the
        # boundaries (packed_attention.py).
        if position_ids is not None and attention_mask is None and takes_boundaries(self.model):
            return {**flatten_for_flash(input_ids, position_ids, cu_seq_lens, max_length), "use_cache": False}
        return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids, "use_cache": False}

    def batch_loss(self, batch: dict) -> torch.Tensor:
        inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
        if self.loss_chunk_tokens or self.liger_loss:
            # FSDP2 gathers the root's weights (the embedding, final norm and lm_head) only in a forward.
            return in_root_forward(self.model, self.loss_from_hidden, inputs, batch["labels"])
        return causal_lm_loss(self(**inputs), batch["labels"], self.true_vocab)

    def loss_from_hidden(self, inputs: dict, labels: torch.Tensor) -> torch.Tensor:
        """liger's fused kernel, or the logits a chunk of tokens at a time."""
        hidden = self.model.base_model(**self.model_kwargs(**inputs)).last_hidden_state
        hidden = hidden.view(*inputs["input_ids"].shape, -1)  # back to rows if flattened for a varlen kernel
        head = self.model.get_output_embeddings()
        if self.liger_loss:
            from tinytrain.model.liger import fused_linear_cross_entropy

            return fused_linear_cross_entropy(hidden, head.weight, labels, self.true_vocab)
        # A vocab-sharded head (tensor parallelism) gathers each chunk's logits through its own style.
        vocab_sharded = isinstance(head.weight, DTensor)
        return chunked_lm_loss(hidden, head if vocab_sharded else head.weight, labels, true_vocab=self.true_vocab, chunk_tokens=self.loss_chunk_tokens)

    def token_loss(self, batch: dict, share: float | None = None) -> torch.Tensor:
        """The mean token loss of a batch; under context parallelism this rank's slice of it, the
        mean taken over the whole sequence across the cp group. `share`: divide the batch's sum
        over tokens by this instead of by its own tokens (the step's trained tokens per micro
        batch, train/callbacks/step_tokens.py), so a step's micro batches average to its token mean."""
        if self.context is None:
            mean = self.batch_loss(batch)
            return mean if share is None else token_sum(mean, batch["labels"]) / share
        local = self.context.shard(batch)
        return self.context.mean_loss(self.batch_loss(local), local["labels"], share)

    # -- preference objectives (dpo, ipo, simpo) ---------------------------------------------------

    def sequence_logps(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
        return sequence_logps(self(**inputs), batch["labels"], self.true_vocab)

    def logps_and_nll(self, batch: dict) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """ORPO's one forward: the rows' log-prob sums, their answer lengths and the chosen rows' NLL."""
        inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
        logits = self(**inputs)
        chosen = batch["input_ids"].shape[0] // 2
        mask = batch["attention_mask"] if "attention_mask" in batch else torch.ones_like(batch["input_ids"])
        nll = full_sequence_nll(logits[:chosen], batch["input_ids"][:chosen], mask[:chosen], self.true_vocab)
        return (*sequence_logps(logits, batch["labels"], self.true_vocab), nll)

    @torch.no_grad()
    def reference_logps(self, batch: dict) -> torch.Tensor:
        """The reference's log-prob sums of the batch's rows: from the batch when precomputed, else
        the frozen copy's, else the policy's with its adapters disabled (LoRA)."""
        if "ref_logps" in batch:
            return batch["ref_logps"]
        if self.reference is not None:
            inputs = {k: batch[k] for k in MODEL_INPUTS if k in batch}
            logits = self.reference(**self.model_kwargs(**inputs)).logits
            logits = logits.view(*batch["input_ids"].shape, -1) if logits.shape[0] != batch["input_ids"].shape[0] else logits
            return sequence_logps(logits, batch["labels"], self.true_vocab)[0]
        if not self.adapters:
            raise RuntimeError("a preference objective with a reference, but no reference model, adapters or precomputed log-probs")
        from tinytrain.model.reference import adapters_disabled

        with adapters_disabled(self.model):
            return self.sequence_logps(batch)[0]

    def kto_step(self, batch: dict) -> tuple[torch.Tensor, dict]:
        """The B examples with gradients, their B KL rows (data/unpaired.py) without; the
        reference scores both; the KL estimate and the metrics are summed over the ranks."""
        b = batch["kto_labels"].shape[0]
        rows = {k: v for k, v in batch.items() if torch.is_tensor(v) and v.dim() and v.shape[0] == 2 * b}
        main, kl = {k: v[:b] for k, v in rows.items()}, {k: v[b:] for k, v in rows.items()}
        logps = self.sequence_logps(main)[0]
        with torch.no_grad():
            kl_logps = self.sequence_logps(kl)[0]
        o = self.objective
        return kto_loss(o.beta, o.desirable_weight, o.undesirable_weight, logps, self.reference_logps(main), kl_logps, self.reference_logps(kl), batch["kto_labels"].bool(), reduce=data_parallel_sum)

    def preference_step(self, batch: dict) -> tuple[torch.Tensor, dict]:
        if self.objective.name == "kto":
            return self.kto_step(batch)
        if self.objective.name == "orpo":
            logps, counts, nll = self.logps_and_nll(batch)
            return preference_loss(self.objective, logps, counts, None, nll)
        logps, counts = self.sequence_logps(batch)
        ref = self.reference_logps(batch) if self.objective.needs_reference else None
        return preference_loss(self.objective, logps, counts, ref)

    def training_step(self, batch, batch_idx):
        row = writes_metrics_row(self.trainer)
        step = self.trainer.global_step
        if self.objective is None:
            loss = self.token_loss(batch, self.loss_share)
        else:
            loss, metrics = self.preference_step(batch)
            means = self.step_metrics.add(step, metrics)
            if row:  # averaged over the data-parallel ranks, as TRL gathers them (a collective each)
                self.log_dict({k: v.float() if torch.is_tensor(v) else v for k, v in means.items()}, sync_dist=True, batch_size=rows(batch))
        step_loss = self.step_losses.add(step, {"loss": loss})["loss"]
        step_loss = rank_token_mean(step_loss, self)
        self.step_values = {"loss": step_loss}
        if shows_step_loss(self.trainer):
            self.log("loss", step_loss, prog_bar=True, batch_size=rows(batch))
        if row:
            self.log("lr", self.lr_schedulers().get_last_lr()[0], batch_size=rows(batch))
        return loss

    def record_grad_norm(self, norm: torch.Tensor | float) -> None:
        """This step's pre-clip gradient norm: the spike monitor reads it every step, the loggers on
        their rows."""
        self.step_values["grad_norm"] = norm
        if writes_metrics_row(self.trainer):
            self.log("grad_norm", norm)

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        scaler = grad_scaler(self.trainer)
        scale = scaler.get_scale() if scaler is not None else None
        super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        # GradScaler skips a step whose fp16 gradients overflowed and lowers its scale (only then).
        self.step_skipped = scaler is not None and scaler.get_scale() < scale
        if self.clip_in_module:
            # Lightning zeroes the gradients inside the next step's closure, after its forward: they
            # would sit beside that forward's activations, 4 B a parameter at its end. Freed now.
            optimizer.zero_grad(set_to_none=True)
            return
        # DeepSpeed clips inside its engine; report the norm it measured (pre-clip). Logged here
        # and not in on_train_batch_end: a step's metrics row is written before its checkpoint, in
        # a callback's on_train_batch_end (metrics_csv.py), which runs before the module's.
        # Lightning calls this with every micro batch there (the engine accumulates): the norm is
        # read only after a step the engine took, a read after every micro batch would make the
        # host wait for each one's backward.
        engine = deepspeed_engine(self.trainer)
        if engine is None or engine.global_steps == self.engine_steps_read:
            return
        self.engine_steps_read = engine.global_steps
        norm = engine.get_global_grad_norm()
        if norm is not None:
            self.record_grad_norm(float(norm))

    def lr_scheduler_step(self, scheduler, metric) -> None:
        # DeepSpeed or GradScaler skips a step whose fp16 gradients overflowed (and lowers the loss
        # scale); the schedule waits with it, as DeepSpeed's own scheduler handling does, under
        # every strategy. Lightning would step it: skips would use up the warm-up.
        engine = deepspeed_engine(self.trainer)
        if (engine is not None and not engine.was_step_applied()) or self.step_skipped:
            return
        scheduler.step()

    def validation_step(self, batch, batch_idx):
        if self.objective is not None:
            loss, metrics = self.preference_step(batch)
            # kto has no accuracies, and margins only when both labels are in the batch.
            self.log_dict({f"val_{k}": metrics[k].float() for k in ("rewards/accuracies", "rewards/margins") if k in metrics}, sync_dist=True, batch_size=rows(batch))
            self.log("val_loss", loss, prog_bar=True, sync_dist=True, batch_size=rows(batch))
            return
        # Each batch's mean weighted by its labelled tokens: the epoch's val_loss is the token-weighted
        # mean over the held-out windows, which mode=eval computes the same way (outputs/modes.py).
        self.log("val_loss", self.token_loss(batch), prog_bar=True, sync_dist=True, batch_size=labelled_tokens(batch))

    def configure_gradient_clipping(self, optimizer, gradient_clip_val=None, gradient_clip_algorithm=None):
        # One pass both clips and measures: the logged grad_norm is the pre-clip total norm
        # (after loss-scale unscaling under fp16).
        if not self.clip_in_module:
            return
        max_norm = self.spec.optimizer.grad_clip if self.spec.optimizer.grad_clip > 0 else float("inf")
        measured, self.measured_grad_norm = self.measured_grad_norm, None
        # Read now, before the update: the non-finite guard and the clipping have waited for the
        # backward already. Read after it (the spike monitor, every step), it would make the host
        # wait for the update too, instead of queueing the next step's work behind it.
        self.record_grad_norm(float(clip_grad_norm(self.parameters(), max_norm, measured)))

    def configure_optimizers(self):
        opt = optimizers.build(self.optimizer_groups(), self.spec.optimizer, cpu_adam=self.cpu_adam, fused_adamw=self.fused_adamw, deepspeed=self.deepspeed_config is not None)
        schedule = self.schedule
        sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: schedule.multiplier(step))  # a function: nothing of it in the scheduler's saved state
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_start(self) -> None:
        # A resumed run gets its step count from the checkpoint and its rates from this run's
        # schedule: the checkpoint's optimizer and scheduler hold the rate (and peak) of the
        # schedule that saved it, which a new stage (another max_steps, decay or trainer.lr) replaces.
        scheduler = self.lr_schedulers()
        if scheduler is None:
            return
        # A Muon group under DeepSpeed carries its per-shape rate multiplier (model/optimizers.py).
        scheduler.base_lrs = [self.spec.optimizer.lr * group.get("lr_scale", 1.0) for group in scheduler.optimizer.param_groups]
        for group, lr in zip(scheduler.optimizer.param_groups, scheduler.base_lrs):
            group["lr"] = lr * scheduler.lr_lambdas[0](scheduler.last_epoch)
        scheduler._last_lr = [group["lr"] for group in scheduler.optimizer.param_groups]

    def on_save_checkpoint(self, checkpoint: dict) -> None:
        # Full tensors (single, ddp, DeepSpeed's module states): unpadded, so any tp loads them.
        # fsdp_tp saves each rank's shards of the padded tables as they are (checkpoint/sharded.py);
        # its metadata says the padding, and a load under another tp re-pads (train/sharded_checkpoints.py).
        if not holds_shards(checkpoint["state_dict"]):
            unpad_vocab(checkpoint["state_dict"], self.vocab_names, self.true_vocab)
        if self.quantized_prefixes:  # QLoRA: the 4-bit base is not saved (tinytrain/model/lora.py)
            state = checkpoint["state_dict"]
            for key in [k for k in state if k.removeprefix(checkpoint_prefix).startswith(tuple(self.quantized_prefixes))]:
                del state[key]
        checkpoint["tinytrain"] = dict(self.checkpoint_metadata)
        scheduler = self.lr_schedulers() if self._trainer is not None else None
        if scheduler is not None:  # the rate its next step takes: a resume under another schedule says the jump
            position = scheduler.last_epoch
            checkpoint["tinytrain"]["rate"] = {"schedule_step": position, "lr": self.spec.optimizer.lr * self.schedule.multiplier(position)}

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        # Lightning resumes load weights after this hook (single, ddp): re-pad for this run.
        # fsdp_tp loads them in the strategy, which re-pads first (strategy.py) and leaves no state_dict.
        if "state_dict" in checkpoint:
            self.repad_state_dict(checkpoint["state_dict"])
            for i, saved in enumerate(checkpoint.get("optimizer_states", [])):
                if isinstance(saved, dict) and saved.get("state") and all(isinstance(k, int) for k in saved["state"]):
                    try:
                        checkpoint["optimizer_states"][i] = self.indexed(self.named_optimizer_state(saved))
                    except ValueError:  # no parameter order fits: torch's own load names the mismatch
                        pass

    def optimizer_param_names(self) -> list[str]:
        """The optimizer's parameters by name, in its order (configure_optimizers' param groups)."""
        names = {id(p): n for n, p in self.named_parameters()}
        return [names[id(p)] for g in self.optimizer_groups() for p in g["params"]]

    def optimizer_groups(self) -> list[dict]:
        return optimizer_groups(self.model, self.spec.optimizer, vocab_tables_decay=not self.adapters, deepspeed=self.deepspeed_config is not None)

    def named_optimizer_state(self, saved: dict) -> dict:
        """A saved optimizer state (parameters by index) keyed by name, its vocab tables' moments
        re-padded for this run (a checkpoint of another tp or vocab_multiple)."""
        shapes = {n: tuple(p.shape) for n, p in self.named_parameters()}
        named = name_optimizer_state(saved, [self.optimizer_param_names(), [n for n, p in self.named_parameters() if p.requires_grad]], shapes, self.vocab_names)
        repad_optimizer_state(named, self.vocab_names, self.true_vocab, self.model.get_input_embeddings().weight.shape[0])
        return named

    def indexed(self, named: dict) -> dict:
        """A name-keyed optimizer state back in this run's optimizer order (what torch loads)."""
        index = {n: i for i, n in enumerate(self.optimizer_param_names())}
        return {"state": {index[n]: s for n, s in named["state"].items()}, "param_groups": [{**g, "params": [index[n] for n in g["params"]]} for g in named["param_groups"]]}

    def repad_state_dict(self, state_dict: dict) -> None:
        """Checkpoints hold len(tokenizer) vocab rows; this run's tables have the padded count."""
        padded = self.model.get_input_embeddings().weight.shape[0]  # the global shape, also when sharded
        if all(name in state_dict for name in self.vocab_names):
            repad_vocab(state_dict, self.vocab_names, padded)
