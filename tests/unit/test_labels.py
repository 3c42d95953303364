"""Node labels as GPU Feature Discovery prints them, Slurm's Gres string, GPU type matching."""

from __future__ import annotations

import pytest

from shoal.agent.gpus import discover_inventory, fake_nvml_from_flags, open_nvml
from shoal.agent.labels import (
    LabelError,
    arch_family,
    gpu_gres,
    gpu_labels,
    gpu_type,
    gpu_type_matches,
    merge_labels,
    sanitise_product,
)
from shoal.model.resources import GPU


def _labels_for(count: int, model: str) -> dict[str, str]:
    inv = discover_inventory(open_nvml(fake_nvml_from_flags(count, model, seed="node")))
    return gpu_labels(inv.gpus, inv.driver_version, inv.cuda_version,
                      compute_capability=inv.compute_capabilities[0])


DRIVER_AND_CUDA = {
    "nvidia.com/cuda.driver.major": "550",
    "nvidia.com/cuda.driver.minor": "54",
    "nvidia.com/cuda.driver.rev": "15",
    "nvidia.com/cuda.driver-version.major": "550",
    "nvidia.com/cuda.driver-version.minor": "54",
    "nvidia.com/cuda.driver-version.revision": "15",
    "nvidia.com/cuda.driver-version.full": "550.54.15",
    "nvidia.com/cuda.runtime.major": "12",
    "nvidia.com/cuda.runtime.minor": "4",
    "nvidia.com/cuda.runtime-version.major": "12",
    "nvidia.com/cuda.runtime-version.minor": "4",
    "nvidia.com/cuda.runtime-version.full": "12.4",
}


def test_eight_h100s_are_labelled_as_gfd_does():
    assert _labels_for(8, "H100-SXM-80GB") == {
        "nvidia.com/gpu.present": "true",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.replicas": "1",
        "nvidia.com/gpu.sharing-strategy": "none",
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.family": "hopper",
        "nvidia.com/gpu.compute.major": "9",
        "nvidia.com/gpu.compute.minor": "0",
        "nvidia.com/mig.capable": "true",
        "nvidia.com/mps.capable": "false",
        **DRIVER_AND_CUDA,
    }


def test_l40s_node_is_ada_lovelace_and_not_mig_capable():
    labels = _labels_for(4, "L40S")
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-L40S"
    assert labels["nvidia.com/gpu.family"] == "ada-lovelace"
    assert (labels["nvidia.com/gpu.compute.major"], labels["nvidia.com/gpu.compute.minor"]) \
        == ("8", "9")
    assert labels["nvidia.com/mig.capable"] == "false"
    assert "nvidia.com/mig.strategy" not in labels  # GFD's default strategy is none


@pytest.mark.parametrize("model, product, family", [
    ("A100-SXM4-80GB", "NVIDIA-A100-SXM4-80GB", "ampere"),
    ("A10G", "NVIDIA-A10G", "ampere"),
    ("T4", "Tesla-T4", "turing"),
    ("B200", "NVIDIA-B200", "blackwell"),
    ("H200-SXM-141GB", "NVIDIA-H200", "hopper"),
])
def test_product_and_family_for_each_model(model, product, family):
    labels = _labels_for(1, model)
    assert (labels["nvidia.com/gpu.product"], labels["nvidia.com/gpu.family"]) == (product, family)


def test_gfd_sanitising_drops_odd_characters_and_squeezes_spaces():
    assert sanitise_product("NVIDIA  GeForce RTX 4090 (TM)") == "NVIDIA-GeForce-RTX-4090-TM"
    assert sanitise_product("NVIDIA A100-SXM4-40GB") == "NVIDIA-A100-SXM4-40GB"


def test_family_from_compute_capability_follows_gfd():
    assert [arch_family(cc) for cc in [(7, 0), (7, 5), (8, 0), (8, 6), (8, 9), (9, 0),
                                        (10, 0), (12, 0), (42, 0)]] == [
        "volta", "turing", "ampere", "ampere", "ada-lovelace", "hopper",
        "blackwell", "blackwell", "undefined"]


def test_without_compute_capability_the_family_comes_from_the_product():
    gpus = (GPU(0, "GPU-a", "NVIDIA H100 80GB HBM3", 81559, True),)
    labels = gpu_labels(gpus, None, None)
    assert labels["nvidia.com/gpu.family"] == "hopper"
    assert "nvidia.com/gpu.compute.major" not in labels
    assert not any(k.startswith("nvidia.com/cuda.") for k in labels)


def test_a_node_without_gpus_has_no_gpu_labels():
    assert gpu_labels((), "550.54.15", 12040) == {}


def test_mixed_node_labels_the_most_common_product():
    gpus = (GPU(0, "a", "NVIDIA L4", 23034), GPU(1, "b", "NVIDIA H100 PCIe", 81559, True),
            GPU(2, "c", "NVIDIA H100 PCIe", 81559, True))
    labels = gpu_labels(gpus, "550.54.15", 12040, compute_capability=(9, 0))
    assert labels["nvidia.com/gpu.product"] == "NVIDIA-H100-PCIe"
    assert labels["nvidia.com/gpu.count"] == "2"
    assert labels["nvidia.com/mig.capable"] == "true"


def test_driver_without_revision_gives_an_empty_rev():
    labels = gpu_labels((GPU(0, "a", "Tesla T4", 15360),), "535.104", 12020)
    assert labels["nvidia.com/cuda.driver.rev"] == ""
    assert labels["nvidia.com/cuda.runtime-version.full"] == "12.2"


def test_malformed_driver_version_is_rejected():
    with pytest.raises(LabelError, match="X.Y"):
        gpu_labels((GPU(0, "a", "Tesla T4", 15360),), "550", 12040)


# --------------------------------------------------------------------------- user labels


def test_user_labels_override_discovered_ones():
    discovered = _labels_for(8, "H100-SXM-80GB")
    merged = merge_labels(discovered, {"nvidia.com/gpu.product": "H100-SXM5",
                                       "topology.kubernetes.io/zone": "rack-12",
                                       "team": "", "shoal.dev/tier": "gold"})
    assert merged["nvidia.com/gpu.product"] == "H100-SXM5"
    assert merged["topology.kubernetes.io/zone"] == "rack-12"
    assert merged["team"] == ""
    assert merged["nvidia.com/gpu.count"] == "8"
    assert discovered["nvidia.com/gpu.product"] == "NVIDIA-H100-80GB-HBM3"  # not mutated


@pytest.mark.parametrize("key, value, expected", [
    ("Shoal.dev/tier", "gold", "prefix 'Shoal.dev' must be a DNS subdomain"),
    ("/tier", "gold", "prefix before '/' must not be empty"),
    ("a/b/c", "x", "at most one '/'"),
    ("shoal.dev/", "x", "name '' must be"),
    ("shoal.dev/-tier", "x", "name '-tier' must be"),
    ("x" * 64, "v", "must be 1-63 characters"),
    ("tier", "gold plated", "value 'gold plated'"),
    ("tier", "v" * 64, "value 'vvvv"),
    ("tier", "gold-", "value 'gold-'"),
    ("gpu", True, "must be a string (quote it in YAML)"),
    ("a" * 254 + "/x", "v", "must be a DNS subdomain"),
])
def test_invalid_user_labels_are_rejected_by_name(key, value, expected):
    with pytest.raises(LabelError) as e:
        merge_labels({}, {key: value})
    assert expected in str(e.value)
    assert isinstance(e.value, ValueError)


def test_longest_valid_label_is_accepted():
    key = "a" * 63 + "." + "b" * 63 + "/" + "n" * 63
    assert merge_labels({}, {key: "v" * 63}) == {key: "v" * 63}


# --------------------------------------------------------------------------- Slurm gres


@pytest.mark.parametrize("product, expected", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla T4", "t4"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA GeForce RTX 4090", "rtx_4090"),
    ("NVIDIA RTX A6000", "rtx_a6000"),
])
def test_gres_type_is_the_short_lowercase_model(product, expected):
    assert gpu_type(product) == expected


def test_gres_string_for_sinfo():
    gpus = tuple(GPU(i, f"u{i}", "NVIDIA H100 80GB HBM3", 81559, True) for i in range(8))
    assert gpu_gres(gpus) == "gpu:h100:8"
    mixed = (GPU(1, "b", "NVIDIA L40S", 46068), GPU(0, "a", "NVIDIA A100-SXM4-80GB", 81920),
             GPU(2, "c", "NVIDIA L40S", 46068))
    assert gpu_gres(mixed) == "gpu:a100:1,gpu:l40s:2"
    assert gpu_gres(()) == ""


@pytest.mark.parametrize("product, requested, matches", [
    ("NVIDIA H100 80GB HBM3", "h100", True),
    ("NVIDIA H100 80GB HBM3", "H100", True),
    ("NVIDIA H100 80GB HBM3", "h100-80gb", True),
    ("NVIDIA H100 80GB HBM3", "NVIDIA-H100-80GB-HBM3", True),
    ("NVIDIA H100 80GB HBM3", "nvidia h100 80gb hbm3", True),
    ("NVIDIA A100-SXM4-80GB", "a100", True),
    ("NVIDIA A100-SXM4-80GB", "A100-SXM4", True),
    ("NVIDIA A100-SXM4-80GB", "a10", False),
    ("NVIDIA A10G", "a10", False),
    ("NVIDIA L40S", "l40", False),
    ("NVIDIA L40S", "l40s", True),
    ("NVIDIA GeForce RTX 4090", "rtx_4090", True),
    ("NVIDIA H100 80GB HBM3", "a100", False),
    ("NVIDIA H100 80GB HBM3", "", False),
])
def test_gpu_type_matching(product, requested, matches):
    assert gpu_type_matches(product, requested) is matches
