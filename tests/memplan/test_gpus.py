import pytest

from arealite.memplan.gpus import GIB, GPUS, find_gpu, usable_bytes


def test_names_are_found_loosely_and_sizes_stand_for_unlisted_cards():
    assert find_gpu("h100").name == "H100-80GB"
    assert find_gpu("A100 40GB").memory_gib == 40
    assert find_gpu("H200-141GB").memory_bytes == 141 * GIB
    assert find_gpu("12GiB").memory_bytes == 12 * GIB
    assert usable_bytes(GPUS["H100-80GB"]) == int(80 * GIB * 0.9)


def test_an_unknown_name_lists_the_table():
    with pytest.raises(ValueError, match="H100-80GB"):
        find_gpu("Z9000")
