"""What every stage runs on: the stage contract (contract.py), worker subprocesses (worker.py) and
the one subprocess environment (env.py), the stage work folder, local or S3 (stage_folder.py), and
the upstream lookup (upstream.py). Stages import this package (and model/, storage/, config/), never
each other. Import from the submodules; this package re-exports nothing, so importing one part stays
cheap."""
