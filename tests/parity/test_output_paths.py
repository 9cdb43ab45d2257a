"""Output paths are checked before the first FLOP: a bad one is exit 2 naming the flag, in seconds."""
from __future__ import annotations

import time

import pytest

from parity.cli import check_outputs
from parity.errors import ParityInputError


def _bad_paths(tmp_path):
    a_file = tmp_path / "plain.txt"
    a_file.write_text("x")
    a_dir = tmp_path / "adir"
    a_dir.mkdir()
    return {
        "--records": (["--records", str(a_dir)], "found a directory"),
        "--json": (["--json", str(a_file / "sub" / "v.json")], "expected a writable location"),
        "--reference-cache": (["--reference-cache", str(a_file)], "expected a directory, found a file"),
    }


@pytest.mark.parametrize("flag", ["--records", "--json", "--reference-cache"])
def test_first_token_refuses_bad_output_paths_before_compute(tmp_path, capsys, flag):
    from parity.first_token import main

    argv, msg = _bad_paths(tmp_path)[flag]
    t = time.perf_counter()
    assert main(["--mode", "chat", "--device", "cpu", *argv]) == 2
    assert time.perf_counter() - t < 5.0          # refused before any model is built
    out = capsys.readouterr()
    assert flag in out.out + out.err and msg in (out.out + out.err).replace("\n", " ")


def test_precision_floor_records_store_is_created_or_refused(tmp_path, capsys):
    from precision_floor.flips import main

    a_file = tmp_path / "f"
    a_file.write_text("x")
    assert main(["--records", str(a_file)]) == 2
    assert "--records" in capsys.readouterr().out


def test_check_outputs_creates_missing_parents(tmp_path):
    check_outputs({"--json": (str(tmp_path / "new" / "deep" / "v.json"), "file"),
                   "--out": (str(tmp_path / "store"), "dir")})
    assert (tmp_path / "new" / "deep").is_dir() and (tmp_path / "store").is_dir()
    assert not list((tmp_path / "new" / "deep").iterdir())   # the probe file is gone
    with pytest.raises(ParityInputError, match="--out .* expected a file path, found a directory"):
        check_outputs({"--out": (str(tmp_path / "store"), "file")})
