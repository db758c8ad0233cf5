"""Fuzzed configs into `llm-pipeline validate` (issue 16, "Fuzzed input"): random `key=value` overrides over
the schema's fields (wrong types, out-of-range numbers, YAML syntax errors, unknown keys, unicode, a scalar
for a section) on the bundled tiny config. Run in-process through the CLI's main with captured output
(plus a few real subprocesses). Properties: no traceback, exit 0 or 2, and every refusal names a field."""
from __future__ import annotations

import contextlib
import io
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from fuzz_inputs import TEXT, examples
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_lib.config.schema import PipelineConfig

RELIABILITY_ROW = "fuzz"
ROOT = Path(__file__).resolve().parents[2]
CONFIG = "configs/pipelines/tiny-cpu.yaml"


def schema_paths(model=PipelineConfig, prefix: str = "") -> list[str]:
    """Every dotted field path of the schema, sections included."""
    out = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        out.append(prefix + name)
        if isinstance(ann, type) and hasattr(ann, "model_fields"):
            out += schema_paths(ann, f"{prefix}{name}.")
    return out


PATHS = schema_paths()
SECTIONS = sorted({p.split(".")[0] for p in PATHS})
# Fields whose value reaches the network or another machine's path: a random value there makes
# `validate` probe a host; their types are still fuzzed through the other value kinds.
NETWORK = {"run.s3_endpoint_url", "data.dask_address"}

YAML_TEXT = st.sampled_from(["[", "{a: b", "]", "a: b: c", "!!python/object:os.system", "*undefined_alias",
                             "&x [1, *x]", "'unterminated", "- - -", "? complex", "@at", "`tick", "%TAG",
                             "1e999", "-1e999", ".nan", ".inf", "0x1F", "0o17", "1_000", "2026-12-01", "~",
                             "yes", "Off", "[1, [2, [3, [4]]]]", "{}", "[]", '"\\ud800"', "\t", "\x00"])
NUMBER = st.one_of(st.integers(), st.integers(-3, 3), st.sampled_from([2**63, -(2**63), 10**30]),
                   st.floats(allow_nan=True, allow_infinity=True))
VALUE_TEXT = st.one_of(
    YAML_TEXT,
    NUMBER.map(lambda v: repr(v) if not isinstance(v, float) or math.isfinite(v) else str(v)),
    TEXT.filter(lambda s: "\x00" not in s),
    st.lists(st.one_of(NUMBER.map(str), st.text("abcxyz_", max_size=6)), max_size=4).map(lambda v: "[" + ",".join(v) + "]"),
    st.sampled_from(["true", "false", "null", "", " ", "{x: 1}", "[wq, wv]", "bpe", "drop", "CPU", "fp16"]),
)
KEY = st.one_of(
    st.sampled_from([p for p in PATHS if p not in NETWORK]),
    st.sampled_from(SECTIONS).flatmap(lambda s: st.text("abcdefghijklmnopqrstuvwxyz_é设", min_size=1, max_size=10)
                                      .map(lambda k: f"{s}.{k}")),                   # unknown key in a section
    st.text("abcdefghijklmnopqrstuvwxyz_.", min_size=1, max_size=15),           # any dotted name
    st.sampled_from(SECTIONS).map(lambda s: f"{s}.x.y"),                        # deeper than a section
)
OVERRIDE = st.tuples(KEY, VALUE_TEXT).map(lambda kv: f"{kv[0]}={kv[1]}")
ISSUE = re.compile(r"^  - (\S+?)=", re.S)


def run_cli(argv: list[str]) -> tuple[int, str, str]:
    from flows.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse refusing an argument: exit 2 with a usage line, no traceback
            code = exit_.code
    return code, out.getvalue(), err.getvalue()


def refusal_fields(stderr: str) -> list[str]:
    """The field each refusal line (`  - field=value: problem. Fix: ...`) names."""
    lines = [line for line in stderr.split("\n") if line.startswith("  - ")]
    return [m.group(1) if (m := ISSUE.match(line)) else "" for line in lines]


def known_field(name: str, overrides: list[str]) -> bool:
    keys = {o.split("=", 1)[0].strip() for o in overrides} | {o for o in overrides if "=" not in o}
    top = name.split(".")[0]
    return (name in PATHS or name in keys or name == "CONFIG" or top in SECTIONS
            or any(k.startswith(name + ".") or name.startswith(k + ".") for k in keys))


@pytest.fixture(autouse=True, scope="module")
def _in_repo():
    cwd = os.getcwd()
    os.chdir(ROOT)
    yield
    os.chdir(cwd)


@settings(max_examples=examples(120, 1500))
@given(st.lists(OVERRIDE, min_size=1, max_size=4), st.booleans())
def test_validate_never_prints_a_traceback_and_names_the_field(tally, overrides, plan_only):
    tally.add(RELIABILITY_ROW, records=1, configs=1)
    argv = ["validate", CONFIG, *(["--plan-only"] if plan_only else []), *overrides]
    code, out, err = run_cli(argv)
    assert "Traceback" not in out + err
    assert code in (0, 2), (code, err[-2000:])
    if code == 2 and "usage:" not in err:
        fields = refusal_fields(err)
        assert fields, err
        for name in fields:
            assert name and known_field(name, overrides), (name, err)


@pytest.mark.parametrize("override", ["training.steps=[", "model.hidden_size=1e999", "data.dedup=7",
                                      "training=[1, 2]", "sft.lora_rank=-3", "run.seed=\u202e\u200b"])
def test_validate_in_a_real_subprocess_refuses_without_a_traceback(override, tally):
    tally.add(RELIABILITY_ROW, records=1, configs=1)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-m", "flows.cli", "validate", CONFIG, override], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
    field = override.split("=", 1)[0]
    assert all(f and known_field(f, [override]) for f in refusal_fields(proc.stderr)) and field.split(".")[0] in \
        proc.stderr, proc.stderr


SECTION_BODY = st.one_of(st.dictionaries(st.text("abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12),
                                         st.one_of(NUMBER, TEXT, st.booleans(), st.none(), st.lists(NUMBER, max_size=3)),
                                         max_size=4),
                         NUMBER, TEXT, st.lists(NUMBER, max_size=3), st.none())
CONFIG_FILE = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(SECTIONS), TEXT), SECTION_BODY, max_size=5).map(
        lambda d: __import__("yaml").safe_dump(d, allow_unicode=True)),
    TEXT, YAML_TEXT, st.binary(max_size=60).map(lambda b: b.decode("latin-1")))


@settings(max_examples=examples(40, 800))
@given(CONFIG_FILE)
def test_validate_of_any_config_file_never_prints_a_traceback(tally, tmp_path_factory, text):
    tally.add(RELIABILITY_ROW, records=1, configs=1)
    path = tmp_path_factory.mktemp("cfg") / "fuzz.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    code, out, err = run_cli(["validate", str(path)])
    assert "Traceback" not in out + err and code in (0, 2), err[-2000:]
    if code == 2:
        fields = refusal_fields(err)
        # named as written, quoted (a repr), or a non-string key as YAML spells it (`?` is the key null)
        named = [f for f in fields if known_field(f, []) or f in text or f.startswith(("'", '"'))
                 or f.rsplit(".", 1)[-1] in ("null", "true", "false")]
        assert fields and len(named) == len(fields), err
