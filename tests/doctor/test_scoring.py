"""The doctor scored on the corpus of real failure text (tests/doctor/logs/corpus.yaml): every category recalled at
0.9 or better, no healthy log called a failure, and the guide's table is what the scoring computes."""
from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from pipeline_lib.doctor.classify import ALL_CATEGORIES
from pipeline_lib.doctor.scoring import HEALTHY, CorpusError, load_corpus, score, table, with_table

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def result():
    return score(load_corpus())


def test_the_corpus_covers_every_category_in_several_wordings():
    cases = load_corpus()
    assert len(cases) >= 60
    counts = Counter(c.expected for c in cases)
    assert set(counts) == set(ALL_CATEGORIES) | {HEALTHY}
    assert min(counts.values()) >= 3, counts
    assert len({c.source.split(" ")[0] for c in cases}) >= 50  # many threads and pages, not a few
    assert sum(c.held_out for c in cases) >= 15


def test_every_category_is_recalled_and_no_healthy_log_is_a_failure(result):
    assert result.false_alarms == []
    low = {c: result.recall(c) for c in result.per_category if (result.recall(c) or 0) < 0.9}
    assert low == {}, result.misses


def test_the_guide_shows_the_score_the_corpus_gives(result):
    guide = (ROOT / "docs" / "troubleshooting.md").read_text(encoding="utf-8")
    assert with_table(guide, result) == guide, "regenerate: python -m pipeline_lib.doctor.scoring --write-doc " \
                                               "docs/troubleshooting.md"
    assert table(result) in guide


def test_precision_counts_a_wrong_category_recall_counts_unknown(tmp_path):
    (tmp_path / "a.log").write_text("OSError: [Errno 28] No space left on device\n")
    (tmp_path / "b.log").write_text("nothing doctor knows\n")
    (tmp_path / "c.log").write_text("step 1 loss 2.0\n")
    (tmp_path / "corpus.yaml").write_text(
        "- {file: a.log, expected: host_oom, source: a thread quoting it}\n"
        "- {file: b.log, expected: host_oom, source: another thread}\n"
        "- {file: c.log, expected: healthy, source: a healthy run's log}\n")
    result = score(load_corpus(tmp_path / "corpus.yaml"))
    assert result.recall("host_oom") == 0.0 and result.precision("host_oom") is None  # called nothing host_oom
    assert result.precision("disk_full") == 0.0  # called disk_full once, wrongly
    assert result.recall(HEALTHY) == 1.0 and result.correct == 1
    assert ("b.log", "host_oom", "unknown") in result.misses


def test_a_corpus_entry_without_its_file_or_source_is_refused(tmp_path):
    (tmp_path / "corpus.yaml").write_text("- {file: missing.log, expected: disk_full, source: somewhere public}\n")
    with pytest.raises(CorpusError, match="missing.log"):
        load_corpus(tmp_path / "corpus.yaml")
    (tmp_path / "a.log").write_text("x\n")
    (tmp_path / "corpus.yaml").write_text("- {file: a.log, expected: disk_ful, source: somewhere public}\n")
    with pytest.raises(CorpusError, match="expected='disk_ful'"):
        load_corpus(tmp_path / "corpus.yaml")
    (tmp_path / "corpus.yaml").write_text("- {file: a.log, expected: disk_full}\n")
    with pytest.raises(CorpusError, match="source"):
        load_corpus(tmp_path / "corpus.yaml")
