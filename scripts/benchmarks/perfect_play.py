"""A tic-tac-toe run's greedy policy against perfect play, exactly: does it lose any game in
either seat?

    python scripts/bench.py perfect-play RUN_DIR [--best]

Plays every game a perfect opponent can make the policy play: the opponent tries each of its
moves of the best minimax value (tictactoe_minimax's choices, all of them), the policy answers
each position greedily (argmax over its legal moves, as fastrl-eval --deterministic does). A
position where the greedy move lowers the game's value (a draw given away, a win missed into a
draw or a loss) is a blunder; the policy never loses to perfect play in a seat exactly when it
blunders in no position reached there. Prints, per seat, the positions reached, the blunders with
the board, the move, the move the value asked for and the policy's probabilities, and the
outcome against perfect play: "never loses" or the share of the perfect opponent's lines (each
of its choices equally likely, as tictactoe_minimax draws them) that the policy loses.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fastrl.multiagent.opponents import TIC_TAC_TOE_FULL, tic_tac_toe_lined, tic_tac_toe_value

ERRORS = (ValueError, FileNotFoundError)
SEATS = ("player_1", "player_2")  # first and second mover


def ended(mine: int, theirs: int) -> bool:
    return tic_tac_toe_lined(mine) or tic_tac_toe_lined(theirs) or (mine | theirs) == TIC_TAC_TOE_FULL


def empty_squares(mine: int, theirs: int) -> list[int]:
    return [square for square in range(9) if not (mine | theirs) >> square & 1]


def move_value(mine: int, theirs: int, square: int) -> int:
    """The game's value for the player to move after it takes ``square``."""
    return -tic_tac_toe_value(theirs, mine | 1 << square)


def audit(choose, policy_moves_first: bool) -> dict:
    """Every position the policy meets in its seat against every perfect line. ``choose(mine,
    theirs) -> (square, probabilities [9])`` (bit sets of the mover's and the other's squares).
    Returns the positions reached, the blunders [(mine, theirs, square, right squares,
    probabilities)], and the share of the perfect player's lines the policy loses (each of the
    opponent's best moves equally likely)."""
    blunders, reached = [], set()

    def loss_share(mine: int, theirs: int, policy_to_move: bool) -> float:
        """The probability that the policy loses from here: mine is the player to move's."""
        if tic_tac_toe_lined(theirs):  # the player who just moved won: the policy lost if it is to move
            return 1.0 if policy_to_move else 0.0
        if (mine | theirs) == TIC_TAC_TOE_FULL:
            return 0.0
        values = {s: move_value(mine, theirs, s) for s in empty_squares(mine, theirs)}
        best = [s for s, v in values.items() if v == max(values.values())]
        if not policy_to_move:
            return float(np.mean([loss_share(theirs, mine | 1 << s, True) for s in best]))
        square, probs = choose(mine, theirs)
        if square not in values:
            raise ValueError(f"the policy chose square {square}, not one of the empty {list(values)}")
        if (mine, theirs) not in reached:
            reached.add((mine, theirs))
            if square not in best:
                blunders.append((mine, theirs, square, best, probs))
        return loss_share(theirs, mine | 1 << square, False)

    share = loss_share(0, 0, policy_moves_first)
    return {"positions": len(reached), "blunders": blunders, "loss_share": share}


def board_text(mine: int, theirs: int) -> str:
    """Rows top to bottom, 'x' the policy's marks, 'o' the other's; PettingZoo numbers the squares
    down the columns (square = 3 * column + row)."""
    rows = []
    for row in range(3):
        rows.append("".join("x" if mine >> (3 * col + row) & 1 else "o" if theirs >> (3 * col + row) & 1 else "."
                            for col in range(3)))
    return "/".join(rows)


def planes(mine: int, theirs: int) -> np.ndarray:
    """tictactoe_v3's observation [3, 3, 2] (plane 0 the mover's marks) of two bit sets."""
    flat = np.array([[mine >> s & 1, theirs >> s & 1] for s in range(9)], np.int8)
    return flat.reshape(3, 3, 2)


def greedy_chooser(run_dir: Path, best: bool):
    """The run's first policy as ``choose``: argmax over the legal moves of its logits."""
    import torch

    from .board_policy import load_board_policy

    model, layout, source = load_board_policy(run_dir, best, (3, 3, 2), "PettingZoo's tictactoe_v3", "perfect-play")

    def choose(mine, theirs):
        mask = np.array([not (mine | theirs) >> s & 1 for s in range(9)], np.int8)
        with torch.no_grad():
            logits, _ = model(torch.as_tensor(layout.pack({"observation": planes(mine, theirs)[None],
                                                           "action_mask": mask[None]}, 1)))
        probs = torch.softmax(logits.float(), -1)[0].numpy()
        return int(logits.argmax(-1)), probs  # illegal moves carry MASKED_LOGIT
    return choose, source


def add_arguments(p) -> None:
    p.add_argument("run_dir", type=Path, help="a run trained on pettingzoo:pettingzoo.classic.tictactoe_v3")
    p.add_argument("--best", action="store_true", help="checkpoints/best.pt instead of the latest checkpoint")


def run(args) -> dict:
    if not args.run_dir.is_dir():
        raise FileNotFoundError(f"no run directory {args.run_dir}")
    choose, source = greedy_chooser(args.run_dir, args.best)
    print(f"{args.run_dir} ({'best.pt' if args.best else 'latest checkpoint'}, {source.get('env_steps')} env steps), "
          f"greedy, against every line of perfect play:")
    report = {"run_dir": str(args.run_dir), "checkpoint": str(source.get("checkpoint")),
              "env_steps": source.get("env_steps"), "seats": {}}
    for seat, first in zip(SEATS, (True, False)):
        found = audit(choose, first)
        verdict = "never loses" if not found["blunders"] else f"loses {found['loss_share']:.1%} of the lines"
        print(f"  {seat} ({'first' if first else 'second'} mover): {found['positions']} positions, "
              f"{len(found['blunders'])} blunders: {verdict}")
        for mine, theirs, square, right, probs in found["blunders"]:
            print(f"    {board_text(mine, theirs)}  plays {square}, the value asks for {right}; "
                  f"p = {np.array2string(probs, precision=3, suppress_small=True)}")
        report["seats"][seat] = {"positions": found["positions"], "blunders": len(found["blunders"]),
                                 "loss_share": found["loss_share"]}
    report["never_loses"] = all(s["blunders"] == 0 for s in report["seats"].values())
    return report
