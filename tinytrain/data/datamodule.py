"""The data a run trains on, built in the main process before the model (so bad data is reported
before compute is spent, and never from inside a DataLoader worker).

format=text              source -> token store (cached, or data.store) -> document split -> PackedWindows
format=instruction|chat  source records -> SFT samples (cached) -> sample split -> SftDataset or PackedSamples
format=preference        source records -> chosen/rejected pairs (cached) -> pair split -> PreferenceDataset
                         (a micro batch of B pairs is 2B rows; the samplers count pairs)
data.sources             each source as above (its own token store or samples), concatenated;
                         samples drawn by weight (mixture_sampler.py), for validation too

The validation split is data.val_fraction of the documents (seeded, so no document is in both), or
a separate source (data.val_path). Each split gets a ResumableBatchSampler (a mixture's: a
MixtureBatchSampler); the training one is what callbacks/data_position.py checkpoints. `mode=prepare` builds this and stops.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import ConcatDataset, DataLoader

from tinytrain.config.schema import DataFormat
from tinytrain.data import parts, sft_cache
from tinytrain.data.bad_records import BadRecords
from tinytrain.data.batch_ramp import BatchRamp
from tinytrain.data.collate import PaddedCollator, collate_windows
from tinytrain.data.mixture import Member, members, stage_weights
from tinytrain.data.mixture_sampler import MixtureBatchSampler
from tinytrain.data.packing import WHOLE, PackedSamples, PackedWindows
from tinytrain.data.parts import PLAN, PartedStore
from tinytrain.data.preference import PreferenceCollator, PreferenceDataset, PreferencePair, build_pairs, no_pairs_fix
from tinytrain.data.ramp_sampler import RampBatchSampler
from tinytrain.data.sample_index import EpochOrders, index_root, split_indices, split_windows
from tinytrain.data.sampler import ResumableBatchSampler
from tinytrain.data.sft import SftDataset, SftSample, build_samples, no_samples_fix
from tinytrain.data.sources import Source, records
from tinytrain.data.sources import fingerprint as sources_fingerprint
from tinytrain.data.store import TokenStore, ensure_store
from tinytrain.data.tokenizer import earlier_fingerprints, fingerprint
from tinytrain.data.unpaired import UnpairedCollator, UnpairedDataset, build_unpaired, is_unpaired
from tinytrain.data.worker_loader import WorkerSafeDataLoader
from tinytrain.errors import ConfigError, Problem

# The split does not follow the run's seed: runs with different seeds validate on the same documents.
SPLIT_SEED = 0


@dataclass(frozen=True)
class MixturePart:
    """One mixture source's training data, as the plan's table shows it."""

    name: str
    where: str  # the source, described
    weight: float  # as given
    items: int  # windows, samples or packed rows per pass
    item_kind: str
    tokens: int  # training tokens per pass
    orders: Path | None = None  # where its pass orders are written and mapped (beside its store); None: in memory


class DataModule:
    def __init__(self, data_cfg, tokenizer, micro_batch_size: int, seed: int, *, progress: bool = True, data_parallel: int = 1, samples_per_step: int = 0, ramp: BatchRamp | None = None, validation_only: bool = False, step_keys: tuple[str, ...] = ("trainer.global_batch_size",)):
        """`samples_per_step`: the global batch in sequences, where a mixture's data.stages turn steps into samples;
        `ramp`: trainer.batch_size_warmup's (data/batch_ramp.py), micro batches that grow with the step;
        `step_keys`: the keys the user set that size a step (data/run_data.py step_keys), which a step
        larger than the data is refused naming;
        `validation_only`: only the validation split is read (mode=eval), the training split's sizes are not checked."""
        self.validation_only = validation_only
        self.cfg = data_cfg
        self.tokenizer = tokenizer
        self.micro_batch_size = micro_batch_size
        self.data_parallel = data_parallel
        self.samples_per_step = samples_per_step
        self.ramp = ramp
        self.step_keys = step_keys
        self.stores: list = []  # token stores read (pretraining), for preflight's data_vocab check
        self.lines: list[str] = []  # what was built, for logs and mode=prepare
        self.parts: list[MixturePart] = []  # a mixture's sources (empty for one source)
        self.val_mixture: tuple[list, list, list, list] = ([], [], [], [])  # names, sizes, weights, order folders of the sources validated on
        if data_cfg.sources:
            self.train, self.val = self._mixture(progress)
        elif data_cfg.format == DataFormat.text:
            self.train, self.val = self._pretraining(progress)
        elif data_cfg.format == DataFormat.preference:
            self.train, self.val = self._preference()
        else:
            self.train, self.val = self._sft()
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id  # padding is masked anyway
        if data_cfg.format == DataFormat.text:
            self.collate = collate_windows  # fixed-size windows
        elif isinstance(self.train, UnpairedDataset):
            self.collate = UnpairedCollator(pad, data_cfg.pad_to_multiple_of, data_cfg.seq_len)
        elif data_cfg.format == DataFormat.preference:
            self.collate = PreferenceCollator(pad, data_cfg.pad_to_multiple_of)
        else:
            self.collate = PaddedCollator(pad, data_cfg.pad_to_multiple_of)
        self._check_sizes()
        if self.parts:
            # Validation draws from the mixture too, the same batches every time and for every seed.
            self.train_sampler = MixtureBatchSampler(
                [p.name for p in self.parts], [p.items for p in self.parts], [p.weight for p in self.parts], micro_batch_size, seed, stage_weights(data_cfg), samples_per_step, [p.orders for p in self.parts]
            )
            names, sizes, weights, orders = self.val_mixture
            self.val_sampler = MixtureBatchSampler(names, sizes, weights, micro_batch_size, SPLIT_SEED, order_folders=orders)
        else:
            grouped = data_cfg.format != DataFormat.text and data_cfg.group_by_length
            # Pretraining: each epoch's order of windows written once and mapped by every rank.
            # (An order depends only on (samples, seed, epoch); kept beside the store's index.)
            orders = EpochOrders(index_root(data_cfg.cache_dir, self.train.store) / "orders", len(self.train), seed) if data_cfg.format == DataFormat.text else None
            if ramp is not None:  # validated: no length grouping
                self.train_sampler = RampBatchSampler(len(self.train), ramp, seed, orders=orders)
            else:
                self.train_sampler = ResumableBatchSampler(len(self.train), micro_batch_size, seed, shuffle=True, drop_last=True, lengths=self.train.lengths if grouped else None, orders=orders)
            # KTO scores each example against another one's completion (its KL row): a last
            # validation batch of one example would be scored against its own, a loss of 0.5.
            lone = isinstance(self.val, UnpairedDataset) and len(self.val) % micro_batch_size == 1
            self.val_sampler = ResumableBatchSampler(len(self.val), micro_batch_size, seed, shuffle=False, drop_last=lone)

    # -- pretraining --------------------------------------------------------------------------

    def _store(self, validation: bool, progress: bool, src: Source | None = None) -> TokenStore:
        d = self.cfg
        if d.store and not validation and src is None:
            store = PartedStore.open(d.store) if (Path(d.store) / PLAN).exists() else TokenStore.open(d.store)
            older = store.check_matches(fingerprint(self.tokenizer), str(self.tokenizer.name_or_path), d.append_eos, d.prepend_bos, earlier=earlier_fingerprints(self.tokenizer))
            self.lines.append(f"token store {store.path} (data.store): {store.describe()}")
            if older:
                self.lines.append(f"token store {older}")
            self.stores.append(store)
            return store
        src = src or Source.from_config(d, validation)
        if d.prepare_parts > 1 and not validation:
            store, built = parts.ensure(src, d, self.tokenizer, progress)
            self.lines += store.build_lines
        else:
            store, built = ensure_store(src, d, self.tokenizer, progress)
        if isinstance(store, PartedStore):
            how = f"{len(store.parts)} parts, tokenized in {store.meta['build_seconds']:.1f} s of build time" if built else f"{len(store.parts)} parts, reused"
        else:
            how = f"built in {store.meta['build_seconds']:.1f} s with {store.meta['tokenize_workers']} workers" if built else "reused"
        self.lines.append(f"token store {store.path} ({how}) for {src.describe()}: {store.describe()}; {store.meta['bad_records']}")
        self.stores.append(store)
        return store

    def _windows(self) -> dict:
        d = self.cfg
        return dict(seq_len=d.seq_len, isolate_documents=not d.cross_document_attention, predict_across_documents=d.predict_across_documents, vocab=len(self.tokenizer))

    def _pretraining(self, progress: bool):
        d = self.cfg
        windows = self._windows()
        store = self._store(validation=False, progress=progress)
        if d.val_path:
            val_store = self._store(validation=True, progress=progress)
            train, val = PackedWindows(store, None, **windows, mapped=WHOLE), PackedWindows(val_store, None, **windows, mapped=WHOLE)
        else:
            train, val = self._split_windows(store)
        self.lines.append(
            f"pretraining: {len(train.doc_starts):,} train documents -> {len(train):,} windows of {d.seq_len}, {len(val.doc_starts):,} validation documents "
            f"-> {len(val):,} windows; documents {'attend to each other' if d.cross_document_attention else 'isolated (position ids restart per document)'}, "
            f"labels {'cross' if d.predict_across_documents else 'never cross'} document boundaries"
        )
        return train, val

    def _split_windows(self, store, source: str = "the source") -> tuple[PackedWindows, PackedWindows]:
        """Train and validation windows of one store split by data.val_fraction; the index is
        computed once and mapped (sample_index.py)."""
        d = self.cfg
        index = split_windows(store, d.val_fraction, SPLIT_SEED, d.cache_dir, d.seq_len, source)
        files = {k: str(Path(v.filename)) for k, v in index.items()}
        train, val = (PackedWindows(store, None, **self._windows(), mapped=tuple(files[f"{p}_{k}"] for k in ("doc_starts", "stream_starts", "window_docs"))) for p in ("train", "val"))
        return train, val

    # -- supervised fine-tuning ---------------------------------------------------------------

    def _cached(self, src: Source, kind: str, item_type, build) -> list:
        """A source's SFT samples or preference pairs, tokenized once per source, template,
        tokenizer and policy (sft_cache.py): other ranks and a requeued job read them."""
        folder = sft_cache.cache_folder(self.cfg.cache_dir, kind, sft_cache.cache_key(sources_fingerprint(src), self.tokenizer, self.cfg))
        items, summary, built = sft_cache.cached_items(folder, item_type, build, "SFT samples" if kind == "sft" else "preference pairs")
        self.lines.append(f"{src.describe()}: {summary} ({'tokenized' if built else 'read from the cache'}: {folder})")
        return items

    def _samples(self, validation: bool, src: Source | None = None) -> list[SftSample]:
        src = src or Source.from_config(self.cfg, validation)

        def build() -> tuple[list[SftSample], str]:
            bad = BadRecords(self.cfg.bad_records, src.key)
            samples, counts = build_samples(records(src, bad), self.cfg, self.tokenizer, bad)
            if not samples:
                raise ConfigError(Problem(src.key, src.path, f"no usable samples ({counts.summary(self.cfg.seq_len)})", no_samples_fix(counts)))
            return samples, counts.summary(self.cfg.seq_len)

        return self._cached(src, "sft", SftSample, build)

    def _train_and_validation(self, build, what: str, smallest_val: int = 1) -> tuple[list, list]:
        """SFT samples or preference pairs: validation from data.val_path, else split off by
        data.val_fraction (at least `smallest_val` of them)."""
        items = build(validation=False)
        if self.cfg.val_path:
            return items, build(validation=True)
        train_ids, val_ids = split_indices(len(items), self.cfg.val_fraction, SPLIT_SEED, what, smallest=smallest_val)
        return [items[i] for i in train_ids], [items[i] for i in val_ids]

    def _sft(self):
        d = self.cfg
        train_samples, val_samples = self._train_and_validation(self._samples, "samples")
        train, val, shape = self._sft_datasets(train_samples, val_samples)
        trained = int(train.labelled.sum())  # packed or not, the rows' trained tokens are the samples'
        total = sum(len(s.input_ids) for s in train_samples)
        self.lines.append(
            f"sft ({d.format.value}, template {d.chat_template.value}, train on {d.train_on.value}): {len(train_samples):,} train / {len(val_samples):,} "
            f"validation samples, {trained:,} of {total:,} train tokens trained on; {shape}"
        )
        return train, val

    def _sft_datasets(self, train_samples: list[SftSample], val_samples: list[SftSample]):
        d = self.cfg
        if d.pack:
            train, val = PackedSamples(train_samples, d.seq_len), PackedSamples(val_samples, d.seq_len)
            shape = f"packed into {len(train):,} train / {len(val):,} validation rows of up to {d.seq_len} (samples isolated)"
        else:
            train, val = SftDataset(train_samples), SftDataset(val_samples)
            grouped = d.group_by_length and not d.sources  # a mixture's batches are drawn by weight
            shape = f"padded to the longest in each batch (multiple of {d.pad_to_multiple_of}){', length-grouped' if grouped else ''}"
        return train, val, shape

    # -- preference pairs ----------------------------------------------------------------------

    def _pairs(self, validation: bool) -> list[PreferencePair]:
        src = Source.from_config(self.cfg, validation)

        def build() -> tuple[list[PreferencePair], str]:
            bad = BadRecords(self.cfg.bad_records, src.key)
            pairs, counts = build_pairs(records(src, bad), self.cfg, self.tokenizer, bad)
            if not pairs:
                raise ConfigError(Problem(src.key, src.path, f"no usable preference pairs ({counts.summary(self.cfg.seq_len)})", no_pairs_fix(counts, self.cfg.seq_len)))
            return pairs, counts.summary(self.cfg.seq_len)

        return self._cached(src, "preference", PreferencePair, build)

    def _unpaired(self):
        """KTO's {prompt, completion, label} records (data/unpaired.py)."""

        def build(validation: bool) -> list:
            src = Source.from_config(self.cfg, validation)
            bad = BadRecords(self.cfg.bad_records, src.key)
            examples, summary = build_unpaired(records(src, bad), self.cfg, self.tokenizer, bad, src.key, src.path)
            if not examples:
                raise ConfigError(Problem(src.key, src.path, f"no usable KTO examples ({summary})", "check data.format and the records ({prompt, completion, label})"))
            self.lines.append(f"{src.describe()}: {summary}")
            return examples

        # Two validation examples at least: each is scored against another one's completion.
        train, val = self._train_and_validation(build, "examples", smallest_val=2)
        self.lines.append(
            f"kto (template {self.cfg.chat_template.value}): {len(train):,} train / {len(val):,} validation examples; a micro batch of {self.micro_batch_size} examples is "
            f"{2 * self.micro_batch_size} rows (the examples, then each prompt with the previous example's completion for the KL estimate)"
        )
        return UnpairedDataset(train), UnpairedDataset(val)

    def _preference(self):
        d = self.cfg
        first = next(iter(records(Source.from_config(d, False), BadRecords(d.bad_records))), (None, None))[0]
        if is_unpaired(first):
            return self._unpaired()
        train_pairs, val_pairs = self._train_and_validation(self._pairs, "pairs")
        trained = sum(int((p.chosen_labels != -100).sum() + (p.rejected_labels != -100).sum()) for p in train_pairs)
        self.lines.append(
            f"preference (template {d.chat_template.value}): {len(train_pairs):,} train / {len(val_pairs):,} validation pairs, {trained:,} answer tokens scored; "
            f"a micro batch of {self.micro_batch_size} pairs is {2 * self.micro_batch_size} rows (chosen, then rejected), padded to the longest"
            f"{' (multiple of ' + str(d.pad_to_multiple_of) + '), length-grouped' if d.group_by_length else ''}"
        )
        return PreferenceDataset(train_pairs), PreferenceDataset(val_pairs)

    # -- a weighted mixture ---------------------------------------------------------------------

    def _mixture_member(self, m: Member, progress: bool):
        """(train, validation, items' name, training tokens per pass, where its pass orders are
        mapped from) of one mixture source."""
        d = self.cfg
        where = f"{m.key} ({m.name})"
        if d.format == DataFormat.text:
            store = self._store(validation=False, progress=progress, src=m.source)
            train, val = self._split_windows(store, where)
            return train, val, "windows", len(train) * d.seq_len, index_root(d.cache_dir, store) / "orders"
        samples = self._samples(validation=False, src=m.source)
        train_ids, val_ids = split_indices(len(samples), d.val_fraction, SPLIT_SEED, "samples", where)
        train_samples = [samples[i] for i in train_ids]
        train, val, _ = self._sft_datasets(train_samples, [samples[i] for i in val_ids])
        return train, val, "rows" if d.pack else "samples", sum(len(s.input_ids) for s in train_samples), None  # samples are in memory anyway

    def _mixture(self, progress: bool):
        d = self.cfg
        trains, vals, val_names, val_sizes, val_weights, val_orders = [], [], [], [], [], []
        for m in members(d):
            train, val, kind, tokens, orders = self._mixture_member(m, progress)
            if len(train) == 0:
                raise ConfigError(Problem(m.source.key, m.source.path, f"mixture source {m.name!r} yields no training {kind} of data.seq_len={d.seq_len} tokens", "use a shorter data.seq_len, more data, or remove the source"))
            self.parts.append(MixturePart(m.name, m.source.describe(), m.weight, len(train), kind, tokens, orders))
            trains.append(train)
            if len(val):  # a source too small to validate on is left out of validation (named below)
                vals.append(val)
                val_names.append(m.name)
                val_sizes.append(len(val))
                val_weights.append(m.weight)
                val_orders.append(orders)
            self.lines.append(f"mixture source {m.name!r} (weight {m.weight:g}): {len(train):,} train {kind} ({tokens:,} tokens), {len(val):,} validation {kind}")
        if not vals:
            raise ConfigError(Problem("data.val_fraction", d.val_fraction, "no mixture source has a validation sequence", "raise data.val_fraction or use a shorter data.seq_len"))
        left_out = [p.name for p in self.parts if p.name not in val_names]
        self.lines.append(f"mixture: {len(self.parts)} sources drawn by weight (data.exhaustion={d.exhaustion.value}); validation from {', '.join(val_names)}" + (f" ({', '.join(left_out)}: too small)" if left_out else ""))
        self.val_mixture = (val_names, val_sizes, val_weights, val_orders)
        return ConcatDataset(trains), ConcatDataset(vals)

    # -- loaders --------------------------------------------------------------------------------

    def _check_sizes(self) -> None:
        for name, ds in (("train", self.train), ("validation", self.val)):
            if len(ds) == 0 and not (self.validation_only and name == "train"):
                raise ConfigError(Problem("data.seq_len", self.cfg.seq_len, f"the {name} split yields no sequences of {self.cfg.seq_len} tokens", "use a shorter data.seq_len or more data"))
        if isinstance(self.val, UnpairedDataset) and len(self.val) < 2:  # data.val_path's (a split keeps 2)
            raise ConfigError(Problem("data.val_path", self.cfg.val_path, f"holds {len(self.val)} KTO example(s); kto scores each against another example's completion (its KL row), so validation needs 2 or more", "add validation examples, or split them off the training data: data.val_path=null"))
        if self.validation_only:
            return
        needed = self.micro_batch_size * self.data_parallel  # one batch for every data-parallel rank
        if self.samples_per_step > needed and self.ramp is None and not self.parts:
            # An epoch is whole optimizer steps (data/sampler.py): at least one step's samples.
            steps = self.samples_per_step // needed
            if len(self.train) < self.samples_per_step:
                # Named by the keys the user set: a derived global batch the user never wrote, or a
                # fix in one key that the other (set too) then contradicts, was no fix.
                accumulation = max(1, len(self.train) // needed)
                fits = {"trainer.global_batch_size": accumulation * needed, "trainer.accumulate_grad_batches": accumulation}
                key = self.step_keys[0]
                fix = " ".join(f"{k}={fits[k]}" for k in self.step_keys) + (" or less" if len(self.step_keys) == 1 else " (or smaller, together)")
                raise ConfigError(
                    Problem(
                        key,
                        {"trainer.global_batch_size": self.samples_per_step, "trainer.accumulate_grad_batches": steps}[key],
                        f"one optimizer step takes {self.samples_per_step} sequences (micro_batch_size {self.micro_batch_size} x data_parallel {self.data_parallel} x accumulation {steps}), more than the {len(self.train)} training sequences",
                        f"use {fix}, or more data",
                    )
                )
        if len(self.train) < needed:
            # Text is cut into windows: shorter ones make more. A fine-tuning sample cut at a shorter
            # data.seq_len can lose every trained token and be dropped: a longer one keeps more.
            length = "a shorter data.seq_len" if self.cfg.format == DataFormat.text else "a longer data.seq_len (samples cut at it may keep no trained token and are dropped)"
            built = f" ({self.lines[-1]})" if self.lines else ""
            raise ConfigError(
                Problem(
                    "trainer.micro_batch_size",
                    self.micro_batch_size,
                    f"micro_batch_size({self.micro_batch_size}) x data_parallel({self.data_parallel}) is more than the {len(self.train)} training sequences{built}",
                    f"use a smaller trainer.micro_batch_size, {length}, or more data",
                )
            )

    def describe(self) -> str:
        return "\n".join(f"data       {line}" for line in self.lines)

    # Each loader has its own generator: without one, every new iterator (each epoch, each
    # validation) draws its workers' seed from the global torch RNG, and a resumed run, which
    # creates its iterators at other moments, would see different random draws afterwards.
    def train_dataloader(self) -> DataLoader:
        return WorkerSafeDataLoader(self.train, batch_sampler=self.train_sampler, collate_fn=self.collate, num_workers=self.cfg.num_workers, generator=self._generator())

    def val_dataloader(self) -> DataLoader:
        return WorkerSafeDataLoader(self.val, batch_sampler=self.val_sampler, collate_fn=self.collate, num_workers=self.cfg.num_workers, generator=self._generator())

    def _generator(self) -> torch.Generator:
        return torch.Generator().manual_seed(self.train_sampler.seed)
