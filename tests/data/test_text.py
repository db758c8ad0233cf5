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


def test_single_spaced_is_true_only_where_collapsing_whitespace_changes_nothing():
    import re

    from pipeline_lib.data.text import _SPACES, exact_key, single_spaced
    every = [chr(c) for c in range(0x110000)]
    spaces = [c for c in every if re.match(r"\s", c)]
    assert len(spaces) > 20 and all(c == " " or not single_spaced(f"a{c}b") for c in spaces)
    texts = ["变压器 检修", "a b c", "a  b", "a\u3000b", "a\tb", "a\u00a0b", "a\u2028b", "x\x1cy", "ab"]
    assert [single_spaced(t) for t in texts] == [True, True, False, False, False, False, False, False, True]
    assert all(_SPACES.sub(" ", t) == t for t in texts if single_spaced(t))
    # the key collapses every kind of whitespace either way (the fast path only skips the identity)
    assert exact_key("变压器\u3000 检修") == exact_key("变压器 检修") == exact_key(" 变压器\t检修\n")
    assert exact_key("变压器检修") != exact_key("变压器 检修")


def test_a_form_said_to_keep_its_tokens_has_the_texts_tokens():
    from pipeline_lib.data.text import dedup_form_keeping_tokens, tokens

    rng = random.Random(11)
    pool = TRICKY + list(_NFKC_OF) + ["Σ", "σ", "α", "'", "＇", ".", "．", "x"]
    cases = ["".join(rng.choice(pool) for _ in range(rng.randint(1, 12))) for _ in range(20_000)]
    cases += [f"{a}{c}{b}" for c in _NFKC_OF for a, b in (("a", "b"), ("中", "文"), ("1", "2"), ("ΑΣ", "Α"))]
    kept = 0
    for text in cases:
        form, same = dedup_form_keeping_tokens(text)
        assert form == dedup_form(text), text
        if same:
            kept += 1
            assert tokens(form) == tokens(text), text
    assert kept > 500  # the claim is made, not only withheld
    # known answers: punctuation folds keep the tokens; digits, ligatures, circled numbers and sigma do not
    assert dedup_form_keeping_tokens("变压器，油温（注）：正常！") == ("变压器,油温(注):正常!", True)
    assert [dedup_form_keeping_tokens(t)[1] for t in ("油温１２３", "ﬁne", "①项", "ΑΣ", "a\u3000b")] == \
        [False, False, False, False, True]
