"""sbatch --array specifications and their compact squeue form."""

import pytest
from hypothesis import given, strategies as st

from shoal.model.arrays import ArraySpecError, TaskRanges, format_array, parse_array


def test_a_range_of_sixteen_tasks():
    assert parse_array("0-15") == (list(range(16)), None)


def test_a_list_with_a_range():
    assert parse_array("1,3,5-7") == ([1, 3, 5, 6, 7], None)


def test_a_step_takes_every_fourth_id():
    assert parse_array("0-15:4") == ([0, 4, 8, 12], None)


def test_a_throttle_limits_how_many_run_at_once():
    assert parse_array("0-15%2") == (list(range(16)), 2)
    assert parse_array("1,3%1") == ([1, 3], 1)


def test_overlapping_pieces_give_each_id_once_in_order():
    assert parse_array("5,1-3,2") == ([1, 2, 3, 5], None)


def test_ids_must_stay_below_max_array_size():
    assert parse_array("1000")[0] == [1000]
    with pytest.raises(ArraySpecError, match="below MaxArraySize=1001"):
        parse_array("0-1001")
    with pytest.raises(ArraySpecError, match="MaxArraySize=11"):
        parse_array("10-11", max_size=11)


@pytest.mark.parametrize(
    "bad, words",
    [
        ("", "expected ids and ranges"),
        ("5-1", "reversed"),
        ("0-10:0", "at least 1"),
        ("a-b", "expected ids and ranges"),
        ("0-3%", "throttle"),
        ("0-3%0", "throttle"),
        ("4:2", "expected ids and ranges"),
        ("1,,2", "expected ids and ranges"),
        ("-3", "expected ids and ranges"),
    ],
)
def test_bad_array_specs_say_what_is_wrong(bad, words):
    with pytest.raises(ArraySpecError) as info:
        parse_array(bad)
    assert words in str(info.value)


def test_format_is_compact_like_squeue():
    assert format_array(range(16), 2) == "0-15%2"
    assert format_array([7, 1, 3, 4, 5]) == "1,3-5,7"
    assert format_array([4]) == "4"
    assert format_array([]) == ""


@given(st.sets(st.integers(0, 1000), min_size=1), st.none() | st.integers(1, 50))
def test_formatted_arrays_read_back(ids, throttle):
    assert parse_array(format_array(ids, throttle)) == (sorted(ids), throttle)


@given(st.text(max_size=20))
def test_array_parser_raises_only_its_own_error(text):
    try:
        parse_array(text)
    except ArraySpecError:
        pass


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 30)), max_size=80), st.sampled_from([None, 3]))
def test_task_ranges_kept_one_id_at_a_time_write_what_format_array_writes_of_them(steps, throttle):
    """Ids added and removed one at a time (an id added twice stays until removed twice, as a
    group may hold two tasks of one id), against format_array of what is held after each."""
    kept, held = TaskRanges(), []
    for add, i in steps:
        if add:
            kept.add(i)
            held.append(i)
        elif i in held:
            kept.remove(i)
            held.remove(i)
        assert kept.text(throttle) == format_array(held, throttle)
        assert len(kept) == len(set(held))
