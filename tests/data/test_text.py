"""text.nfkc (the fast NFKC of dedup_form and the nfkc filter) equals unicodedata's NFKC."""
from __future__ import annotations

import random
import unicodedata

from pipeline_lib.data.text import _NFKC_OF, dedup_form, nfkc

# Characters whose NFKC depends on their neighbours: combining marks (voiced marks, ring, acute,
# Hangul jamo), compositions across a replaced character, and plain prose.
TRICKY = ["ｶ", "ﾞ", "ﾟ", "\u3099", "\u309a", "A", "\u030a", "\u0301", "e", "\u1100", "\u1161", "\u11a8", "가",
          "ﬁ", "①", "㍻", "，", "：", "　", "\u00a0", "Å", "変", "压", "器", "。", "1", " ", "\n"]


def test_nfkc_equals_unicodedata_on_every_replaced_character_and_on_mixed_text():
    rng = random.Random(5)
    pool = TRICKY + list(_NFKC_OF)
    cases = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 12))) for _ in range(20_000)]
    cases += [a + b for a in TRICKY for b in TRICKY]
    cases += ["变压器油温，（注）：正常！ＡＢＣ１２３", "ｶﾞｷﾞ", "ﾊﾟﾝ", "A\u030a\u0301", "가\u11a8"]
    bad = [c for c in cases if nfkc(c) != unicodedata.normalize("NFKC", c)]
    assert not bad, bad[:5]
    assert dedup_form("ＧＩＳ，ｶﾞ") == "GIS,ガ"
