"""Hostlists as administrators type them in slurm.conf, --nodelist and scontrol."""

import pytest
from hypothesis import given, strategies as st

from shoal.model.hostlist import MAX_NAMES, HostlistError, compress, expand, sort_key


def test_a_range_and_a_single_node_in_one_bracket():
    assert expand("node[01-08,10]") == [
        "node01", "node02", "node03", "node04", "node05", "node06", "node07", "node08", "node10",
    ]


def test_two_bracket_groups_give_every_rack_gpu_pair_first_group_slowest():
    assert expand("rack[1-2]-gpu[01-02]") == ["rack1-gpu01", "rack1-gpu02", "rack2-gpu01", "rack2-gpu02"]


def test_top_level_commas_separate_plain_names_and_ranges():
    assert expand("a1,b[1-3],c") == ["a1", "b1", "b2", "b3", "c"]


def test_zero_padding_comes_from_the_low_bound():
    assert expand("n[008-010]") == ["n008", "n009", "n010"]
    assert expand("n[8-10]") == ["n8", "n9", "n10"]


def test_a_suffix_after_the_bracket_is_kept():
    assert expand("gpu[1-2]-ib") == ["gpu1-ib", "gpu2-ib"]


def test_single_number_in_brackets_and_several_ranges():
    assert expand("n[7]") == ["n7"]
    assert expand("n[1-2,5-6,9]") == ["n1", "n2", "n5", "n6", "n9"]


def test_expansion_keeps_order_and_duplicates_like_scontrol_show_hostnames():
    assert expand("b2,a1,b2") == ["b2", "a1", "b2"]
    assert expand("n[3,1,3]") == ["n3", "n1", "n3"]


def test_empty_items_and_whitespace_separators_are_skipped():
    assert expand("") == []
    assert expand("a, b,,c\tn[1-2]") == ["a", "b", "c", "n1", "n2"]


@pytest.mark.parametrize(
    "bad, words",
    [
        ("node[1-3", "unclosed '['"),
        ("node1-3]", "without a matching '['"),
        ("node[5-1]", "reversed range '5-1'"),
        ("node[a-c]", "range 'a-c'"),
        ("node[1-]", "range '1-'"),
        ("node[]", "empty brackets"),
        ("node[1[2]]", "nested '['"),
    ],
)
def test_malformed_hostlists_name_the_problem(bad, words):
    with pytest.raises(HostlistError) as info:
        expand(bad)
    assert words in str(info.value)


def test_a_typo_that_would_expand_to_billions_of_names_fails_fast():
    with pytest.raises(HostlistError, match="more than 1,000,000 names"):
        expand("n[1-999999999]")
    with pytest.raises(HostlistError, match="more than"):
        expand("a[1-1000]b[1-1000]c[1-2]")
    assert len(expand(f"n[1-{MAX_NAMES}]")) == MAX_NAMES


def test_compress_merges_consecutive_numbers_keeping_width():
    assert compress(["node01", "node02", "node03", "node05"]) == "node[01-03,05]"


def test_compress_sorts_numerically_and_drops_duplicates():
    assert compress(["n10", "n9", "n2", "n1", "n2"]) == "n[1-2,9-10]"


def test_compress_leaves_a_lone_name_unbracketed_and_groups_by_prefix_and_suffix():
    assert compress(["login", "gpu3-ib", "gpu4-ib", "cpu7"]) == "cpu7,gpu[3-4]-ib,login"


def test_compress_does_not_merge_different_padding():
    assert compress(["n08", "n09", "n010"]) == "n[08-09,010]"
    assert expand("n[08-09,010]") == ["n08", "n09", "n010"]


def test_compress_of_nothing_is_empty():
    assert compress([]) == ""


def test_compress_refuses_names_that_cannot_live_in_a_hostlist():
    with pytest.raises(HostlistError, match="no brackets, commas"):
        compress(["a,b"])
    with pytest.raises(HostlistError):
        compress([""])


_name = st.builds(
    lambda prefix, number, width, suffix: f"{prefix}{str(number).zfill(width)}{suffix}",
    st.sampled_from(["n", "node", "gpu", "rack1-g", ""]),
    st.integers(0, 120),
    st.integers(0, 4),
    st.sampled_from(["", "-ib", "x"]),
).filter(bool) | st.sampled_from(["login", "head", "x"])


@given(st.lists(_name, max_size=40))
def test_compress_then_expand_gives_the_sorted_unique_names(names):
    assert expand(compress(names)) == sorted(set(names), key=sort_key)


@given(st.text(max_size=30))
def test_expand_raises_only_hostlist_error_on_random_text(text):
    try:
        expand(text)
    except HostlistError:
        pass


def test_three_groups_expand_in_slurm_2205_order():
    # Checked against Slurm 22.05.8's `scontrol show hostnames`: the last group varies fastest,
    # then the first, and the middle one slowest.
    assert expand("row[0,1]_rack[2-3]_blade[4,5]") == [
        "row0_rack2_blade4", "row0_rack2_blade5", "row1_rack2_blade4", "row1_rack2_blade5",
        "row0_rack3_blade4", "row0_rack3_blade5", "row1_rack3_blade4", "row1_rack3_blade5"]
    assert expand("w[1-2]x[3-4]y[5-6]z[7-8]")[:5] == ["w1x3y5z7", "w1x3y5z8", "w2x3y5z7", "w2x3y5z8", "w1x4y5z7"]
