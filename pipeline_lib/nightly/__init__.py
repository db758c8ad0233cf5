"""The nightly: continued pretraining on what arrived since the last decided night, judged before it goes live.

One concern per module:
  inputs   what arrived (the raw files no decided night is done with, and the carried ones)
  lock     one night at a time per output root
  night_ids  which run id a night runs under (a decided night is never rerun in place)
  state    the state generations: latest, held, history, consumed files, the ledger, attention
  ledger   per input file what became of it (trained, carried, dropped, quarantined, duplicate, unusable)
  documents  a night's document counts per file, its dedup segment published on promotion, data failures
  tonight  tonight's config over the promoted night, and what a finished night left behind
  gate     the promotion gate: per metric paired statistics, uninformative metrics, the outcome and its policy
  paired   the gate's statistics (paired bootstrap, McNemar mid-p, above chance)
  scores   what the night's evaluate wrote per row and per item (what the gate pairs)
  schedule the lineage's learning-rate schedule across nights (nightly.lr_schedule=lineage)
  retention  bounded disk: what the folders of decided nights keep (nightly.retention, `llm-pipeline gc`)
  screen   the data screen before tonight's data stage (screen_stats, char_ngram, screen_sample, screen_model and
           its worker screen_worker)
flows/nightly.py orchestrates these; nothing here imports Prefect.
"""
from .gate import judge
from .inputs import list_raw_files, new_files
from .lock import LOCK_HEARTBEAT_SECONDS, LOCK_STALE_SECONDS, NightBusy, lock_uri, night_lock
from .schedule import lineage_note, lineage_overrides, schedule_record
from .state import (NotHeld, commit_night, consume_without_training, load_state, promote_held, promoted_nights,
                    quarantine_night, reject_held, state_folder, state_uri, update_state)
from .tonight import (deep_update, evaluate_metrics, next_base_checkpoint, night_heldout, night_tokenizer,
                      nightly_overrides, no_new_documents, replay_runs)

__all__ = ["judge", "list_raw_files", "new_files", "LOCK_HEARTBEAT_SECONDS", "LOCK_STALE_SECONDS", "NightBusy",
           "lock_uri", "night_lock", "NotHeld", "commit_night", "consume_without_training", "load_state",
           "promote_held", "promoted_nights", "quarantine_night", "reject_held", "state_folder", "state_uri", "update_state", "deep_update",
           "evaluate_metrics", "next_base_checkpoint", "night_heldout", "night_tokenizer", "nightly_overrides",
           "no_new_documents", "replay_runs", "lineage_note", "lineage_overrides", "schedule_record"]
