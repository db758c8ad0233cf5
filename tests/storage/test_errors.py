"""Every error we raise with its own constructor crosses a process boundary intact (a pool worker's error
showed as `BrokenProcessPool ... terminated abruptly` instead of its message and fix)."""
from __future__ import annotations

import pickle
from concurrent.futures import ProcessPoolExecutor

import pytest

from pipeline_lib.config.errors import ConfigError, ConfigIssue
from pipeline_lib.data.errors import DataStageError, NoNewDocuments
from pipeline_lib.model.chat_template import ChatTemplateError
from pipeline_lib.model.tokenizer_lineage import LineageRefused, TokenizerMismatch
from pipeline_lib.nightly import NightBusy
from pipeline_lib.storage.disk_space import DiskFull
from pipeline_lib.storage.input_files import NoInputFiles

ERRORS = [
    DataStageError("data.inputs[0]", "day.jsonl.gz", "truncated gzip", "re-upload the file"),
    NoNewDocuments("data.dedup.lineage", "tiny", "all seen", "nothing", {"read": 3, "kept": 0}),
    ConfigError([ConfigIssue("training.steps", -1, "must be > 0", "set it to 100")]),
    ChatTemplateError("tokenizer.special_tokens", [], "no markers", "list four"),
    LineageRefused("model.base_checkpoint", "/x.ckpt", "no such file or folder", "point it"),
    TokenizerMismatch("tokenizer.path", "/t.model", "other sha256", "set tokenizer.path=/c/tokenizer.model"),
    NightBusy("another night holds the lock", {"run_id": "nightly-1", "pid": 7}),
    DiskFull("no space left writing /runs/x (need 3 GB)", "/runs/x"),
    NoInputFiles("data.inputs[0]", "s3://b/*.jsonl", "matches no file", "check the glob"),
]


@pytest.mark.parametrize("err", ERRORS, ids=lambda e: type(e).__name__)
def test_round_trip_keeps_class_message_and_fields(err):
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is type(err) and str(back) == str(err)
    assert vars(back) == vars(err)


def _raise(i: int):
    raise ERRORS[i]


def test_an_error_raised_in_a_pool_worker_arrives_as_itself():
    with ProcessPoolExecutor(1) as pool:
        for i, err in enumerate(ERRORS):
            with pytest.raises(type(err)) as caught:
                pool.submit(_raise, i).result()
            assert str(caught.value) == str(err)
