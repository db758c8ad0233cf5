"""What every stage runs on: the stage contract, worker subprocesses, the stage work folder and
the upstream lookup. Stages import this package (and model/, storage/, config/), never each other.
Import from the submodules; this package re-exports nothing, so importing one part stays cheap."""
