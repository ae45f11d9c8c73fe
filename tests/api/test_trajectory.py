import torch

from arealite.api.trajectory import concat_padded_tensors, pad_sequences_to_tensors


def test_pad_and_concat_follow_the_contract():
    a = pad_sequences_to_tensors([
        {"input_ids": [5, 6, 7], "loss_mask": [0, 1, 1], "logprobs": [0.0, -1.0, -2.0],
         "versions": [-1, 0, 0], "rewards": 1.0},
    ])
    b = pad_sequences_to_tensors([
        {"input_ids": [5, 6, 7, 8, 9], "loss_mask": [0, 0, 1, 1, 1],
         "logprobs": [0.0, 0.0, -1.0, -1.5, -2.0], "versions": [-1, -1, 1, 1, 2], "rewards": 0.0},
    ])
    c = concat_padded_tensors([a, b])
    assert c["input_ids"].shape == (2, 5) and c["rewards"].shape == (2,)
    assert c["attention_mask"].dtype == torch.bool and c["loss_mask"].dtype == torch.bool
    assert c["attention_mask"][0].tolist() == [True, True, True, False, False]
    assert c["versions"][0].tolist() == [-1, 0, 0, -1, -1]  # padding carries version -1
    assert c["logprobs"].dtype == torch.float32
    assert concat_padded_tensors([]) == {}
