"""``RunLogger``: every row in ``metrics.jsonl``, every numeric value in TensorBoard's event files
(one event per row), each under ``KIND/NAME`` at its step."""

import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from turnrl.train.logger import RunLogger


def test_every_row_goes_to_jsonl_and_every_number_to_tensorboard_at_its_step(tmp_path):
    logger = RunLogger(tmp_path, tensorboard=True)
    rows = [(0, "eval", {"success": 0.25, "reward": 0.5}), (1, "train", {"reward": 0.125, "loss": -1.5, "n": 3}),
            (2, "train", {"reward": 0.75, "loss": float("nan"), "n": 4}), (2, "eval", {"success": 1.0, "reward": 2.0})]
    for step, kind, metrics in rows:
        logger.log(step, metrics, prefix=kind)
    logger.log(3, {"reward": 9.0}, prefix="train", jsonl=False)  # a replayed row: TensorBoard only
    logger.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["kind"]) for r in lines] == [(s, k) for s, k, _ in rows]
    events = EventAccumulator(str(tmp_path / "tb")).Reload()
    assert sorted(events.Tags()["scalars"]) == ["eval/reward", "eval/success", "train/loss", "train/n", "train/reward"]
    assert [(e.step, e.value) for e in events.Scalars("train/reward")] == [(1, 0.125), (2, 0.75), (3, 9.0)]
    assert [(e.step, e.value) for e in events.Scalars("eval/success")] == [(0, 0.25), (2, 1.0)]
    loss = events.Scalars("train/loss")
    assert loss[0].value == -1.5 and loss[1].value != loss[1].value  # NaN kept
    assert [e.value for e in events.Scalars("train/n")] == [3.0, 4.0]
