"""A resumed run trims samples.jsonl / grad_spikes.jsonl to its checkpoint's step (train/jsonl_rows.py):
a last line cut short by a full disk made every resume fail with a JSONDecodeError."""

import json

from tinytrain.train.jsonl_rows import drop_after


def test_rows_after_the_step_go_and_a_cut_last_line_does_not_stop_the_resume(tmp_path, caplog):
    path = tmp_path / "samples.jsonl"
    # samples.jsonl is written with ensure_ascii=False: a completion may hold line separators.
    rows = [{"step": 2, "completion": "x"}, {"step": 4, "completion": "a\u2028b\x85c"}, {"step": 6, "completion": "x"}]
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows) + '{"step": 8, "compl', encoding="utf-8")  # the disk filled mid-line
    assert drop_after(path, 4) == 1
    assert [json.loads(line) for line in path.read_text(encoding="utf-8").split("\n") if line] == rows[:2]
    assert "not JSON dropped" in caplog.text
    assert drop_after(tmp_path / "none.jsonl", 4) == 0
