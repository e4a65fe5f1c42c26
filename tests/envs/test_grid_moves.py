import numpy as np
import pytest

from turnrl.envs.games.grid_moves import MOVES, MoveParse, moves_instruction, parse_moves, random_moves


def test_moves_are_whole_direction_words_in_order_any_case():
    assert parse_moves("Up, then LEFT, then down", 5) == MoveParse(("up", "left", "down"), 0)
    assert parse_moves("go upward; rightmost; sideways", 5) == MoveParse((), 0)
    assert parse_moves("", 1) == MoveParse((), 0)


def test_limit_keeps_the_first_moves_and_counts_the_rest():
    assert parse_moves("left right up down", 2) == MoveParse(("left", "right"), 2)
    assert parse_moves("right", 3) == MoveParse(("right",), 0)


def test_answer_block_is_read_alone():
    text = "Going up would drop me in the hole. <answer>Right || Down</answer> not left"
    assert parse_moves(text, 4).moves == ("right", "down")
    assert parse_moves("<answer>no idea</answer> up", 1).moves == ()


@pytest.mark.parametrize("limit", [0, -1, 1.5, True, "2"])
def test_bad_limit_is_a_value_error(limit):
    with pytest.raises(ValueError, match="limit must be a positive int"):
        parse_moves("up", limit)


def test_random_moves_are_uniform_and_parse_back():
    rng = np.random.default_rng(0)
    text = random_moves(rng, 3)
    assert len(parse_moves(text, 3).moves) == 3
    counts = {m: 0 for m in MOVES}
    for _ in range(4000):
        counts[random_moves(rng, 1)] += 1
    assert all(850 < c < 1150 for c in counts.values()), counts


def test_instruction_names_the_count():
    assert moves_instruction(1) == "Reply with one move: up, down, left or right."
    assert "up to 3 moves" in moves_instruction(3)
