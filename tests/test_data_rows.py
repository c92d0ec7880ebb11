"""The one reader of user data files: every tool names a bad row the same way, and no row is lost or invented."""

import json

import pytest

from cooper_openrlhf.data.rows import RowFormatError, iter_rows


def test_json_lines_keep_their_line_numbers_past_blank_lines_and_odd_unicode(tmp_path):
    path = tmp_path / "rows.jsonl"
    # U+2028 inside a string is valid JSON and must not split the line (str.splitlines would).
    path.write_text('{"q": "a"}\n\n{"q": "b\u2028c"}\n', encoding="utf-8")
    assert [(r.number, r.place, r.data) for r in iter_rows(path)] == [
        (1, f"{path}:1", {"q": "a"}), (3, f"{path}:3", {"q": "b\u2028c"})]


@pytest.mark.parametrize("line, reason", [("{not json", "invalid JSON"), ("[1, 2]", "row must be a JSON object, got list")])
def test_a_bad_line_raises_naming_file_and_line_or_is_skipped_and_listed(tmp_path, line, reason):
    path = tmp_path / "rows.jsonl"
    path.write_text(f'{{"q": 1}}\n{line}\n{{"q": 3}}\n')
    with pytest.raises(RowFormatError, match=f"rows.jsonl:2: {reason}"):
        list(iter_rows(path))
    skipped = []
    assert [r.data["q"] for r in iter_rows(path, skipped=skipped)] == [1, 3]
    assert skipped[0][0] == 2 and skipped[0][1].startswith(reason)


def test_a_json_list_and_parquet_are_numbered_by_row(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    listed = tmp_path / "rows.json"
    listed.write_text(json.dumps([{"q": 1}, "oops"]))
    with pytest.raises(RowFormatError, match="rows.json row 2: row must be a JSON object, got str"):
        list(iter_rows(listed))
    lines = tmp_path / "lines.json"  # .json holding JSON Lines is read as lines
    lines.write_text('{"q": 1}\n{"q": 2}\n')
    assert [r.place for r in iter_rows(lines)] == [f"{lines}:1", f"{lines}:2"]
    table = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([{"q": 1}, {"q": 2}]), table)
    assert [(r.place, r.data) for r in iter_rows(table)] == [(f"{table} row 1", {"q": 1}), (f"{table} row 2", {"q": 2})]
