from pathlib import Path

import pytest

from pipeline_lib.config import ConfigError, check, config_from_dict, config_hash, load_config
from pipeline_lib.config.load import apply_overrides, read_config_file

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted((ROOT / "configs" / "pipelines").glob("*.yaml"))


def test_there_are_shipped_configs():
    names = {p.name for p in SHIPPED}
    assert {"tiny-cpu.yaml", "llama-1.5b-lite.yaml", "llama2-7b-4x64gb.yaml"} <= names


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_every_shipped_config_validates(path):
    cfg = load_config(path)
    # Ascend layouts are checked as plans here (this machine has no NPU); tiny-cpu as a real run.
    assert check(cfg, for_run=cfg.run.device_target != "Ascend") == []


def test_defaults_are_the_tiny_cpu_run():
    assert check(config_from_dict({}), for_run=True) == []


def test_dotted_overrides_are_typed(tmp_path):
    cfg = load_config(ROOT / "configs/pipelines/tiny-cpu.yaml",
                      ["training.steps=7", "training.optimizer.beta2=0.99", "sft.target_modules=[wq,wv]",
                       "run.output_root=s3://b/p", "model.n_kv_heads=null"])
    assert cfg.training.steps == 7
    assert cfg.training.optimizer.beta2 == 0.99
    assert cfg.sft.target_modules == ["wq", "wv"]
    assert cfg.run.output_root == "s3://b/p"
    assert cfg.model.n_kv_heads is None and cfg.model.kv_heads == cfg.model.num_heads


def test_unknown_field_is_named(tmp_path):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/pipelines/tiny-cpu.yaml", ["training.stpes=7"])
    assert "training.stpes" in err.value.fields()
    assert "spelling" in str(err.value)


def test_bad_type_names_field_and_value():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"model": {"hidden_size": "wide"}})
    assert "model.hidden_size" in str(err.value) and "'wide'" in str(err.value)


def test_override_without_equals_is_refused():
    with pytest.raises(ConfigError, match="section.field=value"):
        load_config(ROOT / "configs/pipelines/tiny-cpu.yaml", ["training.steps"])


def test_missing_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="file not found"):
        load_config(tmp_path / "nope.yaml")


def test_config_hash_changes_with_a_field_only():
    a = config_from_dict({})
    b = config_from_dict({"training": {"steps": 61}})
    assert config_hash(a.data) == config_hash(b.data)
    assert config_hash(a.training) != config_hash(b.training)


@pytest.mark.parametrize("override", ["training.steps=[", "run.name=a: b: c", "data.text_field=*alias",
                                      "sft.system_prompt=!!python/object:os.system", "run.name=\x1b[31m"])
def test_an_override_that_is_no_yaml_value_is_named(override):
    """Found by tests/reliability/test_fuzz_config.py: a yaml error escaped as a traceback."""
    key, raw = override.split("=", 1)
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "pipelines" / "tiny-cpu.yaml", [override])
    (issue,) = err.value.issues
    assert (issue.field, issue.value) == (key, raw) and "YAML" in issue.problem and "Fix: " in str(issue)


@pytest.mark.parametrize("override", [".=1", "=5", "training..steps=3", "training.=3"])
def test_an_override_with_an_empty_field_name_is_named(override):
    """Found by tests/reliability/test_fuzz_config.py: `.=[1]` was refused as `(config)={'': ...}`."""
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs" / "pipelines" / "tiny-cpu.yaml", [override])
    (issue,) = err.value.issues
    assert issue.field == (override.split("=", 1)[0] or override) and "not a field path" in issue.problem


def test_a_config_file_that_is_no_utf8_is_named(tmp_path):
    """Found by tests/reliability/test_fuzz_config.py: a UnicodeDecodeError traceback."""
    path = tmp_path / "bad.yaml"
    path.write_bytes(b"run:\n  name: \xed\xa0\x80\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.fields() == ["CONFIG"] and "UTF-8" in str(err.value)


def test_a_blank_key_is_named_quoted(tmp_path):
    """Found by tests/reliability/test_fuzz_config.py: a blank top-level key was refused as `(config)`."""
    path = tmp_path / "blank.yaml"
    path.write_text('"   ": 1\nrun: {name: x}\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.fields() == ["'   '"]


def test_a_key_that_is_no_unicode_text_is_named(tmp_path):
    """Found by tests/reliability/test_fuzz_config.py: a "\\uD800" key was refused as `(config)`."""
    path = tmp_path / "surrogate.yaml"
    path.write_text('run:\n  "\\uD800x": 1\n')
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.fields() == ["run.'\\ud800x'"]


@pytest.mark.parametrize("text, field", [("?\n", "null"), ("run:\n  ~: 1\n", "run.null"),
                                         ("data:\n  7: x\n", "data.7"), ("true: 1\n", "true")])
def test_a_key_that_is_no_name_is_named_as_yaml_spells_it(tmp_path, text, field):
    """Found by tests/reliability/test_fuzz_config.py in a clean-clone run: a file holding `?` (YAML's null key)
    was refused as `None=None: Keys should be strings`, naming a field the user never wrote."""
    path = tmp_path / "key.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert err.value.fields() == [field]
    assert "not a name" in str(err.value) and "before the colon" in str(err.value)


def test_yaml_aliases_are_refused_before_they_expand(tmp_path):
    """435 bytes of nested aliases made a 58 MB error message: an alias is refused where it appears."""
    from pipeline_lib.config.errors import ConfigError

    rows = ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    rows += [f"{n}: &{n} [{', '.join(['*' + p] * 9)}]" for p, n in zip("abcdefg", "bcdefgh")]
    path = tmp_path / "laughs.yaml"
    path.write_text("\n".join(rows + ["run: {name: *h}"]) + "\n")
    with pytest.raises(ConfigError) as caught:
        load_config(str(path))
    assert "aliases are not allowed" in str(caught.value) and len(str(caught.value)) < 1000
    with pytest.raises(ConfigError, match="aliases are not allowed"):
        load_config("configs/pipelines/tiny-cpu.yaml", ["run.name=[&x [a, b], *x, *x]"])


@pytest.mark.parametrize("override", ["data.num_workers=100000", "data.dedup.num_perm=100000000",
                                      "training.steps=1e29", "training.steps=100000000000", "sft.steps=10000000000"])
def test_counts_that_allocate_have_upper_bounds(override):
    from pipeline_lib.config.errors import ConfigError

    with pytest.raises(ConfigError) as caught:
        load_config("configs/pipelines/tiny-cpu.yaml", [override])
    assert override.split("=")[0] in str(caught.value)


# issue 45 items 9 and 11: bounds on what a config file can cost, and no value of an unknown key echoed

def _validate(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "flows.cli", "validate", *map(str, args)], capture_output=True,
                          text=True, timeout=120)


def test_deep_yaml_nesting_is_refused_with_the_fix_and_exit_2(tmp_path):
    deep = tmp_path / "deep.yaml"
    deep.write_text("a:\n" + "".join(" " * (i + 1) + f"k{i}:\n" for i in range(400)) + " " * 401 + "v: 1\n")
    flow = tmp_path / "flow.yaml"
    flow.write_text("run: " + "[" * 400 + "]" * 400 + "\n")
    for path in (deep, flow):
        done = _validate(path)
        assert done.returncode == 2 and "Traceback" not in done.stderr + done.stdout
        assert "nested deeper than 32 levels" in done.stdout + done.stderr and "Fix: remove the nesting" in \
            done.stdout + done.stderr


def test_deep_values_from_overrides_and_sections_are_refused():
    with pytest.raises(ConfigError, match="nested deeper"):
        apply_overrides({}, ["a" + ".b" * 40 + "=1"])
    value: list = []
    for _ in range(400):
        value = [value]
    with pytest.raises(ConfigError, match="nested deeper"):
        config_from_dict({"run": {"name": value}})


def test_a_config_file_over_the_size_cap_is_refused_before_it_is_parsed(tmp_path):
    big = tmp_path / "big.yaml"
    with open(big, "w") as fh:  # a million keys: 205 s and 1.9 GB before
        fh.write("run:\n")
        fh.writelines(f"  k{i}: 1\n" for i in range(1_000_000))
    with pytest.raises(ConfigError, match="larger than 1 MiB") as err:
        read_config_file(big)
    assert err.value.fields() == ["CONFIG"]


def test_errors_printed_are_capped_and_counted():
    with pytest.raises(ConfigError) as err:
        config_from_dict({"run": {f"k{i}": i for i in range(500)}})
    assert len(err.value.issues) == 500
    text = str(err.value)
    assert text.count("\n  - ") == 50 and "... and 450 more issues" in text


def test_the_value_of_an_unknown_key_is_never_echoed(tmp_path):
    token = "eyJhbGciOiJSUzI1NiIsImtpZCI6IkxBQkVMIn0.secret-token-part"
    cfg = tmp_path / "kube.yaml"
    cfg.write_text(f"run:\n  name: x\nusers:\n- name: admin\n  user:\n    token: {token}\n")
    done = _validate(cfg)
    assert done.returncode == 2 and "users" in done.stdout + done.stderr
    assert token not in done.stdout + done.stderr and "secret-token" not in done.stdout + done.stderr
