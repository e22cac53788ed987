"""A resumed run trims samples.jsonl / grad_spikes.jsonl to its checkpoint's step (train/jsonl_rows.py):
a last line cut short by a full disk made every resume fail with a JSONDecodeError."""

import json

from tinytrain.train.jsonl_rows import drop_after


def test_rows_after_the_step_go_and_a_cut_last_line_does_not_stop_the_resume(tmp_path, caplog):
    path = tmp_path / "samples.jsonl"
    rows = [{"step": s, "completion": "x"} for s in (2, 4, 6)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 8, "compl')  # the disk filled mid-line
    kept, dropped = drop_after(path, 4)
    assert [r["step"] for r in kept] == [2, 4] and dropped == 1
    assert [json.loads(line)["step"] for line in path.read_text().splitlines()] == [2, 4]
    assert "not JSON dropped" in caplog.text
    assert drop_after(tmp_path / "none.jsonl", 4) == ([], 0)
