"""data.filters refused before anything runs, by the data stage's own builder (checks/filters.py)."""
from pipeline_lib.checks.filters import filter_issues
from pipeline_lib.config import config_from_dict


def issues(**sections):
    return {i.field: i for i in filter_issues(config_from_dict(sections))}


def test_filters_are_built_as_the_data_stage_builds_them():
    found = issues(data={"filters": [{"name": "nfkc"}, {"name": "lenght"}]})
    assert "length" in found["data.filters[1].name"].fix
    found = issues(data={"filters": [{"name": "length", "params": {"min_char": 3}}]})
    assert "min_chars" in found["data.filters[0].params"].fix
