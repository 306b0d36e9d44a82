from benchmarks.vocabulary_study import merged


def _row(corpus, seeds, finals, tokens=100):
    return {
        "corpus": corpus,
        "min_count": 3,
        "budget": "3epochs",
        "seeds": seeds,
        "final": finals,
        "to_kn3": [None] * len(seeds),
        "to_kn5": [None] * len(seeds),
        "guard": [[] for _ in seeds],
        "tokens": tokens,
    }


def test_a_seed_run_again_replaces_its_earlier_run_and_the_rest_are_kept():
    earlier = [_row("a", [0, 1, 2], [10.0, 11.0, 12.0]), _row("b", [0], [5.0])]
    earlier[0]["guard"] = [None, None, None]  # from before verdicts were recorded
    rows = [_row("b", [1, 2], [6.0, 7.0], tokens=120), _row("c", [0], [1.0]), _row("a", [1], [21.0])]
    rows.append({**_row("a", [0], [30.0]), "min_count": 1})
    out = merged(earlier, rows)
    assert [(r["corpus"], r["seeds"], r["final"]) for r in out] == [
        ("a", [0], [30.0]),  # min_count 1 before 3
        ("a", [0, 1, 2], [10.0, 21.0, 12.0]),
        ("b", [0, 1, 2], [5.0, 6.0, 7.0]),
        ("c", [0], [1.0]),
    ]
    assert out[1]["guard"] == [None, [], None] and out[2]["tokens"] == 120
