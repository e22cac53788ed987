"""mode=doctor's report (tinytrain/cluster/doctor.py), run for real on this machine."""

from tests.conftest import compose
from tinytrain.cluster import doctor
from tinytrain.outputs import modes


def test_the_report_has_every_section_and_the_variables_in_effect(monkeypatch, tmp_path):
    monkeypatch.setenv("NCCL_SOCKET_IFNAME", "ib0")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    monkeypatch.setenv("SLURM_JOB_ID", "42")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-4]")
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    (tmp_path / "ext" / "cpu_adam").mkdir(parents=True)
    (tmp_path / "ext" / "cpu_adam" / "lock").touch()
    text = doctor.report()
    for title, _ in doctor.SECTIONS:
        assert f"\n## {title}\n" in text
    assert "could not be read" not in text, text
    for line in ("NCCL_SOCKET_IFNAME=ib0", "TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "SLURM_JOB_ID=42", "SLURM_JOB_NODELIST=node[1-4]", "lo "):
        assert line in text
    assert "torch         2." in text and "NCCL          " in text
    assert f"{tmp_path / 'ext' / 'cpu_adam' / 'lock'} (held by pid none on this host)" in text  # a stale lock shows here too


def test_mode_doctor_writes_doctor_txt(tmp_path, capsys):
    result = modes.run(compose(["mode=doctor"]), tmp_path)
    assert (tmp_path / "doctor.txt").read_text() == result["report"]
    assert "## versions" in capsys.readouterr().out
