"""A trainer entry that dies of SIGKILL (run as `python -m`, like the real entry module, by
pipeline_lib.train.runner.launch_trainer). With LLM_PIPELINE_TEST_OOM_EVENTS naming a memory.events file it first
raises that file's `oom` and `oom_kill` counts, as the kernel does when its OOM killer kills a process of the cgroup;
without it the kill is like a lost node's or an operator's kill -9."""
import os
import re
import signal
from pathlib import Path

print("pretrain: allocating", flush=True)
events = os.environ.get("LLM_PIPELINE_TEST_OOM_EVENTS")
if events:
    text = Path(events).read_text()
    bump = lambda m: f"{m.group(1)} {int(m.group(2)) + 1}"  # noqa: E731
    Path(events).write_text(re.sub(r"^(oom|oom_kill) (\d+)$", bump, text, flags=re.M))
os.kill(os.getpid(), signal.SIGKILL)
