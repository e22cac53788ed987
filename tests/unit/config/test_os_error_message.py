"""An OSError from a write, flush or close carries no filename: the message said "close in fit
failed on a file" for a full disk under metrics.csv (or samples.jsonl, a generation's file, the run
lock). The file is read from the failing frame's open file object."""

import pytest

from tinytrain.config.friendly_errors import os_error_message


def append_rows(path):
    with open(path, "a") as f:
        f.write("step,loss\n" * 20_000)


def test_a_full_disk_under_a_write_names_the_file(small_disk):
    with pytest.raises(OSError) as e:
        append_rows(small_disk / "metrics.csv")
    assert e.value.filename is None  # what the message had to go on before
    message = os_error_message(e.value, [])
    assert f"failed on {small_disk / 'metrics.csv'}: No space left on device" in message
    assert f"df -h {small_disk}" in message


def test_without_an_open_file_it_says_a_file():
    with pytest.raises(OSError) as e:
        raise OSError(28, "No space left on device")
    assert "failed on a file" in os_error_message(e.value, [])


def test_a_file_the_failing_line_does_not_name_is_not_blamed(tmp_path):
    """A file open in the frame, but the write that failed went elsewhere (stdout on a full disk)."""

    def write_elsewhere(path):
        with open(path, "a") as kept_open:  # noqa: F841 - open beside the failing write
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError) as e:
        write_elsewhere(tmp_path / "generations.jsonl")
    assert "failed on a file" in os_error_message(e.value, [])
