import hashlib

from pipeline.shard.split import (
    everything,
    heldout_rule,
    heldout_threshold,
    is_heldout,
    sentence_digest,
    sentence_hash,
)


def test_hash_is_blake2b_of_the_text_not_pythons_salted_hash():
    expected = int.from_bytes(hashlib.blake2b(b"In the beginning", digest_size=8).digest(), "big")
    assert sentence_hash("In the beginning") == expected
    assert (
        sentence_hash("In the beginning") == 0x87F6BB915B837FDE
    )  # pinned: a changed hash would reshuffle every split


def test_fraction_is_respected_and_extremes():
    sentences = [f"sentence number {i}" for i in range(20000)]
    threshold = heldout_threshold(0.1)
    held = sum(is_heldout(s, threshold) for s in sentences)
    assert 1800 < held < 2200
    assert not any(is_heldout(s, heldout_threshold(0.0)) for s in sentences[:100])
    assert all(is_heldout(s, heldout_threshold(1.0)) for s in sentences[:100])
    # the same sentence always lands on the same side
    assert [is_heldout(s, threshold) for s in sentences[:500]] == [
        is_heldout(s, threshold) for s in sentences[:500]
    ]


def test_the_fast_rule_agrees_with_the_hash_at_every_threshold():
    sentences = [f"sentence number {i}" for i in range(3000)] + ["café ✓", ""]
    hashes = sorted(sentence_hash(s) for s in sentences)
    # thresholds at, just above and just below actual hash values: the byte comparison's edge cases
    thresholds = [h + d for h in hashes[::97] for d in (-1, 0, 1)] + [heldout_threshold(0.3), 1]
    for threshold in thresholds:
        rule = heldout_rule(threshold)
        assert [rule(sentence_digest(s)) for s in sentences] == [is_heldout(s, threshold) for s in sentences]
    assert heldout_rule(heldout_threshold(0.0)) is None
    assert heldout_rule(heldout_threshold(1.0)) is everything
    assert all(int.from_bytes(sentence_digest(s), "big") == sentence_hash(s) for s in sentences)
