from __future__ import annotations

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rlinf.data.records import DatasetError, MathRecord, load_math_records


def write_jsonl_lines(path: Path, lines: list[str]) -> str:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return str(path)


def test_jsonl_areal_shape_with_line_sources(tmp_path: Path) -> None:
    path = write_jsonl_lines(
        tmp_path / "train.jsonl",
        [
            json.dumps({"prompt": "What is 1 + 1?", "solutions": ["2", "\\boxed{2}"]}),
            "",  # blank lines are ignored but still counted in line numbers
            json.dumps({"prompt": "Half of 3?", "solutions": "1.5", "extra": 1}),
            json.dumps({"prompt": "Six times seven?", "solutions": [42, 42.5]}),
        ],
    )
    loaded = load_math_records([path])
    assert loaded.records == [
        MathRecord("What is 1 + 1?", ("2", "\\boxed{2}"), f"{path}:1"),
        MathRecord("Half of 3?", ("1.5",), f"{path}:3"),
        MathRecord("Six times seven?", ("42", "42.5"), f"{path}:4"),
    ]
    assert loaded.num_skipped == 0 and loaded.skipped == []


def test_json_list_and_custom_keys_and_chat_messages(tmp_path: Path) -> None:
    path = tmp_path / "val.json"
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "2 + 2?", "name": "u"},
    ]
    path.write_text(
        json.dumps([{"question": "3 - 1?", "answer": 2}, {"question": messages, "answer": ["4"]}])
    )
    loaded = load_math_records([str(path)], prompt_key="question", answer_key="answer")
    assert loaded.records == [
        MathRecord("3 - 1?", ("2",), f"{path}[0]"),
        MathRecord(
            ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "2 + 2?"}),
            ("4",),
            f"{path}[1]",
        ),
    ]


def test_parquet_with_list_answers_and_several_files_in_order(tmp_path: Path) -> None:
    parquet_path = tmp_path / "train.parquet"
    table = pa.table({"prompt": ["1 + 2?", "5 - 7?"], "solutions": [["3"], ["-2", "-2.0"]]})
    pq.write_table(table, parquet_path)
    jsonl_path = write_jsonl_lines(tmp_path / "more.jsonl", [json.dumps({"prompt": "0?", "solutions": "0"})])
    loaded = load_math_records([str(parquet_path), jsonl_path])
    assert [r.prompt for r in loaded.records] == ["1 + 2?", "5 - 7?", "0?"]
    assert loaded.records[1] == MathRecord("5 - 7?", ("-2", "-2.0"), f"{parquet_path}[1]")
    assert loaded.records[2].source == f"{jsonl_path}:1"


BAD_LINES = [
    ('{"prompt": "x", "solutions": ["1"', "invalid JSON"),
    ('["x", "1"]', "expected a JSON object, got list"),
    ('{"prompt": "x", "answer": "1"}', "missing key 'solutions' (keys present: prompt, answer)"),
    ('{"prompt": 3, "solutions": ["1"]}', "'prompt' must be a string or a list of chat messages, got number"),
    ('{"prompt": "x", "solutions": {"a": 1}}', "'solutions' must be a string or a number, got object"),
    ('{"prompt": "x", "solutions": null}', "got null"),
    ('{"prompt": "x", "solutions": [true]}', "'solutions'[0] must be a string or a number, got boolean"),
    ('{"prompt": "x", "solutions": []}', "'solutions' is an empty list"),
    ('{"prompt": "x", "solutions": ["1", " "]}', "'solutions'[1] is an empty string"),
    ('{"prompt": "  ", "solutions": ["1"]}', "'prompt' is an empty string"),
    (
        '{"prompt": [{"content": "hi"}], "solutions": ["1"]}',
        "'prompt' message 0 needs a non-empty string 'role'",
    ),
    ('{"prompt": [{"role": "user"}], "solutions": ["1"]}', "'prompt' message 0 needs a string 'content'"),
    ('{"prompt": ["hi"], "solutions": ["1"]}', "'prompt' message 0 must be an object"),
    ('{"prompt": [], "solutions": ["1"]}', "'prompt' has no message with content"),
]


@pytest.mark.parametrize(("bad_line", "problem"), BAD_LINES)
def test_bad_record_names_file_line_and_problem(tmp_path: Path, bad_line: str, problem: str) -> None:
    good = json.dumps({"prompt": "ok", "solutions": ["1"]})
    path = write_jsonl_lines(tmp_path / "train.jsonl", [good, "", bad_line, good])
    with pytest.raises(DatasetError) as caught:
        load_math_records([path])
    assert str(caught.value).startswith(f"{path}:3: ")
    assert problem in str(caught.value)


def test_bad_json_record_is_named_by_index(tmp_path: Path) -> None:
    path = tmp_path / "val.json"
    path.write_text(json.dumps([{"prompt": "ok", "solutions": "1"}, {"prompt": "ok"}]))
    with pytest.raises(
        DatasetError, match=r"val\.json\[1\]: missing key 'solutions' \(keys present: prompt\)"
    ):
        load_math_records([str(path)])


@pytest.mark.parametrize(
    ("name", "content", "problem"),
    [
        ("data.csv", "prompt,solutions\n", "unknown data file extension '.csv'"),
        ("data.json", '{"prompt": "x", "solutions": "1"}', "expected a JSON list of records, got object"),
        ("data.json", "[{", "invalid JSON"),
        ("data.parquet", "not parquet", "cannot read parquet file"),
    ],
)
def test_bad_file_raises_naming_it(tmp_path: Path, name: str, content: str, problem: str) -> None:
    path = tmp_path / name
    path.write_text(content)
    with pytest.raises(DatasetError, match=problem) as caught:
        load_math_records([str(path)], skip_invalid=True)  # file-level problems are never skipped
    assert str(path) in str(caught.value)


def test_missing_file_and_no_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.jsonl"
    with pytest.raises(DatasetError, match=f"data file not found: {missing}"):
        load_math_records([str(missing)])
    with pytest.raises(DatasetError, match="no data files"):
        load_math_records([])


def test_skip_invalid_counts_and_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    good = json.dumps({"prompt": "ok", "solutions": ["1"]})
    path = write_jsonl_lines(tmp_path / "train.jsonl", [good, "{oops", good, '{"prompt": "x"}', "[]", good])
    with caplog.at_level(logging.WARNING, logger="rlinf.data.records"):
        loaded = load_math_records([path], skip_invalid=True)
    assert [r.source for r in loaded.records] == [f"{path}:1", f"{path}:3", f"{path}:6"]
    assert loaded.num_skipped == 3
    assert [reason.split(": ")[0] for reason in loaded.skipped] == [f"{path}:2", f"{path}:4", f"{path}:5"]
    assert "missing key 'solutions'" in loaded.skipped[1]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "skipped 3 invalid record(s)" in warnings[0].getMessage()
    assert f"{path}:2: invalid JSON" in warnings[0].getMessage()


def test_skip_invalid_with_nothing_left_raises(tmp_path: Path) -> None:
    path = write_jsonl_lines(tmp_path / "train.jsonl", ['{"prompt": "x"}'])
    with pytest.raises(DatasetError, match="no usable records.*1 skipped"):
        load_math_records([path], skip_invalid=True)
