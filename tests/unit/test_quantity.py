"""Resource quantities as Kubernetes manifests write them: 500m cores, 200Gi of memory, 4 GPUs."""

import pytest
from hypothesis import given, strategies as st

from shoal.model.quantity import parse_cpu, parse_memory_mb, parse_quantity


@pytest.mark.parametrize("text, value", [
    ("500m", 0.5), ("2", 2.0), ("0.5", 0.5), (".5", 0.5), ("1.", 1.0), ("+3", 3.0), ("-1", -1.0),
    ("1k", 1e3), ("1M", 1e6), ("1G", 1e9), ("1T", 1e12), ("1P", 1e15), ("1E", 1e18),
    ("1Ki", 1024.0), ("1Mi", 2.0 ** 20), ("1Gi", 2.0 ** 30), ("1Ti", 2.0 ** 40), ("1Pi", 2.0 ** 50),
    ("1Ei", 2.0 ** 60), ("1e3", 1e3), ("1E3", 1e3), ("5e-1", 0.5), ("2E+2", 200.0), ("1.5Gi", 1.5 * 2 ** 30),
])
def test_every_suffix_kubernetes_knows(text, value):
    assert parse_quantity(text) == value


def test_numbers_in_yaml_are_taken_as_they_are():
    assert parse_quantity(4) == 4.0
    assert parse_quantity(0.25) == 0.25


@pytest.mark.parametrize("bad", ["200Gx", "", "Gi", "1 Gi", " 2", "1gi", "1e", "1.2.3", "m", "1KiB", "0x10", "1e999"])
def test_what_is_not_a_quantity_is_refused_with_examples(bad):
    with pytest.raises(ValueError) as e:
        parse_quantity(bad)
    assert str(e.value) == f"{bad!r} is not a quantity (expected e.g. 500m, 2, 200Gi)"


def test_the_message_of_the_issue():
    with pytest.raises(ValueError, match=r"^'200Gx' is not a quantity \(expected e.g. 500m, 2, 200Gi\)$"):
        parse_memory_mb("200Gx")


@pytest.mark.parametrize("bad", [True, None, [1], float("nan"), float("inf")])
def test_non_numbers_are_refused(bad):
    with pytest.raises(ValueError, match="is not a quantity"):
        parse_quantity(bad)


def test_cpu_in_cores():
    assert parse_cpu("500m") == 0.5
    assert parse_cpu("100m") == 0.1  # exact: no 0.1000000001 from float arithmetic
    assert parse_cpu(2) == 2.0
    assert parse_cpu("1.5") == 1.5
    with pytest.raises(ValueError, match="negative"):
        parse_cpu("-1")


def test_memory_in_mib_rounded_up():
    assert parse_memory_mb("200Gi") == 204800
    assert parse_memory_mb("512Mi") == 512
    assert parse_memory_mb("1G") == 954  # 10^9 bytes is 953.67 MiB: a request is never shrunk
    assert parse_memory_mb("1") == 1  # a bare number is bytes, as in Kubernetes
    assert parse_memory_mb(0) == 0
    assert parse_memory_mb("1Ti") == 1024 * 1024
    with pytest.raises(ValueError, match="negative"):
        parse_memory_mb("-1Gi")


@given(st.integers(min_value=0, max_value=10 ** 6),
       st.sampled_from([("", 1), ("k", 10 ** 3), ("M", 10 ** 6), ("Ki", 2 ** 10), ("Mi", 2 ** 20), ("Gi", 2 ** 30)]))
def test_integer_with_suffix_is_the_product(n, suffix):
    text, factor = suffix
    assert parse_quantity(f"{n}{text}") == float(n * factor)


@given(st.integers(min_value=0, max_value=10 ** 7))
def test_mebibytes_round_trip(n):
    assert parse_memory_mb(f"{n}Mi") == n
    assert parse_memory_mb(f"{n * 1024}Ki") == n


@given(st.integers(min_value=0, max_value=10 ** 6))
def test_millicores_are_thousandths(n):
    assert parse_cpu(f"{n}m") == pytest.approx(n / 1000)
