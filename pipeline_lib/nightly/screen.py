"""The data screen: tonight's new documents scored against the lineage before they train (nightly.screen).

Before tonight's data stage (so the data stage stays model-free, and a quarantined file is never read by it), two
scorers give each new document a score in nats per character (per character, not per token: tokenisations of
different granularity compare):
  model  the promoted model (`latest`) with the lineage's tokenizer, in its own process on the forward path evaluate
         uses (screen_model.py, screen_worker.py); on the first night of a lineage the configured base model
         (model.base_checkpoint / model.hf_checkpoint) when there is one;
  ngram  the lineage's character n-gram model (char_ngram.py), built from the accepted train-split documents of the
         promoted nights (screen_sample.py), which knows the order of characters a young model does not.
Each scorer's threshold comes from the lineage's own accepted held-out documents scored by the same scorer tonight
(screen_stats.robust_threshold: median + k * spread); on the first night with a base model, from tonight's own
documents (median and MAD ignore a minority of garbage). A document above either threshold is excluded: the data
stage drops it with reason `lineage_perplexity` (data.exclude_from gets <run>/screen/exclude.json; stats.json counts it
per file); <run>/screen/excluded.jsonl lists every excluded document with its scores. A file with more than nightly.screen.quarantine_file_share of its documents excluded is quarantined: left
out of tonight's inputs (consumed all the same) and named in the night's message. Every night a self-test scores
character-shuffled copies of a few calibration documents: a scorer that lets one through has no power yet, and the
message says so. Records that do not parse are left to the data stage (it rejects them, as before).
"""
from __future__ import annotations

import json
import random
from dataclasses import dataclass, field

import numpy as np

from ..data.sources import list_inputs, plan_shards
from ..data.readers import iter_shard_batches
from ..runtime.worker import WorkerFailed
from ..storage import RunPaths, join, store_for
from .char_ngram import CharNgram
from .screen_sample import lineage_sample
from .screen_stats import file_shares, outside, quarantined_files, robust_threshold

SCREEN_REASON = "lineage_perplexity"
_json = json.JSONEncoder(ensure_ascii=False, default=str).encode
MIN_CALIBRATION = 20  # calibration documents a threshold wants; train-split ones fill up a short held-out sample


@dataclass
class Screened:
    """What the screen decided for tonight: the files that go on, the file of excluded documents, the record."""

    files: list[str]
    kept_files: list[str]
    quarantined: list[str] = field(default_factory=list)
    exclude_file: str | None = None
    record: dict = field(default_factory=dict)
    summary: str = ""

    def overrides(self, cfg, changes: dict) -> dict:
        """Tonight's config changes (tonight.nightly_overrides) with the screen's: only the files that go on, and
        the excluded documents dropped by the data stage (beside the config's own data.exclude_from)."""
        data = changes.setdefault("data", {})
        data["inputs"] = sorted(self.kept_files)
        if self.exclude_file:
            data["exclude_from"] = [*cfg.data.exclude_from, self.exclude_file]
        return changes

    def nothing_left(self) -> dict:
        """The finding of a night whose every file is quarantined (tonight.no_new_documents' shape, kind
        no_usable_documents): the night consumes the files and trains nothing."""
        return {"kind": "no_usable_documents", "read": self.record.get("screened", 0), "candidates": 0, "kept": 0,
                "rejected": {}, "filtered": {SCREEN_REASON: self.record.get("excluded", 0),
                                             "quarantined_file": self.record.get("screened", 0)
                                             - self.record.get("excluded", 0)},
                "records": {"quarantine.jsonl": [], "excluded.jsonl": [self.record["records"]] if self.record.get("records")
                            else []},
                "screen": self.record}

    def tell(self, state):
        """The night's final state with the screen's line appended to its message and its record in its data."""
        if self.summary:
            state.message = f"{state.message}. {self.summary}" if state.message else self.summary
        if isinstance(state.data, dict):
            state.data["screen"] = self.record
        return state


def _documents(cfg, files: list[str]) -> list[tuple[str, int, object, str]]:
    """(file URI, line, source id, text) of every record of `files` that parses and has text, read as the data
    stage reads them (data/readers.py: the same line numbers)."""
    d, endpoint = cfg.data, cfg.run.s3_endpoint_url
    out = []
    for uri, label in list_inputs(sorted(files), endpoint, follow_symlinks=d.follow_symlinks):
        for spec in plan_shards([(uri, label)], None, endpoint):
            for batch in iter_shard_batches(spec, d.text_field, d.read_batch_size, endpoint, (d.id_field,),
                                            d.max_line_bytes, 256):
                for line, text, reason, _raw, values in batch:
                    if not reason and isinstance(text, str) and text.strip():
                        out.append((uri, line, values.get(d.id_field, f"{label}:{line}"), text))
    return out


def _model(cfg, state: dict) -> tuple[str | None, str | None, bool, str]:
    """(weights, tokenizer, weights are a Hugging Face folder, what they are) of the screen's model."""
    latest = state.get("latest") or {}
    if latest.get("checkpoint"):
        if not latest.get("tokenizer"):
            return None, None, False, f"the promoted model ({latest['run_id']}) records no tokenizer"
        return latest["checkpoint"], latest["tokenizer"], False, f"the promoted model ({latest['run_id']})"
    from ..model.tokenizer_lineage import base_weights, lineage_tokenizer

    base, name = base_weights(cfg)
    if not base:
        return None, None, False, "no promoted model and no model.base_checkpoint / model.hf_checkpoint"
    return base, lineage_tokenizer(cfg), name == "model.hf_checkpoint", f"the base model ({name})"


def _shuffled(texts: list[str], seed: str) -> list[str]:
    rng, out = random.Random(seed), []
    for t in texts:
        chars = list(t)
        rng.shuffle(chars)
        out.append("".join(chars))
    return out


def screen_night(cfg, state: dict, files: dict[str, int] | list[str], run_id: str, log=print) -> Screened:
    """Score tonight's documents, decide what is excluded and quarantined, write the exclusion file (see the module
    docstring). `log`: a callable or a logger (.info / .warning)."""
    info = getattr(log, "info", log)
    warn = getattr(log, "warning", log)
    files = sorted(files)
    sc = cfg.nightly.screen
    if not sc.enabled:
        return Screened(files, files, record={"screened": 0, "skipped": "nightly.screen.enabled=false"})
    docs = _documents(cfg, files)
    cut = sc.max_chars_per_document
    texts = [t[:cut] for *_, t in docs]
    lineage = lineage_sample(cfg, state)
    weights, tokenizer, hf, what = _model(cfg, state) if sc.model else (None, None, False, "nightly.screen.model=false")
    held = [d["text"][:cut] for d in lineage if d["split"] == "heldout"]
    train = [d["text"][:cut] for d in lineage if d["split"] != "heldout"]
    if lineage and len(held) < MIN_CALIBRATION:  # a short held-out sample: borrow train-split documents
        held, train = held + train[:MIN_CALIBRATION - len(held)], train[MIN_CALIBRATION - len(held):]
    from_tonight = not lineage
    calibration = held if lineage else texts
    if not docs or (not lineage and weights is None):
        why = "no document to score" if not docs else f"nothing to measure against: {what}"
        summary = f"Screen: did not screen ({why})"
        info(summary)
        return Screened(files, files, record={"screened": 0, "skipped": why}, summary=summary if docs else "")
    probe = _shuffled(calibration[:sc.self_test_documents], run_id)
    batch = texts + ([] if from_tonight else calibration) + probe
    n, m = len(texts), len(calibration)

    scores: dict[str, np.ndarray] = {}
    scorers: dict[str, dict] = {}
    if weights is not None:
        from .screen_model import model_nll_per_char

        try:
            s, figures = model_nll_per_char(cfg, weights, tokenizer, batch, sc.batch_size, info, hf=hf)
            scores["model"] = s
            scorers["model"] = {"weights": weights, "what": what, **figures}
        except WorkerFailed as err:  # the n-gram model still screens; the message says the model did not
            warn(f"screen: scoring with {what} failed ({err}); screening without it")
            scorers["model"] = {"weights": weights, "what": what, "error": str(err)[:500]}
    if sc.ngram_order and train:
        scores["ngram"] = CharNgram.build(train, sc.ngram_order).score(batch)
        scorers["ngram"] = {"order": sc.ngram_order, "built_from": len(train),
                            "characters": int(sum(len(t) for t in train))}
    excluded = np.zeros(n, dtype=bool)
    no_power = []
    for name, s in scores.items():
        cal = s[:n] if from_tonight else s[n:n + m]
        thr = robust_threshold(cal, sc.k, sc.min_spread)
        out = outside(s[:n], thr)
        caught = int(outside(s[len(batch) - len(probe):], thr).sum())
        excluded |= out
        scorers[name].update(thr.to_json(), excluded=int(out.sum()),
                             self_test={"documents": len(probe), "caught": caught})
        if caught < len(probe):
            no_power.append(f"{name}: {caught}/{len(probe)} shuffled copies caught")
    return _decide(cfg, run_id, files, docs, excluded, scores, scorers, no_power,
                   "tonight's documents" if from_tonight else "the lineage's accepted documents", info)


def _decide(cfg, run_id, files, docs, excluded, scores, scorers, no_power, calibrated_on, info) -> Screened:
    sc, endpoint = cfg.nightly.screen, cfg.run.s3_endpoint_url
    shares = file_shares([d[0] for d in docs], excluded)
    quarantined = quarantined_files(shares, sc.quarantine_file_share)
    kept = [f for f in files if f not in quarantined]
    folder = join(RunPaths(cfg.run.output_root, run_id, endpoint).run_uri, "screen")
    store = store_for(folder, endpoint)
    exclude_file = records = None
    if excluded.any():  # every excluded document, quarantined files' too, with its scores and a head of its text
        records = join(folder, "excluded.jsonl")
        store.put_bytes(records, "".join(_json({
            "file": docs[i][0], "line": docs[i][1], "id": docs[i][2], "reason": SCREEN_REASON,
            "quarantined_file": docs[i][0] in quarantined, "scores": {k: round(float(v[i]), 4) for k, v in scores.items()},
            "text": docs[i][3][:200]}) + "\n" for i in np.flatnonzero(excluded)).encode("utf-8"))
    listed = [i for i, (uri, *_) in enumerate(docs) if excluded[i] and uri not in quarantined]
    if listed and kept:  # what the data stage drops (data.exclude_from), by origin as tonight's data stage names
        # them: the labels of the files that go on
        labels = dict(list_inputs(sorted(kept), endpoint, follow_symlinks=cfg.data.follow_symlinks))
        exclude_file = join(folder, "exclude.json")
        store.put_bytes(exclude_file, _json({"reason": SCREEN_REASON, "documents": [
            {"id": docs[i][2], "origin": f"{labels[docs[i][0]]}:{docs[i][1]}"} for i in listed]}).encode("utf-8"))
    record = {"screened": len(docs), "excluded": int(excluded.sum()), "calibrated_on": calibrated_on,
              "scorers": scorers, "files": shares, "quarantined": quarantined, "exclusions": exclude_file,
              "records": records, "power": not no_power}
    caught = ", ".join(f"{k} {v['excluded']}" for k, v in scorers.items() if "excluded" in v)
    summary = (f"Screen: {len(docs)} document(s) scored, {record['excluded']} excluded as {SCREEN_REASON} "
               f"({caught or 'no scorer ran'}; thresholds from {calibrated_on})")
    if quarantined:
        named = ", ".join(f"{f.rsplit('/', 1)[-1]} ({shares[f]['excluded']}/{shares[f]['screened']})"
                          for f in quarantined)
        summary += f"; quarantined {len(quarantined)} file(s), left out of tonight's data: {named}"
    failed = [f"{k}: {v['error']}" for k, v in scorers.items() if "error" in v]
    if failed:
        summary += f"; a scorer failed ({'; '.join(failed)})"
    if no_power:
        summary += f"; the screen has no power yet ({'; '.join(no_power)})"
    info(summary)
    return Screened(files, kept, quarantined, exclude_file, record, summary)
