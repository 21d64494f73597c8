"""Data files that are not UTF-8, or not files at all, are named with file:line and the problem."""

from pathlib import Path

import pytest

from rlinf.data.records import DatasetError, load_math_records

GOOD = '{"prompt": "1+2=", "solutions": ["3"]}\n'
LATIN1 = '{"prompt": "caf\xe9 1+1=", "solutions": ["2"]}\n'.encode("latin-1")  # 0xe9 alone is not UTF-8


def test_a_jsonl_line_that_is_not_utf8_is_a_bad_record_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes(GOOD.encode() + LATIN1 + GOOD.encode())
    with pytest.raises(DatasetError) as err:
        load_math_records([str(path)])
    assert str(err.value) == f"{path}:2: not UTF-8 text: byte 0xe9 at column 16; save the file as UTF-8"


def test_skip_invalid_skips_the_line_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    path.write_bytes("\ufeff".encode() + GOOD.encode() + LATIN1 + GOOD.encode())  # with a BOM
    loaded = load_math_records([str(path)], skip_invalid=True)
    assert [r.source for r in loaded.records] == [f"{path}:1", f"{path}:3"]
    assert loaded.num_skipped == 1 and loaded.skipped[0].startswith(f"{path}:2: not UTF-8 text: byte 0xe9")


def test_a_json_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = tmp_path / "data.json"
    path.write_bytes(b"[\n" + GOOD.encode().rstrip() + b",\n" + LATIN1.rstrip() + b"\n]\n")
    with pytest.raises(DatasetError, match=rf"^{path}:3: not UTF-8 text: byte 0xe9 at column 16"):
        load_math_records([str(path)], skip_invalid=True)  # one document: nothing to skip around


def test_a_directory_is_not_called_missing(tmp_path: Path) -> None:
    with pytest.raises(DatasetError) as err:
        load_math_records([str(tmp_path)])
    assert str(err.value).startswith(f"{tmp_path}: is a directory, not a data file")
