"""Generate the bundled demo corpus configs/data/tiny_corpus.jsonl (deterministic).

    python tests/data/make_tiny_corpus.py            # rewrites configs/data/tiny_corpus.jsonl

Power-equipment maintenance prose in Chinese and English, built from templates so that a tiny
model's loss falls within ~60 steps, plus planted cases the data stage must account for:
exact duplicates (one differing only in spaces and case), near duplicates (one sentence
changed), malformed lines (bad JSON, bad UTF-8, missing / non-string / empty text, empty line,
not an object) and documents the default filters drop (too short, URL-heavy, symbol-heavy,
repeated lines, boilerplate). `PLANTED` gives the expected counts. Every record has an `id` (as a
source system would give it: `pm-0001`... in file order, planted copies included), `lang` and
`source`; the quarantined records that are still JSON objects name an id too.
"""
from __future__ import annotations

import json
import random
from collections import Counter
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from pipeline_lib.data.text import shingles, tokens  # noqa: E402

OUT = ROOT / "configs" / "data" / "tiny_corpus.jsonl"
SEED = 20240611

ZH_EQUIP = ["主变压器", "断路器", "隔离开关", "电缆线路", "避雷器", "电流互感器", "开关柜", "继电保护装置",
            "直流电源系统", "储能电池组", "GIS组合电器", "接地网"]
ZH_ACTION = ["巡视检查", "红外测温", "绝缘电阻测试", "油色谱分析", "局部放电检测", "螺栓紧固", "清扫积尘",
             "密封件更换", "保护定值核对", "接地电阻测量"]
ZH_FAULT = ["过热", "异常声响", "渗漏油", "放电痕迹", "绝缘下降", "锈蚀", "指示异常", "告警信号"]
ZH_SITE = ["青山", "河西", "东湖", "北郊", "南港", "西岭", "滨江", "高新"]
ZH_TEMPLATES = [
    "{e}在运行中需要定期进行{a}，发现异常应及时记录并上报。",
    "每{n}天对{e}开展一次{a}，重点关注温度、声音和气味的变化。",
    "如果{e}出现{f}，运维人员应立即停止作业并通知调度。",
    "{a}的结果应与历史数据进行对比，以判断{e}的健康状态。",
    "检修{e}之前必须确认设备已经停电并挂好接地线，确保人身安全。",
    "{s}变电站的{e}上一次{a}发现了轻微{f}，本次复查后已经恢复正常。",
    "雨季到来之前，应对{e}的防潮措施进行检查，避免{f}扩大。",
    "新投运的{e}在第一个月内需要加强{a}，每次都要填写记录表。",
    "{e}的{a}应由两名以上持证人员共同完成，一人操作一人监护。",
    "当{e}的负荷超过额定值的{p}%时，需要缩短{a}的周期。",
]
EN_EQUIP = ["main transformer", "circuit breaker", "disconnect switch", "cable line", "surge arrester",
            "current transformer", "switchgear", "protection relay", "battery bank", "grounding grid"]
EN_ACTION = ["visual inspection", "infrared thermography", "insulation resistance test", "dissolved gas analysis",
             "partial discharge test", "bolt torque check", "dust cleaning", "relay setting check"]
EN_FAULT = ["overheating", "abnormal noise", "oil leakage", "discharge marks", "low insulation", "corrosion"]
EN_TEMPLATES = [
    "The {e} should receive a {a} every {n} days, and any abnormal reading must be recorded.",
    "Before maintenance on the {e}, confirm that it is de-energized and that grounding is in place.",
    "If the {e} shows {f}, the crew must stop work and inform the dispatcher at once.",
    "Compare the result of the {a} with earlier records to judge the condition of the {e}.",
    "A {a} of the {e} at the {s} substation found slight {f}, which was fixed during the outage.",
    "New {e} units need a closer {a} during their first month in service.",
    "When the load on the {e} exceeds {p} percent of its rating, shorten the interval of the {a}.",
    "Two qualified workers carry out the {a} of the {e}: one operates and one supervises.",
]
EN_SITES = ["Green Hill", "West River", "East Lake", "North Field", "South Port", "Riverside"]


def _doc(rng: random.Random, zh: bool) -> str:
    templates, equip, act, fault, sites = ((ZH_TEMPLATES, ZH_EQUIP, ZH_ACTION, ZH_FAULT, ZH_SITE) if zh else
                                           (EN_TEMPLATES, EN_EQUIP, EN_ACTION, EN_FAULT, EN_SITES))
    e = rng.choice(equip)
    picks = rng.sample(templates, rng.randint(3, 6))
    sentences = [t.format(e=e if rng.random() < 0.7 else rng.choice(equip), a=rng.choice(act), f=rng.choice(fault),
                          s=rng.choice(sites), n=rng.choice([7, 10, 15, 30]), p=rng.choice([80, 90, 110]))
                 for t in picks]
    sep = "" if zh else " "
    if len(sentences) >= 5 and rng.random() < 0.4:  # some documents have two paragraphs
        return sep.join(sentences[:3]) + "\n" + sep.join(sentences[3:])
    return sep.join(sentences)


def _shingles(text: str) -> set:
    return set(shingles(tokens(text), 5))


def jaccard(a: str, b: str) -> float:
    x, y = _shingles(a), _shingles(b)
    return len(x & y) / len(x | y)


BAD_LINES = [
    b'{"text": "\xe5\x8f\x98\xe5\x8e\x8b\xe5\x99\xa8\xff\xfe broken bytes in the middle of a record"}',  # bad_utf8
    b'{"text": "an unterminated record about the circuit breaker',                                        # bad_json
    b'{"id": "pm-x01", "content": "the text field is missing from this record"}',                          # missing_text
    b'{"id": "pm-x02", "text": 20240611}',                                                                # text_not_string
    b'{"text": "   "}',                                                                                   # empty_text
    b'',                                                                                                  # empty_line
    b'["a JSON list, not an object"]',                                                                    # not_an_object
]
FILTERED = [
    "变压器巡检。",                                                                                        # too_short
    "Reference links: http://example.com/a/b/c/d/e/f http://example.com/g/h/i/j/k https://example.org/x/y/z",  # url_heavy
    "1234 5678 #### ---- 3.14159 2.71828 ==== 0000 9999 #### 1111 ---- 2222",                             # low_text_ratio
    "设备巡视记录表第一页\n设备巡视记录表第一页\n设备巡视记录表第一页\n设备巡视记录表第二页",                    # dup_lines
    "首页 | 联系我们\n上一篇：设备巡视\n下一篇：检修计划\n版权所有 电力运维中心",                                 # boilerplate
]
PLANTED = {"rejected": 7, "filtered": 5, "exact_duplicates": 3, "near_duplicates": 3}


def make_corpus(n_docs: int = 420, seed: int = SEED) -> list[bytes]:
    """The corpus as jsonl lines (bytes), deterministic for a seed."""
    rng = random.Random(seed)
    docs: list[str] = []
    sizes: list[int] = []
    postings: dict[str, list[int]] = {}
    while len(docs) < n_docs:  # unplanted documents must not be near duplicates of each other
        text = _doc(rng, zh=rng.random() < 0.65)
        sh = _shingles(text)
        shared = Counter(i for s in sh for i in postings.get(s, ()))
        if all(n / (len(sh) + sizes[i] - n) < 0.5 for i, n in shared.items()):
            for s in sh:
                postings.setdefault(s, []).append(len(docs))
            docs.append(text)
            sizes.append(len(sh))
    lines = [{"text": t, "source": "tiny"} for t in docs]
    exact = [docs[3], docs[40], docs[100].upper().replace(" ", "  ") if docs[100].isascii() else docs[100] + " "]
    near = []
    for src in [d for d in docs[5:150] if "，" in d and len(d) > 120][:3]:  # two characters inserted: J > 0.9
        near.append(src.replace("，", "，并且", 1))
        assert jaccard(src, near[-1]) > 0.9
    extra = [{"text": t, "source": "dup"} for t in exact + near] + [{"text": t, "source": "filtered"} for t in FILTERED]
    for item in extra:
        lines.insert(rng.randint(150, len(lines)), item)
    lines = [{"id": f"pm-{i + 1:04d}", "text": x["text"], "lang": "en" if x["text"].isascii() else "zh",
              "source": x["source"]} for i, x in enumerate(lines)]
    out = [json.dumps(x, ensure_ascii=False).encode("utf-8") for x in lines]
    for bad in BAD_LINES:
        out.insert(rng.randint(1, len(out) - 1), bad)
    return out


def main() -> None:
    data = b"\n".join(make_corpus()) + b"\n"
    OUT.write_bytes(data)
    print(f"wrote {OUT} ({len(data)} bytes)")


if __name__ == "__main__":
    main()
