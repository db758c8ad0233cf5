"""Generate the bundled instruction samples configs/data/tiny_sft.jsonl (deterministic).

    python tests/data/make_tiny_sft.py            # rewrites configs/data/tiny_sft.jsonl

Power-equipment maintenance questions and answers in Chinese and English (the domain of
tiny_corpus.jsonl), in the three shapes the SFT stage reads: prompt/response, alpaca
(instruction/input/output) and multi-turn messages (some with a system turn), short enough for the
tiny model's 64-token rows. Then the planted malformed lines of `PLANTED`, which the SFT stage must
quarantine with these reasons.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUT = ROOT / "configs" / "data" / "tiny_sft.jsonl"
SEED = 20240612

ZH_FACTS = [
    ("主变压器", "红外测温", "每月一次"), ("断路器", "机械特性测试", "每年一次"),
    ("电缆线路", "局部放电检测", "每季度一次"), ("避雷器", "泄漏电流测量", "每半年一次"),
    ("开关柜", "清扫积尘", "每季度一次"), ("储能电池组", "内阻测试", "每月一次"),
    ("接地网", "接地电阻测量", "每年一次"), ("继电保护装置", "保护定值核对", "每半年一次"),
]
EN_FACTS = [
    ("main transformer", "infrared thermography", "once a month"),
    ("circuit breaker", "timing test", "once a year"),
    ("cable line", "partial discharge test", "every quarter"),
    ("surge arrester", "leakage current check", "every six months"),
    ("switchgear", "dust cleaning", "every quarter"),
    ("battery bank", "internal resistance test", "once a month"),
]
ZH_FAULTS = [("主变压器", "油温过高", "检查冷却风扇和负荷，必要时降低负荷并通知调度。"),
             ("断路器", "拒动", "立即停止操作，检查控制回路和操作机构。"),
             ("电缆线路", "局部放电", "缩短检测周期，安排停电检修。"),
             ("开关柜", "异常声响", "远离设备，通知调度并安排红外测温。")]
EN_FAULTS = [("main transformer", "high oil temperature", "Check the cooling fans and the load, then call dispatch."),
             ("circuit breaker", "failure to trip", "Stop switching and check the control circuit."),
             ("battery bank", "low voltage", "Check the charger and measure each cell.")]
SYSTEM_ZH = "你是变电站运维助手，回答要简洁。"
SYSTEM_EN = "You are a substation maintenance assistant. Answer briefly."

# Malformed lines appended at the end: (raw line, reason the SFT stage must give).
PLANTED = [
    ('{"prompt": "断路器多久检查一次", "response": ', "bad_json"),
    (json.dumps({"instruction": "Describe the grounding grid test.", "input": "", "output": "  "}), "empty_response"),
    (json.dumps({"messages": [{"role": "user", "content": "避雷器有什么作用？"}]}, ensure_ascii=False),
     "ends_without_response"),
]


def _samples(rng: random.Random) -> list[dict]:
    out: list[dict] = []
    for e, a, n in ZH_FACTS:
        out.append({"prompt": f"{e}的{a}多久做一次？", "response": f"{e}的{a}应{n}。"})
        out.append({"instruction": "回答运维问题。", "input": f"{e}需要做哪项检测？", "output": f"{e}需要定期做{a}，{n}。"})
        out.append({"messages": [{"role": "system", "content": SYSTEM_ZH},
                                 {"role": "user", "content": f"{a}适用于什么设备？"},
                                 {"role": "assistant", "content": f"{a}常用于{e}。"}]})
    for e, a, n in EN_FACTS:
        out.append({"prompt": f"How often is the {e} {a} done?", "response": f"The {e} {a} is done {n}."})
        out.append({"instruction": "Answer the maintenance question.", "input": f"Which test does the {e} need?",
                    "output": f"The {e} needs a {a} {n}."})
    for e, f, fix in ZH_FAULTS:
        out.append({"messages": [{"role": "system", "content": SYSTEM_ZH},
                                 {"role": "user", "content": f"{e}出现{f}怎么办？"},
                                 {"role": "assistant", "content": fix}]})
        out.append({"messages": [{"role": "user", "content": f"{e}{f}是什么问题？"},
                                 {"role": "assistant", "content": f"这是{e}的{f}故障。"},
                                 {"role": "user", "content": "应该怎么处理？"},
                                 {"role": "assistant", "content": fix}]})
    for e, f, fix in EN_FAULTS:
        out.append({"messages": [{"role": "system", "content": SYSTEM_EN},
                                 {"role": "user", "content": f"The {e} shows {f}. What now?"},
                                 {"role": "assistant", "content": fix}]})
        out.append({"instruction": f"The {e} shows {f}.", "input": "", "output": fix})
    out.append({"prompt": "巡视前要做什么准备？", "response": "核对工作票，检查安全帽、绝缘手套和测温仪。", "system": SYSTEM_ZH})
    out.append({"prompt": "What must be done before working on a breaker?",
                "response": "Switch it off, verify no voltage and attach the grounding leads."})
    out.append({"instruction": "把下面的句子翻译成英文。", "input": "断路器需要每年做一次机械特性测试。",
                "output": "The circuit breaker needs a timing test once a year."})
    out.append({"instruction": "Translate into Chinese.", "input": "The switchgear is cleaned every quarter.",
                "output": "开关柜每季度清扫一次。"})
    rng.shuffle(out)
    return out


def main() -> None:
    rng = random.Random(SEED)
    lines = [json.dumps(s, ensure_ascii=False) for s in _samples(rng)]
    lines += [raw for raw, _ in PLANTED]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {len(lines)} lines ({len(PLANTED)} malformed) to {OUT}")


if __name__ == "__main__":
    main()
