"""What every stage runs on: the stage contract (contract.py), the one subprocess launcher (launcher.py,
with process_tree.py) and the environment it gives every child (env.py), the collector around a child's imports
and exit (lean_process.py), worker subprocesses on top of
it (worker.py), the stage work folder, local or S3 (stage_folder.py), and the upstream lookup
(upstream.py). Stages import this package (and model/, storage/, config/), never each other. Import
from the submodules; this package re-exports nothing, so importing one part stays cheap."""
