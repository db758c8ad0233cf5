"""`llm-pipeline doctor`: what broke a run and what to change.

- patterns:  the real message text of each failure category, with where it comes from
- classify:  log text -> category, stage, evidence lines; `Diagnosis` (+ the retry policy by category)
- remedies:  what to change, with numbers from our planner and the run's config
- logs:      where a failed run's logs are (the stage folders of `--run-id`)
- cli:       `llm-pipeline doctor --log FILE | --run-id ID CONFIG [--json]`
- scoring:   precision and recall per category on the corpus of real logs (tests/doctor/logs/corpus.yaml)
No MindSpore or Prefect import.
"""
