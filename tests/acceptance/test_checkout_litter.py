"""The litter check every acceptance test ends with (conftest.user_repo) sees what a run leaves in the checkout."""
from __future__ import annotations


def test_files_written_outside_runs_are_seen_and_runs_is_not(user_repo):
    user_repo.run("mkdir -p runs/r1 output/log && echo x > runs/r1/ok.txt && echo y > output/log/mindformer.log "
                  "&& echo z > stray.txt")
    assert user_repo.leftovers() == ["output/log/mindformer.log", "stray.txt"]
    user_repo.run("rm -r output stray.txt")
    assert user_repo.leftovers() == []
    assert "LOG_MF_PATH" not in user_repo.env and "GLOG_v" not in user_repo.env  # a user's shell, not the suite's
