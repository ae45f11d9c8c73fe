import torch

from arealite.memplan.live_bytes import LiveBytes


def test_counts_each_storage_once_until_it_is_freed():
    with LiveBytes(vocab_dim=7) as lb:
        a = torch.zeros(1000)  # 4,000 bytes
        view = a[10:20]  # the same storage: not counted again
        b = torch.zeros(3, 7)  # 84 bytes with a "vocabulary" last dimension
        peak_with_both = lb.live
        del a, view, b
        c = torch.zeros(10)
    assert peak_with_both == 4084
    assert lb.peak == 4084 and lb.vocab_bytes_at_peak == 84
    assert lb.live == 40  # only c is alive
    del c


def test_follows_storage_resizes_and_existing_tensors():
    keep = torch.zeros(100)
    with LiveBytes() as lb:
        lb.add_existing([keep])
        t = torch.zeros(50)
        t.untyped_storage().resize_(0)  # FSDP2 frees unsharded parameters like this
        after_free = lb.live
        t.untyped_storage().resize_(800)
    assert after_free == 400
    assert lb.live == 1200 and lb.peak == 1200
