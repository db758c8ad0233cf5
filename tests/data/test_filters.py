"""Each cleaning filter on Chinese and English text, and the config errors of build_filters."""
from __future__ import annotations

import pytest

from pipeline_lib.config.schema import DataConfig
from pipeline_lib.data.errors import DataStageError
from pipeline_lib.data.filters import FILTERS, Doc, apply_filters, build_filters


def run(name: str, text: str, **params):
    doc = Doc("t:1", text)
    verdict = FILTERS[name](**params)(doc)
    return verdict, doc.text


ZH = "变压器在运行中需要定期进行红外测温，发现异常应及时记录并上报。检修之前必须确认设备已经停电并挂好接地线。"
EN = "The circuit breaker should receive an infrared inspection every ten days, and any abnormal reading is recorded."


def test_nfkc_folds_fullwidth_compatibility_forms_and_cjk_punctuation():
    assert run("nfkc", "ＡＢＣ１２３，ﬁ")[1] == "ABC123,fi"
    assert run("nfkc", "正常，（注）：是；对！？")[1] == "正常,(注):是;对!?"  # why it is not a default


CJK_PUNCT = "，。、（）：；！？「」『』《》【】“”‘’…—～％"


def test_width_folds_fullwidth_letters_and_digits_and_keeps_cjk_punctuation():
    assert run("width", "ＧＩＳ设备编号１２３ａｂ，（注）：正常！")[1] == "GIS设备编号123ab，（注）：正常！"
    assert run("width", CJK_PUNCT)[1] == CJK_PUNCT
    assert run("width", "e\u0301 ﬁ")[1] == "\u00e9 ﬁ"  # NFC composes; compatibility ligatures stay
    assert run("width", ZH) == (True, ZH)


def test_default_filters_keep_cjk_punctuation_in_the_training_text():
    doc = Doc("t:1", ZH + CJK_PUNCT + "ＧＩＳ")
    assert apply_filters(doc, build_filters(DataConfig().filters)) is None
    assert doc.text == ZH + CJK_PUNCT + "GIS"


def test_strip_control_removes_invisible_characters_and_normalizes_newlines():
    verdict, text = run("strip_control", "数据\u200b清洗\ufeff\x07 ok\r\nnext\rline\ue000\ufffd")
    assert verdict is True and text == "数据清洗 ok\nnext\nline"
    assert run("strip_control", "a\ufffdb", drop_replacement_char=False)[1] == "a\ufffdb"
    assert run("strip_control", "tab\tkept\nnewline kept")[1] == "tab\tkept\nnewline kept"


def test_normalize_whitespace_collapses_spaces_and_blank_lines():
    text = "  变压器\u3000\u3000巡检 \t记录  \n\n\n\n  line two\u00a0 end  "
    assert run("normalize_whitespace", text)[1] == "变压器 巡检 记录\n\nline two end"
    assert run("normalize_whitespace", "a\n\n\nb", max_blank_lines=0)[1] == "a\nb"


@pytest.mark.parametrize("text,reason", [("短文本", "too_short"), ("x" * 50, "too_long"), (ZH, None), (EN, None)])
def test_length(text, reason):
    verdict, _ = run("length", text, min_chars=10, max_chars=49 if reason == "too_long" else 1000)
    assert verdict is True if reason is None else verdict == (False, reason)


def test_duplicate_lines_zh_and_en():
    assert run("duplicate_lines", "\n".join([ZH] * 3 + [EN]))[0] == (False, "dup_lines")
    assert run("duplicate_lines", "\n".join(["短行", "短行", ZH + ZH, EN + EN, "另一行", "第五行"]))[0] is True
    # few repeated lines but they hold most of the characters
    long_line = "设备巡视记录" * 20
    verdict = run("duplicate_lines", "\n".join([long_line, long_line, "a", "b", "c", "d", "e"]))[0]
    assert verdict == (False, "dup_line_chars")
    assert run("duplicate_lines", ZH)[0] is True


def test_top_ngram_uses_word_ngrams_for_en_and_longer_char_ngrams_for_zh():
    spam_en = " ".join(["buy cheap transformers"] * 30)
    assert run("top_ngram", spam_en)[0] == (False, "top_2gram")
    assert run("top_ngram", EN + " " + EN.replace("circuit", "main"))[0] is True
    spam_zh = "点击购买优惠" * 30
    assert run("top_ngram", spam_zh)[0] == (False, "top_2gram")
    normal_zh = ZH + "数据质量决定了模型效果，数据清洗是数据处理中最关键的步骤之一，需要认真对待每一条数据。"
    assert run("top_ngram", normal_zh)[0] is True          # "数据" five times is normal Chinese
    assert run("top_ngram", "重复" * 10)[0] is True          # fewer than min_tokens: not judged


def test_char_ratio_drops_symbol_and_number_tables():
    assert run("char_ratio", "1234 5678 #### ---- 3.14159 ==== 0000")[0] == (False, "low_text_ratio")
    assert run("char_ratio", "   ")[0] == (False, "low_text_ratio")
    assert run("char_ratio", ZH)[0] is True and run("char_ratio", EN)[0] is True
    assert run("char_ratio", "2024年第3季度共完成巡检1200次，发现缺陷35处。")[0] is True


def test_char_ratio_counts_as_the_regexes_do_on_a_batch_at_the_threshold():
    # the batch counts with a per-code-point table; the answer is what re's \\s and [\\W\\d_] count per text
    import re

    def by_regex(t):
        visible = len(t) - len(re.findall(r"\s", t))
        return visible > 0 and len(re.sub(r"[\W\d_]", "", t)) / visible >= 0.5

    texts = ["ab12", "ab123", "a_1 ", "\u3000\u00a0\u2028\x1c", "", "é1", "ｅ１", "变1２", "x\ud800\ud800",
             "Ω" * 3 + "٣" * 3, "\t\n\r\x0b\x0c\x1f\x85ab", "\U0001F600a", "ⅫⅫ", ZH, EN, "1234 5678 ####"]
    docs = [Doc(f"t:{i}", t) for i, t in enumerate(texts)]
    got = FILTERS["char_ratio"]().batch(docs)
    assert [v is True for v in got] == [by_regex(t) for t in texts]
    assert [v is True for v in got] == [True, False, False, False, False, True, True, False, False, True, True,
                                       True, True, True, True, False]  # 0.5 of letters is kept: "ab12", "é1"


def test_url_heavy_and_boilerplate():
    links = "see http://example.com/a/b/c/d/e/f/g and https://example.org/x/y/z/w/v/u"
    assert run("url_heavy", links)[0] == (False, "url_heavy")
    assert run("url_heavy", EN + " More at https://example.com/doc.")[0] is True
    nav = "首页 | 联系我们\n上一篇：设备巡视\n下一篇：检修计划\n版权所有 电力运维中心"
    assert run("url_heavy", nav)[0] == (False, "boilerplate")
    assert run("url_heavy", "Home\nPrivacy policy\nAll rights reserved 2024")[0] == (False, "boilerplate")
    assert run("url_heavy", ZH + "\n" + EN + "\n联系我们：电话 12345")[0] is True


@pytest.mark.parametrize("n", [20, 1000])
@pytest.mark.parametrize("phrases", [None, ["Privacy Policy", "联系我们", "ab"], ["", "x"], ["a\x00b", "上一篇"]])
def test_url_heavy_on_a_batch_gives_each_document_its_own_verdict(n, phrases):
    """The batch searches each phrase once over the texts joined by NUL: a phrase at a text's edge, texts that
    hold NUL themselves, empty texts, phrases that are empty or hold NUL (a match across two texts), the same
    verdicts as one text at a time."""
    import random

    rng = random.Random(n)
    parts = ["联系我们", "PRIVACY POLICY", "上一篇：x", "\x00", "a", "b", "\n", "https://e.com/" + "q" * 40, ZH[:30], EN[:40]]
    texts = ["".join(rng.choice(parts) for _ in range(rng.randrange(0, 6))) for _ in range(n)]
    f = FILTERS["url_heavy"](phrases=phrases)
    want = [f(Doc(f"t:{i}", t)) for i, t in enumerate(texts)]
    assert f.batch([Doc(f"t:{i}", t) for i, t in enumerate(texts)]) == want
    assert {v if v is True else v[1] for v in want} >= {True, "boilerplate"}  # both answers occur
    assert f.batch([]) == []  # every document dropped by an earlier filter


def test_default_filters_keep_normal_zh_and_en_and_report_the_first_drop():
    filters = build_filters(DataConfig().filters)
    for text in (ZH, EN, ZH + "\n\n" + EN):
        assert apply_filters(Doc("x", text), filters) is None
    doc = Doc("x", "  ＡＢ  ")
    assert apply_filters(doc, filters) == ("length", "too_short")
    assert doc.text == "AB"


def test_build_filters_errors_name_the_field():
    with pytest.raises(DataStageError, match=r"data.filters\[0\].name='nope'.*use one of"):
        build_filters([{"name": "nope"}])
    with pytest.raises(DataStageError, match=r"data.filters\[1\].params.*no parameter\(s\) \['min'\]"):
        build_filters([{"name": "nfkc"}, {"name": "length", "params": {"min": 3}}])
    with pytest.raises(DataStageError, match=r"data.filters\[0\].params.*min_chars <= max_chars"):
        build_filters([{"name": "length", "params": {"min_chars": 10, "max_chars": 5}}])


def _reference_share(text: str, n: int, cjk_n: int, min_tokens: int) -> float:
    from collections import Counter

    from pipeline_lib.data.text import tokens

    toks = tokens(text)
    if len(toks) < min_tokens:
        return 0.0
    k = cjk_n if len(toks) * 2 > len(text) else n
    grams = Counter(zip(*(toks[i:] for i in range(k))))
    count, width = max(((c, sum(map(len, g))) for g, c in grams.items()), default=(0, 0))
    return count * width / sum(map(len, toks)) if count >= 2 else 0.0


def test_vectorized_top_ngram_equals_the_counter_definition():
    import random

    from datagen import random_doc

    from pipeline_lib.data.tokenhash import top_ngram_shares

    rng = random.Random(11)
    texts = [random_doc(rng, zh=i % 2 == 0)[: rng.randint(10, 400)] for i in range(150)]
    texts += [" ".join(["buy cheap transformers"] * k) for k in (3, 30)] + ["点击购买优惠" * 30, "", "!!!", ZH, EN]
    texts += [t[:200] + "数据质量" * rng.randint(1, 12) + t[200:] for t in texts[:40]]
    got = top_ngram_shares(texts, 2, 4, 50)
    want = [_reference_share(t, 2, 4, 50) for t in texts]
    assert max(abs(g - w) for g, w in zip(got, want)) < 1e-9
    assert max(want) > 0.5 and sum(w > 0 for w in want) > 20


def test_batch_filtering_gives_the_same_verdicts_as_one_document_at_a_time():
    import random

    from datagen import random_doc

    from pipeline_lib.data.filters import apply_filters_batch

    rng = random.Random(12)
    texts = [random_doc(rng, zh=i % 2 == 0)[: rng.randint(5, 300)] for i in range(60)]
    texts += ["http://a.b/" + "x" * 50, "1 2 3 4 5 6 7 8 9 0 1 2 3 4 5 6 7 8 9 0 ab", "重复" * 60, ZH, EN]
    filters = build_filters(DataConfig().filters)
    one = [apply_filters(Doc(str(i), t), filters) for i, t in enumerate(texts)]
    assert apply_filters_batch([Doc(str(i), t) for i, t in enumerate(texts)], filters) == one
    assert len({v for v in one if v}) >= 3


def test_normalize_whitespace_fast_path_changes_nothing_the_full_rules_would_change():
    """Every short string over an alphabet of all kinds of whitespace and text: the filter's
    result equals the three regex rules applied in full (no fast-path shortcut differs)."""
    import itertools
    import re

    from pipeline_lib.data.filters import Doc, NormalizeWhitespace

    f = NormalizeWhitespace()

    def full(t):
        t = re.sub(r" ?\n ?", "\n", re.sub(r"[^\S\n]+", " ", t))
        return re.sub("\n{3,}", "\n\n", t).strip()
    alphabet = ["a", "中", " ", "\n", "\t", "\u3000", "\xa0", "\x85", "\u2028", "\r", "\x1f"]
    for k in range(1, 5):
        for chars in itertools.product(alphabet, repeat=k):
            doc = Doc("x", "".join(chars))
            f(doc)
            assert doc.text == full("".join(chars)), repr("".join(chars))
