"""A connect-four run's greedy tactics on positions from random play: does its policy take a win
in one move, and block the other player's single threat of one?

    python scripts/bench.py tactics RUN_DIR [--best] [--positions 4000]

Positions come from games of uniformly random legal moves, each stopped after a random number of
moves (4 to 29) or as soon as the player to move can win: positions no self-play run steers
towards, which is where the one-ply player (win now, else block, else random) leads its games.
Each is classified for the player to move: "win" (a drop wins now), "block" (none does, and the
other player has exactly one winning drop, which this move must take) or "quiet" (no threat on
either side; the table counts how often the policy's move there hands the other player a win by
filling the square under it). Beside each rate, what a uniformly random legal move scores. The
policy acts greedily (argmax over its legal moves), as fastrl-eval --deterministic does.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from fastrl.multiagent.opponents import CONNECT_FOUR_COLUMNS, CONNECT_FOUR_ROWS, wins_by_dropping

ERRORS = (ValueError, FileNotFoundError)
FIRST_STOP, LAST_STOP = 4, 30  # a game is stopped after FIRST_STOP to LAST_STOP - 1 random moves


def drop(pieces: np.ndarray, filled: np.ndarray, column: int) -> np.ndarray:
    """``pieces`` with one more in ``column``'s lowest empty square (row 0 the top)."""
    row = int(np.flatnonzero(~filled[:, column])[-1])
    out = pieces.copy()
    out[row, column] = True
    return out


def legal_columns(filled: np.ndarray) -> list[int]:
    return [c for c in range(filled.shape[1]) if not filled[0, c]]


def random_positions(count: int, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """``count`` (mover's pieces, other's pieces) pairs, bool [6, 7], from random play; each with a
    legal move, and no four on the board yet."""
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        mover = np.zeros((CONNECT_FOUR_ROWS, CONNECT_FOUR_COLUMNS), bool)
        other = np.zeros_like(mover)
        for _ in range(rng.integers(FIRST_STOP, LAST_STOP)):
            legal = legal_columns(mover | other)
            if any(wins_by_dropping(mover, mover | other, c) for c in legal):
                break
            mover = drop(mover, mover | other, int(rng.choice(legal)))
            mover, other = other, mover
        if legal_columns(mover | other):
            out.append((mover, other))
    return out


def classify(mover: np.ndarray, other: np.ndarray) -> tuple[str, list[int]]:
    """("win", the winning columns), ("block", [the one column to block]), ("quiet", []), or
    ("lost", the other player's winning columns) where more than one threat cannot all be blocked."""
    filled = mover | other
    legal = legal_columns(filled)
    wins = [c for c in legal if wins_by_dropping(mover, filled, c)]
    if wins:
        return "win", wins
    threats = [c for c in legal if wins_by_dropping(other, filled, c)]
    if len(threats) == 1:
        return "block", threats
    return ("lost", threats) if threats else ("quiet", [])


def hands_a_win(mover: np.ndarray, other: np.ndarray, column: int) -> bool:
    """Whether playing ``column`` lets the other player win on its next move."""
    after = drop(mover, mover | other, column)
    filled = after | other
    return any(wins_by_dropping(other, filled, c) for c in legal_columns(filled))


def tactics(choose, positions) -> dict:
    """Rates of ``choose(positions) -> columns`` (one legal column per position): wins taken,
    single threats blocked, quiet positions where the move hands the other player a win; and a
    uniformly random legal move's rates on the same positions."""
    columns = choose(positions)
    found = {"win": [], "block": [], "quiet": []}
    random = {"win": [], "block": [], "quiet": []}
    for (mover, other), column in zip(positions, columns):
        kind, right = classify(mover, other)
        if kind == "lost":
            continue
        legal = legal_columns(mover | other)
        if int(column) not in legal:
            raise ValueError(f"the policy chose column {int(column)}, not one of the legal {legal}")
        if kind == "quiet":
            found[kind].append(hands_a_win(mover, other, int(column)))
            random[kind].append(np.mean([hands_a_win(mover, other, c) for c in legal]))
        else:
            found[kind].append(int(column) in right)
            random[kind].append(len(right) / len(legal))
    names = {"win": "takes_win", "block": "blocks", "quiet": "hands_a_win"}
    return {**{names[k]: float(np.mean(v)) if v else float("nan") for k, v in found.items()},
            **{f"random_{names[k]}": float(np.mean(v)) if v else float("nan") for k, v in random.items()},
            **{f"{k}_positions": len(v) for k, v in found.items()}}


def greedy_chooser(run_dir: Path, best: bool):
    """The run's first policy as ``choose``: argmax over the legal moves of its logits."""
    import torch

    from .board_policy import load_board_policy

    model, layout, source = load_board_policy(run_dir, best, (CONNECT_FOUR_ROWS, CONNECT_FOUR_COLUMNS, 2),
                                              "PettingZoo's connect_four_v3", "tactics")

    def choose(positions):
        planes = np.stack([np.stack([m, o], -1) for m, o in positions]).astype(np.int8)
        masks = np.stack([~(m | o)[0] for m, o in positions]).astype(np.int8)
        with torch.no_grad():
            logits, _ = model(torch.as_tensor(layout.pack({"observation": planes, "action_mask": masks},
                                                          len(positions))))
        return logits.argmax(-1).numpy()  # illegal moves carry MASKED_LOGIT
    return choose, source


def add_arguments(p) -> None:
    p.add_argument("run_dir", type=Path, help="a run trained on pettingzoo:pettingzoo.classic.connect_four_v3")
    p.add_argument("--best", action="store_true", help="checkpoints/best.pt instead of the latest checkpoint")
    p.add_argument("--positions", type=int, default=4000, help="positions from random play")
    p.add_argument("--seed", type=int, default=0, help="seed of the random games")


def run(args) -> dict:
    if not args.run_dir.is_dir():
        raise FileNotFoundError(f"no run directory {args.run_dir}")
    choose, source = greedy_chooser(args.run_dir, args.best)
    report = {"run_dir": str(args.run_dir), "checkpoint": str(source.get("checkpoint")),
              "env_steps": source.get("env_steps"), **tactics(choose, random_positions(args.positions, args.seed))}
    print(f"{args.run_dir} ({'best.pt' if args.best else 'latest checkpoint'}), greedy, "
          f"{args.positions} positions from random play:")
    for key, what in (("takes_win", "takes a win in one"), ("blocks", "blocks the other's single threat"),
                      ("hands_a_win", "hands the other a win (quiet positions)")):
        kind = {"takes_win": "win", "blocks": "block", "hands_a_win": "quiet"}[key]
        print(f"  {what:<42} {report[key]:.3f}   a random legal move {report['random_' + key]:.3f}"
              f"   ({report[kind + '_positions']} positions)")
    return report
