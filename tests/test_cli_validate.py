"""The CLI as a user runs it: a real subprocess, exit codes and messages."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TINY = "configs/pipelines/tiny-cpu.yaml"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline_lib.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_validate_tiny_ok_with_token_arithmetic():
    res = cli("validate", TINY)
    assert res.returncode == 0, res.stderr
    assert "tokens per step: 256" in res.stdout and "total tokens: 15,360" in res.stdout


def test_validate_bad_global_batch_exits_2_and_names_formula():
    res = cli("validate", TINY, "training.global_batch_size=7")
    assert res.returncode == 2
    assert "global_batch_size" in res.stderr
    assert "micro_batch_size x gradient_accumulation_steps x data_parallel" in res.stderr


def test_validate_fp16_without_loss_scale_exits_2_naming_the_field():
    res = cli("validate", TINY, "training.precision=fp16", "training.loss_scale.type=none")
    assert res.returncode == 2 and "training.loss_scale.type='none'" in res.stderr
    res = cli("validate", TINY, "model.compute_dtype=float16")
    assert res.returncode == 2 and "model.compute_dtype='float16'" in res.stderr


def test_validate_warns_about_optimizer_sharding_without_data_parallel():
    res = cli("validate", TINY, "parallel.optimizer_shard=true")
    assert res.returncode == 0
    assert "WARNING: parallel.optimizer_shard=true has no effect with parallel.data_parallel=1" in res.stdout
    assert "optimizer_shard" not in cli("validate", TINY).stdout


def test_validate_budgets_the_card_minus_headroom():
    res = cli("validate", "configs/pipelines/llama2-7b-4x64gb.yaml", "--plan-only")
    assert res.returncode == 0, res.stderr
    assert "GB of 59 GB usable (64 GB card - 5 GB headroom)" in res.stdout and "WARNING" not in res.stdout
    tight = cli("validate", "configs/pipelines/llama2-7b-4x64gb.yaml", "--plan-only", "parallel.device_memory_gb=32")
    assert "WARNING: predicted peak" in tight.stdout and "exceeds the usable 27 GB" in tight.stdout


def test_explain_documents_every_field():
    res = cli("validate", "--explain")
    assert res.returncode == 0
    assert "training.optimizer.beta2 = 0.95" in res.stdout
    assert "model.n_kv_heads" in res.stdout


def test_pipeline_lib_never_imports_prefect():
    import ast

    offenders = []
    for path in (ROOT / "pipeline_lib").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            offenders += [f"{path.relative_to(ROOT)}: {n}" for n in names if n.split(".")[0] in ("prefect", "flows", "tasks")]
    assert offenders == []


def test_validate_checks_input_files_and_runtime_rules(tmp_path):
    res = cli("validate", TINY, f"sft.inputs=[{tmp_path}/nope.jsonl]", f"data.inputs=[{tmp_path}/raw/*.jsonl]",
              "training.preflight_steps=2")
    assert res.returncode == 2
    for named in ("sft.inputs[0]", "data.inputs[0]", "training.preflight_steps=2"):
        assert named in res.stderr, res.stderr


def test_run_refuses_a_missing_input_with_exit_2(tmp_path):
    res = subprocess.run([sys.executable, "-m", "flows.cli", "run", TINY, f"sft.inputs=[{tmp_path}/nope.jsonl]",
                          f"run.output_root={tmp_path}/runs"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert res.returncode == 2 and "sft.inputs[0]" in res.stderr, res.stderr
    assert not (tmp_path / "runs").exists()
