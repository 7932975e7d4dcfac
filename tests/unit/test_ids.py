"""compiler.ids: the plan's ids written, read back and ordered in one place."""

import random

from compiler import ids


def test_each_id_reads_back_as_written():
    assert ids.tray_id(3, 7) == "r3-t07" and ids.parse_tray("r3-t07") == (3, 7)
    assert ids.gpu_id(12, 105, 2) == "r12-t105-g2" and ids.parse_gpu("r12-t105-g2") == (12, 105, 2)
    assert ids.instance_id("prefill", 3) == "prefill-03"
    assert ids.parse_instance("decode-123") == ("decode", 123)
    assert ids.domain_id("r0-t01-g2", 1) == "r0-t01-g2-d1"
    assert ids.gpu_of_domain("r0-t01-g2-d1") == "r0-t01-g2"
    assert ids.tray_of_gpu("r10-t01-g2") == "r10-t01"
    for bad in ("r0-t01", "r0-t01-g", "x0-t01-g1", "r0-t01-g1-d0"):
        assert ids.parse_gpu(bad) is None
    for bad in ("prefill-", "encode-01", "prefill-01x", "decode-1234567890"):
        assert ids.parse_instance(bad) is None


def test_natural_order_compares_numbers_as_numbers():
    shuffled = ["r10-t00-g0", "r2-t11-g1", "r2-t11-g0", "r2-t03-g7", "r0-t100-g0", "r0-t99-g3"]
    random.Random(0).shuffle(shuffled)
    assert sorted(shuffled, key=ids.natural) == [
        "r0-t99-g3", "r0-t100-g0", "r2-t03-g7", "r2-t11-g0", "r2-t11-g1", "r10-t00-g0"]
    assert sorted(["prefill-100", "decode-10", "prefill-9", "decode-02"], key=ids.natural) == [
        "decode-02", "decode-10", "prefill-9", "prefill-100"]
    # ids of different kinds still compare (text and numbers alternate in every key)
    assert sorted(["nvl1", "r0-t00", "rdma"], key=ids.natural) == ["nvl1", "r0-t00", "rdma"]


def test_next_numbers_continue_after_every_role_used():
    used = ["prefill-00", "prefill-04", "decode-02", "not-an-id"]
    assert ids.next_numbers(used) == {"prefill": 5, "decode": 3}
    assert ids.next_numbers(["decode-00"], {"decode": 7, "aggregated": 1}) == {
        "decode": 7, "aggregated": 1}


def test_offsets_add_up_group_by_group():
    at = ids.Offsets().after(2, 2).after(1, 8)
    assert at == ids.Offsets(racks=3, nvlinks=10)


def test_a_part_is_a_rack_a_tray_or_a_gpu():
    assert ids.parse_part("r3") == (3, None, None)
    assert ids.parse_part("r3-t07") == (3, 7, None)
    assert ids.parse_part("r3-t07-g2") == (3, 7, 2)
    for bad in ("t07", "r3-g2", "r3-t07-g2-d0", "r-1", ""):
        assert ids.parse_part(bad) is None
