"""sbatch --dependency as users chain their pipelines."""

import pytest
from hypothesis import given, strategies as st

from shoal.model.dependency import DependencyError, format_dependency, parse_dependency
from shoal.model.snapshot import Dependency


def test_all_clauses_must_hold_when_joined_by_commas():
    assert parse_dependency("after:12:13,afterok:14") == (
        (Dependency("after", (12, 13)), Dependency("afterok", (14,))),
        False,
    )


def test_any_clause_suffices_when_joined_by_question_marks():
    assert parse_dependency("afterok:12?afterok:13") == (
        (Dependency("afterok", (12,)), Dependency("afterok", (13,))),
        True,
    )


def test_every_kind_is_known():
    for kind in ("after", "afterany", "afterok", "afternotok", "aftercorr"):
        assert parse_dependency(f"{kind}:7") == ((Dependency(kind, (7,)),), False)
    assert parse_dependency("singleton") == ((Dependency("singleton"),), False)


def test_an_array_task_reference_waits_for_the_whole_array_job():
    assert parse_dependency("afterok:12_3:15") == ((Dependency("afterok", (12, 15)),), False)


def test_kinds_are_case_insensitive():
    assert parse_dependency("AfterOK:5") == ((Dependency("afterok", (5,)),), False)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("", "empty --dependency"),
        ("afterok", "needs at least one job id"),
        ("afterok:", "needs at least one job id"),
        ("afterok:x", "'x' is not a job id"),
        ("afterok:12_", "'12_' is not a job id"),
        ("before:12", "unknown type 'before'"),
        ("afterok:1,afterany:2?after:3", "cannot be mixed"),
        ("singleton:4", "singleton takes no job ids"),
        ("after:12+5", "delays"),
        ("afterok:0", "start at 1"),
    ],
)
def test_bad_dependencies_say_what_is_wrong(bad, words):
    with pytest.raises(DependencyError) as info:
        parse_dependency(bad)
    assert words in str(info.value)


def test_format_gives_back_the_text_form():
    deps = (Dependency("afterok", (11, 12)), Dependency("singleton"))
    assert format_dependency(deps) == "afterok:11:12,singleton"
    assert format_dependency(deps[:1] * 2, any_of=True) == "afterok:11:12?afterok:11:12"


_clause = st.builds(
    Dependency,
    st.sampled_from(["after", "afterany", "afterok", "afternotok", "aftercorr"]),
    st.lists(st.integers(1, 10**6), min_size=1, max_size=4).map(tuple),
) | st.just(Dependency("singleton"))


@given(st.lists(_clause, min_size=1, max_size=4), st.booleans())
def test_formatted_dependencies_read_back(clauses, any_of):
    # With one clause "any" and "all" are the same thing, and the text cannot tell them apart.
    expected_any = any_of and len(clauses) > 1
    assert parse_dependency(format_dependency(clauses, any_of)) == (tuple(clauses), expected_any)


@given(st.text(max_size=30))
def test_dependency_parser_raises_only_its_own_error(text):
    try:
        parse_dependency(text)
    except DependencyError:
        pass
