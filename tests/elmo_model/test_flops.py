"""The model FLOP counts shared by the benchmarks and the trainer's MFU."""

import copy

from elmo_model.flops import encoder_flops, first_input_flops, lstm_flops, train_step_flops

ORIGINAL = {  # 2x4096_512_2048cnn_2xhighway
    "lstm": {"dim": 4096, "projection_dim": 512, "n_layers": 2, "cell_clip": 3, "proj_clip": 3},
    "char_cnn": {
        "activation": "relu",
        "embedding": {"dim": 16},
        "filters": [[1, 32], [2, 32], [3, 64], [4, 128], [5, 256], [6, 512], [7, 1024]],
        "n_highway": 2,
        "n_characters": 262,
        "max_characters_per_token": 50,
    },
}


def test_flop_counts_of_the_original_model():
    options = ORIGINAL
    # LSTM: per layer (in + P) x 4C gates and C x P projection, 2 FLOPs per multiply-add
    assert lstm_flops(options) == 2 * (2 * 1024 * 16384 + 2 * 4096 * 512)
    assert first_input_flops(options) == 2 * 512 * 16384
    conv = sum(2 * (50 - w + 1) * w * 16 * n for w, n in options["char_cnn"]["filters"])
    assert encoder_flops(options) == conv + 2 * (2 * 2048 * 4096) + 2 * 2048 * 512
    # a step of 2 x 128 x 20 positions whose encoder ran on 900 distinct spellings
    total = train_step_flops(options, 8193, positions=5120, distinct=900)
    assert total == 3 * (900 * encoder_flops(options) + 5120 * (lstm_flops(options) + 2 * 512 * 8193))


def test_no_projection_flops_when_the_filters_match_the_projection():
    options = copy.deepcopy(ORIGINAL)
    options["lstm"]["projection_dim"] = 2048
    conv = sum(2 * (50 - w + 1) * w * 16 * n for w, n in options["char_cnn"]["filters"])
    assert encoder_flops(options) == conv + 2 * (2 * 2048 * 4096)
